"""What an actor returns for one input: a Record, carried through Ray Data as one row {"input", "record"} (the record
as JSON: one string column, whatever the task and its stats hold), and turned back into the task's own result
(tasks.summarize.Summary, tasks.transcribe.Transcript) for the CLI's renderers."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from specdec_cli.decoding import GenerationStats
from specdec_cli.tasks.summarize import Summary
from specdec_cli.tasks.transcribe import TranscribeStats, Transcript

# Record.failure: why an input has no output. "input": it is bad (the CLI's exit 2 for it); "unexpected": decoding
# it failed otherwise (exit 1); "setup": the actor could not load its models, so nothing can run (the run stops).
FAILURES = ("input", "unexpected", "setup")


@dataclass
class Record:
    """One input decoded (error "") or not (error: the one line saying why), by one actor."""

    input: str  # the path or URI as given
    task: str
    text: str = ""
    error: str = ""  # one line; "" when decoded
    failure: str = ""  # "" | one of FAILURES
    finish_reason: str = ""
    stats: dict | None = None  # the task's stats (GenerationStats.to_dict(); TranscribeStats for transcribe)
    segments: list = field(default_factory=list)  # transcribe: [start s, end s, text]
    language: str | None = None  # transcribe
    warnings: list[str] = field(default_factory=list)  # what the task warned while reading or decoding this input
    worker: str = ""  # host:pid of the actor
    device: str = ""
    mode: str = ""  # the contender: mode, γ (0 for autoregressive), schedule (None for autoregressive)
    gamma: int = 0
    schedule: str | None = None

    @property
    def ok(self) -> bool:
        return not self.error

    def error_line(self) -> str:
        """The error, naming the input."""
        return self.error if self.error.startswith(self.input) else f"{self.input}: {self.error}"

    def row(self) -> dict:
        return {"input": self.input, "record": json.dumps(dataclasses.asdict(self), ensure_ascii=False)}

    @classmethod
    def from_row(cls, row) -> Record:
        return cls(**json.loads(row["record"]))

    def stats_object(self) -> GenerationStats:
        """The stats as the task's own class."""
        cls = TranscribeStats if self.task == "transcribe" else GenerationStats
        return cls(**(self.stats or {}))

    def result(self) -> Summary | Transcript:
        """The task's own result for this (decoded) input, as the single-process CLI renders it."""
        if self.task == "transcribe":
            segments = [(float(a), float(b), str(t)) for a, b, t in self.segments]
            return Transcript(self.input, self.text, self.finish_reason, self.stats_object(), segments)
        return Summary(self.input, self.text, self.finish_reason, self.stats_object())

    def manifest(self, output: str | None) -> dict:
        """The manifest's line for this input: the CLI's JSON object (input, text, mode, backend, device, stats, ...)
        with the output file, the error, the warnings and the actor."""
        stats = self.stats or {}
        line = {"input": self.input, "output": output, "error": self.error or None, "failure": self.failure or None,
                "text": self.text, "mode": self.mode, "backend": stats.get("backend") or ("torch" if stats else None),
                "device": self.device, "finish_reason": self.finish_reason or None, "worker": self.worker,
                "warnings": self.warnings, "stats": stats}
        if self.task == "transcribe":
            line["language"], line["segments"] = self.language, self.segments
        return line

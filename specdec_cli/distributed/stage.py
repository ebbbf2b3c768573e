"""The Ray Data stage: callable classes a Ray Data user passes to `Dataset.map_batches`, one model load per actor.

    import ray
    from ray.data import ActorPoolStrategy
    from specdec_cli.distributed import Transcriber
    from specdec_cli.options import TranscribeOptions

    ds = ray.data.from_items([{"input": p} for p in paths])          # local or shared paths, or URIs
    out = ds.map_batches(Transcriber, fn_constructor_kwargs={"options": TranscribeOptions(output_format="srt")},
                         batch_size=1, compute=ActorPoolStrategy(size=4), num_gpus=1)
    for row in out.iter_rows():
        record = Record.from_row(row)       # text, segments, stats; or the one-line error of a bad input

Each actor loads its target and draft once, in its constructor, through the CLI's own loading and model cache
(tasks.*.load_pair): the first actor on a node converts an embedded model into that node's cache, and two actors
that build the same entry at once both succeed (models.cache.atomic_entry: the first rename wins, the other's copy
is dropped). Each batch is decoded with the CLI's options by the task library (tasks.summarize.summarize,
tasks.transcribe.transcribe), one γ schedule per actor carrying what it measured from batch to batch as one
process does. A bad input is its record's one-line error, and the batch's other inputs are decoded; a model that
cannot load makes every record a "setup" failure (the driver stops the run with that line).
"""

from __future__ import annotations

import contextlib
import os
import socket
import warnings
from collections.abc import Iterator
from typing import Any, ClassVar

import torch

from specdec_cli.decoding import make_schedule
from specdec_cli.distributed import files
from specdec_cli.distributed.records import Record
from specdec_cli.errors import SpecdecError, SpecdecWarning, first_line
from specdec_cli.options import AUTOREGRESSIVE, DecodeOptions, SummarizeOptions, TranscribeOptions
from specdec_cli.tasks import summarize as summarize_task
from specdec_cli.tasks import transcribe as transcribe_task
from specdec_cli.tasks.audio import load_audio

Contender = tuple[str, int, "str | None"]  # (mode, γ: 0 for autoregressive, schedule: None for autoregressive)


@contextlib.contextmanager
def _caught() -> Iterator[list[str]]:
    """The SpecdecWarnings raised inside the block, as lines (filled when it ends, however it ends)."""
    lines: list[str] = []
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always", SpecdecWarning)
        try:
            yield lines
        finally:
            lines += [str(w.message) for w in got if issubclass(w.category, SpecdecWarning)]


def _one_line(error: BaseException) -> tuple[str, str]:
    """(failure, line): a SpecdecError is the input's fault ("input"), anything else "unexpected"."""
    if isinstance(error, SpecdecError):
        return "input", first_line(error)
    return "unexpected", f"unexpected failure: {type(error).__name__}: {first_line(error)}"


class Stage:
    """What Summarizer and Transcriber share: the constructor loads the models (once per actor), __call__ decodes a
    batch of rows {"input": path or URI} into rows {"input", "record"} (records.Record as JSON), one per input, or
    with `contenders` (bench) one per input and contender.

    options: the task's options (default: the CLI's defaults). threads: torch threads in this actor. env: variables
    set first (SPECDEC_CACHE: the model cache on this node). contenders: (mode, γ, schedule) to decode every input
    with, γ and schedule replacing the options' (bench: autoregressive then schedule × γ × mode; the models are loaded
    for the first speculative one); each mode first decodes warmup_tokens tokens of its first input untimed."""

    task: ClassVar[str] = ""
    options_class: ClassVar[type[DecodeOptions]] = DecodeOptions

    def __init__(self, options: DecodeOptions | None = None, *, threads: int | None = None,
                 env: dict[str, str] | None = None, contenders: list[Contender] | None = None, warmup_tokens: int = 0):
        os.environ.update(env or {})
        if threads:
            torch.set_num_threads(int(threads))
        self.options = options if options is not None else self.options_class()
        # fixed: the other actors on this node are planned, not load to make room for
        self.options = self.options.replace(threads=str(torch.get_num_threads()))
        self.contenders = [tuple(c) for c in contenders] if contenders else None
        self.warmup_tokens, self.warm = warmup_tokens, set()
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self.calls, self.schedules = 0, {}
        self.target: Any = None
        self.draft: Any = None
        self.device, self.setup_error = "", ""
        with _caught() as self.load_warnings:
            try:
                self.options = self.options.validate()
                self.target, self.draft = self.load(self._load_options())
                self.device = str(self.target.device)
            except Exception as e:  # said by every record: the driver stops the run with this line
                self.setup_error = _one_line(e)[1]

    def _load_options(self) -> DecodeOptions:
        speculative = [c for c in self.contenders or () if c[0] != AUTOREGRESSIVE]
        return self.options.replace(mode=speculative[0][0]) if speculative else self.options

    # what each task says
    def load(self, opts) -> tuple[Any, Any]:
        raise NotImplementedError

    def read(self, path: str) -> Any:
        raise NotImplementedError

    def run(self, items: list[tuple[str, Any]], opts, draft, schedule) -> list:
        raise NotImplementedError

    def __call__(self, batch: dict) -> dict[str, list]:
        """Ray Data's call: a batch {"input": [paths]} -> {"input": [...], "record": [JSON of records.Record]}."""
        self.calls += 1
        records = self.records([str(p) for p in batch["input"]])
        if records and self.load_warnings:  # said once, with this actor's first record
            records[0].warnings[:0] = self.load_warnings
            self.load_warnings = []
        rows = [r.row() for r in records]
        return {"input": [r["input"] for r in rows], "record": [r["record"] for r in rows]}

    def records(self, paths: list[str]) -> list[Record]:
        """One record per input (per input and contender), bad inputs with their one-line error."""
        if self.setup_error:
            return [Record(p, self.task, error=self.setup_error, failure="setup", worker=self.worker) for p in paths]
        items, out = [], []
        for p in paths:
            with _caught() as caught:
                try:
                    items.append((p, self.read(p), caught))
                except Exception as e:
                    failure, line = _one_line(e)
                    out.append(self._failed(p, failure, line, caught))
        for c in self.contenders or [None]:
            out += self._decode(items, c)
        return out

    def _options_for(self, contender: Contender | None):
        if contender is None:
            return self.options
        mode, gamma, schedule = contender
        return self.options.replace(mode=mode, gamma=max(gamma, 1), gamma_schedule=schedule or "constant")

    def _decode(self, items: list, contender: Contender | None) -> list[Record]:
        """The inputs decoded together; when that fails, one by one, so that one bad input fails alone."""
        if not items:
            return []
        opts = self._options_for(contender)
        draft = self.draft if opts.speculative else None
        key = (opts.mode, opts.gamma, opts.gamma_schedule)
        if key not in self.schedules:
            self.schedules[key] = make_schedule(opts.gamma_schedule, opts.gamma)
        if self.contenders and opts.mode not in self.warm:  # first-call costs stay out of a bench's figures
            self.warm.add(opts.mode)
            with contextlib.suppress(Exception), _caught():
                self.run(items[:1], opts.replace(max_new_tokens=min(opts.max_new_tokens, self.warmup_tokens or 8)),
                         draft, make_schedule(opts.gamma_schedule, opts.gamma))
        try:
            with _caught() as caught:
                results = self.run([(p, item) for p, item, _ in items], opts, draft, self.schedules[key])
        except Exception as e:
            if len(items) > 1:
                return [r for it in items for r in self._decode([it], contender)]
            failure, line = _one_line(e)
            return [self._failed(items[0][0], failure, line, items[0][2], contender)]
        return [self._record(r, opts, contender, warned + caught) for r, (_, _, warned) in zip(results, items)]

    def _contender(self, opts, contender: Contender | None) -> dict:
        if contender is None:
            return {"mode": opts.mode, "gamma": opts.gamma if opts.speculative else 0,
                    "schedule": opts.gamma_schedule if opts.speculative else None}
        return {"mode": contender[0], "gamma": contender[1], "schedule": contender[2]}

    def _failed(self, path: str, failure: str, line: str, warned: list[str], contender=None) -> Record:
        return Record(path, self.task, error=line, failure=failure, warnings=list(warned), worker=self.worker,
                      device=self.device, **self._contender(self.options, contender))

    def _record(self, result, opts, contender, warned: list[str]) -> Record:
        return Record(result.input, self.task, text=result.text, finish_reason=result.finish_reason,
                      stats=result.stats.to_dict(),
                      segments=[list(s) for s in getattr(result, "segments", [])],
                      language=getattr(result.stats, "language", None), warnings=list(warned), worker=self.worker,
                      device=self.device, **self._contender(opts, contender))


def _read_local(path: str, reader):
    """reader(local path) for the input `path` (a URI read through a local copy, its errors naming the URI)."""
    with files.local_copy(path) as local:
        try:
            return reader(local)
        except SpecdecError as e:
            if local == path:
                raise
            raise SpecdecError(str(e).replace(local, path)) from None


class Summarizer(Stage):
    """Ray Data stage for `specdec summarize`: rows {"input": article path or URI} -> summaries (records.Record)."""

    task = "summarize"
    options_class = SummarizeOptions

    def load(self, opts):
        return summarize_task.load_pair(opts, progress=False)

    def read(self, path: str):
        return summarize_task.Article(path, _read_local(path, summarize_task.read_article).text)

    def run(self, items, opts, draft, schedule):
        return summarize_task.summarize(self.target, draft, [a for _, a in items], opts, schedule=schedule)


class Transcriber(Stage):
    """Ray Data stage for `specdec transcribe`: rows {"input": audio path or URI} -> transcripts with their segments
    (records.Record)."""

    task = "transcribe"
    options_class = TranscribeOptions

    def load(self, opts):
        target, draft = transcribe_task.load_pair(opts, progress=False)
        transcribe_task.check_target(target, opts)
        return target, draft

    def read(self, path: str):
        return _read_local(path, load_audio)

    def run(self, items, opts, draft, schedule):
        return transcribe_task.transcribe(self.target, draft, [p for p, _ in items], opts,
                                          audios=[a for _, a in items], schedule=schedule)


STAGES: dict[str, type[Stage]] = {"summarize": Summarizer, "transcribe": Transcriber}

"""A transcript written out: the output formats of `specdec transcribe --output-format`, and where files go.

    txt   the text (with timestamps: one segment a line, "[HH:MM:SS.mmm --> HH:MM:SS.mmm] text")
    srt   numbered cues, "HH:MM:SS,mmm --> HH:MM:SS,mmm", a blank line after each (SubRip)
    vtt   "WEBVTT", then cues "HH:MM:SS.mmm --> HH:MM:SS.mmm" (WebVTT)
    tsv   a "start  end  text" header, then times in integer milliseconds (whisper's CLI)
    json  the CLI's JSON object for the input (text, mode, stats, ...) with the language and the segments

Segments are a Transcript's: (start s, end s, text), one per 30 s window, or the model's own with timestamps
(srt, vtt and tsv turn them on: options.TIMED_FORMATS).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from specdec_cli import options
from specdec_cli.errors import SpecdecError


def clock(seconds: float, decimal: str = ".") -> str:
    """HH:MM:SS.mmm (SRT: decimal=",")."""
    ms = max(0, round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{decimal}{ms:03d}"


def _cues(segments, decimal: str) -> list[str]:
    return [f"{clock(a, decimal)} --> {clock(b, decimal)}\n{text.strip()}\n" for a, b, text in segments]


def txt(transcript, timestamps: bool = False) -> str:
    if not timestamps:
        return transcript.text + "\n"
    return "".join(f"[{clock(a)} --> {clock(b)}] {text.strip()}\n" for a, b, text in transcript.segments)


def srt(transcript) -> str:
    return "\n".join(f"{i}\n{cue}" for i, cue in enumerate(_cues(transcript.segments, ","), 1))


def vtt(transcript) -> str:
    return "WEBVTT\n\n" + "\n".join(_cues(transcript.segments, "."))


def tsv(transcript) -> str:
    rows = [f"{round(a * 1000)}\t{round(b * 1000)}\t{' '.join(text.split())}\n" for a, b, text in transcript.segments]
    return "start\tend\ttext\n" + "".join(rows)


def as_json(transcript, header: dict) -> str:
    """`header` (the CLI's JSON object for this input) with the language and the segments added."""
    segments = [{"start": round(a, 3), "end": round(b, 3), "text": text.strip()} for a, b, text in transcript.segments]
    return json.dumps({**header, "language": transcript.stats.language, "segments": segments}, ensure_ascii=False,
                      indent=2) + "\n"


def render(transcript, fmt: str, *, timestamps: bool, header: dict) -> str:
    """The file's text for one transcript in format `fmt` (options.OUTPUT_FORMATS)."""
    if fmt == "txt":
        return txt(transcript, timestamps)
    if fmt == "json":
        return as_json(transcript, header)
    return {"srt": srt, "vtt": vtt, "tsv": tsv}[fmt](transcript)


# ----------------------------------------------------------------------------------------------------
# Files


@dataclass
class Outputs:
    """Where a transcribe run's outputs go: one file per input under --output-dir (paths; none without it), and
    the inputs left to do (todo: all of them, less those whose file is there with --skip-existing)."""

    todo: list[str]
    paths: dict[str, Path] = field(default_factory=dict)
    skipped: int = 0


def plan_outputs(inputs: list[str], out_dir: str | Path | None, fmt: str, skip_existing: bool,
                 as_json: bool) -> Outputs:
    """The outputs of `inputs`, checked before any model loads (options.check_output; the folder writable)."""
    options.check_output(fmt, out_dir, skip_existing, len(inputs), as_json)
    if out_dir is None:
        return Outputs(list(inputs))
    check_output_dir(out_dir)
    paths = dict(zip(inputs, output_paths(inputs, out_dir, fmt)))
    todo = [f for f in inputs if not (skip_existing and paths[f].exists())]
    return Outputs(todo, paths, len(inputs) - len(todo))


def output_paths(inputs, out_dir: str | Path, fmt: str) -> list[Path]:
    """One file per input in `out_dir`: the input's stem + "." + fmt; two inputs that would share a file, or an
    output that is its input, raise SpecdecError."""
    paths = [Path(out_dir) / f"{Path(p).stem}.{fmt}" for p in inputs]
    owner: dict[Path, str] = {}
    for path, src in zip(paths, inputs):
        if "://" not in src and path.resolve() == Path(src).resolve():
            raise SpecdecError(f"{src} would be overwritten by its own output: give another --output-dir")
        if path in owner:
            raise SpecdecError(f"{owner[path]} and {src} would both be written to {path}: rename one, or give them "
                               "separate runs with separate --output-dir")
        owner[path] = src
    return paths


def check_output_dir(out_dir: str | Path) -> None:
    """Make `out_dir` (and its parents) and check that a file can be written in it, before any model loads;
    SpecdecError in one line when not."""
    d = Path(out_dir)
    if d.exists() and not d.is_dir():
        raise SpecdecError(f"--output-dir {d}: is a file, not a folder")
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=d, prefix=".specdec-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise SpecdecError(f"--output-dir {d}: cannot write there ({e.strerror or e})") from e


def write(path: Path, text: str) -> None:
    """Write `text` to `path` whole: a file that exists is a finished one (what --skip-existing trusts)."""
    part = path.with_name(path.name + ".part")
    part.write_text(text, encoding="utf-8")
    os.replace(part, path)

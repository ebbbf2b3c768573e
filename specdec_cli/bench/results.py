"""What a bench run produced, and how it is written: BenchResults (the records, the command, the machine),
JSON, CSV and the plots."""

from __future__ import annotations

import csv
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specdec_cli.bench import plots
from specdec_cli.bench.contenders import (
    TASK_COST_COLUMNS,
    TASK_END_TO_END_COLUMNS,
    TASK_PROFILING_COLUMNS,
    TASK_QUALITY_COLUMNS,
    TASK_SPEED_COLUMNS,
)
from specdec_cli.bench.synthetic import SYNTHETIC_COLUMNS
from specdec_cli.errors import SpecdecError


@dataclass
class BenchResults:
    task: str
    command: str  # a command line that reproduces the run
    config: dict
    machine: dict
    records: list  # SyntheticRecord | TaskRecord
    warnings: list[str] = field(default_factory=list)

    @property
    def tables(self) -> list[tuple[str, list[tuple[str, str]]]]:
        """The tables shown: (title, columns as (field, header)); every field is in to_dict()['results']."""
        if self.task == "synthetic":
            cols = list(SYNTHETIC_COLUMNS)
            if not any(r.gb_per_s is not None for r in self.records):
                cols = [c for c in cols if c[0] != "gb_per_s"]
            return [("", cols)]
        keys = list(dict.fromkeys(k for r in self.records for k in r.quality))
        out = [("speed: measured over autoregressive, and predicted from α and c", list(TASK_SPEED_COLUMNS)),
               ("acceptance and cost", list(TASK_COST_COLUMNS)),
               ("memory and quality", list(TASK_QUALITY_COLUMNS) + [(f"quality.{k}", k) for k in keys])]
        if any(r.verify_s is not None for r in self.records):
            out.append(("profiling time (the paper's Table 1): the verification summed over every input",
                        list(TASK_PROFILING_COLUMNS) + [(f"quality.{k}", k) for k in keys[:1]]))
        if any(r.end_to_end_s is not None for r in self.records):
            out.append(("end to end (features, encoder, decoding; load excluded) over the unmodified target alone",
                        list(TASK_END_TO_END_COLUMNS) + [(f"quality.{k}", k) for k in keys]))
        return out

    def groups(self) -> list[tuple[str, list]]:
        """The records shown together: (title, records). A task's sweep gives one group per thread count and
        draft setting, each with the autoregressive record it is measured against."""
        if self.task == "synthetic":
            return [("", self.records)]
        spec = [r for r in self.records if r.mode != "autoregressive" and r.peer is None]
        settings = list(dict.fromkeys((r.threads, r.draft, r.target_int8, r.encoder_int8) for r in spec))
        if len(settings) <= 1:
            return [("", self.records)]
        # each setting with the autoregressive record it is measured against, and the peers of its thread count
        return [(f"{t} thread{'s' if t != 1 else ''} · draft {d}",
                 [r for r in self.records if r.threads == t and (
                     r.peer is not None or (r.draft == d and r.target_int8 == i and r.encoder_int8 == e) or
                     (r.mode == "autoregressive" and r.target_int8 in (i, False) and r.encoder_int8 in (e, False)))])
                for t, d, i, e in settings]

    def to_dict(self) -> dict:
        return {
            "task": self.task,
            "command": self.command,
            "argv": sys.argv,
            "config": self.config,
            "machine": self.machine,
            "warnings": self.warnings,
            "results": [asdict(r) for r in self.records],
        }


def value(record, key: str):
    """A record's field by column key; 'quality.rouge1' reaches into the quality dict."""
    if key.startswith("quality."):
        return record.quality.get(key.split(".", 1)[1])
    return getattr(record, key)


def _flat(record) -> dict:
    row = asdict(record)
    row.pop("outputs", None)  # texts: in the JSON only
    quality = row.pop("quality", None) or {}
    row.update({f"quality_{k}": v for k, v in quality.items()})
    return row


def write_json(results: BenchResults, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results.to_dict(), indent=2, allow_nan=True) + "\n")


def write_csv(results: BenchResults, path: Path) -> None:
    """One row per record: (grid point, mode) for synthetic, (γ, mode) for a task."""
    rows = [_flat(r) for r in results.records]
    fields = list(dict.fromkeys(k for row in rows for k in row))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for row in rows:
            w.writerow({k: ("" if v is None else v) for k, v in row.items()})


def check_outputs(*, out: Path | None = None, csv_path: Path | None = None, plot_dir: Path | None = None) -> None:
    """Refuse, before anything runs, an output that could not be written: a file path that is a folder, or a
    folder (the plots', or a file's) that cannot be made or written into."""
    for flag, path, is_dir in (("--out", out, False), ("--csv", csv_path, False), ("--plot", plot_dir, True)):
        if path is None:
            continue
        path = Path(path)
        if not is_dir and path.is_dir():
            raise SpecdecError(f"{flag} {path}: is a folder; give a file name")
        if is_dir and path.exists() and not path.is_dir():
            raise SpecdecError(f"{flag} {path}: is a file; give a folder for the plots")
        folder = path if is_dir else path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)  # an empty output folder is harmless; a failure now is cheap
        except OSError as e:
            raise SpecdecError(f"{flag} {path}: cannot make the folder {folder} ({e.strerror or e})") from None
        if not os.access(folder, os.W_OK | os.X_OK):
            raise SpecdecError(f"{flag} {path}: cannot write into {folder} (permission denied)")


def write_outputs(results: BenchResults, *, out: Path | None = None, csv_path: Path | None = None,
                  plot_dir: Path | None = None) -> list[Path]:
    """Write whichever of JSON, CSV and plots were asked for; returns the paths written. A write that fails
    does not stop the others: the failures are raised together afterwards, each naming its file."""
    jobs = []
    if out is not None:
        jobs.append((Path(out), lambda: [write_json(results, out) or Path(out)]))
    if csv_path is not None:
        jobs.append((Path(csv_path), lambda: [write_csv(results, csv_path) or Path(csv_path)]))
    if plot_dir is not None:
        jobs.append((Path(plot_dir), lambda: plots.plot_results(results, Path(plot_dir))))
    written, failed = [], []
    for path, job in jobs:
        try:
            written += job()
        except OSError as e:
            failed.append(f"{path}: {e.strerror or e}")
    if failed:
        kept = f" (written: {', '.join(map(str, written))})" if written else ""
        raise SpecdecError(f"cannot write {'; '.join(failed)}{kept}")
    return written

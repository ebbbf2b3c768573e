"""What the CLI shows on the terminal: rich tables and progress, all on stderr."""

from __future__ import annotations

import contextlib

from rich.console import Console
from rich.table import Table

err = Console(stderr=True)


@contextlib.contextmanager
def status(title: str, quiet: bool = False):
    """A spinner with a changing message; yields step(msg)."""
    if quiet or not err.is_terminal:
        yield lambda msg: None
        return
    with err.status(title) as s:
        yield lambda msg: s.update(f"{title}: {msg}")


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def kernel_report(report) -> None:
    t = Table(title=f"verify-kernel --mode {report.mode}  ({report.backend}, {report.device})")
    t.add_column("check")
    t.add_column("result")
    t.add_column("detail")
    for c in report.checks:
        t.add_row(c.name, "[green]pass[/]" if c.passed else "[red]FAIL[/]", c.detail)
    err.print(t)
    f = Table(title=f"figures  (V={report.vocab}, γ={report.gamma}, B={report.batch})")
    f.add_column("figure")
    f.add_column("value", justify="right")
    for k, v in report.figures.items():
        f.add_row(k, _fmt(v))
    err.print(f)
    if report.mode == "sigmoid":
        fig = report.figures
        err.print(
            f"sigmoid moves the output: TV to the target {fig['tv_to_target']:.3f} "
            f"(exact: {fig['tv_exact_to_target']:.3f}, the draft alone: {fig['tv_draft_to_target']:.3f}); "
            f"acceptance rate {fig['acceptance_rate']:.3f} vs exact {fig['acceptance_rate_exact']:.3f}",
            highlight=False,
        )
    err.print("[bold green]PASSED[/]" if report.passed else "[bold red]FAILED[/]")

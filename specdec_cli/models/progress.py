"""What a user sees while models load: rich spinners and bars on stderr, and transformers' own bars kept
quiet while ours are on screen. Every helper is a no-op when `enabled` is False (--json, tests)."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def status(enabled: bool, message: str):
    """A rich spinner with `message` while the block runs (nothing when disabled)."""
    if not enabled:
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(message):
        yield


@contextlib.contextmanager
def byte_progress(enabled: bool, description: str, total: int):
    """Yield an `on_bytes(n)` callback that advances a rich progress bar over `total` bytes."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


@contextlib.contextmanager
def quiet_transformers():
    """Silence transformers' own tqdm bars (ours are on screen instead); restore them afterwards."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def build_kernels(enabled: bool, kernels) -> None:
    """Build the C++ kernels (kernels/cpp.py Extensions) a model's steps will run, now, at load, where this machine
    has no build of them yet (on 2 cores about half a minute each), under a spinner: no input's time holds a build
    (the demo's first article took 47–55 s instead of ~10, its recording 36 s instead of 0.4)."""
    todo = [k.name for k in kernels if not k.cached()]
    with status(enabled and bool(todo), f"building the {', '.join(todo)} kernels for this CPU (once: they are cached)"):
        for kernel in kernels:
            kernel.module()


def note(enabled: bool, message: str) -> None:
    """One line on stderr (when progress is on)."""
    if enabled:
        from rich.console import Console

        Console(stderr=True).print(message, style="dim", highlight=False, soft_wrap=True)

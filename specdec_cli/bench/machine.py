"""The machine a result was measured on, and what a measurement took from it: CPU time of others, peak memory."""

from __future__ import annotations

import datetime
import os
import platform
import time
from pathlib import Path

import torch

from specdec_cli.errors import SpecdecError
from specdec_cli.models.cache import human


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def available_memory() -> int | None:
    """Bytes the machine can still give (Linux MemAvailable), None where it cannot tell."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def check_memory(what: str, needed: int) -> None:
    """Refuse up front a request that would take more memory than the machine has available."""
    free = available_memory()
    if free is not None and needed > free:
        raise SpecdecError(f"{what} needs about {human(needed)} of memory; this machine has {human(free)} available")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            info = dict(line.split(":", 1) for line in f if ":" in line)
        name = info.get("model name\t", "").strip() or info.get("model name", "").strip()
        fam, mod = info.get("cpu family\t", "").strip(), info.get("model\t\t", "").strip()
        if name:
            return f"{name} (family {fam}, model {mod})" if fam and mod else name
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _version(dist: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_revision() -> str | None:
    """The source tree's commit, '+modified' when tracked files differ from it (None outside a checkout)."""
    import subprocess

    root = Path(__file__).resolve().parent.parent.parent
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        if rev.returncode != 0:
            return None
        changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return rev.stdout.strip() + ("+modified" if changed else "")


def machine_info(device: str) -> dict:
    """The machine and software a result was measured on (written beside every result)."""
    import specdec_cli

    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else cpu_model(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "load_average_at_start": load_average(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {
            "specdec": specdec_cli.__version__,
            "torch": torch.__version__,
            "triton": _version("triton"),
            "transformers": _version("transformers"),
        },
        "git": _git_revision(),
    }
    if device == "cuda":
        info["cuda"] = torch.version.cuda
    return info


def cpu_clock() -> tuple[float, float, float] | None:
    """(CPU seconds the whole machine spent busy, including time stolen by the hypervisor; CPU seconds of
    this process, all threads; wall seconds). None where /proc/stat is missing (not Linux)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError):
        return None
    busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    own = os.times()
    return busy, own.user + own.system, time.monotonic()


def others_cpu(before, after) -> float | None:
    """The share of the machine's CPU that other processes (and the hypervisor) took between two clocks:
    0 on a quiet machine; 0.5 on 2 cores means one core was busy with someone else's work."""
    if before is None or after is None or after[2] <= before[2]:
        return None
    cores = os.cpu_count() or 1
    others = (after[0] - before[0]) - (after[1] - before[1])
    return min(1.0, max(0.0, others / ((after[2] - before[2]) * cores)))


def _peak_rss_mib() -> float | None:
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError):
        return None


class PeakMemory:
    """`with PeakMemory(device) as peak: ...` then peak.mib: the peak memory of the block, MiB.

    CUDA: torch's peak allocated bytes (weights, KV caches, activations: the paper's figures 4, 5).
    CPU: the process's peak resident set (Linux VmHWM, reset on entry by writing 5 to
    /proc/self/clear_refs), so models, caches and the interpreter are all in it; None where it cannot
    be reset (not Linux). tracemalloc would not do: it does not see torch's allocations."""

    def __init__(self, device: str):
        self.cuda = str(device).startswith("cuda")
        self.mib: float | None = None
        self._reset = False

    def __enter__(self) -> PeakMemory:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return self
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self._reset = True
        except OSError:
            pass
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.mib = torch.cuda.max_memory_allocated() / 2**20
        elif self._reset:
            self.mib = _peak_rss_mib()

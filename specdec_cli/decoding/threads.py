"""torch's intra-op thread count while decoding: all cores, or fewer while other processes keep cores busy.

Why: each of torch's (and the kernels') parallel regions ends when its last thread does. With a core busy
elsewhere, one of our threads waits for the scheduler and the other for it: a step of the summarize target on its
GGUF blocks took 122 ms on 2 threads beside one busy process, 38.5 ms on 1 (25.3 / 38.6 ms on a quiet machine;
AMD EPYC Zen 5, 2 vCPUs; benchmarks/under_load.py has the end-to-end runs).

The rule (`choose`): of the n CPUs this process may run on, `others` are kept busy by other processes (their
CPU time over the last PERIOD_S, from /proc/stat less this process's own); use the share of `ceiling` (the
thread count the run started with) that the free CPUs are, rounded to nearest, at least 1. Our own threads'
time is left out of `others`, so the choice does not feed on itself. Where /proc/stat cannot be read (not
Linux), the count stays the ceiling. Every specdec kernel computes each output on one thread, so the count changes
none of their bits (kernels/*.cpp), only the speed; torch's own fp32 GEMMs may split a sum over threads (1 and 2
threads differed at [5, 896] · [896, 4864]): where a model runs on them, --threads N keeps runs comparable.

A CPU quota caps auto (`quota_cpus`: a container's --cpus, cgroup v2's cpu.max or v1's cpu.cfs_quota_us, the
tightest on the process's cgroup path): torch counts the CPUs it may run on, not the CPU time it may use, and
threads beyond the quota all stop together once a period's time is spent (100 ms by default, several steps).
The count is then at most the quota's CPUs, rounded to nearest, at least 1; the free CPUs still lower it."""

from __future__ import annotations

import math
import os
import time

import torch

from specdec_cli import options

PERIOD_S = 0.5  # how often the CPUs are looked at (a tick in between costs one clock read)


CGROUP_ROOT = "/sys/fs/cgroup"  # where the cgroup file systems are mounted (v2 unified, or one folder per v1 controller)


def quota_cpus(root: str = CGROUP_ROOT, membership: str = "/proc/self/cgroup") -> float | None:
    """The CPUs' worth of time this process's cgroups may use (quota / period), the tightest from its own cgroup up
    to the root; None where none is set or nothing can be read (not Linux, no cgroup file system)."""
    try:
        with open(membership) as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f if line.count(":") >= 2]
    except OSError:
        return None
    limits: list[float] = []
    for _, controllers, path in lines:
        if controllers == "":  # v2: <root>/<path>/cpu.max holds "max 100000" or "<quota> <period>"
            folders, name = [root], "cpu.max"
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's folder, quota and period apart
            folders, name = [os.path.join(root, controllers), os.path.join(root, "cpu")], "cpu.cfs_quota_us"
        else:
            continue
        for folder in folders:
            parts = [p for p in path.split("/") if p]
            for depth in range(len(parts), -1, -1):  # from the process's cgroup up to the root
                quota = _quota_at(os.path.join(folder, *parts[:depth]), name)
                if quota is not None:
                    limits.append(quota)
    return min(limits) if limits else None


def _quota_at(folder: str, name: str) -> float | None:
    try:
        with open(os.path.join(folder, name)) as f:
            fields = f.read().split()
        if name == "cpu.max":
            quota, period = fields[0], fields[1]
        else:
            with open(os.path.join(folder, "cpu.cfs_period_us")) as f:
                quota, period = fields[0], f.read().split()[0]
        if quota == "max" or int(quota) <= 0 or int(period) <= 0:  # v1 says -1 for none
            return None
        return int(quota) / int(period)
    except (OSError, ValueError, IndexError):
        return None


def capped(count: int, quota: float | None) -> int:
    """A thread count under a CPU quota (quota_cpus): at most its CPUs, rounded to nearest, at least 1."""
    return count if quota is None else max(1, min(count, math.floor(quota + 0.5)))


def choose(others: float, cpus: int, ceiling: int) -> int:
    """The thread count when `others` of `cpus` CPUs are busy with other processes (see the module's rule)."""
    free = max(0.0, cpus - others)
    return max(1, min(ceiling, math.floor(free * ceiling / cpus + 0.5)))


class CpuSample:
    """(wall s, busy CPU s of the CPUs we may use, our own CPU s) at one moment; None where /proc/stat is missing."""

    def __init__(self):
        self.cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.names = {f"cpu{i}" for i in self.cpus}  # their lines in /proc/stat
        self.tick_s = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01

    def __call__(self) -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat") as f:
                lines = [line.split() for line in f if line.startswith("cpu")]
        except OSError:
            return None
        # fields: user nice system idle iowait irq softirq steal (guest is inside user)
        busy = sum(sum(int(v) for i, v in enumerate(f[1:9]) if i not in (3, 4)) for f in lines if f[0] in self.names)
        return time.perf_counter(), busy * self.tick_s, time.process_time()


class Threads:
    """Sets torch's thread count from `setting` (options.thread_count) and, under auto, adapts it on each tick() (at most once per
    PERIOD_S). A context manager: the count it found is set back on exit."""

    def __init__(self, setting: str | int | None = options.AUTO_THREADS, sample: CpuSample | None = None):
        fixed = options.thread_count(setting)
        self.found = torch.get_num_threads()
        self.cap = capped(self.found, quota_cpus()) if fixed is None else fixed  # auto: never past a CPU quota
        self.ceiling = fixed or self.found  # choose's share is of this, then capped
        self.adapts = fixed is None and self.cap > 1
        self.sample = sample or CpuSample()
        self.cpus = len(self.sample.cpus) or os.cpu_count() or 1
        self.last = self.sample() if self.adapts else None
        torch.set_num_threads(self.cap)

    def __enter__(self) -> Threads:
        return self

    def __exit__(self, *exc) -> None:
        torch.set_num_threads(self.found)

    def others(self, now, before) -> float:
        """CPUs other processes kept busy between two samples."""
        wall = now[0] - before[0]
        return max(0.0, (now[1] - before[1]) - (now[2] - before[2])) / wall if wall > 0 else 0.0

    def tick(self) -> None:
        if not self.adapts or self.last is None or time.perf_counter() - self.last[0] < PERIOD_S:
            return
        now = self.sample()
        if now is None:
            self.adapts = False
            return
        self._set(min(self.cap, choose(self.others(now, self.last), self.cpus, self.ceiling)))
        self.last = now

    def _set(self, n: int) -> None:
        if n != torch.get_num_threads():
            torch.set_num_threads(n)

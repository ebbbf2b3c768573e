"""decoding/threads.py: the run's CPU thread count, fewer while other processes keep cores busy."""

import subprocess
import sys
import time

import pytest
import torch

from conftest import torch_threads
from specdec_cli.decoding import threads as th


class FakeCpus:
    """Samples as CpuSample gives them, from a list of what other processes keep busy (CPUs) in each interval;
    this process uses `own` CPUs throughout."""

    def __init__(self, cpus: int, others: list[float], own: float = 1.0, step_s: float = 1.0):
        self.cpus, self.others, self.own, self.step_s = list(range(cpus)), list(others), own, step_s
        self.t = self.busy = self.mine = 0.0
        self.calls = 0

    def __call__(self):
        if self.calls:
            other = self.others[min(self.calls - 1, len(self.others) - 1)]
            self.t += self.step_s
            self.busy += (other + self.own) * self.step_s
            self.mine += self.own * self.step_s
        self.calls += 1
        return self.t, self.busy, self.mine


def test_the_count_is_the_share_of_free_cpus():
    assert th.choose(0.0, 2, 2) == 2  # a quiet machine: every core
    assert th.choose(0.3, 2, 2) == 2  # a little background work leaves it
    assert th.choose(1.0, 2, 2) == 1  # one of two cores busy elsewhere
    assert th.choose(5.0, 2, 2) == 1  # never fewer than one
    assert th.choose(0.0, 8, 4) == 4  # never more than the count the run started with
    assert th.choose(4.0, 8, 4) == 2  # half the CPUs free: half the threads


def test_auto_follows_other_processes_and_sets_the_count_back(monkeypatch):
    monkeypatch.setattr(th, "PERIOD_S", 0.0)
    cpus = FakeCpus(2, [0.0, 1.0, 1.0, 0.1])
    with torch_threads(2):
        seen = []
        with th.Threads("auto", sample=cpus) as t:
            for _ in range(4):
                t.tick()
                seen.append(torch.get_num_threads())
        assert seen == [2, 1, 1, 2]
        assert torch.get_num_threads() == 2


def test_our_own_threads_are_not_counted_as_load(monkeypatch):
    """Both CPUs busy with this process alone: no other process, so every thread stays."""
    monkeypatch.setattr(th, "PERIOD_S", 0.0)
    with torch_threads(2), th.Threads("auto", sample=FakeCpus(2, [0.0], own=2.0)) as t:
        t.tick()
        assert torch.get_num_threads() == 2


def test_a_number_is_kept_whatever_the_load(monkeypatch):
    monkeypatch.setattr(th, "PERIOD_S", 0.0)
    cpus = FakeCpus(2, [2.0])
    with torch_threads(2):
        with th.Threads("2", sample=cpus) as t:
            t.tick()
            assert torch.get_num_threads() == 2 and cpus.calls == 0
        with th.Threads("1") as t:
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2


def test_another_process_is_seen_busy():
    """A child spinning for ~1 s is counted as another process's CPU (the parent sleeps): at least half a CPU
    over the interval, whatever else the machine runs (that only adds)."""
    sample = th.CpuSample()
    if sample() is None:
        pytest.skip("no /proc/stat here")
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 30: pass"])
    try:
        time.sleep(0.3)  # the interpreter has started
        before = sample()
        time.sleep(1.0)
        now = sample()
    finally:
        child.kill()
        child.wait()
    t = th.Threads("1", sample=sample)
    assert t.others(now, before) >= 0.5

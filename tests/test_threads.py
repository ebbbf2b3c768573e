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


def _cgroup_file(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_cpu_quota_is_read_from_either_cgroup_version(tmp_path):
    """The tightest quota from the process's cgroup up to the root, as CPUs (quota / period); none set: None."""
    v2 = tmp_path / "v2"
    _cgroup_file(v2 / "self", "0::/system.slice/app.service\n")
    _cgroup_file(v2 / "fs" / "cpu.max", "max 100000\n")
    _cgroup_file(v2 / "fs" / "system.slice" / "cpu.max", "max 100000\n")
    _cgroup_file(v2 / "fs" / "system.slice" / "app.service" / "cpu.max", "150000 100000\n")
    assert th.quota_cpus(str(v2 / "fs"), str(v2 / "self")) == 1.5
    _cgroup_file(v2 / "fs" / "system.slice" / "cpu.max", "50000 100000\n")  # a parent's is tighter
    assert th.quota_cpus(str(v2 / "fs"), str(v2 / "self")) == 0.5

    v1 = tmp_path / "v1"  # a container: its namespace shows "/", the limit at the controller's root
    _cgroup_file(v1 / "self", "5:memory:/\n4:cpu,cpuacct:/\n0::/\n")
    _cgroup_file(v1 / "fs" / "cpu,cpuacct" / "cpu.cfs_quota_us", "400000\n")
    _cgroup_file(v1 / "fs" / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    assert th.quota_cpus(str(v1 / "fs"), str(v1 / "self")) == 4.0
    _cgroup_file(v1 / "fs" / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1\n")  # v1's "none"
    assert th.quota_cpus(str(v1 / "fs"), str(v1 / "self")) is None
    assert th.quota_cpus(str(tmp_path / "none"), str(tmp_path / "none" / "self")) is None


def test_a_quota_caps_the_count():
    assert th.capped(8, None) == 8
    assert th.capped(8, 2.0) == 2
    assert th.capped(8, 2.5) == 3 and th.capped(8, 2.4) == 2  # rounded to nearest
    assert th.capped(8, 0.2) == 1  # at least one
    assert th.capped(2, 7.0) == 2  # never more than torch's count


def test_auto_stays_within_a_quota_and_a_number_ignores_it(monkeypatch):
    """torch counts 8 CPUs, the quota is 2: auto runs 2, and 2 still while 10 of 16 CPUs are busy elsewhere (6 free:
    choose gives 3 of torch's 8), 1 once 14 are; a number is kept as given."""
    monkeypatch.setattr(th, "PERIOD_S", 0.0)
    monkeypatch.setattr(th, "quota_cpus", lambda: 2.0)
    with torch_threads(8):
        seen = []
        with th.Threads("auto", sample=FakeCpus(16, [10.0, 14.0])) as t:
            seen.append(torch.get_num_threads())
            for _ in range(2):
                t.tick()
                seen.append(torch.get_num_threads())
        assert seen == [2, 2, 1]
        assert torch.get_num_threads() == 8
        with th.Threads("4", sample=FakeCpus(16, [0.0])):
            assert torch.get_num_threads() == 4

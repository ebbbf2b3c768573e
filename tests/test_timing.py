"""The timer: order statistics of real sleeps, and round-robin interleaving of providers."""

import time

import pytest
import torch

from specdec_cli.bench.timing import Timing, measure, measure_side_by_side


def test_timing_from_samples():
    t = Timing.from_samples([float(i) for i in range(1, 12)])  # 1..11 ms
    assert t.median_ms == 6.0 and t.n == 11
    assert t.p10_ms == pytest.approx(2.0) and t.p90_ms == pytest.approx(10.0)
    assert t.min_ms == 1.0 and t.mean_ms == pytest.approx(6.0)
    assert set(t.to_dict()) >= {"median_ms", "p10_ms", "p90_ms", "n"}
    with pytest.raises(ValueError):
        Timing.from_samples([])


def test_measure_a_sleep():
    t = measure(lambda: time.sleep(0.003), warmup=1, repeat=10, min_time_s=0.0)
    assert t.n == 10
    assert 2.9 <= t.median_ms < 30.0  # sleep never returns early; allow a slow machine
    assert t.p10_ms <= t.median_ms <= t.p90_ms


def test_min_time_extends_repeats():
    t = measure(lambda: None, warmup=0, repeat=5, min_time_s=0.02, max_repeat=2_000_000)
    assert t.n > 5


def test_side_by_side_alternates_and_rotates():
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    out = measure_side_by_side(fns, warmup=2, repeat=4, min_time_s=0.0)
    assert list(out) == ["a", "b", "c"] and all(t.n == 4 for t in out.values())
    timed = calls[6:]  # after 2 warm-up rounds of 3
    assert calls[:6] == list("abcabc")
    assert timed == list("abc" "bca" "cab" "abc")  # one call each per round, order rotating


def test_side_by_side_separates_fast_from_slow():
    fns = {"slow": lambda: time.sleep(0.004), "fast": lambda: time.sleep(0.001)}
    out = measure_side_by_side(fns, warmup=1, repeat=8, min_time_s=0.0)
    assert out["fast"].median_ms < out["slow"].median_ms


def test_cpu_tensors_use_the_cpu_clock():
    x = torch.randn(256, 256)
    t = measure(lambda: x @ x, warmup=1, repeat=5, min_time_s=0.0)
    assert t.n == 5 and t.median_ms > 0


def test_bad_arguments():
    with pytest.raises(ValueError):
        measure_side_by_side({}, repeat=3)
    with pytest.raises(ValueError):
        measure(lambda: None, repeat=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_work_is_timed_with_events():
    x = torch.randn(2048, 2048, device="cuda")
    small = measure(lambda: x[:64, :64] @ x[:64, :64], repeat=10, min_time_s=0.0)
    big = measure(lambda: x @ x @ x @ x, repeat=10, min_time_s=0.0)  # returns a CUDA tensor
    assert small.median_ms < big.median_ms
    out = measure_side_by_side({"a": lambda: x @ x, "b": lambda: x + 1}, repeat=6, min_time_s=0.0,
                               flush_l2=True)
    assert out["b"].median_ms < out["a"].median_ms

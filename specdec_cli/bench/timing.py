"""Timing small GPU/CPU functions fairly.

- CUDA work is timed with CUDA events around each call, after a `torch.cuda.synchronize()` so the
  queue is empty: a sample is launch overhead + kernel time of that one call (what a decoding step
  pays), not the throughput of back-to-back calls. CPU work is timed with `time.perf_counter_ns`.
- When several implementations are compared, `measure_side_by_side` interleaves them: every round
  calls each provider once, and the order rotates from round to round, so clock boosts, thermal
  drift and noisy neighbours hit all providers alike instead of whichever ran last.
- Statistics are order statistics (median, p10, p90): robust to the occasional preempted sample.
- The garbage collector is paused while timing (as `timeit` does).
"""

from __future__ import annotations

import dataclasses
import gc
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than any current GPU's L2 cache


@dataclass(frozen=True)
class Timing:
    """Summary of n timed calls, in milliseconds per call."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    n: int
    mean_ms: float = math.nan
    std_ms: float = math.nan
    min_ms: float = math.nan

    @classmethod
    def from_samples(cls, samples_ms) -> Timing:
        x = np.asarray(list(samples_ms), dtype=np.float64)
        if x.size == 0:
            raise ValueError("no timing samples")
        p10, p50, p90 = np.percentile(x, [10, 50, 90])
        std = float(x.std(ddof=1)) if x.size > 1 else 0.0
        return cls(float(p50), float(p10), float(p90), int(x.size), float(x.mean()), std,
                   float(x.min()))

    def to_dict(self) -> dict[str, float | int]:
        return dataclasses.asdict(self)


def _find_device(obj: Any, depth: int = 0) -> str | None:
    """'cuda' if a CUDA tensor is anywhere in obj (tensor, sequence, mapping, dataclass), else
    'cpu' if a tensor was found, else None."""
    if isinstance(obj, torch.Tensor):
        return "cuda" if obj.is_cuda else "cpu"
    if depth > 3:
        return None
    if isinstance(obj, Mapping):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        items = list(obj)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        items = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    else:
        return None
    found = None
    for item in items[:64]:
        d = _find_device(item, depth + 1)
        if d == "cuda":
            return d
        found = found or d
    return found


def _resolve_device(device, results: list[Any]) -> str:
    if device is not None:
        return "cuda" if torch.device(device).type == "cuda" else "cpu"
    found = [_find_device(r) for r in results]
    if "cuda" in found:
        return "cuda"
    if "cpu" in found:
        return "cpu"
    # Nothing returned a tensor: synchronise if CUDA is in use at all (harmless, and safe).
    return "cuda" if torch.cuda.is_available() and torch.cuda.is_initialized() else "cpu"


def measure_side_by_side(
    fns: Mapping[str, Callable[[], Any]],
    *,
    warmup: int = 5,
    repeat: int = 50,
    min_time_s: float = 0.1,
    max_repeat: int = 10_000,
    device: str | torch.device | None = None,
    flush_l2: bool = False,
) -> dict[str, Timing]:
    """Time several zero-argument callables against each other, round-robin.

    Each provider runs `warmup` untimed calls, then rounds of one timed call per provider (the order
    rotating each round) until at least `repeat` rounds were done and at least `min_time_s` of wall
    time was spent in timed rounds, or `max_repeat` rounds. `device` ("cuda"/"cpu") chooses the
    clock; by default it is CUDA if any warm-up call returned a CUDA tensor. `flush_l2` (CUDA only)
    overwrites a 256 MiB buffer before every call so inputs are read from HBM, not L2 (off by
    default: in decoding the logits were usually just written by the LM head).
    Returns {name: Timing} in the order of `fns`.
    """
    names = list(fns)
    if not names:
        raise ValueError("no functions to time")
    if repeat < 1 or max_repeat < repeat or warmup < 0:
        raise ValueError(f"need warmup >= 0 and 1 <= repeat <= max_repeat, got {warmup}, {repeat}, "
                         f"{max_repeat}")

    dev = _resolve_device(device, _warm_up(fns, warmup))
    cuda = dev == "cuda"
    flush_buf = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda") if cuda and flush_l2 else None
    samples: dict[str, list[Any]] = {n: [] for n in names}  # ms, or CUDA's (start, end) events read at the end

    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        spent_s, rounds = 0.0, 0
        while rounds < max_repeat and (rounds < repeat or spent_s < min_time_s):
            k = rounds % len(names)
            for name in names[k:] + names[:k]:  # rotate the order every round
                wall_s, sample = _timed_call(fns[name], cuda, flush_buf)
                spent_s += wall_s
                samples[name].append(sample)
            rounds += 1
        if cuda:
            torch.cuda.synchronize()
            samples = {n: [float(start.elapsed_time(end)) for start, end in events] for n, events in samples.items()}
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: Timing.from_samples(samples[name]) for name in names}


def _warm_up(fns: Mapping[str, Callable[[], Any]], warmup: int) -> list[Any]:
    """`warmup` untimed calls of each provider; -> what each first call returned (where the clock runs)."""
    results: list[Any] = []
    for i in range(warmup):
        for fn in fns.values():
            out = fn()
            if i == 0:
                results.append(out)
    return results


def _timed_call(fn: Callable[[], Any], cuda: bool, flush_buf: torch.Tensor | None) -> tuple[float, Any]:
    """One timed call -> (its wall seconds, its time: ms on the CPU, or CUDA's (start, end) events, read later)."""
    if flush_buf is not None:
        flush_buf.zero_()
    if not cuda:
        t0 = time.perf_counter_ns()
        fn()
        dt = time.perf_counter_ns() - t0
        return dt * 1e-9, dt * 1e-6
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter_ns()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return (time.perf_counter_ns() - t0) * 1e-9, (start, end)


def measure(
    fn: Callable[[], Any],
    *,
    warmup: int = 5,
    repeat: int = 50,
    min_time_s: float = 0.1,
    max_repeat: int = 10_000,
    device: str | torch.device | None = None,
    flush_l2: bool = False,
) -> Timing:
    """Time one zero-argument callable: see `measure_side_by_side` for the rules."""
    return measure_side_by_side(
        {"fn": fn}, warmup=warmup, repeat=repeat, min_time_s=min_time_s, max_repeat=max_repeat,
        device=device, flush_l2=flush_l2,
    )["fn"]

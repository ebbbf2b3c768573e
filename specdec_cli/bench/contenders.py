"""A decoding task's benchmark, whatever the task: every contender (autoregressive, then γ × mode) decodes every
input, and each becomes a TaskRecord; `aggregate` adds the measured speedup over autoregressive decoding and
Leviathan's prediction from the measured α and cost ratio c (the paper's tables 1, 5; figures 4, 5 from the
peak memory). The tasks plug in through runners.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from specdec_cli import options
from specdec_cli.bench import metrics, speedup
from specdec_cli.bench.machine import PeakMemory
from specdec_cli.decoding import GenerationStats

Progress = Callable[[str], None]  # called once per finished unit of work, with its label


@dataclass
class TaskRecord:
    """One (γ, mode) run of a decoding task over all its inputs. `mode == "autoregressive"` (γ = 0) is
    the reference every speedup is measured against. A task runner fills the measured fields; the
    derived ones are filled by `aggregate`."""

    task: str
    gamma: int
    mode: str
    new_tokens: int
    wall_s: float  # the decoding loop over every input (prefill included)
    tokens_per_s: float
    acceptance_rate: float | None  # accepted / drafted (None for autoregressive)
    mean_accepted_per_call: float | None  # accepted draft tokens per sequence per target call
    verify_ms_per_call: float | None
    draft_ms_per_forward: float | None  # one draft forward pass (None for autoregressive)
    target_ms_per_forward: float | None  # one target forward pass (the one-token step for autoregressive)
    peak_memory_mib: float | None  # PeakMemory: CUDA tensors, or the process's peak resident set on a CPU
    quality: dict[str, float] = field(default_factory=dict)  # rouge1/rouge2/rougeL or wer (score_quality)
    backend: str | None = None  # the verification backend that ran ("torch", "triton", ...)
    outputs: list[str] = field(default_factory=list)  # the text of each input, in input order
    # derived by aggregate()
    speedup: float | None = None  # tokens/s over autoregressive tokens/s, measured
    alpha: float | None = None  # Leviathan's α, from mean_accepted_per_call
    cost_ratio: float | None = None  # c = draft ms per forward / target ms per forward
    predicted_speedup: float | None = None  # walltime_speedup(α, γ, c)
    best_gamma: int | None = None  # best_gamma(α, c)
    same_as_autoregressive: float | None = None  # share of inputs whose output equals autoregressive's


WARMUP_TOKENS = 8  # new tokens of the untimed warm-up decode of each mode

# decode(mode, γ, short) -> (texts in input order, finished GenerationStats summed over the inputs);
# short: the first input only, at most WARMUP_TOKENS new tokens (the warm-up).
Decode = Callable[[str, int, bool], tuple[list[str], GenerationStats]]


def run_contenders(config, decode: Decode, references: list[str] | None,
                   progress: Progress) -> list[TaskRecord]:
    """A task runner's loop: autoregressive (γ = 0), then every γ × mode, each decoding every input.
    Every mode first runs one short untimed decode (first-call costs stay out of the figures); each
    contender then runs config.repeat times and keeps its fastest pass, with that pass's peak memory."""
    contenders = [("autoregressive", 0)] + [(m, g) for g in config.gammas for m in config.modes]
    for mode in dict.fromkeys(m for m, _ in contenders):
        decode(mode, 0 if mode == "autoregressive" else config.gammas[0], True)
    records = []
    for mode, gamma in contenders:
        best = None
        for _ in range(config.repeat):
            with PeakMemory(config.device) as peak:
                texts, stats = decode(mode, gamma, False)
            if best is None or stats.wall_s < best[1].wall_s:
                best = (texts, stats, peak.mib)
        records.append(task_record(config.task, mode, gamma, *best, references))
        progress("autoregressive" if mode == "autoregressive" else f"{mode} γ={gamma}")
    return records


def task_record(task: str, mode: str, gamma: int, texts: list[str], stats, peak_mib: float | None,
                references: list[str] | None) -> TaskRecord:
    """A TaskRecord from one pass: its texts and its finished GenerationStats (decoding.stats)."""
    return TaskRecord(
        task=task, gamma=gamma, mode=mode, new_tokens=stats.new_tokens, wall_s=stats.wall_s,
        tokens_per_s=stats.tokens_per_s, acceptance_rate=stats.acceptance_rate,
        mean_accepted_per_call=stats.mean_accepted_per_call, verify_ms_per_call=stats.verify_ms_per_call,
        draft_ms_per_forward=1e3 * stats.draft_s / stats.draft_calls if stats.draft_calls else None,
        target_ms_per_forward=1e3 * stats.target_s / stats.target_calls if stats.target_calls else None,
        peak_memory_mib=peak_mib,
        quality=score_quality(task, texts, references) if references else {},
        backend=stats.backend, outputs=list(texts),
    )


def score_quality(task: str, predictions: list[str], references: list[str]) -> dict[str, float]:
    """summarize: mean ROUGE-1/2/L F1; transcribe: corpus WER (metrics.py)."""
    if task == "summarize":
        return metrics.corpus_rouge(predictions, references)
    if task == "transcribe":
        return {"wer": metrics.wer(predictions, references)}
    raise ValueError(f"no quality metric for task {task!r}")


def aggregate(records: list[TaskRecord], greedy: bool = True) -> list[TaskRecord]:
    """Fill the derived fields: the measured speedup over the autoregressive record, Leviathan's
    prediction (Theorem 3.8) from the measured α and c, and (greedy only: sampled outputs differ draw by
    draw) the share of outputs equal to the autoregressive ones.

    α is inverted from mean_accepted_per_call (not accepted / drafted, which undercounts it: see
    speedup.acceptance_from_mean_accepted). c = draft ms per forward / target ms per forward, where
    the target's one-token step is taken from the autoregressive record when there is one (the model's
    assumption: scoring γ+1 positions costs one target step); else from the record itself.
    """
    ar = next((r for r in records if r.mode == "autoregressive"), None)
    for r in records:
        if r.mode == "autoregressive":
            r.speedup = 1.0
            continue
        if ar is not None and ar.tokens_per_s > 0:
            r.speedup = r.tokens_per_s / ar.tokens_per_s
        if greedy and ar is not None and ar.outputs and len(r.outputs) == len(ar.outputs):
            r.same_as_autoregressive = sum(a == b for a, b in zip(r.outputs, ar.outputs)) / len(ar.outputs)
        if r.mean_accepted_per_call is None or r.gamma < 1:
            continue
        r.alpha = speedup.acceptance_from_mean_accepted(min(r.mean_accepted_per_call, r.gamma), r.gamma)
        target_ms = ar.target_ms_per_forward if ar is not None and ar.target_ms_per_forward else r.target_ms_per_forward
        if r.draft_ms_per_forward is None or not target_ms:
            continue
        r.cost_ratio = r.draft_ms_per_forward / target_ms
        r.predicted_speedup = speedup.walltime_speedup(r.alpha, r.gamma, r.cost_ratio)
        r.best_gamma = speedup.best_gamma(r.alpha, r.cost_ratio, options.MAX_GAMMA)
    return records


# The task tables' columns (record field, header), three tables narrow enough for 80 columns: speed;
# acceptance and cost (the inputs of the prediction); quality (its columns are appended per task).
TASK_SPEED_COLUMNS = (
    ("gamma", "γ"), ("mode", "mode"), ("new_tokens", "tokens"), ("wall_s", "wall s"), ("tokens_per_s", "tok/s"),
    ("speedup", "speedup"), ("predicted_speedup", "predicted"), ("best_gamma", "best γ"),
)
TASK_COST_COLUMNS = (
    ("gamma", "γ"), ("mode", "mode"), ("acceptance_rate", "acc"), ("mean_accepted_per_call", "acc/call"),
    ("alpha", "α"), ("cost_ratio", "c"), ("verify_ms_per_call", "verify ms"), ("peak_memory_mib", "peak MiB"),
)
TASK_QUALITY_COLUMNS = (("gamma", "γ"), ("mode", "mode"), ("same_as_autoregressive", "= AR"))
TASK_COLUMNS = tuple(dict.fromkeys(TASK_SPEED_COLUMNS + TASK_COST_COLUMNS + TASK_QUALITY_COLUMNS))

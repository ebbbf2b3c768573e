"""A decoding task's benchmark, whatever the task: every contender (autoregressive, then schedule × γ × mode)
decodes every input, and each becomes a TaskRecord; `aggregate` adds the measured speedup over autoregressive
decoding at the same thread count and Leviathan's prediction from the measured α and cost ratio c (the paper's
tables 1, 5; figures 4, 5 from the peak memory). The tasks plug in through runners.py; a sweep over threads
and draft options runs these contenders once per setting (runners.run_task).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

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
    gamma: int  # constant: γ; heuristic: its start; auto: its upper bound; 0 for autoregressive
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
    schedule: str | None = None  # the γ schedule (decoding/schedule.py); None for autoregressive
    threads: int | None = None  # torch intra-op threads it ran with
    draft: str | None = None  # "lookup", or a model draft's options ("vocab 32768, quantized"); None: autoregressive
    rounds_per_gamma: list[int] = field(default_factory=list)  # [γ]: rounds run at that γ (0: plain steps)
    mean_gamma: float | None = None  # draft tokens per round, plain steps counted as 0
    measured: dict | None = None  # what the auto schedule measured (decoding.schedule.Auto.estimates)
    end_to_end_s: float | None = None  # transcribe: features + encoder + probe + decoding, load excluded
    encoder_s: float | None = None  # transcribe: the target's encoder (and a draft's own) alone
    target_int8: bool = False  # the target's linears in int8 (transcribe --target-int8)
    encoder_int8: bool | None = None  # the encoder's linears in int8 (transcribe --encoder-int8); None: no encoder
    peer: str | None = None  # another tool (peers.py), e.g. "faster-whisper"; None: specdec
    verify_s: float | None = None  # the verification calls' seconds summed over every input (the paper's profiling time)
    verify_share: float | None = None  # verify_s over the decoding loops' wall_s
    prefill_s: float | None = None  # the prompts' prefill (a peer's: its time to the first token), within wall_s
    input_wall_s: list[float] = field(default_factory=list)  # each input's share of wall_s, in input order
    # derived by aggregate()
    speedup: float | None = None  # tokens/s over autoregressive tokens/s, measured
    alpha: float | None = None  # Leviathan's α, from mean_accepted_per_call
    cost_ratio: float | None = None  # c = draft ms per forward / target ms per forward
    predicted_speedup: float | None = None  # walltime_speedup(α, γ, c)
    best_gamma: int | None = None  # best_gamma(α, c)
    same_as_autoregressive: float | None = None  # share of inputs whose output equals autoregressive's
    pass_ratio: float | None = None  # the target's ms per call here over its one-token step (autoregressive's)
    end_to_end_speedup: float | None = None  # autoregressive's end_to_end_s over this one's (same threads)
    verify_vs_baseline: float | None = None  # 1 − verify_s / baseline's at the same γ and schedule (paper: Δ% profiling)

    @property
    def int8(self) -> str | None:
        """Which of the target's parts ran on int8 weights (--target-int8: the decoder, --encoder-int8: the encoder),
        in a word for the end-to-end table; None for a peer."""
        if self.peer is not None:
            return None
        return {(True, True): "both", (True, False): "decoder", (False, True): "encoder"}.get(
            (self.target_int8, bool(self.encoder_int8)), "none")


WARMUP_TOKENS = 8  # new tokens of the untimed warm-up decode of each mode

@dataclass(frozen=True)
class Contender:
    mode: str
    gamma: int = 0
    schedule: str | None = None  # None for autoregressive

    @property
    def label(self) -> str:
        return self.mode if self.mode == "autoregressive" else f"{self.mode} {self.schedule} γ={self.gamma}"


AUTOREGRESSIVE = Contender("autoregressive")

# decode(contender, short) -> (texts in input order, finished GenerationStats summed over the inputs, stages:
# {"end_to_end_s", "encoder_s"} where the task times them, else {}); short: the first input only, at most
# WARMUP_TOKENS new tokens (the warm-up).
Decode = Callable[[Contender, bool], tuple[list[str], GenerationStats, dict]]


def contenders_of(config, autoregressive: bool = True) -> list[Contender]:
    """Autoregressive (unless told not), then every schedule × γ × mode of a TaskConfig."""
    spec = [Contender(m, g, s) for s in config.schedules for g in config.gammas for m in config.modes]
    return ([AUTOREGRESSIVE] if autoregressive else []) + spec


@dataclass
class Run:
    """A contender as the rounds take it, specdec's or a peer tool's: warm() once, untimed (first calls); once() one
    timed pass over every input -> (seconds, what record needs, its peak memory in MiB where measured in a process
    of its own, else None: measured here); record(that of its fastest pass, the pass's peak memory) -> its
    TaskRecord."""

    label: str
    warm: Callable[[], None]
    once: Callable[[], tuple[float, object, float | None]]
    record: Callable[[object, float | None], TaskRecord]


def run_rounds(runs: list[Run], repeat: int, device: str, progress: Progress) -> list[TaskRecord]:
    """Every run warmed, then `repeat` rounds each taking every run once, the first of a round rotating (a host
    whose speed drifts over minutes slows them alike; progress after each pass); each run's record from its fastest
    pass, in `runs`' order."""
    for r in runs:
        r.warm()
    n = len(runs)
    best: list = [None] * n  # per run: (seconds, result, peak MiB) of its fastest pass
    for round_ in range(repeat):
        for i in ((round_ + j) % n for j in range(n)):
            with PeakMemory(device) as peak:
                seconds, result, mib = runs[i].once()
            if best[i] is None or seconds < best[i][0]:
                best[i] = (seconds, result, peak.mib if mib is None else mib)
            progress(runs[i].label)
    return [r.record(result, mib) for r, (_, result, mib) in zip(runs, best, strict=True)]


def run_contenders(config, contenders: list[Contender], decode: Decode, references: list[str] | None,
                   progress: Progress, peers: list[Run] = (), **setting) -> list[TaskRecord]:
    """A task runner's loop: each contender decodes every input, in run_rounds with the `peers` (other tools' runs
    on the same inputs) beside them. Every mode first runs one short untimed decode (first-call costs stay out of
    the figures). `setting` (threads, draft) goes into each of the contenders' records."""
    warmed: set[str] = set()

    def run(c: Contender) -> Run:
        def warm():
            if c.mode not in warmed:
                warmed.add(c.mode)
                decode(c, True)

        def once():
            texts, stats, stages = decode(c, False)
            return stats.wall_s, (texts, stats, stages), None

        def record(result, mib):
            texts, stats, stages = result
            r = task_record(config.task, c, texts, stats, mib, references, stages)
            r.threads = setting.get("threads")
            r.target_int8 = bool(setting.get("target_int8"))
            r.encoder_int8 = setting.get("encoder_int8")
            r.draft = None if c.mode == "autoregressive" else setting.get("draft")
            return r

        return Run(c.label, warm, once, record)

    return run_rounds([run(c) for c in contenders] + list(peers), config.repeat, config.device, progress)


def task_record(task: str, contender: Contender, texts: list[str], stats, peak_mib: float | None,
                references: list[str] | None, stages: dict | None = None) -> TaskRecord:
    """A TaskRecord from one pass: its texts, its finished GenerationStats (decoding.stats) and its stages."""
    history = stats.gamma_history
    return TaskRecord(
        task=task, gamma=contender.gamma, mode=contender.mode, new_tokens=stats.new_tokens, wall_s=stats.wall_s,
        tokens_per_s=stats.tokens_per_s, acceptance_rate=stats.acceptance_rate,
        mean_accepted_per_call=stats.mean_accepted_per_call, verify_ms_per_call=stats.verify_ms_per_call,
        draft_ms_per_forward=1e3 * stats.draft_s / stats.draft_calls if stats.draft_calls else None,
        target_ms_per_forward=1e3 * stats.target_s / stats.target_calls if stats.target_calls else None,
        peak_memory_mib=peak_mib,
        quality=score_quality(task, texts, references) if references else {},
        backend=stats.backend, outputs=list(texts), schedule=contender.schedule,
        rounds_per_gamma=list(stats.rounds_per_gamma), mean_gamma=sum(history) / len(history) if history else None,
        measured=stats.schedule, end_to_end_s=(stages or {}).get("end_to_end_s"), prefill_s=stats.prefill_s,
        encoder_s=(stages or {}).get("encoder_s"), input_wall_s=list((stages or {}).get("input_wall_s", [])),
        verify_s=stats.verify_s if stats.verify_calls else None,
        verify_share=stats.verify_s / stats.wall_s if stats.verify_calls and stats.wall_s > 0 else None,
    )


def score_quality(task: str, predictions: list[str], references: list[str]) -> dict[str, float]:
    """summarize: mean ROUGE-1/2/L F1; transcribe: corpus WER (metrics.py)."""
    if task == "summarize":
        return metrics.corpus_rouge(predictions, references)
    if task == "transcribe":
        return {"wer": metrics.wer(predictions, references)}
    raise ValueError(f"no quality metric for task {task!r}")


def aggregate(records: list[TaskRecord], greedy: bool = True) -> list[TaskRecord]:
    """Fill the derived fields: the measured speedup over the autoregressive record of the same thread count,
    Leviathan's prediction (Theorem 3.8) from the measured α and c, and (greedy only: sampled outputs differ
    draw by draw) the share of outputs equal to the autoregressive ones.

    α is inverted from mean_accepted_per_call (not accepted / drafted, which undercounts it: see
    speedup.acceptance_from_mean_accepted). c = draft ms per forward / target ms per forward, where
    the target's one-token step is taken from the autoregressive record when there is one (the model's
    assumption: scoring γ+1 positions costs one target step); else from the record itself. pass_ratio is what
    that assumption misses: the target's ms per call here over its one-token step. Where γ varies (auto,
    heuristic) there is no one γ to predict for: α is the schedule's own estimate when it made one.
    """
    ars = {_target(r): r for r in records if r.mode == "autoregressive"}
    # the unmodified target alone, per thread count: no int8 target, its own encoder where a sweep ran one
    plains = {r.threads: r for r in sorted(ars.values(), key=lambda r: r.encoder_int8 is False) if not r.target_int8}
    baselines = {_point(r): r for r in records if r.mode == "baseline" and r.peer is None}
    for r in records:
        b = baselines.get(_point(r))
        if b is not None and r.verify_s is not None and b.verify_s:
            r.verify_vs_baseline = 1 - r.verify_s / b.verify_s
        # end to end: every contender (a peer too) against specdec's unmodified target alone
        plain = plains.get(r.threads)
        if plain is not None and plain.end_to_end_s and r.end_to_end_s:
            r.end_to_end_speedup = plain.end_to_end_s / r.end_to_end_s
        if r.mode == "autoregressive" and not r.target_int8:
            r.speedup = 1.0
            continue
        ar = ars.get(_target(r)) if r.mode != "autoregressive" and r.peer is None else plain
        if r.peer is not None and r.end_to_end_s is None and plain is not None and plain.tokens_per_s > 0:
            r.speedup = r.tokens_per_s / plain.tokens_per_s  # a peer timed as the loops are (hf-assisted: same target)
        if r.peer is not None or r.mode == "autoregressive":  # another model (or tool): tokens/s differ in kind
            if greedy and ar is not None and ar.outputs and len(r.outputs) == len(ar.outputs):
                r.same_as_autoregressive = sum(a == b for a, b in zip(r.outputs, ar.outputs)) / len(ar.outputs)
            continue
        if ar is not None and ar.tokens_per_s > 0:
            r.speedup = r.tokens_per_s / ar.tokens_per_s
        if greedy and ar is not None and ar.outputs and len(r.outputs) == len(ar.outputs):
            r.same_as_autoregressive = sum(a == b for a, b in zip(r.outputs, ar.outputs)) / len(ar.outputs)
        target_ms = ar.target_ms_per_forward if ar is not None and ar.target_ms_per_forward else r.target_ms_per_forward
        if r.draft_ms_per_forward is not None and target_ms:
            r.cost_ratio = r.draft_ms_per_forward / target_ms
        if r.target_ms_per_forward and ar is not None and ar.target_ms_per_forward:
            r.pass_ratio = r.target_ms_per_forward / ar.target_ms_per_forward
        if r.schedule not in (None, "constant"):
            r.alpha = (r.measured or {}).get("alpha")
            continue
        if r.mean_accepted_per_call is None or r.gamma < 1:
            continue
        r.alpha = speedup.acceptance_from_mean_accepted(min(r.mean_accepted_per_call, r.gamma), r.gamma)
        if r.cost_ratio is None:
            continue
        r.predicted_speedup = speedup.walltime_speedup(r.alpha, r.gamma, r.cost_ratio)
        r.best_gamma = speedup.best_gamma(r.alpha, r.cost_ratio, options.MAX_GAMMA)
    return records


def _target(r: TaskRecord) -> tuple:
    """The target a record decoded with: its threads and weights."""
    return r.threads, r.target_int8, r.encoder_int8


def _point(r: TaskRecord) -> tuple:
    """Where two modes are compared: the same setting, schedule and γ."""
    return *_target(r), r.draft, r.schedule, r.gamma


# The task tables' columns (record field, header), three tables narrow enough for 80 columns: speed;
# acceptance and cost (the inputs of the prediction); memory and quality (its columns are appended per task).
TASK_SPEED_COLUMNS = (
    ("schedule", "schedule"), ("gamma", "γ"), ("mode", "mode"), ("new_tokens", "tokens"), ("wall_s", "wall s"),
    ("tokens_per_s", "tok/s"), ("speedup", "speedup"), ("predicted_speedup", "predicted"), ("best_gamma", "best γ"),
)
TASK_COST_COLUMNS = (
    ("schedule", "schedule"), ("gamma", "γ"), ("mode", "mode"), ("mean_gamma", "mean γ"), ("acceptance_rate", "acc"),
    ("alpha", "α"), ("cost_ratio", "c"), ("pass_ratio", "pass"), ("verify_ms_per_call", "verify ms"),
)
# prefill_s and input_wall_s are in the JSON and CSV only: another column cuts a peer's name at 80 columns
TASK_QUALITY_COLUMNS = (("schedule", "schedule"), ("gamma", "γ"), ("mode", "mode"), ("peak_memory_mib", "peak MiB"),
                        ("same_as_autoregressive", "= AR"))
# transcribe only (where end_to_end_s is measured): end to end against the unmodified target alone, peers included
# (= AR is in the quality table: with a peer's name the row would not fit 80 columns)
TASK_END_TO_END_COLUMNS = (("schedule", "schedule"), ("gamma", "γ"), ("mode", "mode"), ("int8", "int8"),
                           ("end_to_end_s", "e2e s"), ("encoder_s", "encoder s"), ("end_to_end_speedup", "e2e ×"))
# the verification's time over the corpus, its share of decoding, its change against baseline (the paper's Table 1)
TASK_PROFILING_COLUMNS = (("schedule", "schedule"), ("gamma", "γ"), ("mode", "mode"), ("verify_s", "verify s"),
                          ("verify_share", "share"), ("verify_vs_baseline", "Δ vs base"))
TASK_COLUMNS = tuple(dict.fromkeys(TASK_SPEED_COLUMNS + TASK_COST_COLUMNS + TASK_QUALITY_COLUMNS
                                   + TASK_PROFILING_COLUMNS))

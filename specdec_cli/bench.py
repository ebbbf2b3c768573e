"""What `specdec bench` measures, and how its results are written.

Two kinds of benchmark share the outputs (table, JSON, CSV, plots):

synthetic   one verification step, timed per provider on LM-like logits from `synthetic.make_case`,
            over a grid of vocabulary V × draft length γ × batch B (the paper's figure 3, tables 6
            and 8). Providers are the verification modes (`baseline`, `exact`, `sigmoid`, through
            `verify.verify`) and `hf`: transformers' own `_speculative_sampling`, called literally
            (B = 1 only), the paper's real baseline. All providers of a grid point are timed side by
            side (`timing.measure_side_by_side`), so their ratios share the machine's noise.
summarize,  a decoding task run per (γ, mode) by a *task runner* (see TASK_RUNNERS), which returns
transcribe  `TaskRecord`s; `aggregate` adds the measured speedup over autoregressive decoding and
            Leviathan's prediction from the measured α and cost ratio c (the paper's tables 1, 5;
            figures 4, 5 from the peak memory).
"""

from __future__ import annotations

import csv
import datetime
import os
import platform
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Protocol

import torch

from specdec_cli.errors import SpecdecError

if TYPE_CHECKING:
    from specdec_cli.decoding import GenerationStats

TASKS = ("synthetic", "summarize", "transcribe")
SYNTHETIC_MODES = ("baseline", "exact", "sigmoid", "hf")  # hf: transformers' _speculative_sampling
TASK_MODES = ("baseline", "exact", "sigmoid")  # autoregressive always runs too: it is the reference
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BACKENDS = ("auto", "torch", "triton")
MAX_GAMMA = 32
WARMUP = 5
ACCEPTANCE_POOL = 64  # distinct uniform draws cycled through the timed calls of one grid point
HF_PROMPT_LEN = 16  # tokens before the draft in hf's candidate_input_ids (it only reads the last γ)

Progress = Callable[[str], None]  # called once per finished unit of work, with its label


# ----------------------------------------------------------------------------------------------- options


def parse_ints(text: str, option: str) -> list[int]:
    """'1,5,10' -> [1, 5, 10] (sorted, duplicates dropped). Empty items are ignored; no items is an error."""
    items = [s.strip() for s in str(text).split(",") if s.strip()]
    if not items:
        raise SpecdecError(f"{option} is empty: give a comma-separated list such as 1,5,10")
    try:
        return sorted({int(s) for s in items})
    except ValueError:
        raise SpecdecError(f"{option} must be a comma-separated list of integers (got {text!r})") from None


def parse_names(text: str, option: str, allowed: Iterable[str]) -> list[str]:
    """'exact,sigmoid' -> ['exact', 'sigmoid'] (order kept, duplicates dropped), each checked against allowed."""
    allowed = tuple(allowed)
    names = list(dict.fromkeys(s.strip() for s in str(text).split(",") if s.strip()))
    if not names:
        raise SpecdecError(f"{option} is empty: choose from {', '.join(allowed)}")
    for n in names:
        if n not in allowed:
            raise SpecdecError(f"{option}: unknown {n!r} (choose from {', '.join(allowed)})")
    return names


@dataclass
class SyntheticConfig:
    vocabs: list[int]
    gammas: list[int]
    batches: list[int]
    modes: list[str]
    device: str = "cpu"
    dtype: str = "float32"
    overlap: float = 0.8
    repeat: int = 50
    backend: str = "auto"
    alpha: float = -1e4
    beta: float = 1e4
    seed: int = 0
    threads: int | None = None  # torch intra-op threads; None: torch's default

    def validate(self) -> "SyntheticConfig":
        for option, grid in (("--vocab", self.vocabs), ("--gamma", self.gammas), ("--batch", self.batches),
                             ("--modes", self.modes)):
            if not grid:
                raise SpecdecError(f"{option} is empty")
        if min(self.vocabs) < 2:
            raise SpecdecError(f"--vocab must be at least 2 (got {min(self.vocabs)})")
        _check_gammas(self.gammas)
        if min(self.batches) < 1:
            raise SpecdecError(f"--batch must be at least 1 (got {min(self.batches)})")
        for m in self.modes:
            if m not in SYNTHETIC_MODES:
                raise SpecdecError(f"--modes: unknown {m!r} (choose from {', '.join(SYNTHETIC_MODES)})")
        if self.modes == ["hf"] and 1 not in self.batches:
            raise SpecdecError("--modes hf runs at batch 1 only: add 1 to --batch")
        _check_common(self.dtype, self.backend, self.repeat, self.alpha, self.beta, self.threads)
        if not 0.0 < self.overlap <= 1.0:
            raise SpecdecError(f"--overlap must be in (0, 1] (got {self.overlap})")
        return self

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def kernel_backend(self) -> str:
        """Which backend exact/sigmoid run on: the --backend choice, auto = triton on CUDA, torch on CPU."""
        if self.backend == "auto":
            return "triton" if self.device == "cuda" else "torch"
        return self.backend

    def command(self) -> str:
        """A command line that reproduces this run."""
        args = ["specdec", "bench", "--task", "synthetic", "--vocab", _join(self.vocabs), "--gamma",
                _join(self.gammas), "--batch", _join(self.batches), "--modes", ",".join(self.modes),
                "--device", self.device, "--dtype", self.dtype, "--overlap", str(self.overlap), "--repeat",
                str(self.repeat), "--backend", self.backend, "--alpha", str(self.alpha), "--beta",
                str(self.beta), "--seed", str(self.seed)] + _threads_arg(self.threads)
        return shlex.join(args)


# A task's own settings (TaskConfig.options), each the `specdec bench` option of that name ("max_new_tokens" ->
# --max-new-tokens); an option left out takes the task runner's default. Library callers may also pass
# "inputs" (paths) and "references" (texts) instead of "data".
TASK_OPTIONS = ("data", "limit", "target", "draft", "draft_vocab", "max_new_tokens", "temperature")


@dataclass
class TaskConfig:
    """What a task runner is asked to run: every γ × every mode, plus autoregressive once (γ = 0).
    `options` carries the task's own settings (TASK_OPTIONS). dtype is the models' ("auto" allowed)."""

    task: str
    gammas: list[int]
    modes: list[str]
    batch: int = 1
    device: str = "cpu"
    dtype: str = "auto"
    repeat: int = 1
    backend: str = "auto"
    alpha: float = -1e4
    beta: float = 1e4
    seed: int = 0
    threads: int | None = None
    options: dict = field(default_factory=dict)

    def validate(self) -> "TaskConfig":
        """Checks every option, finds the inputs (task_inputs) and reads them, all before any model loads."""
        if self.task not in TASKS or self.task == "synthetic":
            raise SpecdecError(f"--task must be one of {', '.join(TASKS)} (got {self.task!r})")
        if not self.gammas:
            raise SpecdecError("--gamma is empty")
        _check_gammas(self.gammas)
        if not self.modes:
            raise SpecdecError(f"--modes is empty: choose from {', '.join(TASK_MODES)} (autoregressive always runs)")
        for m in self.modes:
            if m not in TASK_MODES:
                raise SpecdecError(f"--modes: unknown {m!r} for --task {self.task} (choose from {', '.join(TASK_MODES)})")
        if self.batch < 1:
            raise SpecdecError(f"--batch must be at least 1 (got {self.batch})")
        _check_common(self.dtype, self.backend, self.repeat, self.alpha, self.beta, self.threads,
                      dtypes=("auto", *DTYPES))
        opts = self.options
        for key, least in (("limit", 1), ("max_new_tokens", 1), ("draft_vocab", 0)):
            if opts.get(key) is not None and opts[key] < least:
                raise SpecdecError(f"{_flag(key)} must be at least {least} (got {opts[key]})")
        t = opts.get("temperature")
        if t is not None and not 0.0 <= t < float("inf"):
            raise SpecdecError(f"--temperature must be 0 (greedy) or positive (got {t})")
        if self.task not in TASK_RUNNERS:
            raise SpecdecError(f"--task {self.task} is not available yet: use --task synthetic")
        read_task_inputs(self.task, task_inputs(self)[0])
        return self

    @property
    def greedy(self) -> bool:
        return not self.options.get("temperature")

    def command(self) -> str:
        args = ["specdec", "bench", "--task", self.task, "--gamma", _join(self.gammas), "--modes",
                ",".join(self.modes), "--batch", str(self.batch), "--device", self.device, "--dtype", self.dtype,
                "--repeat", str(self.repeat), "--backend", self.backend, "--alpha", str(self.alpha), "--beta",
                str(self.beta), "--seed", str(self.seed)] + _threads_arg(self.threads)
        for key in TASK_OPTIONS:
            if self.options.get(key) is not None:
                args += [_flag(key), str(self.options[key])]
        return shlex.join(args)


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _threads_arg(threads) -> list[str]:
    return [] if threads is None else ["--threads", str(threads)]


def _join(xs) -> str:
    return ",".join(str(x) for x in xs)


def _check_gammas(gammas):
    bad = [g for g in gammas if not 1 <= g <= MAX_GAMMA]
    if bad:
        raise SpecdecError(f"--gamma must be between 1 and {MAX_GAMMA} (got {bad[0]})")


def _check_common(dtype, backend, repeat, alpha, beta, threads, dtypes=tuple(DTYPES)):
    if dtype not in dtypes:
        raise SpecdecError(f"--dtype must be one of {', '.join(dtypes)} (got {dtype!r})")
    if backend not in BACKENDS:
        raise SpecdecError(f"--backend must be one of {', '.join(BACKENDS)} (got {backend!r})")
    if repeat < 1:
        raise SpecdecError(f"--repeat must be at least 1 (got {repeat})")
    if not alpha < beta:
        raise SpecdecError(f"--alpha must be below --beta (got α={alpha}, β={beta})")
    if threads is not None and threads < 1:
        raise SpecdecError(f"--threads must be at least 1 (got {threads})")


def warnings_for(config: SyntheticConfig | TaskConfig) -> list[str]:
    """Things about this run the user should know before trusting its numbers."""
    out = []
    if config.backend == "triton" and config.device == "cpu":
        out.append("--backend triton on a CPU runs the Triton interpreter: very slow, and its timings "
                   "measure the interpreter, not the kernel")
    if isinstance(config, TaskConfig) and config.greedy and len(config.modes) > 1:
        out.append("greedy decoding (--temperature 0) verifies by argmax match in every mode: baseline, exact and "
                   "sigmoid then run the same code and differ only by noise; pass --temperature 1 to compare them")
    load = _load_average()
    cores = os.cpu_count() or 1
    if load is not None and load > cores:
        out.append(f"the machine is busy (load average {load:.1f} on {cores} cores): timings will be noisy")
    return out


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


# ----------------------------------------------------------------------------------------- the machine


def _cpu_model() -> str:
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

    root = Path(__file__).resolve().parent.parent
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
        "device_name": torch.cuda.get_device_name() if device == "cuda" else _cpu_model(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "load_average_at_start": _load_average(),
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


# ------------------------------------------------------------------------------------ synthetic: bytes


def bytes_per_step(mode: str, batch: int, gamma: int, vocab: int, itemsize: int) -> int:
    """Bytes one verification step moves to and from memory, per provider (the bandwidth denominator).

    Notation: R = B·(γ+1)·V target logits, D = B·γ·V draft values, s = the logits' itemsize, fp32 = 4.

    exact:    the least any exact verifier must read:
                R·s                      every target row once (its log-sum-exp: softmax fused, online)
              + B·V·s + B·V·4            the one resampled row per sequence: its target logits again and
                                         its draft probabilities (fp32)
              (gathered scalars, uniforms and the B·(γ+1) int64 tokens written are left out: < 0.1 %)
    sigmoid:  elementwise p̂, q̂, no normalisation: only the resampled row, target and draft logits,
              B·V·2s.
    baseline: kernels/baseline.py, each full-size tensor op counted once as reads of its inputs plus a
              write of its output (a lower bound: torch's softmax reads its input more than once):
                .float() of both logits (only if s != 4)  (D + R)·(s+4)
                / T, then softmax, for both               (D + R)·8 + (D + R)·8
                isnan(p).any()                            R·4 + R·1 + R·1
                p[n]; cat([q, 0]) then [n]                B·V·8; D·4 + R·4; B·V·8
                p' = clamp(p_n − q_n), Σ, /, where        B·V·(12 + 8 + 4 + 8 + 12)
                multinomial                               B·V·4
    hf:       transformers' `_speculative_sampling` (B = 1), same counting, softmax in the logits' dtype:
                softmax of draft and target logits        D·2s + R·2s
                p[:, n], q[:, n] (advanced indexing)      B·V·4s
                clamp(p − q), Σ, div_, multinomial        B·V·(3s + 2s + s + 2s + s)
    """
    B, G, V, s = batch, gamma, vocab, itemsize
    R, D, row = B * (G + 1) * V, B * G * V, B * V
    if mode == "exact":
        return R * s + row * s + row * 4
    if mode == "sigmoid":
        return row * 2 * s
    if mode == "baseline":
        cast = 0 if s == 4 else (D + R) * (s + 4)
        softmaxes = (D + R) * 8 * 2  # divide by T, then softmax, for draft and target
        nan_check = R * 6
        rows = row * 8 + D * 4 + R * 4 + row * 8
        residual = row * (12 + 8 + 4 + 8 + 12) + row * 4
        return cast + softmaxes + nan_check + rows + residual
    if mode == "hf":
        return D * 2 * s + R * 2 * s + row * 4 * s + row * 9 * s
    raise ValueError(f"no byte model for {mode!r}")


# ------------------------------------------------------------------------------------ synthetic: timing


@dataclass
class SyntheticRecord:
    """One provider at one grid point. Times are per verification step, in ms."""

    vocab: int
    batch: int
    gamma: int
    mode: str
    backend: str  # "torch" | "triton" | "triton-interpreter" | "transformers"
    dtype: str
    device: str
    median_ms: float
    p10_ms: float
    p90_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    n: int  # timed calls
    speedup_vs_baseline: float | None  # baseline median / this median (> 1: faster than baseline)
    speedup_vs_hf: float | None  # hf median / this median (B = 1 only)
    acceptance_rate: float  # accepted / drafted over every call of this provider (warm-up included)
    mean_accepted_per_call: float  # accepted draft tokens per sequence per step
    expected_acceptance_rate: float  # what exact sampling must give on this case (see _expected_acceptance)
    calls: int  # verification calls the acceptance figures come from
    bytes: int  # bytes_per_step
    gb_per_s: float | None  # bytes / median (CUDA only: on a CPU the caches make it meaningless)
    peak_extra_mib: float | None  # CUDA only: peak memory allocated during one step, above its inputs
    case_overlap: float  # mean Σ min(p, q) of the case's draft rows (Leviathan's α of the case)
    case_target_entropy: float  # mean entropy of the target rows, nats
    others_cpu: float | None = None  # share of the machine's CPU other processes used while this point was timed


# Columns of the results table: (record field, header). `--json` carries every one of them.
SYNTHETIC_COLUMNS = (
    ("vocab", "V"), ("batch", "B"), ("gamma", "γ"), ("mode", "mode"),
    ("median_ms", "ms/step"), ("p10_ms", "p10"), ("p90_ms", "p90"),
    ("speedup_vs_baseline", "×base"), ("speedup_vs_hf", "×hf"),
    ("acceptance_rate", "acc"), ("expected_acceptance_rate", "expect"), ("gb_per_s", "GB/s"),
)


def _expected_acceptance(case: dict) -> float:
    """E[accepted / drafted] of exact sampling on this case's fixed draft tokens: position j passes
    with r_j = min(1, p_j(x_j)/q_j(x_j)) given the earlier ones passed, so E[A] = Σ_k Π_{j<=k} r_j."""
    tokens = case["draft_tokens"]  # [B, γ]
    B, G = tokens.shape
    lse = torch.logsumexp(case["target_logits"][:, :G].float(), dim=-1)  # [B, γ]
    z_x = case["target_logits"][:, :G].gather(-1, tokens[..., None])[..., 0].float()  # [B, γ]
    p_x = torch.exp(z_x - lse)
    q_x = case["draft_probs"].gather(-1, tokens[..., None])[..., 0].float()  # [B, γ]
    r = torch.where(q_x > 0, (p_x / q_x.clamp_min(1e-38)).clamp(max=1.0), 0.0)  # [B, γ]
    return float(torch.cumprod(r.double(), dim=1).sum(dim=1).mean() / G)


def _providers(modes, case, pool, config: SyntheticConfig, sink: dict[str, list]) -> dict[str, Callable]:
    """Zero-argument callables, one verification step each. Every call takes the next uniform draw of
    the pool (so acceptance is measured over many draws) and keeps its accepted count in sink[mode]."""
    from specdec_cli.verify import verify

    tokens, probs, logits, target = (case["draft_tokens"], case["draft_probs"], case["draft_logits"],
                                     case["target_logits"])
    B, G = tokens.shape
    fns = {}

    def step_verify(mode):
        calls = sink[mode]
        # baseline takes the draft logits: transformers softmaxes both models' logits itself
        kwargs = dict(draft_logits=logits, alpha=config.alpha, beta=config.beta)
        if mode != "baseline":
            kwargs["backend"] = config.kernel_backend()

        def step():
            out = verify(mode, tokens, probs, target, pool[len(calls) % len(pool)], **kwargs)
            calls.append(out.num_accepted)
            return out.out_tokens

        return step

    def step_hf():
        from transformers.generation.utils import _speculative_sampling

        calls = sink["hf"]
        gen = torch.Generator(device="cpu").manual_seed(config.seed)
        prompt = torch.randint(0, target.shape[-1], (1, HF_PROMPT_LEN), generator=gen).to(tokens.device)
        candidate_input_ids = torch.cat([prompt, tokens], dim=1)  # [1, n+γ]
        candidate_logits = logits  # [1, γ, V]
        new_logits = target  # [1, γ+1, V]

        def step():
            valid_tokens, n_matches = _speculative_sampling(candidate_input_ids, candidate_logits, G, new_logits)
            calls.append(n_matches)
            return valid_tokens

        return step

    for mode in modes:
        if mode == "hf":
            if B == 1:
                fns["hf"] = step_hf()
        else:
            fns[mode] = step_verify(mode)
    return fns


def _cpu_clock() -> tuple[float, float, float] | None:
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


def _others_cpu(before, after) -> float | None:
    """The share of the machine's CPU that other processes (and the hypervisor) took between two clocks:
    0 on a quiet machine; 0.5 on 2 cores means one core was busy with someone else's work."""
    if before is None or after is None or after[2] <= before[2]:
        return None
    cores = os.cpu_count() or 1
    others = (after[0] - before[0]) - (after[1] - before[1])
    return min(1.0, max(0.0, others / ((after[2] - before[2]) * cores)))


def _peak_extra_mib(fn) -> float:
    """CUDA: memory allocated at the peak of one call above what was allocated before it, in MiB."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def grid(config: SyntheticConfig) -> list[tuple[int, int, int]]:
    """(vocab, batch, gamma) in the order they are run."""
    return [(v, b, g) for v in config.vocabs for b in config.batches for g in config.gammas]


def run_point(vocab: int, batch: int, gamma: int, config: SyntheticConfig) -> list[SyntheticRecord]:
    """Time every provider of one grid point side by side; one record per provider."""
    from specdec_cli.synthetic import describe, make_case
    from specdec_cli.timing import measure_side_by_side

    device, dtype = config.device, config.torch_dtype
    case = make_case(batch, gamma, vocab, overlap=config.overlap, dtype=dtype, device=device, seed=config.seed)
    gen = torch.Generator(device="cpu").manual_seed(config.seed + 1)
    pool = [(1.0 - torch.rand(batch, gamma + 1, generator=gen)).to(device) for _ in range(ACCEPTANCE_POOL)]
    sink = {m: [] for m in config.modes}
    fns = _providers(config.modes, case, pool, config, sink)
    torch.manual_seed(config.seed)  # hf draws its own uniforms from the global generator
    before = _cpu_clock()
    timings = measure_side_by_side(fns, warmup=WARMUP, repeat=config.repeat, device=device)
    others = _others_cpu(before, _cpu_clock())
    peak = {m: _peak_extra_mib(fn) for m, fn in fns.items()} if device == "cuda" else {}

    about = describe(case)
    expected = _expected_acceptance(case)
    itemsize = torch.empty((), dtype=dtype).element_size()
    from specdec_cli.kernels import triton_backend_name

    kernel = triton_backend_name() if config.kernel_backend() == "triton" else "torch"
    base = timings.get("baseline")
    hf = timings.get("hf")
    records = []
    for mode, t in timings.items():
        accepted = torch.stack([torch.as_tensor(a).reshape(-1) for a in sink[mode]]).cpu()  # [calls, B]
        calls = accepted.shape[0]
        nbytes = bytes_per_step(mode, batch, gamma, vocab, itemsize)
        records.append(SyntheticRecord(
            vocab=vocab, batch=batch, gamma=gamma, mode=mode,
            backend={"hf": "transformers", "baseline": "torch"}.get(mode, kernel),
            dtype=config.dtype, device=device,
            median_ms=t.median_ms, p10_ms=t.p10_ms, p90_ms=t.p90_ms, mean_ms=t.mean_ms, std_ms=t.std_ms,
            min_ms=t.min_ms, n=t.n,
            speedup_vs_baseline=base.median_ms / t.median_ms if base else None,
            speedup_vs_hf=hf.median_ms / t.median_ms if hf else None,
            acceptance_rate=float(accepted.sum()) / (calls * accepted.shape[1] * gamma),
            mean_accepted_per_call=float(accepted.double().mean()),
            expected_acceptance_rate=expected,
            calls=calls,
            bytes=nbytes,
            gb_per_s=nbytes / (t.median_ms * 1e-3) / 1e9 if device == "cuda" else None,
            peak_extra_mib=peak.get(mode),
            case_overlap=about["overlap"],
            case_target_entropy=about["target_entropy_mean"],
            others_cpu=others,
        ))
    return records


def run_synthetic(config: SyntheticConfig, progress: Progress | None = None) -> list[SyntheticRecord]:
    step = progress or (lambda _msg: None)
    records = []
    for vocab, batch, gamma in grid(config):
        records += run_point(vocab, batch, gamma, config)
        step(f"V={vocab} B={batch} γ={gamma}")
    return records


# ------------------------------------------------------------------------------------ decoding tasks


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


class TaskRunner(Protocol):
    def __call__(self, config: TaskConfig, progress: Progress) -> list[TaskRecord]: ...


def _summarize_runner(config: TaskConfig, progress: Progress) -> list[TaskRecord]:
    from specdec_cli.summarize import bench_runner  # imported on use: the task modules import this one

    return bench_runner(config, progress)


def _transcribe_runner(config: TaskConfig, progress: Progress) -> list[TaskRecord]:
    from specdec_cli.transcribe import bench_runner

    return bench_runner(config, progress)


# The decoding tasks plug in here: name -> runner(TaskConfig, progress) -> [TaskRecord, ...], one record
# per (γ, mode) plus one autoregressive record (γ = 0), usually built by `run_contenders`.
TASK_RUNNERS: dict[str, TaskRunner] = {"summarize": _summarize_runner, "transcribe": _transcribe_runner}

# Where a task finds its inputs under --data DIR: DIR/<folder> when it exists, else DIR itself; files with
# these suffixes are inputs, except `*.ref.txt`, which are references (`<stem>.ref.txt` beside its input).
TASK_DATA = {
    "summarize": ("articles", (".txt",), "*.txt articles"),
    "transcribe": ("audio", (".wav", ".flac", ".ogg", ".mp3", ".aiff", ".aif", ".raw", ".pcm"), "audio files"),
}
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"  # --data's default


def data_files(task: str, data: str | Path | None) -> list[str]:
    """The input files of `task` under --data (sorted), or SpecdecError when there are none."""
    root = Path(data) if data is not None else EXAMPLES
    if not root.is_dir():
        raise SpecdecError(f"--data {root}: no such directory")
    folder, suffixes, what = TASK_DATA[task]
    where = root / folder if (root / folder).is_dir() else root
    files = sorted(p for p in where.iterdir()
                   if p.is_file() and p.suffix.lower() in suffixes and not p.name.endswith(".ref.txt"))
    if not files:
        raise SpecdecError(f"--data {root}: no usable files for --task {task} (expected {what} in it or in "
                           f"{folder}/, with <name>.ref.txt references beside them)")
    return [str(p) for p in files]


def task_inputs(config: TaskConfig) -> tuple[list[str], list[str] | None]:
    """(input paths, their references; None unless every input has one), the first --limit of them, from:
    options["inputs"] (+ options["references"]) when given; else the files under --data (data_files);
    else the task's default: examples/, and for transcribe first the LibriVox clips of Debian's
    pocketsphinx-testdata when installed (5 clips, examples/audio holds one of them)."""
    from specdec_cli.audio import librivox_clips, reference_for

    opts = config.options
    if opts.get("inputs"):
        inputs = [str(p) for p in opts["inputs"]]
        refs = list(opts.get("references") or [reference_for(p) for p in inputs])
    elif opts.get("data") is None and config.task == "transcribe" and librivox_clips():
        inputs, refs = map(list, zip(*((str(w), r) for w, r in librivox_clips())))
    else:
        inputs = data_files(config.task, opts.get("data"))
        refs = [reference_for(p) for p in inputs]
    limit = opts.get("limit") or len(inputs)
    inputs, refs = inputs[:limit], refs[:limit]
    return inputs, (refs if all(r is not None for r in refs) else None)


def read_task_inputs(task: str, paths: list[str]) -> None:
    """Read every input as its task will (SpecdecError on an empty, binary or unreadable one)."""
    if task == "summarize":
        from specdec_cli.summarize import read_article

        for p in paths:
            read_article(p)
    elif task == "transcribe":
        from specdec_cli.audio import load_audio

        for p in paths:
            load_audio(p)


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

    def __enter__(self) -> "PeakMemory":
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


WARMUP_TOKENS = 8  # new tokens of the untimed warm-up decode of each mode

# decode(mode, γ, short) -> (texts in input order, finished GenerationStats summed over the inputs);
# short: the first input only, at most WARMUP_TOKENS new tokens (the warm-up).
Decode = Callable[[str, int, bool], tuple[list[str], "GenerationStats"]]


def run_contenders(config: TaskConfig, decode: Decode, references: list[str] | None,
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
    """A TaskRecord from one pass: its texts and its finished GenerationStats (decoding.py)."""
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
    from specdec_cli import metrics

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
    from specdec_cli import speedup

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
        r.best_gamma = speedup.best_gamma(r.alpha, r.cost_ratio, MAX_GAMMA)
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


def run_task(config: TaskConfig, progress: Progress | None = None) -> list[TaskRecord]:
    runner = TASK_RUNNERS.get(config.task)
    if runner is None:
        raise SpecdecError(f"--task {config.task} is not available yet: use --task synthetic")
    return aggregate(list(runner(config, progress or (lambda _msg: None))), greedy=config.greedy)


# ----------------------------------------------------------------------------------------- results


@dataclass
class BenchResults:
    task: str
    command: str  # a command line that reproduces the run
    config: dict
    machine: dict
    records: list  # SyntheticRecord | TaskRecord
    warnings: list[str] = field(default_factory=list)

    @property
    def tables(self) -> list[tuple[str, list[tuple[str, str]]]]:
        """The tables shown: (title, columns as (field, header)); every field is in to_dict()['results']."""
        if self.task == "synthetic":
            cols = list(SYNTHETIC_COLUMNS)
            if not any(r.gb_per_s is not None for r in self.records):
                cols = [c for c in cols if c[0] != "gb_per_s"]
            return [("", cols)]
        keys = list(dict.fromkeys(k for r in self.records for k in r.quality))
        return [("speed: measured over autoregressive, and predicted from α and c", list(TASK_SPEED_COLUMNS)),
                ("acceptance and cost", list(TASK_COST_COLUMNS)),
                ("quality", list(TASK_QUALITY_COLUMNS) + [(f"quality.{k}", k) for k in keys])]

    def to_dict(self) -> dict:
        return {
            "task": self.task,
            "command": self.command,
            "argv": sys.argv,
            "config": self.config,
            "machine": self.machine,
            "warnings": self.warnings,
            "results": [asdict(r) for r in self.records],
        }


def value(record, key: str):
    """A record's field by column key; 'quality.rouge1' reaches into the quality dict."""
    if key.startswith("quality."):
        return record.quality.get(key.split(".", 1)[1])
    return getattr(record, key)


def run(config: SyntheticConfig | TaskConfig, progress: Progress | None = None,
        warnings: list[str] | None = None) -> BenchResults:
    """Run a benchmark and gather everything its outputs need."""
    saved_threads = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    try:
        machine = machine_info(config.device)
        if isinstance(config, SyntheticConfig):
            records = run_synthetic(config, progress)
            task = "synthetic"
        else:
            records = run_task(config, progress)
            task = config.task
    finally:
        torch.set_num_threads(saved_threads)
    warnings = list(warnings or [])
    if task == "synthetic":
        warnings += spread_warnings(records)
    return BenchResults(task, config.command(), asdict(config), machine, records, warnings)


SPREAD_LIMIT = 3.0  # p90 / p10 above this: the calls were not timed under steady conditions


OTHERS_CPU_LIMIT = 0.1  # other processes took more than this share of the CPU while a point was timed


def spread_warnings(records: list[SyntheticRecord]) -> list[str]:
    """Warnings that timings were taken on a busy machine, so a reader does not trust them blindly: a
    wide spread of one provider's calls, or other processes using the CPU while a grid point was timed
    (a steadily busy machine slows every call alike, which the spread alone does not show)."""
    out = []
    wide = [r for r in records if r.p10_ms > 0 and r.p90_ms / r.p10_ms > SPREAD_LIMIT]
    if wide:
        out.append(f"{len(wide)} of {len(records)} timings spread widely (p90 > {SPREAD_LIMIT:g} × p10): "
                   "the machine was busy; rerun when it is quiet")
    busy = {(r.vocab, r.batch, r.gamma): r.others_cpu for r in records
            if r.others_cpu is not None and r.others_cpu > OTHERS_CPU_LIMIT}
    if busy:
        points = ", ".join(f"V={v} B={b} γ={g} ({share:.0%})" for (v, b, g), share in sorted(busy.items()))
        out.append(f"other processes used the CPU while {len(busy)} grid point(s) were timed: {points}; "
                   "their timings are suspect")
    return out


def total_steps(config: SyntheticConfig | TaskConfig) -> int:
    """Units of progress a run reports (grid points; for a task, γ × modes + autoregressive)."""
    if isinstance(config, SyntheticConfig):
        return len(grid(config))
    return len(config.gammas) * len(config.modes) + 1


# ------------------------------------------------------------------------------------------ writing


def _flat(record) -> dict:
    row = asdict(record)
    row.pop("outputs", None)  # texts: in the JSON only
    quality = row.pop("quality", None) or {}
    row.update({f"quality_{k}": v for k, v in quality.items()})
    return row


def write_json(results: BenchResults, path: Path) -> None:
    import json

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results.to_dict(), indent=2, allow_nan=True) + "\n")


def write_csv(results: BenchResults, path: Path) -> None:
    """One row per record: (grid point, mode) for synthetic, (γ, mode) for a task."""
    rows = [_flat(r) for r in results.records]
    fields = list(dict.fromkeys(k for row in rows for k in row))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for row in rows:
            w.writerow({k: ("" if v is None else v) for k, v in row.items()})


def write_outputs(results: BenchResults, *, out: Path | None = None, csv_path: Path | None = None,
                  plot_dir: Path | None = None) -> list[Path]:
    """Write whichever of JSON, CSV and plots were asked for; returns the paths written."""
    from specdec_cli import plots

    written = []
    try:
        if out is not None:
            write_json(results, out)
            written.append(Path(out))
        if csv_path is not None:
            write_csv(results, csv_path)
            written.append(Path(csv_path))
        if plot_dir is not None:
            written += plots.plot_results(results, Path(plot_dir))
    except OSError as e:
        raise SpecdecError(f"cannot write results: {e}") from None
    return written


"""What a `specdec bench` run is asked to measure, checked before anything runs.

    SyntheticConfig   one verification step on synthetic logits, over a grid V × B × γ × provider
    TaskConfig        a decoding task (summarize, transcribe): autoregressive, then every schedule × γ × mode,
                      for each thread count and draft setting of the sweep

Their options follow the rules of specdec_cli.options; a task's decoding options default to the CLI's
(runners.task_options), so a bench measures what users run unless told otherwise.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from specdec_cli import options
from specdec_cli.bench import peers, runners
from specdec_cli.bench.cases import case_bytes
from specdec_cli.bench.machine import check_memory, load_average
from specdec_cli.errors import SpecdecError, warn

TASKS = ("synthetic", *runners.RUNNERS)
# hf: transformers' _speculative_sampling; flashinfer: FlashInfer's chain_speculative_sampling (GPU, when installed)
SYNTHETIC_MODES = ("baseline", "exact", "sigmoid", "hf", "flashinfer")
DEFAULT_SYNTHETIC_MODES = SYNTHETIC_MODES[:4]  # what --modes runs unless told: FlashInfer only on request
TASK_MODES = options.SPECULATIVE_MODES  # autoregressive always runs too: it is the reference
SYNTHETIC_DTYPES = ("float32", "bfloat16", "float16")  # the logits' dtype


def parse_ints(text: str, option: str) -> list[int]:
    """'1,5,10' -> [1, 5, 10] (sorted, duplicates dropped). Empty items are ignored; no items is an error."""
    items = [s.strip() for s in str(text).split(",") if s.strip()]
    if not items:
        raise SpecdecError(f"{option} is empty: give a comma-separated list such as 1,5,10")
    try:
        return sorted({int(s) for s in items})
    except ValueError:
        raise SpecdecError(f"{option} must be a comma-separated list of integers (got {text!r})") from None


def parse_threads(text: str | None) -> list[int] | None:
    """'1,all' -> [1, os.cpu_count()]; None -> None (torch's default)."""
    if text is None:
        return None
    cores = str(os.cpu_count() or 1)
    return parse_ints(",".join(cores if s.strip() == "all" else s for s in str(text).split(",")), "--threads")


SWITCHES = {"on": True, "off": False}


def parse_switches(text: str | None, option: str) -> list[bool] | None:
    """'on,off' -> [True, False]; None -> None (the task's default)."""
    if text is None:
        return None
    return [SWITCHES[n] for n in parse_names(text, option, SWITCHES)]


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


def _check_run(repeat: int, threads: int | None, backend: str, alpha: float, beta: float) -> None:
    options.at_least("--repeat", repeat, 1)
    if threads is not None:
        options.at_least("--threads", threads, 1)
    options.one_of("--backend", backend, options.BACKENDS)
    options.check_sigmoid(alpha, beta)


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _threads_arg(threads) -> list[str]:
    return [] if threads is None else ["--threads", str(threads)]


def _join(xs) -> str:
    return ",".join(str(x) for x in xs)


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
    alpha: float = options.DecodeOptions.alpha
    beta: float = options.DecodeOptions.beta
    seed: int = 0
    threads: int | None = None  # torch intra-op threads; None: torch's default

    def validate(self) -> SyntheticConfig:
        for option, grid in (("--vocab", self.vocabs), ("--gamma", self.gammas), ("--batch", self.batches),
                             ("--modes", self.modes)):
            if not grid:
                raise SpecdecError(f"{option} is empty")
        options.at_least("--vocab", min(self.vocabs), 2)
        for g in self.gammas:
            options.check_gamma(g)
        options.at_least("--batch", min(self.batches), 1)
        for m in self.modes:
            options.one_of("--modes", m, SYNTHETIC_MODES)
        if self.modes == ["hf"] and 1 not in self.batches:
            raise SpecdecError("--modes hf runs at batch 1 only: add 1 to --batch")
        if "flashinfer" in self.modes:
            from specdec_cli.bench import flashinfer_peer

            if self.device != "cuda" or flashinfer_peer.source() is None:
                raise SpecdecError("--modes flashinfer needs a CUDA device and FlashInfer (pip install flashinfer-python, "
                                   f"or its kernel built by scripts/build_flashinfer_chain.sh, named by {flashinfer_peer.LIB_ENV})")
        options.one_of("--dtype", options.dtype_name(self.dtype), SYNTHETIC_DTYPES)
        _check_run(self.repeat, self.threads, self.backend, self.alpha, self.beta)
        if not 0.0 < self.overlap <= 1.0:
            raise SpecdecError(f"--overlap must be in (0, 1] (got {self.overlap})")
        V, B, G = max(self.vocabs), max(self.batches), max(self.gammas)
        check_memory(f"--vocab {V} × --batch {B} × (--gamma {G} + 1)", case_bytes(B, G, V))
        return self

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, options.dtype_name(self.dtype))

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


DEFAULT_SCHEDULES = ("auto", "constant")  # what users run (auto), and the constant γ it should come close to


@dataclass
class TaskConfig:
    """What a task runner is asked to run: autoregressive (γ = 0), then every schedule × γ × mode (γ: the
    constant γ, or auto's upper bound), all of it once per thread count × draft setting (a sweep).
    `options` carries the task's own settings (runners.TASK_OPTIONS); what it leaves out, and dtype, backend,
    α, β and seed left at their defaults, are the CLI's defaults (runners.task_options)."""

    task: str
    gammas: list[int]
    modes: list[str]
    schedules: list[str] = field(default_factory=lambda: list(DEFAULT_SCHEDULES))
    batch: int | None = None  # None: the task's own (--batch-size)
    device: str = "cpu"
    dtype: str = options.DecodeOptions.dtype
    repeat: int = 1
    backend: str = options.DecodeOptions.backend
    alpha: float = options.DecodeOptions.alpha
    beta: float = options.DecodeOptions.beta
    seed: int = options.DecodeOptions.seed
    threads: list[int] | None = None  # a sweep; None: torch's default
    draft_vocabs: list[int] | None = None  # a sweep of --draft-vocab; None: the task's default
    draft_quantized: list[bool] | None = None  # a sweep of the draft's low-bit weights (on / off); None: the default
    target_int8: list[bool] | None = None  # transcribe: a sweep of --target-int8; None: the default (off)
    encoder_int8: list[bool] | None = None  # transcribe: a sweep of --encoder-int8; None: the default (on)
    peers: list[str] = field(default_factory=list)  # other tools run beside (peers.PEERS), e.g. faster-whisper
    options: dict = field(default_factory=dict)
    ray: options.RayOptions | None = None  # --ray: over the corpus on a Ray cluster (bench/corpus.py)
    pool: str | None = None  # --ray: the actor pool it ran on, in words (filled by the run)

    def validate(self) -> TaskConfig:
        """Checks every option (the task's decoding options through options.DecodeOptions.validate), finds
        the inputs and reads them, all before any model loads."""
        if self.task not in runners.RUNNERS:
            raise SpecdecError(f"--task {self.task}: no runner is registered for it (choose from {', '.join(runners.RUNNERS)})")
        if not self.gammas:
            raise SpecdecError("--gamma is empty")
        if not self.modes:
            raise SpecdecError(f"--modes is empty: choose from {', '.join(TASK_MODES)} (autoregressive always runs)")
        for m in self.modes:
            if m not in TASK_MODES:
                raise SpecdecError(f"--modes: unknown {m!r} for --task {self.task} (choose from {', '.join(TASK_MODES)})")
        for s in self.schedules:
            options.one_of("--gamma-schedule", s, options.GAMMA_SCHEDULES)
        for p in self.peers:
            options.one_of("--peers", p, peers.PEERS)
            if peers.PEERS[p].task != self.task:
                raise SpecdecError(f"--peers {p} runs beside --task {peers.PEERS[p].task}, not {self.task}")
        if self.options.get("language") is not None and self.task != "transcribe":
            raise SpecdecError(f"--language is for --task transcribe, not {self.task}")
        for flag, sweep in (("--target-int8", self.target_int8), ("--encoder-int8", self.encoder_int8)):
            if sweep is not None and self.task != "transcribe":
                raise SpecdecError(f"{flag} is for --task transcribe, not {self.task}")
        if self.options.get("target_quant") is not None and self.task != "summarize":
            raise SpecdecError(f"--target-quant is for --task summarize, not {self.task} (transcribe: --target-int8)")
        if self.options.get("limit") is not None:
            options.at_least("--limit", self.options["limit"], 1)
        for t in self.threads or [None]:
            _check_run(self.repeat, t, self.backend, self.alpha, self.beta)
        for setting in runners.task_settings(self):
            for g in self.gammas:
                setting.options.replace(gamma=g).validate()
        if self.ray is not None:
            self._check_ray()  # the actors read the inputs: a bad one is left out of every contender, said in one line
        else:
            runners.read_inputs(self.task, runners.task_inputs(self)[0])
        self._drop_modes_the_draft_cannot_verify()  # last: a bad option is said alone, without this line before it
        return self

    def _drop_modes_the_draft_cannot_verify(self) -> None:
        """A deterministic draft (lookup, summarize's default) has no logits for sigmoid: such a mode is left out with
        one line, or refused when it is the only one."""
        from specdec_cli.drafts import check_mode

        kept = []
        for m in self.modes:
            try:
                for setting in runners.task_settings(self):
                    check_mode(setting.options.replace(mode=m))
                kept.append(m)
            except SpecdecError as e:
                if len(self.modes) == 1:
                    raise
                warn(f"--modes {m} left out: {e}")
        self.modes = kept

    def _check_ray(self) -> None:
        """--ray runs one setting, every input once per contender, on actors of --ray-threads threads."""
        from specdec_cli.distributed import corpus

        if self.threads is not None:
            raise SpecdecError("--threads: with --ray each actor runs --ray-threads torch threads")
        for flag, sweep in (("--draft-vocab", self.draft_vocabs), ("--draft-quantized", self.draft_quantized),
                            ("--target-int8", self.target_int8), ("--encoder-int8", self.encoder_int8)):
            if sweep is not None and len(sweep) > 1:
                raise SpecdecError(f"{flag}: one setting with --ray (sweep it without --ray)")
        if self.peers:
            raise SpecdecError("--peers run beside specdec in this process: leave out --ray")
        if self.repeat != 1:
            raise SpecdecError("--repeat: with --ray every input runs once per contender (the corpus is the repeat)")
        runners.task_inputs(self)  # there are inputs
        corpus.require_ray()

    @property
    def greedy(self) -> bool:
        return not self.options.get("temperature")

    def command(self) -> str:
        args = ["specdec", "bench", "--task", self.task, "--gamma", _join(self.gammas), "--modes",
                ",".join(self.modes), "--gamma-schedule", ",".join(self.schedules),
                "--batch", str(runners.task_options(self).batch_size), "--device", self.device,
                "--dtype", self.dtype, "--repeat", str(self.repeat), "--backend", self.backend, "--alpha",
                str(self.alpha), "--beta", str(self.beta), "--seed", str(self.seed)]
        if self.threads is not None:
            args += ["--threads", _join(self.threads)]
        if self.draft_vocabs is not None:
            args += ["--draft-vocab", _join(self.draft_vocabs)]
        if self.draft_quantized is not None:
            args += ["--draft-quantized", ",".join("on" if q else "off" for q in self.draft_quantized)]
        for flag, sweep in (("--target-int8", self.target_int8), ("--encoder-int8", self.encoder_int8)):
            if sweep is not None:
                args += [flag, ",".join("on" if q else "off" for q in sweep)]
        if self.peers:
            args += ["--peers", ",".join(self.peers)]
        for key in runners.TASK_OPTIONS:
            if self.options.get(key) is not None:
                args += [_flag(key), str(self.options[key])]
        if self.ray is not None:
            args += ["--ray"] + [x for key in ("ray_address", "ray_actors", "ray_threads", "ray_gpus")
                                 if getattr(self.ray, key) not in (None, 0) for x in (_flag(key), str(getattr(self.ray, key)))]
        return shlex.join(args)


def build(o: options.BenchOptions, ray: options.RayOptions | None = None) -> SyntheticConfig | TaskConfig:
    """The run `specdec bench` is asked for (options.BenchOptions, as the command line gave them; `ray`: --ray and its
    options): every option checked, a task's inputs read, the output paths checked, all before anything runs."""
    from specdec_cli.bench import results
    from specdec_cli.models import resolve_device

    options.one_of("--task", o.task, TASKS)
    if ray is not None and ray.ray and o.task == "synthetic":
        raise SpecdecError("--ray is for --task summarize or transcribe, not synthetic")
    config = _synthetic(o) if o.task == "synthetic" else _task(o)
    if isinstance(config, TaskConfig) and ray is not None and ray.ray:
        config.ray = ray
    config.device = resolve_device(o.device)
    config.validate()
    results.check_outputs(out=o.out, csv_path=o.csv, plot_dir=o.plot)
    return config


_TASK_ONLY = ("data", "limit", "target", "draft", "draft_stop", "max_new_tokens", "temperature", "language",
              "draft_vocab", "draft_quantized", "gamma_schedule", "target_int8", "encoder_int8", "peers",
              "target_quant")  # BenchOptions a task reads


def _synthetic(o: options.BenchOptions) -> SyntheticConfig:
    given = [k for k in _TASK_ONLY if getattr(o, k) is not None]
    if given:
        raise SpecdecError(f"{_flag(given[0])} is for --task summarize or transcribe, not synthetic")
    threads = parse_threads(o.threads)
    if threads is not None and len(threads) > 1:
        raise SpecdecError("--threads: one count for --task synthetic (a task sweeps a list)")
    return SyntheticConfig(
        vocabs=parse_ints(o.vocab, "--vocab"), gammas=parse_ints(o.gamma, "--gamma"),
        batches=parse_ints("1,8" if o.batch is None else o.batch, "--batch"), modes=parse_names(o.modes, "--modes", SYNTHETIC_MODES),
        device=o.device, dtype=o.dtype or "float32", overlap=o.overlap, repeat=50 if o.repeat is None else o.repeat,
        backend=o.backend, alpha=o.alpha, beta=o.beta, seed=o.seed, threads=None if threads is None else threads[0],
    )


def _task(o: options.BenchOptions) -> TaskConfig:
    names = parse_names(o.modes, "--modes", (options.AUTOREGRESSIVE, *SYNTHETIC_MODES))
    task_options = {k: getattr(o, k) for k in runners.TASK_OPTIONS if k != "draft_vocab"}
    return TaskConfig(
        task=o.task, gammas=parse_ints(o.gamma, "--gamma"), batch=None if o.batch is None else parse_ints(o.batch, "--batch")[0],
        modes=[m for m in names if m in TASK_MODES],  # autoregressive always runs; hf is synthetic only
        device=o.device, dtype=o.dtype or options.DecodeOptions.dtype, repeat=1 if o.repeat is None else o.repeat,
        backend=o.backend, alpha=o.alpha, beta=o.beta, seed=o.seed, threads=parse_threads(o.threads),
        schedules=parse_names(o.gamma_schedule or ",".join(DEFAULT_SCHEDULES), "--gamma-schedule",
                              options.GAMMA_SCHEDULES),
        draft_vocabs=None if o.draft_vocab is None else parse_ints(o.draft_vocab, "--draft-vocab"),
        draft_quantized=parse_switches(o.draft_quantized, "--draft-quantized"),
        target_int8=parse_switches(o.target_int8, "--target-int8"),
        encoder_int8=parse_switches(o.encoder_int8, "--encoder-int8"),
        peers=[] if o.peers is None else parse_names(o.peers, "--peers", peers.PEERS),
        options={k: v for k, v in task_options.items() if v is not None},
    )


def warnings_for(config: SyntheticConfig | TaskConfig) -> list[str]:
    """Things about this run the user should know before trusting its numbers."""
    out = []
    if config.backend == "triton" and config.device == "cpu":
        out.append("--backend triton on a CPU runs the Triton interpreter: very slow, and its timings "
                   "measure the interpreter, not the kernel")
    if isinstance(config, TaskConfig) and config.greedy and len(config.modes) > 1:
        out.append("greedy decoding (--temperature 0) verifies by argmax match in every mode: baseline, exact and "
                   "sigmoid then run the same code and differ only by noise; pass --temperature 1 to compare them")
    if isinstance(config, TaskConfig):
        target = runners.task_options(config).target
        out += [line for line in (peers.skipped(p, target) for p in config.peers) if line]
    load = load_average()
    cores = os.cpu_count() or 1
    if load is not None and load > cores:
        out.append(f"the machine is busy (load average {load:.1f} on {cores} cores): timings will be noisy")
    return out

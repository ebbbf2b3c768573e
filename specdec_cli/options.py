"""Every option's rule and default, once.

The CLI's help shows these defaults, the library's functions use them when called without options, and
`specdec bench` measures them unless told otherwise: a default changed here changes all three.

    MODES, BACKENDS, ...   the names each option accepts
    DecodeOptions          what every decoding command takes; `validate()` is the one check of them
    SummarizeOptions       its defaults for `specdec summarize` (measured: see the comments)
    TranscribeOptions      its defaults for `specdec transcribe`
    one_of, at_least, ...  the checks, for the options of bench and verify-kernel too

A failed check raises SpecdecError with one line that names the option as the CLI spells it. This module
imports nothing of specdec but errors, so every layer may read it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from specdec_cli.errors import SpecdecError

AUTOREGRESSIVE = "autoregressive"  # the target alone
SPECULATIVE_MODES = ("baseline", "exact", "sigmoid")  # the verification modes a user picks (decoding/verify.py)
MODES = (AUTOREGRESSIVE, *SPECULATIVE_MODES)  # --mode
VERIFY_MODES = ("reference", *SPECULATIVE_MODES)  # decoding.verify.VERIFIERS: + the specification, for tests
BACKENDS = ("auto", "torch", "triton")  # exact/sigmoid kernels: auto = Triton on CUDA, torch on a CPU
GAMMA_SCHEDULES = ("auto", "constant", "heuristic")  # decoding/schedule.py
DTYPES = ("auto", "float32", "bfloat16", "float16")  # auto: bf16 on CUDA and on CPUs that have it in hardware
DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
WHISPER_TASKS = ("transcribe", "translate")
TARGET_QUANTS = ("gguf", "none", "int8", "int4")  # summarize --target-quant (models/weights.py)
OUTPUT_FORMATS = ("txt", "srt", "vtt", "json", "tsv")  # transcribe --output-format (tasks/formats.py)
TIMED_FORMATS = ("srt", "vtt", "tsv")  # formats made of timed segments: they turn --timestamps on
MAX_GAMMA = 32  # γ above this never paid in any measurement, and the Triton kernels are planned up to it
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts


# ----------------------------------------------------------------------------------------------------
# The checks


def one_of(flag: str, value, allowed) -> None:
    if value not in allowed:
        raise SpecdecError(f"{flag} must be one of {', '.join(map(str, allowed))} (got {value!r})")


def at_least(flag: str, value, least) -> None:
    if not value >= least:  # also refuses NaN
        raise SpecdecError(f"{flag} must be at least {least} (got {value})")


def check_gamma(value: int, flag: str = "--gamma") -> None:
    if not 1 <= value <= MAX_GAMMA:
        raise SpecdecError(f"{flag} must be between 1 and {MAX_GAMMA} (got {value})")


AUTO_THREADS = "auto"  # --threads: all cores (within a CPU quota), fewer while others keep some busy (decoding/threads.py)


def thread_count(setting) -> int | None:
    """--threads: auto (or None) -> None; a count >= 1 -> that count."""
    if setting is None or str(setting).strip().lower() == AUTO_THREADS:
        return None
    try:
        n = int(str(setting).strip())
    except ValueError:
        raise SpecdecError(f"--threads must be auto or a number of threads (got {setting!r})") from None
    at_least("--threads", n, 1)
    return n


def check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """temperature: 0 (greedy) or a finite positive number; top-k >= 0 (0 = off); top-p in (0, 1]."""
    if not math.isfinite(temperature) or temperature < 0:
        raise SpecdecError(f"--temperature must be 0 (greedy) or a finite positive number (got {temperature})")
    if top_k < 0:
        raise SpecdecError(f"--top-k must be 0 (off) or a number of tokens (got {top_k})")
    if not 0.0 < top_p <= 1.0:
        raise SpecdecError(f"--top-p must be in (0, 1] (got {top_p})")


def check_sigmoid(alpha: float, beta: float) -> None:
    """The sigmoid approximation's constants (paper eq. 5): finite, α < β."""
    if not (math.isfinite(alpha) and math.isfinite(beta) and alpha < beta):
        raise SpecdecError(f"--alpha must be below --beta, both finite (got α={alpha}, β={beta})")


def check_seed(seed: int) -> None:
    lo, hi = SEED_RANGE
    if not lo <= seed <= hi:
        raise SpecdecError(f"--seed must be between {lo} and {hi} (got {seed})")


def check_output(output_format: str, output_dir, skip_existing: bool, inputs: int, as_json: bool) -> None:
    """transcribe's outputs: --skip-existing resumes an --output-dir; without one, a format other than txt goes
    to stdout, for one input, and not beside --json's objects."""
    if skip_existing and output_dir is None:
        raise SpecdecError("--skip-existing needs --output-dir (it skips the inputs whose file is there)")
    if output_dir is None and output_format != "txt":
        if as_json:
            raise SpecdecError(f"--json prints JSON on stdout: --output-format {output_format} needs --output-dir")
        if inputs > 1:
            raise SpecdecError(f"--output-format {output_format} with {inputs} inputs: give --output-dir "
                               "(one file per input)")


def dtype_name(name: str) -> str:
    """The canonical name of a --dtype value (aliases such as bf16 accepted), or SpecdecError."""
    key = (name or "auto").strip().lower()
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise SpecdecError(f"--dtype must be one of {', '.join(DTYPES)} (got {name!r})")
    return key


# ----------------------------------------------------------------------------------------------------
# An option: its default, its help, and how the CLI spells it


def option(default, help: str = "", *, flag: str | None = None):
    """A dataclass field that is a CLI option: `flag` is its Typer declaration (default: --field-name, with
    --no-field-name for a bool). A subclass that only changes the default may write it plainly: the help stays
    the base class's (help_of)."""
    return dataclasses.field(default=default, metadata={"help": help, "flag": flag})


def help_of(cls: type, name: str) -> tuple[str, str | None]:
    """(help, flag) of option `name` of `cls`: the nearest class in its MRO that gives them."""
    for klass in cls.__mro__:
        f = getattr(klass, "__dataclass_fields__", {}).get(name)
        if f is not None and f.metadata.get("help"):
            return f.metadata["help"], f.metadata.get("flag")
    return "", None


# ----------------------------------------------------------------------------------------------------
# The options of a decoding command

_DRAFT_CHEAPER = "a cheaper draft, the same output"


@dataclass(frozen=True)
class DecodeOptions:
    """What `summarize` and `transcribe` take, besides their inputs. Each field is the CLI option of that
    name (`max_new_tokens` is --max-new-tokens)."""

    target: str = option("embedded", "Target model: embedded, a Hugging Face id, a local directory, or a .gguf file.")
    draft: str = option("embedded", "Draft model: as --target, or self:K (the target's own first K layers).")
    mode: str = option("exact", " | ".join(MODES))
    gamma: int = option(5, f"Draft tokens per step (γ, 1..{MAX_GAMMA}); under auto the most tried.")
    gamma_schedule: str = option("constant", "auto (γ in 0..--gamma from this machine's measured costs; 0 = a plain "
                                 "step; sampled tokens then vary run to run, their distribution does not) | constant "
                                 "| heuristic (+2 when all accepted, −1 otherwise).")
    temperature: float = option(0.0, "0 = greedy: output identical to the target alone.")
    top_k: int = option(0, "Keep the k most likely tokens (0 = off).")
    top_p: float = option(1.0, "Nucleus sampling mass in (0, 1] (1 = off).")
    seed: int = option(0, "Random seed.")
    max_new_tokens: int = option(100, "Never generate more than this many tokens per input.")
    batch_size: int = option(1, "Inputs decoded together.")
    device: str = option("auto", "auto | cpu | cuda")
    dtype: str = option("auto", "auto | float32 | bfloat16 | float16 (auto: bf16 on CPUs that have it).")
    backend: str = option("auto", "Kernel backend for exact/sigmoid: auto | torch | triton.")
    alpha: float = option(-1e4, "Sigmoid approximation: lower logit constant α (paper eq. 5).")
    beta: float = option(1e4, "Sigmoid approximation: upper logit constant β (paper eq. 5).")
    draft_vocab: int = option(0, "Score only this many of the most frequent tokens (+ the prompt's) in the draft's "
                              f"output layer: {_DRAFT_CHEAPER}. 0 = the full vocabulary.")
    draft_stop: float = option(0.0, "End a round's drafting early once the draft gives its token less than this "
                               "probability (0 = always draft γ); the output stays the target's.")
    draft_quantized: bool = option(False, f"Give the draft low-bit weights (CPU only): {_DRAFT_CHEAPER}.")
    threads: str = option(AUTO_THREADS, "CPU threads: auto (torch's count, one per core, at most a container's "
                          "CPU quota, fewer while other processes keep cores busy, looked at twice a second) or a "
                          "number.")

    @property
    def speculative(self) -> bool:
        return self.mode != AUTOREGRESSIVE

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def validate(self):
        """Every rule of these options; returns self, so `Options(...).validate()` reads as one step."""
        if not self.target.strip():
            raise SpecdecError("--target is empty: give a model (embedded, a directory, a .gguf file or a hub id)")
        if self.speculative and not self.draft.strip():
            raise SpecdecError("--draft is empty: give a model, or self")
        one_of("--mode", self.mode, MODES)
        check_gamma(self.gamma)
        one_of("--gamma-schedule", self.gamma_schedule, GAMMA_SCHEDULES)
        check_sampling(self.temperature, self.top_k, self.top_p)
        check_seed(self.seed)
        at_least("--max-new-tokens", self.max_new_tokens, 1)
        at_least("--batch-size", self.batch_size, 1)
        dtype_name(self.dtype)
        thread_count(self.threads)
        one_of("--backend", self.backend, BACKENDS)
        check_sigmoid(self.alpha, self.beta)
        if self.draft_vocab < 0:
            raise SpecdecError(f"--draft-vocab must be 0 (off) or a number of tokens (got {self.draft_vocab})")
        if not 0.0 <= self.draft_stop < 1.0:
            raise SpecdecError(f"--draft-stop must be in [0, 1) (got {self.draft_stop})")
        return self


# Summarize: the embedded Qwen2.5-Coder 1.5B target on its GGUF blocks, drafted by prompt lookup with γ ≤ 8, chosen
# by measurement over the seven example articles (benchmarks/lookup_speed.py, 2 threads, a quiet AMD EPYC, two runs
# and one on the blocks, 2026-11-26; benchmarks/README.md): on bf16, lookup ran 1.71-1.74x the target alone where
# the 0.5B model draft ran 1.49-1.56x (faster on 13 of 14 article runs); γ ≤ 4 / 8 / 12 within 1 % there, the
# larger bounds ahead where a summary copies long phrases. On the blocks the target alone runs 2.1x bf16, lookup
# 1.23x that, the model draft 0.89x (it costs 0.66 of a step). These defaults beside llama.cpp in one run (bench
# --peers llama.cpp): 13.9 tokens/s against its 15.8 on the same file; after the int8 kernel and the bf16 prefill
# (the day after), 18.9 / 17.2 against 15.7 / 15.3 in two runs (the model draft, whose rows are not K-quants, only
# costlier beside the faster target: not measured again). Again with both driven by decoding/llama_like (the sixth
# session, benchmarks/summarize-draft-llama-like.json): lookup 1.23x the target alone, lookup+embedded 0.97x, the
# model draft 0.84x (its step 0.6 of the target's, acceptance 0.80-0.88). With the draft's 32-element layers packed
# (the thirty-fifth session, benchmarks/summarize-drafts-zen5-s35.json): lookup 1.50x, lookup+embedded 1.27x, the model
# draft 1.06x (their decoding 2.01 / 1.98 / 1.34x; a model draft also reads the prompt, 0.35 s an article).
# The model draft's options (draft_vocab, draft_stop, int8) stay what was best for it: they apply to --draft
# embedded and lookup+embedded.
@dataclass(frozen=True)
class SummarizeOptions(DecodeOptions):
    draft: str = option("lookup", "Draft model: as --target, or self:K (the target's own first K layers); lookup "
                        "(prompt lookup, no model: the tokens that followed the longest tail seen earlier in the "
                        "article; lookup:N for tails of N tokens at most); lookup+DRAFT (lookup where a tail matches, "
                        "DRAFT elsewhere).")
    gamma: int = 8
    gamma_schedule: str = "auto"
    draft_vocab: int = 32768
    draft_stop: float = 0.4
    draft_quantized: bool = option(True, f"Give the draft int8 weights (CPU only) where they are not quantized "
                                   f"already (a draft on GGUF blocks keeps them): {_DRAFT_CHEAPER}.",
                                   flag="--draft-int8/--no-draft-int8")  # drafts/int8.py
    # how the target's and a draft model's weights are held (models/weights.py): gguf by default, a GGUF on its own
    # blocks (kernels/qmatmul), whose step costs ~0.27 of bf16's; on CUDA, and for a model that is not a GGUF, none
    target_quant: str = option("gguf", "How the target's (and a draft model's) weights are held on a CPU: none (a "
                               "GGUF dequantized to --dtype, as on CUDA) | gguf (a GGUF runs on its own blocks, "
                               "exactly as the file means them: faster steps, costlier passes) | int8 | int4 (a "
                               "safetensors model quantized weight-only per group of 32 to Q8_0 / Q4_1 blocks: a "
                               "different model).")
    truncate: bool = option(False, "Cut articles too long for the model's context instead of refusing them, to "
                            "--max-input-tokens.")
    # with --truncate, the prompt tokens kept: the embedded pair reads 2048 tokens in ~46 s on 2 cores (an AMD
    # EPYC, bf16; 1024 in ~16 s, 512 in ~9 s), the whole 32 768-token context would take well over 10 minutes
    max_input_tokens: int = option(2048, "With --truncate: the prompt tokens kept (a long prompt takes long to read "
                                   "on a CPU).")

    def validate(self):
        super().validate()
        at_least("--max-input-tokens", self.max_input_tokens, 16)
        one_of("--target-quant", self.target_quant, TARGET_QUANTS)
        return self


# Transcribe: the self draft of Whisper base, chosen by measurement (benchmarks/transcribe_bench.py ->
# benchmarks/transcribe-cpu.json; bf16, one torch thread of a shared 2-core Xeon; decoder time, runs interleaved
# input by input; sets: LibriVox short clips (25 s) | the clips joined (74 s) | news read by espeak-ng (272 s)):
# - where a token's time goes: an autoregressive step is ~21.5 ms (transformers' layers ~13.5 ms, the 51 865-row
#   output layer ~7.5 ms), ~80 % of it inside torch's bf16 GEMV kernels (~5 GB/s), ~11 % in attention, little in
#   Python or per-op overhead: the same step hand-written (LeanDraft) with bf16 weights and a 16 384-row output
#   layer costs 14.3 ms (exact then runs at 0.99 | 1.13 | 1.02×); with int4 weights 6.3 ms. The target's pass
#   over a round's tokens (ExactScorer) costs 27–35 ms: the weights are read once for ~7 tokens.
# - every decoder layer (K = 6): the first K layers agree with the target's greedy token on 5 % (K=1), 0 % (2),
#   2 % (3), 19 % (4), 34 % (5) of 906 tokens (short clips + news, teacher forcing); self:5 runs at 0.82×.
# - output layer over ids [0, N) + EOT, int4 (bf16): agreement 79 % (81 %) for N = 8192, 87 % (90 %) for 16384,
#   94 % (97 %) for 32768. Int4 costs ~3 points of agreement on the news, none on LibriVox (94 %).
# - draft_stop τ (end a round after a draft token given < τ) and γ, autoregressive / exact decoder time:
#     N = 16384 τ=0   γ=8: 1.36 | 1.67 | 1.23      N = 16384 τ=0.5 γ=8: 1.49 | 1.75 | 1.45
#     N = 16384 τ=0.8 γ=6: 1.56 | 1.76 | 1.44      N = 16384 τ=0.9 γ=8: 1.55 | 1.68 | 1.38
#     N = 16384 τ=0.8 γ=8: 1.53 | 1.94 | 1.44      N = 8192  τ=0.8 γ=8: 1.53 | 1.77 | 1.31
#     N = 16384 τ=0.8 γ=10: 1.58 | 1.91 | 1.47     N = 32768 τ=0.8 γ=8: 1.59 | 1.76 | 1.48
#     N = 16384 τ=0.8 γ=12: 1.56 | 1.87 | 1.48     bf16 weights, N = 16384 τ=0.8 γ=8: 0.99 | 1.13 | 1.02
# γ 8–12 lie within 3 % of each other (τ = 0.8 ends most rounds first); 10 was best over the three sets in both
# runs. 16384 over 32768: faster on the long recording, as fast elsewhere; 8192 misses too many rare words.
# Measured again (2026-11-26, eighth session; AMD EPYC, 2 threads, the 74 s recording, `specdec bench --task
# transcribe --target-int8 off,on --draft-vocab 16384,32768 --repeat 3`, one run): with the rows-kernel attention
# the head's rows cost less of a step, and 32768 now ties on the unmodified target (2.14× against 16384's 2.19×,
# acceptance 0.976 against 0.931) and wins with --target-int8, whose draft was then the target's own int8 rows (1.17×
# against 1.07×, acceptance 0.988 against 0.941; full head: 1.0, but 1.08×). Default: 32768.
@dataclass(frozen=True)
class TranscribeOptions(DecodeOptions):
    target: str = option("embedded", "Whisper target: embedded (Whisper base), embedded:tiny.en, a Hugging Face id, "
                         "or a local directory.")
    draft: str = option("self", "self (the target's own decoder weights, int4, with a reduced output layer, in a lean "
                        "decoding step), self:K (its first K layers), self:0-2,4 (those layers), or another Whisper "
                        "model with the same vocabulary; lookup (prompt lookup within each window: no model) or "
                        "lookup+DRAFT.")
    gamma: int = 10
    gamma_schedule: str = "auto"
    max_new_tokens: int = option(224, "Never generate more than this many tokens per 30 s window.")
    # 4: each step reads the weights once for four windows (2026-11-27, AMD EPYC Zen 3, 2 threads, the CLI's other
    # defaults: a 297 s recording 20.3 → 14.6 s end to end, the 74 s one's decoding 3.4 → 1.9 s, the same text;
    # five short clips level; benchmarks/README.md). Each file's stats stay its own (decoding.stats.rows_share).
    batch_size: int = option(4, "30 s windows decoded together, of one file or several.")
    draft_vocab: int = option(32768, "The draft's output layer scores only the token ids below this (+ end of text, "
                              "+ the timestamp tokens with --timestamps): a cheaper draft, the same output. 0 = the "
                              "full vocabulary.")
    draft_stop: float = 0.8
    draft_quantized: bool = option(True, f"Give the self draft low-bit weights on a CPU (int4 layers, with --target-int8 "
                                   f"too, and an int4 output layer whose top tokens are rescored in int8) and "
                                   f"cross-attention over pooled frames in int8: {_DRAFT_CHEAPER}.")  # drafts/lean_whisper.py
    language: str = option("auto", "auto (detected per file; English-only models: en) or a language code: en, de, "
                           "fr, ...")
    task: str = option("transcribe", "transcribe | translate (into English; multilingual models only).", flag="--task")
    no_speech_threshold: float = option(0.6, "A window whose probability of no speech is above this is silence "
                                        "(nothing is decoded there).")  # OpenAI's default
    timestamps: bool = option(False, "Decode Whisper's timestamp tokens: segments with start and end times (on for "
                              "srt, vtt, tsv).", flag="--timestamps")
    output_format: str = option("txt", f"{' | '.join(OUTPUT_FORMATS)}: to stdout for one input, or one file per "
                                "input with --output-dir.")
    # int8 weights for the target's decoder linears and output layer on a CPU (models/int8.py): faster, and no
    # longer the unmodified model (measured against it by WER and identical transcripts: benchmarks/README.md). Off:
    # the decoder is the model itself.
    target_int8: bool = option(False, "Give the target int8 weights in its decoder linear layers and output layer "
                               "(CPU only; the encoder: --encoder-int8): faster, but no longer the unmodified model (its output "
                               "may differ from the default's; speculative decoding then reproduces the int8 "
                               "target's own output).")

    # The encoder's linears as int8 products (models/int8.py: Q6_K weights, activations in int8 per 256 inside
    # qmatmul's prompt kernel). On (2026-11-29, AMD EPYC Zen 3, 2 threads, fp32 Whisper base): a 30 s window's
    # encoder 0.94 → 0.76 s, the 297 s recording 18.6 → 16.2 s end to end, the same WER on it and the 74 s one;
    # benchmarks/README.md. Every mode reads the same encoder output: speculative output still equals autoregressive.
    encoder_int8: bool = option(True, "Run the encoder's linear layers as int8 products on a CPU with AVX2 or AVX-512 "
                                "VNNI (six-bit weights, int8 activations): about twice as fast there, and no longer "
                                "the unmodified model (judged by WER; --no-encoder-int8 keeps it).",
                                flag="--encoder-int8/--no-encoder-int8")

    def __post_init__(self):
        object.__setattr__(self, "language", (self.language or "auto").strip().lower())
        if self.output_format in TIMED_FORMATS:
            object.__setattr__(self, "timestamps", True)

    def validate(self):
        super().validate()
        one_of("--task", self.task, WHISPER_TASKS)
        one_of("--output-format", self.output_format, OUTPUT_FORMATS)
        if not 0.0 <= self.no_speech_threshold <= 1.0:
            raise SpecdecError(f"--no-speech-threshold must be in [0, 1] (got {self.no_speech_threshold})")
        return self


# ----------------------------------------------------------------------------------------------------
# Ray: summarize, transcribe and a task bench over a corpus on a Ray cluster (specdec_cli/distributed)


@dataclass(frozen=True)
class RayOptions:
    """Where and how wide a corpus runs on Ray (summarize, transcribe, bench --task summarize|transcribe).
    0 and None are "suit the cluster": distributed.corpus.pool_for reads what the cluster has."""

    ray: bool = option(False, "Decode the inputs on a Ray cluster, one model load per actor (pip install "
                       "'specdec-cli\\[ray]'): --ray=ADDRESS (or RAY_ADDRESS) joins the cluster there, plain --ray the one "
                       "running on this machine, else starts one for this run. Writes one file per input and "
                       "manifest.jsonl into --output-dir.", flag="--ray")
    ray_address: str | None = option(None, "The Ray cluster to join (auto, HOST:PORT, ray://HOST:PORT); --ray=ADDRESS "
                                     "says the same.")
    ray_actors: int = option(0, "Actors in the pool, each with its own models (0: one per GPU where the cluster has "
                             "GPUs, else its CPUs / --ray-threads; never more than the inputs).")
    ray_threads: int = option(0, "torch threads per actor, and the CPUs it reserves (0: 1).")
    ray_gpus: float | None = option(None, "GPUs per actor, fractions allowed (default: 1 where the cluster has GPUs, "
                                    "else 0).")

    def validate(self):
        given = [f.name for f in dataclasses.fields(self) if f.name != "ray" and getattr(self, f.name) not in (0, None)]
        if given and not self.ray:
            raise SpecdecError(f"--{given[0].replace('_', '-')} needs --ray")
        at_least("--ray-actors", self.ray_actors, 0)
        at_least("--ray-threads", self.ray_threads, 0)
        if self.ray_gpus is not None:
            at_least("--ray-gpus", self.ray_gpus, 0)
        if self.ray_address is not None and not self.ray_address.strip():
            raise SpecdecError("--ray= is empty: give the cluster's address (auto, HOST:PORT or ray://HOST:PORT)")
        return self


# ----------------------------------------------------------------------------------------------------
# The options of bench and verify-kernel, as the CLI takes them (bench/config.py builds a run from them)

_S, _T = SummarizeOptions(), TranscribeOptions()


def _task_help(name: str, what: str = "") -> str:
    """A task option's help in bench: the tasks' own help, and each task's default."""
    help_text = what or help_of(SummarizeOptions, name)[0] or help_of(TranscribeOptions, name)[0]
    defaults = [f"{t} {getattr(o, name)}" for t, o in (("summarize", _S), ("transcribe", _T)) if hasattr(o, name)]
    return f"A task's --{name.replace('_', '-')}, as for specdec summarize|transcribe: {help_text} (default: {', '.join(defaults)})."


@dataclass(frozen=True)
class BenchOptions:
    """What `specdec bench` takes: the grids as comma-separated lists; a task's decoding options left None are
    the task's own defaults (SummarizeOptions, TranscribeOptions)."""

    task: str = option("synthetic", "synthetic | summarize | transcribe")
    vocab: str = option("32000,151936", "Vocabulary sizes V, comma-separated (synthetic).")
    gamma: str = option("1,5,10", f"Draft lengths γ, comma-separated (1..{MAX_GAMMA}).")
    batch: str | None = option(None, "Batch sizes B, comma-separated (synthetic default: 1,8; a decoding task runs at "
                               "the smallest, by default its own: summarize 1, transcribe 4).")
    modes: str = option("baseline,exact,sigmoid,hf", "Comma-separated: baseline, exact, sigmoid, and (synthetic only) "
                        "hf, transformers' own (B = 1), and flashinfer (a CUDA GPU with FlashInfer). A task always runs "
                        "autoregressive too.")
    device: str = option("auto", "auto | cpu | cuda")
    dtype: str | None = option(None, "synthetic: the logits' dtype, float32 (default) | bfloat16 | float16; a task: "
                               "the models' dtype, auto (default) or one of those.")
    overlap: float = option(0.8, "Synthetic draft/target overlap Σ min(p, q), i.e. the expected α.")
    repeat: int | None = option(None, "synthetic: timed calls per provider (default 50; more while under 0.1 s). A "
                                "task: passes over the inputs per (γ, mode), in rounds that take every one in turn, the fastest kept "
                                "(default 1).")
    backend: str = option(DecodeOptions.backend, help_of(DecodeOptions, "backend")[0])
    alpha: float = option(DecodeOptions.alpha, help_of(DecodeOptions, "alpha")[0])
    beta: float = option(DecodeOptions.beta, help_of(DecodeOptions, "beta")[0])
    seed: int = option(DecodeOptions.seed, help_of(DecodeOptions, "seed")[0])
    threads: str | None = option(None, "torch intra-op threads (default: torch's, one per core); a task sweeps a "
                                 "list, e.g. 1,all.")
    gamma_schedule: str | None = option(None, f"A task's γ schedules, comma-separated: {', '.join(GAMMA_SCHEDULES)}; "
                                        "each runs at every --gamma (auto: its upper bound). Default: auto,constant.")
    data: str | None = option(None, "A task's inputs: a directory of articles (*.txt) or audio, or with an articles/ "
                              "or audio/ folder; <name>.ref.txt beside an input is its reference. Default: the "
                              "examples shipped with specdec (transcribe: the LibriVox clips of pocketsphinx-testdata "
                              "when installed).")
    limit: int | None = option(None, "A task: only the first N inputs.")
    target: str | None = option(None, _task_help("target", "the target model"))
    draft: str | None = option(None, _task_help("draft", "the draft model"))
    draft_vocab: str | None = option(None, _task_help("draft_vocab", "the draft's output layer sizes, comma-separated "
                                                      "(0 = full)"))
    draft_quantized: str | None = option(None, "A task's draft weights: on (summarize int8; transcribe int4 layers; "
                                         "the default), off, or on,off to compare.")
    target_int8: str | None = option(None, "transcribe: the target's weights: off (the default: the model itself), on "
                                     "(int8 decoder linears and output layer, as specdec transcribe --target-int8), or "
                                     "off,on to compare.")
    encoder_int8: str | None = option(None, "transcribe: the encoder's products: on (int8, as specdec transcribe "
                                      "runs by default), off (--no-encoder-int8: the model's own), or off,on to compare.")
    target_quant: str | None = option(None, _task_help("target_quant", "summarize: how the models' weights are held"))
    peers: str | None = option(None, "Other tools run beside, on the same inputs and threads, comma-separated: "
                               "faster-whisper (transcribe; pip install 'specdec-cli\\[peers]'; float32 and int8, fed the "
                               "embedded Whisper's CTranslate2 files); hf-assisted (summarize; transformers' generate() "
                               "with the draft as assistant_model, and with prompt_lookup_num_tokens); llama.cpp "
                               "(summarize; llama-cpp-python on the target's GGUF, greedy, built from source: "
                               "CMAKE_ARGS=\"-DGGML_NATIVE=ON\" pip install 'specdec-cli\\[llama-cpp]'). One that is not "
                               "installed is skipped with one line.")
    draft_stop: float | None = option(None, _task_help("draft_stop"))
    max_new_tokens: int | None = option(None, _task_help("max_new_tokens", "new tokens per input (transcribe: per "
                                                         "30 s window)"))
    language: str | None = option(None, _task_help("language", "the language; --peers run with it too"))
    temperature: float | None = option(None, "A task: 0 = greedy (default; every mode then verifies by argmax match), "
                                       "> 0 samples and compares the verifications.")
    out: str | None = option(None, "Write every figure, the command line and the machine as JSON.")
    csv: str | None = option(None, "Write one CSV row per (grid point, mode).")
    plot: str | None = option(None, "Write PNG plots into this directory.")


@dataclass(frozen=True)
class KernelCheckOptions:
    """What `specdec verify-kernel` takes."""

    mode: str = option("exact", "exact | sigmoid")
    vocab: int = option(32000, "Vocabulary size of the random cases.")
    gamma: int = option(5, help_of(DecodeOptions, "gamma")[0])
    batch: int = option(4, "Sequences per step.")
    samples: int = option(100_000, "Draws for the distribution test.")
    cases: int = option(8, "Random cases checked decision for decision.")
    alpha: float = option(DecodeOptions.alpha, help_of(DecodeOptions, "alpha")[0])
    beta: float = option(DecodeOptions.beta, help_of(DecodeOptions, "beta")[0])
    device: str = option("auto", "auto | cpu | cuda")
    seed: int = option(0, "Random seed.")
    compile_for: str | None = option(None, "sm_80 | sm_90: compile every kernel of the mode for that GPU, here, "
                                     "without one; report registers, spills, shared memory.")


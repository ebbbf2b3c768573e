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
# The options of a decoding command


@dataclass(frozen=True)
class DecodeOptions:
    """What `summarize` and `transcribe` take, besides their inputs. Each field is the CLI option of that
    name (`max_new_tokens` is --max-new-tokens)."""

    target: str = "embedded"  # a model spec: embedded[:NAME], a directory, a .gguf file, a hub id
    draft: str = "embedded"  # as target, or self / self:K / self:0-2,4 (drafts.spec)
    mode: str = "exact"
    gamma: int = 5  # draft tokens per round: the constant γ, heuristic's start, auto's upper bound
    gamma_schedule: str = "constant"  # auto: γ in [0, --gamma] from measured costs; heuristic: +2 / −1
    temperature: float = 0.0  # 0 = greedy: token for token the target alone's output
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int = 0
    max_new_tokens: int = 100
    batch_size: int = 1
    device: str = "auto"
    dtype: str = "auto"
    backend: str = "auto"
    alpha: float = -1e4  # sigmoid: p̂ = σ((z − α)/(β − α))
    beta: float = 1e4
    draft_vocab: int = 0  # score only this many frequent tokens (+ the prompt's) in the draft's head; 0 = all
    draft_stop: float = 0.0  # end a round's drafting once the draft gives its token less than this
    draft_quantized: bool = False  # low-bit draft weights on a CPU (summarize: int8, transcribe: int4)

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
        one_of("--backend", self.backend, BACKENDS)
        check_sigmoid(self.alpha, self.beta)
        if self.draft_vocab < 0:
            raise SpecdecError(f"--draft-vocab must be 0 (off) or a number of tokens (got {self.draft_vocab})")
        if not 0.0 <= self.draft_stop < 1.0:
            raise SpecdecError(f"--draft-stop must be in [0, 1) (got {self.draft_stop})")
        return self


# Summarize: the embedded Qwen2.5-Coder 1.5B target and 0.5B draft. γ = 4 with draft-stop 0.4 was the best
# pair measured on the embedded pair (2.62 -> 3.28 tok/s at γ = 4 on one article, bf16, 1 thread of a 2-core
# Xeon; benchmarks/README.md), the 32 768-token draft head and int8 draft weights likewise.
@dataclass(frozen=True)
class SummarizeOptions(DecodeOptions):
    gamma: int = 4
    gamma_schedule: str = "auto"
    draft_vocab: int = 32768
    draft_stop: float = 0.4
    draft_quantized: bool = True  # int8 (drafts/int8.py)
    truncate: bool = False  # cut an article too long for the model's context instead of refusing it
    # with --truncate, the prompt tokens kept: the embedded pair reads 2048 tokens in ~46 s on 2 cores (an AMD
    # EPYC, bf16; 1024 in ~16 s, 512 in ~9 s), the whole 32 768-token context would take well over 10 minutes
    max_input_tokens: int = 2048

    def validate(self):
        super().validate()
        at_least("--max-input-tokens", self.max_input_tokens, 16)
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
@dataclass(frozen=True)
class TranscribeOptions(DecodeOptions):
    draft: str = "self"
    gamma: int = 10
    gamma_schedule: str = "auto"
    max_new_tokens: int = 224  # per 30 s window
    draft_vocab: int = 16384
    draft_stop: float = 0.8
    draft_quantized: bool = True  # int4 (drafts/int4.py)
    language: str = "auto"  # detected per file (English-only models: en), or a code: en, de, fr, ...
    task: str = "transcribe"  # or translate (into English; multilingual models only)
    no_speech_threshold: float = 0.6  # P(<|nospeech|>) above this: the window is silence (OpenAI's default)
    timestamps: bool = False  # decode Whisper's timestamp tokens: timed segments (on for TIMED_FORMATS)
    output_format: str = "txt"  # one of OUTPUT_FORMATS
    # int8 weights for the target's decoder linears and output layer on a CPU (models/int8.py; the encoder stays:
    # int8 did not make it faster): faster, and no longer the unmodified model (measured against it by WER and
    # identical transcripts: benchmarks/README.md). Off: the default is the model itself.
    target_int8: bool = False

    def __post_init__(self):
        object.__setattr__(self, "language", (self.language or "auto").strip().lower())
        if self.output_format in TIMED_FORMATS:
            object.__setattr__(self, "timestamps", True)

    def validate(self):
        super().validate()
        one_of("--task", self.task, WHISPER_TASKS)
        one_of("--output-format", self.output_format, OUTPUT_FORMATS)
        return self

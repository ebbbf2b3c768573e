"""How Whisper enters the decoding loop for a batch of 30 s windows: features and encoder once, then decoders
over the window's encoder output.

    features, encode  log-mel features of ≤ 30 s audio, and the encoder over them (its self-attention
                      frames_attention: on an AVX2 CPU kernels/frames_attention)
    EncodedWindows    a batch of windows as every decoder reads them: the audio, the target's encoder output and
                      every decoder layer's cross-attention K/V, computed once and shared by the target, the draft
                      and the probe (a self draft's layers are the target's own: the same K/V)
    cross_kv          those K/V
    same_encoder      whether two Whisper models have the same encoder (a draft then reuses the target's output)
    WindowDecoder     a Seq2SeqDecoder whose cross-attention cache starts filled with them (kernel_or_step:
                      on a CPU kernels/rows_attention, fp32; elsewhere cross-attention in the K/V's dtype)
    ExactScorer       the target in the speculative modes: γ+1 slots in one pass, every row bit for bit a
                      one-token step's logits (greedy speculative output = autoregressive output)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from specdec_cli import internals
from specdec_cli.decoding import Seq2SeqDecoder
from specdec_cli.decoding.exact_rows import copy_with_row_linears, kernel_or_sdpa_by_rows, kernel_or_step, row_linear
from specdec_cli.kernels import frames_attention as kernels_frames
from specdec_cli.models.loading import LoadedModel
from specdec_cli.models.whisper import SAMPLE_RATE


def features(model: LoadedModel, audio: Sequence[np.ndarray]) -> torch.Tensor:
    """Log-mel features [B, mels, 3000] of each (≤ 30 s) audio, padded as Whisper expects."""
    fe = model.feature_extractor
    out = fe(list(audio), sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
    return out.to(device=model.device, dtype=model.dtype)


def encode(model: LoadedModel, feats: torch.Tensor) -> torch.Tensor:
    """The encoder's output [B, S, d] for features [B, mels, 3000]: on a CPU one window at a time (four windows
    together took 1.16× as long, AMD EPYC Zen 3, 2 threads: 1 500 frames a window fill the cores already, and a
    window's output no longer depends on the batch it is in), its self-attention through frames_attention; elsewhere
    all together."""
    encoder = model.model.model.encoder
    if feats.device.type != "cpu":
        return encoder(feats).last_hidden_state
    if internals.attention_implementation(encoder.config) == "sdpa":
        encoder = _with_attention(encoder, "specdec_frames", frames_attention, internals.shallow_copy)
    return torch.cat([encoder(feats[i : i + 1]).last_hidden_state for i in range(feats.shape[0])])


def frames_attention(module, query, key, value, attention_mask, **kwargs):
    """The encoder's self-attention through kernels/frames_attention where it takes the call (a CPU with AVX2 or
    AVX-512, heads 64 wide) and nothing it leaves out is asked for (a mask, dropout, the weights), else transformers'
    sdpa. -> (out [B, S, H, D], None)."""
    if attention_mask is None and not kwargs.get("dropout") and not kwargs.get("output_attentions") \
            and kernels_frames.runs(query, key, value):
        scale = kwargs.get("scaling")
        return kernels_frames.attend(query, key, value, query.shape[-1] ** -0.5 if scale is None else scale), None
    return internals.sdpa_attention(module, query, key, value, attention_mask, **kwargs)


@dataclass(frozen=True)
class EncodedWindows:
    """A batch of windows, encoded once: what every decoder of the batch reads (decoding.draft.Batch.window)."""

    audio: list[np.ndarray]  # each row's ≤ 30 s of 16 kHz samples (a draft with its own encoder reads them)
    encoded: torch.Tensor  # [B, S, d]: the target's encoder output
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per target decoder layer: cross-attention K, V [B, heads, S, hd]
    timestamps: bool = False  # the task decodes timestamp tokens (a draft must score them)


def same_encoder(a: nn.Module, b: nn.Module) -> bool:
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


def cross_kv(layers: Sequence[nn.Module], encoded: torch.Tensor,
             dtype: torch.dtype | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each decoder layer's cross-attention keys and values for `encoded` [B, S, d]: [(K, V)] with
    K, V [B, heads, S, head_dim], computed exactly as WhisperAttention does on its first call, then kept in
    `dtype` (default: as computed; the target's: models.whisper.cross_attention_dtype)."""
    out = []
    B = encoded.shape[0]
    for layer in layers:
        attn = layer.encoder_attn
        shape = (B, -1, attn.num_heads, attn.head_dim)
        k = attn.k_proj(encoded).view(shape).transpose(1, 2).contiguous()
        v = attn.v_proj(encoded).view(shape).transpose(1, 2).contiguous()
        out.append((k, v) if dtype is None else (k.to(dtype), v.to(dtype)))
    return out


def _with_attention(stack: nn.Module, name: str, fn, copy=copy_with_row_linears) -> nn.Module:
    """A shallow copy of a Whisper decoder or encoder (weights and caches shared) whose attention modules run `fn`,
    each layer and attention module copied by `copy` (by default its linear layers made to compute a lone row as a
    pass does: decoding/exact_rows.row_linear); its config, hence its masks, stay transformers' sdpa ones."""
    config = internals.config_with_attention(stack.config, name, fn)
    clone = internals.shallow_copy(stack)
    clone.layers = nn.ModuleList()
    for layer in stack.layers:
        layer = copy(layer)
        for attr in ("self_attn", "encoder_attn"):  # an encoder layer has the first only
            if hasattr(layer, attr):
                attn = copy(getattr(layer, attr))
                attn.config = config
                setattr(layer, attr, attn)
        clone.layers.append(layer)
    return clone


class WindowDecoder(Seq2SeqDecoder):
    """A Seq2SeqDecoder whose cross-attention cache starts filled with precomputed K/V (no recomputation:
    the target, the draft and the probe share the tensors; each has its own cache objects). Where the model
    runs transformers' sdpa, its steps run `attention` (kernel_or_step here: decoding/exact_rows) and its prompt
    kernel_or_step."""

    attention = staticmethod(kernel_or_step)
    attention_name = "specdec_step"

    def __init__(self, model, encoded: torch.Tensor, kv: list[tuple[torch.Tensor, torch.Tensor]], hook=None):
        from transformers.modeling_outputs import BaseModelOutput

        super().__init__(model, forward_kwargs={"encoder_outputs": BaseModelOutput(last_hidden_state=encoded)},
                         logits_hook=hook)
        self.kv = kv
        decoder = model.model.decoder
        self.proj_out = model.proj_out
        if internals.attention_implementation(decoder.config) != "sdpa":
            self.decoder = self.prefill_decoder = decoder
        else:
            self.proj_out = row_linear(model.proj_out)  # transformers' layers with our attention; the prompt always through kernel_or_step
            self.decoder = _with_attention(decoder, self.attention_name, self.attention)
            self.prefill_decoder = (self.decoder if self.attention_name == WindowDecoder.attention_name else
                                    _with_attention(decoder, WindowDecoder.attention_name, kernel_or_step))

    def _call(self, tokens, mask, positions, keep: int) -> torch.Tensor:
        hidden = self.decoder(
            input_ids=tokens, attention_mask=mask, encoder_hidden_states=self.forward_kwargs["encoder_outputs"].last_hidden_state,
            **internals.cache_kwargs(self.decoder, self.cache), position_ids=positions, use_cache=True,
        ).last_hidden_state  # [B, T, d]
        if keep:
            hidden = hidden[:, -keep:]
        return self.proj_out(hidden)  # [B, T', V]

    def prefill(self, tokens, mask, positions) -> None:
        """The prompt slots through the layers only: their logits are never read (Seq2SeqDecoder would
        also apply the output layer to them)."""
        self.reset()
        if tokens.shape[1] > 0:
            encoded = self.forward_kwargs["encoder_outputs"].last_hidden_state
            self.prefill_decoder(input_ids=tokens, attention_mask=mask, encoder_hidden_states=encoded,
                                 **internals.cache_kwargs(self.prefill_decoder, self.cache), position_ids=positions,
                                 use_cache=True)
            self.length, self.seen = tokens.shape[1], tokens

    def new_cache(self):
        return internals.prefilled_cross_cache(self.kv)

    def select(self, rows: torch.Tensor) -> None:
        super().select(rows)
        self.kv = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.kv]


class ExactScorer(WindowDecoder):
    """The target in the speculative modes: it scores a round's γ+1 slots in one pass (one read of its weights),
    every row bit for bit the logits that a one-token step, i.e. autoregressive decoding, gives for it, so
    greedy output is the autoregressive output token for token.

    Layer norms and GELU compute a row the same in a many-row call as alone, and so do the linear layers (on a CPU
    kernels/float_rows, each row alone; elsewhere from two rows on: a lone row is computed as two, RowLinear);
    torch's scaled_dot_product_attention does not (a
    9-row call rounds differently from nine 1-row calls and flipped 0.7 % of the greedy tokens of the 74 s
    LibriVox recording in bf16), so attention runs row by row (decoding/exact_rows: kernel_rows, else sdpa_by_rows). Needs the target's attention
    to be sdpa (transformers' default for Whisper); tests/test_transcribe.py checks the rows bit for bit."""

    attention = staticmethod(kernel_or_sdpa_by_rows)
    attention_name = "specdec_sdpa_by_rows"

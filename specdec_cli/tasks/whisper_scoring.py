"""How Whisper's decoder enters the decoding loop for one 30 s window, and how its logits are shaped:

    cross_kv       every decoder layer's cross-attention K/V of a window, computed once and shared by the
                   target, the draft and the probe
    WindowDecoder  a Seq2SeqDecoder whose cross-attention cache starts filled with them (step_attention:
                   cross-attention in the K/V's dtype, fp32 on a CPU)
    ExactScorer    the target in the speculative modes: γ+1 slots in one pass, every row bit for bit a
                   one-token step's logits (greedy speculative output = autoregressive output)
    Suppressor     the logits hook: the tokens Whisper never emits here (special and timestamp tokens)
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from specdec_cli import internals
from specdec_cli.decoding import Seq2SeqDecoder
from specdec_cli.models import LoadedModel
from specdec_cli.models.whisper import special_ids


class Suppressor:
    """The logits hook: Whisper's suppress_tokens and every special / timestamp token except EOT, always;
    begin_suppress_tokens (blank, EOT) at the first generated position. Timestamps are off."""

    def __init__(self, model: LoadedModel, prompt_len: int, vocab: int):
        g = model.model.generation_config
        ids = special_ids(model)
        suppress = set(getattr(g, "suppress_tokens", None) or getattr(model.model.config, "suppress_tokens", None) or [])
        suppress |= {i for i in model.tokenizer.added_tokens_decoder if i != ids.eot}
        begin = set(getattr(g, "begin_suppress_tokens", None) or getattr(model.model.config, "begin_suppress_tokens", None) or [])
        device = model.device
        self.always = torch.zeros(vocab, dtype=torch.bool, device=device)
        self.always[[i for i in suppress if 0 <= i < vocab]] = True
        self.begin = torch.zeros(vocab, dtype=torch.bool, device=device)
        self.begin[[i for i in begin if 0 <= i < vocab]] = True
        self.prompt_len = prompt_len

    def __call__(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        first = (positions == self.prompt_len)[..., None]  # [B, T, 1]
        return logits.masked_fill(self.always | (first & self.begin), -math.inf)


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


def step_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' sdpa attention for queries [B, H, T, D], with cross-attention computed in its keys' dtype
    (fp32 on a CPU: models.whisper.cross_attention_dtype), the output back in the queries'; one query's mask
    dropped when it hides nothing, as transformers' sdpa path drops it (a mask takes another kernel).
    -> (out [B, T, H, D], None)."""
    if query.shape[2] == 1:
        attention_mask = internals.sdpa_mask_for_one_query(attention_mask)
    if module.is_causal or key.dtype == query.dtype:
        return internals.sdpa_attention(module, query, key, value, attention_mask, **kwargs)
    out, weights = internals.sdpa_attention(module, query.to(key.dtype), key, value, attention_mask, **kwargs)
    return out.to(query.dtype), weights


class RowLinear(nn.Module):
    """An nn.Linear (weights shared) that computes a lone row [.., 1, in] as the first of two rows. On a CPU
    a one-row product may take another kernel than a many-row one and round otherwise (oneDNN, bf16, AMD
    EPYC: Whisper base's fc2, 2048 -> 512, differs at one row and agrees for every count from 2 to 32; its
    other layers agree at every count), so that a one-token step computes a row as a pass over several tokens
    does. Two rows cost what one does: the weights are read once. (Layers much smaller than base's may not
    agree among counts of two and more either; tests/test_transcribe.py checks base bit for bit.)"""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[:-1].numel() == 1:
            return self.linear(torch.cat([x, x], -2))[..., :1, :]
        return self.linear(x)


def _row_linear(linear: nn.Module) -> nn.Module:
    """RowLinear(linear) for an nn.Linear on a CPU in bf16/fp16, where greedy equality rests on rows computing
    alike; else `linear` itself."""
    if type(linear) is not nn.Linear:  # e.g. models.int8.Int8Linear (--target-int8)
        return linear
    w = linear.weight
    return RowLinear(linear) if w.device.type == "cpu" and w.dtype in (torch.bfloat16, torch.float16) else linear


def _copy(module: nn.Module) -> nn.Module:
    """A shallow copy of `module` with its nn.Linear children made _row_linear."""
    clone = internals.shallow_copy(module)
    for name, child in module.named_children():
        if type(child) is nn.Linear:
            setattr(clone, name, _row_linear(child))
    return clone


def _with_attention(decoder: nn.Module, name: str, fn) -> nn.Module:
    """A shallow copy of a Whisper decoder (weights and caches shared) whose attention modules run `fn` and
    whose linear layers compute a lone row as a pass does (_row_linear); its config, hence its masks, stay
    transformers' sdpa ones."""
    config = internals.config_with_attention(decoder.config, name, fn)
    clone = internals.shallow_copy(decoder)
    clone.layers = nn.ModuleList()
    for layer in decoder.layers:
        layer = _copy(layer)
        for attr in ("self_attn", "encoder_attn"):
            attn = _copy(getattr(layer, attr))
            attn.config = config
            setattr(layer, attr, attn)
        clone.layers.append(layer)
    return clone


class WindowDecoder(Seq2SeqDecoder):
    """A Seq2SeqDecoder whose cross-attention cache starts filled with precomputed K/V (no recomputation:
    the target, the draft and the probe share the tensors; each has its own cache objects). Where the model
    runs transformers' sdpa, its steps run `attention` (step_attention here) and its prompt step_attention."""

    attention = staticmethod(step_attention)
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
            self.proj_out = _row_linear(model.proj_out)  # transformers' layers with our attention; the prompt always through step_attention
            self.decoder = _with_attention(decoder, self.attention_name, self.attention)
            self.prefill_decoder = (self.decoder if self.attention_name == WindowDecoder.attention_name else
                                    _with_attention(decoder, WindowDecoder.attention_name, step_attention))

    def _call(self, tokens, mask, positions, keep: int) -> torch.Tensor:
        hidden = self.decoder(
            input_ids=tokens, attention_mask=mask, encoder_hidden_states=self.forward_kwargs["encoder_outputs"].last_hidden_state,
            past_key_values=self.cache, position_ids=positions, use_cache=True,
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
                                 past_key_values=self.cache, position_ids=positions, use_cache=True)
            self.length = tokens.shape[1]

    def new_cache(self):
        return internals.prefilled_cross_cache(self.kv)

    def select(self, rows: torch.Tensor) -> None:
        super().select(rows)
        self.kv = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.kv]


def _sdpa_by_rows(module, query, key, value, attention_mask, **kwargs):
    """Attention for queries [B, heads, T, head_dim], one query row at a time (step_attention) over
    exactly the keys a one-token step would see: the first S − (T−1−r) for row r of a causal self-attention,
    all S for cross-attention (step_attention drops a mask row that hides nothing, as transformers does for
    one token). -> ([B, T, heads, head_dim], None), each row bit for bit a one-token step's."""
    T, S = query.shape[2], key.shape[2]
    if T == 1:
        return step_attention(module, query, key, value, attention_mask, **kwargs)
    rows = []
    for r in range(T):
        end = S - (T - 1 - r) if module.is_causal else S
        mask = None if attention_mask is None else attention_mask[:, :, r : r + 1, :end]
        rows.append(step_attention(module, query[:, :, r : r + 1], key[:, :, :end], value[:, :, :end], mask,
                                        **kwargs)[0])
    return torch.cat(rows, 1), None


class ExactScorer(WindowDecoder):
    """The target in the speculative modes: it scores a round's γ+1 slots in one pass (one read of its weights),
    every row bit for bit the logits that a one-token step, i.e. autoregressive decoding, gives for it, so
    greedy output is the autoregressive output token for token.

    Layer norms and GELU compute a row the same in a many-row call as alone, and so do the linear layers from
    two rows on (a lone row is computed as two: RowLinear); torch's scaled_dot_product_attention does not (a
    9-row call rounds differently from nine 1-row calls and flipped 0.7 % of the greedy tokens of the 74 s
    LibriVox recording in bf16), so attention runs row by row (_sdpa_by_rows). Needs the target's attention
    to be sdpa (transformers' default for Whisper); tests/test_transcribe.py checks the rows bit for bit."""

    attention = staticmethod(_sdpa_by_rows)
    attention_name = "specdec_sdpa_by_rows"

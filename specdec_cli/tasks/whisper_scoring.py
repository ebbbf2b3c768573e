"""How Whisper's decoder enters the decoding loop for one 30 s window, and how its logits are shaped:

    cross_kv       every decoder layer's cross-attention K/V of a window, computed once and shared by the
                   target, the draft and the probe
    WindowDecoder  a Seq2SeqDecoder whose cross-attention cache starts filled with them (step_attention:
                   cross-attention in the K/V's dtype, fp32 on a CPU)
    ExactScorer    the target in the speculative modes: γ+1 slots in one pass, every row bit for bit a
                   one-token step's logits (greedy speculative output = autoregressive output)
    Suppressor     the logits hook: the tokens Whisper never emits here (special tokens; timestamp tokens
                   unless timestamps are on)
    TimestampRules Whisper's rules for timestamp tokens, each logits row by its own prefix (with timestamps)
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import torch
from torch import nn

from specdec_cli import internals
from specdec_cli.decoding import Seq2SeqDecoder
from specdec_cli.models import LoadedModel
from specdec_cli.models.exact_rows import copy_with_row_linears, row_linear, sdpa_by_rows, step_attention
from specdec_cli.models.whisper import special_ids


class Suppressor:
    """The logits hook, the same for the draft's proposals and the target's scores (hence its resampled and
    bonus tokens): Whisper's suppress_tokens and every special token except EOT, always; begin_suppress_tokens
    (blank, EOT) at the first generated position; with `timestamps`, the timestamp tokens are let through
    and TimestampRules apply after the suppression (transformers' and OpenAI's order)."""

    def __init__(self, model: LoadedModel, prompt_len: int, vocab: int, timestamps: bool = False):
        g = model.model.generation_config
        ids = special_ids(model)
        suppress = set(getattr(g, "suppress_tokens", None) or getattr(model.model.config, "suppress_tokens", None) or [])
        suppress |= {i for i in model.tokenizer.added_tokens_decoder if i != ids.eot}
        self.timestamps = TimestampRules(ids, prompt_len) if timestamps else None
        if self.timestamps is not None:
            suppress = {i for i in suppress if i < ids.timestamp_begin}
        begin = set(getattr(g, "begin_suppress_tokens", None) or getattr(model.model.config, "begin_suppress_tokens", None) or [])
        device = model.device
        self.always = torch.zeros(vocab, dtype=torch.bool, device=device)
        self.always[[i for i in suppress if 0 <= i < vocab]] = True
        self.begin = torch.zeros(vocab, dtype=torch.bool, device=device)
        self.begin[[i for i in begin if 0 <= i < vocab]] = True
        self.prompt_len = prompt_len

    def __call__(self, logits: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        first = (positions == self.prompt_len)[..., None]  # [B, T, 1]
        logits = logits.masked_fill(self.always | (first & self.begin), -math.inf)
        return logits if self.timestamps is None else self.timestamps(logits, tokens)


class TimestampRules:
    """Whisper's timestamp rules (OpenAI's ApplyTimestampRules, transformers' WhisperTimeStampLogitsProcessor),
    for logits rows that each have their own prefix. Over the generated tokens before a row (the prompt's
    `prompt_len` tokens excluded):
      - <|notimestamps|> never;
      - timestamps come in pairs: after two timestamps (or one alone) text follows, after text then one
        timestamp no text token (ids below EOT) does;
      - they never go backwards: none below the last one, and none equal to it but the one right after a
        segment's end (the next segment's start);
      - the first token is a timestamp, at most <|0.00|> + max_initial_timestamp;
      - when the probability of all timestamps together exceeds the most likely text token's, a timestamp.
    Called by the logits hook with logits [B, T, V] and tokens [B, S] (decoding.adapters.LogitsHook: row t's
    prefix is the first S − (T − 1 − t) slots, −1 marks a slot outside the sequence)."""

    def __init__(self, ids, prompt_len: int):
        self.eot, self.begin, self.no_timestamps = ids.eot, ids.timestamp_begin, ids.no_timestamps
        self.max_initial = ids.max_initial_timestamp
        self.prompt_len = prompt_len

    def _states(self, tokens: list[int], rows: int) -> list[tuple[int, bool, bool, int]]:
        """After each of the last `rows` slots of one sequence's tokens: (generated tokens so far, the last is a
        timestamp, the one before is (or there are fewer than two), the lowest timestamp allowed next)."""
        out, seen, n, last, before, last_time = [], 0, 0, None, None, None
        for i, t in enumerate(tokens):
            if t >= 0:
                seen += 1
                if seen > self.prompt_len:  # a generated token
                    n, before, last = n + 1, last, t
                    last_time = t if t >= self.begin else last_time
            if i >= len(tokens) - rows:
                was_time = last is not None and last >= self.begin
                before_time = n < 2 or before >= self.begin
                floor = (self.begin if last_time is None  # a segment may start when the one before ended
                         else last_time if was_time and not before_time else last_time + 1)
                out.append((n, was_time, before_time, floor))
        return out

    def __call__(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        B, T, V = logits.shape
        states = [s for row in tokens.tolist() for s in self._states(row, T)]  # B·T, row-major
        logits = logits.clone()  # [B, T, V]
        logits[..., self.no_timestamps] = -math.inf
        # each rule bans a range of ids: text below `text_end`, times outside [lo, hi)
        for (b, t), (n, was_time, before_time, floor) in zip(itertools.product(range(B), range(T)), states):
            text_end = self.begin if n == 0 else self.eot if was_time and not before_time else 0
            lo, hi = (V, V) if was_time and before_time else (floor, self.begin + self.max_initial + 1 if n == 0 else V)
            row = logits[b, t]  # [V], a view
            row[:text_end] = row[self.begin : lo] = row[hi:] = -math.inf
        # the times' summed probability above the likeliest text token's: log-sum-exp of the time logits
        # against the largest text logit (the softmax's normalizer is on both sides; transformers subtracts it
        # from both, which can only matter to a tie within float32 rounding)
        z = logits.float()
        time_wins = z[..., self.begin :].logsumexp(-1) > z[..., : self.begin].amax(-1)  # [B, T]
        for b, t in time_wins.nonzero().tolist():
            logits[b, t, : self.begin] = -math.inf
        return logits


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


def _with_attention(decoder: nn.Module, name: str, fn) -> nn.Module:
    """A shallow copy of a Whisper decoder (weights and caches shared) whose attention modules run `fn` and
    whose linear layers compute a lone row as a pass does (models/exact_rows.row_linear); its config, hence its masks, stay
    transformers' sdpa ones."""
    config = internals.config_with_attention(decoder.config, name, fn)
    clone = internals.shallow_copy(decoder)
    clone.layers = nn.ModuleList()
    for layer in decoder.layers:
        layer = copy_with_row_linears(layer)
        for attr in ("self_attn", "encoder_attn"):
            attn = copy_with_row_linears(getattr(layer, attr))
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
            self.proj_out = row_linear(model.proj_out)  # transformers' layers with our attention; the prompt always through step_attention
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

    Layer norms and GELU compute a row the same in a many-row call as alone, and so do the linear layers from
    two rows on (a lone row is computed as two: RowLinear); torch's scaled_dot_product_attention does not (a
    9-row call rounds differently from nine 1-row calls and flipped 0.7 % of the greedy tokens of the 74 s
    LibriVox recording in bf16), so attention runs row by row (models/exact_rows.sdpa_by_rows). Needs the target's attention
    to be sdpa (transformers' default for Whisper); tests/test_transcribe.py checks the rows bit for bit."""

    attention = staticmethod(sdpa_by_rows)
    attention_name = "specdec_sdpa_by_rows"

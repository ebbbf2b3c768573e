"""Whisper's rules for its logits, applied alike to the draft's proposals and to every row the target scores (the
logits hook of both decoders, so greedy output stays the autoregressive output and sampling the target's):

    Suppressor     the tokens Whisper never emits here (special tokens; timestamp tokens unless timestamps are on)
    TimestampRules Whisper's rules for timestamp tokens, each logits row by its own prefix (with timestamps)

How Whisper's decoder itself enters the loop (the window's cross-attention K/V, the exact scorer) is in
models/whisper_decoding.py.
"""

from __future__ import annotations

import itertools
import math

import torch

from specdec_cli.models import LoadedModel
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
        self.always = torch.tensor(sorted(i for i in suppress if 0 <= i < vocab), dtype=torch.long, device=device)  # ids
        self.begin = torch.zeros(vocab, dtype=torch.bool, device=device)
        self.begin[[i for i in begin if 0 <= i < vocab]] = True
        self.prompt_len = prompt_len

    def __call__(self, logits: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        # a copy with the always-suppressed ids set: a [B, T, V] mask built and applied cost ~15x (0.3 ms at 11 rows)
        logits = logits.clone()
        logits[..., self.always] = -math.inf
        first = positions == self.prompt_len  # [B, T]: the first generated position, where begin applies too
        if first.any():
            logits[first] = logits[first].masked_fill(self.begin, -math.inf)
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

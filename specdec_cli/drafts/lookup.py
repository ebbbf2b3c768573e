"""Prompt lookup: a draft without a model (also called n-gram drafting; transformers' prompt_lookup_num_tokens,
vLLM's ngram proposer, llama.cpp's lookup decoding).

A summary repeats its article's names, numbers and phrases. Before each round the draft takes the longest tail of
a row (the prompt and what was generated so far; `longest` tokens at most, `shortest` at least) that occurred
earlier, and proposes the tokens that followed it there, up to γ. Where the tail occurred several times, it follows
the occurrence whose next token came most often after it (the latest such): on the seven example articles this
made 2.21 tokens per target call instead of 2.15 for the latest occurrence (γ = 4, a replay of the target's greedy
output). No model, no memory, tens of microseconds. The proposal is deterministic, so verification reads it as a
one-hot q (decoding/verify.py): accept x iff u <= p(x), after a rejection draw from p without x. Greedy output
is the target's token for token, sampled output keeps its distribution.

    Lookup      the draft itself (`lookup`, `lookup:N`, `lookup:N-M`)
    LookupThen  lookup first; another draft for the rounds where no n-gram matched (`lookup+DRAFT`)

This module is the worked example of a draft kind: a class that follows decoding.draft.Draft, a `build`
function, and one line in drafts/__init__.py's BUILDERS.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from specdec_cli.decoding import Batch, Decoder, Draft, DraftSettings, Proposal, Slots
from specdec_cli.drafts import spec


def continuation(context: np.ndarray, k: int, longest: int, shortest: int = 1) -> np.ndarray:
    """The up to k tokens that followed an earlier occurrence of context's longest tail of `shortest`..`longest`
    tokens that occurred before: of that tail's occurrences, one whose next token is the most frequent among
    them, the latest such. Nothing matched: empty.

    >>> continuation(np.array([5, 6, 7, 8, 5, 6]), 3, longest=3).tolist()
    [7, 8, 5]
    >>> continuation(np.array([1, 4, 1, 4, 1, 9, 1]), 2, longest=1).tolist()  # 4 came twice after 1, 9 once
    [4, 1]
    """
    L = len(context)
    ends = np.flatnonzero(context[: L - 1] == context[L - 1])  # ends i < L−1 of earlier occurrences of the 1-token tail
    found, n = None, 1
    while len(ends) and n <= longest:  # ends: where the n-token tail context[L−n:] occurred before
        if n >= shortest:
            found = ends
        ends = ends[ends >= n]
        ends = ends[context[ends - n] == context[L - 1 - n]] if n < L else ends[:0]  # the (n+1)-token tail
        n += 1
    if found is None:
        return context[:0]
    following = context[found + 1]  # [hits]: the token after each occurrence
    values, counts = np.unique(following, return_counts=True)
    start = found[np.isin(following, values[counts == counts.max()])][-1] + 1
    return context[start : start + k]


class Lookup:
    """The prompt-lookup draft. longest, shortest: the tail lengths (n-gram sizes) it matches. No model and no
    cache: fitting it to a batch changes nothing."""

    vocab = None  # proposes token ids of the prompt: any vocabulary
    decoders: tuple[Decoder, ...] = ()

    def __init__(self, longest: int = spec.LOOKUP_LONGEST, shortest: int = spec.LOOKUP_SHORTEST):
        if not 1 <= shortest <= longest:
            raise ValueError("n-gram sizes: 1 <= shortest <= longest")
        self.longest, self.shortest = longest, shortest

    def fit(self, batch: Batch) -> Lookup:
        return self

    def crop(self, length: int) -> None:
        pass

    def propose(self, slots: Slots, gamma: int, settings: DraftSettings) -> Proposal:
        """Each row's continuation; a row with a shorter one (or none) is padded with its last token, which
        verification rejects or accepts like any proposal. k = 0 when no row matched."""
        tokens = slots.tokens[:, : slots.length].cpu().numpy()  # [B, S]
        valid = slots.valid[:, : slots.length].cpu().numpy()  # [B, S]
        found = [self.lookup(t[v], gamma) for t, v in zip(tokens, valid)]
        k = max(len(f) for f in found)
        out = torch.empty(len(found), k, dtype=torch.int64)  # [B, k]
        for b, f in enumerate(found):
            pad = f[-1] if len(f) else tokens[b, slots.length - 1]
            out[b] = torch.from_numpy(np.concatenate([f, np.full(k - len(f), pad, dtype=f.dtype)]))
        return Proposal(out.to(slots.tokens.device), None)

    def lookup(self, context: np.ndarray, k: int) -> np.ndarray:
        return continuation(context, k, self.longest, self.shortest)


class LookupThen:
    """Lookup when an n-gram matches, another draft otherwise (a model: its cache catches up on the slots it
    missed in its next round, its first step reads them all)."""

    def __init__(self, lookup: Lookup, then: Draft):
        self.lookup, self.then = lookup, then

    @property
    def vocab(self) -> int | None:
        return self.then.vocab

    @property
    def decoders(self) -> tuple[Decoder, ...]:
        return self.then.decoders

    def fit(self, batch: Batch) -> LookupThen:
        return LookupThen(self.lookup, self.then.fit(batch))

    def crop(self, length: int) -> None:
        self.then.crop(length)

    def propose(self, slots: Slots, gamma: int, settings: DraftSettings) -> Proposal:
        found = self.lookup.propose(slots, gamma, settings)
        return found if found.tokens.shape[1] > 0 else self.then.propose(slots, gamma, settings)


def build(draft_spec: str, target: Any, opts: Any, progress: bool = True) -> Lookup:
    """`lookup`, `lookup:N` or `lookup:N-M` (drafts/spec.py), for any target."""
    return Lookup(*spec.lookup_sizes(draft_spec))

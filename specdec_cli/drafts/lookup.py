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

    Lookup           the draft itself
    LookupThenModel  lookup first; a model draft for the rounds where no n-gram matched
    WithLookup       what drafts.load_draft gives for --draft lookup+DRAFT, before the loop's drafter is made
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specdec_cli.decoding.drafter import Drafter, ModelDrafter, Proposal, as_drafter


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


class Lookup(Drafter):
    """The prompt-lookup draft. longest, shortest: the tail lengths (n-gram sizes) it matches."""

    def __init__(self, longest: int = 16, shortest: int = 1):
        if not 1 <= shortest <= longest:
            raise ValueError("n-gram sizes: 1 <= shortest <= longest")
        self.longest, self.shortest = longest, shortest

    def propose(self, slots, gamma, params, generator, vocab, *, keep_logits=False, stop_below=0.0) -> Proposal:
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
        out = out.to(slots.tokens.device)
        for i in range(k):
            slots.append(out[:, i])
        return Proposal(out, None)

    def lookup(self, context: np.ndarray, k: int) -> np.ndarray:
        return continuation(context, k, self.longest, self.shortest)


class LookupThenModel(Drafter):
    """Lookup when an n-gram matches, the model draft otherwise. The model's cache catches up on the slots it
    missed in its next round (its first step reads them all)."""

    def __init__(self, lookup: Lookup, model: ModelDrafter):
        self.lookup, self.model = lookup, model
        self.decoders = model.decoders

    def propose(self, slots, gamma, params, generator, vocab, *, keep_logits=False, stop_below=0.0) -> Proposal:
        found = self.lookup.propose(slots, gamma, params, generator, vocab)
        if found.tokens.shape[1] > 0:
            return found
        return self.model.propose(slots, gamma, params, generator, vocab, keep_logits=keep_logits, stop_below=stop_below)


@dataclass
class WithLookup:
    """--draft lookup+DRAFT as loaded: the lookup, and DRAFT's draft (a task's model, before it is made cheaper)."""

    lookup: Lookup
    model: Any


def parts(draft) -> tuple[Lookup | None, Any]:
    """(the lookup, the model draft) of what drafts.load_draft gave; either may be None."""
    if isinstance(draft, WithLookup):
        return draft.lookup, draft.model
    return (draft, None) if isinstance(draft, Lookup) else (None, draft)


def drafter(lookup: Lookup | None, model) -> Any:
    """What the loop takes as its draft: the lookup, the model (a model or Decoder), or lookup then the model."""
    if lookup is None or model is None:
        return lookup if model is None else model
    return LookupThenModel(lookup, as_drafter(model))

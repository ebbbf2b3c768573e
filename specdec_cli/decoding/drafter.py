"""What proposes a round's tokens: the loop's one view of a draft, so that a draft is swapped without
touching the loop.

    Proposal      the tokens a round proposes, and the distribution each was drawn from (or None: one-hot)
    Drafter       propose(slots, γ, ...) -> Proposal, and the decoders (KV caches) it holds, which the loop
                  prefills, crops and row-selects with the target's
    ModelDrafter  a model through a Decoder: γ steps, each fed back through its cache (the paper's draft)

A draft without a model (drafts/lookup.py: prompt lookup) subclasses Drafter; it holds no decoder and proposes
one-hot tokens, which verification checks through the contract's one-hot path (decoding/verify.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdec_cli.decoding.adapters import Decoder, as_decoder
from specdec_cli.decoding.sampling import SamplingParams, process_logits, sample_logits, uniforms


@dataclass
class Proposal:
    tokens: torch.Tensor  # int64 [B, k], k ≤ γ; k = 0: nothing proposed, the round is a plain step of the target
    probs: torch.Tensor | None  # float32 [B, k, V]: what each token was drawn from; None: one-hot at `tokens`
    #                            (a deterministic draft), or greedy decoding, which never reads them
    logits: torch.Tensor | None = None  # [B, k, V] the draft's logits, for sigmoid verification only
    catch_up: int = 0  # slots the draft's cache read in its first step (1–2 between speculative rounds)


class Drafter:
    """The interface. `propose` appends its k tokens to the slots (the target scores them next) and returns
    them; it may read every slot (slots.tokens [B, S], slots.valid [B, S], slots.length)."""

    decoders: tuple[Decoder, ...] = ()  # caches the loop prefills, crops and row-selects

    def propose(self, slots, gamma: int, params: SamplingParams, generator, vocab: int, *, keep_logits: bool,
                stop_below: float = 0.0) -> Proposal:
        raise NotImplementedError

    def crop(self, length: int) -> None:
        """Forget every slot from `length` on (rejected tokens)."""
        for d in self.decoders:
            d.crop(min(d.length, length))


class ModelDrafter(Drafter):
    """A draft model: γ tokens, one step each, sampled as the target would be (params)."""

    def __init__(self, decoder: Decoder):
        self.decoder = decoder
        self.decoders = (decoder,)

    def propose(self, slots, gamma, params, generator, vocab, *, keep_logits, stop_below=0.0) -> Proposal:
        """Up to γ tokens, each fed back through the cache. The round ends early, after k < γ tokens, once every
        row's draft gave its last token a probability below `stop_below`: a rule that reads only the draft, so
        the output stays exactly the target's. keep_logits: also the logits (raw, or processed when top-k/top-p
        is on), which sigmoid verification reads."""
        decoder = self.decoder
        B = slots.tokens.shape[0]
        catch_up = slots.length - decoder.length
        tokens = torch.empty(B, gamma, dtype=torch.int64, device=slots.tokens.device)  # [B, γ]
        probs = None if params.greedy else torch.empty(B, gamma, vocab, device=slots.tokens.device)  # [B, γ, V]
        raw = [] if keep_logits else None
        for i in range(gamma):
            # first step: every slot the draft cache lacks (the pending token, and any slot it never saw)
            inp, mask, positions = slots.window(decoder.length, slots.length)
            logits = fit_vocab(decoder.forward(inp, mask, positions, keep=1)[:, -1], vocab)  # [B, V]
            u = None if params.greedy else uniforms(B, generator)
            token, p = sample_logits(logits, params, u)
            tokens[:, i] = token
            if probs is not None:
                probs[:, i] = p
            if raw is not None:  # sigmoid reads logits in the same space as the target's (see loop.verify)
                raw.append(process_logits(logits, params) if params.filtered else logits)
            slots.append(token)
            if stop_below > 0 and i < gamma - 1:
                top = (p if p is not None else torch.softmax(logits.float(), dim=-1)).amax(dim=-1)  # [B]
                if bool((top < stop_below).all()):
                    tokens, probs = tokens[:, : i + 1], None if probs is None else probs[:, : i + 1]
                    break
        return Proposal(tokens, probs, torch.stack(raw, dim=1) if raw is not None else None, catch_up)


def as_drafter(draft) -> Drafter | None:
    """A Drafter for a draft model, a Decoder, or a Drafter (passed through)."""
    if draft is None or isinstance(draft, Drafter):
        return draft
    return ModelDrafter(as_decoder(draft))


def fit_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Cut or pad logits [..., V'] to the shared V. Draft: extra tokens are never proposed, missing ones
    get −inf (lossless: the draft distribution is whatever it was drawn from). Target: only padding
    rows of its lm_head are cut (V comes from check_compatible)."""
    width = logits.shape[-1]
    if width == vocab:
        return logits
    if width > vocab:
        return logits[..., :vocab]
    return torch.nn.functional.pad(logits, (0, vocab - width), value=-math.inf)

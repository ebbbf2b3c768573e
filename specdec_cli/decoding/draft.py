"""What a draft is to the loop: one protocol, so that a draft kind is added without touching the loop.

    Draft          the protocol: fit it to a batch (a task does), then each round propose tokens, and own the
                   caches the loop prefills, crops and row-selects with the target's
    Batch          what a task fits a draft to: the prompts, the logits hook, an encoder-decoder's window
    DraftSettings  how a round's tokens are drawn in this run (the target's sampling, what verification reads)
    Proposal       a round's tokens and the distributions (or logits) they were drawn from
    ModelDraft     a draft model through a Decoder: γ steps, each fed back through its cache (the paper's draft)

The draft kinds are in drafts/ (drafts/__init__.py registers them): a causal LM or its own first layers, the
lean Whisper draft, another Whisper model, prompt lookup (deterministic: it proposes one-hot tokens, which
verification checks through the contract's one-hot path), and lookup then a model.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from specdec_cli.decoding.adapters import Decoder, LogitsHook
from specdec_cli.decoding.llama_like import draft_decoder
from specdec_cli.decoding.sampling import SamplingParams, process_logits, sample_logits, uniforms
from specdec_cli.decoding.slots import Slots


@dataclass(frozen=True)
class Batch:
    """The rows a task decodes next, as a draft is fitted to them (Draft.fit)."""

    input_ids: torch.Tensor  # int64 [B, T]: the prompts, left-padded
    logits_hook: LogitsHook | None = None  # the task's rules for every logits row (Whisper: suppression, timestamps)
    window: Any = None  # an encoder-decoder's input: for Whisper a models.whisper_decoding.EncodedWindows


@dataclass(frozen=True)
class DraftSettings:
    """How a draft draws a round's tokens in this run."""

    params: SamplingParams  # the target's sampling: the draft samples as the target would
    generator: torch.Generator  # the run's randomness (unused when greedy)
    vocab: int  # V: the draft's logits are cut or padded to it (fit_vocab)
    keep_logits: bool = False  # verification reads the draft's logits (sigmoid), not its probabilities
    stop_below: float = 0.0  # end the round once every row's draft gave its token less than this


@dataclass
class Proposal:
    tokens: torch.Tensor  # int64 [B, k], k ≤ γ; k = 0: nothing proposed, the round is a plain step of the target
    probs: torch.Tensor | None  # float32 [B, k, V]: what each token was drawn from; None: one-hot at `tokens`
    #                            (a deterministic draft), or greedy decoding, which never reads them
    logits: torch.Tensor | None = None  # [B, k, V]: the draft's logits, when DraftSettings.keep_logits
    catch_up: int = 0  # slots the draft's cache read in its first step (1–2 between speculative rounds)


@runtime_checkable
class Draft(Protocol):
    """A draft: a task fits it to its rows, then the loop asks it for tokens each round.

    fit(batch)     this draft for these rows (summarize: a batch of prompts; transcribe: a window), with
                   fresh caches; a task calls it before generate()
    decoders       the caches it owns: the loop prefills, crops and row-selects them with the target's
    propose(...)   up to γ tokens after the slots' last one; reads the slots, never changes them
    crop(length)   forget every slot from `length` on (rejected tokens)
    vocab          the V both models' logits are cut to (models.check_compatible), None: the target's
    """

    vocab: int | None

    @property
    def decoders(self) -> tuple[Decoder, ...]: ...

    def fit(self, batch: Batch) -> Draft: ...

    def propose(self, slots: Slots, gamma: int, settings: DraftSettings) -> Proposal: ...

    def crop(self, length: int) -> None: ...


class ModelDraft:
    """A draft model: γ tokens, one step each, sampled as the target would be. Its decoder comes from
    decoder_for(batch); a draft kind over another kind of model overrides that one method (drafts/)."""

    def __init__(self, model: Any, decoder: Decoder | None = None, vocab: int | None = None):
        self.model = model  # what decoder_for builds a decoder of (a transformers model, unless a kind says)
        self.decoder = decoder
        self.vocab = vocab

    @property
    def decoders(self) -> tuple[Decoder, ...]:
        return () if self.decoder is None else (self.decoder,)

    def decoder_for(self, batch: Batch) -> Decoder:
        return draft_decoder(self.model)

    def fit(self, batch: Batch) -> ModelDraft:
        fitted = copy.copy(self)
        fitted.decoder = self.decoder_for(batch)
        return fitted

    def crop(self, length: int) -> None:
        for d in self.decoders:
            d.crop(min(d.length, length))

    def propose(self, slots: Slots, gamma: int, settings: DraftSettings) -> Proposal:
        """Up to γ tokens, each fed back through the cache. The round ends early, after k < γ tokens, once every
        row's draft gave its last token a probability below `stop_below`: a rule that reads only the draft, so
        the output stays exactly the target's. keep_logits: also the logits (raw, or processed when top-k/top-p
        is on: the space verification reads the target's in)."""
        decoder = self.decoder
        if decoder is None:
            raise RuntimeError("fit the draft to a batch first (Draft.fit)")
        params, B, device = settings.params, slots.rows, slots.tokens.device
        catch_up = slots.length - decoder.length
        tokens = torch.empty(B, gamma, dtype=torch.int64, device=device)  # [B, γ]
        probs = None if params.greedy else torch.empty(B, gamma, settings.vocab, device=device)  # [B, γ, V]
        raw: list[torch.Tensor] | None = [] if settings.keep_logits else None
        mask, positions = slots.ahead(gamma)  # [B, length+γ] or None, [B, γ]: the slots these tokens take
        for i in range(gamma):
            if i == 0:  # every slot the draft cache lacks: the pending token, and any slot it never saw
                step = slots.window(decoder.length, slots.length)
            else:
                step = (tokens[:, i - 1 : i], None if mask is None else mask[:, : slots.length + i],
                        positions[:, i - 1 : i])
            logits = fit_vocab(decoder.forward(*step, keep=1)[:, -1], settings.vocab)  # [B, V]
            u = None if params.greedy else uniforms(B, settings.generator)
            token, p = sample_logits(logits, params, u)
            tokens[:, i] = token
            if probs is not None and p is not None:
                probs[:, i] = p
            if raw is not None:
                raw.append(process_logits(logits, params) if params.filtered else logits)
            if settings.stop_below > 0 and i < gamma - 1:
                top = (p if p is not None else torch.softmax(logits.float(), dim=-1)).amax(dim=-1)  # [B]
                if bool((top < settings.stop_below).all()):
                    tokens, probs = tokens[:, : i + 1], None if probs is None else probs[:, : i + 1]
                    break
        return Proposal(tokens, probs, torch.stack(raw, dim=1) if raw is not None else None, catch_up)


def as_draft(draft: Any) -> Draft | None:
    """A Draft for a draft model (transformers), a Decoder, or a Draft (passed through)."""
    if draft is None or isinstance(draft, Draft):
        return draft
    if isinstance(draft, Decoder):
        return ModelDraft(draft.model, draft)
    return ModelDraft(draft, draft_decoder(draft))


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

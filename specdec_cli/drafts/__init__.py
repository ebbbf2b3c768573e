"""Drafts: what proposes tokens for the target to verify, and what makes a draft cheap.

    spec.py           the one grammar of --draft: self, self:K, self:0-2,4, lookup, lookup+DRAFT, or another model
    lookup.py         prompt lookup: a draft without a model, verified as one-hot (and lookup+DRAFT)
    causal.py         a causal LM as the draft: another model, with a subset head and int8 weights
    layers.py         self:K for causal LMs: the target's first K layers, weights shared
    lean_whisper.py   self for Whisper: the target's decoder in a lean int4 / int8 decoding step
    whisper_model.py  another Whisper model as the draft
    subset_head.py    an output layer over a subset of the vocabulary
    int8.py           low-bit draft weights on a CPU

Every draft kind follows decoding.draft.Draft and is built by one entry of BUILDERS, keyed by its kind in the
--draft grammar and the target's family. A new kind is one module with a `build` and one line below. None of
these changes the output: verification checks every draft token against the unmodified target. Drafts build on
models and decoding, never on tasks, bench or the CLI.
"""

from __future__ import annotations

from typing import Protocol

from specdec_cli import options
from specdec_cli.decoding import VERIFIERS, Draft, ModelDraft
from specdec_cli.drafts import causal, layers, lean_whisper, lookup, spec, whisper_model
from specdec_cli.errors import SpecdecError
from specdec_cli.models import LoadedModel, load_model, resolve_device
from specdec_cli.models.causal_lm import CAUSAL_LM
from specdec_cli.models.loading import Family
from specdec_cli.models.weights import load_held
from specdec_cli.models.whisper import WHISPER


class Builder(Protocol):
    def __call__(self, draft_spec: str, target: LoadedModel, opts: options.DecodeOptions,
                 progress: bool = True) -> Draft: ...


ANY = None  # a kind that drafts for every family
BUILDERS: dict[tuple[str, Family | None], Builder] = {
    ("lookup", ANY): lookup.build,
    ("self", CAUSAL_LM): layers.build,
    ("self", WHISPER): lean_whisper.build,
    ("model", CAUSAL_LM): causal.build,
    ("model", WHISPER): whisper_model.build,
}


def build(draft_spec: str, target: LoadedModel, family: Family, opts: options.DecodeOptions, *,
          progress: bool = True) -> Draft:
    """The draft `draft_spec` names for `target` (read by `family`), with `opts`' draft options; lookup+DRAFT
    is lookup, then DRAFT's draft."""
    lookup_spec, model_spec = spec.split_lookup(draft_spec)
    drafts = [_build_one(part, target, family, opts, progress) for part in (lookup_spec, model_spec) if part]
    return drafts[0] if len(drafts) == 1 else lookup.LookupThen(*drafts)


def _build_one(part: str, target: LoadedModel, family: Family, opts: options.DecodeOptions, progress: bool) -> Draft:
    kind = spec.kind(part)
    builder = BUILDERS.get((kind, family)) or BUILDERS.get((kind, ANY))
    if builder is None:
        raise SpecdecError(f"--draft {part}: no {kind} draft for {family.kind}")
    return builder(part, target, opts, progress)


def check_mode(opts: options.DecodeOptions) -> None:
    """Refuse, before any model loads, a --draft the mode cannot verify: a deterministic draft (lookup)
    has no probabilities or logits, which a mode without a one-hot path (sigmoid) needs."""
    if not opts.speculative or VERIFIERS[opts.mode].one_hot:
        return
    if spec.split_lookup(opts.draft)[0] is not None:
        raise VERIFIERS[opts.mode].refuse_one_hot()


def load_pair(opts: options.DecodeOptions, family: Family, *, progress: bool = True) -> tuple[LoadedModel, Draft | None]:
    """(target, draft) for `opts` (target, draft, mode, dtype, device and the draft options); the draft is
    None for autoregressive. A causal LM target is held as --target-quant says (models/weights.py) before its
    draft is built: self:K then shares its layers as they are held."""
    check_mode(opts)
    device = resolve_device(opts.device)
    if family is CAUSAL_LM:
        target = load_held(opts.target, getattr(opts, "target_quant", "none"), role="target", dtype=opts.dtype,
                           device=device, progress=progress)
    else:
        target = load_model(opts.target, family, role="target", dtype=opts.dtype, device=device, progress=progress)
    if not opts.speculative:
        return target, None
    return target, build(opts.draft, target, family, opts, progress=progress)


def model_draft(draft: Draft | None) -> ModelDraft | None:
    """The model a draft runs (lookup+DRAFT: DRAFT's), or None for a draft without one."""
    if isinstance(draft, lookup.LookupThen):
        return model_draft(draft.then)
    return draft if isinstance(draft, ModelDraft) else None

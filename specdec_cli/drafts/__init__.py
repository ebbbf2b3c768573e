"""Drafts: what proposes tokens for the target to verify, and what makes a draft cheap.

    spec.py          the one grammar of --draft: self, self:K, self:0-2,4, lookup, lookup+DRAFT, or another model
    lookup.py        prompt lookup: a draft without a model, verified as one-hot
    layers.py        self:K for causal LMs: the target's first K layers, weights shared
    lean_whisper.py  self for Whisper: the target's decoder in a lean int4 decoding step (LeanDraft)
    subset_head.py   an output layer over a subset of the vocabulary
    int8.py, int4.py low-bit draft weights on a CPU

None of these changes the output: verification checks every draft token against the unmodified target.
`load_pair` below gives a task its (target, draft), `load_draft` a draft for a loaded target. Drafts build on models and decoding, never on tasks,
bench or the CLI.
"""

from __future__ import annotations

from typing import Any, Callable

from specdec_cli import options
from specdec_cli.drafts import spec
from specdec_cli.drafts.lookup import Lookup, WithLookup
from specdec_cli.models import LoadedModel, check_compatible, load_model, resolve_device
from specdec_cli.models.loading import Family


def load_draft(draft_spec: str, target: LoadedModel, family: Family, *,
               self_draft: Callable[[LoadedModel, str], Any],
               adopt: Callable[[LoadedModel, LoadedModel, int], Any] | None = None, progress: bool = True) -> Any:
    """The draft `draft_spec` names for `target`. A `self…` draft is self_draft(target, draft_spec). Another model
    is read by the family in the target's dtype and on its device, checked against the target
    (models.check_compatible), then handed to adopt(target, draft, V) when given (a task may wrap it).
    `lookup` is a lookup.Lookup; `lookup+DRAFT` a lookup.WithLookup of it and DRAFT's draft."""
    lookup_spec, model_spec = spec.split_lookup(draft_spec)
    if model_spec is None:
        return Lookup(*spec.lookup_sizes(lookup_spec))
    if spec.is_self(model_spec):
        draft = self_draft(target, model_spec)
    else:
        draft = load_model(model_spec, family, role="draft", dtype=target.dtype, device=str(target.device),
                           progress=progress)
        vocab = check_compatible(target, draft)
        draft = adopt(target, draft, vocab) if adopt is not None else draft
    return draft if lookup_spec is None else WithLookup(Lookup(*spec.lookup_sizes(lookup_spec)), draft)


def load_pair(opts: options.DecodeOptions, family: Family, *, self_draft: Callable[[LoadedModel, str], Any],
              adopt: Callable[[LoadedModel, LoadedModel, int], Any] | None = None,
              progress: bool = True) -> tuple[LoadedModel, Any]:
    """(target, draft) for `opts` (target, draft, mode, dtype, device); the draft is None for autoregressive,
    else load_draft's."""
    device = resolve_device(opts.device)
    target = load_model(opts.target, family, role="target", dtype=opts.dtype, device=device, progress=progress)
    if not opts.speculative:
        return target, None
    return target, load_draft(opts.draft, target, family, self_draft=self_draft, adopt=adopt, progress=progress)

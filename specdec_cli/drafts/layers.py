"""`self:K` for causal LMs: the target's own first K decoder layers as the draft (self-speculative
drafting), sharing every weight with the target; it drafts as any causal draft does (causal.CausalDraft)."""

from __future__ import annotations

import copy

from torch import nn

from specdec_cli import internals
from specdec_cli.drafts import causal, spec
from specdec_cli.errors import SpecdecError
from specdec_cli.models import LoadedModel, check_compatible
from specdec_cli.options import DecodeOptions


def decoder_layers(model) -> nn.ModuleList | None:
    """A causal LM's list of decoder layers (model.model.layers for llama, qwen2, ...), or None."""
    base = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    layers = getattr(base, "layers", None)
    return layers if isinstance(layers, nn.ModuleList) else None


def self_draft(target: LoadedModel, k: int) -> LoadedModel:
    """The `self:K` draft: the target's first K decoder layers, its final norm and its lm_head.

    Shares every parameter with the target (nothing is copied; moving or casting one moves the other).
    Its config is a copy with num_hidden_layers=K (and layer_types cut to K), so a DynamicCache built
    for it has K layers and is independent of the target's cache; the layers keep layer_idx 0..K-1.

    >>> draft = self_draft(target, 4)                                   # doctest: +SKIP
    >>> draft.model.lm_head.weight.data_ptr() == target.model.lm_head.weight.data_ptr()
    True
    """
    model = target.model
    layers = decoder_layers(model)
    if layers is None:
        raise SpecdecError(f"self:K drafting needs a decoder with a `layers` list; {type(model).__name__} has none")
    n = len(layers)
    if not 1 <= k <= n - 1:
        raise SpecdecError(f"self:{k}: K must be between 1 and {n - 1} (the target has {n} decoder layers)")
    base = getattr(model, model.base_model_prefix)

    config = copy.deepcopy(model.config)
    config.num_hidden_layers = k
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = list(config.layer_types[:k])

    draft_base = internals.shallow_copy(base)
    draft_base.layers = nn.ModuleList(list(layers)[:k])
    draft_base.config = config
    draft_model = internals.shallow_copy(model)
    setattr(draft_model, model.base_model_prefix, draft_base)
    draft_model.config = config

    # the KV cache is indexed by layer_idx: the first K layers must be numbered 0..K-1
    for i, layer in enumerate(draft_base.layers):
        idx = getattr(getattr(layer, "self_attn", None), "layer_idx", i)
        if idx != i:
            raise SpecdecError(f"self:{k}: layer {i} of {type(model).__name__} has layer_idx {idx}")

    return LoadedModel(
        draft_model,
        target.tokenizer,
        f"{target.name} (first {k} of {n} layers)",
        "self",
        f"self:{k}",
        target.path,
        target.cached,
        0.0,
    )


def build(draft_spec: str, target: LoadedModel, opts: DecodeOptions, progress: bool = True) -> causal.CausalDraft:
    """The draft `self:K` names (drafts/spec.py; a causal LM runs only its first K layers, K < n)."""
    layers = decoder_layers(target.model)
    if layers is None:
        raise SpecdecError(f"self:K drafting needs a decoder with a `layers` list; {type(target.model).__name__} has none")
    n = len(layers)
    loaded = self_draft(target, len(spec.self_layers(draft_spec, n, max_layers=n - 1, prefix_only=True)))
    return causal.adopt(loaded, target, check_compatible(target, loaded), opts)

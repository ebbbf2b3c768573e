"""`self:K` for causal LMs: the target's own first K decoder layers as the draft (self-speculative
drafting), sharing every weight with the target; it drafts as any causal draft does (causal.CausalDraft)."""

from __future__ import annotations

import copy

from torch import nn

from specdec_cli import internals
from specdec_cli.decoding.adapters import layers_path
from specdec_cli.drafts import causal, spec
from specdec_cli.errors import SpecdecError
from specdec_cli.models import LoadedModel, check_compatible
from specdec_cli.options import DecodeOptions


def decoder_layers(model) -> nn.ModuleList | None:
    """A causal LM's list of decoder layers (layers_path), or None."""
    path = layers_path(model)
    if path is None:
        return None
    for name in path:
        model = getattr(model, name)
    return model


def self_draft(target: LoadedModel, k: int) -> LoadedModel:
    """The `self:K` draft: the target's first K decoder layers, its final norm and its output layer.

    Shares every parameter with the target (nothing is copied; moving or casting one moves the other): the model
    and each module on the way to its layers (layers_path) are shallow copies, the last holding the first K.
    Its config is a copy with num_hidden_layers=K (and layer_types cut to K), so a DynamicCache built for it has
    K layers and is independent of the target's cache; the layers keep layer_idx 0..K-1.

    >>> draft = self_draft(target, 4)                                   # doctest: +SKIP
    >>> draft.model.lm_head.weight.data_ptr() == target.model.lm_head.weight.data_ptr()
    True
    """
    model, path = target.model, layers_path(target.model)
    if path is None:
        raise SpecdecError(f"self:K drafting needs the model's decoder layers as one list; {type(model).__name__} "
                           "keeps them otherwise")
    layers = decoder_layers(model)
    n = len(layers)
    if not 1 <= k <= n - 1:
        raise SpecdecError(f"self:{k}: K must be between 1 and {n - 1} (the target has {n} decoder layers)")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = k
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = list(config.layer_types[:k])

    draft_model = internals.shallow_copy(model)
    parent = draft_model
    for name in path[:-1]:  # a shallow copy of each module on the way, so that the target keeps its own
        child = internals.shallow_copy(getattr(parent, name))
        setattr(parent, name, child)
        parent = child
    setattr(parent, path[-1], nn.ModuleList(list(layers)[:k]))
    for module in (draft_model, getattr(draft_model, path[0])):
        module.config = config

    # the KV cache is indexed by layer_idx: the first K layers must be numbered 0..K-1
    for i, layer in enumerate(list(layers)[:k]):
        idx = next((m.layer_idx for m in layer.modules() if isinstance(getattr(m, "layer_idx", None), int)), i)
        if idx != i:
            raise SpecdecError(f"self:{k}: layer {i} of {type(model).__name__} has layer_idx {idx}")

    return LoadedModel(draft_model, target.tokenizer, f"{target.name} (first {k} of {n} layers)", "self", f"self:{k}",
                       target.path, target.cached, 0.0, weights=target.weights)


def build(draft_spec: str, target: LoadedModel, opts: DecodeOptions, progress: bool = True) -> causal.CausalDraft:
    """The draft `self:K` names (drafts/spec.py; a causal LM runs only its first K layers, K < n)."""
    layers = decoder_layers(target.model)
    if layers is None:
        raise SpecdecError(f"self:K drafting needs the model's decoder layers as one list; {type(target.model).__name__} "
                           "keeps them otherwise")
    n = len(layers)
    loaded = self_draft(target, len(spec.self_layers(draft_spec, n, max_layers=n - 1, prefix_only=True)))
    return causal.adopt(loaded, target, check_compatible(target, loaded), opts, progress)

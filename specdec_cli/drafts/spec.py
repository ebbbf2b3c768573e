"""The one grammar of `--draft`, for every task:

    self            the target's own decoder, every layer (made cheaper another way: a smaller output layer,
                    low-bit weights, a lean decoding step)
    self:K          the target's first K decoder layers
    self:0-2,4      those decoder layers (ranges and single numbers, increasing)
    anything else   another model: a spec for models.load_model, checked against the target
"""

from __future__ import annotations

import re

from specdec_cli.errors import SpecdecError


def is_self(spec: str) -> bool:
    text = (spec or "").strip().lower()
    return text == "self" or text.startswith("self:")


def self_layers(spec: str, num_layers: int, *, max_layers: int | None = None,
                prefix_only: bool = False) -> tuple[int, ...] | None:
    """The decoder layers (of num_layers) a `self…` draft keeps, or None when `spec` names another model.

    max_layers: the most a draft may keep (default all). prefix_only: the model can run only its first K
    layers (a causal LM's KV cache is indexed by layer number), so self:K is the only form.

    >>> self_layers("self:2", 6), self_layers("self", 4), self_layers("self:0-2,5", 6), self_layers("embedded", 6)
    ((0, 1), (0, 1, 2, 3), (0, 1, 2, 5), None)
    """
    if not is_self(spec):
        return None
    most = num_layers if max_layers is None else max_layers
    form = "self:K (the first K layers)" if prefix_only else "self, self:K (first K layers) or self:0-2,4 (layer numbers)"
    value = spec.strip().lower().partition(":")[2].replace(" ", "")
    if not value:
        if most < num_layers:
            raise SpecdecError(f"--draft '{spec}': write {form}, K between 1 and {most}")
        return tuple(range(num_layers))
    if re.fullmatch(r"[+-]?\d+", value):
        k = int(value)
        if not 1 <= k <= most:
            raise SpecdecError(f"--draft self:{k}: K must be between 1 and {most} (the target has {num_layers} decoder layers)")
        return tuple(range(k))
    if prefix_only:
        raise SpecdecError(f"--draft '{spec}': write {form}")
    layers: list[int] = []
    for part in value.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise SpecdecError(f"--draft '{spec}': write {form}")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        layers.extend(range(lo, hi + 1))
    if sorted(set(layers)) != layers or layers[-1] >= num_layers or len(layers) > most:
        raise SpecdecError(f"--draft '{spec}': layers must increase and lie in 0..{num_layers - 1}")
    return tuple(layers)

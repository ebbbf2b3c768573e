"""The one grammar of `--draft`, for every task:

    self            the target's own decoder, every layer (made cheaper another way: a smaller output layer,
                    low-bit weights, a lean decoding step)
    self:K          the target's first K decoder layers
    self:0-2,4      those decoder layers (ranges and single numbers, increasing)
    lookup          prompt lookup, no model (drafts/lookup.py): the longest tail seen before, up to 16 tokens
    lookup:N        tails of N tokens at most; lookup:N-M: of N down to M
    lookup+DRAFT    lookup where an n-gram matches, the draft DRAFT (any of the above) elsewhere
    anything else   another model: a spec for models.load_model, checked against the target
"""

from __future__ import annotations

import re

from specdec_cli.errors import SpecdecError

LOOKUP_LONGEST, LOOKUP_SHORTEST = 16, 1  # the tail lengths lookup matches (drafts/lookup.py)


def split_lookup(spec: str) -> tuple[str | None, str | None]:
    """(the lookup part, the model part) of a --draft spec; either may be None.

    >>> split_lookup("lookup"), split_lookup("lookup:2+self:4"), split_lookup("embedded")
    (('lookup', None), ('lookup:2', 'self:4'), (None, 'embedded'))
    """
    parts = [p.strip() for p in (spec or "").split("+")]
    found = [p for p in parts if p.lower().partition(":")[0] == "lookup"]
    models = [p for p in parts if p not in found]
    if len(found) > 1 or len(models) > 1 or (len(parts) > 1 and not found):
        raise SpecdecError(f"--draft '{spec}': write one draft, lookup, or lookup+DRAFT")
    return (found[0] if found else None), (models[0] if models else None)


def lookup_sizes(spec: str) -> tuple[int, int]:
    """(longest, shortest) n-gram of a lookup spec: lookup, lookup:N or lookup:N-M.

    >>> lookup_sizes("lookup"), lookup_sizes("lookup:4"), lookup_sizes("lookup:4-2")
    ((16, 1), (4, 1), (4, 2))
    """
    value = spec.strip().lower().partition(":")[2].replace(" ", "")
    if not value:
        return LOOKUP_LONGEST, LOOKUP_SHORTEST
    m = re.fullmatch(r"(\d+)(?:-(\d+))?", value)
    longest, shortest = (int(m.group(1)), int(m.group(2) or 1)) if m else (0, 0)
    if not 1 <= shortest <= longest <= 16:
        raise SpecdecError(f"--draft '{spec}': write lookup, lookup:N or lookup:N-M (n-gram sizes, 16 >= N >= M >= 1)")
    return longest, shortest


def kind(spec: str) -> str:
    """The kind of one draft (no `+`): "lookup", "self" or "model" (drafts.BUILDERS has a builder for each).

    >>> kind("lookup:4"), kind("self:2"), kind("./my-draft")
    ('lookup', 'self', 'model')
    """
    head = (spec or "").strip().lower().partition(":")[0]
    return head if head in ("lookup", "self") else "model"


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

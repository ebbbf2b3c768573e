"""Whether a draft can draft for a target: the one rule, for every kind of model."""

from __future__ import annotations

from specdec_cli.errors import SpecdecError
from specdec_cli.models.loading import Family, LoadedModel, load_model


def vocab_difference(target_vocab: dict[str, int], draft_vocab: dict[str, int]) -> str | None:
    """None when both map the same tokens to the same ids, else a short description of the first difference."""
    if target_vocab == draft_vocab:
        return None
    if len(target_vocab) != len(draft_vocab):
        return f"the target's tokenizer has {len(target_vocab)} tokens, the draft's {len(draft_vocab)}"
    for token, index in sorted(target_vocab.items(), key=lambda item: item[1]):
        other = draft_vocab.get(token)
        if other != index:
            where = "is missing from the draft's" if other is None else f"is id {other} in the draft's"
            return f"token {token!r} (id {index} in the target's tokenizer) {where}"
    return "the tokenizers differ"


def check_compatible(target: LoadedModel, draft: LoadedModel) -> int:
    """Refuse a pair whose token ids do not mean the same thing; return the vocabulary size V to use.

    Rules:
    - the tokenizers' vocabularies (token → id, added tokens included) must be identical;
    - lm_head row counts may differ (Qwen pads rows past the tokenizer: 151 936 for both 0.5B and 1.5B,
      152 064 for 7B): the pair is accepted when both cover every token id, and V = the smaller row count.
      The decoding loop must then use logits[..., :V] of both models (rows ≥ V are padding that no token
      id maps to). A model with fewer rows than token ids is refused.

    >>> check_compatible(target, draft)                                 # doctest: +SKIP
    151936
    """
    if draft.tokenizer is not target.tokenizer:
        difference = vocab_difference(target.tokenizer.get_vocab(), draft.tokenizer.get_vocab())
        if difference is not None:
            raise SpecdecError(
                f"draft '{draft.name}' cannot draft for target '{target.name}': vocabularies differ ({difference})"
            )
    ids = max(target.tokenizer.get_vocab().values()) + 1
    for lm in (target, draft):
        if lm.output_size < ids:
            raise SpecdecError(
                f"model '{lm.name}' has {lm.output_size} output rows but its tokenizer has token ids up to {ids - 1}"
            )
    return min(target.output_size, draft.output_size)




def load_compatible(spec: str, target: LoadedModel, family: Family, *, progress: bool = True) -> tuple[LoadedModel, int]:
    """A second model for `target` (a draft): read by `family` in the target's dtype and on its device, checked
    against it. -> (the model, the V both models' logits are cut to)."""
    draft = load_model(spec, family, role="draft", dtype=target.dtype, device=str(target.device), progress=progress)
    return draft, check_compatible(target, draft)

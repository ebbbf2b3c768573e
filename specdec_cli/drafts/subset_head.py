"""A cheaper draft: an output layer restricted to a subset of the vocabulary.

The draft's output layer is a large share of its cost (Qwen2.5-0.5B: 151 936 × 896 of its ~360 M
multiply-adds per token; Whisper base: 51 865 × 512, about as much as its six decoder layers). A draft
whose logits cover only the tokens it is likely to propose, and are −inf elsewhere, is still a valid
draft: verification only needs q to be the distribution the draft token was drawn from, and the rule
then repairs whatever q misses (the residual max(0, p − q) puts the target's mass back on those
tokens). The output stays exactly the target's; only the acceptance rate can drop.

Which tokens: byte-level BPE vocabularies are ordered by merge rank, so the lowest ids are the most
frequent pieces; add every token of the prompt (summaries copy names and numbers from the article)
and the special tokens the decoder must be able to emit (EOS).
"""

from __future__ import annotations

import torch
from torch import nn


class SubsetHead(nn.Module):
    """An output layer that scores only `keep` (int64 [N]) and gives −inf to every other token.

    h [..., d] → logits [..., V], V = the full head's size, so everything downstream is unchanged.
    `weight` / `bias` stay the full head's (shared, not copied), so the model's vocabulary size still
    reads right; the rows it scores are copied once into `proj`, an nn.Linear d → N (which int8.py
    can quantize like any other layer). A head on GGUF blocks (`source`: a layer with `rows(ids)`, its weight a
    meta tensor) gives `proj` as its own rows' blocks instead, and is kept to restrict again.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, keep: torch.Tensor,
                 source: nn.Module | None = None):
        super().__init__()
        self.weight, self.bias = weight, bias  # [V, d], [V]: the full head's
        device = torch.device("cpu") if weight.is_meta else weight.device
        self.register_buffer("keep", torch.unique(keep.to(torch.int64)).to(device), persistent=False)  # [N]
        object.__setattr__(self, "source", source)  # not a submodule: int8.py must not quantize the full head
        if source is not None:
            self.proj = source.rows(self.keep)  # type: ignore[operator]
            return
        self.proj = nn.utils.skip_init(nn.Linear, weight.shape[1], len(self.keep), bias=bias is not None,
                                       device=weight.device, dtype=weight.dtype)
        self.proj.requires_grad_(False)
        self.proj.weight.copy_(weight.detach()[self.keep])  # [N, d]
        if bias is not None:
            self.proj.bias.copy_(bias.detach()[self.keep])  # [N]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        z = self.proj(h)  # [..., N]
        out = z.new_full((*z.shape[:-1], self.weight.shape[0]), float("-inf"))  # [..., V]
        return out.index_copy_(-1, self.keep, z)


def frequent_ids(n: int, vocab_size: int) -> torch.Tensor:
    """The n lowest token ids (for byte-level BPE: the most frequent merges), int64 [min(n, V)]."""
    return torch.arange(min(n, vocab_size), dtype=torch.int64)


def restrict_head(model, keep: torch.Tensor):
    """Give `model` (a draft: its own module, e.g. a self:K shallow copy) a SubsetHead over `keep`,
    replacing any earlier one. Returns the model. The full head's weights are never modified. A head on GGUF blocks
    (models/gguf_linear.GgufLinear: `rows`) scores its kept rows' own blocks."""
    head = model.get_output_embeddings()
    source = getattr(head, "source", None)  # a SubsetHead on blocks: restrict its full head again
    source = head if source is None else source
    if hasattr(source, "rows"):
        model.set_output_embeddings(SubsetHead(source.weight, None, keep, source=source))
    else:
        model.set_output_embeddings(SubsetHead(head.weight, getattr(head, "bias", None), keep))
    return model

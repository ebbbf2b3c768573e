"""A cheaper draft on a CPU: weight-only int8 for the draft's linear layers.

At batch 1 a decoding step multiplies one activation row by every weight matrix, so its time is the
time to read the weights. Int8 weights (one scale per output row, symmetric, rounded to nearest) are
half the bytes of bf16, and torch's int8 GEMV (internals.int8_weight_mm) also reads them faster than its
bf16 GEMV reads bf16: on this project's 2-core Xeon the Qwen2.5-0.5B draft's step drops from about
100 ms to about 55 ms, while the 1.5B target's step stays at about 290 ms (benchmarks/README.md).

Only the draft is quantized. Verification checks every draft token against the unmodified target, so
the output is still exactly the target's; only the acceptance rate can move.

Many rows at once (a prompt's prefill) go through the original weight, which is kept (shared, not
copied): the int8 kernel is a GEMV kernel and slow on a few hundred rows.
"""

from __future__ import annotations

import torch
from torch import nn

from specdec_cli import internals
from specdec_cli.models.weights import replace_linears

GEMV_ROWS = 16  # up to this many rows (batch × new tokens) use the int8 weight


class Int8Linear(nn.Module):
    """y = x Wᵀ + b with W ≈ scale[:, None] · qweight.  x [..., in] -> y [..., out]."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias  # [out, in], [out]: the original's, shared
        w = linear.weight.detach().float()  # [out, in]
        scale = w.abs().amax(dim=1).clamp_(min=1e-12) / 127.0  # [out]
        self.register_buffer("qweight", (w / scale[:, None]).round_().clamp_(-127, 127).to(torch.int8), persistent=False)
        self.register_buffer("scale", scale.to(linear.weight.dtype), persistent=False)  # [out], x's dtype
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows > GEMV_ROWS or x.device.type != "cpu" or x.dtype != self.scale.dtype:
            return nn.functional.linear(x, self.weight, self.bias)
        y = internals.int8_weight_mm(x.reshape(rows, self.in_features), self.qweight, self.scale)  # [rows, out]
        y = y.view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


def quantize_linears(module: nn.Module, skip: nn.Module | None = None) -> nn.Module:
    """Replace every nn.Linear inside `module` (except `skip`) by an Int8Linear, in place. Idempotent.
    Call it only on modules the draft owns: a self:K draft's layers are the target's own."""
    replace_linears(module, Int8Linear, lambda linear: linear is not skip)
    return module


def quantize_draft(draft) -> None:
    """Int8 for a draft (models.LoadedModel) on a CPU: its decoder layers when it owns them (not a
    self:K draft), and its output layer (after subset_head.restrict_head: the subset's projection)."""
    model = draft.model
    if draft.device.type != "cpu":
        return
    head = model.get_output_embeddings()
    if draft.source != "self":
        quantize_linears(model, skip=head)
    if type(head) is nn.Linear:  # the full head (a self:K draft shares it: set it on the draft only)
        model.set_output_embeddings(Int8Linear(head))
    else:  # a SubsetHead, or an Int8Linear already
        quantize_linears(head)

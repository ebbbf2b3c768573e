"""A cheaper draft on a CPU: weight-only int4 for a hand-written decoding step (drafts/lean_whisper.py).

At batch 1 a decoding step's time is the time to read the weights; torch's CPU int4 GEMV reads a quarter of
bf16's bytes (internals.int4_weight_mm). Only the draft runs on int4 weights: verification checks every
draft token against the unmodified target, so the output stays exactly the target's.
"""

from __future__ import annotations

import torch
from torch import nn

from specdec_cli import internals

INT4_GROUP = 32  # input channels that share one int4 scale and zero point


def pack_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """weight [out, in] for torch's CPU int4 GEMV: (packed [out, in/2] uint8, scales and zero points
    [in/32, out, 2]), w ≈ (q − 8)·scale + zero, q in 0..15 rounded to nearest between each group of 32 inputs'
    min and max. None where the kernel is missing or the shape does not fit it (in % 32, out % 16)."""
    rows, cols = weight.shape
    if cols % INT4_GROUP or rows % 16 or not internals.has_int4_kernels():
        return None
    w = weight.detach().float().reshape(rows, cols // INT4_GROUP, INT4_GROUP)  # [out, groups, 32]
    lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)  # [out, groups, 1]
    scale = (hi - lo).clamp(min=1e-6) / 15
    q = ((w - lo) / scale).round_().clamp_(0, 15).to(torch.int32).reshape(rows, cols)  # [out, in]
    scales_zeros = torch.cat([scale, lo + 8 * scale], -1).transpose(0, 1).contiguous().to(weight.dtype)  # [groups, out, 2]
    return internals.int4_pack(q), scales_zeros


def linear(x: torch.Tensor, lin: tuple) -> torch.Tensor:
    """x [..., in] → [..., out] through lin = (weight [out, in] or None, pack_int4's pair or None, bias [out] or None)."""
    weight, packed, bias = lin
    if packed is None:
        return nn.functional.linear(x, weight, bias)
    y = internals.int4_weight_mm(x.reshape(-1, x.shape[-1]), packed[0], INT4_GROUP, packed[1])
    y = y.view(*x.shape[:-1], y.shape[-1])
    return y if bias is None else y + bias

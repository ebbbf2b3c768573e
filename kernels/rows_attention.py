"""Attention of a pass's few query rows over a KV cache, each row computed alone, on a CPU (rows_attention.cpp; its
top states the arithmetic): a pass's row gets the bits of a one-token step at its position, and slots its mask hides
(a batch's padding, the holes of rejected draft tokens) change none of them, as decoding/exact_rows needs, in one
call for every row and head instead of a torch call per row.

    attend     q [B, H, T, D], k, v [B, KVH, S, D] (any strides but the last; fp32 or bf16, k and v also int8:
               a draft's, with its per-channel scales qscale, oscale [B, H, 1, D] / [B, 1, H, D]: q · qscale in,
               out · oscale out, torch's bits), mask [B, 1|H, 1|T, S] bool or float, or None
               -> [B, T, H, D] in q's dtype; None where the kernel did not build
    reference  the same in fp64 torch ops, not rounded to q's dtype (tests)
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdec_cli.kernels import cpp

SOURCE = Path(__file__).with_name("rows_attention.cpp")
# -march=native: the loops are written plainly and vectorized by the compiler for this CPU (the key holds its flags)
KERNEL = cpp.Extension("rows_attention", SOURCE, ["-O3", "-march=native", "-ffp-contract=off", "-std=c++17"],
                       "attention runs through torch, one call per row")


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
           causal: bool = True, qscale: torch.Tensor | None = None,
           oscale: torch.Tensor | None = None) -> torch.Tensor | None:
    ext = KERNEL.module()
    return None if ext is None else ext.attend(q, k, v, mask, scale, causal, qscale, oscale)


def reference(q, k, v, mask, scale: float, causal: bool = True) -> torch.Tensor:
    """attend's result in fp64: row r sees keys j < S − (T − 1 − r) (causal) where the mask shows them."""
    B, H, T = q.shape[:3]
    S = k.shape[2]
    rep = H // k.shape[1]
    k, v = (t.double().repeat_interleave(rep, 1) for t in (k, v))
    s = q.double() @ k.transpose(-1, -2) * scale  # [B, H, T, S]
    shown = torch.ones(B, H, T, S, dtype=torch.bool)
    if causal:
        shown &= torch.arange(S) < (S - (T - 1) + torch.arange(T))[:, None]
    if mask is not None:
        if mask.dtype == torch.bool:
            shown &= mask.expand(B, H, T, S)
        else:
            s = s + mask.double()
            shown &= mask.expand(B, H, T, S) != float("-inf")
    s = s.masked_fill(~shown, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)  # a row that sees nothing: 0
    return (p @ v).transpose(1, 2)

"""The torch pieces every torch twin of a verification kernel shares (exact.py, sigmoid.py), and sampling too:
how many leading draft tokens were accepted, the inverse-CDF draw over unnormalised weights (two levels, as
the Triton kernel draws), and the out_tokens layout of the contract.
"""

from __future__ import annotations

import torch

from specdec_cli.errors import NonFiniteLogitsError

from .contract import PAD


def first_rejection(accepted: torch.Tensor) -> torch.Tensor:
    """accepted [B, γ] bool -> n [B]: the number of leading accepted positions."""
    return accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)


DRAW_BLOCK = 1024


def draw_from_weights(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """weights [B, V] >= 0 (unnormalised), u [B] in (0, 1] -> [B]: the first token whose running sum
    reaches u · Σ weights. Zero-weight tokens are never drawn (the running sum does not move there).
    Two levels, as in the kernel: the block where the running sum crosses, then the token inside it."""
    B, V = weights.shape
    full = V - V % DRAW_BLOCK
    block_sums = weights[:, :full].view(B, -1, DRAW_BLOCK).sum(dim=-1, dtype=torch.float64)  # [B, V // BLOCK]
    if full < V:  # the last, partial block
        tail = weights[:, full:].sum(dim=-1, keepdim=True, dtype=torch.float64)  # [B, 1]
        block_sums = torch.cat([block_sums, tail], dim=1)  # [B, nb]
    running = block_sums.cumsum(dim=-1)  # [B, nb]
    total = running[:, -1]  # [B]
    if not bool(((total > 0) & torch.isfinite(total)).all()):  # NaN, inf, negative or no weight: nothing to draw
        raise NonFiniteLogitsError("the distribution to draw from has NaN or infinite weights, or none above zero")
    threshold = u.double()[:, None] * running[:, -1:]  # [B, 1]
    blocks = torch.searchsorted(running, threshold, side="left")[:, 0].tolist()  # [B] where it crosses
    tokens = []
    for b, k in enumerate(blocks):
        w = weights[b, k * DRAW_BLOCK : (k + 1) * DRAW_BLOCK]  # [≤ BLOCK]
        inside = w.double().cumsum(dim=0).add_(float(running[b, k] - block_sums[b, k]))  # [≤ BLOCK]
        j = min(int(torch.searchsorted(inside, threshold[b])), len(w) - 1)
        if not w[j] > 0:  # rounding left j on a zero weight: the last positive one before it, else the first
            positive = (w > 0).nonzero()[:, 0]
            before = positive[positive <= j]
            j = int(before[-1] if len(before) else positive[0])
        tokens.append(k * DRAW_BLOCK + j)
    return torch.tensor(tokens, dtype=torch.int64, device=weights.device)


def assemble(draft_tokens: torch.Tensor, n: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """out_tokens [B, γ+1]: the n accepted draft tokens, then `token`, then PAD."""
    B, gamma = draft_tokens.shape
    out = torch.full((B, gamma + 1), PAD, dtype=torch.int64, device=draft_tokens.device)
    cols = torch.arange(gamma, device=draft_tokens.device)[None, :]  # [1, γ]
    out[:, :gamma] = torch.where(cols < n[:, None], draft_tokens, PAD)
    out.scatter_(1, n[:, None], token[:, None])
    return out

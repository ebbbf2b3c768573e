"""Synthetic verification inputs that look like a real draft/target pair.

Target logits: LM-like. Each row (one batch element, one position) has a Zipf profile over a random
assignment of the vocabulary to ranks: token x gets logit −s·log(V·u_x) with u_x ~ U(0, 1) i.i.d., so
the token with the k-th smallest u sits at rank ≈ k and its logit is ≈ −s·log k. No sort is needed,
the top gaps are random (sometimes one token dominates, sometimes a few share the mass), and the
tail is heavy. The exponent s varies from row to row around `peakedness` (confident and uncertain
positions), and every row gets a random offset, as raw LM logits are not normalised.

Draft logits: the target's plus Gaussian noise σ·ε. σ is found by bisection so that the mean of
Σ_x min(p(x), q(x)) over all draft rows equals `overlap`. That sum is 1 − TV(p, q) and is exactly the
probability that a draft token drawn from q is accepted (Leviathan et al., Theorem 3.5), so `overlap`
is the expected acceptance rate per tested position; individual rows vary around it.

Draft tokens are drawn from the draft probabilities, so acceptance statistics measured on a case
are those of a real draft model with that overlap.
"""

from __future__ import annotations

import math

import torch

ZIPF_MIN_RANK = 0.05  # V·u is clamped here: bounds how far the top token can stand out (s·log 20)
# make_case holds about seven fp32 copies of the B·(γ+1)·V grid at its peak (uniforms, noise, logits, the draft
# rows and their softmax while σ is calibrated), and a verification step of baseline two more: 48 bytes each
BYTES_PER_ELEMENT = 48


def case_bytes(batch: int, gamma: int, vocab: int) -> int:
    """The memory a case of this size and one verification step on it take, about."""
    return batch * (gamma + 1) * vocab * BYTES_PER_ELEMENT


def tv_distance(p: torch.Tensor, q: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Total-variation distance ½ Σ |p − q| along `dim` (float32 or wider); shape p.shape minus dim."""
    dt = torch.promote_types(torch.promote_types(p.dtype, q.dtype), torch.float32)
    return 0.5 * (p.to(dt) - q.to(dt)).abs().sum(dim)


def acceptance_probability(p: torch.Tensor, q: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Σ min(p, q) along `dim` = 1 − TV(p, q): the acceptance probability of a draft drawn from q."""
    dt = torch.promote_types(torch.promote_types(p.dtype, q.dtype), torch.float32)
    return torch.minimum(p.to(dt), q.to(dt)).sum(dim)


def _draft_logits(target_draft_rows: torch.Tensor, eps: torch.Tensor, sigma: float, dtype) -> torch.Tensor:
    # [B, γ, V] in `dtype`: noise added in fp32, then rounded like a real model's output
    return (target_draft_rows + sigma * eps).to(dtype)


def _mean_overlap(p: torch.Tensor, target_draft_rows, eps, sigma, dtype) -> float:
    q = torch.softmax(_draft_logits(target_draft_rows, eps, sigma, dtype).float(), dim=-1)
    return float(acceptance_probability(p, q).mean())


def _check_case(batch: int, gamma: int, vocab: int, overlap: float, peakedness: float, dtype: torch.dtype) -> None:
    if batch < 1 or gamma < 1 or vocab < 2:
        raise ValueError(f"need batch >= 1, gamma >= 1, vocab >= 2; got {batch}, {gamma}, {vocab}")
    if not 0.0 < overlap <= 1.0:
        raise ValueError(f"overlap must be in (0, 1], got {overlap}")
    if peakedness <= 0:
        raise ValueError(f"peakedness must be > 0, got {peakedness}")
    if dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        raise ValueError(f"unsupported logits dtype {dtype}")


def _calibrate(p: torch.Tensor, t_rows: torch.Tensor, eps: torch.Tensor, overlap: float, tol: float,
               dtype: torch.dtype) -> float:
    """σ such that the draft t_rows + σ·ε has mean Σ min(p, q) = overlap (within tol), by bisection."""
    sigma = 0.0
    if overlap < 1.0:
        lo, hi = 0.0, 1.0
        while _mean_overlap(p, t_rows, eps, hi, dtype) > overlap and hi < 256.0:
            lo, hi = hi, 2.0 * hi
        for _ in range(60):
            sigma = 0.5 * (lo + hi)
            got = _mean_overlap(p, t_rows, eps, sigma, dtype)
            if abs(got - overlap) <= tol:
                break
            if got > overlap:
                lo = sigma
            else:
                hi = sigma
    return sigma


def make_case(
    batch: int,
    gamma: int,
    vocab: int,
    *,
    overlap: float = 0.8,
    peakedness: float = 2.0,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    tol: float = 2e-3,
) -> dict:
    """One batch of verification inputs.

    Args:
        batch, gamma, vocab: B, γ, V.
        overlap: requested mean Σ min(p, q) over the draft rows, in (0, 1]; 1 makes the draft logits
            equal to the target's. Very low values may be out of reach (the draft
            then becomes noise-dominated); the achieved value is returned under "overlap".
        peakedness: median Zipf exponent s of the target rows. Mean top-token probability for a
            32k vocabulary: s = 1 -> ~0.2 (flat), 1.5 -> ~0.4, 2 -> ~0.6 with ~2 nats of entropy
            (the default, LM-like at temperature 1), 2.5 -> ~0.65 with ~1.3 nats.
        dtype: dtype of the logits (float32, bfloat16, float16); probabilities are always float32.
        device: where the returned tensors live (the random numbers are drawn on the CPU from
            `seed`, so a case is the same on every device up to float rounding).
        tol: tolerance of the overlap calibration.

    Returns a dict:
        draft_tokens  int64   [B, γ]      drawn from draft_probs
        draft_probs   float32 [B, γ, V]   softmax(draft_logits)
        draft_logits  dtype   [B, γ, V]
        target_logits dtype   [B, γ+1, V] (the last row is the bonus position, no draft there)
        uniforms      float32 [B, γ+1]    in (0, 1]
        row_overlap   float32 [B, γ]      Σ min(p, q) per draft row
        overlap       float               mean of row_overlap (the achieved overlap)
        noise_scale   float               σ of the draft noise
    """
    _check_case(batch, gamma, vocab, overlap, peakedness, dtype)
    B, G, V = batch, gamma, vocab
    device = torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(seed)

    # --- random numbers, all drawn up front in a fixed order on the CPU
    s = peakedness * torch.exp(0.35 * torch.randn(B, G + 1, 1, generator=gen))  # [B, γ+1, 1]
    s = s.clamp(0.25 * peakedness, 4.0 * peakedness)
    offset = 6.0 + 2.0 * torch.randn(B, G + 1, 1, generator=gen)  # [B, γ+1, 1]
    u = torch.rand(B, G + 1, V, generator=gen)  # [B, γ+1, V]
    eps = torch.randn(B, G, V, generator=gen)  # [B, γ, V] draft noise
    token_u = 1.0 - torch.rand(B, G, 1, generator=gen)  # [B, γ, 1] in (0, 1], inverse-CDF draws
    uniforms = 1.0 - torch.rand(B, G + 1, generator=gen)  # [B, γ+1] in (0, 1]

    # --- target: Zipf profile over a random rank assignment
    z = -s * torch.log((u * V).clamp_min(ZIPF_MIN_RANK)) + offset  # [B, γ+1, V] fp32
    del u
    target_logits = z.to(device=device, dtype=dtype)
    del z
    t_rows = target_logits[:, :G].float()  # [B, γ, V] the rows that have a draft token
    p = torch.softmax(t_rows, dim=-1)  # [B, γ, V]
    eps = eps.to(device)

    # --- draft: target + σ·ε, σ calibrated so that mean Σ min(p, q) = overlap
    sigma = _calibrate(p, t_rows, eps, overlap, tol, dtype)
    draft_logits = _draft_logits(t_rows, eps, sigma, dtype)  # [B, γ, V]
    del eps
    draft_probs = torch.softmax(draft_logits.float(), dim=-1)  # [B, γ, V] fp32
    row_overlap = acceptance_probability(p, draft_probs)  # [B, γ]
    del p, t_rows

    # --- draft tokens ~ draft_probs, by inverse CDF: first index whose CDF reaches u·total
    cdf = torch.cumsum(draft_probs, dim=-1)  # [B, γ, V]
    draft_tokens = torch.searchsorted(cdf, token_u.to(device) * cdf[..., -1:]).squeeze(-1)
    draft_tokens = draft_tokens.clamp_(max=V - 1).to(torch.int64)  # [B, γ]
    del cdf

    return {
        "draft_tokens": draft_tokens,
        "draft_probs": draft_probs,
        "draft_logits": draft_logits,
        "target_logits": target_logits,
        "uniforms": uniforms.to(device),
        "row_overlap": row_overlap.float(),
        "overlap": float(row_overlap.mean()),
        "noise_scale": float(sigma),
    }


def describe(case: dict) -> dict:
    """A few scalars that say what a case looks like (for logs and benchmark metadata)."""
    p = torch.softmax(case["target_logits"].float(), dim=-1)  # [B, γ+1, V]
    top = p.max(dim=-1).values
    top5 = p.topk(min(5, p.shape[-1]), dim=-1).values.sum(-1)
    B, G1, V = p.shape
    return {
        "batch": B,
        "gamma": G1 - 1,
        "vocab": V,
        "dtype": str(case["target_logits"].dtype).replace("torch.", ""),
        "overlap": case["overlap"],
        "noise_scale": case["noise_scale"],
        "target_top1_mean": float(top.mean()),
        "target_top5_mean": float(top5.mean()),
        "target_entropy_mean": float(-(p * torch.log(p.clamp_min(1e-30))).sum(-1).mean()),
        "log_vocab": math.log(V),
    }

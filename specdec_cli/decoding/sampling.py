"""Sampling: what turns logits into a token, shared by the draft, the target and autoregressive decoding.

    process_logits   z -> z / T, then top-k and top-p masks (−inf), keeping at least one token
    probs_from_logits  softmax in float32
    sample           inverse CDF with caller-supplied uniforms (reproducible, and cheap on CPU:
                     torch.multinomial costs ~3 ms per 152k-token row there)

Temperature 0 means greedy: argmax of the (masked) logits, no randomness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from specdec_cli import options
from specdec_cli.errors import NonFiniteLogitsError
from specdec_cli.kernels.draw import draw_from_weights

_DEFAULTS = options.DecodeOptions()


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = _DEFAULTS.temperature  # 0 = greedy
    top_k: int = _DEFAULTS.top_k  # 0 = off
    top_p: float = _DEFAULTS.top_p  # 1 = off
    seed: int | None = _DEFAULTS.seed  # None: a fresh random seed

    def __post_init__(self):
        options.check_sampling(self.temperature, self.top_k, self.top_p)
        if self.seed is not None:
            options.check_seed(self.seed)

    @classmethod
    def of(cls, opts: options.DecodeOptions) -> SamplingParams:
        return cls(opts.temperature, opts.top_k, opts.top_p, opts.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def filtered(self) -> bool:
        """True when top-k or top-p masks tokens (the distribution is more than softmax(z / T))."""
        return self.top_k > 0 or self.top_p < 1.0

    def generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        g = torch.Generator(device=device)
        if self.seed is None:
            g.seed()
        else:
            g.manual_seed(self.seed)
        return g


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[..., V] logits -> [..., V] float32 logits of the sampling distribution: z / T, then top-k, then
    top-p; masked tokens are −inf and the most likely token always survives. Greedy: z unchanged."""
    z = logits.float()
    if params.greedy:
        return z
    if params.temperature != 1.0:
        z = z / params.temperature
    vocab = z.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(z, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        z = z.masked_fill(z < kth, -math.inf)  # ties at the k-th value are all kept
    if params.top_p < 1.0:
        z = _mask_top_p(z, params.top_p)
    return z


def _mask_top_p(z: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (nucleus).

    The nucleus is usually small: look for it among the top 256, then 4096 tokens (a partial sort,
    ~1 ms on a 152k row on CPU) and sort the whole row only when they do not hold top_p of the mass."""
    probs = torch.softmax(z, dim=-1)
    vocab = z.shape[-1]
    for k in (256, 4096, vocab):
        if k < vocab:
            sorted_p, order = torch.topk(probs, k, dim=-1)  # [..., k] descending
        else:
            sorted_p, order = torch.sort(probs, dim=-1, descending=True)  # [..., V]
        mass = torch.cumsum(sorted_p, dim=-1, dtype=torch.float64)  # [..., k]
        if k < vocab and not bool((mass[..., -1] >= top_p).all()):
            continue  # the nucleus reaches past the top k of some row
        keep_sorted = mass - sorted_p < top_p  # mass of the more likely tokens; the first always kept
        keep = torch.zeros_like(z, dtype=torch.bool).scatter(-1, order, keep_sorted)
        return z.masked_fill(~keep, -math.inf)
    raise AssertionError("unreachable: the whole sorted row holds top_p of the mass")


def probs_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """softmax over the last dim, float32; −inf logits get probability exactly 0."""
    return torch.softmax(logits.float(), dim=-1)


def sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse CDF: probs [B, V] (need not be normalised), u [B] in (0, 1] -> int64 [B]: the first token
    whose running sum reaches u · Σ probs; a zero-probability token is never returned. The same draw
    verification uses for its resampled token (kernels/exact.py)."""
    return draw_from_weights(probs, u)


def uniforms(shape, generator: torch.Generator, device=None) -> torch.Tensor:
    """float32 uniforms in (0, 1] (torch.rand gives [0, 1))."""
    return 1.0 - torch.rand(shape, generator=generator, device=device or generator.device)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """logits [..., V] -> int64 [...]: each row's argmax, the first of equal maxima (torch.argmax's), after checking
    that each row's max is finite (a max shows NaN, +inf and an all-masked row: NonFiniteLogitsError). Widened to
    fp32 first (exact); on a CPU numpy's argmax: torch's took 59 µs for 3 × 51 865 logits and 227 µs for 15 rows,
    numpy's 8 and 36 (AMD EPYC Zen 5, 2 threads; bf16 was 5× slower still: 4 × 151 936 logits 0.98 ms)."""
    z = logits.float()
    if z.device.type != "cpu":
        if not bool(torch.isfinite(z.amax(dim=-1)).all()):
            raise NonFiniteLogitsError("logits contain NaN or +inf, or a row is all -inf")
        return z.argmax(dim=-1)
    a = z.contiguous().numpy().reshape(-1, z.shape[-1])  # [R, V]
    best = a.argmax(-1)  # numpy's argmax gives a row's first NaN where it has one, so its value is the row's max
    if not np.isfinite(a[np.arange(len(best)), best]).all():
        raise NonFiniteLogitsError("logits contain NaN or +inf, or a row is all -inf")
    return torch.from_numpy(best.astype("int64", copy=False)).reshape(z.shape[:-1])


def sample_logits(
    logits: torch.Tensor, params: SamplingParams, u: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [B, V] -> (tokens int64 [B], probs float32 [B, V] they were drawn from, or None if greedy)."""
    if params.greedy:
        return greedy_tokens(logits), None
    assert u is not None, "sampling needs uniforms"
    probs = probs_from_logits(process_logits(logits, params))
    return sample(probs, u), probs

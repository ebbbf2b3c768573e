"""The small operations around a Llama-shaped layer's products on a CPU, fused in C++ (layer_ops.cpp; its top states
the arithmetic), each beside the torch ops it stands for (transformers' own: what runs where the kernel does not).

    LayerOps    for one dtype (bf16 or fp32):
                  add_rms     x + y (in place into x's tensor) and the RMS norm of the sum, per row: each op as
                              torch's, the sum of squares in an order of its own (add_rms_twin: that arithmetic in
                              torch ops, for tests: the same bits)
                  rope_store  the rotary embedding of q and k (torch's bits), k and v written into the KV cache
                  silu_mul    silu(g) · u from a joint gate/up product [g | u] in one pass (its own exp: not torch's
                              bits; every element alike wherever it stands)

decoding/llama_like.py calls them: a Qwen2.5-1.5B step spent ~1.2 ms in 57 RMS norms of 8 torch ops each and ~0.7 ms
in the rotary embedding and cache writes (AMD EPYC Zen 5, 2 threads, bf16); in fp32 on a Zen 3 without AVX-512
(where activations are fp32) the torch ops took ~10 ms a step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from specdec_cli.kernels import cpp

SOURCE = Path(__file__).with_name("layer_ops.cpp")
KERNEL = cpp.Extension("layer_ops", SOURCE, ["-O3", "-march=native", "-ffp-contract=off", "-std=c++17"],
                       "a layer's norms and rotary embedding run as torch ops")


class LayerOps:
    """add_rms and rope_store for activations of one dtype: the fused kernel's where it runs (bf16 or fp32 on a CPU,
    the kernel built), else torch's ops (transformers' own: the norm module itself, its rotary embedding's operations)."""

    def __init__(self, dtype: torch.dtype):
        self.ext: Any = KERNEL.module() if dtype in (torch.bfloat16, torch.float32) else None

    def add_rms(self, x: torch.Tensor, y: torch.Tensor | None, norm: torch.nn.Module):
        """(s, norm(s)) for s = x + y (x itself without y), x, y [..., d] (x contiguous); norm: the model's RMS norm
        module (transformers' Llama/Qwen2/Mistral one: `weight` [d], `variance_epsilon`), which runs itself where the
        kernel does not. The fused kernel writes s into x's tensor (x is not needed as it was)."""
        if self.ext is None:
            s = x if y is None else x + y
            return s, norm(s)
        y = y if y is None or y.is_contiguous() else y.contiguous()
        return x, self.ext.add_rms(x, y, norm.weight, norm.variance_epsilon)

    def silu_mul(self, gu: torch.Tensor) -> torch.Tensor:
        """silu(g) · u for gu = [g | u] [..., 2F] (a joint gate/up product's output; rows evenly spaced) -> [..., F]:
        the kernel's, else torch's (transformers' SiLU MLP)."""
        if self.ext is not None:
            return self.ext.silu_mul(gu)
        g, u = gu.chunk(2, -1)
        return torch.nn.functional.silu(g) * u

    def rope_store(self, q, k, v, cos, sin, keys, values, start: int) -> torch.Tensor:
        """q [B, T, H, D], k, v [B, T, KVH, D], cos, sin [B, T, D] contiguous; keys, values [B, KVH, S, D] contiguous
        caches. Rotated k and v go to slots start .. start + T -> rotated q [B, H, T, D]. transformers' ops:
        x · cos + rotate_half(x) · sin."""
        if self.ext is not None:
            return self.ext.rope_store(q, k, v, cos, sin, keys, values, start)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, T, D]
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, heads, T, D]
        end = start + q.shape[2]
        keys[:, :, start:end] = (k * c) + (rotate_half(k) * s)
        values[:, :, start:end] = v.transpose(1, 2)
        return (q * c) + (rotate_half(q) * s)


def add_rms_twin(x: torch.Tensor, y: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """add_rms's arithmetic (layer_ops.cpp's top) in torch ops, operation for operation: (s, norm(s)), bf16 or fp32."""
    s = x if y is None else x + y
    f = s.float()  # [..., d]
    d = f.shape[-1]
    d16 = d // 16 * 16
    lanes = torch.zeros(*f.shape[:-1], 16)
    for i0 in range(0, d16, 16):
        lanes = lanes + f[..., i0 : i0 + 16] * f[..., i0 : i0 + 16]
    for h in (8, 4, 2, 1):
        lanes = lanes[..., :h] + lanes[..., h : 2 * h]
    r = lanes[..., 0]
    for i in range(d16, d):
        r = r + f[..., i] * f[..., i]
    # r / d, not r / 1/d (what torch does for a scalar d); sqrt correctly rounded (fp64's rounded to fp32: exact), as
    # std::sqrt is and torch's vectorized fp32 sqrt is not on every CPU
    inv = 1 / torch.sqrt((r / torch.full_like(r, d) + eps).double()).float()
    return s, weight * (f * inv[..., None]).to(s.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

"""The small operations around a Llama-shaped layer's products on a CPU, fused in C++ (layer_ops.cpp; its top states
the arithmetic), each beside the torch ops it stands for (transformers' own: what runs where the kernel does not).

    add_rms     x + y (in place into x's tensor) and the RMS norm of the sum, per row: bf16 ops as torch's, the sum of
                squares in an order of its own; add_rms_twin: that arithmetic in torch ops (tests: the same bits)
    rope_store  the rotary embedding of q and k (torch's bits), k and v written into the KV cache's slots

decoding/llama_like.py calls them: a Qwen2.5-1.5B step spent ~1.2 ms in 57 RMS norms of 8 torch ops each and ~0.7 ms
in the rotary embedding and cache writes (AMD EPYC, 2 threads).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from specdec_cli.kernels import cpp

SOURCE = Path(__file__).with_name("layer_ops.cpp")
KERNEL = cpp.Extension("layer_ops", SOURCE, ["-O3", "-march=native", "-ffp-contract=off", "-std=c++17"],
                       "a layer's norms and rotary embedding run as torch ops")


def _fused(*tensors: torch.Tensor) -> Any:
    """The built module where every tensor is a bf16 one on a CPU, else None."""
    if any(t.dtype != torch.bfloat16 or t.device.type != "cpu" for t in tensors):
        return None
    return KERNEL.module()


def rms_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMS norm (Llama's, Qwen2's, Mistral's): x in fp32 over its root mean square, back to x's dtype,
    times the weight."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def add_rms(x: torch.Tensor, y: torch.Tensor | None, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, norm(s)) for s = x + y (x itself without y), x, y [..., d], weight [d]. The fused kernel writes s into x's
    tensor where it runs (x must then be contiguous and not needed as it was)."""
    ext = _fused(x, weight, *(() if y is None else (y,)))
    if ext is None or not x.is_contiguous():
        s = x if y is None else x + y
        return s, rms_torch(s, weight, eps)
    d = x.shape[-1]
    out = ext.add_rms(x.view(-1, d), None if y is None else y.reshape(-1, d).contiguous(), weight, eps)
    return x, out.view(x.shape)


def add_rms_twin(x: torch.Tensor, y: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """add_rms's arithmetic (layer_ops.cpp's top) in torch ops, operation for operation: (s, norm(s)), bf16."""
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
    inv = 1 / torch.sqrt(r / d + eps)
    return s, weight * (f * inv[..., None]).to(torch.bfloat16)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_store(q, k, v, cos, sin, keys, values, start: int) -> torch.Tensor:
    """q [B, T, H, D], k, v [B, T, KVH, D], cos, sin [B, T, D]; keys, values [B, KVH, S, D] caches. Rotated k and v
    go to slots start .. start + T -> rotated q [B, H, T, D]. transformers' ops: x · cos + rotate_half(x) · sin."""
    ext = _fused(q, k, v, cos, sin, keys)
    if ext is not None and keys.is_contiguous() and values.is_contiguous() and q.stride(-1) == k.stride(-1) == 1 \
            and v.stride(-1) == 1:
        return ext.rope_store(q, k, v, cos.contiguous(), sin.contiguous(), keys, values, start)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, T, D]
    q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, heads, T, D]
    end = start + q.shape[2]
    keys[:, :, start:end] = (k * c) + (rotate_half(k) * s)
    values[:, :, start:end] = v.transpose(1, 2)
    return (q * c) + (rotate_half(q) * s)

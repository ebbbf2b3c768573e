"""A Whisper encoder's self-attention on a CPU: every frame attends to every frame, no mask, heads 64 wide
(frames_attention.cpp; its top states the arithmetic: fp32 sums, a two-pass softmax, 4 query rows a tile). torch's
CPU flash attention ran it at ~170 GFLOP/s in bf16 on an AMD EPYC Zen 5 (27 ms a layer of Whisper base, 2 threads),
more than half of the encoder's time (benchmarks/README.md, sixteenth session).

    cpu_takes  whether this CPU has the AVX-512 path (the kernel is built only there)
    runs       whether attend takes this call: such a CPU, the kernel built, q, k, v [B, H, S, 64] alike
    attend     q [B, H, T, 64], k, v [B, H, S, 64] (fp32 or bf16, any strides), scale -> [B, T, H, 64] in q's dtype
    reference  the same in fp64 (tests), and error_bound: how far attend may be from it

The encoder's output is computed once a window and read by every mode (autoregressive, speculative, the draft), so a
faster encoder leaves speculative output equal to autoregressive output; its own rounding differs from torch's (judged
by WER on the recordings: benchmarks/README.md).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from specdec_cli.kernels import cpp

SOURCE = Path(__file__).with_name("frames_attention.cpp")
PATHS = {"portable": 1, "avx512": 3}  # the C++ enum Path
KERNEL = cpp.Extension("frames_attention", SOURCE, ["-O3", "-ffp-contract=off", "-std=c++17"],
                       "the encoder's attention runs through torch")
HEAD = 64  # the head size it takes (every Whisper size's)


@functools.lru_cache(maxsize=1)
def cpu_takes() -> bool:
    """Whether this CPU has what the AVX-512 path needs (its flags, read without building the kernel: elsewhere it is
    neither built nor run, torch's flash attention being the faster there)."""
    return {"avx512f", "avx512dq", "avx2", "fma"} <= set(cpp.cpu_flags().split())


def runs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether attend takes these: on a CPU whose AVX-512 path runs (cpu_takes, and the kernel built), q, k, v alike
    [B, H, S, 64] in fp32 or bf16."""
    if not (q.device.type == "cpu" and q.dim() == 4 and q.shape[-1] == HEAD and q.shape == k.shape == v.shape
            and q.dtype in (torch.float32, torch.bfloat16) and cpu_takes()):
        return False
    ext = KERNEL.module()
    return ext is not None and ext.best_path() == PATHS["avx512"]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, path: str | None = None) -> torch.Tensor:
    """softmax(q · kᵀ · scale) · v: [B, T, H, 64] in q's dtype (runs() must hold, or path="portable")."""
    ext = KERNEL.module()
    assert ext is not None, "frames_attention.attend: the kernel did not build"
    return ext.attend(q, k, v, scale, PATHS.get(path or "", 0))


def reference(q, k, v, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(attend's result in fp64 [B, T, H, D], Σ_j p_j |v_j| / Σ_j p_j: the magnitude its errors scale with)."""
    s = q.double() @ k.double().transpose(-1, -2) * scale
    p = torch.softmax(s, -1)
    return (p @ v.double()).transpose(1, 2), (p @ v.double().abs()).transpose(1, 2)


def error_bound(q, k, v, scale: float) -> torch.Tensor:
    """How far attend's fp32 result (before its rounding to q's dtype) may be from reference, per output: a score's
    D fused multiply-adds err by ≤ D·u·Σ_d|q_d k_d|·scale (u = 2⁻²⁴), so a weight p_j by ≤ twice the largest such
    error (its score's and the max's) plus exp's few ulp; the sum of the S weights and of the S products p_j v_j add
    S·u each, relative: (2·δ + (2S + 16)·u) · Σ p_j|v_j| / Σ p_j, with room."""
    S, D = k.shape[-2], q.shape[-1]
    u = 2.0 ** -24
    delta = (D * u * (q.double().abs() @ k.double().abs().transpose(-1, -2)) * scale).amax(-1)  # [B, H, T]
    _, mag = reference(q, k, v, scale)
    return ((2 * delta.transpose(1, 2)[..., None] + (2 * S + 16) * u) * mag) * 1.5

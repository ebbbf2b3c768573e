"""Attention of many queries at once on a CPU, heads 64 or 128 wide: a Whisper encoder's self-attention (every frame
attends to every frame, no mask) and a prompt's prefill (causal, grouped heads) (frames_attention.cpp; its top states
the arithmetic: fp32 sums, a two-pass softmax, 4 query rows a tile; with AVX-512 BF16 and bf16 inputs, products two
at a time in bf16, P rounded to bf16). torch's CPU flash attention ran the encoder's at ~170 GFLOP/s in bf16 on an
AMD EPYC Zen 5 (27 ms a layer of Whisper base, 2 threads), more than half of the encoder's time, and a 500-token
prompt's at ~10 ms a layer of Qwen2.5 1.5B (benchmarks/README.md, sixteenth and seventeenth sessions); this kernel's
fp32 path 12.5–13 ms, its bf16 one 7.2 (twenty-third session).

    cpu_takes  whether this CPU has a SIMD path (AVX-512, or AVX2 with FMA; the kernel is built only there)
    takes      ... and heads of this width (HEADS)
    runs       whether attend takes this call: such a CPU, the kernel built, q [B, H, T, D], k, v [B, Hkv, S, D]
    attend     q, k, v (fp32 or bf16, any strides), scale, causal -> [B, T, H, D] in q's dtype
    reference  the same in fp64 (tests), and error_bound: how far attend may be from it
    bf16_products  whether a call multiplies in bf16 (AVX-512 BF16, bf16 inputs): error_bound's term for P's rounding

What it computes is read by every mode alike (a window's encoder output; a prompt's prefill, which every mode runs
the same way, steps and passes going by rows_attention), so it leaves speculative output equal to autoregressive
output; its own rounding differs from torch's (judged by WER and ROUGE: benchmarks/README.md).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from specdec_cli.kernels import cpp

SOURCE = Path(__file__).with_name("frames_attention.cpp")
PATHS = {"portable": 1, "avx2": 2, "avx512": 3, "avx512bf16": 4}  # the C++ enum Path; avx512bf16: bf16 inputs only
KERNEL = cpp.Extension("frames_attention", SOURCE, ["-O3", "-ffp-contract=off", "-std=c++17"],
                       "the encoder's attention runs through torch")
HEADS = (64, 128)  # the head sizes it takes (every Whisper size's; Llama, Qwen2.5, Mistral)


@functools.lru_cache(maxsize=1)
def cpu_takes() -> bool:
    """Whether this CPU has what a SIMD path needs, AVX2 with FMA at least (its flags, read without building the
    kernel: elsewhere it is neither built nor run, its portable path being far slower than torch's flash attention).
    Both paths beat torch's on an encoder's and a prompt's shapes (benchmarks/README.md, eighteenth session)."""
    return {"avx2", "fma"} <= set(cpp.cpu_flags().split())


def takes(head_dim: int) -> bool:
    """Whether this CPU's SIMD path would take heads this wide (before a call's shapes, and before a build)."""
    return head_dim in HEADS and cpu_takes()


def runs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> bool:
    """Whether attend takes these: on a CPU whose SIMD path runs (cpu_takes, and the kernel built), q [B, H, T, D],
    k, v [B, Hkv, S, D] (Hkv dividing H, D in HEADS, S ≥ T when causal) in fp32 or bf16."""
    if not (q.device.type == "cpu" and q.dim() == 4 and k.dim() == 4 and k.shape == v.shape and takes(q.shape[-1])
            and q.shape[0] == k.shape[0] and q.shape[-1] == k.shape[-1] and k.shape[1] > 0
            and q.shape[1] % k.shape[1] == 0 and k.shape[2] > 0 and (not causal or k.shape[2] >= q.shape[2])
            and q.dtype in (torch.float32, torch.bfloat16)):
        return False
    ext = KERNEL.module()
    return ext is not None and ext.best_path() > PATHS["portable"]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool = False,
           path: str | None = None) -> torch.Tensor:
    """softmax(q · kᵀ · scale) · v, query t of T seeing keys 0 .. S − T + t when causal: [B, T, H, D] in q's dtype
    (runs() must hold, or path="portable")."""
    ext = KERNEL.module()
    assert ext is not None, "frames_attention.attend: the kernel did not build"
    return ext.attend(q, k, v, scale, causal, PATHS.get(path or "", 0))


def bf16_products(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, path: str | None = None) -> bool:
    """Whether attend(q, k, v, path=path) multiplies in bf16: the kernel's own choice of path for these inputs
    (path_for) is AVX-512 BF16 (the best here unless `path` says another; inputs not all bf16 take the fp32 path)."""
    ext = KERNEL.module()
    bf16 = {q.dtype, k.dtype, v.dtype} == {torch.bfloat16}
    return ext is not None and ext.path_for(PATHS.get(path or "", 0), bf16) == PATHS["avx512bf16"]


def _scores(q, k, scale: float, causal: bool) -> torch.Tensor:
    """fp64 scores [B, H, T, S], k's heads repeated to q's, the keys a causal row does not see at −inf."""
    k = k.double().repeat_interleave(q.shape[1] // k.shape[1], 1)
    s = q.double() @ k.transpose(-1, -2) * scale
    if causal:
        T, S = s.shape[-2:]
        s = s.masked_fill(torch.ones(T, S, dtype=torch.bool).triu(S - T + 1), float("-inf"))
    return s


def reference(q, k, v, scale: float, causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(attend's result in fp64 [B, T, H, D], Σ_j p_j |v_j| / Σ_j p_j: the magnitude its errors scale with)."""
    p = torch.softmax(_scores(q, k, scale, causal), -1)
    v = v.double().repeat_interleave(q.shape[1] // v.shape[1], 1)
    return (p @ v).transpose(1, 2), (p @ v.abs()).transpose(1, 2)


def error_bound(q, k, v, scale: float, causal: bool = False, bf16: bool = False) -> torch.Tensor:
    """How far attend's fp32 result (before its rounding to q's dtype) may be from reference, per output: a score's
    D fused multiply-adds err by ≤ D·u·Σ_d|q_d k_d|·scale (u = 2⁻²⁴; bf16 products are exact, their sums as fma's),
    so a weight p_j by ≤ twice the largest such error (its score's and the max's) plus exp's few ulp; the sum of the
    S weights and of the S products p_j v_j add S·u each, relative: (2·δ + (2S + 16)·u) · Σ p_j|v_j| / Σ p_j, with
    room. bf16 (bf16_products): each p_j rounded to bf16 for P · V moves it by ≤ 2⁻⁸ of itself, the output by ≤ 2⁻⁸
    of the same Σ p_j|v_j| / Σ p_j."""
    S, D = k.shape[-2], q.shape[-1]
    u = 2.0 ** -24
    delta = _scores(q.abs(), k.abs(), D * u * scale, causal).amax(-1)  # [B, H, T]
    _, mag = reference(q, k, v, scale, causal)
    return ((2 * delta.transpose(1, 2)[..., None] + (2 * S + 16) * u + (2.0 ** -8 if bf16 else 0.0)) * mag) * 1.5

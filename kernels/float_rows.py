"""Linear layers on a CPU whose rows compute alone, with fp32 or bf16 weights as the model holds them: float_rows.cpp
(its top states the arithmetic). A row's result does not depend on the other rows of its call, on M, on the thread
count or on the SIMD path (AVX-512, AVX2, portable), so a speculative pass's rows are a one-token step's bits; and the
weights are read once per call, so a batch's step costs about what one row's does (torch's fp32 GEMM read Whisper
base's output layer at ~5 GB/s for 4 rows, ~11 GB/s for one, on an AVX2 Zen 3). Many rows are bound by the fp32
multiply-adds: on an AVX-512 BF16 CPU, torch's bf16 product (two multiply-adds an instruction) is faster at a batch's
pass of ~44 rows, float_rows up to ~12 (benchmarks/README.md, sixteenth session).

    takes      whether it runs for a weight once built: on a CPU, fp32 or bf16, 2-D
    mm         x [..., K] · Wᵀ (+ bias) -> [..., N] in x's dtype
    reference  the same product in fp64 (tests: the kernel's error is bounded by its arithmetic)

Built at first use and cached (kernels/cpp.py: a C++ compiler is needed then). Where it does not build, the callers
keep torch's linear layers (decoding/exact_rows.row_linear).
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdec_cli.kernels import cpp

SOURCE = Path(__file__).with_name("float_rows.cpp")
PATHS = {"portable": 1, "avx2": 2, "avx512": 3}  # the C++ enum Path
KERNEL = cpp.Extension("float_rows", SOURCE, ["-O3", "-ffp-contract=off", "-fno-fast-math", "-std=c++17"],
                       "torch's linear layers run instead")
DTYPES = (torch.float32, torch.bfloat16)  # the weights it reads as they are
LANES = 8  # acc_l: the products of the k with k mod 8 = l, one fused multiply-add each


def extension():
    return KERNEL.module()


def backend_line() -> str:
    """Which path runs, in a few words."""
    ext = extension()
    return f"torch (the C++ kernel did not build: {KERNEL.error})" if ext is None else f"C++ {ext.backend()} path"


def takes(weight: torch.Tensor) -> bool:
    """Whether mm runs for this weight once built (extension() is not None): on a CPU, fp32 or bf16, 2-D; a layer's
    every call then takes the same path, whatever its rows."""
    return weight.device.type == "cpu" and weight.dtype in DTYPES and weight.dim() == 2


def mm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, path: str | None = None) -> torch.Tensor:
    """x [..., K] (fp32 or bf16; others go through fp32) · weight [N, K]ᵀ (+ bias) -> [..., N] in x's dtype, by the
    C++ kernel (takes() must hold, and the kernel be built). path: 'portable', 'avx2' or 'avx512'; default the best this CPU has."""
    if x.dtype not in (torch.float32, torch.bfloat16):
        return mm(x.float(), weight, bias, path).to(x.dtype)
    ext = extension()
    assert ext is not None, "float_rows.mm: the kernel did not build (check extension() first)"
    return ext.mm(x, weight.contiguous(), bias, PATHS.get(path or "", 0))


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x · Wᵀ (+ bias) in fp64: [..., N]."""
    y = x.double() @ weight.double().T
    return y if bias is None else y + bias.double()


def error_bound(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The most mm's fp32 result may differ from reference: each lane a chain of ⌈K / 8⌉ fused multiply-adds, then
    three adds and the bias's, each rounding to within u = 2⁻²⁴ of its exact sum: (⌈K / 8⌉ + 4) · u · (Σ_k |x_k w_k|
    + |bias|) (the standard bound for recursive summation, with room)."""
    K = x.shape[-1]
    u = 2.0 ** -24
    mag = x.double().abs() @ weight.double().abs().T
    if bias is not None:
        mag = mag + bias.double().abs()
    return (-(-K // LANES) + 4) * u * mag * 1.01

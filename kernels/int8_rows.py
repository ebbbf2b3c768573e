"""Weight-only int8 linear layers on a CPU whose rows compute alone (int8_rows.cpp; its top states the arithmetic): W in
int8 with one scale per output row, each row of x quantized to int8 with its own scale, integer products summed
exactly. So a row's result does not depend on the other rows of its call, on M, on the thread count or on the SIMD
path: a speculative pass's rows are a one-token step's bits (torch's dynamic int8 linear shares one activation scale
over a call's rows, so its pass rounded a row otherwise than a step did).

    Packed     a weight [N, K] packed for the kernel: pack(weight), or pack(weight, bits=4) (w in [−7, 7], a draft's:
               half the bytes, the same kernel)
    mm         x [..., K] · Wᵀ (+ bias) -> [..., N] in x's dtype: the C++ kernel, or the twin where it does not build
    twin       the kernel's arithmetic in torch ops: the same values bit for bit, slowly (the fallback, and the tests')
    reference  x · Ŵᵀ in fp64, Ŵ the dequantized weights: what the rounding of x moves the result from (tests)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specdec_cli.kernels import cpp

SOURCE = Path(__file__).with_name("int8_rows.cpp")
PATHS = {"portable": 1, "avx2": 2, "avx512": 3}  # the C++ enum Path
KERNEL = cpp.Extension("int8_rows", SOURCE, ["-O3", "-ffp-contract=off", "-fno-fast-math", "-std=c++17"],
                       "its torch twin runs instead (the same values, much slower)")


@dataclass(frozen=True)
class Packed:
    """An int8 or int4 weight as the kernel reads it."""

    blocks: torch.Tensor  # [N128 / 16, K / 4, 16, 4] int8: 16 rows' 4 consecutive weights side by side (zero rows
    #                       past N); int4: [N128 / 16, K / 8, 16, 4] uint8, two k-steps' w + 8 in the low / high nibbles
    sums: torch.Tensor  # [N128] int32: Σ_k w_nk
    scales: torch.Tensor  # [N] fp32: s_n
    N: int
    K: int

    @property
    def bits(self) -> int:
        return 4 if self.blocks.dtype == torch.uint8 else 8

    def ints(self) -> torch.Tensor:
        """w [N, K] int8."""
        b = self.blocks
        if self.bits == 4:  # [NB, K / 8, 16, 4] -> [NB, K / 8, 2, 16, 4]: the low nibble's k-step, then the high one's
            b = (torch.stack([b & 15, b >> 4], 2).to(torch.int8) - 8).reshape(b.shape[0], -1, 16, 4)
        return b.permute(0, 2, 1, 3).reshape(-1, self.K)[: self.N]

    def dequantized(self) -> torch.Tensor:
        """Ŵ = s_n · w_nk [N, K] in fp64 (exact)."""
        return self.ints().double() * self.scales.double()[:, None]


def quantize(x: torch.Tensor, top: int = 127) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (widened to fp32) -> (q [M, K] int8, s [M] fp32): q = clamp(rint(x · (top / a)), ±top), s = a / top,
    a = max |x| of the row (q = 0 where a = 0). With top = 127, the kernel's operations one for one (its activations)."""
    x = x.float()
    a = x.abs().amax(-1)  # [M]
    c = torch.full_like(a, float(top))  # tensor by tensor: a true division (torch's 127.0 / a is 127 · (1 / a))
    inv = torch.where(a > 0, c / a, torch.zeros_like(a))
    q = (x * inv[:, None]).round().clamp(-top, top)
    return q.to(torch.int8), a / c


# bits -> the largest |w|: int4 keeps ±7 (symmetric, as int8's ±127), the whole row's range (no clipping: the Whisper
# self draft on rows clipped to the least squared error had 0.83 of its tokens accepted against 0.96, the 74 s recording)
TOPS = {8: 127, 4: 7}


def pack(weight: torch.Tensor, bits: int = 8) -> Packed:
    """A float weight [N, K] (K a multiple of 8) in int8 or int4, one scale per row (quantize's rule, top TOPS[bits])."""
    N, K = weight.shape
    if K % 8:
        raise ValueError(f"int8_rows: a row's length must be a multiple of 8 (got {K})")
    q, scales = quantize(weight.detach(), TOPS[bits])
    n128 = -(-N // 128) * 128  # whole groups of 8 blocks: the kernel takes up to 8 at a time
    q = torch.cat([q, q.new_zeros(n128 - N, K)])  # [N128, K]
    blocks = q.view(n128 // 16, 16, K // 4, 4).permute(0, 2, 1, 3)  # [N128 / 16, K / 4, 16, 4]
    if bits == 4:  # k-steps 2i (low nibble) and 2i + 1 (high) in one byte: [N128 / 16, K / 8, 16, 4] uint8
        u = (blocks.to(torch.int16) + 8).to(torch.uint8).view(n128 // 16, K // 8, 2, 16, 4)
        blocks = u[:, :, 0] | (u[:, :, 1] << 4)
    return Packed(blocks.contiguous(), q.sum(1, dtype=torch.int32), scales.contiguous(), N, K)


def extension():
    return KERNEL.module()


def backend_line() -> str:
    """Which path runs, in a few words."""
    ext = extension()
    return f"torch twin (the C++ kernel did not build: {KERNEL.error})" if ext is None else f"C++ {ext.backend()} path"


def mm(x: torch.Tensor, w: Packed, bias: torch.Tensor | None = None, path: str | None = None) -> torch.Tensor:
    """x [..., K] (fp32 or bf16; others go through fp32) · Wᵀ (+ bias, fp32) -> [..., N] in x's dtype. path:
    'portable', 'avx2', 'avx512' or 'torch' (the twin); default the best this CPU has."""
    if x.dtype not in (torch.float32, torch.bfloat16):
        return mm(x.float(), w, bias, path).to(x.dtype)
    ext = None if path == "torch" else extension()
    if ext is not None:
        return ext.mm(x, w.blocks, w.sums, w.scales, bias, PATHS.get(path or "", 0))
    return twin(x.reshape(-1, w.K), w, bias).to(x.dtype).reshape(*x.shape[:-1], w.N)


def twin(x: torch.Tensor, w: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel's arithmetic in torch ops -> [M, N] fp32: the integer sums in fp64 (exact: every partial sum is an
    integer below 2⁵³), then float(dot) · (s_m · s_n) + bias_n in fp32."""
    q, s = quantize(x)
    dot = (q.double() @ w.ints().double().T).float()  # [M, N]
    y = dot * (s[:, None] * w.scales[None, :])
    return y if bias is None else y + bias.float()


def reference(x: torch.Tensor, w: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x · Ŵᵀ (+ bias) in fp64, x not rounded: [M, N]."""
    y = x.double() @ w.dequantized().T
    return y if bias is None else y + bias.double()

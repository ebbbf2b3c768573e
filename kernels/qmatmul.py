"""The CPU matmul for GGUF-quantized weights: y[M, N] = x[M, K] · W[N, K]ᵀ with W left in its GGUF blocks.

    gguf_mm       the C++ kernel (qmatmul.cpp; its top states the arithmetic), built at first use and cached
    dequantize    the file's weights in fp32 (for a prompt's prefill, which runs as a dense product)
    packed_mm     Q4_K / Q5_K / Q6_K and Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 on AVX-512 VNNI or AVX2: steps and
                  passes from weights packed once (pack), the cost nearly flat in the rows of a pass (AVX-512 VNNI;
                  AVX2: about twice a step at 9 rows)
    prompt_mm     a prompt's product of the K-quants (AVX-512 VNNI or AVX2), the 32-element types' (AVX-512 VNNI)
    twin_mm       the same arithmetic in torch ops: the same values bit for bit, slowly (the fallback, and the tests')
    reference_mm  the plain reference: the file's weights dequantized to fp32 (gguf_blocks.dequantize), x · Wᵀ in fp64

The kernel quantizes each row's activations per group, to int8 per 256 elements for the K-quants (as llama.cpp's
Q8_K) and to int16 per 32 for the others, and multiplies integers, so a row's result does not depend on the other rows
of its call, on M, on the thread count or on the SIMD path; it differs from reference_mm by that rounding of x (at
most amax / 254, or amax / 65534, per element, amax being the largest |x| of the element's group) and fp32
accumulation.

Built at first use and cached (kernels/cpp.py: a C++ compiler is needed then). A failed build says so in one line
and the twin runs instead.
SPECDEC_QMATMUL=portable|avx2|avx512 runs as a CPU whose best path that is would (portable: no prompt kernel, no
packed form; avx2: AVX2's packed and prompt kernels); `torch`: the twin, with neither (tests, benchmarks).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from specdec_cli.kernels import cpp
from specdec_cli.kernels import gguf_blocks as gb
from specdec_cli.kernels.gguf_blocks import block_bytes, random_blocks, row_bytes  # noqa: F401 - re-exported

SOURCE = Path(__file__).with_name("qmatmul.cpp")
PATHS = {"portable": 1, "avx2": 2, "avx512": 3}  # the C++ enum Path

KERNEL = cpp.Extension("qmatmul", SOURCE, ["-O3", "-ffp-contract=off", "-fno-fast-math", "-std=c++17"],
                       "its torch twin runs instead (the same values, much slower)")


def extension():
    """The built kernel module, or None when it cannot be built here (said once, on stderr)."""
    return KERNEL.module()


def _forced() -> str:
    return os.environ.get("SPECDEC_QMATMUL", "auto").strip().lower() or "auto"


def _simd(path: str | None) -> int:
    """The C++ path number for the prompt and packed kernels: `path`, else SPECDEC_QMATMUL's where it names one of
    theirs (avx2, avx512), else 0: the best here."""
    path = path or _forced()
    return PATHS[path] if path in ("avx2", "avx512") else 0


def backend_line() -> str:
    """Which path runs, in a few words."""
    forced = _forced()
    if forced == "torch":
        return "torch twin (SPECDEC_QMATMUL=torch)"
    ext = extension()
    if ext is None:
        return f"torch twin (the C++ kernel did not build: {KERNEL.error})"
    best = ext.backend()
    line = f"C++ {forced} path (SPECDEC_QMATMUL; this CPU's best: {best})" if forced in PATHS else f"C++ {best} path"
    packed = ", ".join(t.upper() for t in PACKED_TYPES + PACKED_32_TYPES if packs(t, 16))
    return line + (f", {packed} steps from the packed form" if packed else "")


def gguf_mm(x: torch.Tensor, blocks: torch.Tensor, qtype, N: int, K: int, bias: torch.Tensor | None = None,
            path: str | None = None) -> torch.Tensor:
    """x [..., K] (fp32 or bf16; others go through fp32) · W[N, K]ᵀ (+ bias) -> [..., N] in x's dtype.
    blocks: [N, row_bytes] uint8, the tensor's bytes as in the file. path: 'portable', 'avx2', 'avx512', 'torch'
    (default: SPECDEC_QMATMUL, else the best this CPU has)."""
    path = path or _forced()
    if x.dtype not in (torch.float32, torch.bfloat16):
        return gguf_mm(x.float(), blocks, qtype, N, K, bias, path).to(x.dtype)
    ext = None if path == "torch" else extension()
    if ext is not None:  # a step's call: nothing else in Python (the C++ takes [..., K], returns x's dtype)
        return ext.mm(x, blocks, gb.type_id(qtype), N, K, bias, PATHS.get(path, 0))
    return twin_mm(x.reshape(-1, K), blocks, qtype, N, K, bias).to(x.dtype).reshape(*x.shape[:-1], N)


def dequantize(blocks: torch.Tensor, qtype, N: int, K: int, out: torch.Tensor | None = None,
               path: str | None = None) -> torch.Tensor:
    """The weights as the file means them (gguf_blocks.dequantize's values, in C++ when it is built) into `out`,
    a contiguous [N, K] fp32 or bf16 tensor (bf16: rounded as .to(torch.bfloat16) rounds), else a new fp32 one.
    path: as gguf_mm's (the AVX2 path has no dequantizer of its own: the portable one runs)."""
    out = torch.empty(N, K) if out is None else out
    path = path or _forced()
    ext = None if path == "torch" else extension()
    if ext is None:
        return out.copy_(gb.dequantize(qtype, blocks, N, K))
    ext.dequantize(blocks.reshape(N, -1), gb.type_id(qtype), N, K, out, PATHS.get(path, 0))
    return out


PACKED_TYPES = ("q4_k", "q5_k", "q6_k")  # pack / mm_packed's: Q4_K_M and Q5_K_M files' K-quants
PACKED_32_TYPES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")  # ... and the 32-element types (a tile of their own)


def packs(qtype, N: int) -> bool:
    """Whether a weight of this type and N outputs runs from pack()'s form here: a K-quant or a 32-element type, N a
    multiple of 16, the kernel built, a CPU with AVX-512 VNNI or AVX2 (prompt_runs)."""
    return gb.type_name(qtype) in PACKED_TYPES + PACKED_32_TYPES and N % 16 == 0 and prompt_runs()


def packed_group(qtype) -> int:
    """The elements of one packed group along K: 32 for the 32-element types, 256 for the K-quants."""
    return 32 if gb.type_name(qtype) in PACKED_32_TYPES else 256


def pack(blocks: torch.Tensor, qtype, N: int, K: int) -> torch.Tensor:
    """The file's blocks [N, row_bytes] in packed_mm's form: [N / 16, K / packed_group, bytes] uint8, 16 weight rows
    interleaved 4 quants at a time, about the file's size (qmatmul.cpp). Only where packs() says so."""
    return extension().pack(blocks.reshape(N, -1), gb.type_id(qtype), N, K)


def unpack(packed: torch.Tensor, qtype, N: int, K: int) -> torch.Tensor:
    """The file's blocks [N, row_bytes] uint8 back from pack()'s form, bit for bit (pack keeps every bit)."""
    return extension().unpack(packed, gb.type_id(qtype), N, K)


def packed_mm(x: torch.Tensor, packed: torch.Tensor, qtype, N: int, K: int,
              bias: torch.Tensor | None = None, path: str | None = None) -> torch.Tensor:
    """x [..., K] · Wᵀ (+ bias) -> [..., N] in x's dtype (fp32 and bf16; others through fp32), from pack()'s form:
    steps and passes (any number of rows), each row computed alike whatever the others, and alike on either path
    (qmatmul.cpp; the 32-element types: x quantized to int8 per 32). path: 'avx512', 'avx2' (tests), default the
    best here."""
    if x.dtype not in (torch.float32, torch.bfloat16):
        return packed_mm(x.float(), packed, qtype, N, K, bias, path).to(x.dtype)
    return KERNEL.module().mm_packed(x, packed, qtype if type(qtype) is int else gb.type_id(qtype), N, K, bias,
                                     _simd(path))  # an id as it is: a step calls ~110 layers


PROMPT_TYPES = ("q4_k", "q5_k", "q6_k")  # mm_prompt's: the K-quants (and the 32-element types' packed form on AVX-512)


def prompt_mm(x: torch.Tensor, blocks: torch.Tensor | None, qtype, N: int, K: int,
              bias: torch.Tensor | None = None, packed: torch.Tensor | None = None,
              path: str | None = None) -> torch.Tensor | None:
    """A prompt's product x [..., K] (fp32 or bf16) · Wᵀ (+ bias) -> [..., N] in x's dtype, by qmatmul.cpp's int8
    prompt kernel (mm_prompt: x quantized as gguf_mm quantizes it; a 32-element type's packed form on AVX-512 VNNI:
    packed_mm's bits), or None where that does not run: another type, N not a multiple of 16, neither AVX-512 VNNI
    nor AVX2, no build, or SPECDEC_QMATMUL=portable|torch. packed: pack()'s form of the same weights, read instead of
    the blocks (no interleaving each call; the same values); blocks may then be None. path: 'avx512', 'avx2'
    (tests), default the best here."""
    name = gb.type_name(qtype)
    if N % 16 or x.dtype not in (torch.float32, torch.bfloat16) or not prompt_runs():
        return None
    if name not in PROMPT_TYPES and not (name in PACKED_32_TYPES and packed is not None
                                         and (_simd(path) or extension().best_path()) == PATHS["avx512"]):
        return None
    if blocks is None:
        blocks = torch.empty(0, dtype=torch.uint8)  # not read: the packed form is
    return extension().mm_prompt(x, blocks, gb.type_id(qtype), N, K, bias, packed, _simd(path))


def prompt_runs() -> bool:
    """Whether prompt_mm's kernel (and packed_mm's) runs here: built, on a CPU with AVX2 or AVX-512 VNNI, unless
    SPECDEC_QMATMUL names the portable path or the twin."""
    forced = _forced()
    if forced not in ("auto", "avx2", "avx512"):
        return False
    ext = extension()
    return ext is not None and min(ext.best_path(), PATHS.get(forced, 3)) >= PATHS["avx2"]


# ----------------------------------------------------------------------------------------------------------------
# The twin: qmatmul.cpp's arithmetic in torch ops (see its top), for machines where it does not build, and tests.


def _s16(K: int) -> int:
    return (K // 32 + 15) // 16 * 16


def _pad16(t: torch.Tensor) -> torch.Tensor:
    """[..., K / 32] -> [..., S16], zeros after."""
    return torch.nn.functional.pad(t, (0, _s16(t.shape[-1] * 32) - t.shape[-1]))


def quantize_rows(x: torch.Tensor, G: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] -> xq [M, K] int64 (|xq| ≤ Q: 127 for the K-quants' G = 256, else 32767), dx [M, K / G] fp32,
    xsd [M, S16] fp32 (sums per 32 · dx). xq in the natural order."""
    M, K = x.shape
    Q = 127.0 if G == 256 else 32767.0
    xf = x.float().reshape(M, K // G, G)
    amax = xf.abs().amax(-1)
    inv = torch.where(amax > 0, torch.tensor(Q) / amax, torch.zeros(()))
    dx = amax / torch.tensor(Q)
    xq = torch.round(xf * inv.unsqueeze(-1)).clamp_(-Q, Q).to(torch.int64).reshape(M, K)
    xsd = xq.reshape(M, K // 32, 32).sum(-1).float() * dx.repeat_interleave(G // 32, 1)
    return xq, dx, _pad16(xsd)


def kernel_order(name: str) -> torch.Tensor:
    """[256] the element at each position of a K-quant group as the kernel multiplies it (qmatmul.cpp's top)."""
    slots = list(range(8)) if name == "q6_k" else [0, 2, 1, 3, 4, 6, 5, 7]
    return (torch.tensor(slots).unsqueeze(1) * 32 + torch.arange(32)).flatten()


def _tree(a: torch.Tensor) -> torch.Tensor:
    """Sum the last dim (16 or 8) as the kernel does: halves added, then again, to one."""
    while a.shape[-1] > 1:
        h = a.shape[-1] // 2
        a = a[..., :h] + a[..., h:]
    return a[..., 0]


def twin_mm(x: torch.Tensor, blocks: torch.Tensor, qtype, N: int, K: int, bias: torch.Tensor | None = None,
            chunk: int = 2048) -> torch.Tensor:
    """x [M, K] -> [M, N] fp32, bit for bit what gguf_mm computes."""
    name = gb.type_name(qtype)
    G = 256 if name.endswith("_k") else 32
    xq, dx, xsd = quantize_rows(x, G)
    M, groups = x.shape[0], K // G
    L = 64 if G == 256 else 32  # isum_l: the positions p with (p mod L) / (L / 16) = l, in the kernel order
    order = kernel_order(name) if G == 256 else torch.arange(G)
    xl = xq.double().reshape(M, groups, G)[..., order].reshape(M, groups, G // L, 16, L // 16)
    rb = gb.row_bytes(name, K)
    blocks = blocks.reshape(N, rb)
    out = []
    for n0 in range(0, N, chunk):
        n1 = min(N, n0 + chunk)
        u = gb.unpack(name, blocks[n0:n1], n1 - n0, K)
        wl = u.w.double().reshape(n1 - n0, groups, G)[..., order].reshape(n1 - n0, groups, G // L, 16, L // 16)
        isum = torch.einsum("ngclp,mgclp->mngl", wl, xl)  # exact integers (< 2³¹) in fp64
        acc = torch.zeros(M, n1 - n0, 16)
        for g in range(groups):
            acc = acc + isum[:, :, g, :].float() * (u.d[None, :, g] * dx[:, None, g]).unsqueeze(-1)
        y = _tree(acc)
        mn = torch.zeros(M, n1 - n0, 16)
        mm = None  # the minimums per 32 elements: dmin·m_j (K-quants) or m (Q4_1, Q5_1)
        if u.mins is not None and u.dmin is not None:
            mm = _pad16((u.dmin.unsqueeze(-1) * u.mins.float()).flatten(1))
        elif u.m is not None:
            mm = _pad16(u.m)
        if mm is not None:
            for j in range(0, mm.shape[1], 16):
                mn = mn + mm[None, :, j:j + 16] * xsd[:, None, j:j + 16]
        if u.mins is not None:
            y = y - _tree(mn)
        elif u.m is not None:
            y = y + _tree(mn)
        if bias is not None:
            y = y + bias[n0:n1].float()
        out.append(y)
    return torch.cat(out, 1)


# ----------------------------------------------------------------------------------------------------------------
# The reference


def reference_mm(x: torch.Tensor, blocks: torch.Tensor, qtype, N: int, K: int) -> torch.Tensor:
    """x [M, K] · dequantize(W)ᵀ in fp64 -> [M, N] fp64: the product the file means, for tests."""
    return x.double() @ gb.dequantize(qtype, blocks, N, K).double().T

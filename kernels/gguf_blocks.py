"""GGUF weight blocks, unpacked in torch: what qmatmul.cpp reads, and the plain fp32 dequantisation its tests hold it
to. A weight [N, K] is stored row after row, each row K / B blocks of B elements (B = 256 for the K-quants, 32
otherwise), in little-endian bytes:

    Q8_0  34 B / 32   d fp16, q int8[32]                                value = d·q
    Q4_0  18 B / 32   d, qs[16] (low nibbles: elements 0–15, high: 16–31)  value = d·(q − 8)
    Q4_1  20 B / 32   d, m fp16, qs[16]                                value = d·q + m
    Q5_0  22 B / 32   d, qh u32 (bit i: element i's fifth bit), qs[16]  value = d·(q − 16)
    Q5_1  24 B / 32   d, m, qh, qs                                      value = d·q + m
    Q4_K 144 B / 256  d, dmin fp16, 12 bytes of 8 six-bit scales sc_j and mins m_j, qs[128]: bytes 32c..32c+31
                      hold sub-block 2c (low nibbles) and 2c + 1 (high)  value = d·sc_j·q − dmin·m_j (j = i / 32)
    Q5_K 176 B / 256  d, dmin, scales[12], qh[32] (bit j of byte l: element 32j + l), qs[128]   as Q4_K
    Q6_K 210 B / 256  ql[128], qh[64], sc int8[16], d: element 128h + t (t = 32s + l) takes nibble s >> 1 of
                      ql[64h + 32(s & 1) + l] and bits 2s, 2s + 1 of qh[32h + l]   value = d·sc_{i/16}·(q − 32)

unpack() gives the integers the kernel multiplies (the sub-block scales folded in where they are integers) and the
float scales it applies per group, all exact; dequantize() the fp32 weights the file means.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# GGML type ids (gguf.GGMLQuantizationType), block elements, block bytes, group elements (one float scale each)
TYPES = {"q4_0": (2, 32, 18), "q4_1": (3, 32, 20), "q5_0": (6, 32, 22), "q5_1": (7, 32, 24), "q8_0": (8, 32, 34),
         "q4_k": (12, 256, 144), "q5_k": (13, 256, 176), "q6_k": (14, 256, 210)}
BY_ID = {v[0]: k for k, v in TYPES.items()}


def type_name(qtype: int | str) -> str:
    """'q4_k' for 12 or 'Q4_K' or 'q4_k'; KeyError for a type the kernel does not take."""
    name = BY_ID[int(qtype)] if not isinstance(qtype, str) else qtype.lower()
    if name not in TYPES:
        raise KeyError(qtype)
    return name


def type_id(qtype: int | str) -> int:
    return TYPES[type_name(qtype)][0]


def block_elements(qtype) -> int:
    return TYPES[type_name(qtype)][1]


def row_bytes(qtype, K: int) -> int:
    _, B, nbytes = TYPES[type_name(qtype)]
    if K % B:
        raise ValueError(f"{type_name(qtype)}: K = {K} is not a multiple of {B}")
    return K // B * nbytes


def block_bytes(qtype, N: int, K: int) -> int:
    return N * row_bytes(qtype, K)


@dataclass
class Unpacked:
    """One weight [N, K] as the kernel sees it: value_i = d_g·w_i − dmin_g·mins_{g,j} (K-quants) or + m_g."""

    w: torch.Tensor  # [N, K] int16 (sub-block scales folded in)
    d: torch.Tensor  # [N, K / B] fp32
    dmin: torch.Tensor | None = None  # [N, K / 256] fp32 (K-quants with minimums)
    mins: torch.Tensor | None = None  # [N, K / 256, 8] int32
    m: torch.Tensor | None = None  # [N, K / 32] fp32 (Q4_1, Q5_1)


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[..., 2] uint8 -> [...] fp32 (little-endian fp16)."""
    return b.contiguous().view(torch.float16).squeeze(-1).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[..., 16] bytes -> [..., 32] (low nibbles, then high)."""
    return torch.cat([qs & 15, qs >> 4], -1)


def _bits(u8: torch.Tensor, n: int) -> torch.Tensor:
    """[..., n / 8] bytes -> [..., n] bits, little-endian."""
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((u8.unsqueeze(-1) >> shifts) & 1).flatten(-2)


def kquant_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., 12] bytes -> sc [..., 8], m [..., 8] (six bits each)."""
    s = s.to(torch.int32)
    a, b, c = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([a & 63, (c & 15) | ((a >> 6) << 4)], -1)
    mn = torch.cat([b & 63, (c >> 4) | ((b >> 6) << 4)], -1)
    return sc, mn


def unpack(qtype, blocks: torch.Tensor, N: int, K: int) -> Unpacked:
    """blocks: [N, row_bytes] uint8 (or anything viewable so) -> Unpacked."""
    name = type_name(qtype)
    _, B, nb = TYPES[name]
    b = blocks.reshape(N, K // B, nb).to(torch.uint8)
    if name == "q8_0":
        return Unpacked(b[..., 2:].contiguous().view(torch.int8).to(torch.int16).reshape(N, K), _f16(b[..., 0:2]))
    if name in ("q4_0", "q4_1"):
        one = name == "q4_1"
        q = _nibbles(b[..., 4 if one else 2:]).to(torch.int16) - (0 if one else 8)
        return Unpacked(q.reshape(N, K), _f16(b[..., 0:2]), m=_f16(b[..., 2:4]) if one else None)
    if name in ("q5_0", "q5_1"):
        one = name == "q5_1"
        h = 4 if one else 2
        q = _nibbles(b[..., h + 4:]).to(torch.int16) | (_bits(b[..., h:h + 4], 32).to(torch.int16) << 4)
        q = q - (0 if one else 16)
        return Unpacked(q.reshape(N, K), _f16(b[..., 0:2]), m=_f16(b[..., 2:4]) if one else None)
    if name in ("q4_k", "q5_k"):
        sc, mn = kquant_scales(b[..., 4:16])
        qs = b[..., 48:] if name == "q5_k" else b[..., 16:]
        qs = qs.reshape(N, K // 256, 4, 32)
        q = torch.stack([qs & 15, qs >> 4], 3).reshape(N, K // 256, 8, 32).to(torch.int16)  # [.., sub-block j, l]
        if name == "q5_k":
            q = q | (_bits(b[..., 16:48], 256).reshape(N, K // 256, 32, 8).transpose(-1, -2).to(torch.int16) << 4)
        w = (q * sc.to(torch.int16).unsqueeze(-1)).reshape(N, K)
        return Unpacked(w, _f16(b[..., 0:2]), dmin=_f16(b[..., 2:4]), mins=mn)
    if name == "q6_k":
        ql, qh = b[..., :128].reshape(N, K // 256, 2, 2, 32), b[..., 128:192].reshape(N, K // 256, 2, 1, 32)
        low = torch.stack([ql[..., 0, :] & 15, ql[..., 1, :] & 15, ql[..., 0, :] >> 4, ql[..., 1, :] >> 4], 3)
        high = (qh >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(4, 1)) & 3  # [N, g, 2, 4, 32]
        q = (low | (high << 4)).to(torch.int16).reshape(N, K // 256, 16, 16) - 32
        sc = b[..., 192:208].contiguous().view(torch.int8).to(torch.int16)  # [N, g, 16]
        return Unpacked((q * sc.unsqueeze(-1)).reshape(N, K), _f16(b[..., 208:210]))
    raise KeyError(name)


def dequantize(qtype, blocks: torch.Tensor, N: int, K: int) -> torch.Tensor:
    """The weights the file means, [N, K] fp32: d·w − dmin·m (each product exact in fp32, one rounding at most)."""
    u = unpack(qtype, blocks, N, K)
    G = K // u.d.shape[1]  # elements per float scale: 256 for K-quants, 32 otherwise
    w = u.w.float().reshape(N, K // G, G) * u.d.unsqueeze(-1)
    if u.mins is not None and u.dmin is not None:
        w = w - (u.dmin.unsqueeze(-1) * u.mins.float()).repeat_interleave(32, -1)
    if u.m is not None:
        w = w + u.m.unsqueeze(-1)
    return w.reshape(N, K)


def random_blocks(qtype, N: int, K: int, seed: int = 0, scale: float = 0.02) -> torch.Tensor:
    """Plausible blocks [N, row_bytes] uint8 for tests and benchmarks: random quants, fp16 scales near
    scale / (the quant range) so that the weights are about `scale` in size."""
    name = type_name(qtype)
    _, B, nb = TYPES[name]
    g = torch.Generator().manual_seed(seed)
    b = torch.randint(0, 256, (N, K // B, nb), dtype=torch.uint8, generator=g)

    def put_f16(offset, values):
        b[..., offset:offset + 2] = values.to(torch.float16).contiguous().view(torch.uint8).reshape(*values.shape, 2)

    shape = (N, K // B)
    rand = torch.rand(shape, generator=g)
    if name in ("q4_k", "q5_k"):
        put_f16(0, (0.5 + rand) * scale / (63 * (31 if name == "q5_k" else 15)) * 2)
        put_f16(2, (0.5 + torch.rand(shape, generator=g)) * scale / 63)
    elif name == "q6_k":
        put_f16(208, (0.5 + rand) * scale / (64 * 32))
    else:
        q_range = {"q8_0": 127, "q4_0": 8, "q4_1": 15, "q5_0": 16, "q5_1": 31}[name]
        put_f16(0, (0.5 + rand) * scale / q_range)
        if name in ("q4_1", "q5_1"):
            put_f16(2, -(0.5 + torch.rand(shape, generator=g)) * scale)
    return b.reshape(N, K // B * nb)


# ----------------------------------------------------------------------------------------------------------------
# Quantizing a float weight into blocks: --target-quant int8 | int4 for a model that has no GGUF (Q8_0, Q4_1:
# llama.cpp's reference quantizers, as gguf.quants writes them in numpy, bit for bit), and transcribe's
# --encoder-int8 (Q6_K: the same kind of search as llama.cpp's, not its bytes; gguf.quants has no Q6_K quantizer).

QUANTIZABLE = ("q8_0", "q4_1", "q6_k")


def _roundf(x: torch.Tensor) -> torch.Tensor:
    """C's roundf (halves away from zero), as gguf.quants.np_roundf computes it in fp32."""
    a = x.abs()
    floored = torch.floor(a)
    return torch.sign(x) * (floored + torch.floor(2 * (a - floored)))


def _f16_bytes(v: torch.Tensor) -> torch.Tensor:
    """[...] fp32 -> [..., 2] uint8 (little-endian fp16)."""
    return v.to(torch.float16).contiguous().view(torch.uint8).reshape(*v.shape, 2)


def _quantize_rows(name: str, w: torch.Tensor) -> torch.Tensor:
    """w [n, K] fp32 -> [n, K / 32, block bytes] uint8."""
    n, K = w.shape
    b = w.reshape(n, K // 32, 32)
    if name == "q8_0":
        d = b.abs().amax(-1, keepdim=True) / 127
        inv = torch.where(d == 0, torch.zeros(()), 1 / d)
        q = _roundf(b * inv).to(torch.int8).view(torch.uint8)
        return torch.cat([_f16_bytes(d.squeeze(-1)), q], -1)
    hi, lo = b.amax(-1, keepdim=True), b.amin(-1, keepdim=True)
    d = (hi - lo) / 15
    inv = torch.where(d == 0, torch.zeros(()), 1 / d)
    q = torch.trunc((b - lo) * inv + 0.5).to(torch.uint8).clamp_(0, 15)  # [n, g, 32]
    qs = q[..., :16] | (q[..., 16:] << 4)
    return torch.cat([_f16_bytes(d.squeeze(-1)), _f16_bytes(lo.squeeze(-1)), qs], -1)


def _q6_k_rows(w: torch.Tensor) -> torch.Tensor:
    """w [n, K] fp32 (K a multiple of 256) -> [n, K / 256, 210] uint8. Each sub-block of 16 gets the scale s that
    minimizes Σ x²·(x − s·q)² over q = round(x / s) in [−32, 31], s tried at −(32 + c/10) / the signed element of
    largest |x| for c in −6, −3, 0, 3, 6 (llama.cpp tries −9..9: 1.77 % rel. L2 error against these 1.79 % on
    Gaussian weights, at 4× the time); the block's 16 scales are then int8 multiples of d (the largest at −128),
    and each q is rounded again to its int8 scale."""
    n, K = w.shape
    x = w.reshape(n, K // 256, 16, 16)
    peak = x.gather(-1, x.abs().argmax(-1, keepdim=True))  # [n, g, 16, 1]: the signed element of largest |x|
    safe = torch.where(peak == 0, torch.ones(()), peak)
    wt = x * x
    best_s, best = torch.zeros_like(peak), torch.full_like(peak, -1.0)
    for c in (-6, -3, 0, 3, 6):
        q = torch.round(x * (-(32 + c / 10) / safe)).clamp_(-32, 31)
        lx, l2 = (wt * x * q).sum(-1, keepdim=True), (wt * q * q).sum(-1, keepdim=True)
        score = torch.where(l2 > 0, lx * lx / l2.clamp(min=1e-30), torch.full_like(l2, -1.0))
        better = score > best
        best_s = torch.where(better, lx / l2.clamp(min=1e-30), best_s)
        best = torch.where(better, score, best)
    s = best_s.squeeze(-1)  # [n, g, 16]
    top = s.gather(-1, s.abs().argmax(-1, keepdim=True))  # [n, g, 1]
    d = torch.where(top == 0, torch.zeros(()), top / -128).to(torch.float16).float()  # the block's fp16 d
    sc = torch.where(d == 0, torch.zeros(()), torch.round(s / torch.where(d == 0, torch.ones(()), d)))
    sc = sc.clamp_(-128, 127)
    step = (d * sc).unsqueeze(-1)  # [n, g, 16, 1]: what one unit of q is worth
    q = torch.where(step == 0, torch.zeros(()), torch.round(x / torch.where(step == 0, torch.ones(()), step)))
    q = (q.clamp_(-32, 31) + 32).to(torch.uint8).reshape(n, K // 256, 2, 4, 32)  # [.., half h, s, l]: 128h + 32s + l
    lo, hi = q & 15, q >> 4
    ql = torch.cat([lo[..., 0, :] | (lo[..., 2, :] << 4), lo[..., 1, :] | (lo[..., 3, :] << 4)], -1)  # [.., h, 64]
    qh = hi[..., 0, :] | (hi[..., 1, :] << 2) | (hi[..., 2, :] << 4) | (hi[..., 3, :] << 6)  # [.., h, 32]
    return torch.cat([ql.reshape(n, K // 256, 128), qh.reshape(n, K // 256, 64),
                      sc.to(torch.int8).view(torch.uint8), _f16_bytes(d.squeeze(-1))], -1)


def quantize(qtype, w: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    """A float weight [N, K] (K a multiple of 32; of 256 for q6_k) in blocks of `qtype` (q8_0: int8 and one fp16
    scale per 32 weights; q4_1: four bits, one fp16 scale and minimum per 32: the bytes llama.cpp would write; q6_k:
    six bits, an int8 scale per 16, one fp16 d per 256) -> [N, row_bytes] uint8."""
    name = type_name(qtype)
    if name not in QUANTIZABLE:
        raise KeyError(f"{name}: only {', '.join(QUANTIZABLE)} are quantized here")
    N, K = w.shape
    row_bytes(name, K)  # K % 32
    rows = _q6_k_rows if name == "q6_k" else lambda w: _quantize_rows(name, w)
    out = [rows(w[n0:n0 + chunk].detach().float()).reshape(min(chunk, N - n0), -1)
           for n0 in range(0, N, chunk)]
    return torch.cat(out) if out else torch.empty(0, row_bytes(name, K), dtype=torch.uint8)

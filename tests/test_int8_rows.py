"""kernels/int8_rows: every path (portable, AVX2, AVX-512 VNNI, the torch twin) gives the same bits; a row's result
does not depend on the other rows of its call or on the threads; the values are x · Ŵᵀ within the bound that
rounding x to int8 and the fp32 epilogue allow. Each for int8 weights and int4 ones (pack(w, bits=4))."""

from __future__ import annotations

import pytest
import torch

from conftest import torch_threads, unbuildable
from specdec_cli.errors import SpecdecWarning
from specdec_cli.kernels import int8_rows

ROWS = (1, 2, 3, 4, 5, 8, 9, 11, 17, 40)  # 1–8 rows take 8, 4, 2, 1 blocks at a time; more rows go in balanced sweeps
N, K = 300, 520  # N past a group of 128 rows and not a multiple of 16; K a multiple of 8, not of 16


def paths_here() -> list[str]:
    ext = int8_rows.extension()
    best = ext.best_path() if ext is not None else 0
    return ["torch"] + [p for p, n in int8_rows.PATHS.items() if n <= best]


def weight(seed: int, n: int = N, k: int = K) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    w[3] = 0.0  # a zero row: scale 0
    w[5, 7] = 40.0  # an outlier: the rest of its row gets few levels
    return w


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_path_gives_the_twins_bits(dtype, bits):
    packed = int8_rows.pack(weight(0), bits)
    bias = torch.randn(N)
    for M in ROWS:
        x = (torch.randn(M, K) * 3).to(dtype)
        x[0, :] = 0.0  # a zero row: bias alone
        want = int8_rows.twin(x, packed, bias).to(dtype)
        for p in paths_here():
            got = int8_rows.mm(x, packed, bias, path=p)
            assert got.dtype == dtype and torch.equal(got, want), (M, p)
        assert torch.equal(int8_rows.mm(x, packed, None), int8_rows.twin(x, packed).to(dtype))


@pytest.mark.parametrize("bits", [8, 4])
def test_the_largest_products_sum_exactly(bits):
    """Weights at ±top and activations at ±127, so each path's narrow partial sums (int16 pairs, int4's sums of
    several k-steps) reach their largest: still the twin's exact integers."""
    w = torch.ones(N, K)
    w[1::2] = -1.0
    packed = int8_rows.pack(w, bits)
    x = torch.ones(4, K)
    x[1] = -1.0
    x[2, 1::2] = -1.0  # alternating: the pairs' products cancel
    x[3] = w[0] * 0.5 - 0.25  # a smaller level beside the largest
    want = int8_rows.twin(x, packed)
    assert float(want[0].abs().max()) == pytest.approx(int8_rows.TOPS[bits] * K * float(packed.scales[0]), rel=1e-6)
    for p in paths_here():
        assert torch.equal(int8_rows.mm(x, packed, path=p), want), p


@pytest.mark.parametrize("bits", [8, 4])
def test_a_row_does_not_depend_on_the_others_or_the_threads(bits):
    packed = int8_rows.pack(weight(1), bits)
    x = torch.randn(33, K, dtype=torch.bfloat16)
    with torch_threads(2):
        together = int8_rows.mm(x, packed)
    with torch_threads(1):
        alone = torch.cat([int8_rows.mm(x[i : i + 1], packed) for i in range(33)])
    assert torch.equal(together, alone)
    assert torch.equal(int8_rows.mm(x.view(3, 11, K), packed), together.view(3, 11, N))  # leading dims


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_values_against_the_dequantized_product(dtype, bits):
    """|y − x · Ŵᵀ − b| within what the arithmetic allows (int8_rows.cpp's top): x_k becomes s·q_k, |x_k − s·q_k| ≤
    s/2 + 3u·|x_k| (u = 2⁻²⁴: 127 / a, x_k times it, a / 127); float(dot), s_m · s_n, their product and the bias add
    are four more roundings of u; bf16 output one of 2⁻⁸."""
    w = weight(2)
    packed = int8_rows.pack(w, bits)
    assert packed.bits == bits and int(packed.ints().abs().max()) == int8_rows.TOPS[bits]  # each row's max at ±top
    bias = torch.randn(N)
    x = (torch.randn(9, K) * 2).to(dtype)
    got = int8_rows.mm(x, packed, bias).double()
    ref = int8_rows.reference(x, packed, bias)
    u = 2.0**-24
    xd = x.double()
    s = xd.abs().amax(-1, keepdim=True) / 127  # [M, 1]
    w_abs = packed.dequantized().double().abs()  # [N, K]
    err_x = (s / 2 * (1 + 4 * u) + 3 * u * xd.abs()) @ w_abs.T  # [M, N]
    bound = err_x + 5 * u * (ref.abs() + err_x)
    if dtype == torch.bfloat16:
        bound = bound + 2.0**-8 * (ref.abs() + bound)
    assert bool(((got - ref).abs() <= bound).all())
    assert float((got - ref).abs().max()) > 0  # x was rounded: the bound is not vacuous
    # the dequantized weights: within half a step of each row's
    assert bool(((packed.dequantized() - w).abs() <= packed.scales[:, None] / 2 * (1 + 1e-6) + 1e-12).all())


def test_packing_rules():
    with pytest.raises(ValueError, match="multiple of 8"):
        int8_rows.pack(torch.randn(16, 20))
    packed = int8_rows.pack(weight(3))
    assert packed.blocks.shape == (384 // 16, K // 4, 16, 4) and packed.blocks.dtype == torch.int8
    q = packed.blocks.permute(0, 2, 1, 3).reshape(-1, K)
    assert torch.equal(packed.sums, q.sum(1, dtype=torch.int32)) and not q[N:].any()
    assert int(q.abs().max()) == 127 and float(packed.scales[3]) == 0.0
    # int4: byte (k8, r, j) of block b holds w + 8 of row 16b + r at k = 8·k8 + j (low nibble) and 8·k8 + 4 + j (high)
    four = int8_rows.pack(weight(3), bits=4)
    w4 = int8_rows.quantize(weight(3), 7)[0]  # [N, K], |w| ≤ 7
    assert four.blocks.shape == (384 // 16, K // 8, 16, 4) and four.blocks.dtype == torch.uint8
    b, k8, r, j = 2, 5, 9, 3
    byte = int(four.blocks[b, k8, r, j])
    assert byte & 15 == int(w4[16 * b + r, 8 * k8 + j]) + 8 and byte >> 4 == int(w4[16 * b + r, 8 * k8 + 4 + j]) + 8
    assert torch.equal(four.ints(), w4) and torch.equal(four.sums[:N], w4.sum(1, dtype=torch.int32))


def test_a_failed_build_falls_back_to_the_twin(monkeypatch):
    packed = int8_rows.pack(weight(4, 20, 64))
    x = torch.randn(3, 64)
    want = int8_rows.twin(x, packed)
    unbuildable(monkeypatch, int8_rows)
    with pytest.warns(SpecdecWarning) as said:
        assert torch.equal(int8_rows.mm(x, packed), want)
        int8_rows.mm(x, packed)  # said once
    assert len(said) == 1 and "c++: not found" in str(said[0].message)
    assert int8_rows.backend_line().startswith("torch twin")

"""kernels/float_rows: every path (portable, AVX2) gives the same bits; a row's result does not depend on the other
rows of its call or on the threads; the values are x · Wᵀ within the bound its fp32 arithmetic allows; a layer made
row_linear runs it for a pass's rows and torch's layer for a prompt's."""

from __future__ import annotations

import pytest
import torch

from conftest import torch_threads, unbuildable
from specdec_cli.decoding import exact_rows
from specdec_cli.errors import SpecdecWarning
from specdec_cli.kernels import float_rows

ROWS = (1, 2, 3, 4, 5, 7, 11, 17, 44)  # tiles of 3 rows, then 2 or 1
N, K = 301, 523  # N not a multiple of the tile's 4 weight rows; K not of the 8 lanes

pytestmark = pytest.mark.skipif(float_rows.extension() is None, reason="the float_rows kernel does not build here")


def paths_here() -> list[str]:
    best = float_rows.extension().best_path()
    return [p for p, n in float_rows.PATHS.items() if n <= best]


def weight(seed: int, n: int = N, k: int = K) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * 0.05


@pytest.mark.parametrize("k", [K, 512])  # a tail of lanes after the vectors; none (the tree in vector lanes)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_path_gives_the_same_bits_and_a_row_its_own(dtype, k):
    w, bias = weight(0, k=k), torch.randn(N)
    x = torch.randn(max(ROWS), k).to(dtype)
    alone = torch.cat([float_rows.mm(x[i : i + 1], w, bias, path="portable") for i in range(len(x))])
    assert alone.dtype == dtype
    for p in paths_here():
        for M in ROWS:
            assert torch.equal(float_rows.mm(x[:M], w, bias, path=p), alone[:M]), (p, M)
    assert torch.equal(float_rows.mm(x.view(4, 11, k), w, bias), alone.view(4, 11, N))  # leading dims


@pytest.mark.parametrize("k", [K, 64])
@pytest.mark.parametrize("n", [N, 8, 9, 3])  # whole blocks of 8 weight rows, an odd row after them, fewer than a tile
def test_bf16_weights_give_the_bits_of_their_fp32_copy(n, k):
    w = weight(3, n, k).bfloat16()
    x = torch.randn(max(ROWS), k)
    alone = torch.cat([float_rows.mm(x[i : i + 1], w.float(), path="portable") for i in range(len(x))])
    for p in paths_here():
        for M in ROWS:
            assert torch.equal(float_rows.mm(x[:M], w, path=p), alone[:M]), (p, M, n)


def test_a_row_does_not_depend_on_the_threads():
    w, x = weight(1), torch.randn(33, K)
    with torch_threads(2):
        two = float_rows.mm(x, w)
    with torch_threads(1):
        one = float_rows.mm(x, w)
    assert torch.equal(one, two)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_values_within_the_arithmetics_bound(dtype):
    w, bias = weight(2), torch.randn(N)
    x = (torch.randn(9, K) * 2).to(dtype)
    got = float_rows.mm(x, w, bias).double()
    ref = float_rows.reference(x, w, bias)
    bound = float_rows.error_bound(x, w, bias)
    if dtype == torch.bfloat16:  # then rounded once to bf16
        bound = bound + 2.0**-8 * (ref.abs() + bound)
    assert bool(((got - ref).abs() <= bound).all())
    assert float((got - ref).abs().max()) > 0  # rounded: the comparison is not vacuous
    # a sum in another order (torch's) differs somewhere: the kernel's own order is what the rows share
    assert not torch.equal(float_rows.mm(x.float(), w, bias), torch.nn.functional.linear(x.float(), w, bias))


def test_row_linear_runs_the_kernel_for_a_pass_and_torch_for_a_prompt():
    lin = torch.nn.Linear(K, N)
    layer = exact_rows.row_linear(lin)
    assert isinstance(layer, exact_rows.KernelLinear)
    assert isinstance(exact_rows.row_linear(torch.nn.Linear(K, N).bfloat16()), exact_rows.KernelLinear)  # bf16 too
    x = torch.randn(2, exact_rows.ROWS + 1, K)
    with torch.inference_mode():
        step = layer(x[:, :1])
        assert torch.equal(layer(x[:, :5])[:, :1], step)  # a pass's first row: the step's bits
        assert torch.equal(step, float_rows.mm(x[:, :1], lin.weight, lin.bias))
        assert torch.equal(layer(x), lin(x))  # a prompt: torch's own product


def test_a_failed_build_keeps_torchs_layers(monkeypatch):
    unbuildable(monkeypatch, float_rows)
    lin = torch.nn.Linear(64, 20)
    with pytest.warns(SpecdecWarning) as said:
        assert exact_rows.row_linear(lin) is lin  # fp32: nothing else needed
    assert isinstance(exact_rows.row_linear(torch.nn.Linear(64, 20).bfloat16()), exact_rows.RowLinear)
    assert len(said) == 1 and "c++: not found" in str(said[0].message)
    assert float_rows.backend_line().startswith("torch")


def test_a_nan_comes_out_alike_on_every_path():
    w = weight(5, k=64)
    x = torch.randn(5, 64).bfloat16()
    x[2, 7] = float("nan")
    bits = [float_rows.mm(x, w, path=p).view(torch.int16) for p in paths_here()]
    assert all(torch.equal(b, bits[0]) for b in bits)
    assert bool(torch.isnan(float_rows.mm(x, w)[2]).all()) and not bool(torch.isnan(float_rows.mm(x, w)[[0, 1, 3, 4]]).any())

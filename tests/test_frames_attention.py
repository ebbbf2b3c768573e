"""kernels/frames_attention: the encoder's attention and a prompt's (causal, grouped heads, 128 wide) within its
arithmetic's bound of the fp64 result (fp32 sums; bf16 products and P on the AVX-512 BF16 path), on every path this CPU
runs (the portable path on any CPU); the rows of a tile do not depend on each other."""

from __future__ import annotations

import pytest
import torch

from specdec_cli.kernels import frames_attention as fa

pytestmark = pytest.mark.skipif(fa.KERNEL.module() is None, reason="the frames_attention kernel does not build here")


def paths_here() -> list[str]:
    best = fa.KERNEL.module().best_path()
    return [p for p, n in fa.PATHS.items() if n <= best]


def qkv(seed: int, B=2, H=3, S=75, dtype=torch.float32, D=64):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, S, D, generator=g) * 2 for _ in range(3))
    return q.to(dtype), k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("S", [1, 3, 16, 75, 257])  # tiles of 4 rows and 16 keys, and what is left after them
def test_within_the_arithmetics_bound(S):
    q, k, v = qkv(0, S=S)
    scale = 64 ** -0.5
    ref, _ = fa.reference(q, k, v, scale)
    bound = fa.error_bound(q, k, v, scale)
    for p in paths_here():
        got = fa.attend(q, k, v, scale, path=p).double()
        assert got.shape == ref.shape
        err = (got - ref).abs()
        assert bool((err <= bound).all()), (p, float((err / bound).max()))
        assert S == 1 or float(err.max()) > 0  # rounded: not vacuous (one key: its values exactly)


@pytest.mark.parametrize("T, S", [(1, 1), (5, 5), (37, 37), (18, 53), (70, 70)])
def test_causal_grouped_heads_128_wide_within_the_bound(T, S):
    """A prompt's attention (Qwen2.5 1.5B: 12 query heads over 2 of K and V, 128 wide): query t sees keys 0 .. S − T + t
    (T < S: a prompt's second chunk), so a key after it changes nothing."""
    g = torch.Generator().manual_seed(T + S)
    q = torch.randn(1, 6, T, 128, generator=g) * 2
    k, v = (torch.randn(1, 2, S, 128, generator=g) * 2 for _ in range(2))
    scale = 128 ** -0.5
    ref, _ = fa.reference(q, k, v, scale, causal=True)
    bound = fa.error_bound(q, k, v, scale, causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, -1] += 50
    v2[:, :, -1] -= 50  # the last key: seen by the last query only
    for p in paths_here():
        got = fa.attend(q, k, v, scale, causal=True, path=p)
        assert got.shape == (1, T, 6, 128)
        assert bool(((got.double() - ref).abs() <= bound).all()), (p, float(((got.double() - ref).abs() / bound).max()))
        moved = fa.attend(q, k2, v2, scale, causal=True, path=p)
        assert torch.equal(moved[:, :-1], got[:, :-1]) and not torch.equal(moved[:, -1], got[:, -1]), p
    assert fa.runs(q, k, v, causal=True) == fa.runs(q, q, q)  # where the encoder's call runs, a prompt's does
    assert not fa.runs(q, k[:, :, : T - 1], v[:, :, : T - 1], causal=True)  # fewer keys than queries


@pytest.mark.parametrize("S", [1, 3, 40, 75])  # odd S: the bf16 path's pairs of keys end in a padded one
def test_bf16_in_any_strides_comes_back_bf16_within_its_rounding(S):
    """bf16 inputs, on every path (AVX-512 BF16's products in bf16, its P rounded to bf16: error_bound's bf16 term)."""
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in qkv(1, S=S, dtype=torch.bfloat16))  # [B, H, S, D] views
    scale = 0.125
    ref, _ = fa.reference(q, k, v, scale)
    for p in paths_here():
        bound = fa.error_bound(q, k, v, scale, bf16=fa.bf16_products(q, k, v, p)) + 2.0 ** -8 * ref.abs()  # then bf16
        got = fa.attend(q, k, v, scale, path=p)
        assert got.dtype == torch.bfloat16
        assert bool(((got.double() - ref).abs() <= bound).all()), (p, float(((got.double() - ref).abs() / bound).max()))


@pytest.mark.parametrize("T, S", [(5, 5), (37, 37), (18, 53)])
def test_bf16_causal_grouped_heads_and_rows_alone(T, S):
    """bf16 inputs, a prompt's shapes (causal, 6 query heads over 2, 128 wide): within the bound on every path; a key
    after a query changes nothing for it; a row alone gives its bits in a tile of four."""
    g = torch.Generator().manual_seed(T * S)
    q = (torch.randn(1, 6, T, 128, generator=g) * 2).bfloat16()
    k, v = ((torch.randn(1, 2, S, 128, generator=g) * 2).bfloat16() for _ in range(2))
    scale = 128 ** -0.5
    ref, _ = fa.reference(q, k, v, scale, causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, -1] += 50
    v2[:, :, -1] -= 50  # the last key: seen by the last query only
    for p in paths_here():
        bound = fa.error_bound(q, k, v, scale, True, bf16=fa.bf16_products(q, k, v, p)) + 2.0 ** -8 * ref.abs()
        got = fa.attend(q, k, v, scale, causal=True, path=p)
        assert bool(((got.double() - ref).abs() <= bound).all()), (p, float(((got.double() - ref).abs() / bound).max()))
        moved = fa.attend(q, k2, v2, scale, causal=True, path=p)
        assert torch.equal(moved[:, :-1], got[:, :-1]) and not torch.equal(moved[:, -1], got[:, -1]), p
    whole = fa.attend(q, k, v, scale, path=paths_here()[-1])
    for r in (0, T - 1):
        alone = fa.attend(q[:, :, r : r + 1], k, v, scale, path=paths_here()[-1])
        assert torch.equal(alone[:, 0], whole[:, r])


def test_bf16_products_only_for_bf16_inputs_on_their_path():
    q, k, v = qkv(5, S=8)
    assert not fa.bf16_products(q, k, v, "avx512bf16") and not fa.bf16_products(q.bfloat16(), k.bfloat16(), v, "avx512bf16")
    assert fa.bf16_products(q.bfloat16(), k.bfloat16(), v.bfloat16(), "avx512bf16")
    assert not fa.bf16_products(q.bfloat16(), k.bfloat16(), v.bfloat16(), "avx512")
    if fa.KERNEL.module().best_path() == fa.PATHS["avx512bf16"]:  # fp32 inputs on it: the AVX-512 path's bits
        assert torch.equal(fa.attend(q, k, v, 0.125, path="avx512bf16"), fa.attend(q, k, v, 0.125, path="avx512"))


def test_a_row_does_not_depend_on_the_others():
    q, k, v = qkv(2, S=30)
    whole = fa.attend(q, k, v, 0.125, path=paths_here()[-1])
    for r in (0, 5, 29):  # one row alone (its own tile of one) against its place in a tile of four
        alone = fa.attend(q[:, :, r : r + 1], k, v, 0.125, path=paths_here()[-1])
        assert torch.allclose(alone[:, 0], whole[:, r], rtol=0, atol=1e-6)


def test_runs_only_where_its_fast_path_does():
    q, k, v = qkv(3, S=8)
    fast = fa.KERNEL.module().best_path() > fa.PATHS["portable"]  # AVX2 or AVX-512
    assert fa.runs(q, k, v) == fast
    assert not fa.runs(q[..., :32], k[..., :32], v[..., :32])  # heads 32 wide: torch's
    assert not fa.runs(q.half(), k.half(), v.half())


def test_the_encoders_attention_function_takes_what_the_kernel_takes():
    from specdec_cli import internals
    from specdec_cli.models import whisper_decoding as wd

    q, k, v = qkv(4, B=1, H=2, S=20)
    module = torch.nn.Module()
    out, weights = wd.frames_attention(module, q, k, v, None, scaling=0.5, dropout=0.0)
    assert weights is None and out.shape == (1, 20, 2, 64)
    if fa.runs(q, k, v):
        assert torch.equal(out, fa.attend(q, k, v, 0.5))
    mask = torch.zeros(1, 1, 20, 20)
    mask[..., -3:] = float("-inf")  # a mask: transformers' sdpa, which applies it
    masked, _ = wd.frames_attention(module, q, k, v, mask, scaling=0.5, dropout=0.0)
    assert torch.equal(masked, internals.sdpa_attention(module, q, k, v, mask, scaling=0.5, dropout=0.0)[0])

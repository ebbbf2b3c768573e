"""kernels/layer_ops: the fused residual add + RMS norm against its torch twin (the same bits) and the fp64 norm
(within the bound its roundings allow), each row alone; the fused rotary embedding and cache writes against torch's
ops, bit for bit; the builds for AVX2 and for plain x86-64 (the paths other CPUs run) give this CPU's bits."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from specdec_cli.kernels import cpp, layer_ops

pytestmark = pytest.mark.skipif(layer_ops.KERNEL.module() is None, reason="the layer_ops kernel did not build")


DTYPES = [torch.bfloat16, torch.float32]

# the kernel built for x86-64-v3 (AVX2 and FMA, no AVX-512: 8 lanes) and x86-64 (the plain loops), made at import so
# that the session builds them side by side with the others (conftest.pytest_collection_finish)
LEVELS = {march: cpp.Extension(f"layer_ops_{march}", layer_ops.SOURCE,
                               ["-O3", f"-march={march}", "-ffp-contract=off", "-std=c++17"], "")
          for march in ("x86-64-v3", "x86-64")}
UNIT = {torch.bfloat16: 2**-8, torch.float32: 2**-24}  # unit roundoff


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 1536, 896, 72])  # 72: a tail past the 16 lanes
def test_add_rms_is_its_twin_and_the_norm(d, dtype):
    torch.manual_seed(d)
    x = (torch.randn(5, d) * 3).to(dtype)
    y = torch.randn(5, d).to(dtype)
    w = (torch.rand(d) + 0.5).to(dtype)
    eps = 1e-6
    want = layer_ops.add_rms_twin(x, y, w, eps)[1]
    ops = layer_ops.LayerOps(dtype)
    assert ops.ext is not None
    norm = LlamaRMSNorm(d, eps).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(w)
    x_in = x.clone()
    s, got = ops.add_rms(x_in, y, norm)
    assert s is x_in and torch.equal(s, x + y)  # the sum in place, torch's add
    assert torch.equal(got, want)
    assert torch.equal(ops.add_rms(x.clone().view(1, 5, d), y.view(1, 5, d), norm)[1], want.view(1, 5, d))  # [..., d]
    # the fp64 norm of the same sum: two roundings to the dtype (h, then w · h) of unit roundoff u, and the fp32
    # sum of d squares, the division, sqrt and reciprocal (≤ (d/2 + 5) · 2⁻²⁴ on the scale)
    f = s.double()
    ref = w.double() * f / torch.sqrt(f.pow(2).mean(-1, keepdim=True) + eps)
    u = UNIT[dtype]
    bound = ref.abs() * (2 * u + u**2 + (d / 2 + 6) * 2**-24)
    assert bool(((got.double() - ref).abs() <= bound).all())
    # without y: the norm of x, x untouched
    x_in = x.clone()
    s, got = ops.add_rms(x_in, None, norm)
    assert torch.equal(s, x) and torch.equal(got, layer_ops.add_rms_twin(x, None, w, eps)[1])
    # each row alone: the same bits
    for m in range(5):
        alone = ops.add_rms(x[m : m + 1].clone(), y[m : m + 1], norm)[1]
        assert torch.equal(alone[0], want[m])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_store_is_torchs_rotary_embedding(monkeypatch, dtype):
    torch.manual_seed(0)
    B, T, H, KVH, D, S, start = 2, 3, 6, 2, 64, 16, 5
    joint = torch.randn(B, T, (H + 2 * KVH) * D).to(dtype)  # q, k, v side by side, as a joint product
    q, k, v = (t.view(B, T, -1, D) for t in joint.split([H * D, KVH * D, KVH * D], -1))
    angles = torch.randn(B, T, D // 2).repeat(1, 1, 2)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    caches = [torch.full((B, KVH, S, D), float("nan"), dtype=dtype) for _ in range(4)]
    got = layer_ops.LayerOps(dtype).rope_store(q, k, v, cos, sin, caches[0], caches[1], start)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    want_q = q.transpose(1, 2) * c + layer_ops.rotate_half(q.transpose(1, 2)) * s  # transformers' ops
    want_k = k.transpose(1, 2) * c + layer_ops.rotate_half(k.transpose(1, 2)) * s
    assert got.shape == (B, H, T, D) and torch.equal(got, want_q)
    assert torch.equal(caches[0][:, :, start : start + T], want_k)
    assert torch.equal(caches[1][:, :, start : start + T], v.transpose(1, 2))
    assert caches[0][:, :, :start].isnan().all() and caches[0][:, :, start + T :].isnan().all()  # no other slot
    # the torch path (where the kernel does not run) gives and writes the same
    monkeypatch.setattr(layer_ops.KERNEL, "module", lambda: None)
    torch_ops = layer_ops.LayerOps(dtype)
    assert torch_ops.ext is None
    assert torch.equal(torch_ops.rope_store(q, k, v, cos, sin, caches[2], caches[3], start), got)
    for torch_path, kernel_path in ((caches[2], caches[0]), (caches[3], caches[1])):
        assert torch.equal(torch_path[:, :, start : start + T], kernel_path[:, :, start : start + T])
        assert torch_path[:, :, :start].isnan().all() and torch_path[:, :, start + T :].isnan().all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_is_silu_times_up_and_every_element_alike(dtype):
    """silu(g) · u from gu = [g | u] (a joint gate/up product's output) against fp64: the exp within 2 ulp (4 units of
    2⁻²⁴), then 1 + e, its reciprocal, e · r, g · σ and · u one rounding each (5 more): ≤ 9 · 2⁻²⁴ relative in fp32,
    plus one rounding to bf16; −|g| is held at −87.3, so below g = −87 the bound is absolute (a silu there
    is below 10⁻³⁰ · |u|). An element's bits do not depend on its row, the other rows, or where it stands
    in its row (the AVX2 lanes and the scalar tail); the fallback is torch's silu(g) · u."""
    torch.manual_seed(0)
    F = 1003  # a tail past the 8 lanes
    gu = torch.randn(37, 2 * F) * 6
    gu[0, :6] = torch.tensor([0.0, -0.0, -100.0, 100.0, -87.5, 86.0])
    gu = gu.to(dtype)
    ops = layer_ops.LayerOps(dtype)
    out = ops.silu_mul(gu)
    assert out.dtype == dtype and out.shape == (37, F)
    g, u = gu.double().chunk(2, -1)
    ref = g * torch.sigmoid(g) * u
    bound = 9 * 2**-24 + (UNIT[dtype] if dtype != torch.float32 else 0)
    inside = g > -87
    rel = ((out.double() - ref).abs() / ref.abs().clamp_min(1e-30))[inside & (ref != 0)]
    assert rel.max().item() <= bound, rel.max().item()
    assert (out.double() - ref)[~inside].abs().max().item() < 1e-30
    assert torch.equal(torch.cat([ops.silu_mul(gu[i:i + 1]) for i in range(37)]), out)  # each row alone
    shifted = torch.cat([gu[:, 3:F], gu[:, F + 3:]], -1)  # every element 3 places earlier
    assert torch.equal(ops.silu_mul(shifted), out[:, 3:])
    assert torch.equal(ops.silu_mul(gu.view(1, 37, 2 * F)), out.view(1, 37, F))  # [..., 2F]
    joint = torch.randn(37, 4 * F).to(dtype)[:, : 2 * F]  # rows evenly spaced, not contiguous
    assert torch.equal(ops.silu_mul(joint), ops.silu_mul(joint.contiguous()))
    ops.ext = None
    fallback = ops.silu_mul(gu)
    assert torch.equal(fallback, torch.nn.functional.silu(gu[:, :F]) * gu[:, F:])


@pytest.mark.parametrize("march", list(LEVELS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_build_gives_this_cpus_bits(march, dtype):
    """add_rms, silu_mul and rope_store of the AVX2 and plain builds equal this CPU's build bit for bit (rows of 72
    and 1536: lane tails and whole registers; values up to where bf16 sums overflow, and ties of the rounding)."""
    other = LEVELS[march].module()
    assert other is not None, LEVELS[march].error
    native = layer_ops.KERNEL.module()
    torch.manual_seed(3)
    for d in (72, 1536):
        x = (torch.randn(9, d) * 3).to(dtype)
        y = torch.randn(9, d).to(dtype)
        x[0, :8] = y[0, :8] = 3e38  # sums past the largest bf16 / fp32: inf
        w = (torch.rand(d) + 0.5).to(dtype)
        a, b = x.clone(), x.clone()
        got, want = other.add_rms(a, y, w, 1e-6), native.add_rms(b, y, w, 1e-6)
        assert torch.equal(a.view(torch.int16 if dtype != torch.float32 else torch.int32),
                           b.view(torch.int16 if dtype != torch.float32 else torch.int32))
        assert torch.equal(got[1:], want[1:]) and torch.equal(got[0].isnan(), want[0].isnan())
        assert torch.equal(other.add_rms(x[1:].clone(), None, w, 1e-6), native.add_rms(x[1:].clone(), None, w, 1e-6))
    gu = (torch.randn(9, 2 * 1003) * 6).to(dtype)
    assert torch.equal(other.silu_mul(gu), native.silu_mul(gu))
    B, T, H, KVH, D, S = 1, 5, 6, 2, 64, 12
    q, k, v = torch.randn(B, T, H, D).to(dtype), torch.randn(B, T, KVH, D).to(dtype), torch.randn(B, T, KVH, D).to(dtype)
    cos, sin = torch.randn(B, T, D).to(dtype), torch.randn(B, T, D).to(dtype)
    caches = [torch.zeros(B, KVH, S, D, dtype=dtype) for _ in range(4)]
    mine = other.rope_store(q, k, v, cos, sin, caches[0], caches[1], 3)
    theirs = native.rope_store(q, k, v, cos, sin, caches[2], caches[3], 3)
    assert torch.equal(mine, theirs) and torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])

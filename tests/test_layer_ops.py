"""kernels/layer_ops: the fused residual add + RMS norm against its torch twin (the same bits) and the fp64 norm
(within the bound its roundings allow), each row alone; the fused rotary embedding and cache writes against torch's
ops, bit for bit."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from specdec_cli.kernels import layer_ops

pytestmark = pytest.mark.skipif(layer_ops.KERNEL.module() is None, reason="the layer_ops kernel did not build")


DTYPES = [torch.bfloat16, torch.float32]
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

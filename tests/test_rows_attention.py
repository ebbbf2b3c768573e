"""kernels/rows_attention: against the fp64 reference within a bound derived from the arithmetic, each row bit for bit
what a one-row call at its position gives (the guarantee decoding/exact_rows needs), on this CPU's build and on
builds for AVX2 and for plain x86-64 (the paths other CPUs run), and the fallback when it does not build."""

from __future__ import annotations

import pytest
import torch

from conftest import torch_threads, unbuildable
from specdec_cli.errors import SpecdecWarning
from specdec_cli.kernels import cpp, rows_attention

EPS32 = 2.0 ** -24

# (B, H, KVH, D): GQA groups of 1, 3, 4, 6, 7, 12 (two groups of 6) and 40 (more heads than the kernel's groups
# hold), head sizes on and off the 16-wide lanes
SHAPES = [(1, 12, 2, 128), (2, 4, 1, 64), (1, 7, 7, 80), (1, 14, 2, 72), (2, 12, 1, 32), (1, 6, 2, 256),
          (1, 40, 1, 32)]


# the kernel built for other x86-64 levels: x86-64-v3 (AVX2 and FMA, no AVX-512: its two-ymm lanes), x86-64 (SSE2:
# the plain loops other CPUs run). Made at import, so the session builds them with the others, side by side
# (conftest.pytest_collection_finish), not one after another inside the first test (~40 s each on 2 cores)
LEVELS = {march: cpp.Extension(f"rows_attention_{march}", rows_attention.SOURCE,
                               ["-O3", f"-march={march}", "-ffp-contract=off", "-std=c++17"], "")
          for march in ("x86-64-v3", "x86-64")}


def built_for(march: str):
    module = LEVELS[march].module()
    assert module is not None, LEVELS[march].error
    return module.attend


BUILDS = {"native": lambda: rows_attention.attend, "avx2": lambda: built_for("x86-64-v3"),
          "plain": lambda: built_for("x86-64")}


def case(B, H, KVH, D, T, S, dtype, kdtype, mask_kind, seed):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, H, T, D, generator=g) * 2).to(dtype)
    k = (torch.randn(B, KVH, S + 5, D, generator=g) * 2).to(kdtype)[:, :, :S]  # a cache's view: room past S
    v = torch.randn(B, KVH, S + 5, D, generator=g).to(kdtype)[:, :, :S]
    mask = None
    if mask_kind == "bool":  # left padding: row b's first 3b slots hidden
        mask = torch.ones(B, 1, T, S, dtype=torch.bool)
        for b in range(B):
            mask[b, :, :, : 3 * b] = False
    elif mask_kind == "float":
        mask = torch.randn(B, 1, T, S, generator=g).clamp(max=0)
        mask[..., ::7] = float("-inf")
    elif mask_kind == "per head":  # each head and row its own keys: a key one member hides, another may see
        mask = torch.rand(B, H, T, S, generator=g) < 0.7
    return q, k, v, mask


def tolerance(q, k, v, scale, ref):
    """|out − reference| ≤ this, elementwise: each score off by at most D·2⁻²³·scale·Σ|q||k| (fp32 fma chains and a
    sum of 16 lanes), which moves each weight e_j / l by at most 2·that relatively (plus 2⁻²² for exp and the sums),
    so out by that times max|v|, and S·2⁻²³·max|v| for the weighted sum; then, for a bf16 output (q's dtype), its
    rounding: half an ulp, ≤ 2⁻⁸ of the value."""
    D, S = q.shape[-1], k.shape[2]
    rep = q.shape[1] // k.shape[1]
    kd = k.double().abs().repeat_interleave(rep, 1)
    score_err = (D * 2 * EPS32 * scale * (q.double().abs() @ kd.transpose(-1, -2))).amax(-1)  # [B, H, T]
    vmax = v.double().abs().amax()
    err = (((2 * score_err + 4 * EPS32) + (S + 16) * 2 * EPS32) * vmax).transpose(1, 2)[..., None]  # [B, T, H, 1]
    rounding = 2.0 ** -8 if q.dtype == torch.bfloat16 else 0.0
    return err * (1 + rounding) + rounding * ref.abs()


@pytest.mark.parametrize("build", list(BUILDS))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_close_to_the_reference_and_rows_alike(build, shape):
    attend = BUILDS[build]()
    B, H, KVH, D = shape
    scale = D ** -0.5
    for T, S, dtype, kdtype, mask_kind in ((1, 37, torch.float32, torch.float32, None),
                                           (3, 40, torch.bfloat16, torch.bfloat16, "bool"),
                                           (9, 75, torch.float32, torch.bfloat16, "float"),
                                           (5, 16, torch.bfloat16, torch.float32, None),
                                           # more rows than a group holds, blocks of 16 keys and a tail
                                           (40, 93, torch.bfloat16, torch.bfloat16, "per head")):
        q, k, v, mask = case(B, H, KVH, D, T, S, dtype, kdtype, mask_kind, seed=T + S)
        out = attend(q, k, v, mask, scale, True)
        assert out.shape == (B, T, H, D) and out.dtype == dtype
        ref = rows_attention.reference(q, k, v, mask, scale)
        assert ((out.double() - ref).abs() <= tolerance(q, k, v, scale, ref)).all(), (T, S, dtype, mask_kind)
        for r in range(T):  # row r alone, as a step at its position sees the cache: the first S − (T − 1 − r) keys
            end = S - (T - 1 - r)
            one = attend(q[:, :, r:r + 1], k[:, :, :end], v[:, :, :end],
                         None if mask is None else mask[:, :, r:r + 1, :end], scale, True)
            assert torch.equal(one[:, 0], out[:, r]), (T, S, r)


@pytest.mark.parametrize("build", list(BUILDS))
def test_threads_and_cross_attention(build):
    attend = BUILDS[build]()
    q, k, v, mask = case(2, 12, 2, 128, 4, 50, torch.bfloat16, torch.bfloat16, "bool", seed=3)
    with torch_threads(1):
        one = attend(q, k, v, mask, 0.1, False)
    with torch_threads(2):
        assert torch.equal(attend(q, k, v, mask, 0.1, False), one)
    ref = rows_attention.reference(q, k, v, mask, 0.1, causal=False)
    assert ((one.double() - ref).abs() <= tolerance(q, k, v, 0.1, ref)).all()


@pytest.mark.parametrize("build", list(BUILDS))
@pytest.mark.parametrize("kdtype", [torch.bfloat16, torch.int8])
def test_bf16_and_int8_keys_give_their_fp32_copys_bits(build, kdtype):
    """K/V held in bf16 or int8 and the same values in fp32 give the same output bit for bit (each is widened
    exactly): Whisper's cross-attention keeps its bf16-computed K/V in bf16 where the kernel runs
    (models.whisper.cross_attention_dtype), which must not change a transcript; the self draft's are int8."""
    attend = BUILDS[build]()
    q, k, v, _ = case(2, 8, 8, 64, 3, 1500, torch.bfloat16, torch.float32, None, seed=5)
    scale = 0.125
    if kdtype == torch.int8:  # the values in steps of 1/30: scores as the bf16 case's
        k, v = ((t * 30).round().clamp(-127, 127).to(torch.int8) for t in (k, v))
        scale /= 30
    else:
        k, v = k.bfloat16(), v.bfloat16()
    ref = rows_attention.reference(q, k, v, None, scale, causal=False)
    out = attend(q, k, v, None, scale, False)
    assert ((out.double() - ref).abs() <= tolerance(q, k, v, scale, ref)).all()
    for causal in (False, True):
        assert torch.equal(attend(q, k, v, None, scale, causal), attend(q, k.float(), v.float(), None, scale, causal))
        assert torch.equal(attend(q[:, :, :1], k, v, None, scale, causal),
                           attend(q[:, :, :1], k.float(), v.float(), None, scale, causal))


@pytest.mark.parametrize("build", list(BUILDS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_per_channel_scales_inside_give_torchs_bits(build, dtype):
    """int8 K/V with per-channel scales (the self draft's pooled frames): qscale and oscale applied inside give
    (attend(q · qscale) · oscale).to(q's dtype) in torch ops, bit for bit: one fp32 multiplication each."""
    attend = BUILDS[build]()
    q, k, v, _ = case(2, 8, 8, 64, 2, 300, dtype, torch.float32, None, seed=6)
    k, v = ((t * 30).round().clamp(-127, 127).to(torch.int8) for t in (k, v))
    ks, vs = torch.rand(2, 8, 1, 64) / 30, torch.rand(2, 8, 1, 64) / 30  # [B, H, 1, D]
    want = (attend(q * ks, k, v, None, 1.0, False, None, None) * vs.transpose(1, 2)).to(dtype)
    assert torch.equal(attend(q, k, v, None, 1.0, False, ks, vs.transpose(1, 2)), want)
    assert not torch.equal(attend(q, k, v, None, 1.0, False, None, None), want)


@pytest.mark.parametrize("build", list(BUILDS))
def test_hidden_slots_leave_a_rows_bits(build):
    """A row whose cache holds hidden slots (a batch's left padding, the holes its rejected draft tokens leave) gets
    the bits of the same row over the shown keys alone, no mask: a batch's speculative row is its autoregressive
    step. (Summing the softmax's terms in lanes by slot index, not by rank among the shown keys, moved the bits.)"""
    attend = BUILDS[build]()
    q, k, v, _ = case(1, 8, 8, 64, 3, 70, torch.float32, torch.bfloat16, None, seed=6)
    shown = torch.ones(70, dtype=torch.bool)
    shown[:5] = False  # left padding
    shown[[20, 21, 22, 37, 50, 51]] = False  # holes
    mask = shown.expand(1, 1, 3, 70)
    for causal in (False, True):
        with_holes = attend(q, k, v, mask, 0.125, causal)
        alone = attend(q, k[:, :, shown], v[:, :, shown], None, 0.125, causal)
        assert torch.equal(with_holes, alone), causal


@pytest.mark.parametrize("build", list(BUILDS))
def test_hidden_slots_never_reach_a_row(build):
    """A padded slot's V (NaN here) is skipped, not multiplied by 0; a row that sees no key gives 0."""
    attend = BUILDS[build]()
    q, k, v, mask = case(2, 6, 2, 64, 2, 12, torch.float32, torch.float32, "bool", seed=4)
    v[1, :, :3] = float("nan")
    k[1, :, :3] = float("nan")
    out = attend(q, k, v, mask, 0.125, True)
    assert not out.isnan().any()
    mask[0, :, 1] = False
    assert torch.equal(attend(q, k, v, mask, 0.125, True)[0, 1], torch.zeros(6, 64))
    # a slot only head 0 hides: the heads beside it (one KV head's, computed together) see its NaN, head 0 must not
    one_head = mask.expand(2, 6, 2, 12).clone()
    one_head[0, 0, :, 5] = False
    v[0, :, 5] = float("nan")
    out = attend(q, k, v, one_head, 0.125, True)
    assert not out[0, 0, 0].isnan().any() and out[0, 0, 1:3].isnan().all()  # row 0 (row 1 sees nothing)


def test_a_failed_build_falls_back_to_torch(monkeypatch):
    """exact_rows' attention without the kernel: torch's sdpa one row at a time, said once."""
    from specdec_cli.decoding import exact_rows

    q, k, v, _ = case(1, 4, 2, 32, 3, 20, torch.float32, torch.float32, None, seed=5)
    module = torch.nn.Module()
    module.is_causal, module.num_key_value_groups = True, 2
    unbuildable(monkeypatch, rows_attention)
    with pytest.warns(SpecdecWarning, match="did not build.*c\\+\\+: not found"):
        out, _ = exact_rows.fp32_by_rows(module, q, k, v, None, scaling=0.2)
    want, _ = exact_rows.sdpa_by_rows(module, q, k, v, None, one_query_dtype=torch.float32, scaling=0.2)
    assert torch.equal(out, want)

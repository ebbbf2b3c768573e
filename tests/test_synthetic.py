"""Synthetic verification inputs: shapes, dtypes, and that the overlap knob means what it says."""

import pytest
import torch

from specdec_cli.bench.cases import acceptance_probability, describe, make_case, tv_distance


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_shapes_dtypes_and_ranges(dtype):
    B, G, V = 3, 4, 1000
    c = make_case(B, G, V, overlap=0.7, dtype=dtype, seed=1)
    assert c["draft_tokens"].shape == (B, G) and c["draft_tokens"].dtype == torch.int64
    assert c["draft_probs"].shape == (B, G, V) and c["draft_probs"].dtype == torch.float32
    assert c["draft_logits"].shape == (B, G, V) and c["draft_logits"].dtype == dtype
    assert c["target_logits"].shape == (B, G + 1, V) and c["target_logits"].dtype == dtype
    assert c["uniforms"].shape == (B, G + 1) and c["uniforms"].dtype == torch.float32
    assert c["row_overlap"].shape == (B, G)
    u = c["uniforms"]
    assert bool((u > 0).all() and (u <= 1).all())
    assert bool(((c["draft_tokens"] >= 0) & (c["draft_tokens"] < V)).all())
    assert torch.isfinite(c["target_logits"].float()).all() and torch.isfinite(c["draft_logits"].float()).all()
    # draft_probs is the softmax of draft_logits, rows sum to one
    torch.testing.assert_close(c["draft_probs"], torch.softmax(c["draft_logits"].float(), -1))
    torch.testing.assert_close(c["draft_probs"].sum(-1), torch.ones(B, G))
    # every draft token has positive draft probability
    qt = c["draft_probs"].gather(-1, c["draft_tokens"][..., None])
    assert bool((qt > 0).all())


@pytest.mark.parametrize(
    "B,G,V,ov,peak,dtype",
    [
        (4, 5, 32000, 0.8, 2.0, torch.float32),
        (2, 8, 32000, 0.5, 1.5, torch.bfloat16),
        (8, 3, 4096, 0.95, 2.5, torch.float16),
        (2, 4, 51865, 0.3, 1.0, torch.float32),
    ],
)
def test_overlap_is_what_was_asked(B, G, V, ov, peak, dtype):
    c = make_case(B, G, V, overlap=ov, peakedness=peak, dtype=dtype, seed=7)
    p = torch.softmax(c["target_logits"][:, :G].float(), dim=-1)
    q = c["draft_probs"]
    measured = acceptance_probability(p, q).mean().item()  # independent recomputation
    assert abs(measured - ov) < 0.1
    assert measured == pytest.approx(c["overlap"], abs=1e-5)
    assert measured == pytest.approx(1 - tv_distance(p, q).mean().item(), abs=1e-5)


def test_draft_tokens_are_drawn_from_draft_probs():
    # Monte Carlo: accepting token x with probability min(1, p(x)/q(x)) must succeed at the rate
    # Σ min(p, q) when x ~ q. 16·16 = 256 draws, std ≈ 0.025. A token drawn uniformly, or the
    # argmax of q, would miss this rate.
    B, G, V = 16, 16, 2000
    c = make_case(B, G, V, overlap=0.6, seed=3)
    p = torch.softmax(c["target_logits"][:, :G].float(), dim=-1)
    q = c["draft_probs"]
    x = c["draft_tokens"][..., None]
    ratio = p.gather(-1, x)[..., 0] / q.gather(-1, x)[..., 0]
    accepted = (c["uniforms"][:, :G] <= ratio).float().mean().item()
    assert abs(accepted - c["overlap"]) < 0.1
    # the sampled tokens are not simply the draft's argmax
    assert (c["draft_tokens"] != q.argmax(-1)).any()


def test_target_looks_like_an_lm():
    c = make_case(4, 4, 32000, overlap=0.8, peakedness=2.0, seed=0)
    p = torch.softmax(c["target_logits"].float(), dim=-1)  # [B, γ+1, V]
    top1 = p.max(-1).values
    top5 = p.topk(5, -1).values.sum(-1)
    assert 0.3 < top1.mean().item() < 0.9  # a few dominant tokens...
    assert top5.mean().item() > 0.6
    assert (p > 1e-3).sum(-1).float().mean().item() < 200  # ...and a long, thin tail
    # heavy tail: sorted probabilities fall roughly like a power law (log-log slope ≈ −s)
    srt = p[0, 0].sort(descending=True).values
    slope = (torch.log(srt[999]) - torch.log(srt[9])) / (torch.log(torch.tensor(1000.0)) - torch.log(torch.tensor(10.0)))
    assert -6.0 < slope.item() < -0.5
    # rows differ: the dominant token is not the same everywhere
    assert len(set(p.argmax(-1).flatten().tolist())) > 1
    d = describe(c)
    assert d["vocab"] == 32000 and d["gamma"] == 4


def test_overlap_one_means_identical_draft():
    c = make_case(2, 3, 500, overlap=1.0, seed=5)
    assert c["noise_scale"] == 0.0
    assert torch.equal(c["draft_logits"], c["target_logits"][:, :3])
    assert c["overlap"] == pytest.approx(1.0, abs=1e-5)


def test_seed_reproducible_and_overlap_ordered():
    a = make_case(2, 3, 800, overlap=0.7, seed=11)
    b = make_case(2, 3, 800, overlap=0.7, seed=11)
    for k in ("draft_tokens", "draft_probs", "target_logits", "uniforms"):
        assert torch.equal(a[k], b[k])
    c = make_case(2, 3, 800, overlap=0.7, seed=12)
    assert not torch.equal(a["target_logits"], c["target_logits"])
    # same seed, lower overlap: same target, noisier draft
    lo = make_case(2, 3, 800, overlap=0.4, seed=11)
    assert torch.equal(a["target_logits"], lo["target_logits"])
    assert lo["noise_scale"] > a["noise_scale"] and lo["overlap"] < a["overlap"]


def test_tv_distance_hand_values():
    p = torch.tensor([0.5, 0.5, 0.0])
    q = torch.tensor([0.25, 0.25, 0.5])
    assert tv_distance(p, q).item() == pytest.approx(0.5)
    assert acceptance_probability(p, q).item() == pytest.approx(0.5)
    assert tv_distance(p, p).item() == 0.0
    batch = torch.stack([p, q])  # [2, 3]: reduces over the last dim only
    assert tv_distance(batch, batch.flip(0)).shape == (2,)


def test_bad_arguments():
    with pytest.raises(ValueError):
        make_case(1, 0, 100)
    with pytest.raises(ValueError):
        make_case(1, 2, 100, overlap=0.0)
    with pytest.raises(ValueError):
        make_case(1, 2, 100, overlap=1.5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_same_case_on_cuda():
    cpu = make_case(2, 4, 32000, overlap=0.7, dtype=torch.bfloat16, seed=2)
    gpu = make_case(2, 4, 32000, overlap=0.7, dtype=torch.bfloat16, seed=2, device="cuda")
    assert gpu["target_logits"].is_cuda and gpu["draft_tokens"].is_cuda and gpu["uniforms"].is_cuda
    torch.testing.assert_close(gpu["target_logits"].cpu(), cpu["target_logits"])
    assert abs(gpu["overlap"] - 0.7) < 0.1

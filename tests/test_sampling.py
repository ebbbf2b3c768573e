"""specdec_cli.sampling: parameter checks, logits processing, inverse-CDF sampling."""

import math

import pytest
import torch
from scipy.stats import chisquare

from specdec_cli.decoding.sampling import (
    SamplingParams,
    greedy_tokens,
    probs_from_logits,
    process_logits,
    sample,
    sample_logits,
    uniforms,
)
from specdec_cli.errors import NonFiniteLogitsError, SpecdecError

NEG = -math.inf


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0.0), "top-p"),
        (dict(top_p=1.5), "top-p"),
        (dict(top_k=-1), "top-k"),
    ],
)
def test_bad_params_raise_one_line(kwargs, words):
    with pytest.raises(SpecdecError) as err:
        SamplingParams(**kwargs)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_greedy_and_filtered_flags():
    assert SamplingParams(temperature=0).greedy
    assert not SamplingParams().filtered
    assert SamplingParams(temperature=1.0, top_k=3).filtered and SamplingParams(temperature=1.0, top_p=0.9).filtered


def test_temperature_divides_logits():
    z = torch.tensor([[1.0, 2.0, 4.0]])
    assert torch.allclose(process_logits(z, SamplingParams(temperature=2.0)), z / 2)
    assert torch.equal(process_logits(z, SamplingParams(temperature=0.0)), z)  # greedy: unchanged


def test_top_k_keeps_the_k_largest():
    z = torch.tensor([[0.5, 3.0, -1.0, 2.0, 1.0], [1.0, 1.0, 1.0, 1.0, 1.0]])
    out = process_logits(z, SamplingParams(temperature=1.0, top_k=2))
    assert torch.equal(torch.isfinite(out[0]), torch.tensor([False, True, False, True, False]))
    assert torch.isfinite(out[1]).all()  # ties at the k-th value are all kept
    assert torch.equal(process_logits(z, SamplingParams(temperature=1.0, top_k=10)), z)  # k >= V: off


def test_top_p_keeps_the_nucleus():
    probs = torch.tensor([[0.5, 0.05, 0.3, 0.15]])
    z = probs.log()
    # sorted 0.5, 0.3, 0.15, 0.05: mass before each is 0, 0.5, 0.8, 0.95
    cases = {0.5: [1, 0, 0, 0], 0.6: [1, 0, 1, 0], 0.8: [1, 0, 1, 0], 0.81: [1, 0, 1, 1], 1.0: [1, 1, 1, 1]}
    for top_p, kept in cases.items():
        out = process_logits(z, SamplingParams(temperature=1.0, top_p=top_p))
        assert torch.isfinite(out[0]).int().tolist() == kept, top_p


def test_top_p_tiny_keeps_at_least_one_token():
    z = torch.tensor([[0.0, 0.0, 5.0, NEG]])
    out = process_logits(z, SamplingParams(temperature=1.0, top_p=1e-6, top_k=1))
    assert torch.isfinite(out).sum() == 1 and out.argmax() == 2


def test_probs_from_logits_zero_where_masked():
    p = probs_from_logits(torch.tensor([[0.0, NEG, 0.0]]))
    assert p.dtype == torch.float32 and p[0, 1] == 0 and torch.allclose(p.sum(-1), torch.ones(1))


def test_sample_one_hot_and_extremes():
    probs = torch.tensor([[0.0, 0.0, 1.0, 0.0]] * 4)
    u = torch.tensor([1e-12, 0.5, 1.0, 0.0])  # 0 is outside the contract, still must not pick a zero
    assert sample(probs, u).tolist() == [2, 2, 2, 2]


def test_sample_never_draws_zero_probability():
    # zeros everywhere, including first and last; thresholds hitting every boundary exactly
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.0, 0.5, 0.25, 0.0]]).repeat(7, 1)
    u = torch.tensor([1e-30, 0.25, 0.2500001, 0.75, 0.7500001, 1.0, 0.5])
    assert sample(probs, u).tolist() == [1, 1, 4, 4, 5, 5, 4]
    g = torch.Generator().manual_seed(0)
    big = torch.rand(64, 1000, generator=g) * (torch.rand(64, 1000, generator=g) < 0.1)  # 90% zeros
    drawn = sample(big, uniforms(64, g))
    assert (big.gather(1, drawn[:, None]) > 0).all()


def test_sample_unnormalised_weights():
    w = torch.tensor([[2.0, 0.0, 6.0]]).repeat(2, 1)  # the CDF is scaled by the total
    assert sample(w, torch.tensor([0.25, 0.26])).tolist() == [0, 2]


def test_sample_frequencies_match_probs():
    """Chi-square over 40 000 draws from a fixed 6-token distribution; fails if p < 1e-3."""
    p = torch.tensor([0.4, 0.0, 0.25, 0.2, 0.1, 0.05])
    n = 40_000
    g = torch.Generator().manual_seed(1234)
    drawn = sample(p.expand(n, -1), uniforms(n, g))
    counts = torch.bincount(drawn, minlength=6).double()
    assert counts[1] == 0
    nz = p > 0
    result = chisquare(counts[nz].numpy(), (p[nz].double() * n).numpy())
    assert result.pvalue > 1e-3, result


def test_sample_logits_greedy_and_processed():
    z = torch.tensor([[0.0, 3.0, 1.0]])
    tokens, probs = sample_logits(z, SamplingParams(temperature=0), None)
    assert tokens.tolist() == [1] and probs is None
    tokens, probs = sample_logits(z, SamplingParams(temperature=0.7, top_k=1), torch.tensor([0.9]))
    assert tokens.tolist() == [1] and probs[0].tolist() == [0.0, 1.0, 0.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_tokens_are_torch_argmax_ties_to_the_first(dtype):
    """The greedy token (numpy's argmax on a CPU) is torch.argmax's: the first of equal maxima, −inf elsewhere, any
    layout of the rows."""
    g = torch.Generator().manual_seed(0)
    z = (torch.randint(-3, 4, (4, 3, 200), generator=g).float()).to(dtype)  # many ties
    z[0, 0] = float("-inf")
    z[0, 0, 150] = z[0, 0, 7] = 2.0
    for logits in (z, z.transpose(0, 1), z[:, :, ::2]):
        best = greedy_tokens(logits)
        assert best.dtype == torch.int64 and torch.equal(best, logits.float().argmax(-1))
    assert greedy_tokens(z)[0, 0] == 7
    for poison in (float("nan"), float("inf"), "all-masked"):  # in one row of many, before or after its max
        for at in (3, 190):
            bad = z.float().clone()
            if poison == "all-masked":
                bad[2, 1] = float("-inf")
            else:
                bad[2, 1, at] = poison
            with pytest.raises(NonFiniteLogitsError):
                greedy_tokens(bad)


def test_uniforms_in_open_closed_interval():
    u = uniforms((1000,), torch.Generator().manual_seed(0))
    assert u.dtype == torch.float32 and (u > 0).all() and (u <= 1).all()


@pytest.mark.parametrize("nucleus", [100, 700, 4600, 9200])
def test_top_p_on_a_large_vocabulary_matches_a_full_sort(nucleus):
    """The partial-sort search (top 256, then 4096, then all) takes each path, V = 50 000, and keeps what a full
    sort of the same probabilities keeps: the smallest set of most likely tokens whose mass reaches top_p.

    Geometric probabilities p_k ∝ r^k: the mass of the k most likely tokens is 1 − r^k (V large), so
    top_p = 1 − r^(n + 1/2) keeps n + 1 tokens in exact arithmetic. softmax sums V fp32 terms: its masses are off
    by up to γ_V = V·u/(1 − V·u) (u = 2⁻²⁴, recursive summation's bound), which moves the cut by at most
    γ_V / p_n tokens (p_n ≈ r^n·d the probability at the cut), never out of the path n + 1 takes."""
    V, d = 50_000, 0.0005
    z = -d * torch.arange(V, dtype=torch.float32)
    z = z[torch.randperm(V, generator=torch.Generator().manual_seed(0))][None]
    top_p = 1.0 - math.exp(-d * (nucleus + 0.5))
    got = torch.isfinite(process_logits(z, SamplingParams(temperature=1.0, top_p=top_p)))[0]
    sorted_p = torch.sort(torch.softmax(z, dim=-1)[0], descending=True).values.double()  # [V] the same probabilities
    kept = int((torch.cumsum(sorted_p, 0) - sorted_p < top_p).sum())  # the full sort's nucleus
    assert got.sum().item() == kept
    u = 2.0**-24
    gamma_v = V * u / (1 - V * u)
    assert abs(kept - (nucleus + 1)) <= math.ceil(gamma_v / (d * math.exp(-d * nucleus))) + 1
    assert z[0, got].min() > z[0, ~got].max()  # the most likely ones

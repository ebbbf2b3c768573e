"""Sigmoid verification (kernels/sigmoid.py, the paper's eq. 5) against an oracle of its own: the reference's
loops with p̂ = σ((z/T − α)/(β − α)) and q̂ in place of p and q (kernels/reference.verify_sigmoid_reference,
written from the formula in float64), decision for decision, for the torch twin and the Triton kernel (compiled
on a GPU, interpreted on a CPU), at T = 1 and T = 0.7. And the distance to the target that `specdec
verify-kernel --mode sigmoid` reports, against its closed form on a vocabulary of 8."""

import math

import pytest
import torch
from test_verify import assert_same, make_case

from conftest import DEVICE, on_device
from specdec_cli.bench import kernel_check
from specdec_cli.errors import NonFiniteLogitsError
from specdec_cli.kernels import sigmoid
from specdec_cli.kernels.reference import sigmoid_row, verify_sigmoid_reference

SIGMOID = {"torch": sigmoid.verify_sigmoid_torch, "triton": on_device(sigmoid.verify_sigmoid_triton)}

# (α, β): the default (every p̂ near σ(0.5): nearly everything accepted), then narrower, where p̂ and q̂ spread
# over (0, 1) and the residual max(0, p̂ − q̂) is drawn from often
CONSTANTS = [(-1e4, 1e4), (-10.0, 10.0), (-2.0, 2.0), (-0.5, 0.5)]


def test_sigmoid_row_is_the_formula():
    """A vocabulary of 4, by hand: z = α gives σ(0) = ½, z = β gives σ(1), a masked token 0; T divides z first."""
    alpha, beta = -2.0, 2.0
    got = sigmoid_row([-2.0, 2.0, -math.inf, 0.0], 1.0, alpha, beta)
    assert got == pytest.approx([0.5, 1 / (1 + math.exp(-1)), 0.0, 1 / (1 + math.exp(-0.5))], abs=1e-15)
    assert sigmoid_row([-1.4], 0.7, alpha, beta) == pytest.approx([0.5], abs=1e-15)  # −1.4 / 0.7 = α
    assert sigmoid_row([-1e6, 1e6], 1.0, -0.5, 0.5) == [0.0, 1.0]  # far out: no overflow
    with pytest.raises(NonFiniteLogitsError):
        sigmoid_row([0.0, math.nan], 1.0, alpha, beta)


def sigmoid_cases(seed):
    """(α, β, draft tokens, target logits, uniforms, draft logits): make_case's LM-like logits for each of
    CONSTANTS, and at the default constants logits 1000× larger too, so that the default rejects as well."""
    out = []
    for i, (alpha, beta) in enumerate(CONSTANTS):
        tokens, _, target, u, draft_logits = make_case(16, 4, 1000, seed=seed + i, overlap=0.3)
        out.append((alpha, beta, tokens, target, u, draft_logits))
    tokens, _, target, u, draft_logits = make_case(16, 4, 1000, seed=seed + 9, overlap=0.3, scale=4000.0)
    return out + [(-1e4, 1e4, tokens, target, u, draft_logits)]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_sigmoid_decides_as_the_plain_loop_oracle(impl, temperature):
    """5 cases of 16 sequences, γ = 4, V = 1000, one per (α, β) of CONSTANTS plus the default on logits of
    scale 4000: every sequence's accepted count and tokens are the oracle's."""
    rejected = []
    for alpha, beta, tokens, target, u, draft_logits in sigmoid_cases(seed=int(10 * temperature)):
        expected = verify_sigmoid_reference(tokens, draft_logits, target, u, temperature, alpha, beta)
        got = SIGMOID[impl](tokens, draft_logits, target, u, temperature, alpha, beta)
        assert_same(expected, got, f"sigmoid/{impl} α={alpha} β={beta} T={temperature}")
        rejected.append(int((expected.num_accepted < 4).sum()))
    # the default constants accept nearly everything on LM-like logits; every other case must draw residuals too
    assert all(r > 0 for r in rejected[1:]), rejected


def first_token_closed_form(p, q, alpha, beta):
    """P(first emitted token = y) when every row has target logits log p, draft logits log q and draft tokens
    drawn from q (kernel_check's distribution test, T = 1): the draft token x is accepted with chance
    min(1, p̂(x)/q̂(x)), else a token is drawn from max(0, p̂ − q̂) normalised (p̂ when that is all zero).
    -> (P [V], the acceptance chance Σ_x q(x)·min(1, p̂(x)/q̂(x)))."""
    p, q = p.double(), q.double()
    p_hat = torch.sigmoid((p.log() - alpha) / (beta - alpha))
    q_hat = torch.sigmoid((q.log() - alpha) / (beta - alpha))
    accept = q * (p_hat / q_hat).clamp(max=1.0)  # [V]: drafted and accepted
    residual = (p_hat - q_hat).clamp(min=0.0)
    residual = residual / residual.sum() if residual.sum() > 0 else p_hat / p_hat.sum()
    return accept + (1 - accept.sum()) * residual, float(accept.sum())


@pytest.mark.parametrize("alpha, beta", [(-0.5, 0.5), pytest.param(-2.0, 2.0, marks=pytest.mark.slow),
                                         pytest.param(-1e4, 1e4, marks=pytest.mark.slow)])
def test_sigmoid_distance_reported_is_the_closed_form(alpha, beta):
    """verify-kernel --mode sigmoid's figures on its vocabulary of 8, N = 20 000 draws (γ = 1): tv_to_target within
    ε of the closed form's TV, ε = ½·sqrt(2·(V·ln 2 + ln 10⁶)/N) = 0.022 (Bretagnolle–Huber–Carol: the empirical
    distribution is within ε of the true one, in TV, but once in 10⁶), and the acceptance rate within
    sqrt(ln(2·10⁶)/(2N)) = 0.019 of Σ q·min(1, p̂/q̂) (Hoeffding). The closed forms of seed 0 at (−0.5, 0.5)
    and (−2, 2), 0.054 and 0.376, move to 0.137 and 0.483 if the draft's probabilities were read as its logits."""
    n, V = 20_000, kernel_check.DIST_VOCAB
    report = kernel_check.run("sigmoid", vocab=64, gamma=1, batch=2, samples=n, alpha=alpha, beta=beta, cases=1,
                              seed=0, device=DEVICE)
    p, q = kernel_check._small_pair(0)
    P, acceptance = first_token_closed_form(p, q, alpha, beta)
    tv = 0.5 * float((P - p.double()).abs().sum())
    eps = 0.5 * math.sqrt(2 * (V * math.log(2) + math.log(1e6)) / n)
    f = report.figures
    assert report.passed, report.checks
    assert abs(f["tv_to_target"] - tv) <= eps, (f["tv_to_target"], tv, eps)
    assert abs(f["acceptance_rate_small_vocab"] - acceptance) <= math.sqrt(math.log(2e6) / (2 * n)), (f, acceptance)
    assert f["tv_draft_to_target"] == pytest.approx(0.5 * float((q - p).abs().sum()), abs=1e-6)

"""A deterministic draft (prompt lookup): draft_probs None means q one-hot at the draft tokens, in every
implementation. Decisions against the reference on the same randomness, the reference against itself given
the one-hot tensor written out, and the emitted tokens against the target's distribution."""

import pytest
import torch
from test_verify import EXACT, assert_fits_target, assert_same, make_case

from conftest import ON_GPU_ONLY
from specdec_cli.decoding.verify import verify
from specdec_cli.errors import SpecdecError
from specdec_cli.kernels.exact import verify_exact_torch
from specdec_cli.kernels.reference import verify_reference

IMPLS = {"reference": verify_reference, **EXACT}


def one_hot_case(B, gamma, V, seed, dtype=torch.float32):
    """make_case's target and uniforms; draft tokens half from the target's favourites, half anywhere."""
    tokens, _, target, u, _ = make_case(B, gamma, V, seed=seed, dtype=dtype)
    g = torch.Generator().manual_seed(seed + 1)
    favourite = target[:, :gamma].float().argmax(-1)  # [B, γ]
    pick = torch.rand(B, gamma, generator=g) < 0.5
    return torch.where(pick, favourite, tokens), target, u


@pytest.mark.parametrize("V", [7, 1000, 32000, pytest.param(151936, marks=pytest.mark.slow)])
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_one_hot_matches_reference(V, impl):
    for i, (B, gamma) in enumerate([(3, 5), (1, 1), (2, 8)] if V <= 32000 else [(1, 4), (2, 2)]):
        tokens, target, u = one_hot_case(B, gamma, V, seed=V + i)
        expected = verify_reference(tokens, None, target, u)
        assert_same(expected, IMPLS[impl](tokens, None, target, u), f"one-hot {impl} V={V} B={B} γ={gamma}")
        if V <= 1000:  # None is the one-hot tensor, written out
            q = torch.nn.functional.one_hot(tokens, V).float()  # [B, γ, V]
            assert_same(verify_reference(tokens, q, target, u), expected, "None vs the one-hot tensor")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_one_hot_low_precision_logits_and_temperature(dtype):
    for seed in range(3):
        tokens, target, u = one_hot_case(2, 4, 1000, seed=seed, dtype=dtype)
        expected = verify_reference(tokens, None, target, u, 0.7)
        for impl in ("torch", "triton"):
            assert_same(expected, IMPLS[impl](tokens, None, target, u, 0.7), f"{impl} {dtype}")


def test_baseline_decides_like_reference_with_one_hot():
    # baseline draws with torch.multinomial: the same decisions, the drawn token from the same distribution
    tokens, target, u = one_hot_case(16, 4, 500, seed=3)
    _, n_ref, *_ = verify_reference(tokens, None, target, u)
    assert torch.equal(verify("baseline", tokens, None, target, u).num_accepted, n_ref)


@pytest.mark.parametrize("impl", ["reference", "torch", "triton"])
def test_a_draft_token_the_target_never_emits_is_rejected(impl):
    tokens, target, _ = one_hot_case(4, 3, 50, seed=4)
    target = target.clone()
    target[:, 0].scatter_(-1, tokens[:, :1], float("-inf"))  # p(x) = 0 at the first position
    u = torch.full((4, 4), 1e-9)  # the smallest uniforms accept anything that can be accepted
    out, n, *_ = IMPLS[impl](tokens, None, target, u)
    assert (n == 0).all() and (out[:, 0] != tokens[:, 0]).all()


@pytest.mark.parametrize("impl", ["reference", "torch", "triton"])
def test_a_one_hot_target_at_the_draft_token_always_accepts(impl):
    tokens, target, _ = one_hot_case(3, 4, 40, seed=5)
    target = torch.full_like(target, float("-inf"))
    target.scatter_(-1, torch.cat([tokens, tokens[:, :1]], 1)[..., None], 0.0)  # p one-hot at x (and at the bonus)
    u = torch.ones(3, 5)  # the largest uniforms reject anything that can be rejected
    out, n, *_ = IMPLS[impl](tokens, None, target, u)
    assert (n == 4).all() and torch.equal(out[:, :4], tokens) and torch.equal(out[:, 4], tokens[:, 0])


def test_sigmoid_refuses_a_deterministic_draft_in_one_line():
    tokens, target, u = one_hot_case(1, 2, 10, seed=6)
    with pytest.raises(SpecdecError, match=r"sigmoid.*lookup") as e:
        verify("sigmoid", tokens, None, target, u)
    assert "\n" not in str(e.value)


# --- distribution: whatever the deterministic draft proposes, the first token is the target's -----------

P = {  # target p over a vocabulary of 6, and the proposal x (the same every draw, as a lookup would repeat it)
    "likely token": ([0.30, 0.25, 0.20, 0.15, 0.07, 0.03], 0),
    "unlikely token": ([0.30, 0.25, 0.20, 0.15, 0.07, 0.03], 5),
    "token with p = 0": ([0.5, 0.3, 0.2, 0.0, 0.0, 0.0], 4),
    "one-hot target at x": ([0.0, 0.0, 1.0, 0.0, 0.0, 0.0], 2),
    "one-hot target elsewhere": ([0.0, 1.0, 0.0, 0.0, 0.0, 0.0], 3),
}


def first_tokens(fn, p, x, n, seed, gamma=3):
    g = torch.Generator().manual_seed(seed)
    target = torch.log(torch.tensor(p)).expand(n, gamma + 1, -1).contiguous()  # log 0 = −inf: masked
    tokens = torch.full((n, gamma), x, dtype=torch.int64)
    tokens[:, 1:] = torch.randint(0, len(p), (n, gamma - 1), generator=g)  # later proposals: anything
    u = 1 - torch.rand(n, gamma + 1, generator=g)  # (0, 1]
    return fn(tokens, None, target, u)[0][:, 0]


@pytest.mark.slow
@pytest.mark.parametrize("case", P)
def test_one_hot_reproduces_target_distribution(case):
    # 200 000 draws; thresholds as for model drafts: TV < 0.005 (expected ≈ 0.002) and chi-square p > 1e-4
    p, x = P[case]
    n = 200_000
    freq = torch.bincount(first_tokens(verify_exact_torch, p, x, n, seed=7), minlength=6).double() / n
    assert_fits_target(freq, p, n, case)


def test_one_hot_baseline_reproduces_target_distribution():
    # 100 000 draws in calls of 2 000 (baseline seeds one multinomial per call); TV < 0.007 (expected ≈ 0.003)
    p, x = P["unlikely token"]
    n, out = 100_000, []
    for seed in range(50):
        out.append(first_tokens(lambda *a: (verify("baseline", *a).out_tokens,), p, x, 2000, seed=100 + seed))
    freq = torch.bincount(torch.cat(out), minlength=6).double() / n
    tv = 0.5 * (freq - torch.tensor(p, dtype=torch.float64)).abs().sum().item()
    assert tv < 0.007, f"TV {tv:.4f}"


@ON_GPU_ONLY
def test_one_hot_triton_reproduces_target_distribution():
    # 200 000 draws by the compiled kernel, the torch path's thresholds
    p, x = P["unlikely token"]
    n = 200_000
    freq = torch.bincount(first_tokens(EXACT["triton"], p, x, n, seed=9), minlength=6).double() / n
    assert_fits_target(freq, p, n, "unlikely token")

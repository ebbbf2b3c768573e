"""Every plan the Triton launcher can choose on a GPU, run on this machine under the interpreter.

exact._plan tiles the vocabulary in BLOCKs and splits each row over SPLITS programs. Under the interpreter it
picks BLOCK 4096 and at most 4 splits; on a GPU BLOCK 1024 and up to 64 splits, from the SM count and the rows
B·(γ+1) (51 at V = 51 865 and B = 1 on an H100). The split search of the draw and the reduction of the row
statistics across splits are what the GPU's plans add, so each plan is run here with exact.launch(plan=...),
decision for decision against the plain-loop reference: for each architecture of kernels/compile.ARCHS (the
plans `verify-kernel --compile-for` compiles) and each V of compile.GRID, every distinct (BLOCK, SPLITS, chunk)
that _plan gives over the GRID's B and γ. The kernels' code is the same whatever the plan; the plan only says
how much of a row each program covers, so a small case (B = 2, γ = 1) runs each one.
"""

import pytest
import torch

from conftest import DEVICE
from specdec_cli.kernels import exact
from specdec_cli.kernels.compile import ARCHS, GRID
from specdec_cli.kernels.reference import verify_reference, verify_sigmoid_reference


def gpu_plans(V: int) -> dict[tuple[int, int, int], list[str]]:
    """{(BLOCK, SPLITS, chunk): the architectures whose launcher gives it} for every plan exact._plan gives at
    vocabulary V on each of ARCHS, over the GRID's B (architectures share many: each is run once)."""
    plans: dict[tuple[int, int, int], list[str]] = {}
    for arch, (_, sms) in ARCHS.items():
        for plan in {exact._plan(V, B, None, False, sms=sms) for B in GRID["B"]}:
            plans.setdefault(plan, []).append(arch)
    return dict(sorted(plans.items()))


def plan_case(V: int, seed: int):
    """B = 2, γ = 1, LM-like logits (scale 4: a few tokens carry each row's mass, wherever they fall in the
    vocabulary). Row 0's draft is the target itself, its token the target's favourite and its acceptance uniform
    ≤ 0.01 (the token accepted, by a deterministic draft too: the bonus row is drawn); row 1's draft another
    distribution and its uniform ≥ 0.99 (mostly a rejection: the residual is drawn).
    -> (draft tokens [2, 1], draft probs [2, 1, V], target logits [2, 2, V], uniforms [2, 2], draft logits)."""
    g = torch.Generator().manual_seed(seed)
    target = 4.0 * torch.randn(2, 2, V, generator=g)  # [B, γ+1, V]
    draft_logits = torch.cat([target[:1, :1], 4.0 * torch.randn(1, 1, V, generator=g)])  # [B, γ, V]
    probs = draft_logits.softmax(-1)
    tokens = torch.multinomial(probs.reshape(-1, V), 1, generator=g).reshape(2, 1)
    tokens[0, 0] = target[0, 0].argmax()
    u = 1 - torch.rand(2, 2, generator=g)
    u[0, 0] *= 0.01
    u[1, 0] = 1 - 0.01 * u[1, 0]
    return tokens, probs, target, u, draft_logits


def run_plan(mode, case, plan):
    """(the plain-loop oracle's Verification, exact.launch's (out, counts) under `plan`, on the CPU) for `mode`.
    The launch runs where conftest.DEVICE says: interpreted on a CPU, compiled on a GPU."""
    tokens, probs, target, u, draft_logits = case
    on = [t.to(DEVICE) for t in case]
    if mode == "sigmoid":  # α = −2, β = 2: p̂, q̂ spread over (0, 1), so it rejects
        expected = verify_sigmoid_reference(tokens, draft_logits, target, u, 1.0, -2.0, 2.0)
        got = exact.launch(on[0], on[4], on[2], on[3], 1.0, sigmoid=True, alpha=-2.0, beta=2.0, plan=plan)
    else:
        expected = verify_reference(tokens, None if mode == "one-hot" else probs, target, u)
        got = exact.launch(on[0], None if mode == "one-hot" else on[1], on[2], on[3], 1.0, sigmoid=False, plan=plan)
    return expected, tuple(t.cpu() for t in got)


def tiers():
    """(V, mode): exact at 32 000 and 51 865 in the fast tier (~6 and ~11 s), at every V of the GRID in the slow
    one (~40 and ~80 s: the interpreter pays ~3 ms a tile); the one-hot and sigmoid paths of stage 2 and its draw at
    32 000 and 51 865, slow too (~8 s each)."""
    fast = [pytest.param(V, "exact") for V in (32000, 51865)]
    slow = [(V, "exact") for V in GRID["V"] if V > 51865] + [(V, m) for V in (32000, 51865) for m in ("one-hot", "sigmoid")]
    return fast + [pytest.param(*p, marks=pytest.mark.slow) for p in slow]


@pytest.mark.parametrize("V, mode", tiers())
def test_every_gpu_plan_decides_as_the_reference(V, mode):
    """Each plan of gpu_plans(V) on plan_case: the launcher's tokens and counts are the plain-loop reference's
    (exact with the draft's probabilities, exact with a deterministic draft, sigmoid against its oracle); the
    bonus row is drawn in row 0, a residual in row 1 (of most cases)."""
    plans = gpu_plans(V)
    # the plans cover every architecture, many splits, and splits that scan more than one tile
    assert {block for block, _, _ in plans} == {1024} and max(s for _, s, _ in plans) >= 16, plans
    assert any(chunk > block for block, _, chunk in plans) and {a for archs in plans.values() for a in archs} == set(ARCHS)
    residuals = 0
    for i, plan in enumerate(plans):
        expected, (out, (n, error)) = run_plan(mode, plan_case(V, seed=i), plan)
        what = f"{mode} V={V} (BLOCK, SPLITS, chunk)={plan} of {'/'.join(plans[plan])}"
        bad = (expected.out_tokens != out).any(dim=1).nonzero()[:, 0].tolist()
        assert not bad, f"{what}: rows {bad} differ: reference {expected.out_tokens.tolist()} vs {out.tolist()}"
        assert torch.equal(expected.num_accepted, n) and not error.any(), what
        assert expected.num_accepted[0] == 1, "row 0 reaches its bonus token"
        residuals += int(expected.num_accepted[1] == 0)
    assert residuals >= len(plans) // 2, "most cases draw a residual in row 1"


@pytest.mark.parametrize("mode", ["exact", "sigmoid"])
def test_steps_of_one_shape_share_a_workspace_and_each_decides_as_the_reference(mode):
    """Three steps of one shape (V = 5 003 in 5 splits of 1 024) on new logits and uniforms: one workspace serves all
    three (exact._STEPS holds one entry for them), and each step's tokens and counts are the reference's. The
    drawing split puts the workspace's count back to 0: without that, the second step's last split would never see
    SPLITS − 1, and nothing would be drawn."""
    plan = (1024, 5, 1024)
    exact._STEPS.clear()
    for seed in range(3):
        expected, (out, (n, error)) = run_plan(mode, plan_case(5003, seed=100 + seed), plan)
        assert torch.equal(expected.out_tokens, out) and torch.equal(expected.num_accepted, n), (mode, seed)
        assert not error.any()
    assert len(exact._STEPS) == 1

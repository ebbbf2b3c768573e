"""`specdec verify-kernel` through the CLI: exit codes, JSON fields, one-line errors."""

import json

import pytest
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.kernels import triton_backend_name

runner = CliRunner()


def test_exact_passes_and_reports_json():
    r = runner.invoke(app, ["verify-kernel", "--mode", "exact", "--vocab", "1000", "--gamma", "3", "--batch", "2",
                            "--samples", "20000", "--cases", "2", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["mode"] == "exact" and report["passed"] is True
    assert report["backend"] == triton_backend_name()
    assert {c["name"] for c in report["checks"]} >= {"exact kernel = reference", "output ~ target distribution"}
    assert 0 <= report["figures"]["acceptance_rate"] <= 1
    assert report["figures"]["tv_to_target"] < 0.02


def test_sigmoid_reports_how_far_it_moves_the_output():
    r = runner.invoke(app, ["verify-kernel", "--mode", "sigmoid", "--vocab", "500", "--gamma", "2", "--batch", "2",
                            "--samples", "5000", "--cases", "2", "--json"])
    assert r.exit_code == 0, r.output
    fig = json.loads(r.stdout)["figures"]
    for key in ("tv_to_target", "tv_exact_to_target", "acceptance_rate", "acceptance_rate_exact"):
        assert key in fig
    assert fig["tv_to_target"] > fig["tv_exact_to_target"], "with α=−1e4, β=1e4 sigmoid must be further from the target"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--vocab", "1"], "--vocab"),
        (["--gamma", "0"], "--gamma"),
        (["--samples", "0"], "--samples"),
        (["--alpha", "3", "--beta", "3"], "--alpha"),
        (["--mode", "fast"], "--mode"),
        (["--device", "tpu"], "--device"),
    ],
)
def test_bad_options_exit_2_with_one_line(args, message):
    r = runner.invoke(app, ["verify-kernel", *args])
    assert r.exit_code == 2
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.output


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["exact", "sigmoid"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_kernel_compiles_for_the_gpus_without_one(mode, arch):
    """Triton compiles each plan the launcher can choose, fp32/bf16/fp16, to cubin here; ptxas reports."""
    r = runner.invoke(app, ["verify-kernel", "--mode", mode, "--compile-for", arch, "--json"])
    report = json.loads(r.stdout)
    failed = [k for k in report["kernels"] if not k["ok"]]
    assert r.exit_code == 0 and report["passed"] and not failed, failed[:3]
    kernels = {(k["kernel"], k["dtype"]) for k in report["kernels"]}
    stages = ({"_row_stats_kernel"} if mode == "exact" else set()) | {"_accept_draw_kernel"}
    assert kernels == {(s, d) for s in stages for d in ("float32", "bfloat16", "float16")}
    assert all(k["registers"] and k["spill_bytes"] == 0 and k["cubin_bytes"] > 0 for k in report["kernels"])
    assert len({(k["constexprs"].get("GAMMA_P2"), k["constexprs"].get("SPLITS_P2")) for k in report["kernels"]}) > 10


def test_a_rounding_tie_is_told_from_a_mismatch():
    """verify-kernel's decision check lets a GPU's token differ from the torch path's only where fp64 says the
    threshold sits on the boundary between them (kernel_check._rounding_tie): a neighbour across the boundary, or
    an acceptance whose u·q(x) is p(x), is a tie; a token further along the CDF is a mismatch."""
    import torch

    from specdec_cli.bench.kernel_check import _rounding_tie
    from specdec_cli.kernels.contract import PAD

    g = torch.Generator().manual_seed(0)
    z = torch.randn(1, 2, 16, generator=g, dtype=torch.float64) * 2  # [B=1, γ+1, V]
    q = torch.softmax(torch.randn(1, 1, 16, generator=g, dtype=torch.float64) * 2, -1)  # [B, γ, V]
    p = torch.softmax(z, -1)
    x = int((q[0, 0] - p[0, 0]).argmax())  # q(x) > p(x): u = 1 rejects it
    w = torch.clamp(p[0, 0] - q[0, 0], min=0)
    W = torch.cumsum(w, 0)
    positive = w.gt(0).nonzero()[:, 0].tolist()
    assert len(positive) >= 4
    a, b, far = positive[0], positive[1], positive[3]
    u = torch.tensor([[1.0, float(W[a] / W[-1])]], dtype=torch.float64)  # the draw's threshold on a's upper edge
    case = (torch.tensor([[x]]), q.float(), z.float(), u.float())
    row = lambda t: torch.tensor([t, PAD])  # noqa: E731
    assert _rounding_tie(case, row(a), row(b), 0)
    assert not _rounding_tie(case, row(a), row(far), 0)
    u_tie = torch.tensor([[float(p[0, 0, x] / q[0, 0, x]), 0.5]])  # u·q(x) = p(x): accept or reject
    assert _rounding_tie((case[0], case[1], case[2], u_tie), torch.tensor([x, 3]), row(a), 0)
    u_clear = torch.tensor([[0.01, 0.5]])  # clearly accepted: x was the only answer at position 0
    assert not _rounding_tie((case[0], case[1], case[2], u_clear), torch.tensor([x, 3]), row(a), 0)

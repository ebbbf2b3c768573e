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
    stages = ({"_row_stats_kernel"} if mode == "exact" else set()) | {"_accept_weights_kernel", "_draw_kernel"}
    assert kernels == {(s, d) for s in stages for d in ("float32", "bfloat16", "float16")}
    assert all(k["registers"] and k["spill_bytes"] == 0 and k["cubin_bytes"] > 0 for k in report["kernels"])
    assert len({(k["constexprs"].get("GAMMA_P2"), k["constexprs"].get("SPLITS_P2")) for k in report["kernels"]}) > 10

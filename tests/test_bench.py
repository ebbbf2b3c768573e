"""`specdec bench`: the synthetic benchmark through the CLI (fields, ratios, files), one-line errors, and the
task framework (aggregation, Leviathan's prediction, outputs) on a fake task runner."""

import csv
import json
import math
import os

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from specdec_cli import bench
from specdec_cli.cli import app

runner = CliRunner()
TINY = ["bench", "--task", "synthetic", "--vocab", "1000", "--gamma", "1,3", "--batch", "1", "--repeat", "3",
        "--device", "cpu"]


@pytest.fixture(autouse=True)
def one_thread():
    """Structure, not speed, is tested here: one thread keeps a busy machine from stalling torch's pool."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One CLI run of the tiny grid writing every output; shared by the tests that read them."""
    d = tmp_path_factory.mktemp("bench")
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        r = runner.invoke(app, [*TINY, "--json", "--out", str(d / "r.json"), "--csv", str(d / "r.csv"),
                                "--plot", str(d / "plots")])
    finally:
        torch.set_num_threads(saved)
    return r, d


def _lines(r):
    return [line for line in r.output.splitlines() if line.strip()]


def test_synthetic_json_has_every_table_field(tiny_run):
    r, _ = tiny_run
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["task"] == "synthetic"
    results = out["results"]
    # grid: 2 γ × (baseline, exact, sigmoid, hf at B = 1)
    assert {(x["gamma"], x["mode"]) for x in results} == {(g, m) for g in (1, 3) for m in bench.SYNTHETIC_MODES}
    for x in results:
        for key, _header in bench.SYNTHETIC_COLUMNS:
            assert key in x, key
        assert x["vocab"] == 1000 and x["batch"] == 1 and x["n"] >= 3 and x["median_ms"] > 0
        assert x["p10_ms"] <= x["median_ms"] <= x["p90_ms"]
        assert 0.0 <= x["acceptance_rate"] <= 1.0 and x["calls"] >= 8
        assert x["gb_per_s"] is None  # CPU: no bandwidth figure
    backends = {x["mode"]: x["backend"] for x in results}
    assert backends == {"baseline": "torch", "exact": "torch", "sigmoid": "torch", "hf": "transformers"}
    assert out["machine"]["versions"]["torch"] == torch.__version__
    assert out["command"].startswith("specdec bench --task synthetic --vocab 1000 --gamma 1,3 --batch 1")


def test_synthetic_ratios_are_consistent(tiny_run):
    r, _ = tiny_run
    results = json.loads(r.stdout)["results"]
    for g in (1, 3):
        point = {x["mode"]: x for x in results if x["gamma"] == g}
        for x in point.values():
            assert x["speedup_vs_baseline"] == pytest.approx(point["baseline"]["median_ms"] / x["median_ms"])
            assert x["speedup_vs_hf"] == pytest.approx(point["hf"]["median_ms"] / x["median_ms"])
        assert point["baseline"]["speedup_vs_baseline"] == pytest.approx(1.0)


def test_synthetic_acceptance_matches_between_exact_modes(tiny_run):
    """baseline and exact see the same uniforms call for call, so they accept the same draft tokens."""
    r, _ = tiny_run
    results = json.loads(r.stdout)["results"]
    for g in (1, 3):
        point = {x["mode"]: x for x in results if x["gamma"] == g}
        assert point["baseline"]["calls"] == point["exact"]["calls"] >= 8  # every round calls every provider
        assert point["baseline"]["acceptance_rate"] == point["exact"]["acceptance_rate"]
        assert 0.0 < point["exact"]["expected_acceptance_rate"] <= 1.0
        assert point["exact"]["mean_accepted_per_call"] == pytest.approx(point["exact"]["acceptance_rate"] * g)


def test_synthetic_files_exist_and_parse(tiny_run):
    r, d = tiny_run
    saved = json.loads((d / "r.json").read_text())
    assert saved["results"] == json.loads(r.stdout)["results"]
    m = saved["machine"]
    for key in ("date", "device_name", "cpu", "torch_threads", "cpu_count"):
        assert m[key], key
    assert set(m["versions"]) >= {"torch", "triton", "transformers", "specdec"} and "git" in m
    assert saved["config"]["gammas"] == [1, 3]

    rows = list(csv.DictReader((d / "r.csv").open()))
    assert len(rows) == len(saved["results"]) == 8  # one row per (grid point, mode)
    assert {row["mode"] for row in rows} == set(bench.SYNTHETIC_MODES)
    assert float(rows[0]["median_ms"]) == pytest.approx(saved["results"][0]["median_ms"])

    pngs = sorted(p.name for p in (d / "plots").glob("*.png"))
    assert pngs == ["synthetic-cpu-speedup-vs-gamma.png", "synthetic-cpu-time-vs-gamma.png"]
    for name in pngs:
        assert (d / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_synthetic_table_on_stderr():
    r = runner.invoke(app, [*TINY, "--gamma", "2", "--modes", "baseline,exact"])
    assert r.exit_code == 0, r.output
    assert "ms/step" in r.stderr and "×base" in r.stderr and "exact" in r.stderr
    assert r.stdout == ""  # results go to stderr unless --json


def test_hf_only_at_batch_1():
    r = runner.invoke(app, [*TINY, "--gamma", "2", "--batch", "2", "--modes", "baseline,exact,hf", "--json"])
    assert r.exit_code == 0, r.output
    results = json.loads(r.stdout)["results"]
    assert {x["mode"] for x in results} == {"baseline", "exact"}
    assert all(x["speedup_vs_hf"] is None for x in results)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--gamma", ""], "--gamma"),
        (["--gamma", "0"], "--gamma"),
        (["--gamma", "33"], "--gamma"),
        (["--gamma", "1,x"], "--gamma"),
        (["--vocab", "1"], "--vocab"),
        (["--vocab", ","], "--vocab"),
        (["--batch", "0"], "--batch"),
        (["--modes", "exact,fast"], "--modes"),
        (["--modes", ""], "--modes"),
        (["--modes", "hf", "--batch", "8"], "batch 1"),
        (["--task", "translate"], "--task"),
        (["--repeat", "0"], "--repeat"),
        (["--dtype", "int8"], "--dtype"),
        (["--backend", "cuda"], "--backend"),
        (["--overlap", "0"], "--overlap"),
        (["--threads", "0"], "--threads"),
        (["--device", "tpu"], "--device"),
        (["--task", "summarize"], "not available yet"),
        (["--task", "transcribe"], "not available yet"),
    ],
)
def test_bad_options_exit_2_with_one_line(args, message):
    r = runner.invoke(app, [*TINY, *args])
    assert r.exit_code == 2, r.output
    lines = _lines(r)
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.output, r.output


def test_triton_on_cpu_warns():
    assert any("interpreter" in w for w in bench.warnings_for(
        bench.SyntheticConfig([1000], [1], [1], ["exact"], backend="triton", device="cpu")))


def test_wide_spread_is_reported():
    def rec(p10, p90):
        return bench.SyntheticRecord(
            vocab=10, batch=1, gamma=1, mode="exact", backend="torch", dtype="float32", device="cpu", median_ms=p10,
            p10_ms=p10, p90_ms=p90, mean_ms=p10, std_ms=0.0, min_ms=p10, n=3, speedup_vs_baseline=1.0,
            speedup_vs_hf=None, acceptance_rate=1.0, mean_accepted_per_call=1.0, expected_acceptance_rate=1.0,
            calls=8, bytes=1, gb_per_s=None, peak_extra_mib=None, case_overlap=0.8, case_target_entropy=1.0)

    assert bench.spread_warnings([rec(1.0, 2.0)]) == []
    (w,) = bench.spread_warnings([rec(1.0, 2.0), rec(1.0, 10.0)])
    assert w.startswith("1 of 2 timings spread widely")
    busy = rec(1.0, 2.0)
    busy.others_cpu = 0.4
    (w,) = bench.spread_warnings([busy])
    assert "while 1 grid point(s) were timed: V=10 B=1 γ=1 (40%)" in w


def test_others_cpu_share():
    assert bench._others_cpu((10.0, 1.0, 100.0), (12.0, 2.0, 101.0)) == pytest.approx(1.0 / (os.cpu_count() or 1))
    assert bench._others_cpu((10.0, 1.0, 100.0), (11.0, 2.0, 101.0)) == 0.0  # all the busy time was ours
    assert bench._others_cpu(None, (1.0, 1.0, 1.0)) is None
    clock = bench._cpu_clock()
    assert clock is None or (clock[0] >= 0 and clock[1] >= 0)


def test_byte_model():
    B, G, V = 2, 5, 32000
    # exact: every target row once in its dtype, plus one target row and one fp32 draft row per sequence
    assert bench.bytes_per_step("exact", B, G, V, 2) == B * (G + 1) * V * 2 + B * V * 2 + B * V * 4
    assert bench.bytes_per_step("sigmoid", B, G, V, 4) == B * V * 8
    assert bench.bytes_per_step("baseline", B, G, V, 4) > 5 * bench.bytes_per_step("exact", B, G, V, 4)
    with pytest.raises(ValueError):
        bench.bytes_per_step("reference", B, G, V, 4)


# ------------------------------------------------------------------------------------ the task framework


def _alpha_from_mean_accepted(m, g):
    """Solve α + α² + ... + α^γ = m by polynomial roots (independently of speedup.py's bisection)."""
    roots = np.roots([1.0] * g + [-m])  # α^γ + ... + α − m = 0
    real = [r.real for r in roots if abs(r.imag) < 1e-9 and 0 <= r.real <= 1]
    assert len(real) == 1
    return real[0]


def _fake_records(task="summarize"):
    """Made-up measurements: autoregressive at 10 tok/s with a 100 ms target step; draft 10 ms/forward."""
    quality = {"rouge1": 0.31, "rouge2": 0.11, "rougeL": 0.22} if task == "summarize" else {"wer": 0.08}

    def rec(gamma, mode, tps, mean_acc, draft_ms):
        return bench.TaskRecord(
            task=task, gamma=gamma, mode=mode, new_tokens=200, wall_s=200 / tps, tokens_per_s=tps,
            acceptance_rate=None if mean_acc is None else mean_acc / gamma, mean_accepted_per_call=mean_acc,
            verify_ms_per_call=None if mode == "autoregressive" else 1.5, draft_ms_per_forward=draft_ms,
            target_ms_per_forward=100.0 if mode == "autoregressive" else 120.0, peak_memory_mib=900.0,
            quality=dict(quality),
        )

    return [
        rec(0, "autoregressive", 10.0, None, None),
        rec(1, "exact", 14.0, 0.7, 10.0),
        rec(3, "exact", 20.0, 1.6, 10.0),
        rec(3, "baseline", 19.0, 1.6, 10.0),
        rec(5, "exact", 22.0, 5.0, 10.0),  # every draft accepted: α = 1
    ]


def test_aggregate_predicted_speedup_arithmetic():
    recs = {(r.gamma, r.mode): r for r in bench.aggregate(_fake_records())}
    ar = recs[(0, "autoregressive")]
    assert ar.speedup == 1.0 and ar.predicted_speedup is None

    r = recs[(3, "exact")]
    assert r.speedup == pytest.approx(2.0)  # 20 tok/s over 10 tok/s
    assert r.cost_ratio == pytest.approx(0.1)  # 10 ms draft / the autoregressive 100 ms target step
    alpha = _alpha_from_mean_accepted(1.6, 3)
    assert r.alpha == pytest.approx(alpha, abs=1e-9)
    assert r.predicted_speedup == pytest.approx((1 - alpha**4) / ((1 - alpha) * (3 * 0.1 + 1)))

    r1 = recs[(1, "exact")]  # γ = 1: α is the mean accepted itself; speedup (1 + α) / (1 + c)
    assert r1.alpha == pytest.approx(0.7) and r1.predicted_speedup == pytest.approx(1.7 / 1.1)

    r5 = recs[(5, "exact")]  # α = 1: all γ + 1 tokens every call
    assert r5.alpha == 1.0 and r5.predicted_speedup == pytest.approx(6 / 1.5)
    assert r5.best_gamma == bench.MAX_GAMMA  # nothing is ever rejected: longer drafts keep helping

    # best γ is the argmax of the model's speedup over 1..32
    best = max(range(1, 33), key=lambda g: (1 - alpha ** (g + 1)) / ((1 - alpha) * (g * 0.1 + 1)))
    assert r.best_gamma == best


def test_aggregate_without_autoregressive_uses_the_records_own_target_step():
    recs = [r for r in _fake_records() if r.mode != "autoregressive"]
    r = next(x for x in bench.aggregate(recs) if (x.gamma, x.mode) == (3, "exact"))
    assert r.speedup is None and r.cost_ratio == pytest.approx(10.0 / 120.0)


@pytest.mark.parametrize("task", ["summarize", "transcribe"])
def test_fake_task_runner_through_the_cli(task, monkeypatch, tmp_path):
    seen = {}

    def fake_runner(config, progress):
        seen["config"] = config
        for _ in range(bench.total_steps(config)):
            progress("step")
        return _fake_records(task)

    monkeypatch.setitem(bench.TASK_RUNNERS, task, fake_runner)
    r = runner.invoke(app, ["bench", "--task", task, "--gamma", "1,3,5", "--modes", "baseline,exact", "--device", "cpu",
                            "--json", "--out", str(tmp_path / "t.json"), "--csv", str(tmp_path / "t.csv"),
                            "--plot", str(tmp_path)])
    assert r.exit_code == 0, r.output
    cfg = seen["config"]
    assert cfg.task == task and cfg.gammas == [1, 3, 5] and cfg.modes == ["baseline", "exact"]

    out = json.loads(r.stdout)
    assert out["task"] == task and len(out["results"]) == 5
    row = next(x for x in out["results"] if (x["gamma"], x["mode"]) == (3, "exact"))
    for key, _ in bench.TASK_COLUMNS:
        assert key in row, key
    assert row["speedup"] == pytest.approx(2.0) and row["predicted_speedup"] > 1
    assert set(row["quality"]) == ({"rouge1", "rouge2", "rougeL"} if task == "summarize" else {"wer"})

    assert json.loads((tmp_path / "t.json").read_text())["results"] == out["results"]
    rows = list(csv.DictReader((tmp_path / "t.csv").open()))
    assert len(rows) == 5 and ("quality_rouge1" in rows[0] or "quality_wer" in rows[0])
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [f"{task}-cpu-acceptance-vs-gamma.png",
                                                               f"{task}-cpu-speedup-vs-gamma.png"]

    r = runner.invoke(app, ["bench", "--task", task, "--gamma", "1,3,5", "--modes", "exact", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert "predicted" in r.stderr and "speedup" in r.stderr


def test_score_quality():
    q = bench.score_quality("summarize", ["the cat sat on the mat"], ["the cat sat on the mat"])
    assert q == pytest.approx({"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0})
    assert bench.score_quality("transcribe", ["hello word"], ["Hello, world."]) == {"wer": 0.5}
    assert not math.isnan(bench.score_quality("transcribe", ["a b"], ["a b"])["wer"])

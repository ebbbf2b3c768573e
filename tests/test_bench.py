"""`specdec bench`: the synthetic benchmark through the CLI (fields, ratios, files), one-line errors, the
task framework (aggregation, Leviathan's prediction, outputs) on a fake task runner, and the summarize and
transcribe tasks end to end on tiny random models saved locally (arithmetic, ROUGE/WER wiring, files)."""

import csv
import json
import math
import mmap
import os
import sys

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from conftest import ROOT, torch_threads
from specdec_cli import options
from specdec_cli.bench import config, contenders, harness, machine, runners, synthetic
from specdec_cli.bench.results import BenchResults
from specdec_cli.cli import app
from specdec_cli.errors import SpecdecError

runner = CliRunner()
EXAMPLE_WAV = os.path.join(os.path.dirname(__file__), "..", "examples", "audio", "librivox-sense-and-sensibility-0870.wav")
TINY = ["bench", "--task", "synthetic", "--vocab", "1000", "--gamma", "1,3", "--batch", "1", "--repeat", "3",
        "--device", "cpu"]


@pytest.fixture(autouse=True)
def one_thread():
    """Structure, not speed, is tested here: one thread keeps a busy machine from stalling torch's pool."""
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One CLI run of the tiny grid writing every output; shared by the tests that read them."""
    d = tmp_path_factory.mktemp("bench")
    with torch_threads(1):
        r = runner.invoke(app, [*TINY, "--json", "--out", str(d / "r.json"), "--csv", str(d / "r.csv"),
                                "--plot", str(d / "plots")])
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
    assert {(x["gamma"], x["mode"]) for x in results} == {(g, m) for g in (1, 3) for m in config.DEFAULT_SYNTHETIC_MODES}
    for x in results:
        for key, _header in synthetic.SYNTHETIC_COLUMNS:
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
    assert {row["mode"] for row in rows} == set(config.DEFAULT_SYNTHETIC_MODES)
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
        (["--gamma-schedule", "auto"], "--gamma-schedule is for --task summarize or transcribe"),
        (["--threads", "1,2"], "one count for --task synthetic"),
        (["--dtype", "int8"], "--dtype"),
        (["--backend", "cuda"], "--backend"),
        (["--overlap", "0"], "--overlap"),
        (["--threads", "0"], "--threads"),
        (["--device", "tpu"], "--device"),
        (["--data", "."], "--data is for --task summarize or transcribe"),
    ],
)
def test_bad_options_exit_2_with_one_line(args, message):
    r = runner.invoke(app, [*TINY, *args])
    assert r.exit_code == 2, r.output
    lines = _lines(r)
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.output, r.output


def test_triton_on_cpu_warns():
    assert any("interpreter" in w for w in config.warnings_for(
        config.SyntheticConfig([1000], [1], [1], ["exact"], backend="triton", device="cpu")))


def test_wide_spread_is_reported():
    def rec(p10, p90):
        return synthetic.SyntheticRecord(
            vocab=10, batch=1, gamma=1, mode="exact", backend="torch", dtype="float32", device="cpu", median_ms=p10,
            p10_ms=p10, p90_ms=p90, mean_ms=p10, std_ms=0.0, min_ms=p10, n=3, speedup_vs_baseline=1.0,
            speedup_vs_hf=None, acceptance_rate=1.0, mean_accepted_per_call=1.0, expected_acceptance_rate=1.0,
            calls=8, bytes=1, gb_per_s=None, peak_extra_mib=None, case_overlap=0.8, case_target_entropy=1.0)

    assert synthetic.spread_warnings([rec(1.0, 2.0)]) == []
    (w,) = synthetic.spread_warnings([rec(1.0, 2.0), rec(1.0, 10.0)])
    assert w.startswith("1 of 2 timings spread widely")
    busy = rec(1.0, 2.0)
    busy.others_cpu = 0.4
    (w,) = synthetic.spread_warnings([busy])
    assert "while 1 grid point(s) were timed: V=10 B=1 γ=1 (40%)" in w


def test_others_cpu_share():
    assert machine.others_cpu((10.0, 1.0, 100.0), (12.0, 2.0, 101.0)) == pytest.approx(1.0 / (os.cpu_count() or 1))
    assert machine.others_cpu((10.0, 1.0, 100.0), (11.0, 2.0, 101.0)) == 0.0  # all the busy time was ours
    assert machine.others_cpu(None, (1.0, 1.0, 1.0)) is None
    clock = machine.cpu_clock()
    assert clock is None or (clock[0] >= 0 and clock[1] >= 0)


def test_byte_model():
    B, G, V = 2, 5, 32000
    # exact: every target row once in its dtype, plus one target row and one fp32 draft row per sequence
    assert synthetic.bytes_per_step("exact", B, G, V, 2) == B * (G + 1) * V * 2 + B * V * 2 + B * V * 4
    assert synthetic.bytes_per_step("sigmoid", B, G, V, 4) == B * V * 8
    assert synthetic.bytes_per_step("baseline", B, G, V, 4) > 5 * synthetic.bytes_per_step("exact", B, G, V, 4)
    with pytest.raises(ValueError):
        synthetic.bytes_per_step("reference", B, G, V, 4)


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
        return contenders.TaskRecord(
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
    recs = {(r.gamma, r.mode): r for r in contenders.aggregate(_fake_records())}
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
    assert r5.best_gamma == options.MAX_GAMMA  # nothing is ever rejected: longer drafts keep helping

    # best γ is the argmax of the model's speedup over 1..32
    best = max(range(1, 33), key=lambda g: (1 - alpha ** (g + 1)) / ((1 - alpha) * (g * 0.1 + 1)))
    assert r.best_gamma == best


def test_aggregate_without_autoregressive_uses_the_records_own_target_step():
    recs = [r for r in _fake_records() if r.mode != "autoregressive"]
    r = next(x for x in contenders.aggregate(recs) if (x.gamma, x.mode) == (3, "exact"))
    assert r.speedup is None and r.cost_ratio == pytest.approx(10.0 / 120.0)


@pytest.mark.parametrize("task", ["summarize", "transcribe"])
def test_fake_task_runner_through_the_cli(task, monkeypatch, tmp_path):
    seen = {}

    def fake_runner(config, progress):
        seen["config"] = config
        for _ in range(harness.total_steps(config)):
            progress("step")
        return _fake_records(task)

    monkeypatch.setattr(runners, "run_task", fake_runner)
    r = runner.invoke(app, ["bench", "--task", task, "--gamma", "1,3,5", "--modes", "baseline,exact", "--device", "cpu",
                            "--json", "--out", str(tmp_path / "t.json"), "--csv", str(tmp_path / "t.csv"),
                            "--plot", str(tmp_path)])
    assert r.exit_code == 0, r.output
    cfg = seen["config"]
    assert cfg.task == task and cfg.gammas == [1, 3, 5] and cfg.modes == ["baseline", "exact"]

    out = json.loads(r.stdout)
    assert out["task"] == task and len(out["results"]) == 5
    row = next(x for x in out["results"] if (x["gamma"], x["mode"]) == (3, "exact"))
    for key, _ in contenders.TASK_COLUMNS:
        assert key in row, key
    assert row["speedup"] == pytest.approx(2.0) and row["predicted_speedup"] > 1
    assert set(row["quality"]) == ({"rouge1", "rouge2", "rougeL"} if task == "summarize" else {"wer"})

    assert json.loads((tmp_path / "t.json").read_text())["results"] == out["results"]
    rows = list(csv.DictReader((tmp_path / "t.csv").open()))
    assert len(rows) == 5 and ("quality_rouge1" in rows[0] or "quality_wer" in rows[0])
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [f"{task}-cpu-{k}-vs-gamma.png"
                                                               for k in ("acceptance", "speedup", "verify")]

    r = runner.invoke(app, ["bench", "--task", task, "--gamma", "1,3,5", "--modes", "exact", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert "predicted" in r.stderr and "speedup" in r.stderr


def test_score_quality():
    q = contenders.score_quality("summarize", ["the cat sat on the mat"], ["the cat sat on the mat"])
    assert q == pytest.approx({"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0})
    assert contenders.score_quality("transcribe", ["hello word"], ["Hello, world."]) == {"wer": 0.5}
    assert not math.isnan(contenders.score_quality("transcribe", ["a b"], ["a b"])["wer"])


def test_a_task_without_runner_is_refused(monkeypatch):
    monkeypatch.delitem(runners.RUNNERS, "summarize")
    r = runner.invoke(app, ["bench", "--task", "summarize", "--device", "cpu"])
    assert r.exit_code == 2 and _lines(r) == ["error: --task summarize: no runner is registered for it (choose from transcribe)"]


# ------------------------------------------------------------------------- the tasks on tiny models

ARTICLES = {  # name -> (article, reference); words of the tiny word-level tokenizer (test_models.WORDS)
    "a": (" ".join(f"w{(i * 37) % 900 + 2}" for i in range(50)), "w39 w76 w113 w150"),
    "b": (" ".join(f"w{(i * 53) % 900 + 2}" for i in range(40)), "w55 w108 w2 w7 w9"),
}


@pytest.fixture(scope="module")
def tiny_llama(tiny_llama_dir):
    return tiny_llama_dir


@pytest.fixture(scope="module")
def articles_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    (d / "articles").mkdir()
    for name, (text, ref) in ARTICLES.items():
        (d / "articles" / f"{name}.txt").write_text(text)
        (d / "articles" / f"{name}.ref.txt").write_text(ref + "\n")
    return d


def task_args(task, model, data, *extra):
    return ["bench", "--task", task, "--data", str(data), "--target", str(model), "--device", "cpu", "--dtype",
            "float32", "--threads", "1", *map(str, extra)]


@pytest.fixture(scope="module")
def summarize_run(tiny_llama, articles_dir, tmp_path_factory):
    """One greedy summarize bench over the tiny llama (self:2 draft) writing every output."""
    d = tmp_path_factory.mktemp("summarize-bench")
    saved = torch.get_num_threads()
    try:
        r = runner.invoke(app, task_args("summarize", tiny_llama, articles_dir, "--draft", "self:2", "--gamma", "1,3",
                                         "--modes", "baseline,exact", "--max-new-tokens", "12", "--draft-vocab", "0",
                                         "--json", "--out", d / "s.json", "--csv", d / "s.csv", "--plot", d))
    finally:
        torch.set_num_threads(saved)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout), d


def test_summarize_json_carries_every_table_field(summarize_run):
    out, d = summarize_run
    assert json.loads((d / "s.json").read_text()) == out
    results = out["results"]
    assert [(x["schedule"], x["mode"], x["gamma"]) for x in results] == [(None, "autoregressive", 0)] + [
        (s, m, g) for s in ("auto", "constant") for g in (1, 3) for m in ("baseline", "exact")]
    records = [contenders.TaskRecord(**x) for x in results]  # every field round-trips
    shown = BenchResults("summarize", out["command"], out["config"], out["machine"], records).tables
    for _title, cols in shown:
        for key, _header in cols:
            for x in results:
                assert (key.split(".", 1)[1] in x["quality"]) if key.startswith("quality.") else key in x, key
    assert {k for _, cols in shown for k, _ in cols} >= {"quality.rouge1", "quality.rouge2", "quality.rougeL"}
    assert out["command"].startswith("specdec bench --task summarize --gamma 1,3 --modes baseline,exact "
                                     "--gamma-schedule auto,constant --batch 1")
    assert "--draft-vocab 0" in out["command"] and "--threads 1" in out["command"]
    assert "--max-new-tokens 12" in out["command"] and "--draft self:2" in out["command"]
    m = out["machine"]
    assert m["device"] == "cpu" and m["device_name"] and m["versions"]["torch"] == torch.__version__
    assert out["argv"] and out["config"]["options"]["data"]


def test_summarize_arithmetic(summarize_run):
    """Speedups, α, c and the prediction recomputed here from the record's own measurements."""
    results = summarize_run[0]["results"]
    ar = results[0]
    assert ar["speedup"] == 1.0 and ar["acceptance_rate"] is None and ar["target_ms_per_forward"] > 0
    for x in results:
        assert x["tokens_per_s"] == pytest.approx(x["new_tokens"] / x["wall_s"])
        assert 0 < x["new_tokens"] <= 12 * len(ARTICLES)
        # batch 1: one wall per article, in input order, adding up to the record's
        assert len(x["input_wall_s"]) == len(ARTICLES) and sum(x["input_wall_s"]) == pytest.approx(x["wall_s"])
        assert x["peak_memory_mib"] is None or x["peak_memory_mib"] > 0
    for x in results[1:]:
        g = x["gamma"]
        assert x["speedup"] == pytest.approx(x["tokens_per_s"] / ar["tokens_per_s"])
        assert 0 <= x["acceptance_rate"] <= 1 and x["verify_ms_per_call"] > 0 and x["backend"] == "torch"
        c = x["draft_ms_per_forward"] / ar["target_ms_per_forward"]
        assert x["cost_ratio"] == pytest.approx(c)
        assert x["pass_ratio"] == pytest.approx(x["target_ms_per_forward"] / ar["target_ms_per_forward"])
        # rounds never draft past γ (constant: γ, fewer where the draft stops early or the end is near)
        assert sum(x["rounds_per_gamma"]) > 0 and len(x["rounds_per_gamma"]) <= g + 1
        if x["schedule"] == "auto":  # what it measured is in the record; no one γ to predict for
            assert x["alpha"] == x["measured"]["alpha"] and x["predicted_speedup"] is None
        if x["schedule"] == "constant" and 0 < x["mean_accepted_per_call"] < g:
            alpha = _alpha_from_mean_accepted(x["mean_accepted_per_call"], g)
            assert x["alpha"] == pytest.approx(alpha, abs=1e-9)
            assert x["predicted_speedup"] == pytest.approx((1 - alpha ** (g + 1)) / ((1 - alpha) * (g * c + 1)))
            assert x["best_gamma"] == max(range(1, 33), key=lambda k: (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1)))
        # greedy: every mode prints exactly the autoregressive summaries
        assert x["outputs"] == ar["outputs"] and x["same_as_autoregressive"] == 1.0


def test_summarize_rouge_wiring(summarize_run):
    """quality = the mean over articles of rouge-score's F1 (stemmed) of each output against its .ref.txt."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    refs = [ref for _name, (_text, ref) in sorted(ARTICLES.items())]
    for x in summarize_run[0]["results"]:
        assert len(x["outputs"]) == len(refs) and any(x["outputs"])
        scores = [scorer.score(ref, out) for ref, out in zip(refs, x["outputs"])]
        for k in ("rouge1", "rouge2", "rougeL"):
            assert x["quality"][k] == pytest.approx(np.mean([s[k].fmeasure for s in scores]))


def test_summarize_csv_and_plots(summarize_run):
    out, d = summarize_run
    rows = list(csv.DictReader((d / "s.csv").open()))
    assert len(rows) == len(out["results"]) == 9
    assert "outputs" not in rows[0] and "quality_rouge1" in rows[0]
    assert float(rows[2]["speedup"]) == pytest.approx(out["results"][2]["speedup"])
    pngs = sorted(p.name for p in d.glob("*.png"))
    assert pngs == [f"summarize-cpu-{k}-vs-gamma.png" for k in ("acceptance", "speedup", "verify")]
    for name in pngs:
        assert (d / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summarize_table_limit_and_greedy_warning(tiny_llama, articles_dir):
    r = runner.invoke(app, task_args("summarize", tiny_llama, articles_dir, "--draft", "self:2", "--gamma", "2",
                                     "--modes", "exact,sigmoid", "--max-new-tokens", "4", "--limit", "1"))
    assert r.exit_code == 0, r.output
    assert "predicted" in r.stderr and "rouge1" in r.stderr and "argmax" in r.stderr and r.stdout == ""


def test_a_sweep_over_threads_and_draft_settings(tiny_llama, articles_dir):
    """--threads and the draft options sweep: autoregressive once per thread count, the speculative contenders
    once per (threads, draft setting), each measured against the autoregressive run of its own thread count;
    the progress bar's total is what ran; torch's thread count is restored."""
    saved = torch.get_num_threads()
    args = task_args("summarize", tiny_llama, articles_dir, "--draft", "self:2", "--gamma", "2", "--modes", "exact",
                     "--gamma-schedule", "auto", "--max-new-tokens", "6", "--limit", "1", "--json")
    args[args.index("--threads") + 1] = "1,2"
    r = runner.invoke(app, [*args, "--draft-vocab", "0,64", "--draft-quantized", "off"])
    assert r.exit_code == 0, r.output
    assert torch.get_num_threads() == saved
    results = json.loads(r.stdout)["results"]
    assert [(x["threads"], x["mode"], x["draft"]) for x in results] == [
        (t, m, d) for t in (1, 2) for m, d in [("autoregressive", None), ("exact", "vocab full, unquantized"),
                                               ("exact", "vocab 64, unquantized")]]
    for x in results:
        ar = next(a for a in results if a["mode"] == "autoregressive" and a["threads"] == x["threads"])
        assert x["speedup"] == pytest.approx(x["tokens_per_s"] / ar["tokens_per_s"])
        assert x["outputs"] == ar["outputs"]  # greedy, whatever the setting
    records = [contenders.TaskRecord(**x) for x in results]
    groups = BenchResults("summarize", "", {}, {}, records).groups()
    assert [len(g) for _, g in groups] == [2, 2, 2, 2] and "2 threads · draft vocab 64" in groups[3][0]
    tc = config.TaskConfig("summarize", [2, 3], ["exact", "sigmoid"], schedules=["auto"], threads=[1, 2],
                           draft_vocabs=[0, 64], options={"data": str(articles_dir)})
    assert harness.total_steps(tc) == 2 + 2 * 2 * 1 * 2 * 2


def test_bench_option_lists():
    assert config.parse_threads("1,all") == sorted({1, os.cpu_count()})
    assert config.parse_threads(None) is None
    assert config.parse_switches("on,off", "--draft-quantized") == [True, False]
    with pytest.raises(SpecdecError, match="--draft-quantized"):
        config.parse_switches("yes", "--draft-quantized")


def test_transcribe_wer_wiring(tmp_path):
    """The transcribe runner through the CLI on a tiny random Whisper: WER = jiwer's word errors over the
    normalised texts, summed over the clips, per reference word. The references are the autoregressive
    transcripts of a first run plus two words, so the WER is neither 0 nor 1."""
    import jiwer
    import soundfile as sf

    from conftest import save_tiny_whisper
    from specdec_cli.bench.metrics import normalize_text

    model = save_tiny_whisper(tmp_path / "whisper")
    data = tmp_path / "clips"
    data.mkdir()
    t = np.arange(2 * 16000) / 16000
    names = ["one", "two"]
    for k, name in enumerate(names):
        sf.write(data / f"{name}.wav", (0.3 * np.sin(2 * np.pi * (200 + 150 * k + 300 * t) * t)).astype(np.float32), 16000)
        (data / f"{name}.ref.txt").write_text("placeholder")
    args = task_args("transcribe", model, data, "--gamma", "2", "--modes", "exact", "--gamma-schedule", "constant",
                     "--max-new-tokens", "6", "--draft-vocab", "150", "--json")
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    for name, text in zip(names, json.loads(first.stdout)["results"][0]["outputs"]):
        (data / f"{name}.ref.txt").write_text(f"{text} the cat")
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    results = json.loads(r.stdout)["results"]
    assert [x["mode"] for x in results] == ["autoregressive", "exact"]
    truth = [normalize_text((data / f"{n}.ref.txt").read_text()) for n in names]
    for x in results:
        hyps = [normalize_text(o) for o in x["outputs"]]
        errors = sum(jiwer.process_words(ref, hyp).wer * len(ref.split()) if hyp else len(ref.split())
                     for ref, hyp in zip(truth, hyps))
        expected = errors / sum(len(ref.split()) for ref in truth)
        assert 0 < expected < 1 and x["quality"]["wer"] == pytest.approx(expected)
    assert results[1]["outputs"] == results[0]["outputs"] and results[1]["same_as_autoregressive"] == 1.0


@pytest.fixture
def empty_dirs(tmp_path):
    (tmp_path / "empty").mkdir()
    refs_only = tmp_path / "refs-only"
    refs_only.mkdir()
    (refs_only / "a.ref.txt").write_text("a reference, but no article")
    (refs_only / "notes.md").write_text("not an input")
    blank = tmp_path / "blank"
    blank.mkdir()
    (blank / "a.txt").write_text("   \n")
    return tmp_path


@pytest.mark.parametrize(
    "args, message",
    [
        (["--gamma", "0"], "--gamma"),
        (["--gamma", ","], "--gamma is empty"),
        (["--modes", ""], "--modes"),
        (["--modes", "hf"], "--modes is empty"),
        (["--modes", "exact,turbo"], "--modes"),
        (["--batch", "0"], "--batch"),
        (["--limit", "0"], "--limit"),
        (["--max-new-tokens", "0"], "--max-new-tokens"),
        (["--draft-vocab", "-1"], "--draft-vocab"),
        (["--temperature", "-1"], "--temperature"),
        (["--dtype", "int8"], "--dtype"),
        (["--repeat", "0"], "--repeat"),
        (["--gamma-schedule", "auto,turbo"], "--gamma-schedule"),
        (["--threads", "1,0"], "--threads"),
        (["--threads", "1,many"], "--threads"),
        (["--draft-quantized", "maybe"], "--draft-quantized"),
        (["--draft-vocab", "8,x"], "--draft-vocab"),
        (["--data", "{tmp}/nope"], "no such directory"),
        (["--data", "{tmp}/empty"], "no usable files for --task summarize"),
        (["--data", "{tmp}/refs-only"], "no usable files for --task summarize"),
        (["--data", "{tmp}/blank"], "is empty"),
        (["--task", "transcribe", "--data", "{tmp}/refs-only"], "no usable files for --task transcribe"),
    ],
)
def test_task_bad_options_exit_2_with_one_line(args, message, empty_dirs, articles_dir):
    args = [a.replace("{tmp}", str(empty_dirs)) for a in args]
    base = ["bench", "--task", "summarize", "--data", str(articles_dir), "--target", "/no/model/needed", "--device", "cpu"]
    r = runner.invoke(app, [*base, *args])
    assert r.exit_code == 2, r.output
    lines = _lines(r)
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.output, r.output


def test_task_inputs(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    for name in ("c", "a", "b"):
        (d / f"{name}.txt").write_text(f"article {name}")
        if name != "c":
            (d / f"{name}.ref.txt").write_text(f" ref\n {name} ")

    def inputs(**options):
        return runners.task_inputs(config.TaskConfig("summarize", [1], ["exact"], options=options))

    paths, refs = inputs(data=d)
    assert [p.rsplit("/", 1)[1] for p in paths] == ["a.txt", "b.txt", "c.txt"] and refs is None  # c has none
    paths, refs = inputs(data=d, limit=2)
    assert [p.rsplit("/", 1)[1] for p in paths] == ["a.txt", "b.txt"] and refs == ["ref a", "ref b"]
    assert inputs(inputs=["x.txt"], references=["r"]) == (["x.txt"], ["r"])
    default, refs = inputs()  # examples/articles, every one with its reference
    assert default and refs and all("/examples/articles/" in p for p in default)


def test_peak_memory_on_cpu():
    with machine.PeakMemory("cpu") as before:
        pass
    with machine.PeakMemory("cpu") as peak:
        # 32 MiB of pages mapped and written here: memory an allocator freed earlier in the process would
        # serve a malloc without growing the resident set (the test failed so after other tests' tensors)
        pages = mmap.mmap(-1, 32 * 2**20)
        for i in range(0, len(pages), mmap.PAGESIZE):
            pages[i] = 1
        pages.close()
    if peak.mib is None:
        pytest.skip("the peak resident set cannot be reset here (not Linux)")
    assert peak.mib >= before.mib + 30


# ------------------------------------------------------------------------------------ --peers faster-whisper


def _has_embedded_base() -> bool:
    from specdec_cli.models.whisper_convert import iter_embedded_installed

    return "base" in iter_embedded_installed()


def test_aggregate_end_to_end_and_peers():
    """End to end, every record (int8 target, peers) is set against the unmodified target alone; a peer gets
    no tokens/s speedup (another tool's tokens), only the share of transcripts equal to autoregressive's."""
    def rec(mode, e2e, outputs, int8=False, peer=None):
        return contenders.TaskRecord(
            task="transcribe", gamma=0 if mode == "autoregressive" or peer else 3, mode=mode, new_tokens=100,
            wall_s=e2e / 2, tokens_per_s=200 / e2e, acceptance_rate=None, mean_accepted_per_call=None,
            verify_ms_per_call=None, draft_ms_per_forward=None, target_ms_per_forward=None, peak_memory_mib=None,
            outputs=outputs, threads=2, end_to_end_s=e2e, target_int8=int8, peer=peer)

    recs = contenders.aggregate([rec("autoregressive", 4.0, ["a", "b"]), rec("exact", 2.0, ["a", "b"]),
                                 rec("autoregressive", 3.0, ["a", "c"], int8=True), rec("exact", 1.0, ["a", "d"], int8=True),
                                 rec("faster-whisper int8", 5.0, ["x", "b"], peer="faster-whisper")])
    _, ex, ar8, ex8, fw = recs
    assert [r.end_to_end_speedup for r in recs] == pytest.approx([1.0, 2.0, 4 / 3, 4.0, 0.8])
    assert (ex.speedup, ex8.speedup) == pytest.approx((2.0, 3.0))  # each against its own target's autoregressive
    assert (ar8.speedup, fw.speedup) == (None, None)
    assert (ex.same_as_autoregressive, ar8.same_as_autoregressive, ex8.same_as_autoregressive,
            fw.same_as_autoregressive) == (1.0, 0.5, 0.5, 0.5)


def test_an_encoder_sweep_pairs_each_run_with_its_own_target():
    """--encoder-int8 off,on: one setting each (the options and the label say which); each speculative record's speedup
    is against the autoregressive run of its own encoder, end to end every record against the target with its own
    encoder (the unmodified model); a transcribe run without the sweep keeps the default (int8) and pairs as before."""
    cfg = config.TaskConfig(task="transcribe", gammas=[3], modes=["exact"], encoder_int8=[False, True])
    settings = runners.task_settings(cfg)
    assert [(s.encoder_int8, s.options.encoder_int8) for s in settings] == [(False, False), (True, True)]
    assert settings[0].draft.endswith(", own encoder") and "encoder" not in settings[1].draft
    assert settings[0].target != settings[1].target  # autoregressive runs once per encoder
    assert "--encoder-int8 off,on" in cfg.command()
    assert [s.encoder_int8 for s in runners.task_settings(config.TaskConfig("transcribe", [3], ["exact"]))] == [True]
    assert [s.encoder_int8 for s in runners.task_settings(config.TaskConfig("summarize", [3], ["exact"]))] == [None]

    def rec(mode, e2e, tps, enc):
        return contenders.TaskRecord(
            task="transcribe", gamma=0 if mode == "autoregressive" else 3, mode=mode, new_tokens=100, wall_s=1.0,
            tokens_per_s=tps, acceptance_rate=None, mean_accepted_per_call=None, verify_ms_per_call=None,
            draft_ms_per_forward=None, target_ms_per_forward=None, peak_memory_mib=None, outputs=["a"], threads=2,
            end_to_end_s=e2e, encoder_int8=enc)

    recs = contenders.aggregate([rec("autoregressive", 4.0, 100, False), rec("exact", 2.5, 150, False),
                                 rec("autoregressive", 3.0, 110, True), rec("exact", 2.0, 165, True)])
    assert [r.end_to_end_speedup for r in recs] == pytest.approx([1.0, 1.6, 4 / 3, 2.0])
    assert [r.speedup for r in recs] == pytest.approx([1.0, 1.5, 1.0, 1.5])
    default = contenders.aggregate([rec("autoregressive", 3.0, 110, True), rec("exact", 2.0, 165, True)])
    assert [x for r in default for x in (r.end_to_end_speedup, r.speedup)] == pytest.approx([1.0, 1.0, 1.5, 1.5])
    import io

    from rich.console import Console

    from specdec_cli import render
    from specdec_cli.bench.results import BenchResults

    peer = rec("faster-whisper float32", 8.0, 30, None)
    peer.peer, peer.quality = "faster-whisper", {"wer": 0.1234}
    for r in recs:
        r.quality = {"wer": 0.0282}
    shown = io.StringIO()
    machine = {"device": "cpu", "device_name": "a CPU", "torch_threads": 2, "versions": {"torch": "2"}}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(render, "err", Console(file=shown, width=80))
        render.bench_table(BenchResults("transcribe", "", {}, machine, contenders.aggregate([*recs, peer])))
    table = shown.getvalue().split("end to end")[-1].split("a CPU.")[0]
    assert "int8" in table and "encoder" in table and "0.123" in table and "…" not in table, table  # 80 columns


def test_the_test_extra_installs_every_peer():
    """faster-whisper is in the test extra, at the peers extra's pin, so `make test` runs the peer below instead of
    its "not installed" path only; installed here at that version (the test extra was installed)."""
    import importlib.metadata

    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras["peers"]) <= set(extras["test"]), (extras["peers"], extras["test"])
    for requirement in extras["peers"]:
        name, version = requirement.split("==")
        assert importlib.metadata.version(name) == version, f"pip install -e '.[test]': {requirement}"


@pytest.mark.skipif(not _has_embedded_base() or not os.path.isfile(EXAMPLE_WAV),
                    reason="needs the embedded Whisper base (make models-test)")
def test_faster_whisper_peer_records(monkeypatch, tmp_path):
    """faster-whisper on the embedded base's CTranslate2 files (joined once into the cache): one record per
    compute type, on the clip given, its WER against the reference, at the thread count given. faster-whisper
    comes with the test extra: missing, this fails (test_the_test_extra_installs_every_peer says why)."""
    from specdec_cli.bench import contenders, metrics, peers
    from specdec_cli.models import cache, whisper_convert
    from specdec_cli.tasks.audio import load_audio, reference_for

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    audio = load_audio(EXAMPLE_WAV)[: 8 * 16000]
    refs = [" ".join(reference_for(EXAMPLE_WAV).split()[:4])]
    runs = peers.faster_whisper_runs("embedded", [audio], refs, threads=1, language="en", max_new_tokens=60)
    records = contenders.run_rounds(runs, 1, "cpu", lambda _label: None)
    assert [r.mode for r in records] == ["faster-whisper float32", "faster-whisper int8"]
    for r in records:
        assert r.peer == "faster-whisper" and r.threads == 1 and r.new_tokens > 0 and r.end_to_end_s == r.wall_s > 0
        assert r.outputs[0] and r.quality["wer"] == pytest.approx(metrics.wer(r.outputs, refs))
    entry = cache.read_entry(whisper_convert.ct2_cache_key("base"))
    assert entry["format"] == "ctranslate2" and cache.damage(whisper_convert.ct2_cache_key("base")) is None
    parts = whisper_convert.locate_embedded("base").model_parts
    assert (tmp_path / "models" / "ct2-whisper-base" / "model.bin").stat().st_size == sum(p.stat().st_size for p in parts)


def test_faster_whisper_missing_is_one_line_and_the_bench_runs(monkeypatch, tmp_path):
    """Without faster-whisper the bench says so in one line and runs the rest; the runner adds no record."""
    from specdec_cli.bench import peers

    monkeypatch.setitem(sys.modules, "faster_whisper", None)  # `import faster_whisper` now raises ImportError
    seen = {}

    def fake_runner(config, progress):
        seen["config"] = config
        seen["peer_records"] = runners.peer_runs(config, [], None, 1)
        return _fake_records("transcribe")

    monkeypatch.setattr(runners, "run_task", fake_runner)
    r = runner.invoke(app, ["bench", "--task", "transcribe", "--gamma", "1,3,5", "--modes", "baseline,exact",
                            "--device", "cpu", "--peers", "faster-whisper", "--json"])
    assert r.exit_code == 0, r.output
    lines = [line for line in r.stderr.splitlines() if "faster" in line]
    assert len(lines) == 1 and "skipped" in lines[0] and peers.INSTALL in lines[0], r.stderr
    assert seen["config"].peers == ["faster-whisper"] and seen["peer_records"] == []
    assert len(json.loads(r.stdout)["results"]) == 5


def test_hf_assisted_peer_beside_specdec(tiny_llama, articles_dir, tmp_path):
    """--peers hf-assisted: transformers' generate() with the self:2 draft as assistant_model and with prompt lookup,
    on the same articles and thread count: greedy, so each summary is the target alone's; its speedup is over
    specdec's autoregressive record, its ROUGE against the same references; the table shows it."""
    saved = torch.get_num_threads()
    try:
        r = runner.invoke(app, task_args("summarize", tiny_llama, articles_dir, "--draft", "self:2", "--gamma", "3",
                                         "--modes", "exact", "--max-new-tokens", "12", "--draft-vocab", "0",
                                         "--peers", "hf-assisted", "--out", tmp_path / "s.json"))
    finally:
        torch.set_num_threads(saved)
    assert r.exit_code == 0, r.output
    records = json.loads((tmp_path / "s.json").read_text())["results"]
    ar = next(x for x in records if x["mode"] == "autoregressive")
    hf = [x for x in records if x["peer"] == "hf-assisted"]
    assert [x["mode"] for x in hf] == ["hf-assisted draft", "hf-assisted prompt lookup"]
    for x in hf:
        assert x["outputs"] == ar["outputs"] and x["same_as_autoregressive"] == 1.0 and x["threads"] == 1
        assert x["new_tokens"] == ar["new_tokens"] and x["speedup"] == pytest.approx(x["tokens_per_s"] / ar["tokens_per_s"])
        assert x["quality"] == ar["quality"]
    assert "hf-assisted prompt lookup" in r.output and "generation_config" not in r.output


@pytest.mark.parametrize("draft, modes", [("lookup", ["hf-assisted prompt lookup"]),
                                          ("lookup+self:2", ["hf-assisted draft", "hf-assisted prompt lookup"])])
def test_hf_assisted_peer_with_a_lookup_draft(tiny_llama, articles_dir, tmp_path, draft, modes):
    """--draft lookup has no model to assist transformers: only its prompt lookup runs, and the progress total
    counts only that; lookup+DRAFT hands it DRAFT's model."""
    tc = config.TaskConfig("summarize", [3], ["exact"], schedules=["constant"], peers=["hf-assisted"],
                           options={"data": str(articles_dir), "target": tiny_llama, "draft": draft})
    assert harness.total_steps(tc) == 2 + len(modes)  # autoregressive, exact γ 3, the peer's variants
    saved = torch.get_num_threads()
    try:
        r = runner.invoke(app, task_args("summarize", tiny_llama, articles_dir, "--draft", draft, "--gamma", "3",
                                         "--modes", "exact", "--max-new-tokens", "12", "--draft-vocab", "0",
                                         "--gamma-schedule", "constant", "--peers", "hf-assisted",
                                         "--out", tmp_path / "s.json"))
    finally:
        torch.set_num_threads(saved)
    assert r.exit_code == 0, r.output
    records = json.loads((tmp_path / "s.json").read_text())["results"]
    ar = next(x for x in records if x["mode"] == "autoregressive")
    hf = [x for x in records if x["peer"] == "hf-assisted"]
    assert [x["mode"] for x in hf] == modes and all(x["outputs"] == ar["outputs"] for x in hf)


@pytest.mark.parametrize("args, message", [(["--peers", "whisper.cpp"], "--peers"),
                                           (["--task", "summarize", "--peers", "faster-whisper"], "--task transcribe"),
                                           (["--task", "summarize", "--target-int8", "on"], "--target-int8"),
                                           (["--target-int8", "maybe"], "--target-int8"),
                                           (["--task", "summarize", "--encoder-int8", "off,on"], "--encoder-int8"),
                                           (["--encoder-int8", "of"], "--encoder-int8"),
                                           (["--task", "summarize", "--language", "en"], "--language")])
def test_peer_and_target_int8_bad_options_exit_2(args, message):
    r = runner.invoke(app, ["bench", "--task", "transcribe", "--device", "cpu", "--target", "/no/model/needed", *args])
    assert r.exit_code == 2, r.output
    lines = _lines(r)
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.output, r.output


def test_a_mode_the_draft_cannot_verify_is_left_out_in_one_line(articles_dir):
    """summarize's default draft (lookup) hands sigmoid no logits: bench leaves sigmoid out with one warning, before any
    model loads, and refuses a run of sigmoid alone."""
    from specdec_cli.errors import SpecdecWarning

    tc = config.TaskConfig("summarize", [3], ["baseline", "exact", "sigmoid"], options={"data": str(articles_dir)})
    with pytest.warns(SpecdecWarning, match="--modes sigmoid left out: --mode sigmoid needs a model draft"):
        tc.validate()
    assert tc.modes == ["baseline", "exact"]
    with pytest.raises(SpecdecError, match="--mode sigmoid needs a model draft"):
        config.TaskConfig("summarize", [3], ["sigmoid"], options={"data": str(articles_dir)}).validate()
    with_model = config.TaskConfig("summarize", [3], ["exact", "sigmoid"],
                                   options={"data": str(articles_dir), "draft": "self:1"})
    assert with_model.validate().modes == ["exact", "sigmoid"]


def test_every_synthetic_mode_has_its_own_plot_colour():
    from specdec_cli.bench.config import SYNTHETIC_MODES
    from specdec_cli.bench.plots import COLORS

    assert set(SYNTHETIC_MODES) <= set(COLORS) and len(set(COLORS.values())) == len(COLORS)


def test_a_setting_names_its_draft_and_only_the_options_that_apply_to_it():
    """A lookup draft has no vocabulary or weights: the results name it by its spec, a model draft by its options
    (the summarize default is lookup: its records said "vocab 32768, quantized" before)."""
    assert runners._draft_label("lookup", 32768, True) == "lookup"
    assert runners._draft_label("lookup:4-2", 0, False) == "lookup:4-2"
    assert runners._draft_label("embedded", 32768, True) == "vocab 32768, quantized"
    assert runners._draft_label("lookup+embedded", 0, False) == "lookup+vocab full, unquantized"
    cfg = config.TaskConfig(task="summarize", gammas=[4], modes=["exact"])
    assert [s.draft for s in runners.task_settings(cfg)] == ["lookup"]


def test_the_bench_interleaves_its_contenders_passes():
    """run_contenders runs --repeat rounds, each decoding with every contender once, the first of a round rotating
    (a host whose speed drifts slows them alike), and keeps each contender's fastest pass, after one short untimed
    decode per mode."""
    from types import SimpleNamespace

    from specdec_cli.bench import contenders as C
    from specdec_cli.decoding.stats import GenerationStats

    cs = [C.AUTOREGRESSIVE, C.Contender("exact", 4, "auto"), C.Contender("sigmoid", 4, "auto")]
    calls, walls = [], iter([5.0, 4.0, 6.0, 3.0, 9.0, 2.0, 7.0, 8.0, 1.0])  # the timed passes, in call order

    def decode(c, short):
        calls.append((c.mode, short))
        stats = GenerationStats(c.mode, c.gamma, c.schedule or "constant", 1, new_tokens=10)
        stats.wall_s = 0.1 if short else next(walls)
        return [f"{c.mode} {stats.wall_s}"], stats.finish(), {}

    labels = []
    records = C.run_contenders(SimpleNamespace(repeat=3, device="cpu", task="synthetic"), cs, decode, None,
                               labels.append, threads=1)
    timed = [m for m, short in calls if not short]
    assert sorted(m for m, short in calls if short) == ["autoregressive", "exact", "sigmoid"]
    assert timed == ["autoregressive", "exact", "sigmoid", "exact", "sigmoid", "autoregressive",
                     "sigmoid", "autoregressive", "exact"]
    # autoregressive: 5, 2, 8 -> 2; exact: 4, 3, 1 -> 1; sigmoid: 6, 9, 7 -> 6
    assert [r.mode for r in records] == ["autoregressive", "exact", "sigmoid"]
    assert [r.wall_s for r in records] == [2.0, 1.0, 6.0] and records[1].outputs == ["exact 1.0"]
    assert labels == [cs[i].label for i in (0, 1, 2, 1, 2, 0, 2, 0, 1)]  # after every pass


def test_a_peer_workers_errors_come_back_to_the_bench():
    """peers.served runs a peer in a spawned worker: an error there is raised where the bench runs (here a peer
    the worker has no builder for), not lost with the process."""
    from specdec_cli.bench import peers

    with pytest.raises(KeyError, match="no-such-peer"):
        peers.served("no-such-peer", threads=1)

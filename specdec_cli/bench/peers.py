"""Other tools as contenders beside specdec's own (`specdec bench --peers`): faster-whisper for transcribe.

faster-whisper reads the embedded Whisper's own CTranslate2 files (models.whisper_convert.ensure_ct2: joined
once into the cache), on the same clips and at the same thread count as the run, decoding as specdec does:
greedy (beam 1, temperature 0, no fallback), no timestamps, no conditioning on the previous window, no VAD,
the run's --language (auto: its own detection). One record per compute type (float32, int8); load excluded.
Its time covers features, encoder and decoder, so it is set beside specdec's end_to_end_s (not wall_s, which
is specdec's decoding loops alone).

faster-whisper is an optional extra (`pip install 'specdec[peers]'`): when it is not installed, `skipped`
gives the one line the bench shows, and the rest of the bench runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from specdec_cli.bench.contenders import Progress, TaskRecord, score_quality
from specdec_cli.bench.machine import PeakMemory


@dataclass(frozen=True)
class Peer:
    name: str  # as --peers spells it
    task: str  # the task it runs beside
    module: str  # what must import
    compute_types: tuple[str, ...]  # one record each


PEERS = {"faster-whisper": Peer("faster-whisper", "transcribe", "faster_whisper", ("float32", "int8"))}
INSTALL = "pip install 'specdec[peers]'"
WARMUP_SECONDS = 5  # the untimed first call: the first seconds of the first clip


def skipped(name: str, target: str = "embedded") -> str | None:
    """The one line saying why peer `name` does not run here (not installed; a target it cannot read), or None."""
    peer = PEERS[name]
    try:
        __import__(peer.module)
    except ImportError:
        return f"--peers {name}: {peer.module} is not installed ({INSTALL}): its contenders are skipped"
    if _embedded_name(target) is None:
        return f"--peers {name}: runs only on an embedded target (got {target!r}): its contenders are skipped"
    return None


def _embedded_name(target: str) -> str | None:
    from specdec_cli.models.whisper import EMBEDDED_DEFAULT
    from specdec_cli.models.whisper_convert import EMBEDDED

    kind, _, name = target.partition(":")
    if kind != "embedded":
        return None
    name = name or EMBEDDED_DEFAULT
    return name if name in EMBEDDED else None


def faster_whisper_records(target: str, audios: list[np.ndarray], references: list[str] | None, *, threads: int,
                           language: str, max_new_tokens: int, repeat: int = 1,
                           progress: Progress | None = None) -> list[TaskRecord]:
    """One TaskRecord per compute type: faster-whisper over every audio (16 kHz mono float32), the fastest of
    `repeat` passes; wall_s = end_to_end_s = the passes' time, load excluded."""
    from faster_whisper import WhisperModel

    from specdec_cli.models.whisper_convert import ensure_ct2

    folder = str(ensure_ct2(_embedded_name(target)))
    lang = None if language == "auto" else language
    records = []
    for compute in PEERS["faster-whisper"].compute_types:
        model = WhisperModel(folder, device="cpu", compute_type=compute, cpu_threads=threads)
        _transcribe(model, [audios[0][: WARMUP_SECONDS * 16000]], lang, max_new_tokens)  # untimed
        best = None
        for _ in range(repeat):
            with PeakMemory("cpu") as peak:
                t0 = time.perf_counter()
                texts, tokens = _transcribe(model, audios, lang, max_new_tokens)
                wall = time.perf_counter() - t0
            if best is None or wall < best[2]:
                best = (texts, tokens, wall, peak.mib)
        del model
        texts, tokens, wall, mib = best
        records.append(TaskRecord(
            task="transcribe", gamma=0, mode=f"faster-whisper {compute}", new_tokens=tokens, wall_s=wall,
            tokens_per_s=tokens / wall if wall > 0 else 0.0, acceptance_rate=None, mean_accepted_per_call=None,
            verify_ms_per_call=None, draft_ms_per_forward=None, target_ms_per_forward=None, peak_memory_mib=mib,
            quality=score_quality("transcribe", texts, references) if references else {}, outputs=texts,
            threads=threads, peer="faster-whisper", end_to_end_s=wall))
        if progress:
            progress(f"faster-whisper {compute}")
    return records


def _transcribe(model, audios: list[np.ndarray], language: str | None, max_new_tokens: int) -> tuple[list[str], int]:
    """(each audio's text, tokens over all) from a faster_whisper.WhisperModel, decoding as specdec does."""
    texts, tokens = [], 0
    for audio in audios:
        segments, _ = model.transcribe(audio, language=language, beam_size=1, temperature=0.0, without_timestamps=True,
                                       condition_on_previous_text=False, vad_filter=False, max_new_tokens=max_new_tokens)
        segments = list(segments)  # the generator decodes as it is read
        texts.append(" ".join(s.text.strip() for s in segments if s.text.strip()))
        tokens += sum(len(s.tokens) for s in segments)
    return texts, tokens

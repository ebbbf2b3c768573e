"""Speech recognition: audio files in, transcripts out, through the speculative decoding loop with a
Whisper target.

Two stages, as faster-whisper's transcribe and generate_segments:

    _setup            once per call: the options checked, the special ids, the logits hook, the schedule
    decode_windows    a generator over batches of ≤ 30 s windows that yields them decoded, each with its text
                      and segments; `transcribe` collects them into one Transcript per input, in input order

Per input file:

    load_audio (any format, rate, channels → 16 kHz mono) → windows (≤ 30 s, cut in pauses: audio.windows)
    → per window: silent? → empty, no model call
                  log-mel features → the target's encoder, ONCE
                  → every decoder layer's cross-attention K/V, ONCE, shared by the target, the draft and the
                    probe (models.whisper_decoding.EncodedWindows)
                  → the probe: one decoder step on <|startoftranscript|>: the language (multilingual model,
                    --language auto: detected on the file's first window with speech) and the no-speech
                    probability (above options' no_speech_threshold the window is silence: no hallucinated text)
                  → generate(target, draft fitted to the window) on [<sot>, <lang>, <task>, <notimestamps>];
                    with timestamps on [<sot>, <lang>, <task>], the timestamp rules in the logits hook
                    (whisper_rules.TimestampRules)
    → the windows' texts joined with one space (the cuts lie in pauses: no word is split, dropped or doubled);
      segments: one per window, or with timestamps the model's own, their times offset by the window's start.

The default draft, `self`, is the target's own decoder in a lean int4 decoding step with a reduced output layer
(drafts/lean_whisper.py). The draft proposes γ tokens one at a time, then the target scores the γ+1 slots in one
pass (models.whisper_decoding.ExactScorer), which costs about what one token costs: that is the saving. Another
Whisper model (`--draft DIR-or-ID`, same vocabulary) reuses the target's encoder output when its encoder has the
same weights (drafts/whisper_model.py).

Exactness: greedy output is the autoregressive output, token for token. The target's one pass over γ+1 slots
gives every row bit for bit the logits a one-token step gives in bf16 (ExactScorer: attention row by row, a lone
row through a linear layer computed as two), so verification compares the draft with exactly the autoregressive
logits. (In fp32 MKL rounds a many-row GEMM differently from a one-row GEMV: only a tie within that rounding
could flip.) Cross-attention runs in fp32 on a CPU (the rows kernel, on K/V kept in bf16 where it builds, else torch's
sdpa on an fp32 copy: models.whisper.cross_attention_dtype), in every mode alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from specdec_cli import drafts
from specdec_cli.decoding import (
    Batch,
    Draft,
    GenerationResult,
    GenerationStats,
    SamplingParams,
    Threads,
    generate,
    make_schedule,
    merge_stats,
    rows_share,
)
from specdec_cli.decoding.exact_rows import takes_kernel
from specdec_cli.drafts.whisper_model import WhisperDraft
from specdec_cli.errors import SpecdecError
from specdec_cli.kernels import float_rows, frames_attention, int8_rows, lean_layers, qmatmul, rows_attention
from specdec_cli.models import LoadedModel, int8
from specdec_cli.models.progress import build_kernels
from specdec_cli.models.whisper import (
    TIME_PER_TOKEN,
    WHISPER,
    SpecialIds,
    check_language_task,
    check_timestamps,
    cross_attention_dtype,
    decoder_layers,
    prompt_ids,
    special_ids,
)
from specdec_cli.models.whisper_decoding import EncodedWindows, ExactScorer, WindowDecoder, cross_kv, encode, features
from specdec_cli.options import TranscribeOptions
from specdec_cli.tasks.audio import SAMPLE_RATE, AudioWindow, is_silent, librivox_clips, load_audio, windows
from specdec_cli.tasks.whisper_rules import Suppressor


@dataclass
class TranscribeStats(GenerationStats):
    """GenerationStats summed over an input's windows (wall_s: the decoding loops), plus the rest; in a batch with
    other inputs' windows, the times and calls are its share (decode_windows)."""

    language: str | None = None
    task: str = "transcribe"
    audio_s: float = 0.0  # the input's duration
    windows: int = 0  # windows of ≤ 30 s
    silent_windows: int = 0  # skipped: silent audio, or the model's no-speech probability
    features_s: float = 0.0  # log-mel features
    encoder_s: float = 0.0  # the target's encoder (+ a different draft encoder)
    cross_kv_s: float = 0.0  # cross-attention K/V of every decoder layer, once per window
    probe_s: float = 0.0  # the language / no-speech step
    decoder_s: float = 0.0  # = wall_s: the decoding loops (prefill included)
    total_s: float = 0.0  # everything above, per input
    finish_reasons: list[str] = field(default_factory=list)  # per decoded window


@dataclass
class Transcript:
    input: str
    text: str
    finish_reason: str  # "eos", "length" (a window hit --max-new-tokens), or "silence"
    stats: TranscribeStats
    # (start s, end s, text): one per window, or with timestamps one per segment the model timed
    segments: list[tuple[float, float, str]] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------------
# Stage 1: what every window of a call shares


@dataclass(frozen=True)
class _Setup:
    opts: TranscribeOptions
    target: LoadedModel
    draft: Draft | None  # None: autoregressive
    ids: SpecialIds
    vocab: int  # the V both models' logits are cut to
    max_new: int  # new tokens per window: --max-new-tokens, within the decoder's positions
    hook: Suppressor  # the logits hook of both decoders
    params: SamplingParams
    schedule: Any  # one for every window: what it measured carries over
    threads: Threads  # the run's CPU threads (--threads): looked at before each batch and in the loop


def check_target(target: LoadedModel, opts: TranscribeOptions) -> None:
    """Refuse, in one line, a language, task or --timestamps this target cannot do."""
    check_language_task(target, opts.language, opts.task)
    if opts.timestamps:
        check_timestamps(target)


def _setup(target: LoadedModel, draft: Draft | None, opts: TranscribeOptions, schedule=None) -> _Setup:
    """Everything checked and built once per call, before any audio reaches the model."""
    if opts.speculative and draft is None:
        raise SpecdecError(f"mode {opts.mode!r} needs a draft model")
    check_target(target, opts)
    ids = special_ids(target)
    vocab = (draft.vocab if draft is not None and opts.speculative else None) or target.output_size
    prompt_len = len(prompt_ids(ids, "en" if ids.multilingual else None, opts.task, opts.timestamps))
    limit = int(getattr(target.model.config, "max_target_positions", 448)) - prompt_len
    return _Setup(opts, target, draft if opts.speculative else None, ids, vocab,
                  max_new=max(1, min(opts.max_new_tokens, limit)),
                  hook=Suppressor(target, prompt_len, vocab, opts.timestamps), params=SamplingParams.of(opts),
                  schedule=schedule or make_schedule(opts.gamma_schedule, opts.gamma), threads=Threads(opts.threads))


@dataclass
class _Window:
    input: _Input
    window: AudioWindow
    done: bool = False  # decoded, or silent
    text: str = ""
    finish: str = "silence"
    segments: list[tuple[float, float, str]] = field(default_factory=list)  # with timestamps


@dataclass
class _Input:
    """One input's windows, stats and language, as its windows are decoded."""

    path: str
    stats: TranscribeStats
    language: str | None  # None: not detected yet
    windows: list[_Window] = field(default_factory=list)

    @classmethod
    def of(cls, setup: _Setup, path: str, audio: np.ndarray) -> _Input:
        opts, multilingual = setup.opts, setup.ids.multilingual
        stats = TranscribeStats(opts.mode, opts.gamma if opts.speculative else 0, opts.gamma_schedule,
                                opts.batch_size, task=opts.task, language=None if multilingual else "en",
                                audio_s=len(audio) / SAMPLE_RATE)
        language = "en" if not multilingual else None if opts.language == "auto" else opts.language
        me = cls(path, stats, language)
        for w in windows(audio):
            silent = is_silent(w.audio)
            me.windows.append(_Window(me, w, done=silent))
            stats.windows += 1
            stats.silent_windows += silent
        return me

    def transcript(self, timestamps: bool) -> Transcript:
        s = self.stats
        s.language, s.decoder_s = self.language, s.wall_s
        reasons = {w.finish for w in self.windows}
        reason = "length" if "length" in reasons else "eos" if "eos" in reasons else "silence"
        segs = ([seg for w in self.windows for seg in w.segments] if timestamps else
                [(w.window.start_s, w.window.start_s + w.window.duration_s, w.text) for w in self.windows])
        return Transcript(self.path, " ".join(w.text for w in self.windows if w.text), reason, s.finish(), segs)


def transcribe(
    target: LoadedModel,
    draft: Draft | None,
    inputs: Sequence[str],
    options: TranscribeOptions | None = None,
    *,
    audios: Sequence[np.ndarray] | None = None,
    on_window: Callable[[int, int], Any] | None = None,
    on_transcript: Callable[[Transcript], Any] | None = None,
    schedule: Any = None,
    **overrides,
) -> list[Transcript]:
    """Transcripts of `inputs` (paths, read with load_audio unless `audios` gives the 16 kHz samples), in input
    order. draft: from load_pair / load_draft, None for mode autoregressive. options: the TranscribeOptions
    (default: the CLI's defaults), with `overrides` applied (e.g. mode="autoregressive"). on_window(done, total)
    after each batch of windows; on_transcript(transcript) as soon as an input's last window is decoded (in
    input order: e.g. to write its file then). schedule: a γ schedule of an earlier call (decoding.make_schedule for
    these options), to carry what it measured over (one actor of a corpus run); default: a new one."""
    setup = _setup(target, draft, (options or TranscribeOptions()).replace(**overrides).validate(), schedule)
    if audios is None:
        audios = [load_audio(p) for p in inputs]
    if len(audios) != len(inputs):
        raise ValueError("one audio per input")
    work = [_Input.of(setup, path, audio) for path, audio in zip(inputs, audios)]
    todo = [w for i in work for w in i.windows if not w.done]
    out: list[Transcript] = []

    def finish_inputs() -> None:  # in input order, each input as soon as all its windows are done
        while len(out) < len(work) and all(w.done for w in work[len(out)].windows):
            out.append(work[len(out)].transcript(setup.opts.timestamps))
            if on_transcript:
                on_transcript(out[-1])

    finish_inputs()
    done = 0
    with setup.threads:
        for batch in decode_windows(setup, todo):
            done += len(batch)
            if on_window:
                on_window(done, len(todo))
            finish_inputs()
    return out


# ----------------------------------------------------------------------------------------------------
# Stage 2: the windows, batch by batch


def decode_windows(setup: _Setup, todo: list[_Window]) -> Iterator[list[_Window]]:
    """Decode `todo` (windows with speech) --batch-size at a time; yield each batch once its windows hold their
    text, segments and finish reason. Each input's stats get its own windows' tokens, drafts and acceptance, and of
    each batch it had windows in a share of the costs: of the stages' times by its windows, of the decoding loop's
    calls and times by its rows' rounds (decoding.stats.rows_share), so the inputs add up to the batches'."""
    size = setup.opts.batch_size
    with torch.inference_mode():
        for start in range(0, len(todo), size):
            batch = todo[start : start + size]
            times, result, decoded = _decode_batch(setup, batch)
            loop_s = result.stats.wall_s if result is not None else 0.0
            for i in {id(w.input): w.input for w in batch}.values():
                s = i.stats
                part = sum(w.input is i for w in batch) / len(batch)  # its share of the batch's windows
                for name in ("features", "encoder", "cross_kv", "probe"):
                    setattr(s, f"{name}_s", getattr(s, f"{name}_s") + times[name] * part)
                s.total_s += (times["total"] - loop_s) * part
                mine = [k for k, w in enumerate(decoded) if w.input is i]  # its rows of the loop's result
                if result is not None and mine:
                    own = rows_share(result, mine)
                    merge_stats([own], s)
                    s.total_s += own.wall_s
                s.finish_reasons.extend(w.finish for w in batch if w.input is i)
            yield batch


def _decode_batch(setup: _Setup, batch: list[_Window]
                  ) -> tuple[dict[str, float], GenerationResult | None, list[_Window]]:
    """One batch of windows: encoder, cross-attention K/V and probe once, then the decoding loop over the rows
    with speech. -> (seconds per stage, the loop's result: None when every window was silence, the windows of its
    rows)."""
    target, device = setup.target, setup.target.device
    setup.threads.tick()
    t0 = _clock(device)
    feats = features(target, [w.window.audio for w in batch])
    t1 = _clock(device)
    encoded = encode(target, feats)
    t2 = _clock(device)
    kv = cross_kv(decoder_layers(target), encoded, cross_attention_dtype(target.model))
    t3 = _clock(device)
    no_speech, lang_logits = probe(target, encoded, kv, setup.ids)
    t4 = _clock(device)
    keep = _speech_rows(setup, batch, no_speech, lang_logits)
    result, draft_s, decoded = None, 0.0, [batch[r] for r in keep]
    if keep:
        rows = torch.tensor(keep, device=device)
        window = EncodedWindows([batch[r].window.audio for r in keep], encoded.index_select(0, rows),
                                [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in kv],
                                setup.opts.timestamps)
        result, draft_s = _generate(setup, decoded, window)
    t5 = _clock(device)
    return {"features": t1 - t0, "encoder": t2 - t1 + draft_s, "cross_kv": t3 - t2, "probe": t4 - t3,
            "total": t5 - t0}, result, decoded


def _speech_rows(setup: _Setup, batch: list[_Window], no_speech: torch.Tensor,
                 lang_logits: torch.Tensor | None) -> list[int]:
    """The rows of `batch` with speech; the others are marked silence. An input's language is detected on its
    first window with speech (--language auto, multilingual model)."""
    keep = []
    for r, w in enumerate(batch):
        if float(no_speech[r]) > setup.opts.no_speech_threshold:
            w.done, w.finish = True, "silence"
            w.input.stats.silent_windows += 1
            continue
        if w.input.language is None and lang_logits is not None:
            w.input.language = list(setup.ids.languages)[int(lang_logits[r].argmax())]
        keep.append(r)
    return keep


def _generate(setup: _Setup, rows: list[_Window], window: EncodedWindows) -> tuple[GenerationResult, float]:
    """The decoding loop over windows with speech; each window gets its text, segments and finish reason.
    -> (the loop's result, seconds spent fitting the draft: a different draft encoder, counted as encoder)."""
    opts, ids, device = setup.opts, setup.ids, setup.target.device
    decoder = ExactScorer if opts.speculative else WindowDecoder
    target = decoder(setup.target.model, window.encoded, window.kv, setup.hook)
    prompts = torch.tensor([prompt_ids(ids, w.input.language, opts.task, opts.timestamps) for w in rows], device=device)
    t0 = _clock(device)
    draft = None if setup.draft is None else setup.draft.fit(Batch(prompts, setup.hook, window))
    draft_s = _clock(device) - t0
    result = generate(
        target, draft, prompts, mode=opts.mode, gamma=opts.gamma, gamma_schedule=setup.schedule,
        params=setup.params, max_new_tokens=setup.max_new, eos_token_ids=[ids.eot], alpha=opts.alpha,
        beta=opts.beta, backend=opts.backend, vocab_size=setup.vocab, draft_stop_below=opts.draft_stop,
        threads=setup.threads,
    )
    for w, tokens, reason in zip(rows, result.tokens, result.finish_reasons):
        tokens = [t for t in tokens if t != ids.eot]
        if opts.timestamps:
            w.segments = timed_segments(tokens, ids.timestamp_begin, w.window, setup.target.tokenizer)
            tokens = [t for t in tokens if t < ids.timestamp_begin]
        w.text = setup.target.tokenizer.decode(tokens, skip_special_tokens=True).strip()
        w.done, w.finish = True, reason
    return result, draft_s


def probe(target: LoadedModel, encoded: torch.Tensor, kv, ids: SpecialIds) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One decoder step on <|startoftranscript|> for every row -> (P(no speech) [B], language logits
    [B, L] in the order of ids.languages, or None for an English-only model)."""
    dec = WindowDecoder(target.model, encoded, kv)
    B = encoded.shape[0]
    dec.reset()
    tokens = torch.full((B, 1), ids.sot, dtype=torch.long, device=encoded.device)
    positions = torch.zeros_like(tokens)
    logits = dec.forward(tokens, None, positions)[:, -1].float()  # [B, V]
    probs = logits.softmax(-1)
    no_speech = probs[:, ids.no_speech] if ids.no_speech is not None else torch.zeros(B, device=logits.device)
    lang = logits[:, list(ids.languages.values())] if ids.multilingual and ids.languages else None
    return no_speech, lang


def _clock(device) -> float:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def timed_segments(tokens: Sequence[int], begin: int, window: AudioWindow, tokenizer) -> list[tuple[float, float, str]]:
    """The segments of one window's tokens, Whisper's way: <|t0|> text <|t1|> (then <|t1|> text <|t2|> ...).
    Times are the window's start + (id − begin) × 0.02 s, at most its end; a text with no closing time (EOT or
    the token budget came first) ends at the window's end; empty texts are left out."""
    out, start, text, end = [], window.start_s, [], window.start_s + window.duration_s

    def close(end: float):
        words = tokenizer.decode(text, skip_special_tokens=True).strip()
        if words:
            out.append((start, max(start, end), words))

    for t in tokens:
        if t < begin:
            text.append(t)
            continue
        time = min(window.start_s + (t - begin) * TIME_PER_TOKEN, end)
        if text:  # a segment's end
            close(time)
            text = []
        start = time
    if text:
        close(end)
    return out


def count_windows(audio: np.ndarray) -> int:
    """Windows of `audio` that will reach the model (not silent)."""
    return sum(not is_silent(w.audio) for w in windows(audio))


def check_inputs(paths: Sequence[str]) -> list[np.ndarray]:
    """Every input read (16 kHz mono float32) before any model loads; bad input raises SpecdecError."""
    if not paths:
        raise SpecdecError("no audio file given")
    return [load_audio(p) for p in paths]


# ----------------------------------------------------------------------------------------------------
# Loading


def load_draft(draft_spec: str, target: LoadedModel, options: TranscribeOptions | None = None, *,
               progress: bool = True, **overrides) -> Draft:
    """The draft for a loaded target (drafts.build): `self`, `self:K`, `self:0-2,4` (the lean self draft),
    another Whisper model, lookup or lookup+DRAFT. options (default: the CLI's) with `overrides` applied say its
    output layer (draft_vocab), weights (draft_quantized) and whether it scores timestamps (timestamps)."""
    opts = (options or TranscribeOptions()).replace(**overrides)
    return drafts.build(draft_spec, target, WHISPER, opts, progress=progress)


def load_pair(opts: TranscribeOptions, progress: bool = True) -> tuple[LoadedModel, Draft | None]:
    """(target, draft) for `opts`; draft is None for autoregressive, else load_draft's. --target-int8: the
    target's decoder and output linears in int8 (models/int8.py), after the draft took what it copies from the
    target's weights (a self draft's int4 or int8 layers are its own). --encoder-int8: the encoder's linears on
    Q6_K blocks (models/int8.py), the target's and a Whisper draft's that runs its own."""
    target, draft = drafts.load_pair(opts, WHISPER, progress=progress)
    if opts.target_int8:
        if target.device.type != "cpu":
            raise SpecdecError(f"--target-int8 runs on a CPU only (the target is on {target.device})")
        int8.quantize_linears(target.model.model.decoder)  # the encoder: --encoder-int8
        target.model.proj_out = int8.Int8Linear(target.model.proj_out)
    if target.device.type == "cpu":  # the C++ kernels its steps run, built now: no recording's time holds a build
        lean = getattr(drafts.model_draft(draft), "lean", None)  # a lean self draft's decoder (lookup+self's too)
        lean_rows = getattr(lean, "weights", None) is not None  # int8 or int4 rows
        float_run = takes_kernel(target.model.proj_out)  # its decoder's linears (not int8 ones)
        build_kernels(progress, (rows_attention.KERNEL, *((int8_rows.KERNEL,) if opts.target_int8 or lean_rows else ()),
                                 *((qmatmul.KERNEL,) if opts.encoder_int8 else ()),
                                 *((lean_layers.KERNEL,) if lean_rows else ()), *((float_rows.KERNEL,) if float_run else ()),
                                 *((frames_attention.KERNEL,) if frames_attention.cpu_takes() else ())))
    if opts.encoder_int8 and target.device.type == "cpu":  # after the draft checked whether it shares the encoder
        other = drafts.model_draft(draft)  # a Whisper draft running its own encoder: that one too
        own = [other.loaded] if isinstance(other, WhisperDraft) and not other.shares_encoder else []
        for model in (target, *own):
            int8.quantize_encoder(model.model.model.encoder, model.model.config.max_source_positions,
                                  source=model.path)
    return target, draft


def joined_librivox(repeats: int = 3) -> tuple[np.ndarray, str] | None:
    """A long recording made of the LibriVox clips of pocketsphinx-testdata, in id order, `repeats` times
    over (3: 74 s, three ≤ 30 s windows), and its reference text; None when the clips are not installed."""
    clips = librivox_clips()
    if not clips:
        return None
    audio = np.concatenate([load_audio(w) for w, _ in clips] * repeats)
    return audio, " ".join(ref for _, ref in clips * repeats)

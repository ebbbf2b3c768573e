"""Speech recognition: audio files in, transcripts out, through the speculative decoding loop with a
Whisper target.

Per input file:

    load_audio (any format, rate, channels → 16 kHz mono) → windows (≤ 30 s, cut in pauses: audio.windows)
    → per window: silent? → empty, no model call
                  log-mel features → the target's encoder, ONCE
                  → every decoder layer's cross-attention K/V, ONCE, shared by the target, the draft and the
                    probe (a self draft's layers are the target's own: the same K/V)
                  → the probe: one decoder step on <|startoftranscript|>: the language (multilingual model,
                    --language auto: detected on the file's first window with speech) and the no-speech
                    probability (above options' no_speech_threshold the window is silence: no hallucinated text)
                  → generate(target, draft) on [<sot>, <lang>, <task>, <notimestamps>]; with timestamps on
                    [<sot>, <lang>, <task>], the timestamp rules in the logits hook (whisper_scoring.TimestampRules)
    → the windows' texts joined with one space (the cuts lie in pauses: no word is split, dropped or doubled);
      segments: one per window, or with timestamps the model's own, their times offset by the window's start.

The default draft, `self`, is the target's own decoder in a lean int4 decoding step with a reduced output layer
(drafts/lean_whisper.py). The draft proposes γ tokens one at a time, then the target scores the γ+1 slots in one
pass (whisper_scoring.ExactScorer), which costs about what one token costs: that is the saving. Another Whisper
model (`--draft DIR-or-ID`, same vocabulary) is a ModelDraft: it reuses the target's encoder output when its
encoder has the same weights.

Exactness: greedy output is the autoregressive output, token for token. The target's one pass over γ+1 slots
gives every row bit for bit the logits a one-token step gives in bf16 (whisper_scoring.ExactScorer: attention
row by row, a lone row through a linear layer computed as two), so verification compares the draft with
exactly the autoregressive logits. (In fp32 MKL rounds a many-row GEMM differently from a one-row GEMV: only
a tie within that rounding could flip.) Cross-attention runs in fp32 on a CPU (models.whisper.
cross_attention_dtype: ~8× faster than torch's bf16 kernel for a few queries), in every mode alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from specdec_cli import drafts
from specdec_cli.decoding import GenerationStats, SamplingParams, generate, make_schedule, merge_stats
from specdec_cli.drafts import lean_whisper
from specdec_cli.drafts.lookup import Lookup
from specdec_cli.drafts.lookup import drafter as lookup_drafter
from specdec_cli.drafts.lookup import parts as lookup_parts
from specdec_cli.drafts.subset_head import frequent_ids, restrict_head
from specdec_cli.errors import SpecdecError
from specdec_cli.models import LoadedModel, int8
from specdec_cli.models.whisper import (TIME_PER_TOKEN, WHISPER, SpecialIds, check_language_task, check_timestamps,
                                        cross_attention_dtype, decoder_layers, prompt_ids, special_ids)
from specdec_cli.options import TranscribeOptions
from specdec_cli.tasks.audio import SAMPLE_RATE, AudioWindow, is_silent, librivox_clips, load_audio, windows
from specdec_cli.tasks.whisper_scoring import ExactScorer, Suppressor, WindowDecoder, cross_kv


@dataclass
class TranscribeStats(GenerationStats):
    """GenerationStats summed over an input's windows (wall_s: the decoding loops), plus the rest."""

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
# Transcription


@dataclass
class _Window:
    input: int  # index into the inputs
    window: AudioWindow
    silent: bool
    text: str = ""
    finish: str = "silence"
    segments: list[tuple[float, float, str]] = field(default_factory=list)  # with timestamps


def _clock(device) -> float:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def features(model: LoadedModel, audio: Sequence[np.ndarray]) -> torch.Tensor:
    """Log-mel features [B, mels, 3000] of each (≤ 30 s) audio, padded as Whisper expects."""
    fe = model.feature_extractor
    out = fe(list(audio), sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
    return out.to(device=model.device, dtype=model.dtype)


def encode(model: LoadedModel, feats: torch.Tensor) -> torch.Tensor:
    return model.model.model.encoder(feats).last_hidden_state


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


def transcribe(
    target: LoadedModel,
    draft,
    inputs: Sequence[str],
    options: TranscribeOptions | None = None,
    *,
    audios: Sequence[np.ndarray] | None = None,
    on_window=None,
    on_transcript=None,
    **overrides,
) -> list[Transcript]:
    """Transcripts of `inputs` (paths, read with load_audio unless `audios` gives the 16 kHz samples), in input
    order. draft: a LeanDraft or a ModelDraft (load_pair), None for mode autoregressive. options: the
    TranscribeOptions (default: the CLI's defaults), with `overrides` applied (e.g. mode="autoregressive").
    on_window(done, total) after each batch of windows; on_transcript(transcript) as soon as an input's last
    window is decoded (in input order: e.g. to write its file then)."""
    opts = (options or TranscribeOptions()).replace(**overrides).validate()
    if opts.speculative and draft is None:
        raise SpecdecError(f"mode {opts.mode!r} needs a draft model")
    if opts.speculative and opts.timestamps and not draft.timestamps:
        raise SpecdecError("--timestamps: this draft's output layer leaves out the timestamp tokens "
                           "(load it with timestamps=True)")
    language = (opts.language or "auto").lower()
    check_language_task(target, language, opts.task)
    if opts.timestamps:
        check_timestamps(target)
    ids = special_ids(target)
    speculative = opts.speculative
    vocab = draft.vocab if speculative else target.output_size
    whisper = target.model
    device = target.device
    params = SamplingParams.of(opts)
    schedule = make_schedule(opts.gamma_schedule, opts.gamma)  # one for every window: what it measured carries over
    if audios is None:
        audios = [load_audio(p) for p in inputs]
    if len(audios) != len(inputs):
        raise ValueError("one audio per input")

    prompt_len = len(prompt_ids(ids, "en" if ids.multilingual else None, opts.task, opts.timestamps))
    limit = int(getattr(whisper.config, "max_target_positions", 448)) - prompt_len
    max_new = max(1, min(opts.max_new_tokens, limit))
    hook = Suppressor(target, prompt_len, vocab, opts.timestamps)
    batch_size = opts.batch_size

    stats = [TranscribeStats(opts.mode, opts.gamma if speculative else 0, opts.gamma_schedule, batch_size,
                             task=opts.task, language=None if ids.multilingual else "en")
             for _ in inputs]
    langs: list[str | None] = [None if language == "auto" else language for _ in inputs]
    if not ids.multilingual:
        langs = ["en"] * len(inputs)
    work: list[_Window] = []
    for i, audio in enumerate(audios):
        stats[i].audio_s = len(audio) / SAMPLE_RATE
        for w in windows(audio):
            work.append(_Window(i, w, is_silent(w.audio)))
            stats[i].windows += 1
    todo = [w for w in work if not w.silent]
    for w in work:
        if w.silent:
            stats[w.input].silent_windows += 1

    out: list[Transcript] = []
    last_todo = {w.input: k for k, w in enumerate(todo)}  # input -> its last window that reaches the model

    def finish_inputs(decoded: int) -> None:
        """Transcripts of the inputs, in order, whose windows are all among the first `decoded` of todo."""
        while len(out) < len(inputs) and last_todo.get(len(out), -1) < decoded:
            i = len(out)
            mine = [w for w in work if w.input == i]
            s = stats[i]
            s.language = langs[i]
            s.decoder_s = s.wall_s
            reasons = {w.finish for w in mine}
            reason = "length" if "length" in reasons else "eos" if "eos" in reasons else "silence"
            segs = ([seg for w in mine for seg in w.segments] if opts.timestamps else
                    [(w.window.start_s, w.window.start_s + w.window.duration_s, w.text) for w in mine])
            out.append(Transcript(inputs[i], " ".join(w.text for w in mine if w.text), reason, s.finish(), segs))
            if on_transcript:
                on_transcript(out[-1])

    finish_inputs(0)
    with torch.inference_mode():
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            owners = sorted({w.input for w in batch})
            t0 = _clock(device)
            feats = features(target, [w.window.audio for w in batch])
            t1 = _clock(device)
            encoded = encode(target, feats)
            t2 = _clock(device)
            kv = cross_kv(decoder_layers(target), encoded, cross_attention_dtype(whisper))
            t3 = _clock(device)
            no_speech, lang_logits = probe(target, encoded, kv, ids)
            t4 = _clock(device)
            keep = []
            for r, w in enumerate(batch):
                if float(no_speech[r]) > opts.no_speech_threshold:
                    w.silent, w.finish = True, "silence"
                    stats[w.input].silent_windows += 1
                    continue
                if langs[w.input] is None and lang_logits is not None:
                    langs[w.input] = list(ids.languages)[int(lang_logits[r].argmax())]
                keep.append(r)
            t_draft_enc = 0.0
            results = None
            if keep:
                rows = torch.tensor(keep, device=device)
                enc_k = encoded.index_select(0, rows)
                kv_k = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in kv]
                target_dec = (ExactScorer if speculative else WindowDecoder)(whisper, enc_k, kv_k, hook)
                draft_dec = None
                if speculative:
                    td = _clock(device)
                    draft_dec = draft.for_window([batch[r].window.audio for r in keep], enc_k, kv_k, hook)
                    t_draft_enc = _clock(device) - td
                prompts = torch.tensor([prompt_ids(ids, langs[batch[r].input], opts.task, opts.timestamps) for r in keep],
                                       device=device)
                results = generate(
                    target_dec, draft_dec, prompts, mode=opts.mode, gamma=opts.gamma,
                    gamma_schedule=schedule, params=params, max_new_tokens=max_new,
                    eos_token_ids=[ids.eot], alpha=opts.alpha, beta=opts.beta, backend=opts.backend,
                    vocab_size=vocab, draft_stop_below=opts.draft_stop,
                )
                for j, r in enumerate(keep):
                    w = batch[r]
                    tokens = [t for t in results.tokens[j] if t != ids.eot]
                    if opts.timestamps:
                        w.segments = timed_segments(tokens, ids.timestamp_begin, w.window, target.tokenizer)
                        tokens = [t for t in tokens if t < ids.timestamp_begin]
                    w.text = target.tokenizer.decode(tokens, skip_special_tokens=True).strip()
                    w.finish = results.finish_reasons[j]
            t5 = _clock(device)
            for i in owners:  # an input's stats: those of the batches its windows ran in
                s = stats[i]
                s.features_s += t1 - t0
                s.encoder_s += t2 - t1 + t_draft_enc
                s.cross_kv_s += t3 - t2
                s.probe_s += t4 - t3
                s.total_s += t5 - t0
                if results is not None:
                    merge_stats([results.stats], s)
                s.finish_reasons.extend(batch[r].finish for r in range(len(batch)) if batch[r].input == i)
            if on_window:
                on_window(min(start + batch_size, len(todo)), len(todo))
            finish_inputs(start + len(batch))

    return out


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
# Drafts and loading


def _same_encoder(a, b) -> bool:
    """True when two Whisper models have the same encoder: the same module, or equal weights."""
    ea, eb = a.model.encoder, b.model.encoder
    if ea is eb:
        return True
    pa, pb = dict(ea.named_parameters()), dict(eb.named_parameters())
    if pa.keys() != pb.keys():
        return False
    for k, x in pa.items():
        y = pb[k]
        if x.data_ptr() == y.data_ptr() and x.shape == y.shape and x.dtype == y.dtype:
            continue
        if x.shape != y.shape or not torch.equal(x.to(y.dtype), y):
            return False
    return True


class ModelDraft:
    """Another Whisper model as the draft (same vocabulary): its own decoder, fed the target's encoder output
    when the two encoders have the same weights, else its own encoder's. For the task, a draft is anything
    with `vocab`, `timestamps` (its output layer scores the timestamp ids) and `for_window(audio, encoded, kv,
    hook) -> Decoder` (lean_whisper.LeanDraft is the other)."""

    def __init__(self, loaded: LoadedModel, target: LoadedModel, vocab: int, timestamps: bool = True):
        self.loaded, self.vocab, self.name = loaded, vocab, loaded.name
        self.timestamps = timestamps  # its output layer scores the timestamp ids
        self.shares_encoder = _same_encoder(target.model, loaded.model)

    def for_window(self, audio, encoded, kv, hook=None) -> WindowDecoder:
        if not self.shares_encoder:
            encoded = encode(self.loaded, features(self.loaded, audio))
        return WindowDecoder(self.loaded.model, encoded, cross_kv(decoder_layers(self.loaded), encoded), hook)


def _draft_makers(opts: TranscribeOptions) -> dict:
    """How a draft is made for a Whisper target (drafts.load_draft): `self…` is a LeanDraft with the draft_vocab
    first ids, EOT and (with timestamps) the timestamp ids in its output layer; another model keeps those rows
    of its head and becomes a ModelDraft."""

    def self_draft(target, spec):
        return lean_whisper.self_draft(target, spec, opts.draft_vocab, opts.draft_quantized, opts.timestamps)

    def adopt(target, draft, vocab):
        restricted = 0 < opts.draft_vocab < draft.output_size
        if restricted:
            extra = lean_whisper.head_extras(target, opts.timestamps)
            keep = torch.cat([frequent_ids(opts.draft_vocab, draft.output_size), torch.tensor(extra)]).unique()
            restrict_head(draft.model, keep)
        return ModelDraft(draft, target, vocab, timestamps=opts.timestamps or not restricted)

    return {"self_draft": self_draft, "adopt": adopt}


class LookupDraft:
    """--draft lookup (and lookup+DRAFT) for Whisper: prompt lookup within each window, over its prompt and the text
    decoded so far (drafts/lookup.py), then DRAFT's decoder where no n-gram matched."""

    def __init__(self, lookup: Lookup, model, vocab: int):
        self.lookup, self.model, self.vocab = lookup, model, vocab
        self.timestamps = model is None or model.timestamps  # lookup proposes whatever the window holds

    def for_window(self, audio, encoded, kv, hook=None):
        return lookup_drafter(self.lookup, None if self.model is None else self.model.for_window(audio, encoded, kv, hook))


def _task_draft(draft, target: LoadedModel):
    """What drafts.load_draft gave, as transcribe() takes it: a lookup becomes a LookupDraft."""
    lookup, model = lookup_parts(draft)
    if lookup is None:
        return model
    return LookupDraft(lookup, model, target.output_size if model is None else model.vocab)


def load_draft(draft_spec: str, target: LoadedModel, options: TranscribeOptions | None = None, *,
               progress: bool = True, **overrides):
    """The draft for a loaded target: a LeanDraft (`self`, `self:K`, `self:0-2,4`), a ModelDraft or a LookupDraft.
    options (default: the CLI's) with `overrides` applied say its output layer (draft_vocab) and weights
    (draft_quantized)."""
    opts = (options or TranscribeOptions()).replace(**overrides)
    return _task_draft(drafts.load_draft(draft_spec, target, WHISPER, progress=progress, **_draft_makers(opts)), target)


def load_pair(opts: TranscribeOptions, progress: bool = True):
    """(target, draft) for `opts`; draft is None for autoregressive, else load_draft's. --target-int8: the
    target's decoder and output linears in int8 (models/int8.py), after the draft took what it copies from the
    target's weights (a self draft's int4 layers are its own)."""
    target, draft = drafts.load_pair(opts, WHISPER, progress=progress, **_draft_makers(opts))
    draft = None if draft is None else _task_draft(draft, target)
    if opts.target_int8:
        if target.device.type != "cpu":
            raise SpecdecError(f"--target-int8 runs on a CPU only (the target is on {target.device})")
        int8.quantize_linears(target.model.model.decoder)  # the encoder stays: see models/int8.py
        target.model.proj_out = int8.Int8Linear(target.model.proj_out)
    return target, draft


def joined_librivox(repeats: int = 3) -> tuple[np.ndarray, str] | None:
    """A long recording made of the LibriVox clips of pocketsphinx-testdata, in id order, `repeats` times
    over (3: 74 s, three ≤ 30 s windows), and its reference text; None when the clips are not installed."""
    clips = librivox_clips()
    if not clips:
        return None
    audio = np.concatenate([load_audio(w) for w, _ in clips] * repeats)
    return audio, " ".join(ref for _, ref in clips * repeats)

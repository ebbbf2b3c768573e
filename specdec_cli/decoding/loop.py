"""The decoding loop: autoregressive and speculative, for Hugging Face decoders with KV caches.

    prefill both models -> repeat { γ from the schedule (schedule.py) -> draft γ tokens -> score γ+1
    positions with the target in one pass -> verify -> crop both caches to the accepted length } until EOS
    or max_new_tokens. A round of γ = 0 is one plain step of the target alone.

Both models share one grid of cache slots (slots.py). Between rounds the last slot (`pending`) holds each row's
newest token, which neither cache has seen yet; the target cache holds every slot before it; the draft cache
may lag behind (it never sees its own last draft token when all are accepted) and is fed the missing slots next
round. The caches are cropped to the longest row.

A model enters through a `Decoder` (adapters.py), a draft through the `Draft` protocol (draft.py), a
verification mode through its `Verifier` (verify.py); the accept/reject rule is kernels/reference.py's.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from specdec_cli import options
from specdec_cli.decoding import schedule as schedules
from specdec_cli.decoding.adapters import Decoder
from specdec_cli.decoding.draft import Draft, DraftSettings, Proposal, as_draft, fit_vocab
from specdec_cli.decoding.llama_like import decoder_for
from specdec_cli.decoding.sampling import SamplingParams, process_logits, sample_logits, uniforms
from specdec_cli.decoding.schedule import Round
from specdec_cli.decoding.slots import Slots
from specdec_cli.decoding.stats import GenerationResult, GenerationStats, merge_stats
from specdec_cli.decoding.threads import Threads
from specdec_cli.decoding.verify import LOGITS, VERIFIERS, Verifier, verify_greedy
from specdec_cli.errors import SpecdecError
from specdec_cli.kernels import Verification

MODES = (options.AUTOREGRESSIVE, *options.VERIFY_MODES)  # generate() also runs the reference, for tests


# ----------------------------------------------------------------------------------------------------
# The stages


PREFILL_CHUNK = 1024  # a longer prompt is read in pieces of this many slots, with progress after each


def prefill(decoders: list[Decoder], slots: Slots, on_progress=None) -> None:
    """Every slot before `pending` into each cache. A prompt longer than PREFILL_CHUNK is read piece by piece
    (the same in every mode, so greedy speculative output stays the autoregressive one); on_progress(done,
    total) counts the slots read, over all decoders."""
    end = slots.pending
    total, done = end * len(decoders), 0
    for decoder in decoders:
        decoder.prefill(*slots.window(0, min(end, PREFILL_CHUNK)))
        done += min(end, PREFILL_CHUNK)
        for start in range(PREFILL_CHUNK, end, PREFILL_CHUNK):
            if on_progress is not None:
                on_progress(done, total)
            decoder.forward(*slots.window(start, min(end, start + PREFILL_CHUNK)), keep=1)
            done += min(end, start + PREFILL_CHUNK) - start
    if on_progress is not None and end > PREFILL_CHUNK:
        on_progress(total, total)


def score(decoder: Decoder, slots: Slots, start: int) -> torch.Tensor:
    """The target over slots start..end (pending + γ draft tokens) in one pass -> logits [B, γ+1, V]."""
    return decoder.forward(*slots.window(start, slots.length))


def verify(verifier: Verifier, proposal: Proposal, target_logits: torch.Tensor, settings: DraftSettings,
           alpha: float, beta: float, backend: str) -> Verification:
    """The accept/reject rule lives in kernels/reference.py, reached through the mode's Verifier; this only
    prepares its inputs: the draft's probabilities or logits as the verifier reads them (neither: a
    deterministic draft, one-hot), the uniforms, and the target's logits in the draft's space.

    Greedy: accept while draft == target argmax, in every mode. Sampling: the target distribution must be
    processed exactly as the draft's was (÷T fused in the kernel when only temperature is on; top-k/top-p
    applied here, then temperature 1)."""
    params = settings.params
    if params.greedy:
        return verify_greedy(proposal.tokens, target_logits)
    B, gamma = proposal.tokens.shape
    temperature = params.temperature
    if params.filtered:
        target_logits, temperature = process_logits(target_logits, params), 1.0
    u = uniforms((B, gamma + 1), settings.generator)  # [B, γ+1]
    draft = proposal.logits if verifier.reads == LOGITS else proposal.probs
    if draft is None and not verifier.one_hot:
        raise verifier.refuse_one_hot()
    kernel = verifier.kernel(backend, target_logits.device)
    return kernel(proposal.tokens, draft, target_logits, u, temperature, alpha, beta)  # flags read with the counts


# ----------------------------------------------------------------------------------------------------
# generate


class _Rows:
    """Per-row bookkeeping on the host: outputs, budget, which input row each active row is."""

    def __init__(self, batch: int, max_new_tokens: int, eos: set[int], stats: GenerationStats):
        self.index = list(range(batch))  # active row -> input row
        self.tokens: list[list[int]] = [[] for _ in range(batch)]
        self.reasons = ["length"] * batch
        self.max_new = max_new_tokens
        self.eos = eos
        self.stats = [GenerationStats(stats.mode, stats.gamma, stats.gamma_schedule, 1) for _ in range(batch)]

    def count(self, gamma: int, accepted: list[int], speculative: bool) -> None:
        """A round's calls, drafts and γ (0: a plain step), each active row's in its input row's stats."""
        for a, n in enumerate(accepted):
            s = self.stats[self.index[a]]
            s.count(gamma, [n])
            if speculative:
                s.gamma_history.append(gamma)

    def remaining(self) -> list[int]:
        return [self.max_new - len(self.tokens[i]) for i in self.index]

    def emit(self, emitted: list[list[int]]) -> tuple[list[int], int]:
        """Append each active row's new tokens, cut at its first EOS and at its budget.
        -> (active rows that are still going, tokens emitted)."""
        going, count = [], 0
        for a, new in enumerate(emitted):
            row = self.index[a]
            new = new[: self.max_new - len(self.tokens[row])]
            for j, t in enumerate(new):
                if t in self.eos:  # an EOS ends the sequence right there
                    new = new[: j + 1]
                    self.reasons[row] = "eos"
                    break
            self.tokens[row].extend(new)
            self.stats[row].new_tokens += len(new)
            count += len(new)
            if self.reasons[row] != "eos" and len(self.tokens[row]) < self.max_new:
                going.append(a)
        return going, count


@dataclass(frozen=True)
class _Run:
    """What stays fixed through one generate() call."""

    target: Decoder
    draft: Draft | None  # None: autoregressive
    verifier: Verifier | None  # None: autoregressive
    settings: DraftSettings
    alpha: float
    beta: float
    backend: str

    @property
    def device(self) -> torch.device:
        return self.target.device


def generate(
    target,
    draft,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    mode: str = options.DecodeOptions.mode,
    gamma: int = options.DecodeOptions.gamma,
    gamma_schedule=options.DecodeOptions.gamma_schedule,
    params: SamplingParams | None = None,
    max_new_tokens: int = options.DecodeOptions.max_new_tokens,
    eos_token_ids: Iterable[int] | int | None = (),
    alpha: float = options.DecodeOptions.alpha,
    beta: float = options.DecodeOptions.beta,
    backend: str = options.DecodeOptions.backend,
    vocab_size: int | None = None,
    draft_stop_below: float = options.DecodeOptions.draft_stop,
    on_prefill=None,
    threads: Threads | None = None,
) -> GenerationResult:
    """Decode `input_ids` [B, T] (any padding side; attention_mask [B, T] marks real tokens).

    target: a transformers causal LM (run as llama_like.decoder_for drives it: its passes compute each row as its steps do, so
    greedy output is its own generate()'s, in bf16 too) or a `Decoder`; draft: a `Draft` fitted to these rows (draft.py), or a
    transformers model or Decoder (as transformers' assistant_model; unused, may be None, for autoregressive).
    gamma_schedule: a name (options.GAMMA_SCHEDULES; γ is its start, or for auto its upper bound) or a
    schedule object (schedule.make), which keeps what it measured from one call to the next. params:
    temperature, top-k, top-p, seed (default: greedy). vocab_size: the V both models' logits are cut to
    (models.check_compatible's answer when lm_heads carry padding rows); default: the draft's `vocab`, else the
    target's lm_head rows. draft_stop_below: end a round's drafting early when the draft is unsure
    (ModelDraft.propose); 0 = always draft γ. on_prefill(done, total): progress through a long prompt. threads:
    the run's thread count, looked at before the prefill and after each round (threads.py; None: left as it is).
    Returns the new tokens of each row and the run's stats."""
    options.one_of("--mode", mode, MODES)
    verifier = VERIFIERS.get(mode)  # None: autoregressive
    if verifier is not None:
        options.check_gamma(gamma)
    schedule = schedules.make(gamma_schedule, gamma)
    draft = as_draft(draft) if verifier is not None else None
    if verifier is not None and draft is None:
        raise SpecdecError(f"mode {mode!r} needs a draft model")
    options.at_least("--max-new-tokens", max_new_tokens, 0)
    params = SamplingParams() if params is None else params
    eos = {eos_token_ids} if isinstance(eos_token_ids, int) else set(eos_token_ids or ())
    target = target if isinstance(target, Decoder) else decoder_for(target)  # steps and passes alike
    if draft is not None and input_ids.shape[0] > 1 and _sliding(target, draft):
        return _row_by_row(target, draft, input_ids, attention_mask, schedule, mode=mode, gamma=gamma, params=params,
                           max_new_tokens=max_new_tokens, eos_token_ids=eos, alpha=alpha, beta=beta, backend=backend,
                           vocab_size=vocab_size, draft_stop_below=draft_stop_below, on_prefill=on_prefill,
                           threads=threads)
    with torch.inference_mode():
        slots = Slots(input_ids, attention_mask, target.device)
        stats = GenerationStats(mode, gamma if draft is not None else 0, schedule.name, slots.rows)
        rows = _Rows(slots.rows, max_new_tokens, eos, stats)
        if max_new_tokens > 0:
            vocab = vocab_size or (draft.vocab if draft is not None else None) or target.vocab_size
            settings = DraftSettings(params, params.generator(target.device), vocab,
                                     keep_logits=verifier is not None and verifier.reads == LOGITS,
                                     stop_below=draft_stop_below)
            _decode(_Run(target, draft, verifier, settings, alpha, beta, backend), slots, rows, schedule, stats,
                    on_prefill, threads)
    return GenerationResult(rows.tokens, rows.reasons, stats.finish(), rows.stats)


def _sliding(target: Decoder, draft: Draft) -> bool:
    """Whether a model of the pair attends within a sliding window (Decoder.sliding_window)."""
    return any(d.sliding_window for d in (target, *draft.decoders))


def _row_by_row(target, draft, input_ids, attention_mask, schedule, **kwargs) -> GenerationResult:
    """generate() one row at a time, the results put together: for a sliding-window model, whose window counts
    slots, a row must never hold a hole (the rejected slots a batch keeps for rows that accepted fewer) or it
    would see fewer than W of its own tokens. The schedule carries over from row to row."""
    results = [generate(target, draft, input_ids[b : b + 1], None if attention_mask is None else attention_mask[b : b + 1],
                        gamma_schedule=schedule, **kwargs) for b in range(input_ids.shape[0])]
    first = results[0].stats
    stats = GenerationStats(first.mode, first.gamma, first.gamma_schedule, input_ids.shape[0])
    merge_stats([r.stats for r in results], stats)
    return GenerationResult([t for r in results for t in r.tokens], [f for r in results for f in r.finish_reasons],
                            stats.finish(), [s for r in results for s in r.rows])


def _decode(run: _Run, slots: Slots, rows: _Rows, schedule, stats: GenerationStats, on_prefill,
            threads: Threads | None) -> None:
    """Prefill, then rounds until every row is done."""
    decoders = [run.target, *(run.draft.decoders if run.draft is not None else ())]
    tick = threads.tick if threads is not None else lambda: None
    tick()
    t_start = _clock(run.device)
    prefill(decoders, slots, on_prefill)
    if run.draft is not None:
        for decoder in decoders:
            decoder.check_rollback()
    stats.prefill_s = _clock(run.device) - t_start
    while True:
        g = min(schedule.next(), max(rows.remaining()) - 1) if run.draft is not None else 0  # never overshoot
        slots.ensure(g + 1)
        start = slots.pending
        out, r = _speculate(run, slots, g) if g > 0 else _decode_one_token(run, slots)
        stats.record(r, run.draft is not None)
        rows.count(r.gamma if run.draft is not None else 0, r.accepted, run.draft is not None)
        schedule.observe(r)
        tick()
        going = _commit(run, slots, rows, out, r.accepted, start, stats)
        if not going:
            break
        if len(going) < len(r.accepted):
            _select(going, slots, decoders, rows)
    stats.wall_s = _clock(run.device) - t_start
    stats.schedule = schedule.estimates()


def _decode_one_token(run: _Run, slots: Slots) -> tuple[torch.Tensor, Round]:
    """The target alone: logits at `pending` -> one token per row. -> (out [B, 1], the Round: γ 0)."""
    t0 = _clock(run.device)
    params = run.settings.params
    logits = run.target.forward(*slots.window(slots.pending, slots.length), keep=1)[:, -1]
    logits = fit_vocab(logits, run.settings.vocab)  # [B, V]
    B = logits.shape[0]
    token, _ = sample_logits(logits, params, None if params.greedy else uniforms(B, run.settings.generator))
    return token[:, None], Round(0, [0] * B, target_s=_clock(run.device) - t0)


def _speculate(run: _Run, slots: Slots, g: int) -> tuple[torch.Tensor, Round]:
    """One speculative round: draft γ (or fewer), score γ+1, verify. -> (out_tokens [B, γ+1], the Round).
    A draft that proposes nothing (no n-gram matched) makes the round one plain step."""
    assert run.draft is not None and run.verifier is not None
    start = slots.pending
    t0 = _clock(run.device)
    proposal = run.draft.propose(slots, g, run.settings)
    slots.extend(proposal.tokens)  # the target scores them next
    asked, g = g, proposal.tokens.shape[1]  # the draft may stop early
    t1 = _clock(run.device)
    if g == 0:
        out, r = _decode_one_token(run, slots)
        r.asked, r.draft_s = asked, t1 - t0
        return out, r
    target_logits = fit_vocab(score(run.target, slots, start), run.settings.vocab)  # [B, γ+1, V]
    t2 = _clock(run.device)
    verified = verify(run.verifier, proposal, target_logits, run.settings, run.alpha, run.beta, run.backend)
    accepted = verified.accepted()  # the one host sync of the round
    t3 = _clock(run.device)
    return verified.out_tokens, Round(g, accepted, asked, draft_s=t1 - t0, target_s=t2 - t1, verify_s=t3 - t2,
                                      catch_up=proposal.catch_up, backend=verified.backend)


def _commit(run: _Run, slots: Slots, rows: _Rows, out: torch.Tensor, accepted: list[int], start: int,
            stats: GenerationStats) -> list[int]:
    """Keep each row's accepted slots and its new token (Slots.commit), crop both caches to the longest row,
    emit the tokens. -> active rows still going."""
    new_token = out.gather(1, torch.tensor(accepted, device=out.device)[:, None]).squeeze(1)  # [B]
    pending = slots.commit(start, accepted, new_token)
    run.target.crop(pending)
    if run.draft is not None:
        run.draft.crop(pending)
    out_rows = out[:, : max(accepted) + 1].tolist()
    emitted = [r[: a + 1] for r, a in zip(out_rows, accepted)]
    going, count = rows.emit(emitted)
    stats.new_tokens += count
    return going


def _select(going: list[int], slots: Slots, decoders: list[Decoder], rows: _Rows) -> None:
    """Drop finished rows from the slots, the caches and the bookkeeping."""
    idx = torch.tensor(going, device=slots.tokens.device)
    slots.select(idx)
    for decoder in decoders:
        decoder.select(idx)
    rows.index = [rows.index[a] for a in going]


def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()

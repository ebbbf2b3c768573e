"""The decoding loop: autoregressive and speculative, for Hugging Face decoders with KV caches.

    prefill both models -> repeat { γ from the schedule (schedule.py) -> draft γ tokens -> score γ+1
    positions with the target in one pass -> verify -> crop both caches to the accepted length } until EOS
    or max_new_tokens. A round of γ = 0 is one plain step of the target alone.

Layout. All rows of a batch share one grid of cache *slots*. Slot s of row b holds a token, a validity
bit and a position id. Prompts are left-padded (pad slots invalid). Each round every row uses the same
γ+1 new slots; a row that accepted fewer draft tokens than the longest row keeps its rejected slots
in the cache, marked invalid (attention mask 0), and position ids count only valid slots, so every
row sees exactly its own contiguous sequence. The caches are cropped to the longest row.

Invariant between rounds: the last slot (`pending`) holds each row's newest token, which neither cache
has seen yet; the target cache holds every slot before it; the draft cache may lag behind (it never
sees its own last draft token when all are accepted) and is fed the missing slots next round.

A model enters through a `Decoder` (adapters.py), a draft through a `Drafter` (drafter.py: a draft model, or
a draft without one such as prompt lookup); the accept/reject rule is kernels/reference.py's, reached through
verify.py.
"""

from __future__ import annotations

import time
from typing import Iterable

import torch

from specdec_cli import options
from specdec_cli.decoding import verify as verification
from specdec_cli.decoding.adapters import Decoder, as_decoder
from specdec_cli.decoding.drafter import Drafter, Proposal, as_drafter, fit_vocab
from specdec_cli.decoding import schedule as schedules
from specdec_cli.decoding.sampling import SamplingParams, process_logits, sample_logits, uniforms
from specdec_cli.decoding.schedule import Round
from specdec_cli.decoding.stats import GenerationResult, GenerationStats
from specdec_cli.errors import SpecdecError

MODES = ("autoregressive", *options.VERIFY_MODES)  # generate() also runs the reference, for tests


# ----------------------------------------------------------------------------------------------------
# The slot grid shared by both models


class _Slots:
    """tokens, validity and positions of every slot, for the rows still decoding."""

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, device):
        rows = _left_padded_rows(input_ids, attention_mask)
        B, T = len(rows), max(len(r) for r in rows)
        capacity = T + 64
        self.tokens = torch.zeros(B, capacity, dtype=torch.int64)  # [B, S]
        self.valid = torch.zeros(B, capacity, dtype=torch.bool)  # [B, S]
        for b, r in enumerate(rows):
            self.tokens[b, T - len(r) : T] = torch.tensor(r)
            self.valid[b, T - len(r) : T] = True
        self.positions = (self.valid.long().cumsum(1) - 1).clamp_min(0)  # [B, S] valid slots before
        self.tokens, self.valid, self.positions = (
            t.to(device) for t in (self.tokens, self.valid, self.positions)
        )
        self.length = T  # slots in use; the last one is `pending`
        self.has_holes = any(len(r) < T for r in rows)  # False: mask all ones, may pass None

    @property
    def pending(self) -> int:
        return self.length - 1

    def ensure(self, extra: int) -> None:
        """Room for `extra` more slots."""
        need = self.length + extra
        if need <= self.tokens.shape[1]:
            return
        grow = max(need, 2 * self.tokens.shape[1]) - self.tokens.shape[1]
        self.tokens = torch.nn.functional.pad(self.tokens, (0, grow))
        self.valid = torch.nn.functional.pad(self.valid, (0, grow))
        self.positions = torch.nn.functional.pad(self.positions, (0, grow))

    def window(self, start: int, end: int):
        """(tokens [B, end−start], mask [B, end] or None, positions [B, end−start]) for slots start..end."""
        mask = self.valid[:, :end] if self.has_holes else None
        return self.tokens[:, start:end], mask, self.positions[:, start:end]

    def append(self, tokens: torch.Tensor) -> None:
        """One new valid slot per row, right after the last: tokens [B]."""
        s = self.length
        self.tokens[:, s] = tokens
        self.valid[:, s] = True
        self.positions[:, s] = self.positions[:, s - 1] + 1
        self.length += 1

    def select(self, rows: torch.Tensor) -> None:
        self.tokens, self.valid, self.positions = (
            t.index_select(0, rows) for t in (self.tokens, self.valid, self.positions)
        )


def _left_padded_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[list[int]]:
    """Each row's real prompt tokens (any padding side accepted)."""
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise SpecdecError("input_ids must be a non-empty [batch, length] tensor")
    ids = input_ids.cpu().tolist()
    if attention_mask is None:
        return ids
    keep = attention_mask.cpu().bool().tolist()
    rows = [[t for t, k in zip(r, m) if k] for r, m in zip(ids, keep)]
    if any(len(r) == 0 for r in rows):
        raise SpecdecError("a prompt is empty (its attention mask is all zero)")
    return rows


# ----------------------------------------------------------------------------------------------------
# The stages


PREFILL_CHUNK = 1024  # a longer prompt is read in pieces of this many slots, with progress after each


def prefill(decoders: list[Decoder], slots: _Slots, on_progress=None) -> None:
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


def score(decoder: Decoder, slots: _Slots, start: int) -> torch.Tensor:
    """The target over slots start..end (pending + γ draft tokens) in one pass -> logits [B, γ+1, V]."""
    return decoder.forward(*slots.window(start, slots.length))


def verify(mode, proposal: Proposal, target_logits, generator, params, alpha, beta, backend):
    """The accept/reject rule lives in kernels/reference.py, reached through decoding/verify.py; this only
    prepares its inputs (proposal.probs None: a deterministic draft, one-hot).

    Greedy: accept while draft == target argmax. Sampling: the target distribution must be processed
    exactly as the draft's was (÷T fused in verify when only temperature is on; top-k/top-p applied
    here, then temperature 1)."""
    draft_tokens = proposal.tokens
    if params.greedy:
        return verification.verify_greedy(draft_tokens, target_logits)
    B, gamma = draft_tokens.shape
    temperature = params.temperature
    if params.filtered:
        target_logits, temperature = process_logits(target_logits, params), 1.0
    u = uniforms((B, gamma + 1), generator)  # [B, γ+1]
    return verification.verify(
        mode,
        draft_tokens,
        proposal.probs,
        target_logits,
        u,
        draft_logits=proposal.logits,
        temperature=temperature,
        alpha=alpha,
        beta=beta,
        backend=backend,
        check=False,  # the flags are read with the accepted counts (Verified.accepted)
    )


# ----------------------------------------------------------------------------------------------------
# generate


class _Rows:
    """Per-row bookkeeping on the host: outputs, budget, which input row each active row is."""

    def __init__(self, batch: int, max_new_tokens: int, eos: set[int]):
        self.index = list(range(batch))  # active row -> input row
        self.tokens: list[list[int]] = [[] for _ in range(batch)]
        self.reasons = ["length"] * batch
        self.max_new = max_new_tokens
        self.eos = eos

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
            count += len(new)
            if self.reasons[row] != "eos" and len(self.tokens[row]) < self.max_new:
                going.append(a)
        return going, count


def generate(
    target,
    draft_model,
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
) -> GenerationResult:
    """Decode `input_ids` [B, T] (any padding side; attention_mask [B, T] marks real tokens).

    target: a transformers causal LM or a `Decoder`; draft_model: one too, or a `Drafter` (unused, may be None,
    for mode="autoregressive"). gamma_schedule: a name (options.GAMMA_SCHEDULES; γ is its start, or for auto its
    upper bound) or a schedule object (schedule.make), which keeps what it measured from one call to the
    next. params: temperature, top-k, top-p, seed (default: greedy). vocab_size: the V
    both models' logits are cut to (models.check_compatible's answer when lm_heads carry padding rows);
    default: the target's lm_head rows. draft_stop_below: end a round's drafting early when the draft is
    unsure (see `draft`); 0 = always draft γ. on_prefill(done, total): progress through a long prompt.
    Returns the new tokens of each row and the run's stats."""
    options.one_of("--mode", mode, MODES)
    speculative = mode != "autoregressive"
    if speculative:
        options.check_gamma(gamma)
    schedule = schedules.make(gamma_schedule, gamma)
    if speculative and draft_model is None:
        raise SpecdecError(f"mode {mode!r} needs a draft model")
    options.at_least("--max-new-tokens", max_new_tokens, 0)
    params = SamplingParams() if params is None else params
    eos = {eos_token_ids} if isinstance(eos_token_ids, int) else set(eos_token_ids or ())

    target = as_decoder(target)
    drafter = as_drafter(draft_model) if speculative else None
    device = target.device
    with torch.inference_mode():
        slots = _Slots(input_ids, attention_mask, device)
        B = slots.tokens.shape[0]
        stats = GenerationStats(mode, gamma if speculative else 0, schedule.name, B)
        rows = _Rows(B, max_new_tokens, eos)
        if max_new_tokens == 0:
            return GenerationResult(rows.tokens, rows.reasons, stats.finish())
        generator = params.generator(device)
        vocab = vocab_size or target.vocab_size
        decoders = [target, *(drafter.decoders if speculative else ())]

        t_start = _clock(device)
        prefill(decoders, slots, on_prefill)
        stats.prefill_s = _clock(device) - t_start
        while True:
            g = min(schedule.next(), max(rows.remaining()) - 1) if speculative else 0  # never overshoot
            slots.ensure(g + 1)
            start = slots.pending
            if g == 0:
                out, r = _decode_one_token(target, slots, params, generator, vocab)
            else:
                out, r = _speculate(target, drafter, slots, g, mode, params, generator, vocab, alpha, beta, backend,
                                    draft_stop_below)
            stats.record(r, speculative)
            schedule.observe(r)
            going = _commit(slots, target, drafter, rows, out, r.accepted, start, stats)
            if not going:
                break
            if len(going) < len(r.accepted):
                _select(going, slots, decoders, rows)
        stats.wall_s = _clock(device) - t_start
        stats.schedule = schedule.estimates()
    return GenerationResult(rows.tokens, rows.reasons, stats.finish())


def _decode_one_token(target: Decoder, slots: _Slots, params, generator, vocab: int):
    """The target alone: logits at `pending` -> one token per row. -> (out [B, 1], the Round: γ 0)."""
    t0 = _clock(target.device)
    logits = fit_vocab(target.forward(*slots.window(slots.pending, slots.length), keep=1)[:, -1], vocab)  # [B, V]
    B = logits.shape[0]
    token, _ = sample_logits(logits, params, None if params.greedy else uniforms(B, generator))
    return token[:, None], Round(0, [0] * B, target_s=_clock(target.device) - t0)


def _speculate(target, drafter: Drafter, slots, g, mode, params, generator, vocab, alpha, beta, backend,
               stop_below=0.0):
    """One speculative round: draft γ (or fewer), score γ+1, verify. -> (out_tokens [B, γ+1], the Round).
    A draft that proposes nothing (no n-gram matched) makes the round one plain step."""
    device = target.device
    start = slots.pending
    t0 = _clock(device)
    proposal = drafter.propose(slots, g, params, generator, vocab, keep_logits=(mode == "sigmoid"), stop_below=stop_below)
    asked, g = g, proposal.tokens.shape[1]  # the draft may stop early
    t1 = _clock(device)
    if g == 0:
        out, r = _decode_one_token(target, slots, params, generator, vocab)
        r.asked, r.draft_s = asked, t1 - t0
        return out, r
    target_logits = fit_vocab(score(target, slots, start), vocab)  # [B, γ+1, V]
    t2 = _clock(device)
    verified = verify(mode, proposal, target_logits, generator, params, alpha, beta, backend)
    accepted = verified.accepted()  # the one host sync of the round
    t3 = _clock(device)
    return verified.out_tokens, Round(g, accepted, asked, draft_s=t1 - t0, target_s=t2 - t1, verify_s=t3 - t2,
                                      catch_up=proposal.catch_up, backend=verified.backend)


def _commit(slots, target, drafter, rows, out, accepted, start, stats) -> list[int]:
    """Keep each row's accepted slots, mark its rejected ones invalid, write its new token to the
    new pending slot, crop both caches to the longest row. -> active rows still going."""
    longest = max(accepted)
    pending = start + longest + 1  # the new pending slot, the same for every row
    n = torch.tensor(accepted, device=slots.tokens.device)  # [B]
    if longest > min(accepted):  # rows that accepted fewer: their extra slots become holes
        offsets = torch.arange(1, longest + 1, device=n.device)  # [longest]
        slots.valid[:, start + 1 : pending] = offsets[None, :] <= n[:, None]
        slots.has_holes = True
    new_token = out.gather(1, n[:, None]).squeeze(1)  # [B] the resampled / bonus token
    slots.tokens[:, pending] = new_token
    slots.valid[:, pending] = True
    slots.positions[:, pending] = slots.positions[:, start] + n + 1
    slots.length = pending + 1
    target.crop(pending)
    if drafter is not None:
        drafter.crop(pending)

    out_rows = out[:, : longest + 1].tolist()
    emitted = [r[: a + 1] for r, a in zip(out_rows, accepted)]
    going, count = rows.emit(emitted)
    stats.new_tokens += count
    return going


def _select(going: list[int], slots: _Slots, decoders: list[Decoder], rows: _Rows) -> None:
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

"""What a decoding run reports: the tokens of each row, and its stats (calls, acceptance, where the time went)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace


@dataclass
class GenerationStats:
    mode: str
    gamma: int  # the initial γ (0 for autoregressive)
    gamma_schedule: str
    batch_size: int
    backend: str | None = None  # which verification backend ran ("torch", "triton", ...)
    new_tokens: int = 0  # emitted tokens, all rows (EOS included)
    target_calls: float = 0  # target forward passes after the prefill (a share of a batch's: rows_share)
    row_calls: int = 0  # Σ over target calls of the rows in that batch
    draft_calls: float = 0  # draft forward passes after the prefill (as target_calls)
    draft_tokens: int = 0  # Σ over rows of the draft tokens proposed
    accepted_tokens: int = 0  # Σ over rows of the draft tokens accepted
    verify_calls: float = 0  # (as target_calls)
    wall_s: float = 0.0
    prefill_s: float = 0.0
    draft_s: float = 0.0  # draft forwards + draft sampling
    target_s: float = 0.0  # target forwards (scoring) after the prefill
    verify_s: float = 0.0  # the verify / verify_greedy call alone
    gamma_history: list[int] = field(default_factory=list)  # γ of each round (0: a plain step; none if autoregressive)
    accepted_histogram: list[int] = field(default_factory=list)  # [k]: verifications accepting k
    schedule: dict | None = None  # what the auto schedule measured (decoding.schedule.Auto.estimates)
    # derived (filled by finish)
    acceptance_rate: float | None = None  # accepted / drafted
    mean_accepted_per_call: float | None = None  # draft tokens accepted per row per verification
    mean_tokens_per_call: float | None = None  # tokens emitted per row per target call
    tokens_per_s: float = 0.0
    verify_ms_per_call: float | None = None
    overhead_s: float = 0.0  # wall − prefill − draft − target − verify: the loop's own cost
    rounds_per_gamma: list[float] = field(default_factory=list)  # [γ]: rounds run at that γ (0: plain steps)

    def record(self, r, speculative: bool) -> None:
        """One finished round (a decoding.schedule.Round) of the whole batch."""
        self.target_s += r.target_s
        if speculative:
            self.gamma_history.append(r.gamma)
            if r.gamma > 0:
                self.draft_s += r.draft_s
                self.verify_s += r.verify_s
                self.backend = r.backend
        self.count(r.gamma if speculative else 0, r.accepted)

    def count(self, gamma: int, accepted: list[int]) -> None:
        """A round's calls and its rows' drafts (γ 0: a plain step), accepted[b] draft tokens kept by row b."""
        self.target_calls += 1
        self.row_calls += len(accepted)
        if gamma == 0:
            return
        self.draft_calls += gamma
        self.verify_calls += 1
        self.draft_tokens += gamma * len(accepted)
        self.accepted_tokens += sum(accepted)
        hist = self.accepted_histogram
        hist.extend([0] * (gamma + 1 - len(hist)))
        for n in accepted:
            hist[n] += 1

    def finish(self) -> GenerationStats:
        self.acceptance_rate = self.accepted_tokens / self.draft_tokens if self.draft_tokens else None
        verifications = sum(self.accepted_histogram)
        self.mean_accepted_per_call = self.accepted_tokens / verifications if verifications else None
        self.mean_tokens_per_call = self.new_tokens / self.row_calls if self.row_calls else None
        self.tokens_per_s = self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0
        self.verify_ms_per_call = 1e3 * self.verify_s / self.verify_calls if self.verify_calls else None
        self.overhead_s = self.wall_s - self.prefill_s - self.draft_s - self.target_s - self.verify_s
        if self.gamma_history:
            self.rounds_per_gamma = [0] * (max(self.gamma_history) + 1)
            for g in self.gamma_history:
                self.rounds_per_gamma[g] += 1
        else:
            self.rounds_per_gamma = [self.target_calls] if self.target_calls else []
        return self

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class GenerationResult:
    tokens: list[list[int]]  # new tokens of each input row, in input order (EOS included)
    finish_reasons: list[str]  # "eos" | "length"
    stats: GenerationStats
    rows: list[GenerationStats] = field(default_factory=list)  # each input row's own counts and γ (no times)


_ROW_COUNTS = ("new_tokens", "row_calls", "draft_tokens", "accepted_tokens")  # summed over the rows
_BATCH_COSTS = ("target_calls", "draft_calls", "verify_calls", "wall_s", "prefill_s", "draft_s", "target_s", "verify_s")


def rows_share(result: GenerationResult, rows: list[int]) -> GenerationStats:
    """The stats of some rows of a batch (a file's windows among others'): their own tokens, drafts, acceptance and
    the γ of the rounds they took part in; of the batch's calls and times, their share of its rows' rounds
    (row_calls): the shares of a batch's inputs add up to its costs, and a cost per call stays the batch's. All
    rows: the batch's stats."""
    whole = result.stats
    share = replace(whole, gamma_history=list(whole.gamma_history), accepted_histogram=list(whole.accepted_histogram))
    if sorted(rows) == list(range(len(result.tokens))):
        return share.finish()
    own = [result.rows[r] for r in rows]
    for name in _ROW_COUNTS:
        setattr(share, name, sum(getattr(o, name) for o in own))
    weight = share.row_calls / whole.row_calls if whole.row_calls else len(rows) / max(1, len(result.tokens))
    for name in _BATCH_COSTS:
        setattr(share, name, getattr(whole, name) * weight)
    share.gamma_history = max(([*o.gamma_history] for o in own), key=len, default=[])
    share.accepted_histogram = []
    for o in own:
        add_counts(share.accepted_histogram, o.accepted_histogram)
    return share.finish()


def add_counts(into: list, other: list) -> None:
    """into[i] += other[i] for every i of `other`, `into` grown with zeros to its length (histograms, rounds per γ)."""
    into.extend([0] * (len(other) - len(into)))
    for i, n in enumerate(other):
        into[i] += n


_SUMMED = ("new_tokens", "target_calls", "row_calls", "draft_calls", "draft_tokens", "accepted_tokens",
           "verify_calls", "wall_s", "prefill_s", "draft_s", "target_s", "verify_s")


def merge_stats(parts: Iterable[GenerationStats], into: GenerationStats) -> GenerationStats:
    """Sum the decoding stats of several generate() calls into `into` (not finished: call finish())."""
    for s in parts:
        for name in _SUMMED:
            setattr(into, name, getattr(into, name) + getattr(s, name))
        into.backend = s.backend or into.backend
        into.gamma_history.extend(s.gamma_history)
        into.schedule = s.schedule or into.schedule  # a schedule spanning the calls: its latest estimates
        add_counts(into.accepted_histogram, s.accepted_histogram)
    return into



"""How many tokens to draft next round: the γ schedules.

    constant   γ every round
    heuristic  +2 after a round whose draft tokens were all accepted, −1 otherwise (never below 1)
    auto       the γ in [0, γmax] with the most expected tokens per second, from what this run measured;
               γ = 0 is one plain step of the target alone

A schedule sees only rounds already finished (`observe`) before it answers (`next`), so whatever it
chooses, every token is still verified against the target: greedy output stays the target's, sampled
output keeps the target's distribution. Under `auto` the choice depends on measured times, so sampled
tokens differ between runs with the same seed (their distribution does not); `constant` repeats them.

The cost model of `auto` (after Leviathan et al. 2023, §3.4), for a round that asks for γ draft tokens:

    expected tokens  E(γ) = 1 + Σ_{j=1..γ} Q(j)
    cost             C(γ) = d(γ)·t_draft + t_target(d(γ) + 1) + t_verify,   d(γ) = Σ_{j=1..γ} D(j)
    γ = 0            E = 1, C = t_target(1)

Q(j) is the chance that the draft proposes tokens 1..j and all are accepted, D(j) the chance that it proposes a
j-th token at all (--draft-stop ends a round early where the draft is unsure). Both are measured position by
position, as survival curves of decaying counts, each position starting from a prior of two tokens at the rate of
the position before it (the first: the overall rate): with independent acceptance α and no draft-stop, Q(j) = α^j
and E is Leviathan's (1 − α^(γ+1)) / (1 − α). Q is measured jointly, not as D(j) times an acceptance: the draft
stops where it is unsure, which is where it would be rejected, so the product underrated long rounds (on the 74 s
recording auto settled at γ 4–5 where γ 10 ran 11 % faster). Measured, the curves also see that acceptance comes
in runs: a token that follows accepted ones is accepted more often than the first, so a little-tried deep position
borrows the rate of the one before it, not the overall rate, which the first positions dominate (with the overall
rate, auto ≤ 10 ran γ 1–2 on the seven example articles where constant 10 ran 6 % faster).
t_draft is one draft step, t_target(k) the target's pass over k tokens: a plain step for k = 1 (a one-row
matrix product may take another kernel), for k ≥ 2 a line fitted to the recent passes, each taken as its length's
running average (so one slow pass early on, before any clipping, does not tilt the line for long; a length's first
pass counts at most the per-token cost of a shorter one); t_verify one
verification. Times are running averages that clip a sample more than 1.5× above the estimate (another
process took the CPU). Whether to speculate at all is decided with Q half a standard error higher, and only
where that beats plain steps by 2 %. While plain steps win, a speculative round is tried now and then (after 2
plain steps, then 4, ... up to 256) to see whether the draft or the costs moved, or the first rounds were only
unlucky (waiting 8 plain steps instead cost two replayed short summaries 5 %); while speculation wins, one round
in 8 asks for the largest γ expected to come within 5 % of the best γ's rate (at least one more than the best), so
that the passes and acceptance beyond it are measured, not guessed, at a bounded cost: where the draft stops
itself when unsure, rates level off and that is often --gamma; where every asked token is drafted, it is near the
best. Replaying recorded rounds (summaries, the 74 s recording; draft-stop on; times with and without noise),
these two rules took auto ≤ 10 from 0.93–1.00× of the best constant γ to 0.95–1.00×, and left auto ≤ 4 as it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specdec_cli import options


@dataclass
class Round:
    """What one finished round tells a schedule."""

    gamma: int  # draft tokens scored (0: a plain step of the target)
    accepted: list[int]  # per row: draft tokens accepted
    asked: int | None = None  # the γ the schedule asked for (the draft may stop before it); default: gamma
    draft_s: float = 0.0
    target_s: float = 0.0
    verify_s: float = 0.0
    catch_up: int = 1  # slots the draft read in its first step: 1–2 between speculative rounds, more after plain steps
    backend: str | None = None  # the verification's backend


class Constant:
    name = "constant"

    def __init__(self, gamma: int):
        self.gamma = gamma

    def next(self) -> int:
        return self.gamma

    def observe(self, r: Round) -> None:
        pass

    def estimates(self) -> dict | None:
        return None


class Heuristic(Constant):
    name = "heuristic"

    def observe(self, r: Round) -> None:
        if r.gamma > 0:
            full = min(r.accepted) == r.gamma
            self.gamma = min(options.MAX_GAMMA, self.gamma + 2) if full else max(1, self.gamma - 1)


class _Average:
    """A running average that forgets: the first value is kept only until a second, smaller one (the
    first call of a shape may pay one-off set-up), then each new value moves it by `weight`; from the third
    on, a value above `clip`× the average counts as `clip`× (another process took the CPU meanwhile)."""

    def __init__(self, weight: float = 0.25, clip: float = 1.5):
        self.weight, self.clip, self.count = weight, clip, 0
        self.value: float | None = None  # None until the first sample

    def add(self, x: float) -> None:
        if self.value is None:
            self.value = x
        elif self.count == 1:
            self.value = min(self.value, x)
        else:
            self.value += self.weight * (min(x, self.clip * self.value) - self.value)
        self.count += 1

    def bound(self, x: float) -> None:
        """x is at least the true value (it includes other work): an estimate above it is wrong, take x."""
        if self.value is None or x < self.value:
            self.value, self.count = x, max(self.count, 1)


class _Line:
    """t ≈ a + b·k, fitted by least squares to recent (k, t) with weights that decay by `decay` per sample;
    b ≥ 0. Samples above `clip`× the line's value count as `clip`× it."""

    def __init__(self, decay: float = 0.95, clip: float = 1.5):
        self.decay, self.clip, self.count = decay, clip, 0
        self.w = self.wk = self.wkk = self.wt = self.wkt = 0.0

    def add(self, k: int, t: float) -> None:
        if self.count >= 3 and self(k) > 0:  # a line below 0 there (extrapolated) bounds nothing
            t = min(t, self.clip * self(k))
        d = self.decay
        self.w, self.wk, self.wkk = d * self.w + 1, d * self.wk + k, d * self.wkk + k * k
        self.wt, self.wkt = d * self.wt + t, d * self.wkt + k * t
        self.count += 1

    def slope(self) -> float:
        spread = self.w * self.wkk - self.wk**2
        return max(0.0, (self.w * self.wkt - self.wk * self.wt) / spread) if spread > 1e-9 * self.w**2 else 0.0

    def __call__(self, k: float) -> float:
        return self.wt / self.w + self.slope() * (k - self.wk / self.w)


class _Survival:
    """P(reaching position j) for j = 1..n as a product of per-position pass rates, each from decaying counts
    (`decay` per round) plus a prior of `prior` trials at the pooled rate."""

    def __init__(self, n: int, decay: float = 0.99, prior: float = 2.0):
        self.decay, self.prior = decay, prior
        self.trials, self.passed = [0.0] * (n + 1), [0.0] * (n + 1)  # [j]: 1-based positions

    def add(self, tried: int, passed: int) -> None:
        """One trial that came to positions 1..tried (it passed each before), passing 1..passed (≤ tried)."""
        for j in range(1, len(self.trials)):
            self.trials[j] *= self.decay
            self.passed[j] *= self.decay
        for j in range(1, tried + 1):
            self.trials[j] += 1
            self.passed[j] += j <= passed

    @property
    def rate(self) -> float:
        """The pooled pass rate, with one pass in two trials as its own prior."""
        return (sum(self.passed) + 1.0) / (sum(self.trials) + 2.0)

    def curve(self, n: int, lift: float = 0.0) -> list[float]:
        """[P(reach 1), ..., P(reach n)]. Position j's pass rate has a prior of `prior` trials at position j−1's
        rate (position 1's: the pooled rate), so a little-tried position follows the last well-tried one.
        lift: standard errors added to the pooled rate."""
        pooled = self.rate
        rate = min(1.0, pooled + lift * math.sqrt(pooled * (1.0 - pooled) / (sum(self.trials) + 2.0)))
        out, s = [], 1.0
        for j in range(1, n + 1):
            rate = (self.passed[j] + self.prior * rate) / (self.trials[j] + self.prior)
            s *= rate
            out.append(s)
        return out


@dataclass
class Auto:
    """γ from the measured costs; see the module's docstring. gamma_max: the largest γ tried (--gamma)."""

    gamma_max: int
    calibrate_gamma: int = 3  # the first round's γ: a few draft tokens, cheap if speculation does not pay
    probe_first: int = 2  # plain steps before a speculative round is tried again (doubling while it loses)
    probe_last: int = 256
    decay: float = 0.99  # per round, of the acceptance and drafting counts
    hope: float = 0.5  # standard errors added to acceptance when deciding whether to speculate at all
    margin: float = 0.02  # ... and by how much it must beat plain steps: their estimate is not refreshed
    #                      while speculating, so one ~10 % noisy sample can leave it a few % high for long
    explore_every: int = 8  # one speculative round in this many asks for the largest γ ...
    explore_within: float = 0.95  # ... whose expected rate is at least this share of the best γ's
    name: str = "auto"
    draft_step: _Average = field(default_factory=_Average)
    verify: _Average = field(default_factory=_Average)
    passes: _Line = field(default_factory=_Line)  # the target's pass over k ≥ 2 tokens
    plain_run: int = 0  # plain steps since the last speculative round
    rounds: int = 0  # speculative rounds observed
    probe_every: int = 0

    def __post_init__(self):
        options.check_gamma(self.gamma_max)
        self.probe_every = self.probe_first
        self._probing = False
        self.gains = _Survival(self.gamma_max, self.decay)  # Q(j): draft tokens 1..j proposed and accepted
        self.drafts = _Survival(self.gamma_max, self.decay)  # D(j): the draft proposed a j-th token
        self.accepts = _Survival(self.gamma_max, self.decay)  # draft tokens tested and accepted: α, for reports
        self.seen: dict[int, _Average] = {}  # k -> the target's pass over k tokens, as measured; k = 1: a plain step

    # -- what was measured

    @property
    def alpha(self) -> float:
        """The share of tested draft tokens accepted."""
        return self.accepts.rate

    def observe(self, r: Round) -> None:
        k, t = r.gamma + 1, r.target_s
        if k not in self.seen:  # a length's first pass, which its average keeps until a faster one: a token of it
            # costs no more than one of a shorter pass did (they share the weights' reads), so one slowed by another
            # process (2.7x, the 74 s recording's second round) is taken at that bound
            t = min([t, *(a.value * k / j for j, a in self.seen.items() if j < k and a.value is not None)])
        seen = self.seen.setdefault(k, _Average())
        seen.add(t)
        if r.gamma == 0:
            if r.asked:  # the draft was asked and had nothing (no n-gram matched): D(1) and Q(1) learn it
                self.drafts.add(1, 0)
                self.gains.add(1, 0)
            self.plain_run += 1
            return
        self.plain_run = 0
        self.rounds += 1
        # the length's own average (add() set it): one slow pass among the first few (a 2x one in the 74 s
        # recording's third round) fits no slope
        self.passes.add(k, t if seen.value is None else seen.value)
        if r.catch_up <= 2:
            self.draft_step.add(r.draft_s / r.gamma)
        else:  # after plain steps the draft's first step reads them all: more than a step, so a bound from above
            self.draft_step.bound(r.draft_s / r.gamma)  # (without it a slow first round kept auto on plain steps)
        self.verify.add(r.verify_s)
        asked = r.gamma if r.asked is None else r.asked
        self.drafts.add(min(r.gamma + 1, asked), r.gamma)  # the draft went on to token j, or stopped there
        for a in r.accepted:  # each row gained a tokens: it failed at the first rejected one, or where the draft stopped
            self.gains.add(min(a + 1, asked), a)
            self.accepts.add(min(a + 1, r.gamma), a)  # tested up to and including the first rejected one
        if self._probing:  # the probe says speculation still loses: wait longer before the next one
            self._probing = False
            self.probe_every = min(2 * self.probe_every, self.probe_last) if self.best() == 0 else self.probe_first

    @property
    def step_s(self) -> float | None:
        """The target's plain step (one token), as measured."""
        return self.seen[1].value if 1 in self.seen else None

    def pass_s(self, k: float) -> float:
        """The target's pass over k tokens: the plain step for k = 1, the fitted line for k ≥ 2 (the step, or
        the line, standing in for the other until both were measured). Asked only once a step was measured."""
        if k <= 1 or self.passes.count == 0:
            assert self.step_s is not None, "no plain step measured yet"
            return self.step_s
        return self.passes(k)

    def rates(self, lift: float = 0.0) -> list[float]:
        """[expected tokens per second (per row) of a round asking for γ] for γ = 0..gamma_max; lift: standard
        errors added to each position's gain."""
        drafted = self.drafts.curve(self.gamma_max)  # D(j)
        gained = self.gains.curve(self.gamma_max, lift)  # Q(j)
        step, verify = self.draft_step.value, self.verify.value
        assert step is not None and verify is not None, "rates need a measured draft step and verification"
        out, tokens, d = [1.0 / self.pass_s(1)], 1.0, 0.0
        for dj, qj in zip(drafted, gained):
            tokens, d = tokens + qj, d + dj
            out.append(tokens / (d * step + self.pass_s(1 + d) + verify))
        return out

    def best(self, least: int = 0) -> int:
        """The best γ ≥ 1; 0 instead when even a hopeful acceptance says plain steps are faster."""
        rates = self.rates()
        g = max(range(1, self.gamma_max + 1), key=rates.__getitem__)
        return g if least > 0 or self.rates(self.hope)[g] > (1 + self.margin) * rates[0] else 0

    # -- the choice

    def next(self) -> int:
        if self.draft_step.value is None or self.verify.value is None:
            return min(self.calibrate_gamma, self.gamma_max)  # nothing measured yet: a short round
        if self.step_s is None:
            return 0  # then one plain step, to know what speculation competes with
        best = self.best()
        if best == 0 and self.plain_run >= self.probe_every:
            self._probing = True
            return self.best(least=1)
        if best and self.rounds % self.explore_every == self.explore_every - 1:
            return self.explore(best)
        return best

    def explore(self, best: int) -> int:
        """The γ of a round that looks past the best: the largest whose expected rate is within explore_within of
        the best's, at least best + 1."""
        rates = self.rates()
        near = [g for g in range(best, self.gamma_max + 1) if rates[g] >= self.explore_within * rates[best]]
        return max(near[-1], min(best + 1, self.gamma_max))

    def estimates(self) -> dict:
        """What the choice rests on, for --json and the bench: c = draft step / target step, the pass-cost
        ratios t_target(k)/t_target(1) as measured, α, and the survival curves Q and D."""
        one = self.step_s
        seen = {k: a.value for k, a in sorted(self.seen.items()) if a.value is not None}
        return {
            "alpha": self.alpha,
            "draft_step_ms": None if self.draft_step.value is None else 1e3 * self.draft_step.value,
            "verify_ms": None if self.verify.value is None else 1e3 * self.verify.value,
            "target_step_ms": None if one is None else 1e3 * one,
            "target_pass_ms": {k: 1e3 * t for k, t in seen.items()},
            "c": None if one is None or self.draft_step.value is None else self.draft_step.value / one,
            "pass_ratio": {k: t / one for k, t in seen.items()} if one else {},
            "gained_through": self.gains.curve(self.gamma_max),
            "drafted_through": self.drafts.curve(self.gamma_max),
            "probe_every": self.probe_every,
        }


SCHEDULES = {"constant": Constant, "heuristic": Heuristic, "auto": Auto}


def make(schedule, gamma: int):
    """A schedule object from its name (options.GAMMA_SCHEDULES), with γ its start or upper bound; an object
    passes through, so one schedule can span several generate() calls and keep what it measured."""
    if not isinstance(schedule, str):
        return schedule
    options.one_of("--gamma-schedule", schedule, options.GAMMA_SCHEDULES)
    return SCHEDULES[schedule](gamma)

"""How many tokens to draft next round: the γ schedules.

    constant   γ every round
    heuristic  +2 after a round whose draft tokens were all accepted, −1 otherwise (never below 1)
    auto       the γ in [0, γmax] with the most expected tokens per second, from what this run measured;
               γ = 0 is one plain step of the target alone

A schedule sees only rounds already finished (`observe`) before it answers (`next`), so whatever it
chooses, every token is still verified against the target: greedy output stays the target's, sampled
output keeps the target's distribution. Under `auto` the choice depends on measured times, so sampled
tokens differ between runs with the same seed (their distribution does not); `constant` repeats them.

The cost model of `auto` (Leviathan et al. 2023, §3.4), per round of γ draft tokens:

    expected tokens  E(γ) = (1 − α^(γ+1)) / (1 − α)       α: the chance a draft token is accepted
    cost             C(γ) = γ·t_draft + t_target(γ+1) + t_verify
    γ = 0            E = 1, C = t_target(1)

t_draft is one draft step, t_target(k) the target's pass over k tokens (measured at the k seen, linear
between them), t_verify one verification; all are running averages, α a decaying count of accepted over
tested draft tokens. Whether to speculate at all is decided at α half a standard error higher. While plain
steps win, a speculative round is tried now and then (after 8 plain steps, then 16, ... up to 256) to see
whether α or the costs moved.
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
    first call of a shape may pay one-off set-up), then each new value moves it by `weight`."""

    def __init__(self, weight: float = 0.25):
        self.weight, self.value, self.count = weight, None, 0

    def add(self, x: float) -> None:
        if self.count == 0:
            self.value = x
        elif self.count == 1:
            self.value = min(self.value, x)
        else:
            self.value += self.weight * (x - self.value)
        self.count += 1


@dataclass
class Auto:
    """γ from the measured costs; see the module's docstring. gamma_max: the largest γ tried (--gamma)."""

    gamma_max: int
    calibrate_gamma: int = 3  # the first round's γ: a few draft tokens, cheap if speculation does not pay
    probe_first: int = 8  # plain steps before a speculative round is tried again
    probe_last: int = 256
    decay: float = 0.99  # per draft token tested, of α's counts (α follows the last ~100 tokens)
    hope: float = 0.5  # standard errors added to α when deciding whether to speculate at all
    name: str = "auto"
    draft_step: _Average = field(default_factory=_Average)
    verify: _Average = field(default_factory=_Average)
    passes: dict[int, _Average] = field(default_factory=dict)  # k tokens scored -> the target's pass time
    accepted: float = 1.0  # decaying counts, with a prior of α = 1/2 worth two tokens
    tested: float = 2.0
    plain_run: int = 0  # plain steps since the last speculative round
    probe_every: int = 0

    def __post_init__(self):
        options.check_gamma(self.gamma_max)
        self.probe_every = self.probe_first
        self._probing = False

    # -- what was measured

    @property
    def alpha(self) -> float:
        return self.accepted / self.tested

    def observe(self, r: Round) -> None:
        self.passes.setdefault(r.gamma + 1, _Average()).add(r.target_s)
        if r.gamma == 0:
            self.plain_run += 1
            return
        self.plain_run = 0
        if r.catch_up <= 2:  # after plain steps the draft's first step reads them all: not a draft step's cost
            self.draft_step.add(r.draft_s / r.gamma)
        self.verify.add(r.verify_s)
        # each row tested its tokens up to and including the first rejected one
        tested = sum(a + (a < r.gamma) for a in r.accepted)
        forget = self.decay ** tested
        self.accepted = forget * self.accepted + sum(r.accepted)
        self.tested = forget * self.tested + tested
        if self._probing:  # the probe says speculation still loses: wait longer before the next one
            self._probing = False
            best = self.best()
            self.probe_every = min(2 * self.probe_every, self.probe_last) if best == 0 else self.probe_first

    def pass_s(self, k: int) -> float:
        """The target's pass over k tokens: measured, linear between measured k, and beyond the largest the
        slope from the smallest to the largest (never decreasing)."""
        ks = sorted(self.passes)
        at = {j: self.passes[j].value for j in ks}
        if k in at:
            return at[k]
        below, above = [j for j in ks if j < k], [j for j in ks if j > k]
        if not below:
            return at[above[0]]
        lo = below[-1]
        if above:
            hi = above[0]
            return at[lo] + (at[hi] - at[lo]) * (k - lo) / (hi - lo)
        slope = max(0.0, (at[ks[-1]] - at[ks[0]]) / (ks[-1] - ks[0])) if len(ks) > 1 else 0.0
        return at[lo] + slope * (k - lo)

    @property
    def alpha_hopeful(self) -> float:
        """α plus `hope` standard errors: whether to speculate at all leans toward yes while few tokens were
        tested, so that an unlucky start does not shut speculation out, and settles as the count grows.
        (Simulated, tests/test_schedule.py: 0 lets one bad first round cost 20 % on a machine where γ = 2 pays
        1.27×; 1 lets γ = 1 rounds run where they lose 6 %.)"""
        a = self.alpha
        return min(1.0, a + self.hope * math.sqrt(a * (1.0 - a) / self.tested))

    def rate(self, gamma: int, alpha: float | None = None) -> float:
        """Expected tokens per second of a round of γ (per row), at acceptance `alpha` (default: the estimate)."""
        if gamma == 0:
            return 1.0 / self.pass_s(1)
        a = min(self.alpha if alpha is None else alpha, 1.0 - 1e-9)
        tokens = (1.0 - a ** (gamma + 1)) / (1.0 - a)
        cost = gamma * self.draft_step.value + self.pass_s(gamma + 1) + self.verify.value
        return tokens / cost

    def best(self, least: int = 0) -> int:
        """The best γ ≥ 1 at the estimated α; 0 instead when even the hopeful α says plain steps are faster."""
        g = max(range(1, self.gamma_max + 1), key=self.rate)
        return g if least > 0 or self.rate(g, self.alpha_hopeful) > self.rate(0) else 0

    # -- the choice

    def next(self) -> int:
        if self.draft_step.value is None or self.verify.value is None:
            return min(self.calibrate_gamma, self.gamma_max)  # nothing measured yet: a short round
        if 1 not in self.passes:
            return 0  # then one plain step, to know what speculation competes with
        best = self.best()
        if best == 0 and self.plain_run >= self.probe_every:
            self._probing = True
            return self.best(least=1)
        return best

    def estimates(self) -> dict:
        """What the choice rests on, for --json and the bench: c = draft step / target step, the pass-cost
        ratios t_target(k)/t_target(1), α."""
        one = self.pass_s(1) if self.passes else None
        return {
            "alpha": self.alpha,
            "draft_step_ms": None if self.draft_step.value is None else 1e3 * self.draft_step.value,
            "verify_ms": None if self.verify.value is None else 1e3 * self.verify.value,
            "target_step_ms": None if one is None else 1e3 * one,
            "target_pass_ms": {k: 1e3 * self.passes[k].value for k in sorted(self.passes)},
            "c": None if one is None or self.draft_step.value is None else self.draft_step.value / one,
            "pass_ratio": {k: self.passes[k].value / one for k in sorted(self.passes)} if one else {},
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

"""The γ schedules. `auto` is run against simulated machines whose costs and acceptance are known, so its
choice can be compared with the best one; the decoding tests run it on real models (greedy equality and
the target's distribution)."""

import random

import pytest
import torch

from conftest import (
    GREEDY,
    PROMPT,
    autoregressive,
    exact_first_two,
    first_two_pvalue,
    make_pair,
    sample_many,
    sample_one_by_one,
)
from specdec_cli.decoding import generate
from specdec_cli.decoding.sampling import SamplingParams
from specdec_cli.decoding.schedule import Auto, Constant, Heuristic, Round, _Line, make
from specdec_cli.errors import SpecdecError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Machine:
    """A simulated pair. Acceptance: the first draft token of a round with chance α, each later one with
    chance α_run once its predecessors were accepted (α_run = α: independent draws; above: acceptance in
    runs). The draft stops after each token with chance `stop` (--draft-stop), and with `stop_wrong` also right
    after the first token the target rejects (a draft unsure exactly where it is wrong, as --draft-stop makes
    the real ones); with `reject_first` the first speculative round's first token is rejected (an unlucky start).
    Costs: one draft step t_draft,
    the target's pass over k tokens t1 for k = 1 and t1·(p2 + slope·(k − 2)) for k ≥ 2 (p2 default 1 + slope:
    a straight line), verification t_verify; each measured time jitters by ±jitter (uniform, multiplicative),
    and one in `outlier` is 1.6× (another process took the CPU)."""

    def __init__(self, alpha, t_draft, slope, t_verify=0.0, t1=1.0, jitter=0.1, seed=0, alpha_run=None, stop=0.0,
                 p2=None, outlier=0, first_draft=1.0, catch_up=0.0, stop_wrong=False, reject_first=False):
        self.alpha, self.t_draft, self.slope, self.t_verify, self.t1 = alpha, t_draft, slope, t_verify, t1
        # first_draft: the first speculative round's draft costs this many times more (one-off set-up);
        # catch_up: each slot the draft missed during plain steps adds this many draft steps to its first step
        self.first_draft, self.catch_up, self.plain_before = first_draft, catch_up, None
        self.alpha_run = alpha if alpha_run is None else alpha_run
        self.stop, self.p2, self.outlier = stop, 1 + slope if p2 is None else p2, outlier
        self.stop_wrong, self.reject_first = stop_wrong, reject_first
        self.jitter, self.rng = jitter, random.Random(seed)

    def pass_s(self, k):
        return self.t1 if k <= 1 else self.t1 * (self.p2 + self.slope * (k - 2))

    def _curves(self, gamma):
        """([P(token j drafted)], [P(tokens 1..j drafted and accepted)]) for j = 1..γ."""
        accepted = [1.0] + [self.alpha * self.alpha_run ** (j - 1) for j in range(1, gamma + 1)]  # [j]: 1..j accepted
        going = [(1 - self.stop) ** (j - 1) for j in range(1, gamma + 1)]  # no random stop before token j
        drafted = [g * accepted[j - 1] if self.stop_wrong else g for j, g in enumerate(going, 1)]
        return drafted, [g * accepted[j] for j, g in enumerate(going, 1)]

    def tokens(self, gamma):
        """Expected tokens of a round asking for γ: 1 + Σ_j P(tokens 1..j drafted and accepted) (independent
        draws, no stops: Leviathan's (1 − α^(γ+1)) / (1 − α))."""
        return 1.0 + sum(self._curves(gamma)[1])

    def cost(self, gamma):
        if gamma == 0:
            return self.pass_s(1)
        drafted = sum(self._curves(gamma)[0])  # expected draft steps; the pass is linear in k from k = 2 on
        return drafted * self.t_draft + self.pass_s(1 + drafted) + self.t_verify

    def rate(self, gamma):
        return self.tokens(gamma) / self.cost(gamma)

    def _noisy(self, t):
        t *= 1 + self.jitter * (2 * self.rng.random() - 1)
        return 1.6 * t if self.outlier and self.rng.randrange(self.outlier) == 0 else t

    def run(self, schedule, tokens=400):
        """Decode `tokens` tokens under `schedule` -> (expected tokens per unit time of the γs it chose, [γ of
        each round]). The rate counts each round's expected tokens and true cost, so it measures the choices,
        not the luck of the draws (which still steer the choices, through the measured acceptance)."""
        made, history = 0, []
        while made < tokens:
            asked = schedule.next()
            history.append(asked)
            if asked == 0:
                r = Round(0, [0], target_s=self._noisy(self.pass_s(1)))
            else:
                if self.stop_wrong:  # draw acceptance as the draft goes: it stops after its first rejected token
                    g = a = 0
                    while g < asked:
                        g += 1
                        if a == g - 1 and self.rng.random() < (self.alpha if a == 0 else self.alpha_run):
                            a += 1
                        if a < g or self.rng.random() < self.stop:
                            break
                else:
                    g = 1
                    while g < asked and self.rng.random() >= self.stop:
                        g += 1
                    a = 0
                    while a < g and self.rng.random() < (self.alpha if a == 0 else self.alpha_run):
                        a += 1
                if self.reject_first and self.plain_before is None:
                    a = 0  # after the draws, so that the other machines keep theirs
                missed = 0 if self.plain_before is None else self.plain_before
                draft_s = (g + self.catch_up * missed) * self.t_draft * (self.first_draft if self.plain_before is None else 1)
                r = Round(g, [a], asked, draft_s=self._noisy(draft_s), target_s=self._noisy(self.pass_s(g + 1)),
                          verify_s=self._noisy(self.t_verify), catch_up=1 + missed)
                self.plain_before = -1
            self.plain_before = None if self.plain_before is None else self.plain_before + 1
            schedule.observe(r)
            made += r.accepted[0] + 1
        return sum(map(self.tokens, history)) / sum(map(self.cost, history)), history


GAMMA_MAX = 10

# (α, c = t_draft / t1, pass-cost slope per token, t_verify / t1[, more Machine options]): machines where
# speculation loses, barely pays, or pays well. "issue 11" is the AMD EPYC measurement of transcribe filed
# with the issue: step 10.7 ms, draft 5.8 ms, a pass over 7 tokens 42 ms, α 0.93 — no γ pays there. The two
# "AMD EPYC" machines are this session's measurements (benchmarks/README.md): summarize (Qwen 1.5B, bf16),
# where a pass over 2–5 tokens costs 0.85× a plain step, acceptance comes in runs and the draft stops early;
# transcribe (Whisper base), where each token of a pass costs ~0.3 of a step.
MACHINES = {
    "slow draft": (0.7, 1.0, 0.3, 0.05),
    "issue 11": (0.93, 5.8 / 10.7, (42 / 10.7 - 1) / 6, 0.02),
    "marginal": (0.8, 0.3, 0.15, 0.02),
    "fast draft": (0.8, 0.1, 0.05, 0.02),
    "near perfect": (0.97, 0.05, 0.03, 0.01),
    "summarize, AMD EPYC": (0.65, 0.2, 0.04, 0.005, {"alpha_run": 0.9, "stop": 0.15, "p2": 0.85, "outlier": 20}),
    "transcribe, AMD EPYC": (0.9, 0.4, 0.3, 0.03, {"alpha_run": 0.95, "stop": 0.2, "p2": 1.4, "outlier": 20}),
    "long runs, cheap passes": (0.8, 0.25, 0.06, 0.01, {"alpha_run": 0.97, "stop": 0.05, "p2": 1.3, "outlier": 20}),
    # the 74 s recording replayed offline (Whisper base, 2 threads): the draft stops where it is wrong, so long
    # rounds cost little where it is right; auto settled at γ 4–5 there while γ 10 ran 11 % faster (before Q)
    "transcribe, draft stops where wrong": (0.93, 0.29, 0.086, 0.03,
                                            {"alpha_run": 0.97, "stop": 0.02, "p2": 1.21, "stop_wrong": True}),
}


def machine(name, **more):
    alpha, c, slope, verify, *extra = MACHINES[name]
    return Machine(alpha, c, slope, verify, **(extra[0] if extra else {}), **more)


NAIVE = (0, 1, 3, GAMMA_MAX)  # constant γ a user could pick without measuring: the target alone, 1, 3, --gamma
SEEDS = range(20)  # runs of 400 tokens per machine, other draws each


def bounds_fail(runs, naive):
    """What a schedule whose runs reached `runs` (rates) fails of the bounds below, given the naive schedules'
    rates {γ: rate} on the same machine: [] when it meets them all."""
    mean, ranked = sum(runs) / len(runs), sorted(naive.values(), reverse=True)
    failed = []
    if mean < 0.95 * ranked[0]:
        failed.append("within 5 % of the best naive schedule")
    if mean < ranked[1]:
        failed.append("above every other naive schedule")
    if min(runs) < 0.95 * naive[0]:
        failed.append("no run below 0.95× the target alone")
    return failed


def naive_rates(name):
    """{γ: rate} of each naive schedule on the machine, over SEEDS (constant γ: the same expected rate each run)."""
    return {g: sum(machine(name, seed=seed).run(Constant(g))[0] for seed in SEEDS) / len(SEEDS) for g in NAIVE}


@pytest.mark.parametrize("name", MACHINES)
def test_auto_against_the_naive_schedules(name):
    """Auto's tokens per unit time over 20 runs of 400 tokens, against the naive schedules on the same simulated
    machine (constant γ of 0 = the target alone, 1, 3 and γmax = 10): its mean within 5 % of the best of them
    (the issue's goal, held against what a user could pick without measuring), above each of the other three
    (auto tells the machine apart), and no run below 0.95× the target alone (the issue's floor). What auto may
    lose to the best naive schedule is what it pays to measure: its first two rounds (γ = 3 and a plain step,
    before anything is known), speculative probes now and then while plain steps win, one round in 8 looking
    past the best γ, and rounds at a neighbour of the best γ while its α estimate (≈ 100 tokens' worth) errs."""
    naive = naive_rates(name)
    runs = [machine(name, seed=seed).run(Auto(GAMMA_MAX))[0] for seed in SEEDS]
    assert not bounds_fail(runs, naive), (bounds_fail(runs, naive), sum(runs) / len(runs), naive)


def test_the_naive_schedules_fail_those_bounds_where_they_are_not_the_best():
    """The bounds above tell a naive schedule from auto on every machine where another naive schedule is better:
    put in auto's place, constant γ 0, 1, 3 and γmax each fail on 4 or more of the 9 machines (γ = 3 on 5:
    it is the best naive choice on the other 4, where nothing but its own rate tells it from auto)."""
    fails = {g: [] for g in NAIVE}
    for name in MACHINES:
        naive = naive_rates(name)
        for g in NAIVE:
            if bounds_fail([naive[g]] * len(SEEDS), naive):
                fails[g].append(name)
    assert all(len(machines) >= 4 for machines in fails.values()), fails


def run_phases(schedule, names, seed, tokens=200):
    """One schedule over two simulated machines in turn, `tokens` on each (the machine changes under it: another
    article, another process on the CPU) -> its tokens per unit time over both, each phase at its own costs."""
    made = spent = 0.0
    for i, name in enumerate(names):
        m = machine(name, seed=10 * seed + i)
        _, history = m.run(schedule, tokens)
        made, spent = made + sum(map(m.tokens, history)), spent + sum(map(m.cost, history))
    return made / spent


@pytest.mark.parametrize("names", [("marginal", "near perfect"), ("summarize, AMD EPYC", "slow draft")])
def test_auto_beats_every_constant_where_the_machine_changes(names):
    """Where the best γ changes halfway (the draft gets better: γ 2 → 10; the draft gets slow: γ 4 → plain steps),
    no constant γ in 0..10 suits both halves and auto must follow: over 10 runs (the same draws for every
    schedule), its mean above the best constant's by more than 3 standard errors of its runs. Unlike the
    stationary machines, this tells auto from a constant γ = 3 too. (Measured: auto 1.11× and 1.13× the best
    constant, 74 % and 44 % of the way to a schedule told when the machine changes.)"""
    seeds = range(10)
    best = max(sum(run_phases(Constant(g), names, seed) for seed in seeds) / 10 for g in range(GAMMA_MAX + 1))
    runs = [run_phases(Auto(GAMMA_MAX), names, seed) for seed in seeds]
    mean = sum(runs) / len(runs)
    se = (sum((r - mean) ** 2 for r in runs) / (len(runs) - 1) / len(runs)) ** 0.5
    assert mean > best + 3 * se, (mean, se, best)


class Recovering:
    """A naive schedule that starts as auto must: γ = 3 (nothing known yet), one plain step (to measure one), `plain`
    more, then constant γ."""

    name = "recovering"

    def __init__(self, plain, gamma):
        self.script, self.gamma = [3, 0] + [0] * plain, gamma

    def next(self):
        return self.script.pop(0) if self.script else self.gamma

    def observe(self, r):
        pass

    def estimates(self):
        return None


def test_an_unlucky_first_round_costs_a_short_output_little():
    """The first round's first draft token is rejected, so auto's estimate says plain steps win; on an 80-token
    output it must find out soon that speculation pays. The bound: the fastest recovery its rules allow (the
    unlucky γ = 3 round, a plain step to measure one, 2 plain steps before the first probe), then the best naive
    constant (γ = 3 here), as a schedule of its own; auto's mean over 20 runs within 5 % of it (its goal against the
    best constant). Probing after 8 plain steps instead of 2, as auto did before, falls below it."""
    def mean_rate(schedule):
        runs = [machine("marginal", seed=seed, reject_first=True).run(schedule(), tokens=80)[0] for seed in SEEDS]
        return sum(runs) / len(runs)

    best_naive = max(NAIVE, key=machine("marginal").rate)
    bound = 0.95 * mean_rate(lambda: Recovering(2, best_naive))
    assert mean_rate(lambda: Auto(GAMMA_MAX)) >= bound
    assert mean_rate(lambda: Auto(GAMMA_MAX, probe_first=8)) < bound, "the bound tells the old probing from the new"


def test_auto_falls_back_to_plain_steps_and_says_so():
    """With a draft as slow as the target, nearly every round is a plain step; the tries of speculation
    grow further apart (2, 4, 8, ... plain steps)."""
    machine = Machine(0.7, 1.0, 0.3, 0.05)
    schedule = Auto(GAMMA_MAX)
    _, history = machine.run(schedule, tokens=600)
    speculative = [i for i, g in enumerate(history) if g > 0]
    assert history.count(0) / len(history) > 0.95
    gaps = [b - a for a, b in zip(speculative[1:], speculative[2:])]
    assert gaps == sorted(gaps) and gaps[-1] > 4 * gaps[0], gaps
    assert schedule.estimates()["c"] == pytest.approx(1.0, rel=0.15)


def test_a_slow_first_round_does_not_keep_auto_on_plain_steps():
    """The first speculative round pays one-off set-up (here 20× its draft cost), so auto takes plain steps; its
    probes after them pay the draft's catch-up too, so they are no draft step's cost, but they bound it from
    above: auto goes back to speculating within a few probes, well before the end of a 100-token summary."""
    m = machine("summarize, AMD EPYC", first_draft=20.0, catch_up=0.5)
    schedule = Auto(4)
    _, history = m.run(schedule, tokens=100)
    assert history[1] == 0 and history[2:].count(0) < len(history[2:]) / 2, history
    assert schedule.estimates()["c"] < 2 * m.t_draft / m.t1
    with_bound_removed = Auto(4)
    with_bound_removed.draft_step.bound = lambda x: None  # what auto did before: the estimate stays 20× too high
    _, stuck = machine("summarize, AMD EPYC", first_draft=20.0, catch_up=0.5).run(with_bound_removed, tokens=100)
    assert stuck[2:].count(0) > len(stuck[2:]) / 2, stuck


def test_auto_chooses_the_gamma_the_costs_call_for():
    """Noiseless costs: the γ auto settles on has a true rate within 3 % of the best γ's (α is estimated from
    the draws, so a neighbour of the best may win a few rounds)."""
    machine = Machine(0.85, 0.15, 0.08, 0.02, jitter=0.0)
    _, history = machine.run(Auto(GAMMA_MAX), tokens=2000)
    settled = max(set(history[20:]), key=history[20:].count)
    best = max(range(GAMMA_MAX + 1), key=machine.rate)
    assert machine.rate(settled) >= 0.97 * machine.rate(best), (settled, best)
    assert settled > 0


def test_auto_fits_the_pass_cost_and_keeps_the_plain_step_apart():
    """k ≥ 2: a line through the recent passes (an outlier clipped); k = 1: the plain steps' own average (a
    one-row product may take another kernel: Qwen's pass over 2 tokens costs 0.85× its step on the AMD EPYC)."""
    schedule = Auto(8)
    for _ in range(3):
        schedule.observe(Round(0, [0], target_s=20.0))
        for k, t in [(2, 12.0), (5, 18.0)]:
            schedule.observe(Round(k - 1, [0], draft_s=1.0 * (k - 1), target_s=t, verify_s=0.1))
    assert schedule.pass_s(3) == pytest.approx(14.0)  # on the line through 12 at 2 and 18 at 5
    assert schedule.pass_s(9) == pytest.approx(26.0)  # the slope 2 per token carried on
    assert schedule.pass_s(1) == 20.0
    schedule.observe(Round(1, [0], draft_s=1.0, target_s=100.0, verify_s=0.1))  # another process took the CPU
    assert schedule.pass_s(2) < 1.5 * 12.0 * 1.1


def test_one_slow_pass_early_on_does_not_tilt_the_line():
    """The 74 s recording, --target-int8, as measured (ms): a plain step 4.77, passes over 4 and 5 tokens 6.09 and
    6.39, then one over 5 tokens 11.93 (another process took the CPU; the line clips only from its fourth sample).
    Fitted to the raw samples, the line rose 3 ms a token and auto ran γ 1 for the rest of the recording (41 passes
    where the others took 20); each length's running average keeps the first 5-token pass, so γ stays 4. Where the
    first pass of a length is the slow one, it is taken at the per-token cost of a shorter pass."""
    schedule = Auto(10)
    full = [3, 3, 3]
    schedule.observe(Round(3, full, draft_s=6.72, target_s=6.09, verify_s=0.47, catch_up=1))
    schedule.observe(Round(0, [0, 0, 0], target_s=4.77))
    schedule.observe(Round(4, [4, 4, 4], 10, draft_s=9.21, target_s=6.39, verify_s=0.59, catch_up=3))
    schedule.observe(Round(4, [4, 4, 4], 4, draft_s=8.57, target_s=11.93, verify_s=0.58, catch_up=2))
    assert schedule.pass_s(5) < 7.0 and schedule.next() >= 4
    schedule = Auto(10)  # another run: the first 5-token pass was the slow one (11.56 ms, 2.1x): taken at 5/4 of the
    schedule.observe(Round(3, full, draft_s=6.24, target_s=5.48, verify_s=0.40, catch_up=1))  # 4-token pass's
    schedule.observe(Round(0, [0, 0, 0], target_s=4.30))
    schedule.observe(Round(4, [4, 4, 4], 10, draft_s=8.49, target_s=11.56, verify_s=0.44, catch_up=3))
    assert schedule.pass_s(5) <= 5.48 * 5 / 4
    line = _Line()  # the raw samples: the line falls below 0 at 2 tokens; 2-token passes are not clipped to that
    for k, t in [(4, 6.09), (5, 6.39), (5, 11.93), *[(2, 4.7)] * 5]:
        line.add(k, t)
    assert line(2) > 2.0


def test_auto_sees_acceptance_in_runs_and_early_stops():
    """Acceptance that comes in runs makes long rounds pay more than independent draws at the same overall
    rate would say; a draft that stops early makes a long γ cheap. The survival curves it measures follow
    the simulated ones."""
    m = machine("summarize, AMD EPYC", jitter=0.0)
    schedule = Auto(GAMMA_MAX)
    m.run(schedule, tokens=4000)
    e = schedule.estimates()
    drafted, gained = m._curves(GAMMA_MAX)
    for j in (1, 2, 4):
        assert e["drafted_through"][j - 1] == pytest.approx(drafted[j - 1], abs=0.08)
        assert e["gained_through"][j - 1] == pytest.approx(gained[j - 1], abs=0.08)
    assert m.rate(schedule.best()) >= 0.97 * max(map(m.rate, range(GAMMA_MAX + 1)))


def test_a_little_tried_position_borrows_the_rate_of_the_one_before_it():
    """Acceptance in runs: the first draft token passes 60 % of the time, each later one 95 % of the time once
    its predecessors passed. Rounds of γ 2 only: positions 3.. were never tried. Their pass rate is then
    position 2's (≈ 0.95), not the pooled rate (≈ 0.69), which the first position dominates; so the expected
    gain of a long round is not underrated (before: P(reach 6) ≈ 0.60 · 0.95 · 0.69⁴ ≈ 0.13 instead of ≈ 0.44)."""
    schedule = Auto(GAMMA_MAX)
    rng = random.Random(0)
    for _ in range(300):
        a = 0 if rng.random() >= 0.6 else 1 + (rng.random() < 0.95)
        schedule.observe(Round(2, [a], draft_s=0.2, target_s=1.0, verify_s=0.01))
    reach = schedule.estimates()["gained_through"]
    assert reach[0] == pytest.approx(0.6, abs=0.06) and reach[1] / reach[0] == pytest.approx(0.95, abs=0.04)
    for j in range(2, GAMMA_MAX):  # untried positions: each ≈ position 2's rate
        assert reach[j] / reach[j - 1] == pytest.approx(reach[1] / reach[0], abs=0.02), reach


def test_exploring_rounds_look_as_far_as_a_bounded_cost_allows():
    """One speculative round in 8 asks for the largest γ whose expected rate is within 5 % of the best's (at
    least best + 1). A draft that stops itself where unsure makes long rounds cost little more, so rates level
    off and it looks up to --gamma; a draft that drafts every asked token makes them cost more, so it looks
    only a little past the best."""
    def settled(stop):
        m = Machine(0.75, 0.25, 0.06, 0.01, alpha_run=0.9, stop=stop, jitter=0.0)
        schedule = Auto(GAMMA_MAX)
        m.run(schedule, tokens=3000)
        rates = schedule.rates()
        best = schedule.best()
        return best, schedule.explore(best), rates
    best, far, rates = settled(stop=0.3)
    assert best < GAMMA_MAX and far == GAMMA_MAX, (best, rates)
    best, near, rates = settled(stop=0.0)
    assert best + 1 <= near < GAMMA_MAX and rates[near] >= 0.95 * rates[best] > rates[near + 1], (best, near, rates)


def test_heuristic_and_constant_rules():
    h = Heuristic(2)
    for accepted, want in [([2], 4), ([4], 6), ([1], 5), ([0], 4)]:
        h.observe(Round(h.next(), accepted))
        assert h.next() == want
    h = Heuristic(1)
    h.observe(Round(1, [0]))
    assert h.next() == 1  # never below 1
    assert Constant(5).next() == 5 and make("auto", 4).gamma_max == 4
    with pytest.raises(SpecdecError, match="--gamma-schedule"):
        make("cosine", 4)


# ----------------------------------------------------------------------------------------------------
# on real models


class Scripted:
    """A schedule for tests: γ from the previous round's outcome only (past-only, so still exact). Round 1:
    γ = 1; after a round that accepted everything (or a plain step) a plain step, else γ = 2 — so plain steps
    and speculation interleave, and the draft must catch up on the plain steps' tokens."""

    name = "scripted"

    def __init__(self, gamma=1):
        self.gamma, self.last = gamma, None

    def next(self):
        if self.last is None:
            return self.gamma
        full = self.last.gamma == 0 or min(self.last.accepted) == self.last.gamma
        return 0 if full and self.last.gamma > 0 else 2

    def observe(self, r):
        self.last = r

    def estimates(self):
        return None


@pytest.mark.parametrize("schedule", ["auto", "scripted"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_output_is_the_targets_under_any_schedule(arch, schedule):
    target, draft = make_pair(arch)
    want = autoregressive(target, PROMPT, n=40).tokens
    s = Scripted() if schedule == "scripted" else Auto(6, probe_first=2)  # tiny models: speculation may not pay
    got = generate(target, draft, PROMPT, mode="exact", gamma=6, gamma_schedule=s, params=GREEDY, max_new_tokens=40)
    assert got.tokens == want
    st = got.stats
    assert st.rounds_per_gamma[0] > 0 and sum(st.rounds_per_gamma[1:]) > 0, "plain steps and speculative rounds both ran"
    assert sum(st.rounds_per_gamma) == st.target_calls


def test_one_auto_schedule_spans_calls_and_reports_what_it_measured():
    target, draft = make_pair("llama")
    s = Auto(4)
    for _ in range(2):
        got = generate(target, draft, PROMPT, gamma=4, gamma_schedule=s, params=GREEDY, max_new_tokens=12)
    est = got.stats.to_dict()["schedule"]
    assert est["draft_step_ms"] > 0 and est["target_pass_ms"][1] > 0 and 0 < est["alpha"] <= 1
    assert sum(p.count for p in s.seen.values()) >= 2 * 4  # both calls observed


@pytest.mark.slow
def test_sampling_keeps_the_targets_distribution_when_gamma_depends_on_the_past(small_pair, verify_calls):
    """B = 1 so each run's γ follows its own accepted counts (Scripted); 4 000 runs, chi-square p > 1e-3 on the
    first two tokens, which come from plain steps, accepted drafts, resampled and bonus tokens alike; every
    verification replayed through the reference (the near-miss sampler missed with chance < 1 %)."""
    target, draft = small_pair
    prompt = torch.tensor([[1, 6, 2, 3]])
    params = SamplingParams(temperature=1.0, seed=0)
    joint = exact_first_two(target, prompt, params)
    runs = sample_one_by_one(target, draft, prompt, 4000, mode="exact", gamma=2, gamma_schedule=Scripted(),
                             max_new_tokens=3)
    tokens = [t for got in runs for t in got.tokens]
    plain = sum(got.stats.rounds_per_gamma[0] > 0 for got in runs)
    assert 400 < plain < 3600, "both branches of the schedule ran"
    assert first_two_pvalue(tokens, joint) > 1e-3
    assert verify_calls.replay()["resampled"] > 400 and verify_calls.near_miss_escape() < 0.01


@pytest.mark.slow
def test_sampling_keeps_the_targets_distribution_under_auto(small_pair, verify_calls):
    """One Auto schedule across the batched runs of sample_many (its γ moves with the measured times);
    chi-square p > 1e-3 and every verification replayed through the reference, as in test_decoding."""
    target, draft = small_pair
    prompt = torch.tensor([[1, 6, 2, 3]])
    params = SamplingParams(temperature=1.0, seed=5)
    joint = exact_first_two(target, prompt, params)
    tokens, rate = sample_many(target, draft, prompt, params, mode="exact", gamma=3, gamma_schedule=Auto(3),
                               max_new_tokens=3)
    assert rate is not None
    assert first_two_pvalue(tokens, joint) > 1e-3
    assert verify_calls.replay()["resampled"] > 1000 and verify_calls.near_miss_escape() < 0.01

"""The analytic model of speculative decoding (Leviathan, Kalman & Matias 2023, section 3).

Assumption of the model: each draft token is accepted independently with the same probability α,
where α = E[Σ_x min(p(x), q(x))] (the expected overlap of target p and draft q, Theorem 3.5 /
Corollary 3.6). The number of accepted drafts per target call is then a geometric variable capped
at γ, and every call emits one more token (the resampled or bonus token).

    E[tokens per call]  = (1 − α^{γ+1}) / (1 − α)                      (eq. 1; γ + 1 at α = 1)
    speedup(α, γ, c)    = (1 − α^{γ+1}) / ((1 − α)(γc + 1))            (Theorem 3.8)

c is the cost of one draft forward pass divided by the cost of one target forward pass; the
denominator γc + 1 is the time of one call (γ draft steps + one target pass) in target-step units.
"""

from __future__ import annotations

import math


def _check_alpha(alpha: float) -> float:
    alpha = float(alpha)
    if not 0.0 <= alpha <= 1.0 or math.isnan(alpha):
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    return alpha


def _check_gamma(gamma: int, minimum: int = 0) -> int:
    if isinstance(gamma, bool) or int(gamma) != gamma or gamma < minimum:
        raise ValueError(f"gamma must be an integer >= {minimum}, got {gamma}")
    return int(gamma)


def _geometric_sum(alpha: float, first: int, last: int) -> float:
    """Σ_{i=first}^{last} α^i, summed directly: exact at α = 1 and stable near it."""
    return math.fsum(alpha**i for i in range(first, last + 1))


def expected_tokens_per_call(alpha: float, gamma: int) -> float:
    """E[tokens emitted per target call] = (1 − α^{γ+1}) / (1 − α) = Σ_{i=0}^{γ} α^i.

    Equals 1 at α = 0 (only the resampled token) and γ + 1 at α = 1 (all drafts plus the bonus).
    """
    return _geometric_sum(_check_alpha(alpha), 0, _check_gamma(gamma))


def expected_accepted_per_call(alpha: float, gamma: int) -> float:
    """E[accepted draft tokens per target call] = Σ_{i=1}^{γ} α^i = α(1 − α^γ) / (1 − α).

    This is `expected_tokens_per_call − 1`, the quantity reported as `mean_accepted_per_call`.
    """
    return _geometric_sum(_check_alpha(alpha), 1, _check_gamma(gamma))


def acceptance_rate_from_alpha(alpha: float, gamma: int) -> float:
    """The acceptance rate a decoder *measures*, accepted / drafted, that α implies:

        rate(α, γ) = E[accepted per call] / γ = α(1 − α^γ) / (γ(1 − α))

    It is below α for γ > 1 (equal at γ = 1, α = 0 and α = 1): see `acceptance_from_mean_accepted`.
    """
    gamma = _check_gamma(gamma, 1)
    return expected_accepted_per_call(alpha, gamma) / gamma


def walltime_speedup(alpha: float, gamma: int, c: float) -> float:
    """Expected walltime improvement over plain autoregressive decoding (Theorem 3.8):

        (1 − α^{γ+1}) / ((1 − α)(γc + 1))

    At γ = 1 this is (1 + α) / (1 + c), so any α > c gives a speedup > 1 (Corollary 3.9).
    """
    c = float(c)
    if c < 0 or math.isnan(c):
        raise ValueError(f"cost coefficient c must be >= 0, got {c}")
    gamma = _check_gamma(gamma)
    return expected_tokens_per_call(alpha, gamma) / (gamma * c + 1.0)


def best_gamma(alpha: float, c: float, max_gamma: int = 32) -> int:
    """The integer γ in [1, max_gamma] that maximises `walltime_speedup(alpha, γ, c)`.

    Going from γ to γ + 1 adds α^{γ+1} expected tokens and c to the call time, so it helps iff

        α^{γ+1} (1 + γc) > c · E[tokens](γ).

    The gap LHS − RHS is non-increasing in γ (its step is α^{γ+1}(α − 1)(1 + γc + c) <= 0), so the
    speedup is unimodal in γ and the first γ where the step stops helping is the argmax; ties go to
    the smaller γ. Deciding by this sign instead of comparing rounded speedups keeps the result
    exactly non-decreasing in α (the gap divided by α^{γ+1} grows with α). At α = 0 this is 1; with
    c = 0 and α > 0 every step helps and the result is max_gamma.
    """
    alpha = _check_alpha(alpha)
    c = float(c)
    if c < 0 or math.isnan(c):
        raise ValueError(f"cost coefficient c must be >= 0, got {c}")
    max_gamma = _check_gamma(max_gamma, 1)
    g = 1
    while g < max_gamma and alpha ** (g + 1) * (1.0 + g * c) > c * expected_tokens_per_call(alpha, g):
        g += 1
    return g


def acceptance_from_mean_accepted(mean_accepted: float, gamma: int, *, tol: float = 1e-12) -> float:
    """Invert the model: the α whose E[accepted draft tokens per call] equals `mean_accepted`.

    Why not just accepted / drafted? The measured acceptance rate r = accepted / drafted is not
    Leviathan's α. After the first rejection in a call the remaining drafts are never tested but are
    still counted as drafted, so under the i.i.d. model

        r = E[A] / γ = α(1 − α^γ) / (γ(1 − α)),     E[A] = Σ_{i=1}^{γ} α^i,

    which is below α for every γ > 1 and 0 < α < 1 (e.g. α = 0.8, γ = 4 gives r ≈ 0.590). Plugging
    r into the speedup formula would therefore underestimate the speedup. This function solves
    E[A](α) = mean_accepted for α by bisection (E[A] is strictly increasing on [0, 1], from 0 to γ).
    (Equivalently, α is estimated by accepted / (accepted + calls that ended in a rejection), the
    fraction of *tested* drafts that passed; this function only needs the mean per call.)

    `mean_accepted` is the mean number of accepted draft tokens per target call, in [0, γ]
    (mean emitted tokens per call minus one). With a varying γ (the heuristic schedule) the model is
    only approximate; pass the mean γ rounded, or invert per γ.
    """
    gamma = _check_gamma(gamma, 1)
    m = float(mean_accepted)
    if math.isnan(m) or m < -1e-9 or m > gamma + 1e-9:
        raise ValueError(f"mean accepted per call must be in [0, {gamma}], got {mean_accepted}")
    if m <= 0.0:
        return 0.0
    if m >= gamma:
        return 1.0
    lo, hi = 0.0, 1.0  # invariant: E[A](lo) <= m < E[A](hi)
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if expected_accepted_per_call(mid, gamma) <= m:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)

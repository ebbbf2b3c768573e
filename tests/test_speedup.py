"""Leviathan et al.'s formulas against hand-computed values and their limits."""

import math

import pytest

from specdec_cli.bench.speedup import (
    acceptance_from_mean_accepted,
    acceptance_rate_from_alpha,
    best_gamma,
    expected_accepted_per_call,
    expected_tokens_per_call,
    walltime_speedup,
)


def test_expected_tokens_hand_values():
    # α = 0.8, γ = 4: (1 − 0.8^5) / 0.2 = (1 − 0.32768) / 0.2 = 3.3616
    assert expected_tokens_per_call(0.8, 4) == pytest.approx(3.3616)
    # α = 0.8, γ = 5 (the summary's example): (1 − 0.262144) / 0.2 = 3.68928
    assert expected_tokens_per_call(0.8, 5) == pytest.approx(3.68928)
    assert expected_tokens_per_call(0.5, 1) == pytest.approx(1.5)


def test_walltime_speedup_hand_values():
    # α = 0.8, γ = 4, c = 0.1: 3.3616 / 1.4
    assert walltime_speedup(0.8, 4, 0.1) == pytest.approx(3.3616 / 1.4)
    # α = 0.75, γ = 7, c = 0.02 (T5-small / T5-XXL): (1 − 0.75^8) / (0.25 · 1.14) ≈ 3.158
    assert walltime_speedup(0.75, 7, 0.02) == pytest.approx((1 - 0.75**8) / 0.285)
    assert walltime_speedup(0.75, 7, 0.02) == pytest.approx(3.158, abs=1e-3)
    # γ = 1 is (1 + α) / (1 + c) (Corollary 3.9)
    assert walltime_speedup(0.3, 1, 0.05) == pytest.approx(1.3 / 1.05)


def test_limits_alpha_zero_and_one():
    for g in (1, 3, 10):
        assert expected_tokens_per_call(0.0, g) == 1.0
        assert expected_tokens_per_call(1.0, g) == g + 1
        assert expected_tokens_per_call(1 - 1e-12, g) == pytest.approx(g + 1, rel=1e-9)
        assert expected_tokens_per_call(1e-12, g) == pytest.approx(1.0)
        assert walltime_speedup(0.0, g, 0.1) == pytest.approx(1 / (g * 0.1 + 1))
        assert walltime_speedup(1.0, g, 0.1) == pytest.approx((g + 1) / (g * 0.1 + 1))
    # continuity at α → 1 against the closed form just below 1
    a = 0.999
    assert expected_tokens_per_call(a, 6) == pytest.approx((1 - a**7) / (1 - a))


def test_speedup_above_one_iff_alpha_above_c_at_gamma_one():
    assert walltime_speedup(0.2, 1, 0.1) > 1
    assert walltime_speedup(0.1, 1, 0.2) < 1


def test_invalid_arguments():
    with pytest.raises(ValueError):
        expected_tokens_per_call(1.5, 3)
    with pytest.raises(ValueError):
        expected_tokens_per_call(0.5, -1)
    with pytest.raises(ValueError):
        walltime_speedup(0.5, 3, -0.1)
    with pytest.raises(ValueError):
        acceptance_from_mean_accepted(5.0, 4)


def test_best_gamma_hand_values():
    # α = 0.8, c = 0.1: speedups γ=1..7 are 1.636, 2.033, 2.271, 2.401, 2.460, 2.470, 2.448
    vals = [walltime_speedup(0.8, g, 0.1) for g in range(1, 33)]
    assert [round(v, 3) for v in vals[:7]] == [1.636, 2.033, 2.271, 2.401, 2.460, 2.470, 2.448]
    assert best_gamma(0.8, 0.1) == 1 + vals.index(max(vals))
    assert best_gamma(0.8, 0.1) == 6
    assert best_gamma(0.0, 0.1) == 1
    assert best_gamma(1.0, 0.1, max_gamma=20) == 20


def test_best_gamma_monotone_in_alpha():
    for c in (0.0, 0.01, 0.05, 0.2, 0.5):
        gammas = [best_gamma(a / 100, c) for a in range(100)]
        assert all(g1 <= g2 for g1, g2 in zip(gammas, gammas[1:])), (c, gammas)
        assert gammas[-1] > gammas[0] or c >= 0.5


def test_best_gamma_decreases_with_cost():
    gs = [best_gamma(0.85, c) for c in (0.01, 0.05, 0.1, 0.3)]
    assert gs == sorted(gs, reverse=True) and gs[0] > gs[-1]


def test_mean_accepted_round_trip():
    for g in (1, 2, 5, 10, 20):
        for a in (0.0, 0.05, 0.3, 0.5, 0.8, 0.95, 0.999, 1.0):
            m = expected_accepted_per_call(a, g)
            assert acceptance_from_mean_accepted(m, g) == pytest.approx(a, abs=1e-8)


def test_measured_rate_is_not_alpha():
    # α = 0.8, γ = 4: E[A] = 0.8 + 0.64 + 0.512 + 0.4096 = 2.3616; accepted/drafted = 0.5904
    assert expected_accepted_per_call(0.8, 4) == pytest.approx(2.3616)
    assert acceptance_rate_from_alpha(0.8, 4) == pytest.approx(0.5904)
    # inverting the mean per call recovers α, not the naive rate
    assert acceptance_from_mean_accepted(2.3616, 4) == pytest.approx(0.8, abs=1e-9)
    assert acceptance_rate_from_alpha(0.6, 1) == pytest.approx(0.6)  # equal at γ = 1
    assert all(acceptance_rate_from_alpha(a, 5) < a for a in (0.1, 0.5, 0.9))
    assert math.isclose(acceptance_rate_from_alpha(1.0, 5), 1.0)

"""The statistics are themselves tested: the calculator, pooling, Holm, and simulated
false-alarm rate and power against what the calculator promises.

Agreement is judged by an exact binomial test at ``META_ALPHA`` over ``REPS`` simulated
experiments: the simulated rate must be consistent with the promised one.
"""

import dataclasses

import numpy as np
import pytest

from harness.backends import load_backend
from harness.checking import pooling, stats
from harness.checking import power as power_calc
from harness.run.plans import planned_trials
from harness.sampling.sample import sample_scenario
from harness.scenarios.profiles import get_profile
from harness.scenarios.scenario import RequestSpec, Scenario

META_ALPHA = 1e-6  # false-alarm rate of each agreement test below
REPS = 3000


@pytest.mark.parametrize(
    "alpha,power,df,expected",
    [
        (1e-6, 0.99, 1, 52.1),
        (1e-6, 0.99, 3, 59.5),
        (1e-6, 0.99, 9, 72.1),
        (1e-6, 0.99, 99, 142.1),
        (0.05, 0.8, 9, 15.6),
        (1e-3, 0.99, 31, 68.5),
    ],
)
def test_noncentrality_matches_published_table(alpha, power, df, expected):
    """Values from ../shared/notes/peers-and-statistics.md section 4.3 (scipy 1.17)."""
    assert abs(power_calc.noncentrality(alpha, power, df) - expected) < 0.06


def test_trials_and_detectable_tv_are_inverse():
    for df in (1, 9, 99):
        for tv in (0.1, 0.02, 0.01):
            n = power_calc.trials_for_tv(1e-6, 0.99, tv, df)
            assert power_calc.detectable_tv(1e-6, 0.99, df, n) <= tv < power_calc.detectable_tv(1e-6, 0.99, df, n - 1)
    assert power_calc.trials_for_tv(1e-6, 0.99, 0.01, 9) == pytest.approx(180_000, rel=0.01)  # notes' table


def test_pooling_uses_expected_counts_only():
    expected = np.array([100.0, 50.0, 3.0, 2.0, 1.0, 0.5, 0.0, 4.0])
    bins = pooling.pool_cells(expected)
    assert bins[6] == -1  # impossible cell stays alone
    assert bins[0] != bins[1] and bins[0] >= 0
    pooled = pooling.pooled(expected, bins)
    assert (pooled >= pooling.MIN_EXPECTED).all()
    assert pooled.sum() == expected.sum()


def test_an_impossible_observation_fails_outright():
    expected = np.array([50.0, 50.0, 0.0])
    r = stats.chi_square_test([49, 50, 1], expected, pooling.pool_cells(expected))
    assert r.p_value == 0.0 and r.impossible == 1


def test_holm_step_down():
    rejected, thresholds = stats.holm([0.01, 0.04, 0.03, 0.5], 0.1)
    np.testing.assert_allclose(thresholds, [0.025, 0.05, 0.1 / 3, 0.1])
    np.testing.assert_array_equal(rejected, [True, True, True, False])
    rejected, _ = stats.holm([0.2, 0.01], 0.05)
    np.testing.assert_array_equal(rejected, [False, True])


def test_binomial_power_calculation():
    for rate in (0.3, 0.8, 0.95):
        n = power_calc.binomial_trials(1e-6, 0.99, rate, 0.01)
        assert power_calc.binomial_detectable(1e-6, 0.99, rate, n) <= 0.01
    assert stats.binomial_test(7, 7, 1.0) == 1.0 and stats.binomial_test(6, 7, 1.0) == 0.0


def worst_case_alternative(null, plus, tv):
    """An alternative at TV ``tv`` with Cohen's w = 2 TV exactly (Cauchy-Schwarz is tight)."""
    sign = -np.ones(null.size)
    sign[plus] = 1.0
    assert abs(null[plus].sum() - 0.5) < 1e-12
    return null * (1 + 2 * tv * sign)


def rejection_rate(rng, law, null, n, alpha):
    bins = pooling.pool_cells(null * n)
    rejected = sum(stats.chi_square_test(row, null * n, bins, with_ci=False).p_value <= alpha for row in rng.multinomial(n, law, size=REPS))
    return rejected


CONFIGS = [
    (np.full(10, 0.1), [0, 1, 2, 3, 4], 0.05, 0.8, 0.1),
    (np.array([0.3, 0.2, 0.25, 0.25]), [0, 1], 0.05, 0.9, 0.05),
    (np.array([0.4, 0.1, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05]), [0, 6, 7], 0.01, 0.8, 0.05),
]


@pytest.mark.parametrize("null,plus,alpha,power,tv", CONFIGS)
def test_simulated_false_alarm_and_power_agree_with_the_calculator(null, plus, alpha, power, tv):
    rng = np.random.default_rng(20261121)
    n = power_calc.trials_for_tv(alpha, power, tv, null.size - 1)
    false_alarms = rejection_rate(rng, null, null, n, alpha)
    assert stats.binomial_test(false_alarms, REPS, alpha) > META_ALPHA, f"false-alarm rate {false_alarms / REPS} vs alpha {alpha}"
    alt = worst_case_alternative(null, plus, tv)
    hits = rejection_rate(rng, alt, null, n, alpha)
    assert stats.binomial_test(hits, REPS, power) > META_ALPHA, f"power {hits / REPS} vs promised {power} at TV {tv}, n={n}"


def test_end_to_end_false_alarm_rate_of_the_reference():
    """The whole pipeline (scenario -> reference sampler -> tally -> outcome-law check) at a
    loose alpha: over many seeds the check's false-alarm rate is alpha within binomial error."""
    profile = dataclasses.replace(get_profile("smoke"), alpha=0.05, power=0.8, tv=0.1)
    backend = load_backend("reference")
    seeds = 400
    alarms = 0
    for seed in range(seeds):
        scenario = Scenario("calibration", "standard", 5, (RequestSpec(2, 1.0, "flat", "peaked"),), seed=seed)
        templates, planned, count = planned_trials(scenario, profile)
        tallies = sample_scenario(backend, scenario, templates, count, profile)
        check = next(c for c in planned if c.name == "outcome-law")
        alarms += check.evaluate(tallies[0], np.random.default_rng(seed)).p_value <= profile.alpha
    assert stats.binomial_test(alarms, seeds, profile.alpha) > META_ALPHA, f"{alarms}/{seeds} false alarms at alpha 0.05"

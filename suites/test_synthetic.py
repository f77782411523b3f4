"""Synthetic acceptance: closed forms of both parameterizations vLLM shipped."""

import numpy as np
import pytest

from reference import synthetic as synth

RATES = np.linspace(0.0, 1.0, 401)
TOLERANCE = 1e-8  # the brief's bound on |mean joint rate - requested rate|


@pytest.mark.parametrize("num_drafts", range(1, 11))
def test_base_and_decay_hit_the_requested_mean(num_drafts):
    for r in RATES:
        base, decay = synth.base_and_decay(float(r), num_drafts)
        assert abs(synth.mean_joint_rate(base, decay, num_drafts) - r) < TOLERANCE, (r, base, decay)
        assert 0.0 <= base <= 1.0 and synth.MIN_DECAY <= decay <= 1.0


@pytest.mark.parametrize("num_drafts", range(2, 11))
def test_decay_is_the_smallest_feasible(num_drafts):
    """gamma = 0.85 when feasible with a0 <= 1, else the smallest gamma that makes a0 <= 1 feasible."""
    for r in RATES[1:-1]:
        base, decay = synth.base_and_decay(float(r), num_drafts)
        if decay > synth.MIN_DECAY:
            assert synth.mean_joint_rate(1.0, synth.MIN_DECAY, num_drafts) < r
            assert synth.mean_joint_rate(1.0, decay - 1e-9, num_drafts) < r + TOLERANCE
            assert base > 1 - 1e-6


def test_extremes_and_known_values():
    assert synth.base_and_decay(0.0, 4) == (0.0, synth.MIN_DECAY)
    assert synth.base_and_decay(1.0, 4) == (1.0, 1.0)
    # vLLM 0.19.x values (see shared notes): n=4
    for r, a0, g in ((0.35, 0.695076, 0.85), (0.6, 0.922291, 0.85), (0.8, 1.0, 0.905616), (0.95, 1.0, 0.979243)):
        base, decay = synth.base_and_decay(r, 4)
        assert abs(base - a0) < 1e-6 and abs(decay - g) < 1e-6


def test_conditional_and_unconditional_round_trip():
    r = np.array([0.9, 0.5, 0.2, 0.0, 0.0])
    c = synth.unconditional_to_conditional(r)
    np.testing.assert_allclose(c, [0.9, 0.5 / 0.9, 0.2 / 0.5, 0.0, 0.0])
    np.testing.assert_allclose(synth.conditional_to_unconditional(c), r)


def test_length_law_and_mean():
    r = np.array([0.9, 0.5, 0.2])
    law = synth.acceptance_length_law(r)
    np.testing.assert_allclose(law, [0.1, 0.4, 0.3, 0.2])
    assert abs(law @ np.arange(4) + 1 - synth.mean_acceptance_length(r)) < 1e-15
    # P(#accepted >= i+1) = r_i
    np.testing.assert_allclose(law[::-1].cumsum()[::-1][1:], r)


@pytest.mark.parametrize("k", [1, 3, 4, 8])
def test_acceptance_length_gives_minimum_variance_rates(k):
    for length in np.linspace(1, k + 1, 37):
        rates = synth.rates_for_acceptance_length(float(length), k)
        assert rates.size == k
        assert abs(synth.mean_acceptance_length(rates) - length) < 1e-12
        assert np.all(np.diff(rates) <= 0) and ((rates > 0) & (rates < 1)).sum() <= 1
    np.testing.assert_allclose(synth.rates_for_acceptance_length(2.5, 4), [1.0, 0.5, 0.0, 0.0])


@pytest.mark.parametrize(
    "call,needle",
    [
        (lambda: synth.base_and_decay(1.5, 4), "mean_rate"),
        (lambda: synth.base_and_decay(float("nan"), 4), "mean_rate"),
        (lambda: synth.base_and_decay(0.5, 0), "num_drafts"),
        (lambda: synth.unconditional_to_conditional([0.5, 0.7]), "non-increasing"),
        (lambda: synth.unconditional_to_conditional([1.2]), "[0, 1]"),
        (lambda: synth.rates_for_acceptance_length(0.5, 3), "acceptance_length"),
        (lambda: synth.rates_for_acceptance_length(5.0, 3), "acceptance_length"),
    ],
)
def test_bad_parameters_are_named(call, needle):
    with pytest.raises(ValueError, match=__import__("re").escape(needle)):
        call()

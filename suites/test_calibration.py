"""Measured calibration of the whole pipeline on the correct reference (a CI-sized slice of
``python -m harness calibrate``; docs/calibration.md has the 1000-seed run).

Agreement is judged at ``META_ALPHA``: the false-alarm rate must be consistent with alpha
(exact binomial test) and the chi-square p-values with a uniform law (Kolmogorov-Smirnov).
"""

from harness.scenarios.profiles import get_profile
from harness.studies.calibration import p_values, summarize

META_ALPHA = 1e-6
SEEDS = range(1000, 1120)  # disjoint from the documented run's seeds


def test_false_alarm_rate_and_p_value_uniformity():
    alpha = 0.05
    rows = summarize(alpha, p_values(get_profile("smoke"), SEEDS, alpha))
    assert {r.kind for r in rows} == {"gof", "binomial"}
    for r in rows:
        assert r.checks >= 500, r
        assert r.agreement_p > META_ALPHA, f"{r.kind}: {r.false_alarms}/{r.checks} false alarms at alpha {alpha}"
        if r.ks_p is not None:
            assert r.ks_p > META_ALPHA, f"{r.kind}: p-values not uniform (KS p = {r.ks_p:.2g})"

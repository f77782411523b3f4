"""Measured calibration of the distribution checks on the correct reference.

For each loose alpha, every calibration scenario is run over many seeds with the
reference backend; each law check's p-value is kept (before Holm). Templates and seeds
are independent data, so the false alarms are independent Bernoulli(alpha) under the
null (the acceptance-length check, a marginal of the same tally, is left out). Under the null
the false-alarm rate must equal alpha within binomial error, and the chi-square tests' p-values
must be uniform (Kolmogorov-Smirnov; the exact binomial tests are discrete, hence
conservative, and are reported by rate only).
"""

import dataclasses
import math

import numpy as np
from scipy import stats as sps

from harness.backends import load_backend
from harness.checking.stats import binomial_test
from harness.run.plans import planned_trials
from harness.sampling.sample import sample_scenario
from harness.scenarios.catalog import catalog, find
from harness.scenarios.profiles import Profile

# One scenario per kind of statistical check: fixed-draft outcome law, per-step laws with
# sampled drafts, block's mixture law, synthetic binomials, a pooled large vocabulary.
CALIBRATION_SCENARIOS = ("standard-near-target", "standard-sampled", "block-sampled", "synthetic-rates", "standard-large-vocab")


def p_values(profile: Profile, seeds: range, alpha: float, names=CALIBRATION_SCENARIOS) -> dict[str, list[float]]:
    """p-values per check kind over ``seeds``, each seed a fresh catalog draw."""
    loose = dataclasses.replace(profile, alpha=alpha)
    backend = load_backend("reference")
    out: dict[str, list[float]] = {"gof": [], "binomial": []}
    for seed in seeds:
        scenarios = catalog(loose, seed)
        for name in names:
            scenario = find(scenarios, name)
            templates, planned, count = planned_trials(scenario, loose)
            tallies = sample_scenario(backend, scenario, templates, count, loose)
            rng = np.random.default_rng(seed)
            for check in planned:
                if check.name == "acceptance-length":
                    continue  # a marginal of the same tally's law check: not independent of it
                v = check.evaluate(tallies[check.template], rng)
                if v.kind in out and v.p_value is not None:
                    out[v.kind].append(v.p_value)
    return out


@dataclasses.dataclass
class CalibrationRow:
    alpha: float
    kind: str
    checks: int
    false_alarms: int
    rate: float
    agreement_p: float  # exact binomial test of the rate against alpha
    ks_p: float | None  # uniformity of the p-values (chi-square tests only)


def summarize(alpha: float, values: dict[str, list[float]]) -> list[CalibrationRow]:
    rows = []
    for kind, ps in values.items():
        if not ps:
            continue
        ps = np.asarray(ps)
        alarms = int((ps <= alpha).sum())
        ks = float(sps.kstest(ps, "uniform").pvalue) if kind == "gof" else None
        rows.append(CalibrationRow(alpha, kind, ps.size, alarms, alarms / ps.size, binomial_test(alarms, ps.size, alpha), ks))
    return rows


def detectable_table(profiles: list[Profile], seed: int = 0) -> list[dict]:
    """Per profile: the largest detectable TV over every planned check of its catalog."""
    rows = []
    for profile in profiles:
        worst, trials = 0.0, 0
        for scenario in catalog(profile, seed):
            _, planned, count = planned_trials(scenario, profile)
            trials += count * len(scenario.requests)
            worst = max([worst] + [c.design_detectable(count) for c in planned if c.detectable])
        rows.append(
            {
                "profile": profile.name,
                "alpha": profile.alpha,
                "power": profile.power,
                "design_tv": profile.tv,
                "worst_detectable_tv": worst,
                "trials": trials,
            }
        )
    return rows


def fmt(x: float | None) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"

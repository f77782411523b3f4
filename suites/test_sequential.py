"""The anytime-valid sequential check (``harness.checking.sequential``): its arithmetic, its
false alarms under continuous monitoring, an early stop on a gross deviation, impossible cells,
the combined design, bad input, and the check in a run (``--sequential``): the looks, the early
stop of a planted fault in process and in a worker, the reference's full count."""

import json
import math
import shlex
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from scipy.stats import binom

from harness.backends.loading import load_for_device
from harness.checking import checks, power, stats
from harness.checking.sequential import (
    SequentialTest,
    combined_design,
    combined_p_value,
    half_profile,
    log_e_value,
    stop_rule,
)
from harness.cli import main
from harness.evidence.records import Kind, Verdict
from harness.run.plans import planned_trials
from harness.run.runner import run
from harness.sampling.sample import FIRST_LOOK, sample_scenario, start_scenario
from harness.scenarios.catalog import catalog, find
from harness.scenarios.materialize import materialize
from harness.scenarios.profiles import get_profile

SEQUENTIAL_CI = replace(get_profile("ci"), sequential=True)

META_ALPHA = 1e-6  # chance that a correct implementation fails the false-alarm test below


def law(cells=13, seed=0, zeros=1):
    """A fixed law over ``cells`` cells, the last ``zeros`` of them impossible."""
    p = np.random.default_rng(seed).dirichlet(np.full(cells - zeros, 0.7))
    return np.concatenate([p, np.zeros(zeros)])


def test_closed_form_equals_the_product_of_predictive_ratios():
    """E_n = B(a + x) / B(a) / prod p^x equals prod_t [(c p_y + x_y) / (c + t)] / p_y, trial by
    trial, and the test updated after every trial reports the same value."""
    p = law()
    c = 7.0
    draws = np.random.default_rng(1).choice(p.size, size=600, p=p)
    test = SequentialTest(p, 0.05, concentration=c)
    counts = np.zeros(p.size, dtype=np.int64)
    log_product = 0.0
    for t, y in enumerate(draws):
        log_product += math.log((c * p[y] + counts[y]) / (c + t)) - math.log(p[y])
        counts[y] += 1
        state = test.update(counts)
        assert state.log_e == pytest.approx(log_product, rel=1e-10, abs=1e-9)
        assert float(log_e_value(counts, p, c)) == pytest.approx(log_product, rel=1e-10, abs=1e-9)
    assert state.trials == draws.size
    assert state.max_log_e >= state.log_e


def test_false_alarms_under_continuous_monitoring_stay_below_alpha():
    """400 sequences drawn from the law itself, looked at every 64 trials up to 20,480 trials,
    at alpha = 0.05. Ville's inequality bounds each sequence's false-alarm chance by alpha, so the
    alarms are at most Binomial(400, 0.05) stochastically: the test fails when they reach the
    least k with P(Binomial(400, 0.05) >= k) <= 1e-6 (k = 45; the mean is 20), which a valid test
    does with probability below 1e-6. This seed gives 3 alarms; without the normalizing
    Gamma(c + n) / Gamma(c), or with it taken at c / 2 (a prior not summing to c), all 400 alarm."""
    p, alpha, sequences, looks, chunk = law(), 0.05, 400, 320, 64
    bound = next(k for k in range(sequences + 1) if binom.sf(k - 1, sequences, alpha) <= META_ALPHA)
    assert bound == 45
    rng = np.random.default_rng(2)
    alarms = 0
    for _ in range(sequences):
        cumulative = np.cumsum(rng.multinomial(chunk, p, size=looks), axis=0)
        test = SequentialTest(p, alpha)
        for counts in cumulative:
            if test.update(counts).rejected:
                break
        alarms += test.rejected
    assert alarms < bound


def test_a_gross_deviation_stops_far_before_the_fixed_design():
    """An implementation at TV 0.3 from the law (mixed with the law's possible cells reversed,
    so every cell moves) is rejected at the combined design's alpha / 2 = 5e-7 within a
    hundredth of the ``ci`` profile's fixed-sample trial count (47,022 here), in every one of 20
    sequences looked at every 64 trials; it took 64 or 128 trials when this was written."""
    p = law()
    live = p > 0
    reversed_law = p.copy()
    reversed_law[live] = p[live][::-1]
    mix = 0.3 / (0.5 * np.abs(reversed_law - p).sum())
    wrong = (1 - mix) * p + mix * reversed_law
    assert 0.5 * np.abs(wrong - p).sum() == pytest.approx(0.3)
    design = combined_design(p, get_profile("ci"))
    rng = np.random.default_rng(3)
    for _ in range(20):
        test = design.sequential()
        counts = np.zeros(p.size, dtype=np.int64)
        while not test.rejected and counts.sum() < design.trials:
            counts += rng.multinomial(64, wrong)
            test.update(counts)
        assert test.rejected
        assert test.crossed_at <= design.fixed_trials / 100


def test_an_observation_in_an_impossible_cell_rejects_at_once_and_for_good():
    p = law(zeros=2)
    test = SequentialTest(p, 1e-9)
    counts = np.zeros(p.size, dtype=np.int64)
    counts[0] = 3
    assert not test.update(counts).rejected
    counts[-1] = 1
    state = test.update(counts)
    assert state.rejected and state.crossed_at == 4 and state.impossible == 1
    assert state.log_e == math.inf and state.p_value == 0.0
    counts[0] += 100
    later = test.update(counts)
    assert later.rejected and later.crossed_at == 4  # the first crossing is kept


def test_pooled_cells_test_the_pooled_counts():
    """On a design's bins the test is the closed form of the pooled counts against the pooled law."""
    p = law(cells=40, zeros=3)
    design = combined_design(p, get_profile("smoke"))
    bins = design.cells.bins
    assert bins.max() + 1 < (p > 0).sum()  # some cells were pooled
    counts = np.random.default_rng(4).multinomial(500, p)
    pooled = np.bincount(bins[bins >= 0], weights=counts[bins >= 0], minlength=bins.max() + 1)
    state = design.sequential(concentration=5.0, pooled=True).update(counts)
    assert state.log_e == pytest.approx(float(log_e_value(pooled, design.cells.probs, 5.0)), rel=1e-12)


def test_the_combined_design_is_the_chi_square_design_at_half_alpha():
    p = law(cells=30)
    profile = get_profile("ci")
    design = combined_design(p, profile)
    unused = lambda *_: None  # noqa: E731 (label and source: the design does not read them)
    assert design.fixed_trials == checks.gof_check("x", 0, p, unused, profile, unused).design_trials
    assert design.trials == checks.gof_check("x", 0, p, unused, half_profile(profile), unused).design_trials
    assert design.trials == power.trials_for_tv(profile.alpha / 2, profile.power, profile.tv, design.df)
    assert 0.02 < design.extra_trials < 0.05
    assert design.sequential().alpha == profile.alpha / 2


def test_the_combined_p_value_is_bonferroni_over_its_two_parts():
    assert combined_p_value(math.log(1e6)) == pytest.approx(2e-6)
    assert combined_p_value(0.0, 0.2) == pytest.approx(0.4)
    assert combined_p_value(math.log(10), 1e-4) == pytest.approx(2e-4)
    assert combined_p_value(0.0, 0.9) == 1.0
    assert combined_p_value(math.inf) == 0.0


@pytest.mark.parametrize(
    "probs,alpha,match",
    [
        ([0.5, 0.4], 0.05, "probs: expected probabilities summing to 1"),
        ([1.2, -0.2], 0.05, "probs: expected probabilities >= 0"),
        ([0.5, np.nan], 0.05, "probs: expected finite"),
        ([], 0.05, "probs: expected at least one cell"),
        ([0.5, 0.5], 0.0, "alpha"),
        ([0.5, 0.5], 1.0, "alpha"),
        ([0.5, 0.5], -0.1, "alpha"),
        ([0.5, 0.5], "0.05", "alpha"),
    ],
)
def test_a_bad_law_or_level_is_refused(probs, alpha, match):
    with pytest.raises(ValueError, match=match):
        SequentialTest(probs, alpha)


def test_bad_concentration_and_bins_are_refused():
    with pytest.raises(ValueError, match="concentration"):
        SequentialTest([0.5, 0.5], 0.05, concentration=0.0)
    with pytest.raises(ValueError, match="concentration"):
        SequentialTest([0.5, 0.5], 0.05, concentration=math.inf)
    with pytest.raises(ValueError, match="bins: expected 3 integer bin ids"):
        SequentialTest([0.5, 0.5, 0.0], 0.05, bins=[0, 1])
    with pytest.raises(ValueError, match="bins: cell 1 has probability > 0 but no bin"):
        SequentialTest([0.5, 0.5, 0.0], 0.05, bins=[0, -1, -1])


def test_bad_counts_are_refused():
    test = SequentialTest([0.25, 0.25, 0.5], 0.05)
    with pytest.raises(ValueError, match=r"counts: expected shape \(3,\)"):
        test.update([1, 2])
    with pytest.raises(ValueError, match=r"counts: expected shape \(3,\)"):
        test.update([[1, 2, 3]])
    with pytest.raises(ValueError, match="counts: expected non-negative integer counts"):
        test.update([1, -1, 2])
    with pytest.raises(ValueError, match="counts: expected non-negative integer counts"):
        test.update([1.5, 1, 2])
    with pytest.raises(ValueError, match="counts: expected integer counts"):
        test.update(["a", "b", "c"])
    test.update([3, 2, 5])
    test.update([3, 2, 5])  # nothing new: allowed
    with pytest.raises(ValueError, match="counts: cell 1 went from 2 to 1; counts are cumulative"):
        test.update([4, 1, 6])
    assert test.state.trials == 10  # a refused update changes nothing


# --- in a run (Profile.sequential, --sequential) ----------------------------------------------
def ci_scenario(name):
    return find(catalog(SEQUENTIAL_CI, 0), name)


def test_the_combined_check_reports_the_combined_p_value():
    """Sampled to its design: p = 2 min(1/E, p_chi), both at the design's counts. Stopped early:
    a rejection reports p = 2/E and log E as its statistic; no rejection is not evaluated."""
    p = law(cells=20)
    check = checks.gof_check("outcome-law", 0, p, str, SEQUENTIAL_CI, lambda tally: tally.counts)
    design = combined_design(p, SEQUENTIAL_CI)
    assert check.design_trials == design.trials and check.monitor.alpha == SEQUENTIAL_CI.alpha / 2
    rng = np.random.default_rng(5)
    counts = rng.multinomial(design.trials, p)
    outcome = check.evaluate(SimpleNamespace(counts=counts, stopped=False, trials=design.trials), rng)
    o, impossible = design.cells.pool(counts)
    chi = stats.chi_square_pooled(o, design.cells.probs * design.trials, impossible)
    assert outcome.kind is Kind.GOF and outcome.statistic == pytest.approx(chi.statistic)
    assert outcome.p_value == pytest.approx(combined_p_value(float(log_e_value(counts, p)), chi.p_value))
    assert outcome.alpha == SEQUENTIAL_CI.alpha
    wrong = np.zeros(p.size, dtype=np.int64)
    wrong[0] = FIRST_LOOK  # every trial in one cell: far from p
    stopped = check.evaluate(SimpleNamespace(counts=wrong, stopped=True, trials=FIRST_LOOK), rng)
    log_e = float(log_e_value(wrong, p))
    assert log_e >= math.log(2 / SEQUENTIAL_CI.alpha)
    assert stopped.kind is Kind.GOF and stopped.statistic == pytest.approx(log_e) and stopped.trials == FIRST_LOOK
    assert stopped.p_value == pytest.approx(combined_p_value(log_e)) and stopped.p_value <= SEQUENTIAL_CI.alpha
    assert f"sampling stopped at {FIRST_LOOK} of the design's {design.trials:,} trials" in stopped.message
    fine = rng.multinomial(FIRST_LOOK, p)
    other = check.evaluate(SimpleNamespace(counts=fine, stopped=True, trials=FIRST_LOOK), rng)
    assert other.kind is Kind.SKIPPED and other.p_value is None and other.message.startswith("not evaluated")


def test_looks_double_from_64_trials_and_do_not_change_the_counts():
    """With a stop rule the host path calls the backend with 64, 64, 128, 256, ... trials (after
    the two one-trial calls of the repeatability probe); the counts are those of one call."""
    scenario = ci_scenario("standard-near-target")
    templates = materialize(scenario)
    _, planned, _ = planned_trials(scenario, SEQUENTIAL_CI)
    reference = load_for_device("reference", "cpu")
    sizes = []

    class Recording:
        def __getattr__(self, name):
            return getattr(reference, name)

        def sample(self, batch):
            sizes.append(batch.num_requests // len(templates))
            return reference.sample(batch)

    looked = start_scenario(Recording(), scenario, templates, 1000, SEQUENTIAL_CI, stop_rule(planned)).tallies()
    assert sizes == [1, 1, 64, 64, 128, 256, 488]
    plain = sample_scenario(reference, scenario, templates, 1000, SEQUENTIAL_CI)
    for a, b in zip(looked, plain):
        assert not a.stopped and a.trials == b.trials == 1000
        assert (a.outcome == b.outcome).all() and (a.steps == b.steps).all()


def test_a_planted_fault_stops_early_and_fails_in_a_worker_and_in_process(tmp_path):
    """fault:bonus-wrong-row on standard-near-target: its outcome-law checks reject at the first
    look, far below the design; they fail with the combined p-value 2/E; nothing else of the
    scenario passes on those counts. Its reproducer names --sequential, and in process (the
    reproducer with --in-process) gives the same records as the worker did."""
    name = "standard-near-target"
    _, _, count = planned_trials(ci_scenario(name), SEQUENTIAL_CI)
    out = tmp_path / "worker"
    args = ["run", "--backend", "fault:bonus-wrong-row", "--profile", "ci", "--scenario", name, "--sequential", "--no-progress"]
    assert main([*args, "--out", str(out)]) == 1
    doc = json.loads((out / "results.json").read_text())
    sampled = doc["trials"][f"fault:bonus-wrong-row/{name}"]
    assert sampled <= count / 100
    records = doc["records"]
    failed = [r for r in records if r["verdict"] == "fail"]
    assert failed and {r["check"] for r in failed} == {"outcome-law"}
    for r in failed:
        assert r["trials"] == sampled and r["statistic"] >= math.log(2 / SEQUENTIAL_CI.alpha)
        assert r["p_value"] == pytest.approx(combined_p_value(r["statistic"]))
        assert f"sampling stopped at {sampled} of the design's" in r["message"]
    assert {r["verdict"] for r in records} == {"fail", "skipped"}
    assert all(r["message"].startswith("not evaluated") for r in records if r["verdict"] == "skipped")
    repro = shlex.split(failed[0]["reproducer"])
    assert "--sequential" in repro
    again = tmp_path / "in-process"
    assert main([*repro[3:], "--in-process", "--no-progress", "--out", str(again)]) == 1
    redo = json.loads((again / "results.json").read_text())
    assert redo["trials"] == doc["trials"]
    assert [(r["check"], r["verdict"], r["statistic"]) for r in redo["records"]] == [
        (r["check"], r["verdict"], r["statistic"]) for r in records
    ]


def test_the_reference_passes_on_the_full_combined_count():
    scenario = ci_scenario("standard-near-target")
    _, _, count = planned_trials(scenario, SEQUENTIAL_CI)
    assert count > planned_trials(scenario, get_profile("ci"))[2]  # the chi-square at alpha / 2 needs more
    result = run(["reference"], [scenario], SEQUENTIAL_CI)
    assert result.trials[("reference", scenario.name)] == count
    assert {r.verdict for r in result.records} == {Verdict.PASS}
    combined = [r for r in result.records if "combined p=" in r.message]  # template 0's acceptance length is a point mass: exact
    assert [(r.template, r.check) for r in combined] == [(0, "outcome-law")] + [
        (i, c) for i in (1, 2) for c in ("outcome-law", "acceptance-length")
    ]


def test_a_stopped_scenario_claims_no_pass_it_has_no_power_for():
    """Counts cut short by a stop (``tally.stopped``): fixed-sample tests (position-law) and a
    combined check that did not reject are not evaluated, nor is an exact check short of its
    design count; an exact check's deviation still fails."""
    scenario = ci_scenario("standard-sampled")
    templates = materialize(scenario)
    planned = checks.plan(scenario, templates, SEQUENTIAL_CI)
    tallies = sample_scenario(load_for_device("reference", "cpu"), scenario, templates, FIRST_LOOK, SEQUENTIAL_CI)
    for tally in tallies:
        tally.stopped = True
    rng = np.random.default_rng(0)
    assert {c.name for c in planned} == {"structure", "position-law", "acceptance-length"}
    for check in planned:
        outcome = check.evaluate(tallies[check.template], rng)
        assert outcome.kind is Kind.SKIPPED and outcome.message.startswith("not evaluated"), (check.name, outcome.message)
    tallies[0].violations = 1
    structure = next(c for c in planned if c.name == "structure" and c.template == 0)
    outcome = structure.evaluate(tallies[0], rng)
    assert outcome.deviated and "sampling stopped early at 64 trials" in outcome.message

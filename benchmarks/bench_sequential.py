"""The anytime-valid sequential check (``harness.checking.sequential``) on the CPU: its false
alarms under continuous monitoring, and how soon it stops planted faults.

(a) Calibration. For outcome laws of the ``ci`` catalog (24, 60 and 768 cells, the last also
on the chi-square design's pooled bins), ``--seeds`` sequences of trials are drawn from the law
itself up to the combined design's trial count, and ``log E`` is followed trial by trial (the
predictive product, cross-checked against the closed form at the end). A seed is a false alarm
when ``E`` reached ``1 / alpha`` at any chunk end (every ``--chunk`` trials, as a runner would
look) or at any trial at all (the worst monitoring there is). Ville's inequality promises a
rate at most ``alpha``; the table gives each rate with its Wilson 95 % interval. The combined
check (``E >= 2 / alpha`` at a chunk end, or the chi-square at ``alpha / 2`` on the final
counts) is counted too.

(b) Detection. Planted faults (``harness.backends.faults``), each on a scenario of the ``ci``
catalog whose fixed-draft outcome law it changes, sampled in process through the fault backend
in batches of ``BATCH`` trials and tallied every ``--chunk`` trials; each of ``--reps``
replicates takes its own range of trial indices (independent trials of the same law). Per
variant (the prior weight c, raw or pooled cells) the trials until the test at ``alpha / 2``
(the combined design's share of ``alpha = 1e-6``) first rejects, and for the kept c the
seconds (sampling, tally and that test's updates up to the batch where it crossed), against
the ``ci`` profile's fixed-sample design and its measured time (``sample_scenario`` at the
profile's chunking, then the check's evaluation). The fault's TV is the plug-in estimate
from ``TV_TRIALS`` trials.

Run: ``python benchmarks/bench_sequential.py [--seeds 1000] [--reps 50] [--json PATH]``
(single process; about a minute on this project's 2-core CPU box).
"""

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from harness.backends import load_backend  # noqa: E402
from harness.checking import sequential, stats  # noqa: E402
from harness.evidence.environment import describe  # noqa: E402
from harness.run.plans import planned_trials  # noqa: E402
from harness.sampling.sample import sample_scenario  # noqa: E402
from harness.sampling.tally import TemplateTally, add_outputs  # noqa: E402
from harness.scenarios.catalog import catalog, find  # noqa: E402
from harness.scenarios.materialize import trials  # noqa: E402
from harness.scenarios.profiles import get_profile  # noqa: E402
from reference import laws  # noqa: E402
from reference.methods import Method  # noqa: E402

CONCENTRATIONS = (1.0, 10.0, 100.0, 1000.0)
LOOSE_ALPHAS = (0.01, 0.05)
DETECTION_ALPHA = 1e-6  # the profiles' alpha; the sequential part runs at half of it
SEED_BLOCK = 50  # sequences simulated at once (memory: a few arrays of SEED_BLOCK x trials)
BATCH = 1024  # trials per backend call in the detection runs
TV_TRIALS = 1 << 18
REP_STRIDE = 1 << 32  # replicate r samples trial indices from r * REP_STRIDE on: disjoint ranges
TV_FIRST = 1 << 40  # the TV estimate's trials, past every replicate's

# (scenario, template, pooled): outcome laws of the ``ci`` catalog, 24, 60 and 768 cells
CALIBRATION_LAWS = (
    ("standard-near-target", 0, False),
    ("standard-near-target", 2, False),
    ("standard-large-vocab", 0, False),
    ("standard-large-vocab", 0, True),
)
# (fault, scenario, template): gross to subtle, two through impossible cells, one large vocabulary
FAULT_CASES = (
    ("bonus-wrong-row", "standard-near-target", 0),
    ("residual-not-normalized", "standard-peaked-vs-flat", 0),
    ("block-token-wise", "block-fixed", 0),
    ("reuse-uniform", "standard-permuted-slots", 2),
    ("top-p-before-temperature", "standard-top-p", 1),
    ("noise-floor", "standard-large-vocab", 0),
    ("wrong-request-slot", "standard-permuted-slots", 2),
    ("min-p-skipped", "standard-min-p", 0),
)


def outcome_law(scenario, templates, i) -> np.ndarray:
    """The fixed-draft outcome law of template ``i``, [d+1, V], as ``checks.plan`` computes it."""
    t = templates[i]
    d = t.effective_drafts
    if t.drafts is None or t.method is Method.SYNTHETIC or t.spec.degenerate:
        raise ValueError(f"{scenario.name}[{i}]: no fixed-draft outcome law")
    visible = t.visible_draft_probs()[:d] if scenario.draft_probs else None
    return laws.fixed_draft_law(t.method, t.target_probs()[: d + 1], visible, t.drafts[:d])


def planned_law(profile, name, i):
    """(scenario, templates, planned outcome-law check, law, combined design); the design's plain
    count must be the planned check's, which ties the law here to the suite's."""
    scenario = find(catalog(profile, 0), name)
    templates, planned, _ = planned_trials(scenario, profile)
    check = next(c for c in planned if c.name == "outcome-law" and c.template == i)
    law = outcome_law(scenario, templates, i)
    design = sequential.combined_design(law, profile)
    assert design.fixed_trials == check.design_trials, (name, i, design.fixed_trials, check.design_trials)
    return scenario, templates, check, law, design


# --- (a) calibration --------------------------------------------------------------------------
def occurrences(cells: np.ndarray, n_cells: int) -> np.ndarray:
    """For each draw, how often its cell was drawn earlier in its row (rows are sequences)."""
    rows, length = cells.shape
    key = (np.arange(rows)[:, None] * n_cells + cells).ravel()
    order = np.argsort(key, kind="stable")
    ranked = key[order]
    first = np.r_[True, ranked[1:] != ranked[:-1]]
    start = np.maximum.accumulate(np.where(first, np.arange(key.size), 0))
    out = np.empty(key.size, dtype=np.int64)
    out[order] = np.arange(key.size) - start
    return out.reshape(rows, length)


def calibrate(profile, name, i, pooled, seeds, chunk) -> list[dict]:
    _, _, _, law, design = planned_law(profile, name, i)
    raw = law.ravel()
    horizon = design.trials
    if pooled:
        probs, to_cell = design.cells.probs, design.cells.bins
    else:
        probs, to_cell = raw, np.arange(raw.size)
    ends = np.r_[np.arange(chunk, horizon + 1, chunk), [horizon]] - 1  # chunk ends (and the horizon), as indices
    sup_chunk = {c: [] for c in CONCENTRATIONS}
    sup_trial = {c: [] for c in CONCENTRATIONS}
    chi_p = []
    t0 = time.perf_counter()
    for block in range(0, seeds, SEED_BLOCK):
        rng = np.random.default_rng([20261201, block])
        rows = min(SEED_BLOCK, seeds - block)
        drawn = rng.choice(raw.size, size=(rows, horizon), p=raw)  # raw cells (chi-square needs them)
        cells = to_cell[drawn]
        seen = occurrences(cells, probs.size)
        finals = np.stack([np.bincount(r, minlength=raw.size) for r in drawn])
        for f in finals:
            chi_p.append(stats.chi_square_test(f, raw * horizon, design.cells.bins, with_ci=False).p_value)
        pooled_finals = np.stack([np.bincount(r, minlength=probs.size) for r in cells])
        p = probs[cells]
        for c in CONCENTRATIONS:
            step = np.log(c * p + seen) - np.log(c + np.arange(horizon)) - np.log(p)  # predictive ratio of trial t
            log_e = np.cumsum(step, axis=1)
            closed = sequential.log_e_value(pooled_finals, probs, c)
            assert np.allclose(log_e[:, -1], closed, rtol=1e-9, atol=1e-6), "predictive product != closed form"
            sup_trial[c].append(np.maximum(log_e.max(axis=1), 0.0))
            sup_chunk[c].append(np.maximum(log_e[:, ends].max(axis=1), 0.0))
    seconds = time.perf_counter() - t0
    chi_p = np.asarray(chi_p)
    out = []
    for c in CONCENTRATIONS:
        by_chunk, by_trial = np.concatenate(sup_chunk[c]), np.concatenate(sup_trial[c])
        for alpha in LOOSE_ALPHAS:
            row = {
                "scenario": f"{name}[{i}]",
                "cells": int(probs.size),
                "pooled": pooled,
                "horizon": horizon,
                "chunk": chunk,
                "concentration": c,
                "alpha": alpha,
                "seeds": seeds,
                "seconds": seconds,
            }
            for label, alarms in (
                ("chunk", by_chunk >= math.log(1 / alpha)),
                ("trial", by_trial >= math.log(1 / alpha)),
                ("combined", (by_chunk >= math.log(2 / alpha)) | (chi_p <= alpha / 2)),
            ):
                k = int(alarms.sum())
                lo, hi = stats.wilson_interval(k, seeds)
                row[label] = {"false_alarms": k, "rate": k / seeds, "wilson95": [lo, hi]}
            out.append(row)
    return out


# --- (b) detection ------------------------------------------------------------------------------
def chunks_of(backend, scenario, templates, i, first, count):
    """One batch through the backend, template ``i``'s part as add_outputs takes it."""
    tr = trials(scenario, templates, first, count)
    tokens, emitted = backend.sample(tr.batch)[:2]
    t_count = len(templates)
    tok = np.asarray(tokens).reshape(count, t_count, -1)[:, i]
    num = np.asarray(emitted).reshape(count, t_count)[:, i]
    return tok, num, tr.drafts[:, i : i + 1]


def fault_tv(backend, scenario, templates, i, law) -> tuple[float, float, int]:
    """(plug-in TV of the fault's outcome law from the exact one, its mass on impossible cells,
    structure violations), from ``TV_TRIALS`` trials."""
    tally = TemplateTally(templates[i].effective_drafts, scenario.vocab_size)
    for first in range(0, TV_TRIALS, 1 << 14):
        tok, num, drafts = chunks_of(backend, scenario, templates, i, TV_FIRST + first, 1 << 14)
        add_outputs([tally], tok, num, drafts, first)
    observed = tally.outcome / max(tally.outcome.sum(), 1)
    return 0.5 * float(np.abs(observed - law).sum()), float(observed[law == 0].sum()), tally.violations


def detect(profile, fault, name, i, reps, chunk) -> dict:
    scenario, templates, check, law, design = planned_law(profile, name, i)
    backend = load_backend(f"fault:{fault}")
    variants = {f"c={c:g}": (c, False) for c in CONCENTRATIONS}
    kept = f"c={sequential.CONCENTRATION:g}"
    variants[kept + " pooled"] = (sequential.CONCENTRATION, True)
    found = {v: [] for v in variants}
    seconds = []
    for r in range(reps):
        tests = {v: design.sequential(c, pooled) for v, (c, pooled) in variants.items()}
        spent = dict.fromkeys(variants, 0.0)  # each test's own update time
        shared = 0.0  # sampling and tally
        tally = TemplateTally(templates[i].effective_drafts, scenario.vocab_size)
        done, crossed_s = 0, None
        while done < design.trials and not all(t.rejected for t in tests.values()):
            count = min(BATCH, design.trials - done)
            t0 = time.perf_counter()
            tok, num, drafts = chunks_of(backend, scenario, templates, i, r * REP_STRIDE + done, count)
            shared += time.perf_counter() - t0
            for start in range(0, count, chunk):
                t0 = time.perf_counter()
                stop = min(start + chunk, count)
                add_outputs([tally], tok[start:stop], num[start:stop], drafts[start:stop], done + start)
                shared += time.perf_counter() - t0
                for v, test in tests.items():
                    if not test.rejected:
                        t0 = time.perf_counter()
                        test.update(tally.outcome)
                        spent[v] += time.perf_counter() - t0
            done += count
            if crossed_s is None and tests[kept].rejected:
                crossed_s = shared + spent[kept]  # up to the batch it crossed in
        for v, test in tests.items():
            found[v].append(test.crossed_at)
        seconds.append(crossed_s)
    t0 = time.perf_counter()
    tallies = sample_scenario(backend, scenario, templates, check.design_trials, profile)
    outcome = check.evaluate(tallies[i], np.random.default_rng(0))
    fixed_s = time.perf_counter() - t0
    tv, impossible, violations = fault_tv(backend, scenario, templates, i, law)
    return {
        "fault": fault,
        "scenario": f"{name}[{i}]",
        "cells": int(law.size),
        "pooled_cells": int(design.cells.probs.size),
        "tv": tv,
        "tv_trials": TV_TRIALS,
        "structure_violations": violations,
        "impossible_mass": impossible,
        "fixed_trials": design.fixed_trials,
        "combined_trials": design.trials,
        "fixed_seconds": fixed_s,
        "fixed_p_value": outcome.p_value,
        "reps": reps,
        "chunk": chunk,
        "sequential_alpha": DETECTION_ALPHA / 2,
        "kept": kept,
        "trials_to_reject": {v: summary(x, design.trials) for v, x in found.items()},
        "seconds_to_reject": summary(seconds, None),
    }


def summary(values, horizon) -> dict:
    """Median and 90th percentile over replicates; a replicate that never rejected counts as
    the horizon (then the chi-square decides), so a quantile at the horizon reads 'not before'."""
    rejected = [v for v in values if v is not None]
    filled = np.array([v if v is not None else (horizon if horizon is not None else math.inf) for v in values], dtype=np.float64)
    return {
        "rejected": len(rejected),
        "median": float(np.quantile(filled, 0.5, method="inverted_cdf")),  # observed values: trials are chunk multiples
        "p90": float(np.quantile(filled, 0.9, method="inverted_cdf")),
        "values": [None if v is None else (int(v) if horizon is not None else float(v)) for v in values],
    }


def design_costs(profiles) -> list[dict]:
    """The combined design's extra trials over the plain one, over every fixed-draft outcome-law
    check of each profile's catalog (the one-multinomial checks it applies to)."""
    out = []
    for profile in profiles:
        extras = []
        for scenario in catalog(profile, 0):
            if scenario.draft_mode != "fixed" or scenario.synthetic is not None:
                continue
            templates, planned, _ = planned_trials(scenario, profile)
            for check in planned:
                if check.name == "outcome-law" and check.kind == "statistical":
                    d = sequential.combined_design(outcome_law(scenario, templates, check.template), profile)
                    extras.append((d.extra_trials, d.df, scenario.name, check.template))
        values = np.array([e[0] for e in extras])
        out.append(
            {
                "profile": profile.name,
                "checks": len(extras),
                "extra_min": float(values.min()),
                "extra_median": float(np.median(values)),
                "extra_max": float(values.max()),
                "df_range": [min(e[1] for e in extras), max(e[1] for e in extras)],
            }
        )
    return out


# --- output ---------------------------------------------------------------------------------------
def fmt_rate(r: dict) -> str:
    lo, hi = r["wilson95"]
    return f"{r['false_alarms']} ({r['rate']:.4f}, {lo:.4f}–{hi:.4f})"


def fmt_q(s: dict, horizon: int | None) -> str:
    def one(x):
        if horizon is not None and x >= horizon:
            return f"≥{horizon:,}"
        return f"{x:,.0f}" if horizon is not None else f"{x:.3f}"

    return f"{one(s['median'])} / {one(s['p90'])}"


def markdown(result: dict) -> str:
    lines = [
        "Calibration: false alarms over seeds (rate, Wilson 95 %), monitored at every chunk end / every trial, and the combined check.",
        "",
        "| law | cells | horizon | c | α | chunk ends | every trial | combined (α/2 + α/2) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["calibration"]:
        cells = f"{r['cells']}{' pooled' if r['pooled'] else ''}"
        lines.append(
            f"| {r['scenario']} | {cells} | {r['horizon']:,} | {r['concentration']:g} | {r['alpha']:g} | "
            f"{fmt_rate(r['chunk'])} | {fmt_rate(r['trial'])} | {fmt_rate(r['combined'])} |"
        )
    variants = list(result["detection"][0]["trials_to_reject"])
    lines += [
        "",
        f"Detection: trials until the sequential test (α/2 = {DETECTION_ALPHA / 2:g}) rejects, median / 90th percentile "
        "over replicates (≥ horizon: not before the combined design's count, where the chi-square decides).",
        "",
        "| fault | law | cells | TV | fixed design | combined design | " + " | ".join(variants) + " | seconds (kept c) | fixed seconds |",
        "|---|---|---|---|---|---|" + "---|" * len(variants) + "---|---|",
    ]
    for r in result["detection"]:
        qs = " | ".join(fmt_q(r["trials_to_reject"][v], r["combined_trials"]) for v in variants)
        lines.append(
            f"| `{r['fault']}` | {r['scenario']} | {r['cells']} | {r['tv']:.3f} | {r['fixed_trials']:,} | {r['combined_trials']:,} | "
            f"{qs} | {fmt_q(r['seconds_to_reject'], None)} | {r['fixed_seconds']:.3f} |"
        )
    lines += [
        "",
        "| profile | one-multinomial checks | df | extra trials of the combined design (min / median / max) |",
        "|---|---|---|---|",
    ]
    for r in result["design_costs"]:
        lines.append(
            f"| {r['profile']} | {r['checks']} | {r['df_range'][0]}–{r['df_range'][1]} | "
            f"{r['extra_min']:.2%} / {r['extra_median']:.2%} / {r['extra_max']:.2%} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, default=1000, help="simulated sequences per calibration law")
    ap.add_argument("--reps", type=int, default=50, help="replicates per planted fault")
    ap.add_argument("--chunk", type=int, default=64, help="trials between two looks")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    profile = get_profile("ci")
    t0 = time.perf_counter()
    result = {"calibration": [], "detection": []}
    for name, i, pooled in CALIBRATION_LAWS:
        result["calibration"] += calibrate(profile, name, i, pooled, args.seeds, args.chunk)
        print(f"calibrated {name}[{i}]{' pooled' if pooled else ''} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    for fault, name, i in FAULT_CASES:
        result["detection"].append(detect(profile, fault, name, i, args.reps, args.chunk))
        print(f"detected {fault} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    result["design_costs"] = design_costs([profile, get_profile("gpu")])
    env = describe()
    env["cpu_affinity"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    result = {
        "environment": env,
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d"),
        "seconds": time.perf_counter() - t0,
        "kept_concentration": sequential.CONCENTRATION,
        "concentrations": list(CONCENTRATIONS),
        **result,
    }
    print(markdown(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The statistics peers use, side by side with ours, on the same faults and trial counts.

Each statistic is a decision on (observed counts, expected probabilities) of one check's
cells; none of the peers' statistics states its false-alarm rate or power.

* ``ours``: the suite's Pearson chi-square test, α = 1e-6, cells pooled from expectations, an observation
  in a zero-probability cell fails outright.
* ``mrv2-10-sigma``: vLLM MRV2's tests: Pearson chi-square, cells expected < 5 merged,
  fails when ``chi2 > df + 10 sqrt(2 df)``.
* ``flashinfer-cosine``: FlashInfer's sampler tests: fails when the cosine similarity of
  observed and expected frequencies is <= 0.99 or a zero-probability cell is observed.
* ``vllm-v1-convergence``: vLLM V1's ``test_rejection_sampling_approximates_target_distribution``:
  fails unless the L2 distance to the expected law shrinks, from 10 trials to all of them,
  at least 20x more than the distance to 100 random reference laws does.
"""

import numpy as np

from harness.backends import load_backend
from harness.checking import pooling, stats
from harness.run.plans import planned_trials
from harness.sampling.sample import sample_scenario
from harness.scenarios.catalog import catalog, find
from harness.scenarios.profiles import Profile
from harness.studies.detection import detect

STATISTICS = ("ours", "mrv2-10-sigma", "flashinfer-cosine", "vllm-v1-convergence")


def ours(observed, probs, alpha=1e-6) -> bool:
    n = observed.sum()
    bins = pooling.pool_cells(probs * n)
    return stats.chi_square_test(observed, probs * n, bins, with_ci=False).p_value <= alpha


def mrv2_ten_sigma(observed, probs) -> bool:
    n = observed.sum()
    expected = probs * n
    if observed[expected == 0].sum() > 0:
        return True  # their chi-square divides by zero there; count it as caught
    bins = pooling.pool_cells(expected)
    o, e = pooling.pooled(observed, bins), pooling.pooled(expected, bins)
    chi2 = float(((o - e) ** 2 / e).sum())
    df = max(o.size - 1, 1)
    return chi2 > df + 10 * np.sqrt(2 * df)


def flashinfer_cosine(observed, probs) -> bool:
    if observed[probs == 0].sum() > 0:
        return True
    freq = observed / observed.sum()
    cosine = float(freq @ probs / (np.linalg.norm(freq) * np.linalg.norm(probs)))
    return cosine <= 0.99


def vllm_v1_convergence(observed, probs, rng) -> bool:
    n = int(observed.sum())
    small = rng.multivariate_hypergeometric(observed.astype(np.int64), min(10, n))
    refs = rng.dirichlet(np.ones(probs.size), size=100)
    freq_small, freq_full = small / small.sum(), observed / n

    def shrink(target):
        far, near = np.linalg.norm(freq_small - target, axis=-1), np.linalg.norm(freq_full - target, axis=-1)
        return far / np.maximum(near, 1e-300)

    return not shrink(probs) >= 20 * float(np.mean(shrink(refs)))


def decide(name: str, observed, probs, rng) -> bool:
    """True when statistic ``name`` flags the counts as deviating from ``probs``."""
    observed = np.asarray(observed, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    probs = probs / probs.sum()
    if name == "ours":
        return ours(observed, probs)
    if name == "mrv2-10-sigma":
        return mrv2_ten_sigma(observed, probs)
    if name == "flashinfer-cosine":
        return flashinfer_cosine(observed, probs)
    if name == "vllm-v1-convergence":
        return vllm_v1_convergence(observed, probs, rng)
    raise ValueError(f"statistic: unknown statistic {name!r} (known: {', '.join(STATISTICS)})")


LAW_CHECKS = ("outcome-law", "position-law", "acceptance-length")


def _law_target(fault: str, profile: Profile, seed: int):
    """The law check that catches ``fault`` most weakly (largest p-value still failing):
    the subtle case, where statistics differ. None when only structure checks catch it."""
    row = detect(fault, profile, seed)
    laws = [c for c in row.catches if c[2] in LAW_CHECKS]
    return row, max(laws, key=lambda c: c[3] if c[3] is not None else 0.0, default=None)


def _decisions(backend_name, scenario, template, check_name, profile, trials, rng):
    templates, planned, _ = planned_trials(scenario, profile)
    check = next(c for c in planned if c.template == template and c.name == check_name)
    tallies = sample_scenario(load_backend(backend_name), scenario, templates, trials, profile)
    observed, expected = check.cells(tallies[template])
    return {name: bool(decide(name, observed, expected, rng)) for name in STATISTICS}


def compare(fault: str, profile: Profile, seed: int = 0, max_trials: int = 1 << 20) -> dict:
    """Which statistics catch ``fault`` at the profile's trial count, and the fewest trials each
    needs. A statistic catches at n trials when it flags the fault and does not flag the
    correct reference on the same scenario at the same n (else it is a false alarm)."""
    row, best = _law_target(fault, profile, seed)
    out = {"fault": fault, "doc": row.doc, "caught_by_suite": row.detected, "check": None, "at_profile_trials": None, "trials_needed": None}
    if best is None:
        out["note"] = "caught only by exact structure checks (any validity check sees it)"
        return out
    name, template, check_name, _ = best
    scenario = find(catalog(profile, seed), name)
    _, _, count = planned_trials(scenario, profile)
    rng = np.random.default_rng(seed)

    def caught(n):
        bad = _decisions(f"fault:{fault}", scenario, template, check_name, profile, n, rng)
        good = _decisions("reference", scenario, template, check_name, profile, n, rng)
        return {s: bad[s] and not good[s] for s in STATISTICS}, {s: good[s] for s in STATISTICS}

    at_count, false_alarm = caught(count)
    out.update(
        check=f"{name}[{template}] {check_name}",
        profile_trials=count,
        at_profile_trials=at_count,
        false_alarm_at_profile_trials=false_alarm,
    )
    needed = dict.fromkeys(STATISTICS)
    n = 100
    while n <= max_trials and any(v is None for v in needed.values()):
        for stat, hit in caught(n)[0].items():
            if hit and needed[stat] is None:
                needed[stat] = n
        n *= 2
    out["trials_needed"] = needed
    return out


def to_markdown(rows: list[dict], profile: Profile, max_trials: int) -> str:
    lines = [
        f"Same faults, same scenario and check, same trials (profile `{profile.name}`): which statistic flags the fault.",
        f"'trials needed' doubles from 100 up to {max_trials:,}; '–' = not caught within that.",
        "",
        "| fault | check | trials | " + " | ".join(STATISTICS) + " | " + " | ".join(f"trials needed: {s}" for s in STATISTICS) + " |",
        "|" + "---|" * (3 + 2 * len(STATISTICS)),
    ]
    for r in rows:
        if r["at_profile_trials"] is None:
            lines.append(f"| `{r['fault']}` | {r.get('note', '')} |" + " |" * (1 + 2 * len(STATISTICS)))
            continue
        hits = " | ".join(
            "caught"
            if r["at_profile_trials"][s]
            else ("false alarm on the reference" if r["false_alarm_at_profile_trials"][s] else "**missed**")
            for s in STATISTICS
        )
        need = " | ".join(f"{r['trials_needed'][s]:,}" if r["trials_needed"][s] else "–" for s in STATISTICS)
        lines.append(f"| `{r['fault']}` | {r['check']} | {r['profile_trials']:,} | {hits} | {need} |")
    return "\n".join(lines) + "\n"

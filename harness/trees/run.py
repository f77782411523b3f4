"""Tree samplers verified scenario by scenario: one check per (backend, scenario).

``tree-law`` (Pearson chi-square, level ``alpha``): counts of the sampler's outcomes,
``(accepted node, emitted token)`` for fixed children or the emitted sequence for drafted
ones, against the rule's exact law (``reference.tree``): cells pooled from the law alone and
trials from the power calculation for the profile's TV (or ``tv``) at its alpha and power
(``harness.checking.checks.gof_check``, the design of every law check). Holm over the run
gives its verdict (``harness.checking.family``). Its message says whether the rule is
lossless on the scenario: the rule's exact emitted law, continued by the target, against the
target's own law (a property of the rule, checked in ``suites/test_tree.py``, not of the
backend; a pass on a lossless scenario makes the sampler lossless there).

A backend that does not implement a scenario's rule declines it: the check is skipped with
the reason, never passed. A backend that raises or breaks the protocol errors it.
"""

import dataclasses
import shlex
import time
import zlib

import numpy as np

from harness.checking import checks
from harness.checking.family import decide_verdicts
from harness.evidence.records import CheckRecord, Kind, Verdict
from harness.run.runner import RunResult, _pythonpath_root
from harness.scenarios.profiles import Profile
from harness.trees import backends as tb
from harness.trees.scenario import LOSSLESS_TOLERANCE, TreeCase, TreeScenario
from reference.rng import hash64

CHECKS = ("tree-law",)


def reproducer(backend: str, profile: Profile, seed: int, scenario: str, tv: float | None) -> str:
    cmd = ["python", "-m", "harness", "tree", "--backend", backend, "--profile", profile.name, "--seed", str(seed), "--scenario", scenario]
    cmd = shlex.join(cmd + (["--tv", repr(tv)] if tv is not None else []))
    root = _pythonpath_root(backend)  # the PYTHONPATH entry a user's sampler was found through
    return cmd if root is None else f"PYTHONPATH={shlex.quote(root)} {cmd}"


def sampling_seed(seed: int, scenario: TreeScenario) -> int:
    """The seed a scenario's trials are drawn with: the run's seed and the scenario's name."""
    return int(hash64(seed, zlib.crc32(scenario.name.encode())))


def run_trees(backends: list[str], scenarios: list[TreeScenario], profile: Profile, seed: int = 0, tv: float | None = None) -> RunResult:
    start = time.monotonic()
    design = dataclasses.replace(profile, tv=tv) if tv is not None else profile
    cases = [s.build() for s in scenarios]
    plans = {c.scenario.name: checks.gof_check("tree-law", 0, c.law, c.label, design, lambda counts: counts) for c in cases}
    result = RunResult([], design, seed, 0.0, 0.0, scenarios={s.name: s.to_dict() for s in scenarios})
    for name in backends:
        t0 = time.monotonic()
        try:
            backend, error = tb.load(name), None
        except Exception as e:  # a user's module that does not import, or no tree sampler
            backend, error = None, f"{type(e).__name__}: {e}"
        for case in cases:
            s = case.scenario
            repro = reproducer(name, profile, seed, s.name, tv)
            plan = plans[s.name]
            result.trials[(name, s.name)] = [plan.design_trials]
            reason = error or backend.declines(case)
            if reason:
                verdict, kind = (Verdict.ERROR, Kind.ERROR) if error else (Verdict.SKIPPED, Kind.SKIPPED)
                result.records += [CheckRecord(name, s.name, 0, c, verdict, kind, reason, repro, s.rule) for c in CHECKS]
                continue
            try:
                counts = backend.counts(case, plan.design_trials, sampling_seed(seed, s))
            except Exception as e:  # the sampler raised, or its output broke the protocol
                message = f"{type(e).__name__}: {e}"
                result.records += [CheckRecord(name, s.name, 0, c, Verdict.ERROR, Kind.ERROR, message, repro, s.rule) for c in CHECKS]
                continue
            result.records.append(_law_record(name, case, plan, counts, repro))
        result.backend_seconds[name] = time.monotonic() - t0
    result.family_alpha = decide_verdicts(result.records, profile.alpha)
    result.planned_checks = {s.name: len(CHECKS) for s in scenarios}
    result.seconds = time.monotonic() - start
    return result


def _law_record(backend: str, case: TreeCase, plan: checks.Check, counts: np.ndarray, repro: str) -> CheckRecord:
    o = plan.evaluate(counts, np.random.default_rng(0))
    r = CheckRecord(
        backend, case.scenario.name, 0, plan.name, None, o.kind, f"{case.cells} cells: {o.message}; {_claim(case)}", repro,
        case.scenario.rule, o.statistic, o.df, o.p_value, o.alpha, None, o.trials, o.detectable_tv, o.tv_estimate, o.tv_ci,
        o.cells,
    )  # fmt: skip
    if o.kind is Kind.EXACT:  # a point-mass law: any deviation fails
        r.verdict = Verdict.FAIL if o.deviated else Verdict.PASS
    return r


def _claim(case: TreeCase) -> str:
    """The rule's own distance from the target on this scenario (what a pass here means)."""
    s = case.scenario
    tv = case.lossless_tv()
    if s.lossless and tv <= LOSSLESS_TOLERANCE:
        return f"a lossless setting (the rule's law is the target's, TV {tv:.2g})"
    return f"a known lossy setting ({s.description}: the rule's law is TV {tv:.3g} from the target's)"

"""Engines verified end to end: ``hf`` (the transformers installed here), ``hf@SITE`` (a
release installed in SITE with ``pip install --target``), ``hf-fault:NAME`` (a planted
fault, ``harness.engines.faults``).

Per engine and scenario, three checks:

* ``continuation-law`` (chi-square, level ``alpha``): the N-token continuations of
  ``generate`` against their exact law (``harness.engines.law``); trials from the
  power calculation for the profile's TV (or ``tv``), like every law check;
* ``verifier-q`` (exact): the q the verifier is given equals the law the assistant drew
  each candidate from, row by row;
* ``verifier-p`` (exact): the p the verifier is given equals the target's processed law
  at that prefix;
* ``drafter-law`` (exact): the assistant drew its candidates from the draft model's law
  under the request's settings (lossless output does not need it; acceptance rates and
  the static ensemble's law do).

The audits compare float64 softmaxes of float32 logits: the largest difference a correct
engine shows is ~1e-7 (cached vs full forward passes, rounding); ``AUDIT_TOLERANCE`` is
three orders of magnitude above it and far below any wiring bug's (>= 1e-2 measured).
Each engine runs in ``workers`` processes (``harness.engines.hf_worker``); the seeds of
every trial are the same for every engine, so releases are compared on the same draws.
"""

import concurrent.futures
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
import zlib

import numpy as np

from harness.checking import checks
from harness.checking.family import decide_verdicts
from harness.engines.faults import FAULTS
from harness.engines.law import continuation_law, prefix_laws
from harness.engines.scenario import EngineScenario
from harness.evidence.records import CheckRecord, Kind, Verdict
from harness.run.runner import RunResult
from harness.scenarios.profiles import Profile

AUDIT_TOLERANCE = 1e-4  # total variation per row
AUDIT_CALLS = 8  # generate calls audited per scenario


@dataclasses.dataclass(frozen=True)
class Engine:
    name: str
    site: str | None = None  # a folder holding the transformers release to verify
    fault: str | None = None


def parse_engine(name: str) -> Engine:
    """``hf``, ``hf@SITE`` or ``hf-fault:NAME``; ValueError naming what is wrong."""
    if name == "hf":
        return Engine(name)
    if name.startswith("hf@"):
        site = name[3:]
        if not os.path.isdir(os.path.join(site, "transformers")):
            raise ValueError(f"engine {name}: {site!r} holds no transformers/ (install one: pip install --target {site} transformers==X)")
        return Engine(name, site=os.path.abspath(site))
    if name.startswith("hf-fault:"):
        fault = name.partition(":")[2]
        if fault not in FAULTS:
            raise ValueError(f"engine {name}: unknown fault {fault!r} (known: {', '.join(FAULTS)})")
        return Engine(name, fault=fault)
    raise ValueError(f"engine {name!r}: expected hf, hf@SITE or hf-fault:NAME")


def trial_seeds(seed: int, scenario: EngineScenario, n: int) -> np.ndarray:
    return np.random.SeedSequence([seed, zlib.crc32(scenario.name.encode())]).generate_state(n)


def reproducer(engine: str, profile: Profile, seed: int, scenario: str, tv: float | None) -> str:
    cmd = ["python", "-m", "harness", "engine", "--engine", engine, "--profile", profile.name, "--seed", str(seed), "--scenario", scenario]
    return shlex.join(cmd + (["--tv", repr(tv)] if tv is not None else []))


def run_engines(
    engines, scenarios, profile: Profile, seed: int = 0, tv: float | None = None, workers: int = 0, timeout: float = 3600.0
) -> RunResult:
    start = time.monotonic()
    design = dataclasses.replace(profile, tv=tv) if tv is not None else profile
    workers = workers or os.cpu_count() or 1
    plans = {s.name: _plan(s, design) for s in scenarios}
    result = RunResult([], profile, seed, 0.0, 0.0, scenarios={s.name: s.to_dict() for s in scenarios})
    for engine in map(parse_engine, engines):
        t0 = time.monotonic()
        outputs, environment, error = _sample(engine, scenarios, plans, seed, workers, timeout)
        result.backend_seconds[engine.name] = time.monotonic() - t0
        result.backend_environments[engine.name] = environment
        for s in scenarios:
            repro = reproducer(engine.name, profile, seed, s.name, tv)
            result.trials[(engine.name, s.name)] = [plans[s.name].design_trials]
            if error:
                result.records.append(CheckRecord(engine.name, s.name, -1, "engine", Verdict.ERROR, Kind.ERROR, error, repro))
                continue
            result.records += _records(engine.name, s, plans[s.name], outputs[s.name], repro)
    result.family_alpha = decide_verdicts(result.records, profile.alpha)
    result.planned_checks = {s.name: len(CHECKS) for s in scenarios}
    result.seconds = time.monotonic() - start
    return result


def _plan(scenario: EngineScenario, profile: Profile) -> checks.Check:
    v, n = scenario.vocab, scenario.max_new_tokens

    def label(cell: int) -> str:
        return " ".join(str(t) for t in np.unravel_index(cell, (v,) * n))

    return checks.gof_check("continuation-law", 0, continuation_law(scenario), label, profile, lambda counts: counts)


def _sample(engine: Engine, scenarios, plans, seed, workers, timeout):
    """(outputs per scenario, the engine's environment, an error message or None)."""
    jobs = [[] for _ in range(workers)]
    for i, s in enumerate(scenarios):
        n = plans[s.name].design_trials
        seeds = trial_seeds(seed, s, n + AUDIT_CALLS)
        for w in range(workers):
            jobs[w].append({"scenario": s.to_dict(), "mode": "sample", "seeds": seeds[w:n:workers].tolist(), "fault": engine.fault})
        jobs[i % workers].append({"scenario": s.to_dict(), "mode": "audit", "seeds": seeds[n:].tolist(), "fault": engine.fault})
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        done = list(pool.map(lambda job: _work(engine, job, timeout), [j for j in jobs if j]))
    errors = [e for _, e in done if e]
    if errors:
        return None, None, errors[0]
    outputs = {s.name: {"sample": [], "audit": [], "error": None, "declined": None} for s in scenarios}
    environment = {}
    for results, _ in done:
        for task, r in results:
            out = outputs[task["scenario"]["name"]]
            out[task["mode"]] += r.get(task["mode"], [])
            out["error"] = out["error"] or r.get("error")
            out["declined"] = r["declined"]
            environment = {"transformers": r["transformers"], "where": r["where"]}
    return outputs, environment, None


def _work(engine: Engine, tasks: list, timeout: float):
    """Run one worker process over ``tasks``: ([(task, result)], error or None)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = [engine.site] if engine.site else []
    path += [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), OMP_NUM_THREADS="1")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "harness.engines.hf_worker"], input=json.dumps(tasks), env=env,
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return [], f"{engine.name}: the worker ran past {timeout:.0f} s"
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-6:])
        return [], f"{engine.name}: the worker exited {proc.returncode}:\n{tail}"
    return list(zip(tasks, json.loads(proc.stdout))), None


CHECKS = ("continuation-law", "verifier-q", "verifier-p", "drafter-law")


def _records(engine: str, scenario: EngineScenario, check: checks.Check, out: dict, repro: str) -> list[CheckRecord]:
    if out["error"] or out["declined"]:
        verdict, kind = (Verdict.ERROR, Kind.ERROR) if out["error"] else (Verdict.SKIPPED, Kind.SKIPPED)
        return [
            CheckRecord(engine, scenario.name, 0, name, verdict, kind, out["error"] or out["declined"], repro, "engine") for name in CHECKS
        ]
    v, n = scenario.vocab, scenario.max_new_tokens
    tokens = np.asarray(out["sample"], dtype=np.int64).reshape(-1, n)
    counts = np.bincount(np.ravel_multi_index(tokens.T, (v,) * n), minlength=v**n).astype(np.float64)
    o = check.evaluate(counts, np.random.default_rng(0))
    law = CheckRecord(
        engine, scenario.name, 0, check.name, None, o.kind, o.message, repro, "engine", o.statistic, o.df, o.p_value,
        o.alpha, None, o.trials, o.detectable_tv, o.tv_estimate, o.tv_ci, o.cells,
    )  # fmt: skip
    if o.kind is Kind.EXACT:
        law.verdict = Verdict.FAIL if o.deviated else Verdict.PASS
    calls = out["audit"]
    return [
        law,
        _audit_q(engine, scenario, calls, repro),
        _audit_p(engine, scenario, calls, repro),
        _audit_drafter(engine, scenario, calls, repro),
    ]


def _audit_record(engine, scenario, check, what, given, truth, calls, repro) -> CheckRecord:
    if not calls:
        reason = f"the verifier (_speculative_sampling) was never called in {AUDIT_CALLS} generate calls: nothing to audit"
        return CheckRecord(engine, scenario.name, 0, check, Verdict.SKIPPED, Kind.SKIPPED, reason, repro, "engine")
    rows = np.concatenate(given), np.concatenate(truth)
    tv = 0.5 * np.abs(rows[0] - rows[1]).sum(axis=1)
    worst = int(tv.argmax())
    cells = [(f"token {x}", float(rows[0][worst, x]), float(rows[1][worst, x])) for x in range(scenario.vocab)]
    bad = int((tv > AUDIT_TOLERANCE).sum())
    message = f"{what}: max TV {tv.max():.3g} over {tv.size} rows of {len(calls)} verifier calls (tolerance {AUDIT_TOLERANCE:g})"
    if bad:
        message = f"{bad} of {tv.size} rows differ; " + message
    return CheckRecord(
        engine, scenario.name, 0, check, Verdict.FAIL if bad else Verdict.PASS, Kind.EXACT, message, repro, "engine",
        statistic=float(tv.max()), trials=tv.size, tv_estimate=float(tv.max()), cells=cells,
    )  # fmt: skip


def _unmatched(engine, scenario, check, calls, repro) -> CheckRecord | None:
    """An error record where the assistant's draws could not be matched to its candidates."""
    unmatched = [c["how"] for c in calls if c["drafted"] is None]
    if not unmatched:
        return None
    message = f"the assistant's draws could not be matched to its candidates ({unmatched[0]})"
    return CheckRecord(engine, scenario.name, 0, check, Verdict.ERROR, Kind.ERROR, message, repro, "engine")


def _audit_q(engine, scenario, calls, repro) -> CheckRecord:
    if error := _unmatched(engine, scenario, "verifier-q", calls, repro):
        return error
    how = sorted({c["how"] for c in calls})
    what = f"the verifier's q vs the law the assistant drew its candidates from ({', '.join(how)})"
    given = [np.asarray(c["q"], dtype=np.float64).reshape(-1, scenario.vocab) for c in calls]
    truth = [np.asarray(c["drafted"], dtype=np.float64).reshape(-1, scenario.vocab) for c in calls]
    return _audit_record(engine, scenario, "verifier-q", what, given, truth, calls, repro)


def _audit_p(engine, scenario, calls, repro) -> CheckRecord:
    given, truth = [], []
    for c in calls:
        seq, k = c["sequence"], c["c"]
        prefixes = [tuple(seq[: len(seq) - k + i]) for i in range(k + 1)]
        given.append(np.asarray(c["p"], dtype=np.float64).reshape(-1, scenario.vocab))
        truth.append(prefix_laws(scenario.target, scenario.sampling, prefixes))
    what = "the verifier's p vs the target's processed law at each prefix"
    return _audit_record(engine, scenario, "verifier-p", what, given, truth, calls, repro)


def _audit_drafter(engine, scenario, calls, repro) -> CheckRecord:
    """The law the assistant drew each candidate from vs the draft model's law under the
    request's settings (the assistant generates with the request's generation config)."""
    if error := _unmatched(engine, scenario, "drafter-law", calls, repro):
        return error
    given, truth = [], []
    for c in calls:
        seq, k = c["sequence"], c["c"]
        given.append(np.asarray(c["drafted"], dtype=np.float64).reshape(-1, scenario.vocab))
        truth.append(prefix_laws(scenario.draft, scenario.sampling, [tuple(seq[: len(seq) - k + i]) for i in range(k)]))
    what = "the law the assistant drew its candidates from vs the draft model's law under the request's settings"
    return _audit_record(engine, scenario, "drafter-law", what, given, truth, calls, repro)

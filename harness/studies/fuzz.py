"""The fuzzing budget and replay (the strategies that draw scenarios are in
``harness.scenarios.strategies``).

Budget: a fuzz test has a family-wise false-alarm budget; every example (explicit ones
included) gets ``budget / examples`` of it, split by Holm over that example's statistical
checks (``example_profile``).

Replay: ``check_example`` saves a failing scenario under ``reports/fuzz-failures/`` and
names the one-line command that reruns it: ``python -m harness run`` at a named profile,
or ``python -m harness.studies.fuzz`` (this module) at a fuzz profile's coarser detectable TV.
"""

import argparse
import dataclasses
import os
import shlex
import sys

from harness.checking.checks import plan
from harness.evidence.files import write_json_atomic
from harness.run.runner import reproducer, run
from harness.scenarios.materialize import materialize, trials
from harness.scenarios.profiles import PROFILES, Profile, get_profile
from harness.scenarios.scenario import Scenario

BUDGET = 1e-6  # family-wise false-alarm budget of each statistical fuzz test


def example_profile(base: Profile, scenario: Scenario, budget: float, max_examples: int) -> Profile:
    """The profile one example runs with: its share of the budget, split over its checks."""
    planned = plan(scenario, materialize(scenario), base)
    statistical = sum(1 for c in planned if c.name != "structure")
    return dataclasses.replace(base, alpha=budget / max_examples / max(statistical, 1))


def fuzz_profile(tv: float) -> Profile:
    """``smoke``'s error rates at a coarser detectable TV, for samplers the CPU interpreter
    runs one request at a time (vLLM's). It keeps the name ``smoke`` (the runner resolves
    names); ``replay_command`` tells the two apart by the TV."""
    return dataclasses.replace(get_profile("smoke"), tv=tv)


def support_reason(backend, scenario: Scenario) -> str | None:
    """Why ``backend`` cannot run ``scenario`` (its ``supports`` on the first trial), or None."""
    if scenario.draft_mode == "engine" and not getattr(backend, "drafter", False):
        return "the backend does not draw its own drafts (protocol: drafter = True)"
    if not hasattr(backend, "supports"):
        return None
    return backend.supports(trials(scenario, materialize(scenario), 0, 1).batch)


def failure_path(test_name: str) -> str:
    """Where a failing (shrunk) scenario is saved; the last write is the minimal one."""
    return os.path.join("reports", "fuzz-failures", f"{test_name}.json")


def replay_command(backend: str, profile: Profile, path: str, device: str = "cpu") -> str:
    """The one-line command that reruns the saved scenario ``path`` at ``profile``."""
    named = PROFILES.get(profile.name)
    if named is not None and dataclasses.replace(named, alpha=profile.alpha) == profile:
        return reproducer(backend, profile, 0, path, device)
    cmd = ["python", "-m", "harness.studies.fuzz", "--backend", backend, "--tv", repr(profile.tv), "--alpha", repr(profile.alpha)]
    cmd += ["--scenario", path] + (["--device", device] if device != "cpu" else [])
    return shlex.join(cmd)


def check_example(backend: str, scenario: Scenario, base: Profile, examples: int, test_name: str, device: str = "cpu") -> str | None:
    """Every check of one example at its share of ``BUDGET`` (``examples`` in the family).

    Returns None when every check passed, else the failing checks and the command that
    reproduces them (the scenario is saved under ``failure_path(test_name)``). A run in
    which no check passed (the backend skipped the scenario) is a failure too: callers
    reject unsupported scenarios before running them."""
    profile = example_profile(base, scenario, BUDGET, examples)
    result = run([backend], [scenario], profile, seed=0, device=device)
    bad = [r for r in result.records if r.verdict in ("fail", "error")]
    if not bad and result.counts()["pass"]:
        return None
    path = failure_path(test_name)
    write_json_atomic(path, scenario.to_dict())
    shown = bad or result.records
    lines = [f"{r.check}[{r.template}]: {r.verdict}: {r.message}" for r in shown[:5]]
    command = replay_command(backend, profile, path, device)
    return f"{backend} failed on a fuzzed scenario ({path}):\n" + "\n".join(lines) + f"\nreproduce: {command}"


def main(argv=None) -> int:
    """``python -m harness.studies.fuzz``: rerun a saved fuzz failure at the fuzz profile it ran with."""
    parser = argparse.ArgumentParser(prog="python -m harness.studies.fuzz", description=main.__doc__)
    parser.add_argument("--backend", required=True, help="backend name, as for `python -m harness run`")
    parser.add_argument("--scenario", required=True, help="scenario JSON saved by the fuzz test")
    parser.add_argument("--tv", type=float, required=True, help="detectable TV of every check")
    parser.add_argument("--alpha", type=float, required=True, help="per-check false-alarm rate (the example's share of the budget)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args(argv)

    from harness.gpus import configure_triton

    configure_triton()  # before any backend module defines a @triton.jit kernel
    with open(args.scenario) as f:
        scenario = Scenario.from_json(f.read())
    profile = dataclasses.replace(fuzz_profile(args.tv), alpha=args.alpha)
    result = run([args.backend], [scenario], profile, seed=0, device=args.device)
    for r in result.records:
        print(f"{r.verdict:7} {r.check}[{r.template}]: {r.message}")
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(main())

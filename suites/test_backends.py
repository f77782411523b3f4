"""Verify backends named on the command line: ``pytest suites/ --backend pkg.mod:Sampler``.

Each named backend runs the whole catalog of ``--profile`` (default ci) through the same
runner as ``python -m harness run``; the test fails with the failing checks' reproducers.
"""

import subprocess
import sys
from pathlib import Path

from harness.run.runner import run
from harness.scenarios.catalog import catalog

ROOT = Path(__file__).resolve().parent.parent


def test_user_backend(user_backend, run_profile, run_seed):
    result = run([user_backend], catalog(run_profile, run_seed), run_profile, run_seed)
    bad = [
        f"{r.scenario}[{r.template}] {r.check}: {r.verdict}: {r.message}\n  {r.reproducer}"
        for r in result.records
        if r.verdict in ("fail", "error")
    ]
    assert not bad, "\n".join(bad)
    assert not result.unverified(), result.unverified()[0]  # every check skipped is no pass


def test_backend_option_reaches_the_runner():
    """The pytest option works end to end, including a failing fault."""
    base = [
        sys.executable,
        "-m",
        "pytest",
        "suites/test_backends.py::test_user_backend",
        "-q",
        "-p",
        "no:cacheprovider",
        "--profile",
        "smoke",
    ]
    ok = subprocess.run(base + ["--backend", "reference.sampler:ReferenceSampler"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert ok.returncode == 0, ok.stdout[-2000:]
    bad = subprocess.run(base + ["--backend", "fault:bonus-wrong-row"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert bad.returncode == 1 and "python -m harness run --backend fault:bonus-wrong-row" in bad.stdout


class DeclinesBlock:
    """A third-party backend that cannot run block verification, and says so."""

    name = "declines-block"

    def __init__(self):
        from reference.sampler import ReferenceSampler

        self._reference = ReferenceSampler()

    def supports(self, batch):
        from reference.methods import Method

        return "no block verification" if (batch.methods == Method.BLOCK).any() else None

    def sample(self, batch):
        return self._reference.sample(batch)


def test_unsupported_scenarios_are_skipped_not_passed():
    from harness.scenarios.profiles import get_profile

    profile = get_profile("smoke")
    scenarios = [s for s in catalog(profile) if s.name in ("block-fixed", "standard-sampled")]
    result = run(["suites.test_backends:DeclinesBlock"], scenarios, profile)
    verdicts = {(r.scenario, r.verdict) for r in result.records}
    assert verdicts == {("block-fixed", "skipped"), ("standard-sampled", "pass")}
    assert all("no block verification" in r.message for r in result.records if r.verdict == "skipped")

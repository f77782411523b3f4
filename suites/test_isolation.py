"""Backend isolation: a crash, a hang or an import failure is that backend's verdict, the
run goes on, and two vLLM versions can be verified in one run."""

import os
import time

import pytest

from harness.catalog import catalog
from harness.profiles import get_profile
from harness.runner import run

PROFILE = get_profile("smoke")
SCENARIOS = [s for s in catalog(PROFILE) if s.name in ("greedy-ties", "standard-near-target", "block-fixed")]
MARK = "standard-near-target"  # the scenario the misbehaving backends fail on (templates with 1, 3 and 4 drafts)


class _OnMark:
    def __init__(self):
        from reference.sampler import ReferenceSampler

        self._reference = ReferenceSampler()

    def sample(self, batch):
        if batch.num_drafts[:3].tolist() == [1, 3, 4]:  # standard-near-target's templates
            self.misbehave()
        return self._reference.sample(batch)


class Crashes(_OnMark):
    name = "crashes"

    def misbehave(self):
        os._exit(3)  # what a CUDA fault or a segfault looks like from outside


class Hangs(_OnMark):
    name = "hangs"

    def misbehave(self):
        time.sleep(3600)


def verdicts(result, backend):
    return {r.scenario: r.verdict for r in result.records if r.backend == backend}


def test_a_crash_is_the_backends_verdict_and_the_run_goes_on():
    name = "suites.test_isolation:Crashes"
    result = run([name, "reference"], SCENARIOS, PROFILE, isolate=True)
    assert verdicts(result, name) == {"greedy-ties": "pass", MARK: "error", "block-fixed": "pass"}
    crash = next(r for r in result.records if r.backend == name and r.verdict == "error")
    assert "exit code 3" in crash.message
    assert set(verdicts(result, "reference").values()) == {"pass"}


def test_a_hang_is_killed_after_the_timeout():
    name = "suites.test_isolation:Hangs"
    t0 = time.perf_counter()
    result = run([name], SCENARIOS, PROFILE, isolate=True, timeout=20)
    assert time.perf_counter() - t0 < 150
    assert verdicts(result, name) == {"greedy-ties": "pass", MARK: "error", "block-fixed": "pass"}
    assert "timed out" in next(r.message for r in result.records if r.verdict == "error")


def test_an_import_failure_is_a_load_verdict():
    result = run(["no_such_package.mod:Sampler", "reference"], SCENARIOS[:1], PROFILE, isolate=True)
    load = [r for r in result.records if r.check == "load"]
    assert len(load) == 1 and "cannot import" in load[0].message
    assert verdicts(result, "reference") == {"greedy-ties": "pass"}


def test_two_vllm_versions_in_one_run(tmp_path):
    """The installed release and a python-only tree of it, each in its own worker."""
    from harness.backends import vllm_mrv2
    from suites.test_workflows import python_only_tree

    ok, why = vllm_mrv2.availability()
    if not ok:
        pytest.skip(f"vLLM not usable here: {why}")
    tree = python_only_tree(tmp_path / "tree")
    names = ["vllm-mrv2", f"vllm-mrv2@{tree}"]
    result = run(names, SCENARIOS[:1], PROFILE, isolate=True)
    for name in names:
        assert verdicts(result, name) == {"greedy-ties": "pass"}, [(r.check, r.message) for r in result.records if r.backend == name]

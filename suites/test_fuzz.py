"""Property-based fuzzing: scenarios drawn by Hypothesis, where engines' own tests are blind.

Each fuzz test has a family-wise false-alarm budget ``BUDGET``; every example gets
``BUDGET / max_examples`` of it (``harness.fuzz.example_profile``), so the family
includes every example. A failure shrinks to a minimal scenario, saved as JSON under
``reports/fuzz-failures/`` with the one-line command that reproduces it.
"""

import dataclasses
import json
import os
import shlex
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from harness.backends import load_backend
from harness.fuzz import BOUNDARY_VOCABS, GPU_VOCABS, example_profile, failure_path, scenarios
from harness.profiles import get_profile
from harness.records import write_json_atomic
from harness.runner import run
from harness.scenarios import RequestSpec, Scenario, materialize, trials
from harness.tally import TemplateTally, add_outputs

BUDGET = 1e-6  # family-wise false-alarm budget of each statistical fuzz test
BASE = get_profile("smoke")  # detects TV >= 0.1 per check at the example's share of BUDGET
R = RequestSpec


def verify(backend: str, scenario: Scenario, test_name: str, device: str = "cpu") -> None:
    """Run every check; on failure save the scenario and name the command that reproduces it."""
    profile = example_profile(BASE, scenario, BUDGET, settings().max_examples)
    result = run([backend], [scenario], profile, seed=0, device=device)
    bad = [r for r in result.records if r.verdict in ("fail", "error")]
    if bad:
        path = failure_path(test_name)
        write_json_atomic(path, scenario.to_dict())
        command = bad[0].reproducer.replace("--scenario fuzz", f"--scenario {path}")
        lines = [f"{r.check}[{r.template}]: {r.message}" for r in bad[:5]]
        pytest.fail(f"{backend} failed on a fuzzed scenario ({path}):\n" + "\n".join(lines) + f"\nreproduce: {command}", pytrace=False)


# Known regressions, pinned (each named after the bug it guards against).
GHSA_VOCAB_BOUNDARY = Scenario("fuzz", "standard", 1025, (R(2, 1.0, "topk", "disjoint"),), seed=8)  # GHSA-8wr5-jm2h-8r4f
ZERO_TARGET_DRAFT = Scenario("fuzz", "standard", 8, (R(2, 1.0, "topk", "disjoint"), R(1, 1.0, "topk", "disjoint")), seed=3)
PLACEHOLDER_FIRST = Scenario("fuzz", "block", 6, (R(3, 1.0, placeholder_at=0),), seed=1)  # vLLM #46533 / #50939
NAN_ROW = Scenario(
    "fuzz", "standard", 20, (R(2, 1.0, nan_rows=(0,)), R(1, 0, masked_rows=(1,), method="greedy")), seed=2
)  # #21876 / #53029
# Found by this fuzzer: block verification's running ratio 0 * inf (a draft of target
# probability 0, then one of draft probability 0) gave NaN; it must stay 0.
BLOCK_ZERO_TIMES_INF = Scenario("fuzz", "block", 2, (R(3, 1e-4, "peaked", "peaked", draft_ids=(1, 0, 0)),), seed=0)
MIXED = Scenario(
    "fuzz",
    "standard",
    5,
    (R(2, 0, method="greedy"), R(3, 1e-4), R(2, 1.0, method="synthetic")),
    synthetic={"rates": [0.9, 0.5, 0.2]},
    slots="permuted",
    dtype="bfloat16",
    seed=5,
)


@given(scenarios())
@example(GHSA_VOCAB_BOUNDARY)
@example(ZERO_TARGET_DRAFT)
@example(PLACEHOLDER_FIRST)
@example(NAN_ROW)
@example(MIXED)
@example(BLOCK_ZERO_TIMES_INF)
def test_reference_matches_its_laws(scenario):
    verify("reference", scenario, "test_reference_matches_its_laws")


@pytest.mark.slow
@given(scenarios(vocabs=BOUNDARY_VOCABS, methods=("greedy", "standard", "block"), max_drafts=2, max_requests=2))
@settings(max_examples=4)
def test_reference_at_tile_boundaries(scenario):
    verify("reference", scenario, "test_reference_at_tile_boundaries")


def sample_once(backend, scenario, count=16):
    templates = materialize(scenario)
    tr = trials(scenario, templates, 0, count)
    tokens, emitted = (np.asarray(x.cpu() if hasattr(x, "cpu") else x) for x in backend.sample(tr.batch.validate()))
    return templates, tr, tokens, emitted


@given(scenarios(), st.integers(1, 6))
def test_same_seed_same_output_whatever_the_batch_mates(scenario, stride):
    """A request's output depends on its own seed and positions, not on its batch mates."""
    from suites.test_reference import _subset

    backend = load_backend("reference")
    _, tr, tokens, emitted = sample_once(backend, scenario)
    keep = np.arange(tr.batch.num_requests)[::stride]
    sub_tokens, sub_emitted = backend.sample(_subset(tr.batch, keep).validate())
    np.testing.assert_array_equal(sub_emitted, emitted[keep])
    for r, n in enumerate(sub_emitted):
        np.testing.assert_array_equal(sub_tokens[r, :n], tokens[keep[r], :n])


@given(scenarios())
def test_nothing_past_the_emitted_count_is_read(scenario):
    """Slots past ``num_emitted`` are garbage in some engines (vLLM MRV2): the tally ignores them."""
    backend = load_backend("reference")
    templates, tr, tokens, emitted = sample_once(backend, scenario)
    rng = np.random.default_rng(scenario.seed)
    garbage = tokens.copy()
    slot = np.arange(tokens.shape[1])[None, :]
    past = slot >= emitted[:, None]
    garbage[past] = rng.integers(-(2**40), 2**40, size=int(past.sum()))
    clean = [TemplateTally(t.effective_drafts, scenario.vocab_size) for t in templates]
    dirty = [TemplateTally(t.effective_drafts, scenario.vocab_size) for t in templates]
    add_outputs(clean, tokens, emitted, tr.drafts, 0)
    add_outputs(dirty, garbage, emitted, tr.drafts, 0)
    for a, b in zip(clean, dirty):
        assert a.violations == b.violations == 0
        np.testing.assert_array_equal(a.outcome, b.outcome)
        np.testing.assert_array_equal(a.steps, b.steps)


def test_draft_with_zero_draft_probability_is_pinned():
    """A fixed draft the draft distribution gives probability 0 (top-k on the draft side)."""
    probe = Scenario("fuzz", "standard", 8, (R(1, 1.0, "peaked", "topk"),), seed=4)
    q = materialize(probe)[0].proposal_probs()[0]
    zero = int(np.flatnonzero(q == 0)[0])
    verify("reference", dataclasses.replace(probe, requests=(R(1, 1.0, "peaked", "topk", draft_ids=(zero,)),)), "zero-draft-prob")


DEMO = Scenario("fuzz", "standard", 6, (R(2, 1.0, "peaked", "flat"),), seed=1)


def test_a_failure_is_saved_with_its_reproducer(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        pytest.fail.Exception,
        match=r"reproduce: python -m harness run --backend fault:residual-is-target .*--scenario reports/fuzz-failures/demo.json",
    ):
        verify("fault:residual-is-target", DEMO, "demo")
    saved = json.loads((tmp_path / "reports" / "fuzz-failures" / "demo.json").read_text())
    assert Scenario.from_dict(saved) == DEMO
    with pytest.raises(pytest.fail.Exception) as failure:
        verify("fault:residual-is-target", DEMO, "demo")
    command = shlex.split(str(failure.value).split("reproduce: ", 1)[1])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root}
    proc = subprocess.run(
        [sys.executable, *command[1:], "--out", "again", "--no-progress"], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 1, proc.stderr


@pytest.mark.gpu
@given(scenarios(vocabs=GPU_VOCABS, methods=("greedy", "standard", "block", "synthetic"), max_drafts=8, max_requests=4))
@settings(max_examples=int(os.environ.get("GPU_FUZZ_EXAMPLES", "10")))
def test_gpu_backends_at_scale(scenario):
    from harness.device import gpu_skip_reason

    if gpu_skip_reason():
        pytest.skip(gpu_skip_reason())
    for backend in ("triton", "vllm-mrv2", "vllm-v1"):
        verify(backend, scenario, f"gpu-{backend}", device="cuda")


SEARCH = 300  # examples find() may draw; it stops at the first failing one


@pytest.mark.parametrize("fault", ["bonus-wrong-row", "reuse-uniform", "accept-placeholder", "ignore-draft-probs"])
def test_the_fuzzer_finds_planted_faults(fault):
    """Negative control: the strategy reaches scenarios that expose real bug classes, and
    shrinking leaves a small one."""
    from hypothesis import find

    def fails(scenario):
        profile = example_profile(BASE, scenario, BUDGET, SEARCH)
        return run([f"fault:{fault}"], [scenario], profile).failed

    found = find(scenarios(), fails, settings=settings(max_examples=SEARCH, derandomize=True, database=None, deadline=None))
    assert len(found.requests) <= 2 and max(r.num_drafts for r in found.requests) <= 3

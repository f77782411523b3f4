"""Property-based fuzzing of the reference and the harness: scenarios drawn by Hypothesis,
where engines' own tests are blind. The other backends are fuzzed against the reference
in ``test_fuzz_backends.py``.

Each statistical fuzz test has the family-wise false-alarm budget ``harness.studies.fuzz.BUDGET``;
every example, pinned ones included, gets its share (``harness.studies.fuzz.example_profile``).
A failure shrinks to a minimal scenario, saved as JSON under ``reports/fuzz-failures/``
with the one-line command that reproduces it.
"""

import dataclasses
import json
import os
import shlex
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.backends import load_backend
from harness.run.runner import run
from harness.sampling.sample import per_trial_drafts
from harness.sampling.tally import TemplateTally, add_outputs
from harness.scenarios.materialize import materialize, trials
from harness.scenarios.profiles import get_profile
from harness.scenarios.scenario import RequestSpec, Scenario
from harness.scenarios.strategies import (
    BLOCK_ZERO_TIMES_INF,
    BOUNDARY_VOCABS,
    GHSA_8192_BLOCK,
    GHSA_VOCAB_BOUNDARY,
    MIXED,
    NAN_ROW,
    PLACEHOLDER_FIRST,
    ZERO_TARGET_DRAFT,
    draft_probability_vanishes,
    pin,
    placeholder_with_draft_probabilities,
    scenarios,
    undefined_ratio,
    without_mates,
)
from harness.studies.fuzz import BUDGET, check_example, example_profile, fuzz_profile

BASE = get_profile("smoke")  # detects TV >= 0.1 per check at the example's share of BUDGET
EXAMPLES = settings.default.max_examples  # drawn examples per test: the loaded profile's (ci: 25)
R = RequestSpec


def verify(backend: str, scenario: Scenario, test_name: str, examples: int) -> None:
    """Run every check at the example's share of the budget (``examples`` in the family)."""
    message = check_example(backend, scenario, BASE, examples, test_name)
    if message:
        pytest.fail(message, pytrace=False)


# Known regressions (harness.studies.fuzz), pinned.
PINNED = (GHSA_VOCAB_BOUNDARY, GHSA_8192_BLOCK, ZERO_TARGET_DRAFT, PLACEHOLDER_FIRST, NAN_ROW, MIXED, BLOCK_ZERO_TIMES_INF)


@given(scenario=scenarios())
@pin(PINNED)
def test_reference_matches_its_laws(scenario):
    """Every check at ``smoke`` power: each detects TV >= 0.1 at its example's share of BUDGET."""
    verify("reference", scenario, "test_reference_matches_its_laws", EXAMPLES + len(PINNED))


BOUNDARY_EXAMPLES = 4


@pytest.mark.slow
@given(scenarios(vocabs=BOUNDARY_VOCABS, methods=("greedy", "standard", "block"), max_drafts=2, max_requests=2))
@settings(max_examples=BOUNDARY_EXAMPLES)
def test_reference_at_tile_boundaries(scenario):
    """Every check detects TV >= 0.1 at its example's share of BUDGET."""
    verify("reference", scenario, "test_reference_at_tile_boundaries", BOUNDARY_EXAMPLES)


def sample_once(backend, scenario, count=16):
    """(templates, trials, tokens, emitted, drafts [count, T, K]): the backend's own drafts
    when it drew them (``draft_mode`` "engine")."""
    templates = materialize(scenario)
    tr = trials(scenario, templates, 0, count)
    out = backend.sample(tr.batch.validate())
    tokens, emitted = (np.asarray(x.cpu() if hasattr(x, "cpu") else x) for x in out[:2])
    drafts = tr.drafts if len(out) == 2 else per_trial_drafts(np.asarray(out[2]), templates, count, scenario.max_drafts)
    return templates, tr, tokens, emitted, drafts


@given(scenarios(), st.integers(1, 6))
def test_same_seed_same_output_whatever_the_batch_mates(scenario, stride):
    """A request's output depends on its own seed and positions, not on its batch mates."""
    backend = load_backend("reference")
    _, tr, tokens, emitted, _ = sample_once(backend, scenario)
    keep = np.arange(tr.batch.num_requests)[::stride]
    sub_tokens, sub_emitted = backend.sample(without_mates(tr.batch, keep))[:2]
    np.testing.assert_array_equal(sub_emitted, emitted[keep])
    for r, n in enumerate(sub_emitted):
        np.testing.assert_array_equal(sub_tokens[r, :n], tokens[keep[r], :n])


@given(scenarios())
def test_nothing_past_the_emitted_count_is_read(scenario):
    """Slots past ``num_emitted`` are garbage in some engines (vLLM MRV2): the tally ignores them."""
    backend = load_backend("reference")
    templates, tr, tokens, emitted, drafts = sample_once(backend, scenario)
    drafted = scenario.draft_mode == "engine"
    rng = np.random.default_rng(scenario.seed)
    garbage = tokens.copy()
    slot = np.arange(tokens.shape[1])[None, :]
    past = slot >= emitted[:, None]
    garbage[past] = rng.integers(-(2**40), 2**40, size=int(past.sum()))
    clean = [TemplateTally(t.effective_drafts, scenario.vocab_size) for t in templates]
    dirty = [TemplateTally(t.effective_drafts, scenario.vocab_size) for t in templates]
    add_outputs(clean, tokens, emitted, drafts, 0, drafted)
    add_outputs(dirty, garbage, emitted, drafts, 0, drafted)
    for a, b in zip(clean, dirty):
        assert a.violations == b.violations == 0
        np.testing.assert_array_equal(a.outcome, b.outcome)
        np.testing.assert_array_equal(a.steps, b.steps)


def test_draft_with_zero_draft_probability_is_pinned():
    """A fixed draft the draft distribution gives probability 0 (top-k on the draft side)."""
    probe = Scenario("fuzz", "standard", 8, (R(1, 1.0, "peaked", "topk"),), seed=4)
    q = materialize(probe)[0].visible_draft_probs()[0]
    zero = int(np.flatnonzero(q == 0)[0])
    verify("reference", dataclasses.replace(probe, requests=(R(1, 1.0, "peaked", "topk", draft_ids=(zero,)),)), "zero-draft-prob", 1)


DEMO = Scenario("fuzz", "standard", 6, (R(2, 1.0, "peaked", "flat"),), seed=1)


def test_a_failure_is_saved_with_its_reproducer(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        pytest.fail.Exception,
        match=r"reproduce: python -m harness run --backend fault:residual-is-target .*--scenario reports/fuzz-failures/demo.json",
    ):
        verify("fault:residual-is-target", DEMO, "demo", 1)
    saved = json.loads((tmp_path / "reports" / "fuzz-failures" / "demo.json").read_text())
    assert Scenario.from_dict(saved) == DEMO
    with pytest.raises(pytest.fail.Exception) as failure:
        verify("fault:residual-is-target", DEMO, "demo", 1)
    command = shlex.split(str(failure.value).split("reproduce: ", 1)[1])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root}
    proc = subprocess.run(
        [sys.executable, *command[1:], "--out", "again", "--no-progress"], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 1, proc.stderr


def test_a_coarser_fuzz_profile_replays_through_harness_fuzz(tmp_path, monkeypatch):
    """A failure at a fuzz profile's TV (no CLI profile has it) replays with
    ``python -m harness.studies.fuzz`` at the same TV and alpha, and fails again."""
    monkeypatch.chdir(tmp_path)
    message = check_example("fault:residual-is-target", DEMO, fuzz_profile(0.3), 1, "demo-tv")
    command = shlex.split(message.split("reproduce: ", 1)[1])
    assert command[:3] == ["python", "-m", "harness.studies.fuzz"] and command[command.index("--tv") + 1] == "0.3", command
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [sys.executable, *command[1:]], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": root}, timeout=300
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "fail" in proc.stdout


SEARCH = 300  # examples find() may draw; it stops at the first failing one


@pytest.mark.parametrize("fault", ["bonus-wrong-row", "reuse-uniform", "accept-placeholder", "ignore-draft-probs", "logit-bias-skipped"])
def test_the_fuzzer_finds_planted_faults(fault):
    """Negative control: the strategy reaches scenarios that expose real bug classes, and
    shrinking leaves a small one."""
    from hypothesis import find

    def fails(scenario):
        profile = example_profile(BASE, scenario, BUDGET, SEARCH)
        return run([f"fault:{fault}"], [scenario], profile).failed

    found = find(scenarios(), fails, settings=settings(max_examples=SEARCH, derandomize=True, database=None, deadline=None))
    # Small: few target rows in all (a template the failure needs may keep a draft-less mate:
    # removing it changes the others' logits, which come from the seed and template index).
    assert sum(r.num_drafts + 1 for r in found.requests) <= 6 and max(r.num_drafts for r in found.requests) <= 3, found


# The example the GPU fuzzer found for vLLM V1 (docs/verification-results.md): draft id 0 is outside
# the top-k draft.
V1_TOPK_ZERO = {
    "draft_probs": True, "draft_vocab_size": None, "draft_mode": "fixed", "dtype": "float32", "method": "standard",
    "name": "fuzz", "positions": "random", "seed": 0, "slots": "identity", "synthetic": None, "tags": [],
    "vocab_size": 1023,
    "requests": [{
        "draft": "topk", "draft_ids": [0, 0], "masked_rows": [], "method": "standard", "nan_rows": [], "num_drafts": 2,
        "placeholder_at": None, "stationary": False, "target": "peaked", "temperature": 0.3,
    }],
}  # fmt: skip


def test_draft_probability_vanishes_only_where_the_target_keeps_mass():
    found = Scenario.from_dict(V1_TOPK_ZERO)
    assert draft_probability_vanishes(found) and not undefined_ratio(found)
    t = materialize(found)[0]
    assert t.visible_draft_probs()[0, 0] == 0 < t.target_probs()[0, 0]
    flat = Scenario.from_dict({**V1_TOPK_ZERO, "requests": [{**V1_TOPK_ZERO["requests"][0], "draft": "flat"}]})
    request = {**V1_TOPK_ZERO["requests"][0], "draft_ids": None}
    sampled = Scenario.from_dict({**V1_TOPK_ZERO, "draft_mode": "sampled", "requests": [request]})
    assert not draft_probability_vanishes(flat) and not draft_probability_vanishes(sampled)


# The example the GPU fuzzer found for vLLM V1 (docs/verification-results.md): a placeholder draft
# with draft probabilities (V1 emits from the residual of the placeholder's draft row, not the target).
V1_PLACEHOLDER = {
    "draft_probs": True, "draft_vocab_size": None, "draft_mode": "fixed", "dtype": "float32", "method": "standard",
    "name": "fuzz", "positions": "random", "seed": 0, "slots": "identity", "synthetic": None, "tags": [],
    "vocab_size": 1023,
    "requests": [
        {"draft": "peaked", "draft_ids": None, "masked_rows": [0], "method": "standard", "nan_rows": [], "num_drafts": 0,
         "placeholder_at": None, "stationary": False, "target": "peaked", "temperature": 0},
        {"draft": "peaked", "draft_ids": None, "masked_rows": [], "method": "standard", "nan_rows": [], "num_drafts": 1,
         "placeholder_at": 0, "stationary": False, "target": "peaked", "temperature": 1.0},
    ],
}  # fmt: skip


def test_placeholder_with_draft_probabilities_needs_both_at_a_sampling_standard_request():
    found = Scenario.from_dict(V1_PLACEHOLDER)
    assert placeholder_with_draft_probabilities(found) and not undefined_ratio(found)
    sampling = V1_PLACEHOLDER["requests"][1]
    variants = [
        {**V1_PLACEHOLDER, "draft_probs": False},  # drafts without probabilities: V1 emits from the target
        {**V1_PLACEHOLDER, "requests": [{**sampling, "placeholder_at": None}]},
        {**V1_PLACEHOLDER, "requests": [{**sampling, "temperature": 0}]},  # greedy: the argmax either way
        {**V1_PLACEHOLDER, "requests": [{**sampling, "method": "synthetic"}], "synthetic": {"rates": [0.5]}},
    ]
    assert not any(placeholder_with_draft_probabilities(Scenario.from_dict(v)) for v in variants)


def test_a_placeholder_among_explicit_draft_ids_is_a_placeholder_too():
    """The V1 placeholder disagreement reached through ``draft_ids`` (found by the V1 law
    fuzzer: V = 2, drafts (0, -1), draft probabilities, T = 0.3)."""
    spec = {"num_drafts": 2, "temperature": 0.3, "target": "peaked", "draft": "peaked", "draft_ids": [0, -1]}
    found = Scenario.from_dict({"name": "fuzz", "method": "standard", "vocab_size": 2, "draft_probs": True, "requests": [spec]})
    assert placeholder_with_draft_probabilities(found)
    assert not placeholder_with_draft_probabilities(Scenario.from_dict({**found.to_dict(), "draft_probs": False}))

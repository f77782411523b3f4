"""The Triton sampler's outputs against the reference and the laws (``harness/backends/triton/``),
on both paths (staged and fused) where the default would take one only.

On a CPU-only machine the kernels run under the Triton interpreter (``conftest.py`` sets
TRITON_INTERPRET=1 before Triton is imported). What is checked:

* greedy outputs bit-identical to the reference (ties, ragged counts with 0, placeholders,
  NaN and fully masked rows, vocabularies that are not a multiple of the tile, vocabulary
  splits, a narrower draft vocabulary, every method at temperature 0);
* every catalog scenario of the ``smoke`` profile through the suite's own runner, with the
  default tiles and with tiny tiles split over programs;
* seeded reproducibility and independence from batch mates.

The fused path against the staged one: ``test_triton_paths.py``; on CUDA: ``test_triton_gpu.py``.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the Triton backend needs torch")
triton = pytest.importorskip("triton", reason="the Triton backend needs triton")

from harness.backends.triton.backend import TritonBackend  # noqa: E402
from harness.checking.checks import Outcome  # noqa: E402
from harness.run.plans import planned_trials  # noqa: E402
from harness.run.runner import run  # noqa: E402
from harness.sampling.sample import sample_scenario  # noqa: E402
from harness.scenarios.catalog import catalog  # noqa: E402
from harness.scenarios.materialize import materialize, trials  # noqa: E402
from harness.scenarios.profiles import get_profile  # noqa: E402
from reference.distributions import greedy_tokens  # noqa: E402
from reference.methods import Method  # noqa: E402
from reference.sampler import ReferenceSampler  # noqa: E402
from suites.helpers import (  # noqa: E402
    BOTH_PATHS,
    TRITON_BACKEND,
    TRITON_FUSED,
    assert_same_outputs,
    build_batch,
    greedy_requests,
    mixed_requests,
    sample_triton,
)

# The interpreter computes Philox's wrapping uint32 products with NumPy, which warns.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.*")


def _true_greedy(batch):
    """Accept drafts while they equal the target's argmax, then emit the argmax."""
    top = greedy_tokens(batch.target_logits)
    tokens = np.full((batch.num_requests, batch.max_drafts + 1), -1, dtype=np.int64)
    emitted = np.zeros(batch.num_requests, dtype=np.int64)
    for r in range(batch.num_requests):
        start, end = batch.cu_num_drafts[r], batch.cu_num_drafts[r + 1]
        row0, n = start + r, 0
        while start + n < end and batch.draft_tokens[start + n] == top[row0 + n]:
            n += 1
        tokens[r, :n] = batch.draft_tokens[start : start + n]
        tokens[r, n] = top[row0 + n]
        emitted[r] = n + 1
    return tokens, emitted


# --- greedy: bit-identical to the reference --------------------------------------------------------
CHAIN = (Method.STANDARD, Method.STRICT, Method.SYNTHETIC)


@pytest.mark.parametrize(
    "vocab,tiles",
    [(1, {}), (2, {}), (1023, {}), (1025, {}), (1025, {"block_v": 256, "splits": 3}), (70001, {})],
    ids=["V1", "V2", "V1023", "V1025", "V1025-split", "V70001"],
)
@pytest.mark.parametrize("path", BOTH_PATHS)
def test_greedy_matches_reference(vocab, tiles, path):
    rng = np.random.default_rng(vocab)
    n = 24 if vocab > 10000 else 60
    batch = build_batch(greedy_requests(rng, vocab, n, CHAIN), vocab)
    assert_same_outputs(sample_triton(batch, path=path, **tiles), ReferenceSampler().sample(batch), batch)


@pytest.mark.parametrize("path", BOTH_PATHS)
@pytest.mark.parametrize("with_draft", [True, False], ids=["draft-logits", "point-mass"])
def test_greedy_without_or_narrow_draft_vocab(with_draft, path):
    rng = np.random.default_rng(7)
    vocab, draft_vocab = 1025, 700
    batch = build_batch(greedy_requests(rng, vocab, 60, CHAIN, draft_vocab), vocab, draft_vocab, with_draft)
    assert_same_outputs(sample_triton(batch, block_v=128, splits=2, path=path), ReferenceSampler().sample(batch), batch)


@pytest.mark.parametrize("path", BOTH_PATHS)
def test_greedy_block_verification(path):
    """Block verification at T = 0 is greedy, with or without draft logits."""
    rng = np.random.default_rng(11)
    for with_draft in (False, True):
        batch = build_batch(greedy_requests(rng, 1025, 60, (Method.BLOCK,)), 1025, with_draft=with_draft)
        got = sample_triton(batch, block_v=256, splits=3, path=path)
        assert_same_outputs(got, _true_greedy(batch), batch)
        assert_same_outputs(got, ReferenceSampler().sample(batch), batch)


@pytest.mark.parametrize("path", BOTH_PATHS)
def test_block_ratio_stays_zero(path):
    """rho = 0 then a draft with draft probability 0: 0 * inf is 0, so block verification at
    T = 0 stays greedy (the reference computed NaN here and accepted draft 0 until it adopted
    the same convention, ``reference.rules.block_step``)."""
    target = np.array([[0, 5, 0, 0], [0, 0, 5, 0], [0, 0, 0, 5], [5, 0, 0, 0]], np.float32)  # argmax 1, 2, 3, 0
    draft = np.array([[0, 5, 0, 0], [0, 0, 0, 5], [5, 0, 0, 0]], np.float32)  # argmax 1, 3, 0
    req = dict(target=target, draft=draft, drafts=np.array([0, 2, 3]), temperature=0.0, seed=7, position=0, method=Method.BLOCK)
    batch = build_batch([req], 4)
    tokens, emitted = sample_triton(batch, path=path)
    assert emitted.tolist() == [1] and tokens[0].tolist() == [1, -1, -1, -1]
    assert_same_outputs((tokens, emitted), ReferenceSampler().sample(batch), batch)


@pytest.mark.parametrize("path", BOTH_PATHS)
def test_greedy_catalog_scenarios(path):
    profile = get_profile("ci")
    for scenario in catalog(profile, seed=3):
        if scenario.method != "greedy":
            continue
        batch = trials(scenario, materialize(scenario), 0, 40).batch
        assert_same_outputs(sample_triton(batch, path=path), ReferenceSampler().sample(batch), batch)


# --- the output laws through the suite's runner ---------------------------------------------------
# The runner's CPU chunks are whole scenarios (thousands of requests): the default backend
# runs them on the staged path (the fused path takes its few small ones), TRITON_FUSED on the fused path.
@pytest.mark.parametrize("backend", [TRITON_BACKEND, TRITON_FUSED], ids=["default", "fused"])
def test_smoke_catalog_through_runner(backend):
    profile = get_profile("smoke")
    result = run([backend], catalog(profile, seed=0), profile, seed=0, device="cpu")
    bad = [f"{r.scenario}[{r.template}] {r.check}: {r.verdict} {r.message}" for r in result.records if r.verdict in ("fail", "error")]
    assert not bad, "\n".join(bad)
    assert result.counts()["pass"] > 100


@pytest.mark.parametrize("path", BOTH_PATHS)
def test_split_tiles_catalog_laws(path):
    """Tiny tiles split over several programs: the same laws (split merging, partial tiles)."""
    profile = get_profile("smoke")
    names = ("standard-near-target", "standard-small-draft-vocab", "standard-no-draft-probs", "standard-large-vocab",
             "strict-fixed", "block-fixed", "block-no-draft-probs", "synthetic-rates")  # fmt: skip
    backend = TritonBackend("cpu", block_v=2, splits=3, path=path)
    rng = np.random.default_rng(0)
    failures = []
    for scenario in (s for s in catalog(profile, seed=1) if s.name in names):
        templates, planned, count = planned_trials(scenario, profile)
        tallies = sample_scenario(backend, scenario, templates, count, profile)
        for check in planned:
            v: Outcome = check.evaluate(tallies[check.template], rng)
            # An exact check fails on any deviation; any p <= alpha is exactly when the runner's
            # Holm step-down rejects something.
            if v.deviated or (v.p_value is not None and v.p_value <= profile.alpha):
                failures.append(f"{scenario.name}[{check.template}] {check.name}: {v.message}")
    assert not failures, "\n".join(failures)


# --- reproducibility --------------------------------------------------------------------------------
@pytest.mark.parametrize("path", BOTH_PATHS)
def test_seeded_and_independent_of_batch_mates(path):
    rng = np.random.default_rng(5)
    vocab = 300
    reqs = mixed_requests(rng, vocab, 24)
    batch = build_batch(reqs, vocab)
    first = sample_triton(batch, path=path)
    again = sample_triton(batch, path=path)
    assert np.array_equal(first[0], again[0]) and np.array_equal(first[1], again[1])
    # Keep every other request, reversed, among new batch mates of other methods and counts.
    kept = list(range(0, 24, 2))[::-1]
    mates = mixed_requests(np.random.default_rng(6), vocab, 10)
    mixed = [reqs[i] for i in kept[:6]] + mates + [reqs[i] for i in kept[6:]]
    where = list(range(6)) + list(range(16, 22))
    tokens, emitted = sample_triton(build_batch(mixed, vocab), path=path)
    for j, i in zip(where, kept):
        width = len(reqs[i]["drafts"]) + 1
        assert emitted[j] == first[1][i], f"request {i}: emitted {emitted[j]} alone, {first[1][i]} with mates"
        assert tokens[j, :width].tolist() == first[0][i, :width].tolist(), f"request {i} changed with its batch mates"
    # Other seeds give other outputs (the noise is really keyed by the seed).
    reseeded = build_batch([{**q, "seed": q["seed"] + 1} for q in reqs], vocab)
    assert not np.array_equal(sample_triton(reseeded, path=path)[0], first[0])

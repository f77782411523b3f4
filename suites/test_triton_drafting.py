"""The Triton sampler's own drafter (``harness/backends/triton/drafting.py``, ``draft_sampling``).

What is checked:

* the drawn drafts follow ``q = softmax(row / T)``: exactly, against the reference's inverse
  CDF, with the caller's uniforms (tiles narrower than the row, one and several tiles), and by a
  chi-square test with the kernel's own Philox noise;
* greedy drafting (and T = 0) is the argmax, ties to the lowest id, across tile edges; a row
  with no finite logit drafts id 0;
* ``sample`` returns the drafts it verified (the accepted prefix is theirs), greedy drafts are
  verified as point masses, and the fused path gives the staged path's outputs with drafting;
* the drafts depend on (seed, position) and the request's own rows only: the same in another
  batch, among other mates, and other when the seed or the position changes;
* a batch without ``draft_sampling`` takes the old path (two outputs, the same tokens);
* the catalog's engine-* scenarios pass through the runner (smoke profile: the ci one takes
  3-4 minutes under the interpreter, ``python -m harness run --backend triton``).

On CUDA (``-m gpu``): the exact draw, greedy drafts and fused == staged on the device.
"""

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the Triton backend needs torch")
triton = pytest.importorskip("triton", reason="the Triton backend needs triton")
scipy_stats = pytest.importorskip("scipy.stats")

from harness.backends.triton import drafting  # noqa: E402
from harness.backends.triton.backend import TritonBackend  # noqa: E402
from harness.gpus import gpu_skip_reason  # noqa: E402
from harness.protocol import as_numpy_drafted_outputs, as_numpy_outputs  # noqa: E402
from harness.run.runner import run  # noqa: E402
from harness.scenarios.catalog import catalog  # noqa: E402
from harness.scenarios.profiles import get_profile  # noqa: E402
from harness.scenarios.strategies import without_mates  # noqa: E402
from reference.distributions import softmax_rows  # noqa: E402
from reference.methods import Method  # noqa: E402
from reference.rules import inverse_cdf  # noqa: E402
from suites.helpers import TRITON_ALPHA, TRITON_BACKEND, assert_same_outputs, build_batch  # noqa: E402

# The interpreter computes Philox's wrapping uint32 products with NumPy, which warns.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.*")
gpu = pytest.mark.skipif(gpu_skip_reason() is not None, reason=gpu_skip_reason() or "")

ENGINE_SCENARIOS = ("engine-drafted", "engine-drafted-offset", "engine-greedy-drafter", "engine-drafted-block", "engine-drafted-top-p")


def _engine_batch(rng, vocab, n, sampling="probabilistic", methods=(Method.STANDARD,), temps=(0.0, 0.7, 1.0), draft_vocab=None):
    """n requests of 0-4 drafts to be drawn by the backend (``draft_tokens`` -1)."""
    requests = []
    for i in range(n):
        d = int(rng.integers(0, 5))
        target = rng.normal(0.0, 1.5, (d + 1, vocab))
        draft = target[:d, : draft_vocab or vocab] + rng.normal(0.0, 0.7, (d, draft_vocab or vocab))
        requests.append(
            dict(
                target=target, drafts=np.full(d, -1), draft=draft, temperature=float(temps[i % len(temps)]),
                seed=int(rng.integers(1 << 62)), position=int(rng.integers(1 << 40)), method=methods[i % len(methods)],
                rates=rng.random(d),
            )
        )  # fmt: skip
    return dataclasses.replace(build_batch(requests, vocab, draft_vocab), draft_sampling=sampling).validate()


def _sample(batch, device="cpu", **options):
    out = TritonBackend(device, **options).sample(batch)
    return as_numpy_drafted_outputs(out, batch.num_requests, batch.max_drafts, len(batch.draft_tokens))


def _draw(logits, temps, sampling="probabilistic", uniforms=None, seeds=None, positions=None, device="cpu", block_v=None):
    """``draw_drafts`` of one-draft requests, row i of ``logits`` request i's (NumPy in, NumPy out)."""
    n = len(logits)
    seeds = np.arange(n) if seeds is None else seeds
    positions = np.arange(2 * n) if positions is None else positions  # one draft a request: 2 target rows each
    as_t = lambda x, dtype: torch.tensor(np.asarray(x), dtype=dtype, device=device)  # noqa: E731
    drafts = drafting.draw_drafts(
        as_t(logits, torch.float32), as_t(np.arange(n + 1), torch.int64), as_t(temps, torch.float64),
        as_t(seeds, torch.int64), as_t(positions, torch.int64), sampling, block_v=block_v,
        uniforms=None if uniforms is None else as_t(uniforms, torch.float64),
    )  # fmt: skip
    return drafts.cpu().numpy()


def _assert_exact_draw(device="cpu", block_v=None, vocab=20, n=3000, tol=1e-5):
    """With given uniforms the draft is the reference's inverse CDF of q, except where u lies
    within ``tol`` of a boundary of q's fp64 CDF (the kernel's weights are fp32)."""
    rng = np.random.default_rng(vocab)
    logits = rng.normal(0.0, 2.0, (n, vocab)).astype(np.float32)
    logits[rng.random((n, vocab)) < 0.2] = -np.inf
    logits[:, 0] = np.where(rng.random(n) < 0.5, logits[:, 0], 1.0)  # every row keeps a finite logit
    temps = rng.choice([0.05, 0.5, 1.0, 1.7], n)
    u = rng.random(n)
    got = _draw(logits, temps, uniforms=u, device=device, block_v=block_v)
    q = softmax_rows(logits.astype(np.float64), temps)
    want = inverse_cdf(q, u)
    cdf = np.cumsum(q, axis=1)
    near = (np.abs(cdf - u[:, None]) < tol).any(axis=1)
    bad = np.flatnonzero((got != want) & ~near)
    assert bad.size == 0, f"{bad.size} draws differ; first row {bad[0]}: got {got[bad[0]]}, want {want[bad[0]]}"
    assert near.mean() < 0.05
    assert (q[np.arange(n), got] > 0).all(), "a draft of probability 0"


# --- the law of the drafts ---------------------------------------------------------------------------
@pytest.mark.parametrize("block_v", [None, 8], ids=["one-tile", "8-wide-tiles"])
def test_draft_is_the_inverse_cdf_of_q(block_v):
    _assert_exact_draw(block_v=block_v)


def test_drafts_follow_q_with_their_own_noise():
    """Per step of 3-draft requests (each step its own row and T), a chi-square test of 30,000
    drafts against q at alpha = TRITON_ALPHA; every draft is in q's support."""
    rng = np.random.default_rng(5)
    vocab, k, n = 6, 3, 30000
    rows = rng.normal(0.0, 1.0, (k, vocab)).astype(np.float32)
    rows[2, 4] = -np.inf
    temps = np.array([0.8])
    cu = np.arange(n + 1) * k
    # Every request its own seed; positions as an engine's: t .. t + k for the k + 1 target rows.
    pos = rng.integers(1 << 40, size=n)[:, None] + np.arange(k + 1)
    t = dict(
        draft_logits=torch.tensor(np.tile(rows, (n, 1))), cu_num_drafts=torch.tensor(cu), temperature=torch.tensor(np.repeat(temps, n)),
        seeds=torch.tensor(rng.integers(1 << 62, size=n)), positions=torch.tensor(pos.reshape(-1)),
    )  # fmt: skip
    drafts = drafting.draw_drafts(*t.values(), "probabilistic").numpy().reshape(n, k)
    q = softmax_rows(rows.astype(np.float64), temps[0])
    for j in range(k):
        counts = np.bincount(drafts[:, j], minlength=vocab)
        assert counts[q[j] == 0].sum() == 0
        live = q[j] > 0
        p = scipy_stats.chisquare(counts[live], n * q[j][live]).pvalue
        assert p > TRITON_ALPHA, (j, counts, n * q[j])


def test_greedy_drafts_are_the_argmax_ties_to_the_lowest_id():
    rng = np.random.default_rng(2)
    vocab, n = 20, 400
    logits = rng.normal(0.0, 1.0, (n, vocab)).astype(np.float32).round(1)  # many ties
    for i in range(0, n, 4):
        tied = rng.choice(vocab, 3, replace=False)
        logits[i, tied] = logits[i].max() + 1.0  # a tie at the max, often across 8-wide tiles
    logits[7] = -np.inf  # no finite logit: id 0
    logits[9, :] = -np.inf
    logits[9, 17] = 0.0
    want = np.argmax(np.where(np.isneginf(logits), -np.inf, logits), axis=1)
    want[7] = 0
    temps = rng.choice([0.0, 0.5, 1.0], n)
    for block_v in (None, 8):
        assert np.array_equal(_draw(logits, temps, "greedy", block_v=block_v), want)
        # probabilistic at T = 0: the argmax too
        assert np.array_equal(_draw(logits, np.zeros(n), "probabilistic", block_v=block_v), want)


# --- drafting inside sample ------------------------------------------------------------------------
@pytest.mark.parametrize("sampling", drafting.SAMPLINGS)
def test_sample_returns_the_drafts_it_verified(sampling):
    """The accepted prefix of every request is its drafts; a greedy request at T = 0 accepts
    exactly the drafts that are its target rows' argmax (point drafts verified as point masses)."""
    rng = np.random.default_rng(3)
    methods = (Method.STANDARD, Method.STRICT, Method.BLOCK, Method.SYNTHETIC)
    batch = _engine_batch(rng, 10, 80, sampling, methods)
    tokens, emitted, drafts = _sample(batch)
    cu = batch.cu_num_drafts
    assert drafts.shape == (cu[-1],) and ((drafts >= 0) & (drafts < batch.vocab_size)).all()
    d_logits = batch.draft_logits.astype(np.float64)
    if sampling == "greedy":
        assert np.array_equal(drafts, np.argmax(d_logits, axis=1))
    accepted = 0
    for r in range(batch.num_requests):
        lo, hi = cu[r], cu[r + 1]
        assert 1 <= emitted[r] <= hi - lo + 1
        assert np.array_equal(tokens[r, : emitted[r] - 1], drafts[lo : lo + emitted[r] - 1]), r
        accepted += emitted[r] - 1
        if batch.temperature[r] == 0 and batch.methods[r] == Method.STANDARD:
            top = np.argmax(batch.target_logits[lo + r : hi + r + 1], axis=1)
            n_ok = int(np.argmin(np.append(drafts[lo:hi] == top[: hi - lo], False)))
            assert emitted[r] == n_ok + 1 and tokens[r, n_ok] == top[n_ok], r
    assert accepted > 20
    # Verifying the drawn drafts as given drafts gives the same outputs.
    given = dataclasses.replace(
        batch, draft_sampling=None, draft_tokens=drafts, draft_logits=None if sampling == "greedy" else batch.draft_logits
    )
    assert_same_outputs(
        as_numpy_outputs(TritonBackend("cpu").sample(given), batch.num_requests, batch.max_drafts), (tokens, emitted), batch
    )


@pytest.mark.parametrize("sampling", drafting.SAMPLINGS)
@pytest.mark.parametrize("tiles", [{}, {"block_v": 8, "splits": 2}], ids=["default", "8-wide-split2"])
def test_fused_equals_staged_with_drafting(sampling, tiles):
    rng = np.random.default_rng(4)
    methods = (Method.STANDARD, Method.STRICT, Method.BLOCK, Method.SYNTHETIC)
    batch = _engine_batch(rng, 21, 48, sampling, methods, draft_vocab=17)
    *fused, f_drafts = _sample(batch, path="fused", **tiles)
    *staged, s_drafts = _sample(batch, path="staged", **tiles)
    assert np.array_equal(f_drafts, s_drafts)
    assert_same_outputs(tuple(fused), tuple(staged), batch)


def test_drafts_are_keyed_by_seed_and_position_only():
    """The same request drafts the same ids alone, in another batch and after other mates; a
    new seed or new positions draw other drafts."""
    rng = np.random.default_rng(6)
    batch = _engine_batch(rng, 12, 40, temps=(0.9, 1.3))
    drafts = _sample(batch)[2]
    assert np.array_equal(drafts, _sample(batch)[2]), "not deterministic"
    cu = batch.cu_num_drafts
    counts = np.diff(cu)
    r = int(np.flatnonzero(counts >= 3)[0])
    order = np.r_[r, np.setdiff1d(np.arange(batch.num_requests), [r])[::-1]]  # r first, its mates reversed
    alone = without_mates(batch, [r])
    assert np.array_equal(_sample(alone)[2], drafts[cu[r] : cu[r + 1]])
    moved = without_mates(batch, order)
    assert np.array_equal(_sample(moved)[2][: counts[r]], drafts[cu[r] : cu[r + 1]])
    many = without_mates(batch, np.flatnonzero(counts > 0))
    reseeded = _sample(dataclasses.replace(many, seeds=many.seeds + 1))[2]
    shifted = _sample(dataclasses.replace(many, positions=many.positions + 1))[2]
    same = _sample(many)[2]
    assert (reseeded != same).mean() > 0.2 and (shifted != same).mean() > 0.2


def test_batch_without_draft_sampling_takes_the_old_path(monkeypatch):
    rng = np.random.default_rng(7)
    engine = _engine_batch(rng, 9, 20)
    drafts = _sample(engine)[2]
    plain = dataclasses.replace(engine, draft_sampling=None, draft_tokens=drafts)
    called = []
    monkeypatch.setattr(drafting, "draft", lambda *a, **k: called.append(1))
    out = TritonBackend("cpu").sample(plain)
    assert len(out) == 2 and not called
    assert TritonBackend.drafter is True


# --- the catalog's engine-* scenarios through the runner ----------------------------------------------
def test_engine_scenarios_through_runner():
    profile = get_profile("smoke")
    scenarios = [s for s in catalog(profile, seed=0) if s.name in ENGINE_SCENARIOS]
    assert sorted(s.name for s in scenarios) == sorted(ENGINE_SCENARIOS)
    result = run([TRITON_BACKEND], scenarios, profile, seed=0, device="cpu")
    bad = [f"{r.scenario}[{r.template}] {r.check}: {r.verdict} {r.message}" for r in result.records if r.verdict != "pass"]
    assert not bad, "\n".join(bad)
    assert {r.check.split("[")[0] for r in result.records} >= {"draft-law", "position-law", "outcome-law", "structure"}


# --- CUDA ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@gpu
def test_drafting_on_cuda():
    """The exact draw (CUDA tiles, V = 5000: three 2048-wide tiles, the last partly past V),
    greedy drafts, and fused == staged with drafting, on the device."""
    _assert_exact_draw(device="cuda", vocab=5000, n=500, tol=1e-6)
    _assert_exact_draw(device="cuda", vocab=37, n=2000)
    rng = np.random.default_rng(8)
    for sampling in drafting.SAMPLINGS:
        batch = _engine_batch(rng, 37, 64, sampling, (Method.STANDARD, Method.STRICT, Method.BLOCK))
        *fused, f_drafts = _sample(batch, "cuda", path="fused")
        *staged, s_drafts = _sample(batch, "cuda", path="staged")
        assert np.array_equal(f_drafts, s_drafts)
        assert_same_outputs(tuple(fused), tuple(staged), batch)
        if sampling == "greedy":
            assert np.array_equal(f_drafts, np.argmax(batch.draft_logits, axis=1))

"""Logit bias, top-k, top-p and min-p in the suite's Triton sampler (``harness/backends/triton/processing.py``).

The pre-pass adds each request's logit bias and sets every token the processing removes to -inf
in a copy of the target rows. What is checked:

* its kept set is ``reference.processing.processed_logits(..., "vllm")``'s, row for row: random
  rows and parameters (logit biases among them: -inf, removing and lifting ones), ties at the
  k-th value, exact top-p and min-p boundaries (dyadic rows), uniform rows, rows with -inf
  entries, NaN and fully masked rows, greedy requests; requests of several rows; a shared
  (stride-0) target; the batch's tensors never written; the kept logits are the raw ones, or
  with a bias vLLM's float32 sum ``l + b`` (greedy rows too: their argmax is the biased one);
* the device path carries the bias (``DeviceTrials``) as the host path does;
* the catalog's processing scenarios pass through the suite's runner (smoke), and
  ``standard-top-k-ties-sort`` (the sort path's tie rules) is declined;
* the fused path gives the staged path's outputs with parameters, and no emitted token of a
  sampled request lies outside its row's kept set;
* nothing runs when the batch has no sampling parameters.

On CUDA (``-m gpu``): the pre-pass on the device, float32 and bfloat16 rows (a bias makes them float32 sums).
"""

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the Triton backend needs torch")
triton = pytest.importorskip("triton", reason="the Triton backend needs triton")

from harness.backends.triton import processing  # noqa: E402
from harness.backends.triton.backend import TritonBackend  # noqa: E402
from harness.gpus import gpu_skip_reason  # noqa: E402
from harness.run.runner import run  # noqa: E402
from harness.scenarios.catalog import catalog  # noqa: E402
from harness.scenarios.profiles import get_profile  # noqa: E402
from reference.methods import Method  # noqa: E402
from reference.processing import SamplingParams, processed_logits  # noqa: E402
from suites.helpers import TRITON_BACKEND, assert_same_outputs, build_batch, mixed_requests, sample_triton  # noqa: E402

# The interpreter computes Philox's wrapping uint32 products with NumPy, which warns.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.*")
gpu = pytest.mark.skipif(gpu_skip_reason() is not None, reason=gpu_skip_reason() or "")

PROCESSING_SCENARIOS = (
    "standard-top-k", "standard-top-p", "standard-min-p", "standard-top-k-top-p", "standard-processing-removes-draft",
    "standard-processing-one-token", "standard-sampled-top-k", "block-top-p", "greedy-top-k", "standard-top-k-ties",
    "standard-top-k-ties-sort", "standard-logit-bias", "standard-logit-bias-removes", "greedy-logit-bias",
)  # fmt: skip


# --- the pre-pass against the reference --------------------------------------------------------------
def _params(t, k, p, m, bias=()) -> SamplingParams:
    """``VerifyBatch`` spelling (0, 1, 0 off; bias ids -1 padded) as the reference's."""
    pairs = tuple((int(i), float(b)) for i, b in zip(*bias) if i >= 0) if len(bias) else ()
    return SamplingParams(float(t), int(k) or None, None if p >= 1.0 else float(p), float(m) or None, pairs)


def _processed(logits, temps, ks, ps, ms, counts=None, device="cpu", dtype=None, bias=None, fault=0):
    """``processed_target`` of rows ``logits`` (NumPy, any float dtype; on the device in ``dtype``,
    default theirs) for requests of ``counts`` drafts (default: one row each), ``bias``: None or
    (ids [B, L], float32 biases [B, L]); as NumPy float64."""
    counts = np.zeros(len(temps), np.int64) if counts is None else np.asarray(counts)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(counts)]), device=device)
    target = torch.tensor(logits, device=device, dtype=dtype)
    before = target.clone()
    ids, values = (None, None) if bias is None else (torch.tensor(bias[0], device=device), torch.tensor(bias[1], device=device))
    out = processing.processed_target(
        target, cu, torch.tensor(temps, dtype=torch.float64, device=device), torch.tensor(ks, dtype=torch.int64, device=device),
        torch.tensor(ps, dtype=torch.float64, device=device), torch.tensor(ms, dtype=torch.float64, device=device), fault,
        ids, values,
    )  # fmt: skip
    assert torch.equal(target.isnan(), before.isnan()) and torch.equal(target.nan_to_num(), before.nan_to_num()), "input written"
    biased = bias is not None and (bias[0] >= 0).any() and fault != processing.LOGIT_BIAS_SKIPPED
    assert out.dtype == (torch.float32 if biased else target.dtype) and out.device == target.device
    return out.double().cpu().numpy()


def _assert_kept_sets(logits, temps, ks, ps, ms, counts=None, device="cpu", dtype=None, bias=None):
    """Every row's kept set (finite after the pre-pass) is the reference's, and kept logits are
    unchanged, or with a bias vLLM's float32 sum ``l + b``."""
    counts = np.zeros(len(temps), np.int64) if counts is None else np.asarray(counts)
    got = _processed(logits, temps, ks, ps, ms, counts, device, dtype, bias)
    row_req = np.repeat(np.arange(len(temps)), counts + 1)
    raw = np.asarray(logits, dtype=np.float64)
    for i, r in enumerate(row_req):
        req_bias = () if bias is None else (bias[0][r], bias[1][r])
        params = _params(temps[r], ks[r], ps[r], ms[r], req_bias)
        want = np.isfinite(processed_logits(raw[i], params, "vllm"))
        kept = np.isfinite(got[i])
        assert (kept == want).all(), (
            f"row {i} (T={temps[r]} k={ks[r]} p={ps[r]} min_p={ms[r]} bias={params.logit_bias}): kept {np.flatnonzero(kept).tolist()}, "
            f"reference {np.flatnonzero(want).tolist()}; logits {raw[i].tolist()}"
        )
        summed = raw[i].copy()
        for token, b in params.logit_bias:
            summed[token] = float(np.float32(np.float32(raw[i, token]) + np.float32(b)))  # vLLM: float32 logits += bias
        assert np.array_equal(got[i][kept], summed[kept]), f"row {i}: kept logits are not the (biased) raw ones"


def _random_case(rng, vocab, n):
    """n rows with random parameters: some off, some past the vocabulary; -inf entries, NaN
    and fully masked rows, ties."""
    x = (rng.standard_normal((n, vocab)) * rng.choice([0.5, 2.0, 8.0])).astype(np.float32)
    for row in x:
        kind = rng.random()
        if kind < 0.2:
            row[rng.random(vocab) < 0.4] = -np.inf
        elif kind < 0.3:
            row[:] = np.round(row)  # many ties, at the k-th value among them
        elif kind < 0.33:
            row[rng.integers(vocab)] = np.nan
        elif kind < 0.36:
            row[:] = -np.inf
    temps = rng.choice([0.0, 0.3, 1.0, 1.7], n)
    ks = np.where(rng.random(n) < 0.3, 0, rng.integers(1, vocab + 3, n))
    ps = np.where(rng.random(n) < 0.3, 1.0, rng.uniform(0.05, 1.0, n))
    ms = np.where(rng.random(n) < 0.5, 0.0, rng.choice([1e-5, 0.01, 0.1, 0.5, 1.0], n))
    return x, temps, ks, ps, ms


def _random_bias(rng, vocab, n, width=3):
    """Per-request biases as the protocol spells them: ``width`` slots, -1 padded, unique ids;
    values that remove (-inf, -50), move and lift (+4, and random ones) tokens."""
    ids = np.full((n, width), -1, np.int64)
    values = np.zeros((n, width), np.float32)
    for r in range(n):
        m = int(rng.integers(0, min(width, vocab) + 1))
        ids[r, :m] = rng.choice(vocab, size=m, replace=False)
        values[r, :m] = [rng.choice([-np.inf, -50.0, -2.5, 1.5, 4.0, float(rng.normal(0, 3))]) for _ in range(m)]
    return ids, values


@pytest.mark.parametrize("vocab", [1, 2, 7, 50, 1000])
def test_kept_set_on_random_rows(vocab):
    rng = np.random.default_rng(vocab)
    _assert_kept_sets(*_random_case(rng, vocab, 150 if vocab < 1000 else 40))


@pytest.mark.parametrize("vocab", [1, 2, 7, 50, 1000])
def test_kept_set_on_random_rows_with_logit_bias(vocab):
    """The bias before the temperature and the removals, as the reference: random rows and
    parameters, greedy requests included (the bias only), in requests of several rows."""
    rng = np.random.default_rng(100 + vocab)
    n = 120 if vocab < 1000 else 30
    x, temps, ks, ps, ms = _random_case(rng, vocab, n)
    _assert_kept_sets(x, temps, ks, ps, ms, bias=_random_bias(rng, vocab, n))
    counts = rng.integers(0, 4, 20)
    rows = (rng.standard_normal((int(counts.sum()) + 20, vocab)) * 2).astype(np.float32)
    _assert_kept_sets(rows, temps[:20], ks[:20], ps[:20], ms[:20], counts, bias=_random_bias(rng, vocab, 20))


def test_logit_bias_comes_before_the_removals_and_reaches_greedy_rows():
    """A +3 bias lifts token 4 into a top-2 (bias, then top-k), a -inf one removes the top
    token, greedy rows get the float32 sum (their argmax is the biased one); the planted fault
    ``logit-bias-skipped`` leaves the rows and their removals unbiased."""
    x = np.array([[2.0, 1.5, 0.0, -1.0, 0.1]], np.float32).repeat(3, axis=0)
    bias = (np.array([[4, -1], [0, 4], [4, -1]]), np.array([[3.0, 0.0], [-np.inf, 1.0], [3.0, 0.0]], np.float32))
    temps, ks, ps, ms = [1.0, 0.5, 0.0], [2, 0, 2], [1.0, 1.0, 1.0], [0.0, 0.2, 0.0]
    got = _processed(x, temps, ks, ps, ms, bias=bias)
    assert [np.flatnonzero(np.isfinite(r)).tolist() for r in got] == [[0, 4], [1, 4], [0, 1, 2, 3, 4]]
    assert got[2].argmax() == 4 and got[0, 4] == np.float32(3.1)
    _assert_kept_sets(x, temps, ks, ps, ms, bias=bias)
    skipped = _processed(x, temps, ks, ps, ms, bias=bias, fault=processing.LOGIT_BIAS_SKIPPED)
    assert [np.flatnonzero(np.isfinite(r)).tolist() for r in skipped] == [[0, 1], [0, 1], [0, 1, 2, 3, 4]]
    assert np.array_equal(skipped[2], x[2].astype(np.float64))


def test_shared_rows_with_logit_bias():
    """A stride-0 target stays a view when every request has the same bias (float32 rows of
    the sums), and gets rows of its own when the biases differ."""
    row = torch.tensor([[0.5, -1.0, 2.0, 0.25, 1.0, -3.0]])
    shared, cu = row.expand(6, 6), torch.tensor([0, 1, 2, 3])  # 3 requests of 2 rows
    t, k = torch.full((3,), 0.7, dtype=torch.float64), torch.full((3,), 2)
    same = (torch.tensor([[1, -1]] * 3), torch.tensor([[5.0, 0.0]] * 3))
    out = processing.processed_target(shared, cu, t, k, None, None, 0, *same)
    assert out.stride(0) == 0 and out.dtype == torch.float32
    assert np.flatnonzero(np.isfinite(out[0].numpy())).tolist() == [1, 2] and out[3, 1] == 4.0
    other = (torch.tensor([[1, -1], [1, -1], [5, 3]]), torch.tensor([[5.0, 0.0], [5.0, 0.0], [9.0, 9.0]]))
    mixed = processing.processed_target(shared, cu, t, k, None, None, 0, *other)
    assert mixed.stride(0) != 0 and np.flatnonzero(np.isfinite(mixed[4].numpy())).tolist() == [3, 5]
    assert shared.stride(0) == 0 and torch.equal(shared[5], row[0]), "the shared row was written"


def test_device_batches_carry_the_logit_bias():
    """``DeviceTrials`` (torch on the CPU) gives the host path's ``logit_bias_ids`` / ``logit_bias``
    rows, trial after trial, and the Triton sampler the same tokens from either batch."""
    from harness.sampling.device.trials import DeviceTrials
    from harness.scenarios.materialize import materialize, trials

    s = [s for s in catalog(get_profile("smoke"), seed=0) if s.name == "standard-logit-bias"][0]
    templates = materialize(s)
    built = DeviceTrials(s, templates, "cpu", kernels=False)
    built.prepare(12)
    for first, count in ((0, 7), (7, 5)):
        host = trials(s, templates, first, count).batch
        device, _ = built.chunk(first, count)
        for name in ("logit_bias_ids", "logit_bias"):
            assert np.array_equal(getattr(device, name).numpy(), getattr(host, name)), name
        assert host.logit_bias_ids.shape == (count * len(templates), 2) and (host.logit_bias_ids[0] == [0, -1]).all()
        assert_same_outputs(sample_triton(device, path="staged"), sample_triton(host, path="staged"), host)


def test_kept_set_in_requests_of_several_rows():
    """Every row of a request (drafts' and bonus) gets its request's parameters."""
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 5, 40)
    x, temps, ks, ps, ms = _random_case(rng, 30, 40)
    x = np.concatenate([x, (rng.standard_normal((int(counts.sum()), 30)) * 2).astype(np.float32)])
    _assert_kept_sets(x, temps, ks, ps, ms, counts)


def test_ties_at_the_kth_value():
    """Exactly k: the lowest ids among those tied at the k-th value; a row of <= k finite logits keeps them all."""
    x = np.array([[3, 2, 2, 0.5, 2, 1], [1, 1, 1, 1, 1, 1], [2, -np.inf, 2, 2, -np.inf, 0], [0, 5, 5, -np.inf, 5, 5]], np.float32)
    n = len(x)
    for k in range(1, 7):
        for p in (1.0, 0.8, 0.5):
            _assert_kept_sets(x, [1.0] * n, [k] * n, [p] * n, [0.0] * n)
    kept = np.isfinite(_processed(x, [1.0] * n, [2] * n, [1.0] * n, [0.0] * n))
    assert [np.flatnonzero(r).tolist() for r in kept] == [[0, 1], [0, 1], [0, 2], [1, 2]]


def _dyadic(weights):
    """float64 logits ``log(w / max(w))`` of powers of two ``weights``, whose exp is exactly
    ``w / max(w)`` in NumPy and torch alike (skipped where either platform's exp is not exact)."""
    w = np.asarray(weights, dtype=np.float64)
    x = np.log(w / w.max())
    if not (np.array_equal(np.exp(x), w / w.max()) and np.array_equal(torch.exp(torch.tensor(x)).numpy(), w / w.max())):
        pytest.skip("this platform's float64 exp does not give the exact dyadic weights the boundary cases need")
    return x[None, :]


def test_exact_top_p_and_min_p_boundaries():
    """A top set of mass exactly p keeps no more (the token after it goes); min-p keeps a token
    at exactly ``min_p * max``; the boundaries also after top-k renormalizes."""
    x = _dyadic([16, 8, 4, 1, 1, 1, 1])  # masses 1/2, 3/4, 7/8, 29/32, ...
    for p in (0.5, 0.75, 0.875, 29 / 32, 30 / 32, 31 / 32, 0.5 + 1e-6, 0.75 - 1e-6):
        _assert_kept_sets(x, [1.0], [0], [p], [0.0])
    kept = np.isfinite(_processed(x, [1.0], [0], [0.875], [0.0]))[0]
    assert np.flatnonzero(kept).tolist() == [0, 1, 2]
    for m in (0.5, 0.25, 1 / 16, 1 / 16 + 1e-7, 1.0):
        _assert_kept_sets(x, [1.0], [0], [1.0], [m])
    y = _dyadic([4, 2, 1, 1, 1, 1, 1])  # top-4 survivors: 4, 2, 1, 1 (ids 0-3, a tie at the k-th) of 8
    for p in (0.5, 0.75, 0.875, 0.9):
        _assert_kept_sets(y, [1.0], [4], [p], [0.0])
        _assert_kept_sets(y, [1.0], [4], [p], [0.1])  # min-p well inside: the full row's sum (12) is not dyadic
    kept = np.isfinite(_processed(y, [1.0], [4], [0.75], [0.0]))[0]
    assert np.flatnonzero(kept).tolist() == [0, 1]
    # Ties on the boundary: equal survivors of top-k in float32 (1/4 each), p = 1/2 keeps the two lowest ids.
    z = np.array([[1, 3, 3, 0, 3, 3, 2]], np.float32)
    kept = np.isfinite(_processed(z, [1.0], [4], [0.5], [0.0]))[0]
    assert np.flatnonzero(kept).tolist() == [1, 2]
    _assert_kept_sets(z, [1.0], [4], [0.5], [0.0])


def test_uniform_rows_and_greedy_requests():
    """A uniform row without an active top-k stays whole under top-p; with one, top-p cuts its
    survivors. Greedy requests keep every row as it is."""
    x = np.array([[2, 2, 2, 2, 2, 2, 2, 2], [-np.inf, 1, 1, -np.inf, 1, 1, -np.inf, 1], [0] * 8], np.float32)
    for k, p in ((0, 0.3), (8, 0.3), (5, 0.3), (4, 0.5), (3, 0.9), (0, 1.0)):
        _assert_kept_sets(x, [1.0] * 3, [k] * 3, [p] * 3, [0.0] * 3)
    assert np.isfinite(_processed(x, [1.0] * 3, [0] * 3, [0.3] * 3, [0.0] * 3)).sum(1).tolist() == [8, 5, 8]
    rng = np.random.default_rng(0)
    g = rng.standard_normal((4, 20)).astype(np.float32)
    out = _processed(g, [0.0] * 4, [1, 2, 0, 3], [0.5, 1.0, 0.1, 0.2], [0.5, 0.0, 1.0, 0.0])
    assert np.array_equal(out, g.astype(np.float64))


def test_nothing_active_returns_the_rows_themselves():
    target = torch.randn(6, 9)
    cu = torch.tensor([0, 2, 2, 3])  # rows 3, 1 and 2
    t = torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64)
    off = processing.processed_target(target, cu, t, torch.tensor([0, 9, 12]), torch.ones(3, dtype=torch.float64), None)
    assert off is target
    greedy = processing.processed_target(target, cu, torch.zeros(3, dtype=torch.float64), torch.tensor([1, 2, 3]), None, None)
    assert greedy is target


def test_shared_rows():
    """A stride-0 target stays a view when every request has the same T and parameters, and
    gets rows of its own (the same kept sets) when they differ."""
    rng = np.random.default_rng(1)
    row = torch.tensor((rng.standard_normal((1, 40)) * 2).astype(np.float32))
    shared = row.expand(12, 40)
    cu = torch.tensor([0, 2, 4, 6, 8])  # 4 requests, 3 rows each
    same = (torch.full((4,), 0.8, dtype=torch.float64), torch.full((4,), 5), torch.full((4,), 0.7, dtype=torch.float64), None)
    out = processing.processed_target(shared, cu, *same)
    assert out.stride(0) == 0 and out.shape == shared.shape
    dense = processing.processed_target(shared.contiguous(), cu, *same)
    want = np.isfinite(processed_logits(row.double().numpy()[0], _params(0.8, 5, 0.7, 0.0), "vllm"))
    assert torch.equal(torch.isfinite(out), torch.isfinite(dense)) and (torch.isfinite(out[0]).numpy() == want).all()
    ks = torch.tensor([5, 0, 1, 3])
    mixed = processing.processed_target(shared, cu, same[0], ks, same[2], None)
    assert mixed.stride(0) != 0
    for r, k in enumerate(ks.tolist()):
        want = np.isfinite(processed_logits(row.double().numpy()[0], _params(0.8, k, 0.7, 0.0), "vllm"))
        for i in range(3 * r, 3 * r + 3):
            assert (torch.isfinite(mixed[i]).numpy() == want).all(), f"row {i}"
    assert shared.stride(0) == 0 and torch.equal(shared[5], row[0]), "the shared row was written"


# --- supports, and no work without parameters ------------------------------------------------------------
def _with_params(batch, rng, k_max=None):
    b, vocab = batch.num_requests, batch.vocab_size
    ks = np.where(rng.random(b) < 0.3, 0, rng.integers(1, k_max or vocab, b))
    ps = np.where(rng.random(b) < 0.3, 1.0, rng.uniform(0.3, 0.95, b))
    ms = np.where(rng.random(b) < 0.5, 0.0, rng.choice([1e-5, 0.02, 0.2], b))
    return dataclasses.replace(batch, top_k=ks.astype(np.int64), top_p=ps, min_p=ms, processing="vllm").validate()


def test_supports_declines_the_sort_rules():
    batch = build_batch(mixed_requests(np.random.default_rng(0), 20, 3), 20)
    backend = TritonBackend("cpu")
    assert backend.supports(batch) is None
    assert backend.supports(_with_params(batch, np.random.default_rng(1))) is None
    sort = dataclasses.replace(batch, top_k=np.full(3, 2, np.int64), processing="vllm-sort")
    assert backend.supports(sort) == processing.SORT_REASON


def test_no_pre_pass_without_parameters(monkeypatch):
    """``has_sampling_params`` False: the pre-pass is not called and the outputs are unchanged."""
    batch = build_batch(mixed_requests(np.random.default_rng(4), 50, 6), 50)
    want = sample_triton(batch, path="fused")

    def fail(*args, **kwargs):
        raise AssertionError("the pre-pass ran on a batch without sampling parameters")

    monkeypatch.setattr(processing, "processed_target", fail)
    assert_same_outputs(sample_triton(batch, path="fused"), want, batch)


# --- the two paths, and what they emit -------------------------------------------------------------------
@pytest.mark.parametrize("vocab,tiles", [(60, {}), (300, {"block_v": 64, "splits": 3})], ids=["V60", "V300-split3"])
def test_fused_equals_staged_with_parameters(vocab, tiles):
    """The same processed rows go down both paths: the same outputs, token for token; a sampled
    request (standard, strict, block) emits no token its row's processing removed."""
    rng = np.random.default_rng(vocab)
    batch = _with_params(build_batch(mixed_requests(rng, vocab, 24), vocab), rng, k_max=8)
    fused = sample_triton(batch, path="fused", **tiles)
    assert_same_outputs(fused, sample_triton(batch, path="staged", **tiles), batch)
    tokens, emitted = fused
    kept = np.isfinite(
        _processed(batch.target_logits, batch.temperature, batch.top_k, batch.top_p, batch.min_p, np.diff(batch.cu_num_drafts))
    )
    checked = 0
    for r in range(batch.num_requests):
        if batch.temperature[r] == 0 or batch.methods[r] == Method.SYNTHETIC:
            continue
        first = batch.cu_num_drafts[r] + r
        for j in range(emitted[r]):
            assert kept[first + j, tokens[r, j]], f"request {r} emitted token {tokens[r, j]} at step {j}, removed by processing"
            checked += 1
    assert checked > 10
    plain = dataclasses.replace(batch, top_k=None, top_p=None, min_p=None, processing=None)
    assert not np.array_equal(sample_triton(plain, path="fused", **tiles)[0], tokens), "the parameters changed nothing"


# --- the catalog's processing scenarios through the runner ----------------------------------------------
def test_processing_scenarios_through_runner():
    profile = get_profile("smoke")
    scenarios = [s for s in catalog(profile, seed=0) if s.name in PROCESSING_SCENARIOS]
    assert sorted(s.name for s in scenarios) == sorted(PROCESSING_SCENARIOS)
    result = run([TRITON_BACKEND], scenarios, profile, seed=0, device="cpu")
    bad = [f"{r.scenario}[{r.template}] {r.check}: {r.verdict} {r.message}" for r in result.records if r.verdict in ("fail", "error")]
    assert not bad, "\n".join(bad)
    sort = [r for r in result.records if r.scenario == "standard-top-k-ties-sort"]
    assert sort and all(r.verdict == "skipped" and processing.SORT_REASON in r.message for r in sort)
    passed = {r.scenario for r in result.records if r.verdict == "pass"}
    assert passed == set(PROCESSING_SCENARIOS) - {"standard-top-k-ties-sort"}


# --- CUDA ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kept_set_on_cuda(dtype):
    """The pre-pass on the device, on rows stored in ``dtype`` (values exact in it): the
    reference's kept sets, in one request of several rows and one row a request."""
    rng = np.random.default_rng(11)
    x, temps, ks, ps, ms = _random_case(rng, 1000, 60)
    x = torch.tensor(x).to(getattr(torch, dtype)).float().numpy()
    _assert_kept_sets(x, temps, ks, ps, ms, device="cuda", dtype=getattr(torch, dtype))
    _assert_kept_sets(x, temps, ks, ps, ms, device="cuda", dtype=getattr(torch, dtype), bias=_random_bias(rng, 1000, 60))
    counts = np.diff(np.linspace(0, 50, 11).astype(np.int64))  # 10 requests of 5 drafts: 60 rows
    _assert_kept_sets(x, temps[:10], ks[:10], ps[:10], ms[:10], counts, device="cuda", dtype=getattr(torch, dtype))

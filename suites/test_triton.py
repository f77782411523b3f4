"""The suite's own Triton sampler (``harness/backends/triton/sampler.py``).

On a CPU-only machine the kernels run under the Triton interpreter (``conftest.py`` sets
TRITON_INTERPRET=1 before Triton is imported). What is checked:

* greedy outputs bit-identical to the reference (ties, ragged counts with 0, placeholders,
  NaN and fully masked rows, vocabularies that are not a multiple of the tile, vocabulary
  splits, a narrower draft vocabulary, every method at temperature 0);
* every catalog scenario of the ``smoke`` profile through the suite's own runner, with the
  default tiles and with tiny tiles split over programs;
* the far tail of the inverse-CDF draw: exact slices of (0, 1) for tokens 1e-12 below the
  head, and tail rates with calibrated binomial tests (1e-9 below the max on a GPU);
* seeded reproducibility and independence from batch mates;
* the fused small-batch path (``harness/backends/triton/fused.py``, taken by default up to
  ``FUSED_MAX_REQUESTS`` requests a call) and the staged path: each of the above on both
  paths where the default would take one only, the same outputs token for token on random
  mixed batches, and the dispatch rule (planted faults always staged).

GPU tests (``-m gpu``) run the ``gpu`` profile catalog and a V = 152064 batch on CUDA.
"""

import math
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the Triton backend needs torch")
triton = pytest.importorskip("triton", reason="the Triton backend needs triton")

import triton.language as tl  # noqa: E402
from triton.language.extra.cuda import globaltimer  # noqa: E402

from harness.backends.triton import fused as tf  # noqa: E402
from harness.backends.triton import sampler as ts  # noqa: E402
from harness.backends.triton.variants import TritonFaultBackend  # noqa: E402
from harness.checking import stats  # noqa: E402
from harness.checking.checks import Verdict  # noqa: E402
from harness.gpus import gpu_skip_reason  # noqa: E402
from harness.protocol import VerifyBatch, as_numpy_outputs  # noqa: E402
from harness.run.plans import planned_trials  # noqa: E402
from harness.run.runner import run  # noqa: E402
from harness.sampling.sample import sample_scenario  # noqa: E402
from harness.scenarios.catalog import catalog  # noqa: E402
from harness.scenarios.materialize import materialize, trials  # noqa: E402
from harness.scenarios.profiles import get_profile  # noqa: E402
from reference.distributions import greedy_tokens  # noqa: E402
from reference.methods import Method  # noqa: E402
from reference.sampler import ReferenceSampler  # noqa: E402

BACKEND = "harness.backends.triton.sampler:TritonBackend"
FUSED = "harness.backends.triton.fused:FusedTritonBackend"
PATHS = ("staged", "fused")  # both paths, where a test's batches would take one only by default (auto)
ALPHA = 1e-6  # false-alarm rate of each statistical test in this file
POWER = 0.99

# The interpreter computes Philox's wrapping uint32 products with NumPy, which warns.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.*")
gpu = pytest.mark.skipif(gpu_skip_reason() is not None, reason=gpu_skip_reason() or "")


def _sample(batch, device="cpu", **options):
    backend = ts.TritonBackend(device, **options)
    return as_numpy_outputs(backend.sample(batch), batch.num_requests, batch.max_drafts)


def _assert_same(got, want, batch):
    (tok, em), (rtok, rem) = got, want
    bad = np.flatnonzero((tok != rtok).any(axis=1) | (em != rem))
    if bad.size:
        r = int(bad[0])
        lo, hi = batch.cu_num_drafts[r], batch.cu_num_drafts[r + 1]
        pytest.fail(
            f"{bad.size} of {batch.num_requests} requests differ; first r={r} method={Method(batch.methods[r]).name} "
            f"T={batch.temperature[r]} drafts={batch.draft_tokens[lo:hi].tolist()}: got {tok[r].tolist()} / {em[r]}, "
            f"want {rtok[r].tolist()} / {rem[r]}"
        )


# --- batches built by hand -----------------------------------------------------------------------
def _batch(requests, vocab, draft_vocab=None, with_draft=True):
    """A VerifyBatch from per-request dicts: target [d+1, V], drafts [d], draft [d, Vd],
    temperature, seed, position, method, rates [d]."""
    k = max((len(q["drafts"]) for q in requests), default=0)
    dv = draft_vocab or vocab
    counts = np.array([len(q["drafts"]) for q in requests], dtype=np.int64)
    rates = np.zeros((len(requests), k))
    for i, q in enumerate(requests):
        rates[i, : counts[i]] = q.get("rates", np.zeros(counts[i]))
    positions = np.concatenate([q["position"] + np.arange(c + 1) for q, c in zip(requests, counts)])
    return VerifyBatch(
        target_logits=np.concatenate([q["target"] for q in requests]).astype(np.float32),
        draft_logits=np.concatenate([q["draft"] for q in requests]).reshape(-1, dv).astype(np.float32) if with_draft else None,
        draft_tokens=np.concatenate([q["drafts"] for q in requests]).astype(np.int64),
        cu_num_drafts=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        temperature=np.array([q["temperature"] for q in requests], dtype=np.float64),
        seeds=np.array([q["seed"] for q in requests], dtype=np.int64),
        positions=positions.astype(np.int64),
        methods=np.array([q["method"] for q in requests], dtype=np.int8),
        synthetic_rates=rates,
        max_drafts=k,
    ).validate()


def _greedy_requests(rng, vocab, n, methods, draft_vocab=None, max_drafts=5):
    """Temperature-0 requests with ties, NaN rows, fully and partly masked rows, placeholders,
    and drafts that are the target's argmax often enough to be accepted."""
    out = []
    for i in range(n):
        d = int(rng.integers(0, max_drafts + 1))
        target = rng.normal(0.0, 2.0, (d + 1, vocab)).astype(np.float32)
        for row in target:
            kind = rng.random()
            if kind < 0.3 and vocab > 1:  # ties with the max, lowest id must win
                row[rng.choice(vocab, size=min(3, vocab), replace=False)] = row.max() + 1.0
            elif kind < 0.4:
                row[rng.integers(vocab)] = np.nan
            elif kind < 0.45:
                row[:] = -np.inf
            elif kind < 0.6:
                row[rng.random(vocab) < 0.5] = -np.inf
        top = greedy_tokens(target)
        drafts = np.where(rng.random(d) < 0.75, top[:d], rng.integers(0, vocab, d))
        if d and rng.random() < 0.15:
            drafts[rng.integers(d)] = -1
        method = methods[i % len(methods)]
        out.append(
            dict(
                target=target, drafts=drafts, draft=rng.normal(0.0, 2.0, (d, draft_vocab or vocab)),
                temperature=0.0, seed=int(rng.integers(1 << 62)), position=int(rng.integers(1 << 40)),
                method=method, rates=rng.integers(0, 2, d).astype(np.float64),
            )
        )  # fmt: skip
    return out


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


# --- the noise --------------------------------------------------------------------------------------
@triton.jit
def _uniform_probe(seed_ptr, pos_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    seed = tl.load(seed_ptr + i, mask=mask, other=0)
    pos = tl.load(pos_ptr + i, mask=mask, other=0)
    tl.store(out_ptr + i, ts._uniform(seed, pos, 1), mask=mask)


@pytest.mark.parametrize("tiles", [{}, {"block_v": 2, "splits": 3}], ids=["one-split", "three-splits"])
def test_draw_resolves_the_far_tail(tiles):
    """Inverse CDF with a 52-bit uniform and fp64 sums: tokens 1e-12 and 1e-14 below the
    head own exactly their slices of (0, 1) (an fp32 draw cannot see below 2**-24)."""
    ratios = np.array([1.0, 1e-12, 1.0, 1e-14, 1.0])
    edges = np.cumsum(ratios) / ratios.sum()  # the head's value cancels: exact to ~1e-19
    slices = [(0.0, edges[0])] + list(zip(edges[:-1], edges[1:]))
    probes, want = [], []
    for token, (lo, hi) in enumerate(slices):
        width = hi - lo
        for u in (lo + 0.1 * width, lo + 0.5 * width, hi - 0.1 * width):
            probes.append(u)
            want.append(token)
    probes += [2.0**-53, 1 - 2.0**-53]
    want += [0, 4]
    logits = torch.from_numpy(np.log(ratios).astype(np.float32)).expand(len(probes), -1).contiguous()
    u = torch.tensor(probes, dtype=torch.float64)
    got = ts.sample_rows(logits, torch.ones(len(probes), dtype=torch.float64), uniforms=u, **tiles)
    assert got.tolist() == want


def test_uniforms_are_open_interval():
    n = 1 << 14
    seeds = torch.arange(n, dtype=torch.int64) * 7919
    pos = torch.arange(n, dtype=torch.int64) << 20
    out = torch.empty(n, dtype=torch.float64)
    _uniform_probe[(1,)](seeds, pos, out, n, BLOCK=n)
    u = out.numpy()
    assert u.min() > 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 6 * math.sqrt(1 / 12 / n)


# --- the masses: a program of target-row draws takes the short tile loop ---------------------------
@triton.jit
def _masses_probe(t_logits, d_logits, V, rho_ptr, m_ptr, logs2_ptr, out_w, out_t, BLOCK_V: tl.constexpr, NT: tl.constexpr):
    """``_split_tile_masses`` of two lanes over the whole row, each as ``rho`` says (-1 a
    target-row draw, -2 inactive, >= 0 a residual, which takes the general loop for both)."""
    r = tl.arange(0, 2)
    rho = tl.load(rho_ptr + r)[:, None]
    active = rho > -2
    resid = active & (rho >= 0)
    m = tl.load(m_ptr + r)[:, None]
    logs2 = tl.load(logs2_ptr + r)[:, None]
    scale = tl.full([2, 1], ts._LOG2E, tl.float32)
    ts._split_tile_masses(
        t_logits, V, V, d_logits, V, V, r[:, None], r[:, None], m, logs2, m, logs2, scale, rho, active, resid,
        resid, tl.full([2, 1], -1, tl.int64), r < 2, 0, V, out_w + r * NT, out_t + r * NT, True, 0, BLOCK_V,
    )  # fmt: skip


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, gpu])])
def test_target_draw_masses_are_the_same_bits_in_either_tile_loop(device):
    """A program with no residual lane sums its tiles in a loop without the residual's draft
    tile and selects (the bonus rows' masses); a target-row draw's tile masses and maxima are
    the same bits there as beside a residual, in the general loop (tiles of 256, the last one
    partial, a -inf logit)."""
    vocab, block_v = 1000, 256
    n_tiles = -(-vocab // block_v)
    rng = np.random.default_rng(5)
    logits = torch.from_numpy(rng.normal(0.0, 3.0, (2, vocab)).astype(np.float32)).to(device)
    logits[0, 7] = float("-inf")
    draft = (logits + 0.5).to(torch.bfloat16)
    m = logits.max(dim=1).values.contiguous()
    logs2 = torch.log2(torch.exp2((logits - m[:, None]) * ts._LOG2E.value).sum(dim=1)).contiguous()
    sums = {}
    for lane0, lane1 in ((-1.0, -2.0), (-1.0, -1.0), (-1.0, 0.5), (-2.0, -2.0)):  # rho -2: inactive, 0.5: a residual
        out_w = torch.full((2 * n_tiles,), float("nan"), dtype=torch.float64, device=device)
        out_t = torch.full_like(out_w, float("nan"))
        rho = torch.tensor([lane0, lane1], dtype=torch.float32, device=device)
        _masses_probe[(1,)](logits, draft, vocab, rho, m, logs2, out_w, out_t, BLOCK_V=block_v, NT=n_tiles)
        sums[lane1 if lane0 == -1 else "none"] = (out_w[:n_tiles].cpu(), out_t[:n_tiles].cpu())
    # No active lane: zeros, as the general loop stores them (its tile max starts at 0).
    assert not sums["none"][0].any() and not sums["none"][1].any(), "an inactive program stored weight or a max"
    tiles = torch.nn.functional.pad(logits[0].cpu(), (0, n_tiles * block_v - vocab), value=float("-inf"))
    assert torch.equal(sums[0.5][1], tiles.reshape(n_tiles, block_v).max(dim=1).values.double()), "not the tile maxima"
    assert torch.all(sums[0.5][0] >= 1), "a tile's mass relative to its max is at least 1"
    for lane1 in (-2.0, -1.0):
        assert torch.equal(sums[lane1][0], sums[0.5][0]), f"tile masses differ (lane 1 rho {lane1})"
        assert torch.equal(sums[lane1][1], sums[0.5][1]), f"tile maxima differ (lane 1 rho {lane1})"


# --- greedy: bit-identical to the reference --------------------------------------------------------
CHAIN = (Method.STANDARD, Method.STRICT, Method.SYNTHETIC)


@pytest.mark.parametrize(
    "vocab,tiles",
    [(1, {}), (2, {}), (1023, {}), (1025, {}), (1025, {"block_v": 256, "splits": 3}), (70001, {})],
    ids=["V1", "V2", "V1023", "V1025", "V1025-split", "V70001"],
)
@pytest.mark.parametrize("path", PATHS)
def test_greedy_matches_reference(vocab, tiles, path):
    rng = np.random.default_rng(vocab)
    n = 24 if vocab > 10000 else 60
    batch = _batch(_greedy_requests(rng, vocab, n, CHAIN), vocab)
    _assert_same(_sample(batch, path=path, **tiles), ReferenceSampler().sample(batch), batch)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("with_draft", [True, False], ids=["draft-logits", "point-mass"])
def test_greedy_without_or_narrow_draft_vocab(with_draft, path):
    rng = np.random.default_rng(7)
    vocab, draft_vocab = 1025, 700
    batch = _batch(_greedy_requests(rng, vocab, 60, CHAIN, draft_vocab), vocab, draft_vocab, with_draft)
    _assert_same(_sample(batch, block_v=128, splits=2, path=path), ReferenceSampler().sample(batch), batch)


@pytest.mark.parametrize("path", PATHS)
def test_greedy_block_verification(path):
    """Block verification at T = 0 is greedy, with or without draft logits."""
    rng = np.random.default_rng(11)
    for with_draft in (False, True):
        batch = _batch(_greedy_requests(rng, 1025, 60, (Method.BLOCK,)), 1025, with_draft=with_draft)
        got = _sample(batch, block_v=256, splits=3, path=path)
        _assert_same(got, _true_greedy(batch), batch)
        _assert_same(got, ReferenceSampler().sample(batch), batch)


@pytest.mark.parametrize("path", PATHS)
def test_block_ratio_stays_zero(path):
    """rho = 0 then a draft with draft probability 0: 0 * inf is 0, so block verification at
    T = 0 stays greedy (the reference computed NaN here and accepted draft 0 until it adopted
    the same convention, ``reference.rules.block_step``)."""
    target = np.array([[0, 5, 0, 0], [0, 0, 5, 0], [0, 0, 0, 5], [5, 0, 0, 0]], np.float32)  # argmax 1, 2, 3, 0
    draft = np.array([[0, 5, 0, 0], [0, 0, 0, 5], [5, 0, 0, 0]], np.float32)  # argmax 1, 3, 0
    req = dict(target=target, draft=draft, drafts=np.array([0, 2, 3]), temperature=0.0, seed=7, position=0, method=Method.BLOCK)
    batch = _batch([req], 4)
    tokens, emitted = _sample(batch, path=path)
    assert emitted.tolist() == [1] and tokens[0].tolist() == [1, -1, -1, -1]
    _assert_same((tokens, emitted), ReferenceSampler().sample(batch), batch)


@pytest.mark.parametrize("path", PATHS)
def test_greedy_catalog_scenarios(path):
    profile = get_profile("ci")
    for scenario in catalog(profile, seed=3):
        if scenario.method != "greedy":
            continue
        batch = trials(scenario, materialize(scenario), 0, 40).batch
        _assert_same(_sample(batch, path=path), ReferenceSampler().sample(batch), batch)


# --- the output laws through the suite's runner ---------------------------------------------------
# The runner's CPU chunks are whole scenarios (thousands of requests): the default backend
# runs them on the staged path (the fused path takes its few small ones), FUSED on the fused path.
@pytest.mark.parametrize("backend", [BACKEND, FUSED], ids=["default", "fused"])
def test_smoke_catalog_through_runner(backend):
    profile = get_profile("smoke")
    result = run([backend], catalog(profile, seed=0), profile, seed=0, device="cpu")
    bad = [f"{r.scenario}[{r.template}] {r.check}: {r.verdict} {r.message}" for r in result.records if r.verdict in ("fail", "error")]
    assert not bad, "\n".join(bad)
    assert result.counts()["pass"] > 100


@pytest.mark.parametrize("path", PATHS)
def test_split_tiles_catalog_laws(path):
    """Tiny tiles split over several programs: the same laws (split merging, partial tiles)."""
    profile = get_profile("smoke")
    names = ("standard-near-target", "standard-small-draft-vocab", "standard-no-draft-probs", "standard-large-vocab",
             "strict-fixed", "block-fixed", "block-no-draft-probs", "synthetic-rates")  # fmt: skip
    backend = ts.TritonBackend("cpu", block_v=2, splits=3, path=path)
    rng = np.random.default_rng(0)
    failures = []
    for scenario in (s for s in catalog(profile, seed=1) if s.name in names):
        templates, planned, count = planned_trials(scenario, profile)
        tallies = sample_scenario(backend, scenario, templates, count, profile)
        for check in planned:
            v: Verdict = check.evaluate(tallies[check.template], rng)
            # Any p <= alpha is exactly when the runner's Holm step-down rejects something.
            if v.passed is False or (v.p_value is not None and v.p_value <= profile.alpha):
                failures.append(f"{scenario.name}[{check.template}] {check.name}: {v.message}")
    assert not failures, "\n".join(failures)


# --- the far tail -----------------------------------------------------------------------------------
def _tail_batch(vocab, n, log_ratio, seed_base, residual=False):
    """n requests over [0, log_ratio, ..., log_ratio]: token 0 against the tail. Bonus-only
    (no drafts), or ``residual``: one draft, token 1, which the target masks (-inf), so it is
    always rejected and the replacement comes from the residual max(p - onehot(1), 0) = p."""
    row = np.full(vocab, log_ratio, np.float32)
    row[0] = 0.0
    b, d = n, int(residual)
    if residual:
        row[1] = -np.inf
    return VerifyBatch(
        np.broadcast_to(row, (b * (d + 1), vocab)), None, np.ones(b * d, np.int64), np.arange(b + 1, dtype=np.int64) * d, np.ones(b),
        seed_base + np.arange(b, dtype=np.int64) * 7919, np.arange(b * (d + 1), dtype=np.int64) * 13, np.zeros(b, np.int8), None, d,
    )  # fmt: skip


def _tail_rate(tail_tokens, log_ratio):
    tail = tail_tokens * math.exp(float(np.float32(log_ratio)))
    return tail / (1.0 + tail)


def _binomial_check(hits, n, rate, max_shift):
    p = stats.binomial_test(hits, n, rate)
    detect = stats.binomial_detectable(ALPHA, POWER, rate, n)
    assert detect < max_shift, f"underpowered: detects a shift of {detect:.3g} only (wanted {max_shift:.3g})"
    assert p > ALPHA, f"tail drawn {hits}/{n} = {hits / n:.4g} vs rate {rate:.4g}: p = {p:.3g} <= alpha {ALPHA}"


@pytest.mark.parametrize("path,residual", [("staged", False), ("fused", True)], ids=["staged-bonus", "fused-residual"])
def test_tail_tokens_drawn_at_their_rate(path, residual):
    """4095 tail tokens each e^-12 (6e-6) below the head (4094 in the residual): binomial test
    at alpha 1e-6 that detects (power 0.99) a 50% error in the tail rate (vLLM #43150: a draw
    in fp32 starves such tokens). The staged path draws bonus tokens (``_pick_kernel``), the
    fused path replacements from a residual (``_draw``, after its chain rejected the draft);
    either path draws both with the same code, and they agree token for token
    (``test_fused_equals_staged``). The interpreter cannot afford the 1e-9..1e-12 ratios
    (about 200 / ratio token draws): ``test_draw_resolves_the_far_tail`` covers those
    exactly, and ``test_gpu_far_tail`` statistically."""
    vocab, n, log_ratio = 4096, 10000, -12.0
    tokens, emitted = _sample(_tail_batch(vocab, n, log_ratio, 5, residual), path=path)
    assert np.all(emitted == 1), "a draft of target probability 0 was accepted"
    rate = _tail_rate(vocab - 1 - int(residual), log_ratio)
    _binomial_check(int((tokens[:, 0] != 0).sum()), n, rate, 0.5 * rate)


# --- residual candidates ---------------------------------------------------------------------------
def _rejection_batch(vocab, n, noise):
    """n requests with one target row, one draft row (the target plus Gaussian ``noise``) and
    one fixed draft, the token the draft over-weights most (rejected with probability
    1 - p/q there); seeds and positions differ, so the replacements are independent draws."""
    rng = np.random.default_rng(23)
    target = rng.normal(0.0, 1.5, vocab).astype(np.float32)
    draft = (target + rng.normal(0.0, noise, vocab)).astype(np.float32)
    x = int(np.argmax(draft - target))
    batch = VerifyBatch(
        np.tile(np.stack([target, target]), (n, 1)), np.tile(draft, (n, 1)), np.full(n, x, np.int64),
        np.arange(n + 1, dtype=np.int64), np.ones(n), 11 + np.arange(n, dtype=np.int64) * 7919,
        np.arange(2 * n, dtype=np.int64) * 13, np.zeros(n, np.int8), None, 1,
    ).validate()  # fmt: skip
    p, q = (np.exp(r.astype(np.float64) - r.max()) for r in (target, draft))
    p, q = p / p.sum(), q / q.sum()
    return batch, np.maximum(p - q, 0.0), 1.0 - min(1.0, p[x] / q[x])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("noise,kept", [(0.3, False), (2.0, True)], ids=["mostly-fallbacks", "mostly-kept"])
def test_rejection_replacements_have_the_residual_law(path, noise, kept, monkeypatch):
    """A rejected draft's replacement is drawn by residual candidates (``_residual_candidates``),
    or, when none of a request's 8 is kept, from the residual's masses: either way its law is
    max(p - q, 0) / R. Pearson chi-square over the rejections' tokens against it (cells pooled to
    >= 5 expected), alpha 1e-6; the rejections detect TV 0.1 with power 0.99 (requests: that
    many over the rejection's probability, and a fifth more). R = 0.07: (1 - R)^8 = 0.56 of the
    requests fall back; R = 0.67: nearly none. Which one ran shows against the draw without
    candidates (``_CANDIDATES`` 0), whose token a fallback keeps."""
    vocab = 64
    needed = stats.trials_for_tv(ALPHA, POWER, 0.1, vocab - 1)
    n = math.ceil(1.2 * needed / _rejection_batch(vocab, 1, noise)[2])
    batch, residual, _ = _rejection_batch(vocab, n, noise)
    tokens, emitted = _sample(batch, path=path)
    monkeypatch.setattr(ts, "_CANDIDATES", 0)
    plain, _ = _sample(batch, path=path)
    rejected = emitted == 1
    got = np.bincount(tokens[rejected, 0], minlength=vocab).astype(np.float64)
    want = residual / residual.sum() * rejected.sum()
    assert stats.detectable_tv(ALPHA, POWER, vocab - 1, int(rejected.sum())) <= 0.1, f"only {rejected.sum()} rejections"
    result = stats.chi_square_test(got, want, stats.pool_cells(want), with_ci=False)
    assert result.p_value > ALPHA, f"replacements vs the residual: chi2 {result.statistic:.1f}, df {result.df}, p {result.p_value:.3g}"
    same = float(np.mean(tokens[rejected, 0] == plain[rejected, 0]))
    assert (same < 0.3) if kept else (same > 0.3), f"{same:.2f} of the replacements are the fallback's token"


# --- reproducibility --------------------------------------------------------------------------------
def _mixed_requests(rng, vocab, n):
    methods = [Method.STANDARD, Method.STRICT, Method.BLOCK, Method.SYNTHETIC]
    out = []
    for i in range(n):
        d = int(rng.integers(0, 5))
        target = rng.normal(0.0, 1.0, (d + 1, vocab))
        draft = target[:d] + rng.normal(0.0, 0.5, (d, vocab))
        drafts = rng.integers(0, vocab, d)
        out.append(
            dict(
                target=target, draft=draft, drafts=drafts, temperature=float(rng.choice([0.0, 0.7, 1.0])),
                seed=int(rng.integers(1 << 62)), position=int(rng.integers(1 << 40)), method=methods[i % 4],
                rates=rng.random(d),
            )
        )  # fmt: skip
    return out


@pytest.mark.parametrize("path", PATHS)
def test_seeded_and_independent_of_batch_mates(path):
    rng = np.random.default_rng(5)
    vocab = 300
    reqs = _mixed_requests(rng, vocab, 24)
    batch = _batch(reqs, vocab)
    first = _sample(batch, path=path)
    again = _sample(batch, path=path)
    assert np.array_equal(first[0], again[0]) and np.array_equal(first[1], again[1])
    # Keep every other request, reversed, among new batch mates of other methods and counts.
    kept = list(range(0, 24, 2))[::-1]
    mates = _mixed_requests(np.random.default_rng(6), vocab, 10)
    mixed = [reqs[i] for i in kept[:6]] + mates + [reqs[i] for i in kept[6:]]
    where = list(range(6)) + list(range(16, 22))
    tokens, emitted = _sample(_batch(mixed, vocab), path=path)
    for j, i in zip(where, kept):
        width = len(reqs[i]["drafts"]) + 1
        assert emitted[j] == first[1][i], f"request {i}: emitted {emitted[j]} alone, {first[1][i]} with mates"
        assert tokens[j, :width].tolist() == first[0][i, :width].tolist(), f"request {i} changed with its batch mates"
    # Other seeds give other outputs (the noise is really keyed by the seed).
    reseeded = _batch([{**q, "seed": q["seed"] + 1} for q in reqs], vocab)
    assert not np.array_equal(_sample(reseeded, path=path)[0], first[0])


# --- the fused path against the staged path -----------------------------------------------------------
def _any_requests(rng, vocab, n, draft_vocab, max_drafts):
    """Every method at temperatures 0, 1e-4, 0.5, 1 and 2, with what ``_greedy_requests`` plants
    (ties, NaN and masked rows, placeholders), draft rows near the target or not, some fully
    masked, and random synthetic rates."""
    out = _greedy_requests(rng, vocab, n, (Method.STANDARD, Method.STRICT, Method.BLOCK, Method.SYNTHETIC), draft_vocab, max_drafts)
    for q in out:
        d = len(q["drafts"])
        q["temperature"] = float(rng.choice([0.0, 1e-4, 0.5, 1.0, 2.0]))
        if rng.random() < 0.5:
            q["draft"] = q["target"][:d, :draft_vocab] + rng.normal(0.0, 0.5, (d, draft_vocab))
        q["draft"] = np.nan_to_num(q["draft"], nan=0.0, posinf=0.0, neginf=-np.inf)  # draft logits are never NaN
        if d and rng.random() < 0.2:
            q["draft"][rng.integers(d)] = -np.inf
        q["rates"] = rng.random(d)
    return out


FUSED_CASES = [  # vocab, draft vocab, draft logits, tiles
    (300, 300, True, {}),  # one tile, one split
    (1025, 700, True, {"block_v": 256, "splits": 3}),  # a narrower draft vocabulary (3 splits each)
    (1025, 256, True, {"block_v": 256, "splits": 3}),  # a draft vocabulary of one split, the target's of 3
    (33, 33, False, {"block_v": 8, "splits": 2}),  # no draft logits; partial last tile
    (7, 5, True, {"block_v": 4, "splits": 3}),  # tiles and splits past a tiny vocabulary
    (2, 2, True, {}),
]


def _mixed_batch(vocab, draft_vocab, with_draft, seed):
    """Thirty mixed requests of up to 5 drafts over a ``FUSED_CASES`` vocabulary (rng ``[vocab, seed]``)."""
    rng = np.random.default_rng([vocab, seed])
    return _batch(_any_requests(rng, vocab, 30, draft_vocab, int(rng.integers(1, 6))), vocab, draft_vocab, with_draft)


def _assert_fused_equals_staged(vocab, draft_vocab, with_draft, tiles, seed):
    """The fused path's outputs are the staged path's on ``_mixed_batch``."""
    batch = _mixed_batch(vocab, draft_vocab, with_draft, seed)
    _assert_same(_sample(batch, path="fused", **tiles), _sample(batch, path="staged", **tiles), batch)


@pytest.mark.parametrize(
    "vocab,draft_vocab,with_draft,tiles",
    FUSED_CASES,
    ids=["V300", "V1025-draft700-split3", "V1025-draft256-split3-1", "V33-no-draft-split2", "V7-draft5-split3", "V2"],
)
def test_fused_equals_staged(vocab, draft_vocab, with_draft, tiles):
    """The fused path's outputs are the staged path's, token for token, on mixed batches
    (the same tiles, reductions and counter-based uniforms drive the same decisions)."""
    for seed in range(3):
        _assert_fused_equals_staged(vocab, draft_vocab, with_draft, tiles, seed)


def test_fused_pick_in_a_kernel_of_its_own_equals_staged(monkeypatch):
    """Above ``_PICK_IN_MASS_MAX_BLOCKS`` request blocks (large batches on CUDA) the fused path
    picks in a fourth kernel: the same tokens (the interpreter's one block picks in the mass kernel)."""
    monkeypatch.setattr(tf, "_PICK_IN_MASS_MAX_BLOCKS", 0)
    for vocab, draft_vocab, with_draft, tiles in FUSED_CASES[:4]:
        _assert_fused_equals_staged(vocab, draft_vocab, with_draft, tiles, 13)


def test_fused_launch_constants_leave_the_tokens_as_they_were(monkeypatch):
    """The launch constants a GPU is tuned by (``benchmarks/bench_kernels.py --set``) only spread
    the work over programs: all splits in one statistics program, eight tiles in one mass
    program and a pick kernel of its own give the staged path's tokens."""
    for name, value in {"_STATS_PROGRAMS": 1, "_MASS_PROGRAMS": 1, "_MASS_MAX_TILES": 8, "_PICK_IN_MASS_MAX_BLOCKS": 0}.items():
        monkeypatch.setattr(tf, name, value)
    assert tf._stats_splits_per_program(6, 3) == 3  # the settings reach the plan
    for vocab, draft_vocab, with_draft, tiles in FUSED_CASES[:4]:
        _assert_fused_equals_staged(vocab, draft_vocab, with_draft, tiles, 17)


def test_fused_chain_kernel_reads_its_inputs_first_or_after_with_the_same_bits(monkeypatch):
    """The chain kernel reads the drafts, their logits and uniforms before its wait and takes the
    statistics it merged from registers up to ``_INPUTS_FIRST_MAX_STEPS`` steps, else after the
    merge and from the statistics loaded back: forced each way at every K, the scratch is the
    same bit for bit (final statistics, the chain, block verification's running ratios, the
    masses), and the tokens are the staged path's."""
    for vocab, draft_vocab, with_draft, tiles in FUSED_CASES:
        batch = _mixed_batch(vocab, draft_vocab, with_draft, 19)
        scratches, outputs = [], []
        for max_steps in (0, 64):
            monkeypatch.setattr(tf, "_INPUTS_FIRST_MAX_STEPS", max_steps)
            run = lambda batch=batch, tiles=tiles, outputs=outputs: outputs.append(_sample(batch, path="fused", **tiles))  # noqa: E731
            scratches.append(_fused_scratch(monkeypatch, run).view(torch.int64))
        same = scratches[0] == scratches[1]
        assert bool(same.all()), f"V = {vocab}: {int((~same).sum())} scratch slots differ between the two orders"
        staged = _sample(batch, path="staged", **tiles)
        for fused in outputs:
            _assert_same(fused, staged, batch)


def _equal_counts_batch(vocab, draft_vocab, with_draft, k, seed):
    """About forty mixed requests (``_any_requests``) of exactly ``k`` drafts each."""
    rng = np.random.default_rng([vocab, k, seed])
    requests = [q for q in _any_requests(rng, vocab, 40 * (k + 1), draft_vocab, k) if len(q["drafts"]) == k]
    return _batch(requests, vocab, draft_vocab, with_draft)


@pytest.mark.parametrize("k", [1, 3])
def test_fused_batch_of_equal_draft_counts_finds_its_rows_without_cu(monkeypatch, k):
    """Where every request has K drafts (the host knows: B K draft tokens) the statistics kernel
    finds its rows as r (K + 1) + k and r K + k, with no load of ``cu`` before its reads; the
    tokens are the staged path's. A ragged batch is told apart and loads ``cu``."""
    told = []
    real_launch = tf.launch

    def spy(fn, grid, *args, **options):
        if fn is tf._fused_stats_kernel:
            told.append(dict(zip(fn.arg_names, args))["EQUAL_COUNTS"])
        return real_launch(fn, grid, *args, **options)

    monkeypatch.setattr(tf, "launch", spy)
    for vocab, draft_vocab, with_draft, tiles in FUSED_CASES:
        batch = _equal_counts_batch(vocab, draft_vocab, with_draft, k, 23)
        assert (np.diff(batch.cu_num_drafts) == k).all() and batch.num_requests > 10
        _assert_same(_sample(batch, path="fused", **tiles), _sample(batch, path="staged", **tiles), batch)
        assert told[-1] is True, "the batch's equal draft counts were not told to the statistics kernel"
    _assert_fused_equals_staged(*FUSED_CASES[0], 1)  # a ragged batch
    assert told[-1] is False, "a ragged batch was taken for one of equal draft counts"


def test_fused_reads_only_what_it_wrote(monkeypatch):
    """With its float64 scratch allocated full of NaN, the fused path still gives the staged
    path's outputs: no kernel reads a slot no earlier kernel wrote (a request's last target
    row has no statistics; its draws, greedy and degenerate decisions come from its tiles)."""
    real_empty = torch.empty

    def poisoned(*shape, **kwargs):
        out = real_empty(*shape, **kwargs)
        return out.fill_(math.nan) if out.dtype == torch.float64 else out

    for vocab, draft_vocab, with_draft, tiles in FUSED_CASES[:4]:
        batch = _mixed_batch(vocab, draft_vocab, with_draft, 11)
        staged = _sample(batch, path="staged", **tiles)
        monkeypatch.setattr(torch, "empty", poisoned)
        try:
            fused = _sample(batch, path="fused", **tiles)
        finally:
            monkeypatch.setattr(torch, "empty", real_empty)
        _assert_same(fused, staged, batch)


def _fused_scratch(monkeypatch, run, prepare=None) -> torch.Tensor:
    """The fused path's float64 scratch after ``run()``, allocated zeroed (unwritten slots compare
    equal), then given to ``prepare`` where one is passed."""
    real_empty = torch.empty
    made = []

    def zeroed(*shape, **kwargs):
        made.append(torch.zeros(*shape, **kwargs))
        if prepare is not None and made[-1].dtype == torch.float64:
            prepare(made[-1])
        return made[-1]

    monkeypatch.setattr(torch, "empty", zeroed)
    try:
        run()
    finally:
        monkeypatch.setattr(torch, "empty", real_empty)
    (scratch,) = [t for t in made if t.dtype == torch.float64]
    return scratch


# Two fp32 sums of the same row in different orders (CUDA tiles, V <= 262,144): each within 64 u
# of the exact sum (u = 2**-24; a term passes at most 31 in-thread, 5 warp and 2 cross-warp adds
# in the fused kernel's 4096-wide tile (15 in the staged kernel's 2048-wide one, then 2 running-sum
# steps of a multiply and an add), two exp2 of about 2 u each, and the merge's two roundings: at
# most 46), and each log rounds once: |log-sum difference| <= 128 u + 2 ulps.
_ORDER_SLACK = 128 * 2.0**-24


def _assert_stats_equal(stored, want, label: str, log_sum_order_bound: bool = False, rows=None):
    """Stored final statistics (``[4, n]`` float64: max, log-sum, argmax, flag) equal ``_Stats``
    bit for bit in ``rows`` (default all); with ``log_sum_order_bound`` the log-sums within
    ``_ORDER_SLACK`` + 2 ulps."""
    rows = slice(None) if rows is None else rows
    for field, got, w in zip(("max", "log-sum", "argmax", "degenerate"), stored[:, rows], (want.m, want.logs, want.arg, want.bad)):
        w = w[rows]
        if field == "log-sum" and log_sum_order_bound:
            ulp = torch.where(w.isfinite(), torch.nextafter(w, torch.full_like(w, math.inf)) - w, 0.0).to(torch.float64)
            w = w.to(torch.float64)
            same = ((got - w).abs() <= _ORDER_SLACK + 2 * ulp) | (got.isnan() & w.isnan()) | (got == w)
            worst = float(torch.where(same, 0.0, (got - w).abs()).nan_to_num(math.inf).max()) if len(w) else 0.0
            assert bool(same.all()), f"{label} log-sum: {int((~same).sum())} of {len(w)} rows past the order bound (worst {worst:.3g})"
            continue
        w = w.to(torch.float64)
        same = (got == w) | (got.isnan() & w.isnan())
        assert bool(same.all()), f"{label} {field}: {int((~same).sum())} of {len(w)} rows differ"


def _rows_with_drafts(counts):
    """Target rows 0..count-1 of each request (ragged ``counts``): the rows the fused path
    keeps statistics of (a request's last row has none, ``_fused_stats_kernel``)."""
    owner = torch.repeat_interleave(torch.arange(len(counts), device=counts.device), counts + 1)
    first = torch.cumsum(counts + 1, 0) - (counts + 1)
    return torch.arange(len(owner), device=counts.device) - first[owner] < counts[owner]


def _staged_group(vocab, cuda, block_v=None, splits=None) -> int:
    """The group width the staged path's target statistics sum by (``verify``: residual candidates on)."""
    draw_v = ts._tiles(vocab, cuda, block_v, splits)[0]
    return ts._candidate_plan(vocab, draw_v, draw_v)[0] if ts._CANDIDATES else 0


@pytest.mark.parametrize("splits_per_program", [1, 2])
def test_fused_final_statistics_are_the_staged_ones(monkeypatch, splits_per_program):
    """The fused chain kernel's merge of split statistics stores the staged path's final
    statistics bit for bit (max, log-sum, argmax, degenerate flag) for every draft row and
    every target row but a request's last: a merge that drifts moves draws only near a
    boundary, but moves these. Also with two splits per statistics program (large batches
    on CUDA): a split's partials do not depend on which program reads it."""
    monkeypatch.setattr(tf, "_stats_splits_per_program", lambda rows, nsplit: min(splits_per_program, nsplit))
    for vocab, draft_vocab, with_draft, tiles in FUSED_CASES:
        block_v, splits = tiles.get("block_v"), tiles.get("splits")
        if not splits:
            continue  # one split everywhere: the stats kernel stores final statistics itself
        batch = _mixed_batch(vocab, draft_vocab, with_draft, 7)
        scratch = _fused_scratch(monkeypatch, lambda batch=batch, tiles=tiles: _sample(batch, path="fused", **tiles))
        t = batch.to_torch("cpu")
        counts = torch.diff(torch.as_tensor(batch.cu_num_drafts))
        temperature = t["temperature"].to(torch.float64)
        # Final statistics: the chain kernel's (before the mass counters and flags) for a side of several
        # splits, else the stats kernel's own (target at 0, draft after the target's partials).
        n_t, n_d = len(batch.target_logits), len(batch.draft_tokens) if with_draft else 0
        t_split = ts._tiles(vocab, False, block_v, splits)[2]
        d_split = ts._tiles(draft_vocab, False, block_v, splits)[2] if with_draft else 1
        at = (
            len(scratch) - tf._counters_and_flags(len(counts)) - 4 * (n_t * (t_split > 1) + n_d * (d_split > 1))
        )  # before the counters and flags
        t_at = at if t_split > 1 else 0
        d_at = at + 4 * n_t * (t_split > 1) if d_split > 1 else 4 * n_t * t_split
        sides = [(t["target_logits"], torch.repeat_interleave(torch.arange(len(counts)), counts + 1), t_at, _rows_with_drafts(counts))]
        if with_draft:
            sides.append((t["draft_logits"], torch.repeat_interleave(torch.arange(len(counts)), counts), d_at, None))
        for logits, owner, start, rows in sides:
            group = _staged_group(vocab, False, block_v, splits) if rows is not None else 0
            want = ts._Stats(logits.to(torch.float32), owner, temperature, False, (block_v, splits), group=group)
            sampled = (temperature[owner] > 0) & (want.bad == 0)
            assert torch.all(want.arg[sampled] == 2**31 - 1), "a sampled row's argmax is not computed (_NO_ID)"
            _assert_stats_equal(scratch[start : start + 4 * len(owner)].view(4, -1), want, f"V={vocab}", rows=rows)


def test_mass_spans_cover_the_vocabulary_in_whole_tiles():
    """``_mass_split_len``: whole tiles, one each at small batches, at most ``_MASS_MAX_TILES``
    and the row, about ``_MASS_PROGRAMS`` programs a call at large batches."""
    for vocab in (2, 3000, 32000, 131072, 152064, 262144):
        block_v = ts._tiles(vocab, cuda=True)[0]
        n_tiles = -(-vocab // block_v)
        for blocks in (1, 3, 17, 64, 256, 1024):
            span = tf._mass_split_len(blocks, n_tiles, block_v)
            assert span % block_v == 0 and block_v <= span <= min(tf._MASS_MAX_TILES, n_tiles) * block_v
            if blocks * n_tiles < 2 * tf._MASS_PROGRAMS:
                assert span == block_v, (vocab, blocks, span)
            else:
                assert span == tf._MASS_MAX_TILES * block_v or blocks * -(-vocab // span) >= tf._MASS_PROGRAMS, (vocab, blocks, span)


def test_statistics_tile_is_the_split_where_it_fits():
    """``_stats_width``: on CUDA one tile per split up to ``_STATS_MAX_WIDTH`` ids (a power of
    two, as Triton's ranges), else the staged tile; the interpreter keeps its large tiles."""
    for vocab in (2, 3000, 4096, 32000, 131072, 152064, 262144):
        block_v, _, nsplit, split_len = ts._tiles(vocab, cuda=True)
        width = tf._stats_width(split_len, block_v, cuda=True)
        assert width == split_len <= tf._STATS_MAX_WIDTH and nsplit * width >= vocab, (vocab, width, split_len)
    assert tf._stats_width(6144, 2048, cuda=True) == 2048  # a split of three tiles is read tile by tile
    assert tf._stats_width(8192, 2048, cuda=True) == 2048  # wider than the register budget
    assert tf._stats_width(4096, 65536, cuda=False) == 65536


def test_path_dispatch():
    """auto: fused up to ``fused_max_requests`` requests, staged above; a planted fault always staged."""
    assert ts.takes_fused_path("auto", ts.FUSED_MAX_REQUESTS) and not ts.takes_fused_path("auto", ts.FUSED_MAX_REQUESTS + 1)
    assert ts.takes_fused_path("auto", 10, fused_max_requests=10) and not ts.takes_fused_path("auto", 11, fused_max_requests=10)
    assert ts.takes_fused_path("fused", 10**6) and not ts.takes_fused_path("staged", 1)
    assert not ts.takes_fused_path("fused", 1, fault=3) and not ts.takes_fused_path("auto", 1, fault=3)
    # CUDA: logits per row position (8,388 requests at V = 32000, 2,048 at 131072, 1,024 at 262,144)
    for b, v in ((8388, 32000), (2048, 131072), (1024, 262144)):
        assert ts.takes_fused_path("auto", b, cuda=True, vocab=v) and not ts.takes_fused_path("auto", b + 1, cuda=True, vocab=v)
    with pytest.raises(ValueError, match="path"):
        ts.TritonBackend(path="fast")


def test_faults_take_the_staged_path(monkeypatch):
    """A planted fault lives in the staged kernels: a fault backend never calls the fused path."""

    def refuse(*args, **kwargs):
        raise AssertionError("the fused path ran a planted fault")

    monkeypatch.setattr(tf, "verify_fused", refuse)
    batch = _batch(_mixed_requests(np.random.default_rng(1), 16, 4), 16)
    tokens, emitted = as_numpy_outputs(TritonFaultBackend("bonus-wrong-row").sample(batch), batch.num_requests, batch.max_drafts)
    assert np.all((emitted >= 1) & (emitted <= batch.max_drafts + 1))
    with pytest.raises(AssertionError, match="fused path ran"):
        _sample(batch, path="fused")


# --- GPU --------------------------------------------------------------------------------------------
MAX_CATALOG_LOGITS = 2e10  # per scenario: the harness builds and tallies every trial on the host


def _logit_volume(scenario, profile) -> float:
    templates, _, count = planned_trials(scenario, profile)
    return float(count) * sum(t.num_drafts + 1 for t in templates) * scenario.vocab_size


@pytest.mark.gpu
@gpu
def test_gpu_profile_catalog():
    """The ``gpu`` profile catalog on CUDA, but for scenarios whose host-side trial generation
    exceeds MAX_CATALOG_LOGITS (standard-large-vocab: ~8e11 logits), run by the slow test."""
    profile = get_profile("gpu")
    scenarios = [s for s in catalog(profile, seed=0) if _logit_volume(s, profile) <= MAX_CATALOG_LOGITS]
    result = run([BACKEND], scenarios, profile, seed=0, device="cuda")
    bad = [f"{r.scenario}[{r.template}] {r.check}: {r.verdict} {r.message}" for r in result.records if r.verdict in ("fail", "error")]
    assert not bad, "\n".join(bad)


@pytest.mark.gpu
@pytest.mark.slow
@gpu
def test_gpu_profile_catalog_heavy_scenarios():
    profile = get_profile("gpu")
    scenarios = [s for s in catalog(profile, seed=0) if _logit_volume(s, profile) > MAX_CATALOG_LOGITS]
    result = run([BACKEND], scenarios, profile, seed=0, device="cuda")
    bad = [f"{r.scenario}[{r.template}] {r.check}: {r.verdict} {r.message}" for r in result.records if r.verdict in ("fail", "error")]
    assert not bad, "\n".join(bad)


@pytest.mark.gpu
@gpu
def test_gpu_large_vocab_mixed_batch():
    """V = 152064, K = 8, ragged (0 included), placeholders, mixed greedy / standard /
    synthetic, bf16 draft logits: in-range well-formed outputs; greedy rows bit-identical."""
    rng = np.random.default_rng(0)
    vocab, b, k = 152064, 48, 8
    counts = rng.integers(0, k + 1, b)
    counts[:3] = [0, k, 1]
    cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    d = int(cu[-1])
    target = torch.randn(d + b, vocab, device="cuda", generator=torch.Generator("cuda").manual_seed(0)) * 3
    target[::7, 1000:] = -math.inf  # masked rows (top-k style)
    draft = (target[torch.from_numpy(np.arange(d) + np.repeat(np.arange(b), counts)).cuda()] + 0.5).to(torch.bfloat16)
    target[5, 17] = math.nan  # one degenerate target row
    tnp = target.cpu().numpy()
    top = greedy_tokens(tnp)
    drafts = np.zeros(d, np.int64)
    for r in range(b):
        for j in range(counts[r]):
            drafts[cu[r] + j] = top[cu[r] + r + j] if rng.random() < 0.8 else rng.integers(vocab)
    if counts[3] > 1:
        drafts[cu[3] + 1] = -1  # a placeholder
    methods = np.array([(Method.STANDARD, Method.STANDARD, Method.SYNTHETIC)[i % 3] for i in range(b)], dtype=np.int8)
    temps = np.where(np.arange(b) % 2 == 0, 0.0, 1.0)
    batch = VerifyBatch(
        tnp, draft.float().cpu().numpy(), drafts, cu, temps, rng.integers(0, 1 << 62, b), np.arange(d + b, dtype=np.int64) * 3,
        methods, rng.random((b, k)), k,
    ).validate()  # fmt: skip
    t = batch.to_torch("cuda")
    args = [
        t[name]
        for name in ("target_logits", "draft_logits", "draft_tokens", "cu_num_drafts", "temperature", "seeds", "positions", "methods")
    ]
    args[1] = draft  # bf16, as engines keep draft logits
    tokens, emitted = ts.verify(*args, t["synthetic_rates"], k)
    tokens, emitted = tokens.cpu().numpy(), emitted.cpu().numpy()
    rtok, rem = ReferenceSampler().sample(batch)
    for r in range(b):
        drafts_r = drafts[cu[r] : cu[r + 1]]
        d_eff = int(np.argmax(np.append(drafts_r, -1) < 0))
        assert 1 <= emitted[r] <= d_eff + 1
        assert np.all((tokens[r, : emitted[r]] >= 0) & (tokens[r, : emitted[r]] < vocab))
        assert np.all(tokens[r, emitted[r] :] == -1)
        assert tokens[r, : emitted[r] - 1].tolist() == drafts_r[: emitted[r] - 1].tolist()
        if temps[r] == 0 and methods[r] == Method.STANDARD:
            assert tokens[r].tolist() == rtok[r].tolist() and emitted[r] == rem[r], f"greedy request {r} differs"


def _device_mixed_batch(vocab, b, k, seed, device="cuda", chain_only=False, equal_counts=False):
    """Ragged mixed batch built on the device (``equal_counts``: k drafts each): every method
    (``chain_only``: standard and synthetic only), temperatures 0 / 0.5 / 1, masked and
    near-target bf16 draft rows, drafts mostly the target's argmax, a placeholder, rates."""
    g = torch.Generator(device).manual_seed(seed)
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, k + 1, b)
    counts[: min(b, 2)] = [k, 0][: min(b, 2)]
    if equal_counts:
        counts[:] = k
    cu = torch.from_numpy(np.concatenate([[0], np.cumsum(counts)])).to(device)
    d = int(counts.sum())
    target = torch.randn(d + b, vocab, device=device, generator=g) * 3
    target[::5, vocab // 3 :] = -math.inf
    rows = torch.from_numpy(np.arange(d) + np.repeat(np.arange(b), counts)).to(device)
    draft = (target[rows] + torch.randn(d, vocab, device=device, generator=g) * 0.5).to(torch.bfloat16)
    drafts = torch.where(
        torch.rand(d, device=device, generator=g) < 0.7, target[rows].argmax(1), torch.randint(0, vocab, (d,), device=device, generator=g)
    )
    if d > 1:
        drafts[d // 2] = -1
    kinds = [Method.STANDARD, Method.SYNTHETIC] if chain_only else [Method.STANDARD, Method.STRICT, Method.BLOCK, Method.SYNTHETIC]
    methods = torch.from_numpy(np.resize(np.array(kinds, np.int8), b)).to(device)
    temps = torch.from_numpy(np.resize([1.0, 0.0, 0.5], b)).to(device)
    seeds = torch.randint(0, 1 << 62, (b,), device=device, generator=g)
    positions = torch.arange(d + b, device=device, dtype=torch.int64) * 7
    rates = torch.rand(b, k, device=device, generator=g, dtype=torch.float64)
    return target, draft, drafts, cu, temps, seeds, positions, methods, rates, k


# A batch of chain methods only, verified with no strict or block requests: the flags carry the
# chain (``triton_fused._flag_chain``) wherever a block holds one request and a pick kernel follows,
# with programmatic dependent launch (sm_90+).
_CHAIN_ONLY = {"has_strict": False, "has_block": False}


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize(
    "vocab,b,k,chain_only,equal_counts",
    [
        (3000, 17, 8, False, False),
        (152064, 3, 4, False, False),
        (131072, 64, 8, False, False),
        (152064, 64, 1, False, False),
        (152064, 64, 4, False, True),
        (3000, 17, 8, True, False),
        (131072, 256, 1, True, False),
        (131072, 256, 1, True, True),
        (131072, 64, 8, True, False),
    ],
)
def test_gpu_fused_equals_staged(vocab, b, k, chain_only, equal_counts):
    """On CUDA the fused path gives the staged path's tokens and counts, request for request,
    on ragged mixed batches (every method, greedy rows, masked rows, a placeholder; or chain
    methods only, where the flags carry the chain; or K drafts each, where the statistics kernel
    finds its rows without ``cu``). With
    the staged path's exact-law checks this verifies the fused path's law; the whole ``gpu``
    catalog on the fused path also passed on an H100 (``python -m harness run --backend
    harness.backends.triton.fused:FusedTritonBackend --profile gpu --device cuda``) but takes
    minutes, mostly compiling, so it is not part of ``-m gpu``."""
    flags = _CHAIN_ONLY if chain_only else {}
    for seed in range(2):
        args = _device_mixed_batch(vocab, b, k, seed, chain_only=chain_only, equal_counts=equal_counts)
        fused = [t.cpu().numpy() for t in ts.verify(*args, path="fused", **flags)]
        staged = [t.cpu().numpy() for t in ts.verify(*args, path="staged", **flags)]
        bad = np.flatnonzero((fused[0] != staged[0]).any(axis=1) | (fused[1] != staged[1]))
        assert bad.size == 0, (
            f"seed {seed}: {bad.size} of {b} requests differ; first {bad[0]}: fused {fused[0][bad[0]]} / {fused[1][bad[0]]}, staged {staged[0][bad[0]]} / {staged[1][bad[0]]}"
        )


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("vocab,b,k", [(152064, 3, 4), (131072, 64, 8)])
def test_gpu_fused_final_statistics_are_the_staged_ones(vocab, b, k, monkeypatch):
    """On CUDA the fused chain kernel's merged final statistics of every draft row and every
    target row but a request's last are the staged path's: max, argmax and degenerate flag bit for bit, the log-sum within the
    bound of two fp32 summation orders (``_ORDER_SLACK``). Triton lays the fused kernel's fp32
    target tile out like its bf16 draft tile, so its tile sums add in another order than the
    staged kernel's (final log-sums 1-3 ulps apart on an H100, the merges equal); a wrong merge or a dropped
    split moves a log-sum by that split's share of the mass, far past the bound."""
    args = list(_device_mixed_batch(vocab, b, k, 0))
    args[4] = args[4].clone()
    args[4][0] = 0.0  # a greedy request with drafts: argmaxes merged over splits (sampled rows have none)
    target, draft, cu, temps = args[0], args[1], args[3], args[4]
    scratch = _fused_scratch(monkeypatch, lambda: ts.verify(*args, path="fused"))
    counts = torch.diff(cu)
    owners = torch.arange(b, device="cuda")
    sides = [
        (target, torch.repeat_interleave(owners, counts + 1), _rows_with_drafts(counts)),
        (draft, torch.repeat_interleave(owners, counts), None),
    ]
    at = len(scratch) - tf._counters_and_flags(b) - 4 * (len(target) + len(draft))  # the final statistics, then the counters and flags
    for name, (logits, owner, rows) in zip(("target", "draft"), sides):
        want = ts._Stats(logits, owner, temps.to(torch.float64), True, group=_staged_group(vocab, True) if name == "target" else 0)
        n = len(owner)
        _assert_stats_equal(scratch[at : at + 4 * n].view(4, n), want, name, log_sum_order_bound=True, rows=rows)
        at += 4 * n


_final_stats, _store_chain = tf._final_stats, tf._store_chain


@triton.jit
def _spin():
    """About 0.5 ms of nothing: long after the host has launched every kernel of the call."""
    begin = globaltimer()
    now = begin
    while now - begin < 500_000:
        now = globaltimer()


@triton.jit
def _late_final_stats(s_m, s_s, s_arg, s_nan, rows, mask):
    """``_final_stats`` late (the candidate kernel's call: its candidates start late)."""
    _spin()
    return _final_stats(s_m, s_s, s_arg, s_nan, rows, mask)


@triton.jit
def _late_store_chain(chain, r, mask, n, rejected, n_eff, rhos, K, B, HAS_BLOCK: tl.constexpr, KP: tl.constexpr):
    """``_store_chain`` late (the chain kernel's results and its flags come late)."""
    _spin()
    _store_chain(chain, r, mask, n, rejected, n_eff, rhos, K, B, HAS_BLOCK, KP)


_LATE = {
    "chain": ("_fused_chain_kernel", "_store_chain", _late_store_chain),
    "candidates": ("_fused_candidate_kernel", "_final_stats", _late_final_stats),
}


def _late_kernel(late):
    """The fused kernel ``late`` names with one jit function it calls swapped for its late
    variant: the same source and arguments."""
    kernel, callee, late_callee = _LATE[late]
    fn = getattr(tf, kernel).fn
    swapped = types.FunctionType(fn.__code__, {**fn.__globals__, callee: late_callee}, fn.__name__, fn.__defaults__)
    # a new function object has no annotations: copy them, or no parameter is tl.constexpr
    swapped.__annotations__, swapped.__module__, swapped.__qualname__ = fn.__annotations__, fn.__module__, fn.__qualname__
    return kernel, triton.jit(do_not_specialize=tf._COUNTS)(swapped)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("chain_only", [False, True], ids=["mixed", "chain-in-flags"])
@pytest.mark.parametrize("stale_flags", [False, True], ids=["lowered-flags", "stale-flags"])
@pytest.mark.parametrize("late", sorted(_LATE))
def test_gpu_fused_mass_kernel_waits_for_its_blocks_flags(late, stale_flags, chain_only, monkeypatch):
    """With programmatic dependent launch and a pick kernel, the mass kernel starts beside the
    candidate kernel, and each of its programs waits on its request block's flags: the chain
    kernel's, then, after a rejection, the candidate kernel's. Here the chain kernel stores its
    results, or every candidate program starts its candidates, about 0.5 ms late. A mass program
    that did not wait for the chain would take a zeroed chain (a kept candidate 0: no masses);
    one that did not wait for the candidates would read no kept candidate (-1) and sum that
    request's masses. At B = 256, K = 1, V = 131072 (mixed batch): the tokens of the same
    kernels run one after the other (PDL off), no masses for a request whose candidate is kept,
    masses for others. ``stale-flags``: the flags start raised, as an earlier call leaves them
    in memory the allocator hands out again (the statistics kernel lowers them).
    ``chain-in-flags``: chain methods only, where the flags carry the chain (a stale flag 1 would
    read as n = 0, no rejection: slot 0's target row instead of the bonus row)."""
    if not tf._pdl(torch.device("cuda")):
        pytest.skip("this GPU has no programmatic dependent launch (sm_90+ and Triton's launch_pdl): no flags to wait on")
    b = 256
    args = _device_mixed_batch(131072, b, 1, 0, chain_only=chain_only)
    flags = _CHAIN_ONLY if chain_only else {}
    monkeypatch.setattr(tf, *_late_kernel(late))
    ts.verify(*args, path="fused", **flags)  # compiles: the first call's launches are a compile apart, nothing overlaps
    launched = []
    real_launch_each = tf.launch_each
    monkeypatch.setattr(tf, "launch_each", lambda launches, *a: launched.append(a) or real_launch_each(launches, *a))
    flag_slots = tf._counters_and_flags(b) - b
    raise_flags = (lambda s: s[len(s) - flag_slots :].view(torch.int32).fill_(1)) if stale_flags else None
    result, events = [], [torch.cuda.Event(enable_timing=True) for _ in range(2)]

    def run():
        events[0].record()
        result.append(ts.verify(*args, path="fused", **flags))
        events[1].record()

    scratch = _fused_scratch(monkeypatch, run, prepare=raise_flags)
    torch.cuda.synchronize()
    assert events[0].elapsed_time(events[1]) > 0.5, f"the {late} did not come late: the test checks nothing"
    with monkeypatch.context() as m:
        m.setattr(tf, "_PDL", False)
        want_tokens, want_emitted = ts.verify(*args, path="fused", **flags)
    tokens, emitted = result[0]
    bad = torch.nonzero((tokens != want_tokens).any(dim=1) | (emitted != want_emitted)).flatten().tolist()
    assert not bad, f"{len(bad)} of {b} requests differ from the serial launches; first {bad[0]}"
    arg = dict(zip(tf._fused_chain_kernel.arg_names, launched[0]))  # the kernels after the statistics share it
    k, m_off, m_size, c_off, n_tiles = (arg[name] for name in ("K", "m_off", "m_size", "c_off", "n_tiles"))
    assert arg["scratch"] is scratch and arg["B"] == b
    assert arg["FLAG_CHAIN"] is chain_only, "the flags do not carry the chain where the test means them to"
    kept = scratch[c_off + (k + 4) * b : c_off + (k + 5) * b] >= 0
    per_request = (k + 1) * n_tiles  # each request's rows of tile masses (``_fused_mass_kernel``)
    masses = [scratch[at : at + b * per_request].view(b, per_request) for at in (m_off, m_off + m_size)]
    summed = (masses[0] != 0).any(dim=1) | (masses[1] != 0).any(dim=1)
    assert kept.any(), "no request kept a residual candidate: nothing to check"
    assert summed[~kept].any(), "no masses where a request draws: the test reads the wrong slots"
    wasted = torch.nonzero(kept & summed).flatten().tolist()
    assert not wasted, f"{len(wasted)} of {int(kept.sum())} requests with a kept candidate got masses; first {wasted[0]}"


@pytest.mark.gpu
@gpu
def test_gpu_far_tail():
    """262143 tail tokens each 1e-9 below the head (an fp32 draw never reaches them):
    binomial test at alpha 1e-6 that detects (power 0.99) a 40% error in the tail rate."""
    vocab, chunk, chunks, log_ratio = 262144, 1 << 16, 40, math.log(1e-9)
    row = torch.full((vocab,), log_ratio, device="cuda")
    row[0] = 0.0
    ids = torch.arange(chunk, device="cuda", dtype=torch.int64)
    empty = torch.zeros(0, dtype=torch.int64, device="cuda")
    hits = 0
    for c in range(chunks):
        tokens, _ = ts.verify(
            row.expand(chunk, vocab), None, empty, torch.zeros(chunk + 1, dtype=torch.int64, device="cuda"),
            torch.ones(chunk, dtype=torch.float64, device="cuda"), c * chunk + ids + 1, ids * 13,
            torch.zeros(chunk, dtype=torch.int8, device="cuda"), None, 0, has_strict=False, has_block=False, has_synthetic=False,
        )  # fmt: skip
        hits += int((tokens[:, 0] != 0).sum())
    rate = _tail_rate(vocab - 1, log_ratio)
    _binomial_check(hits, chunk * chunks, rate, 0.4 * rate)

"""The Triton sampler on CUDA (``-m gpu``; ``harness/backends/triton/``): the ``gpu`` profile
catalog, a V = 152064 batch, the fused path against the staged path (tokens, final statistics
within a summation-order bound, the mass kernel's waits on its flags under programmatic dependent
launch), and the far tail 1e-9 below the max.
"""

import dataclasses
import math
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the Triton backend needs torch")
triton = pytest.importorskip("triton", reason="the Triton backend needs triton")

import triton.language as tl  # noqa: E402
from triton.language.extra.cuda import globaltimer  # noqa: E402

from harness.backends.triton import fused as tf  # noqa: E402
from harness.backends.triton.backend import verify  # noqa: E402
from harness.backends.triton.fused_parts import final_stats, store_chain  # noqa: E402
from harness.backends.triton.fused_plan import counters_and_flags, pdl_on  # noqa: E402
from harness.backends.triton.staged_jobs import Stats  # noqa: E402
from harness.backends.triton.tunables import DEFAULT_TUNABLES  # noqa: E402
from harness.gpus import gpu_skip_reason  # noqa: E402
from harness.protocol import VerifyBatch  # noqa: E402
from harness.run.plans import planned_trials  # noqa: E402
from harness.run.runner import run  # noqa: E402
from harness.scenarios.catalog import catalog  # noqa: E402
from harness.scenarios.profiles import get_profile  # noqa: E402
from reference.distributions import greedy_tokens  # noqa: E402
from reference.methods import Method  # noqa: E402
from reference.sampler import ReferenceSampler  # noqa: E402
from suites.helpers import (  # noqa: E402
    TRITON_BACKEND,
    assert_stats_equal,
    binomial_check,
    device_mixed_batch,
    fused_scratch,
    rows_with_drafts,
    staged_group,
    tail_rate,
)

# The interpreter computes Philox's wrapping uint32 products with NumPy, which warns.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.*")
gpu = pytest.mark.skipif(gpu_skip_reason() is not None, reason=gpu_skip_reason() or "")


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
    result = run([TRITON_BACKEND], scenarios, profile, seed=0, device="cuda")
    bad = [f"{r.scenario}[{r.template}] {r.check}: {r.verdict} {r.message}" for r in result.records if r.verdict in ("fail", "error")]
    assert not bad, "\n".join(bad)


@pytest.mark.gpu
@pytest.mark.slow
@gpu
def test_gpu_profile_catalog_heavy_scenarios():
    profile = get_profile("gpu")
    scenarios = [s for s in catalog(profile, seed=0) if _logit_volume(s, profile) > MAX_CATALOG_LOGITS]
    result = run([TRITON_BACKEND], scenarios, profile, seed=0, device="cuda")
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
    tokens, emitted = verify(*args, t["synthetic_rates"], k)
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


# A batch of chain methods only, verified with no strict or block requests: the flags carry the
# chain (``fused_plan.flag_chain``) wherever a block holds one request and a pick kernel follows,
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
    harness.backends.triton.backend:FusedTritonBackend --profile gpu --device cuda``) but takes
    minutes, mostly compiling, so it is not part of ``-m gpu``."""
    flags = _CHAIN_ONLY if chain_only else {}
    for seed in range(2):
        args = device_mixed_batch(vocab, b, k, seed, chain_only=chain_only, equal_counts=equal_counts)
        fused = [t.cpu().numpy() for t in verify(*args, path="fused", **flags)]
        staged = [t.cpu().numpy() for t in verify(*args, path="staged", **flags)]
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
    bound of two fp32 summation orders (``ORDER_SLACK``). Triton lays the fused kernel's fp32
    target tile out like its bf16 draft tile, so its tile sums add in another order than the
    staged kernel's (final log-sums 1-3 ulps apart on an H100, the merges equal); a wrong merge or a dropped
    split moves a log-sum by that split's share of the mass, far past the bound."""
    args = list(device_mixed_batch(vocab, b, k, 0))
    args[4] = args[4].clone()
    args[4][0] = 0.0  # a greedy request with drafts: argmaxes merged over splits (sampled rows have none)
    target, draft, cu, temps = args[0], args[1], args[3], args[4]
    scratch = fused_scratch(monkeypatch, lambda: verify(*args, path="fused"))
    counts = torch.diff(cu)
    owners = torch.arange(b, device="cuda")
    sides = [
        (target, torch.repeat_interleave(owners, counts + 1), rows_with_drafts(counts)),
        (draft, torch.repeat_interleave(owners, counts), None),
    ]
    at = len(scratch) - counters_and_flags(b) - 4 * (len(target) + len(draft))  # the final statistics, then the counters and flags
    for name, (logits, owner, rows) in zip(("target", "draft"), sides):
        want = Stats(logits, owner, temps.to(torch.float64), True, group=staged_group(vocab, True) if name == "target" else 0)
        n = len(owner)
        assert_stats_equal(scratch[at : at + 4 * n].view(4, n), want, name, log_sum_order_bound=True, rows=rows)
        at += 4 * n


@triton.jit
def _spin():
    """About 0.5 ms of nothing: long after the host has launched every kernel of the call."""
    begin = globaltimer()
    now = begin
    while now - begin < 500_000:
        now = globaltimer()


@triton.jit
def _late_final_stats(s_m, s_s, s_arg, s_nan, rows, mask):
    """``final_stats`` late (the candidate kernel's call: its candidates start late)."""
    _spin()
    return final_stats(s_m, s_s, s_arg, s_nan, rows, mask)


@triton.jit
def _late_store_chain(chain, r, mask, n, rejected, n_eff, rhos, K, B, HAS_BLOCK: tl.constexpr, KP: tl.constexpr):
    """``store_chain`` late (the chain kernel's results and its flags come late)."""
    _spin()
    store_chain(chain, r, mask, n, rejected, n_eff, rhos, K, B, HAS_BLOCK, KP)


_LATE = {
    "chain": ("_fused_chain_kernel", "store_chain", _late_store_chain),
    "candidates": ("_fused_candidate_kernel", "final_stats", _late_final_stats),
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
    if not pdl_on(torch.device("cuda")):
        pytest.skip("this GPU has no programmatic dependent launch (sm_90+ and Triton's launch_pdl): no flags to wait on")
    b = 256
    args = device_mixed_batch(131072, b, 1, 0, chain_only=chain_only)
    flags = _CHAIN_ONLY if chain_only else {}
    monkeypatch.setattr(tf, *_late_kernel(late))
    verify(*args, path="fused", **flags)  # compiles: the first call's launches are a compile apart, nothing overlaps
    launched = []
    real_launch_each = tf.launch_each
    monkeypatch.setattr(tf, "launch_each", lambda launches, *a: launched.append(a) or real_launch_each(launches, *a))
    flag_slots = counters_and_flags(b) - b
    raise_flags = (lambda s: s[len(s) - flag_slots :].view(torch.int32).fill_(1)) if stale_flags else None
    result, events = [], [torch.cuda.Event(enable_timing=True) for _ in range(2)]

    def run():
        events[0].record()
        result.append(verify(*args, path="fused", **flags))
        events[1].record()

    scratch = fused_scratch(monkeypatch, run, prepare=raise_flags)
    torch.cuda.synchronize()
    assert events[0].elapsed_time(events[1]) > 0.5, f"the {late} did not come late: the test checks nothing"
    # The same kernels (the late one too) launched one after the other: no programmatic launch.
    want_tokens, want_emitted = verify(*args, path="fused", **flags, tunables=dataclasses.replace(DEFAULT_TUNABLES, pdl=False))
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
        tokens, _ = verify(
            row.expand(chunk, vocab), None, empty, torch.zeros(chunk + 1, dtype=torch.int64, device="cuda"),
            torch.ones(chunk, dtype=torch.float64, device="cuda"), c * chunk + ids + 1, ids * 13,
            torch.zeros(chunk, dtype=torch.int8, device="cuda"), None, 0, has_strict=False, has_block=False, has_synthetic=False,
        )  # fmt: skip
        hits += int((tokens[:, 0] != 0).sum())
    rate = tail_rate(vocab - 1, log_ratio)
    binomial_check(hits, chunk * chunks, rate, 0.4 * rate)

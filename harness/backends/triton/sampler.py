"""The suite's own Triton sampler: every verification method behind the protocol (``triton``).

Same output law as ``reference.sampler`` (not the same random numbers). One ``sample`` call
launches a fixed pipeline with no host synchronization:

1. ``_stats_kernel`` (+ ``_combine_kernel`` when the vocabulary is split over programs):
   per target and draft row, an online log-sum-exp of ``logits / T`` over vocabulary
   tiles (max, log of the sum of exponentials, degenerate flag, and for greedy rows the
   argmax with ties to the lowest id: only a point mass's token uses it).
2. Strict requests only: the target's own sample ``y`` of every row they verify (as 6.).
3. ``_chain_kernel``: one lane per request, a loop over draft steps: acceptance of every
   chain method (standard, strict, synthetic; greedy is standard at T = 0), and the running
   ratios ``rho`` of block requests. Tokens fixed by a point mass (T = 0, a degenerate row,
   a strict rejection) are written here; the others become *jobs*: draw one token from a
   target row or from a residual ``max(rho * target - draft, 0)``.
4. Block requests only: ``_mass_kernel`` (residual masses of the inner rows) and
   ``_block_kernel`` (the stop position, Sun et al. 2024).
5. ``_candidate_kernel`` (not under planted faults, which live in the draw): a chain method's
   rejection draws its replacement by rejection from the target row (``_residual_candidates``),
   reading one 64-id group per candidate (the target statistics store group sums for it); a
   request none of whose candidates is kept goes on to 6.
6. ``_mass_kernel`` + ``_pick_kernel``: each job's token by inverse CDF. The first pass
   sums the weights per vocabulary tile (programs per split); the second picks the tile
   holding ``u * total`` from those sums and scans only that tile with fp64 running sums.
   ``u`` has 52 random bits, so a token 1e-12 below the total is drawn at its rate (vLLM #43150 starved tokens
   below fp32's 2**-24). An empty residual falls back to the target row. A draw from the
   target row weighs each tile relative to its own max and rescales the tile sums to the
   row's max (``_target_tile_masses``): it needs no row statistics.

All noise is a counter-based Philox draw keyed by (seed, position, stream): a request's
output depends on its own inputs only, and tiles depend on the vocabulary alone.

Conventions follow ``reference`` (block verification's running ratio stays 0 once 0:
``0 * inf = 0``, as ``reference.rules.block_step``).

The fused path (``harness.backends.triton.fused``) gives the same outputs in three to five launches;
``path`` chooses, and the default takes it up to a batch size per vocabulary (``takes_fused_path``).
"""

import functools
import inspect
import os
import re

import torch
import triton
import triton.language as tl

from harness.backends import shared_rows as rows
from harness.backends.triton.faults import TRITON_FAULTS
from harness.backends.triton.launch import cdiv, launch, next_power_of_2
from harness.protocol import method_codes
from reference.methods import Method
from reference.rng import Stream

_STRICT = tl.constexpr(int(Method.STRICT))
_BLOCK = tl.constexpr(int(Method.BLOCK))
_SYNTHETIC = tl.constexpr(int(Method.SYNTHETIC))
_ACCEPT = tl.constexpr(int(Stream.ACCEPT))
_RESIDUAL = tl.constexpr(int(Stream.RESIDUAL))
_TARGET = tl.constexpr(int(Stream.TARGET))
_BLOCK_STREAM = tl.constexpr(int(Stream.BLOCK))
_CANDIDATE = tl.constexpr(int(Stream.CANDIDATE))
_TWO_M52 = tl.constexpr(2.220446049250313e-16)  # 2**-52
_MAX_INV_T = tl.constexpr(1e30)  # 1/T for tiny T: keeps (a - max) * inv_t finite, ties intact
_LOWEST = tl.constexpr(-3.4028234663852886e38)  # -FLT_MAX: a finite "nothing seen yet"
_NO_ID = tl.constexpr(2**31 - 1)
_LOG2E = tl.constexpr(1.4426950408889634)


def _fault(name: str):
    return tl.constexpr(TRITON_FAULTS[name].code)


# Planted faults (``harness.backends.triton.faults``, ``triton-fault:NAME``): kernels take FAULT as a
# constexpr and every fault branch is resolved at compile time, so FAULT = 0 (the correct
# sampler) compiles to the code it had without them. The first two are the caller's (host) bugs.
_IGNORE_DRAFT_PROBS = TRITON_FAULTS["ignore-draft-probs"].code
_TEMPERATURE_TWICE = TRITON_FAULTS["temperature-twice"].code
_DRAFT_BEFORE_TEMPERATURE = _fault("draft-before-temperature")
_BLOCK_TOKEN_WISE = _fault("block-token-wise")
_GREEDY_TIE_HIGHEST = _fault("greedy-tie-highest")
_NAN_ROW_OUT_OF_VOCAB = _fault("nan-row-out-of-vocab")
_INVERTED_RATIO = _fault("inverted-ratio")
_ACCEPT_AT_ZERO_UNIFORM = _fault("accept-at-zero-uniform")
_ACCEPT_PLACEHOLDER = _fault("accept-placeholder")
_PLACEHOLDER_AS_INDEX = _fault("placeholder-as-index")
_DRAFT_OFF_BY_ONE = _fault("draft-off-by-one")
_WRONG_DRAFT_STEP = _fault("wrong-draft-step")
_SYNTHETIC_RATES_AS_CONDITIONAL = _fault("synthetic-rates-as-conditional")
_BONUS_WRONG_ROW = _fault("bonus-wrong-row")
_GREEDY_BONUS_SAMPLED = _fault("greedy-bonus-sampled")
_SEED_COLLISION = _fault("seed-collision")
_RESIDUAL_IS_TARGET = _fault("residual-is-target")
_KEEPS_REJECTED = _fault("one-hot-residual-keeps-rejected")
_UNCLAMPED_RESIDUAL = _fault("unclamped-residual")
_RESIDUAL_NOT_NORMALIZED = _fault("residual-not-normalized")
_REUSE_UNIFORM = _fault("reuse-uniform")
_NOISE_FLOOR = _fault("noise-floor")
_OOV_LANE_WINS = _fault("oov-lane-wins")
_CONTINUE_AFTER_REJECT = _fault("continue-after-reject")
_BONUS_AFTER_REJECT = _fault("bonus-after-reject")
_RESIDUAL_WRONG_POSITION = _fault("residual-wrong-position")
_SHIFT_MARK = tl.constexpr(2.0)  # residual-wrong-position: a chain rejection's job rho (a real rho is <= 1)


def _faults_compiled_by(fn, seen: set | None = None) -> set[int]:
    """Codes of the faults with a ``FAULT == _NAME`` branch in jit function ``fn`` or in a
    module jit helper it calls (read from the source)."""
    seen = set() if seen is None else seen
    seen.add(fn)
    source = inspect.getsource(fn.fn)
    codes = {globals()[name].value for name in re.findall(r"FAULT == (_[A-Z0-9_]+)", source)}
    for name in set(re.findall(r"\b(_[a-z0-9_]+)\(", source)):
        helper = globals().get(name)
        if hasattr(helper, "fn") and helper not in seen:
            codes |= _faults_compiled_by(helper, seen)
    return codes


@functools.cache
def _planted(kernel, fault: int) -> int:
    """The FAULT constexpr for ``kernel``: ``fault`` where the kernel has a branch for it,
    else 0, so that a planted fault compiles again only the kernels it lives in."""
    return fault if fault in _faults_compiled_by(kernel) else 0


# --- noise ------------------------------------------------------------------------------------
@triton.jit
def _uniform(seed, position, stream: tl.constexpr):
    """float64 uniform keyed by (seed, position, stream): Philox words mapped to
    (k + 0.5) * 2**-52, never 0 (a zero probability never passes ``u < p``) and never 1."""
    zero = seed * 0 + position * 0  # int64, the broadcast shape
    pos = position + zero
    c1 = (pos & 0xFFFFFFFF).to(tl.uint32)
    r0, r1, _, _ = tl.philox(seed + zero, zero.to(tl.uint32), c1, (pos >> 32).to(tl.uint32), (zero + stream).to(tl.uint32))
    bits = (r0.to(tl.uint64) << 20) | (r1 >> 12).to(tl.uint64)
    return (bits.to(tl.float64) + 0.5) * _TWO_M52


@triton.jit
def _uniform_pair(seed, position, index, stream: tl.constexpr):
    """Two float64 uniforms keyed by (seed, position, index, stream), mapped as ``_uniform``'s
    (index 0 gives ``_uniform``'s first): one Philox call, its four words."""
    zero = seed * 0 + position * 0 + index * 0  # int64, the broadcast shape
    pos = position + zero
    c1 = (pos & 0xFFFFFFFF).to(tl.uint32)
    r0, r1, r2, r3 = tl.philox(seed + zero, (index + zero).to(tl.uint32), c1, (pos >> 32).to(tl.uint32), (zero + stream).to(tl.uint32))
    first = (r0.to(tl.uint64) << 20) | (r1 >> 12).to(tl.uint64)
    second = (r2.to(tl.uint64) << 20) | (r3 >> 12).to(tl.uint64)
    return (first.to(tl.float64) + 0.5) * _TWO_M52, (second.to(tl.float64) + 0.5) * _TWO_M52


# --- per-row statistics -----------------------------------------------------------------------
@triton.jit
def _inv_temperature(temp):
    """fp32 1/T; greedy rows (T = 0) use 1 (their statistics only feed the argmax)."""
    safe = tl.where(temp > 0, temp, 1.0)
    return tl.minimum(1.0 / safe, _MAX_INV_T).to(tl.float32)


@triton.jit
def _row_tile(ptrs, mask, EVICT_FIRST: tl.constexpr):
    """A statistics tile of logits as fp32 (-inf where masked). ``EVICT_FIRST``: its lines are
    L2's first to go (``eviction_policy``), so that a read-once stream keeps other lines
    resident; a hint only, the values are the same."""
    if EVICT_FIRST:
        a = tl.load(ptrs, mask=mask, other=float("-inf"), eviction_policy="evict_first")
    else:
        a = tl.load(ptrs, mask=mask, other=float("-inf"))
    return a.to(tl.float32)


@triton.jit
def _stats_step(a, m, s, best, start, scale, FAULT: tl.constexpr):
    """Fold one tile into the running max ``m``, rescaled sum ``s`` and max's tile ``best``.
    The tile's fp32 sum adds in the order of the register layout Triton gives the tile, which
    is the kernel's choice (Triton 3.8 for sm_90: beside a bf16 draft tile, an fp32 target tile
    is laid out 8 ids per thread, alone 4): the fused and staged kernels' sums can differ in
    the last bits. Exact int64 fixed-point sums removed that on an H100 (Triton 3.6), but made
    a call 4-8% slower at K = 4-8, B = 256-1024 (benchmarks/RESULTS.md#tried-and-not-kept)."""
    tile_max = tl.max(a, axis=1)
    if FAULT == _GREEDY_TIE_HIGHEST:
        best = tl.where(tile_max >= m, start, best)
    else:
        best = tl.where(tile_max > m, start, best)  # strict: the first tile holding the max
    new_m = tl.maximum(m, tile_max)
    s = s * tl.exp2((m - new_m) * scale) + tl.sum(tl.exp2((a - new_m[:, None]) * scale[:, None]), axis=1)
    return new_m, s, best


@triton.jit
def _grouped_stats_step(
    base, rows, valid, start, hi, width, m, s, best, scale, g_sum, g_tile, BLOCK_V: tl.constexpr, GROUP: tl.constexpr,
    EVICT_FIRST: tl.constexpr,
):  # fmt: skip
    """``_stats_step`` over the tile at ``start`` with its terms summed by groups of ``GROUP``
    ids first: stores the group sums relative to the running max after the tile into ``g_sum``
    [row, group], and that max and the tile's sum into ``g_tile`` [row, tile, 2]
    (``_residual_candidates`` reads them). The tile's sum adds its group sums, another order
    than ``_stats_step``'s. Storing a [rows, groups] tensor per tile makes Triton 3.6's ptxas
    give the kernel 96 registers where 48 suffice: the fused path caps it
    (``_STATS_MAX_REGISTERS``)."""
    g = start // GROUP + tl.arange(0, BLOCK_V // GROUP)[None, :]
    cols = start + tl.arange(0, BLOCK_V)[None, :]
    a = _row_tile(base + cols, valid[:, None] & (cols < hi), EVICT_FIRST)
    tile_max = tl.max(a, axis=1)
    best = tl.where(tile_max > m, start, best)  # strict: the first tile holding the max
    new_m = tl.maximum(m, tile_max)
    terms = tl.exp2((a - new_m[:, None]) * scale[:, None])
    sums = tl.sum(tl.reshape(terms, [terms.shape[0], BLOCK_V // GROUP, GROUP]), axis=2)
    tile_sum = tl.sum(sums, axis=1)
    at = rows.to(tl.int64)
    tl.store(g_sum + at[:, None] * tl.cdiv(width, GROUP) + g, sums, mask=valid[:, None] & (g < tl.cdiv(width, GROUP)))
    tile = (at * tl.cdiv(width, BLOCK_V) + start // BLOCK_V) * 2
    tl.store(g_tile + tile, new_m, mask=valid)
    tl.store(g_tile + tile + 1, tile_sum, mask=valid)
    return new_m, s * tl.exp2((m - new_m) * scale) + tile_sum, best


@triton.jit
def _split_argmax(base, best, hi, m, need, BLOCK_V: tl.constexpr, FAULT: tl.constexpr):
    """The lowest id holding the max ``m`` in the tile at ``best`` (below ``hi``) of the rows
    ``need`` selects, by reading that tile again; ``_NO_ID`` for the other rows. Only a point
    mass's token uses an argmax, and only a greedy row's statistics give one (a degenerate
    row's token is 0, ``_store_final``): skipping the read for sampled rows saves a tile's
    round trip per split at B = 1 and its bytes at large batches."""
    arg = tl.zeros_like(best) + _NO_ID
    if tl.max(need.to(tl.int32), axis=0) > 0:
        cols = best[:, None] + tl.arange(0, BLOCK_V)[None, :]
        a = tl.load(base + cols, mask=need[:, None] & (cols < hi), other=float("-inf")).to(tl.float32)
        if FAULT == _GREEDY_TIE_HIGHEST:
            arg = tl.where(need, tl.max(tl.where(a == m[:, None], cols, -1), axis=1), arg)
        else:
            arg = tl.where(need, tl.min(tl.where(a == m[:, None], cols, _NO_ID), axis=1), arg)  # lowest id among the maxima
    return arg


@triton.jit(do_not_specialize=["n_rows"])
def _stats_kernel(
    logits, stride, width, n_rows, row_req, temperature,
    out_m, out_s, out_arg, out_nan, g_sum, g_tile,
    split_len, NSPLIT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, FAULT: tl.constexpr, GROUP: tl.constexpr,
):  # fmt: skip
    """Max, sum of exp((a - max) / T), argmax and NaN flag of ``BLOCK_R`` rows over one split.

    The loop keeps a running max and rescaled sum (one exp2 per logit; a NaN logit makes
    the sum NaN) and remembers the tile where the max last grew; the argmax (lowest id) is
    found by reading that one tile again at the end, not by an argmax per tile, and only for
    greedy rows (``_split_argmax``). Full tiles load without a column mask (the loop is bound
    by the exp2 and the loads).
    """
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    split = tl.program_id(1)
    valid = rows < n_rows
    req = tl.load(row_req + rows, mask=valid, other=0)
    temp = tl.load(temperature + req, mask=valid, other=1.0)
    scale = _inv_temperature(temp) * _LOG2E
    need_arg = valid & (temp == 0)
    if FAULT == _CONTINUE_AFTER_REJECT:
        need_arg = valid  # the fault fills a rejected slot with the row's argmax, sampled rows too
    _split_stats(
        logits, stride, width, rows, valid, need_arg, scale, split, split_len, out_m, out_s, out_arg, out_nan, g_sum, g_tile,
        NSPLIT, BLOCK_R, BLOCK_V, FAULT, GROUP, False,
    )  # fmt: skip


@triton.jit
def _split_stats(
    logits, stride, width, rows, valid, need_arg, scale, split, split_len, out_m, out_s, out_arg, out_nan, g_sum, g_tile,
    NSPLIT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, FAULT: tl.constexpr, GROUP: tl.constexpr,
    EVICT_FIRST: tl.constexpr,
):  # fmt: skip
    """One split of the given rows (one per lane; ``scale`` log2(e) / T): the tile loop of
    ``_stats_step``, the argmax of the rows ``need_arg`` selects (``_split_argmax``), then
    final statistics (one split) or the split's partials; with ``GROUP`` > 0 also each tile's
    group sums (``_grouped_stats_step``: a target row's, for residual candidates); the tiles
    loaded with ``EVICT_FIRST`` (``_row_tile``). ``_stats_kernel`` and the fused statistics kernel."""
    lo = split * split_len
    hi = tl.minimum(lo + split_len, width)
    full = lo + (hi - lo) // BLOCK_V * BLOCK_V
    base = logits + rows.to(tl.int64)[:, None] * stride
    m = tl.full([BLOCK_R], _LOWEST, tl.float32)
    s = tl.zeros([BLOCK_R], tl.float32)
    best = tl.zeros([BLOCK_R], tl.int32) + lo
    if GROUP > 0:
        for start in range(lo, hi, BLOCK_V):
            m, s, best = _grouped_stats_step(
                base, rows, valid, start, hi, width, m, s, best, scale, g_sum, g_tile, BLOCK_V, GROUP, EVICT_FIRST
            )
    else:
        for start in range(lo, full, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)[None, :]
            a = _row_tile(base + cols, valid[:, None], EVICT_FIRST)
            m, s, best = _stats_step(a, m, s, best, start, scale, FAULT)
        if full < hi:
            cols = full + tl.arange(0, BLOCK_V)[None, :]
            a = _row_tile(base + cols, valid[:, None] & (cols < hi), EVICT_FIRST)
            m, s, best = _stats_step(a, m, s, best, full, scale, FAULT)
    arg = _split_argmax(base, best, hi, m, need_arg, BLOCK_V, FAULT)
    nan = (s != s).to(tl.int32)
    if NSPLIT == 1:
        _store_final(rows, valid, m, s, arg, nan, out_m, out_s, out_arg, out_nan, FAULT)
    else:
        part = rows * NSPLIT + split
        tl.store(out_m + part, m, mask=valid)
        tl.store(out_s + part, s, mask=valid)
        tl.store(out_arg + part, arg, mask=valid)
        tl.store(out_nan + part, nan, mask=valid)


@triton.jit
def _store_final(rows, valid, m, s, arg, nan, out_m, out_logs, out_arg, out_bad, FAULT: tl.constexpr):
    """Final row statistics; a row with a NaN or no finite logit (s = 0) is degenerate (token 0)."""
    bad = (nan != 0) | (s == 0)
    tl.store(out_m + rows, m, mask=valid)
    tl.store(out_logs + rows, tl.log(s), mask=valid)
    if FAULT == _NAN_ROW_OUT_OF_VOCAB:  # a NaN max matches no lane: the search's not-found id
        tl.store(out_arg + rows, tl.where(nan != 0, _NO_ID, tl.where(bad, 0, arg)), mask=valid)
    else:
        tl.store(out_arg + rows, tl.where(bad, 0, arg), mask=valid)
    tl.store(out_bad + rows, bad.to(tl.int8), mask=valid)


@triton.jit
def _merge_splits(parts_m, parts_s, parts_arg, parts_nan, scale, FAULT: tl.constexpr):
    """Merge per-split statistics along the last axis (a split past the last: max _LOWEST,
    sum 0): the max, the sum of every split's sum rescaled to it, the argmax of the first
    split holding the max (lowest id wins ties) and the NaN flag. One reduction per field,
    not a step per split (a chain of dependent reductions on the small-batch critical path).
    The rescaled fp32 terms add in fp64: on an H100 the staged ``_combine_kernel`` and the fused
    chain kernel gave the same bits from the same partials (docs/verification-results.md)."""
    axis: tl.constexpr = len(parts_m.shape) - 1
    sp = tl.arange(0, parts_m.shape[axis])
    m = tl.max(parts_m, axis=axis)
    terms = parts_s * tl.exp2((parts_m - tl.expand_dims(m, axis)) * tl.expand_dims(scale, axis))
    s = tl.sum(terms.to(tl.float64), axis=axis).to(tl.float32)
    hit = (parts_m == tl.expand_dims(m, axis)) & (parts_s > 0)
    if FAULT == _GREEDY_TIE_HIGHEST:
        first = tl.max(tl.where(hit, sp, -1), axis=axis)
    else:
        first = tl.min(tl.where(hit, sp, _NO_ID), axis=axis)
    arg = tl.sum(tl.where(sp == tl.expand_dims(first, axis), parts_arg, 0), axis=axis)
    return m, s, arg, tl.max(parts_nan, axis=axis)


@triton.jit
def _combine_rows(
    part_m, part_s, part_arg, part_nan, rows, mask, scale, out_m, out_logs, out_arg, out_bad,
    NSPLIT: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """Load the ``NSPLIT`` partials of ``rows`` (any shape; ``scale`` of the same shape), merge
    them (``_merge_splits``) and store the final statistics (``_store_final``): the staged
    ``_combine_kernel`` and the fused chain kernel's ``_finalize`` (partials in float64).
    Returns the merged max, sum, argmax and NaN flag."""
    axis: tl.constexpr = len(rows.shape)
    sp = tl.arange(0, triton.next_power_of_2(NSPLIT))
    part = tl.expand_dims(rows * NSPLIT, axis) + sp
    pmask = tl.expand_dims(mask, axis) & (sp < NSPLIT)
    m, s, arg, nan = _merge_splits(
        tl.load(part_m + part, mask=pmask, other=_LOWEST).to(tl.float32),
        tl.load(part_s + part, mask=pmask, other=0.0).to(tl.float32),
        tl.load(part_arg + part, mask=pmask, other=0).to(tl.int32),
        tl.load(part_nan + part, mask=pmask, other=0).to(tl.int32),
        scale,
        FAULT,
    )
    _store_final(rows, mask, m, s, arg, nan, out_m, out_logs, out_arg, out_bad, FAULT)
    return m, s, arg, nan


@triton.jit(do_not_specialize=["n_rows"])
def _combine_kernel(
    n_rows, row_req, temperature, part_m, part_s, part_arg, part_nan,
    out_m, out_logs, out_arg, out_bad, NSPLIT: tl.constexpr, BLOCK_R: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """Merge the vocabulary splits of ``_stats_kernel`` (``_merge_splits``: lowest id wins ties)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    valid = rows < n_rows
    req = tl.load(row_req + rows, mask=valid, other=0)
    scale = _inv_temperature(tl.load(temperature + req, mask=valid, other=1.0)) * _LOG2E
    _combine_rows(part_m, part_s, part_arg, part_nan, rows, valid, scale, out_m, out_logs, out_arg, out_bad, NSPLIT, FAULT)


@triton.jit
def _row_point(s_arg, s_bad, row, greedy, mask):
    """Whether a row is a point mass (greedy or degenerate) and on which token."""
    bad = tl.load(s_bad + row, mask=mask, other=0) != 0
    return greedy | bad, tl.load(s_arg + row, mask=mask, other=0).to(tl.int64)


@triton.jit
def _logprob(logits, stride, width, s_m, s_logs, s_arg, s_bad, row, x, inv_t, greedy, mask):
    """log p(x) of one row per lane; ids outside the row's vocabulary have probability 0."""
    point, pt = _row_point(s_arg, s_bad, row, greedy, mask)
    inside = mask & (x >= 0) & (x < width)
    a = tl.load(logits + row.to(tl.int64) * stride + x, mask=inside, other=float("-inf")).to(tl.float32)
    m = tl.load(s_m + row, mask=mask, other=0.0)
    logs = tl.load(s_logs + row, mask=mask, other=0.0)
    lp = tl.where(inside, (a - m) * inv_t - logs, float("-inf"))
    return tl.where(point, tl.where(x == pt, 0.0, float("-inf")), lp)


# --- jobs: draws and residual masses over one row ---------------------------------------------
@triton.jit
def _load_job(job_trow, job_req, job_rho, jobs, mask, drafts, d_bad, HAS_DRAFT: tl.constexpr, FAULT: tl.constexpr):
    """A job draws from (or sums) one target row: rho < 0 is the target row itself, rho >= 0
    the residual max(rho * target - draft, 0) against the draft at the same position (the
    draft row when given and not degenerate, else the one-hot of ``excl``)."""
    trow = tl.load(job_trow + jobs, mask=mask, other=-1)
    active = mask & (trow >= 0)
    req = tl.load(job_req + jobs, mask=active, other=0)
    rho = tl.load(job_rho + jobs, mask=active, other=-1.0)
    resid = active & (rho >= 0)
    drow = trow - req  # draft row of target row ``row_start + k`` is ``cu[req] + k``
    if FAULT == _RESIDUAL_WRONG_POSITION:  # a marked job weighs the next target row against this draft
        shifted = resid & (rho == _SHIFT_MARK)
        rho = tl.where(shifted, 1.0, rho)
        trow = tl.where(shifted, trow + 1, trow)
    if HAS_DRAFT:
        dbad = tl.load(d_bad + drow, mask=resid, other=0) != 0
        use_draft = resid & ~dbad
        excl = tl.where(resid & dbad, 0, -1).to(tl.int64)[:, None]  # degenerate draft: one-hot on 0
    else:
        use_draft = resid & False
        # loaded as a column: Triton 3.6 miscompiles this load when it is expanded later
        excl = tl.load(drafts + drow[:, None], mask=resid[:, None], other=-1)
        if FAULT == _KEEPS_REJECTED:
            excl = excl * 0 - 1
    return trow, req, rho, active, resid, drow, use_draft, excl


@triton.jit
def _target_tile(t_logits, t_stride, trow, active, cols, in_range, need_max):
    """A draw's target tile (fp32, -inf off-row) and each row's tile max: 0 unless a lane of
    ``need_max`` (a target-row draw) needs it, else at least ``_LOWEST`` (an empty tile)."""
    # evict_first: this is the last full read of the draw's rows (a rejected row's second, after the
    # statistics), so they should not push other lines out of L2: 1.5-2.5% less time at
    # B = 256-1024, K = 1 on the fused path on an H100.
    a = tl.load(t_logits + trow.to(tl.int64) * t_stride + cols, mask=active & in_range, other=float("-inf"), eviction_policy="evict_first")
    a = a.to(tl.float32)
    tile_m = tl.zeros([a.shape[0], 1], tl.float32)
    if tl.max(need_max.to(tl.int32)) > 0:
        tile_m = tl.maximum(tl.max(a, axis=1), _LOWEST)[:, None]
    return a, tile_m


@triton.jit
def _tile_weights(
    t_logits, t_stride, d_logits, d_stride, d_width, trow, drow, m, logs2, dm, dlogs2, scale,
    rho, active, resid, use_draft, excl, cols, in_range, HAS_DRAFT: tl.constexpr, FAULT: tl.constexpr, SCAN: tl.constexpr,
):  # fmt: skip
    """Target weights ``t``, job weights ``w`` of a [rows, cols] tile (0 off-row) and each row's
    tile max (``_LOWEST`` for an empty tile). ``scale`` is log2(e) / T. A residual row
    (``resid``) weighs normalized probabilities, ``logs2`` being the row's log2 normalizer: p =
    2**((a - m) scale - logs2). A target-row draw weighs relative to the tile's own max,
    2**((a - tile max) scale): it needs no row statistics (the fused path has none for a
    request's last row) and its tile masses are rescaled to the row's max when drawn
    (``_target_tile_masses``). ``SCAN``: the draw's final scan (where the unclamped-residual fault lives)."""
    a, tile_m = _target_tile(t_logits, t_stride, trow, active, cols, in_range, active & ~resid)
    t = tl.exp2((a - tl.where(resid, m, tile_m)) * scale - tl.where(resid, logs2, 0.0))
    q = tl.zeros_like(t)
    if HAS_DRAFT:
        dmask = use_draft & in_range & (cols < d_width)
        b = tl.load(d_logits + drow.to(tl.int64) * d_stride + cols, mask=dmask, other=float("-inf"), eviction_policy="evict_first")
        q = tl.exp2((b.to(tl.float32) - dm) * scale - dlogs2)
        if FAULT == _DRAFT_BEFORE_TEMPERATURE:
            q = tl.exp2((b.to(tl.float32) - dm) * _LOG2E - dlogs2)
    w = tl.where(resid, tl.maximum(rho * t - q, 0.0), t)
    if FAULT == _RESIDUAL_IS_TARGET:
        w = t
    if FAULT == _UNCLAMPED_RESIDUAL:
        if SCAN:
            w = tl.where(resid, rho * t - q, t)
    return tl.where(resid & (cols == excl), 0.0, w), t, tile_m


@triton.jit
def _target_tile_weights(t_logits, t_stride, trow, scale, active, cols, in_range):
    """``_tile_weights`` where no lane is a residual: the target-row draw's weights
    2**((a - tile max) scale) and each row's tile max, the same values (0 for an inactive lane)."""
    a, tile_m = _target_tile(t_logits, t_stride, trow, active, cols, in_range, active)
    return tl.exp2((a - tile_m) * scale), tile_m


@triton.jit
def _job_rows(
    job_trow, job_req, job_rho, n_jobs, temperature, drafts,
    t_m, t_logs, d_m, d_logs, d_bad, HAS_DRAFT: tl.constexpr, BLOCK_R: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """Per-lane inputs of ``BLOCK_R`` jobs, as [BLOCK_R, 1] columns."""
    jobs = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    trow, req, rho, active, resid, drow, use_draft, excl = _load_job(
        job_trow, job_req, job_rho, jobs, jobs < n_jobs, drafts, d_bad, HAS_DRAFT, FAULT
    )
    scale = _inv_temperature(tl.load(temperature + req, mask=active, other=1.0)) * _LOG2E
    m = tl.load(t_m + trow, mask=active, other=0.0)
    logs2 = tl.load(t_logs + trow, mask=active, other=0.0) * _LOG2E
    dm = tl.load(d_m + drow, mask=use_draft, other=0.0)
    dlogs2 = tl.load(d_logs + drow, mask=use_draft, other=0.0) * _LOG2E
    return (
        jobs, req, active, trow, trow[:, None], drow[:, None], m[:, None], logs2[:, None], dm[:, None], dlogs2[:, None],
        scale[:, None], rho[:, None], active[:, None], resid[:, None], use_draft[:, None], excl,
    )  # fmt: skip


@triton.jit(do_not_specialize=["n_jobs"])
def _mass_kernel(
    t_logits, t_stride, V, d_logits, d_stride, Vd, t_m, t_logs, d_m, d_logs, d_bad,
    job_trow, job_req, job_rho, n_jobs, temperature, drafts, out_w, out_t, split_len, n_tiles,
    HAS_DRAFT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """Sums of each job's weights and of its target row over every vocabulary tile of one
    split: the block residual masses, and the tile masses that a draw picks its tile from."""
    jobs, req, act, trow1, trow, drow, m, logs2, dm, dlogs2, scale, rho, active, resid, use_draft, excl = _job_rows(
        job_trow, job_req, job_rho, n_jobs, temperature, drafts, t_m, t_logs, d_m, d_logs, d_bad, HAS_DRAFT, BLOCK_R, FAULT
    )
    _split_tile_masses(
        t_logits, t_stride, V, d_logits, d_stride, Vd, trow, drow, m, logs2, dm, dlogs2, scale, rho, active, resid,
        use_draft, excl, jobs < n_jobs, tl.program_id(1), split_len, out_w + jobs * n_tiles, out_t + jobs * n_tiles,
        HAS_DRAFT, FAULT, BLOCK_V,
    )  # fmt: skip


@triton.jit
def _split_tile_masses(
    t_logits, t_stride, V, d_logits, d_stride, Vd, trow, drow, m, logs2, dm, dlogs2, scale, rho, active, resid,
    use_draft, excl, mask, split, split_len, out_w, out_t, HAS_DRAFT: tl.constexpr, FAULT: tl.constexpr,
    BLOCK_V: tl.constexpr,
):  # fmt: skip
    """Each job's weight sum over every tile of one split into ``out_w``, and into ``out_t``
    the residual's target-row sum (its fallback when the residual is empty) or a target-row
    draw's tile max (``_tile_weights``; each lane's first tile). Summed in fp64: a token 1e-12
    below its tile mates keeps its exact slice of the CDF (in fp32 its weight would vanish from
    the tile's mass and shift the slices after it)."""
    lo = split * split_len
    hi = tl.minimum(lo + split_len, V)
    if tl.max(resid.to(tl.int32)) == 0:
        # Target-row draws only (a bonus row: at K = 1 most of what the masses read): the same
        # sums without a residual's draft tile, second exp2 and selects, half the instructions
        # of a tile (216 against about 436 for sm_90). The mass kernel was bound by their issue
        # as much as by its loads: a call at B = 256, K = 1 took 2.6 us less on an H100 and
        # 6.6 us less on an H200, whose bandwidth does not shorten issue time.
        for start in range(lo, hi, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)[None, :]
            t, tile_m = _target_tile_weights(t_logits, t_stride, trow, scale, active, cols, cols < hi)
            tl.store(out_w + start // BLOCK_V, tl.sum(t.to(tl.float64), axis=1), mask=mask)
            tl.store(out_t + start // BLOCK_V, tl.sum(tile_m.to(tl.float64), axis=1), mask=mask)
    else:
        for start in range(lo, hi, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)[None, :]
            w, t, tile_m = _tile_weights(
                t_logits, t_stride, d_logits, d_stride, Vd, trow, drow, m, logs2, dm, dlogs2, scale,
                rho, active, resid, use_draft, excl, cols, cols < hi, HAS_DRAFT, FAULT, False,
            )  # fmt: skip
            tl.store(out_w + start // BLOCK_V, tl.sum(w.to(tl.float64), axis=1), mask=mask)
            # A residual's target sum; a target-row draw's tile max.
            second = tl.where(resid, tl.sum(t.to(tl.float64), axis=1)[:, None], tile_m.to(tl.float64))
            tl.store(out_t + start // BLOCK_V, tl.sum(second, axis=1), mask=mask)


@triton.jit
def _tile_total(mass, n_tiles, mask, CHUNK: tl.constexpr):
    """fp64 sum of each lane's ``n_tiles`` tile masses (``mass``: each lane's first), CHUNK at a
    time (``_block_kernel``: 64 requests per program, too many for ``_tile_masses``' one load)."""
    total = tl.zeros(mask.shape, tl.float64)
    for c in range(0, n_tiles, CHUNK):
        total += tl.sum(_tile_masses(mass + c, n_tiles - c, mask, CHUNK), axis=1)
    return total


@triton.jit
def _tile_masses(mass, n_tiles, mask, NT: tl.constexpr):
    """Each lane's ``n_tiles`` tile masses (``mass``: each lane's first) as one [lanes, NT]
    tile, NT >= n_tiles (0 past them): at most 128 per lane on CUDA (V <= 262,144)."""
    idx = tl.arange(0, NT)[None, :]
    return tl.load(mass[:, None] + idx, mask=mask[:, None] & (idx < n_tiles), other=0.0)


@triton.jit
def _target_tile_masses(sums, maxima, n_tiles, scale):
    """A target-row draw's tile masses ([lanes, NT] fp64, 0 past ``n_tiles``) from each tile's
    weight sum relative to its own max: sum * 2**((tile max - row max) * scale) (``scale``
    [lanes, 1]). Also each lane's row max, whether the row is degenerate (a NaN, or no
    finite logit: ``_store_final``'s flag), and the first tile holding the max (the argmax's)."""
    idx = tl.arange(0, sums.shape[1])[None, :]
    live = idx < n_tiles
    tile_m = tl.where(live, maxima, _LOWEST).to(tl.float32)
    row_m = tl.max(tile_m, axis=1)
    factor = tl.exp2((tile_m - row_m[:, None]) * scale).to(tl.float64)
    masses = tl.where(live, sums * factor, 0.0)
    bad = (tl.max((sums != sums).to(tl.int32), axis=1) != 0) | (tl.sum(masses, axis=1) == 0)
    first = tl.min(tl.where(live & (tile_m == row_m[:, None]) & (sums > 0), idx, _NO_ID), axis=1)
    return masses, row_m, bad, first


@triton.jit
def _choose_tile(mass, threshold):
    """The first item along the last axis of ``mass`` ([lanes, X] tiles, or [lanes, N, X]
    groups, N candidates) whose running mass passes ``threshold`` (one per row of ``mass``:
    [lanes], or [lanes, N]), and the fraction of that item's mass still below it. Rounding
    past the total: the last item of positive mass, fraction 1 (no such item, as in a
    degenerate row nobody keeps: item 0)."""
    axis: tl.constexpr = len(mass.shape) - 1
    idx = tl.arange(0, mass.shape[axis])  # broadcast along the leading axes
    running = tl.cumsum(mass, axis=axis)
    first = tl.min(tl.where((mass > 0) & (running > tl.expand_dims(threshold, axis)), idx, _NO_ID), axis=axis)
    found = first != _NO_ID
    item = tl.maximum(tl.where(found, first, tl.max(tl.where(mass > 0, idx, -1), axis=axis)), 0)
    at = idx == tl.expand_dims(item, axis)
    mass_at = tl.sum(tl.where(at, mass, 0.0), axis=axis)
    below = tl.sum(tl.where(at, running, 0.0), axis=axis) - mass_at
    frac = tl.where(found, (threshold - below) / tl.where(mass_at > 0, mass_at, 1.0), 1.0)
    return item, tl.minimum(frac, 1.0)


@triton.jit
def _draw_in_tile(
    t_logits, t_stride, V, d_logits, d_stride, Vd, trow, drow, m, logs2, dm, dlogs2, scale, rho, active, weigh,
    use_draft, excl, lo, frac, HAS_DRAFT: tl.constexpr, FAULT: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """The inverse-CDF draw inside the tile starting at ``lo`` (one per lane): the first
    token whose fp64 running weight passes ``frac`` of the tile's own fp64 weight. Returns
    the token (int64); the tile's last positive token when rounding runs past its end."""
    cols = lo + tl.arange(0, BLOCK_V)[None, :]
    w, _, _ = _tile_weights(
        t_logits, t_stride, d_logits, d_stride, Vd, trow, drow, m, logs2, dm, dlogs2, scale,
        rho, active, weigh, use_draft, excl, cols, cols < V, HAS_DRAFT, FAULT, False,
    )  # fmt: skip
    scan = w
    if FAULT == _UNCLAMPED_RESIDUAL:
        scan, _, _ = _tile_weights(
            t_logits, t_stride, d_logits, d_stride, Vd, trow, drow, m, logs2, dm, dlogs2, scale,
            rho, active, weigh, use_draft, excl, cols, cols < V, HAS_DRAFT, FAULT, True,
        )  # fmt: skip
    left = (frac * tl.sum(w.to(tl.float64), axis=1))[:, None]
    passed = (tl.cumsum(scan.to(tl.float64), axis=1) > left) & (scan > 0)
    token = tl.min(tl.where(passed, cols, _NO_ID), axis=1)
    last = tl.max(tl.where(scan > 0, cols, -1), axis=1)
    return tl.where(token == _NO_ID, last, token).to(tl.int64)  # rounding at the tile's end


@triton.jit
def _job_tile_masses(mass_w, mass_t, n_tiles, act, resid, scale, NT: tl.constexpr):
    """The tile masses a job draws from, one job per lane (``mass_w`` / ``mass_t``: each lane's
    ``n_tiles`` sums as ``_split_tile_masses`` stored them): a residual's, the target row's
    where the residual is empty, a target-row draw's rescaled to its row max
    (``_target_tile_masses``). Returns them with whether the residual had weight, and the
    target row's max, degenerate flag and first tile holding the max."""
    tile_w = _tile_masses(mass_w, n_tiles, act, NT)
    second = _tile_masses(mass_t, n_tiles, act, NT)
    use_w = tl.sum(tile_w, axis=1) > 0  # else the residual is empty: fall back to the target row
    target, row_m, bad, first = _target_tile_masses(tile_w, second, n_tiles, scale)
    return tl.where(resid, tl.where(use_w[:, None], tile_w, second), target), use_w, row_m, bad, first


@triton.jit
def _draw_from_masses(
    t_logits, t_stride, V, d_logits, d_stride, Vd, trow, drow, m, logs2, dm, dlogs2, scale, rho, active, resid,
    use_draft, excl, tiles, use_w, u, HAS_DRAFT: tl.constexpr, FAULT: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """Inverse CDF in two steps, one job per lane, from its tile masses (``_job_tile_masses``):
    the tile whose running mass passes ``u * total``, then, inside it, the first id whose fp64
    running sum passes the same fraction of the tile's own fp64 sum. Returns the token (int64)."""
    threshold = u * tl.sum(tiles, axis=1)
    if FAULT == _RESIDUAL_NOT_NORMALIZED:
        threshold = tl.where(tl.max(resid.to(tl.int32), axis=1) != 0, u, threshold)
    tile, frac = _choose_tile(tiles, threshold)
    return _draw_in_tile(
        t_logits, t_stride, V, d_logits, d_stride, Vd, trow, drow, m, logs2, dm, dlogs2, scale, rho, active,
        resid & use_w[:, None], use_draft, excl, (tile * BLOCK_V)[:, None], frac, HAS_DRAFT, FAULT, BLOCK_V,
    )  # fmt: skip


@triton.jit
def _draw_from_tiles(
    t_logits, t_stride, V, d_logits, d_stride, Vd, trow, drow, m, logs2, dm, dlogs2, scale, rho, active, resid,
    use_draft, excl, act, mass_w, mass_t, u, n_tiles, HAS_DRAFT: tl.constexpr, FAULT: tl.constexpr, NT: tl.constexpr,
    BLOCK_V: tl.constexpr,
):  # fmt: skip
    """``_draw_from_masses`` from the masses ``_split_tile_masses`` stored at ``mass_w`` /
    ``mass_t`` (an empty residual draws from the target row). Returns (token int64, whether
    the residual had weight)."""
    tiles, use_w, _, _, _ = _job_tile_masses(mass_w, mass_t, n_tiles, act, resid, scale, NT)
    token = _draw_from_masses(
        t_logits, t_stride, V, d_logits, d_stride, Vd, trow, drow, m, logs2, dm, dlogs2, scale, rho, active, resid,
        use_draft, excl, tiles, use_w, u, HAS_DRAFT, FAULT, BLOCK_V,
    )  # fmt: skip
    return token, use_w


# --- residual candidates: a rejected draft's replacement without a second read of its rows ----------
@triton.jit
def _residual_candidates(
    t_logits, t_stride, V, d_logits, d_stride, Vd, g_sum, g_tile, tile_width, trow, drow, m, logs2, dm, dlogs2, scale,
    rho, use_draft, excl, act, seed, pos,
    HAS_DRAFT: tl.constexpr, N: tl.constexpr, GROUP: tl.constexpr, NTP: tl.constexpr, GPT: tl.constexpr,
):  # fmt: skip
    """A residual draw by rejection from the target row, one per active lane ([lanes, 1]
    columns as ``_job`` gives them; ``seed`` and ``pos`` too): N candidates y ~ target, each by
    inverse CDF in three steps from what the statistics stored (``_grouped_stats_step``): a
    statistics tile by its sum, a group of ``GROUP`` ids in it by the group sums, then an id in
    the group, whose ``GROUP`` target and draft logits are the only ones read. Candidate y is
    kept with probability max(rho t(y) - q(y), 0) / t(y) (its own uniform): the residual is at
    most the target, so the first kept has the residual's law exactly. -1 where none was kept:
    the caller then draws from the residual's masses over the whole row, whose law is the
    same. Candidate i's two uniforms: (seed, position, i, stream CANDIDATE). ``NTP`` >= the
    row's tiles, ``GPT`` = groups per tile (``_candidate_plan``)."""
    grow = trow.to(tl.int64)
    n_tiles = tl.cdiv(V, tile_width)
    ti = tl.arange(0, NTP)[None, :]
    live = act & (ti < n_tiles)
    tile = (grow * n_tiles + ti) * 2
    ref = tl.load(g_tile + tile, mask=live, other=0.0)
    tiles = tl.where(live, tl.load(g_tile + tile + 1, mask=live, other=0.0).to(tl.float64) * tl.exp2((ref - m) * scale).to(tl.float64), 0.0)
    ci = tl.arange(0, N)[None, :]
    u, v = _uniform_pair(seed, pos, ci, _CANDIDATE)  # [lanes, N]: where, and whether kept
    picked, frac = _choose_tile(tiles[:, None, :], u * tl.sum(tiles, axis=1)[:, None])
    # The groups of the picked tile share its reference max: their sums are its relative masses.
    groups = picked[:, :, None] * GPT + tl.arange(0, GPT)[None, None, :]
    gmask = act[:, :, None] & (groups < tl.cdiv(V, GROUP))
    masses = tl.load(g_sum + grow[:, :, None] * tl.cdiv(V, GROUP) + groups, mask=gmask, other=0.0).to(tl.float64)
    group, frac = _choose_tile(masses, frac * tl.sum(masses, axis=2))
    # Inside the group, ``_tile_weights``' residual weights w and normalized target weights t.
    cols = (picked * GPT + group)[:, :, None] * GROUP + tl.arange(0, GROUP)[None, None, :]
    scale = scale[:, :, None]
    a = tl.load(t_logits + grow[:, :, None] * t_stride + cols, mask=act[:, :, None] & (cols < V), other=float("-inf"))
    t = tl.exp2((a.to(tl.float32) - m[:, :, None]) * scale - logs2[:, :, None])
    q = tl.zeros_like(t)
    if HAS_DRAFT:
        dmask = use_draft[:, :, None] & (cols < Vd)
        b = tl.load(d_logits + drow.to(tl.int64)[:, :, None] * d_stride + cols, mask=dmask, other=float("-inf"))
        q = tl.exp2((b.to(tl.float32) - dm[:, :, None]) * scale - dlogs2[:, :, None])
    w = tl.where(cols == excl[:, :, None], 0.0, tl.maximum(rho[:, :, None] * t - q, 0.0))
    t64 = t.to(tl.float64)
    passed = (tl.cumsum(t64, axis=2) > (frac * tl.sum(t64, axis=2))[:, :, None]) & (t > 0)
    y = tl.min(tl.where(passed, cols, _NO_ID), axis=2)
    y = tl.where(y == _NO_ID, tl.max(tl.where(t > 0, cols, -1), axis=2), y)  # rounding at the group's end
    at = cols == y[:, :, None]
    t_y = tl.sum(tl.where(at, t, 0.0), axis=2).to(tl.float64)
    w_y = tl.sum(tl.where(at, w, 0.0), axis=2).to(tl.float64)
    first = tl.min(tl.where(act & (y >= 0) & (v * t_y < w_y), ci, N), axis=1)
    token = tl.sum(tl.where(ci == first[:, None], y, 0), axis=1).to(tl.int64)
    return tl.where(first < N, token, -1)


@triton.jit(do_not_specialize=["n_jobs", "K"])
def _candidate_kernel(
    t_logits, t_stride, V, d_logits, d_stride, Vd, t_m, t_logs, d_m, d_logs, d_bad,
    job_trow, job_req, job_rho, n_jobs, temperature, seeds, positions, drafts, methods, g_sum, g_tile, tile_width,
    out, emitted, K, HAS_DRAFT: tl.constexpr, N: tl.constexpr, GROUP: tl.constexpr, NTP: tl.constexpr,
    GPT: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """The staged path's residual candidates (``_residual_candidates``): each request's final
    job that replaces a rejected draft of a chain method (not block verification's, whose
    stop needs its row's masses anyway) writes the kept candidate into the request's last
    slot and leaves the job (``job_trow`` -1), so the mass and pick kernels skip it."""
    jobs, req, act, trow1, trow, drow, m, logs2, dm, dlogs2, scale, rho, active, resid, use_draft, excl = _job_rows(
        job_trow, job_req, job_rho, n_jobs, temperature, drafts, t_m, t_logs, d_m, d_logs, d_bad, HAS_DRAFT, BLOCK_R, 0
    )
    need = act & (tl.load(job_rho + jobs, mask=act, other=-1.0) >= 0)
    need = need & (tl.load(methods + req, mask=need, other=0).to(tl.int32) != _BLOCK)
    if tl.max(need.to(tl.int32), axis=0) > 0:
        seed = tl.load(seeds + req, mask=need, other=0)
        pos = tl.load(positions + trow1, mask=need, other=0)
        token = _residual_candidates(
            t_logits, t_stride, V, d_logits, d_stride, Vd, g_sum, g_tile, tile_width, trow, drow, m, logs2, dm, dlogs2,
            scale, rho, use_draft, excl, need[:, None], seed[:, None], pos[:, None], HAS_DRAFT, N, GROUP, NTP, GPT,
        )  # fmt: skip
        kept = need & (token >= 0)
        tl.store(out + jobs * (K + 1) + tl.load(emitted + jobs, mask=kept, other=1) - 1, token, mask=kept)
        tl.store(job_trow + jobs, -1, mask=kept)


@triton.jit(do_not_specialize=["n_jobs", "K"])
def _pick_kernel(
    t_logits, t_stride, V, d_logits, d_stride, Vd, t_m, t_logs, d_m, d_logs, d_bad,
    job_trow, job_req, job_rho, n_jobs, temperature, seeds, positions, drafts,
    mass_w, mass_t, u_given, out, emitted, K, n_tiles,
    STREAM: tl.constexpr, FINAL: tl.constexpr, GIVEN_U: tl.constexpr, HAS_DRAFT: tl.constexpr,
    NT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """Each job's token (``_draw_from_tiles``). ``FINAL``: write in the request's last slot,
    else ``out[job]``."""
    jobs, req, act, trow1, trow, drow, m, logs2, dm, dlogs2, scale, rho, active, resid, use_draft, excl = _job_rows(
        job_trow, job_req, job_rho, n_jobs, temperature, drafts, t_m, t_logs, d_m, d_logs, d_bad, HAS_DRAFT, BLOCK_R, FAULT
    )
    if GIVEN_U:
        u = tl.load(u_given + jobs, mask=act, other=0.5)
    else:
        seed = tl.load(seeds + req, mask=act, other=0)
        if FAULT == _SEED_COLLISION:
            seed = seed * 0
        pos = tl.load(positions + trow1, mask=act, other=0)
        if FAULT == _REUSE_UNIFORM:
            u = _uniform(seed, pos, _ACCEPT)
        else:
            u = _uniform(seed, pos, STREAM)
        if FAULT == _NOISE_FLOOR:
            u = ((u * 64.0).to(tl.int32).to(tl.float64) + 0.5) / 64.0
    token, use_w = _draw_from_tiles(
        t_logits, t_stride, V, d_logits, d_stride, Vd, trow, drow, m, logs2, dm, dlogs2, scale, rho, active, resid,
        use_draft, excl, act, mass_w + jobs * n_tiles, mass_t + jobs * n_tiles, u, n_tiles, HAS_DRAFT, FAULT, NT, BLOCK_V,
    )  # fmt: skip
    if FAULT == _OOV_LANE_WINS:
        lane = tl.cdiv(V, BLOCK_V) * BLOCK_V - 1  # the last tile's last lane, padded past V
        empty = (tl.load(job_rho + jobs, mask=act, other=-1.0) >= 0) & ~use_w
        token = tl.where(empty, lane, token)
    if FINAL:
        dest = out + jobs * (K + 1) + tl.load(emitted + jobs, mask=act, other=1) - 1
        if FAULT == _BONUS_AFTER_REJECT:  # a residual job's request emits one more slot: the replacement twice
            tl.store(dest - 1, token, mask=act & (tl.load(job_rho + jobs, mask=act, other=-1.0) >= 0))
    else:
        dest = out + jobs
    tl.store(dest, token, mask=act)


# --- verification -----------------------------------------------------------------------------
@triton.jit(do_not_specialize=["K", "B"])
def _chain_kernel(
    t_logits, t_stride, V, d_logits, d_stride, Vd,
    t_m, t_logs, t_arg, t_bad, d_m, d_logs, d_arg, d_bad,
    cu, temperature, seeds, positions, methods, drafts, rates, K, B,
    strict_y, tokens, emitted, fin_trow, fin_rho, rho_buf, mass_trow, mass_rho,
    HAS_DRAFT: tl.constexpr, HAS_STRICT: tl.constexpr, HAS_SYNTH: tl.constexpr, HAS_BLOCK: tl.constexpr,
    BLOCK_R: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """One lane per request, a loop over draft steps.

    Chain requests stop at their first rejection (or placeholder, or last draft); block
    requests only accumulate ``rho_i = min(rho_{i-1} * target(x)/draft(x), 1)`` here and
    flag their inner rows for ``_mass_kernel``.
    """
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    valid = r < B
    start = tl.load(cu + r, mask=valid, other=0)
    cnt = tl.load(cu + r + 1, mask=valid, other=0) - start
    row0 = start + r  # first target row of the request
    temp = tl.load(temperature + r, mask=valid, other=1.0)
    greedy = temp == 0
    inv_t = _inv_temperature(temp)
    d_inv_t = inv_t  # the draft logits' 1/T
    if FAULT == _DRAFT_BEFORE_TEMPERATURE:
        d_inv_t = tl.full([BLOCK_R], 1.0, tl.float32)
    seed = tl.load(seeds + r, mask=valid, other=0)
    if FAULT == _SEED_COLLISION:
        seed = seed * 0
    method = tl.load(methods + r, mask=valid, other=0).to(tl.int32)
    block = method == _BLOCK
    if FAULT == _BLOCK_TOKEN_WISE:
        block = valid & False
    chain = valid & ~block
    live = chain  # chain lanes still verifying
    n = tl.zeros([BLOCK_R], tl.int64)  # drafts accepted
    rejected = valid & False
    strict_token = tl.zeros([BLOCK_R], tl.int64)
    blive = valid & block
    rho = tl.full([BLOCK_R], 1.0, tl.float32)
    if FAULT == _SYNTHETIC_RATES_AS_CONDITIONAL:
        rate_product = tl.full([BLOCK_R], 1.0, tl.float64)
    width = K + 1
    for k in range(0, K):
        x = tl.load(drafts + start + k, mask=valid & (k < cnt), other=-1)  # -1: placeholder or none
        if FAULT == _PLACEHOLDER_AS_INDEX:
            x = tl.where((x < 0) & (k < cnt), x + V, x)
        act = live & (x >= 0)
        if FAULT == _ACCEPT_PLACEHOLDER:
            act = live & (k < cnt)
        bact = blive & (x >= 0)
        row = row0 + k
        both = act | bact
        vrow = row  # the target row that verifies draft k
        if FAULT == _DRAFT_OFF_BY_ONE:
            vrow = tl.where(act, row + 1, row)
        drow = start + k
        if FAULT == _WRONG_DRAFT_STEP:
            drow = tl.where(act, start, drow)
        lt = _logprob(t_logits, t_stride, V, t_m, t_logs, t_arg, t_bad, vrow, x, inv_t, greedy, both)
        lq = tl.zeros([BLOCK_R], tl.float32)
        if HAS_DRAFT:
            lq = _logprob(d_logits, d_stride, Vd, d_m, d_logs, d_arg, d_bad, drow, x, d_inv_t, greedy, both)
        pos = tl.load(positions + row, mask=both, other=0)
        u = _uniform(seed, pos, _ACCEPT)
        # standard: min(1, t/q), t/0 = inf for t > 0, 0/0 = 0; no draft row: q(x) = 1
        ok = u < tl.where(lt == float("-inf"), 0.0, tl.exp(tl.minimum(lt - lq, 0.0))).to(tl.float64)
        if FAULT == _INVERTED_RATIO:
            if HAS_DRAFT:
                ok = u < tl.where(lq == float("-inf"), 0.0, tl.exp(tl.minimum(lq - lt, 0.0))).to(tl.float64)
        if FAULT == _ACCEPT_AT_ZERO_UNIFORM:
            coarse = (u * 256.0).to(tl.int32).to(tl.float64) / 256.0
            ok = coarse <= tl.where(lt == float("-inf"), 0.0, tl.exp(tl.minimum(lt - lq, 0.0))).to(tl.float64)
        if HAS_STRICT:
            point, pt = _row_point(t_arg, t_bad, vrow, greedy, act)
            is_strict = method == _STRICT
            y = tl.where(point, pt, tl.load(strict_y + vrow, mask=act & is_strict & ~point, other=-1))
            ok = tl.where(is_strict, y == x, ok)
            strict_token = tl.where(act & is_strict, y, strict_token)
        if HAS_SYNTH:
            rate = tl.load(rates + r * K + k, mask=act & (method == _SYNTHETIC), other=0.0)
            if FAULT == _SYNTHETIC_RATES_AS_CONDITIONAL:
                rate_product = rate_product * rate
                rate = rate_product
            ok = tl.where(method == _SYNTHETIC, u < rate, ok)
        if FAULT == _ACCEPT_PLACEHOLDER:
            ok = ok | (x < 0)
        tl.store(tokens + r * width + k, x, mask=act & ok)
        n = tl.where(act & ok, k + 1, n)
        rejected = rejected | (act & ~ok)
        live = act & ok
        if FAULT == _CONTINUE_AFTER_REJECT:  # the lane goes on; the rejected slot gets the token known here
            _, fill = _row_point(t_arg, t_bad, vrow, greedy, act & ~ok)  # the argmax: a point row's replacement
            if HAS_STRICT:
                fill = tl.where(method == _STRICT, strict_token, fill)
            tl.store(tokens + r * width + k, fill, mask=act & ~ok)
            n = tl.where(act, k + 1, n)
            rejected = valid & False
            live = act
        if HAS_BLOCK:
            point, _ = _row_point(t_arg, t_bad, row, greedy, bact)
            inner = bact & (k > 0) & ~point  # draft k exists, so row k is not the last
            tl.store(mass_trow + row, row, mask=inner)
            tl.store(mass_rho + row, rho, mask=inner)
            ratio = tl.where(lt == float("-inf"), 0.0, tl.exp(lt - lq))
            rho = tl.where(bact, tl.where(rho == 0, 0.0, tl.minimum(rho * ratio, 1.0)), rho)
            tl.store(rho_buf + r * width + k + 1, rho, mask=bact)
            blive = bact
    final = row0 + n
    if FAULT == _BONUS_WRONG_ROW:
        final = tl.where(rejected, final, row0 + tl.maximum(n - 1, 0))
    if FAULT == _GREEDY_BONUS_SAMPLED:
        greedy = greedy & rejected  # a greedy bonus row is then drawn like a T = 1 row
    prow = final  # the target row of the last token
    resid_rho = 1.0
    if FAULT == _RESIDUAL_WRONG_POSITION:
        prow = tl.where(rejected, final + 1, final)  # inside the request: a rejection leaves its bonus row
        resid_rho = _SHIFT_MARK
    point, pt = _row_point(t_arg, t_bad, prow, greedy, chain)
    known = point
    token = pt
    if HAS_STRICT:
        strict_rejection = rejected & (method == _STRICT)
        known = known | strict_rejection
        token = tl.where(strict_rejection, strict_token, pt)
    tl.store(tokens + r * width + n, token, mask=chain & known)
    if FAULT == _BONUS_AFTER_REJECT:
        tl.store(tokens + r * width + n + 1, token, mask=chain & known & rejected)
        tl.store(emitted + r, n + 1 + rejected.to(tl.int64), mask=chain)
    else:
        tl.store(emitted + r, n + 1, mask=chain)
    tl.store(fin_trow + r, tl.where(known, -1, final), mask=chain)
    tl.store(fin_rho + r, tl.where(rejected, resid_rho, -1.0), mask=chain)


@triton.jit(do_not_specialize=["K", "B"])
def _block_kernel(
    d_logits, d_stride, Vd, t_arg, t_bad, d_m, d_logs, d_arg, d_bad,
    cu, temperature, seeds, positions, methods, drafts, K, B,
    mass_part, n_tiles, rho_buf, tokens, emitted, fin_trow, fin_rho,
    HAS_DRAFT: tl.constexpr, CHUNK: tl.constexpr, BLOCK_R: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """Block verification's stop: the last i with eta_i <= h_i, where
    h_i = R_i / (R_i + 1 - rho_i) (0/0 = 1) for inner i and h_d = rho_d (Sun et al. 2024)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    valid = r < B
    method = tl.load(methods + r, mask=valid, other=0).to(tl.int32)
    blk = valid & (method == _BLOCK)
    start = tl.load(cu + r, mask=blk, other=0)
    cnt = tl.load(cu + r + 1, mask=blk, other=0) - start
    row0 = start + r
    temp = tl.load(temperature + r, mask=blk, other=1.0)
    greedy = temp == 0
    inv_t = _inv_temperature(temp)
    if FAULT == _DRAFT_BEFORE_TEMPERATURE:
        inv_t = tl.full([BLOCK_R], 1.0, tl.float32)  # only the draft's probabilities use it here
    seed = tl.load(seeds + r, mask=blk, other=0)
    if FAULT == _SEED_COLLISION:
        seed = seed * 0
    width = K + 1
    n_eff = tl.zeros([BLOCK_R], tl.int64)  # drafts before the first placeholder
    alive = blk
    for k in range(0, K):
        alive = alive & (tl.load(drafts + start + k, mask=alive & (k < cnt), other=-1) >= 0)
        n_eff += alive.to(tl.int64)
    stop = tl.zeros([BLOCK_R], tl.int64)
    for i in range(1, K + 1):
        live = blk & (i <= n_eff)
        inner = live & (i < n_eff)
        rho = tl.load(rho_buf + r * width + i, mask=live, other=1.0)
        row = row0 + i
        point, pt = _row_point(t_arg, t_bad, row, greedy, inner)
        # A point-mass target row (T = 0 or degenerate): R = max(rho - draft(pt), 0).
        if HAS_DRAFT:
            q_pt = tl.exp(_logprob(d_logits, d_stride, Vd, d_m, d_logs, d_arg, d_bad, start + i, pt, inv_t, greedy, inner & point))
        else:
            q_pt = (tl.load(drafts + start + i, mask=inner & point, other=-1) == pt).to(tl.float32)
        mass = tl.where(point, tl.maximum(rho - q_pt, 0.0), 0.0).to(tl.float64)
        mass += _tile_total(mass_part + row * n_tiles, n_tiles, inner & ~point, CHUNK)
        denom = mass + 1.0 - rho
        h = tl.where(inner, tl.where(denom > 0, mass / tl.where(denom > 0, denom, 1.0), 1.0), rho)
        eta = _uniform(seed, tl.load(positions + row - 1, mask=live, other=0), _BLOCK_STREAM)
        stop = tl.where(live & (eta <= h), i, stop)
    for j in range(0, K):
        x = tl.load(drafts + start + j, mask=blk & (j < stop), other=-1)
        tl.store(tokens + r * width + j, x, mask=blk & (j < stop))
    final = row0 + stop
    point, pt = _row_point(t_arg, t_bad, final, greedy, blk)
    rho_stop = tl.load(rho_buf + r * width + stop, mask=blk, other=1.0)
    tl.store(tokens + r * width + stop, pt, mask=blk & point)
    if FAULT == _BONUS_AFTER_REJECT:
        cut = stop < n_eff
        tl.store(tokens + r * width + stop + 1, pt, mask=blk & point & cut)
        tl.store(emitted + r, stop + 1 + cut.to(tl.int64), mask=blk)
    else:
        tl.store(emitted + r, stop + 1, mask=blk)
    tl.store(fin_trow + r, tl.where(point, -1, final), mask=blk)
    tl.store(fin_rho + r, tl.where(stop == n_eff, -1.0, rho_stop), mask=blk)


@triton.jit(do_not_specialize=["K", "B"])
def _owners_kernel(cu, t_req, d_req, K, B, BLOCK_R: tl.constexpr):
    """The request of every target row (``cu[r] + r + k``, k <= d_r) and draft row (``cu[r] + k``)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    valid = r < B
    start = tl.load(cu + r, mask=valid, other=0)
    count = tl.load(cu + r + 1, mask=valid, other=0) - start
    for k in range(0, K + 1):
        tl.store(t_req + start + r + k, r.to(tl.int64), mask=valid & (k <= count))
        tl.store(d_req + start + k, r.to(tl.int64), mask=valid & (k < count))


# --- host side ----------------------------------------------------------------------------------
def _tiles(vocab: int, cuda: bool, block_v: int | None = None, splits: int | None = None) -> tuple[int, int, int, int]:
    """(BLOCK_V, BLOCK_R, NSPLIT, split_len) from the vocabulary alone, so that a request's
    reductions (hence its output) never depend on its batch mates. GPU: 2048-wide tiles, one
    split (a program's share of a row's statistics, and of the staged draw masses) per 4096
    ids: at B = 1 a program's time is its loads' latency, and at V = 152064, K = 1 the call
    took 1.08-1.10 of vLLM MRV2's time in 15 splits of five tiles, 0.97-0.99 in 38 splits,
    each read as one tile (``_stats_width``). At large batches the fused path reads several
    splits per program (``_stats_splits_per_program``; one each cost 5-7% at B = 1024,
    K >= 4) and sums masses over spans of its own (``_mass_split_len``) (H100; other tile
    policies: benchmarks/RESULTS.md#tried-and-not-kept). The interpreter pays per operation, so CPU
    tiles are large and unsplit. ``block_v`` / ``splits`` override (tests)."""
    budget = 2048 if cuda else 1 << 18  # elements per tile
    block_v = block_v or min(next_power_of_2(vocab), 2048 if cuda else 1 << 16)
    block_r = max(1, budget // block_v)
    nsplit = splits or (cdiv(vocab, 4096) if cuda else 1)
    split_len = cdiv(cdiv(vocab, nsplit), block_v) * block_v
    return block_v, block_r, cdiv(vocab, split_len), split_len


# Residual candidates (``_residual_candidates``): a rejected draft's replacement is drawn by
# rejection from the target row, reading one group of ids of the target and draft rows per
# candidate instead of both rows whole (a second read after the statistics'). With ``_CANDIDATES``
# candidates a request falls back to the residual's masses over the whole row with probability
# (1 - R)^N, R the residual's mass (the rejection's chance at that step). On an H100
# (benchmarks/RESULTS.md#residual-candidates) they took B = 256, K = 1 from 144.0 / 165.6 us to 137.1 /
# 154.0 (V = 131072 / 152064) and B = 1, K = 8, V = 152064 from 21.9 to 24.0, 21.3 once the
# candidate kernel finished a request whose candidate it kept. With 16 candidates in
# the 4-warp chain kernel instead of 8 in a one-warp kernel of their own, B = 1 took 2-3x as long;
# with candidates in the chain kernel at one warp, 64 us at B = 1, K = 8, V = 152064 (and 29.0
# against 21.6 at V = 131072, where no draft was rejected: one warp slows the chain itself).
# At V = 32000 they cost more than the row reads they save (B = 64, K = 1: 29.0 -> 35.5 us,
# slower than vLLM MRV2), so CUDA uses them from ``_CANDIDATE_MIN_VOCAB_CUDA`` ids on.
_CANDIDATES = 8
_GROUP = 64  # ids per group
_CANDIDATE_MIN_VOCAB_CUDA = 65536


def candidates_for(vocab: int, cuda: bool) -> int:
    """Residual candidates per rejection of a request of ``vocab`` ids (0: none): a request's
    output depends on its vocabulary and its own inputs, never on its batch mates."""
    return _CANDIDATES if not cuda or vocab >= _CANDIDATE_MIN_VOCAB_CUDA else 0


def _candidate_plan(vocab: int, block_v: int, tile_width: int) -> tuple[int, int, int]:
    """(GROUP, NTP, GPT) of ``_residual_candidates`` for a vocabulary whose draw tiles are
    ``block_v`` wide and statistics tiles ``tile_width``: the group (never wider than a draw
    tile, so the paths' groups are the same ids), the row's tiles padded to a power of two
    and the groups per statistics tile."""
    group = min(_GROUP, block_v)
    return group, next_power_of_2(cdiv(vocab, tile_width)), tile_width // group


def _candidate_width(candidates: int, ntp: int, gpt: int, group: int) -> int:
    """Elements per lane of ``_residual_candidates``' widest tile (the interpreter's lanes stay
    within Triton's largest tensor)."""
    return candidates * max(group, gpt, ntp)


def _tile_masses_width(n_tiles: int, lanes: int, cuda: bool) -> int:
    """``_tile_masses``' NT: a power of two >= n_tiles. On CUDA at least 128 / lanes (and 4):
    Triton 3.6 fails to lower the draw's cumulative sum over a tile smaller than a program's
    threads (an assertion in ScanOpToLLVM at [2, 2]); at one lane that is all 128 tiles of V
    = 262,144, so larger vocabularies need no compile of their own."""
    floor = max(4, 128 // lanes) if cuda else 2
    return max(floor, next_power_of_2(n_tiles))


def _mass_chunk(lanes: int, n_tiles: int, cuda: bool) -> int:
    """Tile masses ``_tile_total`` reads per step: on CUDA a function of the lanes per program
    alone (no compile per vocabulary; at most 1024 fp64 per program, all 128 tiles of
    V = 262,144 at one lane), in the interpreter just the tiles there are."""
    if cuda:
        return min(128, max(1, 1024 // lanes))
    return min(next_power_of_2(n_tiles), max(1, (1 << 16) // lanes))


class _Stats:
    """Final per-row statistics: max logit, log of the sum of exp((a - max) / T), argmax
    (greedy rows; ``_NO_ID`` for the others, which never use it), degenerate flag."""

    def __init__(self, logits, row_req, temperature, cuda: bool, tiles: tuple = (None, None), fault: int = 0, group: int = 0):
        """``group`` > 0: also each tile's group sums (``_grouped_stats_step``) for residual candidates."""
        rows, width = logits.shape
        dev = logits.device
        self.m = torch.empty(rows, dtype=torch.float32, device=dev)
        self.logs = torch.empty(rows, dtype=torch.float32, device=dev)
        self.arg = torch.empty(rows, dtype=torch.int32, device=dev)
        self.bad = torch.empty(rows, dtype=torch.int8, device=dev)
        block_v, block_r, nsplit, split_len = _tiles(width, cuda, *tiles)
        self.g_sum = torch.empty(rows * cdiv(width, group) if group else 0, dtype=torch.float32, device=dev)
        self.g_tile = torch.empty(rows * cdiv(width, block_v) * 2 if group else 0, dtype=torch.float32, device=dev)
        if rows == 0:
            return
        grid = (cdiv(rows, block_r), nsplit)
        warps = 4
        if nsplit == 1:
            outs = (self.m, self.logs, self.arg, self.bad)
        else:
            outs = tuple(torch.empty(rows * nsplit, dtype=d, device=dev) for d in (torch.float32, torch.float32, torch.int32, torch.int32))
        launch(
            _stats_kernel, grid,
            logits, logits.stride(0), width, rows, row_req, temperature, *outs,
            self.g_sum if group else self.m, self.g_tile if group else self.m, split_len, nsplit, block_r, block_v,
            _planted(_stats_kernel, fault), group,
            num_warps=warps,
        )  # fmt: skip
        if nsplit > 1:
            rb = 32 if cuda else 4096
            launch(
                _combine_kernel, (cdiv(rows, rb),),
                rows, row_req, temperature, *outs, self.m, self.logs, self.arg, self.bad, nsplit, rb, _planted(_combine_kernel, fault),
            )  # fmt: skip


class _Context:
    """What every job kernel of one batch shares: logits, row statistics, tiles."""

    def __init__(self, target_logits, draft_logits, t_stats, d_stats, temperature, seeds, positions, drafts, tiles, cuda, fault=0):
        self.has_draft = draft_logits is not None
        d_logits = draft_logits if self.has_draft else target_logits
        self.vocab = target_logits.shape[1]
        self.common = (
            target_logits, target_logits.stride(0), self.vocab, d_logits, d_logits.stride(0), d_logits.shape[1],
            t_stats.m, t_stats.logs, d_stats.m, d_stats.logs, d_stats.bad,
        )  # fmt: skip
        self.temperature, self.seeds, self.positions, self.drafts = temperature, seeds, positions, drafts
        self.block_v, self.block_r, self.nsplit, self.split_len = _tiles(self.vocab, cuda, *tiles)
        self.n_tiles = cdiv(self.vocab, self.block_v)
        self.warps = 4
        self.dev = target_logits.device
        self.fault = fault

    def masses(self, job_trow, job_req, job_rho):
        """fp64 [jobs * n_tiles] sums of the jobs' weights and of their target rows per vocabulary tile."""
        n = job_trow.numel()
        mass_w = torch.empty(n * self.n_tiles, dtype=torch.float64, device=self.dev)
        mass_t = torch.empty_like(mass_w)
        launch(
            _mass_kernel, (cdiv(n, self.block_r), self.nsplit),
            *self.common, job_trow, job_req, job_rho, n, self.temperature, self.drafts, mass_w, mass_t, self.split_len,
            self.n_tiles, self.has_draft, self.block_r, self.block_v, _planted(_mass_kernel, self.fault), num_warps=self.warps,
        )  # fmt: skip
        return mass_w, mass_t

    def draw(self, job_trow, job_req, job_rho, stream: int, out, emitted=None, k: int = 0, u=None):
        """One token per active job (trow >= 0) into ``out[job]``, or into each request's
        last slot of ``out`` [B, k+1] when ``emitted`` is given."""
        mass_w, mass_t = self.masses(job_trow, job_req, job_rho)
        n = job_trow.numel()
        rows = min(self.block_r, max(1, (1 << 18) // next_power_of_2(self.n_tiles)))  # tiny CPU tiles: [rows, NT] fits
        nt = _tile_masses_width(self.n_tiles, rows, self.dev.type == "cuda")
        launch(
            _pick_kernel, (cdiv(n, rows),),
            *self.common, job_trow, job_req, job_rho, n, self.temperature, self.seeds, self.positions, self.drafts,
            mass_w, mass_t, mass_w if u is None else u, out, out if emitted is None else emitted, k, self.n_tiles,
            stream, emitted is not None, u is not None, self.has_draft, nt, rows, self.block_v,
            _planted(_pick_kernel, self.fault),
            num_warps=self.warps,
        )  # fmt: skip


# ``path="auto"`` takes the fused path (``harness.backends.triton.fused``: 3-5 launches, 3
# allocations, no host sync, no statistics of a request's last target row) for small batches
# and the staged pipeline (~10 launches, a dozen allocations) above. Interpreter (CPU): up to
# 256 requests, where the fused path's fewer programs pay. CUDA: up to 2**28 logits per row
# position (requests x V: 8,388 requests at V = 32000, 2,048 at 131072). Measured on an H100
# (B in {1, 64, 256, 1024}, V in {32000, 131072, 152064}): the fused path took 8-48% less graph time than the staged path on every shape (it
# reads a target row less per request). Not measured: B > 1024 and V < 32000.
FUSED_MAX_REQUESTS = 256
FUSED_MAX_LOGITS_CUDA = 2**28
PATHS = ("auto", "fused", "staged")


def takes_fused_path(
    path: str, num_requests: int, fused_max_requests: int | None = None, fault: int = 0, cuda: bool = False, vocab: int = 1
) -> bool:
    """Whether ``verify`` runs a batch of ``num_requests`` on the fused path: "auto" takes
    it up to ``fused_max_requests`` requests (default: ``FUSED_MAX_REQUESTS``, or on CUDA
    as many as keep ``num_requests * vocab`` within ``FUSED_MAX_LOGITS_CUDA``). Planted
    faults (``fault != 0``) always take the staged path: they are planted in its kernels."""
    if path not in PATHS:
        raise ValueError(f"path: expected one of {PATHS}, got {path!r}")
    if fused_max_requests is None:
        fused_max_requests = FUSED_MAX_LOGITS_CUDA // max(vocab, 1) if cuda else FUSED_MAX_REQUESTS
    return fault == 0 and (path == "fused" or (path == "auto" and num_requests <= fused_max_requests))


def verify(
    target_logits, draft_logits, draft_tokens, cu_num_drafts, temperature, seeds, positions, methods,
    synthetic_rates, max_drafts: int, *, has_strict: bool = True, has_block: bool = True, has_synthetic: bool = True,
    block_v: int | None = None, splits: int | None = None, fault: int = 0, path: str = "auto",
    fused_max_requests: int | None = None,
):  # fmt: skip
    """Device-side verification of one batch of torch tensors (``VerifyBatch`` layout).

    The ``has_*`` flags only skip work (a method absent from the batch); leaving them True
    is always correct. ``fault``: a planted bug's code (``harness.backends.triton.faults``), 0 none.
    ``path``: "fused", "staged", or "auto" (fused up to ``fused_max_requests`` requests;
    faults always staged: ``takes_fused_path``); both give the same outputs.
    Returns ``(tokens [B, K+1] int64, num_emitted [B] int64)``; slots past ``num_emitted``
    hold -1.
    """
    n_target, vocab = target_logits.shape
    if takes_fused_path(path, cu_num_drafts.numel() - 1, fused_max_requests, fault, target_logits.is_cuda, vocab):
        from harness.backends.triton.fused import verify_fused  # imports this module's helpers

        return verify_fused(
            target_logits, draft_logits, draft_tokens, cu_num_drafts, temperature, seeds, positions, methods, synthetic_rates,
            max_drafts, has_strict=has_strict, has_block=has_block, has_synthetic=has_synthetic, block_v=block_v, splits=splits,
        )  # fmt: skip
    dev = target_logits.device
    cuda = dev.type == "cuda"
    b = cu_num_drafts.numel() - 1
    k = int(max_drafts)
    tokens = torch.full((b, k + 1), -1, dtype=torch.int64, device=dev)
    emitted = torch.zeros(b, dtype=torch.int64, device=dev)
    if b == 0:
        return tokens, emitted
    if fault == _IGNORE_DRAFT_PROBS:
        draft_logits = None
    if fault == _BLOCK_TOKEN_WISE.value:
        has_block = False
    has_draft = draft_logits is not None
    has_synthetic = has_synthetic and synthetic_rates is not None
    temperature = temperature.to(torch.float64)
    t_req = torch.empty(n_target, dtype=torch.int64, device=dev)
    d_req = torch.empty(draft_tokens.numel(), dtype=torch.int64, device=dev)
    req_block = 64 if cuda else 4096
    grid_req = (cdiv(b, req_block),)
    launch(_owners_kernel, grid_req, cu_num_drafts, t_req, d_req, k, b, req_block)
    if fault == _TEMPERATURE_TWICE:  # the caller's division; the kernels divide once more
        target_logits = (target_logits / torch.where(temperature > 0, temperature, 1.0)[t_req, None]).to(target_logits.dtype)
    # Planted faults live in the draw's mass and pick kernels: with one, every residual is drawn there.
    candidates = candidates_for(vocab, cuda) if fault == 0 else 0
    draw_v = _tiles(vocab, cuda, block_v, splits)[0]
    group, ntp, gpt = _candidate_plan(vocab, draw_v, draw_v)
    t_stats = _Stats(target_logits, t_req, temperature, cuda, (block_v, splits), fault, group if candidates else 0)
    d_temperature = temperature
    if fault == _DRAFT_BEFORE_TEMPERATURE.value:  # draft statistics of the raw logits (T = 1)
        d_temperature = torch.where(temperature > 0, 1.0, temperature)
    d_stats = _Stats(draft_logits, d_req, d_temperature, cuda, (block_v, splits), fault) if has_draft else t_stats
    ctx = _Context(
        target_logits, draft_logits, t_stats, d_stats, temperature, seeds, positions, draft_tokens, (block_v, splits), cuda, fault
    )
    d_logits = draft_logits if has_draft else target_logits

    # The strict target sample y of every row of a strict request (point rows need none).
    strict_y = tokens
    if has_strict:
        strict_rows = (methods[t_req] == int(Method.STRICT)) & (temperature[t_req] > 0)
        strict_y = torch.empty(n_target, dtype=torch.int64, device=dev)
        job_trow = torch.where(strict_rows, torch.arange(n_target, device=dev), -1)
        ctx.draw(job_trow, t_req, torch.full((n_target,), -1.0, device=dev), int(Stream.TARGET), strict_y)

    fin_trow = torch.empty(b, dtype=torch.int64, device=dev)
    fin_rho = torch.empty(b, dtype=torch.float32, device=dev)
    rho_buf = torch.ones((b, k + 1), dtype=torch.float32, device=dev) if has_block else fin_rho
    mass_trow = torch.full((n_target,), -1, dtype=torch.int64, device=dev) if has_block else fin_trow
    mass_rho = torch.zeros(n_target, dtype=torch.float32, device=dev) if has_block else fin_rho
    launch(
        _chain_kernel, grid_req,
        target_logits, target_logits.stride(0), ctx.vocab, d_logits, d_logits.stride(0), d_logits.shape[1],
        t_stats.m, t_stats.logs, t_stats.arg, t_stats.bad, d_stats.m, d_stats.logs, d_stats.arg, d_stats.bad,
        cu_num_drafts, temperature, seeds, positions, methods, draft_tokens, synthetic_rates if has_synthetic else temperature, k, b,
        strict_y, tokens, emitted, fin_trow, fin_rho, rho_buf, mass_trow, mass_rho,
        has_draft, has_strict, has_synthetic, has_block, req_block, _planted(_chain_kernel, fault),
    )  # fmt: skip
    if has_block:
        mass, _ = ctx.masses(mass_trow, t_req, mass_rho)
        launch(
            _block_kernel, grid_req,
            d_logits, d_logits.stride(0), d_logits.shape[1], t_stats.arg, t_stats.bad, d_stats.m, d_stats.logs, d_stats.arg, d_stats.bad,
            cu_num_drafts, temperature, seeds, positions, methods, draft_tokens, k, b,
            mass, ctx.n_tiles, rho_buf, tokens, emitted, fin_trow, fin_rho, has_draft, _mass_chunk(req_block, ctx.n_tiles, cuda),
            req_block, _planted(_block_kernel, fault),
        )  # fmt: skip
    requests = torch.arange(b, device=dev)
    if candidates:
        lanes = min(ctx.block_r, next_power_of_2(b), max(1, (1 << 16) // _candidate_width(candidates, ntp, gpt, group)))
        launch(
            _candidate_kernel, (cdiv(b, lanes),),
            *ctx.common, fin_trow, requests, fin_rho, b, temperature, seeds, positions, draft_tokens, methods,
            t_stats.g_sum, t_stats.g_tile, draw_v, tokens, emitted, k, has_draft, candidates, group, ntp, gpt, lanes,
            num_warps=1 if cuda else ctx.warps,
        )  # fmt: skip
    ctx.draw(fin_trow, requests, fin_rho, int(Stream.RESIDUAL), tokens, emitted, k)
    return tokens, emitted


def sample_rows(logits, temperature, uniforms=None, seeds=None, positions=None, block_v: int | None = None, splits: int | None = None):
    """One token per row of ``logits`` [n, V] from softmax(logits / T) (T > 0) by the same
    statistics and inverse-CDF kernels as ``verify``; ``uniforms`` [n] float64 in (0, 1)
    replace the Philox draw (exact tests of the draw's resolution)."""
    n = logits.shape[0]
    dev = logits.device
    cuda = dev.type == "cuda"
    rows = torch.arange(n, device=dev)
    temperature = temperature.to(torch.float64)
    stats_ = _Stats(logits, rows, temperature, cuda, (block_v, splits))
    seeds = rows if seeds is None else seeds
    positions = rows if positions is None else positions
    ctx = _Context(logits, None, stats_, stats_, temperature, seeds, positions, rows, (block_v, splits), cuda)
    out = torch.empty(n, dtype=torch.int64, device=dev)
    ctx.draw(rows, rows, torch.full((n,), -1.0, device=dev), int(Stream.RESIDUAL), out, u=uniforms)
    return out


class TritonBackend:
    """Greedy, strict, standard (with or without draft logits), block and synthetic in Triton.

    ``device`` is "cpu" (Triton interpreter, TRITON_INTERPRET=1) or "cuda"; the runner sets it.
    On CUDA, logits are cast to ``batch.logits_dtype`` (exact by the protocol: half the
    bytes to read for bf16 / fp16 batches). ``path``: "auto" (fused up to
    ``fused_max_requests`` requests, staged above), "fused" or "staged" (``verify``).
    """

    name = "triton"
    devices = ("cpu", "cuda")
    device_batches = True  # takes batches built on its device (harness.sampling.device.trials)
    shared_rows = True  # reads rows through their stride: stride-0 logits stay views

    def __init__(
        self, device: str = "cpu", block_v: int | None = None, splits: int | None = None, path: str = "auto",
        fused_max_requests: int | None = None,
    ):  # fmt: skip
        self.device = device
        self.tiles = {"block_v": block_v, "splits": splits}  # None: chosen from the vocabulary
        takes_fused_path(path, 0)  # a wrong name fails here, not at the first batch
        self.path = {"path": path, "fused_max_requests": fused_max_requests}

    def sample(self, batch):
        if self.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError("triton backend on cpu needs TRITON_INTERPRET=1 set before triton is imported")
        flags = {}  # the has_* flags: all True unless known
        fused = takes_fused_path(
            **self.path,
            num_requests=batch.num_requests,
            fault=self.tiles.get("fault", 0),
            cuda=self.device == "cuda",
            vocab=batch.vocab_size,
        )
        # Reading a CUDA batch's methods synchronizes: worth it for the staged path only.
        if batch.method_codes is not None or not (fused and getattr(batch.methods, "is_cuda", False)):
            codes = method_codes(batch)
            flags = {f"has_{m.name.lower()}": bool(m in codes) for m in (Method.STRICT, Method.BLOCK, Method.SYNTHETIC)}
        t = batch.to_torch(self.device)
        # The interpreter reads fp32; CUDA reads the batch's dtype (half the bytes for bf16 / fp16).
        dtype = torch.float32 if self.device == "cpu" else getattr(torch, getattr(batch, "logits_dtype", "float32"))
        t["target_logits"] = rows.cast(t["target_logits"], dtype)
        t["draft_logits"] = None if t["draft_logits"] is None else rows.cast(t["draft_logits"], dtype)
        return verify(
            t["target_logits"], t["draft_logits"], t["draft_tokens"], t["cu_num_drafts"], t["temperature"], t["seeds"],
            t["positions"], t["methods"], t["synthetic_rates"], batch.max_drafts, **flags, **self.tiles, **self.path,
        )  # fmt: skip

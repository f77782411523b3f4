"""Per-row statistics: the jit helpers both paths compute them with.

``split_stats``: an online log-sum-exp of ``logits / T`` over the vocabulary tiles of one split,
one row per lane (max, sum of exponentials, the argmax of greedy rows with ties to the lowest id,
NaN flag; with ``GROUP`` > 0 also each tile's group sums, for residual candidates): final
statistics where the vocabulary is one split, the split's partials otherwise. ``combine_rows``:
a row's split partials merged into its final statistics. The staged path launches them in
``staged_jobs._stats_kernel`` / ``_combine_kernel``, the fused path in
``fused._fused_stats_kernel`` and the chain kernel (``fused_parts.finalize``).
"""

import triton
import triton.language as tl

from harness.backends.triton.common import GREEDY_TIE_HIGHEST, LOWEST, NAN_ROW_OUT_OF_VOCAB, NO_ID


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
    if FAULT == GREEDY_TIE_HIGHEST:
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
    (``residual_candidates`` reads them). The tile's sum adds its group sums, another order
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
    ``need`` selects, by reading that tile again; ``NO_ID`` for the other rows. Only a point
    mass's token uses an argmax, and only a greedy row's statistics give one (a degenerate
    row's token is 0, ``_store_final``): skipping the read for sampled rows saves a tile's
    round trip per split at B = 1 and its bytes at large batches."""
    arg = tl.zeros_like(best) + NO_ID
    if tl.max(need.to(tl.int32), axis=0) > 0:
        cols = best[:, None] + tl.arange(0, BLOCK_V)[None, :]
        a = tl.load(base + cols, mask=need[:, None] & (cols < hi), other=float("-inf")).to(tl.float32)
        if FAULT == GREEDY_TIE_HIGHEST:
            arg = tl.where(need, tl.max(tl.where(a == m[:, None], cols, -1), axis=1), arg)
        else:
            arg = tl.where(need, tl.min(tl.where(a == m[:, None], cols, NO_ID), axis=1), arg)  # lowest id among the maxima
    return arg


@triton.jit
def split_stats(
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
    m = tl.full([BLOCK_R], LOWEST, tl.float32)
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
    if FAULT == NAN_ROW_OUT_OF_VOCAB:  # a NaN max matches no lane: the search's not-found id
        tl.store(out_arg + rows, tl.where(nan != 0, NO_ID, tl.where(bad, 0, arg)), mask=valid)
    else:
        tl.store(out_arg + rows, tl.where(bad, 0, arg), mask=valid)
    tl.store(out_bad + rows, bad.to(tl.int8), mask=valid)


@triton.jit
def _merge_splits(parts_m, parts_s, parts_arg, parts_nan, scale, FAULT: tl.constexpr):
    """Merge per-split statistics along the last axis (a split past the last: max LOWEST,
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
    if FAULT == GREEDY_TIE_HIGHEST:
        first = tl.max(tl.where(hit, sp, -1), axis=axis)
    else:
        first = tl.min(tl.where(hit, sp, NO_ID), axis=axis)
    arg = tl.sum(tl.where(sp == tl.expand_dims(first, axis), parts_arg, 0), axis=axis)
    return m, s, arg, tl.max(parts_nan, axis=axis)


@triton.jit
def combine_rows(
    part_m, part_s, part_arg, part_nan, rows, mask, scale, out_m, out_logs, out_arg, out_bad,
    NSPLIT: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """Load the ``NSPLIT`` partials of ``rows`` (any shape; ``scale`` of the same shape), merge
    them (``_merge_splits``) and store the final statistics (``_store_final``): the staged
    ``_combine_kernel`` and the fused chain kernel's ``finalize`` (partials in float64).
    Returns the merged max, sum, argmax and NaN flag."""
    axis: tl.constexpr = len(rows.shape)
    sp = tl.arange(0, triton.next_power_of_2(NSPLIT))
    part = tl.expand_dims(rows * NSPLIT, axis) + sp
    pmask = tl.expand_dims(mask, axis) & (sp < NSPLIT)
    m, s, arg, nan = _merge_splits(
        tl.load(part_m + part, mask=pmask, other=LOWEST).to(tl.float32),
        tl.load(part_s + part, mask=pmask, other=0.0).to(tl.float32),
        tl.load(part_arg + part, mask=pmask, other=0).to(tl.int32),
        tl.load(part_nan + part, mask=pmask, other=0).to(tl.int32),
        scale,
        FAULT,
    )
    _store_final(rows, mask, m, s, arg, nan, out_m, out_logs, out_arg, out_bad, FAULT)
    return m, s, arg, nan

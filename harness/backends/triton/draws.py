"""Draws over one target row: the jit helpers both paths draw with.

A *job* draws one token from a target row, or from its residual max(rho * target - draft, 0)
(or sums that row's masses): its weights over a [rows, ids] tile (``_tile_weights``), their
fp64 sums per vocabulary tile over one split (``split_tile_masses``), and the inverse-CDF
draw from those tile masses in two steps, the tile holding ``u * total`` then the token inside
it (``draw_from_masses``, ``draw_from_tiles``). Also the residual candidates
(``residual_candidates``): a rejected draft's replacement by rejection from the target row,
reading one group of ids per candidate instead of both rows whole.
"""

import triton
import triton.language as tl

from harness.backends.triton.common import (
    DRAFT_BEFORE_TEMPERATURE,
    LOG2E,
    LOWEST,
    NO_ID,
    RESIDUAL_IS_TARGET,
    RESIDUAL_NOT_NORMALIZED,
    STREAM_CANDIDATE,
    UNCLAMPED_RESIDUAL,
    uniform_pair,
)


@triton.jit
def _target_tile(t_logits, t_stride, trow, active, cols, in_range, need_max):
    """A draw's target tile (fp32, -inf off-row) and each row's tile max: 0 unless a lane of
    ``need_max`` (a target-row draw) needs it, else at least ``LOWEST`` (an empty tile)."""
    # evict_first: this is the last full read of the draw's rows (a rejected row's second, after the
    # statistics), so they should not push other lines out of L2: 1.5-2.5% less time at
    # B = 256-1024, K = 1 on the fused path on an H100.
    a = tl.load(t_logits + trow.to(tl.int64) * t_stride + cols, mask=active & in_range, other=float("-inf"), eviction_policy="evict_first")
    a = a.to(tl.float32)
    tile_m = tl.zeros([a.shape[0], 1], tl.float32)
    if tl.max(need_max.to(tl.int32)) > 0:
        tile_m = tl.maximum(tl.max(a, axis=1), LOWEST)[:, None]
    return a, tile_m


@triton.jit
def _tile_weights(
    t_logits, t_stride, d_logits, d_stride, d_width, trow, drow, m, logs2, dm, dlogs2, scale,
    rho, active, resid, use_draft, excl, cols, in_range, HAS_DRAFT: tl.constexpr, FAULT: tl.constexpr, SCAN: tl.constexpr,
):  # fmt: skip
    """Target weights ``t``, job weights ``w`` of a [rows, cols] tile (0 off-row) and each row's
    tile max (``LOWEST`` for an empty tile). ``scale`` is log2(e) / T. A residual row
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
        if FAULT == DRAFT_BEFORE_TEMPERATURE:
            q = tl.exp2((b.to(tl.float32) - dm) * LOG2E - dlogs2)
    w = tl.where(resid, tl.maximum(rho * t - q, 0.0), t)
    if FAULT == RESIDUAL_IS_TARGET:
        w = t
    if FAULT == UNCLAMPED_RESIDUAL:
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
def split_tile_masses(
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
def tile_masses(mass, n_tiles, mask, NT: tl.constexpr):
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
    tile_m = tl.where(live, maxima, LOWEST).to(tl.float32)
    row_m = tl.max(tile_m, axis=1)
    factor = tl.exp2((tile_m - row_m[:, None]) * scale).to(tl.float64)
    masses = tl.where(live, sums * factor, 0.0)
    bad = (tl.max((sums != sums).to(tl.int32), axis=1) != 0) | (tl.sum(masses, axis=1) == 0)
    first = tl.min(tl.where(live & (tile_m == row_m[:, None]) & (sums > 0), idx, NO_ID), axis=1)
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
    first = tl.min(tl.where((mass > 0) & (running > tl.expand_dims(threshold, axis)), idx, NO_ID), axis=axis)
    found = first != NO_ID
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
    if FAULT == UNCLAMPED_RESIDUAL:
        scan, _, _ = _tile_weights(
            t_logits, t_stride, d_logits, d_stride, Vd, trow, drow, m, logs2, dm, dlogs2, scale,
            rho, active, weigh, use_draft, excl, cols, cols < V, HAS_DRAFT, FAULT, True,
        )  # fmt: skip
    left = (frac * tl.sum(w.to(tl.float64), axis=1))[:, None]
    passed = (tl.cumsum(scan.to(tl.float64), axis=1) > left) & (scan > 0)
    token = tl.min(tl.where(passed, cols, NO_ID), axis=1)
    last = tl.max(tl.where(scan > 0, cols, -1), axis=1)
    return tl.where(token == NO_ID, last, token).to(tl.int64)  # rounding at the tile's end


@triton.jit
def job_tile_masses(mass_w, mass_t, n_tiles, act, resid, scale, NT: tl.constexpr):
    """The tile masses a job draws from, one job per lane (``mass_w`` / ``mass_t``: each lane's
    ``n_tiles`` sums as ``split_tile_masses`` stored them): a residual's, the target row's
    where the residual is empty, a target-row draw's rescaled to its row max
    (``_target_tile_masses``). Returns them with whether the residual had weight, and the
    target row's max, degenerate flag and first tile holding the max."""
    tile_w = tile_masses(mass_w, n_tiles, act, NT)
    second = tile_masses(mass_t, n_tiles, act, NT)
    use_w = tl.sum(tile_w, axis=1) > 0  # else the residual is empty: fall back to the target row
    target, row_m, bad, first = _target_tile_masses(tile_w, second, n_tiles, scale)
    return tl.where(resid, tl.where(use_w[:, None], tile_w, second), target), use_w, row_m, bad, first


@triton.jit
def draw_from_masses(
    t_logits, t_stride, V, d_logits, d_stride, Vd, trow, drow, m, logs2, dm, dlogs2, scale, rho, active, resid,
    use_draft, excl, tiles, use_w, u, HAS_DRAFT: tl.constexpr, FAULT: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """Inverse CDF in two steps, one job per lane, from its tile masses (``job_tile_masses``):
    the tile whose running mass passes ``u * total``, then, inside it, the first id whose fp64
    running sum passes the same fraction of the tile's own fp64 sum. Returns the token (int64)."""
    threshold = u * tl.sum(tiles, axis=1)
    if FAULT == RESIDUAL_NOT_NORMALIZED:
        threshold = tl.where(tl.max(resid.to(tl.int32), axis=1) != 0, u, threshold)
    tile, frac = _choose_tile(tiles, threshold)
    return _draw_in_tile(
        t_logits, t_stride, V, d_logits, d_stride, Vd, trow, drow, m, logs2, dm, dlogs2, scale, rho, active,
        resid & use_w[:, None], use_draft, excl, (tile * BLOCK_V)[:, None], frac, HAS_DRAFT, FAULT, BLOCK_V,
    )  # fmt: skip


@triton.jit
def draw_from_tiles(
    t_logits, t_stride, V, d_logits, d_stride, Vd, trow, drow, m, logs2, dm, dlogs2, scale, rho, active, resid,
    use_draft, excl, act, mass_w, mass_t, u, n_tiles, HAS_DRAFT: tl.constexpr, FAULT: tl.constexpr, NT: tl.constexpr,
    BLOCK_V: tl.constexpr,
):  # fmt: skip
    """``draw_from_masses`` from the masses ``split_tile_masses`` stored at ``mass_w`` /
    ``mass_t`` (an empty residual draws from the target row). Returns (token int64, whether
    the residual had weight)."""
    tiles, use_w, _, _, _ = job_tile_masses(mass_w, mass_t, n_tiles, act, resid, scale, NT)
    token = draw_from_masses(
        t_logits, t_stride, V, d_logits, d_stride, Vd, trow, drow, m, logs2, dm, dlogs2, scale, rho, active, resid,
        use_draft, excl, tiles, use_w, u, HAS_DRAFT, FAULT, BLOCK_V,
    )  # fmt: skip
    return token, use_w


# --- residual candidates: a rejected draft's replacement without a second read of its rows ----------
@triton.jit
def residual_candidates(
    t_logits, t_stride, V, d_logits, d_stride, Vd, g_sum, g_tile, tile_width, trow, drow, m, logs2, dm, dlogs2, scale,
    rho, use_draft, excl, act, seed, pos,
    HAS_DRAFT: tl.constexpr, N: tl.constexpr, GROUP: tl.constexpr, NTP: tl.constexpr, GPT: tl.constexpr,
):  # fmt: skip
    """A residual draw by rejection from the target row, one per active lane ([lanes, 1]
    columns as ``job`` gives them; ``seed`` and ``pos`` too): N candidates y ~ target, each by
    inverse CDF in three steps from what the statistics stored (``_grouped_stats_step``): a
    statistics tile by its sum, a group of ``GROUP`` ids in it by the group sums, then an id in
    the group, whose ``GROUP`` target and draft logits are the only ones read. Candidate y is
    kept with probability max(rho t(y) - q(y), 0) / t(y) (its own uniform): the residual is at
    most the target, so the first kept has the residual's law exactly. -1 where none was kept:
    the caller then draws from the residual's masses over the whole row, whose law is the
    same. Candidate i's two uniforms: (seed, position, i, stream CANDIDATE). ``NTP`` >= the
    row's tiles, ``GPT`` = groups per tile (``candidate_plan``)."""
    grow = trow.to(tl.int64)
    n_tiles = tl.cdiv(V, tile_width)
    ti = tl.arange(0, NTP)[None, :]
    live = act & (ti < n_tiles)
    tile = (grow * n_tiles + ti) * 2
    ref = tl.load(g_tile + tile, mask=live, other=0.0)
    tiles = tl.where(live, tl.load(g_tile + tile + 1, mask=live, other=0.0).to(tl.float64) * tl.exp2((ref - m) * scale).to(tl.float64), 0.0)
    ci = tl.arange(0, N)[None, :]
    u, v = uniform_pair(seed, pos, ci, STREAM_CANDIDATE)  # [lanes, N]: where, and whether kept
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
    y = tl.min(tl.where(passed, cols, NO_ID), axis=2)
    y = tl.where(y == NO_ID, tl.max(tl.where(t > 0, cols, -1), axis=2), y)  # rounding at the group's end
    at = cols == y[:, :, None]
    t_y = tl.sum(tl.where(at, t, 0.0), axis=2).to(tl.float64)
    w_y = tl.sum(tl.where(at, w, 0.0), axis=2).to(tl.float64)
    first = tl.min(tl.where(act & (y >= 0) & (v * t_y < w_y), ci, N), axis=1)
    token = tl.sum(tl.where(ci == first[:, None], y, 0), axis=1).to(tl.int64)
    return tl.where(first < N, token, -1)

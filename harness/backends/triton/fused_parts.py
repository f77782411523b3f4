"""The fused kernels' jit helpers (``fused`` holds the kernels and their launch).

Row statistics as the fused scratch holds them (``stats_at``, ``final_stats``, ``final_arrays``,
``finalize``); the chain's inputs and decisions, every step at once (``chain_inputs``,
``chain_rule``); one job per lane (``job``); the flags between programmatically launched
kernels (``flag_ptrs``, ``raise_flag``, ``await_flag``, ``block_rejected``); the chain's
scratch slots (``store_chain``, ``load_chain``); the outputs (``store_outputs``); and ``pick``:
strict requests' target samples, block verification's stop and the final draw, in the last
mass program of a request block or in the pick kernel.
"""

import triton
import triton.language as tl

from harness.backends.triton.common import (
    LOG2E,
    METHOD_BLOCK,
    METHOD_STRICT,
    METHOD_SYNTHETIC,
    NO_ID,
    STREAM_ACCEPT,
    STREAM_BLOCK,
    STREAM_RESIDUAL,
    STREAM_TARGET,
    inv_temperature,
    uniform,
)
from harness.backends.triton.draws import draw_from_masses, draw_from_tiles, job_tile_masses, tile_masses
from harness.backends.triton.row_stats import combine_rows


# --- row statistics -----------------------------------------------------------------------------
@triton.jit
def stats_at(base, size):
    """The four statistics arrays (max, sum or log-sum, argmax, NaN or degenerate flag) from ``base``."""
    return base, base + size, base + 2 * size, base + 3 * size


@triton.jit
def final_stats(s_m, s_s, s_arg, s_nan, rows, mask):
    """Final statistics of ``rows`` (any shape) as the stats kernel (one split) or the chain
    kernel (``finalize``) stored them: max, log of the sum, argmax (int64), degenerate flag."""
    m = tl.load(s_m + rows, mask=mask, other=0.0).to(tl.float32)
    logs = tl.load(s_s + rows, mask=mask, other=0.0).to(tl.float32)
    arg = tl.load(s_arg + rows, mask=mask, other=0.0).to(tl.int64)
    bad = tl.load(s_nan + rows, mask=mask, other=0.0) != 0
    return m, logs, arg, bad


@triton.jit
def _logit_at(logits, stride, width, row, x, mask):
    """The logit of id ``x`` in ``row`` (fp32), -inf outside the row's vocabulary or ``mask``."""
    inside = mask & (x >= 0) & (x < width)
    return tl.load(logits + row.to(tl.int64) * stride + x, mask=inside, other=float("-inf")).to(tl.float32)


@triton.jit
def _lp_of(a, m, logs, arg, bad, x, inv_t, greedy):
    """log p(x) from the logit ``a`` of ``x`` (``_logit_at``) and its row's statistics: a point
    mass on the argmax for greedy or degenerate rows, -inf where ``a`` is."""
    lp = tl.where(a == float("-inf"), float("-inf"), (a - m) * inv_t - logs)
    return tl.where(greedy | bad, tl.where(x == arg, 0.0, float("-inf")), lp)


@triton.jit
def _lp(logits, stride, width, m, logs, arg, bad, row, x, inv_t, greedy, mask):
    """``_logprob`` from statistics in registers: log p(x) of one row per lane (a point
    mass on the argmax for greedy or degenerate rows, -inf outside the row's vocabulary)."""
    return _lp_of(_logit_at(logits, stride, width, row, x, mask), m, logs, arg, bad, x, inv_t, greedy)


@triton.jit
def _column(mat, j, KP: tl.constexpr):
    """``mat[lane, j[lane]]`` of a [lanes, KP] tensor (exact: one term and zeros)."""
    return tl.sum(tl.where(tl.arange(0, KP)[None, :] == j[:, None], mat, 0), axis=1)


# --- the chain ------------------------------------------------------------------------------------
@triton.jit
def request(cu, temperature, seeds, methods, B, BLOCK_R: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    valid = r < B
    start = tl.load(cu + r, mask=valid, other=0)
    cnt = tl.load(cu + r + 1, mask=valid, other=0) - start
    temp = tl.load(temperature + r, mask=valid, other=1.0)
    seed = tl.load(seeds + r, mask=valid, other=0)
    method = tl.load(methods + r, mask=valid, other=0).to(tl.int32)
    return r, valid, start, cnt, temp, seed, method


@triton.jit
def chain_inputs(
    t_logits, t_stride, V, d_logits, d_stride, Vd, positions, drafts, rates, K, r, valid, start, cnt, seed, method,
    HAS_DRAFT: tl.constexpr, HAS_SYNTH: tl.constexpr, KP: tl.constexpr,
):  # fmt: skip
    """What the chain reads of the caller's tensors, [lanes, KP] each: the drafts ``x`` (-1 past
    the count), which steps hold one (``good``), the target and draft logits at them
    (``_logit_at``), the acceptance uniforms and the synthetic rates. None of it depends on the
    statistics kernel."""
    ks = tl.arange(0, KP).to(tl.int64)[None, :]  # int64 counts: no widening later (Triton 3.6 miscompiles one)
    step = valid[:, None] & (ks < cnt[:, None])
    x = tl.load(drafts + start[:, None] + ks, mask=step, other=-1)  # -1: placeholder or none
    good = step & (x >= 0)
    row = (start + r)[:, None] + ks
    a_t = _logit_at(t_logits, t_stride, V, row, x, good)
    a_q = a_t  # unused without a draft row
    if HAS_DRAFT:
        a_q = _logit_at(d_logits, d_stride, Vd, start[:, None] + ks, x, good)
    u = uniform(seed[:, None], tl.load(positions + row, mask=good, other=0), STREAM_ACCEPT)
    rate = tl.zeros_like(a_t)
    if HAS_SYNTH:
        rate = tl.load(rates + r[:, None] * K + ks, mask=good & (method == METHOD_SYNTHETIC)[:, None], other=0.0)
    return x, good, a_t, a_q, u, rate


@triton.jit
def chain_rule(
    x, good, a_t, a_q, u, rate, tm, tlogs, targ, tbad, dm, dlogs, darg, dbad, K, valid, temp, method,
    HAS_DRAFT: tl.constexpr, HAS_SYNTH: tl.constexpr, HAS_BLOCK: tl.constexpr, KP: tl.constexpr,
):  # fmt: skip
    """``_chain_kernel``'s decisions, every step at once, from ``chain_inputs`` and the rows'
    final statistics ([lanes, KP]; the draft's unused without a draft row): ``n`` drafts
    accepted by the standard / greedy / synthetic rule, whether step ``n`` rejected, ``n_eff``
    drafts before the first placeholder, and block verification's running ratios ``rhos``
    [lanes, KP] (rho_0 = 1; valid up to n_eff)."""
    ks = tl.arange(0, KP).to(tl.int64)[None, :]
    greedy = (temp == 0)[:, None]
    inv_t = inv_temperature(temp)[:, None]
    lt = _lp_of(a_t, tm, tlogs, targ, tbad, x, inv_t, greedy)
    lq = tl.zeros_like(lt)
    if HAS_DRAFT:
        lq = _lp_of(a_q, dm, dlogs, darg, dbad, x, inv_t, greedy)
    # standard: min(1, t/q), t/0 = inf for t > 0, 0/0 = 0; no draft row: q(x) = 1
    ok = u < tl.where(lt == float("-inf"), 0.0, tl.exp(tl.minimum(lt - lq, 0.0))).to(tl.float64)
    if HAS_SYNTH:
        ok = tl.where((method == METHOD_SYNTHETIC)[:, None], u < rate, ok)
    n = tl.min(tl.where(good & ok, KP, ks), axis=1)  # the first step that does not accept
    n_eff = tl.min(tl.where(good, KP, ks), axis=1)
    rhos = tl.where(ks == 0, 1.0, tl.zeros_like(lt))
    if HAS_BLOCK:
        blk = valid & (method == METHOD_BLOCK)
        ratio = tl.where(lt == float("-inf"), 0.0, tl.exp(lt - lq))
        rho = tl.full(temp.shape, 1.0, tl.float32)
        for k in range(0, K):
            bact = blk & (k < n_eff)
            ratio_k = tl.sum(tl.where(ks == k, ratio, 0.0), axis=1)
            rho = tl.where(bact, tl.where(rho == 0, 0.0, tl.minimum(rho * ratio_k, 1.0)), rho)
            rhos = tl.where(ks == k + 1, rho[:, None], rhos)
    return n, n < n_eff, n_eff, rhos


# --- draws ----------------------------------------------------------------------------------------
@triton.jit
def job(
    d_m, d_s, d_arg, d_nan, drafts, trow, drow, m, logs, rho, act, scale,
    HAS_DRAFT: tl.constexpr,
):  # fmt: skip
    """``job_rows`` for one draw per lane, as [lanes, 1] columns: target row ``trow`` (max
    ``m``, log-sum ``logs``), or its residual max(rho * target - draft, 0) when rho >= 0."""
    resid = act & (rho >= 0)
    if HAS_DRAFT:
        dm, dlogs, _, dbad = final_stats(d_m, d_s, d_arg, d_nan, drow, resid)
        use_draft = resid & ~dbad
        excl = tl.where(resid & dbad, 0, -1).to(tl.int64)[:, None]  # degenerate draft: one-hot on 0
        dm = tl.where(use_draft, dm, 0.0)
        dlogs2 = tl.where(use_draft, dlogs, 0.0) * LOG2E
    else:
        dm = tl.zeros_like(m)
        dlogs2 = tl.zeros_like(m)
        use_draft = resid & False
        excl = tl.load(drafts + drow[:, None], mask=resid[:, None], other=-1)
    m = tl.where(act, m, 0.0)
    logs2 = tl.where(act, logs, 0.0) * LOG2E
    return (
        trow[:, None], drow[:, None], m[:, None], logs2[:, None], dm[:, None], dlogs2[:, None], scale[:, None],
        rho[:, None], act[:, None], resid[:, None], use_draft[:, None], excl,
    )  # fmt: skip


# --- flags between kernels ------------------------------------------------------------------------
@triton.jit
def flag_ptrs(scratch, k_off, B):
    """Per request block: whether the chain kernel (``flags + block``) and the candidate kernel
    (``flags + B + block``) are done with it, int32 beside the mass kernel's counters (PDL only);
    under ``flag_chain`` also n, the rejection and whether a candidate was kept."""
    return (scratch + k_off + B).to(tl.pointer_type(tl.int32), bitcast=True)


@triton.jit
def raise_flag(flag, value):
    """Set ``flag`` to ``value`` (> 0) once every thread of the program has stored its results."""
    tl.debug_barrier()
    tl.atomic_xchg(flag, value, sem="release", scope="gpu")


@triton.jit
def await_flag(flag):
    """Spin until ``flag`` is raised and return its value (acquire: the raiser's stores are seen after)."""
    seen = tl.atomic_add(flag, 0, sem="acquire", scope="gpu")
    while seen == 0:
        seen = tl.atomic_add(flag, 0, sem="acquire", scope="gpu")
    return seen


@triton.jit
def block_rejected(seen):
    """Whether the chain flag's value ``seen`` (1 + rejected, + 2 n under ``flag_chain``) says one
    of the block's requests rejected."""
    return (seen - 1) % 2 == 1


# --- the chain's scratch, the outputs -------------------------------------------------------------
@triton.jit
def store_chain(chain, r, mask, n, rejected, n_eff, rhos, K, B, HAS_BLOCK: tl.constexpr, KP: tl.constexpr):
    """The chain's decisions into the scratch (read back by ``load_chain``), and no kept
    residual candidate (-1) yet: ``_fused_candidate_kernel``, where it runs, stores its own."""
    tl.store(chain + r, n, mask=mask)
    tl.store(chain + (K + 4) * B + r, tl.zeros_like(r) - 1, mask=mask)
    tl.store(chain + B + r, rejected.to(tl.int32), mask=mask)
    tl.store(chain + 2 * B + r, n_eff, mask=mask)
    if HAS_BLOCK:
        ks = tl.arange(0, KP)[None, :]
        tl.store(chain + 3 * B + r[:, None] * (K + 1) + ks, rhos, mask=mask[:, None] & (ks <= K))


@triton.jit
def load_chain(chain, r, valid, K, B, INT: tl.constexpr):
    """``n``, ``rejected``, ``n_eff`` (as ``INT``) and the kept candidate (int64) as
    ``store_chain`` stored them (block verification's ratios are read one per lane where needed)."""
    n = tl.load(chain + r, mask=valid, other=0).to(INT)
    rejected = tl.load(chain + B + r, mask=valid, other=0) != 0
    n_eff = tl.load(chain + 2 * B + r, mask=valid, other=0).to(INT)
    kept = tl.load(chain + (K + 4) * B + r, mask=valid, other=-1).to(tl.int64)
    return n, rejected, n_eff, kept


@triton.jit
def left_to_draw(valid, kept):
    """Whether any of the requests still needs a draw (none kept a residual candidate)."""
    return tl.max((valid & (kept < 0)).to(tl.int32), axis=0) > 0


@triton.jit
def store_outputs(tokens, emitted, r, x, fin, token, mask, K, KP: tl.constexpr):
    """A request's output slots (its drafts before ``fin``, ``token`` at ``fin``, -1 after) and
    its emitted count ``fin + 1``, where ``mask``."""
    ks = tl.arange(0, KP)[None, :]
    out = tl.where(ks < fin[:, None], x, tl.where(ks == fin[:, None], token[:, None], -1))
    tl.store(tokens + r[:, None] * (K + 1) + ks, out, mask=mask[:, None] & (ks <= K))
    tl.store(emitted + r, fin + 1, mask=mask)


@triton.jit
def finalize(partials, size, f_m, f_s, f_arg, f_nan, rows, mask, good, scale, NSPLIT: tl.constexpr):
    """Merge the ``NSPLIT`` partials of ``rows`` (the four arrays of ``size`` at ``partials``)
    and store their final statistics, as ``_combine_kernel`` does (``combine_rows``). Returns
    them as ``final_stats`` loads them back (the same bits) where ``good``, else 0."""
    p_m, p_s, p_arg, p_nan = stats_at(partials, size)
    m, s, arg, nan = combine_rows(
        p_m, p_s, p_arg, p_nan, rows, mask, scale + tl.zeros(rows.shape, tl.float32), f_m, f_s, f_arg, f_nan, NSPLIT, 0
    )
    bad = good & ((nan != 0) | (s == 0))  # as _store_final stores them
    return tl.where(good, m, 0.0), tl.where(good, tl.log(s), 0.0), tl.where(bad | ~good, 0, arg).to(tl.int64), bad


@triton.jit
def final_arrays(scratch, t_size, d_off, d_size, f_off, T_NSPLIT: tl.constexpr, D_NSPLIT: tl.constexpr):
    """Final statistics' arrays: the stats kernel's own where one split, else the chain kernel's."""
    d_fin = f_off  # the draft's finals follow the target's, where the target has any
    if T_NSPLIT > 1:
        t_m, t_s, t_arg, t_nan = stats_at(scratch + f_off, t_size // T_NSPLIT)
        d_fin = f_off + 4 * (t_size // T_NSPLIT)
    else:
        t_m, t_s, t_arg, t_nan = stats_at(scratch, t_size)
    if D_NSPLIT > 1:
        d_m, d_s, d_arg, d_nan = stats_at(scratch + d_fin, d_size // D_NSPLIT)
    else:
        d_m, d_s, d_arg, d_nan = stats_at(scratch + d_off, d_size)
    return t_m, t_s, t_arg, t_nan, d_m, d_s, d_arg, d_nan


# --- the pick -------------------------------------------------------------------------------------
@triton.jit
def _draw(
    t_logits, t_stride, V, d_logits, d_stride, Vd, d_m, d_s, d_arg, d_nan, drafts, positions,
    mass_w, m_size, r, start, trow, slot, m, logs, rho, act, scale, seed, K, n_tiles,
    STREAM: tl.constexpr, HAS_DRAFT: tl.constexpr, NT: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """One draw per active lane from target row ``trow`` (or its residual, rho >= 0) with the
    masses ``_fused_mass_kernel`` summed for ``slot``, by the uniform of (seed, position, STREAM)."""
    j_trow, j_drow, j_m, j_logs2, j_dm, j_dlogs2, j_scale, j_rho, j_active, j_resid, j_use_draft, j_excl = job(
        d_m, d_s, d_arg, d_nan, drafts, trow, start + slot, m, logs, rho, act, scale, HAS_DRAFT
    )
    u = uniform(seed, tl.load(positions + trow, mask=act, other=0), STREAM)
    at = (r * (K + 1) + slot) * n_tiles
    token, _ = draw_from_tiles(
        t_logits, t_stride, V, d_logits, d_stride, Vd, j_trow, j_drow, j_m, j_logs2, j_dm, j_dlogs2, j_scale, j_rho,
        j_active, j_resid, j_use_draft, j_excl, act, mass_w + at, mass_w + m_size + at, u, n_tiles, HAS_DRAFT, 0, NT, BLOCK_V,
    )  # fmt: skip
    return token


@triton.jit
def pick(
    t_logits, t_stride, V, d_logits, d_stride, Vd, positions, drafts, K, B, scratch, t_size, d_off, d_size, m_off,
    m_size, c_off, n_tiles, f_off, tokens, emitted, r, valid, start, cnt, temp, seed, method, n, rejected, n_eff, kept,
    HAS_DRAFT: tl.constexpr, HAS_STRICT: tl.constexpr, HAS_BLOCK: tl.constexpr, T_NSPLIT: tl.constexpr,
    D_NSPLIT: tl.constexpr, KP: tl.constexpr, NT: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """Strict requests' target samples, block verification's stop, the final draw and every
    output slot of the requests ``r``, from the chain (``n``, ``rejected``, ``n_eff`` int32; a
    rejection's ``kept`` candidate, -1 none) as ``_fused_chain_kernel`` decided it and the
    masses of ``_fused_mass_kernel``."""
    t_m, t_s, t_arg, t_nan, d_m, d_s, d_arg, d_nan = final_arrays(scratch, t_size, d_off, d_size, f_off, T_NSPLIT, D_NSPLIT)
    ks = tl.arange(0, KP)[None, :]
    x = tl.load(drafts + start[:, None] + ks, mask=valid[:, None] & (ks < cnt[:, None]), other=-1)
    chain = scratch + c_off
    greedy = temp == 0
    inv_t = inv_temperature(temp)
    scale = inv_t * LOG2E
    row0 = start + r
    mass_w = scratch + m_off
    fin = n  # the row of the emitted token
    rho_fin = tl.where(rejected, 1.0, -1.0)
    strict_rejected = valid & False
    strict_token = tl.zeros_like(start)
    if HAS_STRICT:
        # Strict: accept while the target's own sample (stream TARGET) equals the draft.
        strict = valid & (method == METHOD_STRICT)
        live = strict
        accepted = tl.zeros_like(n)
        for k in range(0, tl.max(tl.where(strict, n_eff, 0), axis=0)):
            xk = _column(x, tl.zeros_like(n) + k, KP)
            act = live & (xk >= 0)
            m, logs, arg, bad = final_stats(t_m, t_s, t_arg, t_nan, row0 + k, act)
            point = greedy | bad
            y = arg
            need = act & ~point
            if tl.max(need.to(tl.int32), axis=0) > 0:
                drawn = _draw(
                    t_logits, t_stride, V, d_logits, d_stride, Vd, d_m, d_s, d_arg, d_nan, drafts,
                    positions, mass_w, m_size, r, start, row0 + k, tl.zeros_like(n) + k, m, logs, tl.full(temp.shape, -1.0, tl.float32),
                    need, scale, seed, K, n_tiles, STREAM_TARGET, HAS_DRAFT, NT, BLOCK_V,
                )  # fmt: skip
                y = tl.where(point, arg, drawn)
            ok = y == xk
            accepted = tl.where(act & ok, k + 1, accepted)
            strict_rejected = strict_rejected | (act & ~ok)
            strict_token = tl.where(act, y, strict_token)
            live = act & ok
        fin = tl.where(strict, accepted, fin)
        rho_fin = tl.where(strict, -1.0, rho_fin)
    if HAS_BLOCK:
        # Block verification's stop: the last i with eta_i <= h_i (``_block_kernel``).
        blk = valid & (method == METHOD_BLOCK)
        stop = tl.zeros_like(n)
        for i in range(1, tl.max(tl.where(blk, n_eff, 0), axis=0) + 1):
            live = blk & (i <= n_eff)
            inner = live & (i < n_eff)
            rho = tl.load(chain + 3 * B + r * (K + 1) + i, mask=live, other=1.0).to(tl.float32)
            row = row0 + i
            _m, _logs, pt, bad = final_stats(t_m, t_s, t_arg, t_nan, row, inner)
            point = greedy | bad
            # A point-mass target row (T = 0 or degenerate): R = max(rho - draft(pt), 0).
            if HAS_DRAFT:
                dm, dlogs, darg, dbad = final_stats(d_m, d_s, d_arg, d_nan, start + i, inner & point)
                q_pt = tl.exp(_lp(d_logits, d_stride, Vd, dm, dlogs, darg, dbad, start + i, pt, inv_t, greedy, inner & point))
            else:
                q_pt = (tl.load(drafts + start + i, mask=inner & point, other=-1) == pt).to(tl.float32)
            mass = tl.where(point, tl.maximum(rho - q_pt, 0.0), 0.0).to(tl.float64)
            mass += tl.sum(tile_masses(mass_w + (r * (K + 1) + i) * n_tiles, n_tiles, inner & ~point, NT), axis=1)
            denom = mass + 1.0 - rho
            h = tl.where(inner, tl.where(denom > 0, mass / tl.where(denom > 0, denom, 1.0), 1.0), rho)
            eta = uniform(seed, tl.load(positions + row - 1, mask=live, other=0), STREAM_BLOCK)
            stop = tl.where(live & (eta <= h), i, stop)
        fin = tl.where(blk, stop, fin)
        rho_stop = tl.load(chain + 3 * B + r * (K + 1) + stop, mask=blk, other=1.0).to(tl.float32)
        rho_fin = tl.where(blk, tl.where(stop == n_eff, -1.0, rho_stop), rho_fin)
    # The emitted token. A draw from the target row may be on the request's last row, which has
    # no statistics: its max, degenerate flag and argmax come from the mass kernel's tiles (the
    # staged path's final statistics exactly: a max and a first index do not depend on the order).
    # The masses load beside the statistics, not after them: a point-mass row's slots (never
    # written) are read but not used.
    from_tiles = valid & (rho_fin < 0) & ~strict_rejected
    row = row0 + fin
    may_draw = valid & ~strict_rejected & (kept < 0)
    m, logs, pt, bad = final_stats(t_m, t_s, t_arg, t_nan, row, valid & ~from_tiles)
    j_trow, j_drow, j_m, j_logs2, j_dm, j_dlogs2, j_scale, j_rho, j_active, j_resid, j_use_draft, j_excl = job(
        d_m, d_s, d_arg, d_nan, drafts, row, start + fin, m, logs, rho_fin, may_draw, scale, HAS_DRAFT
    )
    at = (r * (K + 1) + fin) * n_tiles
    tiles, use_w, row_m, tiles_bad, first = job_tile_masses(mass_w + at, mass_w + m_size + at, n_tiles, may_draw, j_resid, j_scale, NT)
    bad = tl.where(from_tiles, tiles_bad, bad)
    greedy_tiles = from_tiles & greedy & ~tiles_bad
    if tl.max(greedy_tiles.to(tl.int32), axis=0) > 0:  # the lowest id holding the max, in the first tile holding it
        cols = tl.where(greedy_tiles, first, 0)[:, None] * BLOCK_V + tl.arange(0, BLOCK_V)[None, :]
        a = tl.load(t_logits + row.to(tl.int64)[:, None] * t_stride + cols, mask=greedy_tiles[:, None] & (cols < V), other=float("-inf"))
        tiles_arg = tl.min(tl.where(a.to(tl.float32) == row_m[:, None], cols, NO_ID), axis=1)
        pt = tl.where(greedy_tiles, tiles_arg.to(tl.int64), pt)
    pt = tl.where(from_tiles & tiles_bad, 0, pt)  # a degenerate row's token, as _store_final's
    token = tl.where(strict_rejected, strict_token, pt)
    draw = may_draw & ~(greedy | bad)
    if tl.max(draw.to(tl.int32), axis=0) > 0:
        u = uniform(seed, tl.load(positions + row, mask=draw, other=0), STREAM_RESIDUAL)
        drawn = draw_from_masses(
            t_logits, t_stride, V, d_logits, d_stride, Vd, j_trow, j_drow, j_m, j_logs2, j_dm, j_dlogs2, j_scale, j_rho,
            j_active, j_resid, j_use_draft, j_excl, tiles, use_w, u, HAS_DRAFT, 0, BLOCK_V,
        )  # fmt: skip
        token = tl.where(draw, drawn, token)
    token = tl.where(kept >= 0, kept, token)
    store_outputs(tokens, emitted, r, x, fin, token, valid, K, KP)

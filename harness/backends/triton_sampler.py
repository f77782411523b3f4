"""The suite's own Triton sampler: every verification method behind the protocol (``triton``).

Same output law as ``reference.sampler`` (not the same random numbers). One ``sample`` call
launches a fixed pipeline with no host synchronization:

1. ``_stats_kernel`` (+ ``_combine_kernel`` when the vocabulary is split over programs):
   per target and draft row, an online log-sum-exp of ``logits / T`` over vocabulary tiles
   (max, log of the sum of exponentials, argmax with ties to the lowest id, NaN flag).
2. ``_race_kernel`` on the rows of strict requests: the target's own sample ``y``.
3. ``_chain_kernel``: one lane per request, a loop over draft steps: acceptance of every
   chain method (standard, strict, synthetic; greedy is standard at T = 0), and the running
   ratios ``rho`` of block requests. Tokens fixed by a point mass (T = 0, a degenerate
   row, a strict rejection) are written here; the others become *jobs*.
4. Block requests only: ``_mass_kernel`` (residual masses of the inner rows) and
   ``_block_kernel`` (the stop position, Sun et al. 2024).
5. ``_race_kernel`` + ``_write_kernel``: the emitted token of every job.

Sampling is an exponential race: ``argmax_i w_i / E_i`` with ``E_i`` iid Exp(1) draws ``i``
with probability ``w_i / sum(w)`` for unnormalized weights, splits over tiles and
programs, and needs one pass. ``E_i`` comes from two 32-bit Philox words, accurate down to
about 2**-64, so a token ~1e-12 below the max is still drawn at its rate (vLLM #43150 was
fp32 noise never below 2**-24). All noise is keyed by (seed, position, stream, token id):
a request's output depends on its own inputs only.

Conventions follow ``reference``, with one deliberate difference: block verification's
running ratio stays 0 once 0 (``0 * inf = 0`` when a later draft has draft probability 0),
where the reference computes NaN (see ``TritonBackend`` notes).
"""

import numpy as np
import torch
import triton
import triton.language as tl

from reference.methods import Method
from reference.rng import Stream

_STRICT = tl.constexpr(int(Method.STRICT))
_BLOCK = tl.constexpr(int(Method.BLOCK))
_SYNTHETIC = tl.constexpr(int(Method.SYNTHETIC))
_ACCEPT = tl.constexpr(int(Stream.ACCEPT))
_RESIDUAL = tl.constexpr(int(Stream.RESIDUAL))
_TARGET = tl.constexpr(int(Stream.TARGET))
_BLOCK_STREAM = tl.constexpr(int(Stream.BLOCK))
_TWO_M32 = tl.constexpr(2.3283064365386963e-10)  # 2**-32
_TWO_M52 = tl.constexpr(2.220446049250313e-16)  # 2**-52
_MAX_INV_T = tl.constexpr(1e30)  # 1/T for tiny T: keeps (a - max) * inv_t finite, ties intact


# --- noise ------------------------------------------------------------------------------------
@triton.jit
def _philox_words(seed, position, stream: tl.constexpr, index):
    """Two 32-bit Philox words keyed by (seed, position, stream, index), broadcast together."""
    zero = seed * 0 + position * 0 + index * 0  # int64, the broadcast shape
    pos = position + zero
    c0 = (index + zero).to(tl.uint32)
    c1 = (pos & 0xFFFFFFFF).to(tl.uint32)
    c2 = (pos >> 32).to(tl.uint32)
    c3 = (zero + stream).to(tl.uint32)
    r0, r1, _, _ = tl.philox(seed + zero, c0, c1, c2, c3)
    return r0, r1


@triton.jit
def _uniform(seed, position, stream: tl.constexpr):
    """float64 uniform on (k + 0.5) * 2**-52: never 0 (a zero probability never passes
    ``u < p``) and never 1 (probability 1 always does)."""
    r0, r1 = _philox_words(seed, position, stream, position * 0)
    bits = (r0.to(tl.uint64) << 20) | (r1 >> 12).to(tl.uint64)
    return (bits.to(tl.float64) + 0.5) * _TWO_M52


@triton.jit
def _exponential(seed, position, stream: tl.constexpr, index):
    """Exp(1) noise in fp32, accurate in both tails.

    Small E decides whether a far-tail token wins a race, so it must reach far below fp32's
    2**-24 near 1: v = (r0 + (r1 + 1/2) 2**-32) 2**-32 resolves down to 2**-65, and
    E = -log1p(-v) is its Taylor series there. Elsewhere E = -log(1 - v), with 1 - v built
    exactly from the complemented words.
    """
    r0, r1 = _philox_words(seed, position, stream, index)
    v = (r0.to(tl.float32) + (r1.to(tl.float32) + 0.5) * _TWO_M32) * _TWO_M32
    c = ((r0 ^ 0xFFFFFFFF).to(tl.float32) + ((r1 ^ 0xFFFFFFFF).to(tl.float32) + 0.5) * _TWO_M32) * _TWO_M32
    series = v * (1.0 + v * (0.5 + v * (1.0 / 3.0 + v * (0.25 + v * (0.2 + v * (1.0 / 6.0))))))
    return tl.where(r0 < 0x10000000, series, -tl.log(c))  # series for v < 1/16


# --- per-row statistics -----------------------------------------------------------------------
@triton.jit
def _inv_temperature(temp):
    """fp32 1/T; greedy rows (T = 0) use 1 (their statistics only feed the argmax)."""
    safe = tl.where(temp > 0, temp, 1.0)
    return tl.minimum(1.0 / safe, _MAX_INV_T).to(tl.float32)


@triton.jit
def _stats_kernel(
    logits, stride, width, n_rows, row_req, temperature,
    out_m, out_s, out_arg, out_nan,
    split_len, NSPLIT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """Online max / sum-exp / argmax / NaN flag of ``BLOCK_R`` rows over one vocabulary split."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    split = tl.program_id(1)
    valid = rows < n_rows
    req = tl.load(row_req + rows, mask=valid, other=0)
    inv_t = _inv_temperature(tl.load(temperature + req, mask=valid, other=1.0))
    lo = split * split_len
    hi = tl.minimum(lo + split_len, width)
    base = logits + rows.to(tl.int64)[:, None] * stride
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_R], tl.float32)
    arg = tl.zeros([BLOCK_R], tl.int32)
    nan = tl.zeros([BLOCK_R], tl.int32)
    for start in range(lo, hi, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        mask = valid[:, None] & (cols < hi)[None, :]
        a = tl.load(base + cols[None, :], mask=mask, other=float("-inf")).to(tl.float32)
        nan = tl.maximum(nan, tl.max((a != a).to(tl.int32), axis=1))
        tile_max = tl.max(a, axis=1)
        tile_arg = tl.argmax(a, axis=1, tie_break_left=True)
        arg = tl.where(tile_max > m, start + tile_arg, arg)  # strict: earlier tiles win ties
        new_m = tl.maximum(m, tile_max)
        ref = tl.where(new_m == float("-inf"), 0.0, new_m)  # all masked so far: sums stay 0
        s = s * tl.exp((m - ref) * inv_t) + tl.sum(tl.exp((a - ref[:, None]) * inv_t[:, None]), axis=1)
        m = new_m
    if NSPLIT == 1:
        _store_final(rows, valid, m, s, arg, nan, out_m, out_s, out_arg, out_nan)
    else:
        part = rows * NSPLIT + split
        tl.store(out_m + part, m, mask=valid)
        tl.store(out_s + part, s, mask=valid)
        tl.store(out_arg + part, arg, mask=valid)
        tl.store(out_nan + part, nan, mask=valid)


@triton.jit
def _store_final(rows, valid, m, s, arg, nan, out_m, out_logs, out_arg, out_bad):
    """Final row statistics; a row with a NaN or no finite logit is degenerate (token 0)."""
    bad = (nan != 0) | (m == float("-inf"))
    tl.store(out_m + rows, m, mask=valid)
    tl.store(out_logs + rows, tl.log(s), mask=valid)
    tl.store(out_arg + rows, tl.where(bad, 0, arg), mask=valid)
    tl.store(out_bad + rows, bad.to(tl.int8), mask=valid)


@triton.jit
def _combine_kernel(
    n_rows, row_req, temperature, part_m, part_s, part_arg, part_nan,
    out_m, out_logs, out_arg, out_bad, NSPLIT: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """Merge the vocabulary splits of ``_stats_kernel`` (in split order: lowest id wins ties)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    valid = rows < n_rows
    req = tl.load(row_req + rows, mask=valid, other=0)
    inv_t = _inv_temperature(tl.load(temperature + req, mask=valid, other=1.0))
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_R], tl.float32)
    arg = tl.zeros([BLOCK_R], tl.int32)
    nan = tl.zeros([BLOCK_R], tl.int32)
    for k in tl.static_range(NSPLIT):
        part = rows * NSPLIT + k
        mk = tl.load(part_m + part, mask=valid, other=float("-inf"))
        sk = tl.load(part_s + part, mask=valid, other=0.0)
        arg = tl.where(mk > m, tl.load(part_arg + part, mask=valid, other=0), arg)
        nan = tl.maximum(nan, tl.load(part_nan + part, mask=valid, other=0))
        new_m = tl.maximum(m, mk)
        ref = tl.where(new_m == float("-inf"), 0.0, new_m)
        s = s * tl.exp((m - ref) * inv_t) + sk * tl.exp((mk - ref) * inv_t)
        m = new_m
    _store_final(rows, valid, m, s, arg, nan, out_m, out_logs, out_arg, out_bad)


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


# --- jobs: races and residual masses over one row ---------------------------------------------
@triton.jit
def _load_job(job_trow, job_req, job_rho, jobs, mask, drafts, d_bad, HAS_DRAFT: tl.constexpr):
    """A job draws from (or sums) one target row: rho < 0 is the target row itself, rho >= 0
    the residual max(rho * target - draft, 0) against the draft at the same position (the
    draft row when given and not degenerate, else the one-hot of ``excl``)."""
    trow = tl.load(job_trow + jobs, mask=mask, other=-1)
    active = mask & (trow >= 0)
    req = tl.load(job_req + jobs, mask=active, other=0)
    rho = tl.load(job_rho + jobs, mask=active, other=-1.0)
    resid = active & (rho >= 0)
    drow = trow - req  # draft row of target row ``row_start + k`` is ``cu[req] + k``
    if HAS_DRAFT:
        dbad = tl.load(d_bad + drow, mask=resid, other=0) != 0
        use_draft = resid & ~dbad
        excl = tl.where(resid & dbad, 0, -1).to(tl.int64)  # degenerate draft: one-hot on 0
    else:
        use_draft = resid & False
        excl = tl.load(drafts + drow, mask=resid, other=-1)
    return trow, req, rho, active, resid, drow, use_draft, excl


@triton.jit
def _tile_weights(
    t_logits, t_stride, d_logits, d_stride, d_width, trow, drow, m, logs, dm, dlogs, inv_t,
    rho, active, resid, use_draft, excl, cols, in_range, HAS_DRAFT: tl.constexpr,
):  # fmt: skip
    """Target probabilities ``t`` and job weights ``w`` of a [rows, cols] tile (0 off-row)."""
    a = tl.load(t_logits + trow.to(tl.int64) * t_stride + cols, mask=active & in_range, other=float("-inf"))
    t = tl.exp((a.to(tl.float32) - m) * inv_t - logs)
    q = tl.zeros_like(t)
    if HAS_DRAFT:
        dmask = use_draft & in_range & (cols < d_width)
        b = tl.load(d_logits + drow.to(tl.int64) * d_stride + cols, mask=dmask, other=float("-inf"))
        q = tl.exp((b.to(tl.float32) - dm) * inv_t - dlogs)
    w = tl.where(resid, tl.maximum(rho * t - q, 0.0), t)
    return tl.where(resid & (cols == excl), 0.0, w), t


@triton.jit
def _job_rows(
    job_trow, job_req, job_rho, n_jobs, temperature, drafts,
    t_m, t_logs, d_m, d_logs, d_bad, HAS_DRAFT: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """Per-lane inputs of ``BLOCK_R`` jobs, as [BLOCK_R, 1] columns."""
    jobs = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    trow, req, rho, active, resid, drow, use_draft, excl = _load_job(job_trow, job_req, job_rho, jobs, jobs < n_jobs, drafts, d_bad, HAS_DRAFT)
    inv_t = _inv_temperature(tl.load(temperature + req, mask=active, other=1.0))
    m = tl.load(t_m + trow, mask=active, other=0.0)
    logs = tl.load(t_logs + trow, mask=active, other=0.0)
    dm = tl.load(d_m + drow, mask=use_draft, other=0.0)
    dlogs = tl.load(d_logs + drow, mask=use_draft, other=0.0)
    return (
        jobs, req, active, trow, trow[:, None], drow[:, None], m[:, None], logs[:, None], dm[:, None], dlogs[:, None],
        inv_t[:, None], rho[:, None], active[:, None], resid[:, None], use_draft[:, None], excl[:, None],
    )  # fmt: skip


@triton.jit
def _race_kernel(
    t_logits, t_stride, V, d_logits, d_stride, Vd, t_m, t_logs, d_m, d_logs, d_bad,
    job_trow, job_req, job_rho, n_jobs, temperature, seeds, positions, drafts,
    out_kr, out_ir, out_kt, out_it, split_len,
    STREAM: tl.constexpr, HAS_DRAFT: tl.constexpr, NSPLIT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """Exponential race over one vocabulary split of each job's row.

    Keeps two winners: of the job's weights, and of the target row under the same noise
    (the fallback when the residual is empty). Keys are ``w / E``: 0 means weight 0.
    """
    jobs, req, act, trow1, trow, drow, m, logs, dm, dlogs, inv_t, rho, active, resid, use_draft, excl = _job_rows(
        job_trow, job_req, job_rho, n_jobs, temperature, drafts, t_m, t_logs, d_m, d_logs, d_bad, HAS_DRAFT, BLOCK_R
    )
    seed = tl.load(seeds + req, mask=act, other=0)[:, None]
    pos = tl.load(positions + trow1, mask=act, other=0)[:, None]
    split = tl.program_id(1)
    lo = split * split_len
    hi = tl.minimum(lo + split_len, V)
    best_r = tl.zeros([BLOCK_R], tl.float32)
    best_t = tl.zeros([BLOCK_R], tl.float32)
    idx_r = tl.zeros([BLOCK_R], tl.int32)
    idx_t = tl.zeros([BLOCK_R], tl.int32)
    for start in range(lo, hi, BLOCK_V):
        cols = (start + tl.arange(0, BLOCK_V))[None, :]
        w, t = _tile_weights(
            t_logits, t_stride, d_logits, d_stride, Vd, trow, drow, m, logs, dm, dlogs, inv_t,
            rho, active, resid, use_draft, excl, cols, cols < hi, HAS_DRAFT,
        )  # fmt: skip
        e = _exponential(seed, pos, STREAM, cols)
        kr = w / e
        kt = t / e
        tile_r = tl.max(kr, axis=1)
        tile_t = tl.max(kt, axis=1)
        idx_r = tl.where(tile_r > best_r, start + tl.argmax(kr, axis=1, tie_break_left=True), idx_r)
        idx_t = tl.where(tile_t > best_t, start + tl.argmax(kt, axis=1, tie_break_left=True), idx_t)
        best_r = tl.maximum(best_r, tile_r)
        best_t = tl.maximum(best_t, tile_t)
    part = jobs * NSPLIT + split
    mask = jobs < n_jobs
    tl.store(out_kr + part, best_r, mask=mask)
    tl.store(out_ir + part, idx_r, mask=mask)
    tl.store(out_kt + part, best_t, mask=mask)
    tl.store(out_it + part, idx_t, mask=mask)


@triton.jit
def _race_pick(kr, ir, kt, it, jobs, mask, NSPLIT: tl.constexpr):
    """Winner of a job's race over all splits; the target's winner when the residual is empty."""
    best_r = tl.zeros(jobs.shape, tl.float32)
    best_t = tl.zeros(jobs.shape, tl.float32)
    tok_r = tl.zeros(jobs.shape, tl.int32)
    tok_t = tl.zeros(jobs.shape, tl.int32)
    for k in tl.static_range(NSPLIT):
        part = jobs * NSPLIT + k
        key_r = tl.load(kr + part, mask=mask, other=0.0)
        key_t = tl.load(kt + part, mask=mask, other=0.0)
        tok_r = tl.where(key_r > best_r, tl.load(ir + part, mask=mask, other=0), tok_r)
        tok_t = tl.where(key_t > best_t, tl.load(it + part, mask=mask, other=0), tok_t)
        best_r = tl.maximum(best_r, key_r)
        best_t = tl.maximum(best_t, key_t)
    return tl.where(best_r > 0, tok_r, tok_t).to(tl.int64)


@triton.jit
def _mass_kernel(
    t_logits, t_stride, V, d_logits, d_stride, Vd, t_m, t_logs, d_m, d_logs, d_bad,
    job_trow, job_req, job_rho, n_jobs, temperature, drafts, out_mass, split_len,
    HAS_DRAFT: tl.constexpr, NSPLIT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """Mass of each job's block residual over one vocabulary split."""
    jobs, req, act, trow1, trow, drow, m, logs, dm, dlogs, inv_t, rho, active, resid, use_draft, excl = _job_rows(
        job_trow, job_req, job_rho, n_jobs, temperature, drafts, t_m, t_logs, d_m, d_logs, d_bad, HAS_DRAFT, BLOCK_R
    )
    split = tl.program_id(1)
    lo = split * split_len
    hi = tl.minimum(lo + split_len, V)
    mass = tl.zeros([BLOCK_R], tl.float32)
    for start in range(lo, hi, BLOCK_V):
        cols = (start + tl.arange(0, BLOCK_V))[None, :]
        w, _ = _tile_weights(
            t_logits, t_stride, d_logits, d_stride, Vd, trow, drow, m, logs, dm, dlogs, inv_t,
            rho, active, resid, use_draft, excl, cols, cols < hi, HAS_DRAFT,
        )  # fmt: skip
        mass += tl.sum(w, axis=1)
    tl.store(out_mass + jobs * NSPLIT + split, mass, mask=jobs < n_jobs)


# --- verification -----------------------------------------------------------------------------
@triton.jit
def _chain_kernel(
    t_logits, t_stride, V, d_logits, d_stride, Vd,
    t_m, t_logs, t_arg, t_bad, d_m, d_logs, d_arg, d_bad,
    cu, temperature, seeds, positions, methods, drafts, rates, K, B,
    y_kr, y_ir, y_kt, y_it,
    tokens, emitted, fin_trow, fin_rho, rho_buf, mass_trow, mass_rho,
    HAS_DRAFT: tl.constexpr, HAS_STRICT: tl.constexpr, HAS_SYNTH: tl.constexpr, HAS_BLOCK: tl.constexpr,
    NSPLIT: tl.constexpr, BLOCK_R: tl.constexpr,
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
    seed = tl.load(seeds + r, mask=valid, other=0)
    method = tl.load(methods + r, mask=valid, other=0).to(tl.int32)
    block = method == _BLOCK
    chain = valid & ~block
    live = chain  # chain lanes still verifying
    n = tl.zeros([BLOCK_R], tl.int64)  # drafts accepted
    rejected = valid & False
    strict_token = tl.zeros([BLOCK_R], tl.int64)
    blive = valid & block
    rho = tl.full([BLOCK_R], 1.0, tl.float32)
    width = K + 1
    for k in range(0, K):
        x = tl.load(drafts + start + k, mask=valid & (k < cnt), other=-1)  # -1: placeholder or none
        act = live & (x >= 0)
        bact = blive & (x >= 0)
        row = row0 + k
        both = act | bact
        lt = _logprob(t_logits, t_stride, V, t_m, t_logs, t_arg, t_bad, row, x, inv_t, greedy, both)
        lq = tl.zeros([BLOCK_R], tl.float32)
        if HAS_DRAFT:
            lq = _logprob(d_logits, d_stride, Vd, d_m, d_logs, d_arg, d_bad, start + k, x, inv_t, greedy, both)
        pos = tl.load(positions + row, mask=both, other=0)
        u = _uniform(seed, pos, _ACCEPT)
        # standard: min(1, t/q), t/0 = inf for t > 0, 0/0 = 0; no draft row: q(x) = 1
        ok = u < tl.where(lt == float("-inf"), 0.0, tl.exp(tl.minimum(lt - lq, 0.0))).to(tl.float64)
        if HAS_STRICT:
            point, pt = _row_point(t_arg, t_bad, row, greedy, act)
            is_strict = method == _STRICT
            y = tl.where(point, pt, _race_pick(y_kr, y_ir, y_kt, y_it, row, act & is_strict & ~point, NSPLIT))
            ok = tl.where(is_strict, y == x, ok)
            strict_token = tl.where(act & is_strict, y, strict_token)
        if HAS_SYNTH:
            rate = tl.load(rates + r * K + k, mask=act & (method == _SYNTHETIC), other=0.0)
            ok = tl.where(method == _SYNTHETIC, u < rate, ok)
        tl.store(tokens + r * width + k, x, mask=act & ok)
        n = tl.where(act & ok, k + 1, n)
        rejected = rejected | (act & ~ok)
        live = act & ok
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
    point, pt = _row_point(t_arg, t_bad, final, greedy, chain)
    known = point
    token = pt
    if HAS_STRICT:
        strict_rejection = rejected & (method == _STRICT)
        known = known | strict_rejection
        token = tl.where(strict_rejection, strict_token, pt)
    tl.store(tokens + r * width + n, token, mask=chain & known)
    tl.store(emitted + r, n + 1, mask=chain)
    tl.store(fin_trow + r, tl.where(known, -1, final), mask=chain)
    tl.store(fin_rho + r, tl.where(rejected, 1.0, -1.0), mask=chain)


@triton.jit
def _block_kernel(
    d_logits, d_stride, Vd, t_arg, t_bad, d_m, d_logs, d_arg, d_bad,
    cu, temperature, seeds, positions, methods, drafts, K, B,
    mass_part, rho_buf, tokens, emitted, fin_trow, fin_rho,
    HAS_DRAFT: tl.constexpr, NSPLIT: tl.constexpr, BLOCK_R: tl.constexpr,
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
    seed = tl.load(seeds + r, mask=blk, other=0)
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
        mass = tl.where(point, tl.maximum(rho - q_pt, 0.0), 0.0)
        for k in tl.static_range(NSPLIT):
            mass += tl.load(mass_part + row * NSPLIT + k, mask=inner & ~point, other=0.0)
        denom = mass + 1.0 - rho
        h = tl.where(inner, tl.where(denom > 0, mass / tl.where(denom > 0, denom, 1.0), 1.0), rho)
        eta = _uniform(seed, tl.load(positions + row - 1, mask=live, other=0), _BLOCK_STREAM)
        stop = tl.where(live & (eta <= h.to(tl.float64)), i, stop)
    for j in range(0, K):
        x = tl.load(drafts + start + j, mask=blk & (j < stop), other=-1)
        tl.store(tokens + r * width + j, x, mask=blk & (j < stop))
    final = row0 + stop
    point, pt = _row_point(t_arg, t_bad, final, greedy, blk)
    rho_stop = tl.load(rho_buf + r * width + stop, mask=blk, other=1.0)
    tl.store(tokens + r * width + stop, pt, mask=blk & point)
    tl.store(emitted + r, stop + 1, mask=blk)
    tl.store(fin_trow + r, tl.where(point, -1, final), mask=blk)
    tl.store(fin_rho + r, tl.where(stop == n_eff, -1.0, rho_stop), mask=blk)


@triton.jit
def _write_kernel(fin_trow, kr, ir, kt, it, tokens, emitted, K, B, NSPLIT: tl.constexpr, BLOCK_R: tl.constexpr):
    """Emit each job's race winner in the request's last slot."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    valid = r < B
    active = valid & (tl.load(fin_trow + r, mask=valid, other=-1) >= 0)
    token = _race_pick(kr, ir, kt, it, r, active, NSPLIT)
    slot = tl.load(emitted + r, mask=active, other=1) - 1
    tl.store(tokens + r * (K + 1) + slot, token, mask=active)


# --- host side ----------------------------------------------------------------------------------
def _tiles(vocab: int, cuda: bool) -> tuple[int, int, int, int]:
    """(BLOCK_V, BLOCK_R, NSPLIT, split_len) from the vocabulary alone, so that a request's
    reductions (hence its output) never depend on its batch mates."""
    block_v = min(triton.next_power_of_2(vocab), 4096 if cuda else 8192)
    block_r = max(1, (4096 if cuda else 1 << 15) // block_v)
    nsplit = max(1, min(8, vocab // 32768)) if cuda else 1
    split_len = triton.cdiv(triton.cdiv(vocab, nsplit), block_v) * block_v
    return block_v, block_r, triton.cdiv(vocab, split_len), split_len


class _Stats:
    """Final per-row statistics: max logit, log of the sum of exp((a - max) / T), argmax, degenerate flag."""

    def __init__(self, logits, row_req, temperature, cuda: bool):
        rows, width = logits.shape
        dev = logits.device
        self.m = torch.empty(rows, dtype=torch.float32, device=dev)
        self.logs = torch.empty(rows, dtype=torch.float32, device=dev)
        self.arg = torch.empty(rows, dtype=torch.int32, device=dev)
        self.bad = torch.empty(rows, dtype=torch.int8, device=dev)
        if rows == 0:
            return
        block_v, block_r, nsplit, split_len = _tiles(width, cuda)
        grid = (triton.cdiv(rows, block_r), nsplit)
        warps = 8 if cuda and block_v >= 2048 else 4
        if nsplit == 1:
            outs = (self.m, self.logs, self.arg, self.bad)
        else:
            outs = tuple(torch.empty(rows * nsplit, dtype=d, device=dev) for d in (torch.float32, torch.float32, torch.int32, torch.int32))
        _stats_kernel[grid](logits, logits.stride(0), width, rows, row_req, temperature, *outs, split_len, nsplit, block_r, block_v, num_warps=warps)
        if nsplit > 1:
            rb = 256 if cuda else 4096
            _combine_kernel[(triton.cdiv(rows, rb),)](rows, row_req, temperature, *outs, self.m, self.logs, self.arg, self.bad, nsplit, rb)


def verify(
    target_logits, draft_logits, draft_tokens, cu_num_drafts, temperature, seeds, positions, methods,
    synthetic_rates, max_drafts: int, *, has_strict: bool = True, has_block: bool = True, has_synthetic: bool = True,
):  # fmt: skip
    """Device-side verification of one batch of torch tensors (``VerifyBatch`` layout).

    The ``has_*`` flags only skip work (a method absent from the batch); leaving them True
    is always correct. Returns ``(tokens [B, K+1] int64, num_emitted [B] int64)``; slots
    past ``num_emitted`` hold -1.
    """
    dev = target_logits.device
    cuda = dev.type == "cuda"
    b = cu_num_drafts.numel() - 1
    k = int(max_drafts)
    vocab = target_logits.shape[1]
    tokens = torch.full((b, k + 1), -1, dtype=torch.int64, device=dev)
    emitted = torch.zeros(b, dtype=torch.int64, device=dev)
    if b == 0:
        return tokens, emitted
    n_target = target_logits.shape[0]
    n_draft = draft_tokens.numel()
    has_draft = draft_logits is not None
    has_synthetic = has_synthetic and synthetic_rates is not None
    temperature = temperature.to(torch.float64)
    # Request of every target row (row_start[r] = cu[r] + r) and of every draft row.
    row_start = cu_num_drafts + torch.arange(b + 1, device=dev)
    t_req = torch.searchsorted(row_start, torch.arange(n_target, device=dev), right=True) - 1
    d_req = torch.searchsorted(cu_num_drafts, torch.arange(n_draft, device=dev), right=True) - 1
    t_stats = _Stats(target_logits, t_req, temperature, cuda)
    d_stats = _Stats(draft_logits, d_req, temperature, cuda) if has_draft else t_stats
    d_logits = draft_logits if has_draft else target_logits
    d_width = draft_logits.shape[1] if has_draft else vocab
    block_v, block_r, nsplit, split_len = _tiles(vocab, cuda)
    warps = 8 if cuda and block_v >= 2048 else 4
    req_block = 64 if cuda else 4096
    rates = synthetic_rates if has_synthetic else temperature
    common = (target_logits, target_logits.stride(0), vocab, d_logits, d_logits.stride(0), d_width, t_stats.m, t_stats.logs, d_stats.m, d_stats.logs, d_stats.bad)

    def race(job_trow, job_req, job_rho, stream):
        n_jobs = job_trow.numel()
        parts = [torch.empty(n_jobs * nsplit, dtype=d, device=dev) for d in (torch.float32, torch.int32) * 2]
        grid = (triton.cdiv(n_jobs, block_r), nsplit)
        _race_kernel[grid](
            *common, job_trow, job_req, job_rho, n_jobs, temperature, seeds, positions, draft_tokens,
            *parts, split_len, stream, has_draft, nsplit, block_r, block_v, num_warps=warps,
        )  # fmt: skip
        return parts

    # The strict target samples y of every row of a strict request (point rows need none).
    y_parts = [tokens] * 4
    if has_strict:
        strict_rows = (methods[t_req] == int(Method.STRICT)) & (temperature[t_req] > 0)
        all_rows = torch.arange(n_target, device=dev)
        y_parts = race(torch.where(strict_rows, all_rows, -1), t_req, torch.full((n_target,), -1.0, device=dev), int(Stream.TARGET))

    fin_trow = torch.empty(b, dtype=torch.int64, device=dev)
    fin_rho = torch.empty(b, dtype=torch.float32, device=dev)
    rho_buf = torch.ones((b, k + 1), dtype=torch.float32, device=dev) if has_block else fin_rho
    mass_trow = torch.full((n_target,), -1, dtype=torch.int64, device=dev) if has_block else fin_trow
    mass_rho = torch.zeros(n_target, dtype=torch.float32, device=dev) if has_block else fin_rho
    grid_req = (triton.cdiv(b, req_block),)
    _chain_kernel[grid_req](
        target_logits, target_logits.stride(0), vocab, d_logits, d_logits.stride(0), d_width,
        t_stats.m, t_stats.logs, t_stats.arg, t_stats.bad, d_stats.m, d_stats.logs, d_stats.arg, d_stats.bad,
        cu_num_drafts, temperature, seeds, positions, methods, draft_tokens, rates, k, b,
        *y_parts, tokens, emitted, fin_trow, fin_rho, rho_buf, mass_trow, mass_rho,
        has_draft, has_strict, has_synthetic, has_block, nsplit, req_block,
    )  # fmt: skip
    if has_block:
        mass = torch.empty(n_target * nsplit, dtype=torch.float32, device=dev)
        _mass_kernel[(triton.cdiv(n_target, block_r), nsplit)](
            *common, mass_trow, t_req, mass_rho, n_target, temperature, draft_tokens, mass, split_len,
            has_draft, nsplit, block_r, block_v, num_warps=warps,
        )  # fmt: skip
        _block_kernel[grid_req](
            d_logits, d_logits.stride(0), d_width, t_stats.arg, t_stats.bad, d_stats.m, d_stats.logs, d_stats.arg, d_stats.bad,
            cu_num_drafts, temperature, seeds, positions, methods, draft_tokens, k, b,
            mass, rho_buf, tokens, emitted, fin_trow, fin_rho, has_draft, nsplit, req_block,
        )  # fmt: skip
    parts = race(fin_trow, torch.arange(b, device=dev), fin_rho, int(Stream.RESIDUAL))
    _write_kernel[grid_req](fin_trow, *parts, tokens, emitted, k, b, nsplit, req_block)
    return tokens, emitted


class TritonBackend:
    """Greedy, strict, standard (with or without draft logits), block and synthetic in Triton.

    ``device`` is "cpu" (Triton interpreter, TRITON_INTERPRET=1) or "cuda"; the runner sets it.
    Known difference from the reference: when a block request's running ratio is 0 and a
    later draft has draft probability 0 (``0 * inf``), the ratio stays 0 here; the reference
    computes NaN, which makes ``h = 1`` and can accept a zero-probability draft.
    """

    name = "triton"
    devices = ("cpu", "cuda")

    def __init__(self, device: str = "cpu"):
        self.device = device

    def sample(self, batch):
        methods = np.asarray(batch.methods)
        t = batch.to_torch(self.device)
        return verify(
            t["target_logits"], t["draft_logits"], t["draft_tokens"], t["cu_num_drafts"], t["temperature"], t["seeds"],
            t["positions"], t["methods"], t["synthetic_rates"], batch.max_drafts,
            has_strict=bool((methods == Method.STRICT).any()),
            has_block=bool((methods == Method.BLOCK).any()),
            has_synthetic=bool((methods == Method.SYNTHETIC).any()),
        )  # fmt: skip

"""The fused path of the suite's Triton sampler (``verify(..., path="fused")``).

The staged pipeline of ``harness.backends.triton.sampler`` launches up to ten kernels per
call (row statistics and their merge for target and draft, owners, chain, strict draws,
block masses and stop, draw masses and pick) and allocates a dozen tensors. This path does
the same work for every method in three to five launches, three allocations (outputs and
one float64 scratch) and no host synchronization; on sm_90+ each launch after the first is
programmatic (``_PDL``: it starts while the previous kernel runs and waits for it on the device,
``gdc_wait``). Where a pick kernel follows, the mass kernel starts beside the candidate kernel
(which lets it launch before its own ``gdc_wait``; beside the chain kernel where no candidate
kernel runs), and each mass program waits only for its request block, on flags (``_raise``,
``_await``: release and acquire, gpu scope; the statistics kernel lowers them each call, the
scratch is not zeroed):
* the chain kernel's, raised once the block's chain is stored (2 if one of its requests
  rejected, else 1; with one request per block and no strict or block requests 1 + rejected +
  2 n, so that a mass program loads nothing of the chain: ``_flag_chain``): a kernel two
  programmatic launches behind may start before the first has
  ended (``benchmarks/pdl_overlap.py``, ``benchmarks/RESULTS.md#programmatic-launch-overlap``: on
  an H100, in 8 of 10 tries the third of three kernels started 12-25 us before the first ended
  and read its flag unset);
* after a rejection, the candidate kernel's (1; under ``_flag_chain`` 1 + (a candidate kept)):
  a mass program would otherwise sum the masses of a request whose candidate is kept, and the
  pick kernel, which waits for the whole mass kernel, could read the block's candidates before
  they are stored.
The candidate programs of a block without a rejection are waited for by no later kernel of the
call: they only raise their flag, and work launched after the call without PDL (the next call's
statistics kernel; PyTorch's kernels, which may reuse the scratch) waits for them. A ``gdc_wait``
ending each mass program would close that, at 2.4-2.9 us of 127-145 at B = 256, K = 1 on an H100.
At B = 256, K = 1, V = 131072 on an H100 the wait for the whole candidate kernel had cost 6.9 us
of 134.4; having the candidate kernel wait for the chain before the mass kernel may launch, with
no chain flag, cost 1.7 us of those back (both: ``benchmarks/RESULTS.md#tried-and-not-kept``). At up to
``_PICK_IN_MASS_MAX_BLOCKS`` blocks the flags' atomics cost more (0.6-1.0 us at B = 1) than
the wait they save, and the mass kernel waits with ``gdc_wait``:

1. ``_fused_stats_kernel``, grid ((request, step) blocks x runs of target and draft splits, the runs of
   a block consecutive):
   target row k or draft row k (k < the request's draft count) of request r over one split
   (several one after the other at large batches, ``_stats_splits_per_program``), by the
   staged path's own split loop (``_split_stats``; on CUDA a split is one
   tile, ``_stats_width``): final statistics when the vocabulary is one split, per-split
   partials otherwise. A request's last target row
   (the bonus row) gets none: only a draw from the target row uses it, and such a draw
   weighs each tile relative to the tile's own max (``_tile_weights``), so it reads that row
   once, in the mass kernel, instead of twice. With residual candidates (``candidates_for``)
   the target rows' tiles also store their group sums (``_grouped_stats_step``), and the
   kernel is capped at ``_STATS_MAX_REGISTERS`` on CUDA. Where every request has K drafts
   (``EQUAL_COUNTS``) a row's address is r (K + 1) + k or r K + k, and its reads wait for no
   load of ``cu``. With ``_STATS_EVICT_FIRST_MIN_DRAFTS`` to ``_STATS_EVICT_FIRST_MAX_DRAFTS``
   draft rows its tiles load ``evict_first`` (``EVICT_FIRST``, a cache hint).
2. ``_fused_chain_kernel``, grid (request blocks): merges the split partials of every row
   of its requests into final statistics (``_merge_splits``, as ``_combine_kernel``: once per
   row, so no later kernel merges), decides every step of the acceptance chain at once
   (standard, greedy, synthetic) and block verification's running ratios, and writes them.
   Up to ``_INPUTS_FIRST_MAX_STEPS`` steps it reads the drafts, their logits and uniforms
   before it waits for the statistics kernel, and takes the statistics of a side with several
   splits from the registers it merged them in (``INPUTS_FIRST``).
2b. ``_fused_candidate_kernel``, grid (request blocks), one warp on CUDA: a chain method's
   rejection draws its replacement by rejection from the target row (``_residual_candidates``:
   ``candidates_for`` candidates, each reading one group of ids), so that request needs no
   masses of its rows, which would be their second read; one none of whose candidates is
   kept draws below, the same law. A request whose candidate is kept is finished here (its
   output slots and emitted count): the mass and pick kernels skip it, and a request block
   with nothing left skips the pick (at B = 1, K = 8, V = 152064 on an H100, 23.6 -> 21.3 us).
3. ``_fused_mass_kernel``, grid (request blocks, spans of tiles): sums over each tile of its
   span the weights of every draw its requests may need: the residual or bonus row of a
   chain request, every row up to the first placeholder of a strict or block request (a
   target-row draw: each tile's sum relative to its max, and the max). The spans are the
   call's own (``_mass_split_len``): one tile each at small batches, up to four at large.
4. ``_pick`` (in the last mass program of each request block to finish, up to
   ``_PICK_IN_MASS_MAX_BLOCKS`` blocks; else ``_fused_pick_kernel``, grid (request blocks)):
   strict requests' own target samples (stream TARGET), block verification's stop, the
   final draw by inverse CDF inside the tile holding ``u * total`` (``_pick_kernel``'s
   algorithm), and every output slot (-1 past the emitted count, so the outputs need no
   fill). A bonus row's max, degenerate flag and argmax (greedy) come from its tile maxima.

The splits, the reductions and the noise (``_uniform`` keyed by (seed, position, stream)) are
the staged path's, so under the interpreter (where both read a split as one tile) the outputs
are the staged path's token for token and the final statistics bit for bit. On CUDA the fused
statistics kernel reads a 4096-id split as one tile where the staged kernel reads two and
rescales its running sum once, and Triton lays a kernel's tiles out by what the kernel loads
(beside a bf16 draft tile, the fused kernel's fp32 target tile is laid out like the draft's,
seen compiling with Triton 3.8): the fp32 split sums differ in the last bits. On an H100
(Triton 3.6, both paths then reading equal tiles) the per-split sums were 1-4 ulps apart and the final
log-sums 1-3 ulps in some rows; the merges gave equal bits from equal partials; maxima,
argmaxes and flags are equal. A draw from the masses moves only when its uniform lies within
such an ulp of a token's boundary (about 1e-7 of draws). A residual candidate is placed by the
stored tile and group sums, whose last-bit differences shift the boundaries inside the chosen
group by the row's mass over the group's: on an H100 (docs/verification-results.md) one request of 1,024 at
B = 1024, K = 8 (V = 131072, and again at 152064, where 92% rejected) drew the neighbouring id
on one path, none at B = 512, K = 8 or B = 1024, K <= 4; with candidates off the paths agreed
on every token. Either token has the residual's law up to that rounding.
``suites/test_triton.py`` checks tokens on both devices, the final statistics bit for bit
under the interpreter and within a summation-order bound on CUDA. The interpreter takes the
largest tiles Triton allows (it pays per operation and per program; a reduction over a row
does not depend on how many rows the tile holds).

Planted faults (``fault != 0``) never come here: they live in the staged kernels.
"""

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from harness.backends.triton import sampler as triton_sampler
from harness.backends.triton.launch import cdiv, launch, launch_each, next_power_of_2
from harness.backends.triton.sampler import (
    _ACCEPT,
    _BLOCK,
    _BLOCK_STREAM,
    _LOG2E,
    _NO_ID,
    _RESIDUAL,
    _STRICT,
    _SYNTHETIC,
    _TARGET,
    TritonBackend,
    _candidate_plan,
    _candidate_width,
    _combine_rows,
    _draw_from_masses,
    _draw_from_tiles,
    _inv_temperature,
    _job_tile_masses,
    _residual_candidates,
    _split_stats,
    _split_tile_masses,
    _tile_masses,
    _tile_masses_width,
    _tiles,
    _uniform,
)


# --- row statistics -----------------------------------------------------------------------------
@triton.jit
def _stats_at(base, size):
    """The four statistics arrays (max, sum or log-sum, argmax, NaN or degenerate flag) from ``base``."""
    return base, base + size, base + 2 * size, base + 3 * size


@triton.jit
def _final_stats(s_m, s_s, s_arg, s_nan, rows, mask):
    """Final statistics of ``rows`` (any shape) as the stats kernel (one split) or the chain
    kernel (``_finalize``) stored them: max, log of the sum, argmax (int64), degenerate flag."""
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
def _request(cu, temperature, seeds, methods, B, BLOCK_R: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    valid = r < B
    start = tl.load(cu + r, mask=valid, other=0)
    cnt = tl.load(cu + r + 1, mask=valid, other=0) - start
    temp = tl.load(temperature + r, mask=valid, other=1.0)
    seed = tl.load(seeds + r, mask=valid, other=0)
    method = tl.load(methods + r, mask=valid, other=0).to(tl.int32)
    return r, valid, start, cnt, temp, seed, method


@triton.jit
def _chain_inputs(
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
    u = _uniform(seed[:, None], tl.load(positions + row, mask=good, other=0), _ACCEPT)
    rate = tl.zeros_like(a_t)
    if HAS_SYNTH:
        rate = tl.load(rates + r[:, None] * K + ks, mask=good & (method == _SYNTHETIC)[:, None], other=0.0)
    return x, good, a_t, a_q, u, rate


@triton.jit
def _chain_rule(
    x, good, a_t, a_q, u, rate, tm, tlogs, targ, tbad, dm, dlogs, darg, dbad, K, valid, temp, method,
    HAS_DRAFT: tl.constexpr, HAS_SYNTH: tl.constexpr, HAS_BLOCK: tl.constexpr, KP: tl.constexpr,
):  # fmt: skip
    """``_chain_kernel``'s decisions, every step at once, from ``_chain_inputs`` and the rows'
    final statistics ([lanes, KP]; the draft's unused without a draft row): ``n`` drafts
    accepted by the standard / greedy / synthetic rule, whether step ``n`` rejected, ``n_eff``
    drafts before the first placeholder, and block verification's running ratios ``rhos``
    [lanes, KP] (rho_0 = 1; valid up to n_eff)."""
    ks = tl.arange(0, KP).to(tl.int64)[None, :]
    greedy = (temp == 0)[:, None]
    inv_t = _inv_temperature(temp)[:, None]
    lt = _lp_of(a_t, tm, tlogs, targ, tbad, x, inv_t, greedy)
    lq = tl.zeros_like(lt)
    if HAS_DRAFT:
        lq = _lp_of(a_q, dm, dlogs, darg, dbad, x, inv_t, greedy)
    # standard: min(1, t/q), t/0 = inf for t > 0, 0/0 = 0; no draft row: q(x) = 1
    ok = u < tl.where(lt == float("-inf"), 0.0, tl.exp(tl.minimum(lt - lq, 0.0))).to(tl.float64)
    if HAS_SYNTH:
        ok = tl.where((method == _SYNTHETIC)[:, None], u < rate, ok)
    n = tl.min(tl.where(good & ok, KP, ks), axis=1)  # the first step that does not accept
    n_eff = tl.min(tl.where(good, KP, ks), axis=1)
    rhos = tl.where(ks == 0, 1.0, tl.zeros_like(lt))
    if HAS_BLOCK:
        blk = valid & (method == _BLOCK)
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
def _job(
    d_m, d_s, d_arg, d_nan, drafts, trow, drow, m, logs, rho, act, scale,
    HAS_DRAFT: tl.constexpr,
):  # fmt: skip
    """``_job_rows`` for one draw per lane, as [lanes, 1] columns: target row ``trow`` (max
    ``m``, log-sum ``logs``), or its residual max(rho * target - draft, 0) when rho >= 0."""
    resid = act & (rho >= 0)
    if HAS_DRAFT:
        dm, dlogs, _, dbad = _final_stats(d_m, d_s, d_arg, d_nan, drow, resid)
        use_draft = resid & ~dbad
        excl = tl.where(resid & dbad, 0, -1).to(tl.int64)[:, None]  # degenerate draft: one-hot on 0
        dm = tl.where(use_draft, dm, 0.0)
        dlogs2 = tl.where(use_draft, dlogs, 0.0) * _LOG2E
    else:
        dm = tl.zeros_like(m)
        dlogs2 = tl.zeros_like(m)
        use_draft = resid & False
        excl = tl.load(drafts + drow[:, None], mask=resid[:, None], other=-1)
    m = tl.where(act, m, 0.0)
    logs2 = tl.where(act, logs, 0.0) * _LOG2E
    return (
        trow[:, None], drow[:, None], m[:, None], logs2[:, None], dm[:, None], dlogs2[:, None], scale[:, None],
        rho[:, None], act[:, None], resid[:, None], use_draft[:, None], excl,
    )  # fmt: skip


# --- kernels --------------------------------------------------------------------------------------
@triton.jit
def _flags(scratch, k_off, B):
    """Per request block: whether the chain kernel (``flags + block``) and the candidate kernel
    (``flags + B + block``) are done with it, int32 beside the mass kernel's counters (PDL only);
    under ``_flag_chain`` also n, the rejection and whether a candidate was kept."""
    return (scratch + k_off + B).to(tl.pointer_type(tl.int32), bitcast=True)


@triton.jit
def _raise(flag, value):
    """Set ``flag`` to ``value`` (> 0) once every thread of the program has stored its results."""
    tl.debug_barrier()
    tl.atomic_xchg(flag, value, sem="release", scope="gpu")


@triton.jit
def _await(flag):
    """Spin until ``flag`` is raised and return its value (acquire: the raiser's stores are seen after)."""
    seen = tl.atomic_add(flag, 0, sem="acquire", scope="gpu")
    while seen == 0:
        seen = tl.atomic_add(flag, 0, sem="acquire", scope="gpu")
    return seen


@triton.jit
def _block_rejected(seen):
    """Whether the chain flag's value ``seen`` (1 + rejected, + 2 n under ``_flag_chain``) says one
    of the block's requests rejected."""
    return (seen - 1) % 2 == 1


# Batch sizes and scratch offsets are not specialized on (== 1, divisible by 16): every new batch
# shape would compile the kernels again (the GPU suite's fuzzing spent minutes compiling).
_STATS_COUNTS = ["KS", "B", "t_size", "d_off", "d_size", "per", "runs", "k_off"]
_COUNTS = ["K", "B", "t_size", "d_off", "d_size", "m_off", "m_size", "c_off", "n_tiles"]


@triton.jit(do_not_specialize=_STATS_COUNTS)
def _fused_stats_kernel(
    t_logits, t_stride, V, d_logits, d_stride, Vd, cu, temperature, KS, B, scratch, t_size, d_off, d_size,
    t_split_len, d_split_len, per, runs, g_sum, g_tile, k_off, HAS_DRAFT: tl.constexpr, T_NSPLIT: tl.constexpr,
    D_NSPLIT: tl.constexpr, BLOCK_R: tl.constexpr, T_BLOCK_V: tl.constexpr, D_BLOCK_V: tl.constexpr, GROUP: tl.constexpr,
    PDL: tl.constexpr, EQUAL_COUNTS: tl.constexpr, EVICT_FIRST: tl.constexpr,
):  # fmt: skip
    """Target row k (the first cdiv(T_NSPLIT, per) of a lane block's ``runs``) or draft row k (the
    next cdiv(D_NSPLIT, per)) of request r over ``per`` vocabulary splits, one (r, k < max(K, 1))
    per lane: at small batches the programs run side by side instead of reading a target and a
    draft split one after the other. Each split's partials are stored on their own, so they do
    not depend on ``per`` (``_stats_splits_per_program``). A request's last target row (k = its
    draft count) gets no statistics: only a draw from the target row uses it, and that draw
    needs none (``_tile_weights``)."""
    if PDL:  # the chain kernel's programs may start (and wait) while this kernel's last ones run
        gdc_launch_dependents()
        if tl.program_id(0) == 0:  # the later kernels' flags, lowered for this call
            flags = _flags(scratch, k_off, B)
            for i in range(0, 2 * B, 1024):
                tl.store(flags + i + tl.arange(0, 1024), 0, mask=i + tl.arange(0, 1024) < 2 * B)
    # Request-major: a lane block's ``runs`` runs of splits (target, then draft) are consecutive
    # programs, which read its rows in order: 0.4-5.5% less graph time at B = 256-1024 on an H100
    # than each split of every row in turn; at B = 64 from 1.8 us less to 1.1 us more, at B = 1
    # within the spread.
    lane = tl.program_id(0) // runs * BLOCK_R + tl.arange(0, BLOCK_R)
    first = tl.program_id(0) % runs * per
    t_firsts = tl.cdiv(T_NSPLIT, per) * per  # where the draft's programs start, in splits
    r = lane // KS
    k = lane % KS
    valid = r < B
    if EQUAL_COUNTS:  # every request has KS drafts: a row's address waits for no load of ``cu``
        start = (r * KS).to(cu.dtype.element_ty)
        cnt = tl.zeros_like(start) + KS
    else:
        start = tl.load(cu + r, mask=valid, other=0)
        cnt = tl.load(cu + r + 1, mask=valid, other=0) - start
    temp = tl.load(temperature + r, mask=valid, other=1.0)
    scale = _inv_temperature(temp) * _LOG2E
    greedy = temp == 0
    valid = valid & (k < cnt)
    if tl.max(valid.to(tl.int32), axis=0) > 0:
        if first < t_firsts:
            t_m, t_s, t_arg, t_nan = _stats_at(scratch, t_size)
            for split in range(first, tl.minimum(first + per, T_NSPLIT)):
                _split_stats(
                    t_logits, t_stride, V, start + r + k, valid, valid & greedy, scale, split, t_split_len, t_m, t_s, t_arg, t_nan,
                    g_sum, g_tile, T_NSPLIT, BLOCK_R, T_BLOCK_V, 0, GROUP, EVICT_FIRST,
                )  # fmt: skip
        elif HAS_DRAFT:
            d_m, d_s, d_arg, d_nan = _stats_at(scratch + d_off, d_size)
            for split in range(first - t_firsts, tl.minimum(first - t_firsts + per, D_NSPLIT)):
                _split_stats(
                    d_logits, d_stride, Vd, start + k, valid, valid & greedy, scale, split, d_split_len, d_m, d_s, d_arg, d_nan,
                    g_sum, g_tile, D_NSPLIT, BLOCK_R, D_BLOCK_V, 0, 0, EVICT_FIRST,
                )  # fmt: skip


@triton.jit
def _store_chain(chain, r, mask, n, rejected, n_eff, rhos, K, B, HAS_BLOCK: tl.constexpr, KP: tl.constexpr):
    """The chain's decisions into the scratch (read back by ``_load_chain``), and no kept
    residual candidate (-1) yet: ``_fused_candidate_kernel``, where it runs, stores its own."""
    tl.store(chain + r, n, mask=mask)
    tl.store(chain + (K + 4) * B + r, tl.zeros_like(r) - 1, mask=mask)
    tl.store(chain + B + r, rejected.to(tl.int32), mask=mask)
    tl.store(chain + 2 * B + r, n_eff, mask=mask)
    if HAS_BLOCK:
        ks = tl.arange(0, KP)[None, :]
        tl.store(chain + 3 * B + r[:, None] * (K + 1) + ks, rhos, mask=mask[:, None] & (ks <= K))


@triton.jit
def _load_chain(chain, r, valid, K, B, INT: tl.constexpr):
    """``n``, ``rejected``, ``n_eff`` (as ``INT``) and the kept candidate (int64) as
    ``_store_chain`` stored them (block verification's ratios are read one per lane where needed)."""
    n = tl.load(chain + r, mask=valid, other=0).to(INT)
    rejected = tl.load(chain + B + r, mask=valid, other=0) != 0
    n_eff = tl.load(chain + 2 * B + r, mask=valid, other=0).to(INT)
    kept = tl.load(chain + (K + 4) * B + r, mask=valid, other=-1).to(tl.int64)
    return n, rejected, n_eff, kept


@triton.jit
def _left_to_draw(valid, kept):
    """Whether any of the requests still needs a draw (none kept a residual candidate)."""
    return tl.max((valid & (kept < 0)).to(tl.int32), axis=0) > 0


@triton.jit
def _store_outputs(tokens, emitted, r, x, fin, token, mask, K, KP: tl.constexpr):
    """A request's output slots (its drafts before ``fin``, ``token`` at ``fin``, -1 after) and
    its emitted count ``fin + 1``, where ``mask``."""
    ks = tl.arange(0, KP)[None, :]
    out = tl.where(ks < fin[:, None], x, tl.where(ks == fin[:, None], token[:, None], -1))
    tl.store(tokens + r[:, None] * (K + 1) + ks, out, mask=mask[:, None] & (ks <= K))
    tl.store(emitted + r, fin + 1, mask=mask)


@triton.jit
def _finalize(partials, size, f_m, f_s, f_arg, f_nan, rows, mask, good, scale, NSPLIT: tl.constexpr):
    """Merge the ``NSPLIT`` partials of ``rows`` (the four arrays of ``size`` at ``partials``)
    and store their final statistics, as ``_combine_kernel`` does (``_combine_rows``). Returns
    them as ``_final_stats`` loads them back (the same bits) where ``good``, else 0."""
    p_m, p_s, p_arg, p_nan = _stats_at(partials, size)
    m, s, arg, nan = _combine_rows(
        p_m, p_s, p_arg, p_nan, rows, mask, scale + tl.zeros(rows.shape, tl.float32), f_m, f_s, f_arg, f_nan, NSPLIT, 0
    )
    bad = good & ((nan != 0) | (s == 0))  # as _store_final stores them
    return tl.where(good, m, 0.0), tl.where(good, tl.log(s), 0.0), tl.where(bad | ~good, 0, arg).to(tl.int64), bad


@triton.jit
def _finals(scratch, t_size, d_off, d_size, f_off, T_NSPLIT: tl.constexpr, D_NSPLIT: tl.constexpr):
    """Final statistics' arrays: the stats kernel's own where one split, else the chain kernel's."""
    d_fin = f_off  # the draft's finals follow the target's, where the target has any
    if T_NSPLIT > 1:
        t_m, t_s, t_arg, t_nan = _stats_at(scratch + f_off, t_size // T_NSPLIT)
        d_fin = f_off + 4 * (t_size // T_NSPLIT)
    else:
        t_m, t_s, t_arg, t_nan = _stats_at(scratch, t_size)
    if D_NSPLIT > 1:
        d_m, d_s, d_arg, d_nan = _stats_at(scratch + d_fin, d_size // D_NSPLIT)
    else:
        d_m, d_s, d_arg, d_nan = _stats_at(scratch + d_off, d_size)
    return t_m, t_s, t_arg, t_nan, d_m, d_s, d_arg, d_nan


@triton.jit(do_not_specialize=_COUNTS)
def _fused_chain_kernel(
    t_logits, t_stride, V, d_logits, d_stride, Vd, cu, temperature, seeds, positions, methods, drafts, rates, K, B,
    scratch, t_size, d_off, d_size, m_off, m_size, c_off, split_len, n_tiles, f_off, k_off, tokens, emitted,
    g_sum, g_tile, tile_width,
    HAS_DRAFT: tl.constexpr, HAS_STRICT: tl.constexpr, HAS_SYNTH: tl.constexpr, HAS_BLOCK: tl.constexpr,
    T_NSPLIT: tl.constexpr, D_NSPLIT: tl.constexpr, KP: tl.constexpr, NT: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr, PICK: tl.constexpr, N: tl.constexpr, GROUP: tl.constexpr, NTP: tl.constexpr,
    GPT: tl.constexpr, PDL: tl.constexpr, FLAG_CHAIN: tl.constexpr, INPUTS_FIRST: tl.constexpr,
):  # fmt: skip
    """Final statistics of every row of its requests (merged splits), then the chain. With
    ``INPUTS_FIRST`` it reads the caller's tensors (``_chain_inputs``) before it waits for the
    statistics kernel, and takes the statistics it merged (a side with several splits) from
    registers; else it reads them after the merge, and loads the merged statistics back (fewer
    registers across the merge)."""
    r, valid, start, cnt, temp, seed, method = _request(cu, temperature, seeds, methods, B, BLOCK_R)
    if INPUTS_FIRST:
        x, good, a_t, a_q, u, rate = _chain_inputs(
            t_logits, t_stride, V, d_logits, d_stride, Vd, positions, drafts, rates, K, r, valid, start, cnt, seed, method,
            HAS_DRAFT, HAS_SYNTH, KP,
        )  # fmt: skip
    if PDL:  # the inputs above are the caller's; the statistics kernel's partials below
        gdc_wait()
        gdc_launch_dependents()
    ks = tl.arange(0, KP).to(tl.int64)[None, :]
    scale = (_inv_temperature(temp) * _LOG2E)[:, None]
    t_m, t_s, t_arg, t_nan, d_m, d_s, d_arg, d_nan = _finals(scratch, t_size, d_off, d_size, f_off, T_NSPLIT, D_NSPLIT)
    # Target and draft rows 0..cnt-1 (the last target row has no statistics).
    t_rows, d_rows, mask = (start + r)[:, None] + ks, start[:, None] + ks, valid[:, None] & (ks < cnt[:, None])
    if not INPUTS_FIRST:
        good = mask  # _finalize's returns are unused: the merged statistics are loaded back below
    if T_NSPLIT > 1:
        tm, tlogs, targ, tbad = _finalize(scratch, t_size, t_m, t_s, t_arg, t_nan, t_rows, mask, good, scale, T_NSPLIT)
    if HAS_DRAFT and D_NSPLIT > 1:
        dm, dlogs, darg, dbad = _finalize(scratch + d_off, d_size, d_m, d_s, d_arg, d_nan, d_rows, mask, good, scale, D_NSPLIT)
    if not INPUTS_FIRST:
        tl.debug_barrier()  # the final statistics other threads stored, loaded back below
        x, good, a_t, a_q, u, rate = _chain_inputs(
            t_logits, t_stride, V, d_logits, d_stride, Vd, positions, drafts, rates, K, r, valid, start, cnt, seed, method,
            HAS_DRAFT, HAS_SYNTH, KP,
        )  # fmt: skip
    if T_NSPLIT == 1 or not INPUTS_FIRST:
        tm, tlogs, targ, tbad = _final_stats(t_m, t_s, t_arg, t_nan, t_rows, good)
    if HAS_DRAFT:
        if D_NSPLIT == 1 or not INPUTS_FIRST:
            dm, dlogs, darg, dbad = _final_stats(d_m, d_s, d_arg, d_nan, d_rows, good)
    else:
        dm, dlogs, darg, dbad = tm, tlogs, targ, tbad  # unused without a draft row
    n, rejected, n_eff, rhos = _chain_rule(
        x, good, a_t, a_q, u, rate, tm, tlogs, targ, tbad, dm, dlogs, darg, dbad, K, valid, temp, method,
        HAS_DRAFT, HAS_SYNTH, HAS_BLOCK, KP,
    )  # fmt: skip
    _store_chain(scratch + c_off, r, valid, n, rejected, n_eff, rhos, K, B, HAS_BLOCK, KP)
    if PICK:
        tl.store(scratch + k_off + tl.program_id(0), 0.0)  # the mass kernel's counter of this block
    if PDL and not PICK:  # the mass kernel's programs of this block may start: 1 + (one of its requests rejected)
        value = 1 + tl.max((valid & rejected).to(tl.int32), axis=0)
        if FLAG_CHAIN:  # + 2 n of its one request: the mass kernel needs no load of the chain
            tl.static_assert(BLOCK_R == 1, "the flags carry the chain of one request per block")
            value += 2 * tl.sum(tl.where(valid, n, 0), axis=0).to(tl.int32)
        _raise(_flags(scratch, k_off, B) + tl.program_id(0), value)


@triton.jit(do_not_specialize=_COUNTS)
def _fused_candidate_kernel(
    t_logits, t_stride, V, d_logits, d_stride, Vd, cu, temperature, seeds, positions, methods, drafts, rates, K, B,
    scratch, t_size, d_off, d_size, m_off, m_size, c_off, split_len, n_tiles, f_off, k_off, tokens, emitted,
    g_sum, g_tile, tile_width,
    HAS_DRAFT: tl.constexpr, HAS_STRICT: tl.constexpr, HAS_SYNTH: tl.constexpr, HAS_BLOCK: tl.constexpr,
    T_NSPLIT: tl.constexpr, D_NSPLIT: tl.constexpr, KP: tl.constexpr, NT: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr, PICK: tl.constexpr, N: tl.constexpr, GROUP: tl.constexpr, NTP: tl.constexpr,
    GPT: tl.constexpr, PDL: tl.constexpr, FLAG_CHAIN: tl.constexpr, INPUTS_FIRST: tl.constexpr,
):  # fmt: skip
    """A chain method's rejection (``_fused_chain_kernel``'s decision): its replacement from the
    residual by candidates (``_residual_candidates``), if one is kept; ``_load_chain`` reads it
    (a mass program under ``_flag_chain`` only whether one was, from the flag).
    A request whose candidate is kept is finished here (its output slots and emitted count), so
    the mass and pick kernels have nothing left to do for it."""
    r, valid, start, cnt, temp, seed, method = _request(cu, temperature, seeds, methods, B, BLOCK_R)
    ks = tl.arange(0, KP)[None, :]
    x = tl.load(drafts + start[:, None] + ks, mask=valid[:, None] & (ks < cnt[:, None]), other=-1)  # the caller's
    if PDL:
        if PICK:  # the mass kernel waits for this one to end
            gdc_wait()
            gdc_launch_dependents()
        else:  # the mass kernel starts now and waits for each block's flags instead
            gdc_launch_dependents()
            gdc_wait()
    n, rejected, n_eff, kept = _load_chain(scratch + c_off, r, valid, K, B, tl.int64)
    need = valid & rejected & (temp != 0)
    if HAS_STRICT:
        need = need & (method != _STRICT)
    if HAS_BLOCK:
        need = need & (method != _BLOCK)
    if tl.max(need.to(tl.int32), axis=0) > 0:
        t_m, t_s, t_arg, t_nan, d_m, d_s, d_arg, d_nan = _finals(scratch, t_size, d_off, d_size, f_off, T_NSPLIT, D_NSPLIT)
        trow = start + r + n
        m, logs, arg, bad = _final_stats(t_m, t_s, t_arg, t_nan, trow, need)
        # Every load below is masked by ``need``, not by the row's degenerate flag: they go out
        # with the statistics' instead of after them. A degenerate row's candidates are dropped.
        c_trow, c_drow, c_m, c_logs2, c_dm, c_dlogs2, c_scale, c_rho, c_act, c_resid, c_use_draft, c_excl = _job(
            d_m, d_s, d_arg, d_nan, drafts, trow, start + n, m, logs, tl.where(need, 1.0, -1.0), need,
            _inv_temperature(temp) * _LOG2E, HAS_DRAFT,
        )  # fmt: skip
        kept = _residual_candidates(
            t_logits, t_stride, V, d_logits, d_stride, Vd, g_sum, g_tile, tile_width, c_trow, c_drow, c_m, c_logs2, c_dm,
            c_dlogs2, c_scale, c_rho, c_use_draft, c_excl, c_act, seed[:, None], tl.load(positions + trow, mask=need, other=0)[:, None],
            HAS_DRAFT, N, GROUP, NTP, GPT,
        )  # fmt: skip
        kept = tl.where(bad, -1, kept)
        tl.store(scratch + c_off + (K + 4) * B + r, kept, mask=need)
        _store_outputs(tokens, emitted, r, x, n, kept, need & (kept >= 0), K, KP)
    if PDL and not PICK:
        value = 1
        if FLAG_CHAIN:  # + (a candidate kept)
            value += tl.max((need & (kept >= 0)).to(tl.int32), axis=0)
        _raise(_flags(scratch, k_off, B) + B + tl.program_id(0), value)


@triton.jit(do_not_specialize=_COUNTS)
def _fused_mass_kernel(
    t_logits, t_stride, V, d_logits, d_stride, Vd, cu, temperature, seeds, positions, methods, drafts, rates, K, B,
    scratch, t_size, d_off, d_size, m_off, m_size, c_off, split_len, n_tiles, f_off, k_off, tokens, emitted,
    g_sum, g_tile, tile_width,
    HAS_DRAFT: tl.constexpr, HAS_STRICT: tl.constexpr, HAS_SYNTH: tl.constexpr, HAS_BLOCK: tl.constexpr,
    T_NSPLIT: tl.constexpr, D_NSPLIT: tl.constexpr, KP: tl.constexpr, NT: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr, PICK: tl.constexpr, N: tl.constexpr, GROUP: tl.constexpr, NTP: tl.constexpr,
    GPT: tl.constexpr, PDL: tl.constexpr, FLAG_CHAIN: tl.constexpr, INPUTS_FIRST: tl.constexpr,
):  # fmt: skip
    """Every draw's weight sums over this program's span of tiles (``split_len`` ids), after
    the chain ``_fused_chain_kernel`` decided: the final row of chain requests (if not a point
    mass), rows 0..n_eff of strict and block requests."""
    split = tl.program_id(1)  # the span
    r, valid, start, cnt, temp, seed, method = _request(cu, temperature, seeds, methods, B, BLOCK_R)
    if PDL:
        if PICK:  # the call's last kernel
            gdc_wait()
        else:
            # This block's chain, and its candidates where one of its requests rejected: the
            # other blocks' candidates run meanwhile. Then the pick kernel may start.
            flags = _flags(scratch, k_off, B) + tl.program_id(0)
            seen = _await(flags)
            kept_flag = seen * 0 + 1  # no candidates waited for: none kept (an int32 like the flag)
            if _block_rejected(seen) and N > 0:
                kept_flag = _await(flags + B)
            gdc_launch_dependents()
    t_m, t_s, t_arg, t_nan, d_m, d_s, d_arg, d_nan = _finals(scratch, t_size, d_off, d_size, f_off, T_NSPLIT, D_NSPLIT)
    if PDL and not PICK and FLAG_CHAIN:  # the chain from the flags' values (one request per block)
        tl.static_assert(BLOCK_R == 1, "the flags carry the chain of one request per block")
        n = tl.zeros_like(r).to(tl.int64) + (seen - 1) // 2
        rejected = valid & _block_rejected(seen)
        n_eff = n  # strict and block verification only, which do not take this path
        kept = tl.zeros_like(n) + tl.where(kept_flag > 1, 0, -1)  # only whether one was kept matters here
    else:
        n, rejected, n_eff, kept = _load_chain(scratch + c_off, r, valid, K, B, tl.int64)  # as _chain_rule's
    greedy = temp == 0
    scale = _inv_temperature(temp) * _LOG2E
    strict = valid & False
    blk = valid & False
    if HAS_STRICT:
        strict = valid & (method == _STRICT)
    if HAS_BLOCK:
        blk = valid & (method == _BLOCK)
    seq = strict | blk  # a draw may come from any row up to the first placeholder
    first = tl.where(seq, 0, n)
    count = tl.where(seq, n_eff + 1, (valid & (kept < 0)).to(tl.int64)).to(tl.int32)  # a kept candidate: no draw
    rho_chain = tl.where(strict, -1.0, tl.where(rejected, 1.0, -1.0))
    mass_w = scratch + m_off
    for i in range(0, tl.max(count, axis=0)):
        slot = first + i
        trow = start + r + slot
        m, logs, _, bad = _final_stats(t_m, t_s, t_arg, t_nan, trow, (i < count) & (slot < cnt))
        rho = rho_chain
        if HAS_BLOCK:
            # One ratio per lane, not the [lanes, KP] tile: from a loaded tile Triton laid the
            # draw tile out a row per thread (16,000 lines of PTX, a shared-memory round trip).
            rho_slot = tl.load(scratch + c_off + 3 * B + r * (K + 1) + slot, mask=blk & (slot < n_eff), other=0.0)
            rho = tl.where(blk, tl.where(slot == n_eff, -1.0, rho_slot.to(tl.float32)), rho_chain)
        # A point-mass row needs no draw. The request's last job, when it draws from the target
        # row, may be on its last row (no statistics): the pick decides from its tiles, greedy too.
        tiles_decide = (i == count - 1) & (rho < 0)
        act = (i < count) & (tiles_decide | ~(greedy | bad))
        j_trow, j_drow, j_m, j_logs2, j_dm, j_dlogs2, j_scale, j_rho, j_active, j_resid, j_use_draft, j_excl = _job(
            d_m, d_s, d_arg, d_nan, drafts, trow, start + slot, m, logs, rho, act, scale, HAS_DRAFT
        )
        at = (r * (K + 1) + slot) * n_tiles
        _split_tile_masses(
            t_logits, t_stride, V, d_logits, d_stride, Vd, j_trow, j_drow, j_m, j_logs2, j_dm, j_dlogs2, j_scale, j_rho,
            j_active, j_resid, j_use_draft, j_excl, act, split, split_len, mass_w + at, mass_w + m_size + at,
            HAS_DRAFT, 0, BLOCK_V,
        )  # fmt: skip
    # A block whose requests all kept a candidate is finished (``_fused_candidate_kernel``).
    if PICK and _left_to_draw(valid, kept):
        # The last of this request block's mass programs picks its tokens (no fourth launch). The
        # barrier puts every thread's stores before the counter's release (Triton's layer-norm
        # tutorial's lock); the acquire puts the other programs' stores before the pick's loads.
        tl.debug_barrier()
        if tl.atomic_add(scratch + k_off + tl.program_id(0), 1.0, sem="acq_rel", scope="gpu") == tl.num_programs(1) - 1:
            _pick(
                t_logits, t_stride, V, d_logits, d_stride, Vd, positions, drafts, K, B, scratch, t_size, d_off, d_size,
                m_off, m_size, c_off, n_tiles, f_off, tokens, emitted, r, valid, start, cnt, temp, seed, method,
                n.to(tl.int32), rejected, n_eff.to(tl.int32), kept, HAS_DRAFT, HAS_STRICT, HAS_BLOCK, T_NSPLIT, D_NSPLIT, KP, NT, BLOCK_V,
            )  # fmt: skip


@triton.jit
def _draw(
    t_logits, t_stride, V, d_logits, d_stride, Vd, d_m, d_s, d_arg, d_nan, drafts, positions,
    mass_w, m_size, r, start, trow, slot, m, logs, rho, act, scale, seed, K, n_tiles,
    STREAM: tl.constexpr, HAS_DRAFT: tl.constexpr, NT: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """One draw per active lane from target row ``trow`` (or its residual, rho >= 0) with the
    masses ``_fused_mass_kernel`` summed for ``slot``, by the uniform of (seed, position, STREAM)."""
    j_trow, j_drow, j_m, j_logs2, j_dm, j_dlogs2, j_scale, j_rho, j_active, j_resid, j_use_draft, j_excl = _job(
        d_m, d_s, d_arg, d_nan, drafts, trow, start + slot, m, logs, rho, act, scale, HAS_DRAFT
    )
    u = _uniform(seed, tl.load(positions + trow, mask=act, other=0), STREAM)
    at = (r * (K + 1) + slot) * n_tiles
    token, _ = _draw_from_tiles(
        t_logits, t_stride, V, d_logits, d_stride, Vd, j_trow, j_drow, j_m, j_logs2, j_dm, j_dlogs2, j_scale, j_rho,
        j_active, j_resid, j_use_draft, j_excl, act, mass_w + at, mass_w + m_size + at, u, n_tiles, HAS_DRAFT, 0, NT, BLOCK_V,
    )  # fmt: skip
    return token


@triton.jit
def _pick(
    t_logits, t_stride, V, d_logits, d_stride, Vd, positions, drafts, K, B, scratch, t_size, d_off, d_size, m_off,
    m_size, c_off, n_tiles, f_off, tokens, emitted, r, valid, start, cnt, temp, seed, method, n, rejected, n_eff, kept,
    HAS_DRAFT: tl.constexpr, HAS_STRICT: tl.constexpr, HAS_BLOCK: tl.constexpr, T_NSPLIT: tl.constexpr,
    D_NSPLIT: tl.constexpr, KP: tl.constexpr, NT: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """Strict requests' target samples, block verification's stop, the final draw and every
    output slot of the requests ``r``, from the chain (``n``, ``rejected``, ``n_eff`` int32; a
    rejection's ``kept`` candidate, -1 none) as ``_fused_chain_kernel`` decided it and the
    masses of ``_fused_mass_kernel``."""
    t_m, t_s, t_arg, t_nan, d_m, d_s, d_arg, d_nan = _finals(scratch, t_size, d_off, d_size, f_off, T_NSPLIT, D_NSPLIT)
    ks = tl.arange(0, KP)[None, :]
    x = tl.load(drafts + start[:, None] + ks, mask=valid[:, None] & (ks < cnt[:, None]), other=-1)
    chain = scratch + c_off
    greedy = temp == 0
    inv_t = _inv_temperature(temp)
    scale = inv_t * _LOG2E
    row0 = start + r
    mass_w = scratch + m_off
    fin = n  # the row of the emitted token
    rho_fin = tl.where(rejected, 1.0, -1.0)
    strict_rejected = valid & False
    strict_token = tl.zeros_like(start)
    if HAS_STRICT:
        # Strict: accept while the target's own sample (stream TARGET) equals the draft.
        strict = valid & (method == _STRICT)
        live = strict
        accepted = tl.zeros_like(n)
        for k in range(0, tl.max(tl.where(strict, n_eff, 0), axis=0)):
            xk = _column(x, tl.zeros_like(n) + k, KP)
            act = live & (xk >= 0)
            m, logs, arg, bad = _final_stats(t_m, t_s, t_arg, t_nan, row0 + k, act)
            point = greedy | bad
            y = arg
            need = act & ~point
            if tl.max(need.to(tl.int32), axis=0) > 0:
                drawn = _draw(
                    t_logits, t_stride, V, d_logits, d_stride, Vd, d_m, d_s, d_arg, d_nan, drafts,
                    positions, mass_w, m_size, r, start, row0 + k, tl.zeros_like(n) + k, m, logs, tl.full(temp.shape, -1.0, tl.float32),
                    need, scale, seed, K, n_tiles, _TARGET, HAS_DRAFT, NT, BLOCK_V,
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
        blk = valid & (method == _BLOCK)
        stop = tl.zeros_like(n)
        for i in range(1, tl.max(tl.where(blk, n_eff, 0), axis=0) + 1):
            live = blk & (i <= n_eff)
            inner = live & (i < n_eff)
            rho = tl.load(chain + 3 * B + r * (K + 1) + i, mask=live, other=1.0).to(tl.float32)
            row = row0 + i
            _m, _logs, pt, bad = _final_stats(t_m, t_s, t_arg, t_nan, row, inner)
            point = greedy | bad
            # A point-mass target row (T = 0 or degenerate): R = max(rho - draft(pt), 0).
            if HAS_DRAFT:
                dm, dlogs, darg, dbad = _final_stats(d_m, d_s, d_arg, d_nan, start + i, inner & point)
                q_pt = tl.exp(_lp(d_logits, d_stride, Vd, dm, dlogs, darg, dbad, start + i, pt, inv_t, greedy, inner & point))
            else:
                q_pt = (tl.load(drafts + start + i, mask=inner & point, other=-1) == pt).to(tl.float32)
            mass = tl.where(point, tl.maximum(rho - q_pt, 0.0), 0.0).to(tl.float64)
            mass += tl.sum(_tile_masses(mass_w + (r * (K + 1) + i) * n_tiles, n_tiles, inner & ~point, NT), axis=1)
            denom = mass + 1.0 - rho
            h = tl.where(inner, tl.where(denom > 0, mass / tl.where(denom > 0, denom, 1.0), 1.0), rho)
            eta = _uniform(seed, tl.load(positions + row - 1, mask=live, other=0), _BLOCK_STREAM)
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
    m, logs, pt, bad = _final_stats(t_m, t_s, t_arg, t_nan, row, valid & ~from_tiles)
    j_trow, j_drow, j_m, j_logs2, j_dm, j_dlogs2, j_scale, j_rho, j_active, j_resid, j_use_draft, j_excl = _job(
        d_m, d_s, d_arg, d_nan, drafts, row, start + fin, m, logs, rho_fin, may_draw, scale, HAS_DRAFT
    )
    at = (r * (K + 1) + fin) * n_tiles
    tiles, use_w, row_m, tiles_bad, first = _job_tile_masses(mass_w + at, mass_w + m_size + at, n_tiles, may_draw, j_resid, j_scale, NT)
    bad = tl.where(from_tiles, tiles_bad, bad)
    greedy_tiles = from_tiles & greedy & ~tiles_bad
    if tl.max(greedy_tiles.to(tl.int32), axis=0) > 0:  # the lowest id holding the max, in the first tile holding it
        cols = tl.where(greedy_tiles, first, 0)[:, None] * BLOCK_V + tl.arange(0, BLOCK_V)[None, :]
        a = tl.load(t_logits + row.to(tl.int64)[:, None] * t_stride + cols, mask=greedy_tiles[:, None] & (cols < V), other=float("-inf"))
        tiles_arg = tl.min(tl.where(a.to(tl.float32) == row_m[:, None], cols, _NO_ID), axis=1)
        pt = tl.where(greedy_tiles, tiles_arg.to(tl.int64), pt)
    pt = tl.where(from_tiles & tiles_bad, 0, pt)  # a degenerate row's token, as _store_final's
    token = tl.where(strict_rejected, strict_token, pt)
    draw = may_draw & ~(greedy | bad)
    if tl.max(draw.to(tl.int32), axis=0) > 0:
        u = _uniform(seed, tl.load(positions + row, mask=draw, other=0), _RESIDUAL)
        drawn = _draw_from_masses(
            t_logits, t_stride, V, d_logits, d_stride, Vd, j_trow, j_drow, j_m, j_logs2, j_dm, j_dlogs2, j_scale, j_rho,
            j_active, j_resid, j_use_draft, j_excl, tiles, use_w, u, HAS_DRAFT, 0, BLOCK_V,
        )  # fmt: skip
        token = tl.where(draw, drawn, token)
    token = tl.where(kept >= 0, kept, token)
    _store_outputs(tokens, emitted, r, x, fin, token, valid, K, KP)


@triton.jit(do_not_specialize=_COUNTS)
def _fused_pick_kernel(
    t_logits, t_stride, V, d_logits, d_stride, Vd, cu, temperature, seeds, positions, methods, drafts, rates, K, B,
    scratch, t_size, d_off, d_size, m_off, m_size, c_off, split_len, n_tiles, f_off, k_off, tokens, emitted,
    g_sum, g_tile, tile_width,
    HAS_DRAFT: tl.constexpr, HAS_STRICT: tl.constexpr, HAS_SYNTH: tl.constexpr, HAS_BLOCK: tl.constexpr,
    T_NSPLIT: tl.constexpr, D_NSPLIT: tl.constexpr, KP: tl.constexpr, NT: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr, PICK: tl.constexpr, N: tl.constexpr, GROUP: tl.constexpr, NTP: tl.constexpr,
    GPT: tl.constexpr, PDL: tl.constexpr, FLAG_CHAIN: tl.constexpr, INPUTS_FIRST: tl.constexpr,
):  # fmt: skip
    """``_pick`` as a kernel of its own (where the mass kernel does not pick)."""
    r, valid, start, cnt, temp, seed, method = _request(cu, temperature, seeds, methods, B, BLOCK_R)
    if PDL:
        gdc_wait()
    n, rejected, n_eff, kept = _load_chain(scratch + c_off, r, valid, K, B, tl.int32)
    if _left_to_draw(valid, kept):  # else finished by the candidate kernel
        _pick(
            t_logits, t_stride, V, d_logits, d_stride, Vd, positions, drafts, K, B, scratch, t_size, d_off, d_size, m_off,
            m_size, c_off, n_tiles, f_off, tokens, emitted, r, valid, start, cnt, temp, seed, method, n, rejected, n_eff, kept,
            HAS_DRAFT, HAS_STRICT, HAS_BLOCK, T_NSPLIT, D_NSPLIT, KP, NT, BLOCK_V,
        )  # fmt: skip


# --- host side ----------------------------------------------------------------------------------
_CPU_TILE = 1 << 20  # elements per tile in the interpreter: Triton's largest tensor
_CUDA_REQUESTS = 64  # most requests per program of the chain kernels on CUDA (the staged chain's)
_MASS_PROGRAMS = 256  # mass programs a call spreads its tiles over, about (measured, H100)
_MASS_MAX_TILES = 4  # most tiles one mass program sums (measured, H100)
_STATS_MAX_WIDTH = 4096  # widest statistics tile on CUDA (ids; 32 fp32 per thread at 4 warps)
_STATS_PROGRAMS = 8192  # statistics programs a call spreads its splits over, at most about (measured, H100)
_STATS_MAX_SPLITS = 4  # most splits one statistics program reads
# Storing the group sums made ptxas (Triton 3.6) give the statistics kernel 96 registers where
# 48 suffice with no spill (benchmarks/kernel_resources.py, and on an H200; 40 spill). At 48 an
# SM holds 10 of its programs, not 8 as at 64: on an H200 2.9-3.4 us less at B = 256, K = 1,
# V = 131072, up to 1.5 us less at the other shapes timed, B = 1 within its spread
# (benchmarks/RESULTS.md#kernel-registers; not yet measured on an H100). The cap changes only
# ptxas's register allocation, not the arithmetic or its order: the tokens are the same.
_STATS_MAX_REGISTERS = 48
# Up to this many request blocks, the last mass program of each block picks its tokens (no
# fourth launch; up to 0.9 us less at B = 1 on an H100). Above, the pick's registers cost the
# mass kernel occupancy: 1-7% more time at B = 64-1024, V >= 131072 on an H100
# (benchmarks/RESULTS.md#tried-and-not-kept). The tokens are the same either way.
_PICK_IN_MASS_MAX_BLOCKS = 8
# Between these counts of a call's draft rows (B K where every request has K) the statistics kernel
# loads its tiles ``evict_first`` (``_row_tile``): its rows are read once, so their lines go before
# the lines L2 held. On an H200, with do_bench's flush (L2 left full of dirty lines), the call took
# 0.5-3.9 us less at 64-512 draft rows (B = 256, K = 1, V = 131072: 98.8-98.9 -> 97.2-97.5 us),
# mostly because those lines were no longer written back during it; B = 16, K = 1 was level. It
# took 0.6 us more at B = 1, K = 8 (the chain and the candidates read lines of its rows again) and
# 0.5-8.8 us more at 1024 draft rows and more (B = 1024, K = 1 and 4; B = 256, K = 4). With clean
# lines in L2 it took 0.5-0.9 us less at B = 256, K = 1 and 12 us less at B = 1024, K = 1 and
# B = 256, K = 4 (benchmarks/RESULTS.md#fused-path-ab). A hint only: the outputs are the same.
_STATS_EVICT_FIRST_MIN_DRAFTS = 16
_STATS_EVICT_FIRST_MAX_DRAFTS = 512


# Up to this many steps (``KP``: K + 1 padded to a power of two, at least 2, so K <= 1), the chain
# kernel reads the caller's tensors before it waits for the statistics kernel and takes the
# statistics it merged from registers (``INPUTS_FIRST``). At K = 1 on an H200 that took 0.5 us off B = 256,
# V = 131072, 0.9-1.2 off V = 152064, B = 1 and B = 1024; at K = 8 the chain
# kernel's registers went from 80 to 148 and it cost 1.3-1.5 us at B = 1 and 64, and 1.0 us at
# B = 256, K = 4 (benchmarks/RESULTS.md#tried-and-not-kept). The outputs are the same.
_INPUTS_FIRST_MAX_STEPS = 2


def _counters_and_flags(b: int) -> int:
    """The scratch's last float64 slots: the mass kernel's counters, one per request block (at
    most b), then two int32 flags per block (``_flags``)."""
    return 2 * b


def _flag_chain(lanes: int, has_strict: bool, has_block: bool, pdl: bool, pick_in_mass: bool) -> bool:
    """Whether the flags carry the chain (``FLAG_CHAIN``): where the mass kernel waits on flags (PDL,
    a pick kernel of its own), with one request per block and no strict or block requests, the
    chain kernel raises its flag to 1 + rejected + 2 n and the candidate kernel to 1 + (a candidate
    kept), so a mass program takes all it needs of the chain from the flags it waits on, not from a
    load after them (strict and block requests need n_eff and the running ratios). In the
    benchmark's batches (standard requests with draft probabilities), at B = 256, K = 1 on an H200,
    the mass kernel went from 48 registers to 40 and the call took 1.3 us
    less at V = 131072, 2.0 us less at 152064 (2.9 at B = 1024), 0.7 us more at B = 256, K = 4.
    The outputs are the same."""
    return pdl and not pick_in_mass and lanes == 1 and not (has_strict or has_block)


# Programmatic dependent launch (Hopper and later): each kernel after the statistics kernel is
# launched while the previous one runs and waits for it on the device (the mass kernel before a
# pick kernel: on its block's flags), which hides its launch (1-3 us less per call on an H100).
_PDL = True


@functools.cache
def _pdl_device(index: int) -> bool:
    """Whether device ``index`` takes programmatic dependent launch (sm_90+) and this
    Triton has the ``launch_pdl`` option."""
    from triton.backends.nvidia.compiler import CUDAOptions

    nvidia = torch.version.hip is None  # ROCm reports gfx94x as capability 9.4
    return nvidia and torch.cuda.get_device_capability(index) >= (9, 0) and "launch_pdl" in CUDAOptions.__dataclass_fields__


def _pdl(device) -> bool:
    """``_PDL`` on ``device`` (a CUDA device)."""
    return _PDL and _pdl_device(device.index if device.index is not None else torch.cuda.current_device())


def _mass_split_len(request_blocks: int, n_tiles: int, block_v: int) -> int:
    """The span of vocabulary one ``_fused_mass_kernel`` program sums, in whole tiles. A
    program sums its tiles one after the other, so at small batches its time is a latency per tile.
    A call of T tiles (request blocks x tiles per row) gives each program T // _MASS_PROGRAMS
    tiles, at least one (one each while T < 2 * _MASS_PROGRAMS; else at least about
    ``_MASS_PROGRAMS`` programs) and at most ``_MASS_MAX_TILES``. A tile's mass does not
    depend on which program sums it, so neither do the outputs."""
    tiles = min(_MASS_MAX_TILES, n_tiles, max(1, request_blocks * n_tiles // _MASS_PROGRAMS))
    return tiles * block_v


def _stats_splits_per_program(rows: int, nsplit: int) -> int:
    """Splits one ``_fused_stats_kernel`` program reads, one after the other: one each while
    a call has at most about ``_STATS_PROGRAMS`` (rows x splits), else enough to stay near
    that, up to ``_STATS_MAX_SPLITS``. At B = 1 a program's time is its loads' latency; at
    B = 1024, K >= 4 one split per program took 5-7% longer, and a bound of 8192 programs
    rather than 32768 took 0-4% less time at B = 256-1024 (H100; other bounds:
    benchmarks/RESULTS.md#tried-and-not-kept). A split's partials do not depend on which program reads it, so
    neither do the outputs."""
    return min(_STATS_MAX_SPLITS, nsplit, max(1, cdiv(rows * nsplit, _STATS_PROGRAMS)))


def _stats_width(split_len: int, block_v: int, cuda: bool) -> int:
    """The fused statistics kernel's tile: on CUDA a whole split where it fits in one tile of
    at most ``_STATS_MAX_WIDTH`` ids (at B = 1 a program's loads go out at once, not one tile
    after another), else the staged kernel's ``block_v``. A split read as one tile or as
    several has the same max and argmax; its fp32 sum differs in the last bits (the order of
    the adds, one rescale less: ``_ORDER_SLACK`` in ``suites/test_triton.py``)."""
    if cuda and split_len <= _STATS_MAX_WIDTH and split_len == next_power_of_2(split_len):
        return split_len
    return block_v


def _on_cuda(tensor) -> bool:
    """Whether to plan CUDA tiles and grids (``suites/test_triton_layouts.py`` plans them on a CPU machine)."""
    return tensor.device.type == "cuda"


def verify_fused(
    target_logits, draft_logits, draft_tokens, cu_num_drafts, temperature, seeds, positions, methods,
    synthetic_rates, max_drafts: int, *, has_strict: bool = True, has_block: bool = True, has_synthetic: bool = True,
    block_v: int | None = None, splits: int | None = None,
):  # fmt: skip
    """``triton_sampler.verify``'s contract (the same outputs) in three to five launches, three
    allocations and no host synchronization. ``has_*`` only prune code, as there. The inputs keep
    the ``VerifyBatch`` layout, unchecked here: ``cu_num_drafts`` from 0, counts at most
    ``max_drafts``, one draft token per draft (``_fused_stats_kernel`` finds the rows of a batch
    of ``max_drafts`` each without ``cu``)."""
    dev = target_logits.device
    cuda = _on_cuda(target_logits)
    b = cu_num_drafts.numel() - 1
    k = int(max_drafts)
    tokens = torch.empty((b, k + 1), dtype=torch.int64, device=dev)
    emitted = torch.empty(b, dtype=torch.int64, device=dev)
    if b == 0:
        return tokens, emitted
    n_t, vocab = target_logits.shape
    has_draft = draft_logits is not None
    d_logits = draft_logits if has_draft else target_logits
    n_d, d_vocab = draft_tokens.numel(), d_logits.shape[1]
    t_block_v, block_r, t_nsplit, t_split_len = _tiles(vocab, cuda, block_v, splits)
    d_block_v, _, d_nsplit, d_split_len = _tiles(d_vocab, cuda, block_v, splits) if has_draft else (t_block_v, 0, 1, t_split_len)
    # One float64 scratch: row statistics (ids and flags are exact in float64), draw masses, chains,
    # and final statistics of the sides (target, draft) with several splits.
    t_size = n_t * t_nsplit
    d_off = 4 * t_size
    d_size = n_d * d_nsplit if has_draft else 0
    m_off = d_off + 4 * d_size
    n_tiles = cdiv(vocab, t_block_v)
    m_size = b * (k + 1) * n_tiles
    c_off = m_off + 2 * m_size
    # The target rows' group sums and each tile's max and sum (float32, ``_grouped_stats_step``),
    # where requests use residual candidates.
    g_off = c_off + b * (k + 5)
    t_width = _stats_width(t_split_len, t_block_v, cuda)
    candidates = triton_sampler.candidates_for(vocab, cuda)
    group, ntp, gpt = _candidate_plan(vocab, t_block_v, t_width)
    g_size, r_size = (n_t * cdiv(vocab, group), n_t * cdiv(vocab, t_width) * 2) if candidates else (0, 0)
    f_off = g_off + cdiv(g_size + r_size, 2)  # final statistics where the vocabulary has several splits
    f_size = 4 * n_t * (t_nsplit > 1) + 4 * n_d * (d_nsplit > 1)
    k_off = f_off + f_size
    scratch = torch.empty(k_off + _counters_and_flags(b), dtype=torch.float64, device=dev)
    groups = scratch[g_off:f_off].view(torch.float32)
    g_sum, g_tile = groups[:g_size], groups[g_size : g_size + r_size]
    temperature = temperature.to(torch.float64)
    # CUDA: the staged path's tiles (one (request, step) per program for V >= 2048). The
    # interpreter pays per element of a tile, valid or not: no more lanes than needed.
    ks = max(k, 1)  # statistics lanes per request: rows 0..k-1 (the last target row needs none)
    lanes = block_r if cuda else min(_CPU_TILE // t_block_v, next_power_of_2(b * ks))
    per = _stats_splits_per_program(b * ks, max(t_nsplit, d_nsplit))
    pdl = cuda and _pdl(dev)
    # Every request has K drafts: the host knows it from the draft count alone (B K tokens, at
    # most K each), and the statistics kernel then finds its rows without loading ``cu``. On an
    # H200 0.7-1.0 us less at B = 256, K = 1, V = 131072, up to 0.5 us less at the other shapes
    # timed. The outputs are the same. A constexpr: as a runtime argument, a ragged batch's code
    # took 2 us more there than before the change (benchmarks/RESULTS.md#tried-and-not-kept).
    equal_counts = n_d == b * ks
    evict_first = _STATS_EVICT_FIRST_MIN_DRAFTS <= n_d <= _STATS_EVICT_FIRST_MAX_DRAFTS
    runs = cdiv(t_nsplit, per) + (cdiv(d_nsplit, per) if has_draft else 0)  # runs of splits per lane block
    launch(
        _fused_stats_kernel, (cdiv(b * ks, lanes) * runs,),
        target_logits, target_logits.stride(0), vocab, d_logits, d_logits.stride(0), d_vocab, cu_num_drafts, temperature, ks, b,
        scratch, t_size, d_off, d_size, t_split_len, d_split_len, per, runs, g_sum, g_tile, k_off, has_draft, t_nsplit, d_nsplit, lanes,
        t_width, _stats_width(d_split_len, d_block_v, cuda), group if candidates else 0, pdl, equal_counts, evict_first,
        num_warps=4, **({"maxnreg": _STATS_MAX_REGISTERS} if cuda and candidates else {}),
    )  # fmt: skip
    has_synthetic = has_synthetic and synthetic_rates is not None
    # CUDA: one request per program for V >= 2048; at tiny vocabularies at most as many as the
    # staged chain kernel holds (Triton 3.6 took 6 min to compile [1024 lanes, 16 steps] tiles).
    # The interpreter: a lane's widest tile is a draw tile or its candidates' groups.
    lanes = (
        min(block_r, _CUDA_REQUESTS)
        if cuda
        else min(_CPU_TILE // max(t_block_v, _candidate_width(candidates, ntp, gpt, group)), next_power_of_2(b))
    )
    mass_split_len = _mass_split_len(cdiv(b, lanes), n_tiles, t_block_v)
    pick_in_mass = cdiv(b, lanes) <= _PICK_IN_MASS_MAX_BLOCKS
    args = (
        target_logits, target_logits.stride(0), vocab, d_logits, d_logits.stride(0), d_vocab, cu_num_drafts, temperature,
        seeds, positions, methods, draft_tokens, synthetic_rates if has_synthetic else temperature, k, b,
        scratch, t_size, d_off, d_size, m_off, m_size, c_off, mass_split_len, n_tiles, f_off, k_off, tokens, emitted,
        g_sum, g_tile, t_width,
    )  # fmt: skip
    # Steps padded to a power of two, at least 2 (a masked step costs nothing): Triton 3.6
    # failed on a [lanes, 1] step tile before the step indices were int64.
    kp = max(2, next_power_of_2(k + 1))
    # Every lane's tile masses in one load (128 per lane at most on CUDA: V <= 262,144 at one lane).
    flags = (
        has_draft,
        has_strict,
        has_synthetic,
        has_block,
        t_nsplit,
        d_nsplit,
        kp,
        _tile_masses_width(n_tiles, lanes, cuda),
        lanes,
        t_block_v,
        pick_in_mass,
        candidates,
        group,
        ntp,
        gpt,
        pdl,
        _flag_chain(lanes, has_strict, has_block, pdl, pick_in_mass),
        kp <= _INPUTS_FIRST_MAX_STEPS,
    )
    # After the statistics kernel each kernel may start before the previous one ends and waits
    # for it (``gdc_wait``) before it reads what that kernel wrote (the mass kernel before a pick
    # kernel: for its block's flags); the first waits for earlier work.
    options = {"num_warps": 4} | ({"launch_pdl": True} if pdl else {})
    # The kernels after the statistics share one signature and these arguments (``launch_each``).
    launches = [(_fused_chain_kernel, (cdiv(b, lanes),), options)]
    if candidates:  # one warp: its reductions need no shared memory
        launches.append((_fused_candidate_kernel, (cdiv(b, lanes),), options | ({"num_warps": 1} if cuda else {})))
    launches.append((_fused_mass_kernel, (cdiv(b, lanes), cdiv(vocab, mass_split_len)), options))
    if not pick_in_mass:
        launches.append((_fused_pick_kernel, (cdiv(b, lanes),), options))
    launch_each(launches, *args, *flags)
    return tokens, emitted


# --- backends with the path forced (``--backend harness.backends.triton.fused:FusedTritonBackend``) ---
class FusedTritonBackend(TritonBackend):
    """The Triton sampler on its fused path at every batch size."""

    name = "triton-fused"

    def __init__(self, device: str = "cpu", block_v: int | None = None, splits: int | None = None):
        super().__init__(device, block_v, splits, path="fused")


class StagedTritonBackend(TritonBackend):
    """The Triton sampler on its staged path at every batch size."""

    name = "triton-staged"

    def __init__(self, device: str = "cpu", block_v: int | None = None, splits: int | None = None):
        super().__init__(device, block_v, splits, path="staged")

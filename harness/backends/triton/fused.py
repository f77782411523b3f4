"""The fused path of the suite's Triton sampler (``backend.verify(..., path="fused")``: ``verify_fused``).

This module holds the five fused kernels beside the host code that plans their launches
(``plan_fused``), and is over 500 lines because Triton kernels take no ``*args`` or structs: the
four kernels launched together (``launch_each``) each spell out the same 30-parameter signature
(their jit helpers are in ``fused_parts``, the launch policies in ``fused_plan``).

The staged pipeline of ``harness.backends.triton.staged`` launches up to ten kernels per
call (row statistics and their merge for target and draft, owners, chain, strict draws,
block masses and stop, draw masses and pick) and allocates a dozen tensors. This path does
the same work for every method in three to five launches, three allocations (outputs and
one float64 scratch) and no host synchronization; on sm_90+ each launch after the first is
programmatic (``Tunables.pdl``: it starts while the previous kernel runs and waits for it on the device,
``gdc_wait``). Where a pick kernel follows, the mass kernel starts beside the candidate kernel
(which lets it launch before its own ``gdc_wait``; beside the chain kernel where no candidate
kernel runs), and each mass program waits only for its request block, on flags (``raise_flag``,
``await_flag``: release and acquire, gpu scope; the statistics kernel lowers them each call, the
scratch is not zeroed):
* the chain kernel's, raised once the block's chain is stored (2 if one of its requests
  rejected, else 1; with one request per block and no strict or block requests 1 + rejected +
  2 n, so that a mass program loads nothing of the chain: ``flag_chain``): a kernel two
  programmatic launches behind may start before the first has
  ended (``benchmarks/pdl_overlap.py``, ``benchmarks/RESULTS.md#programmatic-launch-overlap``: on
  an H100, in 8 of 10 tries the third of three kernels started 12-25 us before the first ended
  and read its flag unset);
* after a rejection, the candidate kernel's (1; under ``flag_chain`` 1 + (a candidate kept)):
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
``Tunables.pick_in_mass_max_blocks`` blocks the flags' atomics cost more (0.6-1.0 us at B = 1) than
the wait they save, and the mass kernel waits with ``gdc_wait``:

1. ``_fused_stats_kernel``, grid ((request, step) blocks x runs of target and draft splits, the runs of
   a block consecutive):
   target row k or draft row k (k < the request's draft count) of request r over one split
   (several one after the other at large batches, ``stats_splits_per_program``), by the
   staged path's own split loop (``split_stats``; on CUDA a split is one
   tile, ``stats_width``): final statistics when the vocabulary is one split, per-split
   partials otherwise. A request's last target row
   (the bonus row) gets none: only a draw from the target row uses it, and such a draw
   weighs each tile relative to the tile's own max (``_tile_weights``), so it reads that row
   once, in the mass kernel, instead of twice. With residual candidates (``candidates_for``)
   the target rows' tiles also store their group sums (``_grouped_stats_step``), and the
   kernel is capped at ``Tunables.stats_max_registers`` on CUDA. Where every request has K drafts
   (``EQUAL_COUNTS``) a row's address is r (K + 1) + k or r K + k, and its reads wait for no
   load of ``cu``. With ``Tunables.stats_evict_first_min_drafts`` to ``stats_evict_first_max_drafts``
   draft rows its tiles load ``evict_first`` (``EVICT_FIRST``, a cache hint).
2. ``_fused_chain_kernel``, grid (request blocks): merges the split partials of every row
   of its requests into final statistics (``_merge_splits``, as ``_combine_kernel``: once per
   row, so no later kernel merges), decides every step of the acceptance chain at once
   (standard, greedy, synthetic) and block verification's running ratios, and writes them.
   Up to ``Tunables.inputs_first_max_steps`` steps it reads the drafts, their logits and uniforms
   before it waits for the statistics kernel, and takes the statistics of a side with several
   splits from the registers it merged them in (``INPUTS_FIRST``).
2b. ``_fused_candidate_kernel``, grid (request blocks), one warp on CUDA: a chain method's
   rejection draws its replacement by rejection from the target row (``residual_candidates``:
   ``candidates_for`` candidates, each reading one group of ids), so that request needs no
   masses of its rows, which would be their second read; one none of whose candidates is
   kept draws below, the same law. A request whose candidate is kept is finished here (its
   output slots and emitted count): the mass and pick kernels skip it, and a request block
   with nothing left skips the pick (at B = 1, K = 8, V = 152064 on an H100, 23.6 -> 21.3 us).
3. ``_fused_mass_kernel``, grid (request blocks, spans of tiles): sums over each tile of its
   span the weights of every draw its requests may need: the residual or bonus row of a
   chain request, every row up to the first placeholder of a strict or block request (a
   target-row draw: each tile's sum relative to its max, and the max). The spans are the
   call's own (``mass_span``): one tile each at small batches, up to four at large.
4. ``pick`` (in the last mass program of each request block to finish, up to
   ``Tunables.pick_in_mass_max_blocks`` blocks; else ``_fused_pick_kernel``, grid (request blocks)):
   strict requests' own target samples (stream TARGET), block verification's stop, the
   final draw by inverse CDF inside the tile holding ``u * total`` (``_pick_kernel``'s
   algorithm), and every output slot (-1 past the emitted count, so the outputs need no
   fill). A bonus row's max, degenerate flag and argmax (greedy) come from its tile maxima.

The splits, the reductions and the noise (``uniform`` keyed by (seed, position, stream)) are
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
``suites/test_triton_paths.py`` and ``suites/test_triton_gpu.py`` check tokens on both devices, the final statistics bit for bit
under the interpreter and within a summation-order bound on CUDA. The interpreter takes the
largest tiles Triton allows (it pays per operation and per program; a reduction over a row
does not depend on how many rows the tile holds).

Planted faults (``fault != 0``) never come here: they live in the staged kernels.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from harness.backends.triton.common import (
    LOG2E,
    METHOD_BLOCK,
    METHOD_STRICT,
    candidate_plan,
    candidate_width,
    candidates_for,
    inv_temperature,
    tile_masses_width,
    tile_plan,
)
from harness.backends.triton.draws import residual_candidates, split_tile_masses
from harness.backends.triton.fused_parts import (
    await_flag,
    block_rejected,
    chain_inputs,
    chain_rule,
    final_arrays,
    final_stats,
    finalize,
    flag_ptrs,
    job,
    left_to_draw,
    load_chain,
    pick,
    raise_flag,
    request,
    stats_at,
    store_chain,
    store_outputs,
)
from harness.backends.triton.fused_plan import counters_and_flags, flag_chain, mass_span, pdl_on, stats_splits_per_program, stats_width
from harness.backends.triton.launch import cdiv, launch, launch_each, next_power_of_2
from harness.backends.triton.row_stats import split_stats
from harness.backends.triton.tunables import DEFAULT_TUNABLES, Tunables

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
    not depend on ``per`` (``stats_splits_per_program``). A request's last target row (k = its
    draft count) gets no statistics: only a draw from the target row uses it, and that draw
    needs none (``_tile_weights``)."""
    if PDL:  # the chain kernel's programs may start (and wait) while this kernel's last ones run
        gdc_launch_dependents()
        if tl.program_id(0) == 0:  # the later kernels' flags, lowered for this call
            flags = flag_ptrs(scratch, k_off, B)
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
    scale = inv_temperature(temp) * LOG2E
    greedy = temp == 0
    valid = valid & (k < cnt)
    if tl.max(valid.to(tl.int32), axis=0) > 0:
        if first < t_firsts:
            t_m, t_s, t_arg, t_nan = stats_at(scratch, t_size)
            for split in range(first, tl.minimum(first + per, T_NSPLIT)):
                split_stats(
                    t_logits, t_stride, V, start + r + k, valid, valid & greedy, scale, split, t_split_len, t_m, t_s, t_arg, t_nan,
                    g_sum, g_tile, T_NSPLIT, BLOCK_R, T_BLOCK_V, 0, GROUP, EVICT_FIRST,
                )  # fmt: skip
        elif HAS_DRAFT:
            d_m, d_s, d_arg, d_nan = stats_at(scratch + d_off, d_size)
            for split in range(first - t_firsts, tl.minimum(first - t_firsts + per, D_NSPLIT)):
                split_stats(
                    d_logits, d_stride, Vd, start + k, valid, valid & greedy, scale, split, d_split_len, d_m, d_s, d_arg, d_nan,
                    g_sum, g_tile, D_NSPLIT, BLOCK_R, D_BLOCK_V, 0, 0, EVICT_FIRST,
                )  # fmt: skip


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
    ``INPUTS_FIRST`` it reads the caller's tensors (``chain_inputs``) before it waits for the
    statistics kernel, and takes the statistics it merged (a side with several splits) from
    registers; else it reads them after the merge, and loads the merged statistics back (fewer
    registers across the merge)."""
    r, valid, start, cnt, temp, seed, method = request(cu, temperature, seeds, methods, B, BLOCK_R)
    if INPUTS_FIRST:
        x, good, a_t, a_q, u, rate = chain_inputs(
            t_logits, t_stride, V, d_logits, d_stride, Vd, positions, drafts, rates, K, r, valid, start, cnt, seed, method,
            HAS_DRAFT, HAS_SYNTH, KP,
        )  # fmt: skip
    if PDL:  # the inputs above are the caller's; the statistics kernel's partials below
        gdc_wait()
        gdc_launch_dependents()
    ks = tl.arange(0, KP).to(tl.int64)[None, :]
    scale = (inv_temperature(temp) * LOG2E)[:, None]
    t_m, t_s, t_arg, t_nan, d_m, d_s, d_arg, d_nan = final_arrays(scratch, t_size, d_off, d_size, f_off, T_NSPLIT, D_NSPLIT)
    # Target and draft rows 0..cnt-1 (the last target row has no statistics).
    t_rows, d_rows, mask = (start + r)[:, None] + ks, start[:, None] + ks, valid[:, None] & (ks < cnt[:, None])
    if not INPUTS_FIRST:
        good = mask  # finalize's returns are unused: the merged statistics are loaded back below
    if T_NSPLIT > 1:
        tm, tlogs, targ, tbad = finalize(scratch, t_size, t_m, t_s, t_arg, t_nan, t_rows, mask, good, scale, T_NSPLIT)
    if HAS_DRAFT and D_NSPLIT > 1:
        dm, dlogs, darg, dbad = finalize(scratch + d_off, d_size, d_m, d_s, d_arg, d_nan, d_rows, mask, good, scale, D_NSPLIT)
    if not INPUTS_FIRST:
        tl.debug_barrier()  # the final statistics other threads stored, loaded back below
        x, good, a_t, a_q, u, rate = chain_inputs(
            t_logits, t_stride, V, d_logits, d_stride, Vd, positions, drafts, rates, K, r, valid, start, cnt, seed, method,
            HAS_DRAFT, HAS_SYNTH, KP,
        )  # fmt: skip
    if T_NSPLIT == 1 or not INPUTS_FIRST:
        tm, tlogs, targ, tbad = final_stats(t_m, t_s, t_arg, t_nan, t_rows, good)
    if HAS_DRAFT:
        if D_NSPLIT == 1 or not INPUTS_FIRST:
            dm, dlogs, darg, dbad = final_stats(d_m, d_s, d_arg, d_nan, d_rows, good)
    else:
        dm, dlogs, darg, dbad = tm, tlogs, targ, tbad  # unused without a draft row
    n, rejected, n_eff, rhos = chain_rule(
        x, good, a_t, a_q, u, rate, tm, tlogs, targ, tbad, dm, dlogs, darg, dbad, K, valid, temp, method,
        HAS_DRAFT, HAS_SYNTH, HAS_BLOCK, KP,
    )  # fmt: skip
    store_chain(scratch + c_off, r, valid, n, rejected, n_eff, rhos, K, B, HAS_BLOCK, KP)
    if PICK:
        tl.store(scratch + k_off + tl.program_id(0), 0.0)  # the mass kernel's counter of this block
    if PDL and not PICK:  # the mass kernel's programs of this block may start: 1 + (one of its requests rejected)
        value = 1 + tl.max((valid & rejected).to(tl.int32), axis=0)
        if FLAG_CHAIN:  # + 2 n of its one request: the mass kernel needs no load of the chain
            tl.static_assert(BLOCK_R == 1, "the flags carry the chain of one request per block")
            value += 2 * tl.sum(tl.where(valid, n, 0), axis=0).to(tl.int32)
        raise_flag(flag_ptrs(scratch, k_off, B) + tl.program_id(0), value)


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
    residual by candidates (``residual_candidates``), if one is kept; ``load_chain`` reads it
    (a mass program under ``flag_chain`` only whether one was, from the flag).
    A request whose candidate is kept is finished here (its output slots and emitted count), so
    the mass and pick kernels have nothing left to do for it."""
    r, valid, start, cnt, temp, seed, method = request(cu, temperature, seeds, methods, B, BLOCK_R)
    ks = tl.arange(0, KP)[None, :]
    x = tl.load(drafts + start[:, None] + ks, mask=valid[:, None] & (ks < cnt[:, None]), other=-1)  # the caller's
    if PDL:
        if PICK:  # the mass kernel waits for this one to end
            gdc_wait()
            gdc_launch_dependents()
        else:  # the mass kernel starts now and waits for each block's flags instead
            gdc_launch_dependents()
            gdc_wait()
    n, rejected, n_eff, kept = load_chain(scratch + c_off, r, valid, K, B, tl.int64)
    need = valid & rejected & (temp != 0)
    if HAS_STRICT:
        need = need & (method != METHOD_STRICT)
    if HAS_BLOCK:
        need = need & (method != METHOD_BLOCK)
    if tl.max(need.to(tl.int32), axis=0) > 0:
        t_m, t_s, t_arg, t_nan, d_m, d_s, d_arg, d_nan = final_arrays(scratch, t_size, d_off, d_size, f_off, T_NSPLIT, D_NSPLIT)
        trow = start + r + n
        m, logs, arg, bad = final_stats(t_m, t_s, t_arg, t_nan, trow, need)
        # Every load below is masked by ``need``, not by the row's degenerate flag: they go out
        # with the statistics' instead of after them. A degenerate row's candidates are dropped.
        c_trow, c_drow, c_m, c_logs2, c_dm, c_dlogs2, c_scale, c_rho, c_act, c_resid, c_use_draft, c_excl = job(
            d_m, d_s, d_arg, d_nan, drafts, trow, start + n, m, logs, tl.where(need, 1.0, -1.0), need,
            inv_temperature(temp) * LOG2E, HAS_DRAFT,
        )  # fmt: skip
        kept = residual_candidates(
            t_logits, t_stride, V, d_logits, d_stride, Vd, g_sum, g_tile, tile_width, c_trow, c_drow, c_m, c_logs2, c_dm,
            c_dlogs2, c_scale, c_rho, c_use_draft, c_excl, c_act, seed[:, None], tl.load(positions + trow, mask=need, other=0)[:, None],
            HAS_DRAFT, N, GROUP, NTP, GPT,
        )  # fmt: skip
        kept = tl.where(bad, -1, kept)
        tl.store(scratch + c_off + (K + 4) * B + r, kept, mask=need)
        store_outputs(tokens, emitted, r, x, n, kept, need & (kept >= 0), K, KP)
    if PDL and not PICK:
        value = 1
        if FLAG_CHAIN:  # + (a candidate kept)
            value += tl.max((need & (kept >= 0)).to(tl.int32), axis=0)
        raise_flag(flag_ptrs(scratch, k_off, B) + B + tl.program_id(0), value)


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
    r, valid, start, cnt, temp, seed, method = request(cu, temperature, seeds, methods, B, BLOCK_R)
    if PDL:
        if PICK:  # the call's last kernel
            gdc_wait()
        else:
            # This block's chain, and its candidates where one of its requests rejected: the
            # other blocks' candidates run meanwhile. Then the pick kernel may start.
            flags = flag_ptrs(scratch, k_off, B) + tl.program_id(0)
            seen = await_flag(flags)
            kept_flag = seen * 0 + 1  # no candidates waited for: none kept (an int32 like the flag)
            if block_rejected(seen) and N > 0:
                kept_flag = await_flag(flags + B)
            gdc_launch_dependents()
    t_m, t_s, t_arg, t_nan, d_m, d_s, d_arg, d_nan = final_arrays(scratch, t_size, d_off, d_size, f_off, T_NSPLIT, D_NSPLIT)
    if PDL and not PICK and FLAG_CHAIN:  # the chain from the flags' values (one request per block)
        tl.static_assert(BLOCK_R == 1, "the flags carry the chain of one request per block")
        n = tl.zeros_like(r).to(tl.int64) + (seen - 1) // 2
        rejected = valid & block_rejected(seen)
        n_eff = n  # strict and block verification only, which do not take this path
        kept = tl.zeros_like(n) + tl.where(kept_flag > 1, 0, -1)  # only whether one was kept matters here
    else:
        n, rejected, n_eff, kept = load_chain(scratch + c_off, r, valid, K, B, tl.int64)  # as chain_rule's
    greedy = temp == 0
    scale = inv_temperature(temp) * LOG2E
    strict = valid & False
    blk = valid & False
    if HAS_STRICT:
        strict = valid & (method == METHOD_STRICT)
    if HAS_BLOCK:
        blk = valid & (method == METHOD_BLOCK)
    seq = strict | blk  # a draw may come from any row up to the first placeholder
    first = tl.where(seq, 0, n)
    count = tl.where(seq, n_eff + 1, (valid & (kept < 0)).to(tl.int64)).to(tl.int32)  # a kept candidate: no draw
    rho_chain = tl.where(strict, -1.0, tl.where(rejected, 1.0, -1.0))
    mass_w = scratch + m_off
    for i in range(0, tl.max(count, axis=0)):
        slot = first + i
        trow = start + r + slot
        m, logs, _, bad = final_stats(t_m, t_s, t_arg, t_nan, trow, (i < count) & (slot < cnt))
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
        j_trow, j_drow, j_m, j_logs2, j_dm, j_dlogs2, j_scale, j_rho, j_active, j_resid, j_use_draft, j_excl = job(
            d_m, d_s, d_arg, d_nan, drafts, trow, start + slot, m, logs, rho, act, scale, HAS_DRAFT
        )
        at = (r * (K + 1) + slot) * n_tiles
        split_tile_masses(
            t_logits, t_stride, V, d_logits, d_stride, Vd, j_trow, j_drow, j_m, j_logs2, j_dm, j_dlogs2, j_scale, j_rho,
            j_active, j_resid, j_use_draft, j_excl, act, split, split_len, mass_w + at, mass_w + m_size + at,
            HAS_DRAFT, 0, BLOCK_V,
        )  # fmt: skip
    # A block whose requests all kept a candidate is finished (``_fused_candidate_kernel``).
    if PICK and left_to_draw(valid, kept):
        # The last of this request block's mass programs picks its tokens (no fourth launch). The
        # barrier puts every thread's stores before the counter's release (Triton's layer-norm
        # tutorial's lock); the acquire puts the other programs' stores before the pick's loads.
        tl.debug_barrier()
        if tl.atomic_add(scratch + k_off + tl.program_id(0), 1.0, sem="acq_rel", scope="gpu") == tl.num_programs(1) - 1:
            pick(
                t_logits, t_stride, V, d_logits, d_stride, Vd, positions, drafts, K, B, scratch, t_size, d_off, d_size,
                m_off, m_size, c_off, n_tiles, f_off, tokens, emitted, r, valid, start, cnt, temp, seed, method,
                n.to(tl.int32), rejected, n_eff.to(tl.int32), kept, HAS_DRAFT, HAS_STRICT, HAS_BLOCK, T_NSPLIT, D_NSPLIT, KP, NT, BLOCK_V,
            )  # fmt: skip


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
    """``pick`` as a kernel of its own (where the mass kernel does not pick)."""
    r, valid, start, cnt, temp, seed, method = request(cu, temperature, seeds, methods, B, BLOCK_R)
    if PDL:
        gdc_wait()
    n, rejected, n_eff, kept = load_chain(scratch + c_off, r, valid, K, B, tl.int32)
    if left_to_draw(valid, kept):  # else finished by the candidate kernel
        pick(
            t_logits, t_stride, V, d_logits, d_stride, Vd, positions, drafts, K, B, scratch, t_size, d_off, d_size, m_off,
            m_size, c_off, n_tiles, f_off, tokens, emitted, r, valid, start, cnt, temp, seed, method, n, rejected, n_eff, kept,
            HAS_DRAFT, HAS_STRICT, HAS_BLOCK, T_NSPLIT, D_NSPLIT, KP, NT, BLOCK_V,
        )  # fmt: skip


# --- host side ----------------------------------------------------------------------------------
_CPU_TILE = 1 << 20  # elements per tile in the interpreter: Triton's largest tensor


def verify_fused(
    target_logits, draft_logits, draft_tokens, cu_num_drafts, temperature, seeds, positions, methods,
    synthetic_rates, max_drafts: int, *, has_strict: bool = True, has_block: bool = True, has_synthetic: bool = True,
    block_v: int | None = None, splits: int | None = None, tunables: Tunables = DEFAULT_TUNABLES,
):  # fmt: skip
    """``backend.verify``'s contract (the same outputs) in three to five launches, three
    allocations and no host synchronization. ``has_*`` only prune code, as there. The inputs keep
    the ``VerifyBatch`` layout, unchecked here: ``cu_num_drafts`` from 0, counts at most
    ``max_drafts``, one draft token per draft (``_fused_stats_kernel`` finds the rows of a batch
    of ``max_drafts`` each without ``cu``). The launches are ``plan_fused``'s."""
    tokens, emitted, stats, launches, args = plan_fused(
        target_logits, draft_logits, draft_tokens, cu_num_drafts, temperature, seeds, positions, methods, synthetic_rates,
        max_drafts, has_strict=has_strict, has_block=has_block, has_synthetic=has_synthetic, block_v=block_v, splits=splits,
        tunables=tunables,
    )  # fmt: skip
    if stats is not None:
        kernel, grid, stats_args, options = stats
        launch(kernel, grid, *stats_args, **options)
        launch_each(launches, *args)
    return tokens, emitted


def plan_fused(
    target_logits, draft_logits, draft_tokens, cu_num_drafts, temperature, seeds, positions, methods,
    synthetic_rates, max_drafts: int, *, has_strict: bool = True, has_block: bool = True, has_synthetic: bool = True,
    block_v: int | None = None, splits: int | None = None, tunables: Tunables = DEFAULT_TUNABLES,
    cuda: bool | None = None, pdl: bool | None = None,
):  # fmt: skip
    """``verify_fused``'s outputs (allocated, not yet written) and its launches, planned and not
    run: ``(tokens, emitted, stats, launches, args)``. ``stats``: the statistics kernel's
    ``(kernel, grid, arguments, options)`` (None for an empty batch, which launches nothing);
    ``launches``: the later kernels' ``(kernel, grid, options)``, which all take ``args``
    (``launch_each``). ``cuda`` / ``pdl``: plan CUDA tiles and grids / programmatic dependent
    launch (default: as the logits' device has them); ``compile_info.cuda_launches`` plans a
    CUDA call on a machine without a GPU."""
    dev = target_logits.device
    cuda = dev.type == "cuda" if cuda is None else cuda
    b = cu_num_drafts.numel() - 1
    k = int(max_drafts)
    tokens = torch.empty((b, k + 1), dtype=torch.int64, device=dev)
    emitted = torch.empty(b, dtype=torch.int64, device=dev)
    if b == 0:
        return tokens, emitted, None, [], ()
    n_t, vocab = target_logits.shape
    has_draft = draft_logits is not None
    d_logits = draft_logits if has_draft else target_logits
    n_d, d_vocab = draft_tokens.numel(), d_logits.shape[1]
    t_block_v, block_r, t_nsplit, t_split_len = tile_plan(vocab, cuda, block_v, splits)
    d_block_v, _, d_nsplit, d_split_len = tile_plan(d_vocab, cuda, block_v, splits) if has_draft else (t_block_v, 0, 1, t_split_len)
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
    t_width = stats_width(t_split_len, t_block_v, cuda, tunables)
    candidates = candidates_for(vocab, cuda, tunables)
    group, ntp, gpt = candidate_plan(vocab, t_block_v, t_width, tunables)
    g_size, r_size = (n_t * cdiv(vocab, group), n_t * cdiv(vocab, t_width) * 2) if candidates else (0, 0)
    f_off = g_off + cdiv(g_size + r_size, 2)  # final statistics where the vocabulary has several splits
    f_size = 4 * n_t * (t_nsplit > 1) + 4 * n_d * (d_nsplit > 1)
    k_off = f_off + f_size
    scratch = torch.empty(k_off + counters_and_flags(b), dtype=torch.float64, device=dev)
    groups = scratch[g_off:f_off].view(torch.float32)
    g_sum, g_tile = groups[:g_size], groups[g_size : g_size + r_size]
    temperature = temperature.to(torch.float64)
    # CUDA: the staged path's tiles (one (request, step) per program for V >= 2048). The
    # interpreter pays per element of a tile, valid or not: no more lanes than needed.
    ks = max(k, 1)  # statistics lanes per request: rows 0..k-1 (the last target row needs none)
    lanes = block_r if cuda else min(_CPU_TILE // t_block_v, next_power_of_2(b * ks))
    per = stats_splits_per_program(b * ks, max(t_nsplit, d_nsplit), tunables)
    pdl = (cuda and pdl_on(dev, tunables)) if pdl is None else pdl
    # Every request has K drafts: the host knows it from the draft count alone (B K tokens, at
    # most K each), and the statistics kernel then finds its rows without loading ``cu``. On an
    # H200 0.7-1.0 us less at B = 256, K = 1, V = 131072, up to 0.5 us less at the other shapes
    # timed. The outputs are the same. A constexpr: as a runtime argument, a ragged batch's code
    # took 2 us more there than before the change (benchmarks/RESULTS.md#tried-and-not-kept).
    equal_counts = n_d == b * ks
    evict_first = tunables.stats_evict_first_min_drafts <= n_d <= tunables.stats_evict_first_max_drafts
    runs = cdiv(t_nsplit, per) + (cdiv(d_nsplit, per) if has_draft else 0)  # runs of splits per lane block
    stats = (
        _fused_stats_kernel, (cdiv(b * ks, lanes) * runs,),
        (
            target_logits, target_logits.stride(0), vocab, d_logits, d_logits.stride(0), d_vocab, cu_num_drafts, temperature, ks, b,
            scratch, t_size, d_off, d_size, t_split_len, d_split_len, per, runs, g_sum, g_tile, k_off, has_draft, t_nsplit, d_nsplit,
            lanes, t_width, stats_width(d_split_len, d_block_v, cuda, tunables), group if candidates else 0, pdl, equal_counts,
            evict_first,
        ),
        {"num_warps": 4, **({"maxnreg": tunables.stats_max_registers} if cuda and candidates else {})},
    )  # fmt: skip
    has_synthetic = has_synthetic and synthetic_rates is not None
    # CUDA: one request per program for V >= 2048; at tiny vocabularies at most as many as the
    # staged chain kernel holds (Triton 3.6 took 6 min to compile [1024 lanes, 16 steps] tiles).
    # The interpreter: a lane's widest tile is a draw tile or its candidates' groups.
    lanes = (
        min(block_r, tunables.cuda_requests)
        if cuda
        else min(_CPU_TILE // max(t_block_v, candidate_width(candidates, ntp, gpt, group)), next_power_of_2(b))
    )
    mass_split_len = mass_span(cdiv(b, lanes), n_tiles, t_block_v, tunables)
    pick_in_mass = cdiv(b, lanes) <= tunables.pick_in_mass_max_blocks
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
        tile_masses_width(n_tiles, lanes, cuda),
        lanes,
        t_block_v,
        pick_in_mass,
        candidates,
        group,
        ntp,
        gpt,
        pdl,
        flag_chain(lanes, has_strict, has_block, pdl, pick_in_mass),
        kp <= tunables.inputs_first_max_steps,
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
    return tokens, emitted, stats, launches, (*args, *flags)

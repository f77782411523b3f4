"""The staged path's statistics and job kernels, each beside the launcher that runs it.

``Stats``: every target or draft row's final statistics (``_stats_kernel``, and
``_combine_kernel`` where the vocabulary is split over programs). ``Context``: what every job
kernel of one batch shares, and the jobs' launches: ``masses`` (``_mass_kernel``: each job's
weight sums per vocabulary tile) and ``draw`` (``_mass_kernel`` then ``_pick_kernel``: each job's
token by inverse CDF). A job draws from a target row or from its residual (``draws``).
``staged.verify_staged`` runs them in order; ``staged.sample_rows`` draws plain rows with them.
"""

import torch
import triton
import triton.language as tl

from harness.backends.triton.common import (
    BONUS_AFTER_REJECT,
    CONTINUE_AFTER_REJECT,
    KEEPS_REJECTED,
    LOG2E,
    NOISE_FLOOR,
    OOV_LANE_WINS,
    RESIDUAL_WRONG_POSITION,
    REUSE_UNIFORM,
    SEED_COLLISION,
    SHIFT_MARK,
    STREAM_ACCEPT,
    inv_temperature,
    planted,
    tile_masses_width,
    tile_plan,
    uniform,
)
from harness.backends.triton.draws import draw_from_tiles, split_tile_masses
from harness.backends.triton.launch import cdiv, launch, next_power_of_2
from harness.backends.triton.row_stats import combine_rows, split_stats


# --- per-row statistics -----------------------------------------------------------------------
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
    scale = inv_temperature(temp) * LOG2E
    need_arg = valid & (temp == 0)
    if FAULT == CONTINUE_AFTER_REJECT:
        need_arg = valid  # the fault fills a rejected slot with the row's argmax, sampled rows too
    split_stats(
        logits, stride, width, rows, valid, need_arg, scale, split, split_len, out_m, out_s, out_arg, out_nan, g_sum, g_tile,
        NSPLIT, BLOCK_R, BLOCK_V, FAULT, GROUP, False,
    )  # fmt: skip


@triton.jit(do_not_specialize=["n_rows"])
def _combine_kernel(
    n_rows, row_req, temperature, part_m, part_s, part_arg, part_nan,
    out_m, out_logs, out_arg, out_bad, NSPLIT: tl.constexpr, BLOCK_R: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """Merge the vocabulary splits of ``_stats_kernel`` (``_merge_splits``: lowest id wins ties)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    valid = rows < n_rows
    req = tl.load(row_req + rows, mask=valid, other=0)
    scale = inv_temperature(tl.load(temperature + req, mask=valid, other=1.0)) * LOG2E
    combine_rows(part_m, part_s, part_arg, part_nan, rows, valid, scale, out_m, out_logs, out_arg, out_bad, NSPLIT, FAULT)


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
    if FAULT == RESIDUAL_WRONG_POSITION:  # a marked job weighs the next target row against this draft
        shifted = resid & (rho == SHIFT_MARK)
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
        if FAULT == KEEPS_REJECTED:
            excl = excl * 0 - 1
    return trow, req, rho, active, resid, drow, use_draft, excl


@triton.jit
def job_rows(
    job_trow, job_req, job_rho, n_jobs, temperature, drafts,
    t_m, t_logs, d_m, d_logs, d_bad, HAS_DRAFT: tl.constexpr, BLOCK_R: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """Per-lane inputs of ``BLOCK_R`` jobs, as [BLOCK_R, 1] columns."""
    jobs = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    trow, req, rho, active, resid, drow, use_draft, excl = _load_job(
        job_trow, job_req, job_rho, jobs, jobs < n_jobs, drafts, d_bad, HAS_DRAFT, FAULT
    )
    scale = inv_temperature(tl.load(temperature + req, mask=active, other=1.0)) * LOG2E
    m = tl.load(t_m + trow, mask=active, other=0.0)
    logs2 = tl.load(t_logs + trow, mask=active, other=0.0) * LOG2E
    dm = tl.load(d_m + drow, mask=use_draft, other=0.0)
    dlogs2 = tl.load(d_logs + drow, mask=use_draft, other=0.0) * LOG2E
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
    jobs, req, act, trow1, trow, drow, m, logs2, dm, dlogs2, scale, rho, active, resid, use_draft, excl = job_rows(
        job_trow, job_req, job_rho, n_jobs, temperature, drafts, t_m, t_logs, d_m, d_logs, d_bad, HAS_DRAFT, BLOCK_R, FAULT
    )
    split_tile_masses(
        t_logits, t_stride, V, d_logits, d_stride, Vd, trow, drow, m, logs2, dm, dlogs2, scale, rho, active, resid,
        use_draft, excl, jobs < n_jobs, tl.program_id(1), split_len, out_w + jobs * n_tiles, out_t + jobs * n_tiles,
        HAS_DRAFT, FAULT, BLOCK_V,
    )  # fmt: skip


@triton.jit(do_not_specialize=["n_jobs", "K"])
def _pick_kernel(
    t_logits, t_stride, V, d_logits, d_stride, Vd, t_m, t_logs, d_m, d_logs, d_bad,
    job_trow, job_req, job_rho, n_jobs, temperature, seeds, positions, drafts,
    mass_w, mass_t, u_given, out, emitted, K, n_tiles,
    STREAM: tl.constexpr, FINAL: tl.constexpr, GIVEN_U: tl.constexpr, HAS_DRAFT: tl.constexpr,
    NT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """Each job's token (``draw_from_tiles``). ``FINAL``: write in the request's last slot,
    else ``out[job]``."""
    jobs, req, act, trow1, trow, drow, m, logs2, dm, dlogs2, scale, rho, active, resid, use_draft, excl = job_rows(
        job_trow, job_req, job_rho, n_jobs, temperature, drafts, t_m, t_logs, d_m, d_logs, d_bad, HAS_DRAFT, BLOCK_R, FAULT
    )
    if GIVEN_U:
        u = tl.load(u_given + jobs, mask=act, other=0.5)
    else:
        seed = tl.load(seeds + req, mask=act, other=0)
        if FAULT == SEED_COLLISION:
            seed = seed * 0
        pos = tl.load(positions + trow1, mask=act, other=0)
        if FAULT == REUSE_UNIFORM:
            u = uniform(seed, pos, STREAM_ACCEPT)
        else:
            u = uniform(seed, pos, STREAM)
        if FAULT == NOISE_FLOOR:
            u = ((u * 64.0).to(tl.int32).to(tl.float64) + 0.5) / 64.0
    token, use_w = draw_from_tiles(
        t_logits, t_stride, V, d_logits, d_stride, Vd, trow, drow, m, logs2, dm, dlogs2, scale, rho, active, resid,
        use_draft, excl, act, mass_w + jobs * n_tiles, mass_t + jobs * n_tiles, u, n_tiles, HAS_DRAFT, FAULT, NT, BLOCK_V,
    )  # fmt: skip
    if FAULT == OOV_LANE_WINS:
        lane = tl.cdiv(V, BLOCK_V) * BLOCK_V - 1  # the last tile's last lane, padded past V
        empty = (tl.load(job_rho + jobs, mask=act, other=-1.0) >= 0) & ~use_w
        token = tl.where(empty, lane, token)
    if FINAL:
        dest = out + jobs * (K + 1) + tl.load(emitted + jobs, mask=act, other=1) - 1
        if FAULT == BONUS_AFTER_REJECT:  # a residual job's request emits one more slot: the replacement twice
            tl.store(dest - 1, token, mask=act & (tl.load(job_rho + jobs, mask=act, other=-1.0) >= 0))
    else:
        dest = out + jobs
    tl.store(dest, token, mask=act)


# --- host side ----------------------------------------------------------------------------------
class Stats:
    """Final per-row statistics: max logit, log of the sum of exp((a - max) / T), argmax
    (greedy rows; ``NO_ID`` for the others, which never use it), degenerate flag."""

    def __init__(self, logits, row_req, temperature, cuda: bool, tiles: tuple = (None, None), fault: int = 0, group: int = 0):
        """``group`` > 0: also each tile's group sums (``_grouped_stats_step``) for residual candidates."""
        rows, width = logits.shape
        dev = logits.device
        self.m = torch.empty(rows, dtype=torch.float32, device=dev)
        self.logs = torch.empty(rows, dtype=torch.float32, device=dev)
        self.arg = torch.empty(rows, dtype=torch.int32, device=dev)
        self.bad = torch.empty(rows, dtype=torch.int8, device=dev)
        block_v, block_r, nsplit, split_len = tile_plan(width, cuda, *tiles)
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
            planted(_stats_kernel, fault), group,
            num_warps=warps,
        )  # fmt: skip
        if nsplit > 1:
            rb = 32 if cuda else 4096
            launch(
                _combine_kernel, (cdiv(rows, rb),),
                rows, row_req, temperature, *outs, self.m, self.logs, self.arg, self.bad, nsplit, rb, planted(_combine_kernel, fault),
            )  # fmt: skip


class Context:
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
        self.block_v, self.block_r, self.nsplit, self.split_len = tile_plan(self.vocab, cuda, *tiles)
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
            self.n_tiles, self.has_draft, self.block_r, self.block_v, planted(_mass_kernel, self.fault), num_warps=self.warps,
        )  # fmt: skip
        return mass_w, mass_t

    def draw(self, job_trow, job_req, job_rho, stream: int, out, emitted=None, k: int = 0, u=None):
        """One token per active job (trow >= 0) into ``out[job]``, or into each request's
        last slot of ``out`` [B, k+1] when ``emitted`` is given."""
        mass_w, mass_t = self.masses(job_trow, job_req, job_rho)
        n = job_trow.numel()
        rows = min(self.block_r, max(1, (1 << 18) // next_power_of_2(self.n_tiles)))  # tiny CPU tiles: [rows, NT] fits
        nt = tile_masses_width(self.n_tiles, rows, self.dev.type == "cuda")
        launch(
            _pick_kernel, (cdiv(n, rows),),
            *self.common, job_trow, job_req, job_rho, n, self.temperature, self.seeds, self.positions, self.drafts,
            mass_w, mass_t, mass_w if u is None else u, out, out if emitted is None else emitted, k, self.n_tiles,
            stream, emitted is not None, u is not None, self.has_draft, nt, rows, self.block_v,
            planted(_pick_kernel, self.fault),
            num_warps=self.warps,
        )  # fmt: skip

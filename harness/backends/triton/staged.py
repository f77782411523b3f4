"""The staged path of the suite's Triton sampler (``verify_staged``): every verification method.

Same output law as ``reference.sampler`` (not the same random numbers). One call launches a
fixed pipeline with no host synchronization (the statistics and job kernels and their
launchers ``Stats`` and ``Context`` are in ``staged_jobs``; the jit helpers they share with
the fused path in ``row_stats`` and ``draws``):

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
   rejection draws its replacement by rejection from the target row (``residual_candidates``),
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
``backend.verify``'s ``path`` chooses, and the default takes it up to a batch size per vocabulary
(``backend.takes_fused_path``).
"""

import torch
import triton
import triton.language as tl

from harness.backends.triton.common import (
    ACCEPT_AT_ZERO_UNIFORM,
    ACCEPT_PLACEHOLDER,
    BLOCK_TOKEN_WISE,
    BONUS_AFTER_REJECT,
    BONUS_WRONG_ROW,
    CONTINUE_AFTER_REJECT,
    DRAFT_BEFORE_TEMPERATURE,
    DRAFT_OFF_BY_ONE,
    GREEDY_BONUS_SAMPLED,
    IGNORE_DRAFT_PROBS,
    INVERTED_RATIO,
    METHOD_BLOCK,
    METHOD_STRICT,
    METHOD_SYNTHETIC,
    PLACEHOLDER_AS_INDEX,
    RESIDUAL_WRONG_POSITION,
    SEED_COLLISION,
    SHIFT_MARK,
    STREAM_ACCEPT,
    STREAM_BLOCK,
    SYNTHETIC_RATES_AS_CONDITIONAL,
    TEMPERATURE_TWICE,
    WRONG_DRAFT_STEP,
    candidate_plan,
    candidate_width,
    candidates_for,
    inv_temperature,
    planted,
    tile_plan,
    uniform,
)
from harness.backends.triton.draws import residual_candidates, tile_masses
from harness.backends.triton.launch import cdiv, launch, next_power_of_2
from harness.backends.triton.staged_jobs import Context, Stats, job_rows
from harness.backends.triton.tunables import DEFAULT_TUNABLES, Tunables
from reference.methods import Method
from reference.rng import Stream


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


@triton.jit
def _tile_total(mass, n_tiles, mask, CHUNK: tl.constexpr):
    """fp64 sum of each lane's ``n_tiles`` tile masses (``mass``: each lane's first), CHUNK at a
    time (``_block_kernel``: 64 requests per program, too many for ``tile_masses``' one load)."""
    total = tl.zeros(mask.shape, tl.float64)
    for c in range(0, n_tiles, CHUNK):
        total += tl.sum(tile_masses(mass + c, n_tiles - c, mask, CHUNK), axis=1)
    return total


# --- residual candidates: a rejected draft's replacement without a second read of its rows ----------
@triton.jit(do_not_specialize=["n_jobs", "K"])
def _candidate_kernel(
    t_logits, t_stride, V, d_logits, d_stride, Vd, t_m, t_logs, d_m, d_logs, d_bad,
    job_trow, job_req, job_rho, n_jobs, temperature, seeds, positions, drafts, methods, g_sum, g_tile, tile_width,
    out, emitted, K, HAS_DRAFT: tl.constexpr, N: tl.constexpr, GROUP: tl.constexpr, NTP: tl.constexpr,
    GPT: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """The staged path's residual candidates (``residual_candidates``): each request's final
    job that replaces a rejected draft of a chain method (not block verification's, whose
    stop needs its row's masses anyway) writes the kept candidate into the request's last
    slot and leaves the job (``job_trow`` -1), so the mass and pick kernels skip it."""
    jobs, req, act, trow1, trow, drow, m, logs2, dm, dlogs2, scale, rho, active, resid, use_draft, excl = job_rows(
        job_trow, job_req, job_rho, n_jobs, temperature, drafts, t_m, t_logs, d_m, d_logs, d_bad, HAS_DRAFT, BLOCK_R, 0
    )
    need = act & (tl.load(job_rho + jobs, mask=act, other=-1.0) >= 0)
    need = need & (tl.load(methods + req, mask=need, other=0).to(tl.int32) != METHOD_BLOCK)
    if tl.max(need.to(tl.int32), axis=0) > 0:
        seed = tl.load(seeds + req, mask=need, other=0)
        pos = tl.load(positions + trow1, mask=need, other=0)
        token = residual_candidates(
            t_logits, t_stride, V, d_logits, d_stride, Vd, g_sum, g_tile, tile_width, trow, drow, m, logs2, dm, dlogs2,
            scale, rho, use_draft, excl, need[:, None], seed[:, None], pos[:, None], HAS_DRAFT, N, GROUP, NTP, GPT,
        )  # fmt: skip
        kept = need & (token >= 0)
        tl.store(out + jobs * (K + 1) + tl.load(emitted + jobs, mask=kept, other=1) - 1, token, mask=kept)
        tl.store(job_trow + jobs, -1, mask=kept)


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
    inv_t = inv_temperature(temp)
    d_inv_t = inv_t  # the draft logits' 1/T
    if FAULT == DRAFT_BEFORE_TEMPERATURE:
        d_inv_t = tl.full([BLOCK_R], 1.0, tl.float32)
    seed = tl.load(seeds + r, mask=valid, other=0)
    if FAULT == SEED_COLLISION:
        seed = seed * 0
    method = tl.load(methods + r, mask=valid, other=0).to(tl.int32)
    block = method == METHOD_BLOCK
    if FAULT == BLOCK_TOKEN_WISE:
        block = valid & False
    chain = valid & ~block
    live = chain  # chain lanes still verifying
    n = tl.zeros([BLOCK_R], tl.int64)  # drafts accepted
    rejected = valid & False
    strict_token = tl.zeros([BLOCK_R], tl.int64)
    blive = valid & block
    rho = tl.full([BLOCK_R], 1.0, tl.float32)
    if FAULT == SYNTHETIC_RATES_AS_CONDITIONAL:
        rate_product = tl.full([BLOCK_R], 1.0, tl.float64)
    width = K + 1
    for k in range(0, K):
        x = tl.load(drafts + start + k, mask=valid & (k < cnt), other=-1)  # -1: placeholder or none
        if FAULT == PLACEHOLDER_AS_INDEX:
            x = tl.where((x < 0) & (k < cnt), x + V, x)
        act = live & (x >= 0)
        if FAULT == ACCEPT_PLACEHOLDER:
            act = live & (k < cnt)
        bact = blive & (x >= 0)
        row = row0 + k
        both = act | bact
        vrow = row  # the target row that verifies draft k
        if FAULT == DRAFT_OFF_BY_ONE:
            vrow = tl.where(act, row + 1, row)
        drow = start + k
        if FAULT == WRONG_DRAFT_STEP:
            drow = tl.where(act, start, drow)
        lt = _logprob(t_logits, t_stride, V, t_m, t_logs, t_arg, t_bad, vrow, x, inv_t, greedy, both)
        lq = tl.zeros([BLOCK_R], tl.float32)
        if HAS_DRAFT:
            lq = _logprob(d_logits, d_stride, Vd, d_m, d_logs, d_arg, d_bad, drow, x, d_inv_t, greedy, both)
        pos = tl.load(positions + row, mask=both, other=0)
        u = uniform(seed, pos, STREAM_ACCEPT)
        # standard: min(1, t/q), t/0 = inf for t > 0, 0/0 = 0; no draft row: q(x) = 1
        ok = u < tl.where(lt == float("-inf"), 0.0, tl.exp(tl.minimum(lt - lq, 0.0))).to(tl.float64)
        if FAULT == INVERTED_RATIO:
            if HAS_DRAFT:
                ok = u < tl.where(lq == float("-inf"), 0.0, tl.exp(tl.minimum(lq - lt, 0.0))).to(tl.float64)
        if FAULT == ACCEPT_AT_ZERO_UNIFORM:
            coarse = (u * 256.0).to(tl.int32).to(tl.float64) / 256.0
            ok = coarse <= tl.where(lt == float("-inf"), 0.0, tl.exp(tl.minimum(lt - lq, 0.0))).to(tl.float64)
        if HAS_STRICT:
            point, pt = _row_point(t_arg, t_bad, vrow, greedy, act)
            is_strict = method == METHOD_STRICT
            y = tl.where(point, pt, tl.load(strict_y + vrow, mask=act & is_strict & ~point, other=-1))
            ok = tl.where(is_strict, y == x, ok)
            strict_token = tl.where(act & is_strict, y, strict_token)
        if HAS_SYNTH:
            rate = tl.load(rates + r * K + k, mask=act & (method == METHOD_SYNTHETIC), other=0.0)
            if FAULT == SYNTHETIC_RATES_AS_CONDITIONAL:
                rate_product = rate_product * rate
                rate = rate_product
            ok = tl.where(method == METHOD_SYNTHETIC, u < rate, ok)
        if FAULT == ACCEPT_PLACEHOLDER:
            ok = ok | (x < 0)
        tl.store(tokens + r * width + k, x, mask=act & ok)
        n = tl.where(act & ok, k + 1, n)
        rejected = rejected | (act & ~ok)
        live = act & ok
        if FAULT == CONTINUE_AFTER_REJECT:  # the lane goes on; the rejected slot gets the token known here
            _, fill = _row_point(t_arg, t_bad, vrow, greedy, act & ~ok)  # the argmax: a point row's replacement
            if HAS_STRICT:
                fill = tl.where(method == METHOD_STRICT, strict_token, fill)
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
    if FAULT == BONUS_WRONG_ROW:
        final = tl.where(rejected, final, row0 + tl.maximum(n - 1, 0))
    if FAULT == GREEDY_BONUS_SAMPLED:
        greedy = greedy & rejected  # a greedy bonus row is then drawn like a T = 1 row
    prow = final  # the target row of the last token
    resid_rho = 1.0
    if FAULT == RESIDUAL_WRONG_POSITION:
        prow = tl.where(rejected, final + 1, final)  # inside the request: a rejection leaves its bonus row
        resid_rho = SHIFT_MARK
    point, pt = _row_point(t_arg, t_bad, prow, greedy, chain)
    known = point
    token = pt
    if HAS_STRICT:
        strict_rejection = rejected & (method == METHOD_STRICT)
        known = known | strict_rejection
        token = tl.where(strict_rejection, strict_token, pt)
    tl.store(tokens + r * width + n, token, mask=chain & known)
    if FAULT == BONUS_AFTER_REJECT:
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
    blk = valid & (method == METHOD_BLOCK)
    start = tl.load(cu + r, mask=blk, other=0)
    cnt = tl.load(cu + r + 1, mask=blk, other=0) - start
    row0 = start + r
    temp = tl.load(temperature + r, mask=blk, other=1.0)
    greedy = temp == 0
    inv_t = inv_temperature(temp)
    if FAULT == DRAFT_BEFORE_TEMPERATURE:
        inv_t = tl.full([BLOCK_R], 1.0, tl.float32)  # only the draft's probabilities use it here
    seed = tl.load(seeds + r, mask=blk, other=0)
    if FAULT == SEED_COLLISION:
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
        eta = uniform(seed, tl.load(positions + row - 1, mask=live, other=0), STREAM_BLOCK)
        stop = tl.where(live & (eta <= h), i, stop)
    for j in range(0, K):
        x = tl.load(drafts + start + j, mask=blk & (j < stop), other=-1)
        tl.store(tokens + r * width + j, x, mask=blk & (j < stop))
    final = row0 + stop
    point, pt = _row_point(t_arg, t_bad, final, greedy, blk)
    rho_stop = tl.load(rho_buf + r * width + stop, mask=blk, other=1.0)
    tl.store(tokens + r * width + stop, pt, mask=blk & point)
    if FAULT == BONUS_AFTER_REJECT:
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
def _mass_chunk(lanes: int, n_tiles: int, cuda: bool) -> int:
    """Tile masses ``_tile_total`` reads per step: on CUDA a function of the lanes per program
    alone (no compile per vocabulary; at most 1024 fp64 per program, all 128 tiles of
    V = 262,144 at one lane), in the interpreter just the tiles there are."""
    if cuda:
        return min(128, max(1, 1024 // lanes))
    return min(next_power_of_2(n_tiles), max(1, (1 << 16) // lanes))


def verify_staged(
    target_logits, draft_logits, draft_tokens, cu_num_drafts, temperature, seeds, positions, methods,
    synthetic_rates, max_drafts: int, *, has_strict: bool = True, has_block: bool = True, has_synthetic: bool = True,
    block_v: int | None = None, splits: int | None = None, fault: int = 0, tunables: Tunables = DEFAULT_TUNABLES,
):  # fmt: skip
    """``backend.verify`` on the staged path (its contract, the same outputs as the fused path):
    device-side verification of one batch of torch tensors (``VerifyBatch`` layout).

    The ``has_*`` flags only skip work (a method absent from the batch); leaving them True
    is always correct. ``fault``: a planted bug's code (``harness.backends.triton.faults``), 0 none:
    planted faults run on this path only. ``tunables``: the residual candidates' settings.
    Returns ``(tokens [B, K+1] int64, num_emitted [B] int64)``; slots past ``num_emitted``
    hold -1.
    """
    n_target, vocab = target_logits.shape
    dev = target_logits.device
    cuda = dev.type == "cuda"
    b = cu_num_drafts.numel() - 1
    k = int(max_drafts)
    tokens = torch.full((b, k + 1), -1, dtype=torch.int64, device=dev)
    emitted = torch.zeros(b, dtype=torch.int64, device=dev)
    if b == 0:
        return tokens, emitted
    if fault == IGNORE_DRAFT_PROBS:
        draft_logits = None
    if fault == BLOCK_TOKEN_WISE.value:
        has_block = False
    has_draft = draft_logits is not None
    has_synthetic = has_synthetic and synthetic_rates is not None
    temperature = temperature.to(torch.float64)
    t_req = torch.empty(n_target, dtype=torch.int64, device=dev)
    d_req = torch.empty(draft_tokens.numel(), dtype=torch.int64, device=dev)
    req_block = 64 if cuda else 4096
    grid_req = (cdiv(b, req_block),)
    launch(_owners_kernel, grid_req, cu_num_drafts, t_req, d_req, k, b, req_block)
    if fault == TEMPERATURE_TWICE:  # the caller's division; the kernels divide once more
        target_logits = (target_logits / torch.where(temperature > 0, temperature, 1.0)[t_req, None]).to(target_logits.dtype)
    # Planted faults live in the draw's mass and pick kernels: with one, every residual is drawn there.
    candidates = candidates_for(vocab, cuda, tunables) if fault == 0 else 0
    draw_v = tile_plan(vocab, cuda, block_v, splits)[0]
    group, ntp, gpt = candidate_plan(vocab, draw_v, draw_v, tunables)
    t_stats = Stats(target_logits, t_req, temperature, cuda, (block_v, splits), fault, group if candidates else 0)
    d_temperature = temperature
    if fault == DRAFT_BEFORE_TEMPERATURE.value:  # draft statistics of the raw logits (T = 1)
        d_temperature = torch.where(temperature > 0, 1.0, temperature)
    d_stats = Stats(draft_logits, d_req, d_temperature, cuda, (block_v, splits), fault) if has_draft else t_stats
    ctx = Context(
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
        has_draft, has_strict, has_synthetic, has_block, req_block, planted(_chain_kernel, fault),
    )  # fmt: skip
    if has_block:
        mass, _ = ctx.masses(mass_trow, t_req, mass_rho)
        launch(
            _block_kernel, grid_req,
            d_logits, d_logits.stride(0), d_logits.shape[1], t_stats.arg, t_stats.bad, d_stats.m, d_stats.logs, d_stats.arg, d_stats.bad,
            cu_num_drafts, temperature, seeds, positions, methods, draft_tokens, k, b,
            mass, ctx.n_tiles, rho_buf, tokens, emitted, fin_trow, fin_rho, has_draft, _mass_chunk(req_block, ctx.n_tiles, cuda),
            req_block, planted(_block_kernel, fault),
        )  # fmt: skip
    requests = torch.arange(b, device=dev)
    if candidates:
        lanes = min(ctx.block_r, next_power_of_2(b), max(1, (1 << 16) // candidate_width(candidates, ntp, gpt, group)))
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
    statistics and inverse-CDF kernels as ``verify_staged``; ``uniforms`` [n] float64 in (0, 1)
    replace the Philox draw (exact tests of the draw's resolution)."""
    n = logits.shape[0]
    dev = logits.device
    cuda = dev.type == "cuda"
    rows = torch.arange(n, device=dev)
    temperature = temperature.to(torch.float64)
    stats_ = Stats(logits, rows, temperature, cuda, (block_v, splits))
    seeds = rows if seeds is None else seeds
    positions = rows if positions is None else positions
    ctx = Context(logits, None, stats_, stats_, temperature, seeds, positions, rows, (block_v, splits), cuda)
    out = torch.empty(n, dtype=torch.int64, device=dev)
    ctx.draw(rows, rows, torch.full((n,), -1.0, device=dev), int(Stream.RESIDUAL), out, u=uniforms)
    return out

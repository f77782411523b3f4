"""The harness's own per-scenario device work in one Triton launch each, for CUDA.

``DeviceTrials.prepare`` and ``DeviceTally.finish`` written with torch ops cost 58-213 and
74-100 operations per scenario: on a GPU their launch overhead, not their work, set the
harness's share of a run (benchmarks/RESULTS.md#sampling-loop-overhead). These kernels compute the same integers, bit for bit
(``suites/test_device_path.py`` compares them with the host path, under the interpreter in
the CPU suite and on a GPU in its ``cuda-kernels`` cases):

* ``build_trials``: every request's seed and start position, every trial's drafts (fixed,
  or drawn by inverse CDF from the template's float64 draft CDF, as ``torch.searchsorted``),
  and the batch fields laid out for all trials (positions per row, draft tokens per request),
  so that a chunk is a slice;
* ``tally``: each (trial, template)'s validity and cells, counted with relaxed atomic adds
  (integer counts: the order of the adds does not matter; the kernel's end orders them
  before any reader), into copies of the cells when they are few, the invalid trials per
  template and the first of them;
* ``repeat_rows``: a chunk's logits, the templates' rows repeated trial after trial, in one
  vectorized pass (``Tensor.repeat`` copies from a stride-0 view element by element: 15 of
  the 32 ms the harness added to the `gpu` catalog's device time on an H100).
"""

import torch
import triton
import triton.language as tl

from harness.backends.triton.launch import cdiv
from reference.rng import Stream

BLOCK = 256
_GOLDEN = tl.constexpr(0x9E3779B97F4A7C15)
_M1 = tl.constexpr(0xBF58476D1CE4E5B9)
_M2 = tl.constexpr(0x94D049BB133111EB)
_DRAFT = tl.constexpr(int(Stream.DRAFT))
_DRAFT_STEP = tl.constexpr((0x9E3779B97F4A7C15 * int(Stream.DRAFT)) & ((1 << 64) - 1))


@triton.jit
def _mix(x):
    """SplitMix64's finalizer on uint64 (``reference.rng._mix``)."""
    x = x ^ (x >> 30)
    x = x * _M1
    x = x ^ (x >> 27)
    x = x * _M2
    return x ^ (x >> 31)


@triton.jit
def _draft_uniform(seed, position):
    """``reference.rng.uniforms(seed, position, Stream.DRAFT)`` on uint64 seeds."""
    h = _mix(seed + _GOLDEN)
    h = _mix(h ^ (position.to(tl.uint64) * _GOLDEN + _DRAFT))
    h = _mix(h + _DRAFT_STEP)
    return ((h >> 12).to(tl.float64) + 0.5) * 2.0**-52


@triton.jit(do_not_specialize=["state0", "n", "T", "K", "R", "D", "width", "steps", "position_range"])
def _trials_kernel(
    state0, n, T, K, R, D, width, steps, position_range,
    counts, row_offsets, draft_offsets, fixed, cdf, cdf_rows, cdf_last,
    seeds_out, drafts_out, positions_out, draft_tokens_out,
    RANDOM_POSITIONS: tl.constexpr, SAMPLED: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    req = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # request t * T + i
    mask = req < n
    i, t = req % T, req // T
    # state0 arrives as int32 when its value fits (Triton types scalars by value): widen first.
    state = _mix(state0.to(tl.int64).to(tl.uint64, bitcast=True) ^ (req.to(tl.uint64) + _GOLDEN))  # hash64(seed, req), unshifted
    tl.store(seeds_out + req, (_mix(state ^ (1 + _GOLDEN)) >> 1).to(tl.int64), mask=mask)
    if RANDOM_POSITIONS:
        base = (_mix(state ^ (2 + _GOLDEN)) >> 1).to(tl.int64) % position_range
    else:
        base = req * 0
    d = tl.load(counts + i, mask=mask, other=0)
    row = t * R + tl.load(row_offsets + i, mask=mask, other=0)
    for s in range(0, K + 1):
        tl.store(positions_out + row + s, base + s, mask=mask & (s <= d))
    cell = t * D + tl.load(draft_offsets + i, mask=mask, other=0)
    if SAMPLED:
        first_row = tl.load(cdf_rows + i, mask=mask, other=-1)  # the template's first CDF row, -1: fixed drafts
    for j in range(0, K):
        token = tl.load(fixed + i * K + j, mask=mask, other=-1)
        if SAMPLED:
            drawn = mask & (first_row >= 0) & (j < d)
            at = (first_row + j) * width
            value = _draft_uniform(state >> 1, req * 0 + j) * tl.load(cdf + at + width - 1, mask=drawn, other=0.0)
            lo = req * 0
            hi = lo + width
            for _ in range(0, steps):  # torch.searchsorted(right=True): the first entry above value
                active = drawn & (lo < hi)
                mid = (lo + hi) // 2
                above = tl.load(cdf + at + mid, mask=active, other=0.0) > value
                hi = tl.where(active & above, mid, hi)
                lo = tl.where(active & ~above, mid + 1, lo)
            last = tl.load(cdf_last + first_row + j, mask=drawn, other=0)
            token = tl.where(drawn, tl.minimum(lo, last), token)
        tl.store(drafts_out + req * K + j, token, mask=mask)
        tl.store(draft_tokens_out + cell + j, token, mask=mask & (j < d))


def build_trials(state0: int, total: int, fields: dict, random_positions: bool) -> dict:
    """Seeds, drafts ``[total, T, K]``, positions per row and draft tokens per request for
    trials [0, total). ``state0``: ``hash64``'s state after the scenario's seed (int64 bits);
    ``fields``: the templates' sizes and device tensors (``DeviceTrials.prepare``)."""
    f = fields
    t_count, k, dev = f["T"], f["K"], f["counts"].device
    n = total * t_count
    sizes = {"seeds": n, "drafts": n * k, "positions": total * f["R"], "draft_tokens": total * f["D"]}
    buffers = {name: _buffer(size, torch.int64, dev) for name, size in sizes.items()}
    if n:
        cdf = f["cdf"]
        _trials_kernel[(cdiv(n, BLOCK),)](
            state0, n, t_count, k, f["R"], f["D"], cdf.shape[1], cdf.shape[1].bit_length(), f["position_range"],
            f["counts"], f["row_offsets"], f["draft_offsets"], f["fixed"], cdf, f["cdf_rows"], f["cdf_last"],
            buffers["seeds"], buffers["drafts"], buffers["positions"], buffers["draft_tokens"],
            RANDOM_POSITIONS=random_positions, SAMPLED=f["sampled"], BLOCK=BLOCK,
        )  # fmt: skip
    out = {name: buffers[name][:size] for name, size in sizes.items()}
    out["drafts"] = out["drafts"].view(total, t_count, k)
    return out


def _buffer(size: int, dtype, device) -> torch.Tensor:
    """At least one element: a kernel's pointer argument needs memory behind it."""
    return torch.empty(max(size, 1), dtype=dtype, device=device)


@triton.jit(do_not_specialize=["n", "T", "K", "V", "cells", "n_copies"])
def _tally_kernel(tokens, emitted, drafts, n, T, K, V, cells, offsets, counts, copies, n_copies, BLOCK: tl.constexpr):
    # Lanes in template-major order (lane i * trials + t): a block's lanes share a template,
    # so with fixed drafts they share every accepted-step cell (see _count_shared).
    pid = tl.program_id(0)
    lane = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lane < n
    trials = n // T
    i, t = lane // trials, lane % trials
    pair = t * T + i  # trial t, template i in the outputs' layout
    num = tl.load(emitted + pair, mask=mask, other=0)
    d = tl.load(offsets + i, mask=mask, other=0)  # offsets [3, T]: effective drafts, outcome and step cells
    ok = mask & (num >= 1) & (num <= d + 1)
    for s in range(0, K + 1):  # in the vocabulary up to num; the drafts, then no draft (-2), before num - 1
        token = tl.load(tokens + pair * (K + 1) + s, mask=mask, other=0)
        expected = tl.load(drafts + pair * K + s, mask=mask & (s < K), other=-2)
        ok = ok & ((s >= num) | ((token >= 0) & (token < V))) & ((s >= num - 1) | (token == expected))
    last = tl.where(ok, num - 1, 0)
    y = tl.load(tokens + pair * (K + 1) + last, mask=mask, other=0)
    outcome = tl.load(offsets + T + i, mask=mask, other=0)
    step = tl.load(offsets + 2 * T + i, mask=mask, other=0)
    # Few cells (a small vocabulary): every program adds into one of n_copies copies of the
    # cells, summed afterwards, so that fewer programs queue on each address.
    own = copies + (pid % n_copies).to(tl.int64) * cells
    ones = tl.full([BLOCK], 1, tl.int64)
    tl.atomic_add(own + outcome + last * V + y, ones, mask=ok, sem="relaxed")
    tl.atomic_add(own + step + (last * 2 + 1) * V + y, ones, mask=ok, sem="relaxed")
    for s in range(0, K):  # (step s, accepted, draft s) for every step before the last
        draft = tl.maximum(tl.load(drafts + pair * K + s, mask=mask, other=0), 0)
        _count_shared(own, step + s * 2 * V + draft, ok & (s < last), BLOCK)
    bad = mask & ~ok
    tl.atomic_add(counts + cells + i, ones, mask=bad, sem="relaxed")
    tl.atomic_min(counts + cells + T + i, t, mask=bad, sem="relaxed")


@triton.jit
def _count_shared(counts, cell, mask, BLOCK: tl.constexpr):
    """``counts[cell] += 1`` for every lane in ``mask``, the lanes on the block's lowest cell
    in one atomic: with fixed drafts a whole block counts each accepted step in one cell, and
    atomics on one address queue up."""
    lowest = tl.min(tl.where(mask, cell, 1 << 62))
    same = mask & (cell == lowest)
    tl.atomic_add(counts + lowest, tl.sum(same.to(tl.int64)), mask=tl.max(same.to(tl.int32)) > 0, sem="relaxed")
    tl.atomic_add(counts + cell, tl.full([BLOCK], 1, tl.int64), mask=mask & ~same, sem="relaxed")


# Copies of the cells when they are few (the small vocabularies' 300-1200 cells): up to 64,
# one per program. On an H100 they cut the tally of 600,000 trials at V = 32 from 0.45 ms
# to 0.11 ms; at 27,000 cells the zeroing and summing cost more than they save
# (benchmarks/bench_tally.py, benchmarks/RESULTS.md#tally-kernel).
MAX_COPIES = 64
FEW_CELLS = 4096


def tally(tokens, emitted, drafts, vocab: int, offsets, cells: int, copies: int | None = None) -> torch.Tensor:
    """``[cells + 2T]`` int64 on the device: the counts of every template's cells, then the
    invalid trials per template, then the first invalid trial per template (``n`` if none).
    ``tokens [n, T, K+1]``, ``emitted [n, T]``, ``drafts [n, T, K]``; ``offsets [3, T]``:
    each template's effective drafts, first outcome cell and first step cell. ``copies``:
    how many copies of the cells the programs add into (default: by ``cells``)."""
    tokens, emitted, drafts = tokens.contiguous(), emitted.contiguous(), drafts.contiguous()  # flat indexing below
    n, t_count, width = tokens.shape
    out = torch.zeros(cells + 2 * t_count, dtype=torch.int64, device=tokens.device)
    out[cells + t_count :] = n
    lanes = n * t_count
    if lanes:
        programs = cdiv(lanes, BLOCK)
        if copies is None:
            copies = min(MAX_COPIES, programs) if cells <= FEW_CELLS else 1
        work = out if copies == 1 else torch.zeros(copies * cells, dtype=torch.int64, device=tokens.device)
        drafts = drafts if drafts.numel() else _buffer(0, torch.int64, tokens.device)  # no drafts at all (K = 0)
        _tally_kernel[(programs,)](
            tokens, emitted, drafts, lanes, t_count, width - 1, vocab, cells, offsets, out, work, copies, BLOCK=BLOCK,
        )  # fmt: skip
        if copies > 1:
            out[:cells] = work.view(copies, cells).sum(dim=0)
    return out


@triton.jit(do_not_specialize=["period", "count"])
def _repeat_kernel(src, out, period, count, BLOCK: tl.constexpr, COPIES: tl.constexpr):
    # Program (i, j): the block's elements [j * BLOCK, (j + 1) * BLOCK), loaded once, stored
    # into copies [i * COPIES, (i + 1) * COPIES).
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < period
    x = tl.load(src + offs, mask=mask)
    first = tl.program_id(0).to(tl.int64) * COPIES
    for c in range(COPIES):
        copy = first + c
        tl.store(out + copy * period + offs, x, mask=mask & (copy < count))


def repeat_rows(block: torch.Tensor, count: int) -> torch.Tensor:
    """``block.repeat(count, 1)`` (bit for bit, NaN payloads included) in one launch."""
    rows, width = block.shape
    period = rows * width
    # Three tile widths, so few compiles: a small vocabulary's few rows fill most lanes.
    tile = 256 if period <= 256 else 1024 if period <= 1024 else 4096
    copies = 16384 // tile  # 64 KB of fp32 stored per program
    grid = (cdiv(count, copies), cdiv(period, tile))
    if grid[0] >= 2**31 or grid[1] >= 2**16:  # past CUDA's grid limits: a block of over 268 million logits
        return block.repeat(count, 1)
    out = torch.empty(count * rows, width, dtype=block.dtype, device=block.device)
    if count and period:
        _repeat_kernel[grid](block.contiguous(), out, period, count, BLOCK=tile, COPIES=copies)
    return out

"""The Triton sampler's own drafter (``VerifyBatch.draft_sampling``): every draft drawn on the
device before either verification path runs, then verified as given drafts.

``_draft_kernel`` draws draft ``j`` of request ``r`` from its draft row ``cu[r] + j``, ``BLOCK_R``
rows per program over ``BLOCK_V``-wide tiles:

* "greedy", or T = 0: the row's argmax, ties to the lowest id (a row with no finite logit: id 0,
  the verifier's one-hot of a degenerate draft row);
* "probabilistic", T > 0: inverse CDF over ``w = 2**((a - max) * log2(e) / T)`` with fp32 ``1/T``,
  the very weights the verifier's ``q`` normalizes (``draws._tile_weights``), summed in fp64
  (three reads of the row: max, total, scan), so the drafts follow the ``q`` they are verified
  against up to fp32 rounding of each weight.

Noise: one Philox uniform per draft, ``uniform(seed, positions[row verifying the draft], DRAFT)``
(``reference.rng.Stream.DRAFT`` = 5, the reference drafter's tag). The verifier's streams are
ACCEPT 1, RESIDUAL 2, TARGET 3, BLOCK 4 and CANDIDATE 6, so the drafts are independent of every
uniform the verification draws at the same (seed, position); a draft depends on its own row,
seed and position only, never on its batch mates.

``draft`` wires a drawn batch for ``backend.verify``: the drafts become ``draft_tokens`` and greedy
drafts are verified as point masses (no draft logits), as engines pass them. The planted faults
of the drafter live here: two in the kernel (``FAULT``), two on the host (``draft``).
"""

import torch
import triton
import triton.language as tl

from harness.backends.triton import processing
from harness.backends.triton.common import (
    DRAFTER_OTHER_PRECISION,
    DRAFTER_SHARES_NOISE,
    LOG2E,
    NO_ID,
    STREAM_DRAFT,
    STREAM_RESIDUAL,
    inv_temperature,
    planted,
    tile_plan,
    uniform,
)
from harness.backends.triton.faults import TRITON_FAULTS
from harness.backends.triton.launch import cdiv, launch

SAMPLINGS = ("probabilistic", "greedy")
# Host-side drafter faults (``faults.TRITON_FAULTS``): Python branches of ``draft``.
DRAFTER_AFTER_PROCESSOR = TRITON_FAULTS["drafter-after-processor"].code
GREEDY_DRAFTS_VERIFIED_WITH_PROBS = TRITON_FAULTS["greedy-drafts-verified-with-probs"].code
PROCESSOR_TOP_K = 2  # drafter-after-processor: the processor the faulty drafter samples after


@triton.jit
def _bf16(x):
    """fp32 ``x`` rounded to bfloat16 (nearest even), back in fp32: done on the bits because the
    interpreter's fp32 -> bf16 cast truncates where CUDA's rounds."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16) << 16
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _weights(a, m, inv_t, FAULT: tl.constexpr):
    """fp64 draft weights of a [rows, ids] tile: the verifier's ``q`` before its normalization."""
    w = tl.exp2((a - m[:, None]) * (inv_t * LOG2E)[:, None])
    if FAULT == DRAFTER_OTHER_PRECISION:  # logits / T rounded to bf16 first, q stays the fp32 one
        w = tl.exp2((_bf16(a * inv_t[:, None]) - _bf16(m * inv_t)[:, None]) * LOG2E)
    return w.to(tl.float64)


@triton.jit
def _inverse_cdf(base, width, valid, m, inv_t, u, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, FAULT: tl.constexpr):
    """The first id whose fp64 running weight passes ``u * total`` (the row's last positive id
    where rounding runs past the total), one row per lane."""
    total = tl.zeros([BLOCK_R], tl.float64)
    for start in range(0, width, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)[None, :]
        a = tl.load(base + cols, mask=valid[:, None] & (cols < width), other=float("-inf")).to(tl.float32)
        total += tl.sum(_weights(a, m, inv_t, FAULT), axis=1)
    threshold = u * total
    below = tl.zeros([BLOCK_R], tl.float64)
    token = tl.full([BLOCK_R], NO_ID, tl.int32)
    last = tl.full([BLOCK_R], -1, tl.int32)
    for start in range(0, width, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)[None, :]
        a = tl.load(base + cols, mask=valid[:, None] & (cols < width), other=float("-inf")).to(tl.float32)
        w = _weights(a, m, inv_t, FAULT)
        passed = (below[:, None] + tl.cumsum(w, axis=1) > threshold[:, None]) & (w > 0)
        token = tl.minimum(token, tl.min(tl.where(passed, cols, NO_ID), axis=1))  # the first tile's hit wins
        last = tl.maximum(last, tl.max(tl.where(w > 0, cols, -1), axis=1))
        below += tl.sum(w, axis=1)
    return tl.where(token == NO_ID, last, token)


@triton.jit(do_not_specialize=["n_rows"])
def _draft_kernel(
    logits, stride, width, n_rows, row_req, temperature, seeds, positions, u_given, out,
    GREEDY: tl.constexpr, GIVEN_U: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """One draft per draft row (module docstring). ``GIVEN_U``: the caller's uniforms
    (``u_given[row]``) instead of Philox's (exact tests of the draw)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    valid = rows < n_rows
    req = tl.load(row_req + rows, mask=valid, other=0)
    temp = tl.load(temperature + req, mask=valid, other=1.0)
    base = logits + rows.to(tl.int64)[:, None] * stride
    # The row's max and first argmax: the point draft, and the weights' reference.
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    arg = tl.full([BLOCK_R], NO_ID, tl.int32)
    for start in range(0, width, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)[None, :]
        a = tl.load(base + cols, mask=valid[:, None] & (cols < width), other=float("-inf")).to(tl.float32)
        tile_m = tl.max(a, axis=1)
        tile_arg = tl.min(tl.where(a == tile_m[:, None], cols, NO_ID), axis=1)
        better = tile_m > m  # strictly: an equal max in a later tile is a higher id
        arg = tl.where(better, tile_arg, arg)
        m = tl.where(better, tile_m, m)
    token = tl.where(arg == NO_ID, 0, arg)  # no finite logit: id 0
    if not GREEDY:
        sampled = valid & (temp > 0) & (m > float("-inf"))
        if tl.max(sampled.to(tl.int32), axis=0) > 0:
            if GIVEN_U:
                u = tl.load(u_given + rows, mask=sampled, other=0.5)
            else:
                seed = tl.load(seeds + req, mask=sampled, other=0)
                pos = tl.load(positions + rows + req, mask=sampled, other=0)  # draft row cu[r] + j: target row + r
                if FAULT == DRAFTER_SHARES_NOISE:  # the residual draw's uniform at the same key
                    u = uniform(seed, pos, STREAM_RESIDUAL)
                else:
                    u = uniform(seed, pos, STREAM_DRAFT)
            drawn = _inverse_cdf(base, width, sampled, m, inv_temperature(temp), u, BLOCK_R, BLOCK_V, FAULT)
            token = tl.where(sampled, drawn, token)
    tl.store(out + rows, token.to(tl.int64), mask=valid)


def draw_drafts(
    draft_logits, cu_num_drafts, temperature, seeds, positions, sampling: str, *, block_v: int | None = None,
    fault: int = 0, uniforms=None,
):  # fmt: skip
    """[D] int64 drafts (``VerifyBatch`` layout, torch tensors on one device): draft row ``i``
    of request ``r`` from ``softmax(row / T_r)`` ("probabilistic"; T = 0: argmax) or its argmax
    ("greedy"). ``uniforms`` [D] float64 in (0, 1) replace the Philox draw; ``block_v``
    overrides the tile width (tests); ``fault``: a planted fault's code."""
    if sampling not in SAMPLINGS:
        raise ValueError(f"draft_sampling: expected one of {SAMPLINGS}, got {sampling!r}")
    n, width = draft_logits.shape
    dev = draft_logits.device
    out = torch.empty(n, dtype=torch.int64, device=dev)
    if n == 0:
        return out
    counts = cu_num_drafts[1:] - cu_num_drafts[:-1]
    row_req = torch.repeat_interleave(torch.arange(counts.numel(), device=dev), counts, output_size=n)
    tiles, lanes, _, _ = tile_plan(width, dev.type == "cuda", block_v)
    u = out if uniforms is None else uniforms.to(device=dev, dtype=torch.float64)
    launch(
        _draft_kernel, (cdiv(n, lanes),),
        draft_logits, draft_logits.stride(0), width, n, row_req, temperature.to(torch.float64), seeds, positions, u, out,
        sampling == "greedy", uniforms is not None, lanes, tiles, planted(_draft_kernel, fault),
        num_warps=4,
    )  # fmt: skip
    return out


def draft(t: dict, sampling: str, *, block_v: int | None = None, fault: int = 0) -> torch.Tensor:
    """Draw a batch's drafts (``t``: ``VerifyBatch.to_torch``'s fields, logits cast) and wire
    them for ``backend.verify`` in place: ``draft_tokens`` the drafts, and for greedy drafts no
    draft logits (point masses). Returns the drafts."""
    rows = t["draft_logits"]
    if fault == DRAFTER_AFTER_PROCESSOR:  # the drafter samples after a top-2 processor; q stays the raw rows'
        rows = _top_k_rows(rows, t["cu_num_drafts"], t["temperature"], PROCESSOR_TOP_K)
    drafts = draw_drafts(rows, t["cu_num_drafts"], t["temperature"], t["seeds"], t["positions"], sampling, block_v=block_v, fault=fault)
    t["draft_tokens"] = drafts
    if sampling == "greedy" and fault != GREEDY_DRAFTS_VERIFIED_WITH_PROBS:
        t["draft_logits"] = None
    return drafts


def _top_k_rows(rows, cu_num_drafts, temperature, k: int):
    """drafter-after-processor: the draft rows with all but their ``k`` largest logits -inf
    (``processing.removed``, ties to the lowest ids)."""
    n, width = rows.shape
    dev = rows.device
    counts = cu_num_drafts[1:] - cu_num_drafts[:-1]
    t = torch.repeat_interleave(temperature.to(torch.float64), counts, output_size=n)
    t = torch.where(t > 0, t, 1.0)  # a T = 0 row's argmax is among its top k at any T
    out = rows.clone(memory_format=torch.contiguous_format)
    step = max(1, processing.CHUNK_ELEMENTS[dev.type if dev.type in processing.CHUNK_ELEMENTS else "cpu"] // width)
    for at in range(0, n, step):
        part = slice(at, min(n, at + step))
        size = part.stop - part.start
        gone = processing.removed(
            rows[part], t[part], torch.full((size,), k, dtype=torch.int64, device=dev),
            torch.ones(size, dtype=torch.float64, device=dev), torch.zeros(size, dtype=torch.float64, device=dev),
        )  # fmt: skip
        out[part] = torch.where(gone, -torch.inf, rows[part])
    return out

"""A streaming floor under the fused path: how fast do a few minimal Triton kernels
read the bytes the sampler must read, doing the least work with them, timed as the sampler is?

At B = 256, K = 1, V = 131072 the fused path reads 201 MB before its chain (target row 0 fp32,
draft row bf16, for each request) and then the bonus rows of the requests that accept. On an
H200 its statistics kernel alone took 61.2 us, the whole call 101, and 80% of copy needs 98.3
(with the kernels of that date; ``benchmarks/RESULTS.md#streaming-floor``). This script times kernels that read the same
rows and keep only what a statistics or mass kernel cannot do without, in the same graph and
flush (the rows of requests with K drafts each):

* ``max``: one program per (row, 4096-id split), the fused statistics kernel's grid and
  request-major order, storing each split's max: about the least a first-phase kernel does.
* ``softmax``: the same storing the split's max and sum of exp2((a - max) * log2 e);
  ``softmax-rows-loaded`` / ``-guessed`` find each row from the batch's ``cu`` as the
  sampler does (``_lane_tile``).
* ``tma``: ``softmax`` by persistent programs that load their splits through tensor
  descriptors (TMA on sm_90) in a software pipeline of ``--stages`` (V a multiple of 4096).
* ``torch-amax``: PyTorch's ``amax`` over the same rows (two kernels).
* ``two-phase``: ``softmax``, then one program per 2048-id tile of the accepting requests'
  bonus rows (their max and fp32 sum): the two streams with nothing between them.
* ``sampler``, ``sampler-stats`` (the call cut after its statistics kernel, ``ab_fused``),
  and both with ``_STATS_PROGRAMS`` 4096: the sampler itself, in the same process.

On a GPU machine::

    python benchmarks/stream_floor.py --json OUT/stream_floor.json

The floor kernels check their outputs against PyTorch before timing (``check``), and
``suites/test_benchmark_tools.py`` runs them under the interpreter.
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

SPLIT = 4096  # the fused statistics kernel's split at V >= 131072 (ids; one tile on CUDA)
TILE = 2048  # the fused mass kernel's tile
BOX = 256  # ids per row of a descriptor's box (TMA: at most 256 per dimension)
LOG2E = tl.constexpr(1.4426950408889634)
ACCEPT_SHARE = 0.71  # requests whose bonus row the sampler reads at B = 256, K = 1 (this benchmark's drafts)


@triton.jit
def _tile_load(ptr, row, stride, start, V, WIDTH: tl.constexpr):
    """``WIDTH`` ids of row ``row`` from ``start`` as fp32 (-inf past ``V``)."""
    cols = start + tl.arange(0, WIDTH)
    return tl.load(ptr + row.to(tl.int64) * stride + cols, mask=cols < V, other=float("-inf")).to(tl.float32)


@triton.jit
def _tile_store(a, scale, out_m, out_s, at, SUM: tl.constexpr):
    """Store the max of ``a`` (and, with ``SUM``, the sum of exp2((a - max) scale))."""
    m = tl.max(a, axis=0)
    tl.store(out_m + at, m)
    if SUM:
        tl.store(out_s + at, tl.sum(tl.exp2((a - m) * scale), axis=0))


@triton.jit
def _lane_tile(
    logits, stride, step, cu, temperature, r, K, start, V, out_m, out_s, at,
    WIDTH: tl.constexpr, SUM: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    """One split of the row ``first + step`` of request ``r``, ``first`` = cu[r] (the draft row; the
    target row's ``step`` adds r). ``ROWS`` 0: first = r K taken as known (a uniform batch, no
    load); 1: loaded, the tile's address waits for it (the sampler's statistics kernel); 2: the
    tile loaded at r K at once, then checked against the loaded cu[r] and loaded again if it
    differs (a ragged batch). 1 and 2 also load the request's temperature for the scale."""
    if ROWS == 0:
        a = _tile_load(logits, r * K + step, stride, start, V, WIDTH)
        _tile_store(a, LOG2E, out_m, out_s, at, SUM)
    elif ROWS == 1:
        first = tl.load(cu + r)
        scale = (1.0 / tl.load(temperature + r) * LOG2E).to(tl.float32)
        _tile_store(_tile_load(logits, first + step, stride, start, V, WIDTH), scale, out_m, out_s, at, SUM)
    else:
        guess = r * K
        a = _tile_load(logits, guess + step, stride, start, V, WIDTH)
        first = tl.load(cu + r)
        scale = (1.0 / tl.load(temperature + r) * LOG2E).to(tl.float32)
        if first != guess:
            a = _tile_load(logits, first + step, stride, start, V, WIDTH)
        _tile_store(a, scale, out_m, out_s, at, SUM)


@triton.jit
def _split_floor_kernel(
    t_logits, t_stride, d_logits, d_stride, V, K, cu, temperature, out_m, out_s,
    NSPLIT: tl.constexpr, WIDTH: tl.constexpr, SUM: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    """One (request, step) lane's target splits, then its draft splits, one program each:
    target row cu[r] + r + k, draft row cu[r] + k (``_lane_tile``)."""
    pid = tl.program_id(0)
    lane = pid // (2 * NSPLIT)
    run = pid % (2 * NSPLIT)
    r = lane // K
    k = lane % K
    if run < NSPLIT:  # no name bound in both branches: the pointers' types differ
        _lane_tile(t_logits, t_stride, r + k, cu, temperature, r, K, run * WIDTH, V, out_m, out_s, pid, WIDTH, SUM, ROWS)
    else:
        _lane_tile(d_logits, d_stride, k, cu, temperature, r, K, (run - NSPLIT) * WIDTH, V, out_m, out_s, pid, WIDTH, SUM, ROWS)


@triton.jit
def _bonus_floor_kernel(t_logits, t_stride, rows, V, out_m, out_s, N_TILES: tl.constexpr, WIDTH: tl.constexpr):
    """One tile of one listed bonus row: its max and fp32 sum."""
    a = _tile_load(t_logits, tl.load(rows + tl.program_id(0)), t_stride, tl.program_id(1) * WIDTH, V, WIDTH)
    _tile_store(a, LOG2E, out_m, out_s, tl.program_id(0) * N_TILES + tl.program_id(1), True)


@triton.jit
def _desc_split(desc, y, item, out_m, out_s, BOX_ROWS: tl.constexpr):
    a = desc.load([y, 0]).to(tl.float32)  # [BOX_ROWS, BOX]: one split
    m = tl.max(tl.max(a, axis=1), axis=0)
    tl.store(out_m + item, m)
    tl.store(out_s + item, tl.sum(tl.sum(tl.exp2((a - m) * LOG2E), axis=1), axis=0))


@triton.jit
def _tma_floor_kernel(
    t_desc, d_desc, n_lanes, K, rows_per_t, out_m, out_s,
    NSPLIT: tl.constexpr, BOX_ROWS: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    """``_split_floor_kernel``'s ``SUM`` work by persistent programs: every target split, then
    every draft split, each program taking every ``num_programs``-th, its loads pipelined."""
    n_items = n_lanes * NSPLIT
    for item in tl.range(tl.program_id(0), n_items, tl.num_programs(0), num_stages=STAGES):
        lane = item // NSPLIT
        row = lane // K * (K + 1) + lane % K
        _desc_split(t_desc, row * rows_per_t + item % NSPLIT * BOX_ROWS, item, out_m, out_s, BOX_ROWS)
    for item in tl.range(tl.program_id(0), n_items, tl.num_programs(0), num_stages=STAGES):
        _desc_split(d_desc, item * BOX_ROWS, n_items + item, out_m, out_s, BOX_ROWS)


def _rows(x, b, k, v):
    """The rows the statistics read: target rows 0..K-1 of each request, and the draft rows."""
    target = x["target"].reshape(b, k + 1, v)[:, :k].reshape(b * k, v)
    return target, x["draft"].reshape(b * k, v)


def split_floor(x, b, k, v, with_sum: bool, rows: int = 0):
    """``max`` / ``softmax`` (``rows``: ``_lane_tile``'s ``ROWS``): returns a call and what it
    writes (max, sum per split). ``x["cu"]`` and ``x["temperature"]`` as the sampler gets them,
    ``x["cu"]`` uniform by default."""
    if rows not in (0, 1, 2):
        raise ValueError(f"split_floor: rows must be 0, 1 or 2 (_lane_tile's ROWS), got {rows!r}")
    nsplit = triton.cdiv(v, SPLIT)
    n = b * k * 2 * nsplit
    dev = x["target"].device
    draft = x["draft"].reshape(-1, v)
    out_m, out_s = (torch.empty(n, dtype=torch.float32, device=dev) for _ in range(2))
    cu = x.get("cu", torch.arange(0, b * k + 1, k, device=dev))
    temperature = x.get("temperature", torch.ones(b, device=dev)).double()

    def call():
        _split_floor_kernel[(n,)](
            x["target"], x["target"].stride(0), draft, draft.stride(0), v, k, cu, temperature, out_m, out_s, nsplit, SPLIT,
            with_sum, rows,
            num_warps=4,
        )  # fmt: skip
        return out_m, out_s

    return call


def tma_floor(x, b, k, v, stages: int, programs: int):
    """``tma``; None where V is not a multiple of a split (a box would run into the next row)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    if v % SPLIT:
        return None
    box_rows = SPLIT // BOX
    t_desc = TensorDescriptor.from_tensor(x["target"].reshape(-1, BOX), [box_rows, BOX])
    d_desc = TensorDescriptor.from_tensor(x["draft"].reshape(-1, BOX), [box_rows, BOX])
    nsplit = v // SPLIT
    out_m, out_s = (torch.empty(2 * b * k * nsplit, dtype=torch.float32, device=x["target"].device) for _ in range(2))

    def call():
        _tma_floor_kernel[(programs,)](t_desc, d_desc, b * k, k, v // BOX, out_m, out_s, nsplit, box_rows, stages, num_warps=4)
        return out_m, out_s

    return call


def bonus_rows(b, k, share=ACCEPT_SHARE, seed=0):
    """The bonus rows of ``share`` of the requests, chosen at random (row r (K + 1) + K)."""
    g = torch.Generator().manual_seed(seed)
    accepted = torch.randperm(b, generator=g)[: round(share * b)].sort().values
    return accepted * (k + 1) + k


def two_phase(x, b, k, v):
    """``two-phase``: ``softmax``, then the listed bonus rows' tiles."""
    first = split_floor(x, b, k, v, True)
    device = x["target"].device
    rows = bonus_rows(b, k).to(device)
    n_tiles = triton.cdiv(v, TILE)
    out_m, out_s = (torch.empty(rows.numel() * n_tiles, dtype=torch.float32, device=device) for _ in range(2))

    def call():
        call.first()
        _bonus_floor_kernel[(rows.numel(), n_tiles)](x["target"], x["target"].stride(0), rows, v, out_m, out_s, n_tiles, TILE, num_warps=4)
        return out_m, out_s

    call.first = first
    return call, rows


def expected_splits(rows, v, width, temperature=None):
    """Per row, per ``width``-id split: max and sum of exp((a - max) / T) (T: ``temperature``
    per row, default 1), float64, from PyTorch."""
    pad = triton.cdiv(v, width) * width - v
    a = torch.nn.functional.pad(rows.double(), (0, pad), value=float("-inf")).reshape(rows.shape[0], -1, width)
    m = a.amax(dim=2)
    t = torch.ones(rows.shape[0], dtype=torch.float64) if temperature is None else temperature.double().cpu()
    return m.reshape(-1), torch.exp((a - m[..., None]) / t.to(a.device)[:, None, None]).sum(dim=2).reshape(-1)


def expected_rows(target, draft, v, temperature=None):
    """``expected_splits`` of the target and the draft rows (``temperature`` per row)."""
    return expected_splits(target, v, SPLIT, temperature), expected_splits(draft, v, SPLIT, temperature)


def lane_major(expected, lanes):
    """``expected_rows``' values in ``_split_floor_kernel``'s order: each lane's target splits,
    then its draft splits."""
    return tuple(torch.cat([t.reshape(lanes, -1), d.reshape(lanes, -1)], 1).reshape(-1) for t, d in zip(*expected))


def side_major(expected):
    """``expected_rows``' values in ``_tma_floor_kernel``'s order: every target split, then every draft split."""
    return tuple(torch.cat(pair) for pair in zip(*expected))


def check(name, got, want, with_sum=True):
    """Raise unless the kernel's max is exact and its sum within fp32 summation error."""
    (gm, gs), (wm, ws) = got, want
    if not torch.equal(gm.double().cpu(), wm.cpu()):
        raise AssertionError(f"{name}: split maxima differ from PyTorch's")
    if with_sum and not torch.allclose(gs.double().cpu(), ws.cpu(), rtol=1e-4, atol=0):
        raise AssertionError(f"{name}: split sums differ from PyTorch's by more than 1e-4 relative")


def _checked(name, call, want, with_sum=True):
    check(name, [t.clone() for t in call()], want, with_sum)
    return call


def _checked_two_phase(x, b, k, v, want_lanes):
    call, rows = two_phase(x, b, k, v)
    _checked("two-phase, first", call.first, want_lanes)
    check("two-phase, bonus", call(), expected_splits(x["target"][rows], v, TILE))
    return call


def _times(replay, reps):
    """us per replay, ``reps`` timings under each of ``bench_kernels.FLUSHES``."""
    from benchmarks import bench_kernels as bk

    return {flush: [round(bk.time_ms(replay, flush) * 1e3, 2) for _ in range(reps)] for flush in bk.FLUSHES}


def _sampler(x, b, k, v, cut: int, setting: str):
    """The fused path (``cut`` 1: its statistics kernel alone), ``Tunables`` from ``setting``."""
    from benchmarks import ab_fused
    from benchmarks import bench_kernels as bk
    from harness.backends.triton import fused as triton_fused

    launch_each = triton_fused.launch_each  # ``cut_after`` replaces it
    tunables = bk.tunables_from(setting)
    ab_fused.cut_after(cut)
    call = bk.triton_call(x, b, k, v, path="fused", tunables=tunables)
    try:
        return bk.graphed(call), call
    finally:
        triton_fused.launch_each = launch_each


def _floor_variants(x, b, k, v, stages, sm):
    """The floor calls of one shape, each checked against PyTorch: {name: (call or error, bytes read)}."""
    target, draft = _rows(x, b, k, v)
    stats_bytes = target.numel() * 4 + draft.numel() * 2
    expected = expected_rows(target, draft, v)
    want_lanes, want = lane_major(expected, b * k), side_major(expected)
    builders = [
        ("max", lambda: _checked("max", split_floor(x, b, k, v, False), want_lanes, False)),
        ("softmax", lambda: _checked("softmax", split_floor(x, b, k, v, True), want_lanes)),
        ("softmax-rows-loaded", lambda: _checked("softmax-rows-loaded", split_floor(x, b, k, v, True, 1), want_lanes)),
        ("softmax-rows-guessed", lambda: _checked("softmax-rows-guessed", split_floor(x, b, k, v, True, 2), want_lanes)),
        ("torch-amax", lambda: lambda: (target.amax(dim=1), draft.amax(dim=1))),
        ("two-phase", lambda: _checked_two_phase(x, b, k, v, want_lanes)),
    ]
    if v % SPLIT:
        builders.append(("tma", lambda: f"skipped: V = {v} is not a multiple of {SPLIT} (a box would run into the next row)"))
    else:
        for n in stages:
            for per_sm in (2, 4):
                builders.append(
                    (
                        f"tma-{n}-stages-{per_sm}-per-sm",
                        lambda n=n, per_sm=per_sm: _checked("tma", tma_floor(x, b, k, v, n, per_sm * sm), want),
                    )
                )
    variants = {}
    for name, build in builders:
        nbytes = stats_bytes + (bonus_rows(b, k).numel() * v * 4 if name == "two-phase" else 0)
        try:  # a variant that fails to compile or to check is recorded, the others still run
            variants[name] = (build(), nbytes)
        except Exception as e:  # noqa: BLE001
            variants[name] = (f"{type(e).__name__}: {e}"[:2000], nbytes)
    return variants


SAMPLER_VARIANTS = (
    ("sampler", 0, ""),
    ("sampler-stats", 1, ""),
    ("sampler-4096", 0, "_STATS_PROGRAMS=4096"),
    ("sampler-stats-4096", 1, "_STATS_PROGRAMS=4096"),
)


def measure(b, k, v, stages, reps, sm, copy):
    """Rows of one shape: every floor variant and the sampler's four, all twice, in turns."""
    from benchmarks import bench_kernels as bk

    x = bk.inputs(b, k, v)
    variants = _floor_variants(x, b, k, v, stages, sm)
    whole = x["target"].numel() * 4 + x["draft"].numel() * 2
    rows = []
    for turn in range(2):
        for name, (call, nbytes) in variants.items():
            row = {"B": b, "K": k, "V": v, "variant": name, "turn": turn, "bytes": nbytes}
            if isinstance(call, str):  # skipped, or failed to build or to check
                row["skipped" if call.startswith("skipped") else "error"] = call
            else:
                try:
                    row["us"] = _times(bk.graphed(call), reps)
                    row["tb_s"] = {f: nbytes / (min(t) * 1e-6) / 1e12 for f, t in row["us"].items()}
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {e}"[:2000]
            rows.append(row)
            print(json.dumps(row), flush=True)
        for name, cut, setting in SAMPLER_VARIANTS:
            replay, _alive = _sampler(x, b, k, v, cut, setting)
            us = _times(replay, reps)
            row = {"B": b, "K": k, "V": v, "variant": name, "turn": turn, "us": us}
            row["share_of_copy_whole_inputs"] = {f: whole / (min(t) * 1e-6) / copy for f, t in us.items()}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def _numbers(text: str, sep: str, width: int):
    """``text``'s ``sep``-separated groups of ``width`` comma-separated integers >= 1 (one
    integer each at width 1), or None where it is not that."""
    try:
        groups = [tuple(int(n) for n in part.split(",")) for part in text.split(sep)]
    except ValueError:
        return None
    if any(len(g) != width or min(g) < 1 for g in groups):
        return None
    return [g[0] for g in groups] if width == 1 else groups


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="256,1,131072;256,1,152064", help='"B,K,V;..." (default: %(default)s)')
    p.add_argument("--stages", default="2,3,4", help="TMA pipeline depths (default: %(default)s)")
    p.add_argument("--reps", type=int, default=2, help="timings per variant and flush (default: %(default)s)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    shapes, stages = _numbers(args.shapes, ";", 3), _numbers(args.stages, ",", 1)
    if shapes is None:
        p.error(f"--shapes: expected B,K,V;... with every number >= 1, got {args.shapes!r}")
    if stages is None:
        p.error(f"--stages: expected N,... with every number >= 1, got {args.stages!r}")
    if args.reps < 1:
        p.error(f"--reps: expected a number >= 1, got {args.reps}")
    if not torch.cuda.is_available():
        p.error("needs a CUDA device (the kernels' outputs are checked on CPU by suites/test_benchmark_tools.py)")
    from benchmarks import bench_kernels as bk

    sm = torch.cuda.get_device_properties(0).multi_processor_count
    copy = bk.copy_bandwidth()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    out |= {"copy_tb_s": copy / 1e12, "rows": []}
    for b, k, v in shapes:
        out["rows"] += measure(b, k, v, stages, args.reps, sm, copy)
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(f"copy {copy / 1e12:.2f} TB/s on {out['device']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

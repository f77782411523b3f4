"""Time per call: the suite's Triton sampler vs vLLM MRV2 ``rejection_sample`` on the same
inputs (standard method, fp32 target logits, bf16 draft logits), and the achieved bytes/s
against the GPU's measured device-to-device copy bandwidth.

Run on a GPU machine: ``python benchmarks/bench_kernels.py --json OUT.json`` (vLLM from the
installed package or ``SPECDEC_VLLM_SRC``). Timings: ``time_ms``, the median of
``triton.testing.do_bench``'s timed calls (its default is the mean) with the L2 flush chosen
by ``--flush`` (``flush_l2``: ``write``, do_bench's own, leaves up to 50 MB of dirty lines
that the timed call writes back; ``read`` leaves clean ones), ``--reps`` rounds per shape with the
backends taking turns, and the median of the rounds: an eager call is host-bound at small
batches, and one slow stretch of the host moved a single mean by up to 30%. Eager rows also
give the host's time per call (``host_us``: calls queued back to back, no device sync).
Bytes counted: every target row (fp32) and draft row (bf16) read once.

Two ways of calling each implementation: eager (launched from Python every call, as
``python -m harness`` calls backends) and ``NAME-graph``: the same call captured once in a
CUDA graph and replayed (as engines run a decoding step: inputs already in the graph's
static buffers, no host launch work). The graph column is the pipeline's device time.

``triton`` is the path ``verify`` picks by default (``path="auto"``, ``takes_fused_path``: on
CUDA the fused path up to ``Tunables.fused_max_logits_cuda`` requests x V); ``triton-fused`` and
``triton-staged`` force one path at every batch size, for comparison. ``--set`` times every triton
call with a variant of the sampler's ``Tunables`` (``parse_tunables``).
"""

import argparse
import cProfile
import dataclasses
import functools
import json
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from harness.backends.triton.tunables import DEFAULT_TUNABLES, Tunables  # noqa: E402
from harness.evidence.environment import describe  # noqa: E402

BATCHES = (1, 64, 256, 1024)
DRAFTS = (1, 4, 8)
VOCABS = (32000, 131072, 152064)


FLUSHES = ("write", "read")
_FLUSH_BYTES = 256 << 20  # more than any L2 (50 MB on H100 and H200); do_bench's size


@functools.cache
def _flush_buffers():
    return torch.empty(_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda"), torch.ones(_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")


def flush_l2(mode: str) -> None:
    """Evict the inputs from L2 before a timed call. ``write``: ``do_bench``'s own flush (zero
    256 MB), which leaves L2 full of dirty lines that the timed call then writes back to
    DRAM while it reads (up to 50 MB of extra traffic, a fixed cost per call); ``read``: the
    same, then a 256 MB read, which writes those lines back before the call and leaves L2
    full of clean lines."""
    if mode not in FLUSHES:
        raise ValueError(f"flush: expected one of {FLUSHES}, got {mode!r}")
    dirty, clean = _flush_buffers()
    dirty.zero_()
    if mode == "read":
        clean.max()


def time_ms(fn, flush: str = "write", warmup_ms: float = 25, rep_ms: float = 200) -> float:
    """Median device milliseconds per call of ``fn``, L2 flushed before each (``flush_l2``):
    ``triton.testing.do_bench(fn, warmup, rep, return_mode="median")`` with the flush chosen."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        flush_l2(flush)
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = start.elapsed_time(end) / 5
    for _ in range(max(1, int(warmup_ms / estimate))):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(max(1, int(rep_ms / estimate)))]
    for begin, finish in events:
        flush_l2(flush)
        begin.record()
        fn()
        finish.record()
    torch.cuda.synchronize()
    return statistics.median(begin.elapsed_time(finish) for begin, finish in events)


def copy_bandwidth(gib: float = 2.0, flush: str = "write") -> float:
    """Device-to-device copy, bytes read + written per second."""
    n = int(gib * (1 << 30)) // 4
    src = torch.empty(n, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), flush, warmup_ms=10)
    return 2 * n * 4 / (ms * 1e-3)


def inputs(b, k, v, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    rows = b * (k + 1)
    return {
        "target": torch.randn(rows, v, device="cuda", generator=g, dtype=torch.float32),
        "draft": torch.randn(b, k, v, device="cuda", generator=g, dtype=torch.float32).to(torch.bfloat16),
        "tokens": torch.randint(0, v, (b, k), device="cuda", generator=g),
        "temperature": torch.ones(b, device="cuda"),
        "seeds": torch.randint(0, 2**31, (b,), device="cuda", generator=g),
    }


# The fused path's launch constants (fields of harness/backends/triton/tunables.py's ``Tunables``):
# how its work is spread over programs, and the statistics kernel's register cap (how many of its
# programs an SM holds). None changes the tokens (each one's comment in tunables.py says why), so
# one GPU can be tuned apart from another by timing alone.
TUNABLE = (
    "stats_programs",
    "stats_max_splits",
    "mass_programs",
    "mass_max_tiles",
    "pick_in_mass_max_blocks",
    "stats_max_registers",
    "stats_evict_first_min_drafts",
    "stats_evict_first_max_drafts",
)
# Allowed values, where not [1, inf): 0 picks in a kernel of its own at every batch size; register
# caps from 32 (a sanity bound: the statistics kernel already spills at 40) to 255 (ptxas's most);
# 0 as the most draft rows loaded evict_first: never.
_RANGES = {"pick_in_mass_max_blocks": (0, None), "stats_max_registers": (32, 255), "stats_evict_first_max_drafts": (0, None)}


def parse_tunables(spec: str) -> dict:
    """The ``TUNABLE`` fields that "NAME=N,NAME=N" sets, as {field: N}: the variant is
    ``dataclasses.replace(DEFAULT_TUNABLES, **parse_tunables(spec))`` (``tunables_from``). A NAME is
    the field's name in either case, with or without a leading underscore (``STATS_PROGRAMS``,
    ``_STATS_PROGRAMS`` and ``stats_programs`` are one field, as the module constants were named).
    Raises ValueError on a name not in ``TUNABLE`` or a value that is not an integer in its range
    (``_RANGES``, else >= 1)."""
    wanted = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, value = item.partition("=")
        name = name.strip().lstrip("_").lower()
        if not sep or name not in TUNABLE:
            raise ValueError(f"parse_tunables: {item!r} is not NAME=N with NAME one of {', '.join(TUNABLE)}")
        least, most = _RANGES.get(name, (1, None))
        if not value.strip().isdigit() or int(value) < least or (most is not None and int(value) > most):
            bounds = f">= {least}" if most is None else f"in [{least}, {most}]"
            raise ValueError(f"parse_tunables: {item!r}: the value must be an integer {bounds}")
        wanted[name] = int(value)
    return wanted


def tunables_from(spec: str) -> Tunables:
    """``DEFAULT_TUNABLES`` with the fields ``spec`` sets (``parse_tunables``)."""
    return dataclasses.replace(DEFAULT_TUNABLES, **parse_tunables(spec))


def triton_call(x, b, k, v, path="auto", tiles=None, tunables=DEFAULT_TUNABLES):
    """``tiles`` ("BLOCK_VxT"): BLOCK_V-wide tiles, T tiles per vocabulary split (default:
    ``common.tile_plan``); ``tunables``: the sampler's ``Tunables``."""
    from harness.backends.triton.backend import verify

    block_v, splits = None, None
    if tiles:
        block_v, per_split = (int(n) for n in tiles.split("x"))
        splits = -(-v // (block_v * per_split))

    cu = torch.arange(0, b * k + 1, k, device="cuda", dtype=torch.int64)
    positions = torch.arange(b * (k + 1), device="cuda", dtype=torch.int64) + 1000
    methods = torch.zeros(b, dtype=torch.int8, device="cuda")
    draft = x["draft"].reshape(b * k, v)
    tokens = x["tokens"].reshape(-1)
    t64 = x["temperature"].double()

    def call():
        return verify(
            x["target"],
            draft,
            tokens,
            cu,
            t64,
            x["seeds"],
            positions,
            methods,
            None,
            k,
            has_strict=False,
            has_block=False,
            has_synthetic=False,
            path=path,
            block_v=block_v,
            splits=splits,
            tunables=tunables,
        )

    return call


def mrv2_call(x, b, k, v):
    from harness.backends.vllm import env as vllm_env

    vllm_env.prepare()
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils import rejection_sample

    rows = b * (k + 1)
    draft_sampled = torch.zeros(b, k + 1, dtype=torch.int64, device="cuda")
    draft_sampled[:, 1:] = x["tokens"]  # row j verifies draft_sampled[row + 1]
    cu = torch.arange(0, rows + 1, k + 1, device="cuda", dtype=torch.int32)
    pos = torch.arange(rows, device="cuda", dtype=torch.int64) + 1000
    idx = torch.arange(b, device="cuda", dtype=torch.int32)
    expanded = idx.repeat_interleave(k + 1)
    local = torch.arange(k + 1, device="cuda", dtype=torch.int32).repeat(b)

    def call():
        return rejection_sample(
            x["target"], x["draft"], draft_sampled.reshape(-1), cu, pos, idx, expanded, local, x["temperature"], x["seeds"], k
        )

    return call


def host_time(call, calls: int, profile_to=None) -> float:
    """Mean host microseconds to queue one call (the device synchronized before and after
    the timed calls only); with ``profile_to`` (an open file) the calls run under cProfile."""
    call()
    torch.cuda.synchronize()
    prof = cProfile.Profile() if profile_to else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    for _ in range(calls):
        call()
    if prof:
        prof.disable()
    host = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    if prof:
        pstats.Stats(prof, stream=profile_to).sort_stats("tottime").print_stats(25)
    return host


def graphed(call):
    """``call`` captured in a CUDA graph (after warm-up on a side stream); returns its replay."""
    call()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph.replay


def main() -> int:
    from harness.backends.triton.backend import takes_fused_path

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--backends", default="triton,vllm-mrv2,triton-graph,vllm-mrv2-graph")
    ap.add_argument("--reps", type=int, default=3, help="rounds per shape, the backends taking turns (default 3)")
    ap.add_argument(
        "--flush", default="write", choices=FLUSHES, help="how L2 is flushed before each timed call (flush_l2; default write, do_bench's)"
    )
    ap.add_argument("--tiles", help="also time the triton backends with these tile policies (BLOCK_VxT,...: T tiles per split)")
    ap.add_argument("--batches", help=f"comma-separated (default: {BATCHES})")
    ap.add_argument("--drafts", help=f"comma-separated (default: {DRAFTS})")
    ap.add_argument("--vocabs", help=f"comma-separated (default: {VOCABS})")
    ap.add_argument("--set", default="", help=f"the fused path's launch constants, NAME=N,... (one of {', '.join(TUNABLE)})")
    args = ap.parse_args()
    try:
        constants = parse_tunables(args.set)
    except ValueError as e:
        ap.error(str(e))
    tunables = dataclasses.replace(DEFAULT_TUNABLES, **constants)
    ints = lambda text, default: tuple(int(n) for n in text.split(",")) if text else default  # noqa: E731
    names = args.backends.split(",")
    names += [f"{n}@{t}" for t in (args.tiles.split(",") if args.tiles else ()) for n in names if n.startswith("triton")]
    if not torch.cuda.is_available():
        print("error: no CUDA device", file=sys.stderr)
        return 2
    bandwidth = copy_bandwidth(flush=args.flush)
    makers = {"triton": functools.partial(triton_call, tunables=tunables), "vllm-mrv2": mrv2_call}
    makers |= {f"triton-{path}": functools.partial(triton_call, path=path, tunables=tunables) for path in ("fused", "staged")}
    rows = []
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    for v in ints(args.vocabs, VOCABS):
        for k in ints(args.drafts, DRAFTS):
            for b in ints(args.batches, BATCHES):
                x = inputs(b, k, v)
                nbytes = b * (k + 1) * v * 4 + b * k * v * 2
                row = {
                    "B": b,
                    "K": k,
                    "V": v,
                    "bytes": nbytes,
                    "triton_path": "fused" if takes_fused_path("auto", b, cuda=True, vocab=v, tunables=tunables) else "staged",
                }
                timed = {}  # name -> (call, what do_bench runs); the call keeps a graph's buffers alive
                for name in names:
                    try:
                        base, _, tiles = name.partition("@")
                        graph = base.endswith("-graph")
                        make = makers[base.removesuffix("-graph")]
                        call = make(x, b, k, v, tiles=tiles) if tiles else make(x, b, k, v)
                        timed[name] = (call, graphed(call) if graph else call)
                        row[name] = {"ms_reps": []} | ({} if graph else {"host_us": host_time(call, 50)})
                    except Exception as e:  # one backend failing to run a shape is its own result
                        row[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
                for _ in range(args.reps):
                    for name, (_, fn) in list(timed.items()):
                        try:
                            row[name]["ms_reps"].append(time_ms(fn, args.flush))
                        except Exception as e:
                            row[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
                            del timed[name]
                for name in timed:
                    ms = statistics.median(row[name]["ms_reps"])
                    row[name] |= {"ms": ms, "TBps": nbytes / (ms * 1e-3) / 1e12, "of_copy": nbytes / (ms * 1e-3) / bandwidth}
                del timed
                rows.append(row)
                cells = "  ".join(
                    f"{n}: {row[n]['ms']:.3f} ms ({row[n]['of_copy']:.0%} of copy)" if "ms" in row[n] else f"{n}: {row[n]['error']}"
                    for n in names
                )
                print(f"B={b:5d} K={k} V={v:6d} ({row['triton_path']})  {cells}", flush=True)
                del x
                torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "environment": describe(),
                    "copy_bandwidth_Bps": bandwidth,
                    "flush": args.flush,
                    "constants": constants,
                    "command": " ".join(sys.argv),
                    "results": rows,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

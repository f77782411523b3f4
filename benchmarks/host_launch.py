"""Host time to queue one call of the Triton sampler, by part, against vLLM MRV2's.

Run on a GPU machine: ``python benchmarks/host_launch.py --json OUT.json`` (vLLM from the
installed package or ``SPECDEC_VLLM_SRC``). For each shape and path (staged, fused), in one
process and interleaved (three rounds, the fastest kept), the mean host microseconds per call
of 200 back-to-back calls:

* ``normal``: every kernel launched through Triton's ``JITFunction.run``;
* ``direct``: through ``harness.backends.triton.launch`` (the default on Triton 3.6);
* ``nolaunch``: no Triton kernel launched: the call's own Python and allocations (and
  torch's fills, which still launch);

and ``mrv2``: vLLM MRV2 ``rejection_sample`` on the same inputs (``bench_kernels.mrv2_call``).
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from bench_kernels import inputs, mrv2_call, triton_call  # noqa: E402

from harness.backends.triton import fused as triton_fused  # noqa: E402
from harness.backends.triton import launch as triton_launch  # noqa: E402
from harness.backends.triton import staged as triton_staged  # noqa: E402
from harness.backends.triton import staged_jobs as triton_staged_jobs  # noqa: E402
from harness.evidence.environment import describe  # noqa: E402

SHAPES = "1,4,131072;64,4,131072;256,1,152064"


def host_us(call, calls: int = 200) -> float:
    for _ in range(10):
        call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    us = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return us


def timed(call, mode: str) -> float:
    """``call``'s host time with launches as ``mode`` says (module attributes restored after)."""
    direct, launch = triton_launch._direct_possible, triton_launch.launch
    triton_launch._direct_possible = (lambda: False) if mode == "normal" else (lambda: True)
    if mode == "nolaunch":
        triton_staged.launch = triton_staged_jobs.launch = triton_fused.launch = lambda *args, **options: None
    try:
        return host_us(call)
    finally:
        triton_launch._direct_possible = direct
        triton_staged.launch = triton_staged_jobs.launch = triton_fused.launch = launch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--shapes", default=SHAPES, help=f"B,K,V;... (default {SHAPES})")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("error: no CUDA device", file=sys.stderr)
        return 2
    results = []
    for shape in args.shapes.split(";"):
        b, k, v = (int(n) for n in shape.split(","))
        x = inputs(b, k, v)
        calls = {path: triton_call(x, b, k, v, path=path) for path in ("staged", "fused")}
        rounds: dict[str, list] = {}
        for _ in range(3):
            for mode in ("normal", "direct", "nolaunch"):
                for path, call in calls.items():
                    rounds.setdefault(f"{path}_{mode}", []).append(timed(call, mode))
            rounds.setdefault("mrv2", []).append(host_us(mrv2_call(x, b, k, v)))
        row = {"B": b, "K": k, "V": v} | {name: min(times) for name, times in rounds.items()}
        results.append(row)
        print({name: round(value, 1) for name, value in row.items()}, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": describe(), "command": " ".join(sys.argv), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Device time per kernel of one call (torch.profiler, CUDA activity): where the Triton
sampler's small-batch time goes against vLLM MRV2's, on ``bench_kernels``' inputs.

Run on a GPU machine: ``python benchmarks/profile_kernels.py --json OUT.json [--shapes B,K,V;...]``.
Each implementation is called ``--calls`` times after a warm-up; a kernel's time is its mean
device duration per call. The sum over kernels is the device time a CUDA graph replay cannot
go below (launch gaps come on top). ``host_us``: the host's time to queue one call (no
synchronization between calls), what an eager call costs where it exceeds the device time;
``--host-profile FILE``: cProfile of those calls, by own time, per implementation and shape.
"""

import argparse
import functools
import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.bench_kernels import host_time, inputs, mrv2_call, triton_call  # noqa: E402
from harness.evidence.environment import describe  # noqa: E402

SHAPES = "1,1,32000;1,8,32000;1,1,152064;1,8,152064;64,4,131072;256,1,32000"


def kernel_times(call, calls: int) -> dict:
    """Mean device microseconds per call of every kernel ``call`` launches."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    per_kernel = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[event.name[:80]] += event.device_time / calls  # us
    return dict(sorted(per_kernel.items(), key=lambda kv: -kv[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--shapes", default=SHAPES, help=f"B,K,V;... (default {SHAPES})")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--host-profile", help="write cProfile tables of each implementation's calls to this file")
    ap.add_argument("--impls", default="triton-fused,triton-staged,vllm-mrv2")
    args = ap.parse_args()
    makers = {"vllm-mrv2": mrv2_call} | {f"triton-{p}": functools.partial(triton_call, path=p) for p in ("auto", "fused", "staged")}
    rows = []
    host_profile = open(args.host_profile, "w") if args.host_profile else None
    for shape in args.shapes.split(";"):
        b, k, v = (int(n) for n in shape.split(","))
        x = inputs(b, k, v)
        for name in args.impls.split(","):
            try:
                call = makers[name](x, b, k, v)
                kernels = kernel_times(call, args.calls)
                row = {"B": b, "K": k, "V": v, "impl": name, "kernels_us": kernels, "sum_us": sum(kernels.values())}
                row["host_us"] = host_time(call, args.calls)
                if host_profile:
                    print(f"\n##### {name} B={b} K={k} V={v}", file=host_profile)
                    host_time(call, args.calls, host_profile)
            except Exception as e:  # one implementation failing a shape is its own result
                row = {"B": b, "K": k, "V": v, "impl": name, "error": f"{type(e).__name__}: {e}"[:300]}
            rows.append(row)
            print(json.dumps(row), flush=True)
        del x
        torch.cuda.empty_cache()
    with open(args.json, "w") as f:
        json.dump({"environment": describe(), "command": " ".join(sys.argv), "results": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

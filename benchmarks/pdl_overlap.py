"""Can a kernel two programmatic launches behind start before the first one ends?

Three one-program kernels in a stream, the second and third launched with programmatic
dependent launch (``launch_pdl``): ``first`` spins 50 us and then raises a flag; ``second``
lets its dependents launch before its own ``gdc_wait`` (``second_triggers_first``), then, in a
second set of tries, after it (``second_waits_first``); ``third`` reads the flag without
waiting. The fused Triton sampler's mass kernel is such a third kernel
(``harness/backends/triton/fused.py``): it may read the chain kernel's results only on a flag.
Usage: ``python benchmarks/pdl_overlap.py [--tries N] [--json PATH]`` on an sm_90+ GPU.
"""

import argparse
import json

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait, globaltimer

SPIN_NS = tl.constexpr(50_000)  # the first kernel's spin


@triton.jit
def _first(flag, times):
    gdc_launch_dependents()
    begin = globaltimer()
    now = begin
    while now - begin < SPIN_NS:
        now = globaltimer()
    tl.store(times, now)
    tl.atomic_xchg(flag, 1, sem="release", scope="gpu")


@triton.jit
def _second(times, WAIT_FIRST: tl.constexpr):
    if WAIT_FIRST:
        gdc_wait()
        gdc_launch_dependents()
    else:
        gdc_launch_dependents()
        gdc_wait()
    tl.store(times + 1, globaltimer())


@triton.jit
def _third(flag, times):
    tl.store(times + 2, globaltimer())
    tl.store(times + 3, tl.atomic_add(flag, 0, sem="acquire", scope="gpu").to(tl.int64))
    gdc_wait()


def _launch(flag, times, wait_first):
    _first[(1,)](flag, times)
    _second[(1,)](times, wait_first, launch_pdl=True)
    _third[(1,)](flag, times, launch_pdl=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tries", type=int, default=5)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    times = torch.zeros(4, dtype=torch.int64, device="cuda")
    for wait_first in (False, True):  # compile first: a compile between the launches hides any overlap
        _launch(flag, times, wait_first)
    torch.cuda.synchronize()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    for wait_first in (False, True):
        tries = []
        for _ in range(args.tries):
            flag.zero_()
            _launch(flag, times, wait_first)
            torch.cuda.synchronize()
            first_end, _, third_start, seen = times.tolist()
            tries.append({"third_start_minus_first_end_ns": third_start - first_end, "third_saw_flag": seen})
        out["second_waits_first" if wait_first else "second_triggers_first"] = tries
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

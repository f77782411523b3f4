"""Residual candidates on and off (``benchmarks/RESULTS.md#residual-candidates``): graph time of the
default (fused) Triton call with ``Tunables.candidates`` set to each variant in one process.

On a GPU machine: ``AB_VARIANTS=0,8 AB_SHAPES='256,1,131072;1,8,152064' python benchmarks/ab_candidates.py``
(writes ``$OUT/ab.json`` or ``./ab.json``). Per shape and variant: ``do_bench`` medians (us) of the call
captured in a CUDA graph, ``AB_REPS`` runs; with candidates on, whether the fused path's tokens equal the
staged path's; the share of requests that rejected; the share whose tokens equal the first variant's;
whether the emitted counts equal it.
"""

import dataclasses
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from benchmarks import bench_kernels as bk  # noqa: E402
from harness.backends.triton.tunables import DEFAULT_TUNABLES  # noqa: E402

SHAPES = "256,1,131072;256,1,152064;256,4,131072;1024,1,131072;64,8,131072;64,1,131072;1,8,152064;1,1,131072"


def main() -> int:
    variants = [int(v) for v in os.environ.get("AB_VARIANTS", "0,8").split(",")]
    shapes = [tuple(int(x) for x in s.split(",")) for s in os.environ.get("AB_SHAPES", SHAPES).split(";")]
    reps = int(os.environ.get("AB_REPS", "2"))
    out = {"copy_Bps": bk.copy_bandwidth(), "rows": []}
    print(f"copy {out['copy_Bps'] / 1e12:.2f} TB/s", flush=True)
    for b, k, v in shapes:
        x = bk.inputs(b, k, v)
        row = {"B": b, "K": k, "V": v, "bytes": b * (k + 1) * v * 4 + b * k * v * 2}
        tokens = {}
        for rep in range(reps):
            for c in variants:
                tunables = dataclasses.replace(DEFAULT_TUNABLES, candidates=c)
                call = bk.triton_call(x, b, k, v, tunables=tunables)
                row.setdefault(f"c{c}", []).append(do_bench(bk.graphed(call), warmup=25, rep=200) * 1000)
                if rep == 0:
                    tokens[c] = [t.clone() for t in call()]
                    if c:
                        staged = bk.triton_call(x, b, k, v, path="staged", tunables=tunables)()
                        row[f"c{c}_fused_eq_staged"] = all(torch.equal(a, s) for a, s in zip(tokens[c], staged))
        first = tokens[variants[0]]
        row["rejected_frac"] = float((first[1] <= k).float().mean())
        for c in variants[1:]:
            row[f"c{c}_same_tokens_as_c{variants[0]}"] = float((tokens[c][0] == first[0]).all(dim=1).float().mean())
            row[f"c{c}_same_counts"] = bool(torch.equal(tokens[c][1], first[1]))
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
        del x
        torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "ab.json"), "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

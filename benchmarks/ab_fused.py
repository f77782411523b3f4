"""Graph time of the fused Triton path against another version of it, and vLLM MRV2, one variant
per process (``benchmarks/RESULTS.md``, issue 3, session 22): run it once per variant, in turns.

On a GPU machine, with an earlier version of the fused module saved beside the checkout::

    git show d2d33dd:harness/backends/triton_fused.py > /tmp/fused_old.py
    for v in old new mrv2 old new mrv2; do AB_OLD=/tmp/fused_old.py python benchmarks/ab_fused.py $v; done

``old``: ``AB_OLD``'s ``verify_fused`` (it imports the sampler's helpers from this checkout);
``new``: this checkout's; ``mrv2``: vLLM MRV2 ``rejection_sample``. Per shape (``AB_SHAPES``
"B,K,V;..."): ``bench_kernels.time_ms`` medians of the call captured in a CUDA graph (``AB_REPS`` each;
L2 flush ``AB_FLUSH``, default ``write`` as ``do_bench``),
for the Triton variants whether the fused tokens equal the staged path's, and their tokens
saved (``$OUT/ab_tokens_VARIANT.pt``) to compare variants. Writes ``$OUT/ab_VARIANT.json``.
"""

import importlib.util
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from benchmarks import bench_kernels as bk  # noqa: E402
from harness.backends import triton_fused  # noqa: E402

SHAPES = "1,8,152064;1,4,152064;1,1,152064;1,8,131072;1,4,131072;1,1,131072;64,1,131072;256,1,131072;256,1,152064;1024,8,152064"


def main() -> int:
    variant = sys.argv[1] if len(sys.argv) > 1 else ""
    if variant not in ("old", "new", "mrv2"):
        print("usage: ab_fused.py old|new|mrv2 (old needs AB_OLD=path of a triton_fused.py)", file=sys.stderr)
        return 2
    if variant == "old":
        spec = importlib.util.spec_from_file_location("fused_old", os.environ["AB_OLD"])
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        triton_fused.verify_fused = old.verify_fused  # what ``verify`` calls on its fused path
    out_dir = os.environ.get("OUT", ".")
    out = {"variant": variant, "device": torch.cuda.get_device_name(), "rows": []}
    tokens = {}
    flush = os.environ.get("AB_FLUSH", "write")
    for shape in os.environ.get("AB_SHAPES", SHAPES).split(";"):
        b, k, v = (int(n) for n in shape.split(","))
        x = bk.inputs(b, k, v)
        row = {"B": b, "K": k, "V": v}
        call = bk.mrv2_call(x, b, k, v) if variant == "mrv2" else bk.triton_call(x, b, k, v)
        if variant != "mrv2":
            tokens[shape] = [t.cpu() for t in call()]
            staged = bk.triton_call(x, b, k, v, path="staged")()
            row["fused_eq_staged"] = all(torch.equal(a, s.cpu()) for a, s in zip(tokens[shape], staged))
        replay = bk.graphed(call)  # ``call`` stays alive: the graph reads its buffers
        row["us"] = [bk.time_ms(replay, flush) * 1e3 for _ in range(int(os.environ.get("AB_REPS", "2")))]
        out["rows"].append(row)
        print(variant, json.dumps(row), flush=True)
        del x, call, replay
        torch.cuda.empty_cache()
    if tokens:
        torch.save(tokens, os.path.join(out_dir, f"ab_tokens_{variant}.pt"))
    with open(os.path.join(out_dir, f"ab_{variant}.json"), "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

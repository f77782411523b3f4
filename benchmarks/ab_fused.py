"""Graph time of the fused Triton path against another version of it, and vLLM MRV2, one variant
per process (``benchmarks/RESULTS.md#fused-path-ab``): run it once per variant, in turns.

On a GPU machine, with an earlier version of the fused module saved beside the checkout::

    git show d2d33dd:harness/backends/triton/fused.py > /tmp/fused_old.py
    for v in old new mrv2 old new mrv2; do AB_OLD=/tmp/fused_old.py python benchmarks/ab_fused.py $v; done

``old``: ``AB_OLD``'s ``verify_fused`` (it imports the sampler's helpers from this checkout, so it must be
a ``fused.py`` of this package layout, ``harness/backends/triton/fused.py`` since the split of
``sampler.py``; ``backend.verify`` calls it with ``tunables=``);
``new``: this checkout's; ``mrv2``: vLLM MRV2 ``rejection_sample``. Per shape (``AB_SHAPES``
"B,K,V;..."): ``bench_kernels.time_ms`` medians of the call captured in a CUDA graph (``AB_REPS`` each;
L2 flush ``AB_FLUSH``, default ``write`` as ``do_bench``),
for the Triton variants whether the fused tokens equal the staged path's, and their tokens
saved (``$OUT/ab_tokens_VARIANT.pt``) to compare variants. Writes ``$OUT/ab_VARIANT.json``.

Variants of ``new`` without a second file: ``AB_SET="STATS_PROGRAMS=4096,..."`` times the fused
path with those ``Tunables`` (``bench_kernels.tunables_from``); ``AB_CUT=n`` launches only the
call's first n kernels (1: the statistics kernel; ``benchmarks/RESULTS.md#kernel-time-by-stage``:
outputs not valid, so not compared, but the time of what was launched); ``AB_NAME`` names the files and rows instead of
the variant. For example, in turns::

    for i in 1 2; do
      AB_NAME=base python benchmarks/ab_fused.py new
      AB_NAME=s4096 AB_SET=STATS_PROGRAMS=4096 python benchmarks/ab_fused.py new
    done
"""

import importlib.util
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from benchmarks import bench_kernels as bk  # noqa: E402
from harness.backends.triton import fused as triton_fused  # noqa: E402
from harness.backends.triton.tunables import DEFAULT_TUNABLES  # noqa: E402

SHAPES = "1,8,152064;1,4,152064;1,1,152064;1,8,131072;1,4,131072;1,1,131072;64,1,131072;256,1,131072;256,1,152064;1024,8,152064"


LAUNCHED = []  # under AB_CUT: the kernels the last call launched


def cut_after(n: int) -> None:
    """Make ``verify_fused`` launch only its first ``n`` kernels (0: all of them)."""
    if n < 0:
        raise ValueError(f"AB_CUT: expected a kernel count >= 0, got {n}")
    if n == 0:
        return
    launch_each = triton_fused.launch_each  # every kernel after the statistics kernel

    def first_only(launches, *args):
        LAUNCHED[:] = ["_fused_stats_kernel"] + [fn.__name__ for fn, _, _ in launches[: n - 1]]
        if n > 1:  # launch_each takes at least one kernel
            launch_each(launches[: n - 1], *args)

    triton_fused.launch_each = first_only


def main() -> int:
    variant = sys.argv[1] if len(sys.argv) > 1 else ""
    if variant not in ("old", "new", "mrv2"):
        print("usage: ab_fused.py old|new|mrv2 (old needs AB_OLD=path of a triton_fused.py)", file=sys.stderr)
        return 2
    setting, cut = os.environ.get("AB_SET", ""), os.environ.get("AB_CUT", "0")
    tunables = DEFAULT_TUNABLES
    try:
        if not cut.isdigit():
            raise ValueError(f"AB_CUT: expected a kernel count >= 0, got {cut!r}")
        cut = int(cut)
        if variant != "new" and (setting or cut):
            raise ValueError(f"AB_SET and AB_CUT change this checkout's sampler: variant new only, not {variant}")
        if variant == "new":
            tunables = bk.tunables_from(setting)
            cut_after(cut)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    name = os.environ.get("AB_NAME", variant)
    if variant == "old":
        spec = importlib.util.spec_from_file_location("fused_old", os.environ["AB_OLD"])
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        triton_fused.verify_fused = old.verify_fused  # what ``verify`` calls on its fused path
    out_dir = os.environ.get("OUT", ".")
    out = {"variant": name, "device": torch.cuda.get_device_name(), "rows": []}
    out |= {"set": setting, "cut": cut}
    tokens = {}
    flush = os.environ.get("AB_FLUSH", "write")
    for shape in os.environ.get("AB_SHAPES", SHAPES).split(";"):
        b, k, v = (int(n) for n in shape.split(","))
        x = bk.inputs(b, k, v)
        row = {"B": b, "K": k, "V": v}
        call = bk.mrv2_call(x, b, k, v) if variant == "mrv2" else bk.triton_call(x, b, k, v, tunables=tunables)
        if variant != "mrv2" and not cut:
            tokens[shape] = [t.cpu() for t in call()]
            staged = bk.triton_call(x, b, k, v, path="staged")()
            row["fused_eq_staged"] = all(torch.equal(a, s.cpu()) for a, s in zip(tokens[shape], staged))
        replay = bk.graphed(call)  # ``call`` stays alive: the graph reads its buffers
        if cut:
            row["launched"] = list(LAUNCHED)  # as the warm-up and captured calls launched
        row["us"] = [bk.time_ms(replay, flush) * 1e3 for _ in range(int(os.environ.get("AB_REPS", "2")))]
        out["rows"].append(row)
        print(name, json.dumps(row), flush=True)
        del x, call, replay
        torch.cuda.empty_cache()
    if tokens:
        torch.save(tokens, os.path.join(out_dir, f"ab_tokens_{name}.pt"))
    with open(os.path.join(out_dir, f"ab_{name}.json"), "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

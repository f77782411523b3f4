"""Registers, stack and shared memory of the fused Triton kernels compiled for an H100 (sm_90)
on a machine without a GPU: what a kernel change does to occupancy, before any device time.

    python benchmarks/kernel_resources.py --shapes '256,1,131072;1,8,152064'

The launches are planned by ``harness.backends.triton.compile_info`` (the fused path's
tiles, grids and arguments for a batch of B requests of K drafts at vocabulary V, every method
present) and compiled with the installed Triton's bundled ptxas; ``cuobjdump`` reads the cubin.
The GPU machines run Triton 3.6: put its wheel, unpacked, first on ``PYTHONPATH`` for their
counts (``pip download --no-deps triton==3.6.0``). They have equalled the H100's
for the statistics kernel (64, and 96 with a per-tile store) and a candidate kernel (124), but
not for the mass and pick kernels (138 and 220 here, 56 and 96 there): compare variants of a
kernel, and confirm on the GPU (``benchmarks/RESULTS.md#kernel-registers``). A kernel the launch
caps (``maxnreg``) is compiled with that cap: the statistics kernel in 48, as on an H200.
Run without ``TRITON_INTERPRET``.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import triton  # noqa: E402

from harness.backends.triton.compile_info import compile_sm90, cuda_launches  # noqa: E402


def resources(compiled) -> dict:
    """Registers, stack bytes and static shared bytes of a compiled kernel, and its PTX lines."""
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True).stdout
    found = {key: re.search(rf"{key}:(\d+)", usage) for key in ("REG", "STACK", "SHARED")}
    out = {key.lower(): int(m.group(1)) for key, m in found.items() if m}
    out["ptx_lines"] = compiled.asm["ptx"].count("\n")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="256,1,131072;1,8,152064", help="B,K,V;... (fp32 target, bf16 draft logits)")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("error: unset TRITON_INTERPRET (the interpreter compiles nothing)", file=sys.stderr)
        return 2
    print(f"triton {triton.__version__}")
    for shape in args.shapes.split(";"):
        b, k, v = (int(n) for n in shape.split(","))
        for fn, launch_args, options in cuda_launches(b, k, v, True):
            usage = resources(compile_sm90(fn, launch_args, options.get("num_warps", 4), options.get("maxnreg")))
            print(f"B={b} K={k} V={v} {fn.__name__}: " + " ".join(f"{key} {value}" for key, value in usage.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

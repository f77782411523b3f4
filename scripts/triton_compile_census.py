"""Where a pytest run's Triton compile time goes: every kernel compile, with the test that
triggered it, its constexprs and its seconds (the GPU suite's wall time:
``benchmarks/RESULTS.md#gpu-suite-wall-time``).

Usage: ``python scripts/triton_compile_census.py OUT.json [pytest args...]``. Patches
``triton.compiler.compile`` before any kernel launches, then runs pytest in this
process. Not a test: a measuring tool for GPU machines (under the interpreter nothing compiles).
"""

import json
import os
import sys
import time
from collections import defaultdict

import triton.compiler
import triton.runtime.jit as jit

compiles = []
_compile = triton.compiler.compile


def _timed_compile(src, *args, **kwargs):
    t0 = time.perf_counter()
    try:
        return _compile(src, *args, **kwargs)
    finally:
        fn = getattr(src, "fn", None)
        compiles.append(
            {
                "kernel": getattr(fn, "__name__", str(fn)),
                "seconds": time.perf_counter() - t0,
                "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
                "constexprs": {str(k): str(v) for k, v in dict(getattr(src, "constexprs", {}) or {}).items()},
                "signature": {str(k): str(v) for k, v in dict(getattr(src, "signature", {}) or {}).items()},
            }
        )


# JITFunction imports ``compile`` from triton.compiler when it first launches on a device
# (older Triton: a module global of triton.runtime.jit).
triton.compiler.compile = _timed_compile
if hasattr(jit, "compile"):
    jit.compile = _timed_compile


def summary() -> dict:
    by_kernel, by_test = defaultdict(lambda: [0, 0.0]), defaultdict(lambda: [0, 0.0])
    for c in compiles:
        for table, key in ((by_kernel, c["kernel"]), (by_test, c["test"])):
            table[key][0] += 1
            table[key][1] += c["seconds"]

    def order(t):
        return dict(sorted(((k, {"compiles": n, "seconds": round(s, 2)}) for k, (n, s) in t.items()), key=lambda kv: -kv[1]["seconds"]))

    return {
        "compiles": len(compiles),
        "seconds": round(sum(c["seconds"] for c in compiles), 2),
        "by_kernel": order(by_kernel),
        "by_test": order(by_test),
    }


def main() -> int:
    import pytest

    out, args = sys.argv[1], sys.argv[2:]
    t0 = time.perf_counter()
    code = pytest.main(args)
    result = {"command": " ".join(sys.argv), "pytest_exit": int(code), "wall_s": time.perf_counter() - t0, **summary(), "each": compiles}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "each"}, indent=1)[:6000])
    return int(code)


if __name__ == "__main__":
    sys.exit(main())

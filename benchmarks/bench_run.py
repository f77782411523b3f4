"""Harness overhead of a whole run: the share of wall time outside the backends' own ``sample``
calls, for the pipelined runner and the serial one it replaced
(``benchmarks/RESULTS.md#whole-run-overhead``).

Calls ``harness.run.runner.run`` as ``python -m harness run`` does (one worker process per
backend unless ``--in-process``) with the backends' ``sample`` calls timed inside the
worker (on CUDA the device is synchronized around each call), once per mode:

* pipelined (the default runner): planning, worker start-up and sampling, and evaluation
  overlap, and every backend's worker starts at once;
* serial (``run(..., pipelined=False)``, the old order): plan every scenario, then sample
  every scenario backend after backend, then evaluate every check.

Reported per run: wall; backend (the sum of the seconds inside ``sample`` calls); busy (the
seconds during which at least one backend's call was running: with concurrent workers the
calls overlap, and this is what the wall time is compared with); sampling (the worker's
sampling loops, backend included: inputs, tallies); planning (laws and trial counts, host
float64); evaluation (every check); per backend, load (from its sampling's start until its
first worker had loaded the backend: process start-up and imports); overhead = 1 - busy / wall. Both modes must give the same records (``same_records``). Kernels compile on a backend's first calls (Triton caches them
on disk): ``--warmup`` runs once, unreported, before the measured runs.

CPU: ``python benchmarks/bench_run.py --json OUT.json`` (reference backend, ``ci``
profile); a GPU machine: ``python benchmarks/bench_run.py --device cuda --profile gpu
--backend triton --warmup --json OUT.json``.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness.gpus import configure_triton  # noqa: E402

configure_triton()  # before any backend module defines a @triton.jit kernel

from harness.evidence.environment import describe  # noqa: E402
from harness.run.runner import run  # noqa: E402
from harness.scenarios.catalog import catalog  # noqa: E402
from harness.scenarios.profiles import get_profile  # noqa: E402

MODES = ("serial", "pipelined")


def measure(args, scenarios, profile, pipelined: bool):
    result = run(
        args.backend or ["reference"], scenarios, profile, args.seed, args.device,
        isolate=not args.in_process, timeout=args.timeout, gpus=args.gpus, pipelined=pipelined, time_backend=True,
    )  # fmt: skip
    backend = sum(result.sample_call_seconds.values())
    busy = busy_seconds([call for calls in result.sample_calls.values() for call in calls])
    row = {
        "mode": "pipelined" if pipelined else "serial",
        "wall_s": result.seconds,
        "backend_s": backend,
        "busy_s": busy,
        "sampling_s": sum(result.backend_seconds.values()),
        "plan_s": result.plan_seconds,
        "evaluate_s": result.evaluate_seconds,
        "overhead": 1 - busy / result.seconds,
        "per_backend": {
            name: {"backend_s": result.sample_call_seconds.get(name), "sampling_s": s, "load_s": result.load_seconds.get(name)}
            for name, s in result.backend_seconds.items()
        },
        "counts": result.counts(),
    }
    for r in result.records:
        if r.verdict == "error":  # a worker's error is the run's to explain, not a timing
            print(f"error: {r.backend} {r.scenario}: {r.message[:500]}", file=sys.stderr, flush=True)
    return row, [r.to_dict() for r in result.records]


def busy_seconds(calls: list[tuple[float, float]]) -> float:
    """Length of the union of the (start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(calls):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def select(args, profile):
    scenarios = catalog(profile, args.seed)
    if args.scenario:
        unknown = set(args.scenario) - {s.name for s in scenarios}
        if unknown:
            raise SystemExit(f"--scenario: not in the {profile.name} catalog: {sorted(unknown)}")
        scenarios = [s for s in scenarios if s.name in args.scenario]
    return [s for s in scenarios if s.name not in (args.exclude or ())]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True, help="write the results here")
    ap.add_argument("--backend", action="append", help="backend to run (repeatable; default: reference)")
    ap.add_argument("--profile", default="ci", help="default: ci")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="default: cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scenario", action="append", help="only these catalog scenarios (repeatable; default: the whole catalog)")
    ap.add_argument("--exclude", action="append", help="leave out this catalog scenario (repeatable)")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--in-process", action="store_true", help="sample in this process (default: worker processes)")
    ap.add_argument("--mode", choices=MODES, action="append", help=f"default: {', '.join(MODES)}")
    ap.add_argument("--warmup", action="store_true", help="one unreported pipelined run first (compiles kernels)")
    args = ap.parse_args()
    profile = get_profile(args.profile)
    scenarios = select(args, profile)
    if args.warmup:
        measure(args, scenarios, profile, pipelined=True)
    rows, records = [], []
    for mode in args.mode or MODES:
        row, recs = measure(args, scenarios, profile, pipelined=mode == "pipelined")
        rows.append(row)
        records.append(recs)
        print(json.dumps({k: v for k, v in row.items() if k != "per_backend"}), flush=True)
    out = {
        "command": " ".join(sys.argv),
        "environment": describe(),
        "profile": profile.name,
        "device": args.device,
        "backends": args.backend or ["reference"],
        "scenarios": [s.name for s in scenarios],
        "runs": rows,
        "same_records": all(r == records[0] for r in records),
    }
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    return 0 if out["same_records"] else 1


if __name__ == "__main__":
    sys.exit(main())

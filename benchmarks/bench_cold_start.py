"""Cold start: a GPU run's time on a fresh machine, with and without a carried Triton cache.

    python benchmarks/bench_cold_start.py --json OUT.json [--backend triton] [--profile gpu]
        [--pytest "suites/ -m gpu -n 4 --dist worksteal"] [--cache-out triton-cache.tar.gz]

Each measured command runs in a fresh process with a fresh Python bytecode cache, once with an
empty Triton cache (a fresh machine: every kernel compiles) and once with a copy of the cache
that run left (what a machine finds when the cache travels with it: ``scripts/gpu_run.sh``
unpacks ``vendor/triton-cache.tar.gz``, and a user's second run finds ``~/.triton/cache``).
Recorded: wall time; for ``harness run``, its sampling and load seconds; the kernels compiled
(the cache's entries) and the cache's size. ``--cache-out``: the run's cache, packed to carry.
Not a test: a measuring tool for GPU machines (under the interpreter nothing compiles).
"""

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _cache_stats(cache: Path) -> dict:
    files = [p for p in cache.rglob("*") if p.is_file()]
    return {"kernels": sum(1 for p in files if p.name.startswith("__grp__")), "bytes": sum(p.stat().st_size for p in files)}


def _timed(cmd: list[str], cache: Path, scratch: Path, log: Path) -> dict:
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "PYTHONPYCACHEPREFIX": str(scratch / "pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    start = time.perf_counter()
    with open(log, "w") as f:
        code = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    return {"command": shlex.join(cmd), "exit": code, "wall_s": round(time.perf_counter() - start, 2)}


def _harness_run(args, cache: Path, scratch: Path, name: str) -> dict:
    out = scratch / f"run-{name}"
    cmd = [sys.executable, "-m", "harness", "run", "--backend", args.backend, "--profile", args.profile]
    cmd += ["--device", args.device, "--out", str(out), "--no-progress"]
    row = _timed(cmd, cache, scratch, scratch / f"run-{name}.log")
    results = out / "results.json"
    if results.is_file():
        doc = json.loads(results.read_text())
        timing = doc.get("timing", {})
        row["sampling_s"] = round(timing.get("sampling_s", {}).get(args.backend, float("nan")), 2)
        row["load_s"] = round(timing.get("backend_load_s", {}).get(args.backend, float("nan")), 2)
        row["run_s"] = round(doc["seconds"], 2)
        row["records"] = {v: sum(1 for r in doc["records"] if r["verdict"] == v) for v in ("pass", "fail", "error", "skipped")}
    return row


def _measure(label: str, run_one, scratch: Path, cache_out: Path | None, keep) -> None:
    """``run_one(cache, scratch, name)`` cold (empty cache), then with a copy of that cache;
    ``keep(row)`` each row as it is measured."""
    cold_cache = scratch / f"{label}-cache-cold"
    cold_cache.mkdir()
    cold = {"case": f"{label}, empty Triton cache", **run_one(cold_cache, scratch / f"{label}-cold", "cold")}
    cold.update(_cache_stats(cold_cache))
    if cache_out:
        with tarfile.open(cache_out, "w:gz") as tar:
            tar.add(cold_cache, arcname="triton-cache")
        cold["packed_bytes"] = cache_out.stat().st_size
    keep(cold)
    carried = scratch / f"{label}-cache-carried"
    shutil.copytree(cold_cache, carried)
    warm = {"case": f"{label}, the cold run's cache carried", **run_one(carried, scratch / f"{label}-carried", "carried")}
    warm.update({f"{k}_after": v for k, v in _cache_stats(carried).items()})
    keep(warm)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--backend", default="triton")
    p.add_argument("--profile", default="gpu")
    p.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    p.add_argument("--pytest", help="pytest arguments to time the same way (e.g. 'suites/ -m gpu -n 4')")
    p.add_argument("--cache-out", type=Path, help="pack the harness run's cold cache here (.tar.gz)")
    p.add_argument("--pytest-cache-out", type=Path, help="pack the pytest run's cold cache here (.tar.gz)")
    args = p.parse_args(argv)
    rows = []

    def keep(row):  # written at once: a run cut off by its time limit keeps what it measured
        rows.append(row)
        print(json.dumps(row), flush=True)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"backend": args.backend, "profile": args.profile, "rows": rows}, indent=1) + "\n")

    with tempfile.TemporaryDirectory(prefix="cold-start-") as tmp:
        scratch = Path(tmp)

        def run_one(cache, where, name):
            where.mkdir()
            return _harness_run(args, cache, where, name)

        _measure("run", run_one, scratch, args.cache_out, keep)
        if args.pytest:
            pytest_cmd = [sys.executable, "-m", "pytest", *shlex.split(args.pytest), "-q", "-p", "no:cacheprovider"]

            def pytest_one(cache, where, name):
                where.mkdir()
                return _timed(pytest_cmd, cache, where, where / "pytest.log") | {"tail": _tail(where / "pytest.log")}

            _measure("pytest", pytest_one, scratch, args.pytest_cache_out, keep)
    return 0


def _tail(log: Path) -> str:
    lines = log.read_text(errors="replace").splitlines()
    return lines[-1] if lines else ""


if __name__ == "__main__":
    sys.exit(main())

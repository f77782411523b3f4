"""The nightly verification the workflow runs; it runs here too (CPU, small profile).

For each vLLM target (a python-only source tree such as a checkout of vLLM main, and/or
the vLLM installed in the environment), run the vLLM backends through
``python -m harness run`` with ``--history``, then build the drift page. Exit status:
0 every check passed; 1 a distribution check failed (a regression: the job fails);
3 only API drift (an adapter could not bind to that vLLM: reported apart, the job does
not fail on it alone); 2 a usage or setup error.

    python scripts/nightly.py --profile gpu --device cuda --history reports/history.sqlite \\
        --start-from docs/data/vllm-releases.sqlite \\
        --target main=vendor/vllm-main --target 0.33.0=vendor/vllm-0.33.0 --out reports/nightly

Each target is one run in the history, its ``vllm_version`` the tree's release, so the drift
page's release matrix gains a column per new release (a main build shares the "main" column).
``--start-from``: a history to copy when ``--history`` does not exist yet (the committed
release sweep, ``scripts/vllm_releases.py``), so the nightly runs extend it.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKENDS = ("vllm-mrv2", "vllm-v1")


def run_target(label, source, args) -> dict:
    out = os.path.join(args.out, label)
    cmd = [sys.executable, "-m", "harness", "run", "--profile", args.profile, "--device", args.device, "--out", out]
    cmd += ["--history", args.history, "--label", label, "--no-progress", "--seed", str(args.seed)]
    for b in args.backend or BACKENDS:
        cmd += ["--backend", b]
    for s in args.scenario or ():
        cmd += ["--scenario", s]
    env = dict(os.environ)
    if source != "installed":
        cmd += ["--vllm-src", source]
    else:
        env.pop("SPECDEC_VLLM_COMMIT", None)  # the commit names the source tree, not the release
        env.pop("SPECDEC_VLLM_SRC", None)
    proc = subprocess.run(cmd, cwd=ROOT, env=env)
    if proc.returncode == 2:
        return {"label": label, "status": "setup-error"}
    with open(os.path.join(out, "results.json")) as f:
        records = json.load(f)["records"]
    failed = [r for r in records if r["verdict"] == "fail" or (r["verdict"] == "error" and r["kind"] != "api-drift")]
    drift = [r for r in records if r["kind"] == "api-drift"]
    return {
        "label": label,
        "status": "regression" if failed else ("api-drift" if drift else "pass"),
        "failed": len(failed),
        "api_drift": len(drift),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", action="append", required=True, help="LABEL=PATH of a vLLM source tree, or LABEL=installed")
    ap.add_argument("--profile", default="gpu")
    ap.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--history", default="reports/history.sqlite")
    ap.add_argument("--start-from", help="a history to copy to --history when that does not exist yet")
    ap.add_argument("--out", default="reports/nightly")
    ap.add_argument("--backend", action="append", help="backends to verify (default: vllm-mrv2 and vllm-v1)")
    ap.add_argument("--scenario", action="append", help="restrict to these scenarios (default: the whole catalog)")
    args = ap.parse_args(argv)
    targets = []
    for t in args.target:
        label, sep, source = t.partition("=")
        if not sep or not label or not source:
            print(f"error: --target: expected LABEL=PATH or LABEL=installed, got {t!r}", file=sys.stderr)
            return 2
        targets.append((label, source))
    if args.start_from and not os.path.exists(args.history):
        if not os.path.isfile(args.start_from):
            print(f"error: --start-from {args.start_from}: no such file", file=sys.stderr)
            return 2
        os.makedirs(os.path.dirname(os.path.abspath(args.history)), exist_ok=True)
        shutil.copyfile(args.start_from, args.history)
    summary = [run_target(label, source, args) for label, source in targets]
    drift_page = os.path.join(args.out, "drift.html")
    subprocess.run([sys.executable, "-m", "harness", "report", "--history", args.history, "--out", drift_page], cwd=ROOT, check=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    for s in summary:
        print(f"{s['label']}: {s['status']}")
    statuses = {s["status"] for s in summary}
    if "setup-error" in statuses:
        return 2
    if "regression" in statuses:
        return 1
    return 3 if "api-drift" in statuses else 0


if __name__ == "__main__":
    sys.exit(main())

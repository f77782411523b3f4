"""The GitHub workflows lint clean, and the nightly script works end to end on the CPU."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from suites.helpers import python_only_tree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ACTIONLINT = shutil.which("actionlint", path=os.path.dirname(sys.executable)) or shutil.which("actionlint")


@pytest.mark.skipif(ACTIONLINT is None, reason="actionlint not installed (requirements-test.txt installs it)")
def test_workflows_lint_clean():
    workflows = [os.path.join(ROOT, ".github", "workflows", f) for f in ("nightly.yml", "pr.yml")]
    proc = subprocess.run([ACTIONLINT, *workflows], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def nightly(tmp_path, *args):
    cmd = [
        sys.executable,
        "scripts/nightly.py",
        "--profile",
        "smoke",
        "--device",
        "cpu",
        "--history",
        str(tmp_path / "h.sqlite"),
        "--out",
        str(tmp_path / "out"),
    ]
    return subprocess.run(cmd + list(args), cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_nightly_plumbing_and_exit_codes(tmp_path):
    """History restored across runs, drift page built, 0 on pass and 1 on a regression."""
    scen = ["--scenario", "standard-near-target", "--scenario", "block-fixed"]
    ok = nightly(tmp_path, "--target", "release=installed", "--backend", "reference", *scen)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = nightly(tmp_path, "--target", "main=installed", "--backend", "fault:bonus-wrong-row", *scen)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert (tmp_path / "out" / "drift.html").exists()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary == [{"label": "main", "status": "regression", "failed": summary[0]["failed"], "api_drift": 0}]
    assert nightly(tmp_path, "--target", "nolabel").returncode == 2


def test_nightly_extends_the_release_history(tmp_path):
    """--start-from seeds a missing history (the committed release sweep), which the run extends."""
    from harness.evidence.history import load

    scen = ["--scenario", "greedy-ties", "--backend", "reference"]
    seed = tmp_path / "seed"
    seed.mkdir()
    assert nightly(seed, "--target", "0.33.0=installed", *scen).returncode == 0
    assert nightly(tmp_path, "--target", "main=installed", "--start-from", str(tmp_path / "absent.sqlite"), *scen).returncode == 2
    assert nightly(tmp_path, "--target", "main=installed", "--start-from", str(seed / "h.sqlite"), *scen).returncode == 0
    assert [r["label"] for r in load(str(tmp_path / "h.sqlite"))[0]] == ["0.33.0", "main"]
    assert [r["label"] for r in load(str(seed / "h.sqlite"))[0]] == ["0.33.0"]  # the seed is copied, not written


def test_nightly_against_a_pinned_release_and_a_source_tree(tmp_path):
    """What the nightly workflow runs, end to end on the CPU: vLLM MRV2 from the installed
    release and from a python-only source tree, history, drift page."""
    from harness.backends.vllm import mrv2 as vllm_mrv2

    ok, why = vllm_mrv2.availability()
    if not ok:
        pytest.skip(f"vLLM not usable here: {why}")
    tree = python_only_tree(tmp_path / "vllm-tree")
    proc = nightly(
        tmp_path, "--target", "release=installed", "--target", f"main={tree}", "--backend", "vllm-mrv2", "--scenario", "greedy-ties"
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [s["status"] for s in summary] == ["pass", "pass"]
    main_env = json.loads((tmp_path / "out" / "main" / "results.json").read_text())["environment"]
    assert main_env["vllm_source"] == str(tree.resolve()) and main_env["vllm"]
    assert (tmp_path / "out" / "drift.html").exists()

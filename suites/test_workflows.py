"""The GitHub workflows lint clean, and the nightly script works end to end on the CPU."""

import json
import os
import shutil
import subprocess
import sys

import pytest

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

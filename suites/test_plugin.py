"""The installed pytest plugin (``harness.pytest_plugin``) from a user's folder outside the
checkout: one test per scenario and check with the CLI's verdicts and reproducers, ``-m
exact`` selects the exact checks, the seed is in the header, nothing verified fails."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def plugin_run(folder, *args):
    (folder / "mysampler.py").write_text("from reference.sampler import ReferenceSampler as Sampler\n")
    cmd = [sys.executable, "-m", "pytest", "-p", "harness.pytest_plugin", "-p", "no:cacheprovider", "--rootdir", str(folder), *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=600)


def test_a_users_sampler_gets_one_test_per_check(tmp_path):
    done = plugin_run(tmp_path, "--specdec-backend", "mysampler:Sampler", "--specdec-seed", "3")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "seed=3" in done.stdout
    passed = int(re.search(r"(\d+) passed", done.stdout).group(1))
    listed = subprocess.run(
        [sys.executable, "-m", "harness", "scenarios", "--profile", "smoke", "--seed", "3"], cwd=ROOT, capture_output=True, text=True
    )
    checks = sum(int(m) for m in re.findall(r"checks=(\d+)", listed.stdout))
    assert passed == checks + 1  # every check of the catalog, and the coverage test


def test_a_failing_check_fails_its_test_with_the_reproducer_and_marks_select(tmp_path):
    done = plugin_run(tmp_path, "--specdec-backend", "fault:bonus-wrong-row", "-m", "exact")
    assert done.returncode == 1
    assert "python -m harness run --backend fault:bonus-wrong-row --profile smoke --seed 0 --scenario" in done.stdout
    assert "deselected" in done.stdout and "[outcome-law] " in done.stdout


def test_no_backend_no_tests_and_a_bad_name_is_a_usage_error(tmp_path):
    assert "no --specdec-backend" in plugin_run(tmp_path).stdout
    bad = plugin_run(tmp_path, "--specdec-backend", "refrence")
    assert bad.returncode == 4 and "did you mean 'reference'" in bad.stderr

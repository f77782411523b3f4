"""The GitHub workflows lint clean, and the nightly script works end to end on the CPU."""

import importlib.util
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


# --- scripts/vllm_releases.py: every release in one run, a history run per release -------------
def _vllm_releases():
    spec = importlib.util.spec_from_file_location("vllm_releases", os.path.join(ROOT, "scripts", "vllm_releases.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree(folder, version):
    meta = folder / f"vllm-{version}.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (folder / "vllm").mkdir()
    (folder / "vllm" / "__init__.py").write_text("")
    return folder


def _record(backend, scenario, check, verdict, kind="gof"):
    return {"backend": backend, "scenario": scenario, "template": 0, "check": check, "verdict": verdict, "kind": kind,
            "message": "", "reproducer": f"python -m harness run --backend {backend}"}  # fmt: skip


def test_release_sweep_gives_a_history_run_and_a_row_per_release(tmp_path):
    from harness.evidence.history import append_run, load

    releases = _vllm_releases()
    old, main = _tree(tmp_path / "vllm-0.20.2", "0.20.2"), _tree(tmp_path / "vllm-main", "0.35.0.dev7+gabc1234")
    records = [
        _record(f"vllm-mrv2@{old}", "standard-near-target", "outcome-law", "pass"),
        _record(f"vllm-mrv2@{old}", "block-fixed", "outcome-law", "skipped"),
        _record(f"vllm-v1@{old}", "-", "load", "error", kind="api-drift"),
        _record(f"vllm-mrv2@{main}", "standard-near-target", "outcome-law", "fail"),
        _record("reference", "standard-near-target", "outcome-law", "pass"),  # not a release: left out
    ]
    doc = {"created": "2026-12-07T00:00:00+0000", "profile": {"name": "smoke"}, "seed": 0, "environment": {}, "records": records}
    per = releases.split_by_release(doc)
    assert {v: (label, len(sub["records"])) for v, (label, sub) in per.items()} == {
        "0.20.2": ("0.20.2", 3),
        "0.35.0.dev7+gabc1234": ("main", 1),
    }
    history = str(tmp_path / "h.sqlite")
    for label, sub in per.values():
        append_run(history, sub, label=label)
    assert sorted((r["label"], r["vllm_version"]) for r in load(history)[0]) == [("0.20.2", "0.20.2"), ("main", "0.35.0.dev7+gabc1234")]
    table = releases.releases_table(doc)
    assert [(r["version"], r["implementation"], r["status"], r["passed"], r["skipped"]) for r in table] == [
        ("0.20.2", "v1", "api-drift", 0, 0),
        ("0.20.2", "mrv2", "bound", 1, 1),
        ("0.35.0.dev7+gabc1234", "mrv2", "bound", 0, 0),
    ]
    assert table[2]["failed"] == [
        {"scenario": "standard-near-target[0]", "check": "outcome-law", "verdict": "fail", "reproducer": records[3]["reproducer"]}
    ]
    assert "**api-drift**" in releases.markdown(table)


def test_release_sweep_packs_trees_and_refuses_bad_input(tmp_path):
    import tarfile

    vendor = tmp_path / "vendor"
    _tree(vendor / "vllm-0.20.2", "0.20.2")
    (vendor / "vllm-0.20.2" / "vllm" / "__pycache__").mkdir()
    script = [sys.executable, "scripts/vllm_releases.py"]
    archive = tmp_path / "trees.tar.xz"
    packed = subprocess.run(script + ["prepare", "--releases", "0.20.2", "--vendor", str(vendor), "--pack", str(archive)], cwd=ROOT)
    assert packed.returncode == 0
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "vllm-0.20.2/vllm/__init__.py" in names and not any("__pycache__" in n for n in names)
    for bad in (
        ["prepare", "--releases", "0.20"],
        ["run", "--trees", str(tmp_path / "absent")],
        ["run", "--trees", str(vendor), "--implementations", "v2"],
        ["run", "--trees", str(vendor), "--releases", "0.21.0"],
        ["run", "--trees", str(vendor), "--group", "-1"],
        ["table", str(tmp_path / "absent.json")],
    ):
        proc = subprocess.run(script + bad, cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.startswith("error: "), (bad, proc.stderr)

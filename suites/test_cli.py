"""The main job end to end: exit codes, results.json, index.html, reproducers."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main

ROOT = Path(__file__).resolve().parent.parent
RECORD_FIELDS = {
    "backend",
    "scenario",
    "check",
    "verdict",
    "statistic",
    "p_value",
    "alpha",
    "trials",
    "detectable_tv",
    "tv_estimate",
    "tv_ci",
    "reproducer",
}


def test_run_writes_results_and_report(tmp_path, capsys):
    assert main(["run", "--profile", "smoke", "--out", str(tmp_path), "--no-progress"]) == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["counts"]["fail"] == 0 and doc["counts"]["pass"] > 100
    assert all(RECORD_FIELDS <= set(r) for r in doc["records"])
    timing = doc["timing"]  # where the wall time went, per stage and backend
    assert timing["planning_s"] > 0 and timing["evaluation_s"] > 0
    assert timing["backend_load_s"]["reference"] > 0 and timing["sampling_s"]["reference"] > 0
    html = (tmp_path / "index.html").read_text()
    assert html.startswith("<!doctype html>") and "<script src" not in html
    out = capsys.readouterr().out
    assert "reference" in out and "family-wise alpha" in out


def test_failing_backend_exits_1_and_its_reproducer_reproduces(tmp_path):
    assert main(["run", "--profile", "smoke", "--backend", "fault:residual-is-target", "--out", str(tmp_path), "--no-progress"]) == 1
    doc = json.loads((tmp_path / "results.json").read_text())
    failed = [r for r in doc["records"] if r["verdict"] == "fail"]
    assert failed
    first = failed[0]
    cmd = shlex.split(first["reproducer"])
    assert cmd[:4] == ["python", "-m", "harness", "run"]
    again = tmp_path / "again"
    proc = subprocess.run(
        [sys.executable, *cmd[1:], "--out", str(again), "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 1, proc.stderr
    redo = json.loads((again / "results.json").read_text())["records"]
    same = [r for r in redo if (r["scenario"], r["template"], r["check"]) == (first["scenario"], first["template"], first["check"])]
    assert same and same[0]["verdict"] == "fail" and same[0]["statistic"] == first["statistic"]


def test_scenario_json_files_replay(tmp_path):
    assert main(["run", "--profile", "smoke", "--scenario", "block-fixed", "--out", str(tmp_path), "--no-progress"]) == 0
    saved = tmp_path / "scenarios" / "block-fixed.json"
    assert main(["run", "--profile", "smoke", "--scenario", str(saved), "--out", str(tmp_path / "b"), "--no-progress"]) == 0
    a = json.loads((tmp_path / "results.json").read_text())["records"]
    b = json.loads((tmp_path / "b" / "results.json").read_text())["records"]
    assert [r["statistic"] for r in a] == [r["statistic"] for r in b]
    assert str(saved) in b[0]["reproducer"]


def test_third_party_backend_by_dotted_path(tmp_path):
    """Users verify their own kernels this way; any class with sample(batch) works."""
    assert (
        main(["run", "--profile", "smoke", "--backend", "reference.sampler:ReferenceSampler", "--out", str(tmp_path), "--no-progress"]) == 0
    )


def test_unloadable_backend_is_its_own_verdict_and_the_run_continues(tmp_path):
    assert (
        main(
            [
                "run",
                "--profile",
                "smoke",
                "--backend",
                "nope_mod:X",
                "--backend",
                "reference",
                "--scenario",
                "greedy-ties",
                "--out",
                str(tmp_path),
                "--no-progress",
            ]
        )
        == 1
    )
    records = json.loads((tmp_path / "results.json").read_text())["records"]
    assert {r["verdict"] for r in records if r["backend"] == "nope_mod:X"} == {"error"}
    assert {r["verdict"] for r in records if r["backend"] == "reference"} == {"pass"}


def test_backends_and_scenarios_listings(capsys):
    assert main(["backends"]) == 0
    assert "fault:reuse-uniform" in capsys.readouterr().out
    assert main(["scenarios", "--profile", "smoke"]) == 0
    assert "standard-large-vocab" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args,needle", [(["--df", "9", "--tv", "0.01"], "180169 trials"), (["--df", "9", "--trials", "180169"], "TV >= 0.00999998")]
)
def test_power_calculator_cli(args, needle, capsys):
    assert main(["power", *args]) == 0
    assert needle in capsys.readouterr().out


def test_html_escapes_backend_names_and_messages():
    from harness.report.outputs import render_html

    evil = "<script>alert(1)</script>"
    rec = dict.fromkeys(RECORD_FIELDS | {"template", "kind", "df", "holm_threshold", "message", "cells"}, None)
    rec.update(
        backend=evil,
        scenario=evil,
        check="c",
        verdict="fail",
        template=0,
        trials=1,
        message=evil,
        reproducer=evil,
        cells=[(evil, 1.0, 2.0)],
    )
    doc = {
        "records": [rec],
        "counts": {"fail": 1},
        "profile": {"name": evil, "alpha": 1e-6, "tv": 0.1, "power": 0.99},
        "family_alpha": 1e-6,
        "seed": 0,
        "environment": {"x": evil},
    }
    html = render_html(doc)
    assert evil not in html and "\\u003cscript\\u003e" in html  # JSON-escaped; the browser test checks it renders as text

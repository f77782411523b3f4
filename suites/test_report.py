"""Reports: rendered in a real headless Chromium, history that survives kills and says
what is wrong with a corrupt file, the drift page, and markup injection."""

import json
import os
import sqlite3

import pytest

from harness.cli import main
from harness.evidence.history import HistoryError, append_run, load
from harness.report.drift import analyse
from harness.report.outputs import write_outputs
from harness.run.runner import run
from harness.scenarios.catalog import catalog
from harness.scenarios.profiles import get_profile
from suites.browser import launch, open_page, unavailable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCREENSHOTS = os.path.join(ROOT, "reports", "screenshots")
EVIL = "<img src=x onerror=window.__pwned=1><script>window.__pwned=2</script>"
_NO_BROWSER = unavailable()
needs_browser = pytest.mark.skipif(_NO_BROWSER is not None, reason=_NO_BROWSER or "")


@pytest.fixture(scope="module")
def run_doc(tmp_path_factory):
    """A run with a passing backend, a failing one, and an unloadable one whose name is markup."""
    profile = get_profile("smoke")
    scenarios = [s for s in catalog(profile) if s.name in ("standard-near-target", "synthetic-rates", "block-fixed")]
    result = run(["reference", "fault:bonus-wrong-row", EVIL], scenarios, profile)
    out = tmp_path_factory.mktemp("report")
    return write_outputs(result, str(out), argv=["python", "-m", "harness", "run"])


@pytest.fixture(scope="module")
def browser():
    """One Chromium for the module; each test opens its own page (a fresh context)."""
    with launch() as b:
        yield b


@needs_browser
def test_run_report_renders_without_errors(run_doc, browser):
    with open_page(browser, run_doc["report"]) as (page, errors):
        assert page.evaluate("document.querySelectorAll('table tr').length") > 20
        opened = page.evaluate(
            "(async () => { for (const d of document.querySelectorAll('details')) d.open = true;"
            " await new Promise(r => setTimeout(r, 1500)); return document.querySelectorAll('.js-plotly-plot .main-svg').length; })()"
        )
        assert opened >= 6, f"only {opened} chart layers rendered"
        assert page.evaluate("document.querySelectorAll('.js-plotly-plot .point, .js-plotly-plot path.point').length") > 0
        # Filtering by verdict leaves only failing rows.
        shown = page.evaluate(
            "(() => { const s = document.getElementById('filter-verdict'); s.value = 'fail'; s.dispatchEvent(new Event('change'));"
            " return [...document.querySelectorAll('td.verdict')].map(td => td.textContent); })()"
        )
        assert shown and set(shown) == {"fail"}
        os.makedirs(SCREENSHOTS, exist_ok=True)
        page.screenshot(path=os.path.join(SCREENSHOTS, "run-report.png"), full_page=True)
        assert errors == []


@needs_browser
def test_injected_markup_is_shown_as_text_not_run(run_doc, browser):
    with open_page(browser, run_doc["report"]) as (page, errors):
        assert page.evaluate("window.__pwned === undefined")
        assert page.evaluate(f"document.body.textContent.includes({json.dumps(EVIL)})")
        assert page.evaluate("document.querySelectorAll('body img').length") == 0
        with open(run_doc["report"]) as f:
            text = f.read()
        assert EVIL not in text and "</script><script>window.__pwned" not in text
        assert errors == []


def test_report_is_self_contained(run_doc):
    with open(run_doc["report"]) as f:
        text = f.read()
    assert "<script src" not in text and "https://" not in text.split("<script id='data'")[1][:200]
    assert "cdn." not in text.lower().split("plotly.js")[0][:1000]


def test_history_appends_and_never_rewrites(run_doc, tmp_path):
    path = str(tmp_path / "history.sqlite")
    first = append_run(path, run_doc["document"], "first")
    second = append_run(path, run_doc["document"], "second")
    runs, records = load(path)
    assert [r["id"] for r in runs] == [first, second]
    assert len(records) == 2 * len(run_doc["document"]["records"])


def test_a_run_killed_midway_leaves_earlier_runs_intact(run_doc, tmp_path):
    path = str(tmp_path / "history.sqlite")
    append_run(path, run_doc["document"], "kept")
    broken = dict(run_doc["document"], records=run_doc["document"]["records"] + [{"backend": "x"}])  # fails mid-insert
    with pytest.raises(HistoryError, match="could not append"):
        append_run(path, broken, "killed")
    runs, records = load(path)
    assert [r["label"] for r in runs] == ["kept"] and len(records) == len(run_doc["document"]["records"])


@pytest.mark.parametrize("content", [b"not a database at all", b"SQLite format 3\x00" + b"\x00" * 200])
def test_corrupt_history_is_a_clear_error(tmp_path, content, capsys):
    path = tmp_path / "history.sqlite"
    path.write_bytes(content)
    with pytest.raises(HistoryError, match=str(path)):
        load(str(path))
    assert main(["report", "--history", str(path), "--out", str(tmp_path / "drift.html")]) == 2
    assert str(path) in capsys.readouterr().err
    assert not (tmp_path / "drift.html").exists()


def test_a_foreign_sqlite_file_is_named(tmp_path):
    path = tmp_path / "other.sqlite"
    sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(HistoryError, match="not a run history"):
        load(str(path))


def test_drift_flags_shifts_regressions_and_api_drift():
    runs = [
        {"id": i, "created": "", "label": None, "profile": "ci", "seed": 0, "vllm_version": v, "vllm_commit": None, "environment": {}}
        for i, v in ((1, "0.19.1"), (2, "0.33.0"))
    ]
    base = {
        "backend": "vllm-mrv2",
        "scenario": "s",
        "template": 0,
        "check": "outcome-law",
        "kind": "gof",
        "p_value": 0.5,
        "alpha": 1e-6,
        "trials": 10,
        "detectable_tv": 0.02,
        "message": "",
        "reproducer": "cmd",
    }
    records = [
        dict(base, run_id=1, verdict="pass", tv_estimate=0.01, tv_ci=[0.005, 0.015]),
        dict(base, run_id=2, verdict="fail", tv_estimate=0.08, tv_ci=[0.07, 0.09]),
        dict(
            base,
            run_id=2,
            check="load",
            verdict="error",
            kind="api-drift",
            tv_estimate=None,
            tv_ci=None,
            message="vLLM API changed: rejection_sample lost 'pos'",
        ),
    ]
    data = analyse(runs, records)
    assert len(data["shifts"]) == 1 and len(data["regressions"]) == 1
    assert data["api_drift"] == [{"run": 2, "backend": "vllm-mrv2", "message": "vLLM API changed: rejection_sample lost 'pos'"}]


@needs_browser
def test_drift_page_renders(run_doc, tmp_path, browser):
    path = str(tmp_path / "history.sqlite")
    for label in ("a", "b", "c"):
        append_run(path, run_doc["document"], label)
    out = str(tmp_path / "drift.html")
    assert main(["report", "--history", path, "--out", out]) == 0
    with open_page(browser, out) as (page, errors):
        page.wait_for_selector(".js-plotly-plot .main-svg")  # drawn once the matrix has painted
        assert page.locator("#matrix tr.row").count() > 10
        assert page.evaluate(f"document.getElementById('matrix').textContent.includes({json.dumps(EVIL)})")
        page.click("#matrix tr.row td.c.fail")  # its detail panel, markup shown as text
        assert page.locator("#detail").is_visible()
        assert page.evaluate("window.__pwned === undefined")
        os.makedirs(SCREENSHOTS, exist_ok=True)
        page.screenshot(path=os.path.join(SCREENSHOTS, "drift.png"), full_page=True)
        assert errors == []

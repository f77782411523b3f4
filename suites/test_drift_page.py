"""The drift page's release matrix: ``analyse`` on a small synthetic history of vLLM releases
(ordering by version with a dev build, the latest run per release, first changes, api-drift
cells), and the page in a real headless Chromium (the matrix, a failing cell's detail panel,
the filters, no console errors, speed on ~15 releases x ~500 rows)."""

import importlib.util
import os

import pytest

from harness.cli import main
from harness.evidence.history import append_run, load
from harness.report.drift import analyse, release_of
from suites.browser import launch, open_page, unavailable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NO_BROWSER = unavailable()
needs_browser = pytest.mark.skipif(_NO_BROWSER is not None, reason=_NO_BROWSER or "")
DEV = "0.34.0.dev57+gabc1234"
# The columns the history below gives, in order: releases by version (not by run or text
# order), main (a dev version) after the last release, then unversioned labels in run order.
COLUMNS = ["0.19.1", "0.20.0", "0.27.1", "0.33.0", "main", "zeta-build", "alpha-build"]
CELLS = [["n=1,y=2", 9000.0, 12000.5], ["n=1,y=4", 0.0, 4000.25], ["all 20 other cells", 3000.0, 2000.0]]


def _record(backend, scenario, check, verdict, *, template=0, kind="gof", tv=0.004, message="", cells=None):
    statistical = kind == "gof"
    return {
        "backend": backend,
        "scenario": scenario,
        "template": template,
        "check": check,
        "verdict": verdict,
        "kind": kind,
        "message": message or (f"X2={'12.5' if verdict == 'pass' else '9123.4'} df=3 p={'0.4' if verdict == 'pass' else '0'}"),
        "reproducer": f"python -m harness run --backend {backend} --profile gpu --seed 0 --scenario {scenario}",
        "method": "standard",
        "statistic": (12.5 if verdict == "pass" else 9123.4) if statistical else None,
        "df": 3 if statistical else None,
        "p_value": (0.4 if verdict == "pass" else 0.0) if statistical else None,
        "alpha": 1e-6 if statistical else 0.0,
        "holm_threshold": 1e-6 if statistical else None,
        "trials": 5000,
        "detectable_tv": 0.02 if statistical else None,
        "tv_estimate": tv if statistical else None,
        "tv_ci": [tv / 2, tv * 1.5] if statistical else None,
        "cells": cells,
    }


def _backend(impl, release, plain=False):
    return impl if plain else f"{impl}@vendor/vllm-{release}"


def _checks(impl, release, *, position="pass", outcome="pass", plain=False):
    """Three rows: standard[0] structure and outcome-law, engine-drafted[0] position-law."""
    b = _backend(impl, release, plain)
    return [
        _record(b, "standard", "structure", "pass", kind="exact", message="every trial well-formed"),
        _record(b, "standard", "outcome-law", outcome, tv=0.004 if outcome == "pass" else 0.31, cells=CELLS),
        _record(b, "engine-drafted", "position-law", position, tv=0.003 if position == "pass" else 0.12, cells=CELLS),
    ]


def _drift_load(impl, release):
    b = _backend(impl, release)
    msg = f"vLLM API changed: {impl} found no known contract in vLLM {release}"
    return [dict(_record(b, "-", "load", "error", template=-1, kind="api-drift", message=msg), reproducer="")]


def _doc(version, records, day):
    return {
        "created": f"2026-05-{day:02d}T03:00:00+0000",
        "command": "synthetic",
        "profile": {"name": "gpu"},
        "seed": 0,
        "environment": {"vllm": version, "vllm_commit": "abc1234" if version == DEV else None},
        "records": records,
    }


def build_history(path: str) -> None:
    """A sweep appended out of release order, with an api-drift release, a release run twice,
    a verdict change per implementation, a dev build of main and two unversioned runs."""
    m, v = "vllm-mrv2", "vllm-v1"
    sample_drift = _record(_backend(v, "0.27.1"), "engine-drafted", "sample", "error", template=-1, kind="api-drift")
    sample_drift["message"] = "vLLM API changed: the drafter's gumbel_sample takes no 'pos'"
    plan = [
        ("zeta-build", None, _checks(v, "zeta")),
        ("0.33.0", "0.33.0", _checks(m, "0.33.0", plain=True) + _checks(v, "0.33.0", outcome="fail")),
        ("0.19.1", "0.19.1", _drift_load(m, "0.19.1") + _checks(v, "0.19.1")),
        ("0.27.1", "0.27.1", _checks(m, "0.27.1", position="error") + _checks(v, "0.27.1")),  # superseded below
        ("main", DEV, _checks(m, "main") + _checks(v, "main", outcome="fail")),
        ("0.20.0", "0.20.0", _checks(m, "0.20.0", position="fail") + _checks(v, "0.20.0")),
        ("0.27.1", "0.27.1", _checks(m, "0.27.1", position="fail") + _checks(v, "0.27.1")[:2] + [sample_drift]),
        ("alpha-build", None, _checks(v, "alpha")),
    ]
    for day, (label, version, records) in enumerate(plan, 1):
        append_run(path, _doc(version, records, day), label)


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("drift") / "history.sqlite")
    build_history(path)
    return path


@pytest.fixture(scope="module")
def data(history):
    return analyse(*load(history))


def _row(data, impl, scenario, check):
    rows = [r for r in data["matrix"]["rows"] if (r["impl"], r["scenario"], r["check"]) == (impl, scenario, check)]
    assert len(rows) == 1, rows
    return rows[0]


def _states(data, row):
    return [c and (c["s"], data["records"][c["r"]]["run_id"]) for c in row["cells"]]


def test_release_of_orders_and_groups_runs():
    assert release_of({"vllm_version": "0.27.1", "label": "0.27.1"})[0] == "0.27.1"
    assert release_of({"vllm_version": "0.33.0", "label": "release"})[0] == "0.33.0"  # the nightly's release run
    assert release_of({"vllm_version": DEV, "label": "main"})[0] == "main"  # every main build: one column
    assert release_of({"vllm_version": DEV, "label": None})[0] == DEV
    assert release_of({"vllm_version": None, "label": "0.20.0"})[1] is not None
    assert release_of({"vllm_version": "weird build", "label": None}) == ("weird build", None)


def test_matrix_orders_releases_by_version(data):
    releases = data["matrix"]["releases"]
    assert [r["key"] for r in releases] == COLUMNS
    assert releases[4]["version"] == DEV and releases[4]["parsed"]
    assert [r["parsed"] for r in releases[5:]] == [False, False]
    assert releases[2]["runs"] == [4, 7]  # 0.27.1 was run twice
    assert data["matrix"]["implementations"] == ["vllm-mrv2", "vllm-v1"]
    # Rows grouped by implementation, then scenario; checks in the order the runs wrote them.
    keys = [(r["impl"], r["scenario"], r["check"]) for r in data["matrix"]["rows"]]
    assert keys == [
        ("vllm-mrv2", "engine-drafted", "position-law"),
        ("vllm-mrv2", "standard", "structure"),
        ("vllm-mrv2", "standard", "outcome-law"),
        ("vllm-v1", "engine-drafted", "position-law"),
        ("vllm-v1", "standard", "structure"),
        ("vllm-v1", "standard", "outcome-law"),
    ]


def test_matrix_shows_the_latest_run_per_release(data):
    row = _row(data, "vllm-mrv2", "engine-drafted", "position-law")
    # 0.27.1: the later run's fail, not the earlier run's error; the plain backend name of 0.33.0 is the same implementation.
    assert _states(data, row) == [("drift", 3), ("fail", 6), ("fail", 7), ("pass", 2), ("pass", 5), None, None]
    summary = data["matrix"]["summary"]["vllm-mrv2"]["releases"]
    assert summary[2]["run"] == 7 and summary[2]["runs"] == 2
    assert summary[2]["counts"] == {"pass": 2, "fail": 1, "error": 0, "skipped": 0, "drift": 0}
    assert summary[5] == {"state": "absent"}


def test_first_change_skips_drift_and_missing_releases(data):
    fixed = _row(data, "vllm-mrv2", "engine-drafted", "position-law")
    assert fixed["changes"] == [{"at": 3, "from": "fail", "to": "pass"}] and fixed["first_change"] == 3
    assert fixed["failing"] and fixed["drift"]
    broke = _row(data, "vllm-v1", "standard", "outcome-law")
    assert broke["changes"] == [{"at": 3, "from": "pass", "to": "fail"}, {"at": 5, "from": "fail", "to": "pass"}]
    assert broke["first_change"] == 3
    steady = _row(data, "vllm-v1", "standard", "structure")
    assert steady["changes"] == [] and steady["first_change"] is None and not steady["failing"]


def test_a_declined_release_is_no_change(tmp_path):
    """A release that declines a scenario (skipped) sits between two verdicts: pass, skipped,
    fail is one change, at the fail; pass, skipped, pass is none."""
    path = str(tmp_path / "h.sqlite")
    for day, (release, first, second) in enumerate(
        [("0.19.1", "pass", "pass"), ("0.20.2", "skipped", "skipped"), ("0.21.0", "fail", "pass")], 1
    ):
        b = _backend("vllm-mrv2", release)
        append_run(path, _doc(release, [_record(b, "a", "outcome-law", first), _record(b, "b", "outcome-law", second)], day), release)
    data = analyse(*load(path))
    assert _row(data, "vllm-mrv2", "a", "outcome-law")["changes"] == [{"at": 2, "from": "pass", "to": "fail"}]
    assert _row(data, "vllm-mrv2", "b", "outcome-law")["changes"] == []


def test_drift_cells_cover_what_could_not_bind(data):
    m = data["matrix"]
    for row in (r for r in m["rows"] if r["impl"] == "vllm-mrv2"):
        cell = row["cells"][0]  # 0.19.1: the adapter could not bind; one record covers every row
        assert cell["s"] == "drift" and cell["w"] == "backend"
        assert data["records"][cell["r"]]["message"].startswith("vLLM API changed")
    assert m["summary"]["vllm-mrv2"]["releases"][0]["state"] == "drift"
    assert m["summary"]["vllm-mrv2"]["drift_releases"] == ["0.19.1"]
    assert (m["summary"]["vllm-mrv2"]["bound"], m["summary"]["vllm-v1"]["bound"]) == (4, 7)
    # A scenario that could not be sampled: its rows only, the release still bound.
    v1 = _row(data, "vllm-v1", "engine-drafted", "position-law")
    assert v1["cells"][2]["s"] == "drift" and v1["cells"][2]["w"] == "scenario" and v1["changes"] == []
    assert _row(data, "vllm-v1", "standard", "outcome-law")["cells"][2]["s"] == "pass"
    assert m["summary"]["vllm-v1"]["releases"][2]["state"] == "bound"
    assert m["summary"]["vllm-v1"]["releases"][2]["counts"]["drift"] == 1
    assert {(a["run"], a["backend"]) for a in data["api_drift"]} == {(3, "vllm-mrv2@vendor/vllm-0.19.1"), (7, "vllm-v1@vendor/vllm-0.27.1")}


def test_records_are_embedded_once_with_details_where_shown(history, data):
    # The matrix and the series name records by index; the matrix's records carry details.
    _, records = load(history)
    assert len(data["records"]) == len(records)
    assert sorted(i for points in data["series"].values() for i in points) == list(range(len(records)))
    shown = {c["r"] for row in data["matrix"]["rows"] for c in row["cells"] if c}
    assert all("reproducer" in data["records"][i] and "cells" in data["records"][i] for i in shown)
    superseded = next(i for i, r in enumerate(data["records"]) if r["run_id"] == 4)
    assert superseded not in shown and "reproducer" not in data["records"][superseded]  # in the series only
    assert "reproducer" in data["records"][-1]  # the latest run's, for its failures


def test_an_empty_matrix_and_a_history_without_vllm():
    runs = [{"id": 1, "created": "", "label": None, "profile": "ci", "seed": 0, "vllm_version": None, "vllm_commit": None}]
    rec = dict(_record("reference", "s", "outcome-law", "pass"), run_id=1, statistic=float("inf"))
    data = analyse(runs, [rec])
    assert [r["key"] for r in data["matrix"]["releases"]] == ["(no vLLM version)"]
    assert data["records"][0]["statistic"] == "inf"  # JSON has no infinity
    assert analyse([], [])["matrix"] == {"releases": [], "implementations": [], "summary": {}, "rows": []}


# In Chromium.


@pytest.fixture(scope="module")
def page_path(history, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("drift-page") / "drift.html")
    assert main(["report", "--history", history, "--out", out]) == 0
    return out


@pytest.fixture(scope="module")
def browser():
    with launch() as b:
        yield b


def _row_index(data, impl, scenario, check):
    return data["matrix"]["rows"].index(_row(data, impl, scenario, check))


@needs_browser
def test_matrix_renders(page_path, data, browser):
    with open_page(browser, page_path) as (page, errors):
        heads = page.eval_on_selector_all("#matrix thead th.rel", "ths => ths.map(th => th.firstChild.textContent)")
        assert heads == COLUMNS
        assert page.locator("#matrix tr.row").count() == len(data["matrix"]["rows"])
        assert page.locator("#matrix tr.group").count() == 2
        drift = page.eval_on_selector_all("#matrix tr.row td.c.drift", "tds => tds.map(td => td.textContent)")
        assert drift == ["drift"] * 4  # three mrv2 rows at 0.19.1, one v1 scenario at 0.27.1
        i = _row_index(data, "vllm-v1", "standard", "outcome-law")
        first = page.locator(f"#matrix tr.row[data-i='{i}'] td.c.first")
        assert first.count() == 1 and first.get_attribute("data-j") == "3" and "fail" in first.get_attribute("class")
        assert page.locator(f"#matrix tr.row[data-i='{i}'] td.c.change").count() == 1  # back to pass at zeta-build
        # Not colour only: every verdict cell carries a symbol or a word.
        texts = page.eval_on_selector_all("#matrix td.c:not(.none)", "tds => tds.map(td => td.textContent.trim())")
        assert texts and all(t[0] in "✓✗!–" or t == "drift" for t in texts)
        summary = page.text_content("#release-summary")
        assert "not bound" in summary and "0.19.1" in summary
        page.hover(f"#matrix tr.row[data-i='{i}'] td.c[data-j='3']")
        title = page.get_attribute(f"#matrix tr.row[data-i='{i}'] td.c[data-j='3']", "title")
        assert "TV 0.31" in title and "detectable TV 0.02" in title and "first change: pass → fail" in title
        page.wait_for_selector("#series-over-runs ~ .charts .js-plotly-plot .main-svg")  # the sections over runs still render
        assert page.locator("#api-drift").count() == 1
        assert errors == []


@needs_browser
def test_clicking_a_failing_cell_shows_its_record(page_path, data, browser):
    i = _row_index(data, "vllm-v1", "standard", "outcome-law")
    with open_page(browser, page_path) as (page, errors):
        assert page.locator("#detail").is_hidden()
        page.click(f"#matrix tr.row[data-i='{i}'] td.c[data-j='3']")
        panel = page.locator("#detail")
        assert panel.is_visible()
        text = panel.text_content()
        assert "vllm-v1 · standard[0] outcome-law @ 0.33.0" in text and "Verdict changed here: pass → fail" in text
        cells = page.eval_on_selector_all(
            "#detail table.cells tr", "trs => trs.slice(1).map(tr => [...tr.cells].map(td => td.textContent))"
        )
        assert cells == [["n=1,y=2", "9000", "12000.5"], ["n=1,y=4", "0", "4000.25"], ["all 20 other cells", "3000", "2000"]]
        stats = dict(
            page.eval_on_selector_all("#detail table.stats tr", "trs => trs.map(tr => [tr.cells[0].textContent, tr.cells[1].textContent])")
        )
        assert stats["df"] == "3" and stats["p-value"] == "0" and stats["Holm threshold"] == "0.000001000" and stats["trials"] == "5000"
        repro = page.locator("#detail pre.repro")
        expected = "python -m harness run --backend vllm-v1@vendor/vllm-0.33.0 --profile gpu --seed 0 --scenario standard"
        assert repro.text_content() == expected
        assert repro.evaluate("e => getComputedStyle(e).userSelect") in ("all", "text", "auto")
        page.click("#detail h4 button")  # "select": the reproducer is selected, ready to copy
        assert page.evaluate("window.getSelection().toString()") == expected
        # A cell covered by the release's load error shows that record.
        page.click(f"#matrix tr.row[data-i='{i - 3}'] td.c[data-j='0']")
        assert "could not load for 0.19.1" in panel.text_content() and "vLLM API changed" in panel.text_content()
        page.keyboard.press("Escape")
        assert panel.is_hidden()
        page.click("#release-summary tr[data-impl='vllm-mrv2'] td.unbound")  # the summary's "not bound" names why
        assert "vllm-mrv2: could not bind" in panel.text_content() and "no known contract in vLLM 0.19.1" in panel.text_content()
        assert errors == []


@needs_browser
def test_filters_leave_failures_and_changes(page_path, data, browser):
    rows = data["matrix"]["rows"]
    with open_page(browser, page_path) as (page, errors):
        visible = "() => [...document.querySelectorAll('#matrix tr.row')].filter(tr => !tr.hidden).map(tr => Number(tr.dataset.i))"
        assert page.evaluate(visible) == list(range(len(rows)))
        page.check("#only-interesting")
        shown = page.evaluate(visible)
        assert shown == [i for i, r in enumerate(rows) if r["failing"] or r["changes"]]
        passing = _row_index(data, "vllm-v1", "standard", "structure")
        assert passing not in shown and _row_index(data, "vllm-v1", "standard", "outcome-law") in shown
        assert page.text_content("#matrix-count") == f"{len(shown)} of {len(rows)} rows shown"
        page.uncheck("#only-interesting")
        page.fill("#matrix-filter", "position")
        assert [rows[i]["check"] for i in page.evaluate(visible)] == ["position-law", "position-law"]
        page.fill("#matrix-filter", "engine outcome")  # every word must match
        assert page.evaluate(visible) == []
        assert page.locator("#matrix tr.group:not([hidden])").count() == 0
        page.fill("#matrix-filter", "")
        page.select_option("#matrix-impl", "vllm-v1")
        assert {rows[i]["impl"] for i in page.evaluate(visible)} == {"vllm-v1"}
        assert errors == []


def _script():
    spec = importlib.util.spec_from_file_location("screenshot_drift", os.path.join(ROOT, "scripts", "screenshot_drift.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_browser
@pytest.mark.slow
def test_a_release_sweep_page_renders_and_filters(tmp_path, browser):
    """15 releases and main x 2 implementations x 239 rows (the realistic synthetic history
    of scripts/screenshot_drift.py): every row rendered, the filter leaves the few failing or
    changing ones, a failing cell opens its table. (Page speed is not a test's business.)"""
    history = str(tmp_path / "synthetic-release-sweep.sqlite")
    _script().synthetic_history(history)
    out = str(tmp_path / "drift.html")
    assert main(["report", "--history", history, "--out", out]) == 0
    with open(out) as f:
        assert f.read().count("<script id='data'") == 1
    with open_page(browser, out) as (page, errors):
        assert page.locator("#matrix tr.row").count() == 478 and page.locator("#matrix thead th.rel").count() == 16
        page.evaluate(
            "(() => { const c = document.getElementById('only-interesting'); c.checked = true; c.dispatchEvent(new Event('change')); })()"
        )
        assert 0 < page.locator("#matrix tr.row:not([hidden])").count() < 50
        page.click("#matrix tr.row:not([hidden]) td.c.fail")
        assert page.locator("#detail table.cells").is_visible()
        assert errors == []


@needs_browser
def test_the_screenshot_script(history, tmp_path, browser):
    info = _script().shoot(history, str(tmp_path / "drift.png"), width=1400, height=900, browser=browser)
    assert info["errors"] == [] and info["shown"] == "2 of 6 rows shown"  # the failures-and-changes filter on
    with open(tmp_path / "drift.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"

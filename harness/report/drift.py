"""The drift page: trends across runs and vLLM releases, read from a history.

Two views of one history, both computed here (the page only renders what ``analyse``
returns; it computes no statistic):

* The **release matrix**: one column per vLLM release (``runs.vllm_version``, ordered by
  ``packaging.version.Version``; builds of a source tree, whose version is a dev or local
  version such as ``0.34.0.dev57+gabc1234``, share one column per run label, e.g. "main";
  runs with no parsable version after the releases, in run order), one row per
  implementation x scenario[template] x check, where the implementation is the backend's
  name before '@' (``vllm-mrv2@vendor/vllm-0.27.1`` is ``vllm-mrv2``). Each cell is the
  record of the *latest* run of that release that verified that implementation. A release
  the adapter could not bind to (an ``api-drift`` record for the whole backend, or for a
  scenario) gives every row it covers a drift cell. A row's *changes* are the releases whose
  verdict differs from the verdict of the nearest earlier release that has one (drift and
  skipped cells and releases without a record are passed over: they say nothing of the
  distribution); the first is highlighted.
* The **series over runs**: for each (backend, scenario, template, check) the TV estimates
  (with their 95% intervals), p-values and verdicts in run order. A *shift* is flagged
  between consecutive runs whose TV intervals do not overlap. API-drift verdicts (an adapter
  that could not bind to the vLLM it found) are listed apart from distribution regressions
  (checks that fail now and passed in the previous run of the same backend).

Every record appears once in the page's data (``records``); the matrix and the series name
records by their index there. Records shown in the matrix (and the latest run's) carry
their details: message, statistic, df, alpha, Holm threshold, trials, the pooled cells and
the reproducer.
"""

import math

from packaging.version import InvalidVersion, Version

from harness.evidence.history import load
from harness.evidence.records import Verdict
from harness.report.html import page

DRIFT = "drift"  # a cell whose record is an api-drift error: the adapter could not bind
_SUMMARY_FIELDS = ("run_id", "verdict", "kind", "tv_estimate", "tv_ci", "p_value", "detectable_tv")
_DETAIL_FIELDS = (
    "backend", "scenario", "template", "check", "method", "message", "reproducer", "statistic", "df",
    "alpha", "holm_threshold", "trials", "cells",
)  # fmt: skip
UNVERSIONED = "(no vLLM version)"


def implementation(backend: str) -> str:
    """The implementation a backend name verifies: ``vllm-mrv2@vendor/vllm-0.27.1`` -> ``vllm-mrv2``."""
    return str(backend).partition("@")[0]


def series_key(r: dict) -> str:
    return f"{r['backend']} | {r['scenario']}[{r['template']}] {r['check']}"


def state(r: dict) -> str:
    """What a matrix cell shows: the verdict, or ``drift`` for an api-drift record."""
    if r.get("kind") == "api-drift":
        return DRIFT
    return r.get("verdict") or "error"  # a statistical check the family rule never decided


def _parse(text) -> Version | None:
    if not text:
        return None
    try:
        return Version(str(text))
    except InvalidVersion:
        return None


def release_of(run: dict) -> tuple[str, Version | None]:
    """The matrix column of a run and its version (None: not a version). A release's runs
    share its version; builds of a source tree (a dev or local version) share their label."""
    version, label = run.get("vllm_version"), run.get("label")
    parsed = _parse(version)
    if parsed is not None:
        if label and (parsed.is_devrelease or parsed.local is not None):
            return str(label), parsed
        return str(version), parsed
    if label:
        return str(label), _parse(label)
    return (str(version) if version else UNVERSIONED), None


def _scope(r: dict) -> str | None:
    """Which rows a record covers beyond its own: ``backend`` (the backend could not load:
    scenario "-"), ``scenario`` (a whole-scenario error: template -1), or None."""
    if r["scenario"] == "-":
        return "backend"
    if r["template"] is not None and r["template"] < 0:
        return "scenario"
    return None


def _clean(x):
    """A value as the page's JSON holds it: finite numbers (whole ones as integers, others
    to 6 significant digits), infinities as text, NaN as null."""
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if isinstance(x, float):
        if math.isnan(x):
            return None
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        if x.is_integer() and abs(x) < 2**53:
            return int(x)
        return float(f"{x:.6g}")
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    return str(x)


def release_matrix(runs: list[dict], records: list[dict], index: dict[int, int]) -> dict:
    """The release matrix (module docstring); ``index`` maps ``id(record)`` to its index in
    the page's records."""
    # Columns: one per release, runs in run order.
    columns: dict[str, dict] = {}
    for run in sorted(runs, key=lambda r: r["id"]):
        key, version = release_of(run)
        col = columns.setdefault(key, {"key": key, "runs": [], "version": None, "parsed": None, "first": run["id"]})
        col["runs"].append(run["id"])
        if version is not None:  # the column sorts by its latest run's version
            col["version"], col["parsed"] = run.get("vllm_version") or key, version
    ordered = sorted(
        columns.values(),
        key=lambda c: (0, c["parsed"], c["first"]) if c["parsed"] is not None else (1, Version("0"), c["first"]),
    )
    col_of_run = {run_id: j for j, c in enumerate(ordered) for run_id in c["runs"]}

    # The latest run of each (release, implementation), and its records.
    by_run_impl: dict[tuple[int, str], list[dict]] = {}
    for r in records:
        by_run_impl.setdefault((r["run_id"], implementation(r["backend"])), []).append(r)
    chosen: dict[tuple[str, int], int] = {}  # (impl, column) -> run id
    run_count: dict[tuple[str, int], int] = {}
    for run_id, impl in sorted(by_run_impl):
        j = col_of_run.get(run_id)
        if j is None:
            continue
        chosen[(impl, j)] = run_id  # runs ascend: the last one wins
        run_count[(impl, j)] = run_count.get((impl, j), 0) + 1
    impls = sorted({impl for impl, _ in chosen})

    # Rows: every check of a chosen run; a whole-scenario or whole-backend error is a row
    # of its own only where no finer row covers it.
    order: dict[tuple, int] = {}
    wide: dict[tuple[str, int], list[dict]] = {}
    for (impl, j), run_id in chosen.items():
        for r in by_run_impl[(run_id, impl)]:
            if _scope(r):
                wide.setdefault((impl, j), []).append(r)
            else:
                order.setdefault((impl, r["scenario"], r["template"], r["check"]), len(order))
    for scope in ("scenario", "backend"):
        for (impl, _), rs in sorted(wide.items()):
            for r in rs:
                covered = any(k[0] == impl and (scope == "backend" or k[1] == r["scenario"]) for k in order)
                if _scope(r) == scope and not covered:
                    order.setdefault((impl, r["scenario"], r["template"], r["check"]), len(order))
    row_keys = sorted(order, key=lambda k: (k[0], k[1], k[2] if k[2] is not None else -1, order[k]))

    # Cells.
    exact: dict[tuple, dict] = {}
    scenario_wide: dict[tuple, dict] = {}
    backend_wide: dict[tuple, dict] = {}
    for (impl, j), run_id in chosen.items():
        for r in by_run_impl[(run_id, impl)]:
            exact[(impl, r["scenario"], r["template"], r["check"], j)] = r
            if _scope(r) == "scenario":
                scenario_wide.setdefault((impl, r["scenario"], j), r)
            elif _scope(r) == "backend":
                backend_wide.setdefault((impl, j), r)
    rows = []
    for key in row_keys:
        impl, scenario, template, check = key
        cells, changes, previous, seen = [], [], None, set()
        for j in range(len(ordered)):
            r, covers = exact.get((*key, j)), None
            if r is None:
                r, covers = scenario_wide.get((impl, scenario, j)), "scenario"
            if r is None:
                r, covers = backend_wide.get((impl, j)), "backend"
            if r is None:
                cells.append(None)
                continue
            s = state(r)
            cell = {"s": s, "r": index[id(r)]}
            if covers:
                cell["w"] = covers
            cells.append(cell)
            seen.add(s)
            if s in (DRIFT, Verdict.SKIPPED):  # a declined scenario says nothing of the distribution either
                continue
            if previous is not None and s != previous:
                changes.append({"at": j, "from": previous, "to": s})
            previous = s
        rows.append(
            {
                "impl": impl,
                "scenario": scenario,
                "template": template,
                "check": check,
                "cells": cells,
                "changes": changes,
                "first_change": changes[0]["at"] if changes else None,
                "failing": bool(seen & {"fail", "error"}),
                "drift": DRIFT in seen,
            }
        )

    # Per implementation and release: bound or not, and the cells' verdicts.
    summary = {}
    for impl in impls:
        per = []
        for j in range(len(ordered)):
            run_id = chosen.get((impl, j))
            if run_id is None:
                per.append({"state": "absent"})
                continue
            counts = {"pass": 0, "fail": 0, "error": 0, "skipped": 0, DRIFT: 0}
            for row in rows:
                cell = row["cells"][j] if row["impl"] == impl else None
                if cell:
                    counts[cell["s"]] = counts.get(cell["s"], 0) + 1
            load_error = backend_wide.get((impl, j))
            if load_error is not None:
                status = DRIFT if state(load_error) == DRIFT else "error"
            elif counts[DRIFT] and not (counts["pass"] or counts["fail"] or counts["error"] or counts["skipped"]):
                status = DRIFT  # it loaded, but no scenario could be sampled through it
            else:
                status = "bound"
            entry = {"state": status, "run": run_id, "runs": run_count[(impl, j)], "counts": counts}
            if load_error is not None:
                entry["r"] = index[id(load_error)]
            per.append(entry)
        summary[impl] = {
            "releases": per,
            "bound": sum(p["state"] == "bound" for p in per),
            "drift": sum(p["state"] == DRIFT for p in per),
            "error": sum(p["state"] == "error" for p in per),
            "absent": sum(p["state"] == "absent" for p in per),
            "drift_releases": [ordered[j]["key"] for j, p in enumerate(per) if p["state"] == DRIFT],
            "rows": sum(row["impl"] == impl for row in rows),
        }
    return {
        "releases": [{"key": c["key"], "version": c["version"], "parsed": c["parsed"] is not None, "runs": c["runs"]} for c in ordered],
        "implementations": impls,
        "summary": summary,
        "rows": rows,
    }


def analyse(runs: list[dict], records: list[dict]) -> dict:
    series: dict[str, list] = {}
    for r in records:
        series.setdefault(series_key(r), []).append(r)
    shifts, regressions = [], []
    for key, points in series.items():
        for a, b in zip(points, points[1:]):
            if (
                a["tv_ci"]
                and b["tv_ci"]
                and None not in (*a["tv_ci"], *b["tv_ci"])
                and (b["tv_ci"][0] > a["tv_ci"][1] or b["tv_ci"][1] < a["tv_ci"][0])
            ):
                shifts.append(
                    {"key": key, "from_run": a["run_id"], "to_run": b["run_id"], "from_tv": a["tv_estimate"], "to_tv": b["tv_estimate"]}
                )
            if b["verdict"] == "fail" and a["verdict"] == "pass":
                regressions.append({"key": key, "run": b["run_id"], "message": b["message"], "reproducer": b["reproducer"]})
    api_drift = [r for r in records if r["kind"] == "api-drift"]
    latest = runs[-1]["id"] if runs else None

    index = {id(r): i for i, r in enumerate(records)}
    matrix = release_matrix(runs, records, index)
    detailed = {cell["r"] for row in matrix["rows"] for cell in row["cells"] if cell}
    detailed |= {p["r"] for s in matrix["summary"].values() for p in s["releases"] if "r" in p}
    detailed |= {i for i, r in enumerate(records) if r["run_id"] == latest}
    page_records = []
    for i, r in enumerate(records):
        fields = _SUMMARY_FIELDS + (_DETAIL_FIELDS if i in detailed else ("backend",))
        page_records.append({f: _clean(r.get(f)) for f in fields})
    return {
        "runs": [{k: run[k] for k in ("id", "created", "label", "profile", "seed", "vllm_version", "vllm_commit")} for run in runs],
        "records": page_records,
        "series": {k: [index[id(p)] for p in v] for k, v in series.items()},
        "matrix": matrix,
        "versions": {run["id"]: run["vllm_version"] for run in runs},
        "shifts": shifts,
        "regressions": regressions,
        "api_drift": [{"run": r["run_id"], "backend": r["backend"], "message": r["message"]} for r in api_drift],
        "latest_failures": [
            {"key": series_key(r), "message": r["message"], "reproducer": r["reproducer"]}
            for r in records
            if r["run_id"] == latest and r["verdict"] == "fail"
        ],
    }


_INTERNED = ("backend", "scenario", "check", "method", "kind", "verdict", "message", "reproducer")


def pack_records(records: list[dict]) -> dict:
    """The page's records as one table: field names once, each row a list, and the strings
    that repeat across records (backends, reproducers, messages) once, named by index. A
    sweep of 15 releases holds thousands of records: this halves the page's data. drift.js
    unpacks it as it loads."""
    fields = list(dict.fromkeys(f for r in records for f in r))
    strings: dict[str, int] = {}
    rows = []
    for r in records:
        row = []
        for f in fields:
            v = r.get(f)
            if f in _INTERNED and isinstance(v, str):
                v = strings.setdefault(v, len(strings))
            row.append(v)
        rows.append(row)
    return {"fields": fields, "interned": [f for f in fields if f in _INTERNED], "strings": list(strings), "rows": rows}


def render(history_path: str) -> tuple[str, dict]:
    runs, records = load(history_path)
    data = analyse(runs, records)
    data["history"] = history_path
    return page("Distribution drift", dict(data, records=pack_records(data["records"])), "drift.js"), data

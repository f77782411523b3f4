"""The drift page: trends across runs and vLLM versions, read from a history.

For each (backend, scenario, template, check) the series of TV estimates (with their 95%
intervals), p-values and verdicts over runs. A *shift* is flagged between consecutive
runs whose TV intervals do not overlap. API-drift verdicts (an adapter that could not
bind to the vLLM it found) are listed apart from distribution regressions (checks that
fail now and passed in the previous run of the same backend).
"""

from harness.evidence.history import load
from harness.report.html import page


def analyse(runs: list[dict], records: list[dict]) -> dict:
    series: dict[str, list] = {}
    for r in records:
        key = f"{r['backend']} | {r['scenario']}[{r['template']}] {r['check']}"
        series.setdefault(key, []).append(r)
    run_info = {run["id"]: run for run in runs}
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
    return {
        "runs": [{k: run[k] for k in ("id", "created", "label", "profile", "seed", "vllm_version", "vllm_commit")} for run in runs],
        "series": {
            k: [{f: p[f] for f in ("run_id", "verdict", "tv_estimate", "tv_ci", "p_value", "detectable_tv")} for p in v]
            for k, v in series.items()
        },
        "versions": {run["id"]: run_info[run["id"]]["vllm_version"] for run in runs},
        "shifts": shifts,
        "regressions": regressions,
        "api_drift": [{"run": r["run_id"], "backend": r["backend"], "message": r["message"]} for r in api_drift],
        "latest_failures": [
            {
                "key": f"{r['backend']} | {r['scenario']}[{r['template']}] {r['check']}",
                "message": r["message"],
                "reproducer": r["reproducer"],
            }
            for r in records
            if r["run_id"] == latest and r["verdict"] == "fail"
        ],
    }


def render(history_path: str) -> tuple[str, dict]:
    runs, records = load(history_path)
    data = analyse(runs, records)
    data["history"] = history_path
    return page("Distribution drift", data, "drift.js"), data

"""Run outputs: ``results.json``, a self-contained ``index.html``, scenario files.

Reads records only; never recomputes a statistic. The page is built by
``reports/templates/run.js`` from the results document (``harness.html``).
"""

import os
import time

from harness.environment import describe
from harness.html import page
from harness.records import write_json_atomic, write_text_atomic


def results_document(result, argv=None) -> dict:
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(argv) if argv else None,
        "profile": result.profile.__dict__,
        "seed": result.seed,
        "family_alpha": result.family_alpha,
        "seconds": result.seconds,
        "backend_seconds": result.backend_seconds,
        # Where a run's wall time went (the stages overlap: they need not add up to ``seconds``).
        "timing": {
            "planning_s": result.plan_seconds,
            "evaluation_s": result.evaluate_seconds,
            "backend_load_s": result.load_seconds,
            "sampling_s": result.backend_seconds,
        },
        "trials": {f"{b}/{s}": n for (b, s), n in result.trials.items()},
        "counts": result.counts(),
        "environment": describe(),
        "backend_environments": result.backend_environments,
        "scenarios": result.scenarios,
        "records": [r.to_dict() for r in result.records],
    }


def write_outputs(result, out_dir: str, argv=None) -> dict:
    doc = results_document(result, argv)
    for name, scenario in result.scenarios.items():
        write_json_atomic(os.path.join(out_dir, "scenarios", f"{name}.json"), scenario)
    results = os.path.join(out_dir, "results.json")
    report = os.path.join(out_dir, "index.html")
    write_json_atomic(results, doc)
    write_text_atomic(report, render_html(doc))
    return {"results": results, "report": report, "document": doc}


def render_html(doc: dict) -> str:
    return page("Rejection-sampler verification", doc, "run.js")


def summary_table(result) -> str:
    rows = {}
    for r in result.records:
        row = rows.setdefault(r.backend, {"pass": 0, "fail": 0, "error": 0, "skipped": 0, "worst": None})
        row[r.verdict] += 1
        if r.verdict in ("fail", "error") and row["worst"] is None:
            row["worst"] = f"{r.scenario}[{r.template}] {r.check}"
    lines = [f"{'backend':34s} {'pass':>6s} {'fail':>6s} {'error':>6s} {'skip':>6s}  first failure"]
    for name, row in rows.items():
        lines.append(f"{name:34s} {row['pass']:6d} {row['fail']:6d} {row['error']:6d} {row['skipped']:6d}  {row['worst'] or ''}")
    p = result.profile
    lines.append(
        f"profile {p.name}: each check alpha={p.alpha:g}, detects TV >= {p.tv} with power {p.power}; "
        f"run family-wise alpha (Holm) = {result.family_alpha:.3g}; {result.seconds:.1f} s"
    )
    return "\n".join(lines)

"""Run outputs: ``results.json``, a self-contained ``index.html``, scenario files.

Reads records only; never recomputes a statistic. The page is built by
``harness/report/templates/run.js`` from the results document (``harness.report.html``).
"""

import os
import time

from harness.evidence.environment import describe
from harness.evidence.files import json_text, write_unit
from harness.report.html import page


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
        # backend -> {"planned", "evaluated", "share"}: how much of the run's checks it was verified on
        "coverage": result.coverage(),
        "unrepeatable": result.unrepeatable,
        "environment": describe(),
        "backend_environments": result.backend_environments,
        "scenarios": result.scenarios,
        "records": [r.to_dict() for r in result.records],
    }


def write_outputs(result, out_dir: str, argv=None) -> dict:
    """``results.json``, ``index.html`` and ``scenarios/`` under ``out_dir``, as one unit
    (``records.write_unit``): an interrupted write leaves the previous run's outputs."""
    doc = results_document(result, argv)
    files = {"results.json": json_text(doc), "index.html": render_html(doc)}
    files.update({f"scenarios/{name}.json": json_text(scenario) for name, scenario in result.scenarios.items()})
    write_unit(out_dir, files, folders=("scenarios",))
    return {"results": os.path.join(out_dir, "results.json"), "report": os.path.join(out_dir, "index.html"), "document": doc}


def render_html(doc: dict) -> str:
    return page("Rejection-sampler verification", doc, "run.js")


def summary_table(result) -> str:
    rows = {}
    for r in result.records:
        row = rows.setdefault(r.backend, {"pass": 0, "fail": 0, "error": 0, "skipped": 0, "worst": None, "why": None})
        row[r.verdict] += 1
        if r.verdict in ("fail", "error") and row["worst"] is None:
            row["worst"] = f"{r.scenario}[{r.template}] {r.check}"
        if r.verdict == "error" and row["why"] is None:
            row["why"] = r.message.strip().splitlines()[-1] if r.message.strip() else "(no message)"
    coverage = result.coverage()
    lines = [f"{'backend':34s} {'pass':>6s} {'fail':>6s} {'error':>6s} {'skip':>6s} {'verified':>9s}  first failure"]
    for name, row in rows.items():
        share = f"{100 * coverage[name]['share']:.0f}%" if name in coverage else "-"
        lines.append(
            f"{name:34s} {row['pass']:6d} {row['fail']:6d} {row['error']:6d} {row['skipped']:6d} {share:>9s}  {row['worst'] or ''}"
        )
        if row["why"]:
            lines.append(f"  {name} error: {row['why']}")
    for name, scenarios in result.unrepeatable.items():
        lines.append(
            f"  {name} is not repeatable: two calls on the same inputs emitted different tokens in {len(scenarios)} scenario(s)"
            f" ({', '.join(scenarios[:3])}{', ...' if len(scenarios) > 3 else ''}); its reproducers cannot reproduce the counts"
        )
    lines += [f"  {line}" for line in result.unverified()]
    p = result.profile
    lines.append(
        f"profile {p.name}: each check alpha={p.alpha:g}, detects TV >= {p.tv} with power {p.power}; "
        f"run family-wise alpha (Holm) = {result.family_alpha:.3g}; {result.seconds:.1f} s"
    )
    return "\n".join(lines)

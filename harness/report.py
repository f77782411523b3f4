"""Run outputs: ``results.json``, a plain self-contained ``index.html``, scenario files.

Reads records only; never recomputes a statistic. Every string that reaches the HTML is
escaped.
"""

import html
import json
import os
import time

from harness.environment import describe
from harness.records import write_json_atomic, write_text_atomic


def _fmt(x, spec=".3g"):
    if x is None:
        return "–"
    if isinstance(x, float):
        return format(x, spec)
    return str(x)


def results_document(result, argv=None) -> dict:
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(argv) if argv else None,
        "profile": result.profile.__dict__,
        "seed": result.seed,
        "family_alpha": result.family_alpha,
        "seconds": result.seconds,
        "backend_seconds": result.backend_seconds,
        "counts": result.counts(),
        "environment": describe(),
        "records": [r.to_dict() for r in result.records],
    }


def write_outputs(result, out_dir: str, argv=None) -> dict:
    doc = results_document(result, argv)
    results = os.path.join(out_dir, "results.json")
    report = os.path.join(out_dir, "index.html")
    for r in result.records:
        scenario = r.extra.get("scenario_json")
        if scenario:
            write_json_atomic(os.path.join(out_dir, "scenarios", f"{r.scenario}.json"), scenario)
    write_json_atomic(results, doc)
    write_text_atomic(report, render_html(doc))
    return {"results": results, "report": report}


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


_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}
th{background:#f3f3f3}.pass{background:#e6f4e6}.fail{background:#fbe3e3}.error{background:#fde9c8}
.skipped{background:#eee}code{font-size:12px}details{margin:.4em 0}
"""


def render_html(doc: dict) -> str:
    e = html.escape
    recs = doc["records"]
    counts = doc["counts"]
    prof = doc["profile"]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Rejection-sampler verification</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>Rejection-sampler verification</h1>",
        f"<p>Profile <b>{e(prof['name'])}</b>: each check has false-alarm rate α = {prof['alpha']:g} and detects "
        f"TV ≥ {prof['tv']:g} with power {prof['power']:g}; run family-wise α (Holm) = {doc['family_alpha']:.3g}. "
        f"Seed {doc['seed']}. {e(json.dumps(counts))}</p>",
        "<h2>Environment</h2><p>" + ", ".join(f"{e(k)}: {e(str(v))}" for k, v in doc["environment"].items() if v) + "</p>",
    ]
    failures = [r for r in recs if r["verdict"] in ("fail", "error")]
    if failures:
        parts.append("<h2>Failures</h2>")
        for r in failures:
            parts.append(
                f"<details open><summary class='{e(r['verdict'])}'>{e(r['backend'])} · {e(r['scenario'])}[{r['template']}] · "
                f"{e(r['check'])}: {e(r['verdict'])}</summary><p>{e(r['message'])}</p>"
                f"<p>Reproduce: <code>{e(r['reproducer'])}</code></p>{_cells_table(r)}</details>"
            )
    parts.append("<h2>All checks</h2><table><tr>")
    heads = [
        "backend",
        "scenario",
        "tpl",
        "check",
        "verdict",
        "kind",
        "p-value",
        "α",
        "Holm thr.",
        "trials",
        "detectable TV",
        "TV est.",
        "TV 95% CI",
    ]
    parts.append("".join(f"<th>{h}</th>" for h in heads) + "</tr>")
    for r in recs:
        ci = r["tv_ci"]
        cells = [
            r["backend"], r["scenario"], r["template"], r["check"], r["verdict"], r["kind"], _fmt(r["p_value"]), _fmt(r["alpha"], "g"),
            _fmt(r["holm_threshold"]), r["trials"], _fmt(r["detectable_tv"], ".4f"), _fmt(r["tv_estimate"], ".4f"),
            f"[{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "–",
        ]  # fmt: skip
        parts.append(f"<tr class='{e(r['verdict'])}'>" + "".join(f"<td>{e(str(c))}</td>" for c in cells) + "</tr>")
    parts.append("</table></body></html>")
    return "\n".join(parts)


def _cells_table(r) -> str:
    if not r.get("cells"):
        return ""
    e = html.escape
    rows = "".join(f"<tr><td>{e(str(label))}</td><td>{obs:.0f}</td><td>{exp:.1f}</td></tr>" for label, obs, exp in r["cells"])
    return f"<table><tr><th>cells (pooled)</th><th>observed</th><th>expected</th></tr>{rows}</table>"

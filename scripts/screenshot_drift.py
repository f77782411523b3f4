"""A screenshot of the drift page (``python -m harness report``) of a history, in headless
Chromium: the release matrix with its summary, the failures-and-changes filter on, and the
detail panel of the first failing cell where a verdict first changed.

    python scripts/screenshot_drift.py --history reports/history.sqlite --out docs/img/drift-page.png

``--synthetic`` first writes an illustrative history to ``--history`` (which must not exist
yet): 15 vLLM releases (0.19.1 to 0.33.0) x vllm-mrv2 and vllm-v1, one run per release, a
second run of 0.33.0 and a run of main, whose records are the scenarios and checks of
``docs/data/results-vllm-{mrv2,v1}.json`` with invented variation and planted events (an
api-drift release, a scenario that cannot be sampled, a finding fixed in a later release,
a scenario declined from a release on). Its verdicts are *not* results: it shows what the
page looks like. docs/img/drift-page.png was made with

    python scripts/screenshot_drift.py --synthetic --history /tmp/synthetic-release-sweep.sqlite --out docs/img/drift-page.png

Needs Chromium on PATH and playwright (as the page tests do; see suites/browser.py).
"""

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import zlib

from packaging.version import Version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# As scripts/vllm_releases.py sweeps them.
RELEASES = ["0.19.1", "0.20.2", "0.21.0", "0.22.1", "0.23.0", "0.24.0", "0.25.1", "0.26.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0"]  # fmt: skip
MAIN_VERSION = "0.34.0.dev57+gabc1234"
TEMPLATES = {"vllm-mrv2": "docs/data/results-vllm-mrv2.json", "vllm-v1": "docs/data/results-vllm-v1.json"}


def _key(*parts) -> random.Random:
    return random.Random(zlib.crc32("|".join(map(str, parts)).encode()))


def _vary(r: dict, rng: random.Random) -> None:
    """Another draw of a passing statistical record: new p-value, statistic and TV."""
    from scipy.special import chdtri  # chi2.isf, without importing scipy.stats

    if r["kind"] not in ("gof", "binomial") or r["verdict"] != "pass" or r.get("tv_estimate") is None:
        return
    p = max(rng.random(), 1e-4)
    scale = 0.6 + 0.8 * rng.random()
    lo, hi = r["tv_ci"] or (r["tv_estimate"], r["tv_estimate"])
    r.update(p_value=p, tv_estimate=r["tv_estimate"] * scale, tv_ci=[lo * scale, hi * scale])
    if r["kind"] == "gof" and r.get("df"):
        r["statistic"] = float(chdtri(r["df"], p))
        r["message"] = f"X2={r['statistic']:.2f} df={r['df']} p={p:.3g}"


def _fail(r: dict, rng: random.Random, tv: float) -> None:
    """A failing statistical record: the observed cells pushed away from the expected."""
    stat = 5000 + 20000 * rng.random()
    cells = []
    for i, (label, _observed, expected) in enumerate(r.get("cells") or []):
        cells.append([label, float(round(expected * (1 + (0.6 if i % 2 else -0.45) * (0.8 + 0.4 * rng.random())))), expected])
    r.update(
        verdict="fail", p_value=0.0, statistic=stat, tv_estimate=tv, tv_ci=[tv - 0.004, tv + 0.004], cells=cells or None,
        message=f"X2={stat:.2f} df={r.get('df')} p=0",
    )  # fmt: skip


def _records(impl: str, release: str, version: str, template: list[dict], run: str) -> list[dict]:
    backend = f"{impl}@vendor/vllm-{release}"
    repro = f"python -m harness run --backend {backend} --profile gpu --seed 0 --device cuda --scenario "
    if impl == "vllm-v1" and release == "0.22.1":  # the adapter cannot bind: one record for the whole backend
        msg = "vLLM API changed: RejectionSampler.forward(metadata, draft_probs, logits, sampling_metadata) matches no known contract"
        return [
            dict(backend=backend, scenario="-", template=-1, check="load", verdict="error", kind="api-drift", message=msg, reproducer="")
        ]
    out, dropped = [], set()
    for t in template:
        r = {k: v for k, v in t.items() if k not in ("extra", "acceptance")}  # the rest is replaced, not changed
        r.update(backend=backend, reproducer=repro + r["scenario"])
        rng = _key(impl, release, run, r["scenario"], r["template"], r["check"])
        if impl == "vllm-mrv2" and release == "0.24.0" and r["scenario"] == "standard-topk":
            if r["scenario"] not in dropped:  # one record for the whole scenario
                dropped.add(r["scenario"])
                out.append(dict(r, template=-1, check="sample", verdict="error", kind="api-drift", cells=None, statistic=None,
                                p_value=None, tv_estimate=None, tv_ci=None, detectable_tv=None, trials=0,
                                message="vLLM API changed: vllm.v1.sample.ops.topk_topp_sampler has no apply_top_k_top_p"))  # fmt: skip
            continue
        if impl == "vllm-mrv2" and r["scenario"].startswith("strict-") and release == "0.19.1":
            r.update(verdict="pass", kind="exact", message="every trial gave the deterministic outcome")  # 0.19 had strict verification
        _vary(r, rng)
        old = Version(version) < Version("0.29.0")
        if impl == "vllm-mrv2" and old and r["check"] == "position-law" and r["verdict"] == "pass" and r["kind"] == "gof":
            _fail(r, rng, 0.08 + 0.05 * rng.random())  # fixed in 0.29.0
        out.append(r)
    return out


def synthetic_history(path: str) -> None:
    """Write the illustrative history of the module docstring to ``path`` (must not exist)."""
    from harness.evidence.history import append_run

    if os.path.exists(path):
        raise SystemExit(f"--synthetic: {path} exists; name a new file")
    templates = {}
    for impl, rel in TEMPLATES.items():
        with open(os.path.join(ROOT, rel)) as f:
            templates[impl] = json.load(f)["records"]
    plan = [(r, r, r, "sweep") for r in RELEASES] + [("0.33.0", "0.33.0", "release", "nightly"), ("main", MAIN_VERSION, "main", "nightly")]
    for day, (release, version, label, run) in enumerate(plan):
        records = [rec for impl in TEMPLATES for rec in _records(impl, release, version, templates[impl], run)]
        doc = {
            "created": f"2026-05-{day + 1:02d}T03:00:00+0000",
            "command": f"synthetic release sweep ({run}), scripts/screenshot_drift.py",
            "profile": {"name": "gpu"},
            "seed": 0,
            "environment": {"vllm": version, "vllm_commit": "abc1234" if release == "main" else None, "gpu": "synthetic"},
            "records": records,
        }
        append_run(path, doc, label)


# The cell whose record the screenshot opens: a failure where its row's verdict first
# changed, else the last failure before a row's first change, else any failure.
PICK_CELL = """(() => {
  const rows = [...document.querySelectorAll('#matrix tr.row.failing:not([hidden])')];
  for (const tr of rows) { const td = tr.querySelector('td.c.fail.first'); if (td) return td; }
  for (const tr of rows) {
    for (let td = tr.querySelector('td.c.first'); td; td = td.previousElementSibling) if (td.classList.contains('fail')) return td;
  }
  return document.querySelector('#matrix tr.row:not([hidden]) td.c.fail');
})()"""


def shoot(history: str, out: str, width=1920, height=1250, only_failures=True, html_out=None, browser=None) -> dict:
    """Render the drift page of ``history``, open it (in ``browser``, or a Chromium of its
    own), and write a PNG of the viewport to ``out``; returns what the page reported
    (render time, rows shown, console errors)."""
    from harness.evidence.files import write_text_atomic
    from harness.report.drift import render
    from suites.browser import TIMEOUT_MS, launch

    text, _ = render(history)
    with tempfile.TemporaryDirectory() as tmp:
        page_path = html_out or os.path.join(tmp, "drift.html")
        write_text_atomic(page_path, text)
        with launch() if browser is None else contextlib.nullcontext(browser) as browser:
            context = browser.new_context(viewport={"width": width, "height": height})
            try:
                page = context.new_page()
                page.set_default_timeout(TIMEOUT_MS)
                errors = []
                page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "assert") else None)
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto("file://" + os.path.abspath(page_path), wait_until="load")
                if only_failures:
                    page.check("#only-interesting")
                target = page.evaluate_handle(PICK_CELL).as_element()
                if target:
                    target.click()
                    page.wait_for_timeout(400)  # the panel's chart
                os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
                page.screenshot(path=out)
                info = {"shown": page.text_content("#matrix-count"), "errors": errors}
            finally:
                context.close()
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--history", required=True, help="the history (SQLite) to render")
    ap.add_argument("--out", required=True, help="the PNG to write")
    ap.add_argument("--synthetic", action="store_true", help="first write the illustrative history to --history (a new file)")
    ap.add_argument("--all-rows", action="store_true", help="leave the failures-and-changes filter off")
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1250)
    ap.add_argument("--html", help="also keep the rendered page here")
    args = ap.parse_args(argv)
    if args.synthetic:
        synthetic_history(args.history)
    info = shoot(args.history, args.out, args.width, args.height, not args.all_rows, args.html)
    print(f"{args.out}: {info['shown']}")
    if info["errors"]:
        print("console errors:\n" + "\n".join(info["errors"]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Throughput of the float64 reference sampler (single-draft trials, small vocabulary).

Goal: at least 1M single-draft standard trials per second on one core
(``benchmarks/RESULTS.md#reference-sampler-throughput``).
Run: ``python benchmarks/bench_reference.py [--trials N] [--vocab V] [--repeats R] [--json PATH]``.
Measures the ``sample`` call on a prebuilt batch, and the whole pipeline (batch
construction + sample + tally) separately. Pin to one core with ``taskset -c 0``.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


from harness.evidence.environment import describe  # noqa: E402
from harness.sampling.tally import TemplateTally, add_outputs  # noqa: E402
from harness.scenarios.materialize import materialize, trials  # noqa: E402
from harness.scenarios.scenario import RequestSpec, Scenario
from reference.sampler import ReferenceSampler  # noqa: E402


def bench(method: str, drafts: str, draft_probs: bool, n: int, vocab: int, repeats: int) -> dict:
    temperature = 0 if method == "greedy" else 1.0
    scenario = Scenario(
        "bench", method, vocab, (RequestSpec(1, temperature, "peaked", "near-target"),), drafts=drafts, draft_probs=draft_probs, seed=1
    )
    templates = materialize(scenario)
    sampler = ReferenceSampler()
    sample_times, pipeline_times = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        tr = trials(scenario, templates, 0, n)
        t1 = time.perf_counter()
        tokens, emitted = sampler.sample(tr.batch)
        t2 = time.perf_counter()
        add_outputs([TemplateTally(1, vocab)], tokens, emitted, tr.drafts, 0)
        t3 = time.perf_counter()
        sample_times.append(t2 - t1)
        pipeline_times.append(t3 - t0)
    best_sample, best_pipeline = min(sample_times), min(pipeline_times)
    return {
        "method": method, "drafts": drafts, "draft_probs": draft_probs, "trials": n, "vocab": vocab,
        "sample_s": best_sample, "sample_trials_per_s": n / best_sample,
        "pipeline_s": best_pipeline, "pipeline_trials_per_s": n / best_pipeline,
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=1_000_000)
    ap.add_argument("--vocab", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    cases = [
        ("standard", "fixed", True),
        ("standard", "sampled", True),
        ("standard", "fixed", False),
        ("strict", "fixed", True),
        ("block", "fixed", True),
        ("greedy", "fixed", True),
    ]
    rows = [bench(m, d, p, args.trials, args.vocab, args.repeats) for m, d, p in cases]
    print(f"{'method':10s} {'drafts':8s} {'q':5s} {'sample (trials/s)':>18s} {'pipeline (trials/s)':>20s}")
    for r in rows:
        print(
            f"{r['method']:10s} {r['drafts']:8s} {str(r['draft_probs']):5s} {r['sample_trials_per_s']:18,.0f} {r['pipeline_trials_per_s']:20,.0f}"
        )
    env = describe()
    env["cpu_affinity"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "command": " ".join(sys.argv), "results": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Time to verdict of one full-power scenario, and the harness's share of it
(``benchmarks/RESULTS.md#time-to-verdict``).

For each backend, vocabulary V and draft count K: a standard scenario with one request
template of K fixed drafts (fp32 logits, near-target draft), verified at the ``gpu`` profile
(every check detects TV >= 0.01 at alpha = 1e-6 with power 0.99), with rows ``shared`` (one
row at every step, stride-0 views for backends that take them) or ``per-step``. A first run
(``cold_s``) compiles the kernels for its chunk sizes; then ``--repeat`` verifications and as
many backend-alone runs, in turn, of which the fastest count:

* plan: materialize the template and compute the exact laws (host, float64);
* sample: build the trials on the device, call the backend, tally on the device, with
  nothing synchronized but the tally's copy to the host, as a run does;
* backend: the backend alone on the same batches (``backend_alone``: built first, then
  called back to back);
* verdict: evaluate every planned check.

Time to verdict = plan + sample + verdict. Harness overhead = 1 - backend / time to verdict
(``overhead``) and 1 - backend / sample (``sampling_overhead``: the sampling loop alone; in a
run, planning and evaluation overlap other scenarios' sampling).

Two more runs: one synchronized around each backend call (``loop_parts.synced_calls_s``, the
measure before the overhead was taken without added syncs), one synchronized around each part of the loop outside the backend,
splitting it into building inputs and tallying (``loop_parts``).

Run on a GPU machine: ``python benchmarks/bench_verdict.py --json OUT.json`` (vLLM from the
installed package or ``SPECDEC_VLLM_SRC``).
"""

import argparse
import itertools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from harness.backends.loading import load_for_device
from harness.evidence.environment import describe  # noqa: E402
from harness.run.plans import planned_trials  # noqa: E402
from harness.sampling.device.tally import DeviceTally  # noqa: E402
from harness.sampling.device.trials import DeviceTrials  # noqa: E402
from harness.sampling.sample import TimedBackend, device_trials, sample_scenario
from harness.scenarios.profiles import get_profile  # noqa: E402
from harness.scenarios.scenario import RequestSpec, Scenario  # noqa: E402

BACKENDS = ("triton", "vllm-mrv2", "vllm-v1")
DRAFTS = (1, 4, 8)
VOCABS = (32000, 131072, 152064)


ROWS = ("shared", "per-step")


class LoopParts:
    """Seconds in each part of the sampling loop outside the backend (device synchronized
    around each, so measured on a separate run: the syncs stop CPU and GPU overlapping)."""

    PARTS = {
        "build inputs": (DeviceTrials, ("__init__", "prepare", "chunk")),
        "tally": (DeviceTally, ("__init__", "add", "start_finish")),
    }

    def __init__(self, parts: dict | None = None):
        self.parts = parts or self.PARTS  # part -> (object, names of the methods it times)
        self._label = None

    def labelled(self, label):
        """Instead of timing: each part inside ``label(part)`` (``torch.profiler.record_function``),
        nothing synchronized."""
        self._label = label
        return self

    def __enter__(self):
        self.seconds, self.saved = dict.fromkeys(self.parts, 0.0), []
        for part, (cls, names) in self.parts.items():
            for name in names:
                original = getattr(cls, name)
                self.saved.append((cls, name, original))
                setattr(cls, name, self._timed(part, original))
        return self

    def _timed(self, part, fn):
        def labelled(*args, **kwargs):
            with self._label(part):
                return fn(*args, **kwargs)

        def timed(*args, **kwargs):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            torch.cuda.synchronize()
            self.seconds[part] += time.perf_counter() - t0
            return out

        return labelled if self._label else timed

    def __exit__(self, *exc):
        for cls, name, original in self.saved:
            setattr(cls, name, original)


def scenario(vocab: int, k: int, rows: str) -> Scenario:
    """``shared``: one target row and one draft row at every step (a stationary request),
    which backends with ``shared_rows`` read as stride-0 views; ``per-step``: K+1 different
    target rows and K draft rows, repeated for every trial."""
    spec = RequestSpec(k, 1.0, "peaked", "near-target", stationary=rows == "shared")
    return Scenario(name=f"verdict-V{vocab}-K{k}-{rows}", method="standard", vocab_size=vocab, requests=(spec,))


def _failed(outcome, profile) -> bool:
    """One check read alone: an exact check's deviation, a statistical one's p-value at the
    profile's per-check alpha (a run holds them to Holm over all its checks instead)."""
    if outcome.kind.statistical:
        return outcome.p_value is not None and outcome.p_value <= profile.alpha
    return bool(outcome.deviated)


def measure(backend, s: Scenario, profile, synchronized: bool = False) -> dict:
    """One verification of ``s``, as a run executes it. ``synchronized``: the device
    synchronized around each backend call, whose seconds are added up (``calls_s``)."""
    t0 = time.perf_counter()
    templates, checks, count = planned_trials(s, profile)
    t1 = time.perf_counter()
    timed = TimedBackend(backend) if synchronized else backend
    tallies = sample_scenario(timed, s, templates, count, profile)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    verdicts = [c.evaluate(tallies[c.template], np.random.default_rng(0)) for c in checks]
    t3 = time.perf_counter()
    return {
        "trials": count,
        "checks": len(checks),
        "passed": not any(_failed(v, profile) for v in verdicts),
        "failed": [c.name for c, v in zip(checks, verdicts) if _failed(v, profile)],
        "plan_s": t1 - t0,
        "sample_s": t2 - t1,
        "verdict_s": t3 - t2,
        "time_to_verdict_s": t3 - t0,
    } | ({"calls": len(timed.calls), "calls_s": sum(end - start for start, end in timed.calls)} if synchronized else {})


def backend_alone(backend, s: Scenario, templates, count: int, profile) -> float:
    """Seconds of the backend's calls alone on the batches a run gives it: every batch of
    the scenario built first (``sample.device_trials``), then the calls back to back, the
    device synchronized before the first and after the last."""
    built, chunk = device_trials(backend, s, templates, count, profile)
    batches = [built.chunk(first, min(chunk, count - first))[0] for first in range(0, count, chunk)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for batch in batches:
        backend.sample(batch)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True, help="write the results here")
    ap.add_argument("--backend", action="append", help=f"default: {', '.join(BACKENDS)}")
    ap.add_argument("--vocab", type=int, action="append", help=f"default: {VOCABS}")
    ap.add_argument("--drafts", type=int, action="append", help=f"default: {DRAFTS}")
    ap.add_argument("--rows", choices=ROWS, action="append", help=f"default: {', '.join(ROWS)}")
    ap.add_argument("--repeat", type=int, default=3, help="verifications and backend-alone runs per shape (the fastest counts)")
    args = ap.parse_args()
    profile = get_profile("gpu")
    results = []
    for name in args.backend or BACKENDS:
        try:
            backend = load_for_device(name, "cuda")
        except Exception as e:  # a backend that cannot load is reported, the others still run
            results.append({"backend": name, "error": str(e)})
            continue
        for rows_kind, vocab, k in itertools.product(args.rows or ROWS, args.vocab or VOCABS, args.drafts or DRAFTS):
            s = scenario(vocab, k, rows_kind)
            cold = measure(backend, s, profile)  # compiles the kernels for this run's chunk sizes
            templates, _, count = planned_trials(s, profile)
            runs, alones = [], []
            for _ in range(args.repeat):  # in turn, so that both see the same machine; the fastest counts
                runs.append(measure(backend, s, profile))
                alones.append(backend_alone(backend, s, templates, count, profile))
            row = {"backend": name, "rows": rows_kind, "vocab": vocab, "drafts": k, "repeats": args.repeat}
            row |= min(runs, key=lambda r: r["time_to_verdict_s"])
            alone = min(alones)
            row |= {
                "backend_s": alone,
                "sampling_overhead": 1 - alone / row["sample_s"],
                "overhead": 1 - alone / row["time_to_verdict_s"],
            }
            synced = measure(backend, s, profile, synchronized=True)
            with LoopParts() as parts:
                measure(backend, s, profile)
            loop = {"synced_sample_s": synced["sample_s"], "synced_calls_s": synced["calls_s"], "calls": synced["calls"]}
            loop |= {f"{p}_s": v for p, v in parts.seconds.items()}
            results.append({**row, "cold_s": cold["time_to_verdict_s"], "loop_parts": loop})
            print(json.dumps(results[-1]), flush=True)
            torch.cuda.empty_cache()
    out = {"command": " ".join(sys.argv), "environment": describe(), "profile": profile.name, "results": results}
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

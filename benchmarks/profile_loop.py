"""Where a run's sampling loop spends its time outside the backend's calls
(``benchmarks/RESULTS.md#sampling-loop-overhead``): every
phase of ``sample.sample_scenario`` timed per scenario, the device synchronized around each.

Wraps the loop's steps in place (no copy of the loop): the probe batch and ``supports``,
``DeviceTrials`` (construction, ``prepare``, ``chunk``), the backend's ``sample`` and
``DeviceTally`` (construction, ``add``, ``start_finish``), and the wait for the counts. In process, after one unreported pass
over the catalog (kernels compiled, CUDA modules loaded). Synchronizing around every phase
adds a little time of its own: the totals (``calls_timed``) come from a pass synchronized
around the backend's calls only, as ``bench_run`` times them.

The harness's overhead is measured without any added synchronization (``overhead``): the
loop scenario by scenario (``loop_s``: each scenario's wall time, which ends with the
tally's copy to the host) against the backend alone on the same batches (``backend_alone_s``:
every batch of the scenario built first, then the backend's calls back to back, the device
synchronized before the first and after the last), each scenario's fastest of ``--repeat``
passes. overhead = 1 - backend_alone / loop. ``stream``: the whole catalog as a run samples
it (``streaming.sample_stream``: scenarios queued while the oldest one's counts are not back,
up to ``streaming.STREAM_AHEAD`` ahead; materializing the templates included; ``--compare-ahead
N``: N ahead as well), the fastest of ``--repeat`` passes, against the same backend-alone total.
``--isolated N``: the steady-state time per catalog pass through one worker process, as a
run with isolation samples (streaming, and one scenario at a time; N passes after a
warm-up pass), against the same total. ``--turns N``: two workers of the backend taking turns on the GPU,
streaming in turns as the workers of a run of two backends do (``turns_pass``).

GPU machine: ``python benchmarks/profile_loop.py --backend triton --json OUT.json``
(``--trace DIR``: a torch.profiler trace of one more stream pass, phases labelled, and
where the GPU stood idle in it; ``--host-profile FILE``: cProfile of one more stream pass,
the host's Python functions by own and cumulative time).
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness.gpus import configure_triton  # noqa: E402

configure_triton()  # before any backend module defines a @triton.jit kernel


from benchmarks.bench_verdict import LoopParts, backend_alone  # noqa: E402
from harness.backends import loading  # noqa: E402
from harness.evidence.environment import describe  # noqa: E402
from harness.run import plans  # noqa: E402
from harness.sampling import sample  # noqa: E402
from harness.sampling import stream as streaming  # noqa: E402
from harness.sampling.device.tally import DeviceTally  # noqa: E402
from harness.sampling.device.trials import DeviceTrials  # noqa: E402
from harness.scenarios.catalog import catalog  # noqa: E402
from harness.scenarios.profiles import get_profile  # noqa: E402


def phases(backend) -> LoopParts:
    """``bench_verdict.LoopParts`` split finer: each step of the loop, the backend's calls too."""
    steps = {"probe batch": (sample, ("trials",)), "backend.sample": (backend, ("sample",))}
    steps |= {"materialize": (sample, ("materialize",)), "wait for counts": (sample.Started, ("tallies",))}
    if hasattr(backend, "supports"):
        steps["backend.supports"] = (backend, ("supports",))
    for cls, names in ((DeviceTrials, ("__init__", "prepare", "chunk")), (DeviceTally, ("__init__", "add", "start_finish"))):
        steps |= {f"{cls.__name__}.{name.strip('_')}": (cls, (name,)) for name in names}
    return LoopParts(steps)


def one_pass(backend, planned, profile):
    per_scenario = []
    for s, templates, count in planned:
        t0 = time.perf_counter()
        try:
            sample.sample_scenario(backend, s, templates, count, profile)
            status = "sampled"
        except sample.Unsupported:
            status = "unsupported"
        per_scenario.append({"scenario": s.name, "trials": count, "status": status, "seconds": time.perf_counter() - t0})
    return per_scenario


def stream_pass(backend, planned, profile, ahead: int = streaming.STREAM_AHEAD) -> float:
    """Wall seconds of the catalog sampled as a run samples it (``streaming.sample_stream``:
    each scenario materialized, prepared and queued while up to ``ahead`` earlier ones'
    counts are not back), the device synchronized before and after."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in streaming.sample_stream(backend, ((s, count) for s, _, count in planned), profile, ahead=ahead):
        pass
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def traced_pass(backend, planned, profile, folder: str) -> dict:
    """One more stream pass under torch.profiler, each phase a labelled range (no
    synchronization): the trace, the ops table, and where the GPU stood idle (``idle``)."""
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile

    labelled = phases(backend)
    with labelled.labelled(record_function), torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        stream_pass(backend, planned, profile)
    os.makedirs(folder, exist_ok=True)
    trace = os.path.join(folder, f"trace-{backend.name}.json")
    prof.export_chrome_trace(trace)
    with open(os.path.join(folder, f"ops-{backend.name}.txt"), "w") as f:
        f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=60))
    with open(trace) as f:
        return idle(json.load(f)["traceEvents"], set(labelled.parts))


def isolated_pass(name: str, planned, profile, passes: int, stream: bool, device: str = "cuda", turns=None, done=None) -> float:
    """Seconds per catalog pass through one worker process (``harness.sampling.worker``, as a run
    with isolation samples; ``stream``: the streaming protocol, else one scenario at a
    time), in the steady state: ``passes`` + 1 passes back to back, the time from the first
    pass's last outcome to the last pass's, divided by ``passes``. The first pass loads
    kernels and warms the worker. A streaming worker runs ahead across pass boundaries, so
    a single pass is not timed alone: over many, the work it did ahead at either end is
    about the same and cancels. ``turns``: the lock folder the worker takes turns in;
    ``done``: a list to get (arrival time, scenario name) of every outcome."""
    from harness.sampling.worker import sample_isolated

    work = [(s, count) for s, _, count in planned] * (passes + 1)
    done = [] if done is None else done
    for scenario, outcome in sample_isolated(name, iter(work), profile, device, 600.0, turns=turns, stream=stream):
        if scenario is None and outcome[0] != "environment" or scenario is not None and outcome[0] == "error":
            raise RuntimeError(f"worker: {outcome}")  # a pass that timed errors would be fast and wrong
        if scenario is not None:
            done.append((time.perf_counter(), scenario.name))
    ends = [t for t, _ in done[len(planned) - 1 :: len(planned)]]
    return (ends[-1] - ends[0]) / passes


MIN_TURNS = 10  # turns inside a turns_pass window: a turn's start-up cost is counted about as often as it occurs


def turns_pass(name: str, planned, profile, passes: int, alone: dict) -> dict:
    """Two workers of ``name`` taking turns on the GPU, as the workers of a run of two
    backends sample: ``isolated_pass`` in two threads on one lock folder, ``passes`` + 1
    passes each. Timed while both are warm and both have work: from the later worker's
    warm-up pass end to the last outcome of the worker that finishes first. The backend's work done in that
    window is the backend-alone time (``alone``, per scenario; an unsupported one has none)
    of every outcome that arrives in it, so where the window cuts a turn, or a pass, does
    not quantize the count. overhead = 1 - work / window. At either edge each worker may
    have about one scenario partly done (a turn's last items overlap the next turn's first;
    outcomes read late add a little): ``edge_bound`` estimates that share. A turn starts
    where a worker's outcomes resume after a pause of half a turn (a heuristic: a scenario
    longer than that would count as one); a window with fewer than ``MIN_TURNS`` turns is
    refused, since one turn start more or less then shifts the figure by about overhead /
    turns. Repeat the measurement for its spread between runs, which is the larger error."""
    import tempfile
    import threading

    from harness.sampling.turns import TURN_SECONDS

    folder, done = tempfile.mkdtemp(prefix="profile-loop-turns-"), ([], [])
    threads = [
        threading.Thread(target=isolated_pass, args=(name, planned, profile, passes, True), kwargs={"turns": folder, "done": d})
        for d in done
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = len(planned) * (passes + 1)
    if not all(len(d) == total for d in done):
        raise RuntimeError("a worker taking turns did not finish its passes")
    start = max(d[len(planned) - 1][0] for d in done)
    end = min(d[-1][0] for d in done)
    turns = sum(1 for d in done for (t0, _), (t1, _) in zip(d, d[1:]) if start < t1 <= end and t1 - t0 > TURN_SECONDS / 2)
    if turns < MIN_TURNS:
        raise RuntimeError(f"{turns} turns in the window, fewer than {MIN_TURNS}: time more passes")
    work = sum(alone.get(s, 0.0) for d in done for t, s in d if start < t <= end)
    window = end - start
    return {
        "passes": passes,
        "window_s": window,
        "turns": turns,
        "work_s": work,
        "overhead": 1 - work / window,
        "edge_bound": 4 * max(alone.values()) / window,
        "pair_pass_s": 2 * sum(alone.values()) * window / work,
    }


def host_profiled_pass(backend, planned, profile, path: str) -> None:
    """One more stream pass under cProfile: where the host's time goes, function by function."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.runcall(stream_pass, backend, planned, profile)
    with open(path, "w") as f:
        for key in ("tottime", "cumulative"):
            pstats.Stats(prof, stream=f).sort_stats(key).print_stats(45)


GPU_EVENTS = ("kernel", "gpu_memcpy", "gpu_memset")


def idle(events: list, labels: set) -> dict:
    """Where the GPU stood idle between its first and last work in a trace: the idle time
    split among the labelled host phases running meanwhile (ms; "no phase": none ran)."""
    busy = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in GPU_EVENTS and "dur" in e)
    gaps, end = [], busy[0][1]
    for start, stop in busy[1:]:
        if start > end:
            gaps.append((end, start))
        end = max(end, stop)
    phases_on_host = [
        (e["ts"], e["ts"] + e["dur"], e["name"]) for e in events if e.get("cat") == "user_annotation" and e.get("name") in labels
    ]
    by_phase: dict = {}
    for lo, hi in gaps:
        covered = 0.0
        for start, stop, name in phases_on_host:
            overlap = min(hi, stop) - max(lo, start)
            if overlap > 0:
                by_phase[name] = by_phase.get(name, 0.0) + overlap / 1e3
                covered += overlap
        by_phase["no phase"] = by_phase.get("no phase", 0.0) + max(0.0, hi - lo - covered) / 1e3
    window = end - busy[0][0]
    idle_us = sum(hi - lo for lo, hi in gaps)
    return {
        "window_ms": window / 1e3,
        "gpu_busy_ms": (window - idle_us) / 1e3,
        "gpu_idle_ms": idle_us / 1e3,
        "gaps": len(gaps),
        "idle_ms_by_phase": dict(sorted(by_phase.items(), key=lambda kv: -kv[1])),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--profile", default="gpu")
    ap.add_argument("--scenario", action="append", help="only these catalog scenarios (repeatable)")
    ap.add_argument("--json", required=True)
    ap.add_argument("--trace", help="write a torch.profiler trace of one more pass to this folder")
    ap.add_argument("--host-profile", help="write a cProfile table of one more stream pass to this file")
    ap.add_argument("--compare-ahead", type=int, help="also time stream passes that run this many scenarios ahead")
    ap.add_argument("--isolated", type=int, default=0, help="also time this many catalog passes through a worker process, per pass")
    ap.add_argument("--turns", type=int, default=0, help="also time this many passes of two workers taking turns on the GPU")
    ap.add_argument("--repeat", type=int, default=5, help="passes of the loop and of the backend alone (the fastest counts)")
    args = ap.parse_args()
    profile = get_profile(args.profile)
    backend = loading.load_for_device(args.backend, "cuda")
    planned = []
    scenarios = [s for s in catalog(profile) if not args.scenario or s.name in args.scenario]
    for i in plans.sampling_order(scenarios):  # as a run samples them
        templates, _, count = plans.planned_trials(scenarios[i], profile)
        planned.append((scenarios[i], templates, count))
    one_pass(backend, planned, profile)  # compiles, module loading
    # As a run executes it (nothing added), and the backend alone: each scenario's fastest of
    # ``--repeat`` passes of each, taken in turn, so that both see the same machine.
    loops, alones, streams, shallow = [], [], [], []
    for _ in range(args.repeat):
        streams.append(stream_pass(backend, planned, profile))
        if args.compare_ahead:
            shallow.append(stream_pass(backend, planned, profile, args.compare_ahead))
        loops.append(one_pass(backend, planned, profile))
        sampled = {r["scenario"] for r in loops[0] if r["status"] == "sampled"}
        alones.append({s.name: backend_alone(backend, s, t, n, profile) for s, t, n in planned if s.name in sampled})
    loop = [min(rows, key=lambda r: r["seconds"]) for rows in zip(*loops)]
    alone = {name: min(a[name] for a in alones) for name in sampled}
    timed = sample.TimedBackend(backend)
    plain = one_pass(timed, planned, profile)
    with phases(backend) as timed_phases:
        per_scenario = one_pass(backend, planned, profile)
    for row in per_scenario:
        row["backend_alone_s"] = alone.get(row["scenario"])
        row["loop_s"] = next(r["seconds"] for r in loop if r["scenario"] == row["scenario"])
    loop_s = sum(r["seconds"] for r in loop if r["scenario"] in sampled)
    calls = sum(end - start for start, end in timed.calls)
    plain_s = sum(r["seconds"] for r in plain)
    result = {
        "command": " ".join(sys.argv),
        "environment": describe(),
        "backend": args.backend,
        "profile": args.profile,
        "scenarios": len(plain),
        "sampled": len(sampled),
        "overhead": {"loop_s": loop_s, "backend_alone_s": sum(alone.values()), "overhead": 1 - sum(alone.values()) / loop_s},
        "stream": {
            "ahead": streaming.STREAM_AHEAD,
            "wall_s": min(streams),
            "passes_s": streams,
            "overhead": 1 - sum(alone.values()) / min(streams),
        },
        "calls_timed": {"loop_s": plain_s, "backend_calls_s": calls, "outside_calls_s": plain_s - calls, "calls": len(timed.calls)},
        "phases_s": dict(sorted(timed_phases.seconds.items(), key=lambda kv: -kv[1])),
        "synchronized_loop_s": sum(r["seconds"] for r in per_scenario),
        "per_scenario": per_scenario,
    }
    import torch

    torch.cuda.empty_cache()  # the workers below need the memory this process's passes cached
    for stream in (True, False) if args.isolated else ():
        seconds = isolated_pass(args.backend, planned, profile, args.isolated, stream)
        result[f"isolated_{'stream' if stream else 'one_at_a_time'}"] = {
            "passes": args.isolated,
            "wall_s": seconds,
            "overhead": 1 - sum(alone.values()) / seconds,
        }
    if args.turns:
        result["turns_stream"] = turns_pass(args.backend, planned, profile, args.turns, alone)
    if shallow:
        result["stream_compared"] = {
            "ahead": args.compare_ahead,
            "wall_s": min(shallow),
            "passes_s": shallow,
            "overhead": 1 - sum(alone.values()) / min(shallow),
        }
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k not in ("per_scenario", "environment")}, indent=1))
    if args.host_profile:
        host_profiled_pass(backend, planned, profile, args.host_profile)
    if args.trace:
        result["stream_trace"] = traced_pass(backend, planned, profile, args.trace)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(json.dumps(result["stream_trace"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m harness {run,engine,tree,backends,scenarios,power}``.

Exit codes: 0 every check passed, 1 a check failed or a backend errored, 2 usage or
setup error (one line on stderr saying what was wrong; also when a finished run's outputs
could not be written, after its summary and verdict are printed), 3 a backend had no
check evaluated (every check skipped or errored: it was verified on nothing).
"""

import argparse
import dataclasses
import os
import shlex
import sys

from harness.evidence.files import check_output_folder
from harness.evidence.history import HistoryError
from harness.gpus import configure_triton

configure_triton()  # before any backend module defines a @triton.jit kernel


EXIT_UNVERIFIED = 3


class UsageError(Exception):
    pass


SEQUENTIAL_HELP = (
    "stop a wrong implementation early: one-multinomial checks (outcome-law, acceptance-length) become the combined "
    "design (a sequential test at alpha/2, looked at after 64, 128, 256, ... trials, plus the chi-square at alpha/2 at "
    "the full count; 2.4-6.6%% more trials for a passing implementation), and a scenario stops sampling once one rejects. "
    "Host path only: batches built on a GPU (--device cuda, device-batched backends) sample the full count, evaluated the "
    "same way (see docs/sequential.md)"
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness", description="Verify speculative-decoding rejection samplers.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run every applicable check for each backend")
    r.add_argument(
        "--backend",
        action="append",
        help="backend name, fault:NAME or pkg.mod:Class; NAME@PATH binds a vLLM source tree, so versions can be compared (repeatable; default: reference)",
    )
    r.add_argument("--profile", default="ci", help="smoke, ci, gpu or nightly (default: ci)")
    r.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="device for the backends (default: cpu)")
    r.add_argument("--seed", type=int, default=0, help="run seed; the same seed gives the same counts (default: 0)")
    r.add_argument("--out", default="reports/latest", help="output directory (default: reports/latest)")
    r.add_argument(
        "--scenario", action="append", help="catalog scenario name or a scenario JSON file (repeatable; default: the whole catalog)"
    )
    r.add_argument("--exclude", action="append", help="leave out this catalog scenario (repeatable)")
    r.add_argument("--alpha", type=float, help="override the profile's per-check false-alarm rate (fuzz reproducers use it)")
    r.add_argument("--sequential", action="store_true", help=SEQUENTIAL_HELP)
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument(
        "--vllm-src", help="verify the vLLM in this python-only source tree (a folder holding vllm/; see scripts/build_vllm_tree.py)"
    )
    r.add_argument("--in-process", action="store_true", help="sample in this process (default: one worker process per backend)")
    r.add_argument(
        "--timeout",
        type=float,
        default=900.0,
        help="seconds a backend may spend loading, or on one scenario, before its worker is killed; after a timeout its other scenarios are not sampled (default: 900)",
    )
    r.add_argument(
        "--gpus", type=int, default=1, help="spread each backend's scenarios over this many GPUs, one worker per GPU (default: 1)"
    )
    r.add_argument("--history", help="append this run to a history file (SQLite), e.g. reports/history.sqlite")
    r.add_argument("--label", help="a label for this run in the history (e.g. 'vllm main abc123')")
    e = sub.add_parser("engine", help="verify a whole engine end to end: Hugging Face assisted generation at T > 0")
    e.add_argument(
        "--engine",
        action="append",
        help="hf (this environment's transformers), hf@SITE (a release in SITE: pip install --target SITE transformers==X) or hf-fault:NAME (repeatable; default: hf)",
    )
    e.add_argument("--profile", default="smoke", help="smoke, ci, gpu or nightly: alpha, power and the TV to detect (default: smoke)")
    e.add_argument(
        "--tv", type=float, help="detect this TV instead of the profile's (fewer trials on a small machine: the record states it)"
    )
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--scenario", action="append", help="engine catalog scenario (repeatable; default: all)")
    e.add_argument("--workers", type=int, default=0, help="processes per engine (default: one per CPU)")
    e.add_argument("--timeout", type=float, default=3600.0, help="seconds one worker process may run (default: 3600)")
    e.add_argument("--out", default="reports/engine", help="output directory (default: reports/engine)")
    e.add_argument("--history", help="append this run to a history file (SQLite)")
    e.add_argument("--label", help="a label for this run in the history")
    t = sub.add_parser("tree", help="verify tree samplers (SGLang's EAGLE rule, SpecInfer's) against their exact laws")
    t.add_argument(
        "--backend",
        action="append",
        help="reference, tree-fault:NAME or package.module:attr (an object with rule and sample: docs/trees.md) (repeatable; default: reference)",
    )
    t.add_argument("--scenario", action="append", help="tree catalog scenario (repeatable; default: all)")
    t.add_argument("--profile", default="ci", help="smoke, ci, gpu or nightly: alpha, power and the TV to detect (default: ci)")
    t.add_argument("--tv", type=float, help="detect this TV instead of the profile's (the records state it)")
    t.add_argument("--seed", type=int, default=0, help="run seed; the same seed gives the same counts (default: 0)")
    t.add_argument("--out", default="reports/tree", help="output directory (default: reports/tree)")
    t.set_defaults(history=None, label=None)
    rp = sub.add_parser("report", help="build the drift page from a history")
    rp.add_argument("--history", required=True, help="history file written by 'run --history'")
    rp.add_argument("--out", required=True, help="HTML file to write")
    hi = sub.add_parser("history", help="append a run written earlier by 'run' to a history")
    his = hi.add_subparsers(dest="history_command", required=True, metavar="append")
    ha = his.add_parser("append", help="append a run's results.json (e.g. one whose history write failed) to a history")
    ha.add_argument("results", help="results.json written by 'run', or the folder 'run --out' wrote it in")
    ha.add_argument("--history", required=True, help="history file (SQLite) to append to; created if missing")
    ha.add_argument("--label", help="a label for this run in the history (e.g. 'vllm main abc123')")
    f = sub.add_parser("faults", help="detection matrix: every planted fault x check family")
    f.add_argument("--profile", default="ci")
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    f.add_argument(
        "--backend",
        default="reference",
        choices=("reference", "triton"),
        help="the faults planted in this sampler: reference (fault:NAME) or triton (triton-fault:NAME) (default: reference)",
    )
    f.add_argument("--out", default="reports/faults", help="writes matrix.json and matrix.md here (default: reports/faults)")
    f.add_argument("--fault", action="append", help="only these faults (repeatable)")
    f.add_argument("--no-progress", action="store_true")
    c = sub.add_parser("calibrate", help="measured false-alarm rate and p-value uniformity of the checks on the reference")
    c.add_argument("--profile", default="smoke", help="trial counts from this profile (default: smoke; alpha is overridden)")
    c.add_argument("--seeds", type=int, default=1000)
    c.add_argument("--alpha", type=float, action="append", help="loose levels to measure (default: 0.01 and 0.05)")
    c.add_argument("--out", default="reports/calibration", help="writes calibration.json and calibration.md here")
    pe = sub.add_parser("peers", help="peers' statistics vs ours on the planted faults (writes peers.md)")
    pe.add_argument("--profile", default="ci")
    pe.add_argument("--seed", type=int, default=0)
    pe.add_argument("--fault", action="append", help="only these faults (repeatable)")
    pe.add_argument("--max-trials", type=int, default=1 << 20)
    pe.add_argument("--out", default="reports/peers")
    sub.add_parser("backends", help="list the backends and whether they can run here")
    s = sub.add_parser("scenarios", help="list a profile's scenarios with their trial counts")
    s.add_argument("--profile", default="ci")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--sequential", action="store_true", help="trial counts of the combined design (as 'run --sequential')")
    w = sub.add_parser("power", help="trials for a TV to detect, or the TV that trials detect")
    w.add_argument("--alpha", type=float, default=1e-6)
    w.add_argument("--power", type=float, default=0.99)
    w.add_argument("--df", type=int, required=True, help="degrees of freedom (cells - 1)")
    g = w.add_mutually_exclusive_group(required=True)
    g.add_argument("--tv", type=float, help="smallest total-variation distance to detect")
    g.add_argument("--trials", type=int, help="number of trials")
    return p


def main(argv=None) -> int:
    import signal
    import threading

    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse already printed its one-line reason
        return 0 if e.code == 0 else 2
    ending = (signal.SIGINT, signal.SIGTERM)
    handlers = {s: signal.getsignal(s) for s in ending} if threading.current_thread() is threading.main_thread() else {}
    terminated = []

    def terminate(signum, frame):  # SIGTERM ends a command as Ctrl-C does
        terminated.append(signum)
        raise KeyboardInterrupt

    if handlers and handlers[signal.SIGTERM] is not signal.SIG_IGN:
        signal.signal(signal.SIGTERM, terminate)
    try:
        commands = {
            "run": _run,
            "engine": _engine,
            "tree": _tree,
            "faults": _faults,
            "calibrate": _calibrate,
            "peers": _peers,
            "report": _report,
            "history": _history,
            "backends": _backends,
            "scenarios": _scenarios,
            "power": _power,
        }
        return commands[args.command](args)
    except (UsageError, ValueError, OSError, HistoryError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        from harness.sampling.worker import end_workers

        for s in handlers:  # a second signal must not interrupt the cleanup with a traceback
            signal.signal(s, signal.SIG_IGN)
        end_workers()  # every worker's process group: a backend's own children too
        name = "SIGTERM" if terminated else "SIGINT"
        print(f"interrupted ({name}): no results written", file=sys.stderr)
        return 128 + (signal.SIGTERM if terminated else signal.SIGINT)
    finally:
        for s, handler in handlers.items():
            if handler is not None:  # None: not set from Python, nothing to restore
                signal.signal(s, handler)


def _select_scenarios(args, profile):
    from harness.scenarios.catalog import catalog, find
    from harness.scenarios.scenario import read_scenario_file

    scenarios = catalog(profile, args.seed)
    if not args.scenario:
        return scenarios, {}
    chosen, refs, given = [], {}, {}
    for item in args.scenario:
        if item.endswith(".json") or os.path.sep in item:
            try:
                scenario = read_scenario_file(item)
            except FileNotFoundError:
                raise UsageError(f"--scenario: no such file {item!r}") from None
            except OSError as e:
                raise UsageError(f"--scenario {item}: {e.strerror or e}") from None
            except ValueError as e:
                raise UsageError(f"--scenario {item}: {e}") from None
            refs[scenario.name] = item
        else:
            scenario = find(scenarios, item)
        # Results and output files are keyed by name (case-blind on some file systems): two would be one.
        key = scenario.name.lower()
        if key in given:
            raise UsageError(f"--scenario {item}: a scenario named {scenario.name!r} is already selected (--scenario {given[key]})")
        given[key] = item
        chosen.append(scenario)
    return chosen, refs


def _run(args) -> int:
    from harness.gpus import cuda_available
    from harness.report.outputs import summary_table
    from harness.run.runner import run
    from harness.scenarios.profiles import get_profile
    from harness.scenarios.scenario import check_seed, did_you_mean

    profile = get_profile(args.profile)
    if args.alpha is not None:
        if not 0 < args.alpha < 1:
            raise UsageError(f"--alpha: expected a rate in (0, 1), got {args.alpha}")
        profile = dataclasses.replace(profile, alpha=args.alpha)
    profile = dataclasses.replace(profile, sequential=args.sequential)
    if args.device == "cuda" and not cuda_available():
        raise UsageError("--device cuda: no CUDA device is available on this machine")
    check_seed(args.seed, "--seed")
    if not 0 < args.timeout < float("inf"):  # NaN too: a worker could never be timed out, or always would be
        raise UsageError(f"--timeout: expected a positive, finite number of seconds, got {args.timeout}")
    scenarios, refs = _select_scenarios(args, profile)
    for name in args.exclude or ():
        if name not in {s.name for s in scenarios}:
            raise UsageError(f"--exclude: no scenario named {name!r} in this run{did_you_mean(name, [s.name for s in scenarios])}")
        scenarios = [s for s in scenarios if s.name != name]
    if args.vllm_src:
        from harness.backends.vllm.env import use_source_tree

        use_source_tree(args.vllm_src)
        os.environ["SPECDEC_VLLM_SRC"] = os.path.abspath(args.vllm_src)  # recorded in the run's environment
    if args.gpus < 1:
        raise UsageError(f"--gpus: expected a positive number of GPUs, got {args.gpus}")
    if args.gpus > 1 and (args.in_process or args.device == "cpu"):
        raise UsageError("--gpus > 1 needs --device cuda and worker processes (drop --in-process)")
    backends = args.backend or ["reference"]
    from harness.backends import check_backend_name

    for name in backends:
        check_backend_name(name)
        source = name.partition("@")[2]
        if source and not os.path.isdir(source):
            raise UsageError(f"--backend {name}: no source tree folder {source!r}")
    # Everything a run will write to is checked before it samples: nothing is thrown away.
    check_output_folder(args.out)
    if args.history:
        from harness.evidence.history import check_history

        check_history(args.history)
    progress, close = _progress(len(backends) * len(scenarios), disabled=args.no_progress)
    try:
        result = run(
            backends, scenarios, profile, args.seed, args.device, progress, refs,
            isolate=not args.in_process, timeout=args.timeout, gpus=args.gpus, log_dir=args.out,
        )  # fmt: skip
    finally:
        close()
    print(summary_table(result))
    return _finish(result, args)


def _finish(result, args) -> int:
    """Print the verdict, write the outputs and the history entry; the exit code."""
    from harness.report.outputs import write_outputs

    code, verdict = _verdict(result)
    print(verdict)
    try:
        paths = write_outputs(result, args.out, argv=sys.argv)
    except OSError as e:
        print(f"error: the run's outputs could not be written to {args.out}: {e}", file=sys.stderr)
        return 2
    print(f"results: {paths['results']}\nreport:  {paths['report']}")
    if args.history:
        from harness.evidence.history import append_run

        try:
            run_id = append_run(args.history, paths["document"], args.label)
        except (HistoryError, OSError) as e:
            later = ["python", "-m", "harness", "history", "append", paths["results"], "--history", args.history]
            later += ["--label", args.label] if args.label else []
            print(f"error: {e}; add the run later: {shlex.join(later)}", file=sys.stderr)
            return 2
        print(f"history: {args.history} (run {run_id})")
    return code


def _engine(args) -> int:
    from harness.engines.run import parse_engine, run_engines
    from harness.engines.scenario import CATALOG, catalog_scenario
    from harness.report.outputs import summary_table
    from harness.scenarios.profiles import get_profile
    from harness.scenarios.scenario import check_seed

    profile = get_profile(args.profile)
    check_seed(args.seed, "--seed")
    if args.tv is not None and not 0 < args.tv < 1:
        raise UsageError(f"--tv: expected a total variation in (0, 1), got {args.tv}")
    if args.workers < 0:
        raise UsageError(f"--workers: expected a number of processes >= 0 (0: one per CPU), got {args.workers}")
    if not 0 < args.timeout < float("inf"):
        raise UsageError(f"--timeout: expected a positive, finite number of seconds, got {args.timeout}")
    engines = args.engine or ["hf"]
    for name in engines:
        parse_engine(name)  # ValueError: a usage error
    scenarios = [catalog_scenario(name) for name in args.scenario] if args.scenario else list(CATALOG)
    check_output_folder(args.out)
    if args.history:
        from harness.evidence.history import check_history

        check_history(args.history)
    result = run_engines(engines, scenarios, profile, args.seed, args.tv, args.workers, args.timeout)
    print(summary_table(result))
    return _finish(result, args)


def _tree(args) -> int:
    from harness.report.outputs import summary_table
    from harness.scenarios.profiles import get_profile
    from harness.scenarios.scenario import check_seed
    from harness.trees.backends import check_name
    from harness.trees.run import run_trees
    from harness.trees.scenario import CATALOG, find

    profile = get_profile(args.profile)
    check_seed(args.seed, "--seed")
    if args.tv is not None and not 0 < args.tv < 1:
        raise UsageError(f"--tv: expected a total variation in (0, 1), got {args.tv}")
    backends = args.backend or ["reference"]
    for name in backends:
        check_name(name)  # ValueError: a usage error
    scenarios = [find(name) for name in dict.fromkeys(args.scenario)] if args.scenario else list(CATALOG)
    check_output_folder(args.out)
    result = run_trees(list(dict.fromkeys(backends)), scenarios, profile, args.seed, args.tv)
    print(summary_table(result))
    return _finish(result, args)


def _verdict(result) -> tuple[int, str]:
    """(exit code, one line): 1 a check failed or a backend errored, 3 some backend had no
    check evaluated (nothing verified is no pass), else 0."""
    counts = result.counts()
    if result.failed:
        return 1, f"verdict: FAIL ({counts['fail']} failed, {counts['error']} errors)"
    unverified = result.unverified()
    if unverified:
        return EXIT_UNVERIFIED, f"verdict: NOTHING VERIFIED for {len(unverified)} backend(s): {unverified[0]}"
    return 0, f"verdict: pass ({counts['pass']} checks passed, {counts['skipped']} skipped)"


def _progress(total, disabled):
    if disabled or total == 0:
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(total=total, unit="scenario", file=sys.stderr, dynamic_ncols=True)
    return bar.update, bar.close


def _faults(args) -> int:
    from harness.evidence.files import write_json_atomic, write_text_atomic
    from harness.gpus import cuda_available
    from harness.scenarios.profiles import get_profile
    from harness.scenarios.scenario import check_seed
    from harness.studies.detection import matrix, planted, planted_table, to_json, to_markdown

    profile = get_profile(args.profile)
    check_seed(args.seed, "--seed")
    known = planted(args.backend)
    unknown = set(args.fault or ()) - set(known)
    if unknown:
        raise UsageError(f"--fault: unknown fault(s) {sorted(unknown)} for --backend {args.backend} (known: {', '.join(known)})")
    if args.device == "cuda" and not cuda_available():
        raise UsageError("--device cuda: no CUDA device is available on this machine")
    names = args.fault or list(known)
    progress, close = _progress(len(names), disabled=args.no_progress)
    try:
        rows = matrix(profile, args.seed, args.device, names, progress, args.backend)
    finally:
        close()
    table = to_markdown(rows, profile)
    if args.backend == "triton":
        table += "\n" + planted_table()
    record = {"backend": args.backend, "device": args.device, "profile": profile.__dict__, "seed": args.seed, "rows": to_json(rows)}
    write_json_atomic(os.path.join(args.out, "matrix.json"), record)
    write_text_atomic(os.path.join(args.out, "matrix.md"), table)
    print(table)
    return 0 if all(r.detected for r in rows) else 1


def _calibrate(args) -> int:
    from harness.evidence.files import write_json_atomic, write_text_atomic
    from harness.scenarios.profiles import PROFILES, get_profile
    from harness.studies.calibration import detectable_table, fmt, p_values, summarize

    profile = get_profile(args.profile)
    if args.seeds < 1:
        raise UsageError("--seeds: expected a positive number of seeds")
    rows = []
    for alpha in args.alpha or [0.01, 0.05]:
        values = p_values(profile, range(args.seeds), alpha)
        rows += summarize(alpha, values)
    rows += summarize(profile.alpha, values)  # the default level on the same p-values: expect no alarm
    lines = [
        f"Calibration on the reference: {args.seeds} seeds, trial counts of profile `{profile.name}`.",
        "",
        "| α | check kind | checks | false alarms | rate | binomial p (rate = α) | KS p (uniform) |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.alpha:g} | {r.kind} | {r.checks} | {r.false_alarms} | {r.rate:.4f} | {fmt(r.agreement_p)} | {fmt(r.ks_p)} |" for r in rows
    ]
    power_rows = detectable_table([PROFILES[n] for n in PROFILES])
    lines += ["", "Smallest TV detected with power 0.99 at α = 1e-6 (worst check of each profile's catalog):", ""]
    lines += ["| profile | design TV | worst check's detectable TV | trials in the catalog |", "|---|---|---|---|"]
    lines += [f"| {r['profile']} | {r['design_tv']} | {r['worst_detectable_tv']:.4f} | {r['trials']:,} |" for r in power_rows]
    text = "\n".join(lines) + "\n"
    write_json_atomic(
        os.path.join(args.out, "calibration.json"),
        {"seeds": args.seeds, "profile": profile.name, "rows": [r.__dict__ for r in rows], "power": power_rows},
    )
    write_text_atomic(os.path.join(args.out, "calibration.md"), text)
    print(text)
    return 0


def _peers(args) -> int:
    from harness.backends.faults import FAULTS
    from harness.evidence.files import write_json_atomic, write_text_atomic
    from harness.scenarios.profiles import get_profile
    from harness.scenarios.scenario import check_seed
    from harness.studies.peers import compare, to_markdown

    profile = get_profile(args.profile)
    check_seed(args.seed, "--seed")
    unknown = set(args.fault or ()) - set(FAULTS)
    if unknown:
        raise UsageError(f"--fault: unknown fault(s) {sorted(unknown)}")
    rows = [compare(name, profile, args.seed, args.max_trials) for name in args.fault or FAULTS]
    text = to_markdown(rows, profile, args.max_trials)
    write_json_atomic(os.path.join(args.out, "peers.json"), rows)
    write_text_atomic(os.path.join(args.out, "peers.md"), text)
    print(text)
    return 0


def _report(args) -> int:
    from harness.evidence.files import write_text_atomic
    from harness.report.drift import render

    if os.path.realpath(args.out) == os.path.realpath(args.history):
        raise UsageError("--out: that is the history itself; name the HTML file to write")
    text, data = render(args.history)
    write_text_atomic(args.out, text)
    print(
        f"drift page: {args.out} ({len(data['runs'])} runs, {len(data['regressions'])} regressions, {len(data['api_drift'])} API drift, {len(data['shifts'])} shifts)"
    )
    return 0


def _history(args) -> int:
    from harness.evidence.history import append_run, read_run_document

    doc = read_run_document(args.results)  # refused before the history is touched
    run_id = append_run(args.history, doc, args.label)
    print(f"history: {args.history} (run {run_id})")
    return 0


def _backends(args) -> int:
    from harness.backends import describe_backends

    for name, available, note in describe_backends():
        print(f"{name:32s} {'available' if available else 'unavailable':12s} {note}")
    return 0


def _scenarios(args) -> int:
    from harness.run.plans import planned_trials
    from harness.scenarios.catalog import catalog
    from harness.scenarios.profiles import get_profile
    from harness.scenarios.scenario import check_seed

    profile = dataclasses.replace(get_profile(args.profile), sequential=args.sequential)
    check_seed(args.seed, "--seed")
    combined = ", combined design (--sequential)" if profile.sequential else ""
    print(f"profile {profile.name}: alpha={profile.alpha:g} power={profile.power} detects TV >= {profile.tv}{combined}")
    for s in catalog(profile, args.seed):
        _, planned, count = planned_trials(s, profile)
        print(f"{s.name:34s} {s.method:10s} V={s.vocab_size:<7d} templates={len(s.requests)} trials={count:<8d} checks={len(planned)}")
    return 0


def _power(args) -> int:
    from harness.checking import power

    if args.tv is not None:
        n = power.trials_for_tv(args.alpha, args.power, args.tv, args.df)
        print(f"{n} trials detect every alternative with TV >= {args.tv} (alpha={args.alpha:g}, power={args.power}, df={args.df})")
    else:
        if args.trials <= 0:
            raise UsageError("--trials: expected a positive integer")
        tv = power.detectable_tv(args.alpha, args.power, args.df, args.trials)
        print(f"{args.trials} trials detect TV >= {tv:.6g} (alpha={args.alpha:g}, power={args.power}, df={args.df})")
    return 0

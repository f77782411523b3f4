"""One runner for the CLI and pytest: scenarios -> backend -> tally -> checks -> records.

Trial counts are fixed before sampling (the largest any planned check needs); with
``Profile.sequential`` a scenario stops earlier when a monitored check's sequential test
rejects (``harness.checking.sequential``), and its checks say how they read the shorter
counts. The backend sees chunks of trials sized to a memory budget; only counts are kept.
The stages overlap: a background thread plans the scenarios in order (``Plans``), every backend's
worker starts at once and takes each scenario as it is planned (``Sampling``), and the
checks of a scenario are evaluated as its tallies arrive, in catalog order. Checks are
never retried. Holm's step-down controls the family-wise false-alarm rate of the run's
``m`` statistical checks at ``alpha * m``: it rejects everything Bonferroni at per-check
``alpha`` would, and more, so each check's stated power still holds.
"""

import importlib.util
import os
import shlex
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from harness.checking.checks import Outcome
from harness.checking.family import decide_verdicts
from harness.evidence.records import CheckRecord, Kind, Verdict
from harness.run.plans import Plans, sampling_order
from harness.sampling.sample import Declined
from harness.sampling.stream import sample_in_process
from harness.scenarios.profiles import Profile, get_profile
from harness.scenarios.scenario import Scenario


@dataclass
class RunResult:
    records: list[CheckRecord]
    profile: Profile
    seed: int
    family_alpha: float
    seconds: float
    backend_seconds: dict = field(default_factory=dict)
    trials: dict = field(default_factory=dict)  # (backend, scenario) -> trials per template actually sampled
    scenarios: dict = field(default_factory=dict)  # name -> scenario as JSON data
    planned_checks: dict = field(default_factory=dict)  # scenario -> checks planned for it (each backend's share's denominator)
    backend_environments: dict = field(default_factory=dict)  # backend -> versions it loaded with (its worker's)
    plan_seconds: float = 0.0  # spent planning (laws and trial counts), in a background thread when pipelined
    evaluate_seconds: float = 0.0  # spent evaluating checks
    load_seconds: dict = field(default_factory=dict)  # backend -> seconds until its worker had loaded it
    sample_calls: dict = field(default_factory=dict)  # backend -> [(start, end)] of its sample calls (time_backend), monotonic clock
    # backend -> scenarios where two calls on the same inputs emitted different tokens: its
    # reproducers cannot reproduce those counts
    unrepeatable: dict = field(default_factory=dict)

    @property
    def sample_call_seconds(self) -> dict:
        """backend -> seconds inside its ``sample`` calls (``time_backend``)."""
        return {name: sum(end - start for start, end in calls) for name, calls in self.sample_calls.items()}

    @property
    def failed(self) -> bool:
        return any(r.verdict in (Verdict.FAIL, Verdict.ERROR) for r in self.records)

    def counts(self) -> dict:
        out = {v.value: 0 for v in Verdict}
        for r in self.records:
            out[r.verdict] += 1
        return out

    def coverage(self) -> dict:
        """backend -> how much of its planned checks was verified: ``planned`` (the catalog's
        checks for the run's scenarios), ``evaluated`` (passed or failed), ``share``."""
        planned = sum(self.planned_checks.values())
        out = {}
        for name in dict.fromkeys(r.backend for r in self.records):
            evaluated = sum(1 for r in self.records if r.backend == name and r.verdict in (Verdict.PASS, Verdict.FAIL))
            out[name] = {"planned": planned, "evaluated": evaluated, "share": evaluated / planned if planned else 0.0}
        return out

    def unverified(self) -> list[str]:
        """One line for each backend for which no check was evaluated (all skipped or errors)."""
        lines = []
        for name, c in self.coverage().items():
            if c["evaluated"] == 0:
                mine = [r for r in self.records if r.backend == name]
                first = next((r.message for r in mine if r.verdict in (Verdict.SKIPPED, Verdict.ERROR)), "no records")
                first = first.splitlines()[0] if first else ""
                lines.append(f"{name}: verified nothing: 0 of {c['planned']} checks ran (first reason: {first})")
        return lines


def reproducer(backend: str, profile: Profile, seed: int, scenario_ref: str, device: str) -> str:
    """The one-line command that reruns a scenario (``scenario_ref``: catalog name or JSON
    file), with what the backend needed to load: the ``PYTHONPATH`` entry a dotted-path
    backend was importable through, the vLLM source tree of the run."""
    cmd = ["python", "-m", "harness", "run", "--backend", backend, "--profile", profile.name]
    cmd += ["--seed", str(seed), "--scenario", scenario_ref]
    if profile.alpha != get_profile(profile.name).alpha:
        cmd += ["--alpha", repr(profile.alpha)]
    if profile.sequential:
        cmd += ["--sequential"]
    if device != "cpu":
        cmd += ["--device", device]
    src = os.environ.get("SPECDEC_VLLM_SRC")
    if src and backend.startswith("vllm-") and "@" not in backend:
        cmd += ["--vllm-src", src]
    root = _pythonpath_root(backend)
    return shlex.join(cmd) if root is None else f"PYTHONPATH={shlex.quote(root)} {shlex.join(cmd)}"


def _pythonpath_root(backend: str) -> str | None:
    """The ``PYTHONPATH`` entry a dotted-path backend's top package is found through, or
    None (a built-in name, or found without ``PYTHONPATH``). Finding it imports nothing."""
    module = backend.partition(":")[0] if ":" in backend else None
    if not module or module in ("fault", "triton-fault") or not os.environ.get("PYTHONPATH"):
        return None
    try:
        spec = importlib.util.find_spec(module.split(".")[0])
    except (ImportError, ValueError):
        return None
    where = spec and (spec.origin if not spec.submodule_search_locations else next(iter(spec.submodule_search_locations), None))
    if not where:
        return None
    root = os.path.dirname(os.path.abspath(where))
    entries = {os.path.abspath(e) for e in os.environ["PYTHONPATH"].split(os.pathsep) if e}
    return root if root in entries else None


class Sampling:
    """One backend's sampling, started at once and fed work as it is planned: ``outcome(i)``
    waits for scenario i's. ``work(i)`` gives (scenario, trials), waiting for its plan, or
    None when there is none (the run stops there). A load failure gives every remaining
    scenario of the shard ("load-error", why). Scenarios are sampled in ``order`` (indices;
    default 0..size-1); ``gpus`` > 1: GPU g takes the items at g, g + gpus, ... of it."""

    def __init__(
        self,
        name,
        size,
        work,
        profile,
        device,
        isolate,
        timeout,
        gpus=1,
        progress=None,
        time_backend=False,
        turns=None,
        order=None,
        log_dir=None,
    ):
        from harness.sampling.worker import backend_log_path

        # log_dir: the workers' stdout and stderr go to {log_dir}/backends/NAME.log (None: the tool's own)
        self._log_path = backend_log_path(log_dir, name) if log_dir is not None and isolate else None
        self.outcomes: list = [None] * size
        self.environments: list = []  # one per worker (the same unless workers differ)
        self.load_seconds: float | None = None  # until the first worker had loaded the backend
        self._start = time.perf_counter()
        self._failure: BaseException | None = None  # a harness error in a sampling thread, raised to the reader
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._name, self._profile, self._device, self._timeout = name, profile, device, timeout
        self._work, self._isolate, self._progress, self._time_backend = work, isolate, progress, time_backend
        self._turns = turns  # a folder of lock files, one per GPU, shared with other backends' workers
        order = list(range(size)) if order is None else list(order)
        shards = [order[g::gpus] for g in range(gpus)]
        self._threads = [
            threading.Thread(target=self._serve, args=(shard, g if gpus > 1 else None), name=f"sampling-{name}-{g}", daemon=True)
            for g, shard in enumerate(shards)
            if shard
        ]
        for t in self._threads:
            t.start()

    def _items(self, shard: list[int]):
        for i in shard:
            item = None if self._stop.is_set() else self._work(i)
            if item is None:
                return
            yield item if self._device == "cpu" else item[:2]  # the device path does not look: no stop rule to send

    def _serve(self, shard: list[int], gpu: int | None) -> None:
        from harness.sampling.worker import sample_isolated

        sampler = sample_isolated if self._isolate else sample_in_process
        try:
            items = self._items(shard)
            stream = sampler(
                self._name, items, self._profile, self._device, self._timeout, gpu, self._time_backend, self._turns, log_path=self._log_path
            )
            pending = iter(shard)
            for scenario, outcome in stream:
                if outcome[0] == "environment":  # what the backend loaded with, before any scenario
                    self.environments.append(outcome[1])
                    self.load_seconds = self.load_seconds or time.perf_counter() - self._start
                elif scenario is None:  # every remaining item of this shard gets the load error
                    self._set([j for j in pending], outcome)
                    return
                else:
                    self._set([next(pending)], outcome)
        except BaseException as e:
            with self._changed:
                self._failure = e
                self._changed.notify_all()

    def _set(self, indices: list[int], outcome) -> None:
        with self._changed:
            for j in indices:
                self.outcomes[j] = outcome
            self._changed.notify_all()
        if self._progress and indices:
            self._progress(len(indices))

    def outcome(self, i: int) -> tuple:
        with self._changed:
            self._changed.wait_for(lambda: self.outcomes[i] is not None or self._failure is not None)
        if self._failure is not None:
            raise self._failure
        return self.outcomes[i]

    def stop(self) -> None:
        """Hand out no more work: each worker finishes what it holds (up to
        ``STREAM_AHEAD`` + 1 scenarios for a streaming worker), then exits."""
        self._stop.set()

    def join(self) -> None:
        for t in self._threads:
            t.join()
        if self._failure is not None:
            raise self._failure


def run(
    backend_names,
    scenarios: list[Scenario],
    profile: Profile,
    seed: int = 0,
    device: str = "cpu",
    progress=None,
    scenario_refs=None,
    isolate: bool = False,
    timeout: float = 900.0,
    gpus: int = 1,
    pipelined: bool = True,
    time_backend: bool = False,
    log_dir: str | None = None,
) -> RunResult:
    """Verify every backend on every scenario. ``scenario_refs`` maps a scenario name to how
    the reproducer names it (a JSON file path for scenarios that are not in the catalog).
    ``isolate``: each backend samples in its own worker process (``harness.sampling.worker``): a
    crash, an import failure, or a load or scenario past ``timeout`` seconds becomes that
    backend's verdict and the run goes on (after a timeout, its scenarios not yet sampled
    are charged at once); ``log_dir``: its workers' stdout and stderr go to
    ``log_dir/backends/*.log``. ``gpus`` > 1 (isolated, on CUDA): each backend's
    scenarios are spread over that many workers, one GPU each. Checks are evaluated in
    catalog order whatever the sharding, so a run's records do not depend on ``gpus``.

    ``pipelined`` (default): planning, the backend's loading and sampling, and evaluation
    overlap (scenarios are planned and sampled in ``sampling_order``, evaluated in catalog
    order as their outcomes arrive), and with
    ``isolate`` every backend's workers start together (on a GPU they sample in turns);
    False plans everything, then samples everything backend after backend, then evaluates:
    the same records, more wall time.
    ``time_backend``: record the seconds inside the backends' ``sample`` calls
    (``RunResult.sample_call_seconds``; on CUDA it synchronizes around each call)."""
    if gpus > 1 and not (isolate and device != "cpu"):
        raise ValueError("gpus > 1 needs worker isolation on a CUDA device (not --in-process, not --device cpu)")
    start = time.perf_counter()
    result = RunResult([], profile, seed, 0.0, 0.0, scenarios={s.name: s.to_dict() for s in scenarios})
    rng = np.random.default_rng(seed)  # consumed by the checks in backend, then catalog order
    order = sampling_order(scenarios)
    plans = Plans(scenarios, profile, order)
    # Workers of every backend at once: each loads while the others sample (importing vLLM
    # alone takes 8-24 s on a GPU machine). On a GPU they take turns (a lock file per GPU),
    # streaming the scenarios waiting for them within a turn, so that each call has the
    # per-call memory budget (a turn's last items may overlap the next one's first).
    concurrent = pipelined and isolate and len(backend_names) > 1
    turns = tempfile.mkdtemp(prefix="specdec-gpu-turns-") if concurrent and device != "cpu" else None

    def start_sampling(name):
        return Sampling(
            name, len(scenarios), plans.work, profile, device, isolate, timeout, gpus, progress, time_backend, turns, order, log_dir
        )

    started = [start_sampling(name) for name in backend_names] if concurrent else []
    try:
        if not pipelined:
            plans.wait()
        for i, name in enumerate(backend_names):
            sampling = started[i] if concurrent else start_sampling(name)
            try:
                if not pipelined:
                    sampling.join()
                _evaluate_backend(result, name, scenarios, plans, sampling, rng, scenario_refs or {}, device)
            finally:
                sampling.stop()  # after a load error (or an exception): no more work for this backend
            sampling.join()
            result.backend_environments[name] = sampling.environments[0] if sampling.environments else None
            result.load_seconds[name] = sampling.load_seconds
        for i, scenario in enumerate(scenarios):  # the share's denominator, past a backend that did not load too
            result.planned_checks[scenario.name] = len(plans.get(i)[0])
    finally:
        for sampling in started:  # an exception in an earlier backend's evaluation: stop the rest too
            sampling.stop()
        plans.cancel()
        if turns:
            shutil.rmtree(turns, ignore_errors=True)
    result.family_alpha = decide_verdicts(result.records, profile.alpha)
    result.plan_seconds = plans.seconds
    result.seconds = time.perf_counter() - start
    return result


def _evaluate_backend(result: RunResult, name, scenarios, plans: Plans, sampling: Sampling, rng, refs, device) -> None:
    """Add one backend's records, scenario by scenario in catalog order as its outcomes arrive."""
    profile, seed = result.profile, result.seed
    elapsed = 0.0
    for i, scenario in enumerate(scenarios):
        planned, count = plans.get(i)  # a planning error is raised here, in catalog order
        result.planned_checks[scenario.name] = len(planned)
        outcome = sampling.outcome(i)
        if outcome[0] == "load-error":  # the backend could not load: one record, the run goes on
            result.records.append(_error_record(name, "-", -1, "load", outcome[1], ""))
            break
        repro = reproducer(name, profile, seed, refs.get(scenario.name, scenario.name), device)
        if outcome[0] == "tallies":
            elapsed += outcome[2]
            if outcome[3] is not None:
                result.sample_calls.setdefault(name, []).extend(outcome[3])
            tallies = outcome[1]
            result.trials[(name, scenario.name)] = max((t.trials for t in tallies if not isinstance(t, Declined)), default=count)
            if any(getattr(t, "repeatable", None) is False for t in tallies):
                result.unrepeatable.setdefault(name, []).append(scenario.name)
            t0 = time.perf_counter()
            for check in planned:
                tally = tallies[check.template]
                if isinstance(tally, Declined):
                    result.records.append(_skipped_record(name, scenario, check, f"declined by the backend: {tally.reason}", repro))
                else:
                    result.records.append(_record(name, scenario, check, check.evaluate(tally, rng), repro))
            result.evaluate_seconds += time.perf_counter() - t0
        elif outcome[0] == "unsupported":
            for check in planned:
                result.records.append(
                    _skipped_record(name, scenario, check, f"backend does not support this scenario: {outcome[1]}", repro)
                )
        else:
            result.records.append(_error_record(name, scenario.name, -1, "sample", outcome[1], repro))
    result.backend_seconds[name] = elapsed


def _sample_backend(name, work, profile, device, isolate, timeout, gpus, progress) -> tuple[list, dict | None]:
    """(one outcome per (scenario, trials) in ``work``, in order; the versions the backend
    loaded with, or None when it did not load): every item sampled before returning."""
    sampling = Sampling(name, len(work), work.__getitem__, profile, device, isolate, timeout, gpus, progress)
    sampling.join()
    return sampling.outcomes, (sampling.environments[0] if sampling.environments else None)


def _record(backend, scenario, check, outcome: Outcome, repro) -> CheckRecord:
    """The record of one evaluated check; a statistical one waits for its verdict from the
    run's family rule (``decide_verdicts``)."""
    if outcome.kind is Kind.SKIPPED:
        verdict = Verdict.SKIPPED
    elif outcome.kind.statistical:
        verdict = None
    else:
        verdict = Verdict.FAIL if outcome.deviated else Verdict.PASS
    o = outcome
    return CheckRecord(
        backend=backend, scenario=scenario.name, template=check.template, check=check.name,
        verdict=verdict, kind=o.kind, statistic=o.statistic, df=o.df, p_value=o.p_value,
        alpha=o.alpha, holm_threshold=None, trials=o.trials, detectable_tv=o.detectable_tv,
        tv_estimate=o.tv_estimate, tv_ci=o.tv_ci, message=o.message, reproducer=repro,
        method=scenario.method, cells=o.cells, acceptance=o.acceptance,
    )  # fmt: skip


def _skipped_record(backend, scenario, check, reason, repro) -> CheckRecord:
    return CheckRecord(backend, scenario.name, check.template, check.name, Verdict.SKIPPED, Kind.SKIPPED, reason, repro, scenario.method)


API_DRIFT = "vLLM API changed"  # adapters raise this when they cannot bind to the vLLM they find


def _error_record(backend, scenario, template, stage, message, repro) -> CheckRecord:
    kind = Kind.API_DRIFT if API_DRIFT in message else Kind.ERROR
    return CheckRecord(backend, scenario, template, stage, Verdict.ERROR, kind, message, repro)

"""One runner for the CLI and pytest: scenarios -> backend -> tally -> checks -> records.

Trial counts are fixed before sampling (the largest any planned check needs); the
backend sees chunks of trials sized to a memory budget; only counts are kept. Checks are
never retried. Holm's step-down controls the family-wise false-alarm rate of the run's
``m`` statistical checks at ``alpha * m``: it rejects everything Bonferroni at per-check
``alpha`` would, and more, so each check's stated power still holds.
"""

import shlex
import threading
import time
import traceback
from dataclasses import dataclass, field

import numpy as np

from harness import checks as checks_mod
from harness.backends import load_backend
from harness.profiles import Profile, get_profile
from harness.protocol import as_numpy_outputs, checked_outputs
from harness.records import CheckRecord
from harness.scenarios import Scenario, materialize, trials
from harness.stats import holm
from harness.tally import TemplateTally, add_outputs


class Unsupported(Exception):
    """The backend declared (through ``supports``) that it cannot run a scenario."""


@dataclass
class RunResult:
    records: list[CheckRecord]
    profile: Profile
    seed: int
    family_alpha: float
    seconds: float
    backend_seconds: dict = field(default_factory=dict)
    trials: dict = field(default_factory=dict)  # (backend, scenario) -> trials per template
    scenarios: dict = field(default_factory=dict)  # name -> scenario as JSON data
    backend_environments: dict = field(default_factory=dict)  # backend -> versions it loaded with (its worker's)

    @property
    def failed(self) -> bool:
        return any(r.verdict in ("fail", "error") for r in self.records)

    def counts(self) -> dict:
        out = {v: 0 for v in ("pass", "fail", "error", "skipped")}
        for r in self.records:
            out[r.verdict] += 1
        return out


def reproducer(backend: str, profile: Profile, seed: int, scenario_ref: str, device: str) -> str:
    """The one-line command that reruns a scenario (``scenario_ref``: catalog name or JSON file)."""
    cmd = ["python", "-m", "harness", "run", "--backend", backend, "--profile", profile.name]
    cmd += ["--seed", str(seed), "--scenario", scenario_ref]
    if profile.alpha != get_profile(profile.name).alpha:
        cmd += ["--alpha", repr(profile.alpha)]
    if device != "cpu":
        cmd += ["--device", device]
    return shlex.join(cmd)


def planned_trials(scenario: Scenario, profile: Profile) -> tuple[list, list[checks_mod.Check], int]:
    templates = materialize(scenario)
    planned = checks_mod.plan(scenario, templates, profile)
    return templates, planned, max(c.design_trials for c in planned)


def sample_scenario(backend, scenario: Scenario, templates, count: int, profile: Profile) -> list[TemplateTally]:
    """Run ``count`` trials of every template through ``backend``; return the tallies."""
    probe = trials(scenario, templates, 0, 1).batch  # what a backend supports depends on the templates only
    reason = backend.supports(probe) if hasattr(backend, "supports") else None
    if reason:
        raise Unsupported(reason)
    if getattr(backend, "device_batches", False):
        return _sample_on_device(backend, scenario, templates, count, profile)
    tallies = [TemplateTally(t.effective_drafts, scenario.vocab_size) for t in templates]
    chunk = _chunk_trials(scenario, templates, profile.chunk_elements)
    done = 0
    while done < count:
        n = min(chunk, count - done)
        tr = trials(scenario, templates, done, n)
        batch = tr.batch
        result = backend.sample(batch)
        tokens, emitted = as_numpy_outputs(result, batch.num_requests, batch.max_drafts)
        add_outputs(tallies, tokens, emitted, tr.drafts, done)
        done += n
    return tallies


# A row passed as a stride-0 view costs the backend its per-row scratch only (statistics per
# vocabulary tile, indices): counted as this many logits against the memory budget.
VIEW_ROW_ELEMENTS = 1024


def _chunk_trials(scenario: Scenario, templates, elements: int, row_elements: int | None = None) -> int:
    """Trials per backend call within a budget of ``elements`` logits; a row costs
    ``row_elements`` (default: the vocabulary, a materialized row)."""
    per_trial = sum(t.num_drafts + 1 for t in templates) * (row_elements or scenario.vocab_size)
    return max(1, elements // per_trial)


def _sample_on_device(backend, scenario: Scenario, templates, count: int, profile: Profile) -> list[TemplateTally]:
    """Inputs built and outputs tallied on the backend's device (``harness.device_trials``)."""
    from harness.device_tally import DeviceTally
    from harness.device_trials import DeviceTrials

    device = getattr(backend, "device", "cpu")
    built = DeviceTrials(scenario, templates, device, share_rows=getattr(backend, "shared_rows", False))
    built.prepare(count)
    tally = DeviceTally([t.effective_drafts for t in templates], scenario.vocab_size, count, scenario.max_drafts, device)
    budget = profile.chunk_elements if device == "cpu" else profile.device_chunk_elements
    views = built.shared_target and (built.shared_draft or not scenario.draft_probs)
    chunk = min(_chunk_trials(scenario, templates, budget, VIEW_ROW_ELEMENTS if views else None), count)
    done = 0
    while done < count:
        n = min(chunk, count - done)
        batch, _ = built.chunk(done, n)
        tokens, emitted = checked_outputs(backend.sample(batch), batch.num_requests, batch.max_drafts)
        tally.add(tokens, emitted, done)
        done += n
    return tally.finish(built.drafts)


def split_source(name: str) -> tuple[str, str | None]:
    """``vllm-mrv2@vendor/vllm-0.19.1`` -> (``vllm-mrv2``, ``vendor/vllm-0.19.1``): a backend
    bound to a vLLM source tree, so two vLLM versions can be verified in one run."""
    base, sep, src = name.partition("@")
    return base, (src if sep else None)


def load_for_device(name: str, device: str):
    base, src = split_source(name)
    if src:  # in a worker process this binds the tree for that backend alone
        import os

        from harness.backends.vllm_env import SRC_ENV, use_source_tree

        os.environ[SRC_ENV] = os.path.abspath(src)
        use_source_tree(src)
    backend = load_backend(base)
    devices = getattr(backend, "devices", ("cpu",))
    if device not in devices:
        raise ValueError(f"backend {name!r} runs on {', '.join(devices)}, not {device}")
    backend.device = device
    return backend


def sample_one(backend, scenario: Scenario, profile: Profile, count: int) -> tuple:
    """("tallies", tallies, seconds) | ("unsupported", reason) | ("error", message)."""
    try:
        templates = materialize(scenario)
        t0 = time.perf_counter()
        tallies = sample_scenario(backend, scenario, templates, count, profile)
        return ("tallies", tallies, time.perf_counter() - t0)
    except Unsupported as e:
        return ("unsupported", str(e))
    except Exception as e:
        return ("error", "".join(traceback.format_exception_only(type(e), e)).strip())


def _in_process(name, work, profile, device, timeout):
    try:
        backend = load_for_device(name, device)
    except Exception as e:  # a backend that cannot load is that backend's verdict
        yield None, ("load-error", str(e))
        return
    from harness.environment import backend_environment

    yield None, ("environment", backend_environment())
    for scenario, count in work:
        yield scenario, sample_one(backend, scenario, profile, count)


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
) -> RunResult:
    """Verify every backend on every scenario. ``scenario_refs`` maps a scenario name to how
    the reproducer names it (a JSON file path for scenarios that are not in the catalog).
    ``isolate``: each backend samples in its own worker process (``harness.worker``): a
    crash, a hang past ``timeout`` seconds per scenario or an import failure becomes that
    backend's verdict and the run goes on. ``gpus`` > 1 (isolated, on CUDA): each backend's
    scenarios are spread over that many workers, one GPU each. Checks are evaluated in
    catalog order whatever the sharding, so a run's records do not depend on ``gpus``."""
    if gpus > 1 and not (isolate and device != "cpu"):
        raise ValueError("gpus > 1 needs worker isolation on a CUDA device (not --in-process, not --device cpu)")
    start = time.perf_counter()
    records: list[CheckRecord] = []
    backend_seconds, trial_counts, backend_environments = {}, {}, {}
    rng = np.random.default_rng(seed)
    plans = {id(s): planned_trials(s, profile)[1:] for s in scenarios}  # laws once per run
    work = [(s, plans[id(s)][1]) for s in scenarios]
    for name in backend_names:
        outcomes, backend_environments[name] = _sample_backend(name, work, profile, device, isolate, timeout, gpus, progress)
        elapsed = 0.0
        for scenario, outcome in zip(scenarios, outcomes):
            if outcome[0] == "load-error":  # the backend could not load: one record, the run goes on
                records.append(_error_record(name, "-", -1, "load", outcome[1], ""))
                break
            repro = reproducer(name, profile, seed, (scenario_refs or {}).get(scenario.name, scenario.name), device)
            planned, count = plans[id(scenario)]
            if outcome[0] == "tallies":
                elapsed += outcome[2]
                trial_counts[(name, scenario.name)] = count
                for check in planned:
                    records.append(_record(name, scenario, check, check.evaluate(outcome[1][check.template], rng), repro))
            elif outcome[0] == "unsupported":
                for check in planned:
                    records.append(_skipped_record(name, scenario, check, f"backend does not support this scenario: {outcome[1]}", repro))
            else:
                records.append(_error_record(name, scenario.name, -1, "sample", outcome[1], repro))
        backend_seconds[name] = elapsed
    family = _apply_holm(records, profile.alpha)
    described = {s.name: s.to_dict() for s in scenarios}
    return RunResult(
        records, profile, seed, family, time.perf_counter() - start, backend_seconds, trial_counts, described, backend_environments
    )


def _sample_backend(name, work, profile, device, isolate, timeout, gpus, progress) -> tuple[list, dict | None]:
    """(one outcome per work item, in order, a load failure giving ("load-error", why);
    the versions the backend loaded with, or None when it did not load)."""
    from harness.worker import sample_isolated

    shards = [list(range(g, len(work), gpus)) for g in range(gpus)] if gpus > 1 else [list(range(len(work)))]
    outcomes: list = [None] * len(work)
    environments: list = []  # one per worker (the same unless workers differ)
    lock = threading.Lock()

    def serve(shard: list[int], gpu: int | None) -> None:
        items = [work[i] for i in shard]
        if isolate:
            stream = sample_isolated(name, items, profile, device, timeout, gpu=gpu)
        else:
            stream = _in_process(name, items, profile, device, timeout)
        pending = iter(shard)
        for scenario, outcome in stream:
            with lock:
                if outcome[0] == "environment":  # what the backend loaded with, before any scenario
                    environments.append(outcome[1])
                    continue
                if scenario is None:  # every remaining item of this shard gets the load error
                    for j in shard:
                        outcomes[j] = outcomes[j] or outcome
                    if progress:
                        progress(sum(1 for j in shard if outcomes[j] is outcome))
                    return
                outcomes[next(pending)] = outcome
                if progress:
                    progress(1)

    if gpus > 1:
        threads = [threading.Thread(target=serve, args=(shard, g)) for g, shard in enumerate(shards) if shard]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        serve(shards[0], None)
    return outcomes, (environments[0] if environments else None)


def _record(backend, scenario, check, v, repro) -> CheckRecord:
    if v.passed is None:
        verdict = "skipped"
    else:
        verdict = "pass" if v.passed else "fail"
    return CheckRecord(
        backend=backend, scenario=scenario.name, template=check.template, check=check.name,
        verdict=verdict, kind=v.kind, statistic=v.statistic, df=v.df, p_value=v.p_value,
        alpha=v.alpha, holm_threshold=None, trials=v.trials, detectable_tv=v.detectable_tv,
        tv_estimate=v.tv_estimate, tv_ci=v.tv_ci, message=v.message, reproducer=repro,
        method=scenario.method, cells=v.cells, extra=v.extra,
    )  # fmt: skip


def _skipped_record(backend, scenario, check, reason, repro) -> CheckRecord:
    return CheckRecord(backend, scenario.name, check.template, check.name, "skipped", "skipped", reason, repro, scenario.method)


API_DRIFT = "vLLM API changed"  # adapters raise this when they cannot bind to the vLLM they find


def _error_record(backend, scenario, template, stage, message, repro) -> CheckRecord:
    kind = "api-drift" if API_DRIFT in message else "error"
    return CheckRecord(backend, scenario, template, stage, "error", kind, message, repro)


def _apply_holm(records: list[CheckRecord], alpha: float) -> float:
    """Holm over every statistical check of the run; exact checks stand on their own."""
    stat = [r for r in records if r.kind in ("gof", "binomial") and r.p_value is not None]
    family = alpha * max(len(stat), 1)
    if stat:
        rejected, thresholds = holm([r.p_value for r in stat], family)
        for r, rej, thr in zip(stat, rejected, thresholds):
            r.holm_threshold = float(thr)
            r.verdict = "fail" if rej else "pass"
    return family

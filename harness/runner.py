"""One runner for the CLI and pytest: scenarios -> backend -> tally -> checks -> records.

Trial counts are fixed before sampling (the largest any planned check needs); the
backend sees chunks of trials sized to a memory budget; only counts are kept. The stages
overlap: a background thread plans the scenarios in order (``Plans``), every backend's
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
import traceback
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from harness import checks as checks_mod
from harness.backends import load_backend
from harness.device import gpu_sharers
from harness.profiles import Profile, get_profile
from harness.protocol import MalformedOutputs, as_numpy_outputs, check_integer_outputs, checked_outputs
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
        return any(r.verdict in ("fail", "error") for r in self.records)

    def counts(self) -> dict:
        out = {v: 0 for v in ("pass", "fail", "error", "skipped")}
        for r in self.records:
            out[r.verdict] += 1
        return out

    def coverage(self) -> dict:
        """backend -> how much of its planned checks was verified: ``planned`` (the catalog's
        checks for the run's scenarios), ``evaluated`` (passed or failed), ``share``."""
        planned = sum(self.planned_checks.values())
        out = {}
        for name in dict.fromkeys(r.backend for r in self.records):
            evaluated = sum(1 for r in self.records if r.backend == name and r.verdict in ("pass", "fail"))
            out[name] = {"planned": planned, "evaluated": evaluated, "share": evaluated / planned if planned else 0.0}
        return out

    def unverified(self) -> list[str]:
        """One line for each backend for which no check was evaluated (all skipped or errors)."""
        lines = []
        for name, c in self.coverage().items():
            if c["evaluated"] == 0:
                mine = [r for r in self.records if r.backend == name]
                first = next((r.message for r in mine if r.verdict in ("skipped", "error")), "no records")
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


def planned_trials(scenario: Scenario, profile: Profile) -> tuple[list, list[checks_mod.Check], int]:
    templates = materialize(scenario)
    planned = checks_mod.plan(scenario, templates, profile)
    return templates, planned, max(c.design_trials for c in planned)


def sample_scenario(backend, scenario: Scenario, templates, count: int, profile: Profile) -> list[TemplateTally]:
    """Run ``count`` trials of every template through ``backend``; return the tallies."""
    return start_scenario(backend, scenario, templates, count, profile).tallies()


class Started:
    """A scenario's sampling, queued: ``tallies()`` waits for its counts; ``ready()`` says
    whether they are back (until then the device may still be working on it, and the host
    can prepare the next scenarios)."""

    def __init__(self, tallies, ready=None):
        # tallies: the function that waits for them; ready: None when they are complete already
        self._tallies, self._ready = tallies, ready

    @classmethod
    def complete(cls, tallies: list) -> "Started":
        return cls(lambda: tallies)

    def ready(self) -> bool:
        return self._ready is None or self._ready()

    def tallies(self) -> list[TemplateTally]:
        return self._tallies()


class ProtocolError(Exception):
    """The backend broke the protocol (``harness.protocol``) in a way no check can score."""


@dataclass(frozen=True)
class Declined:
    """A template the backend declined (``supports``): in the tallies' place, its reason."""

    reason: str


def start_scenario(backend, scenario: Scenario, templates, count: int, profile: Profile) -> Started:
    """``sample_scenario`` up to its last wait: batches built and tallied on a GPU are left
    queued there, only the host path's tallies are complete. Templates the backend declines
    are ``Declined`` in the tallies; the rest are sampled in as few batches as it accepts."""
    groups, declined, reason = accepted_groups(backend, scenario, templates)
    if not groups:
        raise Unsupported(reason)
    started = [(group, _start_group(backend, scenario, [templates[i] for i in group], count, profile)) for group in groups]

    def tallies():
        out: list = [Declined(declined[i]) if i in declined else None for i in range(len(templates))]
        for group, one in started:
            for i, tally in zip(group, one.tallies()):
                out[i] = tally
        return out

    if len(started) == 1 and not declined:
        return started[0][1]
    return Started(tallies, lambda: all(one.ready() for _, one in started))


def accepted_groups(backend, scenario: Scenario, templates) -> tuple[list[list[int]], dict[int, str], str | None]:
    """(template indices in batches the backend accepts, {declined index: reason}, why it
    declined the whole scenario or None). The whole scenario in one batch when it accepts
    that; else each template is asked alone, and the accepted ones are put together while it
    accepts them together."""
    reason = _asked(backend, scenario, templates)
    if reason is None:
        return [list(range(len(templates)))], {}, None
    if len(templates) == 1:
        return [], {0: reason}, reason
    declined = {i: _asked(backend, scenario, [t]) for i, t in enumerate(templates)}
    declined = {i: why for i, why in declined.items() if why is not None}
    groups: list[list[int]] = []
    for i in (i for i in range(len(templates)) if i not in declined):
        group = next((g for g in groups if _asked(backend, scenario, [templates[j] for j in g + [i]]) is None), None)
        if group is None:
            groups.append([i])
        else:
            group.append(i)
    return groups, declined, reason


def _asked(backend, scenario: Scenario, templates) -> str | None:
    """The backend's ``supports`` on one trial of ``templates`` (what it supports depends on
    the templates only), held to the protocol: None or a non-empty reason string."""
    if not hasattr(backend, "supports"):
        return None
    reason = backend.supports(trials(scenario, templates, 0, 1).batch)
    if reason is None or (isinstance(reason, str) and reason.strip()):
        return reason
    name = getattr(backend, "name", type(backend).__name__)
    raise ProtocolError(f"backend {name!r}: supports() returned {reason!r}; expected None or a non-empty reason string")


def _start_group(backend, scenario: Scenario, templates, count: int, profile: Profile) -> Started:
    if getattr(backend, "device_batches", False):
        return _sample_on_device(backend, scenario, templates, count, profile)
    tallies = [TemplateTally(t.effective_drafts, scenario.vocab_size) for t in templates]
    repeatable = _repeatable(backend, scenario, templates)
    chunk = _chunk_trials(scenario, templates, profile.chunk_elements)
    done = 0
    while done < count:
        n = min(chunk, count - done)
        tr = trials(scenario, templates, done, n)
        batch = tr.batch
        result = backend.sample(batch)
        try:
            tokens, emitted = as_numpy_outputs(result, batch.num_requests, batch.max_drafts)
        except MalformedOutputs as e:
            return Started.complete(_all_malformed(tallies, count, str(e)))
        add_outputs(tallies, tokens, emitted, tr.drafts, done)
        done += n
    for tally in tallies:
        tally.repeatable = repeatable
    return Started.complete(tallies)


def _repeatable(backend, scenario: Scenario, templates) -> bool | None:
    """Whether two calls on the same one-trial batch emit the same tokens (None: the calls
    did not give well-formed outputs; the sampling proper reports that)."""
    outputs = []
    for _ in range(2):
        batch = trials(scenario, templates, 0, 1).batch
        try:
            outputs.append(as_numpy_outputs(backend.sample(batch), batch.num_requests, batch.max_drafts))
        except ValueError:
            return None
    return _same_emitted(*outputs[0], *outputs[1])


def _same_emitted(tokens_a, emitted_a, tokens_b, emitted_b) -> bool:
    """Whether two outputs emitted the same tokens (slots past ``num_emitted`` are not read)."""
    shown = np.arange(tokens_a.shape[1])[None, :] < emitted_a[:, None]
    return bool((emitted_a == emitted_b).all() and (np.where(shown, tokens_a, 0) == np.where(shown, tokens_b, 0)).all())


def _all_malformed(tallies: list[TemplateTally], count: int, reason: str) -> list[TemplateTally]:
    """Every trial a structure violation: outputs that are not token ids cannot be scored."""
    for tally in tallies:
        tally.outcome[:] = 0
        tally.steps[:] = 0
        tally.trials, tally.violations, tally.example = count, count, {"reason": reason}
    return tallies


# A row passed as a stride-0 view costs the backend its per-row scratch only (statistics per
# vocabulary tile, indices): counted as this many logits against the memory budget, at any
# vocabulary (the scratch does not shrink with it).
VIEW_ROW_ELEMENTS = 1024


def _chunk_trials(scenario: Scenario, templates, elements: int, row_elements: int | None = None) -> int:
    """Trials per backend call within a budget of ``elements`` logits; a row costs
    ``row_elements`` (default: the vocabulary, a materialized row)."""
    per_trial = sum(t.num_drafts + 1 for t in templates) * (row_elements or scenario.vocab_size)
    return max(1, elements // per_trial)


def device_chunk_elements(profile: Profile) -> int:
    """The profile's per-call logits budget on a GPU, divided between the processes that
    use the GPU at once (``pytest -n N`` with more workers than GPUs)."""
    return profile.device_chunk_elements // gpu_sharers()


def device_trials(backend, scenario: Scenario, templates, count: int, profile: Profile):
    """(``count`` trials built on the backend's device, trials per backend call)."""
    from harness.device_trials import DeviceTrials

    device = getattr(backend, "device", "cpu")
    built = DeviceTrials(scenario, templates, device, share_rows=getattr(backend, "shared_rows", False))
    built.prepare(count)
    budget = profile.chunk_elements if device == "cpu" else device_chunk_elements(profile)
    views = built.shared_target and (built.shared_draft or not scenario.draft_probs)
    chunk = _chunk_trials(scenario, templates, budget, VIEW_ROW_ELEMENTS if views else None)
    # An even chunk starts every chunk's slices of the run-long int64 fields (positions,
    # seeds, drafts) 16-byte aligned: Triton compiles a kernel again for each alignment.
    return built, count if chunk >= count else max(1, chunk - chunk % 2)


def _sample_on_device(backend, scenario: Scenario, templates, count: int, profile: Profile) -> Started:
    """Inputs built and outputs tallied on the backend's device (``harness.device_trials``);
    the counts are left queued there (``DeviceTally.start_finish``). The first chunk is
    sampled twice, so that a backend whose outputs differ for the same inputs is flagged."""
    from harness.device_tally import DeviceTally

    built, chunk = device_trials(backend, scenario, templates, count, profile)
    effective = [t.effective_drafts for t in templates]
    tally = DeviceTally(effective, scenario.vocab_size, count, scenario.max_drafts, built.device, built.kernels)
    done, same = 0, None
    while done < count:
        n = min(chunk, count - done)
        batch, _ = built.chunk(done, n)
        tokens, emitted = checked_outputs(backend.sample(batch), batch.num_requests, batch.max_drafts)
        try:
            check_integer_outputs(tokens, emitted)
        except MalformedOutputs as e:
            return Started.complete(_all_malformed([TemplateTally(d, scenario.vocab_size) for d in effective], count, str(e)))
        tally.add(tokens, emitted, done)
        if done == 0:
            same = _same_on_device(backend, built, batch, tally, n)
        done += n
    queued = tally.start_finish(built.drafts)

    def tallies():
        out = queued.tallies()
        repeatable = None if same is None else bool(same.item())
        for t in out:
            t.repeatable = repeatable
        return out

    return Started(tallies, queued.ready)


def _same_on_device(backend, built, batch, tally, n: int):
    """A device bool: whether the backend emits the same tokens twice for the same inputs;
    None when a call gives no well-formed outputs. On CUDA the first chunk (trials 0..n, in
    ``tally``) is sampled again: its shapes are compiled already. On the CPU, where a Triton
    kernel is interpreted and a chunk can take minutes, one trial is sampled twice."""
    import torch

    def call(b):
        tokens, emitted = checked_outputs(backend.sample(b), b.num_requests, b.max_drafts)
        check_integer_outputs(tokens, emitted)
        return torch.as_tensor(tokens).clone(), torch.as_tensor(emitted).clone()  # outputs may live in reused buffers

    try:
        if torch.device(built.device).type == "cpu":
            one, _ = built.chunk(0, 1)
            (first_tokens, first_emitted), (tokens, emitted) = call(one), call(one)
        else:
            tokens, emitted = call(batch)
            first_tokens, first_emitted = tally.tokens[:n].reshape(tokens.shape), tally.emitted[:n].reshape(emitted.shape)
    except ValueError:
        return None
    shown = torch.arange(tokens.shape[1], device=tokens.device)[None, :] < first_emitted[:, None]
    return (first_emitted == emitted).all() & ((first_tokens == tokens) | ~shown).all()


def split_source(name: str) -> tuple[str, str | None]:
    """``vllm-mrv2@vendor/vllm-0.19.1`` -> (``vllm-mrv2``, ``vendor/vllm-0.19.1``): a backend
    bound to a vLLM source tree, so two vLLM versions can be verified in one run."""
    base, sep, src = name.partition("@")
    return base, (src if sep else None)


def load_for_device(name: str, device: str):
    base, src = split_source(name)
    if src:  # in a worker process this binds the tree for that backend alone
        from harness.backends.vllm_env import SRC_ENV, use_source_tree

        os.environ[SRC_ENV] = os.path.abspath(src)
        use_source_tree(src)
    backend = load_backend(base)
    devices = getattr(backend, "devices", ("cpu",))
    if device not in devices:
        raise ValueError(f"backend {name!r} runs on {', '.join(devices)}, not {device}")
    backend.device = device
    return backend


class TimedBackend:
    """``backend`` with the (start, end) of each of its own ``sample`` calls (on CUDA the device
    is synchronized around each call, so its kernels are counted rather than queued). The
    clock (``perf_counter``, monotonic) is the machine's: worker processes' calls line up."""

    def __init__(self, backend):
        self._backend, self.calls = backend, []
        self._sync = _cuda_synchronize if getattr(backend, "device", "cpu") == "cuda" else _no_sync

    def __getattr__(self, name):  # supports, device_batches, shared_rows, ...: the backend's own
        return getattr(self._backend, name)

    def sample(self, batch):
        self._sync()
        t0 = time.perf_counter()
        out = self._backend.sample(batch)
        self._sync()
        self.calls.append((t0, time.perf_counter()))
        return out


def _cuda_synchronize():
    import torch

    torch.cuda.synchronize()


def _no_sync():
    pass


def sample_one(backend, scenario: Scenario, profile: Profile, count: int, time_backend: bool = False) -> tuple:
    """("tallies", tallies, seconds, [(start, end)] of the ``backend.sample`` calls or None) |
    ("unsupported", reason) | ("error", message). ``time_backend``: measure the calls (off
    by default: on CUDA it synchronizes around every call)."""
    return start_one(backend, scenario, profile, count, time_backend).outcome()


class StartedOne:
    """``start_one``'s result: ``outcome()`` waits for the scenario's outcome."""

    def __init__(self, started: Started | None, outcome: tuple | None = None, seconds=0.0, timed=None):
        self._started, self._outcome, self._seconds, self._timed = started, outcome, seconds, timed

    def ready(self) -> bool:
        """Whether ``outcome()`` would not wait for the device. A device error (a CUDA fault,
        reported by any later query) counts as ready: ``outcome()`` then gives it as an error."""
        try:
            return self._started is None or self._started.ready()
        except Exception:
            return True

    def outcome(self) -> tuple:
        if self._outcome is None:
            try:
                t0 = time.perf_counter()
                tallies = self._started.tallies()
                seconds = self._seconds + time.perf_counter() - t0
                self._outcome = ("tallies", tallies, seconds, self._timed.calls if self._timed else None)
            except Exception as e:
                self._outcome = _failure(e)
            self._started = None  # its device buffers go
        return self._outcome


def start_one(backend, scenario: Scenario, profile: Profile, count: int, time_backend: bool = False) -> StartedOne:
    """``sample_one`` up to its last wait (``start_scenario``); an error raised here is the
    outcome. Its seconds are those spent here and in waiting for its counts, not the next
    scenario's start in between (``sample_stream``)."""
    try:
        templates = materialize(scenario)
        timed = TimedBackend(backend) if time_backend else None
        t0 = time.perf_counter()
        started = start_scenario(timed or backend, scenario, templates, count, profile)
        return StartedOne(started, None, time.perf_counter() - t0, timed)
    except Exception as e:
        return StartedOne(None, _failure(e))


def _failure(e: Exception) -> tuple:
    if isinstance(e, Unsupported):
        return ("unsupported", str(e))
    return ("error", "".join(traceback.format_exception_only(type(e), e)).strip())


# How far a stream runs ahead on a GPU: scenarios queued there before the oldest one's counts
# are read, while the process's tensors take less than this share of the device's memory.
# Deep enough that the host prepares all of the `gpu` catalog's small scenarios (host-bound:
# about 2 ms of host work each) while its large-vocabulary one samples (0.18 s on an H100);
# 16 ahead left the last 20 to be prepared after it, with the device idle
# (benchmarks/RESULTS.md#sampling-loop-overhead).
STREAM_AHEAD = 64
STREAM_MEMORY_SHARE = 0.25


def sample_stream(backend, work, profile: Profile, time_backend: bool = False, ahead: int = STREAM_AHEAD, available=None):
    """(scenario, ``sample_one``'s outcome) for each (scenario, trials) of ``work``, in order.
    On a GPU the stream runs ahead: scenarios are prepared and queued while the oldest queued
    one's counts are not back, up to ``ahead`` of them and ``STREAM_MEMORY_SHARE`` of the
    device's memory, so the device works while the host builds the next inputs.
    ``available()``: whether the next item of ``work`` can be had without waiting; while it
    cannot, the oldest queued outcome is given first (a worker must not block on its pipe
    holding the outcome its parent waits for). Default: always."""
    work = iter(work)
    queued = deque()  # (scenario, StartedOne), oldest first, outcomes not yet read

    def oldest():
        scenario, started = queued.popleft()
        return scenario, started.outcome()

    while True:
        if queued and available is not None and not available():
            yield oldest()
            continue
        item = next(work, None)
        if item is None:
            break
        scenario, count = item
        queued.append((scenario, start_one(backend, scenario, profile, count, time_backend)))
        while queued and (queued[0][1].ready() or len(queued) > ahead or _memory_full(backend)):
            yield oldest()
    while queued:
        yield oldest()


def _memory_full(backend) -> bool:
    """Whether this process's tensors hold ``STREAM_MEMORY_SHARE`` of its GPU's share."""
    if getattr(backend, "device", "cpu") != "cuda":
        return False
    import torch

    device = torch.cuda.current_device()
    total = torch.cuda.get_device_properties(device).total_memory
    # The allocator's own counter: torch.cuda.memory_allocated flattens every statistic into a
    # dict first, about 0.2 ms a call under cProfile.
    allocated = torch._C._cuda_memoryStats(device)["allocated_bytes"]["all"]["current"]
    return allocated > STREAM_MEMORY_SHARE * total / gpu_sharers()


def _in_process(name, work, profile, device, timeout, gpu=None, time_backend=False, turns=None, log_path=None):  # turns: see Sampling
    # log_path unused: in process, the backend's output cannot be told from the tool's
    try:
        backend = load_for_device(name, device)
    except Exception as e:  # a backend that cannot load is that backend's verdict
        yield None, ("load-error", str(e))
        return
    from harness.environment import backend_environment

    yield None, ("environment", backend_environment())
    yield from sample_stream(backend, work, profile, time_backend)


def sampling_order(scenarios: list[Scenario]) -> list[int]:
    """The scenarios' indices, the costliest per trial first (vocabulary x rows per trial;
    catalog order among equals). A stream then queues the cheap scenarios, whose host work
    outweighs their device work, while the device samples the large ones; on several GPUs
    the round robin over this order spreads the large ones."""

    def cost(i: int) -> int:
        s = scenarios[i]
        return s.vocab_size * sum(r.num_drafts + 1 for r in s.requests)

    return sorted(range(len(scenarios)), key=lambda i: -cost(i))


class Plans:
    """Every scenario's (checks, trials), planned by a background thread in ``order`` (the
    sampling order; default catalog order), once per run for every backend: sampling starts
    with the first plan, not after the last."""

    def __init__(self, scenarios: list[Scenario], profile: Profile, order: list[int] | None = None):
        self.seconds = 0.0  # spent planning (while other threads run, so a little more than alone)
        self._scenarios = scenarios
        self._plans: list = [None] * len(scenarios)
        self._done = [threading.Event() for _ in scenarios]
        self._error: BaseException | None = None
        self._cancelled = threading.Event()
        order = range(len(scenarios)) if order is None else order
        self._thread = threading.Thread(target=self._plan_all, args=(scenarios, profile, order), name="planning", daemon=True)
        self._thread.start()

    def _plan_all(self, scenarios, profile, order) -> None:
        try:
            for i in order:
                if self._cancelled.is_set():
                    break
                t0 = time.perf_counter()
                self._plans[i] = planned_trials(scenarios[i], profile)[1:]  # the templates are not kept
                self.seconds += time.perf_counter() - t0
                self._done[i].set()
        except BaseException as e:  # raised to whoever asks for this plan or a later one
            self._error = e
        finally:
            for done in self._done:  # nobody waits forever on a plan that will not come
                done.set()

    def get(self, i: int) -> tuple[list[checks_mod.Check], int]:
        self._done[i].wait()
        if self._plans[i] is None:
            raise self._error or RuntimeError("planning was cancelled")
        return self._plans[i]

    def work(self, i: int) -> tuple[Scenario, int] | None:
        """(scenario, trials) to sample, or None when planning failed or was cancelled."""
        self._done[i].wait()
        return None if self._plans[i] is None else (self._scenarios[i], self._plans[i][1])

    def wait(self) -> None:
        self._thread.join()

    def cancel(self) -> None:
        self._cancelled.set()


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
        from harness.worker import backend_log_path

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
            yield item

    def _serve(self, shard: list[int], gpu: int | None) -> None:
        from harness.worker import sample_isolated

        sampler = sample_isolated if self._isolate else _in_process
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
    ``isolate``: each backend samples in its own worker process (``harness.worker``): a
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
    result.family_alpha = _apply_holm(result.records, profile.alpha)
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
            result.trials[(name, scenario.name)] = count
            tallies = outcome[1]
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

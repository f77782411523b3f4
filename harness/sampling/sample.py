"""One scenario through one backend: what it supports (per template when a batch is
declined), chunks of trials within the profile's memory budget, the host path or the
device path (inputs built and outputs tallied on the backend's device), repeatability,
and the outcome (tallies, unsupported or error) that leaves this stage.

A scenario with a stop rule (``stop``: its monitored checks, ``harness.checking.sequential``)
is looked at on the host path after ``FIRST_LOOK`` trials and then each time the trials
double, and stops early once a monitored check rejects (``TemplateTally.stopped``). The device
path does not look: it samples the full count."""

import time
import traceback
from dataclasses import dataclass

import numpy as np

from harness.gpus import gpu_sharers
from harness.protocol import MalformedOutputs, as_numpy_drafted_outputs, as_numpy_outputs, check_integer_outputs, checked_outputs
from harness.sampling.tally import TemplateTally, add_outputs
from harness.scenarios.materialize import materialize, trials
from harness.scenarios.profiles import Profile
from harness.scenarios.scenario import Scenario

FIRST_LOOK = 64  # trials at a stop rule's first look; each later look doubles them


class Unsupported(Exception):
    """The backend declared (through ``supports``) that it cannot run a scenario."""


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


def start_scenario(backend, scenario: Scenario, templates, count: int, profile: Profile, stop=None) -> Started:
    """``sample_scenario`` up to its last wait: batches built and tallied on a GPU are left
    queued there, only the host path's tallies are complete. Templates the backend declines
    are ``Declined`` in the tallies; the rest are sampled in as few batches as it accepts.
    ``stop``: the scenario's stop rule (``sequential.StopRule``: ``stop.start()`` gives a
    function of ``{template: tally}`` that says whether to stop), or None."""
    groups, declined, reason = accepted_groups(backend, scenario, templates)
    if not groups:
        raise Unsupported(reason)
    rule = None if stop is None else stop.start()
    started = [
        (group, _start_group(backend, scenario, [templates[i] for i in group], count, profile, _looks(rule, group))) for group in groups
    ]

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
    if scenario.draft_mode == "engine" and not getattr(backend, "drafter", False):
        return "the backend does not draw its own drafts (protocol: drafter = True)"
    if not hasattr(backend, "supports"):
        return None
    reason = backend.supports(trials(scenario, templates, 0, 1).batch)
    if reason is None or (isinstance(reason, str) and reason.strip()):
        return reason
    name = getattr(backend, "name", type(backend).__name__)
    raise ProtocolError(f"backend {name!r}: supports() returned {reason!r}; expected None or a non-empty reason string")


def _looks(rule, group: list[int]):
    """The stop rule's look at one group's tallies (a function of them), or None."""
    return None if rule is None else (lambda tallies: rule(dict(zip(group, tallies))))


def _start_group(backend, scenario: Scenario, templates, count: int, profile: Profile, looks=None) -> Started:
    """One batch of templates to ``count`` trials; with ``looks`` (host path only), looked at
    after ``FIRST_LOOK`` trials and each time they double (about ten looks to a ``ci`` count, so
    small calls and the looks' cost stay negligible), and stopped once it says so."""
    drafted = scenario.draft_mode == "engine"  # the backend's drafter draws: its drafts come back with its outputs
    if getattr(backend, "device_batches", False) and not drafted:
        return _sample_on_device(backend, scenario, templates, count, profile)
    tallies = [TemplateTally(t.effective_drafts, scenario.vocab_size) for t in templates]
    repeatable = _repeatable(backend, scenario, templates)
    chunk = _chunk_trials(scenario, templates, profile.chunk_elements)
    done = 0
    while done < count:
        n = min(chunk, count - done, max(FIRST_LOOK, done) if looks else count)
        tr = trials(scenario, templates, done, n)
        batch = tr.batch
        result = backend.sample(batch)
        drafts = tr.drafts
        try:
            if drafted:
                tokens, emitted, flat = as_numpy_drafted_outputs(result, batch.num_requests, batch.max_drafts, len(batch.draft_tokens))
                drafts = per_trial_drafts(flat, templates, n, scenario.max_drafts)
            else:
                tokens, emitted = as_numpy_outputs(result, batch.num_requests, batch.max_drafts)
        except MalformedOutputs as e:
            return Started.complete(_all_malformed(tallies, count, str(e)))
        add_outputs(tallies, tokens, emitted, drafts, done, drafted)
        done += n
        if looks is not None and done < count and looks(tallies):
            for tally in tallies:
                tally.stopped = True
            break
    for tally in tallies:
        tally.repeatable = repeatable
    return Started.complete(tallies)


def per_trial_drafts(flat: np.ndarray, templates, count: int, k: int) -> np.ndarray:
    """A batch's ``[D]`` drafts as ``[count, T, K]`` (-1 past each template's count)."""
    counts = np.array([t.num_drafts for t in templates])
    out = np.full((count, len(templates), k), -1, dtype=np.int64)
    per_trial = flat.reshape(count, int(counts.sum()))
    at = np.concatenate([[0], np.cumsum(counts)])
    for i, d in enumerate(counts):
        out[:, i, :d] = per_trial[:, at[i] : at[i] + d]
    return out


def _repeatable(backend, scenario: Scenario, templates) -> bool | None:
    """Whether two calls on the same one-trial batch emit the same tokens (None: the calls
    did not give well-formed outputs; the sampling proper reports that)."""
    outputs = []
    for _ in range(2):
        batch = trials(scenario, templates, 0, 1).batch
        try:
            result = backend.sample(batch)
            drafted = scenario.draft_mode == "engine" and isinstance(result, tuple)
            outputs.append(as_numpy_outputs(result[:2] if drafted else result, batch.num_requests, batch.max_drafts))
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
    from harness.sampling.device.trials import DeviceTrials

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
    """Inputs built and outputs tallied on the backend's device (``harness.sampling.device.trials``);
    the counts are left queued there (``DeviceTally.start_finish``). The first chunk is
    sampled twice, so that a backend whose outputs differ for the same inputs is flagged.
    No stop rule is looked at here (the counts stay on the device until the end): the full
    count is sampled."""
    from harness.sampling.device.tally import DeviceTally

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


def sample_one(backend, scenario: Scenario, profile: Profile, count: int, time_backend: bool = False, stop=None) -> tuple:
    """("tallies", tallies, seconds, [(start, end)] of the ``backend.sample`` calls or None) |
    ("unsupported", reason) | ("error", message). ``time_backend``: measure the calls (off
    by default: on CUDA it synchronizes around every call). ``stop``: as ``start_scenario``."""
    return start_one(backend, scenario, profile, count, time_backend, stop).outcome()


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


def start_one(backend, scenario: Scenario, profile: Profile, count: int, time_backend: bool = False, stop=None) -> StartedOne:
    """``sample_one`` up to its last wait (``start_scenario``); an error raised here is the
    outcome. Its seconds are those spent here and in waiting for its counts, not the next
    scenario's start in between (``sample_stream``)."""
    try:
        templates = materialize(scenario)
        timed = TimedBackend(backend) if time_backend else None
        t0 = time.perf_counter()
        started = start_scenario(timed or backend, scenario, templates, count, profile, stop)
        return StartedOne(started, None, time.perf_counter() - t0, timed)
    except Exception as e:
        return StartedOne(None, _failure(e))


def _failure(e: Exception) -> tuple:
    if isinstance(e, Unsupported):
        return ("unsupported", str(e))
    return ("error", "".join(traceback.format_exception_only(type(e), e)).strip())

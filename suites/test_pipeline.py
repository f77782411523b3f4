"""The pipelined runner: planning, sampling and evaluation overlap, and the records are the
ones of the serial order (plan everything, sample everything, evaluate in catalog order
with one generator)."""

import fcntl
import multiprocessing
import os
import threading
import time

import numpy as np
import pytest

import harness.run.plans as plans_mod
import harness.run.runner as runner
import harness.sampling.sample as sample_mod
import harness.sampling.stream as stream_mod
import harness.sampling.turns as taking_turns
from harness.backends.loading import load_for_device
from harness.gpus import gpu_skip_reason
from harness.run.plans import planned_trials
from harness.run.runner import run
from harness.sampling.sample import sample_scenario
from harness.sampling.turns import device_turn
from harness.sampling.worker import sample_isolated
from harness.scenarios.catalog import catalog
from harness.scenarios.profiles import get_profile
from harness.scenarios.scenario import Scenario
from reference.methods import Method
from suites.helpers import MARK

PROFILE = get_profile("smoke")
NAMES = ("greedy-ties", "standard-near-target", "block-fixed", "synthetic-rates", "strict-fixed")
SCENARIOS = [s for s in catalog(PROFILE) if s.name in NAMES]
BACKENDS = ["reference", "fault:bonus-wrong-row"]  # a failing one: its statistics are not all near the null's


def serial_verdicts(backend_names, scenarios, profile, seed):
    """The run written out in the serial order, one rng consumed backend by backend in catalog order."""
    rng = np.random.default_rng(seed)
    plans = [planned_trials(s, profile) for s in scenarios]
    out = []
    for name in backend_names:
        backend = load_for_device(name, "cpu")
        for s, (templates, planned, count) in zip(scenarios, plans):
            tallies = sample_scenario(backend, s, templates, count, profile)
            out += [(name, s.name, c.template, c.name, c.evaluate(tallies[c.template], rng)) for c in planned]
    return out


def fields(records):
    return [(r.backend, r.scenario, r.template, r.check, r.statistic, r.p_value, r.trials, r.tv_estimate, r.message) for r in records]


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "workers"])
def test_pipelined_records_are_the_serial_orders(isolate):
    result = run(BACKENDS, SCENARIOS, PROFILE, seed=5, isolate=isolate)
    expected = [
        (b, s, t, c, v.statistic, v.p_value, v.trials, v.tv_estimate, v.message)
        for b, s, t, c, v in serial_verdicts(BACKENDS, SCENARIOS, PROFILE, 5)
    ]
    assert fields(result.records) == expected
    serial = run(BACKENDS, SCENARIOS, PROFILE, seed=5, isolate=isolate, pipelined=False)
    assert [r.to_dict() for r in result.records] == [r.to_dict() for r in serial.records]  # Holm's thresholds too


def test_a_crash_mid_stream_leaves_the_remaining_scenarios_their_results():
    """The worker dies on the third of five scenarios, holding the fourth (sent ahead): a
    fresh worker takes the fourth and the fifth, and the records equal the serial run's."""
    name = "suites.isolation_backends:Crashes"
    result = run([name], SCENARIOS, PROFILE, isolate=True)
    assert [(r.scenario, r.verdict) for r in result.records if r.verdict != "pass"] == [(MARK, "error")]
    assert {s.name for s in SCENARIOS} - {r.scenario for r in result.records if r.verdict == "pass"} == {MARK}
    serial = run([name], SCENARIOS, PROFILE, isolate=True, pipelined=False)
    assert [r.to_dict() for r in result.records] == [r.to_dict() for r in serial.records]


def test_sampling_starts_before_planning_ends(monkeypatch):
    """The last scenario's planning waits for the first outcome: only a worker that started
    and got its work while planning went on can give it."""
    first_outcome, waited = threading.Event(), []

    def planned(scenario, profile):
        if scenario is SCENARIOS[-1]:
            waited.append(first_outcome.wait(120))
        return planned_trials(scenario, profile)

    monkeypatch.setattr(plans_mod, "planned_trials", planned)
    result = run(["reference"], SCENARIOS, PROFILE, isolate=True, progress=lambda n: first_outcome.set())
    assert waited == [True]
    assert {r.verdict for r in result.records} == {"pass"}


evaluated = threading.Event()


class WaitsForAVerdict:
    """Samples like the reference, but on a batch whose first request has method ``marked``
    first waits until a check was evaluated."""

    saw_a_verdict: list = []
    marked = None

    def __init__(self):
        from reference.sampler import ReferenceSampler

        self._reference = ReferenceSampler()

    def sample(self, batch):
        if int(batch.methods[0]) == self.marked:
            WaitsForAVerdict.saw_a_verdict.append(evaluated.wait(120))
        return self._reference.sample(batch)


def test_checks_are_evaluated_while_later_scenarios_sample(monkeypatch):
    record = runner._record

    def recorded(*args):
        evaluated.set()
        return record(*args)

    # The scenario sampled last waits for a verdict: one the runner evaluated while it sampled.
    scenarios = SCENARIOS[:3]
    last = plans_mod.sampling_order(scenarios)[-1]
    assert last != 0  # checks are evaluated in catalog order: the first must be sampled before
    methods = [int(s.request_method(s.requests[0])) for s in scenarios]
    assert methods.count(methods[last]) == 1  # it alone has this method
    monkeypatch.setattr(WaitsForAVerdict, "marked", methods[last])
    evaluated.clear()
    WaitsForAVerdict.saw_a_verdict.clear()
    monkeypatch.setattr(runner, "_record", recorded)
    result = run(["suites.test_pipeline:WaitsForAVerdict"], scenarios, PROFILE)
    assert WaitsForAVerdict.saw_a_verdict and all(WaitsForAVerdict.saw_a_verdict)
    assert {r.verdict for r in result.records} == {"pass"}


def test_a_planning_error_is_raised_not_waited_on(monkeypatch):
    def planned(scenario, profile):
        if scenario is SCENARIOS[2]:
            raise RuntimeError("planning broke")
        return planned_trials(scenario, profile)

    monkeypatch.setattr(plans_mod, "planned_trials", planned)
    for isolate in (False, True):
        with pytest.raises(RuntimeError, match="planning broke"):
            run(["reference"], SCENARIOS, PROFILE, isolate=isolate)


def test_backend_time_is_measured_only_when_asked():
    plain = run(["reference"], SCENARIOS[:2], PROFILE)
    timed = run(["reference"], SCENARIOS[:2], PROFILE, time_backend=True)
    assert plain.sample_call_seconds == {}
    assert 0 < timed.sample_call_seconds["reference"] <= timed.backend_seconds["reference"]
    assert [r.to_dict() for r in plain.records] == [r.to_dict() for r in timed.records]


class MeetsItsPartner:
    """The reference, but loading waits until the other backend's worker has started
    loading too (a file each, in ``SPECDEC_TEST_MEETING``): only concurrent workers meet."""

    def __init__(self):
        import os
        import time
        from pathlib import Path

        from reference.sampler import ReferenceSampler

        folder = Path(os.environ["SPECDEC_TEST_MEETING"])
        (folder / str(os.getpid())).touch()
        deadline = time.monotonic() + 60
        while len(list(folder.iterdir())) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the other backend's worker never started")
            time.sleep(0.05)
        self._reference = ReferenceSampler()

    def sample(self, batch):
        return self._reference.sample(batch)


class ItsPartner(MeetsItsPartner):
    pass


def test_every_backends_workers_run_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_TEST_MEETING", str(tmp_path))
    names = ["suites.test_pipeline:MeetsItsPartner", "suites.test_pipeline:ItsPartner"]
    result = run(names, SCENARIOS[:2], PROFILE, isolate=True)
    assert {r.verdict for r in result.records} == {"pass"}
    assert len(list(tmp_path.iterdir())) == 2


def test_a_device_turn_excludes_other_holders_until_released(tmp_path):
    """Workers of several backends on one GPU sample in turns (``harness.sampling.turns.device_turn``)."""
    with device_turn(str(tmp_path), None):
        assert not _turn_is_free(str(tmp_path))
    assert _turn_is_free(str(tmp_path))  # free again
    with device_turn(None, None):
        pass  # no turns to take: nothing to hold


def test_a_device_turn_handed_on_early_lets_the_next_holder_in(tmp_path):
    """A worker hands its turn on once its items are queued (``release``), before its block ends."""
    lock = tmp_path / "gpu0.lock"
    with open(lock, "a") as nxt:
        with device_turn(str(tmp_path), None) as release:
            assert not _turn_is_free(str(tmp_path))
            release()
            fcntl.flock(nxt, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the next worker's turn
            release()  # at most once


def test_timed_calls_hand_a_turn_on_only_when_they_are_done():
    """No backend call's time may include another worker's work on the device."""
    assert taking_turns._hands_on_early("cpu", False, PROFILE)
    assert not taking_turns._hands_on_early("cpu", True, PROFILE)
    assert not taking_turns._hands_on_early("cuda", True, PROFILE)


@pytest.mark.gpu
@pytest.mark.skipif(gpu_skip_reason() is not None, reason=gpu_skip_reason() or "")
def test_a_turn_is_handed_on_early_only_while_the_gpu_has_the_next_worker_s_memory_free(monkeypatch):
    import torch

    free, total = torch.cuda.mem_get_info()
    call_logits = sample_mod.device_chunk_elements(PROFILE)  # divided among pytest-xdist workers on one GPU
    monkeypatch.setattr(stream_mod, "STREAM_MEMORY_SHARE", 0.0)
    monkeypatch.setattr(taking_turns, "CALL_BYTES_PER_LOGIT", 0.5 * free / call_logits)
    assert taking_turns._hands_on_early("cuda", False, PROFILE)
    monkeypatch.setattr(taking_turns, "CALL_BYTES_PER_LOGIT", 1.5 * total / call_logits)
    assert not taking_turns._hands_on_early("cuda", False, PROFILE)


def _turn_is_free(folder) -> bool:
    """Whether another worker could take GPU 0's turn now."""
    with open(os.path.join(folder, "gpu0.lock"), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True


class _LockProbe:
    """A worker's end of its pipe that notes, at each outcome it sends, whether its GPU's
    turn is free for another worker to take."""

    def __init__(self, conn, folder):
        self.conn, self.folder, self.free = conn, folder, []

    def send(self, message):
        if message not in (taking_turns.TURN, taking_turns.WAITING):
            self.free.append(_turn_is_free(self.folder))
        self.conn.send(message)

    def recv(self):
        return self.conn.recv()

    def poll(self, timeout=0.0):
        return self.conn.poll(timeout)


@pytest.mark.parametrize("timed", [False, True], ids=["untimed", "timed"])
def test_a_turn_is_handed_on_once_its_items_are_queued_unless_its_calls_are_timed(timed, tmp_path, monkeypatch):
    """A turn whose items are all queued, none done (counts never ready, as on a busy GPU),
    hands the device on before its first outcome goes out, not before its last item is
    sampled; timed calls keep it to the end."""
    monkeypatch.setattr(sample_mod.Started, "ready", sample_mod.Started.ready)  # restored after PendingThenCrashes
    backend, free_while_sampling = PendingThenCrashes(), []
    sample = backend.sample

    def sample_noting_the_turn(batch):
        free_while_sampling.append(_turn_is_free(str(tmp_path)))
        return sample(batch)

    backend.sample = sample_noting_the_turn
    parent, child = multiprocessing.Pipe(duplex=True)
    work = [(s, planned_trials(s, PROFILE)[2]) for s in SCENARIOS if s.name != MARK][:3]
    for s, count in work:
        parent.send((s.to_dict(), count))
    parent.send(None)
    probe = _LockProbe(child, str(tmp_path))
    args = (probe, backend, "cpu", PROFILE, None, timed, str(tmp_path), 1.0)
    serving = threading.Thread(target=taking_turns.serve_turns, args=args, daemon=True)
    serving.start()
    messages = [parent.recv() for _ in range(1 + len(work)) if parent.poll(60)]
    serving.join(60)
    assert not serving.is_alive()
    assert messages[0] == taking_turns.TURN and [m[0] for m in messages[1:]] == ["tallies"] * len(work)
    assert free_while_sampling and not any(free_while_sampling)
    assert probe.free == [not timed] * len(work)


def test_a_worker_taking_turns_delivers_every_outcome(tmp_path):
    """Its turn message (``harness.sampling.turns.TURN``) restarts the timeout; it is not an outcome."""
    work = [(s, 50) for s in SCENARIOS[:2]]
    stream = sample_isolated("reference", iter(work), PROFILE, "cpu", 120, None, False, str(tmp_path))
    assert [outcome[0] for _, outcome in stream] == ["environment", "tallies", "tallies"]


class DeviceReference:
    """The reference sampler taking device batches (CPU tensors here): the runner's device
    path, whose scenarios stay queued until their counts are read, on any machine. Fails
    on block verification, to put an error between two good scenarios."""

    name, device, device_batches = "device-reference", "cpu", True

    def __init__(self, log: list):
        self._reference, self._log = load_for_device("reference", "cpu"), log

    def sample(self, batch):
        self._log.append(("sample", batch.vocab_size, int(batch.methods[0])))
        if int(batch.methods[0]) == Method.BLOCK:
            raise RuntimeError("no block verification here")
        return _reference_on_host(self._reference, batch)


def _reference_on_host(reference, batch):
    """The reference's outputs for a device batch of CPU tensors, as tensors."""
    import dataclasses

    import torch

    host = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    host = dataclasses.replace(batch, **{k: v.numpy() for k, v in host.items() if isinstance(v, torch.Tensor)})
    tokens, emitted = reference.sample(host)
    return torch.as_tensor(tokens), torch.as_tensor(emitted)


def outcome_fields(outcome):
    if outcome[0] != "tallies":
        return outcome
    return ("tallies", [(t.trials, t.violations, t.outcome.tolist(), t.steps.tolist()) for t in outcome[1]])


def _streamed(monkeypatch, ready: bool, **kw):
    """The stream's outcomes and the log of its calls and waits, the device's counts ready
    at once (``ready``) or never before they are waited for."""
    log = []
    backend = DeviceReference(log)
    work = [(s, planned_trials(s, PROFILE)[2]) for s in SCENARIOS]
    expected = [outcome_fields(sample_mod.sample_one(backend, s, PROFILE, n)) for s, n in work]
    assert [o[0] for o in expected] == ["error" if s.method == "block" else "tallies" for s, _ in work]

    waits = sample_mod.Started.tallies
    monkeypatch.setattr(sample_mod.Started, "tallies", lambda self: log.append(("wait",)) or waits(self))
    monkeypatch.setattr(sample_mod.Started, "ready", lambda self: ready)
    starts = stream_mod.start_one
    monkeypatch.setattr(stream_mod, "start_one", lambda *a, **k: log.append(("start",)) or starts(*a, **k))
    log.clear()
    streamed = list(stream_mod.sample_stream(backend, iter(work), PROFILE, **kw))
    assert [s.name for s, _ in streamed] == [s.name for s, _ in work]
    assert [outcome_fields(o) for _, o in streamed] == expected
    return log


def _scenario_calls_before_first_wait(log) -> int:
    """How many scenarios were started (and their batches sampled) before the stream's first wait."""
    return log[: log.index(("wait",))].count(("start",))


def test_the_stream_runs_ahead_while_the_device_is_busy_and_gives_sample_ones_outcomes(monkeypatch):
    # Counts never ready early: the third scenario is queued before the first one's wait (two ahead).
    assert _scenario_calls_before_first_wait(_streamed(monkeypatch, ready=False, ahead=2)) == 3


def test_the_stream_reads_counts_that_are_back_before_it_queues_more(monkeypatch):
    assert _scenario_calls_before_first_wait(_streamed(monkeypatch, ready=True)) == 1


def test_the_stream_stops_running_ahead_when_the_device_memory_is_taken(monkeypatch):
    monkeypatch.setattr(stream_mod, "_memory_full", lambda backend: True)
    assert _scenario_calls_before_first_wait(_streamed(monkeypatch, ready=False)) == 1


@pytest.mark.gpu
@pytest.mark.skipif(gpu_skip_reason() is not None, reason=gpu_skip_reason() or "")
def test_the_memory_guard_reads_this_process_s_tensors_on_the_gpu(monkeypatch):
    import torch

    class OnCuda:
        device = "cuda"

    held = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # 64 MiB
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    monkeypatch.setattr(stream_mod, "STREAM_MEMORY_SHARE", 0.5 * held.numel() / total)  # half of what is held
    assert stream_mod._memory_full(OnCuda())
    monkeypatch.setattr(stream_mod, "STREAM_MEMORY_SHARE", 1.0)
    assert not stream_mod._memory_full(OnCuda())
    assert not stream_mod._memory_full(load_for_device("reference", "cpu"))  # a CPU backend never waits for memory


class PendingThenCrashes:
    """Device batches on the CPU whose counts never report ready before they are waited for
    (as on a busy GPU), so a streaming worker holds several scenarios; it dies on ``MARK``."""

    name, device, devices, device_batches = "pending-then-crashes", "cpu", ("cpu",), True

    def __init__(self):
        sample_mod.Started.ready = lambda self: False  # in the worker process that loads it only
        self._reference = load_for_device("reference", "cpu")

    def sample(self, batch):
        import os

        if batch.cu_num_drafts.diff()[:3].tolist() == [1, 3, 4]:  # MARK's templates
            os._exit(3)
        return _reference_on_host(self._reference, batch)


# (workers started, most outcomes given before the first crash): reference: one worker;
# Crashes: the first two outcomes come back, then MARK crashes its worker, a fresh one samples
# it alone (and dies), a third takes the rest; PendingThenCrashes: the worker dies holding
# MARK and the items sent after it, and usually the first two (innocent) as well: how many of
# those came back first depends on how fast the items reach its pipe. Either way it dies
# holding several, and none of the innocent ones may be charged (their outcomes are compared).
STREAMING_WORKERS = {
    "reference": (1, 5),
    "suites.isolation_backends:Crashes": (3, 2),
    "suites.test_pipeline:PendingThenCrashes": (3, 2),
}


def _work_and_serial_outcomes():
    """Every scenario with its planned trials, and the reference's outcomes sampled one by one in process."""
    work = [(s, planned_trials(s, PROFILE)[2]) for s in SCENARIOS]
    reference = load_for_device("reference", "cpu")
    return work, [outcome_fields(sample_mod.sample_one(reference, s, PROFILE, n)) for s, n in work]


@pytest.mark.parametrize("turns", [False, True], ids=["alone", "in-turns"])
@pytest.mark.parametrize("backend", list(STREAMING_WORKERS))
def test_a_streaming_worker_gives_the_serial_outcomes_a_crash_charged_to_its_own_scenario(backend, turns, tmp_path):
    """The streaming worker protocol (forced on here; by default on a GPU), alone or taking
    turns: the parent sends many items ahead. When the worker dies holding several, a fresh
    worker samples them one at a time before anything is charged, and the rest follow."""
    work, expected = _work_and_serial_outcomes()
    folder = str(tmp_path) if turns else None
    everything = list(sample_isolated(backend, iter(work), PROFILE, "cpu", 120, turns=folder, stream=True))
    streamed = [(s, o) for s, o in everything if s is not None]
    assert [s.name for s, _ in streamed] == [s.name for s, _ in work]
    starts = [i for i, (s, o) in enumerate(everything) if s is None]
    assert len(starts) == STREAMING_WORKERS[backend][0]
    assert starts[1:2] == [] or starts[1] - 1 <= STREAMING_WORKERS[backend][1]  # outcomes between the first two starts
    for (s, outcome), want in zip(streamed, expected):
        if backend != "reference" and s.name == MARK:
            assert outcome[0] == "error" and "exit code 3" in outcome[1]
        else:
            assert outcome_fields(outcome) == want


def test_streaming_workers_of_two_backends_take_turns_and_give_the_serial_outcomes(tmp_path):
    """Two workers streaming on one lock file, read at once as a run reads its backends,
    their items arriving as a run plans them."""
    work, expected = _work_and_serial_outcomes()
    got = {}

    def planned_slowly():  # the pipe runs empty between items: each turn is short, the workers alternate
        for item in work:
            time.sleep(0.05)
            yield item

    def read(i):
        stream = sample_isolated("reference", planned_slowly(), PROFILE, "cpu", 120, turns=str(tmp_path), stream=True)
        got[i] = [outcome_fields(o) for s, o in stream if s is not None]

    threads = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == {0: expected, 1: expected}


def test_a_worker_waiting_for_its_turn_is_not_timed_out(tmp_path):
    """While another process holds the device past the timeout, the waiting worker says so
    (``harness.sampling.turns.WAITING``, every second) and is not killed as hung."""
    held, release = threading.Event(), threading.Event()

    def hold():
        with device_turn(str(tmp_path), None):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    work = [(s, 50) for s in SCENARIOS[:2]]
    stream = sample_isolated("reference", iter(work), PROFILE, "cpu", 2.5, turns=str(tmp_path), stream=True)
    assert next(stream)[1][0] == "environment"  # loaded: the items go out when the stream is read on
    threading.Timer(5.0, release.set).start()  # twice the timeout
    assert [outcome[0] for _, outcome in stream] == ["tallies", "tallies"]
    assert release.is_set()  # the outcomes came after the turn was handed over
    holder.join()


def test_many_large_items_and_large_outcomes_do_not_deadlock_a_streaming_worker(tmp_path):
    """70 items of 40 requests (2 KB each, sent ahead) and outcomes of 1.5 MB: both pipes
    fill. The parent sends from a thread of its own (``harness.sampling.framing.Sender``), so it is
    never stuck sending while the worker, holding its turn, is stuck sending an outcome."""
    base = next(s for s in SCENARIOS if s.name == "standard-near-target").to_dict()
    request = base["requests"][1]
    work = [(Scenario.from_dict(dict(base, name=f"big-{i}", vocab_size=512, requests=[request] * 40)), 4) for i in range(70)]
    got = []

    def read():
        stream = sample_isolated("reference", iter(work), PROFILE, "cpu", 60, turns=str(tmp_path), stream=True)
        got.extend(outcome[0] for _, outcome in stream)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(120)
    assert not reader.is_alive(), f"stuck after {len(got)} messages"
    assert got == ["environment"] + ["tallies"] * 70

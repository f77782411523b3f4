"""Backend isolation: one worker process per backend, only counts come back.

The worker (a fresh ``spawn`` process) starts at once, binds its own vLLM source tree if
the backend name asks for one (``vllm-mrv2@PATH``) and loads the backend while the parent
is still planning. Work items then stream through a duplex pipe as they are planned; for
each one the worker materializes the inputs, samples and tallies, sending back the tallies
alone. The parent plans and evaluates the checks. A worker that dies (a CUDA fault, a
segfault) or that sends nothing for ``timeout`` seconds is killed; that scenario gets an
error record and a fresh worker takes the remaining scenarios. An import failure is the
backend's own load verdict.

Several backends' workers run at once; on a GPU they sample in turns (``device_turn``: a
lock file per GPU, which the OS releases when a holder dies), so that each call has the
per-call memory budget. A worker says when its turn starts (``TURN``), and every
``WAIT_BEAT`` seconds while it waits for one (``WAITING``): the timeout counts from the
turn's start.

A worker on a GPU streams (``runner.sample_stream``): the parent sends up to
``runner.STREAM_AHEAD`` + 1 items ahead and the worker queues them on the device while
the oldest one's counts are not back. A worker that takes turns streams within each turn:
the turn takes the items already in the pipe, for up to ``TURN_SECONDS``. A turn that ends
on time or at the end of the work is handed on once its items are queued, where the GPU has
the memory for it and the calls are not being timed (``_hands_on_early``): the next
worker's first items then run on the device alongside this turn's last ones, which hides
the restart of its stream. When a streaming worker dies (or hangs)
holding several items, none is charged at once (any of them may have caused it): a fresh
worker samples them one at a time, and a crash or hang there charges that item alone. The
parent sends from a thread of its own (``_Sender``): with many items ahead and large
outcomes both pipes fill, and a parent stuck sending while its worker is stuck sending an
outcome would hang the run.
"""

import fcntl
import multiprocessing as mp
import os
import queue
import threading
import time
from collections import deque
from contextlib import contextmanager

from harness.profiles import Profile
from harness.scenarios import Scenario

LOAD_TIMEOUT = 300.0  # importing vLLM and compiling kernels takes a while
AHEAD = 2  # items sent before their turn: the next one waits in the pipe, so the worker never idles
TURN = ("turn",)  # a worker's message: its turn starts, and its scenarios' time with it
WAITING = ("waiting",)  # a worker's message while another worker holds the device
WAIT_BEAT = 1.0  # seconds between WAITING messages (a quarter of the timeout if that is shorter)
TURN_SECONDS = 3.0  # a streaming turn takes no new item after this long (each turn restarts a stream)
CALL_BYTES_PER_LOGIT = 10  # device memory one call may take beyond a stream's share, per logit of its budget
TURN_PAUSE = 0.005  # after its turn a worker waits this long, so a waiting one takes the device


@contextmanager
def device_turn(turns: str | None, gpu: int | None, waiting=None, beat: float = WAIT_BEAT):
    """Hold GPU ``gpu``'s lock file in the folder ``turns`` (None: no turns to take);
    ``waiting()`` is called every ``beat`` seconds while another process holds it. Yields
    ``release()``, which hands the turn on before the block ends (at most once)."""
    if turns is None:
        yield lambda: None
        return
    with open(os.path.join(turns, f"gpu{gpu or 0}.lock"), "a") as f:
        _lock(f, waiting, beat)
        held = True

        def release():
            nonlocal held
            if held:
                held = False
                fcntl.flock(f, fcntl.LOCK_UN)

        try:
            yield release
        finally:
            release()


def _lock(f, waiting, beat: float) -> None:
    if waiting is None:
        fcntl.flock(f, fcntl.LOCK_EX)
        return
    last = time.monotonic()
    while True:  # polled, to beat while waiting; a releasing worker pauses (TURN_PAUSE) to let it in
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() - last >= beat:
                waiting()
                last = time.monotonic()
            time.sleep(0.001)


def _serve(conn, name, device, profile_fields, gpu=None, time_backend=False, turns=None, stream=False, beat=WAIT_BEAT):
    from harness.device import configure_triton, pin_gpu

    if gpu is not None:  # before CUDA is initialized: this worker sees one GPU
        pin_gpu(gpu)

    configure_triton()
    from harness.runner import load_for_device, sample_one

    try:
        backend = load_for_device(name, device)
    except Exception as e:
        conn.send(("load-error", str(e)))
        return
    from harness.environment import backend_environment

    conn.send(("loaded", backend_environment()))
    profile = Profile(**profile_fields)
    if stream and turns is None:
        from harness.runner import sample_stream

        for _, outcome in sample_stream(backend, _items(conn), profile, time_backend, available=lambda: _waiting(conn)):
            conn.send(outcome)
        return
    if stream:
        _serve_turns(conn, backend, device, profile, gpu, time_backend, turns, beat)
        return
    while (item := _next_item(conn)) is not None:
        data, count = item
        with device_turn(turns, gpu, lambda: conn.send(WAITING), beat):
            if turns is not None:
                conn.send(TURN)
            outcome = sample_one(backend, Scenario.from_dict(data), profile, count, time_backend)
            if turns is not None and device != "cpu":
                _return_cached_memory()  # the next worker's turn needs the GPU's memory
        conn.send(outcome)


def _serve_turns(conn, backend, device, profile, gpu, time_backend, turns, beat):
    """Stream in turns: each turn waits for one item, then also takes the items already in
    the pipe for up to ``TURN_SECONDS``. A turn that ends on time or at the end of the work
    may be handed on before its last items are done (``_hands_on_early``): the next worker's
    first items then run on the device alongside them."""
    from harness.runner import sample_stream

    ended = False

    def turn(first, release):
        nonlocal ended
        start = time.monotonic()
        item = first
        while True:
            yield Scenario.from_dict(item[0]), item[1]
            if not _waiting(conn):
                return  # the stream has run its queue dry before asking: nothing to overlap
            if time.monotonic() - start >= TURN_SECONDS:
                break
            if (item := _next_item(conn)) is None:
                ended = True
                break
        if _hands_on_early(device, time_backend, profile):
            release()  # this turn's items are all queued; the last ones may still be running

    while not ended and (first := _next_item(conn)) is not None:
        with device_turn(turns, gpu, lambda: conn.send(WAITING), beat) as release:
            conn.send(TURN)
            items = turn(first, release)
            for _, outcome in sample_stream(backend, items, profile, time_backend, available=lambda: _waiting(conn)):
                conn.send(outcome)
            if device != "cpu":  # the next worker's turn needs the GPU's memory: returned before
                _return_cached_memory()  # the turn is handed on, unless it was handed on early
        time.sleep(TURN_PAUSE)


def _hands_on_early(device: str, time_backend: bool, profile: Profile) -> bool:
    """Whether a turn is handed on while its last items still run. Not for timed calls (no
    call's time may include another worker's work). On a GPU, only while the memory free on
    it (every process counted) holds what the next worker may take before this one is done:
    a stream's share (``runner.STREAM_MEMORY_SHARE``) and one call beyond it, at
    ``CALL_BYTES_PER_LOGIT``. A whole scenario of the ``gpu`` profile (2^30 logits a call),
    its inputs included, allocated at most 9.7 bytes per logit with vLLM MRV2 and 6.7 with
    triton (H100, session 15; it reserved up to 3x that). Within a process torch's allocator
    returns its cached blocks and retries before it fails; across the two workers of an early
    hand-on it cannot, so this rests on measurement: two runs of two MRV2 workers in turns
    and a whole three-backend run met no out-of-memory error (session 15).
    Otherwise this worker returns its cache and hands the turn on once its items are done."""
    if time_backend:
        return False
    if device == "cpu":
        return True
    import torch

    from harness.device import gpu_sharers
    from harness.runner import STREAM_MEMORY_SHARE, device_chunk_elements

    try:
        free, total = torch.cuda.mem_get_info()
    except RuntimeError:  # a device fault: the turn is handed on once its items are done
        return False
    return free >= STREAM_MEMORY_SHARE * total / gpu_sharers() + CALL_BYTES_PER_LOGIT * device_chunk_elements(profile)


def _streams(device: str) -> bool:
    """Whether a worker streams: on a GPU (in turns when it shares the GPU with other backends)."""
    return device != "cpu"


def _items(conn):
    """(scenario, trials) as the parent sends them, until it sends None (or is gone)."""
    while (item := _next_item(conn)) is not None:
        yield Scenario.from_dict(item[0]), item[1]


def _waiting(conn) -> bool:
    """Whether the parent's next message can be read without blocking (a closed pipe reads
    at once, as the end of the work)."""
    try:
        return conn.poll(0)
    except (EOFError, OSError):
        return True


def _return_cached_memory():
    """Hand the blocks torch's caching allocator keeps back to the device."""
    import torch

    torch.cuda.empty_cache()


def _next_item(conn):
    """The next (scenario data, trials), or None when the parent has no more (or is gone)."""
    try:
        return conn.recv()
    except (EOFError, OSError):
        return None


def _receive(conn, proc, timeout):
    """The next message, or ("error", why) when the worker died or went silent."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if conn.poll(0.5):
            try:
                message = conn.recv()
            except (EOFError, OSError):  # OSError: reset, when it died holding unread work
                break  # the worker is gone (or going)
            if message in (TURN, WAITING):  # it waited for the device until now
                deadline = time.monotonic() + timeout
                continue
            return message
        if not proc.is_alive() and not conn.poll(0):
            break
    else:
        proc.kill()
        proc.join()
        return ("error", f"worker timed out: no result within {timeout:.0f} s (killed)")
    proc.join(10)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return ("error", "worker closed its pipe without a result (killed)")
    return ("error", f"worker died with exit code {proc.exitcode} (a crash in the backend)")


def _send_item(sender, item) -> None:
    """A (scenario, trials) work item, as the worker reads it (``_items``)."""
    sender.send((item[0].to_dict(), item[1]))


class _Sender:
    """The parent's messages to one worker, sent in order from a thread of their own: the
    parent never blocks on a full pipe (work items ahead) while the worker blocks sending it
    an outcome, which would leave both waiting, the worker holding its GPU turn. The thread
    owns the connection's end: it closes it after ``close()``, never while a send may run."""

    def __init__(self, conn):
        self._queue = queue.SimpleQueue()
        threading.Thread(target=self._run, args=(conn,), name="worker-sender", daemon=True).start()

    def send(self, message) -> None:
        self._queue.put(("message", message))

    def close(self) -> None:
        """Send what is queued, then close the connection (the parent reads from it no more)."""
        self._queue.put(("close", None))

    def _run(self, conn) -> None:
        gone = False
        while (entry := self._queue.get())[0] == "message":
            if not gone:
                try:
                    conn.send(entry[1])
                except OSError:  # the worker is gone: the receiver says how
                    gone = True
        conn.close()


def sample_isolated(name, work, profile, device, timeout, gpu: int | None = None, time_backend: bool = False, turns=None, stream=None):
    """Yield (scenario, outcome) like the in-process sampler, from worker processes.

    ``work`` is an iterable of (scenario, trials), read lazily: a worker starts before the
    first item exists, and an item is taken (which may wait for its planning) only when the
    worker is about to need it. ``gpu``: the index (among the visible GPUs) the workers use;
    ``turns``: the folder of lock files the workers of several backends take turns with.
    ``stream``: whether the workers stream (default: on a GPU, ``_streams``)."""
    from harness.runner import STREAM_AHEAD

    ctx = mp.get_context("spawn")
    items = iter(work)
    sent = deque()  # items the current worker holds, in order; a fresh worker gets them again
    stream = _streams(device) if stream is None else stream
    ahead = STREAM_AHEAD + 1 if stream else AHEAD
    alone = 0  # the worker died holding this many items: the next samples them one at a time
    while True:
        parent, child = ctx.Pipe(duplex=True)
        beat = max(0.05, min(WAIT_BEAT, timeout / 4))
        args = (child, name, device, profile.__dict__, gpu, time_backend, turns, stream, beat)
        proc = ctx.Process(target=_serve, args=args, daemon=True)
        proc.start()
        child.close()
        sender = None
        try:
            sender = _Sender(parent)
            first = _receive(parent, proc, LOAD_TIMEOUT)
            if first[0] != "loaded":
                yield None, ("load-error", first[1])
                return
            yield None, ("environment", first[1])
            while alone and proc.is_alive():  # each alone: a crash or hang here is its own
                _send_item(sender, sent[0])
                outcome = _receive(parent, proc, timeout)
                yield sent.popleft()[0], outcome
                alone -= 1
            if alone or not proc.is_alive():
                continue  # it died on an item of its own (charged): a fresh worker takes the rest
            for item in sent:
                _send_item(sender, item)
            ended = yield from _drain(parent, sender, proc, items, sent, timeout, ahead, stream)
            if ended == "done":
                return
            alone = len(sent) if ended == "died holding several" else 0
        finally:  # also when the caller stops listening: no worker is left behind
            if sender is None:
                parent.close()
            else:
                sender.close()  # it closes the pipe once its sends are done (or failed: killed below)
            if proc.is_alive():
                proc.kill()
                proc.join()


def _drain(conn, sender, proc, items, sent, timeout, ahead: int = AHEAD, stream: bool = False):
    """Feed ``proc`` up to ``ahead`` items and yield its outcomes until the work ends
    ("done") or it dies: "died" (the oldest item charged), or, for a streaming worker,
    "died holding several" (not charged: any of them may have caused it). An outcome that
    has arrived is read before the next item is taken (which may wait for its planning)."""
    while True:
        while len(sent) < ahead and not (sent and conn.poll(0)) and (item := next(items, None)) is not None:
            sent.append(item)
            _send_item(sender, item)
        if not sent:
            sender.send(None)  # no more work: the worker exits
            proc.join(timeout=30)
            return "done"
        outcome = _receive(conn, proc, timeout)
        if outcome[0] == "error" and not proc.is_alive() and len(sent) > 1 and stream:
            return "died holding several"
        yield sent.popleft()[0], outcome
        if outcome[0] == "error" and not proc.is_alive():
            return "died"

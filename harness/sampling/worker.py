"""Backend isolation: one worker process per backend, only counts come back. This module is
the parent's side (``sample_isolated``); the worker's side is ``serve``, the pipe between
them ``framing``, and the turns the workers on one GPU take ``turns``.

The worker (a fresh ``spawn`` process, ``serve.serve``) starts at once, binds its own vLLM
source tree if the backend name asks for one (``vllm-mrv2@PATH``) and loads the backend while
the parent is still planning. Work items then stream through a duplex pipe as they are
planned; for each one the worker materializes the inputs, samples and tallies, sending back
the tallies alone. An item may carry the scenario's stop rule (``--sequential``): the worker
then stops the scenario early next to its counts, and no counts cross the pipe before. The parent plans and evaluates the checks. A worker that dies (a CUDA
fault, a segfault), that sends nothing for ``timeout`` seconds or that sends a malformed
message is killed; that scenario gets an error record and a fresh worker takes the remaining
scenarios, except after a hang (below). An import failure is the backend's own load verdict.

``timeout`` also bounds the backend's loading (its import and construction), counted from
the worker's ``LOADING`` message; the worker's own start before it (the interpreter, the
harness's imports) has ``START_TIMEOUT``. A scenario proven to hang (it timed out in a
worker that samples one item at a time, or that held no other) is charged with the timeout,
and the backend's remaining scenarios in that worker's shard are charged at once, not
sampled ("not sampled: this backend timed out on an earlier scenario ..."): each would
otherwise wait the timeout out again.

The worker's messages are framed and read by a thread of the parent's (``framing.Receiver``):
bytes a backend writes into the pipe, a message that does not unpickle or one that is not
the protocol's can neither crash nor hang the parent: the worker is killed as if it had
crashed, and the scenario it was working on gets the error.

Each worker leads a process group of its own (``serve``), so a backend's own child processes
go with it: the group is killed on a timeout, after a crash, at the end of the work and,
through ``end_workers``, when the parent is interrupted (``cli.main`` turns SIGTERM into
KeyboardInterrupt, like Ctrl-C). A worker starts with SIGINT and SIGTERM blocked (``_start``)
and ignores SIGINT once it leads its group: Ctrl-C is the parent's to handle. With
``log_path`` the worker's descriptors 1 and 2 go to that file (``backend_log_path``).

Several backends' workers run at once; on a GPU they sample in turns (``turns.device_turn``),
so that each call has the per-call memory budget. A worker says when its turn starts
(``TURN``), and every ``WAIT_BEAT`` seconds while it waits for one (``WAITING``): the timeout
counts from the turn's start.

A worker on a GPU streams (``stream.sample_stream``): the parent sends up to
``stream.STREAM_AHEAD`` + 1 items ahead and the worker queues them on the device while the
oldest one's counts are not back (in turns: ``turns.serve_turns``). When a streaming worker
dies (or hangs) holding several items, none is charged at once (any of them may have caused
it): a fresh worker samples them one at a time, and a crash or hang there charges that item
alone. The parent sends from a thread of its own (``framing.Sender``): with many items ahead
and large outcomes both pipes fill, and a parent stuck sending while its worker is stuck
sending an outcome would hang the run.
"""

import hashlib
import multiprocessing as mp
import os
import re
import signal
import threading
import time
from collections import deque

from harness.sampling.framing import Receiver, Sender
from harness.sampling.serve import ENDING_SIGNALS, LOADING, serve
from harness.sampling.turns import TURN, WAIT_BEAT, WAITING

START_TIMEOUT = 300.0  # a worker's start before it loads the backend: the harness's imports (slow on a busy machine)
AHEAD = 2  # items sent before their turn: the next one waits in the pipe, so the worker never idles


def backend_log_path(log_dir: str, name: str) -> str:
    """``{log_dir}/backends/{safe}-{hash}.log`` for backend ``name``, its folder created:
    ``safe`` is the name with every character but [A-Za-z0-9._-] replaced by '_' (cut
    short), and the hash of the whole name keeps names that differ only there apart."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:80].lstrip(".") or "backend"
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    folder = os.path.join(log_dir, "backends")
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"{safe}-{digest}.log")


def _streams(device: str) -> bool:
    """Whether a worker streams: on a GPU (in turns when it shares the GPU with other backends)."""
    return device != "cpu"


_workers: set = set()  # worker processes started and not yet ended
_workers_lock = threading.RLock()  # re-entrant: end_workers may run in a thread interrupted while starting one
_ending = False  # end_workers was called: no worker starts from now on


class Interrupted(Exception):
    """No worker starts: the process was interrupted (``end_workers``)."""


def _start(proc) -> None:
    """Start ``proc`` with SIGINT and SIGTERM blocked (it inherits the mask; ``serve._lead_own_group``
    unblocks them once it leads its group), so that Ctrl-C before then cannot reach it."""
    with _workers_lock:  # end_workers waits for a start under way, then ends that worker too
        if _ending:
            raise Interrupted("the run was interrupted: no new worker starts")
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, ENDING_SIGNALS)
        try:
            proc.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        _workers.add(proc)


def _kill_group(proc) -> None:
    """Kill ``proc``'s process group (it leads it: ``serve._lead_own_group``), its children with it."""
    if proc.pid is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # no such group: not made yet, or gone with every member
        pass
    proc.kill()


def end_workers() -> None:
    """Kill every worker's process group, and start no worker from now on: for a process
    that was interrupted and is about to exit (``cli.main``)."""
    global _ending
    with _workers_lock:
        _ending = True
        procs = list(_workers)
    for proc in procs:
        _kill_group(proc)


class _Worker:
    """One worker process with its ``Sender`` and ``Receiver``. ``ended`` says why it was
    ended: "timeout", "malformed" (killed by the parent) or "died"; None while it serves.
    ``loading``: it has said it loads the backend (``LOADING``)."""

    def __init__(self, ctx, args):
        parent, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=serve, args=(child, *args), daemon=True)
        try:
            _start(self.proc)
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        self.ended, self.loading = None, False
        self._receiver = Receiver(parent)
        self._sender = Sender(parent)

    def alive(self) -> bool:
        return self.proc.is_alive()

    def ready(self) -> bool:
        """Whether a message (or the pipe's end) has arrived."""
        return self._receiver.ready()

    def send_item(self, item) -> None:
        """A (scenario, trials[, stop rule]) work item, as the worker reads it (``serve._items``):
        the stop rule travels with it, so the worker stops next to the counts."""
        self._sender.send((item[0].to_dict(), item[1], item[2] if len(item) > 2 else None))

    def finish(self) -> None:
        """No more work: the worker exits."""
        self._sender.send(None)
        self.proc.join(timeout=30)

    def receive(self, timeout: float, first: float | None = None) -> tuple:
        """The next message, or ("error", why) when the worker died, sent nothing for
        ``timeout`` seconds (``first`` until its first message; TURN, WAITING and LOADING
        restart the wait) or sent a malformed message: it is killed (its group with it)."""
        deadline, dead_since = time.monotonic() + (timeout if first is None else first), None
        while (left := deadline - time.monotonic()) > 0:
            entry = self._receiver.get(min(left, 0.5))
            if entry is None:
                if self.proc.is_alive():
                    continue
                if dead_since is None:  # its children may hold the pipe open: they go with it
                    dead_since = time.monotonic()
                    _kill_group(self.proc)
                elif time.monotonic() - dead_since > 2:
                    break  # the pipe outlived every process we know of
                continue
            kind, message = entry
            if kind == "message" and message in (TURN, WAITING, LOADING):
                self.loading = self.loading or message == LOADING
                deadline = time.monotonic() + timeout
                continue
            if kind == "message":
                return message
            if kind == "malformed":
                self._end("malformed")
                return ("error", f"worker sent a malformed message: {message} (killed)")
            break  # the pipe ended
        else:
            self._end("timeout")
            return ("error", f"worker timed out: no result within {timeout:g} s (killed)")
        self.proc.join(10)
        if self.proc.is_alive():
            self._end("died")
            return ("error", "worker closed its pipe without a result (killed)")
        self._end("died")
        return ("error", f"worker died with exit code {self.proc.exitcode} (a crash in the backend)")

    def _end(self, why: str) -> None:
        self.ended = why
        _kill_group(self.proc)
        self.proc.join()

    def close(self) -> None:
        """Stop sending (once what is queued is sent), and kill what is left of the worker's
        group: the worker itself, or the children it leaves behind."""
        self._sender.close()  # it closes the pipe once its sends are done (or failed: killed here)
        _kill_group(self.proc)
        self.proc.join()
        with _workers_lock:
            _workers.discard(self.proc)


def sample_isolated(
    name, work, profile, device, timeout, gpu: int | None = None, time_backend: bool = False, turns=None, stream=None, log_path=None
):
    """Yield (scenario, outcome) like the in-process sampler, from worker processes.

    ``work`` is an iterable of (scenario, trials), read lazily: a worker starts before the
    first item exists, and an item is taken (which may wait for its planning) only when the
    worker is about to need it. ``gpu``: the index (among the visible GPUs) the workers use;
    ``turns``: the folder of lock files the workers of several backends take turns with.
    ``stream``: whether the workers stream (default: on a GPU, ``_streams``). ``log_path``:
    the file the workers' stdout and stderr go to (default: this process's)."""
    from harness.sampling.stream import STREAM_AHEAD

    ctx = mp.get_context("spawn")
    items = iter(work)
    sent = deque()  # items the current worker holds, in order; a fresh worker gets them again
    stream = _streams(device) if stream is None else stream
    ahead = STREAM_AHEAD + 1 if stream else AHEAD
    beat = max(0.05, min(WAIT_BEAT, timeout / 4))
    args = (name, device, profile.__dict__, gpu, time_backend, turns, stream, beat, log_path)
    alone = 0  # the worker died holding this many items: the next samples them one at a time
    while True:
        worker = _Worker(ctx, args)
        try:
            first = worker.receive(timeout, first=START_TIMEOUT)  # from its LOADING message: ``timeout``
            if first[0] != "loaded":
                yield None, ("load-error", _load_failure(first, worker, timeout))
                return
            yield None, ("environment", first[1])
            hung = None
            while alone and worker.alive():  # each alone: a crash or hang here is its own
                worker.send_item(sent[0])
                outcome = worker.receive(timeout)
                scenario = sent.popleft()[0]
                yield scenario, outcome
                alone -= 1
                if worker.ended == "timeout":
                    hung = scenario
                    break
            if hung is None:
                if alone or not worker.alive():
                    continue  # it died on an item of its own (charged): a fresh worker takes the rest
                for item in sent:
                    worker.send_item(item)
                ended, hung = yield from _drain(worker, items, sent, timeout, ahead, stream)
                if ended == "done":
                    return
                alone = len(sent) if ended == "died holding several" else 0
            if hung is not None:
                yield from _not_sampled(sent, items, hung, timeout)
                return
        finally:  # also when the caller stops listening: no worker is left behind
            worker.close()


def _load_failure(first, worker, timeout) -> str:
    if worker.ended == "timeout" and worker.loading:
        return f"loading timed out: the backend did not load within {timeout:g} s (killed)"
    if worker.ended == "timeout":
        return f"worker timed out: it did not start within {START_TIMEOUT:g} s (killed)"
    if first[0] in ("load-error", "error"):
        return first[1]
    return f"worker sent {first[0]!r} before loading the backend"


def _drain(worker, items, sent, timeout, ahead: int = AHEAD, stream: bool = False):
    """Feed the worker up to ``ahead`` items and yield its outcomes until the work ends
    ("done") or it ends: "died" (the oldest item charged), "hung" (the oldest item charged,
    proven to hang: the worker held no other or samples one at a time), or, for a streaming
    worker, "died holding several" (not charged: any of them may have caused it). Returns
    (that, the scenario that hung or None). An outcome that has arrived is read before the
    next item is taken (which may wait for its planning)."""
    while True:
        while len(sent) < ahead and not (sent and worker.ready()) and (item := next(items, None)) is not None:
            sent.append(item)
            worker.send_item(item)
        if not sent:
            worker.finish()
            return "done", None
        outcome = worker.receive(timeout)
        if worker.ended is not None and len(sent) > 1 and stream:
            return "died holding several", None
        scenario = sent.popleft()[0]
        yield scenario, outcome
        if worker.ended == "timeout":
            return "hung", scenario
        if worker.ended is not None:
            return "died", None


def _not_sampled(sent, items, hung, timeout):
    """Every item left once ``hung`` hung, charged at once: each would wait the timeout out."""
    why = ("error", f"not sampled: this backend timed out on an earlier scenario ({hung.name}, after {timeout:g} s)")
    while sent:
        yield sent.popleft()[0], why
    for item in items:
        yield item[0], why

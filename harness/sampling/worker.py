"""Backend isolation: one worker process per backend, only counts come back.

The worker (a fresh ``spawn`` process) starts at once, binds its own vLLM source tree if
the backend name asks for one (``vllm-mrv2@PATH``) and loads the backend while the parent
is still planning. Work items then stream through a duplex pipe as they are planned; for
each one the worker materializes the inputs, samples and tallies, sending back the tallies
alone. The parent plans and evaluates the checks. A worker that dies (a CUDA fault, a
segfault), that sends nothing for ``timeout`` seconds or that sends a malformed message is
killed; that scenario gets an error record and a fresh worker takes the remaining scenarios,
except after a hang (below). An import failure is the backend's own load verdict.

``timeout`` also bounds the backend's loading (its import and construction), counted from
the worker's ``LOADING`` message; the worker's own start before it (the interpreter, the
harness's imports) has ``START_TIMEOUT``. A scenario proven to hang (it timed out in a
worker that samples one item at a time, or that held no other) is charged with the timeout,
and the backend's remaining scenarios in that worker's shard are charged at once, not
sampled ("not sampled: this backend timed out on an earlier scenario ..."): each would
otherwise wait the timeout out again.

The worker's messages are framed (``_HEADER``: ``MAGIC``, length, CRC-32, then a pickle) and
read by a thread of the parent's (``_Receiver``): bytes a backend writes into the pipe, a
message that does not unpickle or one that is not the protocol's (``_malformed``) can neither
crash nor hang the parent: the worker is killed as if it had crashed, and the scenario it
was working on gets the error.

Each worker leads a process group of its own, so a backend's own child processes go with
it: the group is killed on a timeout, after a crash, at the end of the work and, through
``end_workers``, when the parent is interrupted (``cli.main`` turns SIGTERM into
KeyboardInterrupt, like Ctrl-C). A worker starts with SIGINT and SIGTERM blocked and ignores
SIGINT once it leads its group: Ctrl-C is the parent's to handle, and no worker prints a
traceback for it. With ``log_path`` the worker's descriptors 1 and 2 go to that file
(appended): a backend's prints and C-level writes stay out of the tool's output.

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
import hashlib
import multiprocessing as mp
import os
import pickle
import queue
import re
import signal
import struct
import sys
import threading
import time
import zlib
from collections import deque
from contextlib import contextmanager

from harness.scenarios.profiles import Profile
from harness.scenarios.scenario import Scenario

START_TIMEOUT = 300.0  # a worker's start before it loads the backend: the harness's imports (slow on a busy machine)
AHEAD = 2  # items sent before their turn: the next one waits in the pipe, so the worker never idles
TURN = ("turn",)  # a worker's message: its turn starts, and its scenarios' time with it
WAITING = ("waiting",)  # a worker's message while another worker holds the device
LOADING = ("loading",)  # a worker's message: it starts loading the backend, and the load's time with it
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


def _serve(conn, name, device, profile_fields, gpu=None, time_backend=False, turns=None, stream=False, beat=WAIT_BEAT, log_path=None):
    _lead_own_group()
    if log_path is not None:
        _log_to(log_path, name)
    conn = _Framed(conn)
    from harness.gpus import configure_triton, pin_gpu

    if gpu is not None:  # before CUDA is initialized: this worker sees one GPU
        pin_gpu(gpu)

    configure_triton()
    from harness.backends.loading import load_for_device
    from harness.sampling.sample import sample_one

    conn.send(LOADING)  # the backend's import and construction have the scenarios' timeout
    try:
        backend = load_for_device(name, device)
    except Exception as e:
        conn.send(("load-error", str(e)))
        return
    from harness.evidence.environment import backend_environment

    conn.send(("loaded", backend_environment()))
    profile = Profile(**profile_fields)
    if stream and turns is None:
        from harness.sampling.stream import sample_stream

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


ENDING_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _lead_own_group() -> None:
    """Lead a process group of this worker's own, which its children join (the parent kills
    the group), and ignore SIGINT: Ctrl-C is the parent's to handle. Both signals were blocked
    since the start (``_start``): a SIGINT that came meanwhile is dropped, a SIGTERM ends it."""
    os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the backend's children, which the parent kills
    signal.pthread_sigmask(signal.SIG_UNBLOCK, ENDING_SIGNALS)


def _log_to(path: str, name: str) -> None:
    """Send descriptors 1 and 2 (prints and C-level writes alike) to ``path``, appended."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    if fd > 2:
        os.close(fd)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # a killed worker's last lines are in the file
    os.write(2, f"--- worker {os.getpid()} for {name}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())


def backend_log_path(log_dir: str, name: str) -> str:
    """``{log_dir}/backends/{safe}-{hash}.log`` for backend ``name``, its folder created:
    ``safe`` is the name with every character but [A-Za-z0-9._-] replaced by '_' (cut
    short), and the hash of the whole name keeps names that differ only there apart."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:80].lstrip(".") or "backend"
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    folder = os.path.join(log_dir, "backends")
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"{safe}-{digest}.log")


def _serve_turns(conn, backend, device, profile, gpu, time_backend, turns, beat):
    """Stream in turns: each turn waits for one item, then also takes the items already in
    the pipe for up to ``TURN_SECONDS``. A turn that ends on time or at the end of the work
    may be handed on before its last items are done (``_hands_on_early``): the next worker's
    first items then run on the device alongside them."""
    from harness.sampling.stream import sample_stream

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
    triton (H100, benchmarks/RESULTS.md#sampling-loop-overhead; it reserved up to 3x that). Within a process torch's allocator
    returns its cached blocks and retries before it fails; across the two workers of an early
    hand-on it cannot, so this rests on measurement: two runs of two MRV2 workers in turns
    and a whole three-backend run met no out-of-memory error.
    Otherwise this worker returns its cache and hands the turn on once its items are done."""
    if time_backend:
        return False
    if device == "cpu":
        return True
    import torch

    from harness.gpus import gpu_sharers
    from harness.sampling.sample import device_chunk_elements
    from harness.sampling.stream import STREAM_MEMORY_SHARE

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


MAGIC = b"specdec\x01"
_HEADER = struct.Struct("!8sQI")  # MAGIC, the pickle's length, its CRC-32
# A message's tag and its number of fields after the tag; "tallies": (tallies, seconds, calls or None).
_FIELDS = {"loaded": 1, "load-error": 1, "tallies": 3, "unsupported": 1, "error": 1, "turn": 0, "waiting": 0, "loading": 0}


class _Framed:
    """The worker's end of its pipe: what it sends goes out framed (``_HEADER``), so that the
    parent tells its messages from bytes a backend writes into the pipe; what the parent
    sends comes in as the connection reads it."""

    def __init__(self, conn):
        self._conn = conn

    def send(self, message) -> None:
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        _write_all(self._conn.fileno(), _HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)))
        _write_all(self._conn.fileno(), payload)

    def recv(self):
        return self._conn.recv()

    def poll(self, timeout=0.0) -> bool:
        return self._conn.poll(timeout)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read(fd: int, size: int, expect: bytes = b"") -> bytes:
    """Up to ``size`` bytes from ``fd``: fewer at the pipe's end, or once they stop matching
    ``expect`` (what the first bytes must be)."""
    got = bytearray()
    while len(got) < size:
        chunk = os.read(fd, min(size - len(got), 1 << 20))
        if not chunk:
            break
        got += chunk
        n = min(len(got), len(expect))
        if got[:n] != expect[:n]:
            break
    return bytes(got)


def _read_message(fd: int) -> tuple:
    """("message", message) | ("gone", None): the pipe ended (a message cut short too: the
    worker died sending it) | ("malformed", why)."""
    header = _read(fd, _HEADER.size, MAGIC)
    n = min(len(header), len(MAGIC))
    if header[:n] != MAGIC[:n]:
        return "malformed", f"{_shown(header)} where a message should start"
    if len(header) < _HEADER.size:
        return "gone", None
    _, size, crc = _HEADER.unpack(header)
    payload = _read(fd, size)
    if len(payload) < size:
        return "gone", None
    if zlib.crc32(payload) != crc:
        return "malformed", "its bytes changed on the way (CRC-32 mismatch)"
    try:
        message = pickle.loads(payload)
    except Exception as e:
        return "malformed", f"it does not unpickle ({type(e).__name__}: {_shown(str(e))})"
    why = _malformed(message)
    return ("malformed", why) if why else ("message", message)


def _malformed(message) -> str | None:
    """Why ``message`` is none of the protocol's (the tags of ``_FIELDS``, each with its
    fields' types), or None."""
    from harness.sampling.sample import Declined
    from harness.sampling.tally import TemplateTally

    if not (isinstance(message, tuple) and message and isinstance(message[0], str) and message[0] in _FIELDS):
        return f"not a tagged tuple: {_shown(message)}"
    tag, fields = message[0], message[1:]
    if len(fields) != _FIELDS[tag]:
        return f"{tag!r} with {len(fields)} fields, not {_FIELDS[tag]}"
    if tag == "loaded":
        ok = isinstance(fields[0], dict)
    elif tag == "tallies":
        tallies, seconds, calls = fields
        ok = isinstance(tallies, list) and all(isinstance(t, (TemplateTally, Declined)) for t in tallies)
        ok = ok and isinstance(seconds, (int, float)) and (calls is None or isinstance(calls, list))
    else:
        ok = all(isinstance(f, str) for f in fields)
    return None if ok else f"a {tag!r} message holding {_shown(fields)}"


def _shown(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Receiver:
    """The worker's messages, read as they come by a thread of their own, from a duplicate of
    the pipe's descriptor (the ``_Sender`` closes the connection, maybe while a read waits):
    a wait for the next one (``get``) has a deadline even when a message stops halfway. Ends
    at the pipe's end or after a malformed message."""

    def __init__(self, conn):
        self._queue = queue.SimpleQueue()
        fd = os.dup(conn.fileno())
        threading.Thread(target=self._run, args=(fd,), name="worker-receiver", daemon=True).start()

    def get(self, timeout: float):
        """(kind, message) as ``_read_message`` gives them, or None after ``timeout`` seconds."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def ready(self) -> bool:
        return not self._queue.empty()

    def _run(self, fd: int) -> None:
        try:
            while True:
                entry = _read_message(fd)
                self._queue.put(entry)
                if entry[0] != "message":
                    return
        except OSError:  # reset: it died holding unread work
            self._queue.put(("gone", None))
        except BaseException as e:  # this thread prints nothing: the wait says what happened
            self._queue.put(("malformed", f"reading it failed ({type(e).__name__})"))
        finally:
            os.close(fd)


_workers: set = set()  # worker processes started and not yet ended
_workers_lock = threading.RLock()  # re-entrant: end_workers may run in a thread interrupted while starting one
_ending = False  # end_workers was called: no worker starts from now on


class Interrupted(Exception):
    """No worker starts: the process was interrupted (``end_workers``)."""


def _start(proc) -> None:
    """Start ``proc`` with SIGINT and SIGTERM blocked (it inherits the mask; ``_lead_own_group``
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
    """Kill ``proc``'s process group (it leads it: ``_lead_own_group``), its children with it."""
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
    """One worker process with its ``_Sender`` and ``_Receiver``. ``ended`` says why it was
    ended: "timeout", "malformed" (killed by the parent) or "died"; None while it serves.
    ``loading``: it has said it loads the backend (``LOADING``)."""

    def __init__(self, ctx, args):
        parent, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_serve, args=(child, *args), daemon=True)
        try:
            _start(self.proc)
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        self.ended, self.loading = None, False
        self._receiver = _Receiver(parent)
        self._sender = _Sender(parent)

    def alive(self) -> bool:
        return self.proc.is_alive()

    def ready(self) -> bool:
        """Whether a message (or the pipe's end) has arrived."""
        return self._receiver.ready()

    def send_item(self, item) -> None:
        """A (scenario, trials) work item, as the worker reads it (``_items``)."""
        self._sender.send((item[0].to_dict(), item[1]))

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
    for scenario, _ in items:
        yield scenario, why

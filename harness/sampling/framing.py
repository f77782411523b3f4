"""The pipe between the parent and one worker: the framed message protocol and the threads
that carry it, with nothing of what the messages mean to either side.

The worker's messages are framed (``_HEADER``: ``MAGIC``, length, CRC-32, then a pickle; the
worker's end of its pipe, ``Framed``) and read by a thread of the parent's (``Receiver``):
bytes a backend writes into the pipe, a message that does not unpickle or one that is not
the protocol's (``_malformed``) can neither crash nor hang the parent. The parent sends from
a thread of its own (``Sender``): with many items ahead and large outcomes both pipes fill,
and a parent stuck sending while its worker is stuck sending an outcome would hang the run.
The worker reads the parent's messages as the connection gives them (``next_item``,
``message_waiting``).
"""

import os
import pickle
import queue
import struct
import threading
import zlib

MAGIC = b"specdec\x01"
_HEADER = struct.Struct("!8sQI")  # MAGIC, the pickle's length, its CRC-32
# A message's tag and its number of fields after the tag; "tallies": (tallies, seconds, calls or None).
_FIELDS = {"loaded": 1, "load-error": 1, "tallies": 3, "unsupported": 1, "error": 1, "turn": 0, "waiting": 0, "loading": 0}


class Framed:
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


class Receiver:
    """The worker's messages, read as they come by a thread of their own, from a duplicate of
    the pipe's descriptor (the ``Sender`` closes the connection, maybe while a read waits):
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


class Sender:
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


def next_item(conn):
    """The next (scenario data, trials), or None when the parent has no more (or is gone)."""
    try:
        return conn.recv()
    except (EOFError, OSError):
        return None


def message_waiting(conn) -> bool:
    """Whether the parent's next message can be read without blocking (a closed pipe reads
    at once, as the end of the work)."""
    try:
        return conn.poll(0)
    except (EOFError, OSError):
        return True

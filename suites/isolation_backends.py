"""Tiny misbehaving backends for the isolation and pipeline tests, each loaded by name in a worker.

Most misbehave on ``standard-near-target`` only (the scenario with templates of 1, 3 and
4 drafts) and sample like the reference otherwise. Those that start processes note their
ids in the file named by ``PIDS_ENV``: one line "worker-pid worker-pgid child-pid".
"""

import gc
import os
import stat
import subprocess
import time
from multiprocessing.connection import Connection

PIDS_ENV = "SPECDEC_ISOLATION_PIDS"


class _Reference:
    def __init__(self):
        from reference.sampler import ReferenceSampler

        self._reference = ReferenceSampler()

    def sample(self, batch):
        return self._reference.sample(batch)


class _OnMark(_Reference):
    def sample(self, batch):
        if batch.num_drafts[:3].tolist() == [1, 3, 4]:  # standard-near-target's templates
            self.misbehave()
        return super().sample(batch)


def _sockets() -> list[int]:
    """This process's socket descriptors beyond 0-2: the worker's pipe to its parent."""
    fds = []
    for entry in os.listdir("/proc/self/fd"):
        fd = int(entry)
        try:
            if fd > 2 and stat.S_ISSOCK(os.fstat(fd).st_mode):
                fds.append(fd)
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return fds


def _senders() -> list:
    """The worker's ways to send to its parent: its framing sender where it has one, else
    the bare connection."""
    objects = gc.get_objects()
    framed = [o for o in objects if type(o).__name__ == "Framed"]
    return framed or [o for o in objects if isinstance(o, Connection) and not o.closed]


class Crashes(_OnMark):
    name = "crashes"

    def misbehave(self):
        os._exit(3)  # what a CUDA fault or a segfault looks like from outside


class Hangs(_OnMark):
    name = "hangs"

    def misbehave(self):
        time.sleep(3600)


class WritesGarbage(_OnMark):
    def misbehave(self):
        for fd in _sockets():
            try:
                os.write(fd, b"\x00garbage\xff" * 4)
            except OSError:  # a socket of the runtime's own, not connected
                pass


class SendsNonTuple(_OnMark):
    def misbehave(self):
        for sender in _senders():
            sender.send("garbage")


class SendsWrongTag(_OnMark):
    def misbehave(self):
        for sender in _senders():
            sender.send(("bogus-tag", 1))


class SendsBadTallies(_OnMark):
    def misbehave(self):
        for sender in _senders():
            sender.send(("tallies", "no tallies here", 0.0, None))


def _spawn_sleeper() -> None:
    child = subprocess.Popen(["sleep", "1000"])
    with open(os.environ[PIDS_ENV], "a") as f:
        f.write(f"{os.getpid()} {os.getpgrp()} {child.pid}\n")


class HangsAlways(_Reference):
    def sample(self, batch):
        time.sleep(3600)


class SpawnsAndHangs(_OnMark):
    """Starts a child process, then hangs (on every scenario with ``always``)."""

    always = False

    def sample(self, batch):
        if self.always:
            self.misbehave()
        return super().sample(batch)

    def misbehave(self):
        _spawn_sleeper()
        time.sleep(3600)


class SpawnsAndHangsAlways(SpawnsAndHangs):
    always = True


class SpawnsAtLoad(_Reference):
    """Starts a child process when it loads and leaves it running."""

    def __init__(self):
        super().__init__()
        _spawn_sleeper()

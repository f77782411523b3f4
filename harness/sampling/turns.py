"""Device turns: the workers of several backends on one GPU sample in turns, so that each
call has the per-call memory budget.

A turn is a lock file per GPU (``device_turn``), which the OS releases when a holder dies. A
worker says when its turn starts (``TURN``), and every ``WAIT_BEAT`` seconds while it waits
for one (``WAITING``): the parent's timeout counts from the turn's start.

A worker that takes turns streams within each turn (``serve_turns``): the turn takes the
items already in the pipe, for up to ``TURN_SECONDS``. A turn that ends on time or at the
end of the work is handed on once its items are queued, where the GPU has the memory for it
and the calls are not being timed (``_hands_on_early``): the next worker's first items then
run on the device alongside this turn's last ones, which hides the restart of its stream.
"""

import fcntl
import os
import time
from contextlib import contextmanager

from harness.sampling.framing import message_waiting, next_item
from harness.scenarios.profiles import Profile
from harness.scenarios.scenario import Scenario

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


def serve_turns(conn, backend, device, profile, gpu, time_backend, turns, beat):
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
            if not message_waiting(conn):
                return  # the stream has run its queue dry before asking: nothing to overlap
            if time.monotonic() - start >= TURN_SECONDS:
                break
            if (item := next_item(conn)) is None:
                ended = True
                break
        if _hands_on_early(device, time_backend, profile):
            release()  # this turn's items are all queued; the last ones may still be running

    while not ended and (first := next_item(conn)) is not None:
        with device_turn(turns, gpu, lambda: conn.send(WAITING), beat) as release:
            conn.send(TURN)
            items = turn(first, release)
            for _, outcome in sample_stream(backend, items, profile, time_backend, available=lambda: message_waiting(conn)):
                conn.send(outcome)
            if device != "cpu":  # the next worker's turn needs the GPU's memory: returned before
                return_cached_memory()  # the turn is handed on, unless it was handed on early
        time.sleep(TURN_PAUSE)


def _hands_on_early(device: str, time_backend: bool, profile: Profile) -> bool:
    """Whether a turn is handed on while its last items still run. Not for timed calls (no
    call's time may include another worker's work). On a GPU, only while the memory free on
    it (every process counted) holds what the next worker may take before this one is done:
    a stream's share (``stream.STREAM_MEMORY_SHARE``) and one call beyond it, at
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


def return_cached_memory():
    """Drop the adapters' logits memos, then hand the blocks torch's caching allocator keeps
    back to the device. Without the memos' release a vLLM worker held up to 15.5 GiB between
    its turns (a ``gpu`` scenario's transformed logits), and 32 of them ran an 80 GB card out
    of memory."""
    import torch

    from harness.backends.logits_cache import release_all

    release_all()
    torch.cuda.empty_cache()

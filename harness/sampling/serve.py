"""The worker process's side: what runs in the process the parent starts for one backend
(``serve``), from its start to the last outcome it sends.

The worker (a fresh ``spawn`` process) starts at once, binds its own vLLM source tree if the
backend name asks for one (``vllm-mrv2@PATH``) and loads the backend, saying so first
(``LOADING``: the load has the scenarios' timeout). Work items then come through its pipe;
for each one it materializes the inputs, samples and tallies (stopping early where the item's
stop rule says so), sending back the tallies alone, framed (``framing.Framed``). On a GPU it
streams (``stream.sample_stream``), in turns when it shares the GPU with other backends'
workers (``turns.serve_turns``).

A worker leads a process group of its own, so a backend's own child processes go with it
(the parent kills the group). It starts with SIGINT and SIGTERM blocked (``ENDING_SIGNALS``)
and ignores SIGINT once it leads its group: Ctrl-C is the parent's to handle, and no worker
prints a traceback for it. With ``log_path`` its descriptors 1 and 2 go to that file
(appended): a backend's prints and C-level writes stay out of the tool's output.
"""

import os
import signal
import sys
import time

from harness.sampling.framing import Framed, message_waiting, next_item
from harness.sampling.turns import TURN, WAIT_BEAT, WAITING, device_turn, return_cached_memory, serve_turns
from harness.scenarios.profiles import Profile
from harness.scenarios.scenario import Scenario

LOADING = ("loading",)  # a worker's message: it starts loading the backend, and the load's time with it
ENDING_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def serve(conn, name, device, profile_fields, gpu=None, time_backend=False, turns=None, stream=False, beat=WAIT_BEAT, log_path=None):
    _lead_own_group()
    if log_path is not None:
        _log_to(log_path, name)
    conn = Framed(conn)
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

    conn.send(("loaded", backend_environment(backend)))
    profile = Profile(**profile_fields)
    if stream and turns is None:
        from harness.sampling.stream import sample_stream

        for _, outcome in sample_stream(backend, _items(conn), profile, time_backend, available=lambda: message_waiting(conn)):
            conn.send(outcome)
        return
    if stream:
        serve_turns(conn, backend, device, profile, gpu, time_backend, turns, beat)
        return
    while (item := next_item(conn)) is not None:
        data, count, stop = item
        with device_turn(turns, gpu, lambda: conn.send(WAITING), beat):
            if turns is not None:
                conn.send(TURN)
            outcome = sample_one(backend, Scenario.from_dict(data), profile, count, time_backend, stop)
            if turns is not None and device != "cpu":
                return_cached_memory()  # the next worker's turn needs the GPU's memory
        conn.send(outcome)


def _lead_own_group() -> None:
    """Lead a process group of this worker's own, which its children join (the parent kills
    the group), and ignore SIGINT: Ctrl-C is the parent's to handle. Both signals were blocked
    since the start (``worker._start``): a SIGINT that came meanwhile is dropped, a SIGTERM ends it."""
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


def _items(conn):
    """(scenario, trials, stop rule) as the parent sends them, until it sends None (or is gone)."""
    while (item := next_item(conn)) is not None:
        yield Scenario.from_dict(item[0]), item[1], item[2]

"""Backend isolation: one worker process per backend, only counts come back.

The worker (a fresh ``spawn`` process) binds its own vLLM source tree if the backend name
asks for one (``vllm-mrv2@PATH``), loads the backend, and for each scenario materializes
the inputs, samples and tallies, sending back the tallies alone. The parent plans and
evaluates the checks. A worker that dies (a CUDA fault, a segfault) or that sends nothing
for ``timeout`` seconds is killed; that scenario gets an error record and a fresh worker
takes the remaining scenarios. An import failure is the backend's own load verdict.
"""

import multiprocessing as mp
import time

from harness.profiles import Profile
from harness.scenarios import Scenario

LOAD_TIMEOUT = 300.0  # importing vLLM and compiling kernels takes a while


def _serve(conn, name, device, work, profile_fields, gpu=None):
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
    for data, count in work:
        conn.send(sample_one(backend, Scenario.from_dict(data), profile, count))


def _receive(conn, proc, timeout):
    """The next message, or ("error", why) when the worker died or went silent."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if conn.poll(0.5):
            try:
                return conn.recv()
            except EOFError:
                break  # the worker is gone (or going)
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


def sample_isolated(name, work, profile, device, timeout, gpu: int | None = None):
    """Yield (scenario, outcome) like the in-process sampler, from worker processes;
    ``work`` is [(scenario, trials)]; ``gpu``: the index (among the visible GPUs) the workers use."""
    ctx = mp.get_context("spawn")
    remaining = list(work)
    while remaining:
        parent, child = ctx.Pipe(duplex=False)
        payload = [(s.to_dict(), count) for s, count in remaining]
        args = (child, name, device, payload, profile.__dict__, gpu)
        proc = ctx.Process(target=_serve, args=args, daemon=True)
        proc.start()
        child.close()
        first = _receive(parent, proc, LOAD_TIMEOUT)
        if first[0] != "loaded":
            yield None, ("load-error", first[1])
            return
        yield None, ("environment", first[1])
        while remaining:
            outcome = _receive(parent, proc, timeout)
            yield remaining.pop(0)[0], outcome
            if outcome[0] == "error" and not proc.is_alive():
                break  # a fresh worker takes the rest
        parent.close()
        if proc.is_alive():
            proc.join(timeout=30)

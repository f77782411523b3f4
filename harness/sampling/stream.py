"""A backend's scenarios sampled as a stream: on a GPU it runs ahead, queueing scenarios
while the oldest one's counts are not back, so the device works while the host builds
the next inputs; and the in-process sampler (``sample_in_process``) the runner uses
without worker isolation."""

from collections import deque

from harness.backends.loading import load_for_device
from harness.gpus import gpu_sharers
from harness.sampling.sample import start_one
from harness.scenarios.profiles import Profile

# How far a stream runs ahead on a GPU: scenarios queued there before the oldest one's counts
# are read, while the process's tensors take less than this share of the device's memory.
# Deep enough that the host prepares all of the `gpu` catalog's small scenarios (host-bound:
# about 2 ms of host work each) while its large-vocabulary one samples (0.18 s on an H100);
# 16 ahead left the last 20 to be prepared after it, with the device idle
# (benchmarks/RESULTS.md#sampling-loop-overhead).
STREAM_AHEAD = 64


STREAM_MEMORY_SHARE = 0.25


def sample_stream(backend, work, profile: Profile, time_backend: bool = False, ahead: int = STREAM_AHEAD, available=None):
    """(scenario, ``sample_one``'s outcome) for each (scenario, trials) of ``work``, in order.
    On a GPU the stream runs ahead: scenarios are prepared and queued while the oldest queued
    one's counts are not back, up to ``ahead`` of them and ``STREAM_MEMORY_SHARE`` of the
    device's memory, so the device works while the host builds the next inputs.
    ``available()``: whether the next item of ``work`` can be had without waiting; while it
    cannot, the oldest queued outcome is given first (a worker must not block on its pipe
    holding the outcome its parent waits for). Default: always. An item may carry a third
    element, the scenario's stop rule (``sample.start_scenario``'s ``stop``)."""
    work = iter(work)
    queued = deque()  # (scenario, StartedOne), oldest first, outcomes not yet read

    def oldest():
        scenario, started = queued.popleft()
        return scenario, started.outcome()

    while True:
        if queued and available is not None and not available():
            yield oldest()
            continue
        item = next(work, None)
        if item is None:
            break
        scenario, count, *stop = item
        queued.append((scenario, start_one(backend, scenario, profile, count, time_backend, stop=stop[0] if stop else None)))
        while queued and (queued[0][1].ready() or len(queued) > ahead or _memory_full(backend)):
            yield oldest()
    while queued:
        yield oldest()


def _memory_full(backend) -> bool:
    """Whether this process's tensors hold ``STREAM_MEMORY_SHARE`` of its GPU's share."""
    if getattr(backend, "device", "cpu") != "cuda":
        return False
    import torch

    device = torch.cuda.current_device()
    total = torch.cuda.get_device_properties(device).total_memory
    # The allocator's own counter: torch.cuda.memory_allocated flattens every statistic into a
    # dict first, about 0.2 ms a call under cProfile.
    allocated = torch._C._cuda_memoryStats(device)["allocated_bytes"]["all"]["current"]
    return allocated > STREAM_MEMORY_SHARE * total / gpu_sharers()


def sample_in_process(name, work, profile, device, timeout, gpu=None, time_backend=False, turns=None, log_path=None):  # turns: see Sampling
    # log_path unused: in process, the backend's output cannot be told from the tool's
    try:
        backend = load_for_device(name, device)
    except Exception as e:  # a backend that cannot load is that backend's verdict
        yield None, ("load-error", str(e))
        return
    from harness.evidence.environment import backend_environment

    yield None, ("environment", backend_environment(backend))
    yield from sample_stream(backend, work, profile, time_backend)

"""Device discovery shared by the CLI and pytest."""

import os
from functools import lru_cache


@lru_cache(maxsize=1)
def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def visible_gpus() -> list[str]:
    """The GPU ids this process may use, read without initializing CUDA (after that, changes
    to CUDA_VISIBLE_DEVICES are ignored): CUDA_VISIBLE_DEVICES, else the driver's list."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip()]
    try:
        return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
    except OSError:
        return []


def pin_gpu(index: int) -> None:
    """Make the ``index``-th visible GPU (modulo their number) this process's only GPU.
    Must run before CUDA is initialized (before ``cuda_available``)."""
    gpus = visible_gpus()
    if gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[index % len(gpus)]


SHARERS_ENV = "SPECDEC_GPU_SHARERS"  # processes sampling on this process's GPU at once


def pin_xdist_worker_gpu() -> None:
    """``pytest -n N``: xdist worker ``gwI`` uses GPU ``I mod #GPUs``; with more workers than
    GPUs, the workers of a GPU share it (``gpu_sharers``)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not (worker.startswith("gw") and worker[2:].isdigit()):
        return
    index, gpus = int(worker[2:]), len(visible_gpus())
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", index + 1))
    if gpus > 1:
        pin_gpu(index)
    if gpus:
        os.environ[SHARERS_ENV] = str(len(range(index % gpus, workers, gpus)))


def gpu_sharers() -> int:
    """How many processes use this process's GPU at once (1 unless ``pin_xdist_worker_gpu``
    put several xdist workers on it)."""
    return max(1, int(os.environ.get(SHARERS_ENV, "1")))


def share_gpu_memory() -> None:
    """Cap this process's share of its GPU's memory when others use it at once: past the cap
    torch's caching allocator returns its cached blocks and retries instead of keeping them
    from the other workers. Each call's budget is divided as well
    (``harness.sampling.sample.device_chunk_elements``)."""
    if gpu_sharers() > 1 and cuda_available():
        import torch

        torch.cuda.set_per_process_memory_fraction(0.95 / gpu_sharers())


def configure_triton() -> None:
    """Use the Triton interpreter (CPU tensors) unless a CUDA device exists.

    Must run before any ``@triton.jit`` decorator executes; an explicit TRITON_INTERPRET
    in the environment wins.
    """
    if "TRITON_INTERPRET" not in os.environ and not cuda_available():
        os.environ["TRITON_INTERPRET"] = "1"


def gpu_skip_reason() -> str | None:
    """Why GPU tests cannot run here, or None when they can."""
    if not cuda_available():
        return "no CUDA device on this machine (run `pytest suites/ -m gpu` on a GPU box)"
    return None

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


def pin_xdist_worker_gpu() -> None:
    """``pytest -n N``: xdist worker ``gwI`` uses GPU ``I mod #GPUs``, one GPU per worker."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit() and len(visible_gpus()) > 1:
        pin_gpu(int(worker[2:]))


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

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

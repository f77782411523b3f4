"""What a result was measured on: versions and devices, for records and reports."""

import os
import platform
import subprocess
import sys
from importlib import metadata


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def describe() -> dict:
    env = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        **{name: _version(name) for name in ("numpy", "scipy", "torch", "triton", "vllm")},
        "vllm_source": os.environ.get("SPECDEC_VLLM_SRC"),
        "vllm_commit": os.environ.get("SPECDEC_VLLM_COMMIT"),  # set by the nightly workflow from the checkout
    }
    try:
        import torch

        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
            env["cuda"] = torch.version.cuda
            env["gpu_count"] = torch.cuda.device_count()
            env["driver"] = _driver()
    except ImportError:
        pass
    return env


def backend_environment() -> dict:
    """The versions a backend was loaded with, read in its own process: with ``NAME@PATH``
    each worker binds its own vLLM tree, so the run's environment alone would name one."""
    return {"vllm": _version("vllm"), "vllm_source": os.environ.get("SPECDEC_VLLM_SRC")}


def _driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None

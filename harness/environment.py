"""What a result was measured on: versions and devices, for records and reports."""

import platform
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
    }
    try:
        import torch

        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
            env["cuda"] = torch.version.cuda
            env["gpu_count"] = torch.cuda.device_count()
    except ImportError:
        pass
    return env

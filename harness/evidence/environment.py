"""What a result was measured on: versions and devices, for records and reports."""

import hashlib
import inspect
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
    from harness import __version__

    env = {
        "specdec_verify": __version__,
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


def backend_environment(backend=None) -> dict:
    """The versions a backend was loaded with, read in its own process: with ``NAME@PATH``
    each worker binds its own vLLM tree, so the run's environment alone would name one.
    With ``backend``: also the module that defines its class and the SHA-256 of that
    module's source, so a record names the adapter code that produced it."""
    env = {"vllm": _version("vllm"), "vllm_source": os.environ.get("SPECDEC_VLLM_SRC")}
    if backend is not None:
        env.update(_module_identity(type(backend)))
    return env


def _module_identity(cls) -> dict:
    module = inspect.getmodule(cls)
    path = getattr(module, "__file__", None)
    digest = None
    if path:
        try:
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        except OSError:
            pass
    return {"backend_module": getattr(module, "__name__", None), "backend_module_sha256": digest}


def _driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None

"""A backend name bound to what it runs on: ``NAME@PATH`` binds a vLLM source tree (in
the worker process that loads it), and the backend must list the device."""

import os

from harness.backends import load_backend


def split_source(name: str) -> tuple[str, str | None]:
    """``vllm-mrv2@vendor/vllm-0.19.1`` -> (``vllm-mrv2``, ``vendor/vllm-0.19.1``): a backend
    bound to a vLLM source tree, so two vLLM versions can be verified in one run."""
    base, sep, src = name.partition("@")
    return base, (src if sep else None)


# Built-in backends whose PATH is a folder of a release's files, loaded by path: they never
# ``import vllm``, so the process's vLLM (if one was imported) does not matter to them.
FILE_TREES = ("vllm-v0-typical", "vllm-v0-rejection")


def load_for_device(name: str, device: str):
    base, src = split_source(name)
    if src:  # in a worker process this binds the tree for that backend alone
        from harness.backends.vllm.env import SRC_ENV, use_source_tree

        os.environ[SRC_ENV] = os.path.abspath(src)
        if base not in FILE_TREES:
            use_source_tree(src)
    backend = load_backend(base)
    devices = getattr(backend, "devices", ("cpu",))
    if device not in devices:
        raise ValueError(f"backend {name!r} runs on {', '.join(devices)}, not {device}")
    backend.device = device
    return backend

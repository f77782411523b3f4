"""pytest plugin of the suite: options, markers and fixtures (calls into ``harness``).

Options (all in the ``specdec`` group):
  --backend NAME     extra backend to verify in ``suites/test_backends.py`` (repeatable;
                     built-in names, ``fault:NAME`` or a dotted path ``pkg.mod:Sampler``).
  --profile NAME     profile for those backend runs (default: ci).
  --run-seed N       seed of those runs (default: 0); printed in the header, replayable.
"""

import os

import pytest

from harness.gpus import configure_triton, pin_xdist_worker_gpu, share_gpu_memory

# `pytest -m gpu -n N`: xdist worker I uses GPU I mod #GPUs, chosen before anything
# initializes CUDA; workers sharing a GPU split its memory (``share_gpu_memory``).
pin_xdist_worker_gpu()
# The Triton interpreter must be chosen before any @triton.jit runs: CPU-only machines
# run Triton kernels under TRITON_INTERPRET=1, GPU machines compile them.
configure_triton()
# Every cached direct launch of a Triton kernel in the suite is checked against the kernel
# Triton itself picks (``harness.backends.triton.launch``); benchmarks and runs skip the check.
os.environ.setdefault("SPECDEC_TRITON_CHECK_LAUNCH", "1")


def pytest_addoption(parser):
    group = parser.getgroup("specdec", "speculative-decoding verification")
    group.addoption(
        "--backend", action="append", default=[], help="backend to verify (repeatable; default: none beyond the built-in tests)"
    )
    group.addoption("--profile", default="ci", help="profile for --backend runs (default: ci)")
    group.addoption("--run-seed", type=int, default=0, help="seed for --backend runs (default: 0)")
    group.addoption("--vllm-src", default=None, help="verify the vLLM in this python-only source tree (default: the installed vLLM)")


def pytest_sessionstart(session):
    share_gpu_memory()


def pytest_configure(config):
    src = config.getoption("--vllm-src", default=None)
    if src:
        from harness.backends.vllm.env import use_source_tree

        use_source_tree(src)


def pytest_report_header(config):
    backends = config.getoption("--backend")
    if backends:
        return f"specdec: backends={backends} profile={config.getoption('--profile')} run-seed={config.getoption('--run-seed')}"
    return None


def pytest_generate_tests(metafunc):
    if "user_backend" in metafunc.fixturenames:
        names = metafunc.config.getoption("--backend")
        if not names:
            skip = pytest.mark.skip(reason="no --backend given (e.g. pytest suites/ --backend pkg.mod:Sampler)")
            metafunc.parametrize("user_backend", [pytest.param(None, marks=skip)], ids=["none"])
        else:
            metafunc.parametrize("user_backend", names, ids=names)


@pytest.fixture(scope="session")
def run_profile(pytestconfig):
    from harness.scenarios.profiles import get_profile

    return get_profile(pytestconfig.getoption("--profile"))


@pytest.fixture(scope="session")
def run_seed(pytestconfig):
    return pytestconfig.getoption("--run-seed")


def _register_hypothesis_profiles():
    """dev: quick local runs; ci: derandomized, no database, bounded; nightly: many more."""
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:
        return
    common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], print_blob=True)
    settings.register_profile("dev", max_examples=20, **common)
    settings.register_profile("ci", max_examples=25, derandomize=True, database=None, **common)
    settings.register_profile("nightly", max_examples=400, **common)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


_register_hypothesis_profiles()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny tensors: waking torch's thread pool costs more than the work (~7 ms a softmax on
    a loaded 2-core machine); the session's setting comes back after the module."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

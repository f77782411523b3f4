"""The benchmarks' hooks into the fused path (issue 3): launch constants set from the command
line (``bench_kernels.set_constants``) and the call cut after its first kernels
(``ab_fused.cut_after``). Both time variants of the sampler on a GPU without a second copy of
its code, so both must do what they say; checked here under the interpreter. That the
constants leave the tokens as they were: ``suites/test_triton.py``."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the Triton backend needs torch")
pytest.importorskip("triton", reason="the Triton backend needs triton")

from benchmarks import ab_fused, bench_kernels  # noqa: E402
from harness.backends import triton_fused as tf  # noqa: E402
from suites.test_triton import _any_requests, _batch, _sample  # noqa: E402


@pytest.fixture
def restored(monkeypatch):
    """Whatever a test sets in ``triton_fused`` is put back after it."""
    for name in (*bench_kernels.TUNABLE, "launch_each"):
        monkeypatch.setattr(tf, name, getattr(tf, name))


@pytest.mark.parametrize(
    "spec",
    ["FOO=1", "_STATS_PROGRAMS", "STATS_PROGRAMS=0", "STATS_PROGRAMS=x", "MASS_MAX_TILES=-2", "STATS_PROGRAMS=64,BAR=2"],
)
def test_set_constants_rejects_bad_input_before_setting_any(spec, restored):
    before = {name: getattr(tf, name) for name in bench_kernels.TUNABLE}
    with pytest.raises(ValueError, match="set_constants"):
        bench_kernels.set_constants(spec)
    assert {name: getattr(tf, name) for name in bench_kernels.TUNABLE} == before


def test_set_constants_sets_the_fused_module(restored):
    wanted = {"_STATS_PROGRAMS": 1, "_MASS_PROGRAMS": 1, "_MASS_MAX_TILES": 8, "_PICK_IN_MASS_MAX_BLOCKS": 0}
    assert bench_kernels.set_constants("STATS_PROGRAMS=1, _MASS_PROGRAMS=1,MASS_MAX_TILES=8, PICK_IN_MASS_MAX_BLOCKS=0") == wanted
    assert {name: getattr(tf, name) for name in wanted} == wanted


@pytest.mark.parametrize("n", [1, 2, 4])
def test_cut_after_launches_the_first_kernels_only(n, restored):
    rng = np.random.default_rng(0)
    vocab = 300
    batch = _batch(_any_requests(rng, vocab, 3, vocab, 2), vocab)
    ab_fused.cut_after(n)
    _sample(batch, path="fused")
    kernels = ["_fused_stats_kernel", "_fused_chain_kernel", "_fused_candidate_kernel", "_fused_mass_kernel"]
    assert ab_fused.LAUNCHED == kernels[:n]

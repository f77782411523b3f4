"""Full power at the largest shape, on a GPU: V = 152,064, K = 8, gpu profile (every check
detects TV >= 0.01 at alpha = 1e-6 with power 0.99; 355,269 trials).

The ``gpu`` catalog's large scenarios stop at V = 32,000; here one standard request with
near-target draft logits at V = 152,064 is verified in full, once with the same row at every
step (``stationary``: backends with ``shared_rows`` read it as a stride-0 view) and once with
a different row per step (repeated for every trial). A few seconds per backend.
"""

import pytest

from harness.backends.vllm import mrv2 as vllm_mrv2
from harness.backends.vllm import v1 as vllm_v1
from harness.gpus import gpu_skip_reason
from harness.run.runner import run
from harness.scenarios.profiles import get_profile
from harness.scenarios.scenario import RequestSpec, Scenario

gpu = pytest.mark.skipif(gpu_skip_reason() is not None, reason=gpu_skip_reason() or "")
AVAILABILITY = {"vllm-mrv2": vllm_mrv2.availability, "vllm-v1": vllm_v1.availability}


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("stationary", [True, False], ids=["shared-rows", "per-step-rows"])
@pytest.mark.parametrize("backend", ["triton", "vllm-mrv2", "vllm-v1"])
def test_full_power_at_152k_vocab_and_8_drafts(backend, stationary):
    if backend in AVAILABILITY:
        ok, why = AVAILABILITY[backend]()
        if not ok:
            pytest.skip(f"vLLM not usable here: {why}")
    spec = RequestSpec(8, 1.0, "peaked", "near-target", stationary=stationary)
    s = Scenario(name="large-vocab-152k", method="standard", vocab_size=152064, requests=(spec,))
    result = run([backend], [s], get_profile("gpu"), seed=0, device="cuda")
    assert result.trials[(backend, s.name)] >= 355_000
    bad = [f"{r.check}: {r.verdict} {r.message}\n  {r.reproducer}" for r in result.records if r.verdict != "pass"]
    assert not bad, "\n".join(bad)


@pytest.mark.gpu
@gpu
def test_full_power_at_152k_vocab_and_8_drafts_fused_path():
    """The same check with every call on the Triton sampler's fused path (shared rows)."""
    test_full_power_at_152k_vocab_and_8_drafts("harness.backends.triton.backend:FusedTritonBackend", True)

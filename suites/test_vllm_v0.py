"""vLLM V0's ``TypicalAcceptanceSampler`` (``vllm-v0-typical@PATH``) against the reference's
typical-acceptance law, its contract, and a convention broken on purpose. The release's
files come from ``python scripts/vllm_v0_files.py --version 0.6.3 --out vendor/vllm-0.6.3``
(``.ci/run`` does it); without them these tests skip with that command."""

import os
import shutil

import pytest

from harness.backends.vllm.v0_typical import VllmV0TypicalBackend, load_sampler_class
from harness.scenarios.catalog import catalog
from harness.scenarios.profiles import get_profile
from suites.helpers import failing_checks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TREE = os.path.join(ROOT, "vendor", "vllm-0.6.3")
pytestmark = pytest.mark.skipif(
    not os.path.isfile(os.path.join(TREE, "vllm", "model_executor", "layers", "typical_acceptance_sampler.py")),
    reason="no V0 files: python scripts/vllm_v0_files.py --version 0.6.3 --out vendor/vllm-0.6.3",
)
CI = get_profile("ci")


def _scenario(name):
    return next(s for s in catalog(CI) if s.name == name)


@pytest.mark.parametrize("name", ["typical-fixed", "typical-fixed-params"])
def test_v0_typical_acceptance_follows_the_law(name):
    assert not failing_checks(f"vllm-v0-typical@{TREE}", _scenario(name), CI)


def test_v0_with_its_parameters_swapped_fails(monkeypatch):
    """V0's constructor read with epsilon and delta the other way round (in this process:
    the binding's environment variable is restored after the test)."""
    from harness.backends.vllm.env import SRC_ENV
    from harness.run.runner import run

    original = VllmV0TypicalBackend._sampler
    monkeypatch.setattr(VllmV0TypicalBackend, "_sampler", lambda self, eps, delta: original(self, delta, eps))
    monkeypatch.setenv(SRC_ENV, TREE)
    result = run([f"vllm-v0-typical@{TREE}"], [_scenario("typical-fixed-params")], CI, 0, isolate=False)
    verdicts = {r.verdict for r in result.records}
    assert "fail" in verdicts and "error" not in verdicts, [r.message for r in result.records]


def test_a_signature_off_the_contract_is_api_drift(tmp_path):
    tree = tmp_path / "vllm-x"
    shutil.copytree(TREE, tree)
    path = tree / "vllm" / "model_executor" / "layers" / "typical_acceptance_sampler.py"
    path.write_text(
        path.read_text().replace(
            "        posterior_alpha: float,\n", "        posterior_alpha: float,\n        posterior_beta: float = 0.0,\n"
        )
    )
    with pytest.raises(RuntimeError, match="vLLM API changed: TypicalAcceptanceSampler.__init__"):
        load_sampler_class(str(tree))
    with pytest.raises(ValueError, match="has no"):
        load_sampler_class(str(tmp_path / "absent"))

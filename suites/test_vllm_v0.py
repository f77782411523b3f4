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


# --- V0's RejectionSampler (vllm-v0-rejection@PATH) ---------------------------------------------
REJECTION = os.path.join(TREE, "vllm", "model_executor", "layers", "rejection_sampler.py")
_REJECTION_MARKS = (
    pytest.mark.skipif(
        not os.path.isfile(REJECTION),
        reason="no V0 rejection_sampler.py: python scripts/vllm_v0_files.py --version 0.6.3 --out vendor/vllm-0.6.3",
    ),
    # the release's module compiles its _multinomial with torch.jit.script, deprecated in this torch
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning"),
)


def needs_rejection(test):
    for mark in _REJECTION_MARKS:
        test = mark(test)
    return test


def _run_rejection(names):
    """The scenarios through vllm-v0-rejection in this process: their records."""
    from harness.run.runner import run

    return run([f"vllm-v0-rejection@{TREE}"], [_scenario(n) for n in names], CI, 0, isolate=False).records


@needs_rejection
@pytest.mark.parametrize(
    "name",
    ["standard-temperatures", "standard-small-draft-vocab", "standard-sampled", "standard-disjoint", "standard-zero-drafts"],
)
def test_v0_rejection_sampler_follows_the_law(name, monkeypatch):
    from harness.backends.vllm.env import SRC_ENV

    monkeypatch.setenv(SRC_ENV, TREE)
    records = _run_rejection([name])
    verdicts = [r.verdict for r in records]
    assert "pass" in verdicts and not {"fail", "error"} & set(verdicts), [(r.template, r.check, r.verdict, r.message) for r in records]


@needs_rejection
def test_v0_rejection_with_draft_probs_at_the_wrong_temperature_fails(monkeypatch):
    """Draft probabilities at T = 1 instead of the request's T (the target's stays right)."""
    import torch

    from harness.backends.vllm.env import SRC_ENV
    from harness.backends.vllm.v0_rejection import VllmV0RejectionBackend

    original = VllmV0RejectionBackend._draft_probs
    monkeypatch.setattr(VllmV0RejectionBackend, "_draft_probs", staticmethod(lambda dl, t, v: original(dl, torch.ones_like(t), v)))
    monkeypatch.setenv(SRC_ENV, TREE)
    records = _run_rejection(["standard-temperatures"])
    verdicts = {r.verdict for r in records}
    assert "fail" in verdicts and "error" not in verdicts, [r.message for r in records]


@needs_rejection
def test_v0_rejection_declines_what_its_contract_lacks(monkeypatch):
    from harness.backends.vllm.env import SRC_ENV

    monkeypatch.setenv(SRC_ENV, TREE)
    skipped = {}
    for r in _run_rejection(["greedy-ragged", "standard-no-draft-probs", "standard-placeholder", "strict-fixed", "standard-top-k"]):
        assert r.verdict == "skipped", (r.scenario, r.verdict, r.message)
        skipped.setdefault(r.scenario, r.message)
    assert "no greedy rule" in skipped["greedy-ragged"]
    assert "requires draft_probs" in skipped["standard-no-draft-probs"]
    assert "placeholder drafts" in skipped["standard-placeholder"]
    assert "standard method only" in skipped["strict-fixed"]
    assert "top-k" in skipped["standard-top-k"]


@needs_rejection
def test_v0_rejection_binds_its_files_without_vllm(tmp_path):
    """Loaded with stubs for vllm.envs and vllm.logger, sys.modules untouched; a signature off
    the contract is api drift; a stub read (vllm.envs) raises rather than drifting."""
    import sys

    from harness.backends.vllm.v0_rejection import load_sampler_class

    before = {m for m in sys.modules if m == "vllm" or m.startswith("vllm.")}
    cls = load_sampler_class(TREE)
    assert {m for m in sys.modules if m == "vllm" or m.startswith("vllm.")} == before
    assert cls(strict_mode=True, use_flashinfer=False).use_flashinfer is False
    with pytest.raises(AttributeError, match="vllm.envs.VLLM_USE_FLASHINFER_SAMPLER"):
        cls(strict_mode=True)  # use_flashinfer=None would read vllm.envs: the stub refuses

    tree = tmp_path / "vllm-x"
    shutil.copytree(TREE, tree)
    path = tree / "vllm" / "model_executor" / "layers" / "rejection_sampler.py"
    path.write_text(
        path.read_text().replace(
            '        seeded_seqs: Optional[Dict[int, torch.Generator]] = None,\n    ) -> torch.Tensor:\n        """Sample',
            '    ) -> torch.Tensor:\n        """Sample',
            1,
        )
    )
    with pytest.raises(RuntimeError, match=r"vLLM API changed: RejectionSampler.forward"):
        load_sampler_class(str(tree))
    path.write_text(
        path.read_text().replace("from vllm.logger import init_logger", "from vllm.logger import init_logger\nimport vllm.platforms")
    )
    with pytest.raises(ImportError, match="imports vllm.platforms, which the adapter does not bind"):
        load_sampler_class(str(tree))
    (tree / "vllm" / "model_executor" / "layers" / "rejection_sampler.py").unlink()
    with pytest.raises(ValueError, match="has no"):
        load_sampler_class(str(tree))


@needs_rejection
def test_v0_rejection_empty_residual_is_uniform_over_the_vocabulary():
    """A finding, pinned as the release has it: where rounding leaves max(p - q, 0) empty after
    a rejection, V0 clamps every entry to float32's tiny (``_get_recovered_probs``, whose docstring
    admits "some drift") and draws uniformly over the whole vocabulary, masked ids (p = 0)
    included; the protocol falls back to p. A rejection there has probability 1 - p(x)/q(x), a
    few float32 ulps (here 3.6e-7 a trial), so no law check can see it."""
    import torch

    from harness.backends.vllm.v0_rejection import load_sampler_class

    sampler = load_sampler_class(TREE)(strict_mode=True, use_flashinfer=False)
    p = torch.tensor([[[0.25, 0.75, 0.0]]])
    q = torch.tensor([[[0.2500001, 0.75, 0.0]]])
    assert (p / q)[0, 0, 0] < 1  # draft 0 is rejected with a positive probability
    assert torch.equal(sampler._get_recovered_probs(p, q), torch.full((1, 1, 3), 1 / 3))

"""Whole engines end to end (``harness.engines``): Hugging Face assisted generation at
T > 0 against the target model's exact law, the wiring audits, the planted engine faults,
HF's processing pinned against its own warpers, and bad input."""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from harness.engines.law import continuation_law, prefix_laws
from harness.engines.models import ModelSpec, build
from harness.engines.run import run_engines
from harness.engines.scenario import CATALOG, EngineScenario, catalog_scenario
from harness.evidence.records import Verdict
from harness.scenarios.profiles import get_profile
from reference.hf_processing import HfSampling, processed_probs

pytestmark = pytest.mark.usefixtures("one_torch_thread")
transformers = pytest.importorskip("transformers")


def _verdicts(result) -> dict:
    return {(r.backend, r.scenario, r.check): r.verdict for r in result.records}


@pytest.mark.parametrize(
    "params", [HfSampling(), HfSampling(0.7), HfSampling(1.3, top_k=3), HfSampling(0.9, top_p=0.8), HfSampling(2.0, 5, 0.9)]
)
def test_hf_processing_matches_hf_warpers(params):
    """HF's own warper list, as ``generate(do_sample=True)`` builds it, gives our law."""
    from transformers import GenerationConfig, LlamaForCausalLM

    rng = np.random.default_rng(0)
    logits = rng.normal(scale=2.0, size=(64, 12)).astype(np.float32)
    logits[:8, :4] = 1.5  # ties at the top-k boundary: HF keeps them all
    config = GenerationConfig(do_sample=True, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p)
    warpers = LlamaForCausalLM._get_logits_processor(build(ModelSpec(vocab=12)), config, input_ids_seq_length=1)
    got = warpers(torch.zeros((64, 1), dtype=torch.long), torch.from_numpy(logits.copy())).softmax(-1).double().numpy()
    np.testing.assert_allclose(got, processed_probs(logits, params), atol=1e-6)


def test_models_are_seeded_and_drafts_are_close_or_far():
    target = catalog_scenario("hf-close-draft")
    prompt = [target.prompt]
    p = prefix_laws(target.target, target.sampling, prompt)
    assert np.array_equal(p, prefix_laws(dataclasses.replace(target.target), target.sampling, prompt))
    close = prefix_laws(target.draft, target.sampling, prompt)
    far = prefix_laws(catalog_scenario("hf-far-draft").draft, target.sampling, prompt)
    tv = lambda a, b: 0.5 * np.abs(a - b).sum()  # noqa: E731
    assert tv(p, close) < 0.15 < 0.4 < tv(p, far)


@pytest.mark.parametrize("scenario", CATALOG, ids=lambda s: s.name)
def test_continuation_law_is_a_law(scenario):
    law = continuation_law(scenario)
    assert law.shape == (scenario.cells,) and np.all(law >= 0) and abs(law.sum() - 1) < 1e-12


def test_ensemble_law_is_the_lossless_law_when_the_draft_is_the_target():
    s = catalog_scenario("hf-ensemble")
    same = dataclasses.replace(s, draft=s.target)
    np.testing.assert_allclose(continuation_law(same), continuation_law(dataclasses.replace(same, ensemble_weight=None)), atol=1e-12)
    assert 0.5 * np.abs(continuation_law(s) - continuation_law(dataclasses.replace(s, ensemble_weight=None))).sum() > 0.05


def test_current_release_end_to_end():
    """transformers as installed (5.20.2 pinned): the emitted law and the verifier's inputs
    are exact, at the power two CPU cores afford in the suite (TV 0.2: ~800 generate calls a
    scenario; the smoke profile's TV 0.1 is docs/data/hf-releases.json); the assistant draws
    its candidates at the request's temperature applied twice
    (docs/verification-results.md), so ``drafter-law`` fails exactly where T != 1."""
    result = run_engines(["hf"], list(CATALOG), get_profile("smoke"), tv=0.2, workers=2)
    verdicts = _verdicts(result)
    for s in CATALOG:
        for check in ("continuation-law", "verifier-q", "verifier-p"):
            assert verdicts["hf", s.name, check] is Verdict.PASS, (s.name, check)
        expected = Verdict.PASS if s.sampling.temperature == 1.0 else Verdict.FAIL
        assert verdicts["hf", s.name, "drafter-law"] is expected, s.name
    law = [r for r in result.records if r.check == "continuation-law"]
    assert all(r.detectable_tv <= 0.2 + 1e-9 and r.trials > 300 for r in law)


def test_engine_faults_are_caught():
    """Each planted wiring fault fails its audit and, where its bias reaches the output at
    this power, the continuation law."""
    engines = ["hf-fault:greedy-draft-soft-q", "hf-fault:q-before-processor", "hf-fault:target-top-k-skipped"]
    scenarios = [catalog_scenario("hf-close-draft"), catalog_scenario("hf-top-k-top-p")]
    verdicts = _verdicts(run_engines(engines, scenarios, get_profile("smoke"), tv=0.3, workers=2))
    assert verdicts[engines[0], "hf-close-draft", "verifier-q"] is Verdict.FAIL
    assert verdicts[engines[0], "hf-close-draft", "continuation-law"] is Verdict.FAIL
    assert verdicts[engines[1], "hf-top-k-top-p", "verifier-q"] is Verdict.FAIL
    assert verdicts[engines[2], "hf-top-k-top-p", "verifier-p"] is Verdict.FAIL
    assert verdicts[engines[2], "hf-top-k-top-p", "continuation-law"] is Verdict.FAIL
    for fault in engines:  # a fault leaves the rest of the path alone
        assert verdicts[fault, "hf-close-draft", "verifier-p"] is Verdict.PASS


def test_a_release_that_fails_to_import_is_an_error_record(tmp_path):
    (tmp_path / "transformers").mkdir()
    (tmp_path / "transformers" / "__init__.py").write_text("raise ImportError('broken release')\n")
    result = run_engines([f"hf@{tmp_path}"], [catalog_scenario("hf-far-draft")], get_profile("smoke"), tv=0.5, workers=1)
    assert {r.verdict for r in result.records} == {Verdict.ERROR}
    assert "broken release" in result.records[0].message


@pytest.mark.parametrize(
    "args, message",
    [
        (["--engine", "vllm"], "expected hf, hf@SITE or hf-fault:NAME"),
        (["--engine", "hf@/no/such/site"], "holds no transformers/"),
        (["--engine", "hf-fault:nope"], "unknown fault 'nope'"),
        (["--scenario", "nope"], "unknown 'nope'"),
        (["--tv", "1.5"], "--tv: expected a total variation in (0, 1)"),
        (["--workers", "-1"], "--workers"),
    ],
)
def test_bad_engine_arguments_exit_2(args, message, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "harness", "engine", *args, "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(prompt=()), "prompt"),
        (dict(prompt=(9,)), "prompt"),
        (dict(max_new_tokens=5), "cells"),
        (dict(ensemble_weight=1.0), "ensemble_weight"),
        (dict(draft=ModelSpec(vocab=9)), "draft vocab"),
    ],
)
def test_bad_engine_scenarios_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(catalog_scenario("hf-far-draft"), **change)


def test_scenarios_round_trip_through_json():
    for s in CATALOG:
        assert EngineScenario.from_dict(s.to_dict()) == s


def test_engine_command_writes_its_outputs_and_history(tmp_path):
    """The command end to end: outputs, exit code, a history entry, and the reproducer."""
    out, history = tmp_path / "out", tmp_path / "h.sqlite"
    args = ["--engine", "hf", "--scenario", "hf-ensemble", "--tv", "0.5", "--workers", "1", "--out", str(out), "--history", str(history)]
    proc = subprocess.run([sys.executable, "-m", "harness", "engine", *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((out / "results.json").read_text())
    assert sorted(r["check"] for r in doc["records"]) == ["continuation-law", "drafter-law", "verifier-p", "verifier-q"]
    assert doc["backend_environments"]["hf"]["transformers"] == transformers.__version__
    assert doc["records"][0]["reproducer"].startswith(
        "python -m harness engine --engine hf --profile smoke --seed 0 --scenario hf-ensemble"
    )
    assert (out / "index.html").is_file() and history.is_file()

"""vLLM MRV2 drafting its own drafts (``harness/backends/vllm/drafting.py``, ``draft_sampling``).

Each convention of vLLM's drafter (``docs/adapter-contracts-drafting.md``) has a test that fails
when vLLM breaks it:

* the catalog's engine-* scenarios pass through the runner (CPU: smoke's error rates at a
  detectable TV of 0.5, ~80 s under the interpreter; the smoke profile itself takes ~40 min there:
  ``-m gpu`` runs it at ``--profile``);
* the drafts are vLLM's ``gumbel_sample`` at (seed, pos of the verifying row, step) and nothing
  else: a direct call of it gives them, the same request drafts the same ids anywhere;
* the cache the drafter writes is the one the verifier is built from (a kernel caching other
  values fails); greedy drafts are the argmax, verified as point masses;
* ``NOISE_SCENARIO`` (V = 5, one draft, T = 2: the draft's favourite has no target mass and its
  runner-up shares the residual with a token the draft lacks) passes with #54282's salt and fails
  the position-law without it: the installed vLLM with ``is_drafting`` forced False, and the
  0.27.1 tree (slow; ``-m gpu``: 0.19.1, 0.24.0, 0.27.1 by the reproducer command). No catalog
  scenario shows it at a CPU-affordable profile: the bias is a TV of ~0.09 at best.
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.backends.logits_cache import LogitsMemo
from harness.backends.vllm import drafting, mrv2
from harness.backends.vllm import env as vllm_env
from harness.gpus import gpu_skip_reason
from harness.protocol import as_numpy_drafted_outputs, as_numpy_outputs
from harness.run.runner import run
from harness.scenarios.catalog import catalog, find
from harness.scenarios.profiles import get_profile
from harness.scenarios.scenario import RequestSpec, Scenario
from harness.scenarios.strategies import without_mates
from suites.helpers import assert_same_outputs, engine_batch, wrapped

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy on -inf lanes in the interpreter
ROOT = Path(__file__).resolve().parent.parent
TREES = Path(os.environ.get("SPECDEC_VLLM_TREES", ROOT / "vendor"))
DRAFTER = "harness.backends.vllm.drafting:VllmMrv2DrafterBackend"
GUMBEL = "vllm.v1.worker.gpu.sample.gumbel"
ENGINE_SCENARIOS = ("engine-drafted", "engine-drafted-offset", "engine-greedy-drafter", "engine-drafted-block", "engine-drafted-top-p")
CPU_PROFILE = dataclasses.replace(get_profile("smoke"), tv=0.5)  # keeps the name: the runner resolves names
# 616 trials (~30 s on the CPU): the bias is detected at p ~ 1e-8 there (0.19.1, 0.24.0, 0.27.1, 0.33 unsalted)
NOISE_PROFILE = dataclasses.replace(get_profile("smoke"), tv=0.15, alpha=1e-3)
NOISE_SCENARIO = Scenario(
    name="engine-drafted-noise-sharing", method="standard", vocab_size=5, seed=45, draft_mode="engine",
    requests=(RequestSpec(1, 2.0, "topk", "topk"),),
)  # fmt: skip
# draft-law: q at T = 0.25 against q at T = 1 is a TV of 0.46; 205 trials (~7 s)
COLD_PROFILE = dataclasses.replace(get_profile("smoke"), tv=0.3)
COLD_SCENARIO = Scenario(
    name="engine-drafted-cold", method="standard", vocab_size=4, seed=3, draft_mode="engine",
    requests=(RequestSpec(1, 0.25, "peaked", "flat"),),
)  # fmt: skip
gpu = pytest.mark.skipif(gpu_skip_reason() is not None, reason=gpu_skip_reason() or "")


# --- vLLM's gumbel_sample made to break a convention (same signature) ---------------------------
def _unsalted(a):
    a["is_drafting"] = False  # the draft's noise is the verifier's again (#47386)


def _untempered(a):
    a["apply_temperature"] = False


def _caches_divided(a):
    """The drafter caches logits / T where its release caches raw logits."""
    import torch

    t = a["temperature"][a["expanded_idx_mapping"].long()]
    t = torch.where(t > 0, t, torch.ones_like(t))
    a["logits_cache_source"] = (a["logits"].float() / t[:, None]).to(a["logits"].dtype)


CHANGES = {"unsalted": _unsalted, "untempered": _untempered, "caches-divided": _caches_divided}


def _install(change, setattr_=setattr):
    module = vllm_env.import_vllm(GUMBEL)
    setattr_(module, "gumbel_sample", wrapped(module.gumbel_sample, CHANGES[change]))


def verdicts(scenario_json: str, tv: float, alpha: float, device: str = "cpu", change: str | None = None) -> dict:
    """Run one scenario through the runner (vLLM's gumbel_sample changed by ``change``)."""
    if change:
        _install(change)
    profile = dataclasses.replace(get_profile("smoke"), tv=tv, alpha=alpha)
    records = run([DRAFTER], [Scenario.from_json(scenario_json)], profile, 0, device=device).records
    return {
        "api": drafting.VllmMrv2DrafterBackend().api,
        "checks": {f"{r.check}[{r.template}]": [str(r.verdict), r.p_value, r.trials] for r in records},
        "failed": sorted({r.check for r in records if r.verdict == "fail"}),
        "errors": [f"{r.check}: {r.kind}: {r.message}" for r in records if r.verdict == "error"],
    }


_IN_TREE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("vllm_drafting_tests", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps(module.verdicts(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5])))
"""


def _in_tree(version: str, scenario: Scenario, profile, device: str = "cpu") -> dict:
    tree = TREES / f"vllm-{version}"
    if not (tree / "vllm" / "__init__.py").is_file():
        pytest.skip(f"no vLLM {version} tree at {tree} (python scripts/build_vllm_tree.py --version {version} --no-wheelhouse)")
    env = {**os.environ, vllm_env.SRC_ENV: str(tree), "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-c", _IN_TREE, __file__, scenario.to_json(), str(profile.tv), str(profile.alpha), device]
    res = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _assert_passes(out):
    assert out["checks"] and not out["failed"] and not out["errors"], out


@pytest.fixture(scope="module")
def drafter():
    ok, why = drafting.availability()
    if not ok:
        pytest.skip(f"vLLM not usable here: {why}")
    return drafting.VllmMrv2DrafterBackend()


@pytest.fixture
def salted(drafter):
    if not drafter.era.is_drafting:
        pytest.skip(f"the installed vLLM's drafter ({drafter.era.releases}) has no #54282 salt: its tree tests cover it")
    return drafter


def _engine_batch(seed, **kw):
    """At scattered state slots, as the engine's are."""
    return engine_batch(seed, scattered_slots=True, **kw)


def _drafts(backend, batch):
    out = backend.sample(batch)
    return as_numpy_drafted_outputs(out, batch.num_requests, batch.max_drafts, len(batch.draft_tokens))


def _subset(batch, reqs):
    """The requests ``reqs`` of ``batch``, in that order, at other state slots, as a batch of their own."""
    return dataclasses.replace(without_mates(batch, reqs), request_slots=np.arange(len(reqs)) * 7 + 1).validate()


# --- the drafts are vLLM's gumbel_sample, keyed by (seed, pos, step) ------------------------------
def test_drafts_are_gumbel_sample_at_the_verifying_rows_position(drafter):
    """One direct call of vLLM's gumbel_sample over every draft (a per-draft cache column, the
    path of parallel drafting) at ``pos[cu[r] + r + j]`` gives the drafts the backend drew step
    by step: the draw depends on (slot's seed, pos, step) only, at the request's temperature."""
    import torch

    if drafter.era.releases != "0.29+":
        pytest.skip(f"the direct call is written in 0.29+'s signature, the installed one is {drafter.era.releases}'s")
    batch = _engine_batch(1)
    drafts = _drafts(drafter, batch)[2]
    cu = batch.cu_num_drafts
    owner = np.repeat(np.arange(batch.num_requests), np.diff(cu))
    steps = np.arange(cu[-1]) - cu[owner]
    slots = batch.request_slots
    n = int(slots.max()) + 1
    temp, seed = torch.zeros(n), torch.zeros(n, dtype=torch.int64)
    temp[slots], seed[slots] = torch.tensor(batch.temperature, dtype=torch.float32), torch.tensor(batch.seeds)
    cache = torch.zeros(n, batch.max_drafts, batch.vocab_size)
    direct = vllm_env.import_vllm(GUMBEL).gumbel_sample(
        torch.tensor(batch.draft_logits), torch.tensor(slots[owner], dtype=torch.int32), temp, seed,
        torch.tensor(batch.positions[np.arange(cu[-1]) + owner]), apply_temperature=True, is_drafting=True,
        logits_cache=cache, logits_cache_col=torch.tensor(steps),
    )  # fmt: skip
    np.testing.assert_array_equal(drafts, direct.numpy())
    assert np.array_equal(drafts, _drafts(drafter, batch)[2]), "not deterministic"


def test_drafts_are_keyed_by_seed_and_position_only(drafter):
    batch = _engine_batch(2)
    drafts = _drafts(drafter, batch)[2]
    cu = batch.cu_num_drafts
    counts = np.diff(cu)
    order = np.r_[0, np.arange(1, batch.num_requests)[::-1]]  # request 0 (3 drafts) first, its mates reversed, other slots
    moved = _drafts(drafter, _subset(batch, order))[2]
    np.testing.assert_array_equal(moved[: counts[0]], drafts[: counts[0]])
    np.testing.assert_array_equal(_drafts(drafter, _subset(batch, [0]))[2], drafts[: counts[0]])
    hot = _subset(batch, np.flatnonzero((counts > 0) & (batch.temperature > 0)))
    same = _drafts(drafter, hot)[2]
    assert (_drafts(drafter, dataclasses.replace(hot, seeds=hot.seeds + 1))[2] != same).mean() > 0.2
    assert (_drafts(drafter, dataclasses.replace(hot, positions=hot.positions + 1))[2] != same).mean() > 0.2


# --- the cache, greedy drafts, the parent's path ---------------------------------------------------
@pytest.mark.parametrize("dtype,draft_vocab", [("float32", None), ("bfloat16", 7)])
def test_drafter_cache_is_the_one_verified(drafter, dtype, draft_vocab):
    """The drafter writes, at (slot, step) of every draft, the cache the verifier builds from the
    draft logits by the release's contract (raw in the logits' dtype from 0.28, logits / T in fp32
    before), bit for bit, at the width the release reads."""
    batch = _engine_batch(3, dtype=dtype, draft_vocab=draft_vocab)
    drafts, cache = drafter.draw(batch)
    verified = dataclasses.replace(batch, draft_tokens=drafts.numpy(), draft_sampling=None)
    width = None if getattr(drafter._api, "truncates", False) else batch.vocab_size
    lay = mrv2._Layout(verified, "cpu", LogitsMemo())
    want = lay.draft_cache(verified, divide=not drafter.era.raw, width=width)
    slot, step = lay.slots[lay.owner_of_draft], lay.draft_steps
    assert cache.dtype == want.dtype and cache.shape == want.shape and cache.is_contiguous()
    assert cache[slot, step].equal(want[slot, step]), "the verified q is not what the drafter sampled from"


def test_cache_of_another_contract_is_caught(drafter, monkeypatch):
    if not drafter.era.raw or "logits_cache_source" not in vllm_env.parameters(vllm_env.import_vllm(GUMBEL).gumbel_sample):
        pytest.skip("the change is written with 0.32+'s logits_cache_source")
    _install("caches-divided", monkeypatch.setattr)
    with pytest.raises(AssertionError, match="not what the drafter sampled from"):
        test_drafter_cache_is_the_one_verified(drafter, "float32", None)


def test_greedy_drafts_are_the_argmax_verified_as_point_masses(drafter, monkeypatch):
    if not drafter.era.greedy:
        pytest.skip(f"vLLM {drafter.era.releases} has no greedy drafting")
    batch = _engine_batch(4, sampling="greedy", temps=(0.0, 1.0))
    seen = []
    parent = mrv2.VllmMrv2Backend.sample
    monkeypatch.setattr(mrv2.VllmMrv2Backend, "sample", lambda self, b: seen.append(b) or parent(self, b))
    tokens, emitted, drafts = _drafts(drafter, batch)
    np.testing.assert_array_equal(drafts, np.argmax(batch.draft_logits, axis=1))
    assert seen[-1].draft_logits is None and seen[-1].draft_sampling is None
    cu = batch.cu_num_drafts
    for r in range(batch.num_requests):
        assert np.array_equal(tokens[r, : emitted[r] - 1], drafts[cu[r] : cu[r] + emitted[r] - 1]), r


def test_batch_without_draft_sampling_takes_the_parents_path(drafter):
    batch = _engine_batch(5)
    drafts = _drafts(drafter, batch)[2]
    plain = dataclasses.replace(batch, draft_sampling=None, draft_tokens=drafts)
    out = drafter.sample(plain)
    assert len(out) == 2 and drafter.drafter is True and drafter.name == "vllm-mrv2"
    want = as_numpy_outputs(mrv2.VllmMrv2Backend().sample(plain), batch.num_requests, batch.max_drafts)
    assert_same_outputs(as_numpy_outputs(out, batch.num_requests, batch.max_drafts), want, batch)


def test_release_without_greedy_drafting_declines(drafter):
    old = dataclasses.replace(drafter.era, releases="0.19-0.20", greedy=False)
    backend = object.__new__(drafting.VllmMrv2DrafterBackend)
    backend.__dict__.update(drafter.__dict__, era=old)
    assert "no greedy draft sampling" in backend.supports(_engine_batch(6, sampling="greedy"))
    assert backend.supports(_engine_batch(6)) is None


# --- binding: the signature's era, the release, api-drift ------------------------------------------
_BASE = ["logits", "expanded_idx_mapping", "temperature", "seed", "pos", "apply_temperature"]


@pytest.mark.parametrize(
    "extra,version,legacy,era",
    [
        (["processed_logits_out"], "0.19.1", True, "0.19-0.20"),
        (["processed_logits_out"], "0.20.2", True, "0.19-0.20"),
        (["output_processed_logits", "output_processed_logits_col"], "0.21.0", True, "0.21-0.27"),
        (["output_processed_logits", "output_processed_logits_col", "use_fp64"], "0.27.1", False, "0.21-0.27"),
        (["logits_cache", "logits_cache_col", "use_fp64"], "0.28.0", False, "0.28"),
        (["is_drafting", "logits_cache", "logits_cache_col", "use_fp64", "logits_cache_source"], "0.33.0", False, "0.29+"),
        (
            ["is_drafting", "logits_cache", "logits_cache_col", "use_fp64", "logits_cache_source", "logits_cache_row_mapping", "bias"],
            "0.34.0",
            False,
            "0.29+",
        ),
    ],
)
def test_each_release_binds_its_era(extra, version, legacy, era):
    from packaging.version import Version

    assert drafting.bind_era(_BASE + extra, Version(version), legacy).releases == era
    assert drafting.bind_era(_BASE + extra, None, legacy).releases == era  # the signature alone says it


@pytest.mark.parametrize(
    "extra,version,legacy",
    [
        (["logits_cache"], "0.33.0", False),  # a cache without its column
        (["is_drafting", "logits_cache", "logits_cache_col"], "0.28.0", False),  # the salt before #54282
        (["logits_cache", "logits_cache_col"], "0.29.0", False),  # #54282's release without is_drafting
        (["processed_logits_out"], None, False),  # 0.19's drafter with 0.22+'s verifier
        (["logits_cache", "logits_cache_col"], "0.28.0", True),  # a raw cache with a function per method
        (["processed_logits_out", "logits_cache", "logits_cache_col"], None, False),
    ],
)
def test_unknown_drafter_contract_is_api_drift(extra, version, legacy):
    from packaging.version import Version

    with pytest.raises(RuntimeError, match="vLLM API changed"):
        drafting.bind_era(_BASE + extra, version and Version(version), legacy)


# --- through the runner ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ENGINE_SCENARIOS)
def test_engine_scenario_passes_cpu(drafter, name):
    records = run([DRAFTER], [find(catalog(CPU_PROFILE), name)], CPU_PROFILE, 0).records
    bad = [f"{r.scenario}[{r.template}] {r.check}: {r.verdict} {r.message}" for r in records if r.verdict != "pass"]
    assert records and not bad, "\n".join(bad)


CONVENTIONS = {
    "unsalted": (NOISE_SCENARIO, NOISE_PROFILE, "position-law"),  # is_drafting=True (#54282)
    "untempered": (COLD_SCENARIO, COLD_PROFILE, "draft-law"),  # apply_temperature=True
}


@pytest.mark.parametrize("change", CONVENTIONS)
def test_drafter_keeping_its_release_passes(request, change):
    drafter = request.getfixturevalue("salted" if change == "unsalted" else "drafter")
    scenario, profile, _ = CONVENTIONS[change]
    out = verdicts(scenario.to_json(), profile.tv, profile.alpha)
    assert drafter.era.releases in out["api"]
    _assert_passes(out)


@pytest.mark.parametrize("change", CONVENTIONS)
def test_drafter_breaking_its_release_fails(request, monkeypatch, change):
    """is_drafting=False: the drafter's noise is the verifier's residual noise at the same (seed,
    pos) (#47386, the bug #54282 fixed); apply_temperature=False: drafts from softmax(row), not
    softmax(row / T)."""
    request.getfixturevalue("salted" if change == "unsalted" else "drafter")
    scenario, profile, check = CONVENTIONS[change]
    _install(change, monkeypatch.setattr)
    out = verdicts(scenario.to_json(), profile.tv, profile.alpha)
    assert not out["errors"] and check in out["failed"], out


@pytest.mark.slow
def test_vllm_before_54282_shares_the_drafters_noise_cpu(drafter):
    out = _in_tree("0.27.1", NOISE_SCENARIO, NOISE_PROFILE)
    assert "0.21-0.27" in out["api"] and not out["errors"] and out["failed"] == ["position-law"], out


# --- CUDA ------------------------------------------------------------------------------------------
@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("name", ENGINE_SCENARIOS)
def test_engine_scenario_passes_gpu(drafter, name, run_profile):
    records = run([DRAFTER], [find(catalog(run_profile), name)], run_profile, 0, device="cuda").records
    bad = [f"{r.scenario}[{r.template}] {r.check}: {r.verdict} {r.message}" for r in records if r.verdict != "pass"]
    assert records and not bad, "\n".join(bad)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("change", [None, "unsalted"])
def test_salt_decides_the_noise_scenario_gpu(salted, monkeypatch, change):
    if change:
        _install(change, monkeypatch.setattr)
    smoke = get_profile("smoke")
    out = verdicts(NOISE_SCENARIO.to_json(), smoke.tv, smoke.alpha, "cuda")
    assert not out["errors"] and out["failed"] == (["position-law"] if change else []), out


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("version", ["0.19.1", "0.24.0", "0.27.1"])
def test_vllm_before_54282_shares_the_drafters_noise_gpu(drafter, version, tmp_path):
    """The reproducer command of the finding, on the device, at the smoke profile."""
    tree = TREES / f"vllm-{version}"
    if not (tree / "vllm" / "__init__.py").is_file():
        pytest.skip(f"no vLLM {version} tree at {tree}")
    scenario = tmp_path / f"{NOISE_SCENARIO.name}.json"
    scenario.write_text(NOISE_SCENARIO.to_json())
    cmd = [sys.executable, "-m", "harness", "run", "--backend", f"{DRAFTER}@{tree}", "--scenario", str(scenario)]
    cmd += ["--profile", "smoke", "--device", "cuda", "--no-progress", "--out", str(tmp_path / "out")]
    res = subprocess.run(
        cmd,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"{NOISE_SCENARIO.name}[0] position-law" in res.stdout, res.stdout[-3000:]  # the first failure

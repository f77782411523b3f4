"""The vLLM adapters bind to vLLM's declared contract, never to the behaviour of the code
they verify (``docs/adapter-contracts.md``).

Each convention has a test that makes vLLM's entry point break it, by wrapping the function
the adapter calls so that it behaves like another release (its kernels divide the draft
logits by the temperature once more, or not at all; they divide the target logits again),
and runs a small scenario through the runner: a check must fail. An adapter that probed the
kernel and fed it whatever makes it pass would turn these failures into passes. Beside each,
the same scenario passes unwrapped: the adapter feeds the release's contract.

``CONTRACT_SCENARIO``: one request, one fixed draft, T = 0.2, V = 8, at ``smoke``'s error
rates and a detectable TV of 0.3 (205 trials: ~20 s for MRV2 under the interpreter). Each
violation moves the outcome law by a TV of 0.35 to 0.43 (the reference sampler with the
violation planted, 21k trials); at 205 trials each was detected on 30 of 30 seeds there,
the reference on none.

Releases other than the installed one run in a subprocess from python-only trees (one vLLM
per process): ``vendor/vllm-X`` or ``SPECDEC_VLLM_TREES``, built by ``python
scripts/vllm_releases.py prepare --releases 0.19.1,0.20.2,0.21.0,0.22.1,0.24.0,0.27.1,0.34.0`` (one tree
per API era); their tests skip, saying so, without them.
"""

import copy
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.backends.vllm import env as vllm_env
from harness.backends.vllm import mrv2 as vllm_mrv2
from harness.backends.vllm import v1 as vllm_v1
from harness.run.runner import run
from harness.scenarios.profiles import get_profile
from harness.scenarios.scenario import RequestSpec, Scenario
from suites.helpers import wrapped

ROOT = Path(__file__).resolve().parent.parent
TREES = Path(os.environ.get("SPECDEC_VLLM_TREES", ROOT / "vendor"))
MRV2 = "harness.backends.vllm.mrv2:VllmMrv2Backend"
V1 = "harness.backends.vllm.v1:VllmV1Backend"
MRV2_UTILS = "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils"
MRV2_019 = "vllm.v1.worker.gpu.spec_decode.rejection_sampler"
MRV2_020 = "vllm.v1.worker.gpu.spec_decode.probabilistic_rejection_sampler_utils"
GUMBEL = "vllm.v1.worker.gpu.sample.gumbel"
V1_MODULE = "vllm.v1.sample.rejection_sampler"
LAW_CHECKS = {"outcome-law", "position-law", "acceptance-length"}
CONTRACT_PROFILE = dataclasses.replace(get_profile("smoke"), tv=0.3)  # keeps the name: the runner resolves names
CONTRACT_SCENARIO = Scenario(
    name="contract-temperature", method="standard", vocab_size=8, requests=(RequestSpec(1, 0.2, "flat", "near-target"),), draft_mode="fixed"
)


# --- breaking a convention ----------------------------------------------------------------------
def _per_slot(t):
    """Temperatures as vLLM stores them (0 greedy, NaN unused) made safe to divide by."""
    import torch

    return torch.where(t > 0, t, torch.ones_like(t))


def _mrv2_draft_scaled(power: int):
    """The kernels divide the draft logits by T**(1 - power): ``power`` 1 = not at all, -1 = twice."""

    def change(a):
        if a["draft_logits"] is not None:
            t = _per_slot(a["temperature"]).to(a["draft_logits"].dtype)
            a["draft_logits"] = a["draft_logits"] * t[:, None, None] ** power

    return change


def _mrv2_0340_draft_scaled(power: int):
    """0.34.0's draft logits come in a DraftLogitsCache: scale its values as ``_mrv2_draft_scaled``."""

    def change(a):
        cache = a["draft_logits_cache"]
        if cache is not None:
            t = _per_slot(a["temperature"]).to(cache.values.dtype)
            scaled = copy.copy(cache)
            scaled.values = cache.values * t[:, None, None] ** power
            a["draft_logits_cache"] = scaled

    return change


def _mrv2_target_divided_again(a):
    t = _per_slot(a["temperature"])[a["expanded_idx_mapping"].long()]
    a["target_logits"] = a["target_logits"] / t[:, None]


def _v1_target_divided_again(a):
    import torch

    t = _per_slot(a["sampling_metadata"].temperature).repeat_interleave(torch.tensor(a["num_draft_tokens"]))
    a["target_logits"] = a["target_logits"] / t[:, None].to(a["target_logits"].dtype)


def _v1_draft_probs_tempered_again(a):
    """The kernels apply the temperature to draft probabilities that already carry it."""
    import torch

    if a["draft_probs"] is not None:
        t = _per_slot(a["sampling_metadata"].temperature).repeat_interleave(torch.tensor(a["num_draft_tokens"]))
        q = a["draft_probs"] ** (1.0 / t[:, None])
        a["draft_probs"] = q / q.sum(-1, keepdim=True)


CHANGES = {
    "mrv2-draft-not-divided": (MRV2_UTILS, "rejection_sample", _mrv2_draft_scaled(1)),
    "mrv2-draft-divided-twice": (MRV2_UTILS, "rejection_sample", _mrv2_draft_scaled(-1)),
    "mrv2-target-divided-again": (MRV2_UTILS, "rejection_sample", _mrv2_target_divided_again),
    "mrv2-019-draft-divided-twice": (MRV2_019, "probabilistic_rejection_sample", _mrv2_draft_scaled(-1)),
    "mrv2-020-draft-divided-twice": (MRV2_020, "probabilistic_rejection_sample", _mrv2_draft_scaled(-1)),
    "mrv2-0340-draft-not-divided": (MRV2_UTILS, "rejection_sample", _mrv2_0340_draft_scaled(1)),
    "v1-target-divided-again": (V1_MODULE, "rejection_sample", _v1_target_divided_again),
    "v1-draft-probs-tempered-again": (V1_MODULE, "rejection_sample", _v1_draft_probs_tempered_again),
}


def _install(change: str | None, setattr_=setattr):
    if change is not None:
        module_name, attr, fn = CHANGES[change]
        module = vllm_env.import_vllm(module_name)
        setattr_(module, attr, wrapped(getattr(module, attr), fn))


def verdicts(backend: str, change: str | None = None, setattr_=setattr) -> dict:
    """Run ``CONTRACT_SCENARIO`` through the runner with vLLM's entry point changed:
    the adapter's description and the checks that failed or errored."""
    _install(change, setattr_)
    obj = vllm_mrv2.VllmMrv2Backend() if backend == MRV2 else vllm_v1.VllmV1Backend()
    records = run([backend], [CONTRACT_SCENARIO], CONTRACT_PROFILE, 0).records
    return {
        "api": getattr(obj, "api", ""),
        "failed": sorted({r.check for r in records if r.verdict == "fail"}),
        "errors": [f"{r.check}: {r.kind}: {r.message}" for r in records if r.verdict == "error"],
        "checks": len(records),
    }


def _available(module):
    ok, why = module.availability()
    if not ok:
        pytest.skip(f"vLLM not usable here: {why}")


def _assert_passes(out):
    assert out["checks"] > 1 and not out["failed"] and not out["errors"], out


def _assert_law_fails(out):
    assert not out["errors"], out
    assert LAW_CHECKS & set(out["failed"]), f"a convention was broken and no law check failed: {out}"


# --- in this process: the installed vLLM --------------------------------------------------------
@pytest.fixture
def installed_mrv2():
    _available(vllm_mrv2)
    if not vllm_mrv2.draft_logits_raw(vllm_env.version(), vllm_env.parameters(vllm_env.import_vllm(GUMBEL).gumbel_sample)):
        pytest.skip(f"installed vLLM {vllm_env.version()} is before {vllm_mrv2.DRAFT_LOGITS_RAW.first_with}: its tests run from a tree")


@pytest.mark.slow
def test_mrv2_feeds_raw_draft_logits(installed_mrv2):
    out = verdicts(MRV2)
    assert "raw draft logits" in out["api"], out
    _assert_passes(out)


@pytest.mark.slow
@pytest.mark.parametrize("change", ["mrv2-draft-not-divided", "mrv2-draft-divided-twice", "mrv2-target-divided-again"])
def test_mrv2_kernel_breaking_its_release_fails(installed_mrv2, change, monkeypatch):
    """From 0.28.0 the kernels divide raw draft logits by T (#50910) and take target logits
    the caller divided: kernels that divide the draft not at all, or twice, or the target
    again must fail the law checks (the adapter used to probe the first and adapt to it)."""
    _assert_law_fails(verdicts(MRV2, change, monkeypatch.setattr))


@pytest.mark.slow
def test_v1_feeds_its_contract():
    _available(vllm_v1)
    _assert_passes(verdicts(V1))


@pytest.mark.slow
@pytest.mark.parametrize("change", ["v1-target-divided-again", "v1-draft-probs-tempered-again"])
def test_v1_kernel_breaking_its_contract_fails(change, monkeypatch):
    _available(vllm_v1)
    _assert_law_fails(verdicts(V1, change, monkeypatch.setattr))


# --- other releases, each from its tree in a subprocess -------------------------------------------
_IN_TREE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("adapter_contracts", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps(module.verdicts(sys.argv[2], sys.argv[3] or None)))
"""


def _in_tree(version: str, backend: str, change: str | None = None) -> dict:
    tree = TREES / f"vllm-{version}"
    if not (tree / "vllm" / "__init__.py").is_file():
        pytest.skip(f"no vLLM {version} tree at {tree} (python scripts/build_vllm_tree.py --version {version} --no-wheelhouse)")
    _available(vllm_mrv2 if backend == MRV2 else vllm_v1)  # the import closure is installed
    env = {**os.environ, vllm_env.SRC_ENV: str(tree), "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-c", _IN_TREE, __file__, backend, change or ""]
    res = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_mrv2_0271_feeds_divided_draft_logits():
    out = _in_tree("0.27.1", MRV2)
    assert "0.27.1: draft logits divided by T" in out["api"], out
    _assert_passes(out)


@pytest.mark.slow
def test_mrv2_0271_kernel_dividing_again_fails():
    """Up to 0.27.1 the drafter caches logits / T and the kernels do not divide: a kernel that
    divides (0.28.0's) fed by a 0.27.1 adapter must fail."""
    _assert_law_fails(_in_tree("0.27.1", MRV2, "mrv2-draft-divided-twice"))


@pytest.mark.slow
def test_mrv2_0191_feeds_divided_draft_logits():
    out = _in_tree("0.19.1", MRV2)
    assert "rejection_sampler.probabilistic_rejection_sample + strict + synthetic (vLLM 0.19.1" in out["api"], out
    _assert_passes(out)


@pytest.mark.slow
def test_mrv2_0191_kernel_dividing_again_fails():
    _assert_law_fails(_in_tree("0.19.1", MRV2, "mrv2-019-draft-divided-twice"))


_NARROW_DRAFT = Scenario(
    name="contract-narrow-draft",
    method="standard",
    vocab_size=8,
    draft_vocab_size=4,
    requests=(RequestSpec(1, 1.0, "flat", "flat"),),
    draft_mode="fixed",
)


@pytest.mark.slow
def test_mrv2_0240_reads_draft_cache_at_target_width():
    """Up to 0.24 the kernels read the draft cache at the target's width: a narrower draft
    vocabulary is padded with -inf (q = 0 there) and verified, not declined."""
    tree = TREES / "vllm-0.24.0"
    if not (tree / "vllm" / "__init__.py").is_file():
        pytest.skip(f"no vLLM 0.24.0 tree at {tree} (python scripts/build_vllm_tree.py --version 0.24.0 --no-wheelhouse)")
    _available(vllm_mrv2)
    code = (
        "import json, dataclasses\n"
        "from harness.run.runner import run\n"
        "from harness.scenarios.profiles import get_profile\n"
        "from harness.scenarios.scenario import Scenario\n"
        f"s = Scenario.from_json({_NARROW_DRAFT.to_json()!r})\n"
        "p = dataclasses.replace(get_profile('smoke'), tv=0.3)\n"
        f"print(json.dumps([(r.check, r.verdict, r.message) for r in run([{MRV2!r}], [s], p, 0).records]))\n"
    )
    env = {**os.environ, vllm_env.SRC_ENV: str(tree), "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    records = json.loads(res.stdout.strip().splitlines()[-1])
    assert records and all(verdict == "pass" for _, verdict, _ in records), records


@pytest.mark.slow
def test_mrv2_0202_feeds_divided_draft_logits():
    """0.20's API: probabilistic_rejection_sampler_utils, strict in rejection_sampler, synthetic
    with conditional rates; its drafter caches logits / T in fp32, as 0.19's."""
    out = _in_tree("0.20.2", MRV2)
    assert "probabilistic_rejection_sampler_utils" in out["api"] and "+ strict" in out["api"], out
    _assert_passes(out)


@pytest.mark.slow
def test_mrv2_0210_kernel_dividing_again_fails():
    """0.21 (no strict, draft logits optional) takes divided draft logits too: a kernel that
    divides them again (0.28.0's contract) fed by a 0.21 adapter must fail."""
    _assert_law_fails(_in_tree("0.21.0", MRV2, "mrv2-020-draft-divided-twice"))


@pytest.mark.slow
def test_mrv2_0340_feeds_raw_draft_logits_in_a_cache_object():
    """0.34.0 takes the draft logits as a DraftLogitsCache (draft_logits_cache): the replicated
    cache of a one-rank engine, raw logits the kernels divide on load, as from 0.28.0."""
    out = _in_tree("0.34.0", MRV2)
    assert "0.34.0: raw draft logits" in out["api"], out
    _assert_passes(out)


@pytest.mark.slow
def test_mrv2_0340_kernel_not_dividing_fails():
    _assert_law_fails(_in_tree("0.34.0", MRV2, "mrv2-0340-draft-not-divided"))


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.19.1", "0.20.2", "0.24.0"])
def test_v1_feeds_its_contract_in_every_era(version):
    """V1's rejection_sample in its three signature eras: 0.19 (no synthetic mode), 0.20-0.22
    (synthetic_mode, synthetic_conditional_rates), 0.23 on (use_fp64_gumbel; 0.33 adds FLy)."""
    _assert_passes(_in_tree(version, V1))


# --- api-drift: a signature no contract matches -------------------------------------------------
def _load_errors(backend: str) -> list:
    records = run([backend], [CONTRACT_SCENARIO], CONTRACT_PROFILE, 0).records
    return [(r.kind, r.message) for r in records if r.verdict == "error"]


def _assert_drift(errors, *words):
    assert errors and all(kind == "api-drift" for kind, _ in errors), errors
    assert all(w in errors[0][1] for w in words), errors


def test_mrv2_unknown_signature_is_api_drift(monkeypatch):
    _available(vllm_mrv2)

    def rejection_sample(target_logits, draft_logits, draft_sampled, cu_num_logits, positions, idx_mapping, *rest):
        raise AssertionError("never called")

    monkeypatch.setattr(vllm_env.import_vllm(MRV2_UTILS), "rejection_sample", rejection_sample)
    _assert_drift(_load_errors(MRV2), "rejection_sample", "'pos'")


def test_mrv2_unknown_draft_cache_is_api_drift(monkeypatch):
    """The drafter's gumbel_sample names what it caches (logits_cache: raw; output_processed_logits:
    divided). Neither: the adapter cannot know what the kernels expect."""
    _available(vllm_mrv2)

    def gumbel_sample(logits, expanded_idx_mapping, temperature, seed, pos, apply_temperature, draft_cache=None):
        raise AssertionError("never called")

    monkeypatch.setattr(vllm_env.import_vllm(GUMBEL), "gumbel_sample", gumbel_sample)
    _assert_drift(_load_errors(MRV2), "gumbel_sample", "draft-logits cache")


def test_mrv2_release_disagreeing_with_signature_is_api_drift(monkeypatch):
    """A release at or before 0.27.1 whose drafter caches raw logits (or the reverse) is no
    known contract."""
    _available(vllm_mrv2)
    from packaging.version import Version

    monkeypatch.setattr(vllm_env, "version", lambda: Version("0.27.1"))
    raw = vllm_mrv2.draft_logits_raw(None, vllm_env.parameters(vllm_env.import_vllm(GUMBEL).gumbel_sample))
    if not raw:
        pytest.skip("the installed vLLM caches divided draft logits")
    _assert_drift(_load_errors(MRV2), "0.27.1", "raw")


def test_v1_unknown_signature_is_api_drift(monkeypatch):
    _available(vllm_v1)

    def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_probs, *rest):
        raise AssertionError("never called")

    monkeypatch.setattr(vllm_env.import_vllm(V1_MODULE), "rejection_sample", rejection_sample)
    _assert_drift(_load_errors(V1), "rejection_sample", "target_logits")


@pytest.mark.parametrize("name,value", [("GREEDY_TEMPERATURE", -1), ("PLACEHOLDER_TOKEN_ID", 0)])
def test_v1_other_constants_are_api_drift(monkeypatch, name, value):
    """V1 marks greedy requests by T == GREEDY_TEMPERATURE (-1 before a 2025 refactor, #27077)
    and unfilled outputs by PLACEHOLDER_TOKEN_ID: the adapter writes 0 and reads -1."""
    _available(vllm_v1)
    monkeypatch.setattr(vllm_env.import_vllm(V1_MODULE), name, value)
    _assert_drift(_load_errors(V1), name)


# --- decisions from the release, without vLLM ---------------------------------------------------
@pytest.mark.parametrize(
    "text,expected",
    [
        ("0.33.0", "0.33.0"),
        ("0.34.0.dev0", "0.34.0.dev0"),
        ("0.33.0-57-g1a2b3c4", "0.33.0.post57"),  # git describe: 57 commits after the tag
        ("v0.27.1-3-gdeadbee", "0.27.1.post3"),
        ("dev", None),  # vllm/version.py without _version.py
    ],
)
def test_version_text(text, expected):
    got = vllm_env.parse_version(text)
    assert (None if got is None else str(got)) == expected


@pytest.mark.parametrize(
    "version,params,raw",
    [
        ("0.28.0", ["logits", "logits_cache"], True),
        ("0.33.0", ["logits", "is_drafting", "logits_cache", "logits_cache_source"], True),
        ("0.27.1", ["logits", "output_processed_logits"], False),
        ("0.19.1", ["logits", "processed_logits_out"], False),
        ("0.28.0.dev5", ["logits", "logits_cache"], True),  # a dev build of 0.28: the signature says
        ("0.28.0.dev5", ["logits", "output_processed_logits"], False),
        (None, ["logits", "logits_cache"], True),
    ],
)
def test_draft_logits_convention(version, params, raw):
    from packaging.version import Version

    assert vllm_mrv2.draft_logits_raw(version and Version(version), params) is raw


@pytest.mark.parametrize(
    "version,params",
    [("0.28.0", ["logits", "output_processed_logits"]), ("0.27.1", ["logits", "logits_cache"]), ("0.33.0", ["logits"])],
)
def test_draft_logits_convention_drift(version, params):
    from packaging.version import Version

    with pytest.raises(RuntimeError, match="vLLM API changed"):
        vllm_mrv2.draft_logits_raw(Version(version), params)


def test_release_boundaries():
    from packaging.version import Version

    boundary = vllm_mrv2.DRAFT_LOGITS_RAW
    assert [boundary.holds(Version(v)) for v in ("0.19.1", "0.27.1", "0.27.2.dev3", "0.28.0rc1", "0.28.0", "0.33.0.post5")] == [
        False,
        False,
        None,
        None,
        True,
        True,
    ]
    assert boundary.holds(None) is None


@pytest.mark.parametrize("truncates,declined", [(True, True), (False, False), (None, True)])
def test_narrow_draft_vocabulary_by_release(truncates, declined):
    """From 0.25.0 the kernels cut the target to the draft's width (declined: the target has
    mass there); up to 0.24.0 they read the cache at the target's width (padded, verified); a
    release between does not say (declined)."""
    from harness.scenarios.materialize import materialize, trials

    api = vllm_mrv2._CurrentApi(lambda *a, **k: None, None, True, truncates)
    batch = trials(_NARROW_DRAFT, materialize(_NARROW_DRAFT), 0, 1).batch
    assert (api.supports(batch) is not None) is declined

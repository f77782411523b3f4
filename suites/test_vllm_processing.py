"""Top-k, top-p and min-p through vLLM's own code, as its verifiers call it (``vllm-mrv2``,
``vllm-v1``; ``harness.backends.vllm.processing``, ``docs/adapter-contracts.md``).

CPU (the Triton interpreter; vLLM's top-k/top-p runs its sort path there, min-p its Triton
kernel): (a) a few processing scenarios of the catalog pass (the exact ones at ``smoke``, in
seconds; ``standard-top-k-top-p`` at a TV of 0.3, ~20 s), the Triton-tie scenario is declined;
(b) each convention has a test that makes vLLM's function break it (wrapped, as
``suites/test_adapter_contracts.py`` does) and asserts that a check fails, beside the same
scenario passing unwrapped (a few seconds each): the adapters feed the contract, they do not
adapt to the code;
(c) what ``supports`` declines, and why, on the CPU and (decided without a GPU) on CUDA.

The ``CONTRACT_*`` scenarios: one request, one fixed draft, V = 8, at ``smoke``'s error rates
and a detectable TV of 0.3. Each violation moves the first token's law by a TV of 0.47 or
more, or puts mass where the law has none (an exact failure).
"""

import dataclasses
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from packaging.version import Version

from harness.backends.vllm import env as vllm_env
from harness.backends.vllm import mrv2 as vllm_mrv2
from harness.backends.vllm import processing
from harness.backends.vllm import v1 as vllm_v1
from harness.run.runner import run
from harness.scenarios.catalog import catalog, find
from harness.scenarios.profiles import get_profile
from harness.scenarios.scenario import RequestSpec, Scenario
from suites.helpers import failing_checks, first_batch, vllm_backend

ROOT = Path(__file__).resolve().parent.parent
TREES = Path(os.environ.get("SPECDEC_VLLM_TREES", ROOT / "vendor"))
MRV2 = "harness.backends.vllm.mrv2:VllmMrv2Backend"
V1 = "harness.backends.vllm.v1:VllmV1Backend"
LAW_CHECKS = {"outcome-law", "position-law", "acceptance-length"}
SMOKE = get_profile("smoke")
CONTRACT_PROFILE = dataclasses.replace(SMOKE, tv=0.3)  # keeps the name: the runner resolves names


def _contract(name, method="standard", **params):
    spec = RequestSpec(1, 1.0, params.pop("target", "flat"), "flat", **params)
    return Scenario(name=f"contract-{name}", method=method, vocab_size=8, requests=(spec,), draft_mode="fixed")


# top-k = 1: a point mass (keeping k + 1 emits tokens the law never does). top-p = 0.2 on a
# flat row keeps two tokens (0.164 + 0.147; dropping the one that reaches p: TV 0.47).
# min-p = 0.5 on a peaked row keeps one token on the draft row, two on the bonus row.
CONTRACT_TOP_K = _contract("top-k", top_k=1)
CONTRACT_TOP_P = _contract("top-p", top_p=0.2)
CONTRACT_MIN_P = _contract("min-p", target="peaked", min_p=0.5)
# One target row for every request and step: MRV2 gets it as a stride-0 view (shared_rows).
CONTRACT_SHARED = Scenario(
    name="contract-shared-row",
    method="standard",
    vocab_size=8,
    requests=(RequestSpec(2, 1.0, "flat", "flat", stationary=True, top_p=0.2, min_p=1e-5),),
)


@pytest.fixture(scope="module")
def mrv2():
    return vllm_backend(vllm_mrv2, "VllmMrv2Backend")


@pytest.fixture(scope="module")
def v1():
    return vllm_backend(vllm_v1, "VllmV1Backend")


def _smoke(name):
    return find(catalog(SMOKE), name)


def _verify(backend_obj, dotted, scenario, profile):
    """Run one scenario through the runner; the failing checks' lines (empty when all pass)."""
    reason = backend_obj.supports(first_batch(scenario))
    assert reason is None, f"{scenario.name}: declined: {reason}"
    return failing_checks(dotted, scenario, profile)


# --- (a) catalog scenarios on the CPU -------------------------------------------------------------
# The exact ones at smoke; standard-top-k-top-p (top-k, top-p and min-p = 1e-5) at a TV of 0.3:
# at smoke its 1408 trials take minutes under the interpreter (MRV2's min-p kernel runs per row).
CPU_SCENARIOS = {
    MRV2: [("greedy-top-k", SMOKE), ("standard-processing-one-token", SMOKE), ("standard-top-k-top-p", CONTRACT_PROFILE)],
    V1: [("greedy-top-k", SMOKE), ("standard-processing-one-token", SMOKE)],  # V1's top-p, ties: CONVENTIONS below
}


@pytest.mark.parametrize("name,profile", CPU_SCENARIOS[MRV2], ids=[n for n, _ in CPU_SCENARIOS[MRV2]])
def test_mrv2_processing_cpu(mrv2, name, profile):
    bad = _verify(mrv2, MRV2, _smoke(name), profile)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name,profile", CPU_SCENARIOS[V1], ids=[n for n, _ in CPU_SCENARIOS[V1]])
def test_v1_processing_cpu(v1, name, profile):
    bad = _verify(v1, V1, _smoke(name), profile)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("which", ["mrv2", "v1"])
def test_triton_ties_are_declined_cpu(which, request):
    """On the CPU vLLM runs the sort path: a law that follows Triton's tie rule is declined
    (the sort path's, ``standard-top-k-ties-sort``, passes: ``test_contract_scenario_passes``)."""
    backend = request.getfixturevalue(which)
    reason = backend.supports(first_batch(_smoke("standard-top-k-ties")))
    assert reason and "'vllm'" in reason and "'vllm-sort'" in reason and "sort path" in reason, reason
    assert backend.supports(first_batch(_smoke("standard-top-k-ties-sort"))) is None


# --- (b) vLLM breaking a convention must fail a check ----------------------------------------------
_TOPK_TOPP = "vllm.v1.sample.ops.topk_topp_sampler"


def _top_k_plus_one(fn):
    @functools.wraps(fn)  # the same signature: the adapter binds by it
    def call(logits, k, p, *args, **kwargs):
        k = None if k is None else (k + 1).clamp(max=logits.shape[-1]).to(k.dtype)
        return fn(logits, k, p, *args, **kwargs)

    return call


def _drops_top_p_boundary(fn):
    """Keeps the largest top set with mass < p: the token that reaches p is removed too."""
    import torch

    @functools.wraps(fn)
    def call(logits, k, p, *args, **kwargs):
        out = fn(logits, k, p, *args, **kwargs)
        if p is None:
            return out
        kept = torch.isfinite(out)
        smallest = torch.where(kept, out, float("inf")).argmin(-1)
        drop = (p < 1) & (kept.sum(-1) > 1)
        rows = torch.nonzero(drop).flatten()
        out[rows, smallest[rows]] = float("-inf")
        return out

    return call


def _keeps_exactly_k(fn):
    """Triton's rule: exactly k survive, ties at the k-th value to the lowest ids."""
    import torch

    @functools.wraps(fn)
    def call(logits, k, p, *args, **kwargs):
        if k is not None:
            order = torch.sort(-logits, dim=-1, stable=True).indices
            ranks = torch.empty_like(order).scatter_(1, order, torch.arange(logits.shape[-1]).expand_as(order))
            logits.masked_fill_(ranks >= k[:, None], float("-inf"))
        return fn(logits, k, p, *args, **kwargs)

    return call


def _break(change, monkeypatch):
    """Make vLLM's top-k/top-p functions (both: the adapters call one per device) or its min-p
    kernel break a convention."""
    if change == "min-p-skipped":
        module = vllm_env.import_vllm(processing.MIN_P)
        monkeypatch.setattr(module, "apply_min_p", lambda logits, expanded_idx_mapping, min_p: None)
        return
    wraps = {"top-k-plus-one": _top_k_plus_one, "top-p-boundary-dropped": _drops_top_p_boundary, "ties-cut-to-k": _keeps_exactly_k}
    wrap = wraps[change]
    module = vllm_env.import_vllm(_TOPK_TOPP)
    for name in ("apply_top_k_top_p", "apply_top_k_top_p_pytorch"):
        monkeypatch.setattr(module, name, wrap(getattr(module, name)))


def _records(dotted, scenario):
    records = run([dotted], [scenario], CONTRACT_PROFILE, 0).records
    assert not [r for r in records if r.verdict == "error"], [(r.check, r.message) for r in records]
    return {r.check for r in records if r.verdict == "fail"}, len(records)


# standard-top-k-ties-sort: three logits tied at the 2nd value, k = 2; the sort path keeps all
# three, Triton's rule two (TV 1/3 on every row).
CONVENTIONS = [
    (MRV2, CONTRACT_TOP_K, "top-k-plus-one"),
    (MRV2, CONTRACT_TOP_P, "top-p-boundary-dropped"),
    (MRV2, CONTRACT_MIN_P, "min-p-skipped"),
    (MRV2, _smoke("standard-top-k-ties-sort"), "ties-cut-to-k"),
    (V1, CONTRACT_TOP_K, "top-k-plus-one"),
    (V1, CONTRACT_TOP_P, "top-p-boundary-dropped"),
    (V1, _smoke("standard-top-k-ties-sort"), "ties-cut-to-k"),
]
_IDS = [f"{d.split(':')[1][4:-7].lower()}-{c}" for d, _, c in CONVENTIONS]


@pytest.mark.parametrize("dotted,scenario,change", CONVENTIONS, ids=_IDS)
def test_contract_scenario_passes(dotted, scenario, change):
    vllm_backend(vllm_mrv2 if dotted == MRV2 else vllm_v1, "VllmMrv2Backend" if dotted == MRV2 else "VllmV1Backend")
    failed, checks = _records(dotted, scenario)
    assert checks > 1 and not failed, failed


@pytest.mark.parametrize("dotted,scenario,change", CONVENTIONS, ids=_IDS)
def test_vllm_breaking_a_convention_fails(dotted, scenario, change, monkeypatch):
    """vLLM's top-k keeps k + 1 tokens, or its sort path cuts a tie at the k-th value to k
    tokens, its top-p drops the token that reaches p, its min-p does nothing: the adapter
    still calls it as the contract says, and a law check fails."""
    vllm_backend(vllm_mrv2 if dotted == MRV2 else vllm_v1, "VllmMrv2Backend" if dotted == MRV2 else "VllmV1Backend")
    _break(change, monkeypatch)
    failed, _ = _records(dotted, scenario)
    assert LAW_CHECKS & failed, f"{change}: no law check failed ({failed})"


def test_mrv2_shared_row_passes():
    vllm_backend(vllm_mrv2, "VllmMrv2Backend")
    failed, checks = _records(MRV2, CONTRACT_SHARED)
    assert checks > 1 and not failed, failed


# --- (c) what supports() declines -------------------------------------------------------------------
def test_v1_declines_min_p(v1):
    for name in ("standard-min-p", "standard-top-k-top-p"):  # the latter has min_p = 1e-5
        reason = v1.supports(first_batch(_smoke(name)))
        assert reason and "min-p" in reason and "MinTokensLogitsProcessor" in reason, (name, reason)
    greedy = first_batch(_smoke("standard-min-p"))
    greedy = dataclasses.replace(greedy, temperature=np.zeros_like(greedy.temperature))
    assert v1.supports(greedy) is None  # vLLM resets a greedy request's min-p


def test_mrv2_applies_min_p(mrv2):
    assert mrv2.supports(first_batch(_smoke("standard-min-p"))) is None
    assert mrv2.supports(first_batch(_smoke("standard-top-k-top-p"))) is None


@pytest.mark.parametrize("which", ["mrv2", "v1"])
def test_cuda_tie_rules_follow_the_release(which, request, monkeypatch):
    """On CUDA the adapter calls ``apply_top_k_top_p``; 0.30.0 on runs Triton for any call:
    the Triton-tie law is accepted and the sort-path one declined (decided without a GPU)."""
    backend = request.getfixturevalue(which)
    if not processing.TRITON_AT_ANY_ROWS.holds(vllm_env.version()):
        pytest.skip(f"installed vLLM {vllm_env.version()}: its dispatch depends on the rows")
    monkeypatch.setattr(backend, "device", "cuda")
    assert backend.supports(first_batch(_smoke("standard-top-k-ties"))) is None
    reason = backend.supports(first_batch(_smoke("standard-top-k-ties-sort")))
    assert reason and "'vllm-sort'" in reason and "runs Triton" in reason, reason


@pytest.mark.parametrize(
    "version,device,rows,rules",
    [
        ("0.33.0", "cpu", 100, "vllm-sort"),
        ("0.33.0", "cuda", 1, "vllm"),
        ("0.30.0", "cuda", 3, "vllm"),
        ("0.29.0", "cuda", 7, "vllm-sort"),
        ("0.29.0", "cuda", 8, "vllm"),
        ("0.19.1", "cuda", 3, "vllm-sort"),
        ("0.29.1.dev4", "cuda", 3, None),  # between the releases: undecided below 8 rows
        ("0.29.1.dev4", "cuda", 8, "vllm"),
        (None, "cuda", 3, None),
    ],
)
def test_tie_rules_by_release(version, device, rows, rules):
    vllm_backend(vllm_v1, "VllmV1Backend")
    proc = processing.Processor(Version(version) if version else None, with_min_p=False)
    assert proc.rules(device, rows) == rules


def test_undecided_release_declines_tie_laws_on_cuda():
    vllm_backend(vllm_v1, "VllmV1Backend")
    proc = processing.Processor(Version("0.29.1.dev4"), with_min_p=False)
    batch = first_batch(_smoke("standard-top-k-ties"))  # 3 rows
    reason = proc.tie_rules_reason(batch, processing.request_params(batch), "cuda", [("a call", 3)])
    assert reason and "does not say" in reason, reason
    assert proc.tie_rules_reason(batch, processing.request_params(batch), "cuda", [("a call", 8)]) is None


def test_release_boundaries():
    holds = processing.TRITON_AT_ANY_ROWS.holds
    assert [holds(Version(v)) for v in ("0.19.1", "0.29.0", "0.29.1.dev1", "0.30.0", "0.33.0")] == [False, False, None, True, True]
    syncs = processing.CPU_SORT_SYNCS.holds
    assert [syncs(Version(v)) for v in ("0.19.1", "0.21.0", "0.22.0", "0.33.0")] == [False, False, True, True]


def test_greedy_requests_have_no_parameters():
    batch = first_batch(_smoke("greedy-top-k"))
    assert processing.request_params(batch) is None  # vLLM resets them: nothing to apply, nothing declined
    params = processing.request_params(first_batch(_smoke("standard-top-k")))
    assert params.top_k.dtype == np.int32 and params.do_top_k and not params.do_top_p and not params.do_min_p


def test_missing_top_k_function_is_api_drift(monkeypatch):
    """A release without the sort path's signature: batches with top-k/top-p report drift."""
    vllm_backend(vllm_v1, "VllmV1Backend")
    module = vllm_env.import_vllm(_TOPK_TOPP)
    monkeypatch.setattr(module, "apply_top_k_top_p_pytorch", lambda logits, k, p: logits)
    errors = [(r.kind, r.message) for r in run([V1], [CONTRACT_TOP_K], CONTRACT_PROFILE, 0).records if r.verdict == "error"]
    assert errors and all(kind == "api-drift" for kind, _ in errors), errors
    assert "allow_cpu_sync" in errors[0][1], errors


def test_processing_leaves_the_batch_alone():
    """A copy is processed (device batches reuse their logits across chunks), and a row
    shared by every request gives the rows the materialized call gives."""
    import torch

    vllm_backend(vllm_mrv2, "VllmMrv2Backend")
    proc = processing.Processor(vllm_env.version(), with_min_p=True)
    batch = first_batch(_smoke("standard-top-k-top-p"))
    params = processing.request_params(batch)
    row = torch.linspace(-2.0, 2.0, 8)[None]
    shared = row.expand(5, 8)
    owners = torch.zeros(5, dtype=torch.int64)
    slots = (torch.zeros(5, dtype=torch.int32), torch.from_numpy(params.min_p))
    out = proc.apply(shared, owners, params, slots, topp_only_arg=True)
    whole = proc.apply(shared.contiguous(), owners, params, slots, topp_only_arg=True)
    assert torch.equal(shared[0], row[0]) and out.stride(0) == 0
    torch.testing.assert_close(out, whole, rtol=0, atol=0)
    assert torch.isinf(out[0]).sum() == 8 - params.top_k[0] + 1  # top-k 4, then top-p 0.9 takes one more


# --- vLLM 0.19's MRV2 API (side-by-side tree) -------------------------------------------------------
_IN_TREE = """
import json, sys
from harness.run.runner import run
from harness.scenarios.catalog import catalog, find
from harness.scenarios.profiles import get_profile
from harness.scenarios.scenario import Scenario
profile = get_profile("smoke")
out = []
for dotted, text in json.loads(sys.argv[1]):
    s = Scenario.from_json(text) if text.startswith("{") else find(catalog(profile), text)
    out += [(dotted, s.name, r.check, r.verdict, r.message) for r in run([dotted], [s], profile, 0).records]
print(json.dumps(out))
"""
STRICT_TOP_K = Scenario(
    name="contract-strict-top-k", method="strict", vocab_size=8, requests=(RequestSpec(2, 1.0, "flat", "flat", top_k=1),)
)


def test_vllm_019_processing_cpu():
    """0.19's API: probabilistic verification of processed rows, and strict verification
    whose target tokens ``gumbel_sample`` draws from the processed rows (a top-k of 1: any
    other token fails exactly); V1 from the same tree."""
    tree = TREES / "vllm-0.19.1"
    if not (tree / "vllm" / "__init__.py").is_file():
        pytest.skip(f"no vLLM 0.19.1 tree at {tree} (python scripts/build_vllm_tree.py --version 0.19.1 --no-wheelhouse)")
    vllm_backend(vllm_mrv2, "VllmMrv2Backend")  # the import closure is installed
    cases = [(MRV2, "standard-processing-one-token"), (MRV2, STRICT_TOP_K.to_json()), (V1, "standard-processing-one-token")]
    env = {**os.environ, vllm_env.SRC_ENV: str(tree), "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, "-c", _IN_TREE, json.dumps(cases)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    records = json.loads(res.stdout.strip().splitlines()[-1])
    assert {(d, s) for d, s, *_ in records} == {
        (MRV2, "standard-processing-one-token"),
        (MRV2, STRICT_TOP_K.name),
        (V1, "standard-processing-one-token"),
    }
    bad = [r for r in records if r[3] != "pass"]
    assert not bad, bad

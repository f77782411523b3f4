"""vLLM V1 drafting its own drafts (``harness/backends/vllm/v1_drafting.py``, ``draft_sampling``).

Each convention of V1's drafter (``docs/adapter-contracts.md``, "vLLM V1's drafter") has a test
that fails when vLLM breaks it:

* the drafts are V1's ``compute_probs_and_sample_next_token``, called on each draft's row at the
  request's temperature, the device's global generator seeded from (seed, position of the
  verifying row, the drafter's key): a direct call gives them, and the probabilities the
  verifier got; above ``max_generators`` requests, one call per draft step gives them;
* the same request drafts the same ids alone, moved and among other mates; another seed or
  position draws others;
* the function compiled by the adapter is the release's ``def`` (the module's own bytecode,
  the module's own imports), and what no known release has is api-drift;
* greedy drafts (and an all-greedy batch) are the argmax, verified as point masses;
* through the runner: the catalog's engine-* scenarios pass, and each convention broken by
  wrapping vLLM's function fails a law check on a scenario that passes unwrapped: drafting
  without the temperature (draft-law), a drafter keyed by the request's seed as the
  verifier's generator is (position-law: the shared-noise class of #47386), the verifier given
  no draft probabilities (#40149: one-hot verification, acceptance-length and position-law).

CPU time of the whole file (``-m "not gpu"``): about 40 s, 10 of them importing vLLM and 13 in the
slow test that runs 0.22.1's tree in a subprocess.
"""

import copy
import dataclasses
import functools
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.backends.vllm import env as vllm_env
from harness.backends.vllm import v1, v1_drafting
from harness.gpus import gpu_skip_reason
from harness.protocol import as_numpy_drafted_outputs, as_numpy_outputs
from harness.run.plans import planned_trials
from harness.scenarios.catalog import catalog, find
from harness.scenarios.materialize import materialize
from harness.scenarios.profiles import get_profile
from harness.scenarios.scenario import RequestSpec, Scenario
from harness.scenarios.strategies import without_mates
from reference.distributions import pad_vocab, softmax_rows
from reference.rng import hash64
from suites.helpers import assert_same_outputs, engine_batch, failing_checks, first_batch, vllm_backend, wrapped

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy on -inf lanes in the interpreter
ROOT = Path(__file__).resolve().parent.parent
TREES = Path(os.environ.get("SPECDEC_VLLM_TREES", ROOT / "vendor"))
DRAFTER = "harness.backends.vllm.v1_drafting:VllmV1DrafterBackend"
REJECTION = "vllm.v1.sample.rejection_sampler"
gpu = pytest.mark.skipif(gpu_skip_reason() is not None, reason=gpu_skip_reason() or "")

# The catalog's engine-* scenarios V1 expresses (engine-drafted-block: V1 has no block verification)
ENGINE_SCENARIOS = ("engine-drafted", "engine-drafted-offset", "engine-greedy-drafter", "engine-drafted-top-p")
CPU_PROFILE = dataclasses.replace(get_profile("smoke"), tv=0.5)  # keeps the name: the runner resolves names
# The scenarios of suites/test_vllm_drafting.py (docs/adapter-contracts.md, "vLLM MRV2's drafter").
NOISE_SCENARIO = Scenario(
    name="engine-drafted-noise-sharing", method="standard", vocab_size=5, seed=45, draft_mode="engine",
    requests=(RequestSpec(1, 2.0, "topk", "topk"),),
)  # fmt: skip
COLD_SCENARIO = Scenario(
    name="engine-drafted-cold", method="standard", vocab_size=4, seed=3, draft_mode="engine",
    requests=(RequestSpec(1, 0.25, "peaked", "flat"),),
)  # fmt: skip
COLD_PROFILE = dataclasses.replace(get_profile("smoke"), tv=0.3)  # 205 trials; the untempered draft is 0.46 away


def _per_draft_calls(profile, scenario, max_generators=256):
    """``profile`` with chunks of at most ``max_generators`` requests: the adapter's per-draft
    calls, where the request's generator is in the metadata the function gets."""
    templates = materialize(scenario)
    trials = max_generators // len(templates)
    return dataclasses.replace(profile, chunk_elements=trials * sum(t.num_drafts + 1 for t in templates) * scenario.vocab_size)


# 616 trials in chunks of 256 (~4 s on the CPU); a drafter keyed by the verifier's seed fails at p ~ 1e-7
NOISE_PROFILE = _per_draft_calls(dataclasses.replace(get_profile("smoke"), tv=0.15, alpha=1e-3), NOISE_SCENARIO)


@pytest.fixture(scope="module")
def drafter():
    return vllm_backend(v1_drafting, "VllmV1DrafterBackend")


@pytest.fixture
def probabilistic(drafter):
    if not drafter.era.probabilistic:
        pytest.skip(f"vLLM {drafter.era.releases}'s V1 has no probabilistic drafting")
    return drafter


def _drafts(backend, batch):
    out = backend.sample(batch)
    return as_numpy_drafted_outputs(out, batch.num_requests, batch.max_drafts, len(batch.draft_tokens))


def _layout(batch):
    """(owner request, step, position of the verifying target row, drafter key) of every draft."""
    cu = batch.cu_num_drafts
    owner = np.repeat(np.arange(batch.num_requests), np.diff(cu))
    pos = batch.positions[np.arange(cu[-1]) + owner]
    return owner, np.arange(cu[-1]) - cu[owner], pos, hash64(batch.seeds[owner], pos, v1_drafting.DRAFTER_KEY)


def _rows(batch):
    """The draft rows as the proposer's logits: the head's dtype, the target's width (-inf beyond the draft's)."""
    import torch

    dtype = getattr(torch, batch.logits_dtype)
    rows = torch.full((len(batch.draft_logits), batch.vocab_size), float("-inf"), dtype=dtype)
    rows[:, : batch.draft_logits.shape[1]] = torch.tensor(batch.draft_logits).to(dtype)
    return rows


def _metadata(drafter, batch, temperature):
    """V1's SamplingMetadata with ``temperature`` and the batch's all_greedy / all_random flags."""
    import torch

    meta = drafter._sampling_metadata(torch.zeros(1), batch.temperature, {})
    meta.temperature = torch.tensor(np.asarray(temperature, dtype=np.float32))
    return meta


def _call(drafter, rows, meta, key):
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(key))
        args = (rows, meta, False) if "use_fp64_gumbel" in drafter.era.params else (rows, meta)
        return drafter.draft_fn(*args)


@pytest.fixture
def handed(drafter, monkeypatch):
    """The ``draft_probs`` each call of vLLM's rejection_sample got."""
    seen = []
    monkeypatch.setattr(drafter, "_verifier", wrapped(drafter._verifier, lambda a: seen.append(a["draft_probs"])))
    return seen


# --- the drafts are V1's function, keyed by (seed, position) -----------------------------------------
@pytest.mark.parametrize("dtype,draft_vocab", [("float32", None), ("bfloat16", 7)])
def test_drafts_are_v1s_function_at_the_verifying_rows_key(probabilistic, handed, dtype, draft_vocab):
    """A direct call of V1's function on each draft's row (in the head's dtype, -inf beyond a
    narrower draft vocabulary), with the request's temperature and the batch's flags, the global
    generator seeded from hash64(seed, pos of the verifying row, DRAFTER_KEY), gives the draft,
    and the probabilities the verifier got, bit for bit."""
    drafter = probabilistic
    batch = engine_batch(1, dtype=dtype, draft_vocab=draft_vocab)
    tokens, emitted, drafts = _drafts(drafter, batch)
    owner, _, _, keys = _layout(batch)
    rows = _rows(batch)
    direct = [
        _call(drafter, rows[d : d + 1], _metadata(drafter, batch, batch.temperature[owner[d] : owner[d] + 1]), keys[d])
        for d in range(len(keys))
    ]
    np.testing.assert_array_equal(drafts, np.concatenate([ids.numpy() for ids, _ in direct]))
    (got,) = handed
    want = np.concatenate([p.numpy() for _, p in direct])
    assert got.dtype.is_floating_point and got.shape == want.shape and np.array_equal(got.numpy(), want), "not the drafter's probs"
    assert (want[:, draft_vocab or batch.vocab_size :] == 0).all()
    cu = batch.cu_num_drafts
    for r in range(batch.num_requests):  # the accepted prefix is the drafts
        assert np.array_equal(tokens[r, : emitted[r] - 1], drafts[cu[r] : cu[r] + emitted[r] - 1]), r


def test_drafts_above_max_generators_are_one_call_per_step(probabilistic):
    """Above ``max_generators`` requests: one call per draft step over the requests with more
    than ``j`` drafts, the generator seeded from the XOR of the step's keys."""
    drafter = probabilistic
    batch = engine_batch(7, n=drafter.max_generators + 20, vocab=6)
    drafts, probs = drafter.draw(batch)
    owner, step, _, keys = _layout(batch)
    rows = _rows(batch)
    for j in range(batch.max_drafts):
        sel = np.flatnonzero(step == j)
        ids, p = _call(drafter, rows[sel], _metadata(drafter, batch, batch.temperature[owner[sel]]), np.bitwise_xor.reduce(keys[sel]))
        np.testing.assert_array_equal(drafts[sel].numpy(), ids.numpy(), err_msg=f"step {j}")
        assert probs[sel].equal(p)


def test_drafts_are_keyed_by_seed_and_position_only(probabilistic):
    drafter = probabilistic
    batch = engine_batch(2)
    drafts = drafter.draw(batch)[0].numpy()
    counts = np.diff(batch.cu_num_drafts)
    order = np.r_[0, np.arange(1, batch.num_requests)[::-1]]  # request 0 (3 drafts) first, its mates reversed
    np.testing.assert_array_equal(drafter.draw(without_mates(batch, order))[0].numpy()[: counts[0]], drafts[: counts[0]])
    np.testing.assert_array_equal(drafter.draw(without_mates(batch, [0]))[0].numpy(), drafts[: counts[0]])
    moved = without_mates(batch, np.r_[1 : batch.num_requests, 0])  # last, after every mate
    np.testing.assert_array_equal(drafter.draw(moved)[0].numpy()[-counts[0] :], drafts[: counts[0]])
    idle = without_mates(batch, np.flatnonzero(counts == 0))  # no drafts: nothing drawn, V1 emits the bonus alone
    assert drafter.draw(idle)[0].numel() == 0 and (_drafts(drafter, idle)[1] == 1).all()
    hot = without_mates(batch, np.flatnonzero((counts > 0) & (batch.temperature > 0)))
    same = drafter.draw(hot)[0].numpy()
    assert (drafter.draw(dataclasses.replace(hot, seeds=hot.seeds + 1))[0].numpy() != same).mean() > 0.2
    assert (drafter.draw(dataclasses.replace(hot, positions=hot.positions + 1))[0].numpy() != same).mean() > 0.2


# --- greedy drafts, the parent's path ------------------------------------------------------------------
@pytest.mark.parametrize("sampling,temps", [("greedy", (0.0, 1.0)), ("probabilistic", (0.0,))], ids=["greedy", "all-greedy"])
def test_greedy_drafts_are_the_argmax_verified_as_point_masses(drafter, handed, sampling, temps):
    """draft_sample_method "greedy" (any T), and a probabilistic batch of T = 0 requests only
    (the proposer's all_greedy path): the argmax, and the verifier gets no draft probabilities."""
    batch = engine_batch(4, sampling=sampling, temps=temps)
    tokens, emitted, drafts = _drafts(drafter, batch)
    np.testing.assert_array_equal(drafts, np.argmax(batch.draft_logits, axis=1))
    assert handed == [None]
    cu = batch.cu_num_drafts
    for r in range(batch.num_requests):
        assert np.array_equal(tokens[r, : emitted[r] - 1], drafts[cu[r] : cu[r] + emitted[r] - 1]), r


def test_batch_without_draft_sampling_takes_the_parents_path(drafter):
    batch = engine_batch(5)
    drafts = drafter.draw(batch)[0].numpy()
    plain = dataclasses.replace(batch, draft_sampling=None, draft_tokens=drafts)
    out = drafter.sample(plain)
    assert len(out) == 2 and drafter.drafter is True
    want = as_numpy_outputs(v1.VllmV1Backend().sample(plain), batch.num_requests, batch.max_drafts)
    assert_same_outputs(as_numpy_outputs(out, batch.num_requests, batch.max_drafts), want, batch)


def test_registered_as_vllm_v1():
    from harness.backends import NAMED

    assert NAMED["vllm-v1"] == DRAFTER


# --- what V1 cannot draft ----------------------------------------------------------------------------
def test_release_without_probabilistic_drafting_declines(drafter):
    old = object.__new__(v1_drafting.VllmV1DrafterBackend)
    old.__dict__.update(drafter.__dict__, era=v1_drafting.ERAS[0])
    assert "draft only the argmax" in old.supports(engine_batch(6))
    assert old.supports(engine_batch(6, sampling="greedy")) is None


def test_probabilistic_drafting_under_another_method_declines(drafter):
    scenario = Scenario(
        name="synthetic-engine", method="synthetic", vocab_size=6, seed=1, draft_mode="engine", synthetic={"mean_rate": 0.5},
        requests=(RequestSpec(2, 1.0, "peaked", "flat"),),
    )  # fmt: skip
    assert "only under rejection_sample_method 'standard'" in drafter.supports(first_batch(scenario))
    greedy = dataclasses.replace(scenario, draft_sampling="greedy")
    assert drafter.supports(first_batch(greedy)) is None
    block = find(catalog(CPU_PROFILE), "engine-drafted-block")
    assert "no block verification" in drafter.supports(first_batch(block))  # the verifier's reason


# --- binding: the release's def, its era, api-drift ------------------------------------------------------
def test_loaded_function_is_the_releases_def(drafter):
    """The adapter's function is the code object CPython makes of the release's def when it
    compiles the module, in the module's file, its globals the module's own imports."""
    import ast
    import builtins

    fn, source = drafter.draft_fn, drafter.source
    code = fn.__code__
    assert code.co_filename == source.path and code.co_firstlineno == source.line
    module_code = compile(Path(source.path).read_text(encoding="utf-8"), source.path, "exec", dont_inherit=True)
    (theirs,) = [c for c in module_code.co_consts if inspect.iscode(c) and c.co_name == v1_drafting.FUNCTION]
    for attr in ("co_code", "co_consts", "co_names", "co_varnames", "co_argcount", "co_firstlineno", "co_linetable"):
        assert getattr(code, attr) == getattr(theirs, attr), attr
    assert fn.__defaults__ == (False,) * len(fn.__defaults__ or ())
    tree = ast.parse(Path(source.path).read_text(encoding="utf-8"))
    imports = {a.asname or a.name: s.module for s in tree.body if isinstance(s, ast.ImportFrom) for a in s.names}
    for name in v1_drafting._global_names(code) - set(dir(builtins)):
        value = fn.__globals__[name]
        if name in imports:
            assert value is getattr(sys.modules[imports[name]], name), name
        else:
            assert value is sys.modules[name], name


# (params, proposer calls it, release): every release from 0.19.1 to 0.33.0, read in its wheel
RELEASES = [
    (("logits", "sampling_metadata"), False, "0.19.1", "0.19-0.21"),  # eagle.py
    (("logits", "sampling_metadata"), False, "0.20.2", "0.19-0.21"),
    (("logits", "sampling_metadata"), False, "0.21.0", "0.19-0.21"),
    (("logits", "sampling_metadata"), True, "0.22.1", "0.22"),
    *[
        (("logits", "sampling_metadata", "use_fp64_gumbel"), True, v, "0.23+")
        for v in ("0.23.0", "0.24.0", "0.25.1", "0.26.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0")
    ],
]


@pytest.mark.parametrize("params,called,version,era", RELEASES, ids=[r[2] for r in RELEASES])
def test_each_release_binds_its_era(params, called, version, era):
    """The table, and where the release's tree is here (scripts/build_vllm_tree.py), its own file
    read as the adapter reads it (not run: a tree of another release cannot be imported here)."""
    from packaging.version import Version

    assert v1_drafting.bind_era(params, called, Version(version)).releases == era
    assert v1_drafting.bind_era(params, called, None).releases == era  # the code alone says it
    tree = TREES / f"vllm-{version}"
    files = [tree / (m.replace(".", "/") + ".py") for m in v1_drafting.MODULES]
    found = [f for f in files if f.is_file() and v1_drafting.read_def(f)[1] is not None]
    if not found:
        pytest.skip(f"no vLLM {version} tree at {tree}")
    _, node, calls = v1_drafting.read_def(found[0])
    assert tuple(a.arg for a in node.args.args) == params and bool(calls) == called
    assert {n for _, _, n in calls} <= {len(params)}


@pytest.mark.parametrize(
    "params,called,version",
    [
        (("logits", "sampling_metadata"), True, "0.21.0"),  # a proposer calling it before #40269
        (("logits", "sampling_metadata"), False, "0.22.1"),  # none calling it after
        (("logits", "sampling_metadata", "use_fp64_gumbel"), False, None),
        (("logits", "sampling_metadata", "use_fp64_gumbel", "generators"), True, None),
        (("logits", "metadata"), True, None),
    ],
)
def test_unknown_drafter_contract_is_api_drift(params, called, version):
    from packaging.version import Version

    with pytest.raises(RuntimeError, match="vLLM API changed"):
        v1_drafting.bind_era(params, called, version and Version(version))


_BODY = "def compute_probs_and_sample_next_token(logits, sampling_metadata):\n    {}\n"


@pytest.mark.parametrize(
    "source,error",
    [
        ("import functools\n\n@functools.cache\n" + _BODY.format("return logits, logits"), "decorated"),
        (_BODY.format("return sampling_metadata.generators, logits"), "generators"),
        ("import torch\n\n" + _BODY.format("return torch.rand(1, generator=None), logits"), "generators"),
        ("import os\nEPS = len(os.sep)\n" + _BODY.format("return EPS, logits"), "computes"),
        ("try:\n    import torch\nexcept ImportError:\n    torch = None\n" + _BODY.format("return torch, logits"), "computes"),
        (_BODY.format("return UNBOUND, logits"), "bound 0 ways"),
    ],
    ids=["decorated", "reads-generators", "draws-from-a-generator", "computed-global", "conditional-import", "unbound-global"],
)
def test_def_the_adapter_cannot_compile_alone_is_api_drift(tmp_path, monkeypatch, source, error):
    (tmp_path / "specdec_fake_proposer.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RuntimeError, match=f"vLLM API changed.*{error}"):
        v1_drafting.load_function("specdec_fake_proposer")


def test_def_with_its_imports_loads(tmp_path, monkeypatch):
    (tmp_path / "specdec_fake_ok.py").write_text(
        "import math as m\nfrom os import sep\nEPS = 1e-5\n\ndef caller(x):\n    return compute_probs_and_sample_next_token(x, 1)\n\n"
        + _BODY.format("return m.pi + EPS + len(sep), logits")
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    fn, source = v1_drafting.load_function("specdec_fake_ok")
    assert fn(1, None) == (np.pi + 1e-5 + 1, 1) and source.calls == ((6, "caller", 2),)
    assert v1_drafting.load_function("specdec_fake_ok", "absent") is None


# --- through the runner ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ENGINE_SCENARIOS)
def test_engine_scenario_passes_cpu(drafter, name):
    scenario = find(catalog(CPU_PROFILE), name)
    assert not failing_checks(DRAFTER, scenario, CPU_PROFILE)


def _wrap_draft_fn(monkeypatch, change):
    """Every backend built from now on drafts with V1's function wrapped by ``change``."""
    load = v1_drafting.load_function

    def loading(*args, **kwargs):
        found = load(*args, **kwargs)
        return found and (functools.wraps(found[0])(functools.partial(change, found[0])), found[1])

    monkeypatch.setattr(v1_drafting, "load_function", loading)


def _untempered(fn, logits, metadata, *rest):
    """Drafting without the temperature: T > 0 rows divided by 1."""
    import torch

    metadata = copy.copy(metadata)
    metadata.temperature = torch.where(metadata.temperature > 0, 1.0, metadata.temperature)
    return fn(logits, metadata, *rest)


def _keyed_as_the_verifier(fn, logits, metadata, *rest):
    """The drafter's global generator seeded with the request's seed, as V1's verifier seeds
    the request's generator ("Consider seeds" done that way): the two draw the same noise."""
    import torch

    if 0 in metadata.generators:
        torch.manual_seed(metadata.generators[0].initial_seed())
    return fn(logits, metadata, *rest)


def _no_draft_probs(a):
    a["draft_probs"] = None


def _break(monkeypatch, change):
    if change == "verified-one-hot":  # V1's runner handing its verifier draft_probs=None (#40149)
        module = vllm_env.import_vllm(REJECTION)
        monkeypatch.setattr(module, "rejection_sample", wrapped(module.rejection_sample, _no_draft_probs))
    else:
        _wrap_draft_fn(monkeypatch, {"untempered": _untempered, "keyed-as-the-verifier": _keyed_as_the_verifier}[change])


CONVENTIONS = {
    "untempered": (COLD_SCENARIO, COLD_PROFILE, ["draft-law"]),
    "keyed-as-the-verifier": (NOISE_SCENARIO, NOISE_PROFILE, ["position-law"]),
    "verified-one-hot": (find(catalog(CPU_PROFILE), "engine-drafted-offset"), CPU_PROFILE, ["position-law", "acceptance-length"]),
}


@pytest.mark.parametrize("change", ["untempered", "keyed-as-the-verifier"])
def test_drafter_keeping_its_release_passes(probabilistic, change):
    """(verified-one-hot's scenario is engine-drafted-offset: test_engine_scenario_passes_cpu.)"""
    scenario, profile, _ = CONVENTIONS[change]
    assert not failing_checks(DRAFTER, scenario, profile)


@pytest.mark.parametrize("change", CONVENTIONS)
def test_drafter_breaking_its_release_fails(probabilistic, monkeypatch, change):
    """untempered: drafts from softmax(row), not softmax(row / T) (the verifier gets those
    probabilities: only the draft-law sees it); keyed-as-the-verifier: the draft's noise is the
    verifier's generator's; verified-one-hot: probabilistic drafts verified as point masses."""
    scenario, profile, checks = CONVENTIONS[change]
    _break(monkeypatch, change)
    lines = failing_checks(DRAFTER, scenario, profile)
    failed = {line.split("]")[1].split(":")[0].strip() for line in lines}
    assert "error" not in " ".join(lines) and failed == set(checks), lines


def test_cold_profile_detects_an_untempered_drafter():
    """The power guarantee behind ``untempered``: q at T = 0.25 is farther from q at T = 1 than
    what the draft-law detects (its power function) at the trials COLD_PROFILE plans."""
    (template,) = materialize(COLD_SCENARIO)
    q = template.sampling_probs()[0]
    untempered = pad_vocab(softmax_rows(template.draft_logits, 1.0), COLD_SCENARIO.vocab_size)[0]
    tv = 0.5 * np.abs(q - untempered).sum()
    _, checks, trials = planned_trials(COLD_SCENARIO, COLD_PROFILE)
    (law,) = [c for c in checks if c.name == "draft-law"]
    assert law.design_detectable(trials) <= COLD_PROFILE.tv < tv


_IN_TREE = r"""
import dataclasses, json, sys
from harness.backends.vllm import v1_drafting
from harness.scenarios.catalog import catalog, find
from harness.scenarios.profiles import get_profile
from suites.helpers import failing_checks
profile = dataclasses.replace(get_profile("smoke"), tv=float(sys.argv[3]))
api = v1_drafting.VllmV1DrafterBackend().api
print(json.dumps({"api": api, "failing": failing_checks(sys.argv[1], find(catalog(profile), sys.argv[2]), profile)}))
"""


@pytest.mark.slow
def test_vllm_0_22_drafts_with_its_two_argument_call_cpu(drafter):
    """0.22.1's tree (the 0.22 era: compute_probs_and_sample_next_token(logits, sampling_metadata)):
    engine-drafted-offset passes through the runner (~13 s, most of it importing vLLM)."""
    tree = TREES / "vllm-0.22.1"
    if not (tree / "vllm" / "__init__.py").is_file():
        pytest.skip(f"no vLLM 0.22.1 tree at {tree} (python scripts/build_vllm_tree.py --version 0.22.1 --no-wheelhouse)")
    env = {**os.environ, vllm_env.SRC_ENV: str(tree), "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-c", _IN_TREE, DRAFTER, "engine-drafted-offset", str(CPU_PROFILE.tv)]
    res = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert "llm_base_proposer.py:1654" in out["api"] and "(0.22)" in out["api"] and not out["failing"], out


# --- CUDA --------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("name", ENGINE_SCENARIOS)
def test_engine_scenario_passes_gpu(drafter, name, run_profile):
    scenario = find(catalog(run_profile), name)
    assert not failing_checks(DRAFTER, scenario, run_profile, device="cuda")


@pytest.mark.gpu
@gpu
def test_drafters_noise_on_the_device_gpu(probabilistic):
    """On CUDA the drafter seeds the device's global generator: the noise scenario passes
    (per-draft calls: chunks of 256 requests). The planted ``keyed-as-the-verifier`` is a CPU
    fault only: on CPU one seed gives the drafter's ``exponential_`` and the verifier's
    ``rand`` the same Mersenne-Twister stream; on CUDA the two Philox kernels map elements to
    counters differently, and the position-law measured no bias at ``smoke`` (an H100,
    torch 2.11): the same seed is not the same noise there."""
    profile = _per_draft_calls(get_profile("smoke"), NOISE_SCENARIO)
    assert not failing_checks(DRAFTER, NOISE_SCENARIO, profile, device="cuda")

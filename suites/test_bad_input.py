"""Bad input gets a clear error naming what was wrong."""

import json
import os
import re
import resource
import subprocess
import sys
import time

import numpy as np
import pytest

from harness.backends import load_backend
from harness.backends.faults import FAULTS
from harness.cli import main
from harness.protocol import VerifyBatch, as_numpy_outputs
from harness.scenarios.scenario import RequestSpec, Scenario
from reference import laws
from reference.methods import Method


def good_batch(**changes) -> VerifyBatch:
    fields = dict(
        target_logits=np.zeros((5, 4), np.float32),
        draft_logits=np.zeros((3, 4), np.float32),
        draft_tokens=np.array([0, 1, 2]),
        cu_num_drafts=np.array([0, 2, 3]),
        temperature=np.array([1.0, 0.0]),
        seeds=np.array([1, 2]),
        positions=np.arange(5),
        methods=np.array([0, 0], np.int8),
        synthetic_rates=None,
        max_drafts=2,
    )
    fields.update(changes)
    return VerifyBatch(**fields)


def test_good_batch_validates():
    good_batch().validate()
    good_batch(method_codes=(0,)).validate()
    # A logit bias: ids padded with -1 (the padded slot's value is not read), -inf masks a token.
    bias = good_batch(logit_bias_ids=np.array([[3, -1], [0, 2]]), logit_bias=np.array([[2.5, np.nan], [-np.inf, 1.0]], np.float32))
    assert bias.validate().has_sampling_params


@pytest.mark.parametrize(
    "changes,name",
    [
        (dict(target_logits=np.zeros((4, 4))), "target_logits"),
        (dict(draft_logits=np.zeros((3, 5))), "draft_logits"),
        (dict(draft_logits=np.full((3, 4), np.nan)), "draft_logits"),
        (dict(target_logits=np.full((5, 4), np.inf)), "target_logits"),
        (dict(draft_tokens=np.array([0, 4, 1])), "draft_tokens"),
        (dict(draft_tokens=np.array([0, -2, 1])), "draft_tokens"),
        (dict(draft_tokens=np.array([0.0, 1.0, 2.0])), "draft_tokens"),
        (dict(cu_num_drafts=np.array([1, 2, 3])), "cu_num_drafts"),
        (dict(temperature=np.array([-1.0, 1.0])), "temperature"),
        (dict(temperature=np.array([np.nan, 1.0])), "temperature"),
        (dict(seeds=np.array([1])), "seeds"),
        (dict(positions=np.arange(4)), "positions"),
        (dict(methods=np.array([0, 9], np.int8)), "methods"),
        (dict(methods=np.array([3, 0], np.int8)), "synthetic_rates"),
        (dict(methods=np.array([3, 0], np.int8), synthetic_rates=np.full((2, 2), 1.5)), "synthetic_rates"),
        (dict(max_drafts=1), "max_drafts"),
        (dict(request_slots=np.array([3, 3])), "request_slots"),
        (dict(logits_dtype="int8"), "logits_dtype"),
        (dict(method_codes=(0, 2)), "method_codes"),
        (dict(top_k=np.array([1.0, 2.0])), "top_k"),
        (dict(top_k=np.array([-1, 2])), "top_k"),
        (dict(top_k=np.array([1])), "top_k"),
        (dict(top_p=np.array([0.0, 0.5])), "top_p"),
        (dict(top_p=np.array([1.5, 0.5])), "top_p"),
        (dict(min_p=np.array([np.nan, 0.5])), "min_p"),
        (dict(min_p=np.array([2, 1])), "min_p"),
        (dict(processing="sort"), "processing"),
        (dict(logit_bias_ids=np.array([[0], [1]])), "logit_bias"),
        (dict(logit_bias=np.ones((2, 1), np.float32)), "logit_bias"),
        (dict(logit_bias_ids=np.array([0, 1]), logit_bias=np.ones(2, np.float32)), "logit_bias_ids"),
        (dict(logit_bias_ids=np.array([[0.0], [1.0]]), logit_bias=np.ones((2, 1), np.float32)), "logit_bias_ids"),
        (dict(logit_bias_ids=np.array([[0], [4]]), logit_bias=np.ones((2, 1), np.float32)), "logit_bias_ids"),
        (dict(logit_bias_ids=np.array([[0], [-2]]), logit_bias=np.ones((2, 1), np.float32)), "logit_bias_ids"),
        (dict(logit_bias_ids=np.array([[1, 1], [0, -1]]), logit_bias=np.ones((2, 2), np.float32)), "logit_bias_ids"),
        (dict(logit_bias_ids=np.array([[0], [1]]), logit_bias=np.ones((2, 2), np.float32)), "logit_bias"),
        (dict(logit_bias_ids=np.array([[0], [1]]), logit_bias=np.ones((2, 1), np.int64)), "logit_bias"),
        (dict(logit_bias_ids=np.array([[0], [1]]), logit_bias=np.array([[np.nan], [1]], np.float32)), "logit_bias"),
        (dict(logit_bias_ids=np.array([[0], [1]]), logit_bias=np.array([[np.inf], [1]], np.float32)), "logit_bias"),
        (dict(logit_bias_ids=np.array([[0], [1]]), logit_bias=np.array([[1e300], [1]])), "logit_bias"),
    ],
)
def test_malformed_batches_name_the_field(changes, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        good_batch(**changes).validate()


@pytest.mark.parametrize(
    "call,name",
    [
        (lambda: laws.fixed_draft_law(Method.STANDARD, [[0.5, 0.6]], None, []), "target"),
        (lambda: laws.fixed_draft_law(Method.STANDARD, [[1.2, -0.2]], None, []), "target"),
        (lambda: laws.fixed_draft_law(Method.STANDARD, [[np.nan, 1.0]], None, []), "target"),
        (lambda: laws.fixed_draft_law(Method.STANDARD, [[0.5, 0.5]] * 2, [[0.5, 0.5, 0.0]], [0]), "draft"),
        (lambda: laws.fixed_draft_law(Method.STANDARD, [[0.5, 0.5]] * 2, [[0.5, 0.5]], [2]), "drafts"),
        (lambda: laws.fixed_draft_law(Method.STANDARD, [[0.5, 0.5]] * 2, [[0.5, 0.5]], [0, 1]), "drafts"),
        (lambda: laws.fixed_draft_law(Method.SYNTHETIC, [[0.5, 0.5]] * 2, None, [0], [1.5]), "rates"),
        (lambda: Method.parse("fast"), "method"),
    ],
)
def test_law_inputs_are_checked(call, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        call()


@pytest.mark.parametrize(
    "data,needle",
    [
        ("[1, 2]", "expected a JSON object"),
        ("{not json", "scenario JSON"),
        (json.dumps({"name": "x", "method": "standard", "vocab_size": 8}), "missing field(s) ['requests']"),
        (json.dumps({"name": "x", "method": "fast", "vocab_size": 8, "requests": [{"num_drafts": 1}]}), "scenario.method"),
        (json.dumps({"name": "x", "method": "standard", "vocab_size": 1, "requests": [{"num_drafts": 1}]}), "scenario.vocab_size"),
        (json.dumps({"name": "x", "method": "standard", "vocab_size": 8, "requests": []}), "scenario.requests"),
        (
            json.dumps({"name": "x", "method": "standard", "vocab_size": 8, "requests": [{"num_drafts": -1}]}),
            "scenario.requests[0].num_drafts",
        ),
        (
            json.dumps({"name": "x", "method": "standard", "vocab_size": 8, "requests": [{"num_drafts": 1, "temperature": -1}]}),
            "temperature",
        ),
        (json.dumps({"name": "x", "method": "standard", "vocab_size": 8, "requests": [{"num_drafts": 1, "target": "wavy"}]}), "target"),
        (json.dumps({"name": "x", "method": "standard", "vocab_size": 8, "requests": [{"num_drafts": 1, "colour": 1}]}), "requests[0]"),
        (json.dumps({"name": "x", "method": "standard", "vocab_size": 8, "colour": 1, "requests": [{"num_drafts": 1}]}), "unknown field"),
        (json.dumps({"name": "x", "method": "synthetic", "vocab_size": 8, "requests": [{"num_drafts": 2}]}), "scenario.synthetic"),
        (
            json.dumps(
                {"name": "x", "method": "synthetic", "synthetic": {"rates": [0.5, 0.9]}, "vocab_size": 8, "requests": [{"num_drafts": 2}]}
            ),
            "non-increasing",
        ),
        (
            json.dumps(
                {
                    "name": "x",
                    "method": "standard",
                    "draft_mode": "sampled",
                    "vocab_size": 8,
                    "requests": [{"num_drafts": 2, "placeholder_at": 0}],
                }
            ),
            "placeholder",
        ),
    ],
)
def test_malformed_scenario_json_is_named(data, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        Scenario.from_json(data)


def test_scenario_round_trips_through_json():
    s = Scenario("rt", "block", 7, (RequestSpec(2, 0.5, "topk", "disjoint"),), draft_mode="sampled", seed=9)
    assert Scenario.from_json(s.to_json()) == s
    mixed = Scenario(
        "mixed", "standard", 9,
        (RequestSpec(2, 0, method="greedy"), RequestSpec(2, 1.0, method="synthetic"), RequestSpec(1, draft_ids=(4,), nan_rows=(1,))),
        synthetic={"rates": [0.9, 0.5]}, dtype="bfloat16", slots="permuted",
    )  # fmt: skip
    assert Scenario.from_json(mixed.to_json()) == mixed


@pytest.mark.parametrize(
    "name,needle",
    [
        ("nonsense", "unknown backend"),
        ("fault:nope", "unknown fault"),
        ("no_such_mod:X", "cannot import"),
        ("reference.sampler:Nope", "no attribute"),
    ],
)
def test_unknown_backends_are_named(name, needle):
    with pytest.raises(ValueError, match=needle):
        load_backend(name)


def test_malformed_backend_output_is_named():
    with pytest.raises(ValueError, match="tokens shape"):
        as_numpy_outputs((np.zeros((2, 2)), np.ones(2)), 2, 2)
    with pytest.raises(ValueError, match="tuple"):
        as_numpy_outputs(np.zeros(3), 2, 2)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["run", "--profile", "bogus"], "profile"),
        (["run", "--scenario", "no-such-scenario", "--profile", "smoke"], "no scenario named"),
        (["run", "--scenario", "/nonexistent/x.json"], "no such file"),
        (["run", "--device", "cuda"], "CUDA"),
        (["power", "--df", "0", "--tv", "0.1"], "df"),
        (["power", "--df", "3", "--tv", "2"], "tv"),
        (["run", "--exclude", "greedy-tie", "--profile", "smoke"], "did you mean 'greedy-ties'"),
        (["run", "--backend", "vllm-v1@/no/such/tree"], "no source tree folder"),
    ],
)
def test_cli_usage_errors_exit_2_with_one_line(argv, needle, capsys, tmp_path):
    if "cuda" in argv and __import__("harness.gpus", fromlist=["x"]).cuda_available():
        pytest.skip("this machine has CUDA")
    assert main(argv + (["--out", str(tmp_path)] if argv[0] == "run" else [])) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert not list(tmp_path.iterdir()), "nothing is written on a usage error"


def test_bad_scenario_file_is_a_usage_error(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x", "method": "standard"}')
    assert main(["run", "--scenario", str(bad), "--out", str(tmp_path / "out")]) == 2
    assert "missing field" in capsys.readouterr().err


# --- scenario files: names, sizes, types -----------------------------------------------
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIRST_FAULT = next(iter(FAULTS))
TINY = {"name": "tiny", "method": "standard", "vocab_size": 4, "requests": [{"num_drafts": 1}]}


def _cap_memory():
    # A regression that allocates a huge vocabulary fails here instead of exhausting the machine.
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))


def harness_run(*args, timeout=120):
    """``python -m harness run ARGS`` in a child process: (exit code, stderr, seconds)."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "harness", "run", "--profile", "smoke", "--no-progress", "--in-process", *args],
            cwd=REPO, capture_output=True, text=True, timeout=timeout, preexec_fn=_cap_memory,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"python -m harness run {' '.join(args)} still running after {timeout} s")
    return p.returncode, p.stderr.strip(), time.monotonic() - t0


def files_under(root) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), root) for d, _, names in os.walk(root) for f in names}


def scenario_file(tmp_path, file="s.json", **changes):
    path = tmp_path / file
    path.write_text(json.dumps({**TINY, **changes}))
    return path


@pytest.mark.parametrize("name", ["../../escaped", "ABSOLUTE"])
def test_scenario_names_cannot_write_outside_the_output_folder(name, tmp_path):
    name = str(tmp_path / "escaped") if name == "ABSOLUTE" else name
    path = scenario_file(tmp_path, name=name)
    rc, err, _ = harness_run("--scenario", str(path), "--out", str(tmp_path / "out"))
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: --scenario {path}: scenario.name:"), err
    assert files_under(tmp_path) == {"s.json"}, "nothing is written on a usage error"


@pytest.mark.parametrize(
    "name",
    ["", ".", "..", "a/b", "a\\b", "/tmp/x", "-lead", ".hidden", "a b", "x" * 129, "caf\u00e9", "nul\x00", "tab\t", 5, None],
)
def test_scenario_names_outside_the_documented_set_are_refused(name):
    with pytest.raises(ValueError, match=r"^scenario\.name:"):
        Scenario.from_dict({**TINY, "name": name})


@pytest.mark.parametrize("profile", ["smoke", "ci", "gpu", "nightly"])
def test_every_catalog_name_is_in_the_documented_set(profile):
    from harness.scenarios.catalog import catalog
    from harness.scenarios.profiles import get_profile
    from harness.scenarios.scenario import NAME_PATTERN

    assert all(NAME_PATTERN.fullmatch(s.name) for s in catalog(get_profile(profile)))
    assert all(NAME_PATTERN.fullmatch(n) for n in ("x" * 128, "a.b_c-D9", "9"))


@pytest.mark.parametrize(
    "changes,field",
    [
        (dict(vocab_size=10**9), "scenario.vocab_size"),
        (dict(vocab_size=(1 << 21) + 1), "scenario.vocab_size"),
        (dict(vocab_size=1 << 21, requests=[{"num_drafts": 31}, {"num_drafts": 1}]), "scenario.requests"),
        (dict(requests=[{"num_drafts": 1}] * 257), "scenario.requests"),
        (dict(requests=[{"num_drafts": 33}]), "scenario.requests[0].num_drafts"),
        (dict(requests=[{"num_drafts": 10**12}]), "scenario.requests[0].num_drafts"),
        (dict(requests=[{"num_drafts": 1, "temperature": 1e5}]), "scenario.requests[0].temperature"),
        (dict(requests=[{"num_drafts": 1, "temperature": 1e-6}]), "scenario.requests[0].temperature"),
        (dict(requests=[{"num_drafts": 1, "temperature": 1e300}]), "scenario.requests[0].temperature"),
        (dict(requests=[{"num_drafts": 1, "nan_rows": [0] * 10**5}]), "scenario.requests[0].nan_rows"),
        (dict(requests=[{"num_drafts": 1, "masked_rows": [1, 1]}]), "scenario.requests[0].masked_rows"),
        (dict(tags=["t"] * 65), "scenario.tags"),
        (dict(tags=["t" * 129]), "scenario.tags"),
        (dict(seed=10**23), "scenario.seed"),
        (dict(seed=2**63), "scenario.seed"),
        (dict(seed=-1), "scenario.seed"),
    ],
)
def test_scenario_sizes_are_bounded(changes, field):
    with pytest.raises(ValueError, match="^" + re.escape(field) + ":"):
        Scenario.from_dict({**TINY, **changes})


def test_the_largest_scenarios_are_accepted():
    from harness.scenarios.scenario import MAX_DRAFTS, MAX_REQUESTS, MAX_SEED, MAX_TEMPERATURE, MAX_VOCAB, MIN_TEMPERATURE

    Scenario.from_dict({**TINY, "vocab_size": MAX_VOCAB, "requests": [{"num_drafts": 31}], "seed": MAX_SEED})
    Scenario.from_dict({**TINY, "requests": [{"num_drafts": MAX_DRAFTS, "temperature": MIN_TEMPERATURE}] * MAX_REQUESTS})
    Scenario.from_dict({**TINY, "requests": [{"num_drafts": 1, "temperature": MAX_TEMPERATURE, "nan_rows": [1, 0]}]})


def test_ten_million_requests_are_refused_before_any_is_built():
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"^scenario\.requests:"):
        Scenario.from_dict({**TINY, "requests": [{"num_drafts": 1}] * 10**7})
    assert time.monotonic() - t0 < 1.0


def test_a_huge_vocabulary_is_a_quick_usage_error(tmp_path):
    path = scenario_file(tmp_path, vocab_size=10**9)
    rc, err, seconds = harness_run("--scenario", str(path), "--out", str(tmp_path / "out"))
    assert rc == 2 and len(err.splitlines()) == 1 and "scenario.vocab_size" in err, err
    assert seconds < 30 and files_under(tmp_path) == {"s.json"}


def test_too_many_requests_are_a_quick_usage_error(tmp_path):
    path = scenario_file(tmp_path, requests=[{"num_drafts": 1}] * 300)
    rc, err, seconds = harness_run("--scenario", str(path), "--out", str(tmp_path / "out"))
    assert rc == 2 and len(err.splitlines()) == 1 and "scenario.requests" in err, err
    assert seconds < 30


def test_a_ten_million_request_file_is_refused_unparsed(tmp_path):
    path = tmp_path / "s.json"
    with open(path, "w") as f:
        f.write(json.dumps(TINY)[:-2])  # TINY's requests list, left open
        f.write(', {"num_drafts": 1}' * (10**7 - 1) + "]}")
    try:
        rc, err, seconds = harness_run("--scenario", str(path), "--out", str(tmp_path / "out"), timeout=60)
    finally:
        path.unlink()
    assert rc == 2 and len(err.splitlines()) == 1 and "bytes" in err, err
    assert seconds < 30


@pytest.mark.parametrize(
    "changes,field",
    [
        (dict(tags=5), "scenario.tags"),
        (dict(tags="abc"), "scenario.tags"),
        (dict(tags=[1]), "scenario.tags"),
        (dict(tags=None), "scenario.tags"),
        (dict(method=["standard"]), "scenario.method"),
        (dict(vocab_size="8"), "scenario.vocab_size"),
        (dict(vocab_size=True), "scenario.vocab_size"),
        (dict(vocab_size=8.0), "scenario.vocab_size"),
        (dict(draft_vocab_size="4"), "scenario.draft_vocab_size"),
        (dict(draft_probs="yes"), "scenario.draft_probs"),
        (dict(draft_mode=5), "scenario.draft_mode"),
        (dict(seed=1.5), "scenario.seed"),
        (dict(seed=True), "scenario.seed"),
        (dict(seed="1"), "scenario.seed"),
        (dict(dtype=32), "scenario.dtype"),
        (dict(slots=None), "scenario.slots"),
        (dict(positions=[]), "scenario.positions"),
        (dict(requests={"num_drafts": 1}), "scenario.requests"),
        (dict(requests=[{"num_drafts": "2"}]), "scenario.requests[0].num_drafts"),
        (dict(requests=[{"num_drafts": True}]), "scenario.requests[0].num_drafts"),
        (dict(requests=[{"num_drafts": "2", "nan_rows": [0]}]), "scenario.requests[0].num_drafts"),
        (dict(requests=[{"num_drafts": None, "draft_ids": [0]}]), "scenario.requests[0].num_drafts"),
        (dict(requests=[{"num_drafts": 1, "temperature": "1"}]), "scenario.requests[0].temperature"),
        (dict(requests=[{"num_drafts": 1, "temperature": True}]), "scenario.requests[0].temperature"),
        (dict(requests=[{"num_drafts": 1, "target": 5}]), "scenario.requests[0].target"),
        (dict(requests=[{"num_drafts": 1, "draft": None}]), "scenario.requests[0].draft"),
        (dict(requests=[{"num_drafts": 1, "draft_ids": 5}]), "scenario.requests[0].draft_ids"),
        (dict(requests=[{"num_drafts": 1, "draft_ids": "a"}]), "scenario.requests[0].draft_ids"),
        (dict(requests=[{"num_drafts": 1, "draft_ids": [True]}]), "scenario.requests[0].draft_ids"),
        (dict(requests=[{"num_drafts": 1, "nan_rows": 5}]), "scenario.requests[0].nan_rows"),
        (dict(requests=[{"num_drafts": 1, "masked_rows": None}]), "scenario.requests[0].masked_rows"),
        (dict(requests=[{"num_drafts": 1, "masked_rows": [False]}]), "scenario.requests[0].masked_rows"),
        (dict(requests=[{"num_drafts": 1, "stationary": 1}]), "scenario.requests[0].stationary"),
        (dict(requests=[{"num_drafts": 1, "placeholder_at": True}]), "scenario.requests[0].placeholder_at"),
        (dict(requests=[{"num_drafts": 1, "method": ""}]), "scenario.requests[0].method"),
        (dict(requests=[{"num_drafts": 1, "method": 0}]), "scenario.requests[0].method"),
        (dict(requests=[{"num_drafts": 1, "method": []}]), "scenario.requests[0].method"),
        (dict(requests=[{"num_drafts": 1, "top_k": 0}]), "scenario.requests[0].top_k"),
        (dict(requests=[{"num_drafts": 1, "top_k": 2.0}]), "scenario.requests[0].top_k"),
        (dict(requests=[{"num_drafts": 1, "top_p": 0}]), "scenario.requests[0].top_p"),
        (dict(requests=[{"num_drafts": 1, "top_p": "0.5"}]), "scenario.requests[0].top_p"),
        (dict(requests=[{"num_drafts": 1, "min_p": 1.5}]), "scenario.requests[0].min_p"),
        (dict(requests=[{"num_drafts": 1, "min_p": True}]), "scenario.requests[0].min_p"),
        (dict(requests=[{"num_drafts": 1, "top_k": 2, "temperature": 3.0}]), "scenario.requests[0].temperature"),
        (dict(requests=[{"num_drafts": 1, "top_p": 0.5, "temperature": 1e-3}]), "scenario.requests[0].temperature"),
        (dict(requests=[{"num_drafts": 1, "logit_bias": [[1, 2.0]]}]), "scenario.requests[0].logit_bias"),
        (dict(requests=[{"num_drafts": 1, "logit_bias": "1: 2"}]), "scenario.requests[0].logit_bias"),
        (dict(requests=[{"num_drafts": 1, "logit_bias": {"a": 2.0}}]), "scenario.requests[0].logit_bias"),
        (dict(requests=[{"num_drafts": 1, "logit_bias": {"1.5": 2.0}}]), "scenario.requests[0].logit_bias"),
        (dict(requests=[{"num_drafts": 1, "logit_bias": {"4": 2.0}}]), "scenario.requests[0].logit_bias"),
        (dict(requests=[{"num_drafts": 1, "logit_bias": {"-1": 2.0}}]), "scenario.requests[0].logit_bias"),
        (dict(requests=[{"num_drafts": 1, "logit_bias": {"1": "2"}}]), "scenario.requests[0].logit_bias"),
        (dict(requests=[{"num_drafts": 1, "logit_bias": {"1": True}}]), "scenario.requests[0].logit_bias"),
        (dict(requests=[{"num_drafts": 1, "logit_bias": {"1": None}}]), "scenario.requests[0].logit_bias"),
        (dict(requests=[{"num_drafts": 1, "logit_bias": {"1": 100.5}}]), "scenario.requests[0].logit_bias"),
        (dict(requests=[{"num_drafts": 1, "logit_bias": {"1": 2.0}, "temperature": 2.5}]), "scenario.requests[0].temperature"),
        (dict(processing="vllm-v1"), "scenario.processing"),
        (dict(method="synthetic", synthetic="x"), "scenario.synthetic"),
        (dict(method="synthetic", synthetic={"mean_rate": "0.5"}), "scenario.synthetic.mean_rate"),
        (dict(method="synthetic", synthetic={"mean_rate": True}), "scenario.synthetic.mean_rate"),
        (dict(method="synthetic", synthetic={"mean_rate": None}), "scenario.synthetic.mean_rate"),
        (dict(method="synthetic", synthetic={"mean_rate": 1.5}), "scenario.synthetic.mean_rate"),
        (dict(method="synthetic", synthetic={"rates": "abc"}), "scenario.synthetic.rates"),
        (dict(method="synthetic", synthetic={"rates": [True]}), "scenario.synthetic.rates"),
        (dict(method="synthetic", synthetic={"rates": [[0.5]]}), "scenario.synthetic.rates"),
        (dict(method="synthetic", synthetic={"rates": [0.5, 0.4]}), "scenario.synthetic.rates"),
        (dict(method="synthetic", synthetic={"acceptance_length": [2]}), "scenario.synthetic.acceptance_length"),
        (dict(method="synthetic", synthetic={"acceptance_length": 9}), "scenario.synthetic.acceptance_length"),
    ],
)
def test_scenario_field_types_are_checked(changes, field):
    with pytest.raises(ValueError, match="^" + re.escape(field) + ":"):
        Scenario.from_dict({**TINY, **changes})


@pytest.mark.parametrize(
    "bias,needle",
    [
        ({4: 1.0}, "token id 4 is outside the vocabulary [0, 4)"),
        ({1: float("nan")}, "the bias of token 1 must be a finite number in [-100, 100]"),
        ({1: float("-inf")}, "the bias of token 1 must be a finite number in [-100, 100]"),
        ({1: 1e3}, "the bias of token 1 must be a finite number"),
        ({"1": 1.0}, "token ids are integers, got '1'"),
        (((1, 1.0), (1, 2.0)), "token 1 has more than one bias"),
        ((1, 2.0), "expected a mapping of token id -> bias"),
    ],
)
def test_logit_bias_errors_name_what_is_wrong(bias, needle):
    """A Python-built request's bias (a mapping, as vLLM's ``SamplingParams.logit_bias``): ids in
    the vocabulary, once each; finite biases within the OpenAI server's [-100, 100]."""
    with pytest.raises(ValueError, match=r"^scenario\.requests\[0\]\.logit_bias: .*" + re.escape(needle)):
        Scenario("x", "standard", 4, (RequestSpec(1, logit_bias=bias),))


def test_logit_bias_is_a_json_object_and_round_trips():
    """JSON spells the mapping as an object with decimal keys (OpenAI's ``logit_bias``); a
    request without a bias writes none, so every earlier scenario's JSON is unchanged."""
    s = Scenario("b", "standard", 12, (RequestSpec(2, 0.7, logit_bias={11: 3.0, 2: -100}), RequestSpec(1)))
    assert s.requests[0].logit_bias == ((2, -100), (11, 3.0))
    data = json.loads(s.to_json())
    assert data["requests"][0]["logit_bias"] == {"2": -100, "11": 3.0} and "logit_bias" not in data["requests"][1]
    assert Scenario.from_json(s.to_json()) == s
    assert RequestSpec(1, logit_bias={3: 1.0, 1: 2.0}) == RequestSpec(1, logit_bias=((1, 2.0), (3, 1.0)))
    assert Scenario.from_dict({**TINY, "requests": [{"num_drafts": 1, "logit_bias": None}]}).requests[0].logit_bias == ()


def test_python_built_scenarios_are_checked_the_same_way():
    with pytest.raises(ValueError, match=r"^scenario\.requests:"):
        Scenario("x", "standard", 8, ())
    with pytest.raises(ValueError, match=r"^scenario\.requests\[1\]:"):
        Scenario("x", "standard", 8, (RequestSpec(1), {"num_drafts": 1}))
    with pytest.raises(ValueError, match=r"^scenario\.tags:"):
        Scenario("x", "standard", 8, (RequestSpec(1),), tags="abc")


def test_deeply_nested_json_is_a_value_error():
    with pytest.raises(ValueError, match="scenario JSON"):
        Scenario.from_json("[" * 100_000 + "]" * 100_000)


def test_a_bad_field_type_in_a_file_is_one_usage_line(tmp_path, capsys):
    path = scenario_file(tmp_path, tags=5)
    assert main(["run", "--scenario", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: --scenario {path}: scenario.tags:"), err
    assert files_under(tmp_path) == {"s.json"}


def test_huge_values_are_shown_briefly():
    with pytest.raises(ValueError) as e:
        Scenario.from_dict({**TINY, "vocab_size": [0] * 10**5})
    assert len(str(e.value)) < 300


@pytest.mark.parametrize("command", ["run", "faults", "peers", "scenarios"])
@pytest.mark.parametrize("seed", [str(2**64), str(2**63), "-1"])
def test_cli_seeds_are_bounded(command, seed, tmp_path, capsys):
    argv = [command, "--profile", "smoke", "--seed", seed] + (["--out", str(tmp_path / "out")] if command != "scenarios" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: --seed:"), err
    assert not (tmp_path / "out").exists()


def test_cli_accepts_the_largest_seed(capsys):
    assert main(["scenarios", "--profile", "smoke", "--seed", str(2**63 - 1)]) == 0


@pytest.mark.parametrize("same_as_catalog", [False, True])
def test_duplicate_scenario_names_are_refused(same_as_catalog, tmp_path, capsys):
    name = "greedy-ragged" if same_as_catalog else "tiny"
    a = scenario_file(tmp_path, "a.json", name=name)
    second = "greedy-ragged" if same_as_catalog else str(scenario_file(tmp_path, "b.json", name=name, seed=1))
    assert main(["run", "--profile", "smoke", "--scenario", str(a), "--scenario", second, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and repr(name) in err and "--scenario" in err, err
    assert not (tmp_path / "out").exists()


def test_unknown_catalog_scenarios_suggest_a_close_name(tmp_path, capsys):
    assert main(["run", "--profile", "smoke", "--scenario", "greedy-ragd", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "did you mean 'greedy-ragged'?" in err, err


@pytest.mark.parametrize(
    "name", ["reference", "triton", "vllm-mrv2", "vllm-v1", "pkg.mod:Attr", "vllm-mrv2@vendor/vllm-0.19.1", "reference@x", "pkg.mod:A@x"]
)
def test_known_backend_names_pass_the_check(name):
    from harness.backends import check_backend_name

    check_backend_name(name)


def test_every_built_in_backend_name_passes_the_check():
    from harness.backends import builtin_names, check_backend_name

    for name in builtin_names():
        check_backend_name(name)


@pytest.mark.parametrize(
    "name,needle",
    [
        ("refrence", "did you mean 'reference'?"),
        ("trition", "did you mean 'triton'?"),
        ("refrence@vendor/x", "did you mean 'reference'?"),
        ("fault:nope", "unknown fault 'nope'"),
        (f"fault:{FIRST_FAULT[:-1]}", f"did you mean 'fault:{FIRST_FAULT}'?"),
        ("triton-fault:nope", "unknown Triton fault 'nope'"),
        ("nonsense", "unknown backend 'nonsense'"),
        ("", "backend"),
        ("@x", "backend"),
    ],
)
def test_unknown_backend_names_are_refused_with_a_suggestion(name, needle):
    from harness.backends import check_backend_name

    with pytest.raises(ValueError, match=re.escape(needle)) as e:
        check_backend_name(name)
    assert str(e.value).startswith("backend:") and "\n" not in str(e.value)


@pytest.mark.parametrize("backend,needle", [("refrence", "did you mean 'reference'?"), ("fault:nope", "unknown fault 'nope'")])
def test_cli_refuses_an_unknown_backend_before_sampling(backend, needle, tmp_path, capsys):
    assert main(["run", "--profile", "smoke", "--backend", backend, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: backend:") and needle in err, err
    assert not (tmp_path / "out").exists()

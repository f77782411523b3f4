"""Bad input gets a clear error naming what was wrong."""

import json
import re

import numpy as np
import pytest

from harness.backends import load_backend
from harness.cli import main
from harness.protocol import VerifyBatch, as_numpy_outputs
from harness.scenarios import RequestSpec, Scenario
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
                    "drafts": "sampled",
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
    s = Scenario("rt", "block", 7, (RequestSpec(2, 0.5, "topk", "disjoint"),), drafts="sampled", seed=9)
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
    ],
)
def test_cli_usage_errors_exit_2_with_one_line(argv, needle, capsys, tmp_path):
    if "cuda" in argv and __import__("harness.device", fromlist=["x"]).cuda_available():
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

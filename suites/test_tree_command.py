"""``python -m harness tree``: the reference passes every tree scenario, each planted tree
fault fails where its exact distance exceeds the profile's detectable TV, declines are
skipped with their reason, usage errors exit 2 and write nothing, and a failing record's
reproducer reruns and fails.

Statistical checks run at the profiles' alpha = 1e-6 with power 0.99 against TV >= 0.1
(smoke) or 0.02 (ci) on the pooled cells; seeds are fixed, so every run gives the same counts.
"""

import json
import os
import shlex
import subprocess
import sys

import numpy as np
import pytest

from harness.checking import checks
from harness.checking.pooling import pooled
from harness.cli import main
from harness.scenarios.profiles import get_profile
from harness.trees import backends as tb
from harness.trees.faults import FAULTS
from harness.trees.run import sampling_seed
from harness.trees.scenario import CATALOG, find

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_tree(tmp_path, *args, out="out"):
    """(exit code, results document or None) of ``python -m harness tree ARGS --out DIR``."""
    path = tmp_path / out
    code = main(["tree", *args, "--out", str(path)])
    doc = json.loads((path / "results.json").read_text()) if (path / "results.json").exists() else None
    return code, doc


def records(doc, **where):
    return [r for r in doc["records"] if all(r[k] == v for k, v in where.items())]


def test_reference_passes_every_scenario_at_smoke(tmp_path, capsys):
    code, doc = run_tree(tmp_path, "--profile", "smoke")
    assert code == 0, capsys.readouterr()
    assert set(doc["scenarios"]) == {s.name for s in CATALOG}
    for s in CATALOG:
        (law,) = records(doc, scenario=s.name, check="tree-law")
        assert law["verdict"] == "pass" and law["kind"] == "gof" and law["detectable_tv"] <= 0.1 * (1 + 1e-9), law
        assert law["alpha"] == 1e-6 and law["trials"] > 0
        # The message says what a pass means: a lossless setting, or the rule's exact distance.
        assert ("a lossless setting" if s.lossless else "a known lossy setting") in law["message"], law
    assert "verdict: pass" in capsys.readouterr().out


# Each fault on a scenario where its exact TV (from the fault's own law, on the cells the
# ci design pools) exceeds ci's detectable TV of 0.02.
FAULT_CASES = [
    ("sglang-residual-keeps-siblings", "sglang-binary", 0.1392),
    ("sglang-coin-per-sibling", "sglang-wide-root", 0.0995),
    ("specinfer-unnormalized-residual", "specinfer-binary", 0.1823),
]


@pytest.mark.parametrize("fault, scenario, exact_tv", FAULT_CASES)
def test_each_planted_fault_fails_at_ci_where_it_is_far_enough(tmp_path, fault, scenario, exact_tv):
    ci = get_profile("ci")
    case = find(scenario).build()
    faulty = FAULTS[fault]().law(case.tree, case.scenario.thresholds).ravel()
    trials, get_pooled, _ = checks.design_pooling(case.law, ci)
    bins = get_pooled().bins
    tv = 0.5 * np.abs(pooled(faulty, bins) - pooled(case.law, bins)).sum() + 0.5 * faulty[bins < 0].sum()
    assert tv == pytest.approx(exact_tv, abs=1e-4) and tv > ci.tv
    # The stated law is the fault's: its own output passes the same check against it.
    backend = tb.load(f"tree-fault:{fault}")
    check = checks.gof_check("fault-law", 0, faulty, case.label, ci, lambda c: c)
    counts = backend.counts(case, check.design_trials, sampling_seed(0, case.scenario))
    assert check.evaluate(counts, np.random.default_rng(0)).p_value > ci.alpha
    code, doc = run_tree(tmp_path, "--backend", f"tree-fault:{fault}", "--scenario", scenario, "--profile", "ci")
    assert code == 1
    (law,) = records(doc, check="tree-law")
    assert law["verdict"] == "fail" and law["p_value"] < law["holm_threshold"] and law["trials"] == trials
    assert "--scenario " + scenario in law["reproducer"]


def test_a_failing_records_reproducer_reruns_and_fails(tmp_path):
    code, doc = run_tree(
        tmp_path, "--backend", "tree-fault:sglang-residual-keeps-siblings", "--scenario", "sglang-wide-root", "--profile", "smoke"
    )
    assert code == 1
    (law,) = records(doc, check="tree-law", verdict="fail")
    argv = shlex.split(law["reproducer"])
    assert argv[:4] == ["python", "-m", "harness", "tree"]
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, *argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    rerun = json.loads((tmp_path / "reports" / "tree" / "results.json").read_text())
    (again,) = records(rerun, check="tree-law")
    assert again["verdict"] == "fail" and again["statistic"] == law["statistic"]  # the same counts


SAMPLERS = """
import numpy as np
from reference import tree as tr


class SGLangOnly(tr.SGLangTreeSampler):
    rule = "sglang"


class FixedOnly:  # SpecInfer without sample_drawn: drafted scenarios are declined
    rule = "specinfer"

    def sample(self, tree, trials, seed):
        return tr.SpecInferTreeSampler().sample(tree, trials, seed)


class Raises(tr.SGLangTreeSampler):
    rule = "sglang"

    def sample(self, *args):
        raise RuntimeError("kernel launch failed")


class OutOfRange(tr.SGLangTreeSampler):
    rule = "sglang"

    def sample(self, tree, trials, seed, single, acc):
        node, token = super().sample(tree, trials, seed, single, acc)
        return node, token + tree.vocab


class NoRule:
    def sample(self, tree, trials, seed):
        return None
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "tree_samplers.py").write_text(SAMPLERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "tree_samplers"
    sys.modules.pop("tree_samplers", None)


def test_declines_are_skipped_with_their_reason_never_passed(tmp_path, user_module):
    code, doc = run_tree(
        tmp_path, "--backend", f"{user_module}:FixedOnly", "--profile", "smoke",
        "--scenario", "sglang-chain", "--scenario", "specinfer-drafted-binary", "--scenario", "specinfer-wide-root",
    )  # fmt: skip
    assert code == 0  # verified on specinfer-wide-root (its fixed children's law); the rest declined
    (law,) = records(doc, scenario="specinfer-wide-root", check="tree-law")
    assert law["verdict"] == "pass"
    for scenario, reason in (("sglang-chain", "is for the sglang rule"), ("specinfer-drafted-binary", "no sample_drawn")):
        for r in records(doc, scenario=scenario):
            assert r["verdict"] == "skipped" and reason in r["message"], r


@pytest.mark.parametrize("attr", ["SGLangOnly", "FixedOnly"])
def test_a_backend_declining_everything_verified_nothing(tmp_path, user_module, attr):
    other = "specinfer-drafted-binary" if attr == "FixedOnly" else "specinfer-chain"
    code, doc = run_tree(tmp_path, "--backend", f"{user_module}:{attr}", "--scenario", other, "--profile", "smoke")
    assert code == 3 and {r["verdict"] for r in doc["records"]} == {"skipped"}


@pytest.mark.parametrize(
    "attr, message",
    [("Raises", "kernel launch failed"), ("OutOfRange", "token: trial 0 gave"), ("NoRule", "expected an attribute rule")],
)
def test_a_backend_that_errors_fails_the_run(tmp_path, user_module, attr, message):
    code, doc = run_tree(tmp_path, "--backend", f"{user_module}:{attr}", "--scenario", "sglang-chain", "--profile", "smoke")
    assert code == 1
    assert {r["verdict"] for r in doc["records"]} == {"error"} and message in doc["records"][0]["message"]


@pytest.mark.parametrize(
    "args, named",
    [
        (["--backend", "refrence"], "'refrence'"),
        (["--backend", "tree-fault:nope"], "'nope'"),
        (["--backend", "fault:bonus-wrong-row"], "fault:bonus-wrong-row: a planted chain fault"),
        (["--scenario", "sglang-chian"], "'sglang-chian'"),
        (["--profile", "quick"], "'quick'"),
        (["--tv", "0"], "got 0.0"),
        (["--tv", "1.5"], "got 1.5"),
        (["--tv", "nan"], "got nan"),
        (["--seed", "-1"], "got -1"),
    ],
)
def test_usage_errors_exit_2_name_the_bad_value_and_write_nothing(tmp_path, capsys, args, named):
    code, doc = run_tree(tmp_path, *args)
    assert code == 2 and doc is None and not (tmp_path / "out").exists()
    err = capsys.readouterr().err
    assert err.startswith("error: ") and named in err, err

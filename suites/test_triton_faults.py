"""Every fault planted in the Triton kernels (``harness.backends.triton.faults``) is caught.

The Triton interpreter takes 2 to 6 minutes per fault for the whole ``ci`` catalog, so
the CPU suite runs each fault on the one ``ci`` scenario recorded below, which must catch
it with the expected check; the whole matrix is ``python -m harness faults --backend
triton`` (docs/fault-matrix-triton.md), whose record is checked to name every planted
fault as caught. ``-m gpu`` runs the same scenarios at the ``gpu`` profile on CUDA (where
one fault needs a scenario of the gpu catalog alone: ``EXPECTED_GPU``).
"""

import json
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the Triton backend needs torch")
pytest.importorskip("triton", reason="the Triton backend needs triton")

from harness.backends import load_backend  # noqa: E402
from harness.backends.faults import FAULTS  # noqa: E402
from harness.backends.triton.faults import NOT_PLANTED, TRITON_FAULTS  # noqa: E402
from harness.cli import main  # noqa: E402
from harness.gpus import gpu_skip_reason  # noqa: E402
from harness.run.runner import run  # noqa: E402
from harness.scenarios.catalog import catalog  # noqa: E402
from harness.scenarios.profiles import get_profile  # noqa: E402
from harness.studies.detection import detect, family_of  # noqa: E402

# The interpreter computes Philox's wrapping uint32 products with NumPy, which warns.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.*")

# fault -> (checks of which one must be among the catching ones, the scenario that runs it: a
# cheap one of those that catch it in the ci matrix)
EXPECTED = {
    "ignore-draft-probs": ({"outcome-law", "acceptance-length"}, "standard-disjoint"),
    "temperature-twice": ({"outcome-law", "acceptance-length"}, "standard-near-target"),
    "block-token-wise": ({"outcome-law", "acceptance-length"}, "block-fixed"),
    "greedy-tie-highest": ({"outcome-law"}, "greedy-ties"),
    "nan-row-out-of-vocab": ({"structure"}, "standard-nan-rows"),
    "inverted-ratio": ({"outcome-law"}, "greedy-ties"),
    "accept-at-zero-uniform": ({"position-law", "acceptance-length"}, "standard-sampled-disjoint"),
    "accept-placeholder": ({"structure"}, "greedy-placeholder"),
    "placeholder-as-index": ({"structure"}, "standard-placeholder"),
    "draft-off-by-one": ({"outcome-law"}, "greedy-ragged"),
    "wrong-draft-step": ({"outcome-law", "acceptance-length"}, "standard-topk"),
    "synthetic-rates-as-conditional": ({"acceptance-length", "acceptance-rate"}, "synthetic-same-as-target"),
    "bonus-wrong-row": ({"outcome-law"}, "greedy-placeholder"),
    "greedy-bonus-sampled": ({"outcome-law"}, "greedy-ragged"),
    "seed-collision": ({"outcome-law"}, "standard-aligned-positions"),
    "residual-is-target": ({"outcome-law"}, "standard-topk"),
    "one-hot-residual-keeps-rejected": ({"outcome-law"}, "standard-no-draft-probs"),
    "unclamped-residual": ({"outcome-law"}, "standard-topk"),
    "residual-not-normalized": ({"outcome-law"}, "standard-topk"),
    "reuse-uniform": ({"outcome-law"}, "standard-topk"),
    "noise-floor": ({"outcome-law"}, "standard-same-as-target"),
    "draft-before-temperature": ({"outcome-law", "acceptance-length"}, "standard-near-target"),
    "oov-lane-wins": ({"structure", "outcome-law"}, "synthetic-same-as-target"),
    "continue-after-reject": ({"structure"}, "greedy-ragged"),
    "bonus-after-reject": ({"structure"}, "greedy-ragged"),
    "residual-wrong-position": ({"outcome-law"}, "greedy-ragged"),
    "draft-before-topk": ({"outcome-law"}, "standard-topk"),
    "min-p-skipped": ({"outcome-law", "acceptance-length"}, "standard-min-p"),
    "top-p-drops-boundary": ({"outcome-law", "position-law"}, "standard-top-p"),
    "top-p-before-temperature": ({"outcome-law"}, "standard-top-p"),
    "drafter-shares-noise": ({"position-law"}, "engine-drafted"),
    "drafter-after-processor": ({"draft-law"}, "engine-drafted"),
    "drafter-other-precision": ({"draft-law"}, "engine-drafted-offset"),
    "greedy-drafts-verified-with-probs": ({"position-law"}, "engine-greedy-drafter"),
    "logit-bias-skipped": ({"outcome-law"}, "greedy-logit-bias"),
}
MATRIX = Path(__file__).resolve().parents[1] / "docs" / "fault-matrix-triton.json"


def test_every_triton_fault_has_an_expectation():
    assert set(EXPECTED) == set(TRITON_FAULTS)


def test_triton_faults_are_reference_faults_with_distinct_codes():
    """Same name, same bug: every Triton fault names a reference fault; 0 is the correct sampler."""
    assert set(TRITON_FAULTS) <= set(FAULTS), set(TRITON_FAULTS) - set(FAULTS)
    codes = [f.code for f in TRITON_FAULTS.values()]
    assert 0 not in codes and len(set(codes)) == len(codes), codes


def test_every_reference_fault_is_planted_or_says_why_not():
    assert not set(NOT_PLANTED) & set(TRITON_FAULTS)
    assert set(NOT_PLANTED) | set(TRITON_FAULTS) == set(FAULTS), set(FAULTS) - set(NOT_PLANTED) - set(TRITON_FAULTS)


def test_recorded_matrix_catches_every_planted_fault():
    """docs/fault-matrix-triton.json (``python -m harness faults --backend triton --profile ci``)
    is the whole ci catalog per fault: it must list every planted fault, each caught."""
    record = json.loads(MATRIX.read_text())
    assert (record["backend"], record["device"], record["profile"]["name"]) == ("triton", "cpu", "ci")
    rows = {row["fault"]: row for row in record["rows"]}
    assert set(rows) == set(TRITON_FAULTS), f"regenerate {MATRIX.name}: it lacks {set(TRITON_FAULTS) - set(rows)}"
    missed = [name for name, row in rows.items() if not row["detected"] or row["errors"]]
    assert not missed, f"not caught (or errors) in the recorded matrix: {missed}"


def test_unknown_triton_fault_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown Triton fault 'nope'.*inverted-ratio"):
        load_backend("triton-fault:nope")


def test_cli_names_the_triton_faults_on_a_wrong_one(capsys):
    assert main(["faults", "--backend", "triton", "--fault", "nope"]) == 2
    assert "oov-lane-wins" in capsys.readouterr().err


# At the gpu profile (V = 32, other trial counts) two faults show in other scenarios
# (measured with `python -m harness faults --backend triton --profile gpu --device cuda` on an H200).
# oov-lane-wins needs an empty residual at a vocabulary whose last CUDA tile is partly past V:
# V = 32 is one whole tile, so its padded lane is V - 1, in the vocabulary (see the CPU test below).
EXPECTED_GPU = {
    **EXPECTED,
    "inverted-ratio": ({"outcome-law", "acceptance-length"}, "standard-near-target"),
    "bonus-wrong-row": ({"outcome-law", "position-law"}, "greedy-sampled"),
    "oov-lane-wins": ({"structure"}, "synthetic-boundary-vocab"),
}


def _assert_caught(fault: str, profile_name: str, device: str, expected=EXPECTED):
    profile = get_profile(profile_name)
    must_checks, scenario = expected[fault]
    scenarios = [s for s in catalog(profile, 0) if s.name == scenario]
    assert scenarios, f"no scenario {scenario!r} in the {profile.name} catalog"
    row = detect(fault, profile, seed=0, device=device, backend="triton", scenarios=scenarios)
    assert not row.errors, row.errors
    assert row.detected, f"triton-fault:{fault} was not caught by {scenario} at {profile.name} on {device}"
    caught_by = {family for family, hit in row.families.items() if hit}
    assert {family_of(c) for c in must_checks} & caught_by, f"triton-fault:{fault} caught only by {caught_by}"
    # The strongest evidence is decisive: an exact violation or a p-value at most alpha.
    assert row.p_value is not None and row.p_value <= profile.alpha, (row.catching, row.p_value)


@pytest.mark.parametrize("fault", sorted(TRITON_FAULTS))
def test_triton_fault_is_caught_on_cpu(fault):
    _assert_caught(fault, "ci", "cpu")


@pytest.mark.parametrize(
    "backend,caught",
    [
        ("harness.backends.triton.variants:OovLaneWinsOnCudaTiles", True),  # the fault: a padded lane's id >= V
        ("harness.backends.triton.variants:CudaTiles", False),  # the correct sampler on the same tiles
    ],
    ids=["oov-lane-wins", "correct"],
)
def test_gpu_boundary_scenario_catches_oov_lane_wins_on_cuda_tiles(backend, caught):
    """GHSA-8wr5-jm2h-8r4f at the gpu catalog's tile-boundary scenario, in the interpreter on
    the tiles CUDA chooses (V = 3000: two 2048-wide tiles, the last one 952 ids in the vocabulary).

    Every synthetic rejection there has an empty residual (draft = target), so the fault emits
    the last tile's last lane, 4095. The structure check is exact: any one such trial fails it,
    and 30% of trials reject at their first draft. So the smoke profile's trial counts suffice
    (1,973 trials, ~10 s each here; the gpu profile's 183,926 would take ~13 min in the interpreter,
    the ci profile's 46,386 took 203 s and caught it the same way).
    """
    profile = get_profile("smoke")
    scenario = [s for s in catalog(get_profile("gpu"), 0) if s.name == "synthetic-boundary-vocab"]
    assert scenario, "no synthetic-boundary-vocab in the gpu catalog"
    records = {r.check: r for r in run([backend], scenario, profile, seed=0, device="cpu").records}
    assert "error" not in {r.verdict for r in records.values()}, [r.message for r in records.values()]
    structure = records["structure"]
    if caught:
        assert structure.verdict == "fail" and "4095" in structure.message, structure.message
    else:
        failed = [f"{r.check}: {r.message}" for r in records.values() if r.verdict == "fail"]
        assert not failed, failed


@pytest.mark.gpu
@pytest.mark.skipif(gpu_skip_reason() is not None, reason=gpu_skip_reason() or "")
@pytest.mark.parametrize("fault", sorted(TRITON_FAULTS))
def test_triton_fault_is_caught_on_gpu(fault):
    _assert_caught(fault, "gpu", "cuda", EXPECTED_GPU)

"""Every planted fault is caught by the CPU ``ci`` profile, by the check we expect."""

import pytest

from harness.backends.faults import FAULTS
from harness.scenarios.profiles import get_profile
from harness.studies.detection import detect, family_of

PROFILE = get_profile("ci")

# fault -> (checks that must be among the catching ones, a scenario that must catch it)
EXPECTED = {
    "ignore-draft-probs": ({"outcome-law", "acceptance-length", "position-law"}, "standard-sampled"),
    "unclamped-residual": ({"outcome-law"}, "standard-near-target"),
    "residual-is-target": ({"outcome-law", "position-law"}, "standard-peaked-vs-flat"),
    "bonus-wrong-row": ({"outcome-law", "position-law"}, "standard-near-target"),
    "continue-after-reject": ({"structure"}, "standard-near-target"),
    "greedy-tie-highest": ({"outcome-law"}, "greedy-ties"),
    "accept-placeholder": ({"structure"}, "standard-placeholder"),
    "reuse-uniform": ({"outcome-law"}, "standard-near-target"),
    "temperature-twice": ({"outcome-law", "position-law"}, "strict-sampled"),
    "draft-before-temperature": ({"outcome-law", "acceptance-length"}, "standard-near-target"),
    "draft-before-topk": ({"outcome-law"}, "standard-disjoint"),
    "accept-at-zero-uniform": ({"outcome-law"}, "greedy-ragged"),
    "inverted-ratio": ({"outcome-law", "position-law"}, "greedy-sampled"),
    "residual-not-normalized": ({"outcome-law"}, "standard-peaked-vs-flat"),
    "residual-wrong-position": ({"outcome-law"}, "greedy-ragged"),
    "one-hot-residual-keeps-rejected": ({"outcome-law", "position-law"}, "standard-no-draft-probs"),
    "draft-off-by-one": ({"outcome-law"}, "greedy-ragged"),
    "wrong-draft-step": ({"outcome-law", "acceptance-length"}, "standard-near-target"),
    "wrong-request-slot": ({"outcome-law"}, "standard-permuted-slots"),
    "seed-collision": ({"outcome-law"}, "standard-aligned-positions"),
    "bonus-after-reject": ({"structure"}, "greedy-ragged"),
    "placeholder-as-index": ({"structure"}, "standard-placeholder"),
    "noise-floor": ({"outcome-law"}, "standard-near-target"),
    "oov-lane-wins": ({"structure"}, "greedy-ragged"),
    "nan-row-out-of-vocab": ({"structure"}, "standard-nan-rows"),
    "synthetic-rates-as-conditional": ({"acceptance-length", "acceptance-rate[1]"}, "synthetic-mean-rate"),
    "synthetic-decay-too-low": ({"acceptance-rate[0]"}, "synthetic-mean-rate"),
    "greedy-bonus-sampled": ({"outcome-law"}, "greedy-ragged"),
    "block-token-wise": ({"outcome-law", "acceptance-length"}, "block-fixed"),
    "min-p-skipped": ({"outcome-law", "acceptance-length"}, "standard-min-p"),
    "logit-bias-skipped": ({"outcome-law"}, "standard-logit-bias"),
    "top-p-drops-boundary": ({"outcome-law", "position-law"}, "standard-top-p"),
    "top-p-before-temperature": ({"outcome-law"}, "standard-top-p"),
    "drafter-shares-noise": ({"position-law"}, "engine-drafted"),
    "drafter-after-processor": ({"draft-law"}, "engine-drafted"),
    "drafter-other-precision": ({"draft-law"}, "engine-drafted-offset"),
    "greedy-drafts-verified-with-probs": ({"position-law"}, "engine-greedy-drafter"),
    "typical-threshold-max": ({"outcome-law"}, "typical-fixed"),
    "fly-entropy-all-tokens": ({"outcome-law"}, "fly-fixed"),
    "fly-window-unchecked": ({"outcome-law"}, "fly-fixed"),
}


def test_every_fault_has_an_expectation():
    assert set(EXPECTED) == set(FAULTS)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_is_caught_by_the_ci_profile(fault):
    row = detect(fault, PROFILE, seed=0)
    assert not row.errors, row.errors
    must_checks, must_scenario = EXPECTED[fault]
    assert row.detected, f"{fault} was not caught by the ci profile"
    assert {family_of(c) for c in must_checks} & {f for f, hit in row.families.items() if hit}, f"{fault} caught only by {row.families}"
    assert must_scenario in row.scenarios, f"{fault} caught only in {row.scenarios}"
    # The strongest evidence is decisive: an exact violation or a p-value at most alpha.
    assert row.p_value is not None and row.p_value <= PROFILE.alpha

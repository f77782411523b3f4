"""Typical acceptance (vLLM V0's TypicalAcceptanceSampler, Medusa): the reference rule, its
exact laws, the reference sampler against them, the planted fault and the scenario fields."""

import dataclasses
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from scipy.stats import chi2

from harness.backends.vllm.mrv2 import _CurrentApi, _PerMethodApi
from harness.backends.vllm.v1 import VllmV1Backend
from harness.run.runner import run
from harness.scenarios.catalog import catalog
from harness.scenarios.materialize import materialize, trials
from harness.scenarios.profiles import get_profile
from harness.scenarios.scenario import RequestSpec, Scenario
from harness.scenarios.strategies import scenarios, without_mates
from harness.studies.detection import detect
from reference import typical
from reference.methods import Method
from reference.sampler import ReferenceSampler

R = RequestSpec
ALPHA = 1e-3  # the Monte Carlo chi-square tests' level

# A hand-worked example, V = 4, epsilon 0.09, delta 0.3 (vLLM V0's defaults):
#   row 0 [0.7, .1, .1, .1]:  H = -(0.7 ln 0.70001 + 3 * 0.1 ln 0.10001) = 0.94041,
#                             delta e^-H = 0.11713 -> threshold 0.09; draft 1 (0.1 > 0.09) kept
#   row 1 uniform:            H = -ln 0.25001 = 1.38625, delta e^-H = 0.075003 -> 0.075003;
#                             draft 3 (0.25) kept
#   row 2 [.05, .85, .05, .05]: H = 0.58746, delta e^-H = 0.16672 -> 0.09; draft 0 (0.05)
#                             rejected: the argmax, token 1, is emitted
#   row 3 the bonus row.
ROWS = np.array([[0.7, 0.1, 0.1, 0.1], [0.25] * 4, [0.05, 0.85, 0.05, 0.05], [0.1, 0.2, 0.3, 0.4]])


def test_rule_on_a_hand_computed_example():
    h = typical.entropy(ROWS[:3])
    by_hand = [
        -(0.7 * math.log(0.70001) + 3 * 0.1 * math.log(0.10001)),
        -math.log(0.25001),
        -(0.85 * math.log(0.85001) + 3 * 0.05 * math.log(0.05001)),
    ]
    np.testing.assert_allclose(h, by_hand, rtol=1e-12)
    np.testing.assert_allclose(h, [0.94041, 1.38625, 0.58746], atol=1e-5)
    np.testing.assert_allclose(typical.thresholds(ROWS[:3], 0.09, 0.3), [0.09, 0.075003, 0.09], atol=1e-6)
    np.testing.assert_allclose(0.3 * np.exp(-h), [0.11714, 0.075003, 0.16672], atol=1e-5)
    assert typical.accepts(ROWS[:3], [1, 3, 0], 0.09, 0.3).tolist() == [True, True, False]
    law = typical.fixed_draft_law(ROWS, [1, 3, 0])
    expected = np.zeros((4, 4))
    expected[2, 1] = 1.0  # two drafts kept, then row 2's argmax
    np.testing.assert_array_equal(law, expected)
    np.testing.assert_array_equal(typical.fixed_draft_law(ROWS, [1, 3, 1])[3], ROWS[3])  # all kept: the bonus row
    # epsilon 0.2: row 0's threshold is delta e^-H = 0.11714 > 0.1, draft 2 rejected at once: argmax 0
    np.testing.assert_array_equal(typical.fixed_draft_law(ROWS, [2, 0, 1], 0.2, 0.3)[0], [1.0, 0, 0, 0])


def test_rule_is_strict_has_v0s_log_epsilon_and_never_accepts_a_placeholder():
    uniform = np.full((1, 4), 0.25)
    # p(x) equal to the threshold (epsilon 0.25, delta large): rejected (V0: candidates_prob > threshold)
    assert not typical.accepts(uniform, [2], 0.25, 100.0)[0]
    assert typical.accepts(uniform, [2], 0.2499, 100.0)[0]
    one_hot = np.array([[0.0, 1.0, 0.0]])
    assert typical.entropy(one_hot)[0] == pytest.approx(-math.log(1 + 1e-5), rel=1e-12)  # the 1e-5 inside the log
    assert typical.recovered_tokens(np.array([[0.4, 0.4, 0.2]]))[0] == 0  # ties: the first maximal index (torch.argmax)
    assert not typical.accepts(uniform, [-1], 0.0, 0.0)[0]
    law = typical.fixed_draft_law(ROWS, [1, -1, 0])  # the placeholder's row acts as the bonus row
    np.testing.assert_array_equal(law[1], ROWS[1])
    assert law.sum() == pytest.approx(1.0)


def test_laws_sum_to_one_and_sampled_matches_the_mixture_over_drafts():
    rng = np.random.default_rng(4)
    for d in (0, 1, 3):
        target = rng.dirichlet(np.full(5, 0.5), size=d + 1)
        proposal = rng.dirichlet(np.full(5, 0.7), size=d)
        for eps, delta in ((0.09, 0.3), (0.2, 0.5), (0.0, 0.0), (1.0, 5.0)):
            law = typical.sampled_draft_law(target, proposal, eps, delta)
            assert law.sum() == pytest.approx(1.0, abs=1e-12)
            mixture = np.zeros_like(target)
            for x in np.ndindex(*(5,) * d):  # every draft sequence, weighted by its probability
                w = np.prod(proposal[np.arange(d), list(x)]) if d else 1.0
                fixed = typical.fixed_draft_law(target, list(x), eps, delta)
                assert fixed.sum() == pytest.approx(1.0, abs=1e-12)
                mixture += w * fixed
            np.testing.assert_allclose(law, mixture, atol=1e-12)


def _counts(scenario: Scenario, n: int):
    """(templates, per-template counts of (accepted, emitted token)) of ``n`` trials of the reference."""
    templates = materialize(scenario)
    batch = trials(scenario, templates, 0, n).batch.validate()
    tokens, emitted = ReferenceSampler().sample(batch)
    t = len(templates)
    out = []
    for i, tpl in enumerate(templates):
        e, tok = emitted[i::t], tokens[i::t]
        counts = np.zeros((tpl.num_drafts + 1, batch.vocab_size))
        np.add.at(counts, (e - 1, tok[np.arange(n), e - 1]), 1)
        out.append(counts)
    return templates, out


def _chi_square_p(observed: np.ndarray, law: np.ndarray) -> float:
    """p-value of Pearson's chi-square of ``observed`` against ``law``; 0 if an impossible cell was hit."""
    o, p = observed.ravel(), law.ravel()
    if o[p == 0].sum():
        return 0.0
    keep = p > 0
    e = p[keep] * o.sum()
    if keep.sum() == 1:
        return 1.0
    return float(chi2.sf(((o[keep] - e) ** 2 / e).sum(), keep.sum() - 1))


@pytest.mark.parametrize("draft_mode", ["fixed", "sampled"])
def test_reference_sampler_follows_the_exact_law(draft_mode):
    """Monte Carlo of the reference sampler: 20,000 trials per template, Pearson's chi-square
    at alpha = 1e-3 against the exact law (fixed drafts: a point mass but for the bonus)."""
    scenario = Scenario(
        "typical-mc", "typical", 6,
        (R(2, 1.0, "flat", "flat"), R(3, 1.0, "peaked", "near-target"), R(2, 0.7, "heavy-tail"), R(0, 1.0)),
        draft_mode=draft_mode, seed=11, posterior_threshold=0.15, posterior_alpha=0.4,
    )  # fmt: skip
    templates, counts = _counts(scenario, 20_000)
    for tpl, observed in zip(templates, counts):
        target = tpl.target_probs()
        if tpl.drafts is not None:
            law = typical.fixed_draft_law(target, tpl.drafts, 0.15, 0.4)
        else:
            law = typical.sampled_draft_law(target, tpl.sampling_probs(), 0.15, 0.4)
        assert law.sum() == pytest.approx(1.0)
        p = _chi_square_p(observed, law)
        assert p > ALPHA, (tpl.spec, p)


def test_catalog_scenarios_mix_acceptance_and_rejection_with_margins():
    """At the ci profile the typical scenarios accept some positions and reject others, each
    draft's probability at least 5% away from its threshold (float32 engines agree)."""
    found = [s for s in catalog(get_profile("ci")) if s.verify_method is Method.TYPICAL]
    assert [s.name for s in found] == ["typical-fixed", "typical-fixed-params"]
    outcomes = []  # (accepted, drafts) per template
    for s in found:
        for t in materialize(s):
            d = t.effective_drafts
            p = t.target_probs()
            thr = typical.thresholds(p[:d], *s.typical_params)
            p_x = p[np.arange(d), t.drafts[:d]]
            assert np.all(np.abs(p_x - thr) > 0.05 * thr)
            law = typical.fixed_draft_law(p[: d + 1], t.drafts[:d], *s.typical_params)
            outcomes.append((int(np.flatnonzero(law.sum(axis=-1))[0]), d))
    assert any(n == 0 for n, _ in outcomes)  # rejected at once
    assert any(0 < n < d for n, d in outcomes)  # some kept, then a rejection
    assert any(n == d for n, d in outcomes)  # all kept: a sampled bonus


def test_the_planted_fault_is_caught_by_the_typical_scenarios():
    profile = get_profile("ci")
    scenarios = [s for s in catalog(profile) if s.verify_method is Method.TYPICAL]
    row = detect("typical-threshold-max", profile, seed=0, scenarios=scenarios)
    assert not row.errors, row.errors
    assert row.detected and row.p_value is not None and row.p_value <= profile.alpha
    assert set(row.scenarios) == {"typical-fixed", "typical-fixed-params"}
    assert not run(["reference"], scenarios, profile).failed


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(posterior_threshold=-0.1), "scenario.posterior_threshold"),
        (dict(posterior_threshold=float("nan")), "scenario.posterior_threshold"),
        (dict(posterior_threshold="0.1"), "scenario.posterior_threshold"),
        (dict(posterior_threshold=True), "scenario.posterior_threshold"),
        (dict(posterior_alpha=float("inf")), "scenario.posterior_alpha"),
        (dict(posterior_alpha=-1), "scenario.posterior_alpha"),
        (dict(posterior_alpha=[0.3]), "scenario.posterior_alpha"),
        (dict(method="standard", posterior_alpha=0.3), "scenario.posterior_alpha"),
        (dict(method="block", posterior_threshold=0.3), "scenario.posterior_threshold"),
    ],
)
def test_bad_typical_fields_are_refused_naming_the_field(changes, field):
    base = dict(name="x", method="typical", vocab_size=8, requests=(R(2),))
    with pytest.raises(ValueError, match=rf"^{field}:"):
        Scenario(**{**base, **changes})
    data = {**base, **changes, "requests": [{"num_drafts": 2}]}
    if all(isinstance(v, (int, float, str, list)) and (not isinstance(v, float) or math.isfinite(v)) for v in changes.values()):
        with pytest.raises(ValueError, match=rf"^{field}:"):
            Scenario.from_json(json.dumps(data))


def test_law_parameters_are_checked():
    with pytest.raises(ValueError, match="^posterior_threshold:"):
        typical.fixed_draft_law(ROWS, [1, 3, 0], -1.0, 0.3)
    with pytest.raises(ValueError, match="^posterior_alpha:"):
        typical.fixed_draft_law(ROWS, [1, 3, 0], 0.09, float("nan"))
    with pytest.raises(ValueError, match="^drafts:"):
        typical.fixed_draft_law(ROWS, [1, 3, 4])


def test_fields_round_trip_and_other_scenarios_keep_their_json():
    s = Scenario("t", "typical", 8, (R(2),), posterior_threshold=0.2, posterior_alpha=0.5)
    assert Scenario.from_json(s.to_json()) == s and s.typical_params == (0.2, 0.5)
    plain = Scenario("t", "standard", 8, (R(2),))
    assert "posterior_threshold" not in plain.to_dict() and "posterior_alpha" not in plain.to_dict()
    assert Scenario("t", "typical", 8, (R(2),)).typical_params == (0.09, 0.3)  # vLLM V0's defaults


def test_batches_carry_the_parameters_and_other_backends_decline():
    s = Scenario("t", "standard", 8, (R(2), R(1, method="typical")), posterior_threshold=0.2, posterior_alpha=0.5)
    batch = trials(s, materialize(s), 0, 3).batch.validate()
    np.testing.assert_array_equal(batch.posterior_threshold, np.full(6, 0.2))
    alone = without_mates(batch, [1, 3])
    assert alone.methods.tolist() == [Method.TYPICAL] * 2 and alone.posterior_alpha.tolist() == [0.5, 0.5]
    plain = Scenario("p", "standard", 8, (R(2),))
    assert trials(plain, materialize(plain), 0, 1).batch.posterior_threshold is None
    with pytest.raises(ValueError, match="posterior_threshold"):
        dataclasses.replace(batch, posterior_alpha=None).validate()
    with pytest.raises(ValueError, match="posterior_alpha: every value"):
        dataclasses.replace(batch, posterior_alpha=np.full(6, -1.0)).validate()
    only = without_mates(batch, [1])
    v1 = object.__new__(VllmV1Backend)  # supports() names the method before reading the release
    assert v1.supports(only) == "typical acceptance: not implemented by vLLM V1 (V0's TypicalAcceptanceSampler was not carried over)"
    for api in (_CurrentApi, _PerMethodApi):
        assert api.supports(object.__new__(api), only) == "typical acceptance: not implemented by vLLM MRV2"


def test_the_triton_sampler_declines_typical_requests():
    pytest.importorskip("triton", reason="the Triton backend needs triton")
    from harness.backends.triton.backend import TritonBackend

    s = Scenario("t", "standard", 8, (R(2), R(1, method="typical")))
    batch = trials(s, materialize(s), 0, 2).batch
    assert TritonBackend(device="cpu").supports(batch) == "typical acceptance: not implemented by the Triton sampler"
    assert TritonBackend(device="cpu").supports(without_mates(batch, [0, 2])) is None


@settings(max_examples=25, deadline=None)
@given(scenario=scenarios(methods=("typical",), max_drafts=3))
def test_drawn_typical_scenarios_emit_only_what_the_law_allows(scenario):
    """Exact, no statistics: every trial's (accepted, token) lies in the law's support, and the
    drafts are kept only up to the first rejection (fixed, sampled and the reference's own drafts)."""
    templates = materialize(scenario)
    n = 200
    tr = trials(scenario, templates, 0, n)
    out = ReferenceSampler().sample(tr.batch.validate())
    tokens, emitted = out[0], out[1]
    t = len(templates)
    for i, tpl in enumerate(templates):
        if tpl.spec.degenerate:
            continue
        d = tpl.effective_drafts
        target = tpl.target_probs()[: d + 1]
        if tpl.drafts is not None:
            law = typical.fixed_draft_law(target, tpl.drafts[:d], *scenario.typical_params)
        else:
            law = typical.sampled_draft_law(target, tpl.sampling_probs()[:d], *scenario.typical_params)
        assert law.sum() == pytest.approx(1.0)
        e = emitted[i::t]
        y = tokens[i::t][np.arange(n), e - 1]
        assert np.all(law[e - 1, y] > 0), (tpl.spec, law, e, y)

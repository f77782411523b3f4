"""FLy (vLLM 0.33.0's ``rejection_sample_method="fly"``): the reference rule, its exact laws,
the reference sampler against them, the planted faults, the scenario and batch fields, and
vLLM's V1 and MRV2 samplers on one small FLy scenario under the Triton interpreter."""

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings

from harness.backends.vllm import env as vllm_env
from harness.backends.vllm import mrv2 as vllm_mrv2
from harness.backends.vllm import v1 as vllm_v1
from harness.checking.checks import gof_check
from harness.run.runner import run
from harness.sampling.tally import TemplateTally, add_outputs
from harness.scenarios.catalog import catalog, find
from harness.scenarios.materialize import materialize, trials
from harness.scenarios.profiles import get_profile
from harness.scenarios.scenario import RequestSpec, Scenario
from harness.scenarios.strategies import scenarios, without_mates
from harness.studies.detection import detect
from reference import fly, laws, rules
from reference.methods import Method
from reference.sampler import ReferenceSampler
from suites.helpers import failing_checks, vllm_backend

R = RequestSpec
MRV2 = "harness.backends.vllm.mrv2:VllmMrv2Backend"
V1 = "harness.backends.vllm.v1:VllmV1Backend"

# A hand-worked example, V = 3, W = 1, top-2 entropy, draft probabilities:
#   row 0 p = [.5, .3, .2], q = [.2, .6, .2], draft 1: native acceptance a0 = .3/.6 = .5,
#         H_2 = -(.5 ln .5 + .3 ln .3) = 0.70777
#   row 1 p = [.4, .35, .25], q = [.1, .5, .4], draft 2: a1 = .25/.4 = .625, H_2 = 0.73395
#   row 2 p = [.34, .33, .33], q = [.2, .6, .2], draft 1: a2 = .33/.6 = .55, H_2 = 0.73265
#   row 3 the bonus row [.1, .2, .7]
# Threshold 0.9: nothing defers, the standard law. Threshold 0.7: every row may defer.
#   From position 0: natively on to 1 with .5; overridden (row 1 accepts natively) on to 2
#   with .5 * .625 = .3125; else stop at 0 with .5 * .375 = .1875, emitting the residual
#   max(p - q, 0) = [.3, 0, 0]: token 0.
#   From 1 (reached with .5): on to 2 with .625; overridden (1 + 1 < 3 fits, row 2 accepts)
#   on to 3 with .375 * .55 = .20625; else stop with .16875: .5 * .16875 = .084375.
#   At 2 (reached with .3125 + .5 * .625 = .625): the last draft, no window fits: on to the
#   bonus with .55, stop with .45: .28125. The bonus: .5 * .20625 + .625 * .55 = .446875.
P = np.array([[0.5, 0.3, 0.2], [0.4, 0.35, 0.25], [0.34, 0.33, 0.33], [0.1, 0.2, 0.7]])
Q = np.array([[0.2, 0.6, 0.2], [0.1, 0.5, 0.4], [0.2, 0.6, 0.2]])
X = np.array([1, 2, 1])


def test_entropy_on_hand_computed_rows():
    h2 = fly.topk_entropy(P[:3], 2)
    by_hand = [
        -(0.5 * math.log(0.5) + 0.3 * math.log(0.3)),
        -(0.4 * math.log(0.4) + 0.35 * math.log(0.35)),
        -(0.34 * math.log(0.34) + 0.33 * math.log(0.33)),
    ]
    np.testing.assert_allclose(h2, by_hand, rtol=1e-12)
    np.testing.assert_allclose(h2, [0.70777, 0.73395, 0.73265], atol=1e-5)
    assert fly.topk_entropy(np.array([[0.0, 1.0, 0.0]]), 3)[0] == 0.0  # 0 log 0 = 0, the terms not renormalized
    assert fly.topk_entropy(np.array([[0.5, 0.5]]), 7)[0] == pytest.approx(math.log(2))  # top-k past V: min(k, V)
    assert fly.topk_entropy(np.array([[0.5, 0.25, 0.25]]), 2)[0] == pytest.approx(0.5 * math.log(2) + 0.25 * math.log(4))  # ties


def test_law_on_a_hand_computed_example():
    np.testing.assert_allclose(rules.acceptance_probability(P[:3], Q, X), [0.5, 0.625, 0.55], atol=1e-15)
    no_defer = fly.fixed_draft_law(P, Q, X, 1, 0.9, 2)
    np.testing.assert_allclose(no_defer, laws.fixed_draft_law(Method.STANDARD, P, Q, X), atol=1e-15)  # nothing defers: standard
    law = fly.fixed_draft_law(P, Q, X, 1, 0.7, 2)
    np.testing.assert_allclose(law.sum(axis=-1), [0.1875, 0.084375, 0.28125, 0.446875], atol=1e-15)
    np.testing.assert_allclose(law[0], [0.1875, 0, 0], atol=1e-15)
    np.testing.assert_allclose(law[3], 0.446875 * P[3], atol=1e-15)
    assert law.sum() == pytest.approx(1.0, abs=1e-15)
    # W = 2: only position 0's window fits (0 + 2 < 3) and needs rows 1 and 2: .5 * .625 * .55
    np.testing.assert_allclose(fly.fixed_draft_law(P, Q, X, 2, 0.7, 2)[0].sum(), 0.5 * (1 - 0.625 * 0.55), atol=1e-15)


def test_rule_details_read_from_vllm():
    p = np.array([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.5, 0.5, 0.0]])
    h = fly.topk_entropy(p, 3)[0]  # ln 2
    # the threshold is non-strict (entropy >= threshold defers), p(x) = 0 and q(x) = 0 never defer
    assert fly.deferrable(p, None, [0, 2, -1], h, 3).tolist() == [True, False, False]
    assert fly.deferrable(p[:1], None, [0], np.nextafter(h, 1), 3).tolist() == [False]
    assert fly.deferrable(p, np.array([[1.0, 0, 0], [0, 1.0, 0], [1.0, 0, 0]]), [0, 0, 1], 0.0, 3).tolist() == [True, False, False]
    # a greedy row reads no draft probability
    assert fly.deferrable(p[:1], np.array([[0.0, 1.0, 0.0]]), [0], 0.0, 3, greedy=True).tolist() == [True]
    # a window must fit before the first placeholder: i + W < n
    native = np.array([[False, True, True, False]])
    assert fly.passes(native, np.ones_like(native), [4], 1).tolist() == [[True, True, True, False]]
    assert fly.passes(native, np.ones_like(native), [4], 2).tolist() == [[True, True, True, False]]
    assert fly.passes(native, np.ones_like(native), [4], 3).tolist() == [[False, True, True, False]]  # 0 + 3 < 4 but row 3 rejects
    assert fly.passes(native, np.ones_like(native), [3], 2).tolist() == [[True, True, True, False]]
    assert fly.passes(native, np.ones_like(native), [2], 2).tolist() == [[False, True, True, False]]  # 0 + 2 < 2 fails


def _v1_prepass(native, deferred, slots, w):
    """vLLM V1 (``fly.py::apply_fly_random_acceptance_kernel``): every position decided alone
    from the native decisions, then the native kernel stops at the first position neither
    natively accepted nor overridden."""
    for i in range(slots):
        window = i + w < slots and all(native[i + 1 : i + 1 + w])
        if not (native[i] or (deferred[i] and window)):
            return i
    return slots


def _mrv2_loop(native, deferred, slots, w):
    """vLLM MRV2 (``rejection_sampler_utils.py::_rejection_kernel``, ``FLY_WINDOW_SIZE > 0``),
    transcribed: a pending window that only native acceptances confirm."""
    accepted, pending, verifying = 0, -1, True
    for i in range(slots):
        if not verifying:
            break
        if pending >= 0:
            verifying = native[i]
            if native[i] and i - pending == w:
                accepted, pending = i + 1, -1
        elif native[i]:
            accepted = i + 1
        else:
            verifying = deferred[i] and i + w < slots
            if verifying:
                pending = i
    return accepted


def test_passes_is_v1s_prepass_and_mrv2s_sequential_loop():
    """Exhaustively for up to 5 draft slots (a placeholder: neither native nor deferrable, and
    the drafts end there), every window 1..4: ``fly.passes`` accepts what both kernels accept."""
    for slots in range(6):
        for bits in itertools.product((0, 1), repeat=2 * slots):
            native = np.array(bits[:slots], dtype=bool)
            deferred = np.array(bits[slots:], dtype=bool)
            for hole in [None, *range(slots)]:
                nat, dfr = native.copy(), deferred.copy()
                n = slots if hole is None else hole
                nat[n:], dfr[n:] = False, False  # at and past the first placeholder
                for w in range(1, 5):
                    ok = fly.passes(nat[None], dfr[None], [n], w)[0]
                    mine = int(np.argmin(np.append(ok[:n], False)))
                    assert mine == _v1_prepass(nat, dfr, slots, w) == _mrv2_loop(nat, dfr, slots, w), (nat, dfr, n, w)


def test_laws_sum_to_one_and_sampled_matches_the_mixture_over_drafts():
    rng = np.random.default_rng(4)
    for d, visible, greedy in itertools.product((0, 1, 3), (True, False), (False, True)):
        target = rng.dirichlet(np.full(4, 0.6), size=d + 1)
        gate = None
        if greedy:
            gate = target
            target = np.eye(4)[np.argmax(gate, axis=1)]
        proposal = rng.dirichlet(np.full(4, 0.8), size=d)
        for w, thr, k in ((1, 0.3, 3), (2, 0.0, 1), (1, 0.6, 2), (3, 1e9, 3)):
            law = fly.sampled_draft_law(target, proposal, w, thr, k, visible, gate)
            assert law.sum() == pytest.approx(1.0, abs=1e-12)
            mixture = np.zeros_like(target)
            for x in np.ndindex(*(4,) * d):  # every draft sequence, weighted by its probability
                weight = np.prod(proposal[np.arange(d), list(x)]) if d else 1.0
                fixed = fly.fixed_draft_law(target, proposal if visible else None, list(x), w, thr, k, gate)
                assert fixed.sum() == pytest.approx(1.0, abs=1e-12)
                mixture += weight * fixed
            np.testing.assert_allclose(law, mixture, atol=1e-12)


def test_a_placeholder_ends_the_drafts_and_every_window():
    p = np.full((4, 3), 1 / 3)
    q = np.array([[0.6, 0.2, 0.2], [0.2, 0.6, 0.2], [0.2, 0.2, 0.6]])
    law = fly.fixed_draft_law(p, q, [0, 1, -1], 1, 0.0, 3)
    assert law[2].sum() > 0 and law[3].sum() == 0  # the placeholder's row is the bonus row
    np.testing.assert_allclose(law[2] / law[2].sum(), p[2])
    # position 0's override (row 1 accepts) lands on the placeholder's row; position 1 cannot
    # defer (its window would be the placeholder): its rejection stops there
    a = 1 / 3 / 0.6
    np.testing.assert_allclose(law.sum(axis=-1), [(1 - a) * (1 - a), a * (1 - a), (1 - a) * a + a * a, 0], atol=1e-15)


def _tallies(scenario, n):
    templates = materialize(scenario)
    tr = trials(scenario, templates, 0, n)
    tokens, emitted = ReferenceSampler().sample(tr.batch.validate())
    tallies = [TemplateTally(t.effective_drafts, scenario.vocab_size) for t in templates]
    add_outputs(tallies, tokens, emitted, tr.drafts, 0)
    return templates, tallies


def _law(scenario, t):
    d = t.effective_drafts
    target = t.target_probs()[: d + 1]
    gate = t.fly_gate_probs()
    gate = None if gate is None else gate[: d + 1]
    if t.drafts is not None:
        visible = t.visible_draft_probs()[:d] if scenario.draft_probs else None
        return fly.fixed_draft_law(target, visible, t.drafts[:d], *scenario.fly_params, greedy_rows=gate)
    return fly.sampled_draft_law(target, t.sampling_probs()[:d], *scenario.fly_params, scenario.draft_probs, gate)


# The Monte Carlo test of the reference sampler: each template's outcome law by the suite's
# own chi-square check (harness.checking.checks.gof_check) at alpha = 1e-3, with the trials
# that detect a TV of 0.05 with power 0.99 (its design count, 2,000 to 8,000 here).
MC_PROFILE = dataclasses.replace(get_profile("ci"), alpha=1e-3, power=0.99, tv=0.05)


@pytest.mark.parametrize("draft_mode", ["fixed", "sampled"])
@pytest.mark.parametrize("draft_probs", [True, False])
def test_reference_sampler_follows_the_exact_law(draft_mode, draft_probs):
    requests = (
        R(4, 1.0, "heavy-tail", "flat"),
        R(3, 0.7, "flat", "near-target"),
        R(3, 0, "flat", "flat"),
        R(4, 1.3, "peaked", "flat", placeholder_at=2 if draft_mode == "fixed" else None),
        R(2, 1.0, "peaked", method="standard"),  # a standard mate: each request follows its own method
        R(0, 1.0),
    )
    scenario = Scenario(
        "fly-mc", "fly", 5, requests, draft_mode=draft_mode, draft_probs=draft_probs, seed=11,
        fly_window_size=2, fly_entropy_threshold=0.5, fly_entropy_top_k=2,
    )  # fmt: skip
    templates = materialize(scenario)
    checks = []
    for i, t in enumerate(templates):
        if t.method is Method.FLY:
            law = _law(scenario, t)
        elif t.drafts is not None:
            law = laws.fixed_draft_law(t.method, t.target_probs(), t.visible_draft_probs() if draft_probs else None, t.drafts)
        else:
            law = laws.sampled_draft_law(t.method, t.target_probs(), t.sampling_probs(), draft_probs)
        assert law.sum() == pytest.approx(1.0, abs=1e-12)
        checks.append(gof_check("outcome-law", i, law, str, MC_PROFILE, lambda tally: tally.outcome))
    n = max(c.design_trials for c in checks)
    _, tallies = _tallies(scenario, n)
    rng = np.random.default_rng(0)
    for check, tally in zip(checks, tallies):
        outcome = check.evaluate(tally, rng)
        assert tally.violations == 0
        if check.kind == "exact":
            assert not outcome.deviated, (templates[check.template].spec, outcome.message)
        else:
            assert outcome.p_value > MC_PROFILE.alpha, (templates[check.template].spec, outcome.message, outcome.cells)
            assert outcome.detectable_tv <= MC_PROFILE.tv * 1.05


def test_catalog_scenarios_override_often_with_entropy_margins():
    """In the CPU profiles the FLy scenarios are the same (V = 6, one seed): overrides move much
    of the law, every gate's entropy is at least 5% away from its threshold (float32 engines
    agree), top-3 and all-token entropies straddle the threshold in one template, and the
    greedy requests do what their comment says."""
    for profile in ("smoke", "ci"):
        found = [s for s in catalog(get_profile(profile)) if s.verify_method is Method.FLY]
        assert [s.name for s in found] == ["fly-fixed", "fly-sampled"]
        moved, straddle = [], []
        for s in found:
            w, thr, k = s.fly_params
            for t in materialize(s):
                d = t.effective_drafts
                gate = t.fly_gate_probs() if t.spec.temperature == 0 else t.target_probs()
                h = fly.topk_entropy(gate[:d], k)
                assert np.all(np.abs(h - thr) > 0.05 * thr), (s.name, t.spec, h)
                law = _law(s, t)
                native = _law(dataclasses.replace(s, fly_entropy_threshold=1e300), t)
                moved.append(0.5 * np.abs(law - native).sum())
                if t.drafts is not None and d and t.spec.temperature > 0:  # the fault fly-entropy-all-tokens
                    all_tokens = fly.fixed_draft_law(t.target_probs()[: d + 1], t.visible_draft_probs()[:d], t.drafts[:d], w, thr, 1 << 20)
                    straddle.append(0.5 * np.abs(law - all_tokens).sum())
        assert sum(m > 0.3 for m in moved) >= 5 and max(straddle) > 0.15
        fixed = materialize(found[0])
        outcomes = [
            (int(np.flatnonzero(_law(found[0], t).sum(axis=-1))[0]), int(np.argmax(_law(found[0], t).max(axis=0)))) for t in fixed[1:4]
        ]
        assert outcomes == [(3, 0), (2, 2), (0, 5)]  # accepted whole, stopped at row 2 (placeholder next), window failed


def test_the_planted_faults_are_caught_by_the_fly_scenarios():
    profile = get_profile("ci")
    found = [s for s in catalog(profile) if s.verify_method is Method.FLY]
    for fault, names in (("fly-entropy-all-tokens", {"fly-fixed"}), ("fly-window-unchecked", {"fly-fixed", "fly-sampled"})):
        row = detect(fault, profile, seed=0, scenarios=found)
        assert not row.errors, row.errors
        assert row.detected and row.p_value is not None and row.p_value <= profile.alpha
        assert set(row.scenarios) == names, (fault, row.scenarios)
    assert not run(["reference"], found, profile).failed


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(fly_window_size=0), "scenario.fly_window_size"),
        (dict(fly_window_size=2.0), "scenario.fly_window_size"),
        (dict(fly_window_size=True), "scenario.fly_window_size"),
        (dict(fly_window_size=33), "scenario.fly_window_size"),
        (dict(fly_entropy_threshold=-0.1), "scenario.fly_entropy_threshold"),
        (dict(fly_entropy_threshold=float("nan")), "scenario.fly_entropy_threshold"),
        (dict(fly_entropy_threshold="0.3"), "scenario.fly_entropy_threshold"),
        (dict(fly_entropy_top_k=0), "scenario.fly_entropy_top_k"),
        (dict(fly_entropy_top_k=1.5), "scenario.fly_entropy_top_k"),
        (dict(method="standard", fly_window_size=1), "scenario.fly_window_size"),
        (dict(method="typical", fly_entropy_top_k=2), "scenario.fly_entropy_top_k"),
        (dict(draft_mode="engine"), "scenario.draft_mode"),
        (dict(requests=(R(2, 0, top_k=2),)), r"scenario.requests\[0\].temperature"),
        (dict(requests=(R(2, 0, logit_bias={1: 2.0}),)), r"scenario.requests\[0\].temperature"),
    ],
)
def test_bad_fly_fields_are_refused_naming_the_field(changes, field):
    base = dict(name="x", method="fly", vocab_size=8, requests=(R(2),))
    with pytest.raises(ValueError, match=rf"^{field}:"):
        Scenario(**{**base, **changes})
    if all(isinstance(v, (int, float, str)) and (not isinstance(v, float) or math.isfinite(v)) for v in changes.values()):
        with pytest.raises(ValueError, match=rf"^{field}:"):
            Scenario.from_json(json.dumps({**base, **changes, "requests": [{"num_drafts": 2}]}))


def test_law_parameters_are_checked():
    for args, name in (((0, 0.3, 3), "fly_window_size"), ((1, -1.0, 3), "fly_entropy_threshold"), ((1, 0.3, 0), "fly_entropy_top_k")):
        with pytest.raises(ValueError, match=f"^{name}:"):
            fly.fixed_draft_law(P, Q, X, *args)
    with pytest.raises(ValueError, match="^drafts:"):
        fly.fixed_draft_law(P, Q, [1, 2, 3], 1)
    with pytest.raises(ValueError, match="^greedy_rows:"):
        fly.fixed_draft_law(P, Q, X, 1, greedy_rows=P[:2])
    with pytest.raises(ValueError, match="^method: FLy's law"):  # the per-step laws would be a standard law
        laws.fixed_draft_law(Method.FLY, P, Q, X)


def test_fields_round_trip_and_other_scenarios_keep_their_json():
    s = Scenario("t", "fly", 8, (R(3),), fly_window_size=2, fly_entropy_threshold=0.5, fly_entropy_top_k=4)
    assert Scenario.from_json(s.to_json()) == s and s.fly_params == (2, 0.5, 4)
    assert not {"fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k"} & set(Scenario("t", "standard", 8, (R(2),)).to_dict())
    assert Scenario("t", "fly", 8, (R(4),)).fly_params == (3, 0.3, 3)  # vLLM's defaults: min(6, K - 1), 0.3, 3
    assert Scenario("t", "fly", 8, (R(1),)).fly_params[0] == 1 and Scenario("t", "fly", 8, (R(9),)).fly_params[0] == 6


def _fly_and_standard_batch():
    s = Scenario("t", "standard", 8, (R(2), R(3, method="fly")), fly_window_size=2, fly_entropy_threshold=0.4)
    return trials(s, materialize(s), 0, 3).batch.validate()


def test_batches_carry_the_parameters():
    batch = _fly_and_standard_batch()
    assert batch.fly_window_size.dtype == np.int64 and batch.fly_window_size.tolist() == [2] * 6
    np.testing.assert_array_equal(batch.fly_entropy_threshold, np.full(6, 0.4))
    assert batch.fly_entropy_top_k.tolist() == [3] * 6
    alone = without_mates(batch, [1, 3])
    assert alone.methods.tolist() == [Method.FLY] * 2 and alone.fly_window_size.tolist() == [2, 2]
    assert without_mates(batch, [0, 2]).fly_window_size is None
    plain = Scenario("p", "standard", 8, (R(2),))
    assert trials(plain, materialize(plain), 0, 1).batch.fly_entropy_top_k is None
    with pytest.raises(ValueError, match="fly_window_size, fly_entropy_threshold, fly_entropy_top_k: given"):
        dataclasses.replace(batch, fly_entropy_top_k=None).validate()
    with pytest.raises(ValueError, match="^fly_window_size: expected"):
        dataclasses.replace(batch, fly_window_size=np.zeros(6, np.int64)).validate()
    with pytest.raises(ValueError, match="^fly_entropy_threshold: expected"):
        dataclasses.replace(batch, fly_entropy_threshold=np.full(6, np.inf)).validate()
    with pytest.raises(ValueError, match="^fly_entropy_top_k: expected"):
        dataclasses.replace(batch, fly_entropy_top_k=np.full(6, 3.0)).validate()


def test_device_batches_carry_the_parameters():
    torch = pytest.importorskip("torch")
    from harness.sampling.device.trials import DeviceTrials

    s = Scenario("t", "standard", 8, (R(2), R(3, method="fly")), fly_window_size=2, fly_entropy_threshold=0.4)
    built = DeviceTrials(s, materialize(s), "cpu")
    built.prepare(3)
    batch, _ = built.chunk(0, 3)
    host = trials(s, materialize(s), 0, 3).batch
    for name in ("fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k"):
        assert isinstance(getattr(batch, name), torch.Tensor)
        np.testing.assert_array_equal(getattr(batch, name).numpy(), getattr(host, name))


def test_backends_without_fly_decline_it_with_a_reason():
    only = without_mates(_fly_and_standard_batch(), [1])
    v1 = object.__new__(vllm_v1.VllmV1Backend)
    v1._params = ["draft_token_ids", "synthetic_mode"]  # a release before 0.33.0
    assert v1.supports(only) == (
        "this vLLM's V1 rejection_sample has no FLy (fly_window_size, fly_entropy_threshold, fly_entropy_top_k: vLLM 0.33.0+)"
    )
    api = object.__new__(vllm_mrv2._CurrentApi)
    api.params = ["target_logits", "use_block_verification"]
    assert api.supports(only).startswith("this vLLM's MRV2 rejection_sample has no FLy")
    per_method = object.__new__(vllm_mrv2._PerMethodApi)
    assert "has no FLy" in per_method.supports(only)
    # one set of parameters per batch, as vLLM's config gives it
    mixed = dataclasses.replace(only, fly_window_size=np.array([1], np.int64))
    two = without_mates(_fly_and_standard_batch(), [1, 3])
    two = dataclasses.replace(two, fly_window_size=np.array([1, 2], np.int64))
    assert vllm_env.fly_kwargs(mixed, vllm_env.FLY_ARGS, "f") == (
        {"fly_window_size": 1, "fly_entropy_threshold": 0.4, "fly_entropy_top_k": 3},
        None,
    )
    assert vllm_env.fly_kwargs(two, vllm_env.FLY_ARGS, "f")[1].startswith("per-request FLy parameters")


def test_the_triton_sampler_declines_fly_requests():
    pytest.importorskip("triton", reason="the Triton backend needs triton")
    from harness.backends.triton.backend import TritonBackend

    batch = _fly_and_standard_batch()
    assert TritonBackend(device="cpu").supports(batch) == "FLy: not implemented by the Triton sampler"
    assert TritonBackend(device="cpu").supports(without_mates(batch, [0, 2])) is None


@settings(max_examples=25, deadline=None)
@given(scenario=scenarios(methods=("fly",), max_drafts=4))
def test_drawn_fly_scenarios_emit_only_what_the_law_allows(scenario):
    """Exact, no statistics: every trial's (accepted, token) lies in the law's support (fixed and
    sampled drafts, greedy rows, placeholders, any window, threshold and top-k drawn)."""
    templates = materialize(scenario)
    n = 200
    tokens, emitted = ReferenceSampler().sample(trials(scenario, templates, 0, n).batch.validate())
    t = len(templates)
    for i, tpl in enumerate(templates):
        if tpl.spec.degenerate:
            continue
        law = _law(scenario, tpl)
        assert law.sum() == pytest.approx(1.0)
        e = emitted[i::t]
        y = tokens[i::t][np.arange(n), e - 1]
        assert np.all(law[e - 1, y] > 0), (tpl.spec, law, e, y)


# --- vLLM 0.33.0 under the Triton interpreter ---------------------------------------------------
def _fly_fixed_prefix(templates: int = 4) -> Scenario:
    """``fly-fixed`` (smoke) cut to its first templates (the same seed: their logits and drafts
    are unchanged): one sampled request and the three greedy ones (an override accepted whole,
    one before a placeholder, a failed window). ~2 minutes a backend under the interpreter."""
    s = find(catalog(get_profile("smoke")), "fly-fixed")
    return dataclasses.replace(s, requests=s.requests[:templates])


@pytest.fixture(scope="module")
def mrv2():
    return vllm_backend(vllm_mrv2, "VllmMrv2Backend")


@pytest.fixture(scope="module")
def v1():
    return vllm_backend(vllm_v1, "VllmV1Backend")


@pytest.mark.parametrize("which", ["v1", "mrv2"])
def test_vllm_greedy_fly_equals_the_reference_exactly(which, request):
    """Greedy FLy is deterministic: vLLM must emit exactly the reference's tokens."""
    backend = request.getfixturevalue(which)
    s = _fly_fixed_prefix()
    batch = trials(s, materialize(s), 0, 4).batch
    assert backend.supports(batch) is None
    tokens, emitted = (np.asarray(x.cpu()) for x in backend.sample(batch))
    ref_tokens, ref_emitted = ReferenceSampler().sample(batch)
    greedy = batch.temperature == 0
    np.testing.assert_array_equal(emitted[greedy], ref_emitted[greedy])
    shown = np.arange(tokens.shape[1])[None, :] < ref_emitted[:, None]
    np.testing.assert_array_equal(np.where(shown, tokens, -1)[greedy], ref_tokens[greedy])
    assert ref_emitted[greedy].tolist()[:3] == [4, 3, 1]  # the greedy templates' designed outcomes


@pytest.mark.slow
@pytest.mark.parametrize("dotted, which", [(V1, "v1"), (MRV2, "mrv2")])
def test_vllm_fly_follows_the_law_at_smoke(dotted, which, request):
    """The sampled request of ``fly-fixed`` (its overrides move the law by TV 0.54 from the
    native one) through the runner; the greedy ones are checked exactly above."""
    request.getfixturevalue(which)  # skips, with the reason, when vLLM is not usable
    bad = failing_checks(dotted, _fly_fixed_prefix(1), get_profile("smoke"))
    assert not bad, "\n".join(bad)


def test_residual_of_a_stop_is_the_native_one():
    """After a rejection that stays one, the token is drawn from ``max(p - q, 0)`` (or p without
    the draft), whatever FLy decided before: the law's emitted rows are the residuals."""
    law = fly.fixed_draft_law(P, Q, X, 1, 0.7, 2)
    for i in range(3):
        resid = rules.residual_weights(P[i][None], Q[i][None], [X[i]])[0]
        np.testing.assert_allclose(law[i] / law[i].sum(), resid / resid.sum(), atol=1e-14)

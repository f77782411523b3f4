"""The reference sampler against its exact laws, and its determinism and tail reach."""

import dataclasses

import numpy as np
import pytest

from harness.checking import stats
from harness.protocol import VerifyBatch
from harness.run.runner import run
from harness.scenarios.catalog import catalog
from harness.scenarios.materialize import materialize, trials
from harness.scenarios.profiles import get_profile
from harness.scenarios.scenario import RequestSpec, Scenario
from reference.distributions import RepeatingRows, repeat_period, softmax_rows
from reference.methods import Method
from reference.rng import Stream, uniforms
from reference.rules import draw_from_row, inverse_cdf
from reference.sampler import ReferenceSampler

PROFILE = get_profile("ci")


@pytest.fixture(scope="module")
def ci_run():
    return run(["reference"], catalog(PROFILE, seed=0), PROFILE, seed=0)


def test_reference_passes_every_check_of_the_ci_catalog(ci_run):
    bad = [(r.scenario, r.template, r.check, r.verdict, r.message) for r in ci_run.records if r.verdict != "pass"]
    assert not bad, bad
    methods = {r.method for r in ci_run.records}
    assert methods == {"greedy", "strict", "standard", "block", "synthetic", "typical", "fly"}
    assert len({r.scenario for r in ci_run.records}) >= 25


def test_every_check_has_the_profile_power(ci_run):
    """Trial counts come from the calculator: every check detects the profile's TV."""
    for r in ci_run.records:
        assert r.detectable_tv <= PROFILE.tv + 1e-12, (r.scenario, r.check, r.detectable_tv, r.trials)
        if r.kind in ("gof", "binomial"):
            assert r.alpha == PROFILE.alpha and r.holm_threshold >= PROFILE.alpha


@pytest.mark.parametrize("seed", range(8))
def test_random_scenarios_pass(seed):
    """Scenarios beyond the catalog: random families, counts, temperatures and methods."""
    rng = np.random.default_rng(seed)
    method = ["standard", "strict", "block", "greedy"][seed % 4]
    families = ["peaked", "flat", "heavy-tail", "topk", "tied"]
    reqs = tuple(
        RequestSpec(
            int(rng.integers(0, 4)),
            0 if method == "greedy" else float(rng.choice([0.5, 1.0, 1.7])),
            str(rng.choice(families)),
            str(rng.choice(families + ["near-target", "disjoint"])),
        )
        for _ in range(3)
    )
    draft_mode = "sampled" if seed % 3 == 0 else "fixed"
    scenario = Scenario(
        f"random-{seed}", method, int(rng.integers(3, 9)), reqs, draft_mode=draft_mode, draft_probs=bool(seed % 2), seed=seed
    )
    result = run(["reference"], [scenario], get_profile("smoke"), seed=seed)
    assert not result.failed, [(r.check, r.message) for r in result.records if r.verdict != "pass"]


def test_same_seed_same_counts_and_verdicts():
    scenarios = catalog(get_profile("smoke"), seed=3)[:6]
    a = run(["reference"], scenarios, get_profile("smoke"), seed=3)
    b = run(["reference"], scenarios, get_profile("smoke"), seed=3)
    assert [(r.statistic, r.p_value, r.verdict) for r in a.records] == [(r.statistic, r.p_value, r.verdict) for r in b.records]


def _batch(templates_scenario, count, first=0):
    templates = materialize(templates_scenario)
    return trials(templates_scenario, templates, first, count).batch


def _subset(batch: VerifyBatch, keep: np.ndarray) -> VerifyBatch:
    """The same requests without their batch mates."""
    counts = batch.num_drafts
    row_start = batch.cu_num_drafts[:-1] + np.arange(batch.num_requests)
    rows = np.concatenate([np.arange(row_start[r], row_start[r] + counts[r] + 1) for r in keep])
    drafts = np.concatenate([np.arange(batch.cu_num_drafts[r], batch.cu_num_drafts[r + 1]) for r in keep])
    return VerifyBatch(
        batch.target_logits[rows], None if batch.draft_logits is None else batch.draft_logits[drafts], batch.draft_tokens[drafts],
        np.concatenate([[0], np.cumsum(counts[keep])]), batch.temperature[keep], batch.seeds[keep], batch.positions[rows],
        batch.methods[keep], None if batch.synthetic_rates is None else batch.synthetic_rates[keep], batch.max_drafts,
    )  # fmt: skip


@pytest.mark.parametrize("method", ["standard", "strict", "block"])
def test_output_does_not_depend_on_batch_mates(method):
    """Nor on whether its rows repeat: the sampler computes a batch of trials' probabilities
    once per period of their rows (``RepeatingRows``); a request alone has no period."""
    scenario = Scenario("mates", method, 9, (RequestSpec(3), RequestSpec(1, 0.7, "flat"), RequestSpec(0)), draft_mode="sampled", seed=4)
    batch = _batch(scenario, 40)
    assert repeat_period(batch.target_logits, np.repeat(batch.temperature, batch.num_drafts + 1)) == 4 + 2 + 1
    tokens, emitted = ReferenceSampler().sample(batch.validate())
    for keep in (np.arange(batch.num_requests)[::7], [0], [1], [2], [61], [119]):
        sub_tokens, sub_emitted = ReferenceSampler().sample(_subset(batch, np.asarray(keep)).validate())
        np.testing.assert_array_equal(sub_emitted, emitted[keep])
        np.testing.assert_array_equal(sub_tokens, tokens[keep])


def test_uniforms_are_never_zero_or_one():
    u = uniforms(np.arange(200_000), np.arange(200_000) * 7, Stream.ACCEPT)
    assert u.min() > 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 5 * np.sqrt(1 / 12 / u.size)


def test_inverse_cdf_reaches_the_far_tail():
    """vLLM #43150: fp32 noise never drew tokens ~17 nats below the max. Here 2**18 tail
    tokens, each ~1e-10 of the mass (23 nats below the head), are drawn at their total rate."""
    vocab = 1 << 18
    logits = np.full(vocab, -23.0)
    logits[0] = 0.0
    p = np.exp(logits)
    p /= p.sum()
    tail = 1 - p[0]  # ~2.7e-5 in all
    n = 4_000_000  # ~107 expected tail draws: starving the tail fails at p ~ e^-107
    draws = draw_from_row(p, uniforms(np.arange(n), 0, Stream.RESIDUAL))
    hits = int((draws > 0).sum())
    assert stats.binomial_test(hits, n, tail) > 1e-6, (hits, n * tail)


def test_one_row_and_many_row_draws_agree():
    rng = np.random.default_rng(0)
    w = rng.random(50) ** 4
    w[[3, 17, 49]] = 0.0
    u = uniforms(np.arange(5000), 1, Stream.RESIDUAL)
    np.testing.assert_array_equal(draw_from_row(w, u), inverse_cdf(np.broadcast_to(w, (u.size, w.size)), u))


def test_placeholder_is_never_accepted_and_ends_the_drafts():
    scenario = Scenario("holes", "standard", 6, (RequestSpec(3, placeholder_at=1),), seed=2)
    batch = _batch(scenario, 2000)
    tokens, emitted = ReferenceSampler().sample(batch.validate())
    assert emitted.max() <= 2 and (tokens >= -1).all()
    assert not (tokens[:, :2] == -1).any()


def test_method_codes_cover_the_protocol():
    assert {m.name for m in Method} == {"STANDARD", "STRICT", "BLOCK", "SYNTHETIC", "TYPICAL", "FLY"}


def test_mixed_batch_with_degenerate_rows_low_precision_and_scattered_slots():
    """Greedy, standard and synthetic requests in one batch, bf16 logits, permuted slots;
    degenerate (NaN / all-masked) templates get only the structure check."""
    r = RequestSpec
    scenario = Scenario(
        "mixed", "standard", 10,
        (r(2, 0, "peaked", method="greedy"), r(3, 1.0, method="synthetic"), r(2, 1.0), r(1, 1.0, draft_ids=(3,)), r(2, 1.0, nan_rows=(1,)), r(2, 1.0, masked_rows=(0,))),
        synthetic={"rates": [0.9, 0.5, 0.2]}, dtype="bfloat16", slots="permuted", seed=3,
    )  # fmt: skip
    result = run(["reference"], [scenario], get_profile("smoke"))
    assert not result.failed
    assert {r.check for r in result.records if r.template >= 4} == {"structure"}
    assert {r.check for r in result.records if r.template == 1} >= {"acceptance-length", "acceptance-rate[2]"}


def test_bfloat16_rounding_is_exact_in_torch():
    import torch

    from harness.scenarios.materialize import round_to_dtype

    x = np.random.default_rng(0).normal(0, 3, 1000).astype(np.float32)
    for dtype in ("bfloat16", "float16"):
        rounded = round_to_dtype(x, dtype)
        back = torch.from_numpy(rounded).to(getattr(torch, dtype)).float().numpy()
        np.testing.assert_array_equal(back, rounded)
        np.testing.assert_array_equal(torch.from_numpy(x).to(getattr(torch, dtype)).float().numpy(), rounded)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_softmax_of_repeated_rows_equals_each_rows_own(dtype):
    """``softmax_rows`` computes one period of a batch whose rows repeat and tiles it: every
    row, NaN, all-masked and greedy ones included, gets the bits it gets alone."""
    rng = np.random.default_rng(0)
    block = rng.standard_normal((7, 40)).astype(dtype)
    block[3] = block[0]  # row 0 again inside the period, at another temperature: not a period
    block[4, 5] = np.nan
    block[5] = -np.inf
    temps = np.array([1.0, 0.5, 0.0, 2.0, 1.0, 1.0, 0.7])
    rows, t = np.concatenate([np.tile(block, (5, 1)), block[:3]]), np.concatenate([np.tile(temps, 5), temps[:3]])
    assert repeat_period(rows, t) == 7
    alone = np.concatenate([softmax_rows(row[None], ti) for row, ti in zip(rows, t)])
    np.testing.assert_array_equal(softmax_rows(rows, t), alone)
    # Equal rows at another temperature, or one bit apart, break the period.
    t2 = t.copy()
    t2[2] = 1.5
    rows2 = rows.copy()
    rows2[2, 39] = np.nextafter(rows2[2, 39], dtype(np.inf))
    for r, ti in ((rows, t2), (rows2, t)):
        assert repeat_period(r, ti) == len(r)
        np.testing.assert_array_equal(softmax_rows(r, ti)[2], softmax_rows(r[2:3], ti[2])[0])


def test_repeating_rows_index_like_the_rows_they_stand_for():
    period = np.arange(12.0).reshape(3, 4)
    whole = np.tile(period, (4, 1))[:11]  # a length that is not a whole number of periods
    rows = RepeatingRows(period, 11)
    assert rows.shape == whole.shape
    picks = np.array([10, 0, 4, 4, 8])
    np.testing.assert_array_equal(rows[picks], whole[picks])
    np.testing.assert_array_equal(rows[picks, np.array([3, 0, 1, 2, 2])], whole[picks, [3, 0, 1, 2, 2]])
    assert rows[np.array([], dtype=np.int64)].shape == (0, 4)
    for bad in (np.array([11]), np.array([-1]), np.array([0.0])):
        with pytest.raises(IndexError, match="RepeatingRows"):
            rows[bad]


def test_fewer_than_two_rows_have_no_period():
    for n in (0, 1):
        assert repeat_period(np.zeros((n, 3)), np.ones(n)) == n


def test_rows_wider_than_8_bytes_have_no_period():
    rows = np.tile(np.arange(6.0).reshape(2, 3), (3, 1))
    assert repeat_period(rows, np.ones(6)) == 2
    for wide in (rows.astype(np.longdouble), rows.astype(np.complex128)):
        assert repeat_period(wide, np.ones(6)) == 6
    np.testing.assert_array_equal(softmax_rows(rows.astype(np.longdouble), 1.0), softmax_rows(rows, 1.0))


def _bias_batch(temperature, bias_ids, bias, drafts, target):
    """Requests of one draft each over V = 4: ``target`` rows (two a request), biases as the protocol spells them."""
    b = len(temperature)
    return VerifyBatch(
        target_logits=np.asarray(target, np.float32), draft_logits=None, draft_tokens=np.asarray(drafts, np.int64),
        cu_num_drafts=np.arange(b + 1, dtype=np.int64), temperature=np.asarray(temperature, np.float64),
        seeds=np.arange(b, dtype=np.int64) + 7, positions=np.arange(2 * b, dtype=np.int64), methods=np.zeros(b, np.int8),
        synthetic_rates=None, max_drafts=1, logit_bias_ids=np.asarray(bias_ids, np.int64), logit_bias=np.asarray(bias, np.float32),
    ).validate()  # fmt: skip


def test_logit_bias_applies_to_every_row_of_its_own_request_only():
    """Greedy: request 0's +10 on token 3 makes 3 the argmax of both its rows (the draft 3 is
    accepted, the bonus token is 3); request 1 has no bias (a padded slot) and rejects it. At
    T = 1 a -inf bias on all but token 2 leaves a point mass there, drafts keep no bias (a draft
    row favouring 0 changes nothing)."""
    rows = [[1.0, 0.0, 0.0, 0.0]] * 4
    batch = _bias_batch([0.0, 0.0], [[3, -1], [-1, -1]], [[10.0, 0.0], [0.0, 0.0]], [3, 3], rows)
    tokens, emitted = ReferenceSampler().sample(batch)
    assert emitted.tolist() == [2, 1] and tokens[0].tolist() == [3, 3] and tokens[1, 0] == 0
    inf = -np.inf
    many = _bias_batch([1.0] * 8, [[0, 1, 3]] * 8, [[inf, inf, inf]] * 8, [0] * 8, [[5.0, 1.0, 0.0, 2.0]] * 16)
    many = dataclasses.replace(many, draft_logits=np.tile(np.array([[9.0, 0.0, 0.0, 0.0]], np.float32), (8, 1)))
    tokens, emitted = ReferenceSampler().sample(many.validate())
    assert (emitted == 1).all() and (tokens[:, 0] == 2).all()


def test_reference_sampler_verifies_against_the_biased_law():
    """The sampler's processed target rows (sampler and law alike: ``reference.processing``) for
    a mixed batch of trials: biased and unbiased templates, top-k after the bias."""
    s = next(s for s in catalog(get_profile("smoke"), seed=0) if s.name == "standard-logit-bias")
    templates = materialize(s)
    batch = trials(s, templates, 0, 3).batch
    seen = {}
    sampler = ReferenceSampler()
    original = sampler.processed_target_probs

    def spy(*args, **kwargs):
        seen["probs"] = original(*args, **kwargs)
        return seen["probs"]

    sampler.processed_target_probs = spy
    sampler.sample(batch)
    rows = np.concatenate([t.target_probs() for t in templates])
    np.testing.assert_array_equal(seen["probs"], rows)  # one period: the trials repeat the templates' rows
    assert rows[:3, 0].min() > 0.8  # +3 on token 0 of a flat row at T = 0.7

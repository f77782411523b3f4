"""Exact laws: losslessness by enumeration, closed forms, and the documented conventions."""

import numpy as np
import pytest

from reference import laws
from reference.distributions import greedy_tokens, softmax_rows
from reference.methods import Method

LOSSLESS = [Method.STANDARD, Method.STRICT, Method.BLOCK]


def random_rows(rng, n, vocab, zeros=0):
    """Peaky rows; ``zeros`` tokens per row get probability 0 (top-k style)."""
    x = rng.random((n, vocab)) ** 3
    for row in x:
        row[rng.choice(vocab, size=zeros, replace=False)] = 0.0
    return x / x.sum(axis=1, keepdims=True)


def product_law(target):
    joint = target[0]
    for row in target[1:]:
        joint = np.multiply.outer(joint, row)
    return joint


CASES = [(seed, vocab, d, zeros) for seed in range(6) for vocab, d, zeros in ((3, 1, 0), (4, 2, 1), (5, 3, 2), (3, 3, 0))]


@pytest.mark.parametrize("method", LOSSLESS, ids=lambda m: m.name.lower())
@pytest.mark.parametrize("visible", [True, False], ids=["draft-probs", "point-mass"])
@pytest.mark.parametrize("seed,vocab,d,zeros", CASES)
def test_lossless_methods_emit_the_target_law_exactly(method, visible, seed, vocab, d, zeros):
    """Completed with target samples, every emitted token is target-distributed given its prefix."""
    rng = np.random.default_rng(seed)
    target, proposal = random_rows(rng, d + 1, vocab, zeros), random_rows(rng, d, vocab, zeros)
    joint = laws.completed_sequence_law(method, target, proposal, visible)
    np.testing.assert_allclose(joint, product_law(target), atol=1e-13)


def test_synthetic_is_not_lossless_and_follows_its_rates():
    rng = np.random.default_rng(1)
    target, proposal = random_rows(rng, 3, 4), random_rows(rng, 2, 4)
    rates = np.array([0.9, 0.5])
    joint = laws.completed_sequence_law(Method.SYNTHETIC, target, proposal, True, rates)
    assert np.abs(joint - product_law(target)).sum() > 1e-3
    length = laws.acceptance_length_law(laws.sampled_draft_law(Method.SYNTHETIC, target, proposal, True, rates))
    np.testing.assert_allclose(length, [0.1, 0.9 * 0.5, 0.9 * 0.5], atol=1e-14)


@pytest.mark.parametrize("seed", range(5))
def test_standard_acceptance_is_one_minus_tv(seed):
    """Leviathan et al.: per-step acceptance = sum min(target, draft) = 1 - TV."""
    rng = np.random.default_rng(seed)
    target, proposal = random_rows(rng, 4, 7, 2), random_rows(rng, 3, 7, 2)
    steps = laws.position_laws(Method.STANDARD, target, proposal)
    np.testing.assert_allclose(steps[:3, 0].sum(axis=-1), np.minimum(target[:3], proposal).sum(axis=-1), atol=1e-14)
    point = laws.position_laws(Method.STANDARD, target, proposal, draft_visible=False)
    np.testing.assert_allclose(point[:3, 0].sum(axis=-1), (target[:3] * proposal).sum(axis=-1), atol=1e-14)
    np.testing.assert_allclose(laws.position_laws(Method.STRICT, target, proposal), point, atol=1e-14)


def test_accepted_count_law_is_the_product_of_step_rates():
    rng = np.random.default_rng(3)
    target, proposal = random_rows(rng, 4, 5), random_rows(rng, 3, 5)
    alpha = np.minimum(target[:3], proposal).sum(axis=-1)
    length = laws.acceptance_length_law(laws.sampled_draft_law(Method.STANDARD, target, proposal))
    expected = [1 - alpha[0], alpha[0] * (1 - alpha[1]), alpha[0] * alpha[1] * (1 - alpha[2]), alpha.prod()]
    np.testing.assert_allclose(length, expected, atol=1e-14)


def test_fixed_draft_law_follows_min_ratio_and_residual():
    target = np.array([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]])
    draft = np.array([[0.2, 0.6, 0.2]])
    law = laws.fixed_draft_law(Method.STANDARD, target, draft, [1])
    accept = 0.3 / 0.6
    residual = np.array([0.3, 0.0, 0.0]) / 0.3
    np.testing.assert_allclose(law[0], (1 - accept) * residual)
    np.testing.assert_allclose(law[1], accept * target[1])


def test_greedy_is_a_point_mass_with_lowest_id_ties():
    logits = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 0.0, 1.0], [0.0, 0.0, 5.0, 5.0]])
    np.testing.assert_array_equal(greedy_tokens(logits), [1, 0, 2])
    target = softmax_rows(logits, 0.0)
    law = laws.fixed_draft_law(Method.STANDARD, target, softmax_rows(logits[:2], 1.0), [1, 3])
    expected = np.zeros_like(law)
    expected[1, 0] = 1.0  # draft 1 matches argmax 1; draft 3 is not argmax 0 -> emit 0
    np.testing.assert_array_equal(law, expected)


def test_degenerate_rows_are_a_point_mass_on_token_zero():
    logits = np.array([[np.nan, 1.0, 2.0], [-np.inf, -np.inf, -np.inf]])
    np.testing.assert_array_equal(softmax_rows(logits, 1.0), [[1, 0, 0], [1, 0, 0]])
    np.testing.assert_array_equal(greedy_tokens(logits), [0, 0])


@pytest.mark.parametrize("method", [Method.STANDARD, Method.STRICT, Method.BLOCK], ids=lambda m: m.name.lower())
def test_placeholder_truncates_the_drafts(method):
    rng = np.random.default_rng(7)
    target, draft = random_rows(rng, 4, 5), random_rows(rng, 3, 5)
    with_hole = laws.fixed_draft_law(method, target, draft, [2, -1, 4])
    truncated = laws.fixed_draft_law(method, target[:2], draft[:1], [2])
    np.testing.assert_allclose(with_hole[:2], truncated, atol=1e-15)
    assert with_hole[2:].sum() == 0


def test_zero_drafts_emit_from_the_only_row():
    target = np.array([[0.1, 0.9]])
    for method in LOSSLESS:
        np.testing.assert_allclose(laws.fixed_draft_law(method, target, np.zeros((0, 2)), []), target)


def test_block_accepts_at_least_as_much_as_standard_on_average():
    """Sun et al. 2024: block verification is optimal; it never loses expected length."""
    rng = np.random.default_rng(11)
    for _ in range(20):
        target, proposal = random_rows(rng, 4, 4), random_rows(rng, 3, 4)
        mean = [
            laws.acceptance_length_law(laws.sampled_draft_law(m, target, proposal)) @ np.arange(4) for m in (Method.STANDARD, Method.BLOCK)
        ]
        assert mean[1] >= mean[0] - 1e-12


def test_laws_sum_to_one():
    rng = np.random.default_rng(5)
    target, proposal = random_rows(rng, 4, 6, 1), random_rows(rng, 3, 6, 1)
    drafts = [int(np.argmax(row)) for row in proposal]
    for method in LOSSLESS:
        assert abs(laws.fixed_draft_law(method, target, proposal, drafts).sum() - 1) < 1e-12
        assert abs(laws.sampled_draft_law(method, target, proposal).sum() - 1) < 1e-12


def test_logit_bias_rows_are_added_before_everything_else():
    """``processing.add_logit_bias``: per-row sparse biases (-1 pads, not read), rounded to
    float32 as vLLM stores them and added in float64; ``processed_rows`` with them equals
    ``processed_probs`` with each row's own ``SamplingParams.logit_bias``."""
    from reference.processing import SamplingParams, add_logit_bias, processed_probs, processed_rows

    rng = np.random.default_rng(5)
    x = rng.normal(0, 2, (4, 6)).astype(np.float32)
    ids = np.array([[1, -1], [0, 5], [-1, -1], [2, 3]])
    bias = np.array([[0.1, np.nan], [-np.inf, 2.5], [7.0, 7.0], [-1.0, 3.0]])
    got = add_logit_bias(x, ids, bias)
    assert got[0, 1] == np.float64(x[0, 1]) + np.float64(np.float32(0.1)) and got[0, 1] != x[0, 1] + 0.1
    assert np.isneginf(got[1, 0]) and np.array_equal(got[2], x[2].astype(np.float64))
    with pytest.raises(ValueError, match="logit_bias: token id 6"):
        add_logit_bias(x, np.array([[6]] * 4), np.ones((4, 1)))
    temps, ks = np.array([1.0, 0.5, 0.0, 1.7]), np.array([0, 2, 1, 0])
    rows = processed_rows(x, temps, ks, None, None, "vllm", ids, bias)
    for i in range(4):
        pairs = tuple((int(t), float(b)) for t, b in zip(ids[i], bias[i]) if t >= 0)
        params = SamplingParams(float(temps[i]), int(ks[i]) or None, logit_bias=pairs)
        np.testing.assert_array_equal(rows[i], processed_probs(x[i : i + 1], params)[0])
    assert rows[1, 0] == 0.0 and rows[2].argmax() == x[2].argmax()

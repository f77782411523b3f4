"""Tree verification (reference/tree.py): the draft tree's validation, SGLang's EAGLE
target-only rule and SpecInfer's multi-round rule: their exact laws against hand-worked
values, against reference.laws on a chain and against the lossless claims; the samplers
against the exact laws by Pearson's chi-square; planted faults the same chi-square catches.

Every statistical test here runs at ALPHA = 1e-6 with POWER = 0.99 against any alternative
at TV >= 0.02 on the pooled cells (harness/checking/power.py's guarantee: the trial count is
``trials_for_tv`` at the largest df the cells can have; the pooled df is at most that).
Seeds are fixed, so a run is reproducible; the 19 tests that expect a pass have a family-wise
false-alarm rate below 2e-5 (Bonferroni) for any seed.
"""

import itertools

import numpy as np
import pytest

from harness.checking import power, stats
from harness.checking.pooling import MAX_BINS, Pooling, pooled
from harness.trees.faults import SGLangCoinPerSibling, SGLangResidualKeepsSiblings, SpecInferUnnormalizedResidual
from reference import laws, rules
from reference import tree as tr
from reference.methods import Method
from reference.rng import Stream, hash64, uniforms

ALPHA = 1e-6  # false-alarm rate of each chi-square test
POWER = 0.99  # its power against TV >= TV
TV = 0.02
V = 4  # vocabulary of the prefix models: drawn laws enumerate V ** children per node

# Topologies (parents; fixed-tree tokens). Siblings distinct but in "duplicates".
TOPOLOGIES = {
    "one-node": ([-1], [-1]),
    "chain": ([-1, 0, 1, 2], [-1, 1, 2, 0]),
    "depth3-branch2": ([-1] + [(j - 1) // 2 for j in range(1, 15)], [-1, 0, 1, 2, 3, 1, 0, 3, 0, 1, 2, 0, 2, 1, 3]),
    "duplicates": ([-1, 0, 0, 0, 1, 1, 2], [-1, 1, 1, 2, 0, 0, 3]),
}
LOSSY_THRESHOLDS = (0.45, 0.6)  # (threshold_single, threshold_acc): SGLang's rule is then lossy


def models(seed: int = 3):
    """Target and draft prefix models (every prefix up to length 3), fixed by ``seed``."""
    rng = np.random.default_rng(seed)
    return tr.PrefixModel.random(rng, V, 3, 1.0), tr.PrefixModel.random(rng, V, 3, 1.0)


def fixed_tree(name: str) -> tr.DraftTree:
    target, draft = models()
    parents, tokens = TOPOLOGIES[name]
    return tr.DraftTree.from_models(parents, tokens, target, draft)


def design_trials(probs: np.ndarray) -> int:
    """Trials for TV at ALPHA and POWER, at the largest df the law's cells can have."""
    possible = int((np.asarray(probs) > 0).sum())
    return power.trials_for_tv(ALPHA, POWER, TV, max(possible - 1, 1))


def pooled_tv(law, probs, trials: int) -> float:
    """TV between ``law`` and ``probs`` on the cells ``chi_square`` pools for ``trials``
    (the distance the power guarantee is about); mass on impossible cells counts in full."""
    law, probs = np.asarray(law, dtype=np.float64).ravel(), np.asarray(probs, dtype=np.float64).ravel()
    bins = Pooling(probs).capped(MAX_BINS, trials)
    return total_variation(pooled(law, bins), pooled(probs, bins)) + 0.5 * float(law[bins < 0].sum())


def chi_square(counts: np.ndarray, probs: np.ndarray) -> stats.GofResult:
    """The suite's Pearson chi-square of ``counts`` against the law ``probs``, cells pooled
    from the law alone; checks that the stated power holds at the pooled df."""
    counts, probs = np.asarray(counts, dtype=np.float64).ravel(), np.asarray(probs, dtype=np.float64).ravel()
    n = counts.sum()
    result = stats.chi_square_test(counts, n * probs, Pooling(probs).capped(MAX_BINS, n), with_ci=False)
    assert power.detectable_tv(ALPHA, POWER, result.df, int(n)) <= TV * (1 + 1e-9)
    return result


def total_variation(a, b) -> float:
    return 0.5 * float(np.abs(np.asarray(a) - np.asarray(b)).sum())


def completed_tv(target: tr.PrefixModel, emitted: np.ndarray, depth: int) -> float:
    """TV between the emitted law, continued by the target, and the target's own law."""
    return total_variation(target.completed(emitted, depth + 1), target.sequence_law(depth + 1))


# --- bad input -------------------------------------------------------------------------------
LOGITS2 = np.zeros((2, V))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(parents=[-1, 2, 1], tokens=[-1, 0, 0], target_logits=np.zeros((3, V))), "cycle"),
        (dict(parents=[-1, 2, 0], tokens=[-1, 0, 0], target_logits=np.zeros((3, V))), "comes after it"),
        (dict(parents=[0, -1], tokens=[-1, 0], target_logits=LOGITS2), "node 0 is the root"),
        (dict(parents=[-1, -1], tokens=[-1, 0], target_logits=LOGITS2), "only node 0 may be the root"),
        (dict(parents=[-1, 5], tokens=[-1, 0], target_logits=LOGITS2), "outside"),
        (dict(parents=[-1, 0.5], tokens=[-1, 0], target_logits=LOGITS2), "integer"),
        (dict(parents=[], tokens=[], target_logits=np.zeros((0, V))), "non-empty"),
        (dict(parents=[-1, 0], tokens=[-1, V], target_logits=LOGITS2), "node 1 has token 4, outside"),
        (dict(parents=[-1, 0], tokens=[-1, -2], target_logits=LOGITS2), "outside"),
        (dict(parents=[-1, 0], tokens=[0, 1], target_logits=LOGITS2), "root"),
        (dict(parents=[-1, 0], tokens=[-1, 1, 2], target_logits=LOGITS2), "tokens"),
        (dict(parents=[-1, 0], tokens=[-1, 1], target_logits=np.zeros((3, V))), "target_logits: expected shape"),
        (dict(parents=[-1, 0], tokens=[-1, 1], target_logits=[[0.0, np.nan, 0, 0], [0] * 4]), "NaN"),
        (dict(parents=[-1, 0], tokens=[-1, 1], target_logits=[[-np.inf] * 4, [0] * 4]), "no finite logit"),
        (dict(parents=[-1, 0], tokens=[-1, 1], target_logits=LOGITS2, temperature=-1.0), "temperature"),
        (
            dict(parents=[-1, 0], tokens=[-1, 1], target_logits=LOGITS2, draft_probs=np.full((2, V - 1), 1 / 3)),
            "draft_probs: expected shape",
        ),
        (dict(parents=[-1, 0], tokens=[-1, 1], target_logits=LOGITS2, draft_probs=[[0.25] * 4, [1.0, 0, 0, 0]]), "draft probability 0"),
        (dict(parents=[-1, 0], tokens=[-1, 1], target_logits=LOGITS2, draft_probs=[[0.25] * 4, [0.5] * 4]), "sum to 1"),
    ],
)
def test_bad_trees_are_refused_with_a_clear_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tr.DraftTree(**kwargs)


def test_bad_rule_arguments_are_refused():
    tree = tr.DraftTree([-1, 0], [-1, 1], LOGITS2)
    for single, acc in ((-0.1, 1.0), (1.0, np.nan), (True, 1.0), ("1", 1.0)):
        with pytest.raises(ValueError, match="threshold"):
            tr.sglang_law(tree, single, acc)
        with pytest.raises(ValueError, match="threshold"):
            tr.SGLangTreeSampler().sample(tree, 10, 0, single, acc)
    with pytest.raises(ValueError, match="draft_probs"):
        tr.specinfer_law(tree)
    with pytest.raises(ValueError, match="draft_probs"):
        tr.SpecInferTreeSampler().sample(tree, 10)
    with pytest.raises(ValueError, match="trials"):
        tr.SGLangTreeSampler().sample(tree, 0)
    target, draft = models()
    with pytest.raises(ValueError, match="needs target prefixes"):
        tr.specinfer_drawn_law([-1, 0, 1, 2, 3], target, draft)  # 4 deep, the models cover 3
    with pytest.raises(ValueError, match="vocabulary"):
        tr.specinfer_drawn_law([-1, 0], target, tr.PrefixModel.random(np.random.default_rng(0), V + 1, 1))
    with pytest.raises(ValueError, match="rows: expected shape"):
        tr.PrefixModel(np.full((3, V), 0.25), V, 1)


def test_retrive_arrays_are_sglangs_first_child_and_next_sibling():
    tree = tr.DraftTree([-1, 0, 0, 1, 1, 2], [-1, 0, 1, 2, 3, 0], np.zeros((6, V)))
    first, sibling = tree.retrive_arrays()
    assert first.tolist() == [1, 3, 5, -1, -1, -1]
    assert sibling.tolist() == [-1, 2, -1, 4, -1, -1]


# --- exact laws against hand-worked values ----------------------------------------------------
# Root row p = [.4, .3, .2, .1]; two leaf children; leaf rows R1, R2.
P = np.array([0.4, 0.3, 0.2, 0.1])
R1, R2 = np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.7, 0.1, 0.1, 0.1])


def two_leaves(tokens, draft_probs=None) -> tr.DraftTree:
    return tr.DraftTree([-1, 0, 0], [-1, *tokens], np.log([P, R1, R2]), 1.0, draft_probs)


@pytest.mark.parametrize(
    "tokens, single, acc, accept, stop_row",
    [
        # thresholds 1: child 0 on coin in (0, .4], child 2 on (.4, .6]; else p without {0, 2}: [0, .3, 0, .1] / .4
        ((0, 2), 1.0, 1.0, (0.4, 0.2), [0, 0.3, 0, 0.1]),
        # threshold_acc .5: coin <= .4 / .5 = .8, then <= .6 / .5 (always): accepts .8 and .2, never stops
        ((0, 2), 1.0, 0.5, (0.8, 0.2), [0, 0, 0, 0]),
        # threshold_single .35: p(0) = .4 >= .35 accepts child 1 whatever the coin
        ((0, 2), 0.35, 1.0, (1.0, 0.0), [0, 0, 0, 0]),
        # order matters: token 2 first (coin <= .2), then token 0 with p = .4 >= .3 takes the rest
        ((2, 0), 0.3, 1.0, (0.2, 0.8), [0, 0, 0, 0]),
        # duplicate tokens: mass counted twice, coin <= .3 and (.3, .6], token 1 first with prob .6 = 2 p(1);
        # the stop (.4) draws from p without token 1, [.4, 0, .2, .1] / .7
        ((1, 1), 1.0, 1.0, (0.3, 0.3), np.array([0.4, 0, 0.2, 0.1]) * 0.4 / 0.7),
    ],
)
def test_sglang_law_on_hand_worked_trees(tokens, single, acc, accept, stop_row):
    law = tr.sglang_law(two_leaves(tokens), single, acc)
    np.testing.assert_allclose(law[1], accept[0] * R1, atol=1e-15)
    np.testing.assert_allclose(law[2], accept[1] * R2, atol=1e-15)
    np.testing.assert_allclose(law[0], stop_row, atol=1e-15)
    assert law.sum() == pytest.approx(1.0, abs=1e-15)


def test_sglang_threshold_single_is_inclusive():
    """``p(x) >= threshold_single`` accepts: at equality the first child takes every coin."""
    tree = two_leaves((0, 2))
    p0 = tree.target_probs()[0, 0]  # 0.4 up to rounding: the threshold is set to it exactly
    assert tr.sglang_law(tree, p0, 1.0)[1].sum() == 1.0
    assert tr.sglang_law(tree, np.nextafter(p0, 1.0), 1.0)[1].sum() == pytest.approx(p0, abs=1e-15)


def test_sglang_accepts_on_coin_equal_to_the_cumulative_mass():
    """The kernel tests ``coin <= prob_acc / threshold_acc`` (not ``<``)."""
    s = tr.SGLangTreeSampler()
    assert s.accepts(0.4, 0.4, 0.1, 1.0, 1.0) and not s.accepts(0.4000001, 0.4, 0.1, 1.0, 1.0)
    assert s.accepts(0.9, 0.1, 0.5, 0.5, 1.0)  # p(x) >= threshold_single


def test_specinfer_law_on_hand_worked_trees():
    q = np.array([0.1, 0.6, 0.2, 0.1])
    drafts = np.array([q, q, q])
    # Token 1 twice: accept min(1, .3 / .6) = .5; residual max(p - q, 0) = [.3, 0, 0, 0] -> [1, 0, 0, 0]
    # gives the second token 1 ratio 0: rejected; stop with prob .5 emitting token 0.
    law = tr.specinfer_law(two_leaves((1, 1), drafts))
    np.testing.assert_allclose(law, [[0.5, 0, 0, 0], 0.5 * R1, np.zeros(4)], atol=1e-15)
    # Tokens 1 then 0: the second child sees residual [1, 0, 0, 0], ratio 1 / .1: always accepted.
    law = tr.specinfer_law(two_leaves((1, 0), drafts))
    np.testing.assert_allclose(law, [np.zeros(4), 0.5 * R1, 0.5 * R2], atol=1e-15)
    # A leaf root: the bonus is its target row.
    np.testing.assert_allclose(tr.specinfer_law(tr.DraftTree([-1], [-1], np.log([P]), 1.0, [P])), [P], atol=1e-15)


# --- chains: the standard rule of reference.laws ----------------------------------------------
def test_a_chain_is_the_standard_rule():
    rng = np.random.default_rng(7)
    d, vocab = 3, 6
    logits = rng.normal(size=(d + 1, vocab)) * 2
    logits[1, 4] = -np.inf  # a masked token
    draft = np.vstack([np.full(vocab, 1 / vocab), rng.dirichlet(np.ones(vocab), size=d)])
    drafts = [2, 0, 5]
    tree = tr.DraftTree(list(range(-1, d)), [-1, *drafts], logits, 0.7, draft)
    target = tree.target_probs()
    # SGLang without draft probabilities: accept with p(x), else p without x; the point-mass rule and strict.
    for method in (Method.STANDARD, Method.STRICT):
        np.testing.assert_allclose(tr.sglang_law(tree), laws.fixed_draft_law(method, target, None, drafts), atol=1e-15)
    np.testing.assert_allclose(tr.specinfer_law(tree), laws.fixed_draft_law(Method.STANDARD, target, draft[1:], drafts), atol=1e-15)


def test_a_drawn_chain_is_the_standard_rule_with_sampled_drafts():
    rng = np.random.default_rng(8)
    d = 3
    target_rows, draft_rows = rng.dirichlet(np.ones(V), size=d + 1), rng.dirichlet(np.full(V, 0.6), size=d)
    emitted = tr.specinfer_drawn_law(
        list(range(-1, d)), tr.PrefixModel.from_depth_rows(target_rows), tr.PrefixModel.from_depth_rows(draft_rows)
    )
    by_count = np.zeros((d + 1, V))  # (n accepted, y): the sequence's length - 1 and its last token
    for code in np.flatnonzero(emitted):
        seq = tr.decode(int(code), V)
        by_count[len(seq) - 1, seq[-1]] += emitted[code]
    np.testing.assert_allclose(by_count, laws.sampled_draft_law(Method.STANDARD, target_rows, draft_rows), atol=1e-15)


def test_a_one_node_tree_emits_the_bonus_row():
    tree = fixed_tree("one-node")
    bonus = tree.target_probs()
    np.testing.assert_array_equal(tr.sglang_law(tree), bonus)
    np.testing.assert_array_equal(tr.sglang_law(tree, *LOSSY_THRESHOLDS), bonus)
    np.testing.assert_array_equal(tr.specinfer_law(tree), bonus)
    np.testing.assert_allclose(bonus, laws.fixed_draft_law(Method.STANDARD, bonus, None, []), atol=1e-15)


# --- the lossless claims -----------------------------------------------------------------------
@pytest.mark.parametrize("name", list(TOPOLOGIES))
def test_laws_sum_to_one_and_are_lossless_exactly_where_claimed(name):
    target, draft = models()
    tree = fixed_tree(name)
    depth = tree.max_depth
    duplicates = any(np.unique(tree.tokens[k]).size < k.size for k in tr.children_lists(tree.parents))
    branching = any(k.size > 0 for k in tr.children_lists(tree.parents))
    sglang = tr.sglang_law(tree)
    lossy_sglang = tr.sglang_law(tree, *LOSSY_THRESHOLDS)
    fixed = tr.specinfer_law(tree)
    drawn = tr.specinfer_drawn_law(tree.parents, target, draft)
    for law in (sglang, lossy_sglang, fixed, drawn):
        assert law.min() >= 0 and law.sum() == pytest.approx(1.0, abs=1e-12)
    # SGLang, thresholds 1, distinct siblings: the target's law; duplicates are not.
    tv = completed_tv(target, tr.emitted_sequence_law(tree, sglang), depth)
    assert (tv > 1e-3) if duplicates else (tv < 1e-12), tv
    # SpecInfer, children drafted i.i.d. from the draft rows: the target's law, for any shape.
    assert completed_tv(target, drawn, depth) < 1e-12
    # Lossy where claimed so (a one-node tree has nothing to verify: always the bonus row).
    for law in (lossy_sglang, fixed):
        tv = completed_tv(target, tr.emitted_sequence_law(tree, law), depth)
        assert (tv > 1e-3) if branching else (tv < 1e-12), tv


def test_the_drawn_law_is_the_mixture_of_fixed_tree_laws_over_drafted_children():
    """SpecInfer's drawn law by enumeration of every child-token assignment of a small tree
    (depth 2, two children per node, 3 tokens: 3^6 trees), each weighted by its drafting
    probability: an independent route to the same law."""
    rng = np.random.default_rng(5)
    vocab, parents = 3, [-1, 0, 0, 1, 1, 2, 2]
    target, draft = tr.PrefixModel.random(rng, vocab, 2, 1.0), tr.PrefixModel.random(rng, vocab, 2, 0.7)
    mixture = np.zeros(tr.num_codes(vocab, 3))
    for tokens in itertools.product(range(vocab), repeat=6):
        tree = tr.DraftTree.from_models(parents, [-1, *tokens], target, draft)
        weight = np.prod(tree.draft_probs[np.arange(1, 7), tree.tokens[1:]])
        mixture += weight * tr.emitted_sequence_law(tree, tr.specinfer_law(tree))
    np.testing.assert_allclose(tr.specinfer_drawn_law(parents, target, draft), mixture, atol=1e-14)


# --- samplers against the exact laws -----------------------------------------------------------
CASES = [("sglang", name, (1.0, 1.0)) for name in TOPOLOGIES]
CASES += [("sglang", name, LOSSY_THRESHOLDS) for name in TOPOLOGIES]
CASES += [("specinfer", name, None) for name in TOPOLOGIES]
CASES += [("specinfer-drawn", name, None) for name in TOPOLOGIES]


def rule_law(rule, name, thresholds):
    """The exact law of one rule on one topology (``[N, V]``, or over sequence codes when drawn)."""
    tree = fixed_tree(name)
    if rule == "specinfer-drawn":
        return tr.specinfer_drawn_law(tree.parents, *models())
    return tr.sglang_law(tree, *thresholds) if rule == "sglang" else tr.specinfer_law(tree)


def law_and_counts(rule, name, thresholds, seed, sampler=None, trials=None):
    """(exact law, counts of ``trials`` trials, by default the law's design) of one rule on one topology."""
    tree = fixed_tree(name)
    law = rule_law(rule, name, thresholds)
    trials = trials or design_trials(law)
    if rule == "specinfer-drawn":
        codes = (sampler or tr.SpecInferTreeSampler()).sample_drawn(tree.parents, *models(), trials, seed)
        return law, np.bincount(codes, minlength=law.size)
    if rule == "sglang":
        node, token = (sampler or tr.SGLangTreeSampler()).sample(tree, trials, seed, *thresholds)
    else:
        node, token = (sampler or tr.SpecInferTreeSampler()).sample(tree, trials, seed)
    return law, tr.outcome_counts(tree, node, token)


@pytest.mark.parametrize("rule, name, thresholds", CASES)
def test_samplers_follow_their_exact_laws(rule, name, thresholds):
    law, counts = law_and_counts(rule, name, thresholds, seed=11)
    result = chi_square(counts, law)
    assert result.impossible == 0
    assert result.p_value > ALPHA, (rule, name, thresholds, result)


def complete_by_sampling(codes: np.ndarray, target: tr.PrefixModel, length: int, seed: int) -> np.ndarray:
    """Continue each emitted sequence with draws from the target's rows up to ``length`` tokens."""
    codes = codes.copy()
    starts = [tr.num_codes(target.vocab, level) for level in range(length + 1)]
    for level in range(length):
        short = np.flatnonzero((codes >= (starts[level - 1] if level else 0)) & (codes < starts[level]))
        u = uniforms(hash64(seed, short), level, Stream.TARGET)
        codes[short] = tr.child_code(codes[short], rules.inverse_cdf(target.rows[codes[short]], u), target.vocab)
    return codes - starts[length - 1]


@pytest.mark.parametrize(
    "rule, name, thresholds, lossless",
    [
        ("sglang", "depth3-branch2", (1.0, 1.0), True),
        ("specinfer-drawn", "depth3-branch2", None, True),
        ("specinfer-drawn", "duplicates", None, True),
        ("sglang", "duplicates", (1.0, 1.0), False),
        ("sglang", "depth3-branch2", LOSSY_THRESHOLDS, False),
        ("specinfer", "depth3-branch2", None, False),
    ],
)
def test_sampled_outputs_follow_the_targets_law_exactly_where_lossless(rule, name, thresholds, lossless):
    """The samplers' sequences, continued by the target, against the target's own law of
    ``depth + 1`` tokens (not the rules' laws): passes where the rule is lossless, fails
    (p < ALPHA) where its exact law is that far from the target's."""
    target, _ = models()
    tree = fixed_tree(name)
    depth = tree.max_depth
    want = target.sequence_law(depth + 1)
    trials = design_trials(want)
    law, counts = law_and_counts(rule, name, thresholds, seed=12, trials=trials)
    if rule != "specinfer-drawn":
        law = tr.emitted_sequence_law(tree, law)
        counts = tr.emitted_sequence_law(tree, counts)
    codes = np.repeat(np.arange(counts.size), counts.astype(np.int64))
    completed = np.bincount(complete_by_sampling(codes, target, depth + 1, seed=13), minlength=want.size)
    result = chi_square(completed, want)
    gap = pooled_tv(target.completed(law, depth + 1), want, trials)  # the rule's exact distance, on the test's cells
    if lossless:
        assert gap < 1e-12 and result.p_value > ALPHA, (gap, result)
    else:
        assert gap > TV and result.p_value < ALPHA, (gap, result)  # far enough for the stated power, and detected


def test_samplers_are_deterministic_in_the_seed():
    tree = fixed_tree("depth3-branch2")
    a, b, c = (tr.SGLangTreeSampler().sample(tree, 2000, s) for s in (1, 1, 2))
    assert all((x == y).all() for x, y in zip(a, b)) and not all((x == y).all() for x, y in zip(a, c))
    a, b = (tr.SpecInferTreeSampler().sample(tree, 2000, 1) for _ in range(2))
    assert all((x == y).all() for x, y in zip(a, b))


# --- planted faults --------------------------------------------------------------------------
# The planted faults live in harness/trees/faults.py (`python -m harness tree` runs them too).


def test_planted_sglang_residual_fault_is_far_and_detected():
    tree = fixed_tree("depth3-branch2")
    law = tr.sglang_law(tree)
    faulty = law.sum(axis=1, keepdims=True) * tree.target_probs()  # the fault's exact law: stop rows unchanged
    trials = design_trials(law)
    assert pooled_tv(faulty, law, trials) > TV  # far enough for the stated power
    _, counts = law_and_counts("sglang", "depth3-branch2", (1.0, 1.0), seed=21, sampler=SGLangResidualKeepsSiblings())
    assert chi_square(counts, law).p_value < ALPHA


@pytest.mark.parametrize(
    "rule, name, sampler",
    [
        ("sglang", "depth3-branch2", SGLangCoinPerSibling()),
        ("specinfer-drawn", "duplicates", SpecInferUnnormalizedResidual()),
    ],
)
def test_planted_faults_are_detected(rule, name, sampler):
    law, counts = law_and_counts(rule, name, (1.0, 1.0), seed=22, sampler=sampler)
    result = chi_square(counts, law)
    assert result.p_value < ALPHA, result
    assert result.tv_estimate > TV  # the plug-in distance of the faulty output: above the stated TV


def test_planted_specinfer_fault_is_detected_on_fixed_children():
    """Child 1 (token 0, drafted from Q1) accepted with prob .5, leaving p' = [0, .5, .375, .125];
    child 2 (token 1, from Q2) is then accepted with prob .5 / .7, unnormalized .2 / .7."""
    q1, q2 = [0.8, 0.1, 0.05, 0.05], [0.1, 0.7, 0.1, 0.1]
    tree = two_leaves((0, 1), [P, q1, q2])
    law = tr.specinfer_law(tree)
    np.testing.assert_allclose(law.sum(axis=1), [0.5 * (1 - 0.5 / 0.7), 0.5, 0.5 * 0.5 / 0.7], atol=1e-15)
    node, token = SpecInferUnnormalizedResidual().sample(tree, design_trials(law), seed=23)
    result = chi_square(tr.outcome_counts(tree, node, token), law)
    assert result.p_value < ALPHA and result.tv_estimate > TV, result

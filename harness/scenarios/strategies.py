"""Hypothesis strategies that draw *scenarios* (never raw arrays), the pinned examples, and
the predicates that name scenarios where a known implementation disagrees with the law.

Drawn: ragged draft counts (0 included), mixed greedy / standard / synthetic requests,
temperatures 0, near 0 and large, every distribution family (top-k truncation gives
zero-probability tokens), explicit drafts with target or draft probability 0,
placeholders, NaN and all-masked rows, top-k / top-p / min-p (with either engine's rules at
ties) and logit biases, drafts drawn by the backend's own drafter (probabilistic or greedy), a smaller draft vocabulary, fp32 / bf16 / fp16
logits, scattered state slots, and vocabularies straddling kernel block sizes. Tensors
are built by ``harness.scenarios.materialize`` from the drawn seed, so examples shrink
to small, readable scenarios. The fuzz budget and replay are in ``harness.studies.fuzz``.
"""

import dataclasses

import numpy as np
from hypothesis import example
from hypothesis import strategies as st

from harness.scenarios.materialize import materialize
from harness.scenarios.scenario import DRAFT_FAMILIES, DRAFT_MODES, DRAFT_SAMPLING, PROCESSING, TARGET_FAMILIES, RequestSpec, Scenario
from reference.laws import MAX_ENUMERATED_DRAFTS
from reference.methods import Method

SMALL_VOCABS = (2, 3, 5, 8, 13)


BOUNDARY_VOCABS = (1023, 1024, 1025)  # the Triton sampler's 1024-wide CPU tiles; vLLM MRV2's 1024-wide resample blocks


VLLM_BLOCK_VOCABS = (8191, 8192, 8193)  # vLLM's 8192-wide vocabulary blocks (V1 recovery, MRV2 argmax / gumbel)


GPU_VOCABS = BOUNDARY_VOCABS + VLLM_BLOCK_VOCABS + (152_064, 262_144)


# The Triton sampler with 8-wide tiles in 2 or 3 splits: V = 7..25 crosses tile and split
# edges the way V = 8191..8193 crosses real ones, at the interpreter's small-vocabulary cost.


TILE_VOCABS = (7, 8, 9, 15, 16, 17, 23, 24, 25)


TEMPERATURES = (1e-4, 0.3, 1.0, 1.7, 10.0)


@st.composite
def request_specs(draw, vocab: int, draft_mode: str, methods: tuple[str, ...], max_drafts: int, min_drafts: int = 0):
    d = draw(st.integers(min_drafts, max_drafts))
    method = draw(st.sampled_from(methods))
    # Temperature 0 for any method: greedy, and strict / block / synthetic verified greedily.
    temperature = 0 if method == "greedy" else draw(st.sampled_from((0,) + TEMPERATURES))
    spec = dict(
        num_drafts=d,
        temperature=temperature,
        target=draw(st.sampled_from(TARGET_FAMILIES)),
        draft=draw(st.sampled_from(DRAFT_FAMILIES)),
        method=method,
    )
    if draft_mode == "fixed" and d and draw(st.booleans()):
        spec["draft_ids"] = tuple(draw(st.lists(st.integers(-1, vocab - 1), min_size=d, max_size=d)))
    elif draft_mode == "fixed" and d and draw(st.integers(0, 3)) == 0:
        spec["placeholder_at"] = draw(st.integers(0, d - 1))
    if draw(st.integers(0, 7)) == 0:
        spec["nan_rows" if draw(st.booleans()) else "masked_rows"] = (draw(st.integers(0, d)),)
    # sampling parameters, at the temperatures engines apply them at (a greedy FLy request takes none)
    if draw(st.integers(0, 2)) == 2 and not (method == "fly" and temperature == 0):
        spec |= draw(sampling_params(vocab))
        if spec["temperature"] and not PROCESSED_TEMPERATURES[0] <= spec["temperature"] <= PROCESSED_TEMPERATURES[-1]:
            spec["temperature"] = draw(st.sampled_from(PROCESSED_TEMPERATURES))
    return RequestSpec(**spec)


PROCESSED_TEMPERATURES = (0.3, 1.0, 1.7)  # inside vLLM's [0.01, 2]


# Logit biases the fuzzer draws: -50 removes a token in effect (e**-25 of its mass at most),
# +4 makes one dominant, the others move mass. Dyadic, so a float32 logit plus one rounds
# only where its exponent grows (vLLM adds in float32, the laws in float64).
LOGIT_BIASES = (-50.0, -2.5, 1.5, 4.0)


@st.composite
def sampling_params(draw, vocab: int) -> dict:
    """top-k / top-p / min-p / logit bias, at least one of them set: small k (1 keeps one
    token), top-p from nearly nothing to nearly everything, min-p that removes most or a few
    tokens, a bias on one to three tokens (``LOGIT_BIASES``)."""
    values = {
        "top_k": st.sampled_from((1, 2, max(1, vocab // 2))),
        "top_p": st.sampled_from((0.5, 0.05, 0.8, 0.95)),
        "min_p": st.sampled_from((0.05, 0.3)),
        "logit_bias": st.dictionaries(st.integers(0, vocab - 1), st.sampled_from(LOGIT_BIASES), min_size=1, max_size=min(3, vocab)),
    }
    first = draw(st.sampled_from(tuple(values)))
    return {name: draw(strategy) for name, strategy in values.items() if name == first or draw(st.booleans())}


@st.composite
def scenarios(
    draw,
    vocabs=SMALL_VOCABS,
    methods=("greedy", "standard", "strict", "block", "synthetic"),
    max_drafts=4,
    max_requests=3,
    mates=("greedy", "synthetic"),
    narrow_draft=True,
    min_drafts=0,
):
    """A whole scenario: one base method; a greedy or standard base may be mixed with
    ``mates`` requests. ``narrow_draft``: the draft vocabulary may be half the target's.
    ``min_drafts``: every request has at least this many drafts."""
    vocab = draw(st.sampled_from(vocabs))
    base = draw(st.sampled_from(methods))
    draft_mode = draw(st.sampled_from(DRAFT_MODES))
    if base == "fly" and draft_mode == "engine":  # FLy verifies drafts the suite draws
        draft_mode = draw(st.sampled_from(("fixed", "sampled")))
    if base == "block" and draft_mode != "fixed":
        max_drafts = min(max_drafts, 2)  # block's sampled-draft law is enumerated
        if vocab**max_drafts > MAX_ENUMERATED_DRAFTS:
            draft_mode = "fixed"  # too many draft sequences to enumerate: the law check would be skipped
    allowed = tuple(m for m in (base, *mates) if m in methods) if base in ("standard", "greedy") else (base,)
    reqs = tuple(draw(st.lists(request_specs(vocab, draft_mode, allowed, max_drafts, min_drafts), min_size=1, max_size=max_requests)))
    k = max(r.num_drafts for r in reqs)
    synthetic = None
    if any(r.method == "synthetic" for r in reqs):
        if k and draw(st.booleans()):
            rates = sorted(draw(st.lists(st.sampled_from((0.0, 0.2, 0.5, 0.9, 1.0)), min_size=k, max_size=k)), reverse=True)
            synthetic = {"rates": rates}
        else:
            synthetic = {"mean_rate": draw(st.sampled_from((0.0, 0.3, 0.6, 1.0)))}
    draft_vocab = draw(st.sampled_from((None, max(2, vocab // 2)))) if vocab > 2 and narrow_draft else None
    typical = {}  # typical acceptance's epsilon and delta, or vLLM V0's defaults
    if base == "typical" and draw(st.booleans()):
        typical = {
            "posterior_threshold": draw(st.sampled_from((0.0, 0.05, 0.09, 0.3, 1.0))),
            "posterior_alpha": draw(st.sampled_from((0.0, 0.1, 0.3, 0.9))),
        }
    fly_params = {}  # FLy's window, entropy threshold and top-k, or vLLM's defaults
    if base == "fly" and draw(st.booleans()):
        fly_params = {
            "fly_window_size": draw(st.sampled_from((1, 2, 3))),
            "fly_entropy_threshold": draw(st.sampled_from((0.0, 0.3, 0.8, 1.5))),
            "fly_entropy_top_k": draw(st.sampled_from((1, 2, 3, 8))),
        }
    return Scenario(
        name="fuzz",
        method=base,
        vocab_size=vocab,
        requests=reqs,
        draft_vocab_size=draft_vocab,
        draft_probs=True if draft_mode == "engine" else draw(st.booleans()),  # the drafter draws from the draft logits
        draft_mode=draft_mode,
        draft_sampling=draw(st.sampled_from(DRAFT_SAMPLING)) if draft_mode == "engine" else "probabilistic",
        synthetic=synthetic,
        seed=draw(st.integers(0, 2**31 - 1)),
        dtype=draw(st.sampled_from(("float32", "bfloat16", "float16"))),
        slots=draw(st.sampled_from(("identity", "permuted"))),
        processing=draw(st.sampled_from(PROCESSING)),
        **typical,
        **fly_params,
    )


# --- known regressions, pinned as explicit examples (each named after the bug it guards against)
R = RequestSpec


GHSA_VOCAB_BOUNDARY = Scenario("fuzz", "standard", 1025, (R(2, 1.0, "topk", "disjoint"),), seed=8)  # GHSA-8wr5-jm2h-8r4f


ZERO_TARGET_DRAFT = Scenario("fuzz", "standard", 8, (R(2, 1.0, "topk", "disjoint"), R(1, 1.0, "topk", "disjoint")), seed=3)


PLACEHOLDER_FIRST = Scenario("fuzz", "block", 6, (R(3, 1.0, placeholder_at=0),), seed=1)  # vLLM #46533 / #50939


NAN_ROW = Scenario(
    "fuzz", "standard", 20, (R(2, 1.0, nan_rows=(0,)), R(1, 0, masked_rows=(1,), method="greedy")), seed=2
)  # #21876 / #53029


# Found by this fuzzer: block verification's running ratio 0 * inf (a draft of target
# probability 0, then one of draft probability 0) gave NaN; it must stay 0. The zeros are
# float64 underflow at T = 1e-4: samplers taking ratios in log space disagree, see
# ``undefined_ratio``.
BLOCK_ZERO_TIMES_INF = Scenario("fuzz", "block", 2, (R(3, 1e-4, "peaked", "peaked", draft_ids=(1, 0, 0)),), seed=0)


MIXED = Scenario(
    "fuzz",
    "standard",
    5,
    (R(2, 0, method="greedy"), R(3, 1e-4), R(2, 1.0, method="synthetic")),
    synthetic={"rates": [0.9, 0.5, 0.2]},
    slots="permuted",
    dtype="bfloat16",
    seed=5,
)


def pin(pinned, **others):
    """``@example(scenario=s, **others)`` for every scenario in ``pinned``: the test's explicit
    examples are exactly this tuple, so ``len(pinned)`` is what they add to the budget's family."""

    def apply(test):
        for s in reversed(pinned):
            test = example(scenario=s, **others)(test)
        return test

    return apply


def _fixed_draft_probabilities(scenario: Scenario):
    """(method, p(x_k), q(x_k)) over the drafts of every template where a fixed draft's
    acceptance ratio p / q decides (standard and block, T > 0, not degenerate)."""
    if not scenario.draft_probs or scenario.draft_mode != "fixed":
        return
    for t in materialize(scenario):
        d = t.effective_drafts
        if d == 0 or t.spec.temperature == 0 or t.spec.degenerate or t.method not in (Method.STANDARD, Method.BLOCK):
            continue
        steps = np.arange(d)
        yield t.method, t.target_probs()[steps, t.drafts[:d]], t.visible_draft_probs()[steps, t.drafts[:d]]


def undefined_ratio(scenario: Scenario) -> bool:
    """Whether a fixed draft meets an acceptance ratio the reference's float64 probabilities
    leave undefined: a draft whose visible draft probability is 0 while its target
    probability is 0 too (0/0), or, in block verification, an earlier draft's is (0 * inf).
    Exact zeros (-inf logits) and underflow (T = 1e-4) alike: the reference rejects, while
    samplers that take ratios in log space see a finite ratio (or a NaN) there. The
    disagreements found are pinned in ``suites/test_fuzz_backends.py``."""
    for method, p, q in _fixed_draft_probabilities(scenario):
        p_zero = p == 0
        if method is Method.BLOCK:
            p_zero = np.cumsum(p_zero) > 0  # the running ratio is 0 from the first one on
        if np.any(p_zero & (q == 0)):
            return True
    return False


def draft_probability_vanishes(scenario: Scenario) -> bool:
    """Whether a fixed standard draft has a draft probability that is 0 in float32 (below its
    smallest normal: a top-k exact zero, or underflow at T = 1e-4) while the target gives it
    probability > 0. The law accepts it (min(1, p / q) = 1); vLLM V1 accepts only where its
    float32 draft_prob > 0 (pinned in ``suites/test_fuzz_backends.py``). Sampled drafts never
    meet this: the draft model gave them probability > 0."""
    return any(
        method is Method.STANDARD and np.any((p > 0) & (q < np.finfo(np.float32).tiny))
        for method, p, q in _fixed_draft_probabilities(scenario)
    )


def placeholder_with_draft_probabilities(scenario: Scenario) -> bool:
    """Whether a sampling (T > 0) standard request has a placeholder draft (-1) while the
    scenario carries draft probabilities. The law emits from the target there; vLLM V1 emits
    from max(p - q, 0) of the placeholder's draft row (pinned in ``suites/test_vllm.py``:
    ``test_v1_placeholder_emits_from_target``). A placeholder is ``placeholder_at`` or a -1
    among explicit ``draft_ids``."""
    return scenario.draft_probs and any(
        (spec.placeholder_at is not None or -1 in (spec.draft_ids or ()))
        and spec.temperature > 0
        and scenario.request_method(spec) is Method.STANDARD
        for spec in scenario.requests
    )


def without_mates(batch, keep):
    """The requests ``keep`` (in that order) of ``batch``, with nothing else: same seeds,
    positions, slots and logits."""
    counts = batch.num_drafts
    row_start = batch.cu_num_drafts[:-1] + np.arange(batch.num_requests)
    rows = np.concatenate([np.arange(row_start[r], row_start[r] + counts[r] + 1) for r in keep])
    drafts = np.concatenate([np.arange(batch.cu_num_drafts[r], batch.cu_num_drafts[r + 1]) for r in keep]).astype(np.int64)
    return dataclasses.replace(
        batch,
        target_logits=batch.target_logits[rows],
        draft_logits=None if batch.draft_logits is None else batch.draft_logits[drafts],
        draft_tokens=batch.draft_tokens[drafts],
        cu_num_drafts=np.concatenate([[0], np.cumsum(counts[keep])]).astype(np.int64),
        temperature=batch.temperature[keep],
        seeds=batch.seeds[keep],
        positions=batch.positions[rows],
        methods=batch.methods[keep],
        synthetic_rates=None if batch.synthetic_rates is None else batch.synthetic_rates[keep],
        request_slots=None if batch.request_slots is None else batch.request_slots[keep],
        **{
            name: None if getattr(batch, name) is None else getattr(batch, name)[keep]
            for name in ("top_k", "top_p", "min_p", "logit_bias_ids", "logit_bias")
        },
        **(
            {"posterior_threshold": None, "posterior_alpha": None}
            if not (batch.methods[keep] == Method.TYPICAL).any()
            else {name: getattr(batch, name)[keep] for name in ("posterior_threshold", "posterior_alpha")}
        ),
        **{  # FLy's parameters go with FLy requests only
            name: getattr(batch, name)[keep] if (batch.methods[keep] == Method.FLY).any() else None
            for name in ("fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k")
        },
    ).validate()


# The same advisory at vLLM's 8192-wide blocks: a fully masked target row and a NaN one,
# whose last block holds one valid id: the output must stay in the vocabulary.
GHSA_8192_BLOCK = Scenario(
    "fuzz", "standard", 8193, (R(1, 1.0, "flat", "flat", masked_rows=(0,)), R(2, 0, method="greedy", nan_rows=(1,))), seed=9
)

"""Hypothesis strategies that draw *scenarios* (never raw arrays), and the fuzzing budget.

Drawn: ragged draft counts (0 included), mixed greedy / standard / synthetic requests,
temperatures near 0 and large, every distribution family (top-k truncation gives
zero-probability tokens), explicit drafts with target or draft probability 0,
placeholders, NaN and all-masked rows, a smaller draft vocabulary, fp32 / bf16 / fp16
logits, scattered state slots, and vocabularies straddling kernel block sizes. Tensors
are built by ``harness.scenarios.materialize`` from the drawn seed, so examples shrink
to small, readable scenarios.

Budget: a fuzz test has a family-wise false-alarm budget; every example gets
``budget / max_examples`` of it, split by Holm over that example's statistical checks
(``example_profile``).
"""

import dataclasses
import os

from hypothesis import strategies as st

from harness.checks import plan
from harness.profiles import Profile
from harness.scenarios import DRAFT_FAMILIES, TARGET_FAMILIES, RequestSpec, Scenario, materialize

SMALL_VOCABS = (2, 3, 5, 8, 13)
BOUNDARY_VOCABS = (1023, 1024, 1025)  # CPU: straddles 1024-wide tiles
GPU_VOCABS = (8191, 8192, 8193, 152_064, 262_144)
TEMPERATURES = (1e-4, 0.3, 1.0, 1.7, 10.0)


@st.composite
def request_specs(draw, vocab: int, drafts: str, methods: tuple[str, ...], max_drafts: int):
    d = draw(st.integers(0, max_drafts))
    method = draw(st.sampled_from(methods))
    temperature = 0 if method == "greedy" else draw(st.sampled_from(TEMPERATURES))
    spec = dict(
        num_drafts=d,
        temperature=temperature,
        target=draw(st.sampled_from(TARGET_FAMILIES)),
        draft=draw(st.sampled_from(DRAFT_FAMILIES)),
        method=method,
    )
    if drafts == "fixed" and d and draw(st.booleans()):
        spec["draft_ids"] = tuple(draw(st.lists(st.integers(-1, vocab - 1), min_size=d, max_size=d)))
    elif drafts == "fixed" and d and draw(st.integers(0, 3)) == 0:
        spec["placeholder_at"] = draw(st.integers(0, d - 1))
    if draw(st.integers(0, 7)) == 0:
        spec["nan_rows" if draw(st.booleans()) else "masked_rows"] = (draw(st.integers(0, d)),)
    return RequestSpec(**spec)


@st.composite
def scenarios(draw, vocabs=SMALL_VOCABS, methods=("greedy", "standard", "strict", "block", "synthetic"), max_drafts=4, max_requests=3):
    """A whole scenario: one base method, possibly mixed with greedy / synthetic requests."""
    vocab = draw(st.sampled_from(vocabs))
    base = draw(st.sampled_from(methods))
    drafts = draw(st.sampled_from(("fixed", "sampled")))
    if base == "block" and drafts == "sampled":
        max_drafts = min(max_drafts, 2)  # block's sampled-draft law is enumerated
    allowed = tuple(m for m in (base, "greedy", "synthetic") if m in methods) if base in ("standard", "greedy") else (base,)
    reqs = tuple(draw(st.lists(request_specs(vocab, drafts, allowed, max_drafts), min_size=1, max_size=max_requests)))
    k = max(r.num_drafts for r in reqs)
    synthetic = None
    if any(r.method == "synthetic" for r in reqs):
        if k and draw(st.booleans()):
            rates = sorted(draw(st.lists(st.sampled_from((0.0, 0.2, 0.5, 0.9, 1.0)), min_size=k, max_size=k)), reverse=True)
            synthetic = {"rates": rates}
        else:
            synthetic = {"mean_rate": draw(st.sampled_from((0.0, 0.3, 0.6, 1.0)))}
    draft_vocab = draw(st.sampled_from((None, max(2, vocab // 2)))) if vocab > 2 else None
    return Scenario(
        name="fuzz",
        method=base,
        vocab_size=vocab,
        requests=reqs,
        draft_vocab_size=draft_vocab,
        draft_probs=draw(st.booleans()),
        drafts=drafts,
        synthetic=synthetic,
        seed=draw(st.integers(0, 2**31 - 1)),
        dtype=draw(st.sampled_from(("float32", "bfloat16", "float16"))),
        slots=draw(st.sampled_from(("identity", "permuted"))),
    )


def example_profile(base: Profile, scenario: Scenario, budget: float, max_examples: int) -> Profile:
    """The profile one example runs with: its share of the budget, split over its checks."""
    planned = plan(scenario, materialize(scenario), base)
    statistical = sum(1 for c in planned if c.name != "structure")
    return dataclasses.replace(base, alpha=budget / max_examples / max(statistical, 1))


def failure_path(test_name: str) -> str:
    """Where a failing (shrunk) scenario is saved; the last write is the minimal one."""
    return os.path.join("reports", "fuzz-failures", f"{test_name}.json")

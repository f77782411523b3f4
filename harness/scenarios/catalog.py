"""The built-in scenario catalog of each profile.

Tens of scenarios spanning every method, every distribution family, ragged draft counts
(0 included), placeholders, a smaller draft vocabulary, verification without draft
probabilities, fixed and sampled drafts, and one large vocabulary; the GPU profiles add a
tile-boundary vocabulary (``Profile.boundary_vocab``). Deterministic in (profile, seed):
the same seed always gives the same scenarios.
"""

from harness.scenarios.profiles import Profile
from harness.scenarios.scenario import RequestSpec, Scenario, check_seed, did_you_mean
from reference.rng import hash64

R = RequestSpec


def catalog(profile: Profile, seed: int = 0) -> list[Scenario]:
    check_seed(seed)
    v, big = profile.vocab, profile.large_vocab
    specs = [
        # greedy: exact outcomes
        dict(name="greedy-ragged", method="greedy", requests=[R(0, 0, "peaked"), R(1, 0, "flat"), R(3, 0, "heavy-tail"), R(4, 0, "topk")]),
        dict(name="greedy-ties", method="greedy", requests=[R(2, 0, "tied", "tied"), R(3, 0, "tied", "flat")]),
        dict(name="greedy-placeholder", method="greedy", requests=[R(3, 0, "peaked", placeholder_at=1), R(2, 0, "flat", placeholder_at=0)]),
        dict(
            name="greedy-sampled",
            method="greedy",
            draft_mode="sampled",
            requests=[R(2, 0, "peaked", "near-target"), R(3, 0, "flat", "flat")],
        ),
        # strict
        dict(name="strict-fixed", method="strict", requests=[R(1, 1.0, "peaked"), R(3, 0.8, "flat", "peaked")]),
        dict(
            name="strict-sampled",
            method="strict",
            draft_mode="sampled",
            requests=[R(2, 1.0, "peaked", "near-target"), R(1, 1.5, "topk", "flat")],
        ),
        # standard, fixed drafts
        dict(name="standard-near-target", method="standard", requests=[R(1, 1.0), R(3, 0.7), R(4, 1.3, "flat")]),
        dict(name="standard-peaked-vs-flat", method="standard", requests=[R(2, 1.0, "peaked", "flat"), R(2, 1.0, "flat", "peaked")]),
        dict(name="standard-disjoint", method="standard", requests=[R(2, 1.0, "topk", "disjoint"), R(1, 1.0, "peaked", "disjoint")]),
        dict(
            name="standard-heavy-tail",
            method="standard",
            requests=[R(3, 1.0, "heavy-tail", "heavy-tail"), R(2, 2.0, "heavy-tail", "near-target")],
        ),
        dict(name="standard-topk", method="standard", requests=[R(3, 1.0, "topk", "near-target"), R(2, 1.0, "topk", "topk")]),
        dict(name="standard-zero-drafts", method="standard", requests=[R(0, 1.0), R(0, 0.5, "flat"), R(2, 1.0)]),
        dict(name="standard-placeholder", method="standard", requests=[R(3, 1.0, placeholder_at=1), R(2, 1.0, "flat", placeholder_at=0)]),
        dict(
            name="standard-small-draft-vocab",
            method="standard",
            draft_vocab_size=max(2, v // 2),
            requests=[R(2, 1.0, "flat", "flat"), R(3, 1.0, "peaked", "near-target")],
        ),
        dict(name="standard-temperatures", method="standard", requests=[R(2, 1e-4, "flat"), R(2, 0.3), R(2, 10.0, "peaked")]),
        dict(name="standard-no-draft-probs", method="standard", draft_probs=False, requests=[R(2, 1.0), R(3, 1.0, "flat", "flat")]),
        dict(name="standard-aligned-positions", method="standard", positions="aligned", requests=[R(2, 1.0, "flat", "peaked"), R(1, 1.0)]),
        dict(
            name="standard-permuted-slots",
            method="standard",
            slots="permuted",
            requests=[R(2, 0.4), R(2, 2.5, "peaked", "flat"), R(1, 1.0, "flat")],
        ),
        dict(name="standard-bf16", method="standard", dtype="bfloat16", requests=[R(2, 1.0), R(3, 0.8, "heavy-tail", "flat")]),
        dict(
            name="standard-nan-rows",
            method="standard",
            requests=[R(2, 1.0, nan_rows=(0,)), R(2, 1.0, masked_rows=(2,)), R(1, 0, nan_rows=(1,))],
        ),
        dict(name="standard-same-as-target", method="standard", requests=[R(3, 1.0, "peaked", "same"), R(2, 0.7, "flat", "same")]),
        dict(
            name="standard-large-vocab",
            method="standard",
            vocab_size=big,
            requests=[R(2, 1.0, "peaked"), R(1, 1.0, "heavy-tail", "near-target")],
        ),
        # standard, drafts sampled per trial
        dict(name="standard-sampled", method="standard", draft_mode="sampled", requests=[R(1, 1.0), R(3, 1.0, "peaked", "flat")]),
        dict(name="standard-sampled-disjoint", method="standard", draft_mode="sampled", requests=[R(2, 1.0, "topk", "disjoint")]),
        dict(
            name="standard-sampled-no-draft-probs",
            method="standard",
            draft_mode="sampled",
            draft_probs=False,
            requests=[R(2, 1.0, "peaked", "near-target")],
        ),
        # block verification
        dict(name="block-fixed", method="block", requests=[R(2, 1.0), R(3, 1.0, "peaked", "flat"), R(4, 0.8, "flat")]),
        dict(name="block-no-draft-probs", method="block", draft_probs=False, requests=[R(3, 1.0), R(2, 1.0, "flat", "flat")]),
        dict(name="block-placeholder", method="block", requests=[R(3, 1.0, placeholder_at=2), R(1, 1.0, placeholder_at=0)]),
        dict(
            name="block-sampled",
            method="block",
            draft_mode="sampled",
            requests=[R(2, 1.0, "peaked", "near-target"), R(3, 1.0, "flat", "peaked")],
        ),
        dict(name="block-greedy", method="block", requests=[R(3, 0, "peaked", "near-target")]),
        # synthetic (lossy): acceptance closed forms only
        dict(name="synthetic-mean-rate", method="synthetic", synthetic={"mean_rate": 0.6}, requests=[R(4, 1.0), R(4, 0, "flat")]),
        dict(
            name="synthetic-rates",
            method="synthetic",
            synthetic={"rates": [0.9, 0.5, 0.2]},
            requests=[R(3, 1.0), R(3, 1.0, "flat", "flat")],
        ),
        dict(
            name="synthetic-length",
            method="synthetic",
            synthetic={"acceptance_length": 2.5},
            requests=[R(4, 1.0), R(4, 0.5, "peaked", "flat")],
        ),
        dict(name="synthetic-same-as-target", method="synthetic", synthetic={"rates": [0.7, 0.4]}, requests=[R(2, 1.0, "peaked", "same")]),
        dict(
            name="synthetic-mixed-batch",
            method="standard",
            synthetic={"mean_rate": 0.5},
            requests=[R(3, 1.0, method="synthetic"), R(2, 0, method="greedy"), R(2, 1.0)],
        ),
        dict(name="synthetic-extremes", method="synthetic", synthetic={"rates": [1.0, 1.0, 0.0]}, requests=[R(3, 1.0)]),
    ]
    if profile.boundary_vocab:
        # GPU profiles: their small vocabularies are one whole CUDA tile and their large one
        # never meets an empty residual. Here every rejection's residual is empty (draft =
        # target) and the last tile is partly past V (Triton's 2048-wide, vLLM's 1024 and 8192
        # on CUDA): a masked lane must never win (GHSA-8wr5-jm2h-8r4f). Appended last, so the
        # scenarios above keep their seeds in every profile.
        specs.append(
            dict(
                name="synthetic-boundary-vocab",
                method="synthetic",
                vocab_size=profile.boundary_vocab,
                synthetic={"rates": [0.7, 0.4]},
                requests=[R(2, 1.0, "peaked", "same")],
            )
        )
    # Sampling parameters over raw target logits (reference.processing: min-p, top-k, top-p),
    # drafts at temperature only, as engines draft. After the boundary scenario: the
    # scenarios above keep their seeds.
    specs += [
        dict(name="standard-top-k", method="standard", requests=[R(2, 1.0, "peaked", top_k=3), R(3, 0.8, "flat", "flat", top_k=5)]),
        dict(name="standard-top-p", method="standard", requests=[R(2, 1.0, "peaked", top_p=0.8), R(2, 1.5, "flat", "peaked", top_p=0.5)]),
        dict(
            name="standard-min-p", method="standard", requests=[R(3, 1.0, "peaked", min_p=0.1), R(2, 0.7, "heavy-tail", "flat", min_p=0.05)]
        ),
        dict(name="standard-top-k-top-p", method="standard", requests=[R(3, 1.0, "peaked", "flat", top_k=4, top_p=0.9, min_p=1e-5)]),
        # processing removes every draft (the draft's mass is on the target's bottom half), or
        # all but one target token (the residual is a point mass)
        dict(name="standard-processing-removes-draft", method="standard", requests=[R(2, 1.0, "peaked", "disjoint", top_k=max(1, v // 2))]),
        dict(
            name="standard-processing-one-token", method="standard", requests=[R(2, 1.0, "peaked", top_p=0.01), R(2, 1.0, "flat", top_k=1)]
        ),
        dict(name="standard-sampled-top-k", method="standard", draft_mode="sampled", requests=[R(2, 1.0, "peaked", top_k=3, top_p=0.95)]),
        dict(name="block-top-p", method="block", requests=[R(3, 1.0, "peaked", "flat", top_p=0.7), R(2, 1.0, top_k=2)]),
        dict(name="greedy-top-k", method="greedy", requests=[R(2, 0, "peaked", top_k=2), R(2, 0, "flat", top_p=0.3)]),
        # an exact tie at the k-th value: the law follows the named engine's rule for it
        dict(name="standard-top-k-ties", method="standard", requests=[R(2, 1.0, "tied", "near-target", top_k=2)]),
        dict(
            name="standard-top-k-ties-sort", method="standard", processing="vllm-sort", requests=[R(2, 1.0, "tied", "near-target", top_k=2)]
        ),
        # The backend's own drafter draws the drafts (draft_mode "engine"), then its verifier
        # verifies them: the emitted tokens must follow the target, the drafts q.
        dict(name="engine-drafted", method="standard", draft_mode="engine", requests=[R(2, 1.0, "peaked", "flat"), R(3, 0.7, "flat")]),
        dict(name="engine-drafted-offset", method="standard", draft_mode="engine", requests=[R(2, 0.7, "flat", "offset")]),
        dict(
            name="engine-greedy-drafter",
            method="standard",
            draft_mode="engine",
            draft_sampling="greedy",
            requests=[R(2, 1.0, "peaked", "near-target"), R(2, 0, "flat")],
        ),
        dict(name="engine-drafted-block", method="block", draft_mode="engine", requests=[R(2, 1.0, "peaked", "flat")]),
        dict(name="engine-drafted-top-p", method="standard", draft_mode="engine", requests=[R(2, 1.0, "peaked", top_p=0.8)]),
        # Logit bias (vLLM's SamplingParams.logit_bias): added to the raw target logits before
        # temperature, never to the draft's. A bias that moves most of the mass onto a token the
        # draft proposes about 1/V of the time (flat rows, +3 at T = 0.7), one that lifts the
        # vocabulary's last id into a top-3 (the bias comes before top-k), and greedy requests,
        # whose argmax is the biased logits'.
        dict(
            name="standard-logit-bias",
            method="standard",
            requests=[
                R(2, 0.7, "flat", "flat", logit_bias={0: 3.0}),
                R(3, 1.0, "peaked", "near-target", logit_bias={1: 4.0, 2: -2.5}),
                R(2, 1.0, "peaked", "near-target", top_k=3, logit_bias={v - 1: 6.0}),
            ],
        ),
        # -100 (the OpenAI server's floor) removes a token in effect (e**-50 of its mass at most):
        # the drafted token itself (explicit drafts), or every token but one (the target becomes
        # a point mass the draft rarely proposes).
        dict(
            name="standard-logit-bias-removes",
            method="standard",
            requests=[
                R(2, 1.0, "peaked", "near-target", draft_ids=(0, 0), logit_bias={0: -100.0}),
                R(2, 1.0, "flat", "flat", logit_bias={i: -100.0 for i in range(1, v)}),
            ],
        ),
        dict(
            name="greedy-logit-bias",
            method="greedy",
            requests=[R(2, 0, "flat", "near-target", logit_bias={2: 2.0}), R(3, 0, "peaked", logit_bias={0: -100.0, 1: 6.0})],
        ),
        # Typical acceptance (vLLM V0, Medusa; reference.typical), fixed drafts: the accepted
        # count is deterministic, a rejection emits the row's argmax, only the bonus is sampled.
        # With V0's defaults (epsilon 0.09, delta 0.3) flat rows (high entropy: the threshold is
        # delta * exp(-H), below epsilon) accept drafts under epsilon, peaked rows reject them;
        # then epsilon 0.2, delta 0.5, where a request accepts one draft and rejects the next.
        dict(
            name="typical-fixed",
            method="typical",
            requests=[R(3, 1.0, "flat", "flat"), R(3, 1.0, "peaked", "flat"), R(2, 0.7, "heavy-tail"), R(2, 1.0, "peaked")],
        ),
        dict(
            name="typical-fixed-params",
            method="typical",
            posterior_threshold=0.2,
            posterior_alpha=0.5,
            requests=[R(4, 1.0, "heavy-tail", "near-target"), R(3, 0.8, "heavy-tail", "peaked"), R(2, 1.0, "flat", "near-target")],
        ),
        # FLy (vLLM 0.33.0's rejection_sample_method "fly"; reference.fly): a native rejection at
        # a row whose top-k entropy reaches the threshold is overridden when the next W drafts
        # are natively accepted. V = 6 in every profile: heavy-tail rows' entropies do not depend
        # on the seed (top-3: 0.95 at T = 1; 0.71 at T = 0.5, where all six tokens give 0.96), so
        # threshold 0.8 lets the first defer and not the second; flat drafts are often rejected.
        # The greedy requests' draft ids are chosen for the seed of the CPU profiles (argmax rows
        # [0, 2, 4], [2, 1, 2, 4], [5, 0, 1]; the GPU profiles' extra scenario above shifts the
        # seed): the first is accepted whole through an override at position 0; the second too
        # up to position 2, whose window would be the placeholder (it emits row 2's argmax); the
        # third's window fails (its second draft misses too): it emits row 0's argmax. The first
        # four templates are the scenario the CPU tests run vLLM on (suites/test_fly.py).
        dict(
            name="fly-fixed",
            method="fly",
            vocab_size=6,
            fly_window_size=1,
            fly_entropy_threshold=0.8,
            requests=[
                R(3, 1.0, "heavy-tail", "flat"),
                R(3, 0, "flat", "flat", draft_ids=(3, 2, 4)),
                R(4, 0, "flat", "flat", draft_ids=(0, 1, 5, -1)),
                R(3, 0, "flat", "flat", draft_ids=(3, 4, 1)),
                R(4, 0.5, "heavy-tail", "flat"),
                R(4, 1.0, "heavy-tail", "flat"),
                R(0, 1.0),
            ],
        ),
        # FLy with drafts drawn per trial and no draft probabilities (native acceptance p(x)),
        # vLLM's default threshold (0.3) and top-k (3), W = 1; the greedy request's drafts come
        # from its draft rows at T = 1.
        dict(
            name="fly-sampled",
            method="fly",
            vocab_size=6,
            draft_mode="sampled",
            draft_probs=False,
            fly_window_size=1,
            requests=[
                R(4, 1.0, "heavy-tail", "near-target"),
                R(3, 0.8, "peaked", "near-target"),
                R(3, 0, "peaked", "near-target"),
                R(4, 0.6, "peaked", "flat"),
                R(3, 1.0, "flat", "same"),
            ],
        ),
    ]
    out = []
    for i, spec in enumerate(specs):
        spec = {"vocab_size": v, **spec, "seed": int(hash64(seed, i) % (1 << 31))}
        spec["requests"] = tuple(spec["requests"])
        out.append(Scenario(**spec))
    return out


def find(scenarios: list[Scenario], name: str) -> Scenario:
    for s in scenarios:
        if s.name == name:
            return s
    hint = did_you_mean(name, [s.name for s in scenarios])
    raise ValueError(f"scenario: no scenario named {name!r} in this profile's catalog{hint} (see 'python -m harness scenarios')")

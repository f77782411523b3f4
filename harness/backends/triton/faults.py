"""Planted faults of the Triton sampler: one real kernel bug each, ``--backend triton-fault:NAME``.

A fault is an integer code passed to the kernels as the constexpr ``FAULT`` (0: none), so
the correct sampler compiles to the same code as without this module and every fault is
resolved at compile time. Names are those of ``harness.backends.faults`` where the bug is the same
one; ``note`` says where the Triton form differs from the reference's. Three are the
caller's bugs, planted on the kernels' inputs (``ignore-draft-probs`` and
``temperature-twice`` in ``verify()``, ``draft-before-topk`` in ``TritonFaultBackend``); the
processing pre-pass's four (28-30, 35) and two of the drafter's (32, 34) are Python branches of
the host code they live in (``processing``, ``drafting.draft``), the other two drafter faults
branches of ``_draft_kernel``.
``NOT_PLANTED`` names the reference faults this sampler has no place for, and why. This
module imports no Triton, so the registry can list and check names anywhere.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class TritonFault:
    code: int  # the kernels' FAULT constexpr
    where: str  # what is planted where
    note: str = ""  # how it differs from the same-named reference fault, if it does


# The one table: name (as in harness.backends.faults) -> code, place, difference from the reference fault.
TRITON_FAULTS = {
    "ignore-draft-probs": TritonFault(1, "verify(): draft logits dropped before the kernels (vLLM #40149, a caller bug)"),
    "temperature-twice": TritonFault(2, "verify(): target logits divided by T before the kernels divide them again"),
    "block-token-wise": TritonFault(3, "_chain_kernel: block requests verified as standard chains; no block kernel"),
    "greedy-tie-highest": TritonFault(4, "_stats_kernel / _combine_kernel: argmax ties to the highest id and last tile"),
    "nan-row-out-of-vocab": TritonFault(
        5,
        "_store_final: a NaN row's point mass sits on the argmax search's not-found id 2**31-1, not on 0 (vLLM #50183 / #53029)",
        "a draft verified at a NaN row is rejected too, then that id emitted",
    ),
    "inverted-ratio": TritonFault(6, "_chain_kernel: acceptance min(1, q(x)/p(x))"),
    "accept-at-zero-uniform": TritonFault(
        7, "_chain_kernel: acceptance u <= ratio with u on a 2**-8 grid that includes 0 (the kernel's own u is never 0)"
    ),
    "accept-placeholder": TritonFault(8, "_chain_kernel: placeholder drafts (-1) verified and accepted", "chain methods only"),
    "placeholder-as-index": TritonFault(
        9, "_chain_kernel: a placeholder (-1) wraps to id V-1 and is verified as that token", "chain methods only"
    ),
    "draft-off-by-one": TritonFault(
        10, "_chain_kernel: draft j verified against target row j+1", "acceptance only; the replacement is drawn from row j"
    ),
    "wrong-draft-step": TritonFault(
        11, "_chain_kernel: every step reads the draft logits of step 0", "acceptance only; the residual uses step j's draft"
    ),
    "synthetic-rates-as-conditional": TritonFault(12, "_chain_kernel: step j accepts with the product of rates 0..j"),
    "bonus-wrong-row": TritonFault(13, "_chain_kernel: the bonus token is drawn from the last verified row"),
    "greedy-bonus-sampled": TritonFault(14, "_chain_kernel: a greedy request's bonus token is drawn at T = 1, not the argmax"),
    "seed-collision": TritonFault(15, "_chain_kernel / _block_kernel / _pick_kernel: noise keyed by position alone (seed 0)"),
    "residual-is-target": TritonFault(
        16, "_tile_weights: the residual's weights are the target row", "block residual masses are the target's too"
    ),
    "one-hot-residual-keeps-rejected": TritonFault(
        17, "_load_job: without draft logits the rejected token is not removed from the residual", "block requests keep it too"
    ),
    "unclamped-residual": TritonFault(
        18,
        "_pick_kernel: the scan sums p - q unclamped (the split totals stay clamped)",
        "with vocabulary splits (CUDA, V >= 16384) the split is chosen from clamped masses",
    ),
    "residual-not-normalized": TritonFault(19, "_pick_kernel: the draw's threshold is u, not u times the residual's mass"),
    "reuse-uniform": TritonFault(20, "_pick_kernel: the draw reuses the acceptance uniform of its position (vLLM #47386 class)"),
    "noise-floor": TritonFault(
        21,
        "_pick_kernel: the draw's uniform has 6 bits, so tokens below that resolution starve (vLLM #43150 class)",
        "inverse CDF, not an exponential race: the resolution of u, not a floor on the noise",
    ),
    "draft-before-temperature": TritonFault(
        23, "_chain_kernel / _block_kernel / _tile_weights / draft statistics: draft logits not divided by T (vLLM #50910)"
    ),
    "oov-lane-wins": TritonFault(
        22,
        "_pick_kernel: an empty residual takes the last lane of the last tile (GHSA-8wr5-jm2h-8r4f)",
        "V a multiple of the tile (the gpu profile's V = 32): that lane is V-1, inside the vocabulary",
    ),
    "continue-after-reject": TritonFault(
        24,
        "_chain_kernel: a rejection does not end the request's loop: later drafts are verified, the bonus drawn after the last",
        "a rejected slot holds the row's argmax (a point row's replacement; strict: the target's sample), not a residual draw",
    ),
    "bonus-after-reject": TritonFault(
        25, "_chain_kernel / _block_kernel / _pick_kernel: after a rejection one more token is emitted, a copy of the replacement"
    ),
    "residual-wrong-position": TritonFault(
        26,
        "_chain_kernel / _load_job: a chain rejection's replacement is drawn from the next target row, against the "
        "rejected draft (its job carries rho = 2 as the mark)",
    ),
    "draft-before-topk": TritonFault(
        27,
        "TritonFaultBackend.sample, a caller bug: the kernels get the draft's logits before its top-k / top-p mask "
        "(masked ones set to the row's lowest finite logit, HF #32867 class); the kernels are the correct ones",
    ),
    "min-p-skipped": TritonFault(28, "processing.removed, on the host: the min-p step skipped (vLLM #42744 class)"),
    "top-p-drops-boundary": TritonFault(
        29,
        "processing.removed, on the host: top-p drops a token once its inclusive prefix mass passes p (the top one stays), "
        "so the token that reaches p is dropped",
        "a uniform row without top-k stays whole, as in the correct rules",
    ),
    "top-p-before-temperature": TritonFault(
        30,
        "processing.removed, on the host: top-p's prefix masses taken from the logits before temperature (the tempered "
        "order, min-p and top-k kept)",
        "min-p and top-k stay on the tempered distribution (the reference fault runs both untempered for top-p's set)",
    ),
    "drafter-shares-noise": TritonFault(
        31, "_draft_kernel: drafts drawn with the residual draw's uniform (seed, position, RESIDUAL) (vLLM #47386 class)"
    ),
    "drafter-after-processor": TritonFault(
        32,
        "drafting.draft, on the host: the drafting kernel samples from the draft rows after a top-2 processor "
        "(processing.removed), the verifier's q from the raw rows (HF #47932 class)",
        "exactly 2 kept, ties to the lowest ids (the reference keeps every token tied with the second)",
    ),
    "drafter-other-precision": TritonFault(
        33, "_draft_kernel: the drafting weights from logits / T rounded to bfloat16; the verifier's q is fp32 (DeepSpec #31 class)"
    ),
    "greedy-drafts-verified-with-probs": TritonFault(
        34, "drafting.draft, on the host: greedy drafts verified against the draft logits, not as point masses (HF #32867)"
    ),
    "logit-bias-skipped": TritonFault(
        35,
        "processing._apply, on the host: the requests' logit bias is never added (their top-k / top-p / min-p run on the "
        "unbiased logits), as vLLM V1's verifier under a speculative config (build_logitsprocs builds no LogitBiasLogitsProcessor)",
    ),
}

# Reference faults with no place in this sampler (not planted; ``harness.backends.faults`` has them):
NOT_PLANTED = {
    "wrong-request-slot": "the sampler has no request-state slots: every per-request input is in batch order, the kernels "
    "index it by the batch index, and no code reads ``request_slots`` (the protocol lets a sampler ignore it), so there is "
    "no slot-to-batch mapping to get wrong; permuting the temperatures before the call would replay the reference fault, "
    "not a bug of this code",
    "synthetic-decay-too-low": "the sampler receives conditional synthetic rates and never computes them: the decay floor "
    "belongs to vLLM 0.19's (base rate, decay) parameterization, which the harness turns into those rates before any "
    "backend runs (``harness.scenarios.scenario.conditional_rates``), so there is no decay in this sampler to get wrong",
    "typical-threshold-max": "the sampler has no typical acceptance (it declines Method.TYPICAL), so there is no threshold to get wrong",
    "fly-entropy-all-tokens": "the sampler has no FLy (it declines Method.FLY), so there is no entropy gate to get wrong",
    "fly-window-unchecked": "the sampler has no FLy (it declines Method.FLY), so there is no window to get wrong",
}

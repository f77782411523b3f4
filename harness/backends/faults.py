"""Planted faults: the reference sampler with exactly one real bug class each.

``--backend fault:NAME`` runs one. They prove the suite can fail: the CPU ``ci`` profile
must catch every one (``suites/test_faults.py``), naming the check that did.
"""

import dataclasses

import numpy as np

from reference import fly, rules, typical
from reference import synthetic as synth
from reference.distributions import degenerate_rows, softmax_rows
from reference.methods import Method
from reference.rng import Stream, uniforms
from reference.sampler import ReferenceSampler


class IgnoreDraftProbs(ReferenceSampler):
    """Drafts verified as point masses although draft probabilities exist (vLLM #40149)."""

    def draft_probs(self, logits, temperature, vocab_size):
        return None


class UnclampedResidual(ReferenceSampler):
    """``target - draft`` not clamped at 0 before the inverse-CDF draw of the residual."""

    def rejection_token(self, method, target_rows, draft_rows, x, u, target_sample):
        if draft_rows is None:
            return super().rejection_token(method, target_rows, draft_rows, x, u, target_sample)
        signed = target_rows - draft_rows
        c = np.cumsum(signed, axis=-1)
        threshold = u * np.maximum(signed, 0).sum(axis=-1)
        above = c > threshold[:, None]
        drawn = np.where(above.any(axis=-1), np.argmax(above, axis=-1), target_rows.shape[-1] - 1)
        return np.where(target_sample >= 0, target_sample, drawn)


class ResidualIsTarget(ReferenceSampler):
    """After a rejection, resample from the target instead of the residual."""

    def rejection_token(self, method, target_rows, draft_rows, x, u, target_sample):
        return rules.inverse_cdf(target_rows, u)


class BonusWrongRow(ReferenceSampler):
    """The bonus token is drawn from the last verified row instead of the bonus row."""

    def bonus_row(self, row_start, num_drafts):
        return row_start + np.maximum(num_drafts - 1, 0)


class ContinueAfterReject(ReferenceSampler):
    """A rejection replaces the draft but verification goes on with the next drafts."""

    stop_at_rejection = False


class GreedyTieHighest(ReferenceSampler):
    """Greedy ties broken toward the highest token id instead of the lowest."""

    def target_probs(self, logits, temperature):
        probs = softmax_rows(logits, temperature)
        greedy = np.asarray(temperature) == 0
        if greedy.any():
            rows = np.where(np.isnan(logits[greedy]), -np.inf, logits[greedy])
            vocab = rows.shape[-1]
            top = vocab - 1 - np.argmax(rows[:, ::-1], axis=-1)
            top = np.where(degenerate_rows(logits[greedy]), 0, top)
            one_hot = np.zeros((top.size, vocab))
            one_hot[np.arange(top.size), top] = 1.0
            probs[greedy] = one_hot
        return probs


class AcceptPlaceholder(ReferenceSampler):
    """Placeholder drafts (-1) are accepted like real drafts and emitted."""

    def effective_draft_counts(self, draft_tokens, cu_num_drafts):
        return np.diff(cu_num_drafts)

    def accept(self, method, target_rows, draft_rows, x, u_accept, rates, target_sample):
        safe = np.maximum(x, 0)
        ok = super().accept(method, target_rows, draft_rows, safe, u_accept, rates, target_sample)
        return ok | (x < 0)


class ReuseUniform(ReferenceSampler):
    """The acceptance uniform is reused for the residual draw (vLLM #47386's class)."""

    def residual_uniform(self, seeds, positions, u_accept):
        return u_accept


class TemperatureTwice(ReferenceSampler):
    """Temperature applied twice to the target logits (once by the caller, once in the kernel)."""

    def target_probs(self, logits, temperature):
        t = np.asarray(temperature, dtype=np.float64)
        scaled = np.asarray(logits, dtype=np.float64) / np.where(t > 0, t, 1.0)[:, None]
        return softmax_rows(scaled, temperature)


class DraftBeforeTemperature(ReferenceSampler):
    """Draft probabilities taken before temperature while drafts were sampled after it (#47932 class)."""

    def draft_probs(self, logits, temperature, vocab_size):
        return super().draft_probs(logits, np.where(np.asarray(temperature) > 0, 1.0, 0.0), vocab_size)


class DraftBeforeTopK(ReferenceSampler):
    """Draft probabilities taken before top-k/top-p masking (HF #32867 / #47932 class)."""

    def draft_probs(self, logits, temperature, vocab_size):
        if logits is None:
            return None
        x = np.asarray(logits, dtype=np.float64)
        finite = np.isfinite(x)
        floor = np.where(finite, x, np.inf).min(axis=-1, keepdims=True)
        return super().draft_probs(np.where(finite, x, floor), temperature, vocab_size)


class AcceptAtZeroUniform(ReferenceSampler):
    """``u <= ratio`` with a uniform that can be exactly 0 accepts zero-probability drafts.
    (fp32 rand hits 0 with probability 2**-24; the resolution is coarsened to 2**-8 so a CPU
    run sees it: the bug class, exaggerated in rate, not in kind.)"""

    def accept(self, method, target_rows, draft_rows, x, u_accept, rates, target_sample):
        coarse = np.floor(u_accept * 256.0) / 256.0
        ratio = rules.acceptance_probability(target_rows, draft_rows, x)
        accept = np.where(method == Method.STRICT, target_sample == x, coarse <= ratio)
        return np.where(method == Method.SYNTHETIC, u_accept < rates, accept)


class InvertedRatio(ReferenceSampler):
    """Acceptance ``min(1, draft/target)``: Chen's and Leviathan's letters swapped."""

    def accept(self, method, target_rows, draft_rows, x, u_accept, rates, target_sample):
        if draft_rows is None:
            return super().accept(method, target_rows, draft_rows, x, u_accept, rates, target_sample)
        swapped = rules.acceptance_probability(draft_rows, target_rows, x)
        accept = np.where(method == Method.STRICT, target_sample == x, u_accept < swapped)
        return np.where(method == Method.SYNTHETIC, u_accept < rates, accept)


class ResidualNotNormalized(ReferenceSampler):
    """The residual's inverse CDF compares against ``u`` instead of ``u * sum(residual)``."""

    def rejection_token(self, method, target_rows, draft_rows, x, u, target_sample):
        weights = rules.residual_weights(target_rows, draft_rows, x)
        c = np.cumsum(weights, axis=-1)
        above = c > u[:, None]
        last = weights.shape[-1] - 1 - np.argmax(weights[:, ::-1] > 0, axis=-1)
        drawn = np.where(above.any(axis=-1), np.argmax(above, axis=-1), last)
        return np.where(method == Method.STRICT, target_sample, drawn)


class ResidualWrongPosition(ReferenceSampler):
    """After a rejection at step j, the replacement is drawn with step j+1's target row."""

    def residual_rows(self, rows, bonus_rows):
        return np.minimum(rows + 1, bonus_rows)


class OneHotResidualKeepsRejected(ReferenceSampler):
    """Without draft probabilities, the residual keeps the rejected token (target not renormalized without it)."""

    def rejection_token(self, method, target_rows, draft_rows, x, u, target_sample):
        if draft_rows is None:
            drawn = rules.inverse_cdf(target_rows, u)
            return np.where(method == Method.STRICT, target_sample, drawn)
        return super().rejection_token(method, target_rows, draft_rows, x, u, target_sample)


class DraftOffByOne(ReferenceSampler):
    """Draft ``j`` verified against target row ``j + 1`` (MRV2's next-row convention misapplied)."""

    def verify_rows(self, rows, bonus_rows):
        return np.minimum(rows + 1, bonus_rows)


class WrongDraftStep(ReferenceSampler):
    """Every step reads the draft probabilities of step 0."""

    def draft_index(self, starts, step):
        return starts


class WrongRequestSlot(ReferenceSampler):
    """Per-request temperature read through the state slot as if it were the batch index."""

    def request_temperature(self, batch):
        t = np.asarray(batch.temperature, dtype=np.float64)
        if batch.request_slots is None:
            return t
        return t[np.argsort(np.argsort(batch.request_slots))]


class SeedCollision(ReferenceSampler):
    """Every request draws from the same seed: noise keyed by position alone."""

    def request_seeds(self, batch):
        return np.zeros_like(np.asarray(batch.seeds))


class BonusAfterReject(ReferenceSampler):
    """A bonus token is appended after a rejection too."""

    def verify(self, batch):
        tokens, emitted = super().verify(batch)
        counts = self.effective_draft_counts(np.asarray(batch.draft_tokens), np.asarray(batch.cu_num_drafts))
        rejected = np.flatnonzero(emitted <= counts)
        tokens[rejected, emitted[rejected]] = tokens[rejected, emitted[rejected] - 1]
        emitted[rejected] += 1
        return tokens, emitted


class PlaceholderAsIndex(ReferenceSampler):
    """A placeholder (-1) is used as a token index: it wraps to the last id and can be accepted as it."""

    def effective_draft_counts(self, draft_tokens, cu_num_drafts):
        return np.diff(cu_num_drafts)

    def verify(self, batch):
        vocab = batch.target_logits.shape[-1]
        wrapped = np.where(np.asarray(batch.draft_tokens) < 0, vocab - 1, batch.draft_tokens)
        return super().verify(dataclasses.replace(batch, draft_tokens=wrapped))


class NoiseFloor(ReferenceSampler):
    """Emitted tokens drawn by an exponential race whose noise never falls below a floor, so
    tail tokens starve (vLLM #43150: fp32 Exp(1) never below 2**-24; floor raised to 2**-6
    so a CPU run sees the bias: the bug class, exaggerated in rate, not in kind)."""

    floor = 2.0**-6

    def _race(self, weights, u):
        vocab = weights.shape[-1]
        keys = np.floor(u * 2.0**52).astype(np.int64)
        noise = -np.log(uniforms(keys[:, None], np.arange(vocab)[None, :], Stream.RESIDUAL))
        with np.errstate(divide="ignore"):
            return np.argmax(weights / np.maximum(noise, self.floor), axis=-1).astype(np.int64)

    def rejection_token(self, method, target_rows, draft_rows, x, u, target_sample):
        drawn = self._race(rules.residual_weights(target_rows, draft_rows, x), u)
        return np.where(method == Method.STRICT, target_sample, drawn)

    def bonus_token(self, target_rows, u):
        return self._race(target_rows, u)


class OutOfVocabLaneWins(ReferenceSampler):
    """An empty residual lets a padded lane of the last 8-wide tile win: an id >= V (GHSA-8wr5-jm2h-8r4f)."""

    def rejection_token(self, method, target_rows, draft_rows, x, u, target_sample):
        vocab = target_rows.shape[-1]
        raw = np.maximum(target_rows - draft_rows, 0.0) if draft_rows is not None else None
        drawn = super().rejection_token(method, target_rows, draft_rows, x, u, target_sample)
        if raw is None:
            return drawn
        padded = -(-vocab // 8) * 8
        lane = padded - 1 if padded > vocab else vocab
        return np.where(raw.sum(axis=-1) <= 0, lane, drawn)


class NanRowOutOfVocab(ReferenceSampler):
    """A NaN target row emits an out-of-range id (vLLM #21876 / #53029)."""

    def verify(self, batch):
        tokens, emitted = super().verify(batch)
        cu = np.asarray(batch.cu_num_drafts)
        last_row = cu[:-1] + np.arange(cu.size - 1) + emitted - 1
        bad = np.isnan(np.asarray(batch.target_logits)[last_row]).any(axis=-1)
        tokens[bad, emitted[bad] - 1] = batch.target_logits.shape[-1]
        return tokens, emitted


class SyntheticRatesAsConditional(ReferenceSampler):
    """Synthetic: unconditional per-position rates used as conditional ones."""

    def verify(self, batch):
        if batch.synthetic_rates is None:
            return super().verify(batch)
        wrong = np.cumprod(np.asarray(batch.synthetic_rates, dtype=np.float64), axis=1)
        return super().verify(dataclasses.replace(batch, synthetic_rates=wrong))


class SyntheticDecayTooLow(ReferenceSampler):
    """Synthetic (a): the decay floor taken as 0.75 instead of 0.85."""

    def verify(self, batch):
        if batch.synthetic_rates is None or batch.max_drafts == 0:
            return super().verify(batch)
        rates = np.array(batch.synthetic_rates, dtype=np.float64)
        for row in np.unique(rates, axis=0):
            mean = float(np.mean(synth.conditional_to_unconditional(row)))
            base, decay = synth.base_and_decay(min(max(mean, 0.0), 1.0), row.size, min_decay=0.75)
            rates[(rates == row).all(axis=1)] = base * decay ** np.arange(row.size)
        return super().verify(dataclasses.replace(batch, synthetic_rates=rates))


class GreedyBonusSampled(ReferenceSampler):
    """Greedy requests draw their bonus token by sampling at temperature 1 instead of argmax."""

    def verify(self, batch):
        tokens, emitted = super().verify(batch)
        counts = self.effective_draft_counts(np.asarray(batch.draft_tokens), np.asarray(batch.cu_num_drafts))
        cu = np.asarray(batch.cu_num_drafts)
        full = np.flatnonzero((np.asarray(batch.temperature) == 0) & (emitted == counts + 1))
        rows = cu[:-1][full] + full + counts[full]
        probs = softmax_rows(np.asarray(batch.target_logits)[rows], 1.0)
        u = uniforms(np.asarray(batch.seeds)[full], np.asarray(batch.positions)[rows], Stream.RESIDUAL)
        tokens[full, counts[full]] = rules.inverse_cdf(probs, u)
        return tokens, emitted


class BlockTokenWise(ReferenceSampler):
    """'Block verification' done token by token with the standard rule (vllm-ascend #7807)."""

    def verify(self, batch):
        methods = np.where(np.asarray(batch.methods) == Method.BLOCK, Method.STANDARD, batch.methods).astype(np.int8)
        return super().verify(dataclasses.replace(batch, methods=methods, method_codes=None))


class MinPSkipped(ReferenceSampler):
    """The verifier skips min-p although the request set it (vLLM #42744's class)."""

    def processed_target_probs(self, logits, temperature, top_k, top_p, min_p, engine, *bias):
        return super().processed_target_probs(logits, temperature, top_k, top_p, np.zeros_like(min_p), engine, *bias)


class LogitBiasSkipped(ReferenceSampler):
    """The verifier ignores the requests' logit bias: what vLLM V1's does under a speculative
    config (``build_logitsprocs`` builds no ``LogitBiasLogitsProcessor``) were a biased request
    let through (``SamplingParams._validate_spec_decode`` rejects it)."""

    def request_logit_bias(self, batch):
        return None


class TopPDropsBoundary(ReferenceSampler):
    """Top-p keeps the tokens whose inclusive prefix mass is <= p (the top one at least):
    the token that reaches p is dropped."""

    def processed_target_probs(self, logits, temperature, top_k, top_p, min_p, engine, *bias):
        probs = super().processed_target_probs(logits, temperature, top_k, np.ones_like(top_p), min_p, engine, *bias)
        order = np.argsort(-probs, axis=-1, kind="stable")
        mass = np.cumsum(np.take_along_axis(probs, order, axis=-1), axis=-1)
        keep = mass <= np.asarray(top_p)[:, None]
        keep[:, 0] = True
        mask = np.zeros_like(keep)
        np.put_along_axis(mask, order, keep, axis=-1)
        applies = (np.asarray(top_p) < 1) & (np.asarray(temperature) > 0)
        kept = np.where(applies[:, None] & ~mask, 0.0, probs)
        return kept / kept.sum(axis=-1, keepdims=True)


class TopPBeforeTemperature(ReferenceSampler):
    """Top-p's set chosen on the distribution before temperature, then the temperature
    applied to it: the engines' order temperature -> top-p broken."""

    def processed_target_probs(self, logits, temperature, top_k, top_p, min_p, engine, *bias):
        t = np.asarray(temperature)
        untempered = super().processed_target_probs(logits, np.where(t > 0, 1.0, 0.0), top_k, top_p, min_p, engine, *bias)
        probs = super().processed_target_probs(logits, temperature, top_k, np.ones_like(top_p), min_p, engine, *bias)
        kept = np.where((t[:, None] > 0) & (untempered == 0), 0.0, probs)
        return kept / kept.sum(axis=-1, keepdims=True)


class DrafterSharesNoise(ReferenceSampler):
    """The drafter draws with the verifier's residual noise at the same (seed, position): the
    recovery token after a rejection reuses the draft's uniform (vLLM #47386, fixed by #54282)."""

    def draft_uniforms(self, seeds, positions):
        return uniforms(seeds, positions, Stream.RESIDUAL)


class DrafterAfterProcessor(ReferenceSampler):
    """The drafter samples after a top-2 processor while the verifier's q is taken from the
    logits before it (HF #47932's class: q is not what the drafter sampled from)."""

    def draft_rows_probs(self, logits, temperature, sampling, vocab_size):
        probs = super().draft_rows_probs(logits, temperature, sampling, vocab_size)
        second = -np.partition(-probs, 1, axis=-1)[:, 1:2]
        kept = np.where(probs >= second, probs, 0.0)
        return kept / kept.sum(axis=-1, keepdims=True)


class DrafterOtherPrecision(ReferenceSampler):
    """The drafter divides its logits by the temperature in bfloat16 while q is verified from
    the full-precision division (DeepSpec #31's class: drafting and verification in other
    precisions)."""

    def draft_rows_probs(self, logits, temperature, sampling, vocab_size):
        t = np.asarray(temperature, dtype=np.float64)
        scaled = np.asarray(logits, dtype=np.float64) / np.where(t > 0, t, 1.0)[:, None]
        rounded = torch_free_bfloat16(scaled)
        return super().draft_rows_probs(rounded, np.where(t > 0, 1.0, 0.0), sampling, vocab_size)


class GreedyDraftsVerifiedWithProbs(ReferenceSampler):
    """Greedy drafts (the drafter's argmax) verified against the draft distribution instead of
    the point mass the drafter used (HF #32867)."""

    def sample(self, batch):
        if getattr(batch, "draft_sampling", None) != "greedy":
            return super().sample(batch)
        drafts = self.draw_drafts(batch)
        return (*self.verify(dataclasses.replace(batch, draft_tokens=drafts, draft_sampling=None)), drafts)


class TypicalThresholdMax(ReferenceSampler):
    """Typical acceptance with ``max(epsilon, delta * exp(-H))`` as its threshold instead of the
    min (vLLM V0's ``torch.minimum``): high-entropy rows reject drafts V0 accepts."""

    def typical_accept(self, target_rows, x, posterior_threshold, posterior_alpha):
        p_x = np.take_along_axis(np.asarray(target_rows), np.maximum(x, 0)[:, None], axis=-1)[:, 0]
        thr = np.maximum(posterior_threshold, np.asarray(posterior_alpha) * np.exp(-typical.entropy(target_rows)))
        return (x >= 0) & (p_x > thr)


class FlyEntropyAllTokens(ReferenceSampler):
    """FLy's entropy gate summed over the whole target row instead of its ``top_k`` largest
    probabilities (``compute_fly_entropy``'s ``torch.topk``): rows below the threshold on
    their top-k but above it on all tokens defer rejections vLLM keeps."""

    def fly_entropy(self, gate_rows, top_k):
        return fly.topk_entropy(gate_rows, np.asarray(gate_rows).shape[-1])


class FlyWindowUnchecked(ReferenceSampler):
    """FLy overrides a deferrable native rejection once a window fits, without the next ``W``
    positions' native acceptances (the window's purpose): more drafts are accepted."""

    def fly_passes(self, native, deferred, num_drafts, window):
        d = native.shape[1]
        fits = np.arange(d)[None, :] + np.asarray(window)[:, None] < np.asarray(num_drafts)[:, None]
        return native | (deferred & fits)


def torch_free_bfloat16(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to bfloat16 (nearest even), as float64."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
    return np.where(np.isfinite(x), rounded.astype(np.uint32).view(np.float32), x).astype(np.float64)


FAULTS = {
    "ignore-draft-probs": IgnoreDraftProbs,
    "unclamped-residual": UnclampedResidual,
    "residual-is-target": ResidualIsTarget,
    "bonus-wrong-row": BonusWrongRow,
    "continue-after-reject": ContinueAfterReject,
    "greedy-tie-highest": GreedyTieHighest,
    "accept-placeholder": AcceptPlaceholder,
    "reuse-uniform": ReuseUniform,
    "temperature-twice": TemperatureTwice,
    "draft-before-temperature": DraftBeforeTemperature,
    "draft-before-topk": DraftBeforeTopK,
    "accept-at-zero-uniform": AcceptAtZeroUniform,
    "inverted-ratio": InvertedRatio,
    "residual-not-normalized": ResidualNotNormalized,
    "residual-wrong-position": ResidualWrongPosition,
    "one-hot-residual-keeps-rejected": OneHotResidualKeepsRejected,
    "draft-off-by-one": DraftOffByOne,
    "wrong-draft-step": WrongDraftStep,
    "wrong-request-slot": WrongRequestSlot,
    "seed-collision": SeedCollision,
    "bonus-after-reject": BonusAfterReject,
    "placeholder-as-index": PlaceholderAsIndex,
    "noise-floor": NoiseFloor,
    "oov-lane-wins": OutOfVocabLaneWins,
    "nan-row-out-of-vocab": NanRowOutOfVocab,
    "synthetic-rates-as-conditional": SyntheticRatesAsConditional,
    "synthetic-decay-too-low": SyntheticDecayTooLow,
    "greedy-bonus-sampled": GreedyBonusSampled,
    "block-token-wise": BlockTokenWise,
    "min-p-skipped": MinPSkipped,
    "logit-bias-skipped": LogitBiasSkipped,
    "top-p-drops-boundary": TopPDropsBoundary,
    "top-p-before-temperature": TopPBeforeTemperature,
    "drafter-shares-noise": DrafterSharesNoise,
    "drafter-after-processor": DrafterAfterProcessor,
    "drafter-other-precision": DrafterOtherPrecision,
    "greedy-drafts-verified-with-probs": GreedyDraftsVerifiedWithProbs,
    "typical-threshold-max": TypicalThresholdMax,
    "fly-entropy-all-tokens": FlyEntropyAllTokens,
    "fly-window-unchecked": FlyWindowUnchecked,
}

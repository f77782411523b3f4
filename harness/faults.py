"""Planted faults: the reference sampler with exactly one real bug class each.

``--backend fault:NAME`` runs one. They prove the suite can fail: the CPU ``ci`` profile
must catch every one (``suites/test_faults.py``), naming the check that did.
"""

import numpy as np

from reference import rules
from reference.distributions import degenerate_rows, softmax_rows
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


FAULTS = {
    "ignore-draft-probs": IgnoreDraftProbs,
    "unclamped-residual": UnclampedResidual,
    "residual-is-target": ResidualIsTarget,
    "bonus-wrong-row": BonusWrongRow,
    "continue-after-reject": ContinueAfterReject,
    "greedy-tie-highest": GreedyTieHighest,
    "accept-placeholder": AcceptPlaceholder,
    "reuse-uniform": ReuseUniform,
}

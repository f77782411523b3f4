"""Planted tree faults: the reference samplers (``reference.tree``) with one bug each.

Each class names the rule it implements (``rule``) and gives its own exact law on a tree
with fixed children (``law``), so its distance from the correct law is known, not guessed.
``FAULTS`` maps the name a run uses (``tree-fault:NAME``) to the class. Distances, and the
profile that catches each fault, are in docs/trees.md ("Planted faults").
"""

import numpy as np

from reference import rules
from reference import tree as tr


def _normalized(w: np.ndarray) -> np.ndarray:
    """The law an inverse-CDF draw from ``w`` gives (``V - 1`` when empty, as the kernel)."""
    if w.sum() > 0:
        return w / w.sum()
    out = np.zeros_like(w)
    out[-1] = 1.0
    return out


class SGLangResidualKeepsSiblings(tr.SGLangTreeSampler):
    """After every child is rejected, the token is drawn from the full target row: the
    rejected siblings' mass is not removed (the kernel's ``draft_probs[x] = target[x]`` lost)."""

    rule = "sglang"

    def stop_weights(self, tree, target):
        return target

    def law(self, tree, thresholds=(1.0, 1.0)) -> np.ndarray:
        """Where the walk stops is unchanged; the token is drawn from the stop node's full row."""
        return tr.sglang_law(tree, *thresholds).sum(axis=1, keepdims=True) * tree.target_probs()


class SGLangCoinPerSibling(tr.SGLangTreeSampler):
    """Each sibling tested against its own mass (``coin <= p(x)``), not the running sum."""

    rule = "sglang"

    def accepts(self, coin, prob_acc, p_single, threshold_single, threshold_acc):
        return super().accepts(coin, p_single, p_single, threshold_single, threshold_acc)

    def law(self, tree, thresholds=(1.0, 1.0)) -> np.ndarray:
        """Sibling ``i`` accepts coins up to its own edge ``e_i = min(1, p(x_i) / acc)`` (1
        when ``p(x_i) >= single``); the first that accepts wins, so it takes ``max(0, e_i -
        max_{j<i} e_j)``."""
        single, acc = tr.check_thresholds(*thresholds)
        target = tree.target_probs()
        residual = tr.sglang_residual_rows(tree, target)
        reach = np.zeros(tree.num_nodes)
        reach[0] = 1.0
        law = np.zeros_like(target)
        for n, kids in enumerate(tr.children_lists(tree.parents)):
            covered = 0.0
            for k in kids:
                p = target[n, tree.tokens[k]]
                edge = 1.0 if p >= single else min(1.0, p / acc)
                reach[k] = reach[n] * max(edge - covered, 0.0)
                covered = max(covered, edge)
            law[n] = reach[n] * (1.0 - covered) * _normalized(residual[n])
        return law


class SpecInferUnnormalizedResidual(tr.SpecInferTreeSampler):
    """``max(p - q, 0)`` not renormalized: later children see a smaller ratio."""

    rule = "specinfer"

    def residual(self, p, q):
        w = np.maximum(p - q, 0.0)
        return np.where(w.sum(axis=-1, keepdims=True) > 0, w, p)

    def law(self, tree, thresholds=None) -> np.ndarray:
        """SpecInfer's law (``reference.tree.specinfer_law``) with the residual unnormalized:
        the ratio ``p'(x) / q(x)`` of later children shrinks; the final draw normalizes."""
        target = tree.target_probs()
        reach = np.zeros(tree.num_nodes)
        reach[0] = 1.0
        law = np.zeros_like(target)
        for n, kids in enumerate(tr.children_lists(tree.parents)):
            p, rejected = target[n], 1.0
            for k in kids:
                q = tree.draft_probs[k]
                a = float(min(rules.ratio(p[tree.tokens[k]], q[tree.tokens[k]]), 1.0))
                reach[k] = reach[n] * rejected * a
                rejected *= 1.0 - a
                p = self.residual(p, q)
            law[n] = reach[n] * rejected * _normalized(p)
        return law


FAULTS = {
    "sglang-residual-keeps-siblings": SGLangResidualKeepsSiblings,
    "sglang-coin-per-sibling": SGLangCoinPerSibling,
    "specinfer-unnormalized-residual": SpecInferUnnormalizedResidual,
}

"""TODO docstring."""

from harness.checking.stats import holm
from harness.evidence.records import CheckRecord


def apply_holm(records: list[CheckRecord], alpha: float) -> float:
    """Holm over every statistical check of the run; exact checks stand on their own."""
    stat = [r for r in records if r.kind in ("gof", "binomial") and r.p_value is not None]
    family = alpha * max(len(stat), 1)
    if stat:
        rejected, thresholds = holm([r.p_value for r in stat], family)
        for r, rej, thr in zip(stat, rejected, thresholds):
            r.holm_threshold = float(thr)
            r.verdict = "fail" if rej else "pass"
    return family

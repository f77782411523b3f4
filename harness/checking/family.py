"""The run's family rule: the one place where a statistical check gets its verdict.

Holm's step-down over every statistical check of the run controls the family-wise
false-alarm rate at ``alpha * m`` (``m`` statistical checks): it rejects everything
Bonferroni at per-check ``alpha`` would, and more, so each check's stated power still
holds. Exact checks stand on their own (any deviation fails them).
"""

from harness.checking.stats import holm
from harness.evidence.records import CheckRecord, Verdict


def decide_verdicts(records: list[CheckRecord], alpha: float) -> float:
    """Give every statistical record its verdict by Holm at family level ``alpha * m``.

    Parameters
    ----------
    records : list of CheckRecord
        The run's records; statistical ones (``kind.statistical``) come with ``verdict`` None
        and their ``p_value``; the others already have their verdict.
    alpha : float
        Each check's own level (the profile's alpha).

    Returns
    -------
    float
        The family-wise level the run's statistical checks were held to.
    """
    stat = [r for r in records if r.kind.statistical]
    family = alpha * max(len(stat), 1)
    if stat:
        rejected, thresholds = holm([r.p_value for r in stat], family)
        for r, rej, thr in zip(stat, rejected, thresholds):
            r.holm_threshold = float(thr)
            r.verdict = Verdict.FAIL if rej else Verdict.PASS
    return family

"""Calibrated statistics: goodness of fit, exact binomial tests, Holm.

Every distribution check comes as a triple (TensorFlow Probability's habit): the test
(here), the smallest discrepancy it detects at a given number of trials, and the number
of trials needed for a discrepancy (``power.py``). Discrepancy is total variation (TV)
between the observed law and the expected one, on the check's cells after pooling
(``pooling.py``).

Goodness of fit is Pearson's chi-square (ddof = 0). The G-test was measured first and
rejected: at the small expected counts pooling allows (>= 5 per cell) its p-values are
measurably non-uniform (KS p < 1e-3 over 9,000 null checks) while Pearson's are not.
A cell of expected probability 0 is never pooled: one observation there is an impossible
outcome and fails the check outright (p-value 0).
"""

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from harness.checking.pooling import pooled


# --- tests ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class GofResult:
    """The outcome of a chi-square goodness-of-fit test.

    Attributes
    ----------
    statistic : float
        Pearson's ``X^2 = sum (o - e)^2 / e`` over the pooled bins of positive expectation.
    df : int
        Degrees of freedom: those bins less the number of segments, at least 1.
    p_value : float
        ``P(chi2(df) >= statistic)``; 0 when any observation fell in an impossible cell.
    trials : int
        Observations in all, ``impossible`` included.
    cells : int
        Pooled bins of positive expectation.
    impossible : int
        Observations in zero-probability cells.
    tv_estimate : float
        Plug-in total variation between the observed and expected counts, per observation
        (per trial for one multinomial).
    tv_ci : tuple of (float, float), or None
        95% multinomial-bootstrap interval of ``tv_estimate`` (biased upward: an upper-side
        effect size), None when it was not computed.
    pooled : tuple of (ndarray, ndarray), or None
        ``(observed, expected)`` float64 counts per pooled bin, shape ``(bins,)`` each.
    """

    statistic: float
    df: int
    p_value: float
    trials: int
    cells: int
    impossible: int  # observations in zero-probability cells
    tv_estimate: float
    tv_ci: tuple[float, float] | None
    pooled: tuple[np.ndarray, np.ndarray] | None = None  # (observed, expected) per pooled cell


def chi_square_test(observed, expected, bins, segments=None, rng=None, with_ci=True) -> GofResult:
    """Pearson chi-square of ``observed`` counts against ``expected`` counts, pooled by ``bins``.

    ``segments`` (one id per cell) splits the cells into independent multinomials whose
    sizes are fixed by conditioning (product-multinomial); ``expected`` must already be
    scaled to each segment's observed size. ``df = pooled cells - number of segments``.

    Without ``segments`` and with ``with_ci``, this is ``chi_square_pooled`` of the pooled
    counts (effect size over the bins). Otherwise the effect size is taken over the raw
    cells: with ``with_ci``, with a bootstrap interval resampled within each segment;
    without, the plug-in TV alone.

    Parameters
    ----------
    observed : array_like of float
        Observed count of every cell, any shape (read flattened).
    expected : array_like of float
        Expected count of every cell, same number of cells as ``observed``.
    bins : ndarray of int, shape (cells,)
        Bin id of every cell (``pool_cells``, ``Pooling.bins``), -1 for cells of expected
        probability 0 (an observation there makes the p-value 0).
    segments : array_like of int, shape (cells,), or None, default None
        Segment id of every cell; None: one multinomial.
    rng : numpy.random.Generator or None, default None
        Generator for the bootstrap interval; None uses ``np.random.default_rng(0)``.
    with_ci : bool, default True
        Whether to compute the bootstrap interval ``tv_ci``.

    Returns
    -------
    GofResult
        The statistic, df, p-value and effect size, with the pooled ``(observed,
        expected)`` counts; ``tv_ci`` None when ``with_ci`` is False.
    """
    observed = np.asarray(observed, dtype=np.float64).ravel()
    expected = np.asarray(expected, dtype=np.float64).ravel()
    impossible = int(observed[bins < 0].sum())
    o, e = pooled(observed, bins), pooled(expected, bins)
    if segments is None and with_ci:
        return chi_square_pooled(o, e, impossible, rng)
    seg = np.zeros(observed.size, dtype=np.int64) if segments is None else np.asarray(segments).ravel()
    n_segments = np.unique(seg[(bins >= 0) & (expected > 0)]).size if segments is not None else int((e > 0).any())
    r = _pearson(o, e, impossible, n_segments)
    if with_ci:
        tv, ci = _tv_with_ci(observed, expected, seg, rng)
    else:
        tv, ci = 0.5 * float(np.abs(observed - expected).sum()) / max(r.trials, 1), None
    return GofResult(r.statistic, r.df, r.p_value, r.trials, r.cells, impossible, tv, ci, (o, e))


def chi_square_pooled(o, e, impossible: int = 0, rng=None) -> GofResult:
    """``chi_square_test`` of one multinomial from its pooled counts: ``o`` observed and ``e``
    expected per bin, ``impossible`` observations outside every bin (zero-probability
    cells, counted as one more cell of the effect size). The effect size is taken over the
    bins: at V = 152k the raw cells' plug-in TV is mostly sampling noise, and resampling
    10^5 cells takes seconds.

    Parameters
    ----------
    o : ndarray of float, shape (bins,)
        Observed count per bin.
    e : ndarray of float, shape (bins,)
        Expected count per bin, summing to the trials observed in the bins.
    impossible : int, default 0
        Observations in zero-probability cells; any makes the p-value 0.
    rng : numpy.random.Generator or None, default None
        Generator for the bootstrap interval; None uses ``np.random.default_rng(0)``.

    Returns
    -------
    GofResult
        With ``df = `` bins of positive expectation ``- 1`` (at least 1), a bootstrap
        ``tv_ci``, and ``pooled = (o, e)``.
    """
    r = _pearson(o, e, impossible, int((e > 0).any()))
    tv, ci = _tv_with_ci(np.append(o, float(impossible)), np.append(e, 0.0), np.zeros(o.size + 1, dtype=np.int64), rng)
    return GofResult(r.statistic, r.df, r.p_value, r.trials, r.cells, impossible, tv, ci, (o, e))


def _pearson(o, e, impossible: int, n_segments: int) -> GofResult:
    """The statistic, df and p-value over pooled bins (no effect size)."""
    live = e > 0
    df = max(int(live.sum()) - n_segments, 1)
    x2 = float(np.sum((o[live] - e[live]) ** 2 / e[live]))
    p = 0.0 if impossible else float(stats.chi2.sf(x2, df))
    return GofResult(x2, df, p, int(round(float(o.sum()))) + impossible, int(live.sum()), impossible, 0.0, None)


def _tv_with_ci(observed, expected, seg, rng, reps: int = 200):
    """Plug-in TV per trial, with a 95% multinomial-bootstrap interval (biased upward by
    about sqrt(cells / n): read it as an upper-side effect size, not an unbiased one)."""
    n = observed.sum()
    if n <= 0:
        return 0.0, (0.0, 0.0)
    tv = 0.5 * float(np.abs(observed - expected).sum()) / n
    rng = rng if rng is not None else np.random.default_rng(0)
    # Resampled counts are 0 wherever nothing was observed: those cells add |0 - expected|
    # to every replicate, so only observed cells are resampled (few, of 10^6 at large V).
    seen = observed > 0
    unseen = float(expected[~seen].sum())
    observed, expected, seg = observed[seen], expected[seen], seg[seen]
    sims = np.zeros((reps, observed.size))
    for s in np.unique(seg):
        idx = np.flatnonzero(seg == s)
        size = int(observed[idx].sum())
        sims[:, idx] = rng.multinomial(size, observed[idx] / size, size=reps)
    boots = 0.5 * (np.abs(sims - expected).sum(axis=1) + unseen) / n
    lo, hi = np.quantile(boots, [0.025, 0.975])
    return tv, (float(lo), float(hi))


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial rate (for display next to exact tests).

    Parameters
    ----------
    successes : int
        Successes observed, in ``[0, trials]``.
    trials : int
        Trials observed.
    confidence : float, default 0.95
        The interval's two-sided coverage, in ``(0, 1)``.

    Returns
    -------
    lo, hi : float
        The interval, clipped to ``[0, 1]``; ``(0.0, 1.0)`` when ``trials <= 0``.
    """
    if trials <= 0:
        return 0.0, 1.0
    z = float(stats.norm.isf((1 - confidence) / 2))
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def binomial_test(successes: int, trials: int, rate: float) -> float:
    """Two-sided exact binomial p-value; a deterministic rate makes any deviation p = 0.

    Parameters
    ----------
    successes : int
        Successes observed, in ``[0, trials]``.
    trials : int
        Trials observed.
    rate : float
        The success rate under the null, in ``[0, 1]``.

    Returns
    -------
    float
        ``scipy.stats.binomtest``'s two-sided p-value; 1.0 when ``trials == 0``; for
        ``rate`` 0 or 1, 1.0 if ``successes == rate * trials`` else 0.0.

    Raises
    ------
    ValueError
        From ``scipy.stats.binomtest``, when ``trials > 0`` and ``rate`` is outside
        ``[0, 1]``, or ``0 < rate < 1`` and ``successes`` is outside ``[0, trials]``.
    """
    if trials == 0:
        return 1.0
    if rate in (0.0, 1.0):
        return 1.0 if successes == round(rate * trials) else 0.0
    return float(stats.binomtest(successes, trials, rate).pvalue)


def holm(p_values, family_alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Holm's step-down: (rejected mask, per-check threshold it was compared with).

    The ``k``-th smallest p-value (``k = 0, 1, ...``, ties in input order) is compared with
    ``family_alpha / (m - k)``; checks are rejected in that order until the first that is
    not, controlling the family-wise error rate at ``family_alpha``.

    Parameters
    ----------
    p_values : array_like of float, shape (m,)
        One p-value per check.
    family_alpha : float
        The family-wise false-alarm rate.

    Returns
    -------
    rejected : ndarray of bool, shape (m,)
        Whether each check is rejected.
    thresholds : ndarray of float64, shape (m,)
        The threshold each check's p-value was compared with (given for every check, those
        past the first non-rejection included).
    """
    p = np.asarray(p_values, dtype=np.float64)
    m = p.size
    order = np.argsort(p, kind="stable")
    thresholds = np.empty(m)
    rejected = np.zeros(m, dtype=bool)
    still = True
    for rank, i in enumerate(order):
        thresholds[i] = family_alpha / (m - rank)
        if still and p[i] <= thresholds[i]:
            rejected[i] = True
        else:
            still = False
    return rejected, thresholds

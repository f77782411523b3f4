"""Calibrated statistics: goodness of fit, exact binomial tests, power, Holm.

Every distribution check comes as a triple (TensorFlow Probability's habit): the test,
the smallest discrepancy it detects at a given number of trials, and the number of
trials needed for a discrepancy. Discrepancy is total variation (TV) between the observed
law and the expected one, on the check's cells after pooling.

Goodness of fit is Pearson's chi-square (ddof = 0). The G-test was measured first and
rejected: at the small expected counts pooling allows (>= 5 per cell) its p-values are
measurably non-uniform (KS p < 1e-3 over 9,000 null checks) while Pearson's are not.

Guarantee: under the chi-square approximation, a Pearson test at level ``alpha`` with ``df``
degrees of freedom detects, with probability at least ``power``, any alternative whose TV
from the null (on the pooled cells) is at least ``eps`` once
``n >= lambda(alpha, power, df) / (4 eps^2)``, where ``lambda`` is the noncentrality at
which a noncentral chi-square exceeds the level-``alpha`` critical value with probability
``power``. This is because Cohen's ``w = sqrt(sum (p1 - p0)^2 / p0) >= 2 TV``
(Cauchy-Schwarz). For product-multinomial checks (one multinomial per draft step, over the
trials that reach it) the bound on the per-trial path law's TV carries a factor ``steps``,
the expected number of steps a trial visits: ``n >= lambda * steps / (4 eps^2)``.

Cells are pooled from the expected probabilities only, never from the observed counts.
A cell of expected probability 0 is never pooled: one observation there is an impossible
outcome and fails the check outright (p-value 0).
"""

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import stats
from scipy.optimize import brentq

MIN_EXPECTED = 5.0  # per pooled cell, for the chi-square approximation
MAX_BINS = 100  # pooled cells per check: bounds df, so large vocabularies do not inflate trial counts


@lru_cache(maxsize=4096)
def noncentrality(alpha: float, power: float, df: int) -> float:
    """The noncentrality at which a level-``alpha`` chi-square test has ``power``."""
    _check_rates(alpha, power)
    if df < 1:
        raise ValueError(f"df: expected at least 1 degree of freedom, got {df}")
    crit = stats.chi2.isf(alpha, df)
    hi = 1.0
    while stats.ncx2.sf(crit, df, hi) < power:
        hi *= 2.0
    return brentq(lambda lam: stats.ncx2.sf(crit, df, lam) - power, 0.0, hi, xtol=1e-10)


def _check_rates(alpha: float, power: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha: expected a false-alarm rate in (0, 1), got {alpha!r}")
    if not 0 < power < 1:
        raise ValueError(f"power: expected a power in (0, 1), got {power!r}")


def trials_for_tv(alpha: float, power: float, tv: float, df: int, steps: float = 1.0) -> int:
    """Trials a chi-square test needs to detect every alternative with TV >= ``tv``."""
    if not 0 < tv <= 1:
        raise ValueError(f"tv: expected a total-variation distance in (0, 1], got {tv!r}")
    return math.ceil(noncentrality(alpha, power, df) * steps / (4.0 * tv * tv))


def detectable_tv(alpha: float, power: float, df: int, trials: int, steps: float = 1.0) -> float:
    """The smallest TV a chi-square test with ``trials`` trials detects with probability ``power``."""
    if trials <= 0:
        return math.inf
    return math.sqrt(noncentrality(alpha, power, df) * steps / (4.0 * trials))


def exact_detectable_rate(power: float, trials: int) -> float:
    """Smallest violation rate an exact check (any violation fails) catches with ``power``."""
    if trials <= 0:
        return 1.0
    return 1.0 - (1.0 - power) ** (1.0 / trials)


def exact_trials_for_rate(power: float, rate: float) -> int:
    return math.ceil(math.log(1.0 - power) / math.log1p(-rate))


# --- pooling -------------------------------------------------------------------------------
def pool_cells(expected: np.ndarray, min_expected: float = MIN_EXPECTED) -> np.ndarray:
    """Bin id per cell, from expected counts alone; -1 marks impossible (zero) cells.

    Cells with at least ``min_expected`` stay alone; the rest, in order of decreasing
    expectation, are merged into bins of at least ``min_expected`` each; a final short bin
    joins the previous one.
    """
    pooling = Pooling(expected)
    return pooling.bins(min_expected)


class Pooling:
    """Cells sorted once by decreasing expectation, pooled at any threshold: a large
    vocabulary has 10^6 cells and ``capped`` tries ~60 thresholds. ``expected`` may be
    probabilities: ``capped(max_bins, trials)`` pools the expected counts ``trials * p``."""

    def __init__(self, expected):
        self.expected = np.asarray(expected, dtype=np.float64).ravel()
        possible = np.flatnonzero(self.expected > 0)  # most cells are impossible at large V: not sorted
        self.order = possible[np.argsort(-self.expected[possible], kind="stable")]
        self.values = self.expected[self.order]
        self.running = np.cumsum(self.values)

    def _edges(self, min_expected: float, limit: int | None = None) -> tuple[int, list[int]]:
        """(cells alone, sorted positions where each pooled bin closes): a bin closes where
        the running sum since the previous one reaches ``min_expected`` (one binary search
        per bin, not a Python step per cell). Stops early past ``limit`` bins."""
        alone = int(np.searchsorted(-self.values, -min_expected, side="right"))
        ends, base = [], self.running[alone - 1] if alone else 0.0
        while limit is None or alone + len(ends) <= limit:
            end = int(np.searchsorted(self.running, base + min_expected, side="left"))
            if end >= self.values.size:
                return alone, ends
            ends.append(end)
            base = self.running[end]
        return alone, ends

    def count(self, min_expected: float, limit: int | None = None) -> int:
        """Bins at this threshold (any number above ``limit`` when it stops early)."""
        alone, ends = self._edges(min_expected, limit)
        if alone + len(ends) == 0 and self.values.size:
            return 1  # every possible cell in one short bin
        return alone + len(ends)

    def cap(self, max_bins: int = MAX_BINS, trials: float = 1.0) -> float:
        """The smallest per-bin threshold on ``expected`` (the expected count ``trials *
        expected`` at least MIN_EXPECTED) that leaves at most ``max_bins`` bins, to within a
        relative 1e-4 (geometric bisection: ~20 rounds where halving would take 60)."""
        lo = MIN_EXPECTED / trials  # thresholds on ``expected``: a count m is m / trials of it
        if self.count(lo, max_bins) <= max_bins:
            return lo
        hi = max(float(np.sum(self.expected)), lo)
        while hi > lo * (1 + 1e-4):  # fewer bins as the threshold grows
            mid = math.sqrt(lo * hi)
            if self.count(mid, max_bins) <= max_bins:
                hi = mid
            else:
                lo = mid
        return hi

    def capped(self, max_bins: int = MAX_BINS, trials: float = 1.0) -> np.ndarray:
        """Bins at ``cap(max_bins, trials)``."""
        return self.bins(self.cap(max_bins, trials))

    def bins(self, min_expected: float) -> np.ndarray:
        alone, ends = self._edges(min_expected)
        out = np.full(self.expected.size, -1, dtype=np.int64)
        out[self.order[:alone]] = np.arange(alone)
        rest = np.arange(alone, self.values.size)
        pooled_bin = alone + np.searchsorted(np.asarray(ends, dtype=np.int64), rest, side="left")
        # A final short bin joins the previous one (bin 0 when there is none).
        out[self.order[alone:]] = np.minimum(pooled_bin, max(alone + len(ends) - 1, 0))
        return out


def pooled(values: np.ndarray, bins: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64).ravel()
    keep = bins >= 0
    return np.bincount(bins[keep], weights=values[keep], minlength=int(bins.max(initial=-1)) + 1)


# --- tests ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class GofResult:
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
    10^5 cells takes seconds."""
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
    """Wilson score interval for a binomial rate (for display next to exact tests)."""
    if trials <= 0:
        return 0.0, 1.0
    z = float(stats.norm.isf((1 - confidence) / 2))
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def binomial_test(successes: int, trials: int, rate: float) -> float:
    """Two-sided exact binomial p-value; a deterministic rate makes any deviation p = 0."""
    if trials == 0:
        return 1.0
    if rate in (0.0, 1.0):
        return 1.0 if successes == round(rate * trials) else 0.0
    return float(stats.binomtest(successes, trials, rate).pvalue)


def binomial_detectable(alpha: float, power: float, rate: float, trials: int) -> float:
    """Smallest shift of a Bernoulli rate (= its TV) the two-sided test detects."""
    if trials <= 0:
        return math.inf
    if rate in (0.0, 1.0):
        return exact_detectable_rate(power, trials)
    za, zb = stats.norm.isf(alpha / 2), stats.norm.isf(1 - power)
    delta = (za + zb) * math.sqrt(rate * (1 - rate) / trials)
    for _ in range(20):  # the alternative's own variance, on the worse side
        worst = max(v * (1 - v) for v in (min(rate + delta, 1.0), max(rate - delta, 0.0)))
        delta = (za * math.sqrt(rate * (1 - rate)) + zb * math.sqrt(worst)) / math.sqrt(trials)
    return delta


def binomial_trials(alpha: float, power: float, rate: float, shift: float) -> int:
    """Trials for the two-sided binomial test to detect a rate shift of ``shift``."""
    if rate in (0.0, 1.0):
        return exact_trials_for_rate(power, shift)
    n = 1
    while binomial_detectable(alpha, power, rate, n) > shift:
        n *= 2
    lo, hi = n // 2, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if binomial_detectable(alpha, power, rate, mid) <= shift else (mid, hi)
    return hi


def trials_to_reach(needed: int, reach: float, miss_rate: float) -> int:
    """Trials so that, with probability ``1 - miss_rate``, at least ``needed`` of them reach a
    step each trial reaches with probability ``reach`` (normal bound on the binomial)."""
    if reach >= 1.0:
        return needed
    z = float(stats.norm.isf(miss_rate))
    spread = z * math.sqrt(reach * (1 - reach))
    root = (spread + math.sqrt(spread * spread + 4 * reach * needed)) / (2 * reach)
    return math.ceil(root * root)


def holm(p_values, family_alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Holm's step-down: (rejected mask, per-check threshold it was compared with)."""
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

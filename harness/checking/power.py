"""Power: the trials a check needs for its stated discrepancy, and the discrepancy it
detects at a given number of trials.

Guarantee: under the chi-square approximation, a Pearson test at level ``alpha`` with ``df``
degrees of freedom detects, with probability at least ``power``, any alternative whose TV
from the null (on the pooled cells) is at least ``eps`` once
``n >= lambda(alpha, power, df) / (4 eps^2)``, where ``lambda`` is the noncentrality at
which a noncentral chi-square exceeds the level-``alpha`` critical value with probability
``power``. This is because Cohen's ``w = sqrt(sum (p1 - p0)^2 / p0) >= 2 TV``
(Cauchy-Schwarz). For product-multinomial checks (one multinomial per draft step, over the
trials that reach it) the bound on the per-trial path law's TV carries a factor ``steps``,
the expected number of steps a trial visits: ``n >= lambda * steps / (4 eps^2)``. Exact
checks and binomial tests have their own closed forms below.
"""

import math
from functools import lru_cache

from scipy import stats
from scipy.optimize import brentq


@lru_cache(maxsize=4096)
def noncentrality(alpha: float, power: float, df: int) -> float:
    """The noncentrality at which a level-``alpha`` chi-square test has ``power``.

    Solves ``P(ncx2(df, lam) > chi2.isf(alpha, df)) = power`` for ``lam`` (to 1e-10).
    Results are cached.

    Parameters
    ----------
    alpha : float
        The test's level (false-alarm rate), in ``(0, 1)``.
    power : float
        The wanted probability of rejecting, in ``(0, 1)``.
    df : int
        Degrees of freedom, at least 1.

    Returns
    -------
    float
        The noncentrality ``lambda(alpha, power, df)`` of the module docstring.

    Raises
    ------
    ValueError
        If ``alpha`` or ``power`` is outside ``(0, 1)`` or ``df < 1``.
    """
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
    """Trials a chi-square test needs to detect every alternative with TV >= ``tv``.

    ``ceil(lambda(alpha, power, df) * steps / (4 tv^2))``: the module docstring's guarantee.

    Parameters
    ----------
    alpha : float
        The test's level, in ``(0, 1)``.
    power : float
        The probability of detecting such an alternative, in ``(0, 1)``.
    tv : float
        The smallest total-variation distance (on the pooled cells) to detect, in ``(0, 1]``.
    df : int
        The test's degrees of freedom, at least 1.
    steps : float, default 1.0
        For a product-multinomial check, the expected number of steps a trial visits (the
        TV is then that of the per-trial path law); 1 for one multinomial.

    Returns
    -------
    int
        The number of trials.

    Raises
    ------
    ValueError
        If ``tv`` is outside ``(0, 1]``, or as ``noncentrality`` for ``alpha``, ``power``, ``df``.
    """
    if not 0 < tv <= 1:
        raise ValueError(f"tv: expected a total-variation distance in (0, 1], got {tv!r}")
    return math.ceil(noncentrality(alpha, power, df) * steps / (4.0 * tv * tv))


def detectable_tv(alpha: float, power: float, df: int, trials: int, steps: float = 1.0) -> float:
    """The smallest TV a chi-square test with ``trials`` trials detects with probability ``power``.

    The inverse of ``trials_for_tv``: ``sqrt(lambda(alpha, power, df) * steps / (4 trials))``.

    Parameters
    ----------
    alpha : float
        The test's level, in ``(0, 1)``.
    power : float
        The detection probability, in ``(0, 1)``.
    df : int
        The test's degrees of freedom, at least 1.
    trials : int
        The number of trials observed.
    steps : float, default 1.0
        Expected steps a trial visits, as in ``trials_for_tv``.

    Returns
    -------
    float
        The detectable TV (possibly above 1 at few trials); ``inf`` when ``trials <= 0``.

    Raises
    ------
    ValueError
        As ``noncentrality``, when ``trials > 0``.
    """
    if trials <= 0:
        return math.inf
    return math.sqrt(noncentrality(alpha, power, df) * steps / (4.0 * trials))


def exact_detectable_rate(power: float, trials: int) -> float:
    """Smallest violation rate an exact check (any violation fails) catches with ``power``.

    ``1 - (1 - power)^(1 / trials)``: at that per-trial rate, at least one of ``trials``
    independent trials violates with probability ``power``.

    Parameters
    ----------
    power : float
        The detection probability, in ``(0, 1)``.
    trials : int
        The number of trials observed.

    Returns
    -------
    float
        The detectable rate, in ``(0, 1]``; 1.0 when ``trials <= 0``.
    """
    if trials <= 0:
        return 1.0
    return 1.0 - (1.0 - power) ** (1.0 / trials)


def exact_trials_for_rate(power: float, rate: float) -> int:
    """Trials an exact check (any violation fails) needs to catch a violation ``rate`` with ``power``.

    The inverse of ``exact_detectable_rate``: ``ceil(log(1 - power) / log(1 - rate))``.

    Parameters
    ----------
    power : float
        The detection probability, in ``[0, 1)``.
    rate : float
        The per-trial violation rate to catch, in ``(0, 1)``.

    Returns
    -------
    int
        The number of trials (0 when ``power`` is 0).

    Raises
    ------
    ZeroDivisionError
        If ``rate`` is 0.
    ValueError
        If ``rate >= 1`` or ``power >= 1`` (a math domain error).
    """
    return math.ceil(math.log(1.0 - power) / math.log1p(-rate))


def binomial_detectable(alpha: float, power: float, rate: float, trials: int) -> float:
    """Smallest shift of a Bernoulli rate (= its TV) the two-sided test detects.

    Normal approximation at level ``alpha`` and ``power``, iterated so that the
    alternative's own variance (on the worse side of ``rate``) is used. A rate of 0 or 1 is
    checked exactly (any deviation fails): ``exact_detectable_rate``.

    Parameters
    ----------
    alpha : float
        The test's level, in ``(0, 1)``.
    power : float
        The detection probability, in ``(0, 1)``.
    rate : float
        The null success rate, in ``[0, 1]``.
    trials : int
        Trials observed.

    Returns
    -------
    float
        The detectable shift ``|rate' - rate|``; ``inf`` when ``trials <= 0``.
    """
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
    """Trials for the two-sided binomial test to detect a rate shift of ``shift``.

    The least ``n`` with ``binomial_detectable(alpha, power, rate, n) <= shift`` (doubling,
    then bisection); for a rate of 0 or 1, ``exact_trials_for_rate(power, shift)``.

    Parameters
    ----------
    alpha : float
        The test's level, in ``(0, 1)``.
    power : float
        The detection probability, in ``(0, 1)``.
    rate : float
        The null success rate, in ``[0, 1]``.
    shift : float
        The rate shift to detect, ``> 0`` (and ``< 1`` when ``rate`` is 0 or 1).

    Returns
    -------
    int
        The number of trials.

    Raises
    ------
    ZeroDivisionError
        If ``rate`` is 0 or 1 and ``shift`` is 0 (as ``exact_trials_for_rate``).
    ValueError
        If ``rate`` is 0 or 1 and ``shift >= 1`` or ``power >= 1`` (as ``exact_trials_for_rate``).
    """
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
    step each trial reaches with probability ``reach`` (normal bound on the binomial).

    The least ``n`` with ``n reach - z sqrt(n reach (1 - reach)) >= needed``, where ``z`` is
    the normal upper ``miss_rate`` quantile.

    Parameters
    ----------
    needed : int
        Trials that must reach the step.
    reach : float
        Probability that a trial reaches the step, in ``(0, 1]``.
    miss_rate : float
        Allowed probability of fewer than ``needed`` reaching it, in ``(0, 1)``.

    Returns
    -------
    int
        The number of trials; ``needed`` when ``reach >= 1``.
    """
    if reach >= 1.0:
        return needed
    z = float(stats.norm.isf(miss_rate))
    spread = z * math.sqrt(reach * (1 - reach))
    root = (spread + math.sqrt(spread * spread + 4 * reach * needed)) / (2 * reach)
    return math.ceil(root * root)

"""Anytime-valid goodness of fit: multinomial counts against an exact law, looked at after
every chunk, stopped at the first rejection.

The test is the Dirichlet-multinomial mixture Bayes factor of Lindon & Malek (2022),
"Anytime-valid inference for multinomial count data" (NeurIPS 2022). For cumulative counts
``x`` over ``n`` trials and the null law ``p``,

    E_n = B(a + x) / B(a) / prod_i p_i^x_i,       B(a) = prod_i Gamma(a_i) / Gamma(sum_i a_i),

the ratio of the Dirichlet(``a``) mixture of multinomial likelihoods to the null's. Written
trial by trial it is a product of predictive ratios,

    E_n = prod_t [(a_y + x_y(t-1)) / (sum a + t - 1)] / p_y        (y = trial t's cell),

so under the null it is a nonnegative martingale with ``E_0 = 1``, and Ville's inequality
gives ``P(sup_n E_n >= 1 / alpha) <= alpha``. The false-alarm rate therefore holds however
often the counts are looked at (after every trial, every chunk of any size) and however the
decision to stop depends on them: the test rejects the first time ``E_n >= 1 / alpha``, and
its anytime-valid p-value is ``1 / sup_n E_n``.

Prior. ``a_i = c p_i`` (``c = CONCENTRATION``): the prior's mean is the null law, so the next
trial's predictive law is ``(c p_i + x_i) / (c + n)``, the observed frequencies shrunk toward
``p`` by ``c`` pseudo-trials. ``c`` is thus in trials, the same for 12 cells or 10^5, and
cells of probability 0 get no prior mass: one observation there is impossible under the
null and rejects at once (``E_n = inf``; the event has probability 0 under the null, so the
guarantee is untouched). A small ``c`` pays about ``log(n / c)`` for every cell it first sees
late; a large one stays near ``p`` for about ``c`` trials. ``benchmarks/bench_sequential.py``
measured c = 1, 10, 100, 1000 on eight planted faults of the ``ci`` catalog: c = 100 was the
fastest or tied on all seven of TV 0.12 to 0.98 (64 to 384 trials, median), and second on
TV 0.065 (1,664 trials against 1,408 for c = 1000); see ``docs/sequential.md``.

Pooling. Under the null, counts pooled into bins by any map fixed before sampling are again
multinomial, over the binned probabilities: the test is valid on the chi-square design's
pooled cells (``checks.PooledCells``, pooled from the law and the trial count alone) as on
the raw ones.

Combined design (``combined_design``). The sequential test alone has no stated power at the
profile's TV; the fixed-sample chi-square has. The combined check spends ``alpha / 2`` on
each: the sequential test is monitored while sampling and stops the check early only when it
rejects; otherwise the chi-square at level ``alpha / 2`` is evaluated at the end, on a trial
count designed at ``alpha / 2`` (``power.trials_for_tv``), so the stated TV and power hold.
By the union bound the check's false-alarm rate is at most ``alpha``; its p-value is
``combined_p_value``. The price is the larger design at ``alpha / 2``: measured over the
fixed-draft outcome-law checks of the catalogs at ``alpha = 1e-6``, power 0.99, 2.4 % to 3.8 %
more trials (median 3.0 %) in ``ci`` and 2.4 % to 6.6 % in ``gpu`` (6.6 % where the larger
count pools into more bins).

In a run (``Profile.sequential``, ``--sequential``): ``checks.gof_check`` builds one-multinomial,
non-exact checks as ``combined_check``; a scenario's ``StopRule`` (its checks' ``Monitor``s)
is looked at by the sampler on the host path, in the worker next to the counts, and stops the
scenario once a monitored test rejects.
"""

import math
import numbers
from dataclasses import dataclass, replace

import numpy as np
from scipy.special import gammaln

from harness.checking import checks, power, stats
from harness.checking.checks import PooledCells
from harness.evidence.records import Kind
from harness.scenarios.profiles import Profile

CONCENTRATION = 100.0  # c, the prior's weight in pseudo-trials: of 1, 10, 100, 1000 the fastest on the faults measured (module docstring)
SUM_TOLERANCE = 1e-9  # how far from 1 the law's probabilities may sum


def log_e_value(counts, probs, concentration: float = CONCENTRATION) -> np.ndarray:
    """``log E_n`` of cumulative counts against ``probs`` (module docstring), closed form.

    No validation: ``SequentialTest`` validates its inputs; this is the arithmetic it and the
    benchmark's batched simulations share.

    Parameters
    ----------
    counts : array_like of float, shape (..., cells)
        Cumulative counts per cell; leading axes are independent sequences.
    probs : array_like of float, shape (cells,)
        The null law, ``>= 0``, summing to 1.
    concentration : float, default CONCENTRATION
        ``c`` in the prior ``a = c * probs``.

    Returns
    -------
    ndarray of float64, shape (...)
        ``log E_n``; ``inf`` where any count falls in a cell of probability 0.
    """
    counts = np.asarray(counts, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    possible = probs > 0
    x, p = counts[..., possible], probs[possible]
    a = concentration * p
    n = x.sum(axis=-1)
    # Cells never observed add gammaln(a) - gammaln(a) = 0 exactly: no special case needed.
    per_cell = gammaln(a + x) - gammaln(a) - x * np.log(p)
    out = per_cell.sum(axis=-1) - (gammaln(concentration + n) - gammaln(concentration))
    impossible = counts[..., ~possible].sum(axis=-1) > 0
    return np.where(impossible, np.inf, out)


@dataclass(frozen=True)
class SequentialState:
    """The test after one update.

    Attributes
    ----------
    trials : int
        Trials counted so far (observations in impossible cells included).
    log_e : float
        ``log E_n`` now (``inf`` after an impossible observation).
    max_log_e : float
        ``log sup E`` over every update so far (at least 0: ``E_0 = 1``).
    rejected : bool
        Whether ``E`` ever reached ``1 / alpha``; once true it stays true.
    crossed_at : int or None
        Trials at the first update where it did; None while it has not.
    impossible : int
        Observations in cells of probability 0.
    """

    trials: int
    log_e: float
    max_log_e: float
    rejected: bool
    crossed_at: int | None
    impossible: int

    @property
    def p_value(self) -> float:
        """The anytime-valid p-value ``min(1, 1 / sup E)``."""
        return math.exp(-self.max_log_e)


class SequentialTest:
    """The mixture e-test of one multinomial against ``probs``, updated on cumulative counts.

    Parameters
    ----------
    probs : array_like of float
        The null law over the cells, any shape; finite, ``>= 0``, summing to 1 (within
        ``SUM_TOLERANCE``). Cells of probability 0 are impossible.
    alpha : float
        The false-alarm rate under continuous monitoring, in ``(0, 1)``: the test rejects
        once ``E_n >= 1 / alpha``.
    concentration : float, default CONCENTRATION
        ``c`` in the prior ``a = c * probs``, finite and ``> 0``.
    bins : array_like of int or None, default None
        Bin of every (flattened) cell, fixed before sampling (``PooledCells.bins`` of a
        chi-square design, ``pooling.Pooling.bins``); -1 only for cells of probability 0.
        None: every possible cell is its own bin.

    Raises
    ------
    ValueError
        On a law that is not one, ``alpha`` outside ``(0, 1)``, a bad ``concentration``, or
        ``bins`` of the wrong size or dropping a possible cell.
    """

    def __init__(self, probs, alpha: float, concentration: float = CONCENTRATION, bins=None):
        probs = _law(probs)
        if not (_real(alpha) and 0 < alpha < 1):
            raise ValueError(f"alpha: expected a false-alarm rate in (0, 1), got {alpha!r}")
        if not (_real(concentration) and math.isfinite(concentration) and concentration > 0):
            raise ValueError(f"concentration: expected a finite prior weight > 0, got {concentration!r}")
        flat = probs.ravel()
        possible = flat > 0
        if bins is None:
            bins = np.where(possible, np.cumsum(possible) - 1, -1)
        bins = np.asarray(bins)
        if bins.shape != (flat.size,) or not np.issubdtype(bins.dtype, np.integer):
            raise ValueError(f"bins: expected {flat.size} integer bin ids (one per cell), got shape {bins.shape} of {bins.dtype}")
        if (bins[possible] < 0).any():
            raise ValueError(f"bins: cell {int(np.flatnonzero(possible & (bins < 0))[0])} has probability > 0 but no bin (-1)")
        self.shape = probs.shape
        self.cells = PooledCells.of(bins.astype(np.int64), flat)
        self.alpha = float(alpha)
        self.concentration = float(concentration)
        self.threshold = math.log(1.0 / self.alpha)
        self._last = np.zeros(flat.size)
        self.state = SequentialState(0, 0.0, 0.0, False, None, 0)

    @property
    def rejected(self) -> bool:
        return self.state.rejected

    @property
    def log_e(self) -> float:
        return self.state.log_e

    @property
    def crossed_at(self) -> int | None:
        return self.state.crossed_at

    def update(self, counts) -> SequentialState:
        """Take the cumulative counts so far (never fewer than at the last update) and test.

        Parameters
        ----------
        counts : array_like of int
            Cumulative counts per cell, the shape of ``probs``: non-negative integers, in no
            cell below the previous update's.

        Returns
        -------
        SequentialState
            The test now (also ``self.state``).

        Raises
        ------
        ValueError
            If ``counts`` has the wrong shape, is not non-negative integers, or decreased.
        """
        counts = np.asarray(counts)
        if counts.shape != self.shape:
            raise ValueError(f"counts: expected shape {self.shape} (one count per cell of probs), got {counts.shape}")
        if not (np.issubdtype(counts.dtype, np.integer) or np.issubdtype(counts.dtype, np.floating)):
            raise ValueError(f"counts: expected integer counts, got dtype {counts.dtype}")
        flat = counts.ravel().astype(np.float64)
        if not np.isfinite(flat).all() or (flat < 0).any() or (flat != np.floor(flat)).any():
            raise ValueError("counts: expected non-negative integer counts")
        if (flat < self._last).any():
            cell = int(np.flatnonzero(flat < self._last)[0])
            raise ValueError(
                f"counts: cell {cell} went from {self._last[cell]:.0f} to {flat[cell]:.0f}; counts are cumulative and never decrease"
            )
        self._last = flat
        pooled, impossible = self.cells.pool(flat)
        log_e = math.inf if impossible else float(log_e_value(pooled, self.cells.probs, self.concentration))
        trials = int(flat.sum())
        old = self.state
        crossed = old.crossed_at if old.rejected else (trials if log_e >= self.threshold else None)
        self.state = SequentialState(trials, log_e, max(old.max_log_e, log_e), crossed is not None, crossed, impossible)
        return self.state


def _real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _law(probs) -> np.ndarray:
    probs = np.asarray(probs, dtype=np.float64)
    if probs.size == 0:
        raise ValueError("probs: expected at least one cell")
    if not np.isfinite(probs).all():
        raise ValueError("probs: expected finite probabilities")
    if (probs < 0).any():
        raise ValueError(f"probs: expected probabilities >= 0, got {float(probs.min())!r} in cell {int(np.argmin(probs.ravel()))}")
    if abs(float(probs.sum()) - 1.0) > SUM_TOLERANCE:
        raise ValueError(f"probs: expected probabilities summing to 1, got {float(probs.sum())!r}")
    return probs


# --- the combined design ----------------------------------------------------------------------
def half_profile(profile: Profile) -> Profile:
    """``profile`` with ``alpha`` halved: what each part of the combined check is designed at."""
    return replace(profile, alpha=profile.alpha / 2)


@dataclass(frozen=True)
class CombinedDesign:
    """A one-multinomial check as the combined design runs it.

    Attributes
    ----------
    alpha : float
        The check's false-alarm rate (the profile's): ``alpha / 2`` for each part.
    trials : int
        Its design trial count: the chi-square at ``alpha / 2`` detects the profile's TV with
        the profile's power. Sampling stops earlier only when the sequential test rejects.
    fixed_trials : int
        The plain fixed-sample check's design trial count, at ``alpha``.
    df : int
        The chi-square's degrees of freedom at ``trials``.
    cells : PooledCells
        The chi-square's pooling at ``trials``; the sequential test may use the same bins.
    probs : ndarray of float64
        The law, as given.
    """

    alpha: float
    trials: int
    fixed_trials: int
    df: int
    cells: PooledCells
    probs: np.ndarray

    @property
    def extra_trials(self) -> float:
        """What the combined design costs over the plain one, as a fraction of its trials."""
        return self.trials / self.fixed_trials - 1.0

    def sequential(self, concentration: float = CONCENTRATION, pooled: bool = False) -> SequentialTest:
        """The sequential part, at ``alpha / 2``: on the raw cells, or (``pooled``) on the design's bins."""
        return SequentialTest(self.probs, self.alpha / 2, concentration, self.cells.bins if pooled else None)


def combined_design(probs, profile: Profile) -> CombinedDesign:
    """The combined check's design for one multinomial over ``probs`` at ``profile``.

    For a law of more than one possible cell: a point mass is an exact check (any deviation
    fails it), which needs neither part.

    Parameters
    ----------
    probs : array_like of float
        The exact law over the check's cells (any shape, read flattened).
    profile : Profile
        Its ``alpha``, ``power`` and ``tv``.

    Returns
    -------
    CombinedDesign
        The trial counts of the combined and of the plain design, and the pooling.

    Raises
    ------
    ValueError
        If ``probs`` is not a law (as ``SequentialTest``), or as ``power.trials_for_tv`` for
        the profile's numbers.
    """
    probs = _law(probs)
    flat = probs.ravel()
    fixed, _, _ = checks.design_pooling(flat, profile)  # the chi-square's own design, reused as is
    trials, pooled, df = checks.design_pooling(flat, half_profile(profile))
    return CombinedDesign(profile.alpha, trials, fixed, df, pooled(), probs)


def combined_p_value(max_log_e: float, chi_square_p: float | None = None) -> float:
    """The combined check's p-value: Bonferroni over its two parts, ``min(1, 2 min(p_seq, p_chi))``.

    ``p_seq = 1 / sup E`` is valid under any monitoring; ``chi_square_p`` is None when the
    sequential test stopped the check before the chi-square ran. ``P(p <= t) <= t`` for every
    ``t`` under the null, so the run's Holm takes it as it takes any check's p-value, and it
    is at most ``alpha`` whenever either part rejects at ``alpha / 2``.

    Parameters
    ----------
    max_log_e : float
        ``log sup E`` of the sequential part (``SequentialState.max_log_e``), ``>= 0``.
    chi_square_p : float or None, default None
        The chi-square's p-value at the design count; None when it was not evaluated.

    Returns
    -------
    float
        The p-value, in ``[0, 1]``.
    """
    p_seq = math.exp(-max_log_e)
    p = p_seq if chi_square_p is None else min(p_seq, chi_square_p)
    return min(1.0, 2.0 * p)


# --- in a run (``Profile.sequential``) --------------------------------------------------------
@dataclass(frozen=True)
class Monitor:
    """A combined check's sequential part as the sampler runs it. Picklable, so that an
    isolated worker builds the test next to the counts: the template, how the check's counts
    are read from its tally, the law and the level (the check's ``alpha / 2``)."""

    template: int
    source: object  # TemplateTally -> the check's counts (a module-level function: pickled by name)
    probs: np.ndarray  # flat, as the counts are read
    alpha: float

    def test(self) -> SequentialTest:
        return SequentialTest(self.probs, self.alpha)


@dataclass(frozen=True)
class StopRule:
    """A scenario's monitored checks: the ``stop`` that ``sample.start_scenario`` takes."""

    monitors: tuple[Monitor, ...]

    def start(self):
        """Fresh tests for one sampling of the scenario (each backend samples it once): a
        function of ``{template: TemplateTally}`` (the templates sampled so far, cumulative
        counts) that updates each test and says whether any has rejected."""
        tests = [(m, m.test()) for m in self.monitors]

        def rejected(tallies: dict) -> bool:
            for m, test in tests:
                if m.template in tallies and not test.rejected:
                    test.update(np.asarray(m.source(tallies[m.template])).ravel())
            return any(test.rejected for _, test in tests)

        return rejected


def stop_rule(planned) -> StopRule | None:
    """The stop rule of a scenario's planned checks, or None when none is monitored."""
    monitors = tuple(c.monitor for c in planned if c.monitor is not None)
    return StopRule(monitors) if monitors else None


def combined_check(name, template, probs, label, profile: Profile, source) -> checks.Check:
    """``checks.gof_check`` of a one-multinomial, non-exact law under ``Profile.sequential``:
    the combined design (``combined_design``), its sequential part monitored while sampling
    (``Check.monitor``), evaluated on the counts the check ends with:

    - sampled to the scenario's count (at least the design's): both parts at ``alpha / 2``,
      p-value ``combined_p_value(log E, p_chi)``, the chi-square's stated power;
    - sampling stopped earlier (``tally.stopped``), at a trial count the data chose: the
      sequential part alone. ``E`` at a stopping time still has expectation at most 1 under
      the null (Ville / optional stopping), so ``2 / E`` is a valid p-value there; it is the
      ``sup E`` of the looks when this test stopped the sampling (the first crossing). A
      rejection fails the check (p <= alpha: Holm rejects it whatever the family). Otherwise
      another check stopped the scenario and this one is not evaluated (skipped, with its
      ``log E``): the chi-square is valid only at its design count, and the sequential part
      alone has no stated power.

    ``E`` is recomputed here from the final counts (the worker sends counts only); the message
    gives ``log E``, the trials where sampling stopped, and the design count."""
    probs = np.asarray(probs, dtype=np.float64).ravel()
    design = combined_design(probs, profile)
    half = half_profile(profile)
    threshold = math.log(1.0 / half.alpha)

    def cells(tally):
        observed = np.asarray(source(tally), dtype=np.float64).ravel()
        return observed, probs * observed.sum()

    def evaluate(tally, rng) -> checks.Outcome:
        observed = np.asarray(source(tally)).ravel()
        trials = int(observed.sum())
        seq = design.sequential().update(observed)
        o, impossible = design.cells.pool(observed)
        r = stats.chi_square_pooled(o, design.cells.probs * trials, impossible, rng)
        summary = checks._cells_summary(label, None, None, design.cells.bins, pooled=r.pooled, impossible=impossible)
        if not tally.stopped:
            p = combined_p_value(seq.max_log_e, r.p_value)
            msg = f"X2={r.statistic:.2f} df={r.df} p={r.p_value:.3g}; sequential log E={seq.log_e:.4g} (rejects at {threshold:.4g}); combined p={p:.3g}"
            detect = power.detectable_tv(half.alpha, profile.power, design.df, trials)
            return checks.Outcome(Kind.GOF, None, r.statistic, r.df, p, profile.alpha, trials, detect, r.tv_estimate, r.tv_ci, msg, summary)
        where = f"sampling stopped at {tally.trials:,} of the design's {design.trials:,} trials"
        if seq.rejected:
            p = combined_p_value(seq.max_log_e)
            msg = f"sequential test rejected: log E={seq.log_e:.4g} >= log(2/alpha)={threshold:.4g}; {where}; combined p=2/E={p:.3g}"
            if impossible:
                msg = f"{impossible} observation(s) in zero-probability cells; " + msg
            return checks.Outcome(Kind.GOF, None, seq.log_e, None, p, profile.alpha, trials, math.nan, r.tv_estimate, r.tv_ci, msg, summary)
        why = (
            f"not evaluated: {where}, when another check's sequential test rejected; this one's did not "
            f"(log E={seq.log_e:.4g} < {threshold:.4g}), and its chi-square is valid only at its design count"
        )
        return checks.Outcome(Kind.SKIPPED, None, None, None, None, 0.0, trials, math.nan, r.tv_estimate, r.tv_ci, why, summary)

    def detectable(n):
        return power.detectable_tv(half.alpha, profile.power, design.df, n)

    monitor = Monitor(template, source, probs, half.alpha)
    return checks.Check(name, template, design.trials, evaluate, detectable, cells, "statistical", monitor)

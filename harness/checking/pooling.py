"""Pooling the cells of a law for a chi-square test, from the expected probabilities only.

Cells are pooled from the expected probabilities, never from the observed counts, so the
test's design (its cells, df and trial count) is fixed before sampling.
"""

import math

import numpy as np

MIN_EXPECTED = 5.0  # per pooled cell, for the chi-square approximation


MAX_BINS = 100  # pooled cells per check: bounds df, so large vocabularies do not inflate trial counts


# --- pooling -------------------------------------------------------------------------------
def pool_cells(expected: np.ndarray, min_expected: float = MIN_EXPECTED) -> np.ndarray:
    """Bin id per cell, from expected counts alone; -1 marks impossible (zero) cells.

    Cells with at least ``min_expected`` stay alone; the rest, in order of decreasing
    expectation, are merged into bins of at least ``min_expected`` each; a final short bin
    joins the previous one. Equivalent to ``Pooling(expected).bins(min_expected)``.

    Parameters
    ----------
    expected : array_like of float
        Expected count of every cell (any shape; read flattened), ``>= 0``.
    min_expected : float, default MIN_EXPECTED
        The least expected count of a pooled bin.

    Returns
    -------
    ndarray of int64, shape (expected.size,)
        Bin id of every flattened cell: ``0 ..`` in decreasing order of expectation, cells
        alone first; -1 for cells of expectation 0.
    """
    pooling = Pooling(expected)
    return pooling.bins(min_expected)


class Pooling:
    """Cells sorted once by decreasing expectation, pooled at any threshold: a large
    vocabulary has 10^6 cells and ``capped`` tries ~60 thresholds. ``expected`` may be
    probabilities: ``capped(max_bins, trials)`` pools the expected counts ``trials * p``.

    Parameters
    ----------
    expected : array_like of float
        Expected count (or probability) of every cell, any shape (read flattened), ``>= 0``.

    Attributes
    ----------
    expected : ndarray of float64, shape (cells,)
        ``expected``, flattened.
    order : ndarray of int64, shape (possible,)
        Indices of the cells of positive expectation, by decreasing expectation (stable:
        ties keep cell order).
    values : ndarray of float64, shape (possible,)
        ``expected[order]``.
    running : ndarray of float64, shape (possible,)
        ``cumsum(values)``.
    """

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
        """Bins at this threshold (any number above ``limit`` when it stops early).

        Parameters
        ----------
        min_expected : float
            The least expectation of a pooled bin, on the scale of ``expected``.
        limit : int or None, default None
            Stop counting once the count exceeds ``limit``; None counts every bin.

        Returns
        -------
        int
            The number of bins ``bins(min_expected)`` has (1 when every possible cell falls
            in one short bin, 0 when no cell is possible), or some number above ``limit``.
        """
        alone, ends = self._edges(min_expected, limit)
        if alone + len(ends) == 0 and self.values.size:
            return 1  # every possible cell in one short bin
        return alone + len(ends)

    def cap(self, max_bins: int = MAX_BINS, trials: float = 1.0) -> float:
        """The smallest per-bin threshold on ``expected`` (the expected count ``trials *
        expected`` at least MIN_EXPECTED) that leaves at most ``max_bins`` bins, to within a
        relative 1e-4 (geometric bisection: ~20 rounds where halving would take 60).

        Parameters
        ----------
        max_bins : int, default MAX_BINS
            The most bins allowed.
        trials : float, default 1.0
            The number of trials ``expected`` is scaled by to give expected counts (1 when
            ``expected`` already holds counts).

        Returns
        -------
        float
            The threshold, on the scale of ``expected``: ``MIN_EXPECTED / trials`` when that
            already leaves at most ``max_bins`` bins, else at most ``sum(expected)`` (one bin).
        """
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
        """Bins at ``cap(max_bins, trials)``.

        Parameters
        ----------
        max_bins : int, default MAX_BINS
            The most bins allowed.
        trials : float, default 1.0
            The scale from ``expected`` to expected counts, as in ``cap``.

        Returns
        -------
        ndarray of int64, shape (cells,)
            Bin id of every cell, as ``bins``.
        """
        return self.bins(self.cap(max_bins, trials))

    def bins(self, min_expected: float) -> np.ndarray:
        """Bin id of every cell at threshold ``min_expected``, as ``pool_cells``.

        Parameters
        ----------
        min_expected : float
            The least expectation of a pooled bin, on the scale of ``expected``.

        Returns
        -------
        ndarray of int64, shape (cells,)
            ``0 .. count(min_expected) - 1``: cells of at least ``min_expected`` alone first,
            by decreasing expectation, then the pooled bins (a final short bin joined to the
            previous one, to bin 0 when there is none); -1 for cells of expectation 0.
        """
        alone, ends = self._edges(min_expected)
        out = np.full(self.expected.size, -1, dtype=np.int64)
        out[self.order[:alone]] = np.arange(alone)
        rest = np.arange(alone, self.values.size)
        pooled_bin = alone + np.searchsorted(np.asarray(ends, dtype=np.int64), rest, side="left")
        # A final short bin joins the previous one (bin 0 when there is none).
        out[self.order[alone:]] = np.minimum(pooled_bin, max(alone + len(ends) - 1, 0))
        return out


def pooled(values: np.ndarray, bins: np.ndarray) -> np.ndarray:
    """Sum of ``values`` per bin; cells of bin -1 (impossible cells) are dropped.

    Parameters
    ----------
    values : array_like of float
        A value per cell (observed or expected counts), any shape (read flattened).
    bins : ndarray of int, shape (values.size,)
        Bin id of every cell (``pool_cells``, ``Pooling.bins``), -1 for impossible cells.

    Returns
    -------
    ndarray of float64, shape (bins.max() + 1,)
        The sum over each bin's cells (empty when every cell is impossible).
    """
    values = np.asarray(values, dtype=np.float64).ravel()
    keep = bins >= 0
    return np.bincount(bins[keep], weights=values[keep], minlength=int(bins.max(initial=-1)) + 1)

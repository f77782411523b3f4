"""Logits -> float64 probabilities under the suite's conventions (see ``reference``)."""

import numpy as np


def degenerate_rows(logits: np.ndarray) -> np.ndarray:
    """Rows with a NaN or with no finite logit: treated as a point mass on token 0."""
    return ~np.isfinite(np.max(logits, axis=-1))  # a NaN propagates through max


def greedy_tokens(logits: np.ndarray) -> np.ndarray:
    """Argmax per row, ties to the lowest id; degenerate rows give token 0."""
    logits = np.asarray(logits)
    return np.where(degenerate_rows(logits), 0, np.argmax(logits, axis=-1)).astype(np.int64)


def softmax_rows(logits: np.ndarray, temperature) -> np.ndarray:
    """float64 ``softmax(logits / T)`` per row; ``T == 0`` rows give the greedy one-hot.

    A batch of trials repeats its templates' rows: where the rows (and temperatures) repeat
    with a period, one period is computed and tiled (``exp`` is most of the reference's time).
    Every row's result is the one it gets alone: the same row-wise operations."""
    logits = np.asarray(logits)
    t = np.broadcast_to(np.asarray(temperature, dtype=np.float64), logits.shape[:-1])
    n = logits.shape[0] if logits.ndim == 2 else 1
    period = repeat_period(logits, t) if logits.ndim == 2 else n
    if period < n:
        return np.tile(_softmax(logits[:period], t[:period]), (-(-n // period), 1))[:n]
    return _softmax(logits, t)


def repeat_period(rows: np.ndarray, temperature: np.ndarray, tries: int = 4) -> int:
    """The least ``p`` such that row ``i + p`` equals row ``i``, bit for bit, and has its
    temperature (``[rows]``, or ``[rows, m]``: a row's temperature and other parameters), for every ``i``; ``len(rows)`` when none of the first ``tries`` rows equal
    to row 0 starts such a period, when there are fewer than 2 rows, or when rows are not
    compared (their elements are read as unsigned integers of their width: none wider than
    8 bytes, no complex or object rows)."""
    if len(rows) < 2 or rows.dtype.kind not in "fiu" or rows.itemsize > 8:
        return len(rows)
    bits = np.ascontiguousarray(rows).view(f"u{rows.itemsize}")
    t = np.ascontiguousarray(temperature, dtype=np.float64).reshape(len(rows), -1).view(np.uint64)
    like_first = np.flatnonzero((bits[1:] == bits[0]).all(axis=1) & (t[1:] == t[0]).all(axis=1)) + 1
    for p in like_first[:tries]:
        if (t[p:] == t[:-p]).all() and (bits[p:] == bits[:-p]).all():
            return int(p)
    return len(rows)


class RepeatingRows:
    """``length`` rows that repeat ``rows`` (row ``i`` is ``rows[i % len(rows)]``), indexed
    like the array they stand for (an index array of rows, or rows then columns) without
    building it: a batch of trials repeats its templates' rows, and gathering from one
    period stays in cache where the whole batch's rows would not."""

    def __init__(self, rows: np.ndarray, length: int):
        self.rows, self.length = rows, length
        self.shape = (length, *rows.shape[1:])

    def __getitem__(self, key):
        rows, rest = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
        rows = np.asarray(rows)
        if rows.dtype.kind not in "iu":
            raise IndexError(f"RepeatingRows: rows are chosen by integer index arrays, not {rows.dtype}")
        if rows.size and (rows.min() < 0 or rows.max() >= self.length):
            raise IndexError(f"RepeatingRows: row index out of range [0, {self.length}) (min {rows.min()}, max {rows.max()})")
        return self.rows[(rows % len(self.rows), *rest)]


def _softmax(logits: np.ndarray, t: np.ndarray) -> np.ndarray:
    x = np.array(logits, dtype=np.float64)  # a private copy, worked on in place
    greedy = t == 0
    top = x.max(axis=-1, keepdims=True)  # NaN rows give NaN, rows with no finite logit -inf
    point = greedy | ~np.isfinite(top[..., 0])
    one_hot = None
    if point.all():
        x[...] = 0.0
        np.put_along_axis(x, greedy_tokens(logits)[..., None], 1.0, axis=-1)
        return x
    if point.any():
        one_hot = np.zeros(x[point].shape)
        np.put_along_axis(one_hot, greedy_tokens(x[point])[..., None], 1.0, axis=-1)
    with np.errstate(invalid="ignore"):
        x -= top
        x /= np.where(greedy, 1.0, t)[..., None]
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    if one_hot is not None:
        x[point] = one_hot
    return x


def pad_vocab(probs: np.ndarray, vocab_size: int) -> np.ndarray:
    """Give probability 0 to ids a smaller (draft) vocabulary lacks."""
    width = probs.shape[-1]
    if width == vocab_size:
        return probs
    if width > vocab_size:
        raise ValueError(f"draft vocabulary ({width}) is larger than the target's ({vocab_size})")
    pad = [(0, 0)] * (probs.ndim - 1) + [(0, vocab_size - width)]
    return np.pad(probs, pad)


def check_probs(probs: np.ndarray, name: str, atol: float = 1e-9) -> np.ndarray:
    """Validate probability rows: finite, non-negative, each row summing to 1."""
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim < 1 or probs.shape[-1] == 0:
        raise ValueError(f"{name}: expected rows of probabilities, got shape {probs.shape}")
    if not np.isfinite(probs).all():
        raise ValueError(f"{name}: probabilities must be finite (found NaN or inf)")
    if (probs < 0).any():
        raise ValueError(f"{name}: probabilities must be non-negative (min {probs.min():.3g})")
    sums = probs.sum(axis=-1)
    worst = np.max(np.abs(sums - 1.0), initial=0.0)
    if worst > atol * max(1, probs.shape[-1]):
        raise ValueError(f"{name}: each row must sum to 1 (off by {worst:.3g})")
    return probs

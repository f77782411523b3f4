"""The verification rules, written once and shared by the sampler and the exact laws.

Every function works on rows of float64 probabilities over the target vocabulary. A
request without draft probabilities (point-mass proposal, n-gram style) passes
``draft=None``. Greedy needs no rule of its own: at temperature 0 the target row is the
one-hot of its argmax, and these rules then accept exactly the argmax and emit it.
"""

import numpy as np


def ratio(target_at_draft: np.ndarray, draft_at_draft: np.ndarray) -> np.ndarray:
    """``target(x) / draft(x)`` with ``t/0 = inf`` for ``t > 0`` and ``0/0 = 0``."""
    t = np.asarray(target_at_draft, dtype=np.float64)
    q = np.asarray(draft_at_draft, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = t / q
    return np.where(q > 0, r, np.where(t > 0, np.inf, 0.0))


def acceptance_probability(target: np.ndarray, draft: np.ndarray | None, tokens) -> np.ndarray:
    """Standard rule: ``min(1, target(x)/draft(x))``; without a draft row, ``target(x)``.

    ``target``/``draft`` are ``[m, V]``; ``tokens`` ``[m]`` (or ``[m, n]`` to evaluate
    several candidate tokens per row). Strict verification has the same law as the
    point-mass rule: ``P(y == x) = target(x)``.
    """
    tokens = np.asarray(tokens)
    idx = tokens if tokens.ndim == 2 else tokens[:, None]
    t_x = np.take_along_axis(target, idx, axis=-1)
    q_x = np.ones_like(t_x) if draft is None else np.take_along_axis(draft, idx, axis=-1)
    out = np.minimum(ratio(t_x, q_x), 1.0)
    return out if tokens.ndim == 2 else out[:, 0]


def residual_weights(target: np.ndarray, draft: np.ndarray | None, tokens) -> np.ndarray:
    """Unnormalized law of the token emitted after rejecting draft ``x``.

    With a draft row: ``max(target - draft, 0)``. Without one: ``target`` with ``x``
    removed. An empty residual (only reachable through rounding, or through a synthetic
    rejection) falls back to the target row.
    """
    if draft is None:
        w = target.copy()
        np.put_along_axis(w, np.asarray(tokens)[:, None], 0.0, axis=-1)
    else:
        w = np.maximum(target - draft, 0.0)
    empty = w.sum(axis=-1) <= 0
    if empty.any():
        w[empty] = target[empty]
    return w


def block_running_ratios(target_at_draft: np.ndarray, draft_at_draft: np.ndarray) -> np.ndarray:
    """Sun et al. (2024): ``rho_0 = 1``, ``rho_i = min(rho_{i-1} * target/draft, 1)``.

    Inputs ``[..., d]`` (the drafts' probabilities under each row); output ``[..., d+1]``.
    """
    r = ratio(target_at_draft, draft_at_draft)
    d = r.shape[-1]
    rho = np.ones(r.shape[:-1] + (d + 1,))
    for i in range(d):
        rho[..., i + 1] = block_step(rho[..., i], r[..., i])
    return rho


def block_step(rho: np.ndarray, step_ratio: np.ndarray) -> np.ndarray:
    """``min(rho * ratio, 1)`` with ``0 * inf = 0``: once a block's ratio hits 0 it stays 0."""
    with np.errstate(invalid="ignore"):
        return np.where(rho > 0, np.minimum(rho * step_ratio, 1.0), 0.0)


def block_residual(rho: np.ndarray, target: np.ndarray, draft: np.ndarray) -> np.ndarray:
    """``max(rho * target - draft, 0)`` for one position; ``draft`` is one-hot without draft probs."""
    return np.maximum(rho[..., None] * target - draft, 0.0)


def block_thresholds(rho: np.ndarray, residual_mass: np.ndarray) -> np.ndarray:
    """Stop thresholds ``h_1..h_d`` of block verification.

    ``rho`` is ``[..., d+1]``; ``residual_mass[..., i]`` the mass of the block residual at
    position ``i`` (``i = 0..d-1``). ``h_i = R_i / (R_i + 1 - rho_i)`` for ``i < d`` and
    ``h_d = rho_d``. ``0/0`` (``rho_i = 1`` and an empty residual) is 1: the chain cannot
    stop where there is nothing to resample, and it never ends there because ``rho`` stays
    1 up to a position that has a residual or to the block's end.
    """
    d = rho.shape[-1] - 1
    h = np.empty(rho.shape[:-1] + (d,))
    if d == 0:
        return h
    mass = residual_mass[..., 1:d]
    denom = mass + 1.0 - rho[..., 1:d]
    with np.errstate(divide="ignore", invalid="ignore"):
        h[..., : d - 1] = np.where(denom > 0, mass / denom, 1.0)
    h[..., d - 1] = rho[..., d]
    return np.clip(h, 0.0, 1.0)


def inverse_cdf(weights: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Draw one id per row from unnormalized non-negative ``weights`` with ``u`` in (0, 1)."""
    c = np.cumsum(weights, axis=-1)
    threshold = uniforms * c[..., -1]
    above = c > threshold[..., None]
    ids = np.argmax(above, axis=-1)
    # Rounding can leave the threshold at the total: take the last id with mass.
    last = weights.shape[-1] - 1 - np.argmax(weights[..., ::-1] > 0, axis=-1)
    return np.where(above[..., -1], ids, last).astype(np.int64)


def draw_from_row(weights: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Many draws from one weight row: ``inverse_cdf`` without materializing the rows."""
    c = np.cumsum(weights)
    ids = np.searchsorted(c, uniforms * c[-1], side="right")
    last = weights.size - 1 - int(np.argmax(weights[::-1] > 0))
    return np.minimum(ids, last).astype(np.int64)

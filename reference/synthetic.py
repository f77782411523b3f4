"""Closed forms of the lossy synthetic mode, in both parameterizations vLLM shipped.

(a) vLLM 0.19.x: one requested mean acceptance rate ``r`` over ``n`` drafts becomes a base
    rate ``a0`` and a decay ``gamma``; step ``i`` accepts with conditional probability
    ``a0 * gamma**i`` and the *joint* rate of step ``i`` is
    ``a0**(i+1) * gamma**(i*(i+1)/2)``. Their mean over ``i = 0..n-1`` equals ``r``.
    ``gamma = 0.85`` when that is feasible with ``a0 <= 1``, otherwise the smallest gamma in
    [0.85, 1] that is. ``r = 0`` gives ``a0 = 0``; ``r = 1`` gives ``a0 = gamma = 1``.
(b) vLLM >= 0.20: per-position *unconditional* rates ``r_i = P(#accepted >= i+1)``
    (each in [0, 1], non-increasing) and the conditional rates ``c_i = r_i / r_{i-1}``
    the kernels use (``c_i = 0`` where ``r_{i-1} = 0``). A requested mean acceptance
    length ``L`` in [1, K+1] becomes the minimum-variance rates ``[1,..,1, frac, 0,..]``.

No losslessness is claimed for synthetic mode: only these acceptance laws.
"""

import math

import numpy as np
from scipy.optimize import brentq

MIN_DECAY = 0.85  # vLLM's MIN_ACCEPTANCE_DECAY_FACTOR


def mean_joint_rate(base: float, decay: float, num_drafts: int) -> float:
    """Mean over steps of the joint acceptance rates ``base**(i+1) * decay**(i(i+1)/2)``."""
    i = np.arange(num_drafts, dtype=np.float64)
    return float(np.mean(base ** (i + 1) * decay ** (i * (i + 1) / 2)))


def base_and_decay(mean_rate: float, num_drafts: int, min_decay: float = MIN_DECAY) -> tuple[float, float]:
    """``(a0, gamma)`` for a requested mean acceptance rate over ``num_drafts`` drafts."""
    if not (isinstance(num_drafts, int) and num_drafts >= 1):
        raise ValueError(f"num_drafts: expected a positive integer, got {num_drafts!r}")
    if not (0.0 <= mean_rate <= 1.0) or math.isnan(mean_rate):
        raise ValueError(f"mean_rate: expected a rate in [0, 1], got {mean_rate!r}")
    if mean_rate == 0.0:
        return 0.0, min_decay
    if mean_rate == 1.0:
        return 1.0, 1.0
    if mean_joint_rate(1.0, min_decay, num_drafts) >= mean_rate:
        decay = min_decay
    else:
        decay = brentq(lambda g: mean_joint_rate(1.0, g, num_drafts) - mean_rate, min_decay, 1.0, xtol=1e-15)
    if mean_joint_rate(1.0, decay, num_drafts) <= mean_rate:
        return 1.0, decay  # the root sits at a0 = 1 up to rounding
    base = brentq(lambda a: mean_joint_rate(a, decay, num_drafts) - mean_rate, 0.0, 1.0, xtol=1e-15)
    return base, decay


def conditional_rates_for_mean(mean_rate: float, num_drafts: int) -> np.ndarray:
    """Conditional step rates ``a0 * gamma**i`` of parameterization (a)."""
    base, decay = base_and_decay(mean_rate, num_drafts)
    return base * decay ** np.arange(num_drafts, dtype=np.float64)


def check_unconditional(rates) -> np.ndarray:
    rates = np.asarray(rates, dtype=np.float64)
    if rates.ndim != 1:
        raise ValueError(f"rates: expected a list of per-position rates, got shape {rates.shape}")
    if not np.all((rates >= 0) & (rates <= 1)):
        raise ValueError(f"rates: each unconditional rate must lie in [0, 1], got {rates.tolist()}")
    if np.any(np.diff(rates) > 0):
        raise ValueError(f"rates: unconditional rates must be non-increasing, got {rates.tolist()}")
    return rates


def unconditional_to_conditional(rates) -> np.ndarray:
    """``c_i = r_i / r_{i-1}`` (``r_{-1} = 1``), ``0`` where ``r_{i-1} = 0``."""
    r = check_unconditional(rates)
    prev = np.concatenate([[1.0], r[:-1]])
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(prev > 0, r / np.where(prev > 0, prev, 1.0), 0.0)


def conditional_to_unconditional(conditional) -> np.ndarray:
    """``r_i = prod_{j <= i} c_j``."""
    return np.cumprod(np.asarray(conditional, dtype=np.float64))


def rates_for_acceptance_length(length: float, num_drafts: int) -> np.ndarray:
    """Minimum-variance unconditional rates with mean acceptance length ``length``."""
    if not (1.0 <= length <= num_drafts + 1):
        raise ValueError(f"acceptance_length: expected a value in [1, {num_drafts + 1}], got {length!r}")
    extra = length - 1.0
    whole = int(math.floor(extra))
    rates = [1.0] * whole + [extra - whole] + [0.0] * num_drafts
    return np.asarray(rates[:num_drafts], dtype=np.float64)


def acceptance_length_law(unconditional) -> np.ndarray:
    """``P(#accepted = n)`` for ``n = 0..K``: ``r_{n-1} - r_n`` with ``r_{-1} = 1, r_K = 0``."""
    r = np.asarray(unconditional, dtype=np.float64)
    return np.concatenate([[1.0], r]) - np.concatenate([r, [0.0]])


def mean_acceptance_length(unconditional) -> float:
    return 1.0 + float(np.sum(unconditional))

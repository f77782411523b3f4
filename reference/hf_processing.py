"""Hugging Face transformers' sampling parameters as ``generate(do_sample=True)`` applies
them to a row of logits, in float64.

Pinned from ``transformers/generation/utils.py::GenerationMixin._get_logits_processor``
(5.20.2, the same order since 4.x): ``TemperatureLogitsWarper`` when ``temperature != 1``,
then ``TopKLogitsWarper`` when ``top_k`` is not 0 or None, then ``TopPLogitsWarper`` when
``top_p < 1`` (``logits_process.py``), then a softmax. ``min_tokens_to_keep`` is 1 (beam
search alone raises it). The definitions, with HF's tie rules:

* top-k keeps every token whose logit is at least the k-th largest (ties at the boundary
  are all kept: ``scores < topk(scores, k)[0][..., -1]`` is removed);
* top-p sorts ascending, takes the cumulative softmax and removes the tokens whose
  cumulative probability is ``<= 1 - top_p``; the most likely token is always kept.

Imports nothing of ``harness``.
"""

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class HfSampling:
    temperature: float = 1.0
    top_k: int = 0  # 0: not applied
    top_p: float = 1.0  # 1: not applied

    def __post_init__(self):
        if not (self.temperature > 0 and np.isfinite(self.temperature)):
            raise ValueError(f"temperature: must be a positive finite number, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k: must be an integer >= 0 (0: off), got {self.top_k!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p!r}")


def processed_logits(logits, params: HfSampling) -> np.ndarray:
    """The logits after HF's warpers, float64, ``-inf`` where a token was removed; any
    leading shape, the vocabulary last."""
    x = np.array(logits, dtype=np.float64)
    if params.temperature != 1.0:
        x = x / params.temperature
    if params.top_k:
        k = min(params.top_k, x.shape[-1])
        kth = -np.sort(-x, axis=-1)[..., k - 1 : k]
        x = np.where(x < kth, -np.inf, x)
    if params.top_p < 1.0:
        order = np.argsort(x, axis=-1, kind="stable")
        sorted_x = np.take_along_axis(x, order, axis=-1)
        cumulative = np.cumsum(_softmax(sorted_x), axis=-1)
        remove_sorted = cumulative <= 1.0 - params.top_p
        remove_sorted[..., -1] = False  # min_tokens_to_keep = 1: the most likely token stays
        remove = np.zeros_like(remove_sorted)
        np.put_along_axis(remove, order, remove_sorted, axis=-1)
        x = np.where(remove, -np.inf, x)
    return x


def processed_probs(logits, params: HfSampling) -> np.ndarray:
    """The distribution ``generate`` samples the next token from, float64."""
    return _softmax(processed_logits(logits, params))


def _softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)

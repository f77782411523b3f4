"""Tensors derived from a batch's logits, reused while the logits are the same tensor.

A device batch (``harness.sampling.device.trials``) hands every chunk of one size the same logits
tensor; an adapter that must transform the logits before calling its engine (divide by the
temperature, gather rows, build a cache) does that once, not once per chunk.
"""

import weakref

_LIVE = weakref.WeakSet()  # every memo of this process, for ``release_all``


class LogitsMemo:
    def __init__(self):
        self._entries = {}
        _LIVE.add(self)

    def get(self, key: str, source, depends_on, build):
        """``build()``, reused while ``source`` is the very same tensor and ``depends_on`` (a
        tensor of everything else the value depends on) is equal."""
        import torch

        hit = self._entries.get(key)
        if hit is not None and hit[0] is source and hit[1].shape == depends_on.shape and torch.equal(hit[1], depends_on):
            return hit[2]
        self._entries.pop(key, None)  # free the old value before building the new one
        value = build()
        self._entries[key] = (source, depends_on, value)
        return value


def release_all() -> None:
    """Drop every memo's tensors (and the logits they hold on to): a worker calls this when
    its GPU turn ends, so that between turns it holds none of a scenario's device memory for
    the workers that take the GPU after it."""
    for memo in list(_LIVE):
        memo._entries.clear()

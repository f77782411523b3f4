"""Tiny misbehaving backends for ``suites/test_verdicts.py``: each breaks one promise a
verdict rests on (declines everything, answers ``supports`` off-protocol, returns ids
that are not integers, is not repeatable) while sampling otherwise as the reference."""

import numpy as np

from reference.methods import Method
from reference.sampler import ReferenceSampler

_REFERENCE = ReferenceSampler()


class DeclinesAll:
    name = "declines-all"

    def supports(self, batch):
        return "this sampler is not finished"

    def sample(self, batch):
        return _REFERENCE.sample(batch)


class TruthySupports(DeclinesAll):
    def supports(self, batch):
        return 5


class EmptySupports(DeclinesAll):
    def supports(self, batch):
        return ""


class DeclinesSynthetic:
    """Runs everything but synthetic requests: the standard ones of a mixed batch are still verified."""

    def supports(self, batch):
        return "no synthetic mode" if (np.asarray(batch.methods) == Method.SYNTHETIC).any() else None

    def sample(self, batch):
        assert not (np.asarray(batch.methods) == Method.SYNTHETIC).any(), "a declined request was sent"
        return _REFERENCE.sample(batch)


class OneMethodACall:
    """Accepts any single method, never two in one batch."""

    def supports(self, batch):
        return "one method a call" if np.unique(np.asarray(batch.methods)).size > 1 else None

    def sample(self, batch):
        assert np.unique(np.asarray(batch.methods)).size == 1
        return _REFERENCE.sample(batch)


def _tokens_as(dtype):
    class Backend:
        def sample(self, batch):
            tokens, emitted = _REFERENCE.sample(batch)
            if dtype == "nan":
                tokens = tokens.astype(np.float64)
                tokens[:, -1] = np.nan
            elif dtype == "uint64-huge":
                tokens = tokens.astype(np.uint64)
                tokens[:, 0] = np.uint64(2**64 - 1)
            else:
                tokens = tokens.astype(dtype)
            return tokens, emitted

    return Backend


FloatTokens = _tokens_as(np.float32)
StringTokens = _tokens_as(str)
NanTokens = _tokens_as("nan")
HugeUnsignedTokens = _tokens_as("uint64-huge")


class FloatCounts:
    def sample(self, batch):
        tokens, emitted = _REFERENCE.sample(batch)
        return tokens, emitted.astype(np.float64)


class AllMalformed:
    """Emits no token at all: every trial is malformed."""

    def sample(self, batch):
        tokens, emitted = _REFERENCE.sample(batch)
        return tokens, np.zeros_like(emitted)


class Unrepeatable:
    """The reference with the run's seeds replaced by fresh ones on every call: a law it
    keeps, a reproducer it breaks."""

    def __init__(self):
        self._calls = 0

    def sample(self, batch):
        import dataclasses

        self._calls += 1
        seeds = np.asarray(batch.seeds) + 7919 * self._calls
        return _REFERENCE.sample(dataclasses.replace(batch, seeds=seeds))


class Errors:
    def sample(self, batch):
        raise RuntimeError("kernel launch failed: out of shared memory")


class _DeviceBatches:
    """Takes device batches (torch tensors, here on the CPU) and emits one token: 0, or a
    random id when ``noisy``."""

    device_batches = True
    devices = ("cpu",)
    noisy = False

    def sample(self, batch):
        import torch

        rows = batch.cu_num_drafts.shape[0] - 1
        tokens = torch.zeros((rows, batch.max_drafts + 1), dtype=torch.int64)
        if self.noisy:
            tokens[:, 0] = torch.randint(0, 1 << 30, (rows,))  # two calls agree with probability 2^-60
        return tokens, torch.ones(rows, dtype=torch.int64)


class RepeatableOnDevice(_DeviceBatches):
    pass


class UnrepeatableOnDevice(_DeviceBatches):
    noisy = True

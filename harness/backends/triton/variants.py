"""The suite's Triton sampler with one planted kernel bug: ``triton-fault:NAME`` (``harness.backends.triton.faults``)."""

import dataclasses

import numpy as np
import torch

from harness.backends.triton.backend import TritonBackend
from harness.backends.triton.common import tile_plan
from harness.backends.triton.faults import TRITON_FAULTS


class TritonFaultBackend(TritonBackend):
    shared_rows = False  # temperature-twice divides every row: give it rows, not a view

    def __init__(self, fault: str, device: str = "cpu", block_v: int | None = None, splits: int | None = None):
        super().__init__(device, block_v, splits)
        self.name = f"triton-fault:{fault}"
        self.fault = fault
        # TritonBackend passes ``tiles`` to verify() as keywords on every call: the fault rides along.
        self.tiles = {**self.tiles, "fault": TRITON_FAULTS[fault].code}

    def sample(self, batch):
        if self.fault == "draft-before-topk" and batch.draft_logits is not None:
            batch = dataclasses.replace(batch, draft_logits=unmasked(batch.draft_logits))
        return super().sample(batch)


def unmasked(logits):
    """``draft-before-topk``: each row's masked (-inf) logits set to its lowest finite one, as
    ``harness.backends.faults.DraftBeforeTopK`` (rows with no finite logit stay as they are).
    NumPy arrays or torch tensors (a device batch), returned as given."""
    if isinstance(logits, torch.Tensor):
        finite = torch.isfinite(logits)
        floor = torch.where(finite, logits, torch.inf).amin(dim=-1, keepdim=True)
        return torch.where(finite | torch.isinf(floor), logits, floor)
    finite = np.isfinite(logits)
    floor = np.where(finite, logits, np.inf).min(axis=-1, keepdims=True)
    return np.where(finite | np.isinf(floor), logits, floor).astype(logits.dtype, copy=False)


def _cuda_tiles(backend, batch) -> None:
    """Give ``backend`` the vocabulary tiles CUDA chooses for ``batch`` (``tile_plan(V, cuda=True)``)."""
    block_v, _, nsplit, _ = tile_plan(batch.target_logits.shape[1], cuda=True)
    backend.tiles = {**backend.tiles, "block_v": block_v, "splits": nsplit}


class CudaTiles(TritonBackend):
    """The Triton sampler on the vocabulary tiles CUDA would choose for each batch: the
    interpreter then pads the last tile as a GPU does (``TritonBackend`` on CPU uses one
    tile of the next power of two)."""

    name = "triton-cuda-tiles"

    def sample(self, batch):
        _cuda_tiles(self, batch)
        return super().sample(batch)


class OovLaneWinsOnCudaTiles(TritonFaultBackend):
    """``triton-fault:oov-lane-wins`` on the tiles CUDA would choose (as ``CudaTiles``)."""

    def __init__(self, device: str = "cpu"):
        super().__init__("oov-lane-wins", device)

    def sample(self, batch):
        _cuda_tiles(self, batch)
        return super().sample(batch)


SMALL_TILE = 8  # 8-wide vocabulary tiles: V = 7..25 crosses tile and split edges at the interpreter's cost


class SmallTiles:
    """The Triton sampler with ``SMALL_TILE``-wide vocabulary tiles over 2 splits (CPU)."""

    name = "triton-small-tiles"
    devices = ("cpu",)
    splits = 2

    def __init__(self):
        self.device = "cpu"
        self._sampler = TritonBackend("cpu", block_v=SMALL_TILE, splits=self.splits)

    def supports(self, batch) -> str | None:
        return self._sampler.supports(batch)

    def sample(self, batch):
        return self._sampler.sample(batch)


class SmallTiles3(SmallTiles):
    """The Triton sampler with ``SMALL_TILE``-wide vocabulary tiles over 3 splits (CPU)."""

    splits = 3

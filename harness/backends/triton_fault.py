"""The suite's Triton sampler with one planted kernel bug: ``triton-fault:NAME`` (``harness.triton_faults``)."""

from harness.backends.triton_sampler import TritonBackend
from harness.triton_faults import TRITON_FAULTS


class TritonFaultBackend(TritonBackend):
    shared_rows = False  # temperature-twice divides every row: give it rows, not a view

    def __init__(self, fault: str, device: str = "cpu", block_v: int | None = None, splits: int | None = None):
        super().__init__(device, block_v, splits)
        self.name = f"triton-fault:{fault}"
        # TritonBackend passes ``tiles`` to verify() as keywords on every call: the fault rides along.
        self.tiles = {**self.tiles, "fault": TRITON_FAULTS[fault].code}

"""How a fused call spreads its work (``fused.plan_fused``): functions of the batch's shape, the
device and the ``Tunables``. None of them changes the outputs but ``stats_width`` (how a split is
read: the fp32 order of its sum, last bits); each docstring says why.
"""

import functools

import torch

from harness.backends.triton.launch import cdiv, next_power_of_2
from harness.backends.triton.tunables import DEFAULT_TUNABLES, Tunables


def counters_and_flags(b: int) -> int:
    """The scratch's last float64 slots: the mass kernel's counters, one per request block (at
    most b), then two int32 flags per block (``flag_ptrs``)."""
    return 2 * b


def flag_chain(lanes: int, has_strict: bool, has_block: bool, pdl: bool, pick_in_mass: bool) -> bool:
    """Whether the flags carry the chain (``FLAG_CHAIN``): where the mass kernel waits on flags (PDL,
    a pick kernel of its own), with one request per block and no strict or block requests, the
    chain kernel raises its flag to 1 + rejected + 2 n and the candidate kernel to 1 + (a candidate
    kept), so a mass program takes all it needs of the chain from the flags it waits on, not from a
    load after them (strict and block requests need n_eff and the running ratios). In the
    benchmark's batches (standard requests with draft probabilities), at B = 256, K = 1 on an H200,
    the mass kernel went from 48 registers to 40 and the call took 1.3 us
    less at V = 131072, 2.0 us less at 152064 (2.9 at B = 1024), 0.7 us more at B = 256, K = 4.
    The outputs are the same."""
    return pdl and not pick_in_mass and lanes == 1 and not (has_strict or has_block)


@functools.cache
def _pdl_device(index: int) -> bool:
    """Whether device ``index`` takes programmatic dependent launch (sm_90+) and this
    Triton has the ``launch_pdl`` option."""
    from triton.backends.nvidia.compiler import CUDAOptions

    nvidia = torch.version.hip is None  # ROCm reports gfx94x as capability 9.4
    return nvidia and torch.cuda.get_device_capability(index) >= (9, 0) and "launch_pdl" in CUDAOptions.__dataclass_fields__


def pdl_on(device, tunables: Tunables = DEFAULT_TUNABLES) -> bool:
    """``Tunables.pdl`` on ``device`` (a CUDA device)."""
    return tunables.pdl and _pdl_device(device.index if device.index is not None else torch.cuda.current_device())


def mass_span(request_blocks: int, n_tiles: int, block_v: int, tunables: Tunables = DEFAULT_TUNABLES) -> int:
    """The span of vocabulary one ``_fused_mass_kernel`` program sums (its ``split_len``), in
    whole tiles. A program sums its tiles one after the other, so at small batches its time is a
    latency per tile. A call of T tiles (request blocks x tiles per row) gives each program
    T // ``mass_programs`` tiles, at least one (one each while T < 2 ``mass_programs``; else at
    least about ``mass_programs`` programs) and at most ``mass_max_tiles`` (``Tunables``). A
    tile's mass does not depend on which program sums it, so neither do the outputs."""
    tiles = min(tunables.mass_max_tiles, n_tiles, max(1, request_blocks * n_tiles // tunables.mass_programs))
    return tiles * block_v


def stats_splits_per_program(rows: int, nsplit: int, tunables: Tunables = DEFAULT_TUNABLES) -> int:
    """Splits one ``_fused_stats_kernel`` program reads, one after the other: one each while
    a call has at most about ``Tunables.stats_programs`` (rows x splits), else enough to stay
    near that, up to ``Tunables.stats_max_splits``. At B = 1 a program's time is its loads' latency; at
    B = 1024, K >= 4 one split per program took 5-7% longer, and a bound of 8192 programs
    rather than 32768 took 0-4% less time at B = 256-1024 (H100; other bounds:
    benchmarks/RESULTS.md#tried-and-not-kept). A split's partials do not depend on which program reads it, so
    neither do the outputs."""
    return min(tunables.stats_max_splits, nsplit, max(1, cdiv(rows * nsplit, tunables.stats_programs)))


def stats_width(split_len: int, block_v: int, cuda: bool, tunables: Tunables = DEFAULT_TUNABLES) -> int:
    """The fused statistics kernel's tile: on CUDA a whole split where it fits in one tile of
    at most ``Tunables.stats_max_width`` ids (at B = 1 a program's loads go out at once, not one tile
    after another), else the staged kernel's ``block_v``. A split read as one tile or as
    several has the same max and argmax; its fp32 sum differs in the last bits (the order of
    the adds, one rescale less: ``ORDER_SLACK`` in ``suites/helpers.py``)."""
    if cuda and split_len <= tunables.stats_max_width and split_len == next_power_of_2(split_len):
        return split_len
    return block_v

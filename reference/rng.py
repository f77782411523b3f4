"""Counter-based float64 uniforms keyed by (seed, position, stream).

The reference draws every random number from a hash of the request's seed, the row's
absolute token position and a stream tag, so a request's outcome depends only on its own
inputs: the same seed gives the same output whatever its batch mates, and the acceptance
uniform, the residual draw and the target sample never share noise (vLLM #47386 reused the
acceptance noise for the draft). SplitMix64 finalizers; 52-bit uniforms in the open
interval (0, 1), so a uniform is never exactly 0 (an ``u <= ratio`` test cannot accept a
zero-probability token) and the inverse-CDF draw reaches mass down to about 2**-52 (vLLM #43150
starved tokens below fp32's 2**-24 floor).
"""

from enum import IntEnum

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


class Stream(IntEnum):
    ACCEPT = 1  # acceptance uniform of a draft step
    RESIDUAL = 2  # inverse-CDF draw of the emitted token
    TARGET = 3  # the target's own sample (strict method)
    BLOCK = 4  # block verification's per-step uniform
    DRAFT = 5  # the harness's own draft sampling (never used by a sampler)
    CANDIDATE = 6  # the Triton sampler's residual candidates (drawn from the target row, then tested)


def _mix(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def uniforms(seeds, positions, stream: Stream) -> np.ndarray:
    """Float64 uniforms in (0, 1), one per (seed, position) pair (broadcast together)."""
    with np.errstate(over="ignore"):
        s = np.asarray(seeds).astype(np.uint64)
        p = np.asarray(positions).astype(np.uint64)
        h = _mix(s + _GOLDEN)
        h = _mix(h ^ (p * _GOLDEN + np.uint64(int(stream))))
        h = _mix(h + _GOLDEN * np.uint64(int(stream)))
    # 52 bits so that k + 0.5 is exact: u = (k + 0.5) / 2**52 lies in [2**-53, 1 - 2**-53].
    return ((h >> np.uint64(12)).astype(np.float64) + 0.5) * 2.0**-52


def hash64(*keys) -> np.ndarray:
    """Non-negative int64 hash of integer keys (broadcast together): seeds from indices."""
    with np.errstate(over="ignore"):
        h = np.uint64(0x243F6A8885A308D3)
        for key in keys:
            h = _mix(h ^ (np.asarray(key).astype(np.uint64) + _GOLDEN))
    return (h >> np.uint64(1)).astype(np.int64)

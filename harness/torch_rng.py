"""``reference.rng`` on torch tensors, bit for bit: the device path's keys and uniforms."""

import numpy as np
import torch

from reference import rng
from reference.rng import Stream


def _signed(x: int) -> int:
    """A uint64 constant as the int64 with the same bits (torch has no uint64 arithmetic)."""
    return x - (1 << 64) if x >= 1 << 63 else x


_MASK64 = (1 << 64) - 1
_M1 = _signed(0xBF58476D1CE4E5B9)
_M2 = _signed(0x94D049BB133111EB)
_GOLDEN = _signed(0x9E3779B97F4A7C15)
_HASH_START = 0x243F6A8885A308D3  # below 2**63: the same as an int64


def shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (``>>`` on int64 is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finalizer on int64 bit patterns (multiplication wraps like uint64)."""
    x = x ^ shift_right(x, 30)
    x = x * _M1
    x = x ^ shift_right(x, 27)
    x = x * _M2
    return x ^ shift_right(x, 31)


def hash_state(*keys: torch.Tensor | int, start: torch.Tensor | int = _HASH_START, device=None) -> torch.Tensor:
    """``hash64`` before its final shift, continued from ``start`` (another state). Integer
    keys before the first tensor are mixed on the host and later ones enter as scalars: a
    copy to the device would wait for its queued work."""
    h = start
    for key in keys:
        if isinstance(key, torch.Tensor):
            h = _mix(h ^ (torch.as_tensor(key, dtype=torch.int64, device=device) + _GOLDEN))
        else:
            h = h ^ _signed((key + _GOLDEN) & _MASK64)
            h = _mix(h) if isinstance(h, torch.Tensor) else _mix_int(h)
    return torch.as_tensor(h, dtype=torch.int64, device=device)


def _mix_int(x: int) -> int:
    """``_mix`` on one int64 bit pattern held as a Python int: the reference's own mix on a
    NumPy scalar (no tensor ops on the host)."""
    with np.errstate(over="ignore"):
        return _signed(int(rng._mix(np.uint64(x & _MASK64))))


def hash64(*keys: torch.Tensor | int, device=None) -> torch.Tensor:
    """``reference.rng.hash64`` on torch int64 tensors (bit-identical)."""
    return shift_right(hash_state(*keys, device=device), 1)


def uniforms(seeds: torch.Tensor, positions: torch.Tensor, stream: Stream) -> torch.Tensor:
    """``reference.rng.uniforms`` on torch int64 tensors (bit-identical float64)."""
    s = int(stream)
    h = _mix(seeds + _GOLDEN)
    h = _mix(h ^ (positions * _GOLDEN + s))
    h = _mix(h + _signed((0x9E3779B97F4A7C15 * s) & _MASK64))
    return (shift_right(h, 12).to(torch.float64) + 0.5) * 2.0**-52

"""A 64-bit mixing function (SplitMix64's finalizer), for Python ints and for numpy uint64 arrays.

Both forms give the same values, so scalar derivations (keys, phases) and vectorized ones agree.
"""

from __future__ import annotations

import numpy as np

MASK64 = (1 << 64) - 1
_C1, _C2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_U30, _U27, _U31 = np.uint64(30), np.uint64(27), np.uint64(31)
_UC1, _UC2 = np.uint64(_C1), np.uint64(_C2)


def mix64(x: int) -> int:
    z = x & MASK64
    z = ((z ^ (z >> 30)) * _C1) & MASK64
    z = ((z ^ (z >> 27)) * _C2) & MASK64
    return z ^ (z >> 31)


def mix64_array(x: np.ndarray) -> np.ndarray:
    """Elementwise mix64 of a uint64 array (multiplication wraps modulo 2**64, as intended)."""
    z = x.astype(np.uint64, copy=True)
    z ^= z >> _U30
    z *= _UC1
    z ^= z >> _U27
    z *= _UC2
    z ^= z >> _U31
    return z


def derive(*parts: int) -> int:
    """A 64-bit key from a tuple of non-negative ints (order matters)."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = mix64(h ^ mix64(p + 0x632BE59BD9B4E019))
    return h

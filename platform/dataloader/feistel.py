"""A keyed pseudo-random permutation of [0, n) with O(1) random access: an (unbalanced) Feistel network
on the bit width of n - 1, plus cycle-walking to stay inside [0, n) (fewer than 2 steps on average).

This is what makes "sample at position p" computable without replaying positions 0..p-1.
"""

from __future__ import annotations

import numpy as np

from stalwart.dataloader.hashing import mix64_array

ROUNDS = 4  # even: the two halves end at the widths they started with
_MAX_WALK = 4096  # each step lands inside with probability > 1/2; never reached in practice
_ROUND_CONSTANTS = [np.uint64((0x9E3779B97F4A7C15 * (r + 1)) & ((1 << 64) - 1)) for r in range(ROUNDS)]
_ONE = np.uint64(1)


def _widths(n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(high, low) half widths of the smallest bit width w >= 1 with 2**w >= n."""
    top = np.maximum(n.astype(np.int64) - 1, 0).astype(np.float64)
    bits = np.maximum(np.frexp(top)[1].astype(np.int64), 1)  # bit length of n - 1 (exact below 2**53)
    low = bits // 2
    return (bits - low).astype(np.uint64), low.astype(np.uint64)


def _encrypt(x: np.ndarray, hi: np.ndarray, lo: np.ndarray, key: np.ndarray) -> np.ndarray:
    masks = ((_ONE << hi) - _ONE, (_ONE << lo) - _ONE)
    left, right = x >> lo, x & masks[1]
    for r in range(ROUNDS):
        f = mix64_array(right ^ (key + _ROUND_CONSTANTS[r])) & masks[r % 2]
        left, right = right, left ^ f
    return (left << lo) | right


def permute(index: np.ndarray, n: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Elementwise perm_key,n(index) for index < n; every argument is an array of the same length."""
    idx = index.astype(np.uint64)
    size = n.astype(np.uint64)
    k = key.astype(np.uint64)
    if np.any(idx >= size):
        raise ValueError("permute: index must be below n")
    hi, lo = _widths(size)
    x = _encrypt(idx, hi, lo, k)
    todo = np.nonzero(x >= size)[0]
    for _ in range(_MAX_WALK):
        if todo.size == 0:
            return x.astype(np.int64)
        x[todo] = _encrypt(x[todo], hi[todo], lo[todo], k[todo])
        todo = todo[x[todo] >= size[todo]]
    raise RuntimeError("feistel cycle-walk did not terminate")  # unreachable: the walk is a cycle through idx

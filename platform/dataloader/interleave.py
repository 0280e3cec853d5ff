"""Which source serves each position of one constant-weight segment, with counts in closed form.

Sources sit at the leaves of a balanced binary tree. A node splits the stream of positions that reach
it between its two children like Bresenham's line: of the first j positions, exactly
L(j) = (j * a + phase) // t go left (a = left weight, t = both children's weight). So

- the source of local position j, and its index among that source's positions, follow from a walk
  down the tree: O(log sources), no replay;
- how many of the first n positions each source got follows from the same formula at every node,
  so the counts at the end of a segment are exact, and the next segment carries on from them;
- every prefix is within about one sample per tree level of the exact weighted share.

The per-node phase (from the seed) makes the interleaving differ between seeds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stalwart.dataloader.hashing import derive


class Interleave:
    def __init__(self, weights: Sequence[int], seed: int) -> None:
        if not weights or sum(weights) <= 0 or any(w < 0 for w in weights):
            raise ValueError(f"weights must be non-negative with a positive sum: {list(weights)}")
        self.weights = tuple(int(w) for w in weights)
        self.n_sources = len(weights)
        a: list[int] = []
        t: list[int] = []
        phase: list[int] = []
        left: list[int] = []
        right: list[int] = []

        def build(lo: int, hi: int) -> int:
            """Index of the node for sources [lo, hi); a leaf is coded as -(source + 1)."""
            if hi - lo == 1:
                return -(lo + 1)
            mid = (lo + hi) // 2
            node = len(a)
            total = sum(self.weights[lo:hi])
            a.append(sum(self.weights[lo:mid]))
            t.append(max(total, 1))
            phase.append(derive(seed, lo, hi) % max(total, 1))
            left.append(0)
            right.append(0)
            left[node] = build(lo, mid)
            right[node] = build(mid, hi)
            return node

        self._root = build(0, self.n_sources)
        self._a, self._t, self._phase = (np.array(v, dtype=np.int64) for v in (a, t, phase))
        self._left, self._right = np.array(left, dtype=np.int64), np.array(right, dtype=np.int64)
        self._depth = max(1, (self.n_sources - 1).bit_length())

    def counts(self, n: int) -> list[int]:
        """How many of the first n positions each source gets (exact, Python ints)."""
        out = [0] * self.n_sources

        def walk(node: int, m: int) -> None:
            if node < 0:
                out[-node - 1] += m
                return
            to_left = (m * int(self._a[node]) + int(self._phase[node])) // int(self._t[node])
            walk(int(self._left[node]), to_left)
            walk(int(self._right[node]), m - to_left)

        walk(self._root, n)
        return out

    def locate(self, local: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, index among that source's positions in this segment) for each local position."""
        j = local.astype(np.int64, copy=True)
        if self._root < 0:
            return np.full(j.shape, -self._root - 1, dtype=np.int64), j
        node = np.full(j.shape, self._root, dtype=np.int64)
        source = np.full(j.shape, -1, dtype=np.int64)
        active = np.arange(j.size)
        for _ in range(self._depth + 1):
            if active.size == 0:
                break
            nd, jj = node[active], j[active]
            a, t, ph = self._a[nd], self._t[nd], self._phase[nd]
            before = (jj * a + ph) // t
            go_left = ((jj + 1) * a + ph) // t > before
            child = np.where(go_left, self._left[nd], self._right[nd])
            j[active] = np.where(go_left, before, jj - before)
            node[active] = child
            leaf = child < 0
            source[active[leaf]] = -child[leaf] - 1
            active = active[~leaf]
        return source, j

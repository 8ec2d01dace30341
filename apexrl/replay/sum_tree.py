"""A vectorized binary sum tree: the index behind proportional prioritized replay.

Leaf ``i`` holds a non-negative value ``v_i`` (a priority already raised to ``alpha``); every inner
node holds the sum of its two children, so the root is ``sum_i v_i``. Sampling descends from the
root with a number ``u`` in ``[0, total)`` and returns the leaf whose cumulative-sum interval
contains ``u``, which draws leaf ``i`` with probability ``v_i / total`` when ``u`` is uniform
(Schaul et al., 2016).

Both ``update`` and ``sample`` work on whole batches, one numpy operation per tree level, so their
cost is ``O(depth)`` numpy calls whatever the batch size. ``PrioritizedTable`` in ``tables.py`` owns
one.
"""

from __future__ import annotations

import numpy as np


class SumTree:
    """Binary sum tree over ``capacity`` leaves, all initially zero.

    The tree is an implicit heap in one array: node ``n`` has children ``2n`` and ``2n + 1``, the
    root is node 1, and the leaves occupy ``[num_leaves, 2 * num_leaves)``, where ``num_leaves`` is
    ``capacity`` rounded up to a power of two (so every leaf sits at the same depth and a batch
    descends in lock step). The padding leaves stay zero and are never sampled.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = int(capacity)
        self._depth = (self._capacity - 1).bit_length()
        self._num_leaves = 1 << self._depth
        # float64, not float32: inner nodes are re-summed on every update, and float32 sums drift
        # visibly over millions of updates (rlpyt's note); priorities also span many decades.
        self._tree = np.zeros(2 * self._num_leaves, dtype=np.float64)
        # A view of the tree whose row n holds the children 2n and 2n + 1 of node n: a batch
        # gathers both children's sums with one index operation.
        self._children = self._tree.reshape(-1, 2)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def total(self) -> float:
        """Sum of all leaf values."""
        return float(self._tree[1])

    def update(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Set ``values[j]`` at leaf ``indices[j]``; where an index repeats, the last write wins.

        Args:
            indices: int ``[K]`` leaf indices in ``[0, capacity)``.
            values: float ``[K]`` finite, non-negative leaf values.
        """
        leaves = self._check_indices(indices)
        values = np.asarray(values, dtype=np.float64)
        if values.shape != leaves.shape:
            raise ValueError(f"indices shape {leaves.shape} != values shape {values.shape}")
        if leaves.size == 0:
            return
        _check_values(values)
        if leaves.size > 1 and not np.all(leaves[1:] > leaves[:-1]):
            # Keep the last occurrence of each index: unique() on the reversed array reports first
            # hits. Strictly increasing indices (an insert's slots) are unique and sorted already.
            leaves, last = np.unique(leaves[::-1], return_index=True)
            values = values[::-1][last]
        nodes = leaves + self._num_leaves
        self._tree[nodes] = values
        # Recompute parents from their children (rather than adding deltas) so that round-off never
        # accumulates in inner nodes: each node is always exactly fl(left + right).
        if nodes[-1] - nodes[0] + 1 == nodes.size:
            self._update_range(int(nodes[0]), int(nodes[-1]) + 1)
            return
        tree, children = self._tree, self._children
        for level in range(self._depth - 1, -1, -1):  # the parents' level: 2**level nodes
            if 1 << level <= nodes.size:
                # As many changed nodes as the level holds: recompute it and those above whole.
                self._update_range(1 << level, 2 << level, parents_only=False)
                return
            nodes >>= 1  # duplicates are harmless: they get the same sum
            pair = children.take(nodes, axis=0)
            tree[nodes] = pair[:, 0] + pair[:, 1]

    def update_range(self, start: int, values: np.ndarray) -> None:
        """``update(np.arange(start, start + K), values)`` without index arrays: set the leaves
        ``[start, start + K)`` to the float ``[K]`` finite, non-negative ``values``."""
        values = np.asarray(values, dtype=np.float64)
        if values.ndim != 1:
            raise ValueError(f"values must be 1-D, got shape {values.shape}")
        if not 0 <= start <= start + values.size <= self._capacity:
            raise ValueError(
                f"leaves [{start}, {start + values.size}) are not within [0, {self._capacity})"
            )
        if values.size == 0:
            return
        _check_values(values)
        lo = start + self._num_leaves
        self._tree[lo : lo + values.size] = values
        self._update_range(lo, lo + values.size)

    def _update_range(self, lo: int, hi: int, parents_only: bool = True) -> None:
        """Recompute the ancestors of the contiguous nodes ``[lo, hi)`` of one level (and, unless
        ``parents_only``, those nodes themselves from their children), with slices: an insert's
        slots are contiguous, and slicing avoids index arrays altogether."""
        tree = self._tree
        if not parents_only:
            np.add(tree[2 * lo : 2 * hi : 2], tree[2 * lo + 1 : 2 * hi : 2], out=tree[lo:hi])
        while lo > 1 and hi - lo > 1:
            lo, hi = lo // 2, (hi - 1) // 2 + 1
            np.add(tree[2 * lo : 2 * hi : 2], tree[2 * lo + 1 : 2 * hi : 2], out=tree[lo:hi])
        # One node per level from here up: scalar steps cost far less than slicing.
        node = lo
        while node > 1:
            node //= 2
            tree[node] = tree[2 * node] + tree[2 * node + 1]

    def get(self, indices: np.ndarray) -> np.ndarray:
        """Leaf values, float64 ``[K]``, for int ``[K]`` leaf indices."""
        return self._tree[self._check_indices(indices) + self._num_leaves]

    def sample(self, u: np.ndarray) -> np.ndarray:
        """Leaf indices, int64 ``[K]``, whose cumulative-sum intervals contain ``u``.

        Args:
            u: float ``[K]`` in ``[0, total)``. Values at or past ``total`` (round-off in the
                caller) map to the last leaf with a non-zero value, negative ones to the first.

        A leaf with value 0 is never returned: the descent enters a child only if its sum is > 0.
        """
        total = self.total
        if total <= 0.0:
            raise ValueError("cannot sample from a sum tree whose total is 0")
        u = np.asarray(u, dtype=np.float64)
        if u.ndim != 1:
            raise ValueError(f"u must be 1-D, got shape {u.shape}")
        if not np.all(np.isfinite(u)):
            raise ValueError("u must be finite")
        u = np.clip(u, 0.0, total)
        nodes = np.ones(u.shape, dtype=np.int64)
        children = self._children
        for _ in range(self._depth):
            pair = children.take(nodes, axis=0)  # [K, 2]: the left and the right child's sums
            left_sum = pair[:, 0]
            # Going right needs a positive right sum; going left when u >= left_sum (round-off, or
            # u == total) happens only when the right sum is 0, and then left_sum == node sum > 0.
            go_right = (u >= left_sum) & (pair[:, 1] > 0.0)
            u -= left_sum * go_right  # u - 0.0 is exactly u
            nodes <<= 1
            nodes += go_right
        return nodes - self._num_leaves

    def _check_indices(self, indices: np.ndarray) -> np.ndarray:
        indices = np.asarray(indices)
        if indices.ndim != 1:
            raise ValueError(f"indices must be 1-D, got shape {indices.shape}")
        if indices.size == 0:
            return indices.astype(np.int64)
        if not np.issubdtype(indices.dtype, np.integer):
            raise ValueError(f"indices must be integers, got dtype {indices.dtype}")
        if indices.min() < 0 or indices.max() >= self._capacity:
            raise ValueError(
                f"indices must lie in [0, {self._capacity}), got [{indices.min()}, {indices.max()}]"
            )
        return indices.astype(np.int64)


def _check_values(values: np.ndarray) -> None:
    """Raise ``ValueError`` unless the float64 ``[K > 0]`` values are finite and non-negative."""
    # Two reductions check everything: a NaN makes both NaN, and NaN fails every comparison.
    low, high = np.minimum.reduce(values), np.maximum.reduce(values)
    if not (low >= 0 and high < np.inf):
        raise ValueError("values must be finite and non-negative")

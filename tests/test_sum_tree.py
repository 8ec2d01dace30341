"""SumTree against a brute-force ``np.cumsum`` / ``np.searchsorted`` reference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from apexrl.replay.sum_tree import SumTree


def reference_sample(values: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Leaf i such that cumsum[i - 1] <= u < cumsum[i]; zero leaves have empty intervals."""
    return np.searchsorted(np.cumsum(values), u, side="right")


def test_hand_worked_capacity_not_power_of_two() -> None:
    tree = SumTree(5)
    tree.update(np.array([0, 2, 4]), np.array([1.0, 2.0, 3.0]))
    # Leaf intervals: 0 -> [0, 1), 1 -> empty, 2 -> [1, 3), 3 -> empty, 4 -> [3, 6).
    assert tree.total == 1.0 + 2.0 + 3.0
    u = np.array([0.0, 0.999, 1.0, 2.999, 3.0, 5.999, 6.0, 1e9])
    np.testing.assert_array_equal(tree.sample(u), [0, 0, 2, 2, 4, 4, 4, 4])
    np.testing.assert_array_equal(tree.get(np.arange(5)), [1.0, 0.0, 2.0, 0.0, 3.0])


@pytest.mark.parametrize("capacity", [1, 2, 3, 5, 8, 100, 1023, 1025])
def test_matches_cumsum_reference(capacity: int) -> None:
    rng = np.random.default_rng(capacity)
    tree = SumTree(capacity)
    reference = np.zeros(capacity)
    for _ in range(20):
        # Small integers (zeros included) keep every partial sum exact in float64, so the tree and
        # the reference must agree even for u exactly on an interval boundary.
        indices = rng.integers(0, capacity, size=rng.integers(1, 2 * capacity + 2))
        values = rng.integers(0, 10, size=indices.size).astype(np.float64)
        tree.update(indices, values)
        for i, v in zip(indices, values, strict=True):  # sequential writes: last one wins
            reference[i] = v
        np.testing.assert_array_equal(tree.get(np.arange(capacity)), reference)
        assert tree.total == reference.sum()
        if reference.sum() == 0:
            continue
        boundaries = np.cumsum(reference)
        boundaries = boundaries[boundaries < reference.sum()]  # u = total has no reference leaf
        u = np.concatenate([rng.uniform(0, reference.sum(), 500), boundaries, [0.0]])
        np.testing.assert_array_equal(tree.sample(u), reference_sample(reference, u))


def test_duplicate_indices_last_write_wins() -> None:
    tree = SumTree(7)
    tree.update(np.array([3, 3, 5, 3]), np.array([1.0, 2.0, 4.0, 8.0]))
    np.testing.assert_array_equal(tree.get(np.array([3, 5])), [8.0, 4.0])
    assert tree.total == 8.0 + 4.0


def test_empirical_frequencies_match_priorities() -> None:
    values = np.array([0.5, 3.0, 0.0, 1.0, 7.25, 0.1, 2.0, 0.0, 4.0, 1.5, 0.3])  # capacity 11
    tree = SumTree(values.size)
    tree.update(np.arange(values.size), values)
    rng = np.random.default_rng(0)
    num_draws = 200_000
    counts = np.bincount(tree.sample(rng.uniform(0, tree.total, num_draws)), minlength=values.size)
    p = values / values.sum()
    standard_error = np.sqrt(num_draws * p * (1 - p))
    assert np.all(counts[p == 0] == 0)
    nonzero = p > 0
    z = np.abs(counts[nonzero] - num_draws * p[nonzero]) / standard_error[nonzero]
    assert z.max() < 5.0, z


def test_total_matches_fsum_after_many_updates() -> None:
    rng = np.random.default_rng(1)
    capacity = 1000
    tree = SumTree(capacity)
    reference = np.zeros(capacity)
    for _ in range(3000):
        indices = rng.integers(0, capacity, size=64)
        values = 10.0 ** rng.uniform(-6, 3, size=64)  # priorities spanning nine decades
        tree.update(indices, values)
        reference[indices] = values  # fancy assignment: last write wins, like the tree
    np.testing.assert_array_equal(tree.get(np.arange(capacity)), reference)
    exact = math.fsum(reference)
    assert abs(tree.total - exact) <= 1e-12 * exact


def test_zero_leaves_never_sampled_even_at_boundaries() -> None:
    rng = np.random.default_rng(2)
    capacity = 1000
    values = rng.uniform(0, 1, capacity) * (rng.random(capacity) < 0.5)
    values[-50:] = 0.0  # trailing zeros: round-off at u ~ total must not land on them
    values[:50] = 0.0
    tree = SumTree(capacity)
    tree.update(np.arange(capacity), values)
    total = tree.total
    u = np.concatenate(
        [
            rng.uniform(0, total, 100_000),
            np.cumsum(values),  # every boundary, with the cumsum's own round-off
            [0.0, total, np.nextafter(total, 0.0), total * (1 - 1e-16), total * 2],
        ]
    )
    chosen = tree.sample(u)
    assert np.all(tree.get(chosen) > 0)
    assert chosen.max() <= np.flatnonzero(values).max()


def test_single_nonzero_leaf_always_chosen() -> None:
    tree = SumTree(6)
    tree.update(np.array([4]), np.array([1e-300]))
    u = np.array([0.0, 1e-300, 1.0, 5.0])
    np.testing.assert_array_equal(tree.sample(u), [4, 4, 4, 4])


def test_invalid_input_raises() -> None:
    tree = SumTree(4)
    with pytest.raises(ValueError, match="total is 0"):
        tree.sample(np.array([0.0]))
    with pytest.raises(ValueError, match="non-negative"):
        tree.update(np.array([0]), np.array([-1.0]))
    with pytest.raises(ValueError, match="finite"):
        tree.update(np.array([0]), np.array([np.nan]))
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        tree.update(np.array([4]), np.array([1.0]))
    with pytest.raises(ValueError, match="shape"):
        tree.update(np.array([0, 1]), np.array([1.0]))
    with pytest.raises(ValueError, match="capacity"):
        SumTree(0)

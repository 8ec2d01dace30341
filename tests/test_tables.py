"""Replay tables: insert/sample/update, eviction and stale keys, FIFO delivery, rate limiting."""

from __future__ import annotations

import numpy as np
import pytest

from apexrl.replay.tables import (
    FifoQueue,
    PrioritizedTable,
    RateLimiter,
    check_no_deadlock,
    make_table,
)


def make_fields(first_key: int, num_items: int) -> dict[str, np.ndarray]:
    """Items whose contents name their key, so a sample can be checked against its keys."""
    keys = np.arange(first_key, first_key + num_items)
    return {
        "obs": np.repeat(keys[:, None], 4, axis=1).astype(np.float32),
        "action": keys.astype(np.int64),
    }


def sample_counts(table: PrioritizedTable, num_batches: int, batch_size: int) -> np.ndarray:
    rng = np.random.default_rng(123)
    keys = np.concatenate([table.sample(batch_size, rng)[0] for _ in range(num_batches)])
    return np.bincount(keys, minlength=table.num_inserted)


ACTION = np.zeros(2, np.int64)


# --- PrioritizedTable -----------------------------------------------------------------------------


def test_insert_and_sample_shapes_dtypes_and_contents() -> None:
    table = PrioritizedTable(capacity=100, alpha=0.6)
    keys = table.insert(make_fields(0, 10), np.ones(10))
    np.testing.assert_array_equal(keys, np.arange(10))
    assert keys.dtype == np.int64
    np.testing.assert_array_equal(table.insert(make_fields(10, 5), np.ones(5)), np.arange(10, 15))

    keys, fields, probabilities = table.sample(32, np.random.default_rng(0))
    assert keys.shape == (32,) and keys.dtype == np.int64
    assert fields["obs"].shape == (32, 4) and fields["obs"].dtype == np.float32
    assert fields["action"].shape == (32,) and fields["action"].dtype == np.int64
    assert probabilities.shape == (32,) and probabilities.dtype == np.float64
    np.testing.assert_array_equal(fields["action"], keys)
    np.testing.assert_array_equal(fields["obs"][:, 0], keys)
    assert (table.size, table.capacity, table.num_inserted, table.num_sampled) == (15, 100, 15, 32)

    fields["obs"][:] = -1.0  # a sample is a copy
    _, again, _ = table.sample(32, np.random.default_rng(0))
    assert np.all(again["obs"] >= 0)


def test_sample_empty_raises() -> None:
    with pytest.raises(ValueError, match="empty"):
        PrioritizedTable(10, 0.6).sample(1, np.random.default_rng(0))


def test_probabilities_match_formula() -> None:
    alpha, min_priority = 0.6, 1e-6
    priorities = np.array([0.0, 1.0, 2.0, 3.0, 0.5, 10.0, 1e-9])
    table = PrioritizedTable(capacity=16, alpha=alpha, min_priority=min_priority)
    table.insert(make_fields(0, priorities.size), priorities)
    scaled = np.maximum(priorities, min_priority) ** alpha
    keys, _, probabilities = table.sample(256, np.random.default_rng(0))
    np.testing.assert_allclose(probabilities, scaled[keys] / scaled.sum(), rtol=1e-12)
    # Priority 10 vs 1: 10 ** 0.6 = 3.98 times as likely.
    assert np.isclose(scaled[5] / scaled[1], 10**0.6)
    assert table.max_priority == 10.0


@pytest.mark.parametrize(
    ("alpha", "expected"),
    [(1.0, 100 / (99 * 1 + 100)), (0.5, 10 / (99 * 1 + 10))],  # 100 ** 0.5 = 10
)
def test_high_priority_item_sampled_as_predicted(alpha: float, expected: float) -> None:
    priorities = np.ones(100)
    priorities[37] = 100.0
    table = PrioritizedTable(capacity=100, alpha=alpha)
    table.insert(make_fields(0, 100), priorities)
    num_batches, batch_size = 1000, 64
    counts = sample_counts(table, num_batches, batch_size)
    num_draws = num_batches * batch_size
    # Binomial standard error; stratified sampling only lowers the variance.
    standard_error = np.sqrt(num_draws * expected * (1 - expected))
    assert abs(counts[37] - num_draws * expected) < 5 * standard_error


def test_alpha_zero_is_uniform() -> None:
    table = PrioritizedTable(capacity=50, alpha=0.0)
    table.insert(make_fields(0, 20), 10.0 ** np.arange(-10, 10))
    _, _, probabilities = table.sample(64, np.random.default_rng(0))
    np.testing.assert_allclose(probabilities, 1 / 20)
    num_draws = 500 * 40
    counts = sample_counts(table, 500, 40)
    standard_error = np.sqrt(num_draws * (1 / 20) * (19 / 20))
    assert np.max(np.abs(counts - num_draws / 20)) < 5 * standard_error


def test_update_priorities_changes_sampling_and_last_duplicate_wins() -> None:
    table = PrioritizedTable(capacity=10, alpha=1.0)
    table.insert(make_fields(0, 10), np.ones(10))
    assert table.update_priorities(np.array([3]), np.array([91.0])) == 1
    keys, _, probabilities = table.sample(100, np.random.default_rng(0))
    np.testing.assert_allclose(probabilities[keys == 3], 91 / 100)
    np.testing.assert_allclose(probabilities[keys != 3], 1 / 100)
    assert table.max_priority == 91.0

    assert table.update_priorities(np.array([3, 4, 3]), np.array([1000.0, 1.0, 1.0])) == 2
    _, _, probabilities = table.sample(100, np.random.default_rng(0))
    np.testing.assert_allclose(probabilities, 1 / 10)


def test_eviction_at_capacity_and_stale_keys_ignored() -> None:
    table = PrioritizedTable(capacity=8, alpha=1.0)
    table.insert(make_fields(0, 5), np.ones(5))
    table.insert(make_fields(5, 5), np.ones(5))  # keys 0 and 1 are overwritten
    assert (table.size, table.num_inserted) == (8, 10)
    counts = sample_counts(table, 200, 16)
    assert counts[:2].sum() == 0 and np.all(counts[2:10] > 0)

    # Evicted (0, 1), never issued (10, 99) and negative keys are ignored; 5 and 9 are applied.
    applied = table.update_priorities(np.array([0, 1, 5, 9, 10, 99, -1]), np.full(7, 8.0))
    assert applied == 2
    keys, fields, probabilities = table.sample(64, np.random.default_rng(1))
    np.testing.assert_array_equal(fields["action"], keys)
    np.testing.assert_allclose(probabilities[np.isin(keys, [5, 9])], 8 / (6 + 2 * 8))
    np.testing.assert_allclose(probabilities[~np.isin(keys, [5, 9])], 1 / (6 + 2 * 8))


def test_insert_larger_than_capacity_keeps_last_items() -> None:
    table = PrioritizedTable(capacity=4, alpha=1.0)
    keys = table.insert(make_fields(0, 10), np.arange(10.0) + 1)
    np.testing.assert_array_equal(keys, np.arange(10))
    assert (table.size, table.num_inserted) == (4, 10)
    keys, fields, probabilities = table.sample(200, np.random.default_rng(0))
    assert set(keys.tolist()) == {6, 7, 8, 9}
    np.testing.assert_array_equal(fields["action"], keys)
    np.testing.assert_allclose(probabilities, (keys + 1) / (7 + 8 + 9 + 10))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"obs": np.zeros((2, 4), np.float64), "action": ACTION}, "'obs'.*float32.*float64"),
        ({"obs": np.zeros((2, 5), np.float32), "action": ACTION}, r"'obs'.*\(4,\).*\(5,\)"),
        ({"obs": np.zeros((2, 4), np.float32)}, "'action'.*int64.*absent"),
        (
            {**make_fields(0, 2), "reward": np.zeros(2, np.float32)},
            "'reward'.*absent.*float32",
        ),
        ({"obs": np.zeros((2, 4), np.float32), "action": np.zeros(3, np.int64)}, "number of items"),
        ({}, "at least one field"),
    ],
)  # fmt: skip
def test_spec_mismatch_raises_and_leaves_table_unchanged(
    fields: dict[str, np.ndarray], message: str
) -> None:
    table = PrioritizedTable(capacity=8, alpha=1.0)
    table.insert(make_fields(0, 3), np.ones(3))
    with pytest.raises(ValueError, match=message):
        table.insert(fields, np.ones(2))
    assert (table.size, table.num_inserted) == (3, 3)
    np.testing.assert_array_equal(table.insert(make_fields(3, 1), np.ones(1)), [3])
    keys, sampled, _ = table.sample(64, np.random.default_rng(0))
    assert set(keys.tolist()) == {0, 1, 2, 3}
    np.testing.assert_array_equal(sampled["action"], keys)


@pytest.mark.parametrize("priorities", [np.ones(2), -np.ones(3), np.array([1.0, np.nan, 1.0])])
def test_bad_priorities_raise_and_leave_table_unchanged(priorities: np.ndarray) -> None:
    table = PrioritizedTable(capacity=8, alpha=1.0)
    with pytest.raises(ValueError, match="priorities"):
        table.insert(make_fields(0, 3), priorities)
    assert (table.size, table.num_inserted) == (0, 0)


# --- FifoQueue ------------------------------------------------------------------------------------


def test_fifo_order_and_exactly_once() -> None:
    queue = FifoQueue(capacity=10)
    queue.insert(make_fields(0, 3))
    queue.insert(make_fields(3, 4), priorities=np.ones(4))  # priorities are ignored
    keys, fields, probabilities = queue.sample(2)
    np.testing.assert_array_equal(keys, [0, 1])
    np.testing.assert_array_equal(fields["action"], [0, 1])
    np.testing.assert_array_equal(probabilities, [1.0, 1.0])
    keys, fields, _ = queue.sample(5, np.random.default_rng(0))
    np.testing.assert_array_equal(keys, [2, 3, 4, 5, 6])
    np.testing.assert_array_equal(fields["obs"][:, 0], [2, 3, 4, 5, 6])
    assert (queue.size, queue.num_inserted, queue.num_sampled) == (0, 7, 7)
    with pytest.raises(ValueError, match="fewer than batch_size"):
        queue.sample(1)
    assert queue.update_priorities(np.array([0]), np.array([1.0])) == 0


def test_fifo_random_chunks_delivers_every_item_once_in_order() -> None:
    rng = np.random.default_rng(0)
    queue = FifoQueue(capacity=64)
    delivered = []
    for _ in range(500):
        if rng.random() < 0.5 and queue.size + 8 <= queue.capacity:
            queue.insert(make_fields(queue.num_inserted, int(rng.integers(1, 9))))
        elif queue.size >= 5:
            keys, fields, _ = queue.sample(5)
            np.testing.assert_array_equal(fields["action"], keys)
            delivered.append(keys)
    delivered_keys = np.concatenate(delivered)
    np.testing.assert_array_equal(delivered_keys, np.arange(queue.num_sampled))


def test_fifo_full_insert_evicts_oldest() -> None:
    queue = FifoQueue(capacity=4)
    queue.insert(make_fields(0, 3))
    queue.insert(make_fields(3, 3))  # keys 0 and 1 are dropped undelivered
    keys, fields, _ = queue.sample(4)
    np.testing.assert_array_equal(keys, [2, 3, 4, 5])
    np.testing.assert_array_equal(fields["action"], [2, 3, 4, 5])


def test_make_table() -> None:
    assert isinstance(make_table("prioritized", 10, 0.6), PrioritizedTable)
    assert isinstance(make_table("fifo", 10, 0.6), FifoQueue)
    with pytest.raises(ValueError, match="unknown table kind 'lifo'"):
        make_table("lifo", 10, 0.6)


# --- RateLimiter ----------------------------------------------------------------------------------


def test_rate_limiter_hand_worked() -> None:
    # spi = 2, min_size = 10, error_buffer = 8:
    #   insert n allowed while filling (inserted + n <= 10) or diff + 2n <= 10 * 2 + 8 = 28;
    #   sample n allowed once inserted >= 10 and diff - n >= 10 * 2 - 8 = 12.
    limiter = RateLimiter(samples_per_insert=2, min_size_to_sample=10, error_buffer=8)
    assert limiter.can_insert(10)  # filling: 0 + 10 <= 10
    assert limiter.can_insert(14)  # past min size, but diff + 2 * 14 = 28 <= 28
    assert not limiter.can_insert(15)  # 2 * 15 = 30 > 28
    limiter.record_insert(9)
    assert not limiter.can_sample(1)  # 9 < min size
    limiter.record_insert(1)
    assert limiter.diff == 10 * 2
    assert limiter.can_sample(8)  # 20 - 8 = 12 >= 12
    assert not limiter.can_sample(9)  # 20 - 9 = 11 < 12
    assert limiter.can_insert(4)  # 20 + 2 * 4 = 28 <= 28
    assert not limiter.can_insert(5)  # 20 + 2 * 5 = 30 > 28
    limiter.record_insert(4)
    assert not limiter.can_insert(1)  # 28 + 2 = 30 > 28: inserts block at 14 items
    assert limiter.can_sample(16)  # 28 - 16 = 12 >= 12
    assert not limiter.can_sample(17)
    limiter.record_sample(16)
    assert limiter.diff == 14 * 2 - 16
    assert not limiter.can_sample(1)  # 12 - 1 = 11 < 12: samples block
    assert limiter.can_insert(8)  # 12 + 2 * 8 = 28 <= 28
    assert not limiter.can_insert(9)
    assert (limiter.num_inserted, limiter.num_sampled) == (14, 16)


def test_rate_limiter_without_ratio() -> None:
    limiter = RateLimiter(samples_per_insert=0, min_size_to_sample=3, error_buffer=0)
    assert not limiter.can_sample(1)
    limiter.record_insert(3)
    assert limiter.can_sample(1000)
    limiter.record_sample(1000)
    assert limiter.can_insert(1000) and limiter.can_sample(1000)


def test_rate_limiter_validates_arguments() -> None:
    with pytest.raises(ValueError, match="min_size_to_sample"):
        RateLimiter(1.0, 0, 1.0)
    with pytest.raises(ValueError, match="error_buffer"):
        RateLimiter(1.0, 1, -1.0)
    with pytest.raises(ValueError, match="samples_per_insert"):
        RateLimiter(float("nan"), 1, 1.0)


def test_too_small_error_buffer_deadlocks_and_is_detected() -> None:
    limiter = RateLimiter(samples_per_insert=2, min_size_to_sample=10, error_buffer=1)
    with pytest.raises(ValueError, match="error_buffer"):
        check_no_deadlock(limiter, max_insert_items=5, max_sample_items=8)
    limiter.record_insert(10)
    # diff = 20: insert 5 needs 20 + 10 <= 21, sample 8 needs 20 - 8 >= 19. Neither can move.
    assert not limiter.can_insert(5) and not limiter.can_sample(8)
    check_no_deadlock(RateLimiter(2, 10, 10), max_insert_items=5, max_sample_items=8)


@pytest.mark.parametrize("kind", ["prioritized", "fifo"])
def test_producer_consumer_never_deadlocks_and_keeps_ratio(kind: str) -> None:
    max_chunk, batch_size, min_size = 16, 32, 100
    spi = 4.0 if kind == "prioritized" else 1.0
    error_buffer = max(max_chunk * spi, batch_size)
    limiter = RateLimiter(spi, min_size, error_buffer)
    check_no_deadlock(limiter, max_chunk, batch_size)
    # A FIFO queue holds at most diff <= min_size + error_buffer items, so nothing is evicted.
    table = make_table(kind, capacity=int(min_size * spi + error_buffer), alpha=0.6)
    rng = np.random.default_rng(0)
    delivered = []
    for _ in range(5000):
        chunk = int(rng.integers(1, max_chunk + 1))
        can_insert = limiter.can_insert(chunk)
        can_sample = limiter.can_sample(batch_size)
        assert can_insert or can_sample, "deadlock"
        if can_insert and (not can_sample or rng.random() < 0.5):
            table.insert(make_fields(table.num_inserted, chunk), rng.random(chunk))
            limiter.record_insert(chunk)
        else:
            keys, _, _ = table.sample(batch_size, rng)
            limiter.record_sample(batch_size)
            delivered.append(keys)
        if limiter.num_inserted >= min_size:
            drift = limiter.num_sampled - spi * (limiter.num_inserted - min_size)
            assert abs(drift) <= error_buffer
    assert limiter.num_sampled > 1000 and table.num_sampled == limiter.num_sampled
    if kind == "fifo":
        np.testing.assert_array_equal(np.concatenate(delivered), np.arange(limiter.num_sampled))

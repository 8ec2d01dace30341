"""Replay tables: insert/sample/update, eviction and stale keys, FIFO delivery, rate limiting."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest

from apexrl.config.rules import check_replay_config
from apexrl.replay.rate_limiter import RateLimiter, check_no_deadlock
from apexrl.replay.tables import FifoQueue, PrioritizedTable, make_table


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


def test_fifo_full_queue_refuses_an_insert_until_a_sample_makes_room() -> None:
    queue = FifoQueue(capacity=4)
    queue.insert(make_fields(0, 3))
    assert queue.can_insert(1) and not queue.can_insert(2)  # 3 + 2 > 4
    with pytest.raises(RuntimeError, match="holds 3 of 4 items and has no room for 3 more"):
        queue.insert(make_fields(3, 3))
    assert (queue.size, queue.num_inserted, queue.num_evicted) == (3, 3, 0)  # nothing changed
    keys, _, _ = queue.sample(2)
    np.testing.assert_array_equal(keys, [0, 1])
    assert queue.can_insert(3)  # 1 + 3 <= 4
    np.testing.assert_array_equal(queue.insert(make_fields(3, 3)), [3, 4, 5])
    keys, fields, _ = queue.sample(4)
    np.testing.assert_array_equal(keys, [2, 3, 4, 5])  # nothing was lost
    np.testing.assert_array_equal(fields["action"], [2, 3, 4, 5])
    assert (queue.num_sampled, queue.num_evicted) == (6, 0)


def test_fifo_evict_unread_drops_the_oldest_items_and_counts_them() -> None:
    queue = FifoQueue(capacity=4, evict_unread=True)
    queue.insert(make_fields(0, 3))
    assert queue.can_insert(4)  # always, when evicting
    queue.insert(make_fields(3, 3))  # 3 + 3 = 6 > 4: keys 0 and 1 are evicted unread
    assert (queue.size, queue.num_inserted, queue.num_evicted) == (4, 6, 2)
    keys, fields, _ = queue.sample(4)
    np.testing.assert_array_equal(keys, [2, 3, 4, 5])
    np.testing.assert_array_equal(fields["action"], [2, 3, 4, 5])
    queue.insert(make_fields(6, 4))  # into an empty queue: nothing evicted
    queue.insert(make_fields(10, 4))  # all of keys 6..9 evicted
    assert (queue.size, queue.num_evicted) == (4, 2 + 4)
    keys, _, _ = queue.sample(4)
    np.testing.assert_array_equal(keys, [10, 11, 12, 13])


def test_fifo_evicts_partly_read_items_first_and_counts_them() -> None:
    queue = FifoQueue(capacity=4, max_times_sampled=2, evict_unread=True)
    queue.insert(make_fields(0, 4))
    np.testing.assert_array_equal(queue.sample(2)[0], [0, 1])  # keys 0, 1 read once of twice
    queue.insert(make_fields(4, 1))  # key 0 is evicted, read only once
    assert (queue.size, queue.num_evicted) == (4, 1)
    # Key 1 has one delivery left: it leaves with this batch; key 2 needs one more.
    np.testing.assert_array_equal(queue.sample(2)[0], [1, 2])
    np.testing.assert_array_equal(queue.sample(2)[0], [2, 3])  # key 2 leaves, key 3 needs one more
    np.testing.assert_array_equal(queue.sample(2)[0], [3, 4])
    assert (queue.size, queue.num_sampled, queue.num_evicted) == (1, 8, 1)


@pytest.mark.parametrize("evict_unread", [False, True])
def test_fifo_chunk_larger_than_the_capacity_is_refused_whole(evict_unread: bool) -> None:
    queue = FifoQueue(capacity=4, evict_unread=evict_unread)
    queue.insert(make_fields(0, 1))
    message = "a chunk of 5 items exceeds the FIFO queue's capacity of 4 items"
    with pytest.raises(ValueError, match=message):
        queue.can_insert(5)
    with pytest.raises(ValueError, match=message):
        queue.insert(make_fields(1, 5))
    assert (queue.size, queue.num_inserted, queue.num_evicted) == (1, 1, 0)
    assert queue.can_insert(3)
    np.testing.assert_array_equal(queue.sample(1)[0], [0])


def test_fifo_random_chunks_held_back_when_full_deliver_every_item_once_in_order() -> None:
    rng = np.random.default_rng(1)
    queue = FifoQueue(capacity=16)
    delivered, refused = [], 0
    for _ in range(2000):
        chunk = int(rng.integers(1, 9))
        if rng.random() < 0.5:
            if queue.can_insert(chunk):
                queue.insert(make_fields(queue.num_inserted, chunk))
            else:
                refused += 1
        elif queue.size >= 5:
            delivered.append(queue.sample(5)[0])
    while queue.size:  # read what is left
        delivered.append(queue.sample(min(queue.size, 5))[0])
    assert refused > 100  # the queue was often full
    np.testing.assert_array_equal(np.concatenate(delivered), np.arange(queue.num_inserted))
    assert queue.num_sampled == queue.num_inserted and queue.num_evicted == 0


def test_fifo_max_times_sampled_two_delivers_each_item_twice_then_drops_it() -> None:
    queue = FifoQueue(capacity=6, max_times_sampled=2)
    queue.insert(make_fields(0, 5))
    # Batches of 2 take the oldest items; an item leaves with its second delivery.
    for expected, size_after in (([0, 1], 5), ([0, 1], 3), ([2, 3], 3), ([2, 3], 1)):
        keys, fields, probabilities = queue.sample(2)
        np.testing.assert_array_equal(keys, expected)
        np.testing.assert_array_equal(fields["action"], expected)
        np.testing.assert_array_equal(probabilities, [1.0, 1.0])
        assert queue.size == size_after
    with pytest.raises(ValueError, match="fewer than batch_size"):
        queue.sample(2)  # key 4 alone
    queue.insert(make_fields(5, 1))
    np.testing.assert_array_equal(queue.sample(2)[0], [4, 5])
    np.testing.assert_array_equal(queue.sample(2)[0], [4, 5])
    assert (queue.size, queue.num_inserted, queue.num_sampled) == (0, 6, 2 * 6)


def test_fifo_item_read_k_times_frees_its_room_only_after_the_last_read() -> None:
    queue = FifoQueue(capacity=4, max_times_sampled=3)
    queue.insert(make_fields(0, 4))
    for _ in range(2):
        queue.sample(2)
        assert queue.size == 4 and not queue.can_insert(1)  # keys 0, 1 owe more deliveries
    queue.sample(2)
    assert queue.size == 2 and queue.can_insert(2) and not queue.can_insert(3)


@pytest.mark.parametrize(("k", "batch_sizes"), [(2, (3, 2, 1)), (3, (2, 5, 1, 4))])
def test_fifo_random_reuse_delivers_every_item_exactly_k_times_oldest_first(
    k: int, batch_sizes: tuple[int, ...]
) -> None:
    rng = np.random.default_rng(k)
    queue = FifoQueue(capacity=12, max_times_sampled=k)
    delivered = []
    for step in range(1500):
        chunk = int(rng.integers(1, 5))
        batch = batch_sizes[step % len(batch_sizes)]
        if rng.random() < 0.5 and queue.can_insert(chunk):
            queue.insert(make_fields(queue.num_inserted, chunk))
        elif queue.size >= batch:
            oldest = queue.num_inserted - queue.size
            keys, fields, _ = queue.sample(batch)
            np.testing.assert_array_equal(keys, np.arange(oldest, oldest + batch))
            np.testing.assert_array_equal(fields["action"], keys)
            delivered.append(keys)
    while queue.size:
        delivered.append(queue.sample(1)[0])
    assert queue.num_inserted > 300
    times = np.bincount(np.concatenate(delivered), minlength=queue.num_inserted)
    np.testing.assert_array_equal(times, np.full(queue.num_inserted, k))
    assert queue.num_sampled == k * queue.num_inserted and queue.num_evicted == 0


def test_fifo_validates_max_times_sampled() -> None:
    with pytest.raises(ValueError, match="max_times_sampled must be >= 1, got 0"):
        FifoQueue(4, max_times_sampled=0)


@pytest.mark.parametrize("table", [PrioritizedTable(4, 1.0), FifoQueue(4)])
def test_an_insert_of_no_items_is_refused(table: PrioritizedTable | FifoQueue) -> None:
    with pytest.raises(ValueError, match="at least one item"):
        table.insert(make_fields(0, 0), np.ones(0))
    assert (table.size, table.num_inserted) == (0, 0)


def test_prioritized_table_always_takes_an_insert() -> None:
    table = PrioritizedTable(capacity=4, alpha=1.0)
    table.insert(make_fields(0, 4), np.ones(4))
    assert table.can_insert(1) and table.can_insert(100)


def test_make_table() -> None:
    assert isinstance(make_table("prioritized", 10, 0.6), PrioritizedTable)
    queue = make_table("fifo", 10, 0.6)
    assert isinstance(queue, FifoQueue)
    assert (queue.max_times_sampled, queue.evict_unread) == (1, False)
    queue = make_table("fifo", 10, 0.6, max_times_sampled=3, evict_unread=True)
    assert (queue.capacity, queue.max_times_sampled, queue.evict_unread) == (10, 3, True)
    assert isinstance(make_table("prioritized", 10, 0.6, evict_unread=True), PrioritizedTable)
    with pytest.raises(ValueError, match="max_times_sampled 2 applies to a FIFO queue only"):
        make_table("prioritized", 10, 0.6, max_times_sampled=2)
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
    # A FIFO queue holds at most diff <= min_size + error_buffer items: it never refuses a chunk.
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


# --- check_replay_config --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        # kind, capacity, samples_per_insert, error_buffer, min_size, chunk items, batch items
        (("lifo", 100, 1.0, 10, 10, 1, 1), {}, "replay.kind must be 'prioritized' or 'fifo'"),
        (("fifo", 100, 1.0, 10, 10, 0, 1), {}, r"actor.chunk_steps \* env.num_envs.*>= 1, got 0"),
        (("prioritized", 100, 1.0, 10, 10, 1, 1), {"max_times_sampled": 2},
         "replay.max_times_sampled 2 applies to a FIFO only"),
        (("prioritized", 100, 1.0, 200, 50, 10, 128), {},
         r"learner.batch_size \(128\) exceeds replay.capacity \(100\)"),
        (("fifo", 100, 1.0, 200, 150, 10, 20), {},
         r"replay.min_size_to_sample \(150\) exceeds replay.capacity \(100\)"),
        # Items read once cannot give 4 samples per insert.
        (("fifo", 1000, 4.0, 100, 100, 10, 20), {},
         "replay.samples_per_insert 4 > 1 for a FIFO whose items are read once .*the learner "
         "would wait forever.*set replay.samples_per_insert = 1 or replay.max_times_sampled = 4"),
        (("fifo", 1000, 2.5, 100, 100, 10, 20), {"max_times_sampled": 2, "evict_unread": True},
         "replay.samples_per_insert 2.5 > 2 for a FIFO whose items are read at most 2 times.*"
         "set replay.samples_per_insert <= 2 or replay.max_times_sampled >= 3"),
        # Items kept until read twice, but the limiter allows one read per insert: the queue fills.
        (("fifo", 1000, 1.0, 100, 100, 10, 20), {"max_times_sampled": 2},
         "replay.samples_per_insert 1 < replay.max_times_sampled 2 .*actors wait forever.*"
         "set replay.samples_per_insert = 2, or replay.evict_unread = true"),
        (("fifo", 1000, 0.5, 100, 100, 10, 20), {},
         "replay.samples_per_insert 0.5 < replay.max_times_sampled 1"),
        # max(20 * 2, 32) = 40 > 30
        (("prioritized", 1000, 2.0, 30, 100, 20, 32), {},
         r"replay.rate_error_buffer 30 < max\(chunk items 20 .* = 40: .*"
         "set replay.rate_error_buffer >= 40"),
        # The limiter admits inserts while inserted <= 1 + 64 / 4 = 17: chunks of 8 stop at 16
        # items, and at worst (chunks of up to 8) at 17 - 8 + 1 = 10, short of a batch of 64.
        (("prioritized", 1000, 4.0, 64, 1, 8, 64), {},
         "replay.min_size_to_sample 1 is too small for learner.batch_size 64: .*from 10 items on.*"
         "set replay.min_size_to_sample >= 64"),
        # 9 items stored: no batch of 10, and no room for a chunk of 32 (9 + 32 > 40).
        (("fifo", 40, 1.0, 60, 20, 32, 10), {},
         "replay.capacity 40 is too small for a FIFO with chunks of 32 items .*"
         "set replay.capacity >= 41"),
        # Before any sample the queue may be refusing chunks of 10 from 91 items on, short of 95.
        (("fifo", 100, 1.0, 50, 95, 10, 20), {},
         "replay.capacity 100 is too small for a FIFO: no learner reads it before "
         "replay.min_size_to_sample 95 items are in.*stop filling at 91 items; "
         "set replay.capacity >= 104"),
        # Items read twice, 2 samples per insert, min size 4, error buffer 4: 5 items inserted,
        # one batch of 4 read once: diff = 2 * 5 - 4 = 6. The full queue refuses a chunk, and the
        # batch needs diff - 4 >= 2 * 4 - 4, but 2 < 4. Capacity 4 + 1 - 1 + (4 - 4 / 2) = 6 works.
        (("fifo", 5, 2.0, 4, 4, 1, 4), {"max_times_sampled": 2},
         "replay.capacity 5 is too small for a FIFO: when it is full and its oldest batch has "
         "been read fewer than 2 times.*set replay.capacity >= 6"),
    ],
)  # fmt: skip
def test_check_replay_config_refuses_what_can_deadlock_and_names_the_key(
    args: tuple, kwargs: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        check_replay_config(*args, **kwargs)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        # configs/apex_dqn_cartpole.yaml: chunks of 8 * 8, error buffer 64 * 4 + 128
        (("prioritized", 100_000, 4.0, 384.0, 2000, 64, 128), {}),
        (("prioritized", 100, 0.0, 0.0, 1, 64, 10), {}),  # no ratio; chunks overwrite freely
        # IMPALA-like: each item read once, error buffer 64 * 1 + 128 (Config's automatic one)
        (("fifo", 4096, 1.0, 192.0, 128, 64, 128), {}),
        (("fifo", 4096, 2.0, 256.0, 128, 64, 128), {"max_times_sampled": 2}),
        (("fifo", 1024, 0.5, 160.0, 128, 64, 128), {"evict_unread": True}),
        (("fifo", 200, 0.0, 128.0, 137, 64, 32), {}),  # no ratio: 200 - 64 + 1 = 137 >= 137
        (("fifo", 41, 1.0, 60, 10, 32, 10), {}),  # capacity 32 + 10 - 1, the smallest safe one
        (("fifo", 6, 2.0, 4, 4, 1, 4), {"max_times_sampled": 2}),  # see the refusal of 5
        (("fifo", 100, 1.0, 50, 95, 10, 20), {"evict_unread": True}),
    ],
)
def test_check_replay_config_accepts_what_cannot_deadlock(args: tuple, kwargs: dict) -> None:
    check_replay_config(*args, **kwargs)


def find_deadlock(
    kind: str,
    capacity: int,
    spi: float,
    error_buffer: float,
    min_size: int,
    chunk: int,
    batch: int,
    k: int,
    evict: bool,
) -> tuple | None:
    """Search every state the replay server's rules reach (``ReplayService.drain``: a chunk goes in
    if the limiter and the table take it, a batch comes out if the table holds one and the limiter
    allows it), with chunks of 1..``chunk`` items and batches of ``batch``. Returns a state in
    which a held chunk and a held batch wait for each other, or None."""
    limiter = RateLimiter(spi, min_size, error_buffer)
    table = make_table(kind, capacity, 1.0, max_times_sampled=k, evict_unread=evict)
    seen, todo = set(), [(limiter, table, {})]
    while todo:
        limiter, table, times = todo.pop()  # times: deliveries of each key delivered so far
        stored = range(table.num_inserted - table.size, table.num_inserted)
        # All that decides what can happen next.
        state = (
            min(limiter.num_inserted, min_size),
            limiter.diff if spi > 0 else 0.0,
            table.size,
            tuple(times.get(key, 0) for key in stored) if kind == "fifo" else (),
        )
        if state in seen:
            continue
        seen.add(state)
        can_sample = table.size >= batch and limiter.can_sample(batch)
        for n in range(1, chunk + 1):
            if not (limiter.can_insert(n) and table.can_insert(n)):
                if not can_sample:
                    return state
                continue
            next_limiter, next_table = copy.deepcopy((limiter, table))
            next_table.insert(make_fields(table.num_inserted, n), np.ones(n))
            next_limiter.record_insert(n)
            todo.append((next_limiter, next_table, times))
        if can_sample:
            next_limiter, next_table = copy.deepcopy((limiter, table))
            keys, _, _ = next_table.sample(batch, np.random.default_rng(0))
            next_limiter.record_sample(batch)
            next_times = dict(times)
            if kind == "fifo":
                for key in keys.tolist():
                    next_times[key] = next_times.get(key, 0) + 1
            todo.append((next_limiter, next_table, next_times))
    return None


@pytest.mark.parametrize(
    ("config", "key"),
    [
        # kind, capacity, spi, error buffer, min size, chunk, batch, max times sampled, evict
        (("fifo", 6, 2.0, 4.0, 2, 1, 2, 1, False), "replay.samples_per_insert 2 >"),
        (("fifo", 6, 1.0, 4.0, 2, 1, 2, 2, False), "replay.samples_per_insert 1 <"),
        (("fifo", 6, 0.5, 4.0, 2, 1, 2, 1, False), "replay.samples_per_insert 0.5 <"),
        # The limiter admits inserts while inserted <= 1 + 4 / 4: 2 items, short of a batch of 4.
        (("prioritized", 8, 4.0, 4.0, 1, 1, 4, 1, False), "replay.min_size_to_sample 1 is"),
        (("fifo", 3, 1.0, 3.0, 1, 3, 2, 1, False), "replay.capacity 3 is"),  # 3 < 3 + 2 - 1
        (("fifo", 3, 0.0, 3.0, 1, 3, 2, 1, False), "replay.capacity 3 is"),  # the same, no ratio
        # A chunk of 3, then no room for 3 more, with 3 items < min size 4: no sample either.
        (("fifo", 5, 1.0, 3.0, 4, 3, 1, 1, False), "replay.capacity 5 is"),
        (("fifo", 5, 2.0, 4.0, 4, 1, 4, 2, False), "replay.capacity 5 is"),  # see above
        (("fifo", 4, 1.0, 4.0, 5, 1, 2, 1, False), "replay.min_size_to_sample (5) exceeds"),
        (("prioritized", 3, 1.0, 4.0, 2, 1, 4, 1, False), "learner.batch_size (4) exceeds"),
    ],
)
def test_refused_configurations_really_deadlock(config: tuple, key: str) -> None:
    with pytest.raises(ValueError, match=re.escape(key)):
        check_replay_config(*config)
    assert find_deadlock(*config) is not None


def test_accepted_configurations_never_deadlock() -> None:
    """Random small configurations: whatever check_replay_config accepts, an exhaustive search
    finds no deadlock in. (Some refusals are sufficient conditions only: the limiter's slack of
    check_no_deadlock, the room of an evicting queue, a min size larger than a table that keeps
    inserting; they may refuse a few safe configurations.)"""
    rng = np.random.default_rng(0)
    accepted = 0
    for _ in range(300):
        kind = ["prioritized", "fifo"][rng.integers(2)]
        k = int(rng.choice([1, 2])) if kind == "fifo" else 1
        capacity = int(rng.integers(3, 10))
        spi = float(rng.choice([0.0, 0.5, 1.0, 2.0, k]))
        chunk, batch = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        automatic = chunk * spi + batch  # Config.rate_error_buffer for rate_error_buffer = 0
        error_buffer = float(rng.choice([1, 2, 3, 4, automatic, automatic]))
        min_size = int(rng.integers(1, capacity + 1))
        evict = bool(kind == "fifo" and rng.random() < 0.3)
        config = (kind, capacity, spi, error_buffer, min_size, chunk, batch, k, evict)
        try:
            check_replay_config(*config)
        except ValueError:
            continue
        assert find_deadlock(*config) is None, config
        accepted += 1
    assert accepted > 150

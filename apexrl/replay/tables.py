"""Replay tables and the rate limiter that the replay server composes.

An *item* is one row of named numpy arrays (its *fields*): an Ape-X transition, an R2D2 sequence or
an IMPALA unroll. An insert carries ``N`` items as ``dict[str, np.ndarray]`` whose arrays share
leading dimension ``N``. Storage is allocated from the first insert, rlpyt style: each field gets
one preallocated array of shape ``[capacity, *trailing_shape]`` and the first insert's dtype, and
every later insert must match those specs exactly.

Items get int64 keys ``0, 1, 2, ...`` in insertion order and live in slot ``key % capacity``, so the
stored items are always the keys ``[next_key - size, next_key)``. When a table is full the oldest
items are overwritten (FIFO eviction). Because keys are never reused, a priority update that arrives
after its item was evicted is recognised as stale and ignored.

- ``PrioritizedTable``: proportional prioritized sampling with replacement (Ape-X, R2D2).
- ``FifoQueue``: every item is delivered exactly once, oldest first (IMPALA, PPO).
- ``RateLimiter``: Reverb's ``SampleToInsertRatio``; it counts, the server decides what to block.
"""

from __future__ import annotations

import math

import numpy as np

from apexrl.replay.sum_tree import SumTree


def _describe(spec: tuple[np.dtype, tuple[int, ...]] | None) -> str:
    if spec is None:
        return "absent"
    dtype, shape = spec
    return f"{dtype} with trailing shape {shape}"


class RingStorage:
    """Preallocated field arrays holding keys ``[oldest_key, next_key)`` at ``key % capacity``.

    Both tables own one. Inserts overwrite the oldest items once ``capacity`` are stored; an insert
    of ``N > capacity`` items behaves as ``N`` single inserts would: every item gets a key, and only
    the last ``capacity`` remain stored.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.size = 0
        self.next_key = 0
        self._arrays: dict[str, np.ndarray] = {}
        self._specs: dict[str, tuple[np.dtype, tuple[int, ...]]] | None = None

    @property
    def oldest_key(self) -> int:
        return self.next_key - self.size

    def check(self, fields: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Validate an insert against the stored specs; returns the fields as arrays.

        Mutates nothing. Raises ``ValueError`` naming the field and both specs on a name, dtype or
        trailing-shape mismatch, and on missing leading dimensions or unequal item counts.
        """
        if not fields:
            raise ValueError("an insert needs at least one field")
        arrays = {name: np.asarray(value) for name, value in fields.items()}
        for name, array in arrays.items():
            if array.ndim == 0:
                raise ValueError(f"field {name!r} has no leading item dimension (a 0-d array)")
            if array.dtype == object:
                raise ValueError(f"field {name!r} has dtype object; only numeric arrays are stored")
        counts = {name: array.shape[0] for name, array in arrays.items()}
        if len(set(counts.values())) > 1:
            raise ValueError(f"fields disagree on the number of items: {counts}")
        if self._specs is not None:
            for name in sorted(set(self._specs) | set(arrays)):
                stored = self._specs.get(name)
                given = (arrays[name].dtype, arrays[name].shape[1:]) if name in arrays else None
                if stored != given:
                    raise ValueError(
                        f"field {name!r}: table stores {_describe(stored)}, "
                        f"insert has {_describe(given)}"
                    )
        return arrays

    def write(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """Store checked arrays (see ``check``); returns the int64 keys ``[N]`` they were given."""
        num_items = next(iter(arrays.values())).shape[0]
        if self._specs is None:
            self._specs = {name: (a.dtype, a.shape[1:]) for name, a in arrays.items()}
            self._arrays = {
                name: np.zeros((self.capacity, *a.shape[1:]), dtype=a.dtype)
                for name, a in arrays.items()
            }
        keys = np.arange(self.next_key, self.next_key + num_items, dtype=np.int64)
        kept = keys[-self.capacity :]
        start = int(kept[0]) % self.capacity
        if start + kept.size <= self.capacity:  # no wrap-around: a slice copy, no index array
            slots: slice | np.ndarray = slice(start, start + kept.size)
        else:
            slots = kept % self.capacity
        for name, array in arrays.items():
            self._arrays[name][slots] = array[-self.capacity :]
        self.next_key += num_items
        self.size = min(self.size + num_items, self.capacity)
        return keys

    def read(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """Copies of the fields at ``slots``, each ``[K, *trailing_shape]``."""
        return {name: array[slots] for name, array in self._arrays.items()}

    def is_stored(self, keys: np.ndarray) -> np.ndarray:
        """Boolean mask ``[K]``: which keys are currently stored (not evicted, already issued)."""
        return (keys >= self.oldest_key) & (keys < self.next_key)

    def keys_at(self, slots: np.ndarray) -> np.ndarray:
        """Keys, int64 ``[K]``, of the items stored in ``slots``."""
        oldest = self.oldest_key
        return oldest + (slots - oldest) % self.capacity

    def drop_oldest(self, num_items: int) -> None:
        self.size -= num_items


def _check_priorities(priorities: np.ndarray, num_items: int) -> np.ndarray:
    priorities = np.asarray(priorities, dtype=np.float64)
    if priorities.shape != (num_items,):
        raise ValueError(f"priorities have shape {priorities.shape}, expected ({num_items},)")
    if not np.all(np.isfinite(priorities)) or np.any(priorities < 0):
        raise ValueError("priorities must be finite and non-negative")
    return priorities


def _check_batch_size(batch_size: int) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")


class PrioritizedTable:
    """Proportional prioritized replay (Schaul et al., 2016): ``P(i) = p_i^a / sum_k p_k^a``.

    Priorities are raw ``|TD|``-like values ``p >= 0``; the tree stores
    ``max(p, min_priority) ** alpha`` so that no stored item becomes unsampleable. ``alpha = 0``
    gives uniform sampling.
    """

    def __init__(self, capacity: int, alpha: float, min_priority: float = 1e-6) -> None:
        if not (math.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"alpha must be finite and >= 0, got {alpha}")
        if not (math.isfinite(min_priority) and min_priority > 0):
            raise ValueError(f"min_priority must be finite and > 0, got {min_priority}")
        self._storage = RingStorage(capacity)
        self._tree = SumTree(capacity)
        self._alpha = float(alpha)
        self._min_priority = float(min_priority)
        # Schaul et al., Algorithm 1, start from p_1 = 1.
        self._max_priority = 1.0
        self._num_sampled = 0

    @property
    def capacity(self) -> int:
        return self._storage.capacity

    @property
    def size(self) -> int:
        return self._storage.size

    @property
    def num_inserted(self) -> int:
        """Items ever inserted (evicted ones included)."""
        return self._storage.next_key

    @property
    def num_sampled(self) -> int:
        """Items ever sampled (a batch of ``B`` counts ``B``)."""
        return self._num_sampled

    @property
    def max_priority(self) -> float:
        """Largest raw priority given so far by insert or update; 1.0 before any."""
        return self._max_priority

    def insert(self, fields: dict[str, np.ndarray], priorities: np.ndarray) -> np.ndarray:
        """Store ``N`` items; returns their int64 keys ``[N]``.

        Args:
            fields: named arrays, each ``[N, ...]``, matching the specs of the first insert.
            priorities: float ``[N]``, raw priorities ``>= 0``.

        An insert of ``N > capacity`` items keeps only the last ``capacity`` (all ``N`` get keys).
        Raises ``ValueError`` (and changes nothing) on a spec mismatch or bad priorities.
        """
        arrays = self._storage.check(fields)
        priorities = _check_priorities(priorities, next(iter(arrays.values())).shape[0])
        keys = self._storage.write(arrays)
        kept = keys[-self.capacity :]
        self._set_priorities(kept % self.capacity, priorities[-self.capacity :])
        return keys

    def sample(
        self, batch_size: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        """Draw ``B`` items with replacement, proportionally to ``p^alpha``, stratified.

        The priority mass is cut into ``B`` equal segments and one point is drawn uniformly in each:
        ``u_i = (i + U(0, 1)) * total / B`` (Schaul et al., Appendix B.2.1).

        Returns:
            keys int64 ``[B]``, fields (copies) ``{name: [B, ...]}``, probabilities float64 ``[B]``
            (``P(i)`` of each drawn item, for importance weights).
        """
        _check_batch_size(batch_size)
        if self.size == 0:
            raise ValueError("cannot sample from an empty table")
        total = self._tree.total
        u = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)
        slots = self._tree.sample(u)
        probabilities = self._tree.get(slots) / total
        self._num_sampled += batch_size
        return self._storage.keys_at(slots), self._storage.read(slots), probabilities

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        """Set raw priorities of stored items; returns the number of distinct keys updated.

        Keys already evicted or never issued are ignored. If a key repeats, its last priority wins.
        Raises ``ValueError`` on non-integer keys or on a negative, NaN or misshapen priority (even
        one paired with a stale key), before changing anything.
        """
        keys = np.asarray(keys)
        if keys.ndim != 1 or (keys.size and not np.issubdtype(keys.dtype, np.integer)):
            raise ValueError(f"keys must be a 1-D integer array, got {keys.dtype} {keys.shape}")
        priorities = _check_priorities(priorities, keys.shape[0])
        stored = self._storage.is_stored(keys.astype(np.int64))
        slots = keys[stored] % self.capacity
        self._set_priorities(slots, priorities[stored])
        return int(np.unique(slots).size)

    def _set_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        if priorities.size:
            self._max_priority = max(self._max_priority, float(priorities.max()))
        self._tree.update(slots, np.maximum(priorities, self._min_priority) ** self._alpha)


class FifoQueue:
    """First-in first-out queue of items: each item is delivered at most once, oldest first.

    When full, an insert evicts the oldest undelivered items (the replay server's ``RateLimiter``
    normally keeps the queue from filling). An insert of ``N > capacity`` items keeps only the last
    ``capacity``. It shares ``PrioritizedTable``'s surface: priorities are accepted and ignored.
    """

    def __init__(self, capacity: int) -> None:
        self._storage = RingStorage(capacity)
        self._num_sampled = 0

    @property
    def capacity(self) -> int:
        return self._storage.capacity

    @property
    def size(self) -> int:
        return self._storage.size

    @property
    def num_inserted(self) -> int:
        """Items ever inserted (evicted ones included)."""
        return self._storage.next_key

    @property
    def num_sampled(self) -> int:
        """Items ever delivered."""
        return self._num_sampled

    def insert(
        self, fields: dict[str, np.ndarray], priorities: np.ndarray | None = None
    ) -> np.ndarray:
        """Store ``N`` items (fields ``[N, ...]``); returns their int64 keys ``[N]``."""
        return self._storage.write(self._storage.check(fields))

    def sample(
        self, batch_size: int, rng: np.random.Generator | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        """Remove and return the oldest ``B`` items: keys, fields ``[B, ...]`` and ones ``[B]``.

        Raises ``ValueError`` if fewer than ``B`` items are stored.
        """
        _check_batch_size(batch_size)
        if self.size < batch_size:
            raise ValueError(f"queue holds {self.size} items, fewer than batch_size {batch_size}")
        oldest = self._storage.oldest_key
        keys = np.arange(oldest, oldest + batch_size, dtype=np.int64)
        fields = self._storage.read(keys % self.capacity)
        self._storage.drop_oldest(batch_size)
        self._num_sampled += batch_size
        return keys, fields, np.ones(batch_size, dtype=np.float64)

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        """No-op (a queue has no priorities); returns 0."""
        return 0


def make_table(kind: str, capacity: int, alpha: float) -> PrioritizedTable | FifoQueue:
    """``"prioritized"`` -> ``PrioritizedTable(capacity, alpha)``; ``"fifo"`` -> ``FifoQueue``."""
    if kind == "prioritized":
        return PrioritizedTable(capacity, alpha)
    if kind == "fifo":
        return FifoQueue(capacity)
    raise ValueError(f"unknown table kind {kind!r}; expected 'prioritized' or 'fifo'")


class RateLimiter:
    """Keeps samples per insert near a target ratio (Reverb's ``SampleToInsertRatio``).

    It counts items, not calls. With ``diff = num_inserted * samples_per_insert - num_sampled``:

    - inserting ``n`` is allowed while filling (``num_inserted + n <= min_size_to_sample``) or if
      ``diff + n * spi <= min_size_to_sample * spi + error_buffer``;
    - sampling ``n`` needs ``num_inserted >= min_size_to_sample`` and
      ``diff - n >= min_size_to_sample * spi - error_buffer``.

    So once sampling starts, ``|num_sampled - spi * (num_inserted - min_size_to_sample)|`` stays
    within ``error_buffer``. ``samples_per_insert <= 0`` disables the ratio: inserts are always
    allowed and sampling needs only ``min_size_to_sample`` inserts (for tests and benchmarks).

    Deadlock: if ``error_buffer`` is too small, a full insert chunk and a full batch can both be
    blocked at once and neither side ever moves. The replay server must choose
    ``error_buffer >= max(max_insert_items * spi, max_sample_items)``; ``check_no_deadlock`` checks
    it.
    """

    def __init__(
        self, samples_per_insert: float, min_size_to_sample: int, error_buffer: float
    ) -> None:
        if not math.isfinite(samples_per_insert):
            raise ValueError(f"samples_per_insert must be finite, got {samples_per_insert}")
        if min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample must be >= 1, got {min_size_to_sample}")
        if not (math.isfinite(error_buffer) and error_buffer >= 0):
            raise ValueError(f"error_buffer must be finite and >= 0, got {error_buffer}")
        self.samples_per_insert = float(samples_per_insert)
        self.min_size_to_sample = int(min_size_to_sample)
        self.error_buffer = float(error_buffer)
        self._num_inserted = 0
        self._num_sampled = 0

    @property
    def num_inserted(self) -> int:
        return self._num_inserted

    @property
    def num_sampled(self) -> int:
        return self._num_sampled

    @property
    def diff(self) -> float:
        """``num_inserted * samples_per_insert - num_sampled``."""
        return self._num_inserted * self.samples_per_insert - self._num_sampled

    def can_insert(self, num_items: int) -> bool:
        spi = self.samples_per_insert
        if spi <= 0 or self._num_inserted + num_items <= self.min_size_to_sample:
            return True
        return self.diff + num_items * spi <= self.min_size_to_sample * spi + self.error_buffer

    def can_sample(self, num_items: int) -> bool:
        if self._num_inserted < self.min_size_to_sample:
            return False
        spi = self.samples_per_insert
        if spi <= 0:
            return True
        return self.diff - num_items >= self.min_size_to_sample * spi - self.error_buffer

    def record_insert(self, num_items: int) -> None:
        if num_items < 0:
            raise ValueError(f"num_items must be >= 0, got {num_items}")
        self._num_inserted += num_items

    def record_sample(self, num_items: int) -> None:
        if num_items < 0:
            raise ValueError(f"num_items must be >= 0, got {num_items}")
        self._num_sampled += num_items


def check_no_deadlock(limiter: RateLimiter, max_insert_items: int, max_sample_items: int) -> None:
    """Raise ``ValueError`` unless inserts of up to ``max_insert_items`` and samples of up to
    ``max_sample_items`` can never be blocked at the same time.

    Sufficient condition (``spi > 0``): ``error_buffer >= max(max_insert_items * spi,
    max_sample_items)``. It covers both ways to stall: while filling, a chunk that would cross
    ``min_size_to_sample`` must fit (needs ``error_buffer >= (max_insert_items - 1) * spi``); later,
    the insert-blocked and sample-blocked ranges of ``diff`` must not overlap (needs
    ``2 * error_buffer >= max_insert_items * spi + max_sample_items``).
    """
    spi = limiter.samples_per_insert
    if spi <= 0:
        return
    needed = max(max_insert_items * spi, max_sample_items)
    if limiter.error_buffer < needed:
        raise ValueError(
            f"error_buffer {limiter.error_buffer} < max(max_insert_items * samples_per_insert, "
            f"max_sample_items) = max({max_insert_items} * {spi}, {max_sample_items}) = {needed}; "
            "inserts and samples could block each other forever"
        )

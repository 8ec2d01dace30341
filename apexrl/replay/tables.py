"""Replay tables and the rate limiter that the replay server composes.

An *item* is one row of named numpy arrays (its *fields*): an Ape-X transition, an R2D2 sequence or
an IMPALA unroll. An insert carries ``N`` items as ``dict[str, np.ndarray]`` whose arrays share
leading dimension ``N``. Each field gets one preallocated array of shape
``[capacity, *item_shape]``, allocated from an *item spec* (field -> dtype and per-item shape)
given when the table is made or, without one, from the first insert (rlpyt style). Every insert
must match those specs exactly. The replay server always passes the algorithm's spec (``item_spec``
of its hyperparameters), so a first chunk of junk cannot decide the layout for everyone after it.

Items get int64 keys ``0, 1, 2, ...`` in insertion order and live in slot ``key % capacity``, so the
stored items are always the keys ``[next_key - size, next_key)``. When a prioritized table is full
the oldest items are overwritten. Because keys are never reused, a priority update that arrives
after its item was evicted is recognised as stale and ignored.

- ``PrioritizedTable``: proportional prioritized sampling with replacement (Ape-X, R2D2).
- ``FifoQueue``: every item is delivered ``max_times_sampled`` times (once by default), oldest
  first (IMPALA, PPO). A full queue refuses inserts (the server holds them back) unless it was
  built to evict unread items, which it then counts.
- ``RateLimiter``: Reverb's ``SampleToInsertRatio``; it counts, the server decides what to block.
- ``check_replay_config``: refuses, before anything starts, a configuration that can deadlock.

Priorities must be finite, ``>= 0`` and ``<= MAX_PRIORITY``.
"""

from __future__ import annotations

import math

import numpy as np

from apexrl.replay.sum_tree import SumTree

ItemSpec = dict[str, tuple[np.dtype, tuple[int, ...]]]  # field -> (dtype, shape of one item)

# The largest raw priority a table takes, far above any |TD| error. It bounds what the float64 sum
# tree must hold: p ** alpha stays finite for any alpha up to 25, and with alpha <= 1 the total of
# a table of 2**24 items stays below 2**64, so each sum's relative round-off (2**-53 per tree
# level) moves any item's sampling probability by less than 1e-14.
MAX_PRIORITY = 1e12


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

    def __init__(self, capacity: int, spec: ItemSpec | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.size = 0
        self.next_key = 0
        self._arrays: dict[str, np.ndarray] = {}
        self._specs: ItemSpec | None = None
        if spec is not None:
            if not spec:
                raise ValueError("an item spec needs at least one field")
            self._allocate(
                {name: (np.dtype(dtype), tuple(shape)) for name, (dtype, shape) in spec.items()}
            )

    def _allocate(self, specs: ItemSpec) -> None:
        for name, (dtype, _shape) in specs.items():
            if dtype.kind == "O":
                raise ValueError(f"field {name!r} has dtype object; only numeric arrays are stored")
        self._specs = specs
        self._arrays = {
            name: np.zeros((self.capacity, *shape), dtype=dtype)
            for name, (dtype, shape) in specs.items()
        }

    @property
    def oldest_key(self) -> int:
        return self.next_key - self.size

    def check(self, fields: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Validate an insert against the stored specs; returns the fields as arrays.

        Mutates nothing. Raises ``ValueError`` naming the field and both specs on a name, dtype or
        trailing-shape mismatch, and on missing leading dimensions, unequal item counts or no items.
        """
        if self._matches_spec(fields):
            return fields
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
        if next(iter(counts.values())) == 0:
            raise ValueError("an insert needs at least one item")
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

    def _matches_spec(self, fields: dict[str, np.ndarray]) -> bool:
        """Whether ``fields`` are arrays of exactly the stored specs with one, non-zero item count:
        ``check``'s answer for the inserts it accepts, in one pass (anything else takes the full
        path, which names the mismatch)."""
        specs = self._specs
        if specs is None or type(fields) is not dict or fields.keys() != specs.keys():
            return False
        num_items = -1
        for name, (dtype, shape) in specs.items():
            array = fields[name]
            if type(array) is not np.ndarray or array.dtype != dtype or array.ndim == 0:
                return False
            if array.shape[1:] != shape or num_items not in (-1, array.shape[0]):
                return False
            num_items = array.shape[0]
        return num_items > 0

    def write(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """Store checked arrays (see ``check``); returns the int64 keys ``[N]`` they were given."""
        num_items = next(iter(arrays.values())).shape[0]
        if self._specs is None:
            self._allocate({name: (a.dtype, a.shape[1:]) for name, a in arrays.items()})
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

    def write_many(self, inserts: list[dict[str, np.ndarray]]) -> tuple[int, int]:
        """Store several checked inserts (see ``check``) one after another, as ``write`` would
        each in turn, with one copy per field for all of them; returns the keys ``[first, end)``
        they were given."""
        first = self.next_key
        counts = [next(iter(arrays.values())).shape[0] for arrays in inserts]
        total = sum(counts)
        if total > self.capacity or self._specs is None:  # only the last items stay: rare
            for arrays in inserts:
                self.write(arrays)
            return first, self.next_key
        start = first % self.capacity
        end = start + total
        split = self.capacity - start  # items that fit before the end of the ring
        for name, stored in self._arrays.items():
            parts = [arrays[name] for arrays in inserts]
            if end <= self.capacity:
                if len(parts) == 1:
                    stored[start:end] = parts[0]
                else:
                    np.concatenate(parts, out=stored[start:end])
            else:
                joined = np.concatenate(parts)
                stored[start:] = joined[:split]
                stored[: end - self.capacity] = joined[split:]
        self.next_key += total
        self.size = min(self.size + total, self.capacity)
        return first, self.next_key

    def read(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """Copies of the fields at ``slots``, each ``[K, *trailing_shape]``."""
        return {name: array.take(slots, axis=0) for name, array in self._arrays.items()}

    def is_stored(self, keys: np.ndarray) -> np.ndarray:
        """Boolean mask ``[K]``: which keys are currently stored (not evicted, already issued)."""
        return (keys >= self.oldest_key) & (keys < self.next_key)

    def keys_at(self, slots: np.ndarray) -> np.ndarray:
        """Keys, int64 ``[K]``, of the items stored in ``slots``."""
        oldest = self.oldest_key
        return oldest + (slots - oldest) % self.capacity

    def drop_oldest(self, num_items: int) -> None:
        self.size -= num_items

    @property
    def spec(self) -> ItemSpec | None:
        """Field -> (dtype, per-item shape); None until the first insert of a table made without
        one."""
        return None if self._specs is None else dict(self._specs)

    def stored_slots(self) -> np.ndarray:
        """Slots, int64 ``[size]``, of the stored items, oldest first."""
        return np.arange(self.oldest_key, self.next_key, dtype=np.int64) % self.capacity

    def export_items(self) -> dict[str, np.ndarray]:
        """Copies of the stored items, oldest first: each field ``[size, *item_shape]``."""
        return self.read(self.stored_slots())

    def import_items(self, items: dict[str, np.ndarray], size: int, next_key: int) -> None:
        """Refill empty storage with ``items`` (as ``export_items`` gives them) holding the keys
        ``[next_key - size, next_key)``; raises ``ValueError`` (changing nothing) unless they
        match the spec exactly."""
        if self.next_key != 0:
            raise ValueError("items can only be imported into empty storage")
        if self._specs is None:
            raise ValueError("storage without an item spec cannot import items")
        if not 0 <= size <= min(next_key, self.capacity):
            raise ValueError(
                f"size {size} must be in 0..min(next_key {next_key}, capacity {self.capacity})"
            )
        for name in sorted(set(self._specs) | set(items)):
            stored = self._specs.get(name)
            given = None
            if name in items:
                given = (items[name].dtype, items[name].shape[1:])
                if items[name].shape[:1] != (size,):
                    raise ValueError(
                        f"field {name!r} has shape {items[name].shape}, not {size} items"
                    )
            if stored != given:
                raise ValueError(
                    f"field {name!r}: table stores {_describe(stored)}, "
                    f"import has {_describe(given)}"
                )
        self.next_key, self.size = int(next_key), int(size)
        slots = self.stored_slots()
        for name, array in items.items():
            self._arrays[name][slots] = array


def check_priorities(priorities: np.ndarray, num_items: int) -> np.ndarray:
    """``priorities`` as float64 ``[num_items]``; raises ``ValueError`` unless each is finite and
    in ``[0, MAX_PRIORITY]``."""
    priorities = np.asarray(priorities)
    if priorities.dtype.kind not in "fiu":
        raise ValueError(f"priorities must be real numbers, got dtype {priorities.dtype}")
    priorities = priorities.astype(np.float64, copy=False)
    if priorities.shape != (num_items,):
        raise ValueError(f"priorities have shape {priorities.shape}, expected ({num_items},)")
    if priorities.size:
        # Two reductions check everything: a NaN makes both NaN, and NaN fails every comparison.
        low, high = np.minimum.reduce(priorities), np.maximum.reduce(priorities)
        if not (low >= 0 and math.isfinite(high)):
            raise ValueError("priorities must be finite and non-negative")
        if high > MAX_PRIORITY:
            raise ValueError(f"priorities must be <= {MAX_PRIORITY:g}, got {high:g}")
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

    def __init__(
        self,
        capacity: int,
        alpha: float,
        min_priority: float = 1e-6,
        spec: ItemSpec | None = None,
    ) -> None:
        if not (math.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"alpha must be finite and >= 0, got {alpha}")
        if not (math.isfinite(min_priority) and min_priority > 0):
            raise ValueError(f"min_priority must be finite and > 0, got {min_priority}")
        self._storage = RingStorage(capacity, spec)
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

    def can_insert(self, num_items: int) -> bool:
        """Always ``True``: a full prioritized table overwrites its oldest items."""
        return True

    def check_items(self, fields: dict[str, np.ndarray]) -> None:
        """Raise ``ValueError`` unless ``fields`` match the table's items (``RingStorage.check``);
        stores nothing."""
        self._storage.check(fields)

    def insert(self, fields: dict[str, np.ndarray], priorities: np.ndarray) -> np.ndarray:
        """Store ``N`` items; returns their int64 keys ``[N]``.

        Args:
            fields: named arrays, each ``[N, ...]``, matching the table's item spec (or, without
                one, the first insert's).
            priorities: float ``[N]``, raw priorities in ``[0, MAX_PRIORITY]``.

        An insert of ``N > capacity`` items keeps only the last ``capacity`` (all ``N`` get keys).
        Raises ``ValueError`` (and changes nothing) on a spec mismatch or bad priorities.
        """
        arrays = self._storage.check(fields)
        priorities = check_priorities(priorities, next(iter(arrays.values())).shape[0])
        return np.arange(*self.insert_many([arrays], [priorities]), dtype=np.int64)

    def insert_many(
        self, fields: list[dict[str, np.ndarray]], priorities: list[np.ndarray]
    ) -> tuple[int, int]:
        """Store several inserts that ``check_items`` and ``check_priorities`` accepted, as
        ``insert`` would each in turn, but without checking them again and with one copy per
        field and one sum-tree update for all of them (the replay server's batched inserts).
        Returns the keys ``[first, end)`` they were given."""
        first, end = self._storage.write_many(fields)
        joined = priorities[0] if len(priorities) == 1 else np.concatenate(priorities)
        kept = joined[-self.capacity :]
        self._set_priority_range((end - kept.size) % self.capacity, kept)
        return first, end

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
        priorities = check_priorities(priorities, keys.shape[0])
        stored = self._storage.is_stored(keys.astype(np.int64))
        slots = keys[stored] % self.capacity
        self._set_priorities(slots, priorities[stored])
        return int(np.unique(slots).size)

    def export_state(self) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """Everything needed to go on (see ``import_state``): arrays (the stored items' fields,
        oldest first, and ``priorities``, their sum-tree values ``max(p, min_priority) ** alpha``,
        float64 ``[size]``) and scalars. Copies: the table may change right after."""
        storage = self._storage
        arrays = {f"field/{name}": a for name, a in storage.export_items().items()}
        arrays["priorities"] = self._tree.get(storage.stored_slots())
        scalars = {
            "next_key": int(storage.next_key),
            "size": int(storage.size),
            "num_sampled": int(self._num_sampled),
            "max_priority": float(self._max_priority),
        }
        return arrays, scalars

    def import_state(self, arrays: dict[str, np.ndarray], scalars: dict[str, float]) -> None:
        """Load an empty table from ``export_state``'s output: the same items under the same keys,
        with the same sampling probabilities. Raises ``ValueError`` on anything that does not fit
        this table; the table is then unusable (import into a fresh one)."""
        size, next_key = _scalar_int(scalars, "size"), _scalar_int(scalars, "next_key")
        num_sampled = _scalar_int(scalars, "num_sampled")
        max_priority = float(scalars["max_priority"])
        if not (math.isfinite(max_priority) and 0 < max_priority <= MAX_PRIORITY):
            raise ValueError(f"max_priority {max_priority} is not in (0, {MAX_PRIORITY:g}]")
        values = arrays.get("priorities")
        if values is None or values.dtype != np.float64 or values.shape != (size,):
            raise ValueError(f"priorities must be float64 [{size}]")
        largest = max(MAX_PRIORITY, self._min_priority) ** self._alpha
        if not np.all(np.isfinite(values)) or np.any(values <= 0) or np.any(values > largest):
            raise ValueError(f"priority values must be in (0, {largest:g}]")
        items = {
            name[len("field/") :]: a for name, a in arrays.items() if name.startswith("field/")
        }
        self._storage.import_items(items, size, next_key)
        self._tree.update(self._storage.stored_slots(), values)
        self._num_sampled = num_sampled
        self._max_priority = max_priority

    def _set_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        if priorities.size:
            self._max_priority = max(self._max_priority, float(priorities.max()))
        self._tree.update(slots, self._tree_values(priorities))

    def _set_priority_range(self, start: int, priorities: np.ndarray) -> None:
        """``_set_priorities`` for the slots ``start, start + 1, ...`` (mod capacity)."""
        if priorities.size:
            self._max_priority = max(self._max_priority, float(priorities.max()))
        values = self._tree_values(priorities)
        split = self.capacity - start
        self._tree.update_range(start, values[:split])
        if values.size > split:
            self._tree.update_range(0, values[split:])

    def _tree_values(self, priorities: np.ndarray) -> np.ndarray:
        """Sum-tree values ``max(p, min_priority) ** alpha``, float64 whatever the priorities'
        float type."""
        return np.maximum(priorities, self._min_priority, dtype=np.float64) ** self._alpha


class FifoQueue:
    """First-in first-out queue: each item is delivered ``max_times_sampled`` times, oldest first.

    Delivery order: a batch of ``B`` is the ``B`` oldest stored items, oldest first. Each item in it
    counts one delivery, and an item leaves the queue with the batch that delivers it for the
    ``max_times_sampled``-th time. So with ``max_times_sampled = 1`` (the default) every item is
    delivered exactly once, in insertion order; with ``k > 1`` and one batch size the queue is read
    in blocks of ``B`` items, each block delivered by ``k`` consecutive batches.

    No item leaves undelivered without being counted:

    - by default a full queue refuses an insert: ``can_insert`` says whether ``N`` items fit now and
      ``insert`` raises ``RuntimeError`` if they do not (the replay server holds the chunk back
      until samples make room, as it does for the rate limiter);
    - with ``evict_unread=True`` an insert into a full queue drops the oldest items (delivered
      fewer than ``max_times_sampled`` times, with ``k = 1`` never) and counts them in
      ``num_evicted``.

    An insert of more than ``capacity`` items raises ``ValueError`` in both modes: it could never
    fit. The queue shares ``PrioritizedTable``'s surface: priorities are accepted and ignored.
    """

    def __init__(
        self,
        capacity: int,
        max_times_sampled: int = 1,
        evict_unread: bool = False,
        spec: ItemSpec | None = None,
    ) -> None:
        if max_times_sampled < 1:
            raise ValueError(f"max_times_sampled must be >= 1, got {max_times_sampled}")
        self._storage = RingStorage(capacity, spec)
        self.max_times_sampled = int(max_times_sampled)
        self.evict_unread = bool(evict_unread)
        # Deliveries of the item in each slot. Batches take the oldest items, so the counts never
        # increase from the oldest stored item to the newest, and the items a batch completes are
        # the oldest ones.
        self._times_sampled = np.zeros(self._storage.capacity, dtype=np.int64)
        self._num_sampled = 0
        self._num_evicted = 0

    @property
    def capacity(self) -> int:
        return self._storage.capacity

    @property
    def size(self) -> int:
        """Items stored: not yet delivered ``max_times_sampled`` times, nor evicted."""
        return self._storage.size

    @property
    def num_inserted(self) -> int:
        """Items ever inserted (evicted ones included)."""
        return self._storage.next_key

    @property
    def num_sampled(self) -> int:
        """Deliveries: a batch of ``B`` counts ``B``, an item delivered ``k`` times counts ``k``."""
        return self._num_sampled

    @property
    def num_evicted(self) -> int:
        """Items dropped by inserts into a full queue before their last delivery (``evict_unread``
        only; always 0 otherwise)."""
        return self._num_evicted

    def can_insert(self, num_items: int) -> bool:
        """Whether ``num_items`` can be inserted now: always with ``evict_unread``, otherwise if the
        free room holds them (else samples must make room first).

        Raises ``ValueError`` if ``num_items > capacity``: such an insert could never succeed.
        """
        if num_items > self.capacity:
            raise ValueError(
                f"a chunk of {num_items} items exceeds the FIFO queue's capacity of "
                f"{self.capacity} items; it is refused whole rather than truncated"
            )
        return self.evict_unread or self.size + num_items <= self.capacity

    def check_items(self, fields: dict[str, np.ndarray]) -> None:
        """Raise ``ValueError`` unless ``fields`` match the queue's items (``RingStorage.check``);
        stores nothing."""
        self._storage.check(fields)

    def insert(
        self, fields: dict[str, np.ndarray], priorities: np.ndarray | None = None
    ) -> np.ndarray:
        """Store ``N`` items (fields ``[N, ...]``); returns their int64 keys ``[N]``.

        Raises (and changes nothing) ``ValueError`` on a spec mismatch or ``N > capacity``, and
        ``RuntimeError`` if the queue has no room for ``N`` items and does not evict.
        """
        arrays = self._storage.check(fields)
        return np.arange(*self.insert_many([arrays]), dtype=np.int64)

    def insert_many(
        self, fields: list[dict[str, np.ndarray]], priorities: list[np.ndarray] | None = None
    ) -> tuple[int, int]:
        """Store several inserts that ``check_items`` accepted, as ``insert`` would each in turn,
        but without checking their items again and with one copy per field for all of them.
        Returns the keys ``[first, end)`` they were given; raises as ``insert`` does when they do
        not fit together (and then changes nothing)."""
        num_items = sum(next(iter(arrays.values())).shape[0] for arrays in fields)
        if not self.can_insert(num_items):
            raise RuntimeError(
                f"the FIFO queue holds {self.size} of {self.capacity} items and has no room for "
                f"{num_items} more; call can_insert first, or build it with evict_unread=True"
            )
        evicted = max(self.size + num_items - self.capacity, 0)
        first, end = self._storage.write_many(fields)
        self._times_sampled[np.arange(first, end) % self.capacity] = 0
        self._num_evicted += evicted
        return first, end

    def sample(
        self, batch_size: int, rng: np.random.Generator | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        """Deliver the oldest ``B`` items: keys ``[B]``, fields ``[B, ...]`` (copies), ones ``[B]``.

        Items delivered for the ``max_times_sampled``-th time leave the queue. Raises
        ``ValueError`` if fewer than ``B`` items are stored.
        """
        _check_batch_size(batch_size)
        if self.size < batch_size:
            raise ValueError(f"queue holds {self.size} items, fewer than batch_size {batch_size}")
        oldest = self._storage.oldest_key
        keys = np.arange(oldest, oldest + batch_size, dtype=np.int64)
        slots = keys % self.capacity
        fields = self._storage.read(slots)
        times = self._times_sampled[slots] + 1
        self._times_sampled[slots] = times
        # The completed items are a prefix of the batch (counts never increase along the queue).
        self._storage.drop_oldest(int(np.count_nonzero(times >= self.max_times_sampled)))
        self._num_sampled += batch_size
        return keys, fields, np.ones(batch_size, dtype=np.float64)

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        """No-op (a queue has no priorities); returns 0."""
        return 0

    def export_state(self) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """Everything needed to go on (see ``import_state``): arrays (the stored items' fields,
        oldest first, and ``times_sampled``, their deliveries so far, int64 ``[size]``) and
        scalars. Copies: the queue may change right after."""
        storage = self._storage
        arrays = {f"field/{name}": a for name, a in storage.export_items().items()}
        arrays["times_sampled"] = self._times_sampled[storage.stored_slots()]
        scalars = {
            "next_key": int(storage.next_key),
            "size": int(storage.size),
            "num_sampled": int(self._num_sampled),
            "num_evicted": int(self._num_evicted),
        }
        return arrays, scalars

    def import_state(self, arrays: dict[str, np.ndarray], scalars: dict[str, float]) -> None:
        """Load an empty queue from ``export_state``'s output: the same items under the same keys,
        delivered as often as before. Raises ``ValueError`` on anything that does not fit this
        queue; the queue is then unusable (import into a fresh one)."""
        size, next_key = _scalar_int(scalars, "size"), _scalar_int(scalars, "next_key")
        num_sampled = _scalar_int(scalars, "num_sampled")
        num_evicted = _scalar_int(scalars, "num_evicted")
        times = arrays.get("times_sampled")
        if times is None or times.dtype != np.int64 or times.shape != (size,):
            raise ValueError(f"times_sampled must be int64 [{size}]")
        if size and (times.min() < 0 or times.max() >= self.max_times_sampled):
            raise ValueError(f"times_sampled must be in 0..{self.max_times_sampled - 1}")
        if np.any(np.diff(times) > 0):  # batches take the oldest items first
            raise ValueError("times_sampled must not increase from the oldest item to the newest")
        items = {
            name[len("field/") :]: a for name, a in arrays.items() if name.startswith("field/")
        }
        self._storage.import_items(items, size, next_key)
        self._times_sampled[self._storage.stored_slots()] = times
        self._num_sampled = num_sampled
        self._num_evicted = num_evicted


def _scalar_int(scalars: dict[str, float], name: str) -> int:
    """``scalars[name]`` as an int that a counter can hold: ``0 <= value < 2**62``."""
    value = scalars[name]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**62:
        raise ValueError(f"{name} must be an int in 0..2**62, got {value!r}")
    return value


def make_table(
    kind: str,
    capacity: int,
    alpha: float,
    *,
    max_times_sampled: int = 1,
    evict_unread: bool = False,
    spec: ItemSpec | None = None,
) -> PrioritizedTable | FifoQueue:
    """``"prioritized"`` -> ``PrioritizedTable(capacity, alpha)``; ``"fifo"`` ->
    ``FifoQueue(capacity, max_times_sampled, evict_unread)``; either with storage allocated from
    ``spec`` (field -> dtype and per-item shape) when given.

    ``evict_unread`` does not apply to a prioritized table (it always overwrites its oldest items);
    ``max_times_sampled`` other than 1 is refused for one (it samples with replacement).
    """
    if kind == "prioritized":
        if max_times_sampled != 1:
            raise ValueError(
                f"max_times_sampled {max_times_sampled} applies to a FIFO queue only; a "
                "prioritized table samples with replacement"
            )
        return PrioritizedTable(capacity, alpha, spec=spec)
    if kind == "fifo":
        return FifoQueue(
            capacity, max_times_sampled=max_times_sampled, evict_unread=evict_unread, spec=spec
        )
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

    def restore(self, num_inserted: int, num_sampled: int) -> None:
        """Go on from counters saved earlier (a replay snapshot)."""
        for name, value in (("num_inserted", num_inserted), ("num_sampled", num_sampled)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**62:
                raise ValueError(f"{name} must be an int in 0..2**62, got {value!r}")
        self._num_inserted, self._num_sampled = num_inserted, num_sampled


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


_CHUNK_KEYS = "actor.chunk_steps * env.num_envs"


def check_replay_config(
    kind: str,
    capacity: int,
    samples_per_insert: float,
    error_buffer: float,
    min_size_to_sample: int,
    max_insert_items: int,
    max_sample_items: int,
    max_times_sampled: int = 1,
    evict_unread: bool = False,
) -> None:
    """Raise ``ValueError`` naming the config keys to change if this replay setup can deadlock.

    Arithmetic only, to run before anything starts. The arguments are the config's values:
    ``replay.kind``, ``replay.capacity``, ``replay.samples_per_insert``, the rate limiter's slack
    in effect (``Config.rate_error_buffer``: ``replay.rate_error_buffer``, or the value it picks
    for 0), ``replay.min_size_to_sample``, the items of one chunk (``actor.chunk_steps *
    env.num_envs``; smaller chunks are covered too), the items of one sample request
    (``learner.batch_size``), ``replay.max_times_sampled`` and ``replay.evict_unread``.

    The replay server holds a chunk back while the rate limiter or a full FIFO queue refuses it,
    and a sample request while the limiter refuses it or the table holds fewer items than it asks
    for. It deadlocks when a held chunk and a held request wait for each other. With ``C``
    capacity, ``spi`` samples per insert, ``eb`` slack, ``m`` min size, ``I`` chunk items (chunks
    of 1 to ``I`` items are covered), ``B`` batch items (every request asks for ``B``, as the
    learners all ask for ``learner.batch_size``) and ``k`` max times sampled, this refuses:

    1. ``B > C`` or ``m > C``: the table never holds a batch, or the min size.
    2. FIFO, ``spi > k``: no item is delivered more than ``k`` times, so ``spi`` samples per insert
       can never be served: the limiter ends up refusing chunks while the queue runs dry.
    3. FIFO without eviction, ``0 < spi < k``: the limiter allows only ``spi`` of the ``k``
       deliveries that each item waits for, so the queue fills up, then refuses chunks while the
       limiter refuses samples.
    4. ``spi > 0`` and ``eb < max(I * spi, B)``: the limiter can refuse a chunk and a batch at
       once (see ``check_no_deadlock``).
    5. ``spi > 0`` and ``floor(m + eb / spi) - I + 1 < B``: before the first sample the limiter
       may stop admitting chunks short of a batch. (A FIFO read ``k = spi`` times is back in that
       state whenever it runs low, so it needs the same.)
    6. FIFO, ``C < I + B - 1``: the queue can hold less than a batch (no sample) and still have no
       room for a chunk.
    7. FIFO without eviction, ``C - I + 1 - m < max(0, B - eb / k)``: nothing reads the queue
       before ``m`` items are in, and a full one refuses chunks, so it may stop filling at
       ``C - I + 1`` items, short of ``m``; and when it is full with a batch read fewer than ``k``
       times (``(k - 1) * B`` deliveries owed), the limiter can refuse samples while the queue
       refuses chunks.

    Each refusal is a reachable deadlock, except in three cases that are only sufficient
    conditions: 4, 6 for an evicting queue, and ``m > C`` for a table that keeps inserting (a
    prioritized or evicting one). Exhaustive searches of small configurations in
    ``tests/test_tables.py`` check both ways: random accepted configurations never deadlock, and
    an example of each refusal does.
    """
    spi, eb, k = samples_per_insert, error_buffer, max_times_sampled
    cap, m, chunk, batch = capacity, min_size_to_sample, max_insert_items, max_sample_items
    if kind not in ("prioritized", "fifo"):
        raise ValueError(f"replay.kind must be 'prioritized' or 'fifo', got {kind!r}")
    for name, value in (
        ("replay.capacity", cap),
        ("replay.min_size_to_sample", m),
        (f"the items per chunk ({_CHUNK_KEYS})", chunk),
        ("learner.batch_size", batch),
        ("replay.max_times_sampled", k),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if not math.isfinite(spi):
        raise ValueError(f"replay.samples_per_insert must be finite, got {spi}")
    if not (math.isfinite(eb) and eb >= 0):
        raise ValueError(f"replay.rate_error_buffer must be finite and >= 0, got {eb}")
    fifo = kind == "fifo"
    if not fifo and k != 1:
        raise ValueError(
            f"replay.max_times_sampled {k} applies to a FIFO only; a prioritized table samples "
            "with replacement: set replay.max_times_sampled = 1 or replay.kind = 'fifo'"
        )
    # 1. What the table must be able to hold.
    if batch > cap:
        raise ValueError(
            f"learner.batch_size {batch} > replay.capacity {cap}: no batch could ever be served; "
            f"set replay.capacity >= {batch} or learner.batch_size <= {cap}"
        )
    if m > cap:
        raise ValueError(
            f"replay.min_size_to_sample {m} > replay.capacity {cap}: the table never holds that "
            f"many items; set replay.capacity >= {m} or replay.min_size_to_sample <= {cap}"
        )
    # 2, 3. How often a FIFO item can be read against how often the limiter asks for it.
    if fifo and spi > k:
        reads = "read once" if k == 1 else f"read at most {k} times"
        fixes = [f"replay.samples_per_insert {'<=' if evict_unread else '='} {k}"]
        if evict_unread or spi == int(spi):
            fixes.append(
                f"replay.max_times_sampled {'>=' if evict_unread else '='} {math.ceil(spi)}"
            )
        raise ValueError(
            f"replay.samples_per_insert {spi:g} > {k} for a FIFO whose items are {reads} "
            f"(replay.max_times_sampled {k}): the learner would wait forever for samples the "
            f"queue cannot give; set {' or '.join(fixes)}"
        )
    if fifo and not evict_unread and 0 < spi < k:
        raise ValueError(
            f"replay.samples_per_insert {spi:g} < replay.max_times_sampled {k} for a FIFO that "
            f"keeps each item until it has been read {k} times: the rate limiter allows only "
            f"{spi:g} reads per item, so the queue fills up and the actors wait forever; set "
            f"replay.samples_per_insert = {k}, or replay.evict_unread = true to drop (and count) "
            "what is not read"
        )
    # 4, 5. The rate limiter.
    if spi > 0:
        needed = max(chunk * spi, batch)
        if eb < needed:
            raise ValueError(
                f"replay.rate_error_buffer {eb:g} < max(chunk items {chunk} ({_CHUNK_KEYS}) * "
                f"replay.samples_per_insert {spi:g}, learner.batch_size {batch}) = {needed:g}: the "
                "rate limiter could hold back a chunk and a batch at once, forever; set "
                f"replay.rate_error_buffer >= {needed:g} (or 0 for chunk items * "
                "samples_per_insert + batch_size)"
            )
        admitted = math.floor(m + eb / spi) - chunk + 1
        if admitted < batch:
            raise ValueError(
                f"replay.min_size_to_sample {m} is too small for learner.batch_size {batch}: with "
                f"replay.samples_per_insert {spi:g} and replay.rate_error_buffer {eb:g} the rate "
                f"limiter may hold chunks of {chunk} items ({_CHUNK_KEYS}) back from {admitted} "
                "items on, fewer than a batch, and no sample can lower it; set "
                f"replay.min_size_to_sample >= {batch} or raise replay.rate_error_buffer"
            )
    # 6, 7. A FIFO that refuses chunks when full.
    if fifo and cap < chunk + batch - 1:
        raise ValueError(
            f"replay.capacity {cap} is too small for a FIFO with chunks of {chunk} items "
            f"({_CHUNK_KEYS}) and batches of {batch} (learner.batch_size): it can hold less than "
            f"a batch and still have no room for a chunk; set replay.capacity >= "
            f"{chunk + batch - 1}"
        )
    if fifo and not evict_unread:
        owed = max(0.0, batch - eb / k) if spi > 0 else 0.0
        if cap - chunk + 1 - m < owed:
            if owed == 0:
                why = (
                    f"no learner reads it before replay.min_size_to_sample {m} items are in, "
                    f"and a full FIFO refuses chunks of up to {chunk} items ({_CHUNK_KEYS}), so "
                    f"it may stop filling at {cap - chunk + 1} items"
                )
            else:
                why = (
                    f"when it is full and its oldest batch has been read fewer than {k} times "
                    "(replay.max_times_sampled), the rate limiter "
                    f"(replay.rate_error_buffer {eb:g}) may refuse samples while the queue refuses "
                    "chunks"
                )
            raise ValueError(
                f"replay.capacity {cap} is too small for a FIFO: {why}; set replay.capacity >= "
                f"{math.ceil(m + chunk - 1 + owed)}, lower replay.min_size_to_sample, or set "
                "replay.evict_unread = true"
            )

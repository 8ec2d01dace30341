"""Replay tables: which stored items a learner gets, and when they leave.

Both tables keep their items in a ``RingStorage`` (``storage.py``: keys ``0, 1, 2, ...`` in
insertion order, allocated from the item spec). When a prioritized table is full the oldest items
are overwritten. Because keys are never reused, a priority update that arrives after its item was
evicted is recognised as stale and ignored.

- ``PrioritizedTable``: proportional prioritized sampling with replacement (Ape-X, R2D2).
- ``FifoQueue``: every item is delivered ``max_times_sampled`` times (once by default), oldest
  first (IMPALA, PPO). A full queue refuses inserts (the server holds them back) unless it was
  built to evict unread items, which it then counts.
- ``make_table``: the one ``replay.kind`` names.

With a ``FrameLayout`` (stacked Atari frames) a table's storage is a ``FrameStorage``
(``frames.py``): inserts bring their chunk's frames, items hold frame keys, ``batch_frames``
turns sampled items into a batch's frames and references, and items dropped because newer frames
overwrite theirs leave as evicted ones do (``num_evicted_for_frames``).

Priorities must be finite, ``>= 0`` and ``<= MAX_PRIORITY`` (``check_priorities``). How fast
items go in and out is the rate limiter's (``rate_limiter.py``).
"""

from __future__ import annotations

import math

import numpy as np

from apexrl.config.algos import ItemSpec
from apexrl.replay.frames import FrameStorage
from apexrl.replay.storage import RingStorage
from apexrl.replay.sum_tree import SumTree
from apexrl.transport.frames import FrameLayout

# The largest raw priority a table takes, far above any |TD| error. It bounds what the float64 sum
# tree must hold: p ** alpha stays finite for any alpha up to 25, and with alpha <= 1 the total of
# a table of 2**24 items stays below 2**64, so each sum's relative round-off (2**-53 per tree
# level) moves any item's sampling probability by less than 1e-14.
MAX_PRIORITY = 1e12


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


def make_storage(
    capacity: int, spec: ItemSpec | None, frames: tuple[FrameLayout, int] | None
) -> RingStorage:
    """A ``RingStorage``, or with ``frames`` (layout, frame capacity) a ``FrameStorage``."""
    if frames is None:
        return RingStorage(capacity, spec)
    if spec is None:
        raise ValueError("a frame storage needs the item spec")
    return FrameStorage(capacity, spec, *frames)


class _FrameSurface:
    """What both tables offer for stacked frames; no-ops without a frame storage."""

    _storage: RingStorage
    _num_evicted_for_frames: int = 0

    @property
    def stores_frames(self) -> bool:
        return isinstance(self._storage, FrameStorage)

    @property
    def num_evicted_for_frames(self) -> int:
        """Items dropped because newer frames overwrote the frames they reference."""
        return self._num_evicted_for_frames

    def start_keys_at(self, key: int) -> None:
        """Give an empty table's next item the key ``key``: the items of a snapshot put back from
        the chunk log get the keys they had."""
        self._storage.start_at(key)

    def frame_capacity(self) -> int:
        return self._storage.ring.capacity if isinstance(self._storage, FrameStorage) else 0

    def batch_frames(self, fields: dict[str, np.ndarray]) -> tuple[np.ndarray, dict]:
        """Sampled items' distinct frames and the items with references into them."""
        assert isinstance(self._storage, FrameStorage)
        return self._storage.batch_frames(fields)

    def _write(
        self, fields: list[dict[str, np.ndarray]], frames: list[np.ndarray] | None
    ) -> tuple[int, int, np.ndarray]:
        """The storage's ``write_many``, and the slots of the items it dropped for frames."""
        if isinstance(self._storage, FrameStorage):
            first, end = self._storage.write_many(fields, frames)
            dropped = self._storage.take_dropped_slots()
            self._num_evicted_for_frames += int(dropped.size)
            return first, end, dropped
        if frames:
            raise ValueError("this table stores no frames")
        first, end = self._storage.write_many(fields)
        return first, end, np.zeros(0, dtype=np.int64)


def _check_batch_size(batch_size: int) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")


class PrioritizedTable(_FrameSurface):
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
        frames: tuple[FrameLayout, int] | None = None,
    ) -> None:
        if not (math.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"alpha must be finite and >= 0, got {alpha}")
        if not (math.isfinite(min_priority) and min_priority > 0):
            raise ValueError(f"min_priority must be finite and > 0, got {min_priority}")
        self._storage = make_storage(capacity, spec, frames)
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

    def insert(
        self,
        fields: dict[str, np.ndarray],
        priorities: np.ndarray,
        frames: np.ndarray | None = None,
    ) -> np.ndarray:
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
        chunk_frames = None if frames is None else [frames]
        return np.arange(*self.insert_many([arrays], [priorities], chunk_frames), dtype=np.int64)

    def insert_many(
        self,
        fields: list[dict[str, np.ndarray]],
        priorities: list[np.ndarray],
        frames: list[np.ndarray] | None = None,
    ) -> tuple[int, int]:
        """Store several inserts that ``check_items`` and ``check_priorities`` accepted, as
        ``insert`` would each in turn, but without checking them again and with one copy per
        field and one sum-tree update for all of them (the replay server's batched inserts).
        Returns the keys ``[first, end)`` they were given. ``frames``: each insert's frames,
        for a table that stores them."""
        first, end, dropped = self._write(fields, frames)
        if dropped.size:  # never sampled again (slots the insert reused get theirs below)
            self._tree.update(dropped, np.zeros(dropped.size))
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

    def recover_num_sampled(self, num_sampled: int) -> None:
        """Go on counting from ``num_sampled`` items sampled (read back after a restart) when it
        is more than the count restored with the table."""
        self._num_sampled = max(self._num_sampled, int(num_sampled))

    def export_state(
        self, with_items: bool = True
    ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """Everything needed to go on (see ``import_state``): arrays (the stored items' fields,
        oldest first, unless ``with_items`` is false, and ``priorities``, their sum-tree values
        ``max(p, min_priority) ** alpha``, float64 ``[size]``) and scalars. Copies: the table may
        change right after."""
        storage = self._storage
        arrays = _exported_items(storage, with_items)
        arrays["priorities"] = self._tree.get(storage.stored_slots())
        scalars = {
            "next_key": int(storage.next_key),
            "size": int(storage.size),
            "num_sampled": int(self._num_sampled),
            "max_priority": float(self._max_priority),
        }
        return arrays, scalars

    def import_state(
        self, arrays: dict[str, np.ndarray], scalars: dict[str, float], items_held: bool = False
    ) -> None:
        """Load an empty table from ``export_state``'s output: the same items under the same keys,
        with the same sampling probabilities. ``items_held``: the table holds the items already
        (put back from the chunk log) and the arrays have none. Raises ``ValueError`` on
        anything that does not fit this table; the table is then unusable (import into a fresh
        one)."""
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
        _import_items(self._storage, arrays, size, next_key, items_held)
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


class FifoQueue(_FrameSurface):
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
        frames: tuple[FrameLayout, int] | None = None,
    ) -> None:
        if max_times_sampled < 1:
            raise ValueError(f"max_times_sampled must be >= 1, got {max_times_sampled}")
        self._storage = make_storage(capacity, spec, frames)
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
        self,
        fields: dict[str, np.ndarray],
        priorities: np.ndarray | None = None,
        frames: np.ndarray | None = None,
    ) -> np.ndarray:
        """Store ``N`` items (fields ``[N, ...]``); returns their int64 keys ``[N]``.

        Raises (and changes nothing) ``ValueError`` on a spec mismatch or ``N > capacity``, and
        ``RuntimeError`` if the queue has no room for ``N`` items and does not evict.
        """
        arrays = self._storage.check(fields)
        chunk_frames = None if frames is None else [frames]
        return np.arange(*self.insert_many([arrays], None, chunk_frames), dtype=np.int64)

    def insert_many(
        self,
        fields: list[dict[str, np.ndarray]],
        priorities: list[np.ndarray] | None = None,
        frames: list[np.ndarray] | None = None,
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
        first, end, dropped = self._write(fields, frames)
        self._times_sampled[np.arange(first, end) % self.capacity] = 0
        self._num_evicted += evicted + dropped.size
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

    def export_state(
        self, with_items: bool = True
    ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """Everything needed to go on (see ``import_state``): arrays (the stored items' fields,
        oldest first, unless ``with_items`` is false, and ``times_sampled``, their deliveries so
        far, int64 ``[size]``) and scalars. Copies: the queue may change right after."""
        storage = self._storage
        arrays = _exported_items(storage, with_items)
        arrays["times_sampled"] = self._times_sampled[storage.stored_slots()]
        scalars = {
            "next_key": int(storage.next_key),
            "size": int(storage.size),
            "num_sampled": int(self._num_sampled),
            "num_evicted": int(self._num_evicted),
        }
        return arrays, scalars

    def import_state(
        self, arrays: dict[str, np.ndarray], scalars: dict[str, float], items_held: bool = False
    ) -> None:
        """Load an empty queue from ``export_state``'s output: the same items under the same keys,
        delivered as often as before. ``items_held``: the queue holds the items already (put
        back from the chunk log) and the arrays have none. Raises ``ValueError`` on anything that
        does not fit this queue; the queue is then unusable (import into a fresh one)."""
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
        _import_items(self._storage, arrays, size, next_key, items_held)
        self._times_sampled[self._storage.stored_slots()] = times
        self._num_sampled = num_sampled
        self._num_evicted = num_evicted


def _exported_items(storage: RingStorage, with_items: bool) -> dict[str, np.ndarray]:
    if not with_items:
        return {}
    return {f"field/{name}": a for name, a in storage.export_items().items()}


def _import_items(
    storage: RingStorage, arrays: dict[str, np.ndarray], size: int, next_key: int, held: bool
) -> None:
    """The items of an import into ``storage``, or with ``held`` a check that it holds exactly
    the keys ``[next_key - size, next_key)`` already."""
    items = {name[len("field/") :]: a for name, a in arrays.items() if name.startswith("field/")}
    if not held:
        storage.import_items(items, size, next_key)
    elif items or (storage.next_key, storage.size) != (next_key, size):
        raise ValueError(
            f"the table holds keys {storage.oldest_key}..{storage.next_key - 1}, the state "
            f"{next_key - size}..{next_key - 1}"
        )


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
    frames: tuple[FrameLayout, int] | None = None,
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
        return PrioritizedTable(capacity, alpha, spec=spec, frames=frames)
    if kind == "fifo":
        return FifoQueue(
            capacity,
            max_times_sampled=max_times_sampled,
            evict_unread=evict_unread,
            spec=spec,
            frames=frames,
        )
    raise ValueError(f"unknown table kind {kind!r}; expected 'prioritized' or 'fifo'")

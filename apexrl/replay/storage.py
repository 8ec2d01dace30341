"""Replay storage: preallocated arrays that hold a table's items, allocated from one example.

An *item* is one row of named numpy arrays (its *fields*): an Ape-X transition, an R2D2 sequence or
an IMPALA unroll. An insert carries ``N`` items as ``dict[str, np.ndarray]`` whose arrays share
leading dimension ``N``. Each field gets one preallocated array of shape
``[capacity, *item_shape]``, allocated from an *item spec* (field -> dtype and per-item shape,
``ItemSpec`` of ``apexrl.config.algos``) given when the storage is made or, without one,
from the first insert (rlpyt style). Every insert must match those specs exactly. The replay
server always passes the algorithm's spec, so a first chunk of junk cannot decide the layout for
everyone after it.

Items get int64 keys ``0, 1, 2, ...`` in insertion order and live in slot ``key % capacity``, so
the stored items are always the keys ``[next_key - size, next_key)``. Which items a table samples
and when they leave is the tables' business (``tables.py``); ``RingStorage`` only writes, reads
and drops the oldest.
"""

from __future__ import annotations

import numpy as np

from apexrl.config.algos import ItemSpec


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

    def start_at(self, key: int) -> None:
        """Let empty storage give its next item the key ``key`` (items put back from the chunk
        log keep the keys they had)."""
        if self.next_key or self.size:
            raise ValueError("only empty storage can start at another key")
        self.next_key = int(key)

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

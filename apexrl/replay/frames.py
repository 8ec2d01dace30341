"""Replay storage for stacked frames held once: items keep references, a ring keeps the frames.

With a ``FrameLayout`` (``transport/frames.py``) a chunk arrives as its distinct frames and items
whose frame fields are int32 references into them. ``FrameStorage`` writes the frames into a
``FrameRing`` (frames under int64 keys ``0, 1, 2, ...`` at slot ``key % capacity``) and stores the
items with those references made global (int64 frame keys); a sample reads the items and
``batch_frames`` gathers the distinct frames they reference, with references into that batch.

Frames outlive their items: the ring holds about ``replay.capacity`` items' worth of frames
(``transport.frames.config_frame_capacity``), and when a chunk's frames would overwrite frames
that stored items still reference, those items (the oldest: frames and items are both written
in arrival order) are dropped first; the table learns which (``take_dropped_slots``) and counts
them. With that estimate it only happens to chunks with more frames per item than an actor of
the config sends.
"""

from __future__ import annotations

import collections

import numpy as np

from apexrl.config.algos import ItemSpec
from apexrl.replay.storage import RingStorage
from apexrl.transport.frames import REF_DTYPE, FrameLayout, refs_within

FRAME_KEY_DTYPE = np.dtype(np.int64)  # a stored item's frame reference: a frame's key


class FrameRing:
    """Frames ``[capacity, H, W]`` uint8 under keys ``0, 1, 2, ...`` at slot ``key % capacity``,
    written a chunk at a time; it remembers each chunk's first item key and first frame key."""

    def __init__(self, capacity: int, frame_shape: tuple[int, ...]) -> None:
        if capacity < 1:
            raise ValueError(f"a frame ring needs a capacity >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.frames = np.zeros((self.capacity, *frame_shape), dtype=np.uint8)
        self.next_key = 0
        # (first item key, first frame key) of each chunk whose items may still be stored
        self._chunks: collections.deque[tuple[int, int]] = collections.deque()

    def first_item_kept(self, num_frames: int, oldest_item: int, next_item: int) -> int:
        """The key of the oldest item whose frames survive writing ``num_frames`` more: items
        ``[oldest_item, result)`` reference frames those would overwrite. Forgets the chunks
        whose items are all gone."""
        lost_below = self.next_key + num_frames - self.capacity  # frame keys overwritten
        kept = oldest_item
        while self._chunks:
            first_item, first_frame = self._chunks[0]
            end_item = self._chunks[1][0] if len(self._chunks) > 1 else next_item
            if end_item > oldest_item and first_frame >= lost_below:
                break
            self._chunks.popleft()
            kept = max(kept, end_item)
        return kept

    def write(self, frames: np.ndarray, first_item: int) -> int:
        """Store one chunk's frames (at most ``capacity``); returns the key of the first."""
        first = self.next_key
        slots = np.arange(first, first + frames.shape[0]) % self.capacity
        self.frames[slots] = frames
        self.next_key += frames.shape[0]
        self._chunks.append((first_item, first))
        return first

    def gather(self, keys: np.ndarray) -> np.ndarray:
        """The frames of ``keys`` (stored ones), ``[*keys.shape, H, W]``."""
        return self.frames[keys % self.capacity]

    def export(self) -> tuple[dict[str, np.ndarray], int]:
        """The frames the remembered chunks hold, oldest first, with their chunks' keys, and the
        next frame key."""
        first_frame = self._chunks[0][1] if self._chunks else self.next_key
        keys = np.arange(first_frame, self.next_key, dtype=np.int64)
        chunks = np.array(self._chunks, dtype=np.int64).reshape(-1, 2)
        return {"frames": self.gather(keys), "chunks": chunks}, self.next_key

    def load(self, arrays: dict[str, np.ndarray], next_key: int) -> None:
        """Refill an empty ring from ``export``'s output; ``ValueError`` unless it fits."""
        frames, chunks = arrays.get("frames"), arrays.get("chunks")
        if frames is None or frames.dtype != np.uint8 or frames.shape[1:] != self.frames.shape[1:]:
            raise ValueError(f"frames must be uint8 [F, {list(self.frames.shape[1:])}]")
        if chunks is None or chunks.dtype != np.int64 or chunks.ndim != 2 or chunks.shape[1] != 2:
            raise ValueError("chunks must be int64 [C, 2]")
        if frames.shape[0] > self.capacity or not 0 <= frames.shape[0] <= next_key:
            raise ValueError(f"{frames.shape[0]} frames do not fit a ring of {self.capacity}")
        first_frame = next_key - frames.shape[0]
        if chunks.size and (
            chunks[0, 1] != first_frame
            or np.any(np.diff(chunks, axis=0) < 0)
            or chunks[-1, 1] >= max(next_key, 1)
        ):
            raise ValueError("chunks must start at the first frame and never go back")
        self.next_key = int(next_key)
        self.frames[np.arange(first_frame, next_key) % self.capacity] = frames
        self._chunks = collections.deque((int(i), int(f)) for i, f in chunks)


class FrameStorage(RingStorage):
    """``RingStorage`` whose items hold frame keys, their frames in a ``FrameRing``.

    ``check`` takes items as they come on the wire (``layout.wire_spec``: int32 references into
    their chunk's frames); stored, those references are int64 frame keys. ``write_many`` takes
    each insert's frames beside it; ``read`` gives items with frame keys, and ``batch_frames``
    turns a read into the batch's distinct frames and int32 references into them.
    """

    def __init__(
        self, capacity: int, spec: ItemSpec, layout: FrameLayout, frame_capacity: int
    ) -> None:
        self.layout = layout
        self.wire_spec = layout.wire_spec(spec)
        stored = {
            name: (FRAME_KEY_DTYPE, shape) if name in layout.fields else (dtype, shape)
            for name, (dtype, shape) in self.wire_spec.items()
        }
        super().__init__(capacity, stored)
        self.ring = FrameRing(frame_capacity, layout.frame_shape)
        self._dropped = np.zeros(0, dtype=np.int64)

    def check(self, fields: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``RingStorage.check`` against the wire spec (references int32)."""
        stored, self._specs = self._specs, self.wire_spec
        try:
            return super().check(fields)
        finally:
            self._specs = stored

    def write_many(
        self, inserts: list[dict[str, np.ndarray]], frames: list[np.ndarray] | None = None
    ) -> tuple[int, int]:
        """Store checked inserts and their frames (one ``[F, H, W]`` array each), dropping the
        oldest items whose frames they overwrite (``take_dropped_slots`` says which)."""
        if frames is None or len(frames) != len(inserts):
            raise ValueError("each insert needs its frames")
        first = self.next_key
        dropped = []
        for arrays, chunk_frames in zip(inserts, frames, strict=True):
            if chunk_frames.shape[0] > self.ring.capacity:
                raise ValueError(
                    f"{chunk_frames.shape[0]} frames are more than the frame ring holds "
                    f"({self.ring.capacity})"
                )
            kept = self.ring.first_item_kept(chunk_frames.shape[0], self.oldest_key, self.next_key)
            if kept > self.oldest_key:
                dropped.append(np.arange(self.oldest_key, kept) % self.capacity)
                self.drop_oldest(kept - self.oldest_key)
            base = self.ring.write(chunk_frames, self.next_key)
            stored = dict(arrays)
            for name in self.layout.fields:
                stored[name] = arrays[name].astype(FRAME_KEY_DTYPE) + base
            super().write(stored)
        self._dropped = np.concatenate(dropped) if dropped else np.zeros(0, dtype=np.int64)
        return first, self.next_key

    def write(self, arrays: dict[str, np.ndarray], frames: np.ndarray | None = None) -> np.ndarray:
        first, end = self.write_many([arrays], None if frames is None else [frames])
        return np.arange(first, end, dtype=np.int64)

    def take_dropped_slots(self) -> np.ndarray:
        """Slots of the items the last write dropped for their frames (and forgets them)."""
        dropped, self._dropped = self._dropped, np.zeros(0, dtype=np.int64)
        return dropped

    def batch_frames(
        self, fields: dict[str, np.ndarray]
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """A read's distinct frames ``[F, H, W]`` and its fields with int32 references into them."""
        keys = [fields[name] for name in self.layout.fields]
        unique, inverse = np.unique(
            np.concatenate([k.reshape(-1) for k in keys]), return_inverse=True
        )
        batch = dict(fields)
        start = 0
        for name, k in zip(self.layout.fields, keys, strict=True):
            batch[name] = inverse[start : start + k.size].reshape(k.shape).astype(REF_DTYPE)
            start += k.size
        return self.ring.gather(unique), batch

    def export_items(self) -> dict[str, np.ndarray]:
        items = super().export_items()
        arrays, next_frame = self.ring.export()
        items.update({f"frame_ring/{name}": a for name, a in arrays.items()})
        items["frame_ring/next_key"] = np.array([next_frame], dtype=np.int64)
        return items

    def import_items(self, items: dict[str, np.ndarray], size: int, next_key: int) -> None:
        ring = {k[len("frame_ring/") :]: v for k, v in items.items() if k.startswith("frame_ring/")}
        next_frame = ring.pop("next_key", None)
        if next_frame is None or next_frame.shape != (1,) or next_frame.dtype != np.int64:
            raise ValueError("a frame storage's items need frame_ring/next_key")
        rest = {k: v for k, v in items.items() if not k.startswith("frame_ring/")}
        end = int(next_frame[0])
        held = end - ring["frames"].shape[0] if "frames" in ring else 0  # its oldest frame key
        for name in self.layout.fields:
            keys = rest.get(name)
            if keys is not None and not refs_within(keys, held, end):
                raise ValueError(f"field {name!r} references frames the snapshot does not hold")
        self.ring.load(ring, end)
        super().import_items(rest, size, next_key)

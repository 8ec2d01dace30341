"""Nested observations (gymnasium ``Dict`` and ``Tuple`` spaces of Boxes) as one byte row each.

An env whose observation is a ``Dict`` of a uint8 camera image and a float32 vector of joint
angles is stepped, stored and sent like any other: ``envs.nested.PackedObservation`` writes each
observation as one uint8 row of ``PackedLayout.nbytes`` bytes, each part at its own offset in its
own dtype (an image part stays uint8, one byte a pixel), so the actors' blocks, the wire, replay
and the learners' batches carry a plain ``[..., nbytes]`` uint8 array; only the network's first
layer (``models.packed.PackedTorso``) and the checks on arrival read the parts again, through the
layout derived from the space. Parts are laid out widest dtype first, each at an offset that is a
multiple of its item size, and the row is padded to a multiple of 8 bytes, so every part is an
aligned view of the row.

The layout needs numpy only (the replay server checks float parts for non-finite values with it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

ROW_ALIGN = 8  # bytes: a row's length is a multiple of the widest dtype allowed


@dataclass(frozen=True)
class Part:
    """One part of a nested observation: its key (a ``Dict`` key, or a ``Tuple`` position as a
    string), dtype, shape, byte offset in the row, and the largest value of its space (what an
    image torso scales pixels by)."""

    key: str
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int
    high: float

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def end(self) -> int:
        return self.offset + self.nbytes

    @property
    def is_image(self) -> bool:
        """A uint8 part of three dims (channel-first or channel-last) or two (one channel)."""
        return self.dtype == np.uint8 and len(self.shape) in (2, 3)


@dataclass(frozen=True)
class PackedLayout:
    """Where each part of a nested observation lies in its byte row; ``kind`` is ``"dict"`` or
    ``"tuple"`` (what ``unpack`` gives back)."""

    kind: str
    parts: tuple[Part, ...]
    nbytes: int

    @classmethod
    def from_space(cls, space: Any) -> PackedLayout:
        """The layout of a gymnasium ``Dict`` or ``Tuple`` space whose parts are all ``Box``es
        (float64 parts are stored as float32). Raises ``ValueError`` naming the first part that
        is not a Box, or a space that is neither."""
        kind = type(space).__name__
        if kind == "Dict":
            items = list(space.spaces.items())
        elif kind == "Tuple":
            items = [(str(i), part) for i, part in enumerate(space.spaces)]
        else:
            raise ValueError(f"only Dict and Tuple observation spaces are packed, got {space}")
        if not items:
            raise ValueError(f"the observation space {space} has no parts")
        for key, part in items:
            if type(part).__name__ != "Box":
                raise ValueError(
                    f"observation part {key!r} is {part}: nested observations take Box parts only"
                )
            if not str(key) or not str(key).replace("_", "a").isalnum():
                raise ValueError(f"observation part key {key!r} must be letters, digits and _")
        stored = [(str(key), _stored_dtype(part.dtype), part) for key, part in items]
        # widest first: every offset is a multiple of its part's item size
        order = sorted(range(len(stored)), key=lambda i: -stored[i][1].itemsize)
        offsets, offset = {}, 0
        for i in order:
            key, dtype, part = stored[i]
            offsets[key] = offset
            offset += int(np.prod(part.shape, dtype=np.int64)) * dtype.itemsize
        parts = tuple(
            Part(key, dtype, tuple(int(n) for n in part.shape), offsets[key], _high(part))
            for key, dtype, part in stored
        )
        nbytes = max(ROW_ALIGN, -(-offset // ROW_ALIGN) * ROW_ALIGN)
        return cls("dict" if kind == "Dict" else "tuple", parts, nbytes)

    def pack(self, obs: Any) -> np.ndarray:
        """One nested observation (a mapping or a sequence of arrays, each of its part's shape,
        optionally with the same leading dims ``[...]``) as uint8 rows ``[..., nbytes]``.
        Raises ``ValueError`` for a missing or surplus part or a wrong shape."""
        values = self._values(obs)
        first = np.asarray(values[0])
        lead = first.shape[: first.ndim - len(self.parts[0].shape)]
        row = np.zeros((*lead, self.nbytes), dtype=np.uint8)
        for part, value in zip(self.parts, values, strict=True):
            value = np.asarray(value)
            if value.shape != (*lead, *part.shape):
                raise ValueError(
                    f"observation part {part.key!r} has shape {value.shape}, expected "
                    f"{(*lead, *part.shape)}"
                )
            flat = np.ascontiguousarray(value, dtype=part.dtype).reshape(*lead, -1)
            row[..., part.offset : part.end] = flat.view(np.uint8)
        return row

    def unpack(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The parts of uint8 rows ``[..., nbytes]``: key -> ``[..., *shape]`` in its dtype."""
        rows = np.asarray(rows)
        if rows.dtype != np.uint8 or rows.shape[-1:] != (self.nbytes,):
            raise ValueError(f"packed rows must be uint8 [..., {self.nbytes}], got {rows.shape}")
        lead = rows.shape[:-1]
        return {
            part.key: np.ascontiguousarray(rows[..., part.offset : part.end])
            .view(part.dtype)
            .reshape(*lead, *part.shape)
            for part in self.parts
        }

    def nested(self, rows: np.ndarray) -> dict[str, np.ndarray] | tuple[np.ndarray, ...]:
        """``unpack`` as the space gives it: a dict, or a tuple in the space's order."""
        parts = self.unpack(rows)
        return parts if self.kind == "dict" else tuple(parts[p.key] for p in self.parts)

    def float_spans(self) -> list[tuple[int, int]]:
        """The byte ranges of the float parts (what the replay server checks finite)."""
        return [(p.offset, p.end) for p in self.parts if p.dtype.kind == "f"]

    def _values(self, obs: Any) -> list[Any]:
        if self.kind == "dict":
            if not hasattr(obs, "keys"):
                raise ValueError(f"a Dict observation must be a mapping, got {type(obs).__name__}")
            keys = {str(k) for k in obs.keys()}
            expected = {p.key for p in self.parts}
            if keys != expected:
                raise ValueError(
                    f"observation keys {sorted(keys)} differ from the space's {sorted(expected)}"
                )
            return [obs[p.key] for p in self.parts]
        if len(obs) != len(self.parts):
            raise ValueError(
                f"a Tuple observation of {len(self.parts)} parts was given {len(obs)} parts"
            )
        return list(obs)


def _stored_dtype(dtype: Any) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        return np.dtype(np.float32)
    if dtype.kind not in "biuf" or dtype.itemsize > ROW_ALIGN:
        raise ValueError(f"observation parts must be numeric, got dtype {dtype}")
    return dtype


def _high(part: Any) -> float:
    high = float(np.max(np.asarray(part.high, dtype=np.float64)))
    return high if np.isfinite(high) else float("inf")


@dataclass(frozen=True)
class ActionLayout:
    """A ``Tuple`` or ``Dict`` action space of ``Discrete`` and ``Box`` parts as one float32 row:
    the index of each Discrete part first (``nvec``: their sizes, in the space's order), then the
    values of each Box part, flattened, in the space's order (``box_slices``; their bounds
    concatenated in ``low`` and ``high``). A policy samples such a row from a product
    distribution (a categorical per Discrete part, one diagonal Gaussian over the Box parts);
    ``envs.nested.PackedActions`` hands the env its nested action."""

    kind: str
    keys: tuple[str, ...]  # every part, in the space's order
    discrete_keys: tuple[str, ...]
    nvec: tuple[int, ...]
    box_keys: tuple[str, ...]
    box_shapes: tuple[tuple[int, ...], ...]
    low: np.ndarray
    high: np.ndarray

    @classmethod
    def from_space(cls, space: Any) -> ActionLayout:
        kind = type(space).__name__
        if kind == "Dict":
            items = [(str(k), v) for k, v in space.spaces.items()]
        elif kind == "Tuple":
            items = [(str(i), v) for i, v in enumerate(space.spaces)]
        else:
            raise ValueError(f"only Tuple and Dict action spaces are packed, got {space}")
        discrete, boxes = [], []
        for key, part in items:
            part_kind = type(part).__name__
            if part_kind == "Discrete":
                if int(part.start) != 0:
                    raise ValueError(f"action part {key!r}: a Discrete part must start at 0")
                discrete.append((key, int(part.n)))
            elif part_kind == "Box":
                if not (np.isfinite(part.low).all() and np.isfinite(part.high).all()):
                    raise ValueError(f"action part {key!r}: a Box part needs finite bounds")
                boxes.append((key, part))
            else:
                raise ValueError(
                    f"action part {key!r} is {part}: Tuple and Dict actions take Discrete and "
                    "Box parts only"
                )
        if not discrete or not boxes:
            raise ValueError(
                f"{space}: a packed action space mixes Discrete and Box parts (use MultiDiscrete "
                "for Discrete parts alone, one Box for continuous parts alone)"
            )
        low = np.concatenate([np.asarray(b.low, np.float32).ravel() for _, b in boxes])
        high = np.concatenate([np.asarray(b.high, np.float32).ravel() for _, b in boxes])
        return cls(
            "dict" if kind == "Dict" else "tuple",
            tuple(key for key, _ in items),
            tuple(key for key, _ in discrete),
            tuple(n for _, n in discrete),
            tuple(key for key, _ in boxes),
            tuple(tuple(int(n) for n in b.shape) for _, b in boxes),
            low,
            high,
        )

    @property
    def num_discrete(self) -> int:
        return len(self.nvec)

    @property
    def box_dim(self) -> int:
        return int(self.low.size)

    @property
    def width(self) -> int:
        return self.num_discrete + self.box_dim

    def nested(self, row: np.ndarray, unit: bool = False) -> Any:
        """One packed float32 row ``[width]`` as the env's action: each Discrete part an int,
        each Box part its values clipped to its bounds (``unit``: mapped from [-1, 1] onto
        them first)."""
        row = np.asarray(row, dtype=np.float32)
        values: dict[str, Any] = {}
        for i, key in enumerate(self.discrete_keys):
            values[key] = int(np.clip(np.rint(row[i]), 0, self.nvec[i] - 1))
        box = row[self.num_discrete :]
        if unit:
            box = self.low + (box + 1.0) * 0.5 * (self.high - self.low)
        box = np.clip(box, self.low, self.high)
        start = 0
        for key, shape in zip(self.box_keys, self.box_shapes, strict=True):
            size = int(np.prod(shape, dtype=np.int64))
            values[key] = box[start : start + size].reshape(shape).astype(np.float32)
            start += size
        if self.kind == "dict":
            return {key: values[key] for key in self.keys}
        return tuple(values[key] for key in self.keys)

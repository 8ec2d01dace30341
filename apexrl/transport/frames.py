"""Stacked frames sent and stored once: a chunk's (or a batch's) distinct frames and, in place of
each stacked observation, the indices of its frames among them.

An Atari observation is a stack of the last ``k`` frames (``[k, H, W]`` uint8), so consecutive
observations of one env share ``k - 1`` frames, and a transition's observation and its n-step next
observation share ``k - n`` more. Sent and stored as stacks, each frame is held up to ``2 k``
times (an Ape-X transition of 84x84 frames: 56 KB); sent once, 7 KB (42x42: 14 KB and 1.8 KB).
Nothing here depends on the frame size (``env.atari.screen_size``).

``FrameLayout`` names the item fields that hold stacked frames (``[..., k, H, W]`` uint8: an
Ape-X transition's ``obs`` and ``next_obs``, an unroll's or a sequence's ``obs``). On the wire
(``TrajectoryChunk.frames``, ``SampleBatch.frames``) those fields become int32 ``[..., k]``
*frame references*: indices into the message's ``frames`` array ``[F, H, W]``.

- ``frame_layout``: the layout of a config, or None when its observations are not stacked frames
  (or ``replay.store_frames_once`` is off);
- ``pack_frames``: the distinct frames of some items and their references (the actor, and replay
  for a batch); exact, whatever the items hold: the stacks rebuilt from them are equal to the
  originals byte for byte, so a stack never mixes frames of two episodes;
- ``unpack_frames``: the stacks rebuilt (numpy; the learner rebuilds them on its device);
- ``check_frame_refs``: what replay checks of a chunk's frames and references, and
  ``frame_refs_fit`` what a learner checks of a batch's;
- ``config_frame_layout``, ``config_frame_capacity``: a config's layout, and the frames replay's
  ring holds for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from apexrl.config import Config
from apexrl.config.algos import ItemSpec

ATARI_PREFIX = "ALE/"  # apexrl.envs.atari.PREFIX (envs imports gymnasium; the wire need not)

REF_DTYPE = np.dtype(np.int32)  # a frame reference on the wire: an index into ``frames``
# The item fields that hold observations in every algorithm's items (``config/algos.py``):
# the ones that can hold stacked frames.
OBSERVATION_FIELDS = ("obs", "next_obs")


@dataclass(frozen=True)
class FrameLayout:
    """Which item fields hold stacked frames, and the frames' shape."""

    fields: tuple[str, ...]  # item fields [..., stack, *frame_shape] uint8
    stack: int  # frames per observation
    frame_shape: tuple[int, ...]  # (H, W)

    @property
    def frame_bytes(self) -> int:
        return int(np.prod(self.frame_shape))

    def wire_spec(self, spec: ItemSpec) -> ItemSpec:
        """``spec`` with each frame field as int32 references ``[..., stack]``."""
        frame_dims = len(self.frame_shape)
        return {
            name: (REF_DTYPE, shape[:-frame_dims]) if name in self.fields else (dtype, shape)
            for name, (dtype, shape) in spec.items()
        }

    def refs_per_item(self, spec: ItemSpec) -> int:
        """Frame references in one item: the most distinct frames it can hold."""
        return sum(
            int(np.prod(shape[: -len(self.frame_shape)]))
            for name, (_, shape) in spec.items()
            if name in self.fields
        )


def frame_layout(spec: ItemSpec, obs_shape: tuple[int, ...], enabled: bool) -> FrameLayout | None:
    """The frame layout of items of ``spec`` whose observations have ``obs_shape``: its
    ``OBSERVATION_FIELDS``, uint8 and ending in ``obs_shape``, when that is a stack of more than
    one 2-D frame (``[k, H, W]``, ``k > 1``); None otherwise or when not ``enabled``."""
    if not enabled or len(obs_shape) != 3 or obs_shape[0] < 2:
        return None
    fields = tuple(
        name
        for name in OBSERVATION_FIELDS
        if name in spec
        and np.dtype(spec[name][0]) == np.uint8
        and tuple(spec[name][1][-3:]) == tuple(obs_shape)
    )
    if not fields:
        return None
    return FrameLayout(fields, int(obs_shape[0]), tuple(int(n) for n in obs_shape[1:]))


def _fingerprints(flat: np.ndarray) -> np.ndarray:
    """A 64-bit linear hash of each row of ``flat`` ([M, P] uint8, C-contiguous): equal rows get
    equal values; ``pack_frames`` checks the rows it merges byte for byte."""
    width = flat.shape[1]
    for word in (np.uint64, np.uint32, np.uint16, np.uint8):
        if width % np.dtype(word).itemsize == 0:
            words = flat.view(word)
            break
    multipliers = _MULTIPLIERS.get(words.shape[1])
    if multipliers is None:
        rng = np.random.default_rng(words.shape[1])
        multipliers = rng.integers(1, 2**63, words.shape[1], dtype=np.uint64) | np.uint64(1)
        _MULTIPLIERS[words.shape[1]] = multipliers
    return (words * multipliers).sum(axis=1, dtype=np.uint64)


_MULTIPLIERS: dict[int, np.ndarray] = {}


def pack_frames(
    fields: dict[str, np.ndarray], layout: FrameLayout
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The distinct frames of the layout's fields, in order of first appearance, ``[F, H, W]``
    uint8, and ``fields`` with each of those fields replaced by int32 references into them."""
    frame_shape, size = layout.frame_shape, layout.frame_bytes
    stacks = [np.ascontiguousarray(fields[name]) for name in layout.fields]
    flat = np.concatenate([s.reshape(-1, size) for s in stacks])  # [M, H*W]
    _, first, inverse = np.unique(_fingerprints(flat), return_index=True, return_inverse=True)
    order = np.argsort(first)  # distinct frames in order of first appearance
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    frames = flat[first[order]]
    refs = rank[inverse.reshape(-1)].astype(REF_DTYPE)
    if not np.array_equal(frames[refs], flat):  # two frames with one fingerprint: no merging
        frames, refs = flat, np.arange(flat.shape[0], dtype=REF_DTYPE)
    packed = dict(fields)
    start = 0
    for name, stack in zip(layout.fields, stacks, strict=True):
        count = stack.size // size
        packed[name] = refs[start : start + count].reshape(stack.shape[: -len(frame_shape)])
        start += count
    return frames.reshape(-1, *frame_shape), packed


def unpack_frames(
    frames: np.ndarray, fields: dict[str, np.ndarray], layout: FrameLayout
) -> dict[str, np.ndarray]:
    """``fields`` with each frame field's references replaced by the stacks they name."""
    unpacked = dict(fields)
    for name in layout.fields:
        unpacked[name] = frames[fields[name]]
    return unpacked


def refs_within(refs: np.ndarray, low: int, end: int) -> bool:
    """Whether every reference (or frame key) in ``refs`` is in ``low..end-1`` (true for none)."""
    return refs.size == 0 or (int(refs.min()) >= low and int(refs.max()) < end)


def check_frame_refs(
    frames: np.ndarray, fields: dict[str, np.ndarray], layout: FrameLayout, max_frames: int
) -> None:
    """Raise ``ValueError`` unless ``frames`` is uint8 ``[F, H, W]`` of the layout with
    ``1 <= F <= max_frames`` and no more frames than the references, and every reference of the
    frame fields (int32, as the wire spec says) is in ``0..F-1``."""
    if frames.dtype != np.uint8 or frames.shape[1:] != layout.frame_shape:
        raise ValueError(
            f"frames must be uint8 [F, {', '.join(map(str, layout.frame_shape))}], got "
            f"{frames.dtype} {list(frames.shape)}"
        )
    num_frames = frames.shape[0]
    num_refs = sum(fields[name].size for name in layout.fields)
    if not 1 <= num_frames <= min(num_refs, max_frames):
        raise ValueError(
            f"{num_frames} frames for {num_refs} frame references: expected 1 to "
            f"{min(num_refs, max_frames)}"
        )
    for name in layout.fields:
        refs = fields[name]
        if not refs_within(refs, 0, num_frames):
            raise ValueError(
                f"field {name!r} references frames {int(refs.min())}..{int(refs.max())}, "
                f"outside the {num_frames} frames it came with"
            )


def frame_refs_fit(frames: np.ndarray, fields: dict[str, np.ndarray]) -> bool:
    """Whether a batch's ``OBSERVATION_FIELDS`` hold int32 references into its ``frames`` (true
    for a batch without frames)."""
    if frames.size == 0:
        return True
    for name in OBSERVATION_FIELDS:
        refs = fields.get(name)
        if refs is None:
            continue
        if refs.dtype != REF_DTYPE or not refs_within(refs, 0, frames.shape[0]):
            return False
    return True


def config_frame_layout(cfg: Config, spec: ItemSpec) -> FrameLayout | None:
    """The frame layout of a config's items: stacked Atari frames (``env.atari.frame_stack`` > 1)
    with ``replay.store_frames_once``; None otherwise. Actors, replay and learners agree on it."""
    enabled = cfg.replay.store_frames_once and cfg.env.id.startswith(ATARI_PREFIX)
    return frame_layout(spec, tuple(spec["obs"][1][-3:]), enabled)  # [k, H, W], k the stack


def config_frame_capacity(cfg: Config, layout: FrameLayout) -> int:
    """Frames replay's ring holds: ``replay.capacity`` items at the algorithm's estimate of new
    frames per item (``frames_per_item``)."""
    per_item = cfg.algo.frames_per_item(layout.stack, cfg.actor.chunk_steps)
    return max(math.ceil(cfg.replay.capacity * per_item), 1)

"""The chunk an actor sends to replay: the items its actor core cut from a full step block, with
their initial priorities and the sender's identity and the chunk's number (``TrajectoryChunk``;
``ChunkNumbers`` numbers an actor process's chunks ``0, 1, 2, ...``). ``cut_chunk`` cuts a
full block and keeps its overlap; ``make_chunk`` wraps items already cut. Stacked Atari frames
go once (``transport/frames.py``): the chunk carries each distinct frame, its items references.
"""

from __future__ import annotations

import numpy as np

from apexrl.acting.step_block import StepBlock
from apexrl.algos import ActorCore
from apexrl.config import Config
from apexrl.transport.frames import config_frame_layout, pack_frames
from apexrl.transport.messages import TrajectoryChunk


class ChunkNumbers:
    """The sequence numbers of one actor process's chunks: ``0, 1, 2, ...`` in the order they are
    cut. Replay stores a chunk once per (actor id, incarnation, sequence), so a chunk sent again
    keeps the number it was cut with."""

    def __init__(self) -> None:
        self.next = 0

    def take(self) -> int:
        number, self.next = self.next, self.next + 1
        return number


def make_chunk(
    cfg: Config,
    actor_id: int,
    incarnation: int,
    sequence: int,
    weights_version: int,
    env_steps: int,
    fields: dict[str, np.ndarray],
    priorities: np.ndarray | None,
    agent_steps: int = -1,
) -> TrajectoryChunk | None:
    """The chunk of the items an actor core cut, or None when it cut none (``agent_steps``: a
    multi-agent chunk's, see ``TrajectoryChunk``)."""
    num_items = len(next(iter(fields.values()))) if fields else 0
    if num_items == 0:
        return None
    if priorities is None:  # a FIFO table ignores them; the wire carries some
        priorities = np.ones(num_items)
    layout = config_frame_layout(cfg, {name: (a.dtype, a.shape[1:]) for name, a in fields.items()})
    frames = None
    if layout is not None:
        frames, fields = pack_frames(fields, layout)
    return TrajectoryChunk(
        cfg.replay.table,
        actor_id,
        incarnation,
        sequence,
        weights_version,
        env_steps,
        priorities,
        fields,
        **({} if frames is None else {"frames": frames}),
        agent_steps=agent_steps,
    )


def cut_chunk(
    cfg: Config,
    core: ActorCore,
    block: StepBlock,
    actor_id: int,
    incarnation: int,
    numbers: ChunkNumbers,
    weights_version: int,
    env_steps: int,
) -> TrajectoryChunk | None:
    """Cut the full ``block`` into replay items and keep its overlap; the chunk of the items
    (numbered by ``numbers``), or None when the core cut none yet (its steps then go with the
    next chunk)."""
    fields, priorities = core.items(block)
    block.keep_overlap()
    if not fields or len(next(iter(fields.values()))) == 0:
        return None
    sequence = numbers.take()
    return make_chunk(
        cfg, actor_id, incarnation, sequence, weights_version, env_steps, fields, priorities
    )

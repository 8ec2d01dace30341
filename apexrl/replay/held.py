"""The chunks the replay server holds back: checked, waiting for the rate limiter or for room in
the table, oldest first, bounded in count (``replay.max_pending_inserts``) and in bytes
(``replay.max_pending_insert_bytes``)."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import NamedTuple

from apexrl.replay.chunk_log import Buffer
from apexrl.transport.messages import TrajectoryChunk


class HeldInsert(NamedTuple):
    """A checked chunk waiting for the rate limiter or room: who sent it, the chunk, its bytes
    and its frames as they came off the wire (None: unknown; the log encodes the chunk again)."""

    identity: bytes
    chunk: TrajectoryChunk
    num_bytes: int
    frames: Sequence[Buffer] | None


def chunk_bytes(chunk: TrajectoryChunk) -> int:
    """The bytes of a chunk's arrays: priorities, fields and frames."""
    num_bytes = chunk.priorities.nbytes + sum(a.nbytes for a in chunk.fields.values())
    return num_bytes + chunk.frames.nbytes


class HeldInserts:
    """The held chunks, oldest first, and their bytes all together (``num_bytes``)."""

    def __init__(self, max_chunks: int, max_bytes: int) -> None:
        self.max_chunks, self.max_bytes = max_chunks, max_bytes
        self.chunks: collections.deque[HeldInsert] = collections.deque()
        self.num_bytes = 0

    def __len__(self) -> int:
        return len(self.chunks)

    def full(self) -> bool:
        """Whether as many chunks are held as may be."""
        return len(self.chunks) >= self.max_chunks

    def check_room(self, chunk: TrajectoryChunk) -> int:
        """Raise ``ValueError`` unless there is room to hold ``chunk``; returns its bytes."""
        if self.full():
            raise ValueError("too many inserts waiting; retry later")
        num_bytes = chunk_bytes(chunk)
        if self.num_bytes + num_bytes > self.max_bytes:
            raise ValueError(
                f"too many bytes of inserts waiting ({self.num_bytes} + {num_bytes} > "
                f"replay.max_pending_insert_bytes {self.max_bytes}); retry later"
            )
        return num_bytes

    def append(self, held: HeldInsert) -> None:
        self.chunks.append(held)
        self.num_bytes += held.num_bytes

    def first(self) -> HeldInsert | None:
        """The oldest held chunk, None when none is held."""
        return self.chunks[0] if self.chunks else None

    def pop(self) -> HeldInsert:
        """Take the oldest held chunk off the line."""
        held = self.chunks.popleft()
        self.num_bytes -= held.num_bytes
        return held

    def num_items(self) -> int:
        """The items of all the held chunks."""
        return sum(int(held.chunk.priorities.shape[0]) for held in self.chunks)

    def clear(self) -> list[HeldInsert]:
        """Let go of every held chunk; returns them, oldest first."""
        held = list(self.chunks)
        self.chunks.clear()
        self.num_bytes = 0
        return held

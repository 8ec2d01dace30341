"""A policy's snapshots: published versions pinned on the parameter server as frozen opponents.

A snapshot is the version's ``Params`` reply exactly as the server encoded it at publish:
immutable ``bytes`` frames, so however long the policy trains on, an actor that asks for the
snapshot gets the same bits (``ParamsRequest.snapshot``). The pool takes every ``every``-th
version past 0 (``due``; ``every`` 0: none by count, only those the league asks for) and holds
at most ``cap``; pinning one more evicts the oldest.
"""

from __future__ import annotations

from collections import OrderedDict


class SnapshotPool:
    """Pinned versions of one policy, oldest first (module docstring)."""

    def __init__(self, cap: int, every: int = 1) -> None:
        if cap < 1:
            raise ValueError(f"a snapshot pool holds at least one version, got cap {cap}")
        if every < 0:
            raise ValueError(f"a snapshot pool takes every N-th version, N >= 0, got {every}")
        self.cap, self.every = cap, every
        self.frames: OrderedDict[int, tuple[bytes, ...]] = OrderedDict()

    def due(self, version: int) -> bool:
        """Whether a published ``version`` is one the pool takes."""
        return self.every > 0 and version > 0 and version % self.every == 0

    def pin(self, version: int, frames: list[bytes]) -> int | None:
        """Pin ``version`` (its encoded ``Params``); the version evicted to make room, if any. A
        version pinned again (a learner that restarted from scratch) replaces the old one."""
        if not all(isinstance(frame, bytes) for frame in frames):
            raise TypeError("a snapshot holds immutable bytes frames")
        self.frames.pop(version, None)
        self.frames[version] = tuple(frames)
        if len(self.frames) > self.cap:
            evicted, _ = self.frames.popitem(last=False)
            return evicted
        return None

    def get(self, version: int) -> tuple[bytes, ...] | None:
        return self.frames.get(version)

    @property
    def versions(self) -> list[int]:
        return list(self.frames)

    def __len__(self) -> int:
        return len(self.frames)

"""The weights versions a chunk or a report may name: those a learner published.

An actor plays weights it got from the parameter server, and the learner tells replay each
version before it publishes it (``PublishedVersion``; again when replay came back), so a chunk or
report that names a newer version than replay heard of names one no learner published: an actor
key claiming it. Such a message is held, at most ``VERSION_WAIT_S`` seconds, in case the learner's
notice is still on its way or replay restarted since it came, and then refused; one more than
``MAX_VERSIONS_AHEAD`` past the newest is refused at once (no learner makes that many updates
between two snapshots of a restarted replay).

The versions a message names: a chunk's ``weights_version`` and, in IMPALA's and PPO's unrolls,
each step's (``weights_version [N, T]``); a report's ``weights_version``. -1 stands for an actor's
initial weights; anything below is refused at once.
"""

from __future__ import annotations

import collections
import time

from apexrl.transport.messages import ActorReport, TrajectoryChunk

VERSION_WAIT_S = 30.0  # seconds a message naming an unpublished version waits for its notice
MAX_VERSIONS_AHEAD = 2**20  # versions past the newest published that a message may wait for
INITIAL_VERSION = -1  # an actor's own initial weights, before it got any


def named_versions(msg: TrajectoryChunk | ActorReport) -> tuple[int, int]:
    """The lowest and the highest weights version ``msg`` names."""
    low = high = msg.weights_version
    steps = msg.fields.get("weights_version") if isinstance(msg, TrajectoryChunk) else None
    if steps is not None and steps.size:
        low, high = min(low, int(steps.min())), max(high, int(steps.max()))
    return low, high


def check_named_versions(msg: TrajectoryChunk | ActorReport, latest: int) -> int:
    """The highest version ``msg`` names; raises ``ValueError`` for one below -1 or more than
    ``MAX_VERSIONS_AHEAD`` past ``latest``, the newest published."""
    low, high = named_versions(msg)
    if low < INITIAL_VERSION:
        raise ValueError(f"weights_version {low} is below -1 (an actor's initial weights)")
    if high > latest + MAX_VERSIONS_AHEAD:
        raise ValueError(
            f"weights_version {high} was never published: the newest published is {latest}"
        )
    return high


class VersionWait:
    """Messages that name a version newer than the newest published one, oldest first, with
    the peer that sent each; at most ``max_waiting`` of them."""

    def __init__(self, max_waiting: int, wait_s: float = VERSION_WAIT_S) -> None:
        self.max_waiting, self.wait_s = max_waiting, wait_s
        self.waiting: collections.deque[tuple[float, bytes, TrajectoryChunk | ActorReport]] = (
            collections.deque()
        )

    def __len__(self) -> int:
        return len(self.waiting)

    def hold(self, identity: bytes, msg: TrajectoryChunk | ActorReport) -> None:
        """Keep ``msg`` until its version is published; ``ValueError`` when the room is full."""
        if len(self.waiting) >= self.max_waiting:
            raise ValueError(
                f"weights_version {msg.weights_version} was not published, and "
                f"{self.max_waiting} messages already wait for theirs"
            )
        self.waiting.append((time.monotonic(), identity, msg))

    def release(
        self, latest: int
    ) -> tuple[list[tuple[bytes, TrajectoryChunk | ActorReport]], list[tuple[bytes, str]]]:
        """The messages whose versions are now published (``latest`` the newest), and the
        (peer, reason) of those that waited too long: both taken out, in arrival order."""
        ready, expired, kept = [], [], collections.deque()
        now = time.monotonic()
        for since, identity, msg in self.waiting:
            high = named_versions(msg)[1]
            if high <= latest:
                ready.append((identity, msg))
            elif now - since > self.wait_s:
                expired.append(
                    (
                        identity,
                        f"weights_version {high} was never published (the newest published "
                        f"version is {latest}; waited {now - since:.0f} s)",
                    )
                )
            else:
                kept.append((since, identity, msg))
        self.waiting = kept
        return ready, expired

"""What replay did with every item it was sent, and which chunks it stored.

- ``ItemCounts``: the replay server's item counters, served in ``Stats`` as ``replay/items_*``
  and carried in ``result.json`` (``replay_items``). Every item of a chunk that reaches the
  server is in exactly one of these at any time, so two identities hold:

      received = stored + duplicates + refused + held
      stored   = size + evicted_capacity + evicted_for_frames + consumed

  ``held`` (the items of chunks waiting for the rate limiter or room) and ``size`` (the table's
  items) are gauges, the others counters. ``evicted_capacity``: items a full table dropped for
  new ones (a prioritized table overwrites its oldest; a FIFO queue with ``evict_unread`` drops
  unread ones); ``evicted_for_frames``: items whose frames newer frames overwrote; ``consumed``:
  FIFO items gone after their last delivery (a learner may then still drop stale ones, PPO's
  ``stale_items_dropped``: those are part of ``consumed``). ``recovered``: stored items that a
  restarted server read back from its chunk log (part of ``stored``); ``lost``: items it had
  acknowledged that a restart did not bring back (0 with ``replay.durable``).
- ``StoredChunks``: per actor id, the highest chunk number stored of each recent incarnation, so
  a chunk sent again (its ack was lost) is acknowledged without being stored twice.

Both go into a replay snapshot (``export`` / ``restore``) and are rebuilt from the chunk log.
"""

from __future__ import annotations

import collections
from dataclasses import asdict, dataclass, fields

from apexrl.replay.snapshot import SnapshotError

INCARNATIONS_PER_ACTOR = 4  # recent incarnations of one actor id whose chunk numbers are kept
MAX_COUNT = 2**62


@dataclass
class ItemCounts:
    """The replay server's item counters (see the module's identities)."""

    received: int = 0  # items of chunks that decoded and reached the server
    stored: int = 0  # items inserted into the table
    duplicates: int = 0  # items of chunks stored before, acknowledged again without storing
    refused: int = 0  # items of chunks answered with Error (or Shutdown at a stop), not stored
    evicted_capacity: int = 0  # items a full table dropped to make room
    evicted_for_frames: int = 0  # items whose frames newer frames overwrote
    consumed: int = 0  # FIFO items that left after their last delivery
    recovered: int = 0  # items read back from the chunk log at a restart (part of stored)
    lost: int = 0  # acknowledged items that a restart did not bring back

    def stats(self, held: int, size: int) -> dict[str, float]:
        """``replay/items_<name>`` for every counter, ``held`` and ``size``."""
        values = {f"replay/items_{name}": float(value) for name, value in asdict(self).items()}
        values["replay/items_held"] = float(held)
        values["replay/items_size"] = float(size)
        return values

    def export(self, held: int) -> dict[str, int]:
        """The counters as a snapshot keeps them: held items, which a restarted server no longer
        holds, are not counted as received."""
        values = asdict(self)
        values["received"] -= held
        return values

    @classmethod
    def restore(cls, values: dict) -> ItemCounts:
        """From ``export``'s dict (missing names count 0); raises ``SnapshotError`` unless every
        value is a count."""
        counts = cls()
        for item in fields(cls):
            value = values.get(item.name, 0)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_COUNT:
                raise SnapshotError(f"item count {item.name} is {value!r}, not a count")
            setattr(counts, item.name, value)
        return counts


class StoredChunks:
    """Per actor id, the highest chunk number stored of each of its last
    ``INCARNATIONS_PER_ACTOR`` incarnations. An actor has one chunk in flight and numbers its
    chunks ``0, 1, 2, ...``, so a chunk numbered at most the highest stored one of its incarnation
    was stored before: a copy sent again because its ack was lost."""

    def __init__(self) -> None:
        self._highest: dict[int, collections.OrderedDict[int, int]] = {}

    def stored(self, actor_id: int, incarnation: int, sequence: int) -> bool:
        highest = self._highest.get(actor_id, {}).get(incarnation)
        return highest is not None and sequence <= highest

    def add(self, actor_id: int, incarnation: int, sequence: int) -> None:
        by_incarnation = self._highest.setdefault(actor_id, collections.OrderedDict())
        by_incarnation[incarnation] = max(sequence, by_incarnation.get(incarnation, -1))
        by_incarnation.move_to_end(incarnation)
        while len(by_incarnation) > INCARNATIONS_PER_ACTOR:
            by_incarnation.popitem(last=False)

    def export(self) -> list[list[int]]:
        """``[actor_id, incarnation, highest]`` rows, each actor's oldest incarnation first."""
        return [
            [actor_id, incarnation, highest]
            for actor_id, by_incarnation in self._highest.items()
            for incarnation, highest in by_incarnation.items()
        ]

    @classmethod
    def restore(cls, rows: list, num_actors: int) -> StoredChunks:
        """From ``export``'s rows; raises ``SnapshotError`` for rows no server could have kept.
        Rows of actor ids past ``num_actors`` (a run restarted with fewer actors) are left out."""
        chunks = cls()
        for row in rows:
            if (
                not isinstance(row, list)
                or len(row) != 3
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in row)
            ):
                raise SnapshotError(f"stored chunk numbers hold {row!r}, not three ints")
            actor_id, incarnation, highest = row
            if actor_id < 0 or not 0 <= highest < MAX_COUNT:
                raise SnapshotError(f"stored chunk numbers hold {row!r}, out of range")
            if actor_id < num_actors:
                chunks.add(actor_id, incarnation, highest)
        return chunks

"""What actors' reports say about each actor, for the ``actor/<name>/...`` entries that the
replay server adds to ``Stats`` (``apexrl status`` shows them): the env steps it reported, its
env steps per second over its last ``ACTOR_RATE_REPORTS`` reports, the weights version it acts
with and how long ago it was heard from. These entries are neither snapshotted nor written to
TensorBoard: they describe who reports now.

``ActorRoster`` keeps them, with when each actor (training or evaluation) was last heard from, for
``replay/active_actors``.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

from apexrl.transport.messages import ActorReport

ACTOR_RATE_REPORTS = 8  # an actor's env steps/s is measured over its last 8 reports
ACTIVE_S = 30.0  # seconds: an actor heard from this recently counts in replay/active_actors


@dataclass
class ActorProgress:
    """What one actor's reports said, for its entries in ``Stats``."""

    env_steps: int = 0  # reported to this server since it started
    weights_version: int = -1
    # (time.monotonic(), env_steps) at each of its last reports
    marks: collections.deque[tuple[float, int]] = field(
        default_factory=lambda: collections.deque(maxlen=ACTOR_RATE_REPORTS)
    )


def actor_name(is_eval: bool, actor_id: int) -> str:
    """An actor's name in ``Stats`` keys: ``actor/3/...`` for training actor 3, ``actor/eval_0/...``
    for evaluation actor 0."""
    return f"eval_{actor_id}" if is_eval else str(actor_id)


def env_steps_per_s(marks: collections.deque[tuple[float, int]]) -> float:
    """Env steps per second between the first and the last of ``marks`` (time, env steps so far);
    nan with fewer than two."""
    if len(marks) < 2 or marks[-1][0] <= marks[0][0]:
        return float("nan")
    (t0, steps0), (t1, steps1) = marks[0], marks[-1]
    return (steps1 - steps0) / (t1 - t0)


def actor_stats(name: str, progress: ActorProgress, now: float) -> dict[str, float]:
    """One actor's four ``Stats`` entries (``apexrl status`` shows them)."""
    return {
        f"actor/{name}/env_steps": float(progress.env_steps),
        f"actor/{name}/env_steps_per_s": env_steps_per_s(progress.marks),
        f"actor/{name}/weights_version": float(progress.weights_version),
        f"actor/{name}/last_heard_s": now - progress.marks[-1][0],
    }


class ActorRoster:
    """When each actor, ``(is_eval, actor id)``, was last heard from (a chunk or a report), and
    what its reports said."""

    def __init__(self) -> None:
        self.last_seen: dict[tuple[bool, int], float] = {}  # time.monotonic()
        self.progress: dict[tuple[bool, int], ActorProgress] = {}  # from their reports

    def saw_chunk(self, actor_id: int) -> None:
        self.last_seen[(False, actor_id)] = time.monotonic()

    def add_report(self, report: ActorReport) -> None:
        now = time.monotonic()
        key = (report.is_eval, report.actor_id)
        self.last_seen[key] = now
        progress = self.progress.setdefault(key, ActorProgress())
        progress.env_steps += report.env_steps
        progress.weights_version = report.weights_version
        progress.marks.append((now, progress.env_steps))

    def num_active(self, now: float) -> int:
        """Actors heard from in the last ``ACTIVE_S`` seconds."""
        return sum(1 for seen in self.last_seen.values() if now - seen < ACTIVE_S)

    def stats(self) -> dict[str, float]:
        """Each actor's entries (``actor/<name>/...``)."""
        now = time.monotonic()
        values: dict[str, float] = {}
        for (is_eval, actor_id), progress in self.progress.items():
            values.update(actor_stats(actor_name(is_eval, actor_id), progress, now))
        return values

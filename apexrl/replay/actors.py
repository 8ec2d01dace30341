"""What actors' reports say about each actor, for the ``actor/<name>/...`` entries that the
replay server adds to ``Stats`` (``apexrl status`` shows them): the env steps it reported, its
env steps per second over its last ``ACTOR_RATE_REPORTS`` reports, the weights version it acts
with and how long ago it was heard from. These entries are neither snapshotted nor written to
TensorBoard: they describe who reports now.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

ACTOR_RATE_REPORTS = 8  # an actor's env steps/s is measured over its last 8 reports


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

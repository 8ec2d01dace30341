"""Where the local launcher's roles run on this machine's cores (``--placement``).

- ``shared``: every role may run on every core the launcher may use; the kernel spreads them.
- ``split``: each learner rank gets ``learner.torch_threads`` cores of its own (the last ones:
  the kernel's interrupts land on the first), and the replay server, the parameter server and
  the actors share the others. The evaluation actor may run on every core at its niceness
  (``Config.eval_niceness``: where no evaluation stops the run, it plays in the time the others
  leave idle).

A split needs at least one core left for the rest; where the learners' cores would take them
all, ``split`` is refused before the start and ``auto`` shares. Inside a role, the threads that
each process starts follow its cores (``apexrl.runtime.cores.usable_cores``: ale-py's vector
envs and the actor's halves), and ``learner.torch_threads`` is the number of a learner's cores.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

PLACEMENTS = ("auto", "shared", "split")
AUTO = "shared"  # what auto lays out where a split fits (benchmarks/RESULTS.md, issue 28)


class PlacementError(ValueError):
    """The placement cannot be laid out on these cores."""


def plan(
    placement: str, cores: Sequence[int], world_size: int, learner_threads: int
) -> dict[str, tuple[int, ...] | None]:
    """The cores of each learner rank (``learner_<rank>``), of the evaluation actor (``eval``)
    and of the other roles (``others``); None where a role may use every core."""
    if placement not in PLACEMENTS:
        raise PlacementError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    wanted = world_size * learner_threads
    fits = len(cores) - wanted >= 1 and hasattr(os, "sched_setaffinity")
    if placement == "split" and not fits:
        raise PlacementError(
            f"--placement split gives {world_size} learner(s) {learner_threads} core(s) each "
            f"and needs one more for the other roles; this machine lets the launcher use "
            f"{len(cores)}"
        )
    if placement == "auto":
        placement = AUTO
    if placement == "shared" or not fits:
        return {"others": None, "eval": None}
    learner_cores = list(cores[len(cores) - wanted :])
    layout: dict[str, tuple[int, ...] | None] = {
        "others": tuple(cores[: len(cores) - wanted]),
        "eval": None,
    }
    for rank in range(world_size):
        layout[f"learner_{rank}"] = tuple(
            learner_cores[rank * learner_threads : (rank + 1) * learner_threads]
        )
    return layout


def cores_of(
    layout: dict[str, tuple[int, ...] | None], role: str, index: int
) -> tuple[int, ...] | None:
    """The cores of ``role``'s process of this index (rank, actor id) in ``layout``; None:
    every core."""
    if role == "learner":
        return layout.get(f"learner_{index}", layout["others"])
    if role == "eval":
        return layout["eval"]
    return layout["others"]


def pin(cores: tuple[int, ...] | None) -> None:
    """Run this process (and the threads it starts later) on ``cores``; None: leave it."""
    if cores:
        os.sched_setaffinity(0, cores)


def describe_cores(cores: Sequence[int] | None) -> str:
    """``0``, ``0-3``, ``0,2`` for a set of cores; ``all`` for None."""
    if cores is None:
        return "all"
    ordered = sorted(cores)
    spans, start = [], ordered[0]
    for prev, cur in zip(ordered, [*ordered[1:], None], strict=True):
        if cur != prev + 1:
            spans.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur
    return ",".join(spans)

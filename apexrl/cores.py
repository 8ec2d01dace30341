"""The cores this process may run on: its CPU affinity (the launcher's ``--placement`` sets it;
``taskset`` or a container's cpuset do too). Threads a role starts (ale-py's vector envs, the
actor's halves) are sized to these, not to the machine's count, so a pinned role does not start
more threads than it has cores."""

from __future__ import annotations

import os


def allowed_cores() -> list[int]:
    """The cores this process may run on, in order."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """How many cores this process may run on, at least 1."""
    return max(1, len(allowed_cores()))

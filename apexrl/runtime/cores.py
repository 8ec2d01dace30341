"""The cores this process may run on: its CPU affinity (the launcher's ``--placement`` sets it;
``taskset`` or a container's cpuset do too). Threads a role starts (ale-py's vector envs, the
actor's halves) are sized to these, not to the machine's count, so a pinned role does not start
more threads than it has cores. And its share of them: ``lower_priority``.
"""

from __future__ import annotations

import errno
import os
import time


def allowed_cores() -> list[int]:
    """The cores this process may run on, in order."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """How many cores this process may run on, at least 1."""
    return max(1, len(allowed_cores()))


def lower_priority(by: int) -> None:
    """Add ``by`` to this process's niceness; where it leads its own session (every role the
    launcher starts does), give the session's scheduling group the same niceness. Where the
    kernel groups the CPU by session (``sched_autogroup``, on by default on many Linux kernels),
    a niceness only ranks a process against its own session, so a niced evaluation actor alone
    in its session would still take a full share, as much as the learner. A process in a user's
    shell session leaves the session's group alone (it would lower the shell's too)."""
    if by <= 0:
        return
    niceness = os.nice(by)
    if os.getsid(0) != os.getpid():
        return
    for _ in range(20):  # the kernel takes one such change per 0.1 s from unprivileged users
        try:
            with open("/proc/self/autogroup", "w") as group:
                group.write(str(niceness))
            return
        except OSError as exc:  # no autogroups on this kernel: the niceness alone does it
            if exc.errno != errno.EAGAIN:
                return
            time.sleep(0.05)

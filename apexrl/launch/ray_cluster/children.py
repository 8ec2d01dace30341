"""The driver's side of the runners: each role a ``RayChild``, the ``Child`` that the local
launcher's supervisor watches (``apexrl.launch.supervisor``), so that a run on Ray is restarted,
ended and stopped by the same rules as one on a single machine.

``RayChild.start`` starts the role's command in its runner, making the runner again in its
bundle (wherever Ray reschedules that bundle) when the last one was lost with its node; its
``process`` is a ``RunnerProcess``, which answers the ``subprocess.Popen`` calls the supervisor
makes (``poll``, ``wait``, ``send_signal``, ``kill``, ``pid``) through the runner. The exit
statuses of every role come from one batch of calls to the runners (``Runners.refresh``) at
most every ``REFRESH_S``, however often the supervisor asks.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from apexrl.launch.processes import Child

log = logging.getLogger("apexrl.launch.ray")

REFRESH_S = 0.1  # the supervisor's looks within this share one batch of polls
CALL_TIMEOUT_S = 30.0  # for a runner to answer (start, poll)
# The exit status the supervisor sees for a role whose runner is gone with its node: an error,
# neither 0 (stopped on request) nor 2 (a configuration error), so the role is restarted.
LOST_EXIT = 255


class Runners:
    """The runners of a run's roles and their last polled exit statuses."""

    def __init__(self) -> None:
        import ray

        self.ray = ray
        self.handles: dict[str, Any] = {}  # role name -> its RoleRunner actor handle
        self.codes: dict[str, int | None] = {}
        self.lost: set[str] = set()
        self.refreshed_at = 0.0

    def exit_code(self, name: str) -> int | None:
        if time.monotonic() - self.refreshed_at > REFRESH_S:
            self.refresh()
        return self.codes.get(name)

    def refresh(self) -> None:
        """One ``poll`` of every live runner; a runner that is gone makes its role's status
        ``LOST_EXIT``."""
        ray = self.ray
        names = [name for name in self.handles if name not in self.lost]
        refs = [self.handles[name].poll.remote() for name in names]
        for name, ref in zip(names, refs, strict=True):
            try:
                self.codes[name] = ray.get(ref, timeout=CALL_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                pass  # an answer late: the role's last known state stands
            except ray.exceptions.ActorUnavailableError:
                pass  # unreachable for now (its node restarting, the network): not lost yet
            except ray.exceptions.RayActorError as exc:
                log.warning("the runner of %s is gone (%s)", name, one_line(exc))
                self.lost.add(name)
                self.codes[name] = LOST_EXIT
        self.refreshed_at = time.monotonic()

    def signal(self, name: str, signum: int) -> None:
        if name in self.handles and name not in self.lost:
            self.handles[name].signal.remote(int(signum))


@dataclass
class RunnerProcess:
    """A role's process on its node, seen through its runner as ``subprocess.Popen`` is."""

    name: str
    pid: int
    runners: Runners

    def poll(self) -> int | None:
        return self.runners.exit_code(self.name)

    def wait(self, timeout: float | None = None) -> int:
        """The exit status once the role has ended; ``TimeoutExpired`` past ``timeout``. Without
        one, a runner that stops answering for ``CALL_TIMEOUT_S`` counts as lost."""
        limit = CALL_TIMEOUT_S if timeout is None else timeout
        deadline = time.monotonic() + limit
        while (code := self.poll()) is None:
            if time.monotonic() >= deadline:
                if timeout is None:
                    log.warning("%s: its runner does not answer; taken as lost", self.name)
                    return LOST_EXIT
                raise subprocess.TimeoutExpired(self.name, timeout)
            time.sleep(REFRESH_S)
        return code

    def send_signal(self, signum: int) -> None:
        self.runners.signal(self.name, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


@dataclass
class RayChild(Child):
    """A role whose process a runner holds; ``make_runner`` makes the runner again in the
    role's bundle once the last one was lost."""

    runners: Runners | None = None
    make_runner: Callable[[], Any] | None = None
    pythonpath: str = ""

    def start(self, extra_args: tuple[str, ...] = ()) -> None:
        assert self.runners is not None and self.make_runner is not None
        ray, runners = self.runners.ray, self.runners
        if self.name not in runners.handles or self.name in runners.lost:
            runners.handles[self.name] = self.make_runner()
            runners.lost.discard(self.name)
        handle = runners.handles[self.name]
        args = [*self.args, *extra_args]
        try:
            self.host = ray.get(handle.where.remote(), timeout=CALL_TIMEOUT_S * 4)["ip"]
            pid = ray.get(
                handle.start.remote(args, str(self.log_path), self.pythonpath),
                timeout=CALL_TIMEOUT_S,
            )
        except (ray.exceptions.RayError, TimeoutError) as exc:
            # Not placed or not started: the supervisor sees an error and restarts it later.
            log.warning("%s could not be started (%s)", self.name, one_line(exc))
            runners.lost.add(self.name)
            runners.codes[self.name] = LOST_EXIT
            self.process = RunnerProcess(self.name, 0, runners)
            return
        runners.codes[self.name] = None
        self.process = RunnerProcess(self.name, pid, runners)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"

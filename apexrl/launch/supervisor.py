"""The local launcher's supervisor: watches a started run's children until the run ends.

Every 0.2 s it records the roles' states in ``roles.json`` and then, in order:

- ``finished``: the learner wrote a ``result.json`` line with ``"done": true`` in this session:
  the run is complete (exit 0, after the learners' last checkpoint);
- ``config_error``: a role exited with status 2 (its configuration cannot work): the run stops
  (exit 2), and that role is never restarted;
- ``stopped_on_request``: the learner or a server exited 0, a stop asked for from anywhere
  (``apexrl stop``, a signal to the learner): the run stops (exit 0) and can be resumed;
- ``check_servers_and_learners``: a dead server is restarted on the same address, a dead learner
  with ``--resume`` from the run's checkpoint (unless ``run.restart_learner`` is false, or it is
  a rank of a group: the run stops, exit 1), after a backoff that doubles with each restart
  within a minute; one that keeps dying stops the run (exit 1), named with the tail of its log;
- ``check_forkserver``: the fork server that forks the actors died: the run stops (exit 1);
- ``check_actors``: an actor that exited 0 stopped on request; one that failed is restarted
  after a short backoff, and one that keeps dying stops the run (exit 1);
- ``restart_due``: restarts whose backoff has passed; ``announce_actors``: logs once that every
  actor is stepping (the replay server's ``replay/active_actors``).

SIGINT or SIGTERM (the ``stop`` event) ends the watch with exit status 130.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import zmq

from apexrl import roles
from apexrl.config import Config
from apexrl.launch.forkserver import ForkServer
from apexrl.launch.processes import Child, role_states, wait_for
from apexrl.launch.run_state import run_finished, save_roles
from apexrl.runtime import rundir
from apexrl.tools.server_stats import server_stats
from apexrl.transport import auth

log = logging.getLogger("apexrl.launch.local")

ACTOR_RESTART_BACKOFF_S = 1.0
MAX_ACTOR_RESTARTS_PER_MIN = 10  # per actor; more means it cannot run at all
SERVER_RESTART_BACKOFF_S = 1.0  # a server's or learner's first restart; doubles within a minute
MAX_SERVER_RESTART_BACKOFF_S = 8.0
MAX_SERVER_RESTARTS_PER_MIN = 5  # per server or learner; more means it cannot run at all
CONFIG_ERROR_EXIT = roles.CONFIG_ERROR_EXIT  # never restarted
POLL_S = 0.2  # between two looks at the children
RESUME_COMMAND = "scripts/launch_local.sh --resume"  # what continues a run stopped on request


def learner_names(world_size: int) -> list[str]:
    """``learner`` alone, or ``learner_0`` .. ``learner_{W-1}`` for a group (rank order)."""
    learner = roles.ROLES["learner"]
    return [learner.process_name(rank, world_size) for rank in range(world_size)]


def write_roles(
    run_dir: Path, children: list[Child], written: list[dict] | None = None
) -> list[dict]:
    """Write ``roles.json`` (atomically) when the roles' states differ from ``written``, the
    states it last wrote; returns the states now."""
    states = role_states(children)
    if states != written:
        save_roles(run_dir, states)
    return states


def log_restarts(children: list[Child]) -> None:
    counts = [f"{c.name} {c.num_restarts}" for c in children if c.num_restarts]
    if counts:
        log.info("restarts in this session: %s", ", ".join(counts))


def schedule_restart(child: Child, code: int, backoff_s: float, max_per_min: int) -> bool:
    """Schedule ``child``'s restart after a backoff that doubles with each restart of the last
    minute (``max_per_min`` 0: a flat backoff and ``MAX_ACTOR_RESTARTS_PER_MIN``); False, with
    the reason logged, when it died too often to go on."""
    if child.max_restarts is not None and child.num_restarts >= child.max_restarts:
        log.error(
            "%s exited with code %s after %d restarts, the most it may have; stopping the run. "
            "Last lines of %s:\n%s",
            child.name,
            code,
            child.num_restarts,
            child.log_path,
            child.log_tail(),
        )
        return False
    now = time.monotonic()
    child.restarts = [t for t in child.restarts if now - t < 60.0] + [now]
    limit = max_per_min or MAX_ACTOR_RESTARTS_PER_MIN
    if len(child.restarts) > limit:
        log.error(
            "%s keeps dying (exit code %s, %d restarts in a minute); stopping the run. "
            "Last lines of %s:\n%s",
            child.name,
            code,
            len(child.restarts) - 1,
            child.log_path,
            child.log_tail(),
        )
        return False
    delay_s = backoff_s
    if max_per_min:
        delay_s = min(backoff_s * 2 ** (len(child.restarts) - 1), MAX_SERVER_RESTART_BACKOFF_S)
    log.warning(
        "%s exited with code %s; restarting it in %.0f s (restart %d of this role)",
        child.name,
        code,
        delay_s,
        child.num_restarts + 1,
    )
    child.restart_at = now + delay_s
    return True


def restart(child: Child, cfg: Config) -> None:
    """Start ``child`` again; a learner resumes from the run's checkpoint when there is one."""
    extra: tuple[str, ...] = ()
    if child.args[0] == "learner":
        checkpoints = (rundir.checkpoint_path, rundir.previous_checkpoint_path)
        if any(path(cfg.run_dir).is_file() for path in checkpoints):
            extra = ("--resume",)
        else:
            log.warning("%s left no checkpoint; it starts again from scratch", child.name)
    child.restart_at = None
    child.num_restarts += 1
    child.start(extra)
    log.info("%s restarted%s", child.name, " with --resume" if extra else "")


class Supervisor:
    """What the watch over a run's children remembers between two looks."""

    def __init__(
        self,
        children: list[Child],
        cfg: Config,
        ctx: zmq.Context,
        forkserver: ForkServer | None,
        result_offset: int,
        resume_command: str = RESUME_COMMAND,
    ) -> None:
        by_name = {c.name: c for c in children}
        self.children, self.cfg, self.ctx = children, cfg, ctx
        self.forkserver, self.result_offset = forkserver, result_offset
        self.resume_command = resume_command
        self.learners = [by_name[name] for name in learner_names(cfg.learner.world_size)]
        self.servers = [by_name["replay"], by_name["params"]]
        self.actors = [c for c in children if c.restartable]  # those not stopped on request
        self.expected_actors = len(self.actors)
        self.stats_keys = auth.client_keys(cfg.net, "eval", "replay")
        self.announced = False
        self.last_check = time.monotonic()
        self.roles: list[dict] | None = None  # roles.json's states as last written

    def step(self) -> int | None:
        """One look at the children: the launcher's exit status when the run has ended."""
        self.roles = write_roles(self.cfg.run_dir, self.children, self.roles)
        checks = (
            self.finished,
            self.config_error,
            self.stopped_on_request,
            self.check_servers_and_learners,
            self.check_forkserver,
            self.check_actors,
        )
        for check in checks:
            code = check()
            if code is not None:
                return code
        self.restart_due()
        self.announce_actors()
        return None

    def finished(self) -> int | None:
        if not run_finished(self.cfg.run_dir, self.result_offset):
            return None
        # The servers stop on the learner's Shutdown, maybe before the learners have exited:
        # give the learners time to finish their last checkpoint, then the run is complete.
        wait_for(self.learners)
        log.info("the learner met its stop condition; the run is complete (%s)", self.cfg.run_dir)
        return 0

    def config_error(self) -> int | None:
        for c in self.children:
            if c.exit_code() == CONFIG_ERROR_EXIT:
                log.error(
                    "%s exited with status 2: its configuration cannot work; stopping the run. "
                    "Last lines of %s:\n%s",
                    c.name,
                    c.log_path,
                    c.log_tail(),
                )
                return CONFIG_ERROR_EXIT
        return None

    def stopped_on_request(self) -> int | None:
        """Exit 0 of the learner or a server: a stop was asked for (Shutdown to the servers, a
        signal to the learner), maybe from another host; the run can be resumed."""
        requested = [c.name for c in (self.learners[0], *self.servers) if c.exit_code() == 0]
        if not requested or run_finished(self.cfg.run_dir, self.result_offset):
            return None
        wait_for(self.learners)
        if run_finished(self.cfg.run_dir, self.result_offset):
            return self.finished()  # the stop condition after all
        log.info(
            "the run was stopped on request (%s exited); continue it with %s --run-dir %s",
            ", ".join(requested),
            self.resume_command,
            self.cfg.run_dir,
        )
        return 0

    def check_servers_and_learners(self) -> int | None:
        for c in [*self.servers, *self.learners]:
            code = None if c.restart_at is not None else c.exit_code()
            if code is None or (code == 0 and c in self.learners):
                continue  # running, restarting, or a rank that stopped with its group
            if not self.restartable(c):
                log.error(
                    "%s exited with code %s; stopping the run. Last lines of %s:\n%s",
                    c.name,
                    code,
                    c.log_path,
                    c.log_tail(),
                )
                return 1
            if not schedule_restart(c, code, SERVER_RESTART_BACKOFF_S, MAX_SERVER_RESTARTS_PER_MIN):
                return 1
        return None

    def restartable(self, child: Child) -> bool:
        """Whether a dead server or learner is restarted: a server always, a learner when
        ``run.restart_learner`` is set and it is not a rank of a group (the group stops with
        it)."""
        if child in self.servers:
            return True
        return self.cfg.run.restart_learner and self.cfg.learner.world_size == 1

    def check_forkserver(self) -> int | None:
        if self.forkserver is None or not any(c.forkserver for c in self.actors):
            return None
        code = self.forkserver.process.poll()
        if code is None:
            return None
        log.error("the actor fork server exited with code %s; stopping the run", code)
        return 1

    def check_actors(self) -> int | None:
        for actor in list(self.actors):
            code = None if actor.restart_at is not None else actor.exit_code()
            if code is None:
                continue
            if code == 0:  # stopped on request: a signal, or the servers' Shutdown
                log.info("%s stopped", actor.name)
                self.actors.remove(actor)
                continue
            if not schedule_restart(actor, code, ACTOR_RESTART_BACKOFF_S, 0):
                return 1
        return None

    def restart_due(self) -> None:
        for c in self.children:
            if c.restart_at is not None and time.monotonic() >= c.restart_at:
                restart(c, self.cfg)

    def announce_actors(self) -> None:
        if self.announced or time.monotonic() - self.last_check <= 1.0:
            return
        self.last_check = time.monotonic()
        addr = self.cfg.net.replay_addr
        stats = server_stats(self.ctx, addr, timeout_ms=500, curve=self.stats_keys)
        if stats and stats.get("replay/active_actors", 0) >= self.expected_actors:
            self.announced = True
            log.info("all %d actors are stepping", self.expected_actors)


def supervise(
    children: list[Child],
    cfg: Config,
    stop: threading.Event,
    ctx: zmq.Context,
    forkserver: ForkServer | None = None,
    result_offset: int = 0,
    resume_command: str = RESUME_COMMAND,
) -> int:
    """Watch the children until the run ends; returns the launcher's exit status
    (``resume_command``: what the log names to continue a run stopped on request)."""
    supervisor = Supervisor(children, cfg, ctx, forkserver, result_offset, resume_command)
    while not stop.is_set():
        time.sleep(POLL_S)
        code = supervisor.step()
        if code is not None:
            return code
    log.info("stop requested")
    return 130

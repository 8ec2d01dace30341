"""Serial mode: every role of a small run in one process, for stepping through it in a debugger.

``scripts/launch_local.sh --serial`` (``apexrl local --serial``) runs the replay server, the
parameter server, the learner, the actors and the evaluation actor each in a thread of this
process, named after the role, and each thread runs the role's own ``main(cfg)``: the same code
as a launched run, so a breakpoint set in ``actor.py`` or ``learner.py`` (``breakpoint()``, or an
IDE's) stops there (rlpyt's serial sampler, RLlib's local mode, Sample Factory's serial mode).
What differs from a launched run:

- the servers bind ``inproc://apexrl-<run>-replay`` and ``inproc://apexrl-<run>-params`` in one
  ZeroMQ context that every role shares (``sockets.share_context``; a role's ``ctx.term()`` leaves
  it to this runner), without CURVE keys: nothing leaves the process;
- one stop event for the clients (learner, actors, evaluation actor) and one for the servers
  (``lifecycle.share_stop``): SIGINT and SIGTERM handlers are installed once, in the main thread,
  and set the clients'; the servers are stopped once the clients have stopped (or did not stop
  in time). Over ``inproc://`` a send to a server that has closed its socket does not queue as
  it does over TCP: it blocks for the socket's send timeout (a minute), longer than a role may
  take to stop;
- one torch thread (``torch.set_num_threads`` is per process) and no niceness for the
  evaluation actor (``os.nice`` would slow every role);
- one learner; nothing is restarted: a role that fails ends the run;
- every log line names its role and the process, on the console and in ``logs/serial.log``, and
  each role's lines also go to its own ``logs/<role>.log``;
- ``apexrl status RUN_DIR`` reaches the in-process servers through a Stats relay on loopback
  (``apexrl.launch.stats_relay``) whose addresses ``roles.json`` records.

The roles, their names and their ``main`` come from the table of roles (``apexrl.roles``);
``roles.json`` and ``result.json`` are written and read by ``apexrl.launch.run_state``.

The run ends as a launched one does: when the learner writes a ``result.json`` line with
``"done": true`` (its stop condition) the runner stops every role, waits for them and exits 0.
Exit status: 0 when the run is complete or the learner stopped; 130 on SIGINT or SIGTERM; 1 when
a role raised or failed; 2 when a role's configuration or environment cannot work.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from apexrl import roles
from apexrl.config import Config, dump_config
from apexrl.launch.run_state import result_size, run_finished, save_roles
from apexrl.launch.stats_relay import StatsRelay
from apexrl.runtime import lifecycle, rundir
from apexrl.tools.plot import plot_after_run
from apexrl.transport import sockets

log = logging.getLogger("apexrl.launch.serial")

JOIN_TIMEOUT_S = 20.0  # for every role together to stop once the stop event is set
WATCH_INTERVAL_S = 0.2  # between two looks at the roles
# Stopped after every other role: replay, params.
SERVERS = tuple(name for name, role in roles.ROLES.items() if role.group == "server")
LEARNER_FINISH_S = 10.0  # for the learner's last checkpoint after it met its stop condition
CONFIG_ERROR_EXIT = roles.CONFIG_ERROR_EXIT


@dataclass
class RoleThread:
    """One role's ``main`` in a thread named after the role, and how it ended."""

    name: str
    main: Callable[[], int]
    thread: threading.Thread | None = None
    exit_code: int | None = None  # main's return value; 1 when it raised (2: a config error)

    def start(self) -> None:
        # A daemon: a role that does not stop on request cannot keep the process alive.
        self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.exit_code = int(self.main())
        except BaseException as exc:
            if roles.is_startup_error(exc):
                log.error("%s: %s", self.name, exc)
                self.exit_code = CONFIG_ERROR_EXIT
            else:
                log.exception("%s crashed", self.name)
                self.exit_code = 1

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()


def serial_config(cfg: Config) -> Config:
    """The run's config for one process: in-process addresses named after the run, no keys, one
    torch thread per role, no niceness."""
    name = cfg.run_dir.name or "run"
    net = dataclasses.replace(
        cfg.net,
        replay_addr=f"inproc://apexrl-{name}-replay",
        params_addr=f"inproc://apexrl-{name}-params",
        keys_dir="",
    )
    actor = dataclasses.replace(cfg.actor, torch_threads=1, eval_nice=0)
    learner = dataclasses.replace(cfg.learner, torch_threads=1)
    return dataclasses.replace(cfg, net=net, actor=actor, learner=learner)


def build_roles(cfg: Config, num_actors: int, evaluate: bool) -> list[RoleThread]:
    """The roles in start order (``roles.processes``): servers, learner, actors, evaluation
    actor, each calling its role's ``main``."""
    return [
        RoleThread(p.name, functools.partial(p.role.main, cfg, p.index))
        for p in roles.processes(1, num_actors, evaluate)
    ]


def write_roles(
    run_dir: Path, threads: list[RoleThread], stats: dict[str, str] | None = None
) -> None:
    """``<run dir>/roles.json`` as the launcher writes it (for ``apexrl status``): every role has
    this process's PID; ``stats``: the Stats relay's addresses."""
    states = []
    for r in threads:
        if r.thread is None:
            state = "not started"
        else:
            state = "running" if r.alive else "exited"
        states.append(
            {
                "name": r.name,
                "pid": os.getpid(),
                "restarts": 0,
                "state": state,
                "exit_code": r.exit_code,
            }
        )
    save_roles(run_dir, states, stats)


def watch(threads: list[RoleThread], cfg: Config, stop: threading.Event, offset: int) -> int:
    """Wait until the run ends; its exit status. ``offset``: ``result.json``'s size at the start
    (a resumed run's earlier lines are not read)."""
    by_name = {r.name: r for r in threads}
    learner = by_name["learner"]
    servers = [by_name["replay"], by_name["params"]]
    while not lifecycle.wait_for_stop(stop, WATCH_INTERVAL_S):
        if run_finished(cfg.run_dir, offset):
            # The learner writes its last checkpoint after the line: let it finish.
            if learner.thread is not None:
                learner.thread.join(LEARNER_FINISH_S)
            log.info("the learner met its stop condition; the run is complete (%s)", cfg.run_dir)
            return 0
        failed = [r for r in threads if r.exit_code not in (None, 0)]
        if failed:
            for r in failed:
                log.error("%s ended with exit code %s; stopping the run", r.name, r.exit_code)
            return CONFIG_ERROR_EXIT if failed[0].exit_code == CONFIG_ERROR_EXIT else 1
        stopped = [r.name for r in (learner, *servers) if r.exit_code == 0]
        if stopped and not stop.is_set():  # set: they ended on the run's own stop request
            if run_finished(cfg.run_dir, offset):
                continue  # the stop condition after all: reported above
            log.info("the run was stopped (%s ended)", ", ".join(stopped))
            return 0
    log.info("stop requested")
    return 130


def join_all(
    threads: list[RoleThread], timeout_s: float, deadline: float | None = None
) -> list[RoleThread]:
    """Wait up to ``timeout_s`` (or until ``deadline``, a ``time.monotonic`` time) for every
    role's thread; the roles still running, each logged with where it is stuck."""
    deadline = time.monotonic() + timeout_s if deadline is None else deadline
    for r in threads:
        if r.thread is not None:
            r.thread.join(max(deadline - time.monotonic(), 0.01))
    stuck = [r for r in threads if r.alive]
    frames = sys._current_frames()
    for r in stuck:
        frame = frames.get(r.thread.ident) if r.thread is not None else None
        where = "".join(traceback.format_stack(frame)) if frame is not None else "?"
        log.error("%s did not stop within %.0f s; it is at:\n%s", r.name, timeout_s, where)
    return stuck


def stop_in_order(
    threads: list[RoleThread], stop: threading.Event, servers_stop: threading.Event
) -> list[RoleThread]:
    """Stop the clients, wait for them, then stop the servers, all within ``JOIN_TIMEOUT_S``;
    the roles that did not stop."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    lifecycle.request_stop(stop)
    for r in threads:
        if r.name not in SERVERS and r.thread is not None:
            r.thread.join(max(deadline - time.monotonic(), 0.01))
    lifecycle.request_stop(servers_stop)
    return join_all(threads, JOIN_TIMEOUT_S, deadline)


def run_threads(
    threads: list[RoleThread],
    cfg: Config,
    stops: tuple[threading.Event, threading.Event],
    offset: int,
    relay: StatsRelay,
) -> tuple[int, list[RoleThread]]:
    """Start the roles and the Stats relay, watch them until the run ends, then stop and join
    them: the exit status and the roles that did not stop. ``stops``: the clients' stop event
    (the signal handlers set it) and the servers'."""
    stop, servers_stop = stops
    code, interrupted, stuck = 1, False, []
    try:
        relay.start()
        for r in threads:
            r.start()
        write_roles(cfg.run_dir, threads, relay.addresses)
        code = watch(threads, cfg, stop, offset)
    except KeyboardInterrupt:  # a second signal (the first one sets ``stop``): stop at once
        code, interrupted = 130, True
    finally:
        try:
            relay.close()  # a client of the servers too
            if not interrupted:
                stuck = stop_in_order(threads, stop, servers_stop)
        except KeyboardInterrupt:
            interrupted = True
        if interrupted:
            log.warning("interrupted again; not waiting for the roles")
            lifecycle.request_stop(stop)
            lifecycle.request_stop(servers_stop)
            stuck = [r for r in threads if r.alive]
        write_roles(cfg.run_dir, threads, relay.addresses)
    return code, stuck


def final_status(code: int, threads: list[RoleThread]) -> int:
    """The run's exit status: ``code``, unless a role failed in a run that ended well or was
    stopped (1, or 2 for a configuration error)."""
    failed = [r for r in threads if r.exit_code not in (None, 0)]
    if code in (0, 130) and failed:
        for r in failed:
            log.error("%s ended with exit code %s", r.name, r.exit_code)
        code = CONFIG_ERROR_EXIT if failed[0].exit_code == CONFIG_ERROR_EXIT else 1
    return code


def run_serial(
    cfg: Config, num_actors: int, evaluate: bool, stop: threading.Event | None = None
) -> int:
    """Run every role of ``cfg``'s run in threads of this process until it ends; the exit
    status (see the module's doc). ``stop``: an event that this thread's SIGINT/SIGTERM
    handlers set (installed here when None)."""
    if cfg.learner.world_size != 1:
        print("apexrl local: --serial runs one learner (--learners 1)", file=sys.stderr)
        return CONFIG_ERROR_EXIT
    if stop is None:
        stop = lifecycle.install_stop_handlers()
    cfg = serial_config(cfg)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    rundir.config_path(cfg.run_dir).write_text(dump_config(cfg))
    threads = build_roles(cfg, num_actors, evaluate)
    threading.current_thread().name = "serial"
    handlers = lifecycle.setup_serial_logging(cfg.run_dir, [r.name for r in threads])
    offset = result_size(cfg.run_dir)
    servers_stop = threading.Event()
    lifecycle.share_stop(stop, {name: servers_stop for name in SERVERS})
    ctx = sockets.share_context()
    relay = StatsRelay(ctx, {"replay": cfg.net.replay_addr, "params": cfg.net.params_addr})
    log.info(
        "serial run in process %d, run directory %s: %s; Stats for apexrl status at %s",
        os.getpid(),
        cfg.run_dir,
        ", ".join(r.name for r in threads),
        ", ".join(relay.addresses.values()),
    )
    stuck: list[RoleThread] = []
    try:
        code, stuck = run_threads(threads, cfg, (stop, servers_stop), offset, relay)
    finally:
        lifecycle.share_stop(None)
        sockets.unshare_context()
        if not stuck:  # a role still running may still use its sockets
            ctx.end()
    code = final_status(code, threads)
    plot_after_run(cfg.run_dir)
    log.info(
        "serial run ended with exit code %d%s",
        code,
        f"; still running: {', '.join(r.name for r in stuck)}" if stuck else "",
    )
    for handler in handlers:
        logging.root.removeHandler(handler)
        handler.close()
    return code

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
- one stop event for every role (``lifecycle.share_stop``): SIGINT and SIGTERM handlers are
  installed once, in the main thread;
- one torch thread (``torch.set_num_threads`` is per process) and no niceness for the
  evaluation actor (``os.nice`` would slow every role);
- one learner; nothing is restarted: a role that fails ends the run;
- every log line names its role and the process, on the console and in ``logs/serial.log``, and
  each role's lines also go to its own ``logs/<role>.log``.

The run ends as a launched one does: when the learner writes a ``result.json`` line with
``"done": true`` (its stop condition) the runner stops every role, waits for them and exits 0.
Exit status: 0 when the run is complete or the learner stopped; 130 on SIGINT or SIGTERM; 1 when
a role raised or failed; 2 when a role's configuration or environment cannot work.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from apexrl import lifecycle
from apexrl.config import Config, dump_config
from apexrl.launch.local import result_size, run_finished, save_roles
from apexrl.transport import sockets

log = logging.getLogger("apexrl.launch.serial")

JOIN_TIMEOUT_S = 20.0  # for every role together to stop once the stop event is set
LEARNER_FINISH_S = 10.0  # for the learner's last checkpoint after it met its stop condition
CONFIG_ERROR_EXIT = 2


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
        from apexrl.envs import EnvError

        try:
            self.exit_code = int(self.main())
        except (EnvError, FileNotFoundError, lifecycle.StartupError) as exc:
            log.error("%s: %s", self.name, exc)
            self.exit_code = CONFIG_ERROR_EXIT
        except BaseException:
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
    """The roles in start order: servers, learner, actors, evaluation actor."""
    from apexrl import actor, evaluation, learner, param_server, replay_server

    roles = [
        RoleThread("replay", lambda: replay_server.main(cfg)),
        RoleThread("params", lambda: param_server.main(cfg)),
        RoleThread("learner", lambda: learner.main(cfg, rank=0)),
    ]
    for i in range(num_actors):
        roles.append(RoleThread(f"actor_{i}", lambda i=i: actor.main(cfg, actor_id=i)))
    if evaluate:
        roles.append(RoleThread("eval", lambda: evaluation.main(cfg)))
    return roles


def write_roles(run_dir: Path, roles: list[RoleThread]) -> None:
    """``<run dir>/roles.json`` as the launcher writes it (for ``apexrl status``): every role has
    this process's PID."""
    states = []
    for r in roles:
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
    save_roles(run_dir, states)


def watch(roles: list[RoleThread], cfg: Config, stop: threading.Event, offset: int) -> int:
    """Wait until the run ends; its exit status. ``offset``: ``result.json``'s size at the start
    (a resumed run's earlier lines are not read)."""
    by_name = {r.name: r for r in roles}
    learner = by_name["learner"]
    servers = [by_name["replay"], by_name["params"]]
    while not stop.wait(0.2):
        if run_finished(cfg.run_dir, offset):
            # The learner writes its last checkpoint after the line: let it finish.
            if learner.thread is not None:
                learner.thread.join(LEARNER_FINISH_S)
            log.info("the learner met its stop condition; the run is complete (%s)", cfg.run_dir)
            return 0
        failed = [r for r in roles if r.exit_code not in (None, 0)]
        if failed:
            for r in failed:
                log.error("%s ended with exit code %s; stopping the run", r.name, r.exit_code)
            return CONFIG_ERROR_EXIT if failed[0].exit_code == CONFIG_ERROR_EXIT else 1
        stopped = [r.name for r in (learner, *servers) if r.exit_code == 0]
        if stopped:
            if run_finished(cfg.run_dir, offset):
                continue  # the stop condition after all: reported above
            log.info("the run was stopped (%s ended)", ", ".join(stopped))
            return 0
    log.info("stop requested")
    return 130


def join_all(roles: list[RoleThread], timeout_s: float) -> list[RoleThread]:
    """Wait up to ``timeout_s`` for every role's thread; the roles still running, each logged
    with where it is stuck."""
    deadline = time.monotonic() + timeout_s
    for r in roles:
        if r.thread is not None:
            r.thread.join(max(deadline - time.monotonic(), 0.01))
    stuck = [r for r in roles if r.alive]
    frames = sys._current_frames()
    for r in stuck:
        frame = frames.get(r.thread.ident) if r.thread is not None else None
        where = "".join(traceback.format_stack(frame)) if frame is not None else "?"
        log.error("%s did not stop within %.0f s; it is at:\n%s", r.name, timeout_s, where)
    return stuck


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
    (cfg.run_dir / "config.yaml").write_text(dump_config(cfg))
    roles = build_roles(cfg, num_actors, evaluate)
    threading.current_thread().name = "serial"
    handlers = lifecycle.setup_serial_logging(cfg.run_dir / "logs", [r.name for r in roles])
    offset = result_size(cfg.run_dir)
    lifecycle.share_stop(stop)
    ctx = sockets.share_context()
    log.info(
        "serial run in process %d, run directory %s: %s",
        os.getpid(),
        cfg.run_dir,
        ", ".join(r.name for r in roles),
    )
    stuck: list[RoleThread] = []
    code, interrupted = 1, False
    try:
        for r in roles:
            r.start()
        write_roles(cfg.run_dir, roles)
        code = watch(roles, cfg, stop, offset)
    except KeyboardInterrupt:  # a second signal (the first one sets ``stop``): stop at once
        code, interrupted = 130, True
    finally:
        stop.set()
        try:
            if not interrupted:
                stuck = join_all(roles, JOIN_TIMEOUT_S)
        except KeyboardInterrupt:
            interrupted = True
        if interrupted:
            log.warning("interrupted again; not waiting for the roles")
            stuck = [r for r in roles if r.alive]
        write_roles(cfg.run_dir, roles)
        lifecycle.share_stop(None)
        sockets.unshare_context()
        if not stuck:  # a role still running may still use its sockets
            ctx.end()
    failed = [r for r in roles if r.exit_code not in (None, 0)]
    if code in (0, 130) and failed:
        for r in failed:
            log.error("%s ended with exit code %s", r.name, r.exit_code)
        code = CONFIG_ERROR_EXIT if failed[0].exit_code == CONFIG_ERROR_EXIT else 1
    from apexrl.tools.plot import plot_after_run

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

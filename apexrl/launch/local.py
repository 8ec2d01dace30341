"""Local launcher: starts a whole run on this machine as separate processes and supervises it.

Order: replay server, parameter server and learner(s) together (the learners' first messages wait
in ZeroMQ until the servers are bound), then, once both servers answer ``StatsRequest``, the actors
and the evaluation actor. While the run is on:

- an actor that exits is restarted (with a short backoff; an actor that keeps dying stops the run);
- a replay or parameter server that dies is restarted on the same address with the same run
  directory, after a backoff that doubles with each restart within a minute; one that keeps
  dying stops the run, named in the log with the tail of its log. The other roles notice that it
  went away and send it again what it lost (``apexrl.clients.peers``);
- a learner that dies is restarted the same way, with ``--resume`` from the run's checkpoint
  (without it when it died before its first checkpoint), unless ``run.restart_learner`` is false;
  a rank of a learner group is not restarted: a group that loses a rank stops the run, and the
  launcher says which learner died, with its exit code and the tail of its log;
- every restart is counted per role and logged, and the counts are logged when the run ends;
- when the learner writes a ``result.json`` line with ``"done": true`` in this session, the run
  is complete (lines of an earlier session of a resumed run are not read);
- when the run is stopped from elsewhere (``apexrl stop``: ``Shutdown`` to the servers), the
  launcher stops the rest and exits 0;
- a role that exits with status 2 (its configuration is wrong) stops the run and is never
  restarted;
- SIGINT or SIGTERM stops every process: SIGTERM first, SIGKILL after ``STOP_TIMEOUT_S`` to the
  ones still alive. Children also get SIGTERM from the kernel if the launcher itself dies
  (``PR_SET_PDEATHSIG``), so no process outlives it.

Every role is forked by a pre-imported fork server (``apexrl.launch.forkserver``) that the launcher
starts first, so the run imports torch once, 32 actors step within seconds and all share the
imported pages; each forked role runs the same ``apexrl <role> ...`` command line it would be
exec'd with (``ps`` shows it), in its own session with its own log. ``--actor-start exec`` starts
every role with ``exec`` instead, and the launcher falls back to that by itself when the fork
server does not come up. ``--actor-nice N`` adds N to
the actors' niceness, so that the learner keeps its CPU when actors outnumber the cores.

Before it starts anything, the launcher checks what it can (the config, the environment id and
its spaces, the devices, the ports, the checkpoint of a resumed run) and reports a problem in one
line with exit status 2, leaving no run directory behind. A run directory is named after the
algorithm and the environment (``runs/apex_dqn-CartPole-v1-20261130-120000``).
``--resume --run-dir DIR`` continues the run in DIR from its checkpoint with its own
``config.yaml`` (or ``--config``), any number of actors and learners.

Each child's output goes to ``<run dir>/logs/<role>.log``; the learner's progress lines are also
copied to the console. The launcher writes the resolved config to ``<run dir>/config.yaml`` and
starts every role with it, so all processes of a run read the same values.

CURVE is on unless ``--no-curve``: the launcher makes the run's keys in ``<run dir>/keys`` (or
uses those ``net.keys_dir`` names) and the config every role reads points there, so the servers
admit only the run's roles. The launcher itself asks for ``Stats`` with the eval role's key, the
least privileged one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from apexrl import lifecycle
from apexrl.config import Config, ConfigError, dump_config, load_config
from apexrl.launch.forkserver import ForkedProcess, ForkServer, die_with_parent
from apexrl.launch.preflight import LaunchError, check_before_start
from apexrl.transport import auth, sockets
from apexrl.transport.codec import DecodeError
from apexrl.transport.messages import Stats, StatsRequest

log = logging.getLogger("apexrl.launch.local")

STOP_TIMEOUT_S = 10.0  # seconds between SIGTERM and SIGKILL
READY_TIMEOUT_S = 60.0  # seconds a server may take to answer its first StatsRequest
ACTOR_RESTART_BACKOFF_S = 1.0
MAX_ACTOR_RESTARTS_PER_MIN = 10  # per actor; more means it cannot run at all
SERVER_RESTART_BACKOFF_S = 1.0  # a server's or learner's first restart; doubles within a minute
MAX_SERVER_RESTART_BACKOFF_S = 8.0
MAX_SERVER_RESTARTS_PER_MIN = 5  # per server or learner; more means it cannot run at all
CONFIG_ERROR_EXIT = 2  # a role's exit status when its configuration cannot work: never restarted
ACTOR_NICENESS = 0  # added to each actor's niceness by default (--actor-nice)


@dataclass
class Child:
    """One supervised process and how to start it again."""

    name: str
    args: list[str]  # apexrl <args>
    log_path: Path
    restartable: bool  # an actor: restarted whatever its exit, started once the servers answer
    echo: bool = False  # copy its log to the console as it grows
    niceness: int = 0
    forkserver: ForkServer | None = None  # fork from it rather than exec
    process: subprocess.Popen | ForkedProcess | None = None
    restarts: list[float] = field(default_factory=list)  # times of the last minute's restarts
    num_restarts: int = 0  # in this session
    restart_at: float | None = None  # when a scheduled restart is due (time.monotonic)

    @property
    def argv(self) -> list[str]:
        return [sys.executable, "-m", "apexrl", *self.args]

    def start(self, extra_args: tuple[str, ...] = ()) -> None:
        args = [*self.args, *extra_args]
        with open(self.log_path, "ab") as log_file:  # there for _follow before the role writes
            offset = log_file.tell()
        self.process = None
        if self.forkserver is not None:
            try:
                self.process = self.forkserver.start(self.name, args, self.niceness)
            except RuntimeError as exc:
                log.warning("%s; starting it with exec", exc)
        if self.process is None:
            self._exec(args)
        if self.echo:
            # Its output goes to its log file like every child's (so the role can tell that its
            # log is already written there); the console gets the lines as they are written.
            threading.Thread(
                target=_follow,
                args=(self.log_path, offset, self.process),
                daemon=True,
                name=f"follow-{self.name}",
            ).start()

    def _exec(self, args: list[str]) -> None:
        log_file = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.process = subprocess.Popen(
            [sys.executable, "-m", "apexrl", *args],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent if not self.niceness else self._prepare_exec,
            close_fds=True,
            # Its own session: a terminal's Ctrl-C reaches the launcher alone, which then stops
            # every child exactly once (a second signal would interrupt a child's clean exit).
            start_new_session=True,
        )
        log_file.close()

    def _prepare_exec(self) -> None:
        die_with_parent()
        os.nice(self.niceness)

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def log_tail(self, num_lines: int = 15) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join("    " + line for line in lines[-num_lines:])


def _follow(path: Path, offset: int, process: subprocess.Popen | ForkedProcess) -> None:
    """Copy what is appended to ``path`` after ``offset`` to the console until ``process``
    exits (and what it wrote last)."""
    with open(path, "rb") as f:
        f.seek(offset)
        while True:
            exited = process.poll() is not None
            data = f.read()
            if data:
                sys.stdout.write(data.decode(errors="replace"))
                sys.stdout.flush()
            elif exited:
                return
            else:
                time.sleep(0.2)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_stats(
    ctx: zmq.Context, addr: str, timeout_ms: int, curve: auth.ClientKeys | None = None
) -> dict[str, float] | None:
    """Ask a server for its ``Stats`` (as a CURVE client with ``curve``); None when it does not
    answer in time."""
    sock = sockets.connect(ctx, zmq.DEALER, addr, curve=curve)
    try:
        sockets.send(sock, StatsRequest())
        deadline = time.monotonic() + timeout_ms / 1000
        while time.monotonic() < deadline:
            try:
                msg = sockets.recv(sock, timeout_ms=50)
            except DecodeError:
                continue
            if isinstance(msg, Stats):
                return msg.values
        return None
    finally:
        sock.close(linger=0)


def resolve_run_config(args: argparse.Namespace) -> Config:
    """The run's config: the file (a resumed run's own ``config.yaml`` by default), the user's
    overrides, then what the launcher decides (loopback addresses on free ports, the number of
    actors and learners), the run directory ``<logdir>/<algorithm>-<env>-<time>`` and its CURVE
    keys (``net.keys_dir`` as given, else ``<run dir>/keys``; none with ``--no-curve``)."""
    config_path = args.config
    if args.resume:
        if not args.run_dir:
            raise LaunchError("--resume needs --run-dir, the directory of the run to continue")
        config_path = config_path or str(Path(args.run_dir) / "config.yaml")
    overrides = [
        f"actor.num_actors={args.actors}",
        f"net.replay_addr=tcp://127.0.0.1:{free_port()}",
        f"net.params_addr=tcp://127.0.0.1:{free_port()}",
        f"learner.world_size={args.learners}",
        f"run.resume={'true' if args.resume else 'false'}",
    ]
    if args.learners > 1:
        overrides.append(f"learner.rendezvous=tcp://127.0.0.1:{free_port()}")
    cfg = load_config(config_path, overrides + list(args.overrides))
    user_sets_dir = any(o.strip().startswith("run.dir=") for o in args.overrides)
    if args.run_dir:
        run_dir = args.run_dir
    elif user_sets_dir:
        run_dir = cfg.run.dir
    else:
        run_dir = str(Path(args.logdir) / f"{cfg.run_name}-{time.strftime('%Y%m%d-%H%M%S')}")
    keys_dir = "" if args.no_curve else cfg.net.keys_dir or str(Path(run_dir) / "keys")
    return dataclasses.replace(
        cfg,
        run=dataclasses.replace(cfg.run, dir=run_dir),
        net=dataclasses.replace(cfg.net, keys_dir=keys_dir),
    )


def check_keys(cfg: Config) -> None:
    """Keys that ``net.keys_dir`` names outside the run directory must exist (the launcher makes
    only the run's own ``<run dir>/keys``)."""
    keys_dir = Path(cfg.net.keys_dir)
    if cfg.net.keys_dir and keys_dir != cfg.run_dir / "keys" and not auth.has_keys(keys_dir):
        raise LaunchError(
            f"net.keys_dir {keys_dir} does not hold a run's CURVE keys (make them with "
            f"`apexrl keys {keys_dir}`, or leave net.keys_dir empty for keys of this run)"
        )


def learner_names(world_size: int) -> list[str]:
    """``learner`` alone, or ``learner_0`` .. ``learner_{W-1}`` for a group (rank order)."""
    return ["learner"] if world_size == 1 else [f"learner_{r}" for r in range(world_size)]


def build_children(
    cfg: Config,
    config_path: Path,
    num_actors: int,
    evaluate: bool,
    forkserver: ForkServer | None = None,
    actor_niceness: int = 0,
) -> list[Child]:
    logs = cfg.run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    conf = ["--config", str(config_path)]

    def child(name: str, args: list[str], restartable: bool, echo: bool = False) -> Child:
        niceness = actor_niceness if restartable else 0
        return Child(
            name, args + conf, logs / f"{name}.log", restartable, echo, niceness, forkserver
        )

    children = [
        child("replay", ["replay"], False),
        child("params", ["params"], False),
    ]
    for rank, name in enumerate(learner_names(cfg.learner.world_size)):
        children.append(child(name, ["learner", "--rank", str(rank)], False, echo=rank == 0))
    children += [child(f"actor_{i}", ["actor", "--id", str(i)], True) for i in range(num_actors)]
    if evaluate:
        children.append(child("eval", ["actor", "--eval"], True))
    return children


def stop_all(children: list[Child]) -> None:
    """SIGTERM to every live child, wait, then SIGKILL the survivors. Only our own PIDs."""
    alive = [c for c in children if c.exit_code() is None and c.process is not None]
    for c in alive:
        c.process.send_signal(signal.SIGTERM)
    started = time.monotonic()
    deadline = started + STOP_TIMEOUT_S
    for c in alive:
        try:
            c.process.wait(timeout=max(deadline - time.monotonic(), 0.01))
            log.debug("%s stopped after %.2f s", c.name, time.monotonic() - started)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0f s; killing it", c.name, STOP_TIMEOUT_S)
            c.process.kill()
            c.process.wait()


def result_size(run_dir: Path) -> int:
    """Bytes of ``result.json`` now: a session reads only what it writes after them."""
    try:
        return (run_dir / "result.json").stat().st_size
    except OSError:
        return 0


def run_finished(run_dir: Path, offset: int = 0) -> bool:
    """Whether the learner's last ``result.json`` line after byte ``offset`` (the size the file
    had when this session started) says the stop condition was met."""
    try:
        with open(run_dir / "result.json", "rb") as f:
            f.seek(offset)
            lines = f.read().decode(errors="replace").splitlines()
        return bool(lines) and json.loads(lines[-1]).get("done") is True
    except (OSError, ValueError):
        return False


def wait_for_forkserver(forkserver: ForkServer, stop) -> bool:
    """Whether the fork server came up; when it did not, say so (actors are then exec'd)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not forkserver.ready.wait(0.1):
        code = forkserver.process.poll()
        if code is not None or time.monotonic() > deadline or stop.is_set():
            if not stop.is_set():
                log.warning(
                    "the actor fork server did not come up (exit code %s); starting actors "
                    "with exec. Last lines of %s:\n%s",
                    code,
                    forkserver.log_path,
                    Child("forkserver", [], forkserver.log_path, False).log_tail(),
                )
            forkserver.close()
            return False
    return True


def wait_for_learners(learners: list[Child]) -> None:
    """Give the learners time to write their last checkpoint after the servers stopped."""
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for c in learners:
        try:
            c.process.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            pass


def restartable_role(child: Child, cfg: Config, servers: list[Child]) -> bool:
    """Whether a dead server or learner is restarted: a server always, a learner when
    ``run.restart_learner`` is set and it is not a rank of a group (the group stops with it)."""
    if child in servers:
        return True
    return cfg.run.restart_learner and cfg.learner.world_size == 1


def schedule_restart(child: Child, code: int, backoff_s: float, max_per_min: int) -> bool:
    """Schedule ``child``'s restart after a backoff that doubles with each restart of the last
    minute (``max_per_min`` 0: a flat backoff and ``MAX_ACTOR_RESTARTS_PER_MIN``); False, with
    the reason logged, when it died too often to go on."""
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
        names = ("checkpoint.pt", "checkpoint.prev.pt")
        if any((cfg.run_dir / name).is_file() for name in names):
            extra = ("--resume",)
        else:
            log.warning("%s left no checkpoint; it starts again from scratch", child.name)
    child.restart_at = None
    child.num_restarts += 1
    child.start(extra)
    log.info("%s restarted%s", child.name, " with --resume" if extra else "")


ROLES_FILE = "roles.json"  # in the run directory: the launcher's roles, for ``apexrl status``


def role_states(children: list[Child]) -> list[dict]:
    """Each role's name, PID, restarts in this session and state (``running``, ``restarting``,
    ``exited``, with its exit code, or ``not started``)."""
    states = []
    for c in children:
        code = c.exit_code()
        if c.process is None:
            state = "not started"
        elif c.restart_at is not None:
            state = "restarting"
        else:
            state = "running" if code is None else "exited"
        states.append(
            {
                "name": c.name,
                "pid": None if c.process is None else c.process.pid,
                "restarts": c.num_restarts,
                "state": state,
                "exit_code": code,
            }
        )
    return states


def write_roles(
    run_dir: Path, children: list[Child], written: list[dict] | None = None
) -> list[dict]:
    """Write ``<run dir>/roles.json`` (atomically) when the roles' states differ from ``written``,
    the states it last wrote; returns the states now."""
    states = role_states(children)
    if states != written:
        save_roles(run_dir, states)
    return states


def save_roles(run_dir: Path, states: list[dict]) -> None:
    """Write ``<run dir>/roles.json`` atomically: this process's PID, the host, the time and
    ``states``; a failure is only logged."""
    record = {"launcher_pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}
    path = run_dir / ROLES_FILE
    try:
        lifecycle.write_atomic(path, json.dumps({**record, "roles": states}, indent=1) + "\n")
    except OSError as exc:
        log.warning("could not write %s: %s", path, exc)


def log_restarts(children: list[Child]) -> None:
    counts = [f"{c.name} {c.num_restarts}" for c in children if c.num_restarts]
    if counts:
        log.info("restarts in this session: %s", ", ".join(counts))


def supervise(
    children: list[Child],
    cfg: Config,
    stop,
    ctx: zmq.Context,
    forkserver: ForkServer | None = None,
    result_offset: int = 0,
) -> int:
    """Watch the children until the run ends; returns the launcher's exit status."""
    by_name = {c.name: c for c in children}
    learners = [by_name[name] for name in learner_names(cfg.learner.world_size)]
    servers = [by_name["replay"], by_name["params"]]
    actors = [c for c in children if c.restartable]
    expected_actors = len(actors)
    stats_keys = auth.client_keys(cfg.net, "eval", "replay")
    announced = False
    last_check = time.monotonic()
    roles = None
    while not stop.is_set():
        time.sleep(0.2)
        roles = write_roles(cfg.run_dir, children, roles)
        if run_finished(cfg.run_dir, result_offset):
            # The servers stop on the learner's Shutdown, maybe before the learners have exited:
            # give the learners time to finish their last checkpoint, then the run is complete.
            wait_for_learners(learners)
            log.info("the learner met its stop condition; the run is complete (%s)", cfg.run_dir)
            return 0
        for c in children:
            if c.exit_code() == CONFIG_ERROR_EXIT:
                log.error(
                    "%s exited with status 2: its configuration cannot work; stopping the run. "
                    "Last lines of %s:\n%s",
                    c.name,
                    c.log_path,
                    c.log_tail(),
                )
                return CONFIG_ERROR_EXIT
        # Exit 0 of the learner or a server: a stop was asked for (Shutdown to the servers, a
        # signal to the learner), maybe from another host. The run can be resumed.
        requested = [c.name for c in (learners[0], *servers) if c.exit_code() == 0]
        if requested and not run_finished(cfg.run_dir, result_offset):
            wait_for_learners(learners)
            if run_finished(cfg.run_dir, result_offset):
                continue  # the stop condition after all: reported above
            log.info(
                "the run was stopped on request (%s exited); continue it with "
                "scripts/launch_local.sh --resume --run-dir %s",
                ", ".join(requested),
                cfg.run_dir,
            )
            return 0
        for c in [*servers, *learners]:
            code = None if c.restart_at is not None else c.exit_code()
            if code is None or (code == 0 and c in learners):
                continue  # running, restarting, or a rank that stopped with its group
            if not restartable_role(c, cfg, servers):
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
        if forkserver is not None and any(c.forkserver for c in actors):
            code = forkserver.process.poll()
            if code is not None:
                log.error("the actor fork server exited with code %s; stopping the run", code)
                return 1
        for actor in list(actors):
            code = None if actor.restart_at is not None else actor.exit_code()
            if code is None:
                continue
            if code == 0:  # stopped on request: a signal, or the servers' Shutdown
                log.info("%s stopped", actor.name)
                actors.remove(actor)
                continue
            if not schedule_restart(actor, code, ACTOR_RESTART_BACKOFF_S, 0):
                return 1
        for c in children:
            if c.restart_at is not None and time.monotonic() >= c.restart_at:
                restart(c, cfg)
        if not announced and time.monotonic() - last_check > 1.0:
            last_check = time.monotonic()
            stats = server_stats(ctx, cfg.net.replay_addr, timeout_ms=500, curve=stats_keys)
            if stats and stats.get("replay/active_actors", 0) >= expected_actors:
                announced = True
                log.info("all %d actors are stepping", expected_actors)
    log.info("stop requested")
    return 130


def main(args: argparse.Namespace) -> int:
    if args.learners < 1:
        print("apexrl local: --learners must be at least 1", file=sys.stderr)
        return 2
    if args.actors < 1:
        print("apexrl local: --actors must be at least 1", file=sys.stderr)
        return 2
    if getattr(args, "serial", False) and args.learners != 1:
        print("apexrl local: --serial runs one learner (--learners 1)", file=sys.stderr)
        return 2
    try:
        cfg = resolve_run_config(args)
        check_before_start(cfg)
        check_keys(cfg)
    except ConfigError as exc:
        print(f"apexrl local: config error: {exc}", file=sys.stderr)
        return 2
    except LaunchError as exc:
        print(f"apexrl local: error: {exc}", file=sys.stderr)
        return 2
    stop = lifecycle.install_stop_handlers()
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    if getattr(args, "serial", False):  # every role in a thread of this process
        from apexrl.launch.serial import run_serial

        return run_serial(cfg, args.actors, not args.no_eval, stop)
    keys_dir = Path(cfg.net.keys_dir)
    if cfg.net.keys_dir and not auth.has_keys(keys_dir):
        try:
            auth.make_keys(keys_dir)
        except (FileExistsError, OSError) as exc:
            print(f"apexrl local: error: {exc}", file=sys.stderr)
            return 2
    config_path = cfg.run_dir / "config.yaml"
    config_path.write_text(dump_config(cfg))
    (cfg.run_dir / "logs").mkdir(parents=True, exist_ok=True)
    result_offset = result_size(cfg.run_dir)
    forkserver = None
    if args.actor_start == "fork":
        # First, so that its imports overlap with the servers' start-up.
        forkserver = ForkServer(config_path, cfg.run_dir)
    niceness = ACTOR_NICENESS if args.actor_nice is None else args.actor_nice
    children = build_children(cfg, config_path, args.actors, not args.no_eval, forkserver, niceness)
    by_name = {c.name: c for c in children}
    log.info(
        "%s run directory %s: replay %s, params %s, %d actors",
        "resuming the" if cfg.run.resume else "new",
        cfg.run_dir,
        cfg.net.replay_addr,
        cfg.net.params_addr,
        args.actors,
    )
    ctx = sockets.make_context()
    started = time.monotonic()
    try:
        servers = (("replay", cfg.net.replay_addr), ("params", cfg.net.params_addr))
        # Every role is forked from the fork server once it has imported what they all import
        # (one import instead of one per process on a few cores); without it, each is exec'd.
        if forkserver is not None and not wait_for_forkserver(forkserver, stop):
            if stop.is_set():
                return 130
            for c in children:
                c.forkserver = None
        # The servers and the learners together: a learner's first message waits in ZeroMQ
        # until the server it connects to is bound. The actors wait until both servers answer.
        for c in children:
            if not c.restartable:
                c.start()
        for name, addr in servers:
            deadline = time.monotonic() + READY_TIMEOUT_S
            keys = auth.client_keys(cfg.net, "eval", name)
            while server_stats(ctx, addr, timeout_ms=200, curve=keys) is None:
                code = by_name[name].exit_code()
                if code is not None or time.monotonic() > deadline or stop.is_set():
                    if stop.is_set():
                        return 130
                    log.error(
                        "%s did not come up (exit code %s). Last lines:\n%s",
                        name,
                        code,
                        by_name[name].log_tail(),
                    )
                    return CONFIG_ERROR_EXIT if code == CONFIG_ERROR_EXIT else 1
        for c in children:
            if c.process is None:
                c.start()
        log.info("started %d processes in %.1f s", len(children), time.monotonic() - started)
        return supervise(children, cfg, stop, ctx, forkserver, result_offset)
    finally:
        # The run's plots (PNGs from result.json; a failure only warns) are drawn while the
        # roles stop, in a thread of this process that mostly waits meanwhile.
        from apexrl.tools.plot import plot_after_run

        plotter = threading.Thread(target=plot_after_run, args=(cfg.run_dir,), name="plots")
        plotter.start()
        stop_all(children)
        write_roles(cfg.run_dir, children)
        log_restarts(children)
        if forkserver is not None:
            forkserver.close()
        ctx.term()
        log.info("all processes stopped")
        plotter.join()

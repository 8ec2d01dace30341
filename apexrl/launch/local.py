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
- SIGINT or SIGTERM stops every process: SIGTERM first, then SIGKILL to the ones still alive
  after ``processes.STOP_TIMEOUT_S``. Children also get SIGTERM from the kernel if the launcher
  itself dies (``PR_SET_PDEATHSIG``), so no process outlives it.

Where things live: this module holds the command (``add_arguments``, ``main``) and the start of a
run (its config, the checks before the start, the run directory, the order of starting);
``apexrl.launch.processes`` the children (forked or exec'd, followed, stopped);
``apexrl.launch.supervisor`` the watch over them and the restart policy;
``apexrl.launch.run_state`` what the run directory records (``result.json``'s end of the run,
``roles.json``); ``apexrl.launch.serial`` the ``--serial`` mode; ``apexrl.roles`` the roles and
their command lines.

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
admit only the run's roles. Every role runs on this host, so ``net.keys_dir`` is the whole
directory of ``apexrl keys``, every bundle, and each role reads its own bundle in it. The
launcher itself asks for ``Stats`` with the eval role's key, the least privileged one.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import socket
import sys
import threading
import time
from pathlib import Path

import zmq

from apexrl import roles, tracking
from apexrl.config import Config, ConfigError, dump_config, load_config
from apexrl.launch import placement
from apexrl.launch.forkserver import ForkServer
from apexrl.launch.preflight import LaunchError, check_before_start
from apexrl.launch.processes import Child, build_children, stop_all
from apexrl.launch.run_state import result_size
from apexrl.launch.serial import run_serial
from apexrl.launch.supervisor import log_restarts, supervise, write_roles
from apexrl.runtime import lifecycle, rundir
from apexrl.runtime.cores import allowed_cores
from apexrl.tools.plot import plot_after_run
from apexrl.tools.server_stats import server_stats
from apexrl.transport import auth, sockets

log = logging.getLogger("apexrl.launch.local")

READY_TIMEOUT_S = 60.0  # seconds a server may take to answer its first StatsRequest
CONFIG_ERROR_EXIT = roles.CONFIG_ERROR_EXIT  # a role's configuration cannot work
ACTOR_NICENESS = 0  # added to each actor's niceness by default (--actor-nice)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``local`` subcommand's arguments (``apexrl.cli`` builds the parser)."""
    roles.add_config_flags(parser, config_required=False)
    parser.add_argument("--actors", type=int, default=4, help="number of actor processes")
    parser.add_argument(
        "--external",
        type=int,
        default=0,
        help="policy servers for environments apexrl does not step (apexrl.PolicyClient); "
        "with them --actors may be 0",
    )
    parser.add_argument("--learners", type=int, default=1, help="number of learner processes")
    parser.add_argument("--logdir", default="runs", help="parent of the run directory")
    parser.add_argument("--no-eval", action="store_true", help="do not start the evaluation actor")
    parser.add_argument(
        "--actor-start",
        choices=("fork", "exec"),
        default="fork",
        help="fork actors from a pre-imported fork server (default) or exec each one",
    )
    parser.add_argument("--actor-nice", type=int, help="niceness added to every actor process")
    parser.add_argument(
        "--placement",
        choices=placement.PLACEMENTS,
        default="auto",
        help="split: each learner on learner.torch_threads cores of its own, the other roles on "
        "the rest, the evaluation actor anywhere at its niceness; shared: every role on every "
        f"core; auto (default): {placement.AUTO} where a split fits",
    )
    parser.add_argument(
        "--serial",
        action="store_true",
        help="every role in a thread of this one process (in-process transport, no keys), to "
        "step through a small run in a debugger",
    )
    tracking.add_track_flag(parser)
    parser.add_argument(
        "--no-curve",
        action="store_true",
        help="no CURVE keys: servers admit anyone who reaches their loopback ports",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --run-dir from its checkpoint (with its own config.yaml "
        "unless --config is given)",
    )


_PORTS_GIVEN: set[int] = set()  # this process's free_port answers, never given twice


def free_port() -> int:
    """A loopback port that is free now and that this process has not handed out before (the
    kernel may offer a port again once its probe socket is closed)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _PORTS_GIVEN:
            _PORTS_GIVEN.add(port)
            return port


def check_counts(args: argparse.Namespace) -> str:
    """What is wrong with ``--actors``, ``--learners`` and ``--serial``; "" when nothing."""
    if args.learners < 1:
        return "--learners must be at least 1"
    external = getattr(args, "external", 0)
    if external < 0:
        return "--external must be at least 0"
    if args.actors < 0:
        return "--actors must be at least 0"
    if external and getattr(args, "serial", False):
        return "--serial does not run policy servers (--external)"
    if getattr(args, "serial", False) and args.learners != 1:
        return "--serial runs one learner (--learners 1)"
    return ""


def resolve_run_config(args: argparse.Namespace) -> Config:
    """The run's config: the file (a resumed run's own ``config.yaml`` by default), the user's
    overrides, then what the launcher decides (loopback addresses on free ports, the number of
    actors and learners), the run directory ``<logdir>/<algorithm>-<env>-<time>`` and its CURVE
    keys (``net.keys_dir`` as given, else ``<run dir>/keys``; none with ``--no-curve``)."""
    config_path = args.config
    if args.resume:
        if not args.run_dir:
            raise LaunchError("--resume needs --run-dir, the directory of the run to continue")
        config_path = config_path or str(rundir.config_path(args.run_dir))
    sources = args.actors + getattr(args, "external", 0)  # the processes that send chunks
    overrides = [
        f"actor.num_actors={max(sources, 1)}",
        f"external.num_servers={getattr(args, 'external', 0)}",
        f"net.replay_addr=tcp://127.0.0.1:{free_port()}",
        f"net.params_addr=tcp://127.0.0.1:{free_port()}",
        f"learner.world_size={args.learners}",
        f"run.resume={'true' if args.resume else 'false'}",
    ]
    if args.learners > 1:
        overrides.append(f"learner.rendezvous=tcp://127.0.0.1:{free_port()}")
    cfg = load_config(config_path, overrides + list(args.overrides))
    cfg = tracking.with_trackers(cfg, getattr(args, "track", []))
    if cfg.run.input_dataset:  # the dataset feeder is one more actor, before the policy servers
        actor = dataclasses.replace(cfg.actor, num_actors=sources + 1)
        cfg = dataclasses.replace(cfg, actor=actor)
        cfg.validate()
    elif sources == 0:
        raise LaunchError(
            "--actors must be at least 1, or 0 with --external N or run.input_dataset"
        )
    user_sets_dir = any(o.strip().startswith("run.dir=") for o in args.overrides)
    if args.run_dir:
        run_dir = args.run_dir
    elif user_sets_dir:
        run_dir = cfg.run.dir
    else:
        run_dir = str(Path(args.logdir) / f"{cfg.run_name}-{time.strftime('%Y%m%d-%H%M%S')}")
    keys_dir = "" if args.no_curve else cfg.net.keys_dir or str(rundir.keys_dir(run_dir))
    return dataclasses.replace(
        cfg,
        run=dataclasses.replace(cfg.run, dir=run_dir),
        net=dataclasses.replace(cfg.net, keys_dir=keys_dir),
    )


def check_output_dataset(cfg: Config) -> None:
    """``run.output_dataset`` must be an id Minari takes and no dataset's yet."""
    if cfg.run.output_dataset:
        from apexrl.envs import atari
        from apexrl.external.spaces import ExternalSpaces, SpaceError
        from apexrl.offline.minari_datasets import DatasetError, check_dataset_id

        if atari.is_atari(cfg.env.id):
            raise LaunchError("run.output_dataset does not take Atari envs (stacked frames)")
        try:
            check_dataset_id(cfg.run.output_dataset)
            ExternalSpaces(cfg)
        except (DatasetError, SpaceError) as exc:
            raise LaunchError(f"run.output_dataset: {exc}") from exc


def check_keys(cfg: Config) -> None:
    """Keys that ``net.keys_dir`` names outside the run directory must exist (the launcher makes
    only the run's own ``<run dir>/keys``)."""
    keys_dir = Path(cfg.net.keys_dir)
    own = rundir.keys_dir(cfg.run_dir)
    if cfg.net.keys_dir and keys_dir != own and not auth.has_keys(keys_dir):
        raise LaunchError(
            f"net.keys_dir {keys_dir} does not hold a run's CURVE keys (make them with "
            f"`apexrl keys {keys_dir}`, or leave net.keys_dir empty for keys of this run)"
        )


def core_layout(cfg: Config, choice: str) -> dict[str, tuple[int, ...] | None]:
    """The roles' cores for ``--placement choice`` (``apexrl.launch.placement``), logged."""
    layout = placement.plan(
        choice, allowed_cores(), cfg.learner.world_size, cfg.learner.torch_threads
    )
    learners = [
        f"{name} on {placement.describe_cores(cores)}"
        for name, cores in layout.items()
        if name.startswith("learner")
    ]
    log.info(
        "placement %s: %s",
        choice,
        "every role on every core"
        if not learners
        else f"{', '.join(learners)}; the other roles on "
        f"{placement.describe_cores(layout['others'])}; eval anywhere",
    )
    return layout


def checked_config(args: argparse.Namespace) -> Config | None:
    """The run's config once every check before the start has passed; None, with one line on
    stderr, when one failed."""
    try:
        cfg = resolve_run_config(args)
        check_before_start(cfg)
        check_keys(cfg)
        check_output_dataset(cfg)
        if getattr(args, "serial", False) and (cfg.run.input_dataset or cfg.run.output_dataset):
            raise LaunchError("--serial runs no dataset feeder and writes no dataset")
        placement.plan(  # a split that does not fit is refused before anything starts
            getattr(args, "placement", "auto"),
            allowed_cores(),
            cfg.learner.world_size,
            cfg.learner.torch_threads,
        )
    except ConfigError as exc:
        print(f"apexrl local: config error: {exc}", file=sys.stderr)
        return None
    except (LaunchError, placement.PlacementError) as exc:
        print(f"apexrl local: error: {exc}", file=sys.stderr)
        return None
    return cfg


def make_run_keys(cfg: Config) -> None:
    """The run's CURVE keys in ``net.keys_dir``, unless they are there (or there are none): one
    bundle per kind of host, each actor (and the dataset feeder: an actor id too) its own key,
    bound to its actor id. A run with policy servers keeps the actors' shared key: their clients
    hold the actor key of the server they call, which a client given the run's keys could not
    tell among one per actor."""
    keys_dir = Path(cfg.net.keys_dir)
    if cfg.net.keys_dir and not auth.has_keys(keys_dir):
        own_keys = cfg.external.num_servers == 0
        auth.make_keys(keys_dir, actors=cfg.actor.num_actors if own_keys else 0)


def write_run_config(cfg: Config) -> Path:
    """``config.yaml``, which every role reads, and ``logs/``; the config's path."""
    config_path = rundir.config_path(cfg.run_dir)
    config_path.write_text(dump_config(cfg))
    rundir.logs_dir(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    return config_path


def wait_for_forkserver(forkserver: ForkServer, stop: threading.Event) -> bool:
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


def wait_for_servers(
    children: list[Child], cfg: Config, stop: threading.Event, ctx: zmq.Context
) -> int | None:
    """Wait until both servers answer ``StatsRequest``; the launcher's exit status when one
    did not come up or a stop was asked for meanwhile."""
    by_name = {c.name: c for c in children}
    for name, addr in (("replay", cfg.net.replay_addr), ("params", cfg.net.params_addr)):
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
    return None


def start_children(
    children: list[Child],
    cfg: Config,
    stop: threading.Event,
    ctx: zmq.Context,
    forkserver: ForkServer | None,
) -> int | None:
    """Start the run's children; the launcher's exit status when the run cannot go on."""
    started = time.monotonic()
    # Every role is forked from the fork server once it has imported what they all import
    # (one import instead of one per process on a few cores); without it, each is exec'd.
    if forkserver is not None and not wait_for_forkserver(forkserver, stop):
        if stop.is_set():
            return 130
        for c in children:
            c.forkserver = None
    # The servers and the learners together: a learner's first message waits in ZeroMQ until
    # the server it connects to is bound. The actors wait until both servers answer.
    for c in children:
        if not c.restartable:
            c.start()
    code = wait_for_servers(children, cfg, stop, ctx)
    if code is not None:
        return code
    for c in children:
        if c.process is None:
            c.start()
    log.info("started %d processes in %.1f s", len(children), time.monotonic() - started)
    return None


def end_run(
    children: list[Child], cfg: Config, forkserver: ForkServer | None, ctx: zmq.Context
) -> None:
    """Stop every child (and the fork server), record their last states and draw the plots."""
    # The run's plots (PNGs from result.json; a failure only warns) are drawn while the roles
    # stop, in a thread of this process that mostly waits meanwhile.
    plotter = threading.Thread(target=plot_after_run, args=(cfg.run_dir,), name="plots")
    plotter.start()
    stop_all(children)
    write_roles(cfg.run_dir, children)
    if cfg.run.output_dataset:  # the actors wrote their parts as they stopped
        from apexrl.offline.training_episodes import combine_parts

        combine_parts(cfg)
    log_restarts(children)
    if forkserver is not None:
        forkserver.close()
    ctx.term()
    log.info("all processes stopped")
    plotter.join()


def main(args: argparse.Namespace) -> int:
    """``apexrl local``: check, prepare the run directory, start every role, supervise them
    until the run ends; the exit status (2: a problem found before the start)."""
    problem = check_counts(args)
    if problem:
        print(f"apexrl local: {problem}", file=sys.stderr)
        return 2
    cfg = checked_config(args)
    if cfg is None:
        return 2
    stop = lifecycle.install_stop_handlers()
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    if getattr(args, "serial", False):  # every role in a thread of this process
        return run_serial(cfg, args.actors, not args.no_eval, stop)
    try:
        make_run_keys(cfg)
    except (FileExistsError, OSError) as exc:
        print(f"apexrl local: error: {exc}", file=sys.stderr)
        return 2
    config_path = write_run_config(cfg)
    result_offset = result_size(cfg.run_dir)
    forkserver = None
    if args.actor_start == "fork":
        # First, so that its imports overlap with the servers' start-up.
        forkserver = ForkServer(config_path, cfg.run_dir)
    niceness = ACTOR_NICENESS if args.actor_nice is None else args.actor_nice
    layout = core_layout(cfg, getattr(args, "placement", "auto"))
    external_addrs = tuple(f"tcp://127.0.0.1:{free_port()}" for _ in range(args.external))
    children = build_children(
        cfg,
        config_path,
        args.actors,
        not args.no_eval,
        forkserver,
        niceness,
        layout,
        external_addrs,
    )
    log.info(
        "%s run directory %s: replay %s, params %s, %d actors",
        "resuming the" if cfg.run.resume else "new",
        cfg.run_dir,
        cfg.net.replay_addr,
        cfg.net.params_addr,
        args.actors,
    )
    for i, addr in enumerate(external_addrs):
        log.info("policy server external_%d at %s (apexrl.PolicyClient)", i, addr)
    ctx = sockets.make_context()
    try:
        code = start_children(children, cfg, stop, ctx, forkserver)
        if code is not None:
            return code
        return supervise(children, cfg, stop, ctx, forkserver, result_offset)
    finally:
        end_run(children, cfg, forkserver, ctx)

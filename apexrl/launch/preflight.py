"""Checks before a launch starts any role: what would otherwise fail in every process at once, each
reported as one line (``LaunchError``, exit status 2 from the launcher): the environment (its
id or entry point, kwargs and wrappers, made and reset once) and its action space against the
algorithm, the run's callbacks class (made once), a ``cuda`` device that is missing, addresses
that cannot be bound here, and a run directory that holds another run (or, for ``--resume``, no
checkpoint), and another run's checkpoint named as a fixed player. It imports no torch unless a
``cuda`` device or such a checkpoint is asked for.
"""

from __future__ import annotations

import dataclasses
import errno
import socket

from apexrl import tracking
from apexrl.callbacks import CallbacksError, check_callbacks
from apexrl.config import Config, ConfigError
from apexrl.config.rules import FIXED_CHECKPOINT
from apexrl.envs import EnvError, check_env
from apexrl.multiagent.policies import check_policies
from apexrl.runtime import lifecycle, rundir


class LaunchError(Exception):
    """The run cannot start as asked; the message is the one line the user sees (exit 2)."""


def check_address(name: str, addr: str) -> None:
    """An address this machine's roles will bind must be free and local."""
    if not addr.startswith("tcp://"):
        return  # ipc:// and inproc:// need no port
    host, _, port = addr[len("tcp://") :].rpartition(":")
    host = "0.0.0.0" if host in ("*", "") else host.strip("[]")
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, int(port)))
    except ValueError as exc:
        raise LaunchError(f"{name} {addr!r} is not tcp://HOST:PORT") from exc
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise LaunchError(f"{name} {addr}: port {port} is already in use") from exc
        raise LaunchError(f"{name} {addr}: cannot bind on this machine ({exc.strerror})") from exc


def check_fixed_checkpoints(cfg: Config) -> None:
    """Another run's policies that this one names as fixed players, loaded once (torch is
    imported only for them)."""
    if any(
        name.startswith(FIXED_CHECKPOINT)
        for name in (*(s.fixed for s in cfg.multiagent.policies), *cfg.league.eval_opponents)
    ):
        from apexrl.multiagent.checkpoint_player import check_checkpoint_players

        check_checkpoint_players(cfg)


def check_before_start(cfg: Config) -> None:
    """What can go wrong in every role at once, checked here first: the environment, the
    devices, the ports, the run directory. Raises ``LaunchError`` with one line."""
    try:
        if cfg.multiagent.enabled:
            check_policies(cfg)
            check_fixed_checkpoints(cfg)
        else:
            check_env(cfg)
    except (EnvError, ConfigError) as exc:
        raise LaunchError(str(exc)) from exc
    try:
        check_callbacks(cfg.callbacks)
    except CallbacksError as exc:
        raise LaunchError(str(exc)) from exc
    try:
        tracking.check_installed(cfg.run.trackers)
    except tracking.TrackerMissing as exc:
        raise LaunchError(str(exc)) from exc
    for name, device in (
        ("actor.device", cfg.actor.device),
        ("learner.device", cfg.learner.device),
    ):
        if device.startswith("cuda"):
            try:
                lifecycle.resolve_device(device)
            except lifecycle.StartupError as exc:
                raise LaunchError(f"{name}: {exc}") from exc
    check_address("net.replay_addr", cfg.net.replay_addr)
    check_address("net.params_addr", cfg.net.params_addr)
    if cfg.learner.world_size > 1:
        check_address("learner.rendezvous", cfg.learner.rendezvous)
    checkpoint = rundir.checkpoint_path(cfg.run_dir)
    previous = rundir.previous_checkpoint_path(cfg.run_dir)
    if cfg.run.resume and not (checkpoint.is_file() or previous.is_file()):
        raise LaunchError(f"--resume: {checkpoint} does not exist")
    # A replay snapshot is a run too: a new run there would start with the old run's data.
    held = (checkpoint, previous, rundir.replay_snapshot_dir(cfg.run_dir))
    if not cfg.run.resume and any(path.exists() for path in held):
        raise LaunchError(
            f"{cfg.run_dir} already holds a run; continue it with --resume or choose another "
            "--run-dir"
        )


def check_before_placing(cfg: Config) -> None:
    """``check_before_start`` on the host that places a run on other nodes (a login node, a Ray
    driver): the addresses are the nodes' own, known once the run starts, and the devices are
    the nodes'. Raises ``LaunchError`` with one line."""
    unbound = "tcp://127.0.0.1:0"
    check_before_start(
        dataclasses.replace(
            cfg,
            net=dataclasses.replace(cfg.net, replay_addr=unbound, params_addr=unbound),
            learner=dataclasses.replace(
                cfg.learner, device="cpu", rendezvous=unbound, world_size=1
            ),
            actor=dataclasses.replace(cfg.actor, device="cpu"),
        )
    )

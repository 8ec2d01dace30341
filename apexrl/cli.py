"""Command line: ``apexrl <command> --config FILE [--set section.key=value ...]``.

Role commands (``apexrl.roles``, the table of roles): ``replay``, ``params``, ``learner``,
``actor`` (``--eval``: the evaluation actor), each the ``main`` of its module, logging to
``<run dir>/logs/<role>.log`` as well as to the console however it was started. Address flags are
shorthands for config overrides (``--bind`` of the replay role is ``--set
net.replay_addr=...``), so a role started by hand and one started by the launcher read the same
config.

Run commands (``apexrl.launch``): ``local`` (the launcher that starts every role on this machine;
``scripts/launch_local.sh``), ``slurm`` (a whole run as one SLURM batch job), ``k8s`` (a whole
run's Kubernetes manifests), ``ray`` (a whole run on a Ray cluster, each role a Ray actor) and
``sweep`` (a hyperparameter sweep: many ``local`` runs side by side with a live table,
``apexrl.sweep``). Tools (``apexrl.tools``): ``status``, ``evaluate``,
``plot``, ``stop`` (asks a run's servers to shut down, from any host), ``config show`` (a
resolved config) and ``docs`` (the reference pages in docs/reference/). ``keys`` makes a run's
CURVE keys: one bundle per kind of host, each with only that host's secret keys; with ``--keys``
servers admit only the run's roles, each to what its role may send.

Errors in the config or the environment exit with status 2 and one clear line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from apexrl import roles
from apexrl.config import ConfigError, load_config
from apexrl.runtime import lifecycle, rundir

EPILOG = """examples (every role of one run with the same --config and --run-dir):
  apexrl keys    runs/exp1/keys   (a bundle per kind of host: servers/, learner/, actors/, eval/;
                 give each role --keys with its host's bundle, or the whole directory on a host
                 that runs every role; without keys a server binds a non-loopback address only
                 with --insecure)
  apexrl replay  --config configs/apex_dqn_cartpole.yaml --bind tcp://0.0.0.0:6000 \\
                 --run-dir runs/exp1 --keys runs/exp1/keys/servers
  apexrl params  --config configs/apex_dqn_cartpole.yaml --bind tcp://0.0.0.0:6001 \\
                 --run-dir runs/exp1 --keys runs/exp1/keys/servers
  apexrl learner --config configs/apex_dqn_cartpole.yaml --replay tcp://HOST:6000 \\
                 --params tcp://HOST:6001 --run-dir runs/exp1 --keys runs/exp1/keys/learner \\
                 --set algo.lr=1e-4
  apexrl learner ... --rank 1 --world-size 2 --rendezvous tcp://HOST0:6002   (one of two learners)
  apexrl actor   --config configs/apex_dqn_cartpole.yaml --replay tcp://HOST:6000 \\
                 --params tcp://HOST:6001 --run-dir runs/exp1 --keys runs/exp1/keys/actors \\
                 --id 7 --num-actors 32
  apexrl actor   --config configs/apex_dqn_cartpole.yaml --replay tcp://HOST:6000 \\
                 --params tcp://HOST:6001 --run-dir runs/exp1 --keys runs/exp1/keys/eval --eval
  apexrl stop    --replay tcp://HOST:6000 --params tcp://HOST:6001 \\
                 --keys runs/exp1/keys/learner   (stops the whole run)
  apexrl local   --actors 4 --learners 1 --config configs/apex_dqn_cartpole.yaml
  apexrl local   --serial --actors 2 --config configs/ppo_cartpole.yaml   (one process: debug)
  apexrl local   --actors 4 --learners 1 --resume --run-dir runs/apex_dqn-CartPole-v1-20261130-1200
  apexrl slurm   --actors 32 --learners 2 --nodes 5 --gpus-per-learner 1 --partition gpu \\
                 --time 04:00:00 --config configs/apex_dqn_cartpole.yaml   (--dry-run: print it)
  apexrl k8s     --actors 32 --learners 2 --config configs/apex_dqn_cartpole.yaml \\
                 --image REGISTRY/apexrl:TAG -o run.yaml   (then kubectl apply -f run.yaml)
  apexrl ray     --address auto --actors 32 --learners 1 --gpus-per-learner 1 \\
                 --config configs/apex_dqn_cartpole.yaml   (or: ray job submit -- apexrl ray ...)
  apexrl sweep   configs/sweeps/ppo_cartpole_lr.yaml --max-concurrent 2 --cpus-per-trial 1
"""
STOP_FLAGS = (roles.REPLAY, roles.PARAMS)  # apexrl stop: the servers to ask
KEY_BUNDLE_HOSTS = {  # apexrl keys: who holds each bundle (auth.BUNDLES)
    "servers": "the replay and parameter servers' host",
    "learner": "the learners' hosts (and where you run `apexrl stop`)",
    "actors": "the actors' hosts",
    "eval": "the evaluation actor's host (and where you run `apexrl status`)",
}


def add_stop_and_keys(commands: argparse._SubParsersAction) -> None:
    """``stop`` (a whole run, from any host) and ``keys`` (a run's CURVE keys)."""
    stop = commands.add_parser(
        "stop", help="stop a whole run from any host (Shutdown to both servers)"
    )
    roles.add_config_flags(stop, config_required=False)
    for flag in STOP_FLAGS:
        flag.add_to(stop)
    keys = commands.add_parser(
        "keys", help="make a run's CURVE keys: a bundle per kind of host, each with its secrets"
    )
    keys.add_argument("dir", metavar="DIR", help="directory to write them to (made, mode 0700)")
    grow = keys.add_mutually_exclusive_group()
    grow.add_argument(
        "--actors",
        type=int,
        default=0,
        metavar="N",
        help="give actors 0..N-1 each its own key, bound to its actor id (default: one key "
        "shared by every actor, which can then speak as any other)",
    )
    grow.add_argument(
        "--add-actors",
        type=int,
        default=0,
        metavar="K",
        help="give K more actors their own keys in DIR's run (ids after the highest there); its "
        "servers admit them without a restart",
    )
    grow.add_argument(
        "--revoke-actor",
        type=int,
        metavar="I",
        help="take actor I's own key out of DIR's run: its servers refuse it within a second, "
        "its open connections too",
    )


def add_tool_commands(commands: argparse._SubParsersAction) -> None:
    """``status`` (a live run's roles), ``evaluate``, ``play``, ``plot`` and ``track`` (after a
    run)."""
    from apexrl.tools import evaluate, play, plot, status
    from apexrl.tracking import upload

    status.add_arguments(commands.add_parser("status", help="a live table of a run's roles"))
    evaluate.add_arguments(
        commands.add_parser("evaluate", help="play a run's checkpoint with the greedy policy")
    )
    play.add_arguments(
        commands.add_parser("play", help="play a two-player game's trained policy yourself")
    )
    plot.add_arguments(commands.add_parser("plot", help="PNGs of a run's learning curve"))
    upload.add_arguments(
        commands.add_parser("track", help="send a finished run (or sweep) to W&B or MLflow")
    )
    add_doc_commands(commands)


def add_doc_commands(commands: argparse._SubParsersAction) -> None:
    """``config show`` (a resolved config) and ``docs`` (the reference pages)."""
    from apexrl.tools import config_show, reference

    config_show.add_arguments(commands.add_parser("config", help="show a resolved config"))
    docs = commands.add_parser("docs", help="write docs/reference/ (config keys, commands)")
    reference.add_arguments(docs)
    docs.set_defaults(build_parser=build_parser)  # the pages describe this very parser


def add_cluster_commands(commands: argparse._SubParsersAction) -> None:
    """``slurm``, ``k8s`` and ``ray``: placement on the schedulers users have."""
    from apexrl.launch import k8s, slurm
    from apexrl.launch.ray_cluster import plan as ray_plan

    slurm.add_arguments(
        commands.add_parser("slurm", help="submit a whole run as one SLURM batch job")
    )
    k8s.add_arguments(commands.add_parser("k8s", help="Kubernetes manifests of a whole run"))
    ray_plan.add_arguments(
        commands.add_parser("ray", help="run a whole run on a Ray cluster, each role a Ray actor")
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="apexrl",
        description="Distributed actor-learner reinforcement learning.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="role", required=True, metavar="ROLE")
    roles.add_commands(commands)
    from apexrl.launch import local

    local.add_arguments(commands.add_parser("local", help="start a whole run on this machine"))
    from apexrl.sweep import command as sweep

    sweep.add_arguments(
        commands.add_parser("sweep", help="a hyperparameter sweep: many local runs, a live table")
    )
    add_stop_and_keys(commands)
    add_tool_commands(commands)
    add_cluster_commands(commands)
    return parser


def make_keys(args: argparse.Namespace) -> int:
    """``apexrl keys DIR [--actors N | --add-actors K | --revoke-actor I]``: 0, or 2 with one
    line when DIR already holds keys (or, to add or revoke, holds none)."""
    from apexrl.transport import auth

    keys_dir = Path(args.dir)
    try:
        if args.actors < 0:
            raise ValueError(f"--actors takes a count of at least 1, got {args.actors}")
        if args.revoke_actor is not None:
            revoked = auth.revoke_actor_key(keys_dir, args.revoke_actor)
            print(f"actor {args.revoke_actor}'s key revoked (its bundle set aside as {revoked})")
            return 0
        if args.add_actors:
            added = auth.add_actor_keys(keys_dir, args.add_actors)
        else:
            auth.make_keys(keys_dir, actors=args.actors)
    except (OSError, ValueError, lifecycle.StartupError) as exc:  # StartupError: the allow-list
        print(f"apexrl keys: error: {exc}", file=sys.stderr)
        return 2
    if args.add_actors:
        print(
            f"CURVE keys of actors {added[0]}..{added[-1]} in {keys_dir}, admitted by the run's "
            "servers at their first connection (their ids must be below the servers' "
            "actor.num_actors):"
        )
        for actor_id in added:
            print(f"  {keys_dir / auth.OWN_ACTOR_BUNDLE.format(actor_id)}  actor {actor_id}")
        return 0
    print(f"CURVE keys in {keys_dir}, a bundle per kind of host; give each host only its own:")
    hosts = dict(KEY_BUNDLE_HOSTS)
    if args.actors:
        del hosts[auth.ACTORS_BUNDLE]
        own = {auth.OWN_ACTOR_BUNDLE.format(i): f"actor {i}'s host" for i in range(args.actors)}
        hosts = {**hosts, **own}
    paths = {bundle: str(keys_dir / bundle) for bundle in hosts}
    width = max(map(len, paths.values()))
    for bundle, where in hosts.items():
        print(f"  {paths[bundle]:<{width}}  {where}")
    return 0


def stop_run(args: argparse.Namespace) -> int:
    """``apexrl stop``: Shutdown to the servers that the flags, ``--config`` or the run
    directory's ``config.yaml`` (a launched run's servers) name."""
    from apexrl.tools import stop

    config_path = args.config
    if config_path is None and args.run_dir:
        config_path = rundir.config_path(args.run_dir)
    try:
        cfg = load_config(config_path, roles.overrides(args, STOP_FLAGS))
    except ConfigError as exc:
        print(f"apexrl stop: config error: {exc}", file=sys.stderr)
        return 2
    lifecycle.setup_logging("stop")
    try:
        return stop.stop_run(cfg)
    except lifecycle.StartupError as exc:
        print(f"apexrl stop: error: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.role in roles.COMMANDS:
        return roles.run(args)
    if args.role == "keys":
        return make_keys(args)
    if args.role == "stop":
        return stop_run(args)
    if args.role == "local":
        from apexrl.launch import local

        lifecycle.setup_logging("local")
        return local.main(args)
    if args.role == "ray":
        from apexrl.launch.ray_cluster import driver

        lifecycle.setup_logging("ray")
        return driver.main(args)
    from apexrl.launch import k8s, slurm
    from apexrl.sweep import command as sweep
    from apexrl.tools import config_show, evaluate, play, plot, reference, status
    from apexrl.tracking import upload

    commands = {
        "config": config_show,
        "docs": reference,
        "slurm": slurm,
        "k8s": k8s,
        "sweep": sweep,
        "status": status,
        "evaluate": evaluate,
        "play": play,
        "plot": plot,
        "track": upload,
    }
    return commands[args.role].main(args)

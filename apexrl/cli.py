"""Command line: ``apexrl <role> --config FILE [--set section.key=value ...]``.

Roles: ``replay``, ``params``, ``learner``, ``actor`` (each the ``main`` of its module),
``local`` (the launcher that starts all of them on this machine; ``scripts/launch_local.sh``),
``slurm`` (a whole run as one SLURM batch job), ``k8s`` (a whole run's Kubernetes manifests),
``stop`` (asks a run's servers to shut down, from any host) and ``keys`` (makes a run's CURVE
keys: with ``--keys DIR`` servers admit only the run's roles, each to what its role may send).
Every role logs to ``<run dir>/logs/<role>.log`` as well as to the console, however it was
started.
Address flags are shorthands for config overrides (``--bind`` of the replay role is
``--set net.replay_addr=...``), so a role started by hand and one started by the launcher read the
same config. Errors in the config or the environment exit with status 2 and one clear line.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from apexrl.config import ConfigError, add_overrides_argument, load_config

EPILOG = """examples (every role of one run with the same --config and --run-dir):
  apexrl keys    runs/exp1/keys   (then give every role --keys runs/exp1/keys; without keys a
                 server binds a non-loopback address only with --insecure)
  apexrl replay  --config configs/apex_dqn_cartpole.yaml --bind tcp://0.0.0.0:6000 \\
                 --run-dir runs/exp1 --keys runs/exp1/keys
  apexrl params  --config configs/apex_dqn_cartpole.yaml --bind tcp://0.0.0.0:6001 \\
                 --run-dir runs/exp1 --keys runs/exp1/keys
  apexrl learner --config configs/apex_dqn_cartpole.yaml --replay tcp://HOST:6000 \\
                 --params tcp://HOST:6001 --run-dir runs/exp1 --set algo.lr=1e-4
  apexrl learner ... --rank 1 --world-size 2 --rendezvous tcp://HOST0:6002   (one of two learners)
  apexrl actor   --config configs/apex_dqn_cartpole.yaml --replay tcp://HOST:6000 \\
                 --params tcp://HOST:6001 --run-dir runs/exp1 --id 7 --num-actors 32
  apexrl actor   --config configs/apex_dqn_cartpole.yaml --replay tcp://HOST:6000 \\
                 --params tcp://HOST:6001 --run-dir runs/exp1 --eval
  apexrl stop    --replay tcp://HOST:6000 --params tcp://HOST:6001   (stops the whole run)
  apexrl local   --actors 4 --learners 1 --config configs/apex_dqn_cartpole.yaml
  apexrl local   --serial --actors 2 --config configs/ppo_cartpole.yaml   (one process: debug)
  apexrl local   --actors 4 --learners 1 --resume --run-dir runs/apex_dqn-CartPole-v1-20261130-1200
  apexrl slurm   --actors 32 --learners 2 --nodes 5 --gpus-per-learner 1 --partition gpu \\
                 --time 04:00:00 --config configs/apex_dqn_cartpole.yaml   (--dry-run: print it)
  apexrl k8s     --actors 32 --learners 2 --config configs/apex_dqn_cartpole.yaml \\
                 --image REGISTRY/apexrl:TAG -o run.yaml   (then kubectl apply -f run.yaml)
"""


def _common(parser: argparse.ArgumentParser, config_required: bool = True) -> None:
    parser.add_argument("--config", required=config_required, help="YAML config file")
    add_overrides_argument(parser)
    parser.add_argument("--run-dir", help="run directory (config run.dir)")
    parser.add_argument(
        "--keys", metavar="DIR", help="the run's CURVE keys from `apexrl keys DIR` (net.keys_dir)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="apexrl",
        description="Distributed actor-learner reinforcement learning.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    roles = parser.add_subparsers(dest="role", required=True, metavar="ROLE")

    for name, text, port in (
        ("replay", "replay server (binds net.replay_addr)", 6000),
        ("params", "parameter server (binds net.params_addr)", 6001),
    ):
        server = roles.add_parser(name, help=text)
        _common(server)
        server.add_argument("--bind", help=f"address to bind, e.g. tcp://0.0.0.0:{port}")
        server.add_argument(
            "--insecure",
            action="store_true",
            help="bind a non-loopback address without keys: anyone who reaches it may control "
            "the run (net.insecure)",
        )

    for name, text in (
        ("learner", "learner (connects to replay and params)"),
        ("actor", "actor (connects to replay and params)"),
    ):
        role = roles.add_parser(name, help=text)
        _common(role)
        role.add_argument("--replay", help="replay server address, e.g. tcp://HOST:6000")
        role.add_argument("--params", help="parameter server address, e.g. tcp://HOST:6001")
        role.add_argument(
            "--resume",
            action="store_true",
            help=(
                "continue from the run directory's checkpoint"
                if name == "learner"
                else "the run resumes from a checkpoint: wait for the learner's weights"
            ),
        )
        if name == "learner":
            role.add_argument("--rank", type=int, default=0, help="this learner's rank in 0..W-1")
            role.add_argument(
                "--world-size", type=int, help="W, the number of learners (learner.world_size)"
            )
            role.add_argument(
                "--rendezvous",
                help="tcp://HOST:PORT where rank 0 hosts the learner group (learner.rendezvous)",
            )
        else:
            role.add_argument("--id", type=int, default=0, help="actor index i in 0..N-1")
            role.add_argument(
                "--num-actors",
                type=int,
                help="N, the number of actors in the run (config actor.num_actors)",
            )
            role.add_argument(
                "--eval",
                action="store_true",
                help="evaluation actor: plays the greedy policy, sends no data",
            )

    local = roles.add_parser("local", help="start a whole run on this machine")
    _common(local, config_required=False)
    local.add_argument("--actors", type=int, default=4, help="number of actor processes")
    local.add_argument("--learners", type=int, default=1, help="number of learner processes")
    local.add_argument("--logdir", default="runs", help="parent of the run directory")
    local.add_argument("--no-eval", action="store_true", help="do not start the evaluation actor")
    local.add_argument(
        "--actor-start",
        choices=("fork", "exec"),
        default="fork",
        help="fork actors from a pre-imported fork server (default) or exec each one",
    )
    local.add_argument("--actor-nice", type=int, help="niceness added to every actor process")
    local.add_argument(
        "--serial",
        action="store_true",
        help="every role in a thread of this one process (in-process transport, no keys), to "
        "step through a small run in a debugger",
    )
    local.add_argument(
        "--no-curve",
        action="store_true",
        help="no CURVE keys: servers admit anyone who reaches their loopback ports",
    )
    local.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --run-dir from its checkpoint (with its own config.yaml "
        "unless --config is given)",
    )

    stop = roles.add_parser(
        "stop", help="stop a whole run from any host (Shutdown to both servers)"
    )
    _common(stop, config_required=False)
    stop.add_argument("--replay", help="replay server address, e.g. tcp://HOST:6000")
    stop.add_argument("--params", help="parameter server address, e.g. tcp://HOST:6001")

    keys = roles.add_parser(
        "keys",
        help="make a run's CURVE keys: a key pair per role and the servers' allow-list",
    )
    keys.add_argument("dir", metavar="DIR", help="directory to write them to (made, mode 0700)")

    # A live run's roles at a glance.
    from apexrl.tools import status

    status.add_arguments(roles.add_parser("status", help="a live table of a run's roles"))

    # After a run: play its checkpoint, plot its result.json.
    from apexrl.tools import evaluate as rollout
    from apexrl.tools import plot

    rollout.add_arguments(
        roles.add_parser("evaluate", help="play a run's checkpoint with the greedy policy")
    )
    plot.add_arguments(roles.add_parser("plot", help="PNGs of a run's learning curve"))

    # Placement on the schedulers users have.
    from apexrl.launch import k8s, slurm

    slurm.add_arguments(roles.add_parser("slurm", help="submit a whole run as one SLURM batch job"))
    k8s.add_arguments(roles.add_parser("k8s", help="Kubernetes manifests of a whole run"))
    return parser


def role_overrides(args: argparse.Namespace) -> list[str]:
    """The config overrides that the address and count flags stand for."""
    overrides = list(args.overrides)
    if getattr(args, "run_dir", None):
        overrides.append(f"run.dir={args.run_dir}")
    if getattr(args, "keys", None):
        overrides.append(f"net.keys_dir={args.keys}")
    if getattr(args, "insecure", False):
        overrides.append("net.insecure=true")
    if args.role == "replay" and args.bind:
        overrides.append(f"net.replay_addr={args.bind}")
    if args.role == "params" and args.bind:
        overrides.append(f"net.params_addr={args.bind}")
    if args.role in ("learner", "actor", "stop"):
        if args.replay:
            overrides.append(f"net.replay_addr={args.replay}")
        if args.params:
            overrides.append(f"net.params_addr={args.params}")
    if args.role in ("learner", "actor") and args.resume:
        overrides.append("run.resume=true")
    if args.role == "learner":
        if args.world_size is not None:
            overrides.append(f"learner.world_size={args.world_size}")
        if args.rendezvous:
            overrides.append(f"learner.rendezvous={args.rendezvous}")
    if args.role == "actor" and args.num_actors is not None:
        overrides.append(f"actor.num_actors={args.num_actors}")
    return overrides


def log_name(args: argparse.Namespace, world_size: int) -> str:
    """The role's name in logs and file names: ``actor_7``, ``eval``, ``learner_1``, ..."""
    if args.role == "actor":
        return "eval" if args.eval else f"actor_{args.id}"
    if args.role == "learner" and world_size > 1:
        return f"learner_{args.rank}"
    return args.role


def make_keys(keys_dir: str) -> int:
    """``apexrl keys DIR``: 0, or 2 with one line when DIR already holds keys."""
    from apexrl.transport import auth

    try:
        auth.make_keys(Path(keys_dir))
    except (FileExistsError, OSError) as exc:
        print(f"apexrl keys: error: {exc}", file=sys.stderr)
        return 2
    print(f"CURVE keys of the roles {', '.join(auth.ROLES)} and {auth.ALLOW_LIST} in {keys_dir}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from apexrl import lifecycle

    if args.role == "keys":
        return make_keys(args.dir)
    if args.role == "status":
        from apexrl.tools import status

        return status.main(args)
    if args.role in ("evaluate", "plot"):
        from apexrl.tools import evaluate as rollout
        from apexrl.tools import plot

        return (rollout if args.role == "evaluate" else plot).main(args)
    if args.role in ("slurm", "k8s"):
        from apexrl.launch import k8s, slurm

        return (slurm if args.role == "slurm" else k8s).main(args)
    if args.role == "local":
        from apexrl.launch import local as launcher

        lifecycle.setup_logging("local")
        return launcher.main(args)
    config_path = args.config
    if config_path is None and args.role == "stop" and args.run_dir:
        config_path = f"{args.run_dir}/config.yaml"  # a launched run: its servers' addresses
    try:
        cfg = load_config(config_path, role_overrides(args))
    except ConfigError as exc:
        print(f"apexrl {args.role}: config error: {exc}", file=sys.stderr)
        return 2
    name = log_name(args, cfg.learner.world_size)
    if args.role == "stop":
        from apexrl.tools import stop as control

        lifecycle.setup_logging(name)
        try:
            return control.stop_run(cfg)
        except lifecycle.StartupError as exc:
            print(f"apexrl stop: error: {exc}", file=sys.stderr)
            return 2
    lifecycle.setup_logging(name)
    lifecycle.log_to_file(cfg.run_dir / "logs" / f"{name}.log")
    from apexrl.envs import EnvError

    try:
        if args.role == "replay":
            from apexrl import replay_server

            return replay_server.main(cfg)
        if args.role == "params":
            from apexrl import param_server

            return param_server.main(cfg)
        if args.role == "learner":
            from apexrl import learner

            return learner.main(cfg, rank=args.rank)
        if args.eval:
            from apexrl import evaluation

            return evaluation.main(cfg)
        from apexrl import actor

        return actor.main(cfg, actor_id=args.id)
    except (EnvError, FileNotFoundError, lifecycle.StartupError) as exc:
        logging.getLogger("apexrl").error("%s", exc)
        print(f"apexrl {args.role}: error: {exc}", file=sys.stderr)
        return 2
    except Exception:
        # Into the role's log file too, not only the terminal that may be gone.
        logging.getLogger("apexrl").exception("%s crashed", name)
        return 1

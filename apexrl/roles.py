"""The process roles of a run, one table: ``replay``, ``params``, ``learner``, ``actor``, ``eval``.

Each row of ``ROLES`` says how the role is started (``apexrl <command> ...``: its flags and the
config override each flag stands for), how its processes are named in logs and file names
(``learner`` or ``learner_<rank>``, ``actor_<id>``, ``eval``) and which ``main`` runs it.
Everything that starts roles reads this table:

- the command line (``apexrl.cli``) adds one subcommand per role command (``add_commands``) and
  runs a parsed one with ``run``;
- the fork server (``apexrl.launch.forkserver``) runs a forked role's command line with ``main``;
- the local launcher and serial mode (``apexrl.launch``) take a run's processes, in start order,
  from ``processes``; serial mode calls each role's ``main`` in a thread.

The evaluation actor is started as ``apexrl actor --eval``: the ``eval`` row shares the
``actor`` command and its flags. Role modules are imported when a role runs, so that reading the
table (the CLI's ``--help``, ``apexrl status``) imports no torch.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from apexrl.config import Config, ConfigError, add_overrides_argument, load_config
from apexrl.runtime import lifecycle, rundir

log = logging.getLogger("apexrl")

CONFIG_ERROR_EXIT = 2  # a role's configuration or environment cannot work: never restarted


@dataclass(frozen=True)
class Flag:
    """One command-line flag of a role and the config override it stands for (``{}``: its
    value; an override without ``{}`` is added when a ``store_true`` flag is given)."""

    flag: str  # "--bind"
    help: str
    override: str = ""  # "net.replay_addr={}"; "": the flag sets no config value
    options: dict[str, Any] = field(default_factory=dict)  # add_argument's type, default, ...

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(self.flag, help=self.help, **self.options)

    def override_of(self, args: argparse.Namespace) -> str | None:
        value = getattr(args, self.dest, None)
        if not self.override or value is None or value is False:
            return None
        return self.override.format(value)


SWITCH = {"action": "store_true"}
RUN_DIR = Flag("--run-dir", "run directory (config run.dir)", "run.dir={}")
KEYS = Flag(
    "--keys",
    "the run's CURVE keys from `apexrl keys DIR` (net.keys_dir)",
    "net.keys_dir={}",
    {"metavar": "DIR"},
)
REPLAY = Flag("--replay", "replay server address, e.g. tcp://HOST:6000", "net.replay_addr={}")
PARAMS = Flag("--params", "parameter server address, e.g. tcp://HOST:6001", "net.params_addr={}")
INSECURE = Flag(
    "--insecure",
    "bind a non-loopback address without keys: anyone who reaches it may control the run "
    "(net.insecure)",
    "net.insecure=true",
    SWITCH,
)
RESUME_LEARNER = Flag(
    "--resume", "continue from the run directory's checkpoint", "run.resume=true", SWITCH
)
RESUME_ACTOR = Flag(
    "--resume",
    "the run resumes from a checkpoint: wait for the learner's weights",
    "run.resume=true",
    SWITCH,
)
LEARNER_FLAGS = (
    Flag("--rank", "this learner's rank in 0..W-1", options={"type": int, "default": 0}),
    Flag(
        "--world-size",
        "W, the number of learners (learner.world_size)",
        "learner.world_size={}",
        {"type": int},
    ),
    Flag(
        "--rendezvous",
        "tcp://HOST:PORT where rank 0 hosts the learner group (learner.rendezvous)",
        "learner.rendezvous={}",
    ),
)
ACTOR_FLAGS = (
    Flag("--id", "actor index i in 0..N-1", options={"type": int, "default": 0}),
    Flag(
        "--num-actors",
        "N, the number of actors in the run (config actor.num_actors)",
        "actor.num_actors={}",
        {"type": int},
    ),
    Flag("--eval", "evaluation actor: plays the greedy policy, sends no data", options=SWITCH),
)


EXTERNAL_FLAGS = (
    Flag("--id", "policy server index i in 0..S-1", options={"type": int, "default": 0}),
    Flag(
        "--num-servers",
        "S, the number of policy servers in the run (config external.num_servers)",
        "external.num_servers={}",
        {"type": int},
    ),
    Flag(
        "--num-actors",
        "N, the actors and policy servers of the run (config actor.num_actors)",
        "actor.num_actors={}",
        {"type": int},
    ),
    Flag("--bind", "address to bind, e.g. tcp://0.0.0.0:6100", "external.addr={}"),
    INSECURE,
)


def server_flags(role: str, port: int) -> tuple[Flag, ...]:
    bind = Flag("--bind", f"address to bind, e.g. tcp://0.0.0.0:{port}", f"net.{role}_addr={{}}")
    return (bind, INSECURE)


# --- the roles' mains (imported when a role runs) ---------------------------------------------


def _replay(cfg: Config, index: int) -> int:
    from apexrl import replay_server

    return replay_server.main(cfg)


def _params(cfg: Config, index: int) -> int:
    from apexrl import param_server

    return param_server.main(cfg)


def _learner(cfg: Config, rank: int) -> int:
    from apexrl import learner

    return learner.main(cfg, rank=rank)


def _actor(cfg: Config, actor_id: int) -> int:
    if cfg.multiagent.enabled:  # PettingZoo envs, several policies
        from apexrl.multiagent import actor as multiagent_actor

        return multiagent_actor.main(cfg, actor_id=actor_id)
    from apexrl import actor

    return actor.main(cfg, actor_id=actor_id)


def _external(cfg: Config, index: int) -> int:
    from apexrl.external import server

    return server.main(cfg, index)


def _dataset(cfg: Config, index: int) -> int:
    from apexrl.offline import feeder

    return feeder.main(cfg, index)


def _eval(cfg: Config, index: int) -> int:
    if cfg.multiagent.enabled:
        from apexrl.multiagent import evaluation as multiagent_evaluation

        return multiagent_evaluation.main(cfg)
    from apexrl import evaluation

    return evaluation.main(cfg)


# --- the table -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Role:
    """One role: how it is started, named and run."""

    name: str  # replay, params, learner, actor, eval
    command: tuple[str, ...]  # `apexrl <command>`: ("actor", "--eval") for the evaluation actor
    help: str  # the subcommand's help line
    group: str  # "server", "learner" or "actor": how a launcher treats its processes
    flags: tuple[Flag, ...]  # besides --config, --set, --run-dir and --keys
    main: Callable[[Config, int], int]  # runs it; the int is its index (rank, actor id)
    index_flag: str = ""  # the flag that gives a process its index: --rank, --id
    numbered: str = "never"  # "always" (actor_3), "in a group" (learner_1 of W > 1), "never"

    def process_name(self, index: int = 0, world_size: int = 1) -> str:
        """The name of one of its processes in logs and file names."""
        if self.numbered == "always" or (self.numbered == "in a group" and world_size > 1):
            return f"{self.name}_{index}"
        return self.name


ROLES: dict[str, Role] = {
    role.name: role
    for role in (
        Role(
            "replay",
            ("replay",),
            "replay server (binds net.replay_addr)",
            "server",
            server_flags("replay", 6000),
            _replay,
        ),
        Role(
            "params",
            ("params",),
            "parameter server (binds net.params_addr)",
            "server",
            server_flags("params", 6001),
            _params,
        ),
        Role(
            "learner",
            ("learner",),
            "learner (connects to replay and params)",
            "learner",
            (REPLAY, PARAMS, RESUME_LEARNER, *LEARNER_FLAGS),
            _learner,
            index_flag="--rank",
            numbered="in a group",
        ),
        Role(
            "actor",
            ("actor",),
            "actor (connects to replay and params)",
            "actor",
            (REPLAY, PARAMS, RESUME_ACTOR, *ACTOR_FLAGS),
            _actor,
            index_flag="--id",
            numbered="always",
        ),
        Role(
            "external",
            ("external",),
            "policy server of external envs (binds external.addr; apexrl.PolicyClient)",
            "actor",
            (REPLAY, PARAMS, RESUME_ACTOR, *EXTERNAL_FLAGS),
            _external,
            index_flag="--id",
            numbered="always",
        ),
        Role(
            "dataset",
            ("dataset",),
            "dataset feeder of an offline run: run.input_dataset to replay, as an actor",
            "actor",
            (REPLAY, PARAMS, RESUME_ACTOR, ACTOR_FLAGS[1]),
            _dataset,
        ),
        Role(
            "eval",
            ("actor", "--eval"),
            "evaluation actor (apexrl actor --eval)",
            "actor",
            (REPLAY, PARAMS, RESUME_ACTOR, *ACTOR_FLAGS),
            _eval,
        ),
    )
}
# the subcommands; eval is actor --eval
COMMANDS = ("replay", "params", "learner", "actor", "external", "dataset")


# --- a run's processes -------------------------------------------------------------------------


@dataclass(frozen=True)
class Process:
    """One process of a run: its role, its index (learner rank, actor id) and its name."""

    role: Role
    index: int
    name: str

    @property
    def args(self) -> list[str]:
        """``apexrl`` arguments that start it (without the config's): ``actor --id 3``."""
        index = [self.role.index_flag, str(self.index)] if self.role.index_flag else []
        return [*self.role.command, *index]


def processes(
    world_size: int, num_actors: int, evaluate: bool, num_external: int = 0, dataset: bool = False
) -> list[Process]:
    """A run's processes in start order: replay, params, the learners by rank, the actors by id,
    the dataset feeder, the policy servers by index, the evaluation actor."""

    def process(name: str, index: int = 0) -> Process:
        role = ROLES[name]
        return Process(role, index, role.process_name(index, world_size))

    run = [process("replay"), process("params")]
    run += [process("learner", rank) for rank in range(world_size)]
    run += [process("actor", i) for i in range(num_actors)]
    run += [process("dataset")] if dataset else []
    run += [process("external", i) for i in range(num_external)]
    return run + ([process("eval")] if evaluate else [])


# --- the command line ----------------------------------------------------------------------------


def add_config_flags(parser: argparse.ArgumentParser, config_required: bool = True) -> None:
    """``--config``, ``--set``, ``--run-dir`` and ``--keys``: every command that reads a run's
    config."""
    parser.add_argument("--config", required=config_required, help="YAML config file")
    add_overrides_argument(parser)
    RUN_DIR.add_to(parser)
    KEYS.add_to(parser)


def add_commands(commands: argparse._SubParsersAction) -> None:
    """One subcommand per role command: ``replay``, ``params``, ``learner``, ``actor``."""
    for command in COMMANDS:
        role = ROLES[command]
        parser = commands.add_parser(command, help=role.help)
        add_config_flags(parser)
        for flag in role.flags:
            flag.add_to(parser)


def overrides(args: argparse.Namespace, flags: tuple[Flag, ...]) -> list[str]:
    """The user's ``--set`` overrides, then those that the run directory, keys and ``flags``
    stand for."""
    found = (flag.override_of(args) for flag in (RUN_DIR, KEYS, *flags))
    return [*args.overrides, *(override for override in found if override is not None)]


def role_of(args: argparse.Namespace) -> Role:
    """The role a parsed role command starts (``actor --eval``: ``eval``)."""
    return ROLES["eval" if args.role == "actor" and args.eval else args.role]


def index_of(role: Role, args: argparse.Namespace) -> int:
    return getattr(args, role.index_flag.removeprefix("--")) if role.index_flag else 0


def role_overrides(args: argparse.Namespace) -> list[str]:
    """The config overrides of a parsed role command: ``--set``, then its flags'."""
    return overrides(args, role_of(args).flags)


def log_name(args: argparse.Namespace, world_size: int) -> str:
    """The name a parsed role command's process logs under: ``actor_7``, ``eval``,
    ``learner_1``, ..."""
    role = role_of(args)
    return role.process_name(index_of(role, args), world_size)


def is_startup_error(exc: BaseException) -> bool:
    """Whether a role failed to start as configured (exit status 2): a missing env, file or
    device, an actor id outside the run, a config that only the role's start finds wrong (a
    scripted player that cannot be loaded, a league's opponent in a game that is not two
    players')."""
    from apexrl.envs import EnvError

    return isinstance(exc, (EnvError, FileNotFoundError, lifecycle.StartupError, ConfigError))


def run(args: argparse.Namespace) -> int:
    """Run the role of a parsed ``apexrl <role>`` command in this process: its config, its log
    (``<run dir>/logs/<name>.log`` and the console), its ``main``; the exit status (2: a config
    or start-up error, 1: it crashed)."""
    try:
        cfg = load_config(args.config, role_overrides(args))
    except ConfigError as exc:
        print(f"apexrl {args.role}: config error: {exc}", file=sys.stderr)
        return CONFIG_ERROR_EXIT
    name = log_name(args, cfg.learner.world_size)
    lifecycle.setup_logging(name)
    lifecycle.log_to_file(rundir.log_path(cfg.run_dir, name))
    role = role_of(args)
    try:
        return role.main(cfg, index_of(role, args))
    except Exception as exc:
        if is_startup_error(exc):
            log.error("%s", exc)
            print(f"apexrl {args.role}: error: {exc}", file=sys.stderr)
            return CONFIG_ERROR_EXIT
        # Into the role's log file too, not only the terminal that may be gone.
        log.exception("%s crashed", name)
        return 1


def main(argv: list[str]) -> int:
    """``apexrl <role> ...`` for a role command only (what the fork server runs in a child)."""
    parser = argparse.ArgumentParser(prog="apexrl")
    add_commands(parser.add_subparsers(dest="role", required=True, metavar="ROLE"))
    return run(parser.parse_args(argv))

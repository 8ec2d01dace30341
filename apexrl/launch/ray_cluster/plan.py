"""The plan of a run on a Ray cluster: ``apexrl ray``'s flags, the placement groups and each
role's command line and resources. Pure: nothing here imports Ray or starts anything.

Placement groups (one Ray bundle per role process):

- ``head``: the replay and parameter servers, and the learners without GPUs, packed on the head
  node (``STRICT_PACK`` there): the servers bind the head's address, which every node reaches;
- ``learners``: learners with ``--gpus-per-learner G``, packed where the GPUs are (``PACK``);
- ``actors``: the actors, the evaluation actor and a dataset feeder, spread over the nodes
  (``SPREAD``), each with ``--cpus-per-actor`` CPUs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from apexrl import roles
from apexrl.config import Config
from apexrl.launch import placed_runs
from apexrl.runtime import rundir
from apexrl.transport import auth

DEFAULT_MAX_ACTOR_RESTARTS = 5
HEAD, LEARNERS, ACTORS = "head", "learners", "actors"
STRATEGIES = {HEAD: "STRICT_PACK", LEARNERS: "PACK", ACTORS: "SPREAD"}
WHERE = {HEAD: "on the head node", LEARNERS: "where the GPUs are", ACTORS: "over the nodes"}
# Addresses in the plan's config stand for the servers' real ones, which the runners on the head
# find when the run starts (a free port on the head node's address) and write into config.yaml.
UNBOUND = "tcp://127.0.0.1:0"


class RayPlanError(Exception):
    """The run cannot be placed as asked; the one line the user sees (exit 2)."""


@dataclass(frozen=True)
class RoleSpec:
    """One role process: its name, where it goes and what it runs."""

    name: str  # replay, params, learner or learner_<rank>, actor_<i>, dataset, eval
    group: str  # its placement group: HEAD, LEARNERS or ACTORS
    bundle: int  # its bundle's index in that group
    resources: dict[str, float]  # its bundle (and its runner's request): {"CPU": 1.0, "GPU": 1.0}
    args: tuple[str, ...]  # apexrl <args>: the role's own command line
    restartable: bool  # an actor: restarted whatever its exit (``Child.restartable``)


@dataclass(frozen=True)
class RayPlan:
    """Everything ``apexrl ray`` starts, decided before it connects to the cluster."""

    cfg: Config
    address: str
    config_path: Path
    keys_dir: Path
    roles: tuple[RoleSpec, ...]
    max_actor_restarts: int
    num_actors: int
    evaluate: bool

    def bundles(self, group: str) -> list[dict[str, float]]:
        """The group's bundles in index order."""
        return [spec.resources for spec in self.roles if spec.group == group]

    @property
    def groups(self) -> list[str]:
        """The placement groups the run needs, in start order."""
        return [group for group in STRATEGIES if self.bundles(group)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``ray`` subcommand's arguments (``apexrl.cli`` builds the parser)."""
    parser.description = (
        "Run a whole run on a Ray cluster: each role a named Ray actor that runs the role's own "
        "command in a placement group (servers and learners on the head node, actors spread over "
        "the nodes), supervised like a local run. Also as `ray job submit -- apexrl ray ...`. "
        "The run directory must be on a filesystem every node shares."
    )
    parser.add_argument(
        "--address",
        default="auto",
        help="the Ray cluster: auto (the one this host belongs to, or the job's) or HOST:PORT",
    )
    placed_runs.add_config_and_role_flags(parser)
    parser.add_argument(
        "--gpus-per-learner",
        type=int,
        default=0,
        help="GPUs of each learner (default 0); learners with GPUs go where the GPUs are, and a "
        "learner.device of cpu becomes cuda",
    )
    parser.add_argument(
        "--cpus-per-actor", type=float, default=1.0, help="CPUs Ray reserves for each actor (1)"
    )
    parser.add_argument(
        "--cpus-per-learner", type=float, default=1.0, help="CPUs Ray reserves for each learner (1)"
    )
    parser.add_argument(
        "--max-actor-restarts",
        type=int,
        default=DEFAULT_MAX_ACTOR_RESTARTS,
        help=f"restarts of one actor before the run ends (default {DEFAULT_MAX_ACTOR_RESTARTS})",
    )
    placed_runs.add_run_flags(parser, "after a stop or a lost cluster")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the placement groups and each role's command; connect to nothing",
    )


def check_counts(args: argparse.Namespace) -> None:
    placed_runs.check_at_least(
        (
            ("--actors", args.actors, 1),
            ("--learners", args.learners, 1),
            ("--gpus-per-learner", args.gpus_per_learner, 0),
            ("--max-actor-restarts", args.max_actor_restarts, 0),
        ),
        RayPlanError,
    )
    for flag, value in (
        ("--cpus-per-actor", args.cpus_per_actor),
        ("--cpus-per-learner", args.cpus_per_learner),
    ):
        if not value > 0:
            raise RayPlanError(f"{flag} must be more than 0, got {value}")
    if not args.address or any(c.isspace() for c in args.address):
        raise RayPlanError(f"--address {args.address!r} must be auto or HOST:PORT")


def plan_config(args: argparse.Namespace) -> Config:
    """The run's config: the file (a resumed run's own by default), what the command decides
    (actors, learners, resume; addresses to be found when the run starts), the user's
    overrides, the absolute run and keys directories."""
    overrides = [
        f"actor.num_actors={args.actors}",
        f"learner.world_size={args.learners}",
        f"run.resume={'true' if args.resume else 'false'}",
        f"net.replay_addr={UNBOUND}",
        f"net.params_addr={UNBOUND}",
        *(["learner.rendezvous=" + UNBOUND] if args.learners > 1 else []),
    ]
    cfg, _, _ = placed_runs.run_config(args, overrides, RayPlanError)
    if cfg.run.input_dataset:  # the dataset feeder is one more actor
        cfg = dataclasses.replace(
            cfg, actor=dataclasses.replace(cfg.actor, num_actors=args.actors + 1)
        )
        cfg.validate()
    return cfg


def role_specs(cfg: Config, args: argparse.Namespace, config_path: Path) -> tuple[RoleSpec, ...]:
    """Each role process of ``roles.processes`` with its group, bundle, resources and command
    line (the run's config and its host's bundle of the run's keys)."""
    keys_dir = Path(cfg.net.keys_dir)
    learner_group = LEARNERS if args.gpus_per_learner else HEAD
    specs, counts = [], dict.fromkeys(STRATEGIES, 0)
    for p in roles.processes(
        args.learners, args.actors, not args.no_eval, dataset=bool(cfg.run.input_dataset)
    ):
        if p.role.group == "server":
            group, resources = HEAD, {"CPU": 1.0}
        elif p.role.group == "learner":
            group, resources = learner_group, {"CPU": float(args.cpus_per_learner)}
            if args.gpus_per_learner:
                resources["GPU"] = float(args.gpus_per_learner)
        else:
            group, resources = ACTORS, {"CPU": float(args.cpus_per_actor)}
        bundle = host_bundle(cfg, keys_dir, p)
        args_ = (*p.args, "--config", str(config_path), "--keys", str(bundle))
        specs.append(
            RoleSpec(p.name, group, counts[group], resources, args_, p.role.group == "actor")
        )
        counts[group] += 1
    return tuple(specs)


def host_bundle(cfg: Config, keys_dir: Path, p: roles.Process) -> Path:
    """The bundle of the run's keys that process ``p`` is given: its kind of host's, an actor's
    (and the dataset feeder's) its own."""
    if p.role.name in ("actor", "dataset"):
        actor_id = p.index if p.role.name == "actor" else cfg.dataset_actor_id
        return auth.actor_bundle(keys_dir, actor_id)
    key_role = {"server": "replay", "learner": "learner"}.get(p.role.group, "eval")
    return keys_dir / auth.BUNDLE_OF[key_role]


def make_plan(args: argparse.Namespace) -> RayPlan:
    """The run asked for by the command line; raises ``RayPlanError`` or ``ConfigError``."""
    check_counts(args)
    cfg = plan_config(args)
    config_path = rundir.config_path(cfg.run_dir)
    return RayPlan(
        cfg=cfg,
        address=args.address,
        config_path=config_path,
        keys_dir=Path(cfg.net.keys_dir),
        roles=role_specs(cfg, args, config_path),
        max_actor_restarts=args.max_actor_restarts,
        num_actors=args.actors,
        evaluate=not args.no_eval,
    )


def render(plan: RayPlan) -> str:
    """What ``--dry-run`` prints: the run, each placement group with its bundles and each
    role's command line."""
    cfg = plan.cfg
    lines = [
        f"apexrl ray: {cfg.algorithm} on {cfg.env.id}, {plan.num_actors} actors, "
        f"{cfg.learner.world_size} learner(s), evaluation {'on' if plan.evaluate else 'off'}; "
        f"cluster {plan.address}",
        f"run directory {cfg.run_dir} (on a filesystem every node shares); keys {plan.keys_dir}",
        f"actors restarted up to {plan.max_actor_restarts} times each",
    ]
    python = Path(sys.executable).name
    for group in plan.groups:
        bundles = plan.bundles(group)
        lines.append(
            f"placement group {group} ({STRATEGIES[group]}, {WHERE[group]}): "
            f"{len(bundles)} bundles, {json.dumps(total(bundles))}"
        )
        for spec in (s for s in plan.roles if s.group == group):
            command = shlex.join([python, "-m", "apexrl", *spec.args])
            lines.append(
                f"  bundle {spec.bundle:<3} {json.dumps(spec.resources):<28} {spec.name:<10} "
                f"{command}"
            )
    lines.append(
        "addresses: replay and params bind a free port on the head node's address"
        + (", learner_0 hosts the learners' rendezvous" if cfg.learner.world_size > 1 else "")
        + f"; written to {plan.config_path} before any other role starts"
    )
    return "\n".join(lines) + "\n"


def total(bundles: list[dict[str, float]]) -> dict[str, float]:
    """The resources of ``bundles`` summed, by name."""
    sums: dict[str, float] = {}
    for bundle in bundles:
        for name, amount in bundle.items():
            sums[name] = sums.get(name, 0.0) + amount
    return sums

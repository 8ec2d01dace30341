"""``apexrl slurm``: a whole run as one SLURM batch job, each role a job step of its own.

    apexrl slurm --actors 32 --learners 2 --config configs/apex_dqn_cartpole.yaml \\
                 [--nodes 5] [--partition gpu] [--gpus-per-learner 1] [--time 04:00:00] [--dry-run]

On the login node it checks the config and the environment, makes the run directory (on the
shared filesystem: every node reads and writes it), writes the resolved ``config.yaml``, the run's
CURVE keys (``keys/``, a bundle per kind of host: each role's step is given only its own) and the
batch script ``job.sbatch`` there, and submits it with ``sbatch``.
``--dry-run`` prints the batch script and writes nothing.

Placement. The first node of the job (the *head*) runs the replay server, the parameter server
and the learners (with ``--gpus-per-learner G``, G GPUs each); the actors and the evaluation
actor run on the other nodes, actor ``i`` on actor node ``i mod (nodes - 1)``. With ``--nodes 1``
(the default) every role shares the one node. With more nodes the job is heterogeneous: component
0 is the head (and holds the GPUs), component 1 the actor nodes, so GPUs are asked for where the
learners run only.

Addresses. The batch script reads the head's name from SLURM's node list
(``scontrol show hostnames``) and its address from ``scontrol show node`` (``NodeAddr``, the
address SLURM itself uses to reach the node); the servers bind that address on ports derived from
the job id (``--port-base`` to choose them) and every other role connects to it.

Lifetime. Each role is started with its own ``apexrl <role> ...`` command line in a job step
(``srun``), the same command a user would type on that node. The batch script then watches them:

- an actor step that ends with an error is started again (backoff 2 s doubling to 60 s, at most
  ``--max-actor-restarts`` times; exit status 2, a configuration error, is never restarted);
- a server or learner step that ends with an error ends the job: the script names the role, its
  exit code and the tail of its log, sends SIGTERM to the other steps (each role stops as on
  Ctrl-C, the learner with a checkpoint) and exits 1; so does an actor that keeps dying;
- the learner meeting its stop condition, or ``apexrl stop`` from anywhere, tells the servers to
  shut down, the actors follow, and the job ends with status 0;
- ``scancel`` (or the time limit) sends SIGTERM to every step: each role stops as on Ctrl-C and
  SLURM kills whatever is left after its ``KillWait``.

Time limits: ``apexrl slurm --resume --run-dir DIR`` submits the run again, from the checkpoint
the learner wrote when SLURM stopped it, with the run's keys and its own ``config.yaml``; the
replay server reloads its snapshot.

The batch script is ``apexrl/launch/slurm_job.sh`` (package data, bash as it runs):
``render_script`` fills in its ``# @sbatch@`` (the ``#SBATCH`` header), ``# @about@`` and
``# @values@`` (the run's values as bash variables) lines; nothing else in it depends on the run.

Logs: ``<run dir>/logs/slurm-<job id>.out`` (the batch script: placement, addresses, restarts,
the end), ``<role>.log`` (each role's own log) and ``<role>.out`` (each step's console).
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from apexrl.config import Config, ConfigError
from apexrl.launch import placed_runs
from apexrl.runtime import rundir

JOB_TEMPLATE = "slurm_job.sh"  # the batch script's template: package data beside this module
PLACEHOLDER = re.compile(r"# @(\w+)@")  # a template line that a block of lines replaces
DEFAULT_MAX_ACTOR_RESTARTS = 5
# Seconds the batch script waits, once the run is ending, for every step to end by itself
# before it sends SIGTERM to the rest (the servers' shutdown grace plus a loaded node's slack).
STOP_GRACE_S = 60
# Addresses in config.yaml stand for the head node's, which only the job knows: its script gives
# every role the real ones on its command line, and the learner writes them into config.yaml (so
# `apexrl status RUN_DIR` and `apexrl stop --run-dir RUN_DIR` reach the job's servers).
PLACEHOLDER_RENDEZVOUS = "tcp://127.0.0.1:29500"
CONFIG_HEADER = (
    "# Written by `apexrl slurm`. The learner rewrites it when the job starts, with the head "
    "node's\n# addresses that job.sbatch gives it (also logged in logs/slurm-<job id>.out).\n"
)
# SLURM's time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or UNLIMITED.
TIME_PATTERN = re.compile(
    r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}){0,2}|UNLIMITED)$"
)


class SlurmError(Exception):
    """The job cannot be written or submitted as asked; the one line the user sees (exit 2)."""


@dataclass(frozen=True)
class JobPlan:
    """Everything the batch script is made from."""

    cfg: Config
    run_dir: Path
    config_path: Path
    keys_dir: Path
    num_actors: int
    num_learners: int
    nodes: int = 1
    evaluate: bool = True
    partition: str = ""
    gpus_per_learner: int = 0
    time_limit: str = ""
    cpus_per_node: int = 0  # 0: whole nodes (--exclusive)
    max_actor_restarts: int = DEFAULT_MAX_ACTOR_RESTARTS
    port_base: int = 0  # 0: derived from the job id in the script
    python: str = sys.executable
    pythonpath: str = ""
    sbatch_args: tuple[str, ...] = ()
    job_name: str = "apexrl"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``slurm`` subcommand's arguments (``apexrl.cli`` builds the parser)."""
    parser.description = (
        "Write one SLURM batch job for a whole run (replay, params and the learners on the first "
        "node, the actors on the others, each role a job step) and submit it with sbatch."
    )
    add_placement_flags(parser)
    add_run_flags(parser)
    add_job_flags(parser)


def add_placement_flags(parser: argparse.ArgumentParser) -> None:
    """The config, the roles and what the job asks SLURM for (nodes, partition, GPUs, time)."""
    placed_runs.add_config_and_role_flags(parser)
    parser.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="nodes of the job: the first runs the servers and learners, the others the actors; "
        "1 (default): every role on one node",
    )
    parser.add_argument("--partition", default="", help="SLURM partition (sbatch --partition)")
    parser.add_argument(
        "--gpus-per-learner",
        type=int,
        default=0,
        help="GPUs for each learner (default 0); a learner.device of cpu becomes cuda",
    )
    parser.add_argument(
        "--time", dest="time_limit", default="", help="time limit, e.g. 04:00:00 (sbatch --time)"
    )
    parser.add_argument(
        "--cpus-per-node",
        type=int,
        default=0,
        help="CPUs to ask for on each node; 0 (default): whole nodes (sbatch --exclusive)",
    )


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """The run directory, its keys, the evaluation actor, resuming a run."""
    placed_runs.add_run_flags(parser, "after a time limit or scancel")


def add_job_flags(parser: argparse.ArgumentParser) -> None:
    """How the batch script runs the roles, and submitting it."""
    parser.add_argument(
        "--max-actor-restarts",
        type=int,
        default=DEFAULT_MAX_ACTOR_RESTARTS,
        help=f"times the job restarts one dead actor (default {DEFAULT_MAX_ACTOR_RESTARTS})",
    )
    parser.add_argument(
        "--port-base",
        type=int,
        default=0,
        help="replay listens on this port, params on +1, the learner group on +2 (default: "
        "20000 + 10 x (job id mod 4000))",
    )
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="the Python (with apexrl installed) on the nodes (default: this one)",
    )
    parser.add_argument(
        "--sbatch-arg",
        dest="sbatch_args",
        action="append",
        default=[],
        metavar="ARG",
        help="one more #SBATCH option, e.g. --sbatch-arg=--account=rl (repeatable)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the batch script; submit and write nothing"
    )


# --- the plan ------------------------------------------------------------------------------------


def check_counts(args: argparse.Namespace) -> None:
    placed_runs.check_at_least(
        (
            ("--actors", args.actors, 1),
            ("--learners", args.learners, 1),
            ("--nodes", args.nodes, 1),
            ("--gpus-per-learner", args.gpus_per_learner, 0),
            ("--cpus-per-node", args.cpus_per_node, 0),
            ("--max-actor-restarts", args.max_actor_restarts, 0),
        ),
        SlurmError,
    )
    if args.port_base and not 1024 <= args.port_base <= 65533:
        raise SlurmError(f"--port-base must be in 1024..65533, got {args.port_base}")
    if args.time_limit and not TIME_PATTERN.match(args.time_limit):
        raise SlurmError(
            f"--time {args.time_limit!r} is not a SLURM time (minutes, HH:MM:SS or D-HH:MM:SS)"
        )
    for arg in args.sbatch_args:
        if not arg.startswith("-") or "\n" in arg:
            raise SlurmError(f"--sbatch-arg {arg!r} must be one sbatch option, e.g. --account=rl")


def make_plan(args: argparse.Namespace) -> JobPlan:
    """The job asked for by the command line; raises ``SlurmError`` or ``ConfigError``."""
    check_counts(args)
    overrides = [
        f"actor.num_actors={args.actors}",
        f"learner.world_size={args.learners}",
        f"run.resume={'true' if args.resume else 'false'}",
    ]
    if args.learners > 1:  # the head node's, given on each learner's command line in the job
        overrides.append(f"learner.rendezvous={PLACEHOLDER_RENDEZVOUS}")
    cfg, run_dir, keys_dir = placed_runs.run_config(args, overrides, SlurmError)
    if re.search(r"\s", str(run_dir)):  # the #SBATCH --output line cannot quote it
        raise SlurmError(f"the run directory {str(run_dir)!r} must not contain whitespace")
    return JobPlan(
        cfg=cfg,
        run_dir=run_dir,
        config_path=rundir.config_path(run_dir),
        keys_dir=keys_dir,
        num_actors=args.actors,
        num_learners=args.learners,
        nodes=args.nodes,
        evaluate=not args.no_eval,
        partition=args.partition,
        gpus_per_learner=args.gpus_per_learner,
        time_limit=args.time_limit,
        cpus_per_node=args.cpus_per_node,
        max_actor_restarts=args.max_actor_restarts,
        port_base=args.port_base,
        python=args.python,
        pythonpath=placed_runs.source_root(),
        sbatch_args=tuple(args.sbatch_args),
        job_name=f"apexrl-{cfg.run_name}",
    )


def check_plan(plan: JobPlan) -> None:
    """What would fail in every step at once, checked on the login node first."""
    from apexrl.launch.preflight import LaunchError, check_before_placing

    try:
        check_before_placing(plan.cfg)
    except LaunchError as exc:
        raise SlurmError(str(exc)) from exc


# --- the batch script ----------------------------------------------------------------------------


def sbatch_lines(plan: JobPlan) -> list[str]:
    """The ``#SBATCH`` header: one component, or two (head, actor nodes) with ``--nodes`` > 1."""
    output = rundir.logs_dir(plan.run_dir) / "slurm-%j.out"
    common = [f"--job-name={plan.job_name}", f"--output={output}"]
    if plan.partition:
        common.append(f"--partition={plan.partition}")
    if plan.time_limit:
        common.append(f"--time={plan.time_limit}")
    common += plan.sbatch_args

    def size(nodes: int, gpus: int) -> list[str]:
        lines = [f"--nodes={nodes}", "--ntasks-per-node=1"]
        lines.append(
            f"--cpus-per-task={plan.cpus_per_node}" if plan.cpus_per_node else "--exclusive"
        )
        if gpus:
            lines.append(f"--gpus-per-node={gpus}")
        return lines

    gpus = plan.gpus_per_learner * plan.num_learners
    if plan.nodes == 1:
        return [f"#SBATCH {option}" for option in common + size(1, gpus)]
    head = common + size(1, gpus)
    actors = size(plan.nodes - 1, 0)
    if plan.partition:  # each component of a heterogeneous job names its own partition
        actors.insert(0, f"--partition={plan.partition}")
    return [
        *(f"#SBATCH {option}" for option in head),
        "#SBATCH hetjob",
        *(f"#SBATCH {option}" for option in actors),
    ]


def fill_template(template: str, blocks: dict[str, list[str]]) -> str:
    """``template`` with each line ``# @NAME@`` replaced by the lines of ``blocks[NAME]``; every
    other line as it is (bash's own ``$`` needs no escaping)."""
    lines = []
    for line in template.splitlines(keepends=True):
        placeholder = PLACEHOLDER.fullmatch(line.rstrip("\n"))
        if placeholder:
            lines += [f"{block_line}\n" for block_line in blocks[placeholder.group(1)]]
        else:
            lines.append(line)
    return "".join(lines)


def job_template() -> str:
    """The batch script's template (``slurm_job.sh``, package data beside this module)."""
    return resources.files(__package__).joinpath(JOB_TEMPLATE).read_text()


def render_script(plan: JobPlan) -> str:
    """The batch script: ``slurm_job.sh`` with the ``#SBATCH`` header, a line about the run and
    the run's values (bash variables) filled in."""
    q = shlex.quote
    values = {
        "RUN_DIR": str(plan.run_dir),
        "CONFIG": str(plan.config_path),
        "KEYS": str(plan.keys_dir),
        "PYTHON": plan.python,
        "NUM_ACTORS": str(plan.num_actors),
        "NUM_LEARNERS": str(plan.num_learners),
        "GPUS_PER_LEARNER": str(plan.gpus_per_learner),
        "EVAL": "1" if plan.evaluate else "0",
        "HET": "1" if plan.nodes > 1 else "0",
        "MAX_ACTOR_RESTARTS": str(plan.max_actor_restarts),
        "PORT_BASE": str(plan.port_base) if plan.port_base else "",
        "STOP_GRACE_S": str(STOP_GRACE_S),
        "RESUME": "1" if plan.cfg.run.resume else "0",
    }
    about = (
        f"# apexrl {plan.cfg.algorithm} on {plan.cfg.env.id}: {plan.num_actors} actors, "
        f"{plan.num_learners} learner(s), {plan.nodes} node(s). Written by `apexrl slurm`."
    )
    assignments = [f"{name}={q(value)}" for name, value in values.items()]
    if plan.pythonpath:
        assignments.append(f'export PYTHONPATH={q(plan.pythonpath)}"${{PYTHONPATH:+:$PYTHONPATH}}"')
    blocks = {"sbatch": sbatch_lines(plan), "about": [about], "values": assignments}
    return fill_template(job_template(), blocks)


# --- submitting ----------------------------------------------------------------------------------


def write_run(plan: JobPlan, keys_given: bool) -> Path:
    """The run directory with ``config.yaml``, ``keys/`` and the batch script; its path."""
    from apexrl.config import dump_config
    from apexrl.transport import auth

    plan.run_dir.mkdir(parents=True, exist_ok=True)
    rundir.logs_dir(plan.run_dir).mkdir(exist_ok=True)
    if auth.has_keys(plan.keys_dir) and not auth.has_bundles(plan.keys_dir):
        raise SlurmError(
            f"{plan.keys_dir} holds CURVE keys in the flat layout of earlier versions; each role "
            "reads its own bundle: make a run's keys with `apexrl keys DIR` and pass --keys DIR"
        )
    if keys_given:
        if not auth.has_bundles(plan.keys_dir):
            raise SlurmError(
                f"--keys {plan.keys_dir} does not hold a run's CURVE keys (make them with "
                f"`apexrl keys {plan.keys_dir}`)"
            )
    elif not auth.has_bundles(plan.keys_dir):
        auth.make_keys(plan.keys_dir, actors=plan.num_actors)
    plan.config_path.write_text(CONFIG_HEADER + dump_config(plan.cfg))
    script = plan.run_dir / rundir.SLURM_JOB_SCRIPT
    script.write_text(render_script(plan))
    return script


def submit(script: Path) -> str:
    """``sbatch --parsable SCRIPT``: the job id."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise SlurmError(
            "sbatch is not on PATH: run this on a SLURM login node, or use --dry-run to see the "
            "batch script"
        )
    done = subprocess.run(
        [sbatch, "--parsable", str(script)], capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise SlurmError(f"sbatch refused the job: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip().split(";")[0]


def main(args: argparse.Namespace) -> int:
    """``apexrl slurm``: 0, or 2 with one line on stderr."""
    try:
        plan = make_plan(args)
        check_plan(plan)
        if args.dry_run:
            sys.stdout.write(render_script(plan))
            return 0
        script = write_run(plan, keys_given=bool(args.keys))
        job_id = submit(script)
    except ConfigError as exc:
        print(f"apexrl slurm: config error: {exc}", file=sys.stderr)
        return 2
    except (SlurmError, OSError, subprocess.SubprocessError) as exc:
        print(f"apexrl slurm: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"submitted batch job {job_id}: {plan.num_actors} actors, {plan.num_learners} "
        f"learner(s) on {plan.nodes} node(s); run directory {plan.run_dir}"
    )
    print(f"  follow: tail -f {plan.run_dir}/logs/slurm-{job_id}.out")
    print(f"  stop:   scancel {job_id}")
    return 0

"""``apexrl sweep SPEC``: run a sweep spec (``apexrl.sweep.spec``) with its live table.

Flags replace the spec's fields of the same name (``--max-concurrent``, ``--cpus-per-trial``,
...); ``--set`` adds overrides of every trial. ``--dry-run`` prints the trials and their command
lines and starts nothing. ``--slurm`` submits each trial as its own SLURM job instead
(``apexrl.sweep.slurm``). Exit status: 0 when every trial met its stop condition or was pruned,
1 when one failed, 2 for an error in the spec or a trial's config (nothing started), 130 on
Ctrl-C or SIGTERM (every trial stopped).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path

from apexrl import tracking
from apexrl.config import ConfigError, add_overrides_argument
from apexrl.runtime import lifecycle
from apexrl.sweep.runner import (
    base_overrides,
    check_spec,
    make_sweep_dir,
    run_sweep,
    sweep_path,
)
from apexrl.sweep.space import Param, config_overrides, trial_points
from apexrl.sweep.spec import SweepSpec, load_spec
from apexrl.sweep.trials import trial_command

FIELD_FLAGS = (  # flag, spec field, type, help
    ("--max-concurrent", "max_concurrent", int, "trials at once (0: as many as the CPUs allow)"),
    ("--cpus", "cpus", int, "CPUs the sweep may use (0: all of this process's)"),
    ("--cpus-per-trial", "cpus_per_trial", int, "CPUs each trial is pinned to"),
    ("--gpus-per-trial", "gpus_per_trial", int, "GPUs each trial gets (CUDA_VISIBLE_DEVICES)"),
    ("--gpus", "gpus", int, "GPUs the sweep may use (0: every visible one)"),
    ("--num-samples", "num_samples", int, "times the grid is run; drawn keys drawn per trial"),
    ("--logdir", "logdir", str, "parent of the sweep directory"),
    ("--interval", "report_interval_s", float, "seconds between live tables"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``sweep`` subcommand's arguments (``apexrl.cli`` builds the parser)."""
    parser.description = (
        "Run a hyperparameter sweep: every trial an `apexrl local` run of the spec's config with "
        "its own values, side by side on the CPUs given, each stopped at the spec's condition, "
        "with a live table and, at the end, a table sorted by the metric and curves.png."
    )
    parser.add_argument("spec", metavar="SPEC", help="the sweep spec (YAML; docs/sweeps.md)")
    for flag, name, kind, text in FIELD_FLAGS:
        parser.add_argument(flag, dest=name, type=kind, help=f"{text} (default: the spec's)")
    parser.add_argument(
        "--sweep-dir", help="the sweep's directory (default <logdir>/<name>-<time>; empty)"
    )
    add_overrides_argument(parser, example="env.num_envs=4")
    tracking.add_track_flag(parser)  # the trials: one W&B group, or children of one MLflow run
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the trials and their commands (with --slurm: their batch scripts); run nothing",
    )
    parser.add_argument(
        "--slurm",
        action="store_true",
        help="submit each trial as its own SLURM job (apexrl slurm) instead of running it here",
    )
    parser.add_argument(
        "--slurm-arg",
        dest="slurm_args",
        action="append",
        default=[],
        metavar="ARG",
        help="a flag for apexrl slurm, e.g. --slurm-arg=--partition=gpu (repeatable)",
    )


def spec_from_args(args: argparse.Namespace) -> SweepSpec:
    changes = {name: getattr(args, name) for _, name, _, _ in FIELD_FLAGS}
    spec = load_spec(args.spec, {k: v for k, v in changes.items() if v is not None})
    trackers = ", ".join(dict.fromkeys(["tensorboard", *args.track]))
    tracked = [f"run.trackers=[{trackers}]"] if args.track else []
    return dataclasses.replace(spec, overrides=(*spec.overrides, *args.overrides, *tracked))


def drawn_text(param: Param) -> str:
    """``<loguniform 0.0001..0.003>``, ``<choice [0.1, 0.2]>``: a drawn key in a dry run."""
    if param.values:
        return f"<{param.kind} {list(param.values)}>"
    return f"<{param.kind} {param.low:g}..{param.high:g}>"


def dry_run(spec: SweepSpec) -> str:
    """The trials a sweep would start, each with its command line (drawn keys shown as such)."""
    overrides = base_overrides(spec, check_spec(spec))
    drawn = {k: p for k, p in spec.params.items() if p.drawn}
    lines = []
    for i, point in enumerate(trial_points(spec.params, spec.num_samples)):
        run_dir = Path("SWEEP_DIR") / f"trial_{i:03d}"
        command = trial_command(
            spec.config,
            [*overrides, *config_overrides(point)],
            run_dir,
            spec.actors,
            spec.learners,
            spec.evaluation,
        )
        draws = "".join(f" {k}={drawn_text(p)}" for k, p in drawn.items())
        lines.append(f"trial_{i:03d}:{draws} {shlex.join(command)}")
    return "\n".join(lines)


def submit_to_slurm(spec: SweepSpec, args: argparse.Namespace) -> int:
    """``--slurm``: one ``apexrl slurm`` job per trial in the sweep directory (made unless
    ``--dry-run``, which prints each job's batch script)."""
    from apexrl.sweep.slurm import check_for_slurm, submit_trials

    check_for_slurm(spec)
    base = check_spec(spec)
    if args.dry_run:
        path = sweep_path(spec, base, args.sweep_dir)
    else:
        path = make_sweep_dir(spec, base, args.sweep_dir)
    code = submit_trials(
        spec, path.absolute(), base_overrides(spec, base), args.slurm_args, args.dry_run
    )
    if code == 0 and not args.dry_run:
        print(f"sweep directory {path}: one SLURM job per trial (trial_NNN/)")
    return code


def main(args: argparse.Namespace) -> int:
    """``apexrl sweep``: see the module's docstring for the exit status."""
    try:
        spec = spec_from_args(args)
        if args.slurm:
            return submit_to_slurm(spec, args)
        if args.dry_run:
            print(dry_run(spec))
            return 0
        lifecycle.setup_logging("sweep")
        stop = lifecycle.install_stop_handlers()
        result = run_sweep(spec, sweep_dir=args.sweep_dir, stop=stop)
    except ConfigError as exc:
        print(f"apexrl sweep: config error: {exc}", file=sys.stderr)
        return 2
    except tracking.TrackerMissing as exc:
        print(f"apexrl sweep: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"apexrl sweep: error: {exc}", file=sys.stderr)
        return 2
    if result.interrupted:
        return 130
    return 0 if result.ok else 1

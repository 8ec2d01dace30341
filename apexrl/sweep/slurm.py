"""``apexrl sweep SPEC --slurm``: each trial of a sweep submitted as its own SLURM job with
``apexrl slurm`` (``apexrl.launch.slurm``), one job per trial.

The drawn keys are drawn when the jobs are written (the spec's sampler and seed), and each trial's
run directory is ``<sweep dir>/trial_NNN``. A job has no sweep watching it: it stops by the
conditions its learner judges (``stop``'s ``env_steps``, ``time_s``, ``eval_return_mean``) or its
time limit, so other stop keys and a scheduler are refused. ``cpus_per_trial`` becomes the job's
``--cpus-per-node`` and ``gpus_per_trial`` its GPUs (per learner); ``--slurm-arg`` passes any
other flag of ``apexrl slurm`` (``--slurm-arg=--partition=gpu``, ``--slurm-arg=--time=01:00:00``).
With ``--dry-run`` each job's batch script is printed and nothing is written or submitted.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from apexrl.config import ConfigError
from apexrl.sweep.space import config_overrides, draw_values, trial_points
from apexrl.sweep.spec import STOP_CONFIG_KEYS, SweepSpec


def check_for_slurm(spec: SweepSpec) -> None:
    """What a sweep of SLURM jobs cannot do: stop keys the learner does not judge, pruning."""
    unjudged = [k for k in spec.stop if k not in STOP_CONFIG_KEYS]
    if unjudged:
        raise ConfigError(
            f"sweep --slurm: stop keys {unjudged} need the sweep to watch the trials; a SLURM "
            f"job stops by {sorted(STOP_CONFIG_KEYS)} (its learner's) or its time limit"
        )
    if spec.scheduler.kind != "none":
        raise ConfigError("sweep --slurm: a scheduler needs the sweep to watch the trials")


def trial_values(spec: SweepSpec, study: Any) -> list[dict[str, Any]]:
    """Each trial's grid point with its drawn keys drawn (one study trial each)."""
    points = trial_points(spec.params, spec.num_samples)
    for point in points:
        draw_values(study.ask(), spec.params, point)
    return points


def slurm_argv(
    spec: SweepSpec, overrides: list[str], run_dir: Path, extra: list[str], dry_run: bool
) -> list[str]:
    """The ``apexrl slurm`` arguments of one trial."""
    argv = ["--config", spec.config, "--run-dir", str(run_dir)]
    argv += ["--actors", str(spec.actors), "--learners", str(spec.learners)]
    argv += ["--cpus-per-node", str(spec.cpus_per_trial)]
    if spec.gpus_per_trial:
        argv += ["--gpus-per-learner", str(max(spec.gpus_per_trial // spec.learners, 1))]
    if not spec.evaluation:
        argv.append("--no-eval")
    if dry_run:
        argv.append("--dry-run")
    for override in overrides:
        argv += ["--set", override]
    return argv + extra


def parse_slurm_args(argv: list[str]) -> argparse.Namespace:
    """``argv`` read by ``apexrl slurm``'s own parser; a wrong flag is a ``ConfigError``."""
    from apexrl.launch import slurm

    parser = argparse.ArgumentParser(prog="apexrl slurm", exit_on_error=False)
    slurm.add_arguments(parser)
    try:
        return parser.parse_args(argv)
    except (argparse.ArgumentError, SystemExit) as exc:
        raise ConfigError(f"sweep --slurm-arg: apexrl slurm refuses {argv[-4:]}: {exc}") from exc


def submit_trials(
    spec: SweepSpec, sweep_dir: Path, overrides: list[str], extra: list[str], dry_run: bool
) -> int:
    """Write (or, with ``dry_run``, print) one SLURM job per trial; the first failing job's exit
    status, else 0."""
    from apexrl.launch import slurm
    from apexrl.sweep.runner import make_study

    check_for_slurm(spec)
    for index, values in enumerate(trial_values(spec, make_study(spec))):
        run_dir = sweep_dir / f"trial_{index:03d}"
        argv = slurm_argv(spec, [*overrides, *config_overrides(values)], run_dir, extra, dry_run)
        code = slurm.main(parse_slurm_args(argv))
        if code != 0:
            return code
    return 0

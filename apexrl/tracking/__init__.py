"""Experiment trackers beside TensorBoard: Weights & Biases and MLflow (``run.trackers``,
``--track`` on the launchers and ``apexrl sweep``, ``apexrl track`` after a run).

Only the learner's reporting process (rank 0) talks to a tracker, through ``TrackerFeed``: one
tracker run per apexrl run, named after the run directory, with the resolved config as its
parameters, every ``result.json`` record's numbers as metrics at the run's env steps, the
evaluation videos and the final checkpoint as artifacts, and tags for algorithm, env and sweep.
A sweep's trials form a W&B group, or child runs of the sweep's MLflow run.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from apexrl.tracking.backends import (
    TrackerMissing,
    check_installed,
    finish_group,
    make_tracker,
    preload,
    prepare_group,
)
from apexrl.tracking.feed import TrackerFeed
from apexrl.tracking.records import PACKAGES, RunInfo, outside_trackers, run_info

__all__ = [
    "RunInfo",
    "TrackerFeed",
    "TrackerMissing",
    "add_track_flag",
    "check_installed",
    "close_group",
    "open_feed",
    "open_group",
    "outside_trackers",
    "preload",
    "run_info",
    "with_trackers",
]


def open_feed(cfg_dict: dict, run_dir: Path, trackers: tuple[str, ...]) -> TrackerFeed | None:
    """The learner's feed to the trackers of ``run.trackers`` besides TensorBoard; None when
    there are none."""
    names = outside_trackers(trackers)
    if not names:
        return None
    return TrackerFeed([make_tracker(n) for n in names], run_info(cfg_dict, Path(run_dir)))


def add_track_flag(parser: argparse.ArgumentParser) -> None:
    """``--track wandb|mlflow`` (repeatable): trackers added to the config's ``run.trackers``."""
    parser.add_argument(
        "--track",
        action="append",
        choices=sorted(PACKAGES),
        default=[],
        help="also send the run to this experiment tracker (run.trackers; repeatable)",
    )


def with_trackers(cfg, names: list[str] | tuple[str, ...]):
    """``cfg`` with the trackers ``names`` (``--track``) added to its ``run.trackers``."""
    if not names:
        return cfg
    trackers = tuple(dict.fromkeys([*cfg.run.trackers, *names]))
    return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, trackers=trackers))


def open_group(run, name: str) -> list[str]:
    """Before a sweep's trials: with trackers besides TensorBoard in ``run`` (a ``RunConfig``),
    the trials' override naming their group ``name`` (the sweep directory's name), and the
    MLflow run they will be children of; [] without."""
    names = outside_trackers(run.trackers)
    if not names:
        return []
    prepare_group(names, run.tracker_project, name, run.mlflow_tracking_uri)
    return [f"run.tracker_group={name}"]


def close_group(run, name: str) -> None:
    """After a sweep: the group's MLflow run ends (nothing for W&B)."""
    names = outside_trackers(run.trackers)
    if names:
        finish_group(names, run.tracker_project, name, run.mlflow_tracking_uri)

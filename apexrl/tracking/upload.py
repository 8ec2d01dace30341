"""``apexrl track RUN_DIR --to wandb|mlflow``: a finished run sent to a tracker after the fact,
from its ``config.yaml``, ``result.json``, evaluation videos and final checkpoint, as the
learner would have sent it live; a sweep directory (``sweep.yaml`` and ``trial_NNN/``) sends
each trial, grouped as one sweep."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import yaml

from apexrl.runtime import rundir
from apexrl.tracking.backends import (
    TrackerMissing,
    check_installed,
    finish_group,
    make_tracker,
    prepare_group,
)
from apexrl.tracking.records import PACKAGES, RunInfo, metrics_of, run_info, step_of


class UploadError(Exception):
    """A directory that is not a run or a sweep, or a run without its files."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``track`` subcommand's arguments (``apexrl.cli`` builds the parser)."""
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a finished run's or sweep's directory")
    parser.add_argument("--to", required=True, choices=sorted(PACKAGES), help="the tracker")


def load_run(run_dir: Path) -> tuple[RunInfo, list[dict]]:
    """The run's ``RunInfo`` and its ``result.json`` records."""
    config_path, result_path = rundir.config_path(run_dir), rundir.result_path(run_dir)
    if not config_path.exists() or not result_path.exists():
        raise UploadError(f"{run_dir} is not a run directory: it needs config.yaml and result.json")
    text = config_path.read_text()
    try:
        records = [json.loads(line) for line in result_path.read_text().splitlines() if line]
    except ValueError as exc:
        raise UploadError(f"{result_path} is not one JSON object a line: {exc}") from exc
    return run_info(yaml.safe_load(text), run_dir), records


def upload_run(info: RunInfo, records: list[dict], to: str) -> str:
    """One run to the tracker ``to``; its id there."""
    tracker = make_tracker(to)
    run_id = tracker.start(info, None)
    for record in records:
        tracker.log(metrics_of(record), step_of(record))
    for video in rundir.finished_videos(info.run_dir):
        tracker.artifact(video, "video")
    checkpoint = rundir.checkpoint_path(info.run_dir)
    if checkpoint.exists():
        tracker.artifact(checkpoint, "checkpoint")
    tracker.finish(ok=True)
    return run_id


def upload(path: Path, to: str) -> list[tuple[Path, str]]:
    """A run, or every trial of a sweep as one group: ``(run directory, id)`` each."""
    check_installed([to])
    if (path / "sweep.yaml").exists():
        trials = sorted(p for p in path.glob("trial_*") if rundir.result_path(p).exists())
        if not trials:
            raise UploadError(f"the sweep {path} has no trial with a result.json")
        loaded = [load_run(trial) for trial in trials]
        project, uri = loaded[0][0].project, loaded[0][0].mlflow_tracking_uri
        prepare_group([to], project, path.name, uri)
        sent = []
        for info, records in loaded:
            grouped = dataclasses.replace(
                info, group=path.name, tags={**info.tags, "sweep": path.name}
            )
            sent.append((info.run_dir, upload_run(grouped, records, to)))
        finish_group([to], project, path.name, uri)
        return sent
    info, records = load_run(path)
    return [(path, upload_run(info, records, to))]


def main(args: argparse.Namespace) -> int:
    """``apexrl track``: 0, or 2 with one line on stderr."""
    try:
        sent = upload(Path(args.run_dir), args.to)
    except (UploadError, TrackerMissing, OSError) as exc:
        print(f"apexrl track: error: {exc}", file=sys.stderr)
        return 2
    for run_dir, run_id in sent:
        print(f"{run_dir}: {args.to} run {run_id}")
    return 0

"""What a tracker is given of a run, in pure functions: the run's identity (name, tags, group),
its resolved config as flat parameters, and each ``result.json`` record's numbers as metrics at
the run's env steps."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

PACKAGES = {"wandb": "wandb", "mlflow": "mlflow"}  # tracker -> the module it needs
EXTRAS = {"wandb": "apexrl[wandb]", "mlflow": "apexrl[mlflow]"}  # what to pip install


@dataclass(frozen=True)
class RunInfo:
    """One apexrl run as a tracker sees it: named after its run directory, its config as
    parameters, tags for algorithm, env and sweep, and the sweep's group ("": none)."""

    name: str
    run_dir: Path
    project: str
    params: dict[str, object]
    tags: dict[str, str]
    group: str = ""
    mlflow_tracking_uri: str = ""


def outside_trackers(trackers: tuple[str, ...] | list[str]) -> list[str]:
    """The trackers of ``run.trackers`` besides TensorBoard, whose events every role writes."""
    return [name for name in trackers if name != "tensorboard"]


def run_info(cfg_dict: dict, run_dir: Path) -> RunInfo:
    """``RunInfo`` of the run in ``run_dir`` whose resolved config is ``cfg_dict`` (the YAML of
    ``config.yaml`` as a dict)."""
    run = cfg_dict.get("run", {})
    group = str(run.get("tracker_group", "") or "")
    tags = {"algorithm": str(cfg_dict.get("algorithm", "")), "env": str(cfg_dict["env"]["id"])}
    if group:
        tags["sweep"] = group
    return RunInfo(
        name=Path(run_dir).resolve().name,
        run_dir=Path(run_dir),
        project=str(run.get("tracker_project", "apexrl") or "apexrl"),
        params=flatten(cfg_dict),
        tags=tags,
        group=group,
        mlflow_tracking_uri=str(run.get("mlflow_tracking_uri", "") or ""),
    )


def flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    """``{"algo": {"lr": 0.1}}`` -> ``{"algo.lr": 0.1}``; lists stay values."""
    flat: dict[str, object] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def metrics_of(record: dict) -> dict[str, float]:
    """The numbers of a ``result.json`` record as metrics: nested objects' numbers under
    ``<key>/<name>`` (``replay_items/stored``, ``custom_metrics/score``, ``league/elo/latest``);
    booleans, strings, nulls and non-finite numbers left out."""
    metrics: dict[str, float] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            for name, inner in metrics_of(value).items():
                metrics[f"{key}/{name}"] = inner
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(value):
                metrics[key] = float(value)
    return metrics


def step_of(record: dict) -> int:
    """The x-axis a record's metrics are logged at: the run's env steps."""
    return int(record.get("env_steps", 0))

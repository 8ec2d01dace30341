"""The trackers: a Weights & Biases run and an MLflow run, each behind the same four calls
(``start``, ``log``, ``artifact``, ``finish``). Their client libraries are optional extras,
imported when a tracker starts; ``check_installed`` says which pip command is missing before a
run starts."""

from __future__ import annotations

import importlib.util
import re
import time
from pathlib import Path
from typing import Protocol

from apexrl.tracking.records import EXTRAS, PACKAGES, RunInfo

MLFLOW_PARAMS_PER_CALL = 100  # MLflow's limit on the parameters of one log_batch
MLFLOW_METRICS_PER_CALL = 1000  # and on its metrics
MLFLOW_MAX_PARAM_CHARS = 6000  # a parameter value's longest
WANDB_MAX_TAG_CHARS = 64
SWEEP_PARENT_TAG = "apexrl.sweep_parent"  # marks the MLflow run a sweep's trials are children of


class TrackerMissing(RuntimeError):
    """A tracker was asked for whose client library is not installed."""


class Tracker(Protocol):
    name: str

    def start(self, info: RunInfo, run_id: str | None) -> str:
        """Open the tracker's run (``run_id``: the one a resumed apexrl run had); its id."""

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def artifact(self, path: Path, kind: str) -> None:
        """Keep a file with the run: ``kind`` ``video`` (evaluation videos) or ``checkpoint``."""

    def finish(self, ok: bool) -> None: ...


def check_installed(names: tuple[str, ...] | list[str]) -> None:
    """``TrackerMissing`` naming the pip command when a tracker's library is not installed."""
    missing = [n for n in names if n in PACKAGES and importlib.util.find_spec(PACKAGES[n]) is None]
    if missing:
        extras = " ".join(f"'{EXTRAS[n]}'" for n in missing)
        raise TrackerMissing(
            f"run.trackers asks for {', '.join(missing)}, which is not installed: "
            f"pip install {extras}"
        )


def preload(names: tuple[str, ...] | list[str]) -> None:
    """Import the client libraries of the trackers ``names`` now (a second or more of CPU that
    would otherwise hold the interpreter while training runs beside the feed's thread)."""
    for name in names:
        if name == "wandb":
            import wandb  # noqa: F401
        elif name == "mlflow":
            import mlflow.entities  # noqa: F401
            import mlflow.tracking  # noqa: F401


def make_tracker(name: str) -> Tracker:
    return {"wandb": WandbTracker, "mlflow": MlflowTracker}[name]()


class WandbTracker:
    """A W&B run in the project ``run.tracker_project``, named after the run directory, its
    files under ``<run dir>/wandb`` (``WANDB_MODE=offline``: nothing leaves the machine until
    ``wandb sync``), every metric charted against ``env_steps``. It does not capture the
    learner's console."""

    name = "wandb"

    def start(self, info: RunInfo, run_id: str | None) -> str:
        import wandb

        tags = [value[:WANDB_MAX_TAG_CHARS] for value in info.tags.values()]
        self.run = wandb.init(
            project=info.project,
            name=info.name,
            dir=str(info.run_dir),
            config=info.params,
            group=info.group or None,
            tags=tags,
            id=run_id,
            resume="allow" if run_id else None,
            settings=wandb.Settings(console="off", silent=True, save_code=False),
        )
        self.wandb = wandb
        # Every record a row (W&B's own step counts them), charted against the run's env steps:
        # a record may repeat the env steps of the one before it.
        self.run.define_metric("env_steps")
        self.run.define_metric("*", step_metric="env_steps")
        return str(self.run.id)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log({**metrics, "env_steps": step})

    def artifact(self, path: Path, kind: str) -> None:
        name = re.sub(r"[^A-Za-z0-9._-]", "-", f"{self.run.name}-{path.stem}")
        artifact = self.wandb.Artifact(name, type="model" if kind == "checkpoint" else kind)
        artifact.add_file(str(path))
        self.run.log_artifact(artifact)

    def finish(self, ok: bool) -> None:
        self.run.finish(exit_code=0 if ok else 1)


class MlflowTracker:
    """An MLflow run in the experiment ``run.tracker_project`` at ``run.mlflow_tracking_uri``
    (else MLflow's own), named after the run directory, with the config as parameters; a sweep's
    trials are child runs of the sweep's run (``prepare_group``)."""

    name = "mlflow"

    def start(self, info: RunInfo, run_id: str | None) -> str:
        self.client, experiment_id = mlflow_experiment(info.mlflow_tracking_uri, info.project)
        if run_id is not None:
            self.run_id = run_id
            self.client.update_run(run_id, status="RUNNING")
            return run_id
        tags = dict(info.tags)
        if info.group:
            tags["mlflow.parentRunId"] = mlflow_parent(self.client, experiment_id, info.group)
        run = self.client.create_run(experiment_id, run_name=info.name, tags=tags)
        self.run_id = run.info.run_id
        self._log_params(info.params)
        return self.run_id

    def _log_params(self, params: dict[str, object]) -> None:
        from mlflow.entities import Param

        listed = [Param(k, str(v)[:MLFLOW_MAX_PARAM_CHARS]) for k, v in params.items()]
        for i in range(0, len(listed), MLFLOW_PARAMS_PER_CALL):
            self.client.log_batch(self.run_id, params=listed[i : i + MLFLOW_PARAMS_PER_CALL])

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now_ms = int(time.time() * 1000)
        listed = [Metric(k, v, now_ms, step) for k, v in metrics.items()]
        for i in range(0, len(listed), MLFLOW_METRICS_PER_CALL):
            self.client.log_batch(self.run_id, metrics=listed[i : i + MLFLOW_METRICS_PER_CALL])

    def artifact(self, path: Path, kind: str) -> None:
        folder = "videos" if kind == "video" else kind
        self.client.log_artifact(self.run_id, str(path), artifact_path=folder)

    def finish(self, ok: bool) -> None:
        self.client.set_terminated(self.run_id, "FINISHED" if ok else "FAILED")


def mlflow_experiment(tracking_uri: str, project: str):
    """An ``MlflowClient`` at ``tracking_uri`` ("": MLflow's own) and the id of the experiment
    ``project``, made when it is not there."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri or None)
    experiment = client.get_experiment_by_name(project)
    if experiment is not None:
        return client, experiment.experiment_id
    return client, client.create_experiment(project)


def mlflow_parent(client, experiment_id: str, group: str) -> str:
    """The id of the sweep run ``group`` in the experiment, made when it is not there."""
    query = f"tags.`{SWEEP_PARENT_TAG}` = '{group}'"
    found = client.search_runs([experiment_id], filter_string=query, max_results=1)
    if found:
        return found[0].info.run_id
    tags = {SWEEP_PARENT_TAG: group, "sweep": group}
    return client.create_run(experiment_id, run_name=group, tags=tags).info.run_id


def prepare_group(names: tuple[str, ...] | list[str], project: str, group: str, uri: str) -> None:
    """Before a sweep's trials start: the MLflow run they will be children of (so that trials
    starting together find one parent); W&B groups need nothing."""
    if "mlflow" in names:
        client, experiment_id = mlflow_experiment(uri, project)
        mlflow_parent(client, experiment_id, group)


def finish_group(names: tuple[str, ...] | list[str], project: str, group: str, uri: str) -> None:
    """After a sweep: its MLflow run ends."""
    if "mlflow" in names:
        client, experiment_id = mlflow_experiment(uri, project)
        client.set_terminated(mlflow_parent(client, experiment_id, group), "FINISHED")

"""Reading back what the trackers wrote, with their own libraries: a W&B offline run's records
(the ``.wandb`` file's protobuf ``Record`` messages, W&B's own types, in the LevelDB log framing
W&B writes them in: 32 KiB blocks of chunks with a 7-byte header), and MLflow runs of a file
store (``mlflow.search_runs``, ``MlflowClient``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

WANDB_BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4  # the chunk types of the log framing


@dataclass
class WandbRun:
    """What a ``.wandb`` file holds of one run."""

    name: str = ""
    group: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, str] = field(default_factory=dict)  # key -> JSON value
    history: list[dict[str, str]] = field(default_factory=list)  # each row: key -> JSON value
    artifacts: list[tuple[str, str, list[str]]] = field(default_factory=list)  # name, type, files
    exit_code: int | None = None


def wandb_payloads(path: Path):
    """The records' bytes of a ``.wandb`` file, in order."""
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = WANDB_BLOCK - pos % WANDB_BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if kind == 0:  # zeros to the block's end
            pos += left
            continue
        payload, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == FULL:
            yield payload
        elif kind == FIRST:
            pending = payload
        elif kind == MIDDLE:
            pending += payload
        elif kind == LAST:
            yield pending + payload
            pending = b""


def read_wandb_run(run_dir: Path) -> list[WandbRun]:
    """Every offline W&B run under ``<run_dir>/wandb``, read with W&B's own protobuf types."""
    from wandb.proto import wandb_internal_pb2 as pb

    runs = []
    for path in sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb")):
        run = WandbRun()
        for payload in wandb_payloads(path):
            record = pb.Record()
            record.ParseFromString(payload)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run.name, run.group = record.run.display_name, record.run.run_group
                run.tags = list(record.run.tags)
                run.config.update({i.key: i.value_json for i in record.run.config.update})
            elif kind == "config":
                run.config.update({i.key: i.value_json for i in record.config.update})
            elif kind == "history":
                row = {i.key or "/".join(i.nested_key): i.value_json for i in record.history.item}
                run.history.append(row)
            elif kind == "artifact":
                files = [entry.path for entry in record.artifact.manifest.contents]
                run.artifacts.append((record.artifact.name, record.artifact.type, files))
            elif kind == "exit":
                run.exit_code = record.exit.exit_code
        runs.append(run)
    return runs


def mlflow_runs(tracking_uri: str, experiment: str = "apexrl") -> list:
    """Every run of ``experiment`` in the store at ``tracking_uri`` (``mlflow.search_runs``)."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    return mlflow.search_runs(experiment_names=[experiment], output_format="list")


def mlflow_metric_steps(tracking_uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    history = MlflowClient(tracking_uri=tracking_uri).get_metric_history(run_id, key)
    return sorted((m.step, m.value) for m in history)


def mlflow_artifacts(tracking_uri: str, run_id: str, folder: str) -> list[str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    return sorted(Path(a.path).name for a in client.list_artifacts(run_id, folder))

"""The run directory's layout: every file and folder a run writes, named in this one place.

```
<run dir>/
  config.yaml           the resolved config (written by the learner and launchers; read by --resume)
  result.json           the learner's records, one JSON object a line (RLlib's convention)
  roles.json            the launcher's roles, their PIDs and states (``apexrl status`` reads it)
  checkpoint.pt         the learner's latest checkpoint (weights, optimizer, counters)
  checkpoint.prev.pt    the one before it, kept whole while the next is written
  checkpoint_best.pt    the weights of the best evaluation round so far
  checkpoints/          checkpoints written on request (``Trainer.save``: checkpoint-<version>.pt)
  requests/             requests of the user's Python to the learner (``apexrl.api``: weights to
                        publish, a checkpoint now) and the learner's replies
  keys/                 the run's CURVE keys (``apexrl keys``)
  logs/<role>.log       each role's log; logs/forkserver.log, logs/serial.log (serial mode),
                        logs/slurm-<job id>.out (the batch job)
  tb/<role>/            each role's TensorBoard events
  replay_snapshot/      the replay server's snapshot (``snapshot.npz``)
  job.sbatch            the SLURM batch script (``apexrl slurm``)
  plots/                return_vs_env_steps.png, return_vs_time.png, throughput.png
                        (``apexrl plot``, and the launcher after a run)
  videos/               the evaluation actor's videos (``actor.eval_video_interval_s``)
  tracking.json         the run's ids in its trackers (``run.trackers``: W&B, MLflow)
  wandb/                W&B's files of the run (``run.trackers: [wandb]``)
```

Only names and paths live here: no role's behaviour, and nothing heavier than ``pathlib`` is
imported, so every module of the package may use it.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

CONFIG = "config.yaml"
RESULT = "result.json"
ROLES = "roles.json"
CHECKPOINT = "checkpoint.pt"
PREVIOUS_CHECKPOINT = "checkpoint.prev.pt"
BEST_CHECKPOINT = "checkpoint_best.pt"
SAVED_CHECKPOINTS = "checkpoints"
REQUESTS = "requests"
KEYS = "keys"
LOGS = "logs"
TENSORBOARD = "tb"
REPLAY_SNAPSHOT = "replay_snapshot"
LEAGUE = "league"
SLURM_JOB_SCRIPT = "job.sbatch"
FORKSERVER_LOG = "forkserver.log"
PLOTS = "plots"
VIDEOS = "videos"
PARTIAL_VIDEO_SUFFIX = ".partial.mp4"  # a video being written, renamed when whole
TRACKING = "tracking.json"
RETURN_PLOTS = {"env_steps": "return_vs_env_steps.png", "time_s": "return_vs_time.png"}
THROUGHPUT_PLOT = "throughput.png"


def config_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / CONFIG


def result_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / RESULT


def roles_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / ROLES


def checkpoint_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT


def previous_checkpoint_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / PREVIOUS_CHECKPOINT


def best_checkpoint_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / BEST_CHECKPOINT


def saved_checkpoint_path(run_dir: str | Path, version: int) -> Path:
    """``checkpoints/checkpoint-<version>.pt``: a checkpoint written on request."""
    return Path(run_dir) / SAVED_CHECKPOINTS / f"checkpoint-{version}.pt"


def requests_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / REQUESTS


def env_task_path(run_dir: str | Path) -> Path:
    """The env task in force (``Trainer.set_env_task``), JSON; a restarted learner reads it."""
    return Path(run_dir) / "env_task.json"


def keys_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / KEYS


def logs_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / LOGS


def log_path(run_dir: str | Path, role: str) -> Path:
    """``logs/<role>.log``: ``replay``, ``params``, ``learner`` or ``learner_<rank>``,
    ``actor_<i>``, ``eval``."""
    return logs_dir(run_dir) / f"{role}.log"


def tensorboard_dir(run_dir: str | Path, role: str) -> Path:
    return Path(run_dir) / TENSORBOARD / role


def plots_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / PLOTS


def videos_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / VIDEOS


def finished_videos(run_dir: str | Path) -> list[Path]:
    """The run's evaluation videos written whole, by name (not one still being written)."""
    found = videos_dir(run_dir).glob("*.mp4")
    return sorted(p for p in found if not p.name.endswith(PARTIAL_VIDEO_SUFFIX))


def tracking_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / TRACKING


def league_dir(run_dir: str | Path) -> Path:
    """A league's pinned snapshots and its payoffs and ratings (``apexrl.league.storage``)."""
    return Path(run_dir) / LEAGUE


def replay_snapshot_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / REPLAY_SNAPSHOT


class CheckpointSources(NamedTuple):
    checkpoint: Path
    config: Path


def checkpoint_sources(
    target: Path, best: bool = False, config: str | None = None
) -> CheckpointSources:
    """A checkpoint to read and the config to read it with: ``target`` a run directory (its
    ``checkpoint.pt``, or with ``best`` its ``checkpoint_best.pt``) or a ``.pt`` file, and the
    ``config.yaml`` beside it unless ``config`` names one. ``ValueError`` with one line when
    either is missing."""
    if target.is_dir():
        path = best_checkpoint_path if best else checkpoint_path
        checkpoint = path(target)
        if not checkpoint.is_file():
            raise ValueError(f"{target} has no {checkpoint.name}")
    elif target.is_file():
        if best:
            raise ValueError("--best picks a run directory's checkpoint; give the directory")
        checkpoint = target
    else:
        raise ValueError(f"no run directory or checkpoint at {target}")
    found = Path(config) if config else config_path(checkpoint.parent)
    if not found.is_file():
        hint = "" if config else "; give --config FILE"
        raise ValueError(f"no config file {found}{hint}")
    return CheckpointSources(checkpoint, found)

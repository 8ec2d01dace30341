"""``run.output_dataset: ID``: the training actors' episodes written as one Minari dataset.

Each training actor keeps the whole episodes its envs play (``TrainingEpisodes.add`` after each
vector step: the observation each action was chosen on, the action in the env's own units, the
raw reward, ``terminated`` and ``truncated``, and the final observation) and, when it stops,
writes them as a part under ``<run dir>/dataset_parts/`` (an episode still running then is left
out: every episode of the dataset is whole). When the run ends the launcher combines the parts
into the dataset ``ID`` under ``MINARI_DATASETS_PATH`` (``combine_parts``) and removes them.

An actor keeps at most ``MAX_STEPS_PER_ACTOR`` steps (then it logs once and records no more).
The spaces are those the policy server takes (``apexrl.external.spaces``): a Box observation
and a Discrete or Box action; other envs are refused at start with the reason.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import numpy as np

from apexrl.config import Config
from apexrl.offline.minari_datasets import DatasetError, write_dataset

log = logging.getLogger(__name__)

MAX_STEPS_PER_ACTOR = 1_000_000
PARTS = "dataset_parts"


def parts_dir(cfg: Config) -> Path:
    return cfg.run_dir / PARTS


class TrainingEpisodes:
    """The whole episodes of one training actor's envs, for ``run.output_dataset``."""

    def __init__(self, cfg: Config, actor_id: int, num_envs: int) -> None:
        from apexrl.external.spaces import ExternalSpaces

        self.cfg, self.actor_id = cfg, actor_id
        self.spaces = ExternalSpaces(cfg)  # SpaceError for spaces a dataset cannot take here
        self.current: list[dict | None] = [None] * num_envs
        self.episodes: list[dict] = []
        self.steps = 0

    def add(self, obs: np.ndarray, action: np.ndarray, step) -> None:
        """One vector step: ``obs`` the actions were chosen on, the actions, what the envs did."""
        if self.steps >= MAX_STEPS_PER_ACTOR:
            return
        ended = step.terminated | step.truncated
        for b, episode in enumerate(self.current):
            if episode is None:
                episode = self.current[b] = {"seed": None, "observations": [obs[b].copy()]}
                for key in ("actions", "rewards", "terminations", "truncations"):
                    episode[key] = []
            episode["actions"].append(self.spaces.action_out(action[b]))
            episode["rewards"].append(float(step.reward[b]))
            episode["terminations"].append(bool(step.terminated[b]))
            episode["truncations"].append(bool(step.truncated[b]))
            episode["observations"].append(step.next_obs[b].copy())
            if ended[b]:
                self.episodes.append(episode)
                self.current[b] = None
        self.steps += len(obs)
        if self.steps >= MAX_STEPS_PER_ACTOR:
            log.warning("run.output_dataset: %d steps recorded, no more", self.steps)

    def close(self) -> None:
        """Write the whole episodes as this actor's part (none: nothing is written)."""
        if not self.episodes:
            return
        os.environ["MINARI_DATASETS_PATH"] = str(parts_dir(self.cfg).resolve())
        try:
            write_dataset(
                f"actor{self.actor_id}-v0",
                self.episodes,
                self.cfg.env.id,
                self.spaces.obs_space,
                self.spaces.env_action_space,
                f"apexrl {self.cfg.algorithm}, training actor {self.actor_id}",
            )
        except DatasetError as exc:
            log.error("run.output_dataset: %s", exc)
            return
        log.info(
            "run.output_dataset: %d episodes of actor %d written", len(self.episodes), self.actor_id
        )


def make_training_episodes(cfg: Config, actor_id: int, num_envs: int) -> TrainingEpisodes | None:
    return TrainingEpisodes(cfg, actor_id, num_envs) if cfg.run.output_dataset else None


def combine_parts(cfg: Config) -> None:
    """The launcher, after every actor stopped: the parts as the dataset ``run.output_dataset``,
    then the parts removed; a failure is logged and the parts are kept."""
    folder = parts_dir(cfg)
    parts = sorted(p for p in folder.glob("*") if (p / "data").is_dir()) if folder.is_dir() else []
    if not parts:
        log.warning("run.output_dataset: no actor wrote episodes")
        return
    import minari

    from apexrl.offline.minari_datasets import absolute_datasets_path

    absolute_datasets_path()
    try:
        from minari.storage import get_dataset_path

        get_dataset_path(cfg.run.output_dataset).parent.mkdir(parents=True, exist_ok=True)
        datasets = [minari.MinariDataset(p / "data") for p in parts]
        combined = minari.combine_datasets(datasets, cfg.run.output_dataset)
    except Exception as exc:  # Minari's and h5py's own errors: keep the parts to retry by hand
        log.error(
            "run.output_dataset %s: not written (%s); the parts are in %s",
            cfg.run.output_dataset,
            exc,
            folder,
        )
        return
    shutil.rmtree(folder, ignore_errors=True)
    log.info(
        "run.output_dataset %s: %d episodes, %d steps of %d actors",
        cfg.run.output_dataset,
        combined.total_episodes,
        combined.total_steps,
        len(parts),
    )

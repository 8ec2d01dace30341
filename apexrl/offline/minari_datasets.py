"""Episodes written as Farama Minari datasets, readable by ``minari.load_dataset(ID)`` as they are.

``apexrl evaluate RUN --episodes N --dataset ID`` records the N counted episodes it plays. The
episodes are taken from the user's env itself (``RecordEpisodeSteps`` wraps it below apexrl's
space flattening and action rescaling), so the dataset holds the env's own observations and
actions, in its own spaces, as Minari's ``DataCollector`` would record them. The dataset is made
with Minari's ``EpisodeBuffer`` and ``create_dataset_from_buffers``, which need neither JAX nor
a ``DataCollector``; it goes under ``MINARI_DATASETS_PATH`` (Minari's default,
``~/.minari/datasets``, otherwise).

A dataset id is Minari's ``[namespace/]name-v<version>``. An id that is already taken is refused
before anything is played: nothing of an existing dataset is overwritten.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np

DATASET_ID = re.compile(r"^([A-Za-z0-9_.-]+/)*[A-Za-z0-9_.]+(-[A-Za-z0-9_.]+)*-v\d+$")


class DatasetError(RuntimeError):
    """A dataset cannot be written: a bad or taken id, a missing package."""


def check_dataset_id(dataset_id: str) -> None:
    """Refuse an id Minari cannot parse, a missing package, or an id already in use."""
    if not DATASET_ID.match(dataset_id):
        raise DatasetError(
            f"dataset id {dataset_id!r} is not Minari's [namespace/]name-v<version> "
            "(e.g. cartpole/apexrl-ppo-v0)"
        )
    for module in ("minari", "h5py"):
        if importlib.util.find_spec(module) is None:
            raise DatasetError(
                "datasets need minari with h5py: pip install 'minari[hdf5]' "
                "(scripts/install.sh does)"
            )
    absolute_datasets_path()
    import minari

    if dataset_id in minari.list_local_datasets():
        raise DatasetError(f"dataset {dataset_id} exists already; give another id or delete it")


def absolute_datasets_path() -> None:
    """Make a relative ``MINARI_DATASETS_PATH`` absolute (Minari 0.5 joins a relative one twice)."""
    path = os.environ.get("MINARI_DATASETS_PATH")
    if path:
        os.environ["MINARI_DATASETS_PATH"] = str(Path(path).resolve())


class RecordEpisodeSteps(gym.Wrapper):
    """Keep the first ``num_episodes`` whole episodes of an env (from a reset to its
    terminated or truncated step) in ``episodes``: observations (one more than actions),
    actions, rewards, terminations, truncations and the reset's seed."""

    def __init__(self, env: gym.Env, num_episodes: int, episodes: list[dict]) -> None:
        super().__init__(env)
        self.num_episodes, self.episodes = num_episodes, episodes
        self.kept = 0
        self.current: dict | None = None

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.current = None
        if self.kept < self.num_episodes:
            seed = kwargs.get("seed")
            self.current = {
                "seed": seed,
                "observations": [obs],
                "actions": [],
                "rewards": [],
                "terminations": [],
                "truncations": [],
            }
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        episode = self.current
        if episode is not None:
            episode["observations"].append(obs)
            episode["actions"].append(action)
            episode["rewards"].append(float(reward))
            episode["terminations"].append(bool(terminated))
            episode["truncations"].append(bool(truncated))
            if terminated or truncated:
                self.episodes.append(episode)
                self.kept += 1
                self.current = None
        return obs, reward, terminated, truncated, info


def stack(values: list, space: gym.Space):
    """A list of one episode's values of ``space`` as Minari stores them: arrays over time,
    per key for a Dict space, per part for a Tuple."""
    if isinstance(space, gym.spaces.Dict):
        return {key: stack([v[key] for v in values], part) for key, part in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(stack([v[i] for v in values], part) for i, part in enumerate(space.spaces))
    return np.asarray(values, dtype=space.dtype)


def write_dataset(
    dataset_id: str,
    episodes: list[dict],
    env_id: str,
    observation_space: gym.Space,
    action_space: gym.Space,
    algorithm_name: str,
):
    """Write ``episodes`` (``RecordEpisodeSteps``'s) as the Minari dataset ``dataset_id``
    (checked by ``check_dataset_id``); on a failure what was written of it is removed and
    ``DatasetError`` says why."""
    import warnings

    absolute_datasets_path()
    import minari
    from minari.data_collector import EpisodeBuffer
    from minari.storage import get_dataset_path

    buffers = [
        EpisodeBuffer(
            id=i,
            seed=episode["seed"],
            observations=stack(episode["observations"], observation_space),
            actions=stack(episode["actions"], action_space),
            rewards=episode["rewards"],
            terminations=episode["terminations"],
            truncations=episode["truncations"],
            infos={},
        )
        for i, episode in enumerate(episodes)
    ]
    try:
        with warnings.catch_warnings():  # Minari's warnings about metadata a user may add later
            warnings.simplefilter("ignore", UserWarning)
            return minari.create_dataset_from_buffers(
                dataset_id,
                buffers,
                env=env_id,
                algorithm_name=algorithm_name,
                observation_space=observation_space,
                action_space=action_space,
                description=f"{len(buffers)} episodes of {env_id} played by apexrl",
            )
    except Exception as exc:  # OSError, h5py's and Minari's own: the dataset is not usable
        shutil.rmtree(get_dataset_path(dataset_id), ignore_errors=True)
        raise DatasetError(f"cannot write dataset {dataset_id}: {exc}") from exc

"""Callbacks classes that tests name in a run's config
(``callbacks: tests.callbacks_for_tests:EpisodeLength``; the launcher puts the repository root on
the roles' ``PYTHONPATH``, so ``tests`` imports as a namespace package)."""

from __future__ import annotations

import numpy as np


class EpisodeLength:
    """Custom metrics a reader can check against the run's own: ``episode_len_x2`` is twice the
    episode's length; ``steps_seen`` counts the env steps of the episode that ``on_step`` saw;
    ``learner_updates_x3`` is three times the record's learner updates."""

    def __init__(self) -> None:
        self.steps_seen: np.ndarray | None = None
        self.started = 0

    def on_episode_start(self, env_index: int, obs: np.ndarray) -> None:
        self.started += 1

    def on_step(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
    ) -> None:
        if self.steps_seen is None:
            self.steps_seen = np.zeros(len(rewards), dtype=np.int64)
        self.steps_seen += 1

    def on_episode_end(
        self, env_index: int, episode_return: float, episode_length: int
    ) -> dict[str, float]:
        assert self.steps_seen is not None
        seen = int(self.steps_seen[env_index])
        self.steps_seen[env_index] = 0
        return {
            "episode_len_x2": 2.0 * episode_length,
            "steps_seen_minus_length": float(seen - episode_length),
        }

    def on_train_result(self, result: dict) -> dict[str, float]:
        return {"learner_updates_x3": 3.0 * result["learner_updates"]}


class RaisesInInit:
    def __init__(self) -> None:
        raise RuntimeError("no licence for this callback")


NOT_A_CLASS = 42

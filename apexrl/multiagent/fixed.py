"""Fixed policies: players of a multi-agent run that are no network and never train.

- ``random``: a uniform draw over the legal actions (every action where the agent brings no mask);
  a Box action uniform within its bounds.
- a scripted ``module:Class``: made once per actor as ``Class(observation_space, action_space)``
  (the spaces its agents share, as the networks see them: ``apexrl.multiagent.envs``) and asked for
  a batch at a time::

      def compute_actions(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
          # obs [B, *obs]; mask [B, A] bool (True: legal) or None; returns [B] (or [B, *action])

  What it returns is checked: the batch's length, integers within the action space for a Discrete
  one, and legal where a mask was given; anything else stops the actor with a message that names
  the class.

A fixed player may also be another run's network policy, ``checkpoint:PATH[#POLICY]``
(``apexrl.multiagent.checkpoint_player``, which ``fixed_player_policy`` there dispatches to).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from apexrl.config import ConfigError
from apexrl.config.rules import FIXED_CHECKPOINT, FIXED_RANDOM
from apexrl.multiagent.config import load_function


class RandomPolicy:
    """Uniform over the legal actions."""

    def __init__(self, action_space: gym.Space, rng: np.random.Generator) -> None:
        self.space, self.rng = action_space, rng

    def compute_actions(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        return random_actions(self.space, len(obs), mask, self.rng)


def random_actions(
    space: gym.Space, num: int, mask: np.ndarray | None, rng: np.random.Generator
) -> np.ndarray:
    """``num`` uniform actions of ``space``, each legal under its row of ``mask`` [num, A]."""
    if isinstance(space, gym.spaces.Discrete):
        if mask is None:
            return rng.integers(0, space.n, size=num)
        # a uniform legal index per row: the argmax of uniform noise over the legal entries
        noise = np.where(mask, rng.random(mask.shape), -1.0)
        return noise.argmax(axis=1).astype(np.int64)
    if isinstance(space, gym.spaces.Box):
        return rng.uniform(space.low, space.high, size=(num, *space.shape)).astype(np.float32)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return rng.integers(0, space.nvec, size=(num, *space.nvec.shape)).astype(np.int64)
    raise ConfigError(f"a random policy does not act in {space}")


class ScriptedPolicy:
    """A user's class behind the checks of what it returns (module docstring)."""

    def __init__(self, name: str, obs_space: gym.Space, action_space: gym.Space) -> None:
        self.name, self.space = name, action_space
        cls = load_function("multiagent.policies[].fixed", name)
        try:
            self.player: Any = cls(obs_space, action_space)
        except Exception as exc:
            raise ConfigError(f"scripted policy {name!r} failed to start: {exc}") from exc
        if not callable(getattr(self.player, "compute_actions", None)):
            raise ConfigError(f"scripted policy {name!r} has no compute_actions(obs, mask)")

    def compute_actions(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        actions = np.asarray(self.player.compute_actions(obs, mask))
        if len(actions) != len(obs):
            raise RuntimeError(
                f"scripted policy {self.name!r} gave {len(actions)} actions for {len(obs)} agents"
            )
        if isinstance(self.space, gym.spaces.Discrete):
            if actions.dtype.kind not in "iu" or actions.ndim != 1:
                raise RuntimeError(f"scripted policy {self.name!r} must give [B] integer actions")
            if (actions < 0).any() or (actions >= self.space.n).any():
                raise RuntimeError(f"scripted policy {self.name!r} gave an action outside 0..n-1")
            if mask is not None and not mask[np.arange(len(actions)), actions].all():
                raise RuntimeError(f"scripted policy {self.name!r} chose an illegal action")
            return actions.astype(np.int64)
        return actions


def make_fixed_policy(
    fixed: str, obs_space: gym.Space, action_space: gym.Space, rng: np.random.Generator
) -> RandomPolicy | ScriptedPolicy:
    """The random or scripted policy ``multiagent.policies[].fixed`` names (another run's
    checkpoint: ``apexrl.multiagent.checkpoint_player``)."""
    if fixed == FIXED_RANDOM:
        return RandomPolicy(action_space, rng)
    if fixed.startswith(FIXED_CHECKPOINT):
        raise ConfigError(f"{fixed!r} is a checkpoint player: apexrl.multiagent.checkpoint_player")
    return ScriptedPolicy(fixed, obs_space, action_space)

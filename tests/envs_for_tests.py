"""Envs and wrappers that tests name as entry points in a config (``tests.envs_for_tests:...``):
roles import this module by that name, the repository being on their ``PYTHONPATH``."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    """Walk right along a corridor of ``length`` cells: action 1 moves right, 0 stays; reward 1
    and the end of the episode at the last cell. The observation is the position."""

    def __init__(self, length: int = 3) -> None:
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, float(length), shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.position = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self.position = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple:
        self.position += int(action)
        at_end = self.position >= self.length - 1
        return self._obs(), float(at_end), at_end, False, {}

    def _obs(self) -> np.ndarray:
        return np.array([self.position], dtype=np.float32)


def make_corridor(length: int = 3) -> gym.Env:
    return Corridor(length)


def make_cartpole(**kwargs) -> gym.Env:
    """Gymnasium's CartPole-v1, made by a user's function."""
    return gym.make("CartPole-v1", **kwargs)


class AddToReward(gym.RewardWrapper):
    """A user's wrapper with an argument: adds ``bonus`` to every reward."""

    def __init__(self, env: gym.Env, bonus: float) -> None:
        super().__init__(env)
        self.bonus = bonus

    def reward(self, reward: float) -> float:
        return reward + self.bonus


def not_an_env() -> list:
    return []


def broken_env(size: int = 1) -> gym.Env:
    raise ValueError(f"size {size} is too small")


NOT_CALLABLE = 3


class TaskReward(gym.Env):
    """Episodes of ``length`` steps whose every reward is the task's ``reward`` (1 before any
    task): an env that takes tasks (``set_task``, RLlib's TaskSettableEnv convention)."""

    def __init__(self, length: int = 10) -> None:
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, float(length), shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.reward, self.t = 1.0, 0

    def set_task(self, task: dict) -> None:
        self.reward = float(task["reward"])

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], dtype=np.float32), {}

    def step(self, action: int) -> tuple:
        self.t += 1
        obs = np.array([self.t], dtype=np.float32)
        return obs, self.reward, self.t >= self.length, False, {}


def make_scaled_cartpole(scale: float = 1000.0, offset: float = 0.0) -> gym.Env:
    """CartPole-v1 whose observations are ``obs * scale + offset`` (a sensor's raw counts): the
    same task, on inputs far from a network's unit range (``algo.normalize_obs`` brings them
    back)."""
    env = gym.make("CartPole-v1")
    space = env.observation_space
    low, high = space.low * scale + offset, space.high * scale + offset
    scaled = gym.spaces.Box(low, high, dtype=np.float32)
    return gym.wrappers.TransformObservation(
        env, lambda obs: (obs * scale + offset).astype(np.float32), scaled
    )

"""Gymnasium vector environments for actors, and the project's own partially observable CartPole
(``apexrl/CartPoleNoVelocity-v1``).

Vector envs autoreset in ``SAME_STEP`` mode: when an episode ends, ``step`` returns the reset
observation and puts the episode's final observation in ``info["final_obs"]``. ``step_vector``
returns that final observation as ``next_obs`` of the ending step, so a transition never spans two
episodes (the default ``NEXT_STEP`` mode would produce one garbage step after every episode end).
"""

from __future__ import annotations

from typing import NamedTuple

import gymnasium as gym
import numpy as np

from apexrl.config import Config, EnvConfig


class MaskObservation(gym.ObservationWrapper):
    """Keeps only the entries ``keep`` of a flat ``Box`` observation: a partially observable
    version of an env (e.g. CartPole without its velocities, which then have to be inferred from
    the history, as a recurrent agent can and a feed-forward one cannot)."""

    def __init__(self, env: gym.Env, keep: tuple[int, ...]) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ValueError(f"MaskObservation needs a flat Box observation, got {space}")
        self.keep = np.asarray(keep, dtype=np.int64)
        self.observation_space = gym.spaces.Box(
            space.low[self.keep], space.high[self.keep], dtype=space.dtype
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[self.keep]


def cartpole_without_velocity(**kwargs) -> gym.Env:
    """CartPole-v1 observing only the cart position and the pole angle (no velocities)."""
    from gymnasium.envs.classic_control import CartPoleEnv

    return MaskObservation(CartPoleEnv(**kwargs), keep=(0, 2))


# Configs name it as ``env.id``; registered when any role imports this module (they all make
# their envs through it).
CARTPOLE_NO_VELOCITY_ID = "apexrl/CartPoleNoVelocity-v1"
if CARTPOLE_NO_VELOCITY_ID not in gym.registry:
    gym.register(
        id=CARTPOLE_NO_VELOCITY_ID,
        entry_point="apexrl.envs:cartpole_without_velocity",
        max_episode_steps=500,
        reward_threshold=475.0,
    )


class EnvError(RuntimeError):
    """The configured environment cannot be made (unknown id, missing package, bad spaces)."""


class VectorStep(NamedTuple):
    obs: np.ndarray  # [B, *obs] observation to act on next (reset obs where an episode ended)
    next_obs: np.ndarray  # [B, *obs] the observation the step led to (final obs at episode ends)
    reward: np.ndarray  # [B] float32
    terminated: np.ndarray  # [B] bool
    truncated: np.ndarray  # [B] bool


def _env_kwargs(cfg: EnvConfig) -> dict:
    return {"max_episode_steps": cfg.max_episode_steps} if cfg.max_episode_steps > 0 else {}


def check_action_space(cfg: Config, action_space: gym.Space) -> None:
    """Raise ``EnvError`` unless the algorithm can act in ``action_space`` (the kinds its
    hyperparameter class lists in ``ACTION_SPACES``)."""
    kinds = cfg.algo.ACTION_SPACES
    if type(action_space).__name__ not in kinds:
        raise EnvError(
            f"environment {cfg.env.id!r} has action space {action_space}; {cfg.algorithm} "
            f"needs a {' or '.join(kinds)} action space"
        )


def check_env(cfg: Config) -> None:
    """Make one env of ``cfg`` and check its action space against the algorithm, as every actor
    and learner will: raises ``EnvError`` with one line (the launcher calls it before it starts
    any role)."""
    try:
        env = gym.make(cfg.env.id, **_env_kwargs(cfg.env))
    except gym.error.Error as exc:
        raise EnvError(f"cannot make environment {cfg.env.id!r}: {exc}") from exc
    except ImportError as exc:
        raise EnvError(
            f"environment {cfg.env.id!r} needs a package that is missing: {exc}"
        ) from exc
    try:
        check_action_space(cfg, env.action_space)
    finally:
        env.close()


def make_vector_env(
    cfg: EnvConfig, num_envs: int, unit_actions: bool = False
) -> gym.vector.VectorEnv:
    """``num_envs`` envs of ``cfg``. A ``Box`` action space takes actions as they are and clips
    them to its bounds, or, with ``unit_actions``, takes actions in [-1, 1] and maps them affinely
    onto its bounds (a tanh-squashed policy's range)."""
    try:
        envs = gym.make_vec(
            cfg.id,
            num_envs=num_envs,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
            **_env_kwargs(cfg),
        )
    except gym.error.Error as exc:
        raise EnvError(f"cannot make environment {cfg.id!r}: {exc}") from exc
    except ImportError as exc:
        raise EnvError(f"environment {cfg.id!r} needs a package that is missing: {exc}") from exc
    if isinstance(envs.single_action_space, gym.spaces.Box):
        if unit_actions:
            envs = gym.wrappers.vector.RescaleAction(envs, min_action=-1.0, max_action=1.0)
        else:
            # A Gaussian policy samples unbounded actions and trains on what it sampled; the
            # env gets them clipped to its bounds.
            envs = gym.wrappers.vector.ClipAction(envs)
    return envs


def step_vector(envs: gym.vector.VectorEnv, actions: np.ndarray) -> VectorStep:
    obs, reward, terminated, truncated, info = envs.step(actions)
    next_obs = obs
    ended = np.logical_or(terminated, truncated)
    if ended.any():
        next_obs = obs.copy()
        final = info["final_obs"]
        for i in np.flatnonzero(ended):
            next_obs[i] = final[i]
    return VectorStep(
        obs=obs,
        next_obs=next_obs,
        reward=np.asarray(reward, dtype=np.float32),
        terminated=np.asarray(terminated, dtype=bool),
        truncated=np.asarray(truncated, dtype=bool),
    )

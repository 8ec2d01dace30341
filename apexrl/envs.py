"""Gymnasium vector environments for actors, and the project's own partially observable CartPole
(``apexrl/CartPoleNoVelocity-v1``).

Vector envs autoreset in ``SAME_STEP`` mode: when an episode ends, ``step`` returns the reset
observation and puts the episode's final observation in ``info["final_obs"]``. ``step_vector``
returns that final observation as ``next_obs`` of the ending step, so a transition never spans two
episodes (the default ``NEXT_STEP`` mode would produce one garbage step after every episode end).

An env id whose gymnasium spec has a vector entry point (CartPole: ``CartPoleVectorEnv``, all envs
in one set of numpy operations, several times faster than a ``SyncVectorEnv`` of single envs from
8 envs on) is made with it when that class autoresets in ``SAME_STEP`` mode or apexrl adapts it
(``CartPoleSameStep``) and there are at least ``MIN_ENVS_FOR_VECTOR_ENTRY_POINT`` envs; any other
env is a ``SyncVectorEnv``.
"""

from __future__ import annotations

from typing import NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.envs.registration import load_env_creator
from gymnasium.vector import AutoresetMode

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


class CartPoleSameStep(gym.vector.VectorWrapper):
    """Gymnasium's ``CartPoleVectorEnv`` autoresetting in ``SAME_STEP`` mode.

    ``CartPoleVectorEnv`` only autoresets in ``NEXT_STEP`` mode: an env whose episode ended is
    reset by its next ``step``, which ignores that env's action and returns reward 0. This wrapper
    resets the ended envs within the step that ended them instead, drawing their new state as
    ``CartPoleVectorEnv`` does (uniform in ``[low, high)`` from its generator, step count 0), so
    the env's own reset never runs. The step returns the reset observations and puts the final
    ones in ``info["final_obs"]`` (``[B, 4]``, rows of the envs flagged in ``info["_final_obs"]``).
    """

    def __init__(self, env: gym.vector.VectorEnv) -> None:
        if not isinstance(env.unwrapped, CartPoleVectorEnv):
            raise TypeError(f"CartPoleSameStep wraps a CartPoleVectorEnv, got {env.unwrapped}")
        super().__init__(env)
        self.metadata = {**env.metadata, "autoreset_mode": AutoresetMode.SAME_STEP}

    def step(self, actions: np.ndarray) -> tuple:
        obs, reward, terminated, truncated, info = self.env.step(actions)
        ended = terminated | truncated
        if not ended.any():
            return obs, reward, terminated, truncated, info
        cartpole = self.env.unwrapped
        state = cartpole.np_random.uniform(
            low=cartpole.low, high=cartpole.high, size=(4, int(ended.sum()))
        )
        cartpole.state[:, ended] = state
        cartpole.steps[ended] = 0
        cartpole.prev_done[:] = False  # reset here: the next step moves every env
        reset_obs = obs.copy()
        reset_obs[ended] = state.T
        info = {**info, "final_obs": obs, "_final_obs": ended}
        return reset_obs, reward, terminated, truncated, info


# NEXT_STEP vector envs of gymnasium that apexrl resets in the same step.
SAME_STEP_ADAPTERS = {CartPoleVectorEnv: CartPoleSameStep}
# Fewer envs than this step faster as a SyncVectorEnv of single envs: a numpy vector env's step
# costs about the same for 1 env as for 16 (CartPole at 1 env: a third of the sync rate; the two
# are even at 2 to 4 envs).
MIN_ENVS_FOR_VECTOR_ENTRY_POINT = 4


def _vector_entry_point_env(cfg: EnvConfig, num_envs: int) -> gym.vector.VectorEnv | None:
    """The id's own vector env when it autoresets in ``SAME_STEP`` mode or has an adapter; None
    when the id has no vector entry point, one that apexrl cannot use, or too few envs."""
    spec = gym.spec(cfg.id)
    if spec.vector_entry_point is None or num_envs < MIN_ENVS_FOR_VECTOR_ENTRY_POINT:
        return None
    try:
        vector_class = load_env_creator(spec.vector_entry_point)
    except ImportError:  # e.g. an accelerated version whose package is missing
        return None
    mode = getattr(vector_class, "metadata", {}).get("autoreset_mode")
    adapter = SAME_STEP_ADAPTERS.get(vector_class)
    if mode != AutoresetMode.SAME_STEP and adapter is None:
        return None
    envs = gym.make_vec(
        cfg.id, num_envs=num_envs, vectorization_mode="vector_entry_point", **_env_kwargs(cfg)
    )
    return envs if adapter is None else adapter(envs)


def make_vector_env(
    cfg: EnvConfig, num_envs: int, unit_actions: bool = False
) -> gym.vector.VectorEnv:
    """``num_envs`` envs of ``cfg``, autoresetting in ``SAME_STEP`` mode: the id's own vector env
    where apexrl can use it (see the module docstring), otherwise a ``SyncVectorEnv``. A ``Box``
    action space takes actions as they are and clips them to its bounds, or, with
    ``unit_actions``, takes actions in [-1, 1] and maps them affinely onto its bounds (a
    tanh-squashed policy's range)."""
    try:
        envs = _vector_entry_point_env(cfg, num_envs)
        if envs is None:
            envs = gym.make_vec(
                cfg.id,
                num_envs=num_envs,
                vectorization_mode="sync",
                vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
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
    ended = terminated | truncated
    if ended.any():
        next_obs = obs.copy()
        final = info["final_obs"]
        if final.dtype == object:  # SyncVectorEnv: one entry per env, None where none ended
            for i in np.flatnonzero(ended):
                next_obs[i] = final[i]
        else:  # a numpy vector env: one [B, *obs] array
            next_obs[ended] = final[ended]
    return VectorStep(
        obs=obs,
        next_obs=next_obs,
        reward=np.asarray(reward, dtype=np.float32),
        terminated=np.asarray(terminated, dtype=bool),
        truncated=np.asarray(truncated, dtype=bool),
    )

"""What an external environment may send and is sent: its observations checked against the run
env's observation space, and actions converted between the env's units and the network's.

The network acts in the spaces every actor sees (``envs.make_vector_env``): a Discrete index,
or a Box action in [-1, 1] where the run rescales (``Config.unit_actions``) and in the env's
bounds otherwise. A client sends and gets the env's own: the observation as ``env.step`` gives
it, the action as ``env.step`` takes it.

External envs take a Box observation and a Discrete or Box action: nested spaces (packed into
byte rows for the actors' envs), Atari (whose frames the actors' envs preprocess and stack) and
recurrent networks (whose state is per env of a vector) are refused at start with the reason.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from apexrl.config import Config
from apexrl.envs import atari, flat_env
from apexrl.envs.nested import HybridActions, PackedBox

# Algorithms whose actor core acts on a batch of any envs with no state between steps.
RECURRENT_FAMILIES = ("r2d2",)


class SpaceError(ValueError):
    """An observation or action that does not fit the run's env."""


def unsupported(cfg: Config) -> str:
    """Why a policy server cannot serve ``cfg``'s env; "" when it can."""
    if atari.is_atari(cfg.env.id) and not cfg.env.wrappers:
        return "external envs do not take Atari envs (their frames are preprocessed per env)"
    if cfg.algorithm in RECURRENT_FAMILIES or getattr(cfg.algo, "lstm_size", 0) > 0:
        return "external envs take feed-forward networks (a recurrent state is per vector env)"
    return ""


class ExternalSpaces:
    """The run env's observation space and its action space, as the env and as the network
    see them."""

    def __init__(self, cfg: Config) -> None:
        env = flat_env(cfg.env, cfg.unit_actions, cfg.product_discrete)
        try:
            self.obs_space, self.env_action_space = env.observation_space, env.action_space
        finally:
            env.close()
        if isinstance(self.obs_space, PackedBox) or not isinstance(self.obs_space, gym.spaces.Box):
            raise SpaceError(
                f"external envs take a Box observation, got {self.obs_space} (nested "
                "observations are not served yet)"
            )
        action = self.env_action_space
        if isinstance(action, HybridActions) or not isinstance(
            action, (gym.spaces.Discrete, gym.spaces.Box)
        ):
            raise SpaceError(f"external envs take a Discrete or Box action, got {action}")
        self.discrete = isinstance(action, gym.spaces.Discrete)
        self.unit = cfg.unit_actions and not self.discrete
        if not self.discrete:
            self.low = action.low.astype(np.float64)
            self.high = action.high.astype(np.float64)

    def obs_in(self, obs: np.ndarray) -> np.ndarray:
        """A client's observation as the network takes it: the space's shape and dtype."""
        space = self.obs_space
        obs = np.asarray(obs)
        if obs.shape != space.shape:
            raise SpaceError(f"observation has shape {obs.shape}, the env's is {space.shape}")
        if not np.can_cast(obs.dtype, space.dtype, "same_kind"):
            raise SpaceError(f"observation has dtype {obs.dtype}, the env's is {space.dtype}")
        obs = obs.astype(space.dtype, copy=False)
        if obs.dtype.kind == "f" and not np.isfinite(obs).all():
            raise SpaceError("observation holds a NaN or an infinity")
        return obs

    def action_out(self, action: np.ndarray) -> np.ndarray:
        """The network's action as the env takes it."""
        if self.discrete:
            return np.asarray(action, dtype=np.int64).reshape(())
        action = np.asarray(action, dtype=np.float64)
        if self.unit:
            action = self.low + (np.clip(action, -1.0, 1.0) + 1.0) * 0.5 * (self.high - self.low)
        return np.clip(action, self.low, self.high).astype(self.env_action_space.dtype)

    def action_in(self, action: np.ndarray) -> np.ndarray:
        """An action a client took, in the env's units, as the network would have taken it."""
        space = self.env_action_space
        action = np.asarray(action)
        if self.discrete:
            if action.size != 1 or action.dtype.kind not in "iu":
                raise SpaceError(
                    f"a Discrete action is one integer, got {action.dtype} {action.shape}"
                )
            index = int(action.reshape(()))
            if not 0 <= index < space.n:
                raise SpaceError(f"action {index} is outside 0..{space.n - 1}")
            return np.asarray(index, dtype=np.int64)
        if action.shape != space.shape or action.dtype.kind not in "fiu":
            raise SpaceError(f"action has shape {action.shape}, the env's is {space.shape}")
        action = action.astype(np.float64)
        if not np.isfinite(action).all() or (action < self.low).any() or (action > self.high).any():
            raise SpaceError("action is outside the env's bounds")
        if self.unit:
            span = np.where(self.high > self.low, self.high - self.low, 1.0)
            action = 2.0 * (action - self.low) / span - 1.0
        return action.astype(np.float32)

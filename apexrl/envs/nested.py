"""Nested spaces as the flat ones every role handles (``apexrl.envs.packing``):

- ``PackedObservation``: a ``Dict`` or ``Tuple`` observation of Boxes as one uint8 byte row, its
  space a ``PackedBox`` that carries the layout (the networks read the parts through it);
- ``PackedActions``: a ``Tuple`` or ``Dict`` action of Discrete and Box parts taken as one float32
  row, its space a ``HybridActions`` that carries the layout (PPO and IMPALA sample it from a
  product distribution);
- ``ProductDiscrete``: a small ``MultiDiscrete`` action taken as one index of their product
  (Ape-X and R2D2 read Q-values of single actions only).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from apexrl.envs.packing import ActionLayout, PackedLayout

MAX_PRODUCT_ACTIONS = 256  # the most actions a MultiDiscrete's product Discrete may have


class PackedBox(gym.spaces.Box):
    """The uint8 ``[nbytes]`` rows of a nested observation space; ``layout`` says where each
    part lies, ``nested_space`` is the env's own space."""

    def __init__(self, space: gym.Space) -> None:
        self.layout = PackedLayout.from_space(space)
        self.nested_space = space
        super().__init__(0, 255, (self.layout.nbytes,), np.uint8)


class HybridActions(gym.spaces.Box):
    """The float32 ``[K + D]`` rows of a Tuple or Dict action space of Discrete and Box parts:
    ``layout`` says which entries are Discrete indices and which Box values."""

    def __init__(self, space: gym.Space) -> None:
        self.layout = ActionLayout.from_space(space)
        self.nested_space = space
        layout = self.layout
        low = np.concatenate([np.zeros(layout.num_discrete, np.float32), layout.low])
        high = np.concatenate([np.asarray(layout.nvec, np.float32) - 1, layout.high])
        super().__init__(low, high, (layout.width,), np.float32)


def is_nested(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Dict | gym.spaces.Tuple)


class PackedObservation(gym.ObservationWrapper):
    """A ``Dict`` or ``Tuple`` observation of Boxes as one uint8 row (``apexrl.envs.packing``)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = PackedBox(env.observation_space)

    def observation(self, observation: Any) -> np.ndarray:
        return self.observation_space.layout.pack(observation)


class PackedActions(gym.ActionWrapper):
    """A ``Tuple`` or ``Dict`` action of Discrete and Box parts taken as one float32 row; with
    ``unit`` the Box values come in [-1, 1] and are mapped onto their bounds, otherwise they are
    clipped to them."""

    def __init__(self, env: gym.Env, unit: bool = False) -> None:
        super().__init__(env)
        self.action_space = HybridActions(env.action_space)
        self.unit = unit

    def action(self, action: Any) -> Any:
        return self.action_space.layout.nested(action, self.unit)


class ProductDiscrete(gym.ActionWrapper):
    """A ``MultiDiscrete`` action taken as one index of ``Discrete(prod(nvec))`` (row-major: the
    last part varies fastest)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.action_space
        self.nvec = tuple(int(n) for n in np.asarray(space.nvec).ravel())
        if np.asarray(space.nvec).ndim != 1 or np.any(np.asarray(space.start) != 0):
            raise ValueError(f"only a flat MultiDiscrete starting at 0 has a product: {space}")
        size = int(np.prod(self.nvec, dtype=np.int64))
        if size > MAX_PRODUCT_ACTIONS:
            raise ValueError(
                f"the action space {space} has {size} joint actions, more than the "
                f"{MAX_PRODUCT_ACTIONS} a Q-network head takes"
            )
        self.action_space = gym.spaces.Discrete(size)
        self.action_space.product_of = self.nvec  # what Policy.compute_actions gives back

    def action(self, action: Any) -> np.ndarray:
        return np.array(np.unravel_index(int(action), self.nvec), dtype=np.int64)


def flatten_spaces(env: gym.Env, unit_actions: bool, product_discrete: bool) -> gym.Env:
    """``env`` with its nested spaces made flat: observations packed, hybrid actions packed,
    and with ``product_discrete`` a MultiDiscrete action as its product Discrete."""
    if is_nested(env.observation_space):
        env = PackedObservation(env)
    if is_nested(env.action_space):
        env = PackedActions(env, unit_actions)
    elif product_discrete and isinstance(env.action_space, gym.spaces.MultiDiscrete):
        env = ProductDiscrete(env)
    return env

"""MinAtar (Young & Tian 2019): five Atari games on a 10x10 grid, where pixels can be learned on
two CPU cores in minutes.

``env.id: MinAtar/Breakout-v1`` (also ``Asterix``, ``Freeway``, ``Seaquest``, ``SpaceInvaders``;
the ``-v1`` ids use each game's minimal action set) is made by the ``minatar`` package's gymnasium
env and then ``MinAtarChannelsFirst``: its bool ``(10, 10, C)`` channels-last observation becomes
uint8 ``(C, 10, 10)``, 0 or 1, the layout every image torso reads (``apexrl.models.torsos``: the
MinAtar paper's network is ``minatar_cnn``, which ``auto`` picks for a 10x10 image).

MinAtar's own protocol holds: sticky actions with probability 0.1 and difficulty ramping (both in
``env.kwargs`` as ``sticky_action_prob`` and ``difficulty_ramping``); one env step is one frame
(no frame skip); rewards are game points, unclipped.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

PREFIX = "MinAtar/"
GAMES = ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")


def is_minatar(env_id: str) -> bool:
    return env_id.startswith(PREFIX)


def register() -> None:
    """Registers the ``MinAtar/<Game>-v0|v1`` ids (``minatar.gym``), once; ImportError when the
    package is missing."""
    if f"{PREFIX}Breakout-v1" in gym.registry:
        return
    import minatar.gym

    minatar.gym.register_envs()


class MinAtarChannelsFirst(gym.ObservationWrapper):
    """MinAtar's bool ``(H, W, C)`` observation as uint8 ``(C, H, W)`` of 0 and 1."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        height, width, channels = env.observation_space.shape
        self.observation_space = gym.spaces.Box(0, 1, (channels, height, width), dtype=np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.moveaxis(observation, -1, 0), dtype=np.uint8)

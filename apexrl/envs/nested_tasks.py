"""Three small tasks with nested spaces, for trying the families on them in a minute.

``apexrl/ImageAndVector-v0``: each step shows a ``Dict`` observation, ``image`` a uint8 8x8 picture
with one bright row out of 3 (and pixel noise) and ``vector`` a float32 one-hot of one of 3 items
(with noise); the action is ``MultiDiscrete([3, 3])``: the bright row and the item. Each part
right earns 0.5. 10 steps an episode: the optimum is 10, a random policy makes 10/3. Both parts
of the observation are needed, each for its own part of the action; the steps do not depend on
each other (a contextual bandit), so a few thousand episodes are enough.

``apexrl/RememberCue-v0``: a task for memory with a ``Dict`` observation: the first step's
``image`` (uint8 8x8, pixel noise) shows one bright row out of 3, the cue; later images are noise
alone. ``vector`` is float32 ``[cue shown, share of the episode left]``. The action is
``Discrete(3)``; each of the 10 steps earns 1 for the cue's row. The optimum is 10; a policy
without memory can answer right only at the first step, 1 + 9/3 = 4 at best; random 10/3.

``apexrl/HybridTarget-v0``: a flat float32 observation, a one-hot class of 3 and a target value
``x`` in [-0.8, 0.8]; the action is ``Tuple(Discrete(3), Box(-1, 1, (1,)))``: the class earns 0.5,
the value ``0.5 * max(0, 1 - 2 |v - x|)``. 10 steps an episode: the optimum is 10, random about
1.9.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

STEPS = 10  # per episode
ROWS = 3
SIDE = 8


def noisy_image(
    rng: np.random.Generator, bright_row: int | None, rows: int = ROWS, side: int = SIDE
) -> np.ndarray:
    """A uint8 ``(1, side, side)`` image of pixel noise (0..59) with row band ``bright_row`` of
    ``rows`` at 255 (None: noise alone)."""
    image = rng.integers(0, 60, (1, side, side)).astype(np.uint8)
    if bright_row is not None:
        band = side // rows
        image[0, bright_row * band : (bright_row + 1) * band] = 255
    return image


class ImageAndVector(gym.Env):
    """A Dict observation of a uint8 image and a float vector, a MultiDiscrete action;
    ``rows`` choices for each part and ``side`` pixels a side (3 and 8: the task as registered;
    more of either makes it harder)."""

    def __init__(self, rows: int = ROWS, side: int = SIDE) -> None:
        if not 2 <= rows <= side:
            raise ValueError(f"rows must be within 2..side, got rows={rows}, side={side}")
        self.rows, self.side = rows, side
        self.observation_space = gym.spaces.Dict(
            {
                "image": gym.spaces.Box(0, 255, (1, side, side), np.uint8),
                "vector": gym.spaces.Box(-2.0, 2.0, (rows,), np.float32),
            }
        )
        self.action_space = gym.spaces.MultiDiscrete([rows, rows])
        self.steps, self.answer = 0, (0, 0)

    def _observe(self) -> dict[str, np.ndarray]:
        rng, rows = self.np_random, self.rows
        row, item = int(rng.integers(rows)), int(rng.integers(rows))
        self.answer = (row, item)
        image = noisy_image(rng, row, rows, self.side)
        vector = (np.eye(rows, dtype=np.float32)[item] + rng.normal(0, 0.1, rows)).astype(
            np.float32
        )
        return {"image": image, "vector": np.clip(vector, -2, 2)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self._observe(), {}

    def step(self, action):
        action = np.asarray(action).ravel()
        reward = 0.5 * float(int(action[0]) == self.answer[0]) + 0.5 * float(
            int(action[1]) == self.answer[1]
        )
        self.steps += 1
        return self._observe(), reward, self.steps >= STEPS, False, {}


class RememberCue(gym.Env):
    """A Dict observation whose cue is shown at the first step only, a Discrete action."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Dict(
            {
                "image": gym.spaces.Box(0, 255, (1, SIDE, SIDE), np.uint8),
                "vector": gym.spaces.Box(0.0, 1.0, (2,), np.float32),
            }
        )
        self.action_space = gym.spaces.Discrete(ROWS)
        self.steps, self.cue = 0, 0

    def _observe(self) -> dict[str, np.ndarray]:
        shown = self.steps == 0
        image = noisy_image(self.np_random, self.cue if shown else None)
        left = (STEPS - self.steps) / STEPS
        return {"image": image, "vector": np.array([float(shown), left], dtype=np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps, self.cue = 0, int(self.np_random.integers(ROWS))
        return self._observe(), {}

    def step(self, action):
        reward = float(int(np.asarray(action).ravel()[0]) == self.cue)
        self.steps += 1
        return self._observe(), reward, self.steps >= STEPS, False, {}


class HybridTarget(gym.Env):
    """A flat observation, a Tuple(Discrete, Box) action."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (ROWS + 1,), np.float32)
        self.action_space = gym.spaces.Tuple(
            (gym.spaces.Discrete(ROWS), gym.spaces.Box(-1.0, 1.0, (1,), np.float32))
        )
        self.steps, self.answer = 0, (0, 0.0)

    def _observe(self) -> np.ndarray:
        rng = self.np_random
        item, target = int(rng.integers(ROWS)), float(rng.uniform(-0.8, 0.8))
        self.answer = (item, target)
        return np.append(np.eye(ROWS, dtype=np.float32)[item], np.float32(target))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self._observe(), {}

    def step(self, action):
        choice, value = action
        item, target = self.answer
        reward = 0.5 * float(int(choice) == item)
        reward += 0.5 * max(0.0, 1.0 - 2.0 * abs(float(np.asarray(value).ravel()[0]) - target))
        self.steps += 1
        return self._observe(), reward, self.steps >= STEPS, False, {}


IDS = {
    "apexrl/ImageAndVector-v0": "apexrl.envs.nested_tasks:ImageAndVector",
    "apexrl/HybridTarget-v0": "apexrl.envs.nested_tasks:HybridTarget",
    "apexrl/RememberCue-v0": "apexrl.envs.nested_tasks:RememberCue",
}
for env_id, entry_point in IDS.items():
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=entry_point, max_episode_steps=STEPS)

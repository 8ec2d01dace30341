"""Train on your own environment: a gymnasium env written here, registered, and trained by PPO.

Run it from the repository root (about 15 s on two cores):

    python3 examples/custom_env.py

The actors are other processes: each imports this module by its name, ``examples.custom_env``
(``env.id: examples.custom_env:Corridor-v0`` says "import examples.custom_env, then make
Corridor-v0"), which registers the env. So the module must be importable (on ``PYTHONPATH``,
or installed), and the training code below runs only when the file is run as a script. In a
config file the same env is::

    env:
      id: examples.custom_env:Corridor-v0
      kwargs: {length: 8}
"""

import os
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

REPO = Path(__file__).resolve().parents[1]


class Corridor(gym.Env):
    """Walk from cell 0 to the last cell of a corridor of ``length`` cells.

    Observation: the position as a fraction of the corridor, one float. Actions: 0 left, 1 right.
    Reward: -0.1 for each step, +1 for the step that reaches the end (which ends the episode). The
    best return of a corridor of 8 cells is 7 steps: 6 * -0.1 + 1 = 0.4.
    """

    def __init__(self, length: int = 8) -> None:
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.position = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.position / (self.length - 1)], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = 0
        return self._obs(), {}

    def step(self, action):
        move = 1 if int(action) == 1 else -1
        self.position = min(max(self.position + move, 0), self.length - 1)
        at_end = self.position == self.length - 1
        reward = 1.0 if at_end else -0.1
        return self._obs(), reward, at_end, False, {}


# Registered when the module is imported: in every role that makes the env, and here (where
# the evaluation at the end imports this file once more, as examples.custom_env).
# max_episode_steps truncates an episode that wanders for too long.
if "Corridor-v0" not in gym.registry:
    gym.register(id="Corridor-v0", entry_point=Corridor, max_episode_steps=50)


def main() -> None:
    from apexrl import Trainer

    # `examples.custom_env` must be importable from the repository root: by the roles, started
    # from this process (PYTHONPATH), and by this process (sys.path), which plays the trained
    # policy at the end. A package of your own would be installed instead (pip install -e .).
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.getenv("PYTHONPATH")]))
    sys.path.insert(0, str(REPO))
    overrides = {
        "env.id": "examples.custom_env:Corridor-v0",  # import the module, then make the env
        "env.kwargs": {"length": 8},  # the arguments of gym.make("Corridor-v0", ...)
        "run.stop_env_steps": 10_000,  # a short run
        "run.stop_eval_return": None,
        "learner.report_interval_s": 1,  # a result.json record every second
        "actor.report_interval_s": 0.5,  # actors report their episodes' returns twice a second
    }
    config = REPO / "configs" / "ppo_cartpole.yaml"  # PPO's settings, with the env replaced
    with Trainer(
        config, overrides, num_actors=2, evaluation=False, logdir="runs/examples"
    ) as trainer:
        while not (result := trainer.train())["done"]:
            returns = result["episode_return_mean"]  # None until an episode has ended
            print(f"env steps {result['env_steps']:>6}  training return {returns}")
        evaluation = trainer.evaluate(episodes=5, seed=0)  # greedy episodes, in this process
    print(f"trained for {result['env_steps']} env steps")
    print(f"evaluation return: {evaluation['return']['mean']:.2f} (best possible: 0.40)")


if __name__ == "__main__":
    main()

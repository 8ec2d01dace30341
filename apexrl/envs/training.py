"""What training sees of a step: the raw step of the env with the algorithm's reward clipping
(``env.clip_rewards``) and, on Atari with ``env.atari.terminal_on_life_loss``, a lost life as an
episode's end.

A lost life ends the training episode only: the transition that lost it is ``terminated`` (no
bootstrapping past it, and n-step windows, unrolls and sequences cut there as at any episode
end), while the game itself goes on in the same env without a reset. Episode returns, episode
counts and evaluation scores are always taken from the raw step: whole games, unclipped.
"""

from __future__ import annotations

import numpy as np

from apexrl.config import EnvConfig
from apexrl.envs import VectorStep, atari


def training_step(
    step: VectorStep, clip_rewards: bool, life_lost: np.ndarray | None = None
) -> VectorStep:
    """The step as training sees it: rewards clipped to [-1, 1] with ``clip_rewards`` (DQN, Ape-X,
    IMPALA and PPO on Atari), ``terminated`` also where ``life_lost``; else the step itself."""
    if clip_rewards:
        step = step._replace(reward=atari.clip_reward(step.reward))
    if life_lost is not None and life_lost.any():
        step = step._replace(terminated=step.terminated | life_lost)
    return step


class TrainingSignal:
    """``training_step`` for one actor's vector env, keeping the lives each env had before the
    step when the config makes a lost life terminal."""

    def __init__(self, cfg: EnvConfig) -> None:
        self.clip_rewards = cfg.clip_rewards
        self.life_loss_terminal = atari.is_atari(cfg.id) and cfg.atari.terminal_on_life_loss
        self.lives: np.ndarray | None = None  # before the step; None until a step has told them

    def __call__(self, step: VectorStep) -> VectorStep:
        life_lost = None
        if self.life_loss_terminal and step.lives is not None:
            if self.lives is not None:
                life_lost = atari.lives_lost(
                    self.lives, step.lives, step.terminated | step.truncated
                )
            self.lives = step.lives.copy()
        return training_step(step, self.clip_rewards, life_lost)

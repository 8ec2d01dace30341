"""Hyperparameters of each algorithm, one frozen dataclass per algorithm.

They live apart from the algorithms' torch code so that roles which never touch a network (the
replay and parameter servers, the launcher) can load a config without importing torch: that saves
each of them about 1.5 s of CPU at start and a few hundred MB of memory.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ApexDQNConfig:
    """Hyperparameters of Ape-X DQN (defaults: the paper's; CartPole values live in its config)."""

    gamma: float = 0.99  # discount per env step
    n_step: int = 3  # n of the n-step return
    lr: float = 0.00025 / 4  # Adam learning rate
    adam_eps: float = 1.5e-4  # Adam epsilon
    grad_clip_norm: float = 40.0  # global gradient-norm clip; 0 disables
    target_update_period: int = 2500  # learner updates between target-network syncs
    huber_delta: float = 1.0  # Huber loss threshold
    importance_exponent: float = 0.4  # beta of the importance-sampling weights
    priority_eps: float = 1e-6  # added to |TD| for new priorities
    hidden_sizes: tuple[int, ...] = (512,)  # MLP torso widths (flat observations)
    dueling: bool = True  # dueling head (Wang et al. 2016)

    def validate(self) -> None:
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"algo.gamma must be in [0, 1], got {self.gamma}")
        if self.n_step < 1:
            raise ValueError(f"algo.n_step must be >= 1, got {self.n_step}")
        if self.lr <= 0:
            raise ValueError(f"algo.lr must be positive, got {self.lr}")
        if self.target_update_period < 1:
            raise ValueError(
                f"algo.target_update_period must be >= 1, got {self.target_update_period}"
            )
        if not self.hidden_sizes or min(self.hidden_sizes) < 1:
            raise ValueError(f"algo.hidden_sizes must be positive widths, got {self.hidden_sizes}")

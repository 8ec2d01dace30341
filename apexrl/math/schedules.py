"""Hyperparameter schedules, pure functions of the run's progress."""

from __future__ import annotations


def linear_remaining(done: float, total: float) -> float:
    """The fraction of a run left once ``done`` of its ``total`` units are behind it,
    ``max(0, 1 - done / total)``: a linearly annealed hyperparameter is its initial value times
    this (stable-baselines3's ``progress_remaining``; the PPO paper's Atari learning rate and
    clip range, ``alpha`` annealed from 1 to 0). ``total`` must be positive."""
    if total <= 0:
        raise ValueError(f"total must be positive, got {total}")
    if done < 0:
        raise ValueError(f"done must be non-negative, got {done}")
    return max(0.0, 1.0 - done / total)

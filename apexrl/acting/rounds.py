"""A round of evaluation episodes: each env plays its quota of whole episodes from a fresh
reset (``round_quotas``, ``play_round``); the evaluation actor, ``apexrl evaluate`` and
``Policy`` play them. ``rest_after_round``: the evaluation actor's pause between rounds
(``actor.eval_interval_s``)."""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from apexrl.envs import step_vector

REPLAY_POLL_STEPS = 64  # vector steps between looks at replay's socket during a round
REST_POLL_S = 0.2  # seconds between looks at replay's socket while resting between rounds


def round_quotas(num_episodes: int, num_envs: int) -> np.ndarray:
    """Episodes each env plays in a round of ``num_episodes``: as even as possible, the first
    envs taking one more where it does not divide."""
    if num_episodes < 1 or num_envs < 1:
        raise ValueError(f"need episodes and envs >= 1, got {num_episodes} and {num_envs}")
    quotas = np.full(num_envs, num_episodes // num_envs, dtype=np.int64)
    quotas[: num_episodes % num_envs] += 1
    return quotas


class Round(NamedTuple):
    returns: np.ndarray  # float64 [episodes], in the order the episodes ended
    lengths: np.ndarray  # int64 [episodes]
    env_steps: int  # every env step played, counted or not
    seconds: float


def play_round(envs, core, quotas: np.ndarray, seed: int, between_steps=None) -> Round | None:
    """Play until every env has finished its quota of episodes from a fresh reset; None when
    ``between_steps`` (called every ``REPLAY_POLL_STEPS`` vector steps) returns False."""
    started = time.monotonic()
    num_envs = len(quotas)
    remaining = quotas.copy()
    episode_return = np.zeros(num_envs)
    episode_length = np.zeros(num_envs, dtype=np.int64)
    returns: list[float] = []
    lengths: list[int] = []
    env_steps = 0
    obs, _ = envs.reset(seed=seed)
    steps = 0
    while remaining.any():
        action, _ = core.act(obs)
        step = step_vector(envs, action)
        core.observe(action, step)
        env_steps += num_envs
        episode_return += step.reward
        episode_length += 1
        ended = step.terminated | step.truncated
        if ended.any():
            counted = ended & (remaining > 0)
            returns += episode_return[counted].tolist()
            lengths += episode_length[counted].tolist()
            remaining[counted] -= 1
            episode_return[ended], episode_length[ended] = 0.0, 0
        obs = step.obs
        steps += 1
        if between_steps is not None and steps % REPLAY_POLL_STEPS == 0 and not between_steps():
            return None
    return Round(
        np.asarray(returns, dtype=np.float64),
        np.asarray(lengths, dtype=np.int64),
        env_steps,
        time.monotonic() - started,
    )


def rest_after_round(
    interval_s: float, round_seconds: float, keep_going, clock=time.monotonic, sleep=time.sleep
) -> bool:
    """Wait until ``interval_s`` has passed since a round of ``round_seconds`` began (no wait
    when 0 or already past), calling ``keep_going`` every ``REST_POLL_S``; False as soon as it
    returns False (a stop), else True."""
    until = clock() + interval_s - round_seconds
    while (left := until - clock()) > 0:
        sleep(min(left, REST_POLL_S))
        if not keep_going():
            return False
    return True

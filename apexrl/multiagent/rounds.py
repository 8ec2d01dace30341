"""A round of greedy multi-agent episodes: each env plays its quota from a fresh reset, and the
round's returns (judged and per group), steps and illegal actions come back as one
``MultiAgentRound``. The evaluation actor and ``apexrl evaluate`` play them."""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from apexrl.acting.rounds import REPLAY_POLL_STEPS
from apexrl.config import Config
from apexrl.multiagent.returns import EpisodeReturns
from apexrl.multiagent.stepping import AgentEnvs


class MultiAgentRound(NamedTuple):
    returns: np.ndarray  # float64 [episodes]: the judged returns
    lengths: np.ndarray  # int64 [episodes]: env steps
    groups: dict[str, np.ndarray]  # every group's returns
    env_steps: int  # every env step played, counted or not
    agent_steps: int
    illegal_actions: int
    seconds: float


def play_multiagent_round(
    cfg: Config, envs: AgentEnvs, quotas: np.ndarray, seed: int, between_steps=None
) -> MultiAgentRound | None:
    """Play until every env has finished its quota of episodes from a fresh reset; None when
    ``between_steps`` (called every ``REPLAY_POLL_STEPS`` vector steps) returns False."""
    started = time.monotonic()
    remaining = quotas.copy()
    episodes = EpisodeReturns(cfg.multiagent)
    env_steps = agent_steps = illegal = steps = 0
    envs.reset(seed)
    while remaining.any():
        tick = envs.step()
        env_steps += tick.env_steps
        agent_steps += sum(tick.agent_steps.values())
        illegal += tick.illegal_actions
        for seated in tick.episodes:
            if remaining[seated.env] > 0:
                remaining[seated.env] -= 1
                episodes.add(seated)
        steps += 1
        if between_steps is not None and steps % REPLAY_POLL_STEPS == 0 and not between_steps():
            return None
    returns, lengths, groups = episodes.arrays()
    seconds = time.monotonic() - started
    return MultiAgentRound(returns, lengths, groups, env_steps, agent_steps, illegal, seconds)

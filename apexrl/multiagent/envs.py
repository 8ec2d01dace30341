"""PettingZoo envs as an actor steps them: every agent's own turns, observations and rewards.

``env.id`` of a multi-agent run is an entry point ``module:function`` that returns a PettingZoo env
(``mpe2.simple_spread_v3:parallel_env``, ``pettingzoo.classic.tictactoe_v3:env``), made with
``env.kwargs``. Both of PettingZoo's APIs are taken:

- **Parallel** (simultaneous moves): every live agent acts at every env step;
- **AEC** (turns; agents that come and go): one agent acts at a time, ``env.last()`` gives it what
  it observed and the rewards it got since it last acted.

``AgentEnv`` turns either into two kinds of event, which is all an actor needs to know:

- ``Decision(agent, obs, mask)``: the agent acts now on ``obs`` (``mask``: its legal actions, or
  None);
- ``Outcome(agent, reward, terminated, truncated, next_obs, next_mask)``: what followed the
  agent's last action. ``reward`` is every reward the agent got from that action until its next
  decision or its end (rewards given while it did not act add up); ``next_obs`` is its own next
  turn's observation, or its final one. An agent that is done is flushed with the flag the env
  gave it: ``terminated`` ends bootstrapping, ``truncated`` does not.

An episode ends when no agent is left (``Episode``: each agent's return and decisions); the env is
then reset at once with the next seed, as a gymnasium vector env resets in the same step.

Observations: a ``Dict`` with ``action_mask`` (PettingZoo's classic games) gives the network its
``observation`` part and the mask separately; a mask may also come in ``info["action_mask"]``. A
``Box`` of more than one dimension that is not a uint8 image is flattened, and non-uint8 values
are cast to float32, so that an MLP reads it (tictactoe's 3x3x2 int8 board: 18 floats).
``AgentEnv.team_state`` is every agent's latest observation together, for a team critic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from apexrl.config.env import EnvConfig
from apexrl.envs import EnvError, one_line, resolve_env_id

MASK_KEY = "action_mask"


class Decision(NamedTuple):
    agent: str
    obs: np.ndarray
    mask: np.ndarray | None  # [A] bool, True: legal; None: every action is


class Outcome(NamedTuple):
    agent: str
    reward: float
    terminated: bool
    truncated: bool
    next_obs: np.ndarray
    next_mask: np.ndarray | None


@dataclass
class Episode:
    """One finished episode of one env: every agent's return and number of decisions."""

    number: int  # the env's episode number in its actor
    returns: dict[str, float]
    decisions: dict[str, int]
    env_steps: int


class ObservationView:
    """What a network sees of one agent's observations: the space and the conversion."""

    def __init__(self, space: gym.Space, agent: str) -> None:
        self.masked = isinstance(space, gym.spaces.Dict) and MASK_KEY in space.spaces
        inner = space["observation"] if self.masked else space
        if self.masked and set(space.spaces) != {MASK_KEY, "observation"}:
            raise EnvError(
                f"agent {agent!r}: a Dict observation with an action_mask must hold exactly "
                f"'observation' and 'action_mask', got {sorted(space.spaces)}"
            )
        if not isinstance(inner, gym.spaces.Box):
            raise EnvError(
                f"agent {agent!r} observes {inner}; multi-agent runs take Box observations "
                "(with an optional action_mask beside them)"
            )
        self.image = inner.dtype == np.uint8 and len(inner.shape) == 3
        self.flatten = len(inner.shape) != 1 and not self.image
        self.dtype = np.dtype(np.uint8) if self.image else np.dtype(np.float32)
        low, high = inner.low, inner.high
        if self.flatten:
            low, high = low.reshape(-1), high.reshape(-1)
        self.space = gym.spaces.Box(
            low.astype(self.dtype), high.astype(self.dtype), dtype=self.dtype
        )

    def convert(self, obs: Any, info: dict | None) -> tuple[np.ndarray, np.ndarray | None]:
        """The network's observation and the legal-action mask (None: none given)."""
        mask = None
        if self.masked:
            mask = np.asarray(obs[MASK_KEY]).astype(bool)
            obs = obs["observation"]
        elif info and MASK_KEY in info:
            mask = np.asarray(info[MASK_KEY]).astype(bool)
        array = np.asarray(obs, dtype=self.dtype)
        if self.flatten:
            array = array.reshape(-1)
        return array, mask


def is_parallel(env: Any) -> bool:
    from pettingzoo import ParallelEnv

    return isinstance(env, ParallelEnv)


def make_pettingzoo_env(cfg: EnvConfig) -> Any:
    """The PettingZoo env ``env.id`` names, made with ``env.kwargs``; ``EnvError`` with one line."""
    try:
        from pettingzoo import AECEnv, ParallelEnv
    except ImportError as exc:  # a dependency: only a broken install lacks it
        raise EnvError(f"multi-agent runs need the pettingzoo package ({exc})") from exc
    if ":" not in cfg.id:
        raise EnvError(
            f"env.id {cfg.id!r}: a multi-agent run names a PettingZoo env's entry point, "
            "module:function (mpe2.simple_spread_v3:parallel_env)"
        )
    source = resolve_env_id(cfg.id)
    if isinstance(source, str):
        raise EnvError(f"env.id {cfg.id!r} is a gymnasium id; a multi-agent run needs PettingZoo's")
    try:
        env = source(**cfg.kwargs)
    except Exception as exc:
        raise EnvError(
            f"env.id {cfg.id!r} with kwargs {cfg.kwargs} failed: {one_line(exc)}"
        ) from exc
    if not isinstance(env, (AECEnv, ParallelEnv)):
        raise EnvError(
            f"env.id {cfg.id!r} returned a {type(env).__name__}, not a PettingZoo AECEnv or "
            "ParallelEnv"
        )
    if cfg.max_episode_steps > 0 and not is_parallel(env):
        env.close()
        raise EnvError(
            "env.max_episode_steps cuts Parallel envs only; limit an AEC env's episodes with its "
            "own argument in env.kwargs (max_cycles, ...)"
        )
    return env


def agent_views(env: Any) -> dict[str, ObservationView]:
    """Each possible agent's ``ObservationView``."""
    return {
        agent: ObservationView(env.observation_space(agent), agent) for agent in env.possible_agents
    }


def team_space(views: dict[str, ObservationView]) -> gym.spaces.Box:
    """What a team critic reads beside an agent's own observation: every possible agent's
    observation, in ``views``' order (``AgentEnv.team_state``); flat observations only."""
    images = [agent for agent, view in views.items() if view.image]
    if images:
        raise EnvError(f"a team critic reads flat observations; agent {images[0]!r} sees images")
    low = np.concatenate([view.space.low for view in views.values()])
    high = np.concatenate([view.space.high for view in views.values()])
    return gym.spaces.Box(low, high, dtype=np.float32)


@dataclass
class AgentEnv:
    """One PettingZoo env as decisions and outcomes (module docstring)."""

    env: Any
    views: dict[str, ObservationView]
    max_episode_steps: int = 0  # Parallel envs: truncate every agent after this many env steps
    parallel: bool = False
    episode: int = -1  # the number of the episode in play (set by reset)
    env_steps: int = 0  # of the episode in play
    pending: set[str] = field(default_factory=set)  # agents that acted and wait for an outcome
    returns: dict[str, float] = field(default_factory=dict)
    decisions: dict[str, int] = field(default_factory=dict)
    obs: dict[str, tuple[np.ndarray, np.ndarray | None]] = field(default_factory=dict)
    team: np.ndarray | None = None  # team_state's, until an agent observes again

    def __post_init__(self) -> None:
        self.parallel = is_parallel(self.env)

    def reset(self, seed: int | None, episode: int) -> list[Decision]:
        """Start episode ``episode``; the first decisions."""
        self.episode, self.env_steps = episode, 0
        self.pending.clear()
        self.returns, self.decisions = {}, {}
        self.obs, self.team = {}, None
        if self.parallel:
            observations, infos = self.env.reset(seed=seed)
            return self._parallel_decisions(observations, infos)
        self.env.reset(seed=seed)
        outcomes, decisions = self._advance()
        return decisions  # nothing acted yet: no outcome

    def step(self, actions: dict[str, Any]) -> tuple[list[Outcome], list[Decision], Episode | None]:
        """Apply the actions of the last decisions (Parallel: all of them; AEC: the one); the
        outcomes, the next decisions and, when the episode ended, the episode (the env is then
        waiting for ``reset``)."""
        for agent in actions:
            self.pending.add(agent)
            self.decisions[agent] = self.decisions.get(agent, 0) + 1
        self.env_steps += 1
        if self.parallel:
            outcomes, decisions = self._parallel_step(actions)
        else:
            ((agent, action),) = actions.items()
            self.env.step(action)
            outcomes, decisions = self._advance()
        if decisions:
            return outcomes, decisions, None
        episode = Episode(self.episode, dict(self.returns), dict(self.decisions), self.env_steps)
        return outcomes, decisions, episode

    def _observe(
        self, agent: str, obs: Any, info: dict | None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        seen = self.views[agent].convert(obs, info)
        self.obs[agent] = seen
        self.team = None
        return seen

    def team_state(self) -> np.ndarray:
        """Every possible agent's latest observation of the episode, in ``views``' order, zeros
        for an agent not seen yet: what a team critic reads (``team_space``)."""
        if self.team is None:
            self.team = np.concatenate(
                [
                    self.obs[agent][0] if agent in self.obs else np.zeros_like(view.space.low)
                    for agent, view in self.views.items()
                ]
            )
        return self.team

    def _add_reward(self, agent: str, reward: float) -> None:
        self.returns[agent] = self.returns.get(agent, 0.0) + float(reward)

    # --- Parallel --------------------------------------------------------------------------

    def _parallel_decisions(self, observations: dict, infos: dict) -> list[Decision]:
        decisions = []
        for agent in self.env.agents:
            obs, mask = self._observe(agent, observations[agent], infos.get(agent))
            decisions.append(Decision(agent, obs, mask))
        return decisions

    def _parallel_step(self, actions: dict[str, Any]) -> tuple[list[Outcome], list[Decision]]:
        observations, rewards, terminations, truncations, infos = self.env.step(actions)
        cut = 0 < self.max_episode_steps <= self.env_steps
        outcomes = []
        for agent, reward in rewards.items():
            self._add_reward(agent, reward)
        for agent in actions:
            self.pending.discard(agent)
            terminated = bool(terminations.get(agent, False))
            truncated = not terminated and (bool(truncations.get(agent, False)) or cut)
            if agent in observations:
                obs, mask = self._observe(agent, observations[agent], infos.get(agent))
            else:  # an agent that left without a last observation keeps its previous one
                obs, mask = self.obs[agent]
            outcome = Outcome(
                agent, float(rewards.get(agent, 0.0)), terminated, truncated, obs, mask
            )
            outcomes.append(outcome)
        if cut or not self.env.agents:
            return outcomes, []
        return outcomes, self._parallel_decisions(observations, infos)

    # --- AEC ---------------------------------------------------------------------------------

    def _advance(self) -> tuple[list[Outcome], list[Decision]]:
        """Run the env to the next agent that must act: each agent selected has its outcome
        flushed (its rewards since it acted, from ``last()``), a done agent its dead step."""
        outcomes = []
        env = self.env
        while env.agents:
            agent = env.agent_selection
            raw_obs, reward, terminated, truncated, info = env.last()
            self._add_reward(agent, reward)
            obs, mask = self._observe(agent, raw_obs, info)
            if agent in self.pending:
                self.pending.discard(agent)
                truncated = bool(truncated) and not terminated
                outcomes.append(
                    Outcome(agent, float(reward), bool(terminated), truncated, obs, mask)
                )
            if terminated or truncated:
                env.step(None)
                continue
            return outcomes, [Decision(agent, obs, mask)]
        return outcomes, []

    def close(self) -> None:
        self.env.close()

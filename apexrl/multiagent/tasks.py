"""apexrl's own multi-agent tasks: ``come_and_go``, agents that come and go mid-episode with two
kinds of spaces (an AEC env), ``cartpoles``, independent CartPoles as the agents of one Parallel
env (the multi-agent actor set against the single-agent one on the same dynamics), and
``board_planes``, PettingZoo's connect_four or tictactoe with the board as planes for a CNN.

``ComeAndGo`` is a PettingZoo AEC env. A *guide* is there from the first turn to the last: it
observes a cue, one of two colours, shown as a one-hot with the episode's progress (3 numbers),
and answers with one of 2 actions. *Walkers* come later and leave early: walker ``k`` joins at
round ``2 * k + 1`` and leaves (terminated) after ``walker_turns`` turns of its own; each observes
one of three directions as a one-hot with its own progress (4 numbers) and answers with one of 3
actions. Every agent gets +1 when its answer matches its cue and 0 otherwise, and a walker still
there also gets +0.5 at the guide's turn that follows its own right answer (a reward given while
it does not act, which belongs to that answer's step). The episode is truncated after
``rounds`` rounds (each round: every agent present takes one turn, the guide first).

A policy that answers every cue scores ``rounds`` for the guide and ``1.5 * walker_turns - 0.5``
for each walker (its last answer's bonus would come after it left); a uniformly random one half
and a third of those. Any family learns it in seconds,
so tests and benchmarks can drive the whole multi-agent path (turns, agents joining and leaving,
rewards between turns, two spaces, two policies) with a learning run that is short.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from pettingzoo import AECEnv, ParallelEnv

GUIDE = "guide_0"


def come_and_go(
    num_walkers: int = 3, rounds: int = 12, walker_turns: int = 5, render_mode: str | None = None
) -> ComeAndGo:
    """The task's entry point (``env.kwargs``: ``num_walkers``, ``rounds``, ``walker_turns``)."""
    return ComeAndGo(num_walkers, rounds, walker_turns, render_mode)


class ComeAndGo(AECEnv):
    """The task (module docstring)."""

    metadata = {"name": "come_and_go_v0", "render_modes": [], "is_parallelizable": False}

    def __init__(
        self, num_walkers: int = 3, rounds: int = 12, walker_turns: int = 5, render_mode=None
    ) -> None:
        super().__init__()
        if not 1 <= 2 * num_walkers + 1 <= rounds:
            raise ValueError(f"{num_walkers} walkers do not all join within {rounds} rounds")
        self.num_walkers, self.rounds, self.walker_turns = num_walkers, rounds, walker_turns
        self.render_mode = render_mode
        self.walkers = [f"walker_{k}" for k in range(num_walkers)]
        self.possible_agents = [GUIDE, *self.walkers]
        self._spaces = {
            GUIDE: (gym.spaces.Box(0.0, 1.0, (3,), np.float32), gym.spaces.Discrete(2)),
            **{
                w: (gym.spaces.Box(0.0, 1.0, (4,), np.float32), gym.spaces.Discrete(3))
                for w in self.walkers
            },
        }
        self.rng = np.random.default_rng()

    def observation_space(self, agent: str) -> gym.Space:
        return self._spaces[agent][0]

    def action_space(self, agent: str) -> gym.Space:
        return self._spaces[agent][1]

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.round = 0
        self.turns = dict.fromkeys(self.possible_agents, 0)
        self.cues = {agent: self._new_cue(agent) for agent in self.possible_agents}
        self.owed: dict[str, float] = {}  # walker -> bonus due at the guide's next turn
        self.agents = [GUIDE]
        self.rewards = {GUIDE: 0.0}
        self._cumulative_rewards = {GUIDE: 0.0}
        self.terminations = {GUIDE: False}
        self.truncations = {GUIDE: False}
        self.infos = {GUIDE: {}}
        self._queue: list[str] = []
        self._start_round()
        self.agent_selection = self._queue.pop(0)

    def _new_cue(self, agent: str) -> int:
        return int(self.rng.integers(self.action_space(agent).n))

    def _start_round(self) -> None:
        """Walkers due this round join; the round's turns: every agent present, guide first."""
        for k, walker in enumerate(self.walkers):
            if self.round == 2 * k + 1 and walker not in self.agents:
                self._join(walker)
        self._queue = [agent for agent in self.agents if self._acts(agent)]

    def _acts(self, agent: str) -> bool:
        return not (self.terminations.get(agent) or self.truncations.get(agent))

    def _join(self, walker: str) -> None:
        self.agents.append(walker)
        for table, value in (
            (self.rewards, 0.0),
            (self._cumulative_rewards, 0.0),
            (self.terminations, False),
            (self.truncations, False),
        ):
            table[walker] = value
        self.infos[walker] = {}

    def observe(self, agent: str) -> np.ndarray:
        n = self.action_space(agent).n
        cue = np.zeros(n, np.float32)
        cue[self.cues[agent]] = 1.0
        if agent == GUIDE:
            progress = self.round / self.rounds
        else:
            progress = self.turns[agent] / self.walker_turns
        return np.append(cue, np.float32(progress))

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if not self._acts(agent):  # a done agent's dead step: it leaves
            if action is not None:
                raise ValueError(f"{agent} is done: its only action is None")
            self.agents.remove(agent)
            for table in (
                self.rewards,
                self._cumulative_rewards,
                self.terminations,
                self.truncations,
                self.infos,
            ):
                del table[agent]
            self._advance()
            return
        self._cumulative_rewards[agent] = 0.0
        self.rewards = dict.fromkeys(self.agents, 0.0)
        right = int(action) == self.cues[agent]
        self.rewards[agent] = 1.0 if right else 0.0
        if agent == GUIDE:
            for walker, bonus in self.owed.items():
                if walker in self.rewards:
                    self.rewards[walker] += bonus
            self.owed = {}
        elif right:
            self.owed[agent] = 0.5
        self.turns[agent] += 1
        self.cues[agent] = self._new_cue(agent)
        if agent != GUIDE and self.turns[agent] >= self.walker_turns:
            self.terminations[agent] = True
        self._accumulate_rewards()
        self._advance()

    def _advance(self) -> None:
        """Select the next agent: a done one for its dead step first, else the round's next,
        else the next round's first (the last round over: every agent is truncated)."""
        done = [agent for agent in self.agents if not self._acts(agent)]
        if done:
            self.agent_selection = done[0]
            return
        if not self._queue:
            self.round += 1
            if self.round >= self.rounds:
                for agent in self.agents:
                    self.truncations[agent] = True
                if self.agents:
                    self.agent_selection = self.agents[0]
                return
            self._start_round()
        if self._queue:
            self.agent_selection = self._queue.pop(0)

    def render(self) -> None:
        return None

    def close(self) -> None:
        return None


def cartpoles(num_agents: int = 3, max_episode_steps: int = 500) -> CartPoles:
    """``CartPoles``' entry point (``env.kwargs``: ``num_agents``, ``max_episode_steps``)."""
    return CartPoles(num_agents, max_episode_steps)


class CartPoles(ParallelEnv):
    """``num_agents`` independent CartPole-v1 poles as the agents of one Parallel env
    (``env.id: apexrl.multiagent.tasks:cartpoles``): each agent observes and balances its own pole,
    gets CartPole's +1 a step, and is done when its pole falls (terminated) or after
    ``max_episode_steps`` steps (truncated); the episode ends when every pole is done. The same
    dynamics as ``num_agents`` single-agent CartPole envs, so a multi-agent actor's agent steps
    can be set against a single-agent actor's env steps
    (``benchmarks/multiagent_actor_throughput.py``)."""

    metadata = {"name": "cartpoles_v0", "render_modes": []}

    def __init__(self, num_agents: int = 3, max_episode_steps: int = 500) -> None:
        from gymnasium.envs.classic_control import CartPoleEnv

        self.possible_agents = [f"pole_{k}" for k in range(num_agents)]
        self.poles = {agent: CartPoleEnv() for agent in self.possible_agents}
        self.max_episode_steps = max_episode_steps
        self.agents: list[str] = []
        self.steps = 0

    def observation_space(self, agent: str) -> gym.Space:
        return self.poles[agent].observation_space

    def action_space(self, agent: str) -> gym.Space:
        return self.poles[agent].action_space

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.agents, self.steps = list(self.possible_agents), 0
        observations = {}
        for k, agent in enumerate(self.agents):
            observations[agent], _ = self.poles[agent].reset(
                seed=None if seed is None else seed + k
            )
        return observations, {agent: {} for agent in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        self.steps += 1
        observations, rewards, terminations, truncations = {}, {}, {}, {}
        for agent, action in actions.items():
            obs, reward, terminated, _, _ = self.poles[agent].step(action)
            observations[agent], rewards[agent] = obs, float(reward)
            terminations[agent] = bool(terminated)
            truncations[agent] = not terminated and self.steps >= self.max_episode_steps
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])]
        return observations, rewards, terminations, truncations, {a: {} for a in actions}

    def close(self) -> None:
        for pole in self.poles.values():
            pole.close()


def board_planes(game: str = "connect_four", render_mode: str | None = None) -> AECEnv:
    """A PettingZoo classic board game (``connect_four``, ``tictactoe``) whose observation is
    its board as channel-first uint8 planes ``(2, rows, columns)`` (the mover's pieces, the
    other's) beside the legal-action mask, so that a convolutional torso reads it (``auto``:
    ``minatar_cnn``); PettingZoo gives ``(rows, columns, 2)`` int8, which runs flatten for an MLP.
    ``env.kwargs``: ``game``."""
    from importlib import import_module

    from pettingzoo.utils import BaseWrapper

    modules = {"connect_four": "connect_four_v3", "tictactoe": "tictactoe_v3"}
    if game not in modules:
        raise ValueError(f"board_planes plays {', '.join(modules)}, not {game!r}")
    env = import_module(f"pettingzoo.classic.{modules[game]}").env(render_mode=render_mode)

    class BoardPlanes(BaseWrapper):
        def observation_space(self, agent: str) -> gym.spaces.Dict:
            space = self.env.observation_space(agent)
            rows, columns, planes = space["observation"].shape
            board = gym.spaces.Box(0, 1, (planes, rows, columns), np.uint8)
            return gym.spaces.Dict({"observation": board, "action_mask": space["action_mask"]})

        def observe(self, agent: str) -> dict[str, np.ndarray]:
            obs = self.env.observe(agent)
            board = np.ascontiguousarray(np.moveaxis(obs["observation"], -1, 0), dtype=np.uint8)
            return {"observation": board, "action_mask": obs["action_mask"]}

    return BoardPlanes(env)

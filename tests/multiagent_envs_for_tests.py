"""Tiny deterministic PettingZoo envs, scripted policies and mapping functions that the multi-agent
tests name as entry points (``multiagent_envs_for_tests:...``: pytest puts ``tests/`` on the path),
so that every reward, flag and observation in them can be worked out by hand.

- ``TakeTurns`` (AEC): ``a`` and ``b`` take turns ``k = 1 .. 4``; the agent acting at turn ``k``
  gets ``k`` and the other ``10 * k``; after turn 4 ``a`` is terminated and ``b`` truncated.
- ``ComeAndGo`` (AEC): agents join and leave mid-episode, with two observation spaces (its
  docstring holds the script).
- ``Twins`` (Parallel): two agents of ``Box(4,)`` and ``Discrete(2)`` whose observation and reward
  say which agent and which step they are.

An observation is ``[turns taken so far, the agent's index, ...]`` as float32, so a test can tell
whose turn, and which, an observation was made at.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from pettingzoo import AECEnv, ParallelEnv


class _ScriptedTurns(AECEnv):
    """The AEC bookkeeping the two turn-based envs share, in PettingZoo's own convention: an
    agent's cumulative reward is zeroed when it acts, the step's rewards are then added to every
    agent's, and done agents are stepped with ``None`` (``_was_dead_step``) before the next live
    agent acts."""

    metadata = {"name": "scripted_turns", "is_parallelizable": False}
    possible_agents: list[str] = []
    starting_agents: list[str] = []
    spaces: dict[str, gym.spaces.Box] = {}

    def __init__(self) -> None:
        super().__init__()
        self.turns = 0

    def observation_space(self, agent: str) -> gym.Space:
        return self.spaces[agent]

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(2)

    def observe(self, agent: str) -> np.ndarray:
        size = self.spaces[agent].shape[0]
        obs = np.ones(size, dtype=np.float32)
        obs[:2] = self.turns, self.possible_agents.index(agent)
        return obs

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        self.turns = 0
        self.agents = list(self.starting_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {agent: {} for agent in self.agents}
        self.agent_selection = self.agents[0]

    def _join(self, agent: str) -> None:
        self.agents.append(agent)
        self.rewards[agent] = self._cumulative_rewards[agent] = 0.0
        self.terminations[agent] = self.truncations[agent] = False
        self.infos[agent] = {}

    def step(self, action: int | None) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self._clear_rewards()
        self.turns += 1
        self.script(agent, self.turns)
        self._accumulate_rewards()
        live = [a for a in self.agents if not (self.terminations[a] or self.truncations[a])]
        if live:  # the next live agent after this one, in the order of ``agents``
            later = [a for a in self.agents[self.agents.index(agent) + 1 :] if a in live]
            self.agent_selection = (later or live)[0]
        self._deads_step_first()

    def script(self, agent: str, turn: int) -> None:
        raise NotImplementedError


class TakeTurns(_ScriptedTurns):
    """``a`` acts at turns 1 and 3, ``b`` at turns 2 and 4. The agent acting at turn ``k`` gets
    ``k``, the other ``10 * k``; after turn 4, ``a`` is terminated and ``b`` truncated. Both
    observe ``Box(2,)``: ``[turns taken, index]`` (a: 0, b: 1)."""

    possible_agents = ["a", "b"]
    starting_agents = ["a", "b"]
    spaces = {agent: gym.spaces.Box(-100.0, 100.0, (2,), np.float32) for agent in ("a", "b")}

    def script(self, agent: str, turn: int) -> None:
        other = "b" if agent == "a" else "a"
        self.rewards[agent] = float(turn)
        self.rewards[other] = 10.0 * turn
        if turn == 4:
            self.terminations["a"] = True
            self.truncations["b"] = True


class ComeAndGo(_ScriptedTurns):
    """Agents that join and leave mid-episode; ``early`` and ``stay`` observe ``Box(2,)``,
    ``late`` and ``ghost`` ``Box(3,)``. The acting agent gets the turn's number ``k``, and:

    ==== ======== =============================================================
    turn acts     then
    ==== ======== =============================================================
    1    early
    2    stay     ``late`` joins
    3    late     ``early`` gets 30 and is terminated (it leaves, the rest go on)
    4    stay     ``ghost`` joins
    5    late     ``stay`` gets 50, ``ghost`` 7; ``stay`` is truncated, ``late``
                  and ``ghost`` terminated: the episode ends before ``ghost``
                  ever acts
    ==== ======== =============================================================
    """

    possible_agents = ["early", "stay", "late", "ghost"]
    starting_agents = ["early", "stay"]
    spaces = {
        "early": gym.spaces.Box(-100.0, 100.0, (2,), np.float32),
        "stay": gym.spaces.Box(-100.0, 100.0, (2,), np.float32),
        "late": gym.spaces.Box(-100.0, 100.0, (3,), np.float32),
        "ghost": gym.spaces.Box(-100.0, 100.0, (3,), np.float32),
    }

    def script(self, agent: str, turn: int) -> None:
        self.rewards[agent] = float(turn)
        if turn == 2:
            self._join("late")
        elif turn == 3:
            self.rewards["early"] = 30.0
            self.terminations["early"] = True
        elif turn == 4:
            self._join("ghost")
        elif turn == 5:
            self.rewards["stay"] = 50.0
            self.rewards["ghost"] = 7.0
            self.truncations["stay"] = True
            self.terminations["late"] = self.terminations["ghost"] = True


class Twins(ParallelEnv):
    """Two agents, ``left`` and ``right``, act at once for ``length`` steps, then both are
    truncated. Each observes ``Box(4,)``: ``[step, index, 0, 0]``; at step ``t`` (from 1) an
    agent gets ``10 * index + t``, whatever its action (``Discrete(2)``)."""

    metadata = {"name": "twins"}
    possible_agents = ["left", "right"]

    def __init__(self, length: int = 5) -> None:
        self.length = length
        self.t = 0
        self.agents: list[str] = []

    def observation_space(self, agent: str) -> gym.Space:
        return gym.spaces.Box(-100.0, 100.0, (4,), np.float32)

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(2)

    def _obs(self) -> dict[str, np.ndarray]:
        return {
            agent: np.array([self.t, i, 0, 0], dtype=np.float32)
            for i, agent in enumerate(self.possible_agents)
        }

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple:
        self.t = 0
        self.agents = list(self.possible_agents)
        return self._obs(), {agent: {} for agent in self.agents}

    def step(self, actions: dict) -> tuple:
        self.t += 1
        rewards = {a: 10.0 * i + self.t for i, a in enumerate(self.possible_agents)}
        done = self.t >= self.length
        flags = dict.fromkeys(self.agents, False)
        truncations = dict.fromkeys(self.agents, done)
        infos = {agent: {} for agent in self.agents}
        obs = self._obs()
        if done:
            self.agents = []
        return obs, rewards, flags, truncations, infos


def take_turns() -> TakeTurns:
    return TakeTurns()


def come_and_go() -> ComeAndGo:
    return ComeAndGo()


def twins(length: int = 5) -> Twins:
    return Twins(length)


def seat_by_episode(agent: str, episode: int) -> str:
    """A ``mapping_fn``: every agent plays ``blue`` in even episodes and ``red`` in odd ones."""
    return "blue" if episode % 2 == 0 else "red"


class FirstLegal:
    """A scripted policy: the lowest legal action (action 0 where no mask is given)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space) -> None:
        self.n = action_space.n

    def compute_actions(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        if mask is None:
            return np.zeros(len(obs), dtype=np.int64)
        return mask.argmax(axis=1)


class AlwaysZero:
    """A scripted policy that ignores the mask: action 0 for every agent."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space) -> None:
        pass

    def compute_actions(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        return np.zeros(len(obs), dtype=np.int64)


class OutOfRange:
    """A scripted policy that answers with an action one past the last of its space."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space) -> None:
        self.n = action_space.n

    def compute_actions(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        return np.full(len(obs), self.n, dtype=np.int64)


# tictactoe's lines of squares (an action is a square; the set is the same for rows and columns)
TICTACTOE_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8),
                   (2, 4, 6))  # fmt: skip


class ScriptedBoardPlayer:
    """A scripted player of a board game: ``move(obs, legal)`` for each of a batch's agents."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space) -> None:
        self.rng = np.random.default_rng(0)

    def compute_actions(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        assert mask is not None
        return np.array([self.move(o, m) for o, m in zip(obs, mask, strict=True)], np.int64)

    def move(self, obs: np.ndarray, legal: np.ndarray) -> int:
        raise NotImplementedError


class TicTacToeBlocker(ScriptedBoardPlayer):
    """A scripted tictactoe player: the move that wins now, else the one that blocks the other
    player's win, else the centre, else a random legal move. PettingZoo's observation, flattened,
    is a 3x3x2 board (the mover's marks, the other's) whose cell ``[a // 3, a % 3]`` is square
    ``a``."""

    def move(self, obs: np.ndarray, legal: np.ndarray) -> int:
        board = obs.reshape(3, 3, 2)
        marks = [[board[a // 3, a % 3, side] > 0 for a in range(9)] for side in (0, 1)]
        for side in (0, 1):  # win, then block
            for line in TICTACTOE_LINES:
                owned = [a for a in line if marks[side][a]]
                empty = [a for a in line if legal[a]]
                if len(owned) == 2 and len(empty) == 1:
                    return empty[0]
        if legal[4]:
            return 4
        return int(self.rng.choice(np.flatnonzero(legal)))


class ConnectFourWinBlock(ScriptedBoardPlayer):
    """A scripted connect_four player: the move that wins now, else the one that blocks the other
    player's win next move, else a random legal move. PettingZoo's observation, flattened, is a
    6x7x2 board (the mover's discs, the other's), row 0 at the top; a disc dropped in column
    ``c`` lands in its lowest empty row. ``apexrl.multiagent.tasks.board_planes`` gives the same
    board as planes ``(2, 6, 7)``."""

    def move(self, obs: np.ndarray, legal: np.ndarray) -> int:
        board = np.moveaxis(obs, 0, -1) if obs.shape == (2, 6, 7) else obs.reshape(6, 7, 2)
        columns = np.flatnonzero(legal)
        for side in (0, 1):  # win, then block
            for column in columns:
                if connects_four(board[:, :, side], landing_row(board, column), column):
                    return int(column)
        return int(self.rng.choice(columns))


def landing_row(board: np.ndarray, column: int) -> int:
    empty = np.flatnonzero(board[:, column].sum(axis=1) == 0)
    return int(empty.max())


def connects_four(discs: np.ndarray, row: int, column: int) -> bool:
    """Whether a disc at (row, column) gives ``discs`` [6, 7] four in a line."""
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        count = 1
        for sign in (1, -1):
            r, c = row + sign * dr, column + sign * dc
            while 0 <= r < 6 and 0 <= c < 7 and discs[r, c]:
                count += 1
                r, c = r + sign * dr, c + sign * dc
        if count >= 4:
            return True
    return False

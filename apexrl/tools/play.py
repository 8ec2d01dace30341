"""``apexrl play RUN``: a person plays a two-player game's trained policy in the terminal.

The run's policy (``--policy``, default its first trained one) plays greedily from the run's
checkpoint against ``TerminalPlayer``, a fixed player that shows the board and reads each move
from standard input; the seats swap every game (``league.opponents.opponent_config``, as
``apexrl evaluate --opponent`` plays). A board is drawn from an observation of two planes (the
mover's marks and the other's: tictactoe's 3x3x2, connect_four's 6x7x2, either way round); any
other observation is printed as numbers. After each game: who won, and the score so far. End of
input ends the games.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

from apexrl.config import ConfigError, load_config
from apexrl.tools.evaluate import EvaluateError, find_sources

PROG = "apexrl play"
PLAYER = "apexrl.tools.play:TerminalPlayer"
BOARDS = {18: (3, 3), 84: (6, 7)}
MARKS = (
    ".XO"  # empty, yours, the other's  # flat observation size -> board rows, columns (2 planes)
)


class NoMoreInput(Exception):
    """Standard input ended: the person is done."""


class TerminalPlayer:
    """A fixed player whose moves a person types (module docstring)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space) -> None:
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ConfigError("apexrl play takes games of discrete moves")
        self.num_actions = int(action_space.n)

    def compute_actions(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        return np.array([self.move(o, m) for o, m in zip(obs, _masks(mask, len(obs)), strict=True)])

    def move(self, obs: np.ndarray, legal: np.ndarray | None) -> int:
        print(board_text(obs))
        moves = [a for a in range(self.num_actions) if legal is None or legal[a]]
        while True:
            print(f"your move ({' '.join(map(str, moves))}): ", end="", flush=True)
            line = sys.stdin.readline()
            if not line:
                raise NoMoreInput
            text = line.strip()
            if text.isdigit() and int(text) in moves:
                return int(text)
            print(f"{text!r} is not a legal move")


def _masks(mask: np.ndarray | None, n: int) -> list:
    return [None] * n if mask is None else list(mask)


def board_text(obs: np.ndarray) -> str:
    """The board as rows of ``X`` (yours), ``O`` (the other's) and ``.``, numbered as the moves
    of the game (a cell's index, or a column's); other observations as numbers."""
    obs = np.asarray(obs)
    if obs.ndim == 3 and obs.shape[0] == 2:  # planes first (tasks.board_planes)
        obs = np.moveaxis(obs, 0, -1)
    flat = obs.ravel()
    shape = BOARDS.get(flat.size)
    if shape is None:
        return np.array2string(flat, precision=3)
    rows, columns = shape
    planes = flat.reshape(rows, columns, 2)
    lines = []
    for r in range(rows):
        cells = [
            "X" if planes[r, c, 0] else "O" if planes[r, c, 1] else "." for c in range(columns)
        ]
        cell_moves = "" if rows == 6 else f"   {r * columns}-{r * columns + 2}"
        lines.append(" ".join(cells) + cell_moves)
    if rows == 6:
        lines.append(" ".join(str(c) for c in range(columns)))
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="RUN_DIR|CHECKPOINT", help="a run directory or a .pt")
    parser.add_argument("--policy", help="the policy to play (default: the run's first trained)")
    parser.add_argument("--games", type=int, default=2, help="games to play (default 2)")
    parser.add_argument("--config", help="config file (default: the run's config.yaml)")


def play(args: argparse.Namespace) -> int:
    from apexrl.league.opponents import OPPONENT, opponent_config
    from apexrl.multiagent.evaluate import load_weights
    from apexrl.multiagent.players import make_players
    from apexrl.multiagent.stepping import AgentEnvs

    sources = find_sources(Path(args.target), False, args.config)
    try:
        cfg = load_config(sources.config)
        if not cfg.multiagent.enabled:
            raise EvaluateError("apexrl play takes a multi-agent run of a two-player game")
        cfg = opponent_config(cfg, args.policy, PLAYER)
    except ConfigError as exc:
        raise EvaluateError(str(exc)) from exc
    policy = cfg.multiagent.trained[0]
    you = next(spec.name for spec in cfg.multiagent.policies if spec.name.startswith(OPPONENT))
    rng = np.random.default_rng()
    players = make_players(cfg, None, 0, True, "cpu", "eval", rng, 1)
    try:
        versions = load_weights(cfg, sources.checkpoint, players)
    except Exception as exc:  # torch.load and load_state_dict raise many types
        raise EvaluateError(f"cannot load {sources.checkpoint}: {exc}") from exc
    print(f"{PROG}: you against {policy} version {versions[policy]} of {cfg.env.id}")
    print("your marks are X, the policy's O; the seats swap every game")
    envs = AgentEnvs(cfg, 1, players)
    score = {"won": 0, "drew": 0, "lost": 0}
    try:
        envs.reset(int(rng.integers(2**31)))
        games = 0
        while games < args.games:
            for seated in envs.step().episodes:
                games += 1
                mine = sum(
                    value
                    for agent, value in seated.episode.returns.items()
                    if seated.policies.get(agent) == you
                )
                outcome = "won" if mine > 0 else "lost" if mine < 0 else "drew"
                score[outcome] += 1
                tally = ", ".join(f"{k} {v}" for k, v in score.items())
                print(f"game {games}: you {outcome} ({tally})")
    except NoMoreInput:
        print("\nno more moves: the games end")
    finally:
        envs.close()
    return 0


def main(args: argparse.Namespace) -> int:
    """``apexrl play``: 0, or 2 with one line on stderr."""
    try:
        return play(args)
    except EvaluateError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2

"""PettingZoo's connect_four learned by self-play: apexrl PPO with a league against
stable-baselines3's MaskablePPO connect-four recipe (sb3-contrib), for the same wall time, in one
run, one after the other, nothing else running.

The score of a policy is its greedy play (the most likely legal move) in both seats (the seats
swapped every game) against:

- ``random``: a uniformly random legal move;
- ``win/block``: ``tests/multiagent_envs_for_tests.py``'s ``ConnectFourWinBlock``, the move that
  wins now, else the one that blocks the other's win, else a random legal move (it beats random
  in 97.5 % of its games here);
- ``pool`` (apexrl only): a uniform mix of the run's pinned snapshots at its end (the league's
  pool), each sampling its moves from its policy as it does in training (greedy against greedy,
  each pairing would play one game over and over).

A game won is 1, drawn or lost 0: the win rate. The issue's bars: 0.95 against random, 0.8
against win/block, 0.6 against the pool, in both seats.

- ``apexrl``: ``scripts/launch_local.sh --actors 2 --learners 1 --config
  configs/ppo_connect_four.yaml`` with ``run.stop_wall_s`` and the evaluation actor's opponents
  random and win/block (``league.eval_opponents``); its wall time is the learner's clock
  (``result.json``'s ``time_s``). The time to each mark is the first record whose evaluation
  window (``eval_returns["opponent/<name>/wins"]``, ``run.stop_eval_episodes`` games shared by
  both opponents) passes it; the final scores are ``--games`` games of the last checkpoint.
- ``sb3``: MaskablePPO (sb3-contrib 2.9.2, its defaults: 2048 steps a rollout, minibatches of 64,
  10 epochs, lr 3e-4, 64-64 MLPs) on one env in which one model plays both players, as in
  PettingZoo's tutorial (``SelfPlayBoard``: each step is the move of the player whose turn it is,
  its reward the mover's), trained in ``model.learn`` calls of ``SB3_CHUNK_STEPS`` until their
  summed time, the only time counted, reaches the wall time; after each call, ``--checkpoint-games``
  greedy games against each opponent (not counted) give its time to each mark.

    python benchmarks/connect_four_vs_sb3.py [--wall-s 600] [--games 400] [--seed 0]
        [--which apexrl,sb3] [--workdir DIR] [--report] [--set section.key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
CONFIG = REPO / "configs" / "ppo_connect_four.yaml"
BLOCKER = "multiagent_envs_for_tests:ConnectFourWinBlock"
OPPONENTS = {"random": "random", "win/block": BLOCKER}
BARS = {"random": 0.95, "win/block": 0.8, "pool": 0.6}
SB3_CHUNK_STEPS = 20_480  # agent moves per model.learn call (10 rollouts)


# --- the games ----------------------------------------------------------------------------------


def play_games(act, opponent: str, games: int, seed: int) -> dict[str, float]:
    """Win, draw and loss rates of ``act(obs [84], mask [7]) -> move`` against ``opponent``
    (``random`` or ``BLOCKER``) in ``games`` games of connect_four, the seats swapped every game;
    each seat's win rate; the moves ``act`` made outside the mask (PettingZoo ends such a game as
    a loss)."""
    from multiagent_envs_for_tests import ConnectFourWinBlock

    rng = np.random.default_rng(seed)
    blocker = ConnectFourWinBlock(None, None)

    def random_move(board: np.ndarray, mask: np.ndarray) -> int:
        return int(rng.choice(np.flatnonzero(mask)))

    rival = random_move if opponent == "random" else blocker.move
    return play_against(act, lambda game: rival, games, seed)


def play_against(act, rival_in, games: int, seed: int) -> dict[str, float]:
    """``act`` against ``rival_in(game)`` (a move function per game), the seats swapped every
    game: win, draw and loss rates, each seat's win rate, ``act``'s illegal moves."""
    from pettingzoo.classic import connect_four_v3

    outcomes: dict[int, list[float]] = {0: [], 1: []}
    illegal = 0
    env = connect_four_v3.env()
    for game in range(games):
        rival = rival_in(game)
        env.reset(seed=seed + game)
        mine = env.possible_agents[game % 2]
        for agent in env.agent_iter():
            obs, reward, terminated, truncated, _ = env.last()
            if terminated or truncated:
                if agent == mine:
                    outcomes[game % 2].append(reward)
                env.step(None)
                continue
            board = obs["observation"].astype(np.float32).ravel()
            mask = obs["action_mask"].astype(bool)
            if agent == mine:
                move = act(board, mask)
                illegal += int(not mask[move])
            else:
                move = rival(board, mask)
            env.step(int(move))
    env.close()
    both = np.array(outcomes[0] + outcomes[1])
    return {
        "wins": float((both > 0).mean()),
        "draws": float((both == 0).mean()),
        "losses": float((both < 0).mean()),
        "first_seat_wins": float((np.array(outcomes[0]) > 0).mean()),
        "second_seat_wins": float((np.array(outcomes[1]) > 0).mean()),
        "games": int(len(both)),
        "illegal_moves": illegal,
    }


# --- stable-baselines3 --------------------------------------------------------------------------


def sb3_train(wall_s: float, seed: int, checkpoint_games: int) -> dict:
    """MaskablePPO self-play for ``wall_s`` seconds of ``model.learn`` (module docstring)."""
    import gymnasium as gym
    import torch
    from pettingzoo.classic import connect_four_v3
    from sb3_contrib import MaskablePPO
    from sb3_contrib.common.wrappers import ActionMasker
    from stable_baselines3.common.logger import Logger

    class SelfPlayBoard(gym.Env):
        """One env of both players: each step is the move of the player to move; its reward
        and its end are that player's (PettingZoo's tutorial wrapper, in gymnasium's API)."""

        observation_space = gym.spaces.Box(0, 1, (84,), np.float32)
        action_space = gym.spaces.Discrete(7)

        def __init__(self) -> None:
            self.env = connect_four_v3.env()

        def _observe(self) -> np.ndarray:
            obs = self.env.observe(self.env.agent_selection)
            self.mask = obs["action_mask"].astype(bool)
            return obs["observation"].astype(np.float32).ravel()

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.env.reset(seed=seed)
            return self._observe(), {}

        def step(self, action):
            mover = self.env.agent_selection
            self.env.step(int(action))
            done = self.env.terminations[mover] or self.env.truncations[mover]
            reward = float(self.env._cumulative_rewards[mover])
            obs = np.zeros(84, np.float32) if done else self._observe()
            return obs, reward, done, False, {}

    torch.set_num_threads(1)
    env = ActionMasker(SelfPlayBoard(), lambda e: e.unwrapped.mask)
    model = MaskablePPO("MlpPolicy", env, seed=seed, verbose=0)
    # A logger that writes nowhere: SB3's default makes a /tmp/SB3-<time> folder per learn().
    model.set_logger(Logger(folder=None, output_formats=[]))

    def act(board: np.ndarray, mask: np.ndarray) -> int:
        return int(model.predict(board, action_masks=mask, deterministic=True)[0])

    trained_s, curve = 0.0, []
    while trained_s < wall_s:
        started = time.monotonic()
        model.learn(total_timesteps=SB3_CHUNK_STEPS, reset_num_timesteps=False)
        trained_s += time.monotonic() - started
        point = {"time_s": round(trained_s, 1), "moves": int(model.num_timesteps)}
        for name, opponent in OPPONENTS.items():
            point[name] = play_games(act, opponent, checkpoint_games, seed + 7)["wins"]
        curve.append(point)
        print(json.dumps(point), file=sys.stderr, flush=True)
    return {"wall_s": trained_s, "moves": int(model.num_timesteps), "curve": curve, "act": act}


def run_sb3(wall_s: float, seed: int, games: int, checkpoint_games: int, workdir: Path) -> dict:
    args = ["--sb3-child", "--wall-s", str(wall_s), "--seed", str(seed), "--games", str(games)]
    args += ["--checkpoint-games", str(checkpoint_games)]
    with open(workdir / "sb3.log", "w") as log:
        out = subprocess.run(
            [sys.executable, __file__, *args],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            timeout=wall_s * 3 + 1200,
            check=False,
        )
    if out.returncode != 0:
        raise RuntimeError(f"sb3-contrib failed (exit {out.returncode}): see {log.name}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def sb3_child(args: argparse.Namespace) -> None:
    trained = sb3_train(args.wall_s, args.seed, args.checkpoint_games)
    act = trained.pop("act")
    trained["scores"] = {
        name: play_games(act, opponent, args.games, args.seed + 1000)
        for name, opponent in OPPONENTS.items()
    }
    trained["marks"] = time_to_marks(trained["curve"])
    print(json.dumps(trained))


# --- apexrl -------------------------------------------------------------------------------------


def run_apexrl(
    wall_s: float, seed: int, games: int, workdir: Path, overrides: tuple[str, ...] = ()
) -> dict:
    run_dir = workdir / "apexrl_run"
    path = os.pathsep.join(p for p in (str(REPO / "tests"), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "PYTHON": sys.executable}
    args = ["bash", str(REPO / "scripts" / "launch_local.sh"), "--actors", "2", "--learners", "1"]
    args += ["--config", str(CONFIG), "--run-dir", str(run_dir)]
    for override in (
        f"run.stop_wall_s={wall_s}",
        f"env.seed={seed}",
        f'league.eval_opponents=[random, "{BLOCKER}"]',
        *overrides,
    ):
        args += ["--set", override]
    with open(workdir / "apexrl.log", "w") as log:
        code = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
    if code.returncode != 0:
        raise RuntimeError(f"the launcher failed (exit {code.returncode}): see {log.name}")
    records = [json.loads(line) for line in (run_dir / "result.json").read_text().splitlines()]
    curve = [
        {
            "time_s": r["time_s"],
            "env_steps": r["env_steps"],
            **{
                name: r["eval_returns"].get(f"opponent/{o.replace(':', '.')}/wins")
                for name, o in OPPONENTS.items()
            },
            "win_rate_vs_pool": r.get("league", {}).get("win_rate_vs_pool"),
            "elo": r.get("league", {}).get("elo"),
        }
        for r in records
        if r.get("eval_returns")
    ]
    act, version, snapshots = load_apexrl(run_dir)
    scores = {
        name: play_games(act, opponent, games, seed + 1000) for name, opponent in OPPONENTS.items()
    }
    scores["pool"] = play_pool(act, snapshots, games, seed + 2000)
    return {
        "wall_s": records[-1]["time_s"],
        "env_steps": records[-1]["env_steps"],
        "weights_version": version,
        "league": records[-1].get("league"),
        "curve": curve,
        "marks": time_to_marks(curve),
        "scores": scores,
        "run_dir": str(run_dir),
    }


def load_apexrl(run_dir: Path):
    """The run's last checkpoint as a greedy player, its version, and the pool's snapshots (from
    the league's state on disk) as players that sample their moves, as they play in training."""
    import torch

    from apexrl.config import load_config
    from apexrl.league import storage
    from apexrl.models import arrays_to_params
    from apexrl.multiagent.evaluate import load_weights
    from apexrl.multiagent.players import make_players
    from apexrl.transport.codec import decode

    cfg = load_config(run_dir / "config.yaml")

    def player(arrays=None):
        greedy = arrays is None  # the snapshots sample their moves, as in training
        rng = np.random.default_rng(len(snapshots) if not greedy else 0)
        players = make_players(cfg, None, 0, greedy, "cpu", "eval", rng, 1)
        main = players["main"]
        if arrays is None:
            version = load_weights(cfg, run_dir / "checkpoint.pt", players)["main"]
        else:
            arrays_to_params(main.net, arrays)
            version = -1

        planes = tuple(getattr(main.net, "obs_shape", ())) == (2, 6, 7)

        def act(board: np.ndarray, mask: np.ndarray) -> int:
            obs = board
            if planes:  # the run's env gives the board as planes (tasks.board_planes)
                obs = np.moveaxis(board.reshape(6, 7, 2), -1, 0).astype(np.uint8)
            with torch.inference_mode():
                move, _ = main.core.act(obs[None], mask[None], np.zeros(1, np.int64))
            return int(move[0])

        return act, version

    snapshots = []
    act, version = player()
    league_dir = run_dir / "league"
    state = storage.read_state(league_dir)
    for v in state["pools"]["main"]:
        frames = storage.read_snapshot(league_dir, "main", v, None)
        snapshots.append(player(decode(list(frames)).arrays)[0])
    return act, version, snapshots


def play_pool(act, snapshots: list, games: int, seed: int) -> dict[str, float]:
    """``act`` against a uniform mix of the ``snapshots``, the seats swapped every game."""
    rng = np.random.default_rng(seed)
    played = play_against(
        act, lambda game: snapshots[int(rng.integers(len(snapshots)))], games, seed
    )
    return {**played, "snapshots": len(snapshots)}


# --- the report ---------------------------------------------------------------------------------


def time_to_marks(curve: list[dict]) -> dict[str, float | None]:
    """The first time each opponent's win rate passes its bar (None: never)."""
    marks = {}
    for name in OPPONENTS:
        passed = [p["time_s"] for p in curve if p.get(name) is not None and p[name] >= BARS[name]]
        marks[name] = passed[0] if passed else None
    return marks


def score_cell(scores: dict, key: str) -> str:
    """A win rate, with each seat's where it has them (first / second)."""
    if key not in scores:
        return "-"
    s = scores[key]
    seats = ""
    if "first_seat_wins" in s:
        seats = f" ({s['first_seat_wins']:.2f} / {s['second_seat_wins']:.2f})"
    return f"{s['wins']:.3f}{seats}"


def report(rows: dict[str, dict]) -> str:
    lines = [
        "| system | trained s | steps | vs random | vs win/block | vs pool | to 0.95 random |"
        " to 0.8 win/block |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        scores = row["scores"]
        marks = row["marks"]
        steps = row.get("env_steps", row.get("moves"))
        lines.append(
            f"| {name} | {row['wall_s']:.0f} | {steps:,} | {score_cell(scores, 'random')} | "
            f"{score_cell(scores, 'win/block')} | {score_cell(scores, 'pool')} | "
            f"{marks['random']} | {marks['win/block']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--wall-s", type=float, default=600.0)
    parser.add_argument("--games", type=int, default=400)
    parser.add_argument("--checkpoint-games", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--which", default="apexrl,sb3")
    parser.add_argument("--workdir")
    parser.add_argument("--report", action="store_true")
    parser.add_argument(
        "--set", action="append", default=[], help="a config override for apexrl's run (repeat)"
    )
    parser.add_argument("--sb3-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sb3_child:
        sb3_child(args)
        return
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="connect_four_"))
    workdir.mkdir(parents=True, exist_ok=True)
    if not args.report:
        for system in args.which.split(","):
            print(f"{system}: training {args.wall_s:.0f} s in {workdir}", flush=True)
            if system == "apexrl":
                row = run_apexrl(args.wall_s, args.seed, args.games, workdir, tuple(args.set))
            else:
                row = run_sb3(args.wall_s, args.seed, args.games, args.checkpoint_games, workdir)
            (workdir / f"{system}.json").write_text(json.dumps(row, indent=1))
    rows = {
        system: json.loads((workdir / f"{system}.json").read_text())
        for system in ("apexrl", "sb3")
        if (workdir / f"{system}.json").exists()
    }
    print(report(rows))
    for name, row in rows.items():
        print(name, "league:", json.dumps(row.get("league")))


if __name__ == "__main__":
    main()

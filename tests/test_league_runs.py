"""Self-play runs with a league, with the launcher a user runs: real processes, sockets and
PettingZoo games.

- tictactoe, PPO self-play (configs/ppo_connect_four.yaml on tictactoe, short): the actors play
  the parameter server's matches (main's latest against itself and against its snapshots), whose
  outcomes fill the payoff table and the Elo ratings in result.json, with none refused; the
  evaluation actor plays the latest against ``random`` in both seats; the pool and the league's
  state are on disk, and the run resumed (``--resume``) goes on from them; ``apexrl play``, a
  person's moves on standard input, plays the trained policy in both seats.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO, run_launcher

CONFIG = REPO / "configs" / "ppo_connect_four.yaml"
TICTACTOE = (
    "env.id=pettingzoo.classic.tictactoe_v3:env",
    "env.num_envs=8",
    "algo.unroll_length=8",
    "league.snapshot_every_versions=5",
    "league.pool_size=3",
    "actor.eval_num_envs=10",
    "run.stop_eval_episodes=40",
)


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "result.json").read_text().splitlines()]


def launch(run_dir: Path, wall_s: float, *overrides: str, resume: bool = False) -> str:
    args = ["--actors", "2", "--learners", "1", "--config", str(CONFIG), "--run-dir", str(run_dir)]
    for override in (*overrides, f"run.stop_wall_s={wall_s}"):
        args += ["--set", override]
    code, output = run_launcher([*args, *(["--resume"] if resume else [])], wall_s + 120)
    assert code == 0, output[-3000:]
    return output


def test_a_tictactoe_league_plays_rates_evaluates_and_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    launch(run_dir, 15, *TICTACTOE)
    last = records(run_dir)[-1]
    league = last["league"]
    print("league after 15 s:", league)
    assert league["games"] > 1000 and league["refused_results"] == 0
    assert 1 <= league["pool_size"] <= 3 and league["games"] > league["self_play_games"]
    snapshots = sorted(league["elo"].keys() - {"latest"})
    assert len(snapshots) == league["pool_size"] and set(league["payoffs"]) == set(snapshots)
    assert sum(sum(counts) for counts in league["payoffs"].values()) > 0
    seats = {"opponent/random", "opponent/random/player_1", "opponent/random/player_2"}
    assert seats <= set(last["eval_returns"]), last["eval_returns"]
    assert "policy/main_snapshot" in last["returns"]  # the snapshots' seats, in training
    state = json.loads((run_dir / "league" / "state.json").read_text())
    pool = state["pools"]["main"]
    assert len(pool) == league["pool_size"]
    kept = sorted((run_dir / "league" / "snapshots").glob("main_*.params"))
    assert sorted(p.name for p in kept) == sorted(f"main_{v}.params" for v in pool)

    launch(run_dir, 25, *TICTACTOE, resume=True)  # the clock goes on from 15 s
    restored = f"league of main restored: snapshots {pool}"
    assert restored in (run_dir / "logs" / "params.log").read_text()
    assert records(run_dir)[-1]["league"]["games"] > league["games"]  # counted on

    moves = "x\n" + "0\n1\n2\n3\n4\n5\n6\n7\n8\n" * 30
    done = subprocess.run(
        [sys.executable, "-m", "apexrl", "play", str(run_dir), "--games", "2"],
        input=moves,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    print(done.stdout[-1500:])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "'x' is not a legal move" in done.stdout and ". . ." in done.stdout
    assert "game 1: you" in done.stdout and "game 2: you" in done.stdout

"""Multi-agent runs with the launcher a user runs: real processes, sockets and PettingZoo envs.

- tictactoe (turns, legal-action masks, a fixed random player, seats swapped every other episode):
  Ape-X DQN, trained against the random player in both seats, wins at least 90 % of its games as
  the first player and averages at least 0.6 as the second, with no illegal move in 1,000
  greedy games (``apexrl evaluate``); the issue's bar, reached in seconds here.
- apexrl's own task with agents that come and go and two policies of different spaces: IMPALA,
  R2D2 and PPO with an LSTM (a recurrent state per agent) each reach a greedy team return of 30
  (of 33; random: about 14), and IMPALA with team critics (whose values read every agent's latest
  observation); every policy has its replay table, its snapshot and its weights; the Python API
  reads a named policy and acts for a dict of agents (a team critic's on their own observations).

- the evaluation actor plays every policy's newest weights (the speaker-listener's two);
- SAC, TD3 and DDPG (slow): a policy shared by simple_spread's three agents with continuous
  actions passes a greedy team return of -50 (random actions about -79) in well under a minute.

The learning runs of the MPE configs (simple_spread against stable-baselines3, the
speaker-listener's communication) are ``benchmarks/multiagent_vs_sb3.py``,
``benchmarks/speaker_listener_runs.py`` and ``tests/test_multiagent_learning.py`` (slow).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, run_launcher

from apexrl import Policy
from apexrl.multiagent.tasks import come_and_go

TIME_LIMIT_S = 120  # each run's own stop_wall_s: they stop on their evaluation return first


def launch(tmp_path: Path, config: str, *overrides: str, actors: int = 2) -> tuple[Path, dict]:
    """Run ``config`` with the launcher to its end; the run directory and its last record."""
    run_dir = tmp_path / "run"
    args = ["--actors", str(actors), "--learners", "1", "--config", str(REPO / "configs" / config)]
    args += ["--run-dir", str(run_dir), "--set", f"run.stop_wall_s={TIME_LIMIT_S}"]
    for override in overrides:
        args += ["--set", override]
    code, output = run_launcher(args, TIME_LIMIT_S + 120)
    assert code == 0, output[-3000:]
    last = json.loads((run_dir / "result.json").read_text().splitlines()[-1])
    return run_dir, last


def eval_versions(run_dir: Path, policy: str) -> list[float]:
    """The weights version of ``policy`` in each of the evaluation actor's rounds."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb" / "eval"))
    acc.Reload()
    return [event.value for event in acc.Scalars(f"eval/weights_version/{policy}")]


def evaluate(run_dir: Path, episodes: int, envs: int, *extra: str) -> dict:
    """``apexrl evaluate`` of the run's checkpoint (the tests' scripted players importable)."""
    out = run_dir / "test-evaluate.json"
    path = os.pathsep.join(p for p in (str(REPO / "tests"), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "apexrl", "evaluate", str(run_dir), "--episodes", str(episodes),
         "--envs", str(envs), "--out", str(out), *extra],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    print(done.stdout)
    return json.loads(out.read_text())


def test_ape_x_beats_a_random_tictactoe_player_in_both_seats_and_never_moves_illegally(
    tmp_path: Path,
) -> None:
    run_dir, last = launch(tmp_path, "apex_dqn_tictactoe.yaml")
    assert last["done"] is True and last["eval_return_mean"] >= 0.85, last
    assert last["agent_steps"] > 0 and set(last["eval_returns"]) >= {
        "team",
        "policy/learner",
        "policy/learner/player_1",
        "policy/learner/player_2",
        "policy/opponent",
    }
    record = evaluate(run_dir, 1000, 50)
    first = record["groups"]["policy/learner/player_1"]
    second = record["groups"]["policy/learner/player_2"]
    print(
        f"tictactoe against random, 1000 greedy games: first seat wins {first['wins']:.3f} "
        f"(bar 0.9), second seat mean {second['mean']:.3f} (bar 0.6), illegal moves "
        f"{record['illegal_actions']}; random against random: first seat wins about 0.58"
    )
    assert first["wins"] >= 0.9
    assert second["mean"] >= 0.6
    assert record["illegal_actions"] == 0
    assert first["episodes"] + second["episodes"] == 1000  # the seats swap every other game

    # Named fixed opponents in both seats (apexrl evaluate --opponent): random, and a one-move
    # win/block player, which the learner (trained against random alone) finds harder.
    blocker = "multiagent_envs_for_tests:TicTacToeBlocker"
    records = {name: evaluate(run_dir, 400, 50, "--opponent", name) for name in ("random", blocker)}
    for name, record in records.items():
        seats = [record["groups"][f"policy/learner/player_{n}"]["episodes"] for n in (1, 2)]
        assert sum(seats) == 400 and min(seats) > 150  # every other game, about
        assert record["illegal_actions"] == 0 and record["opponent"] == name
    wins = {name: record["groups"]["policy/learner"]["wins"] for name, record in records.items()}
    print(f"wins against random {wins['random']:.3f}, against the blocker {wins[blocker]:.3f}")
    assert wins["random"] >= 0.7 and wins[blocker] < wins["random"]


@pytest.mark.parametrize(
    "family",
    [
        ("impala_come_and_go.yaml", ()),
        (
            "impala_come_and_go.yaml",
            ("algorithm=ppo", "algo={unroll_length: 8, lr: 0.001, hidden_sizes: [64],"
             " lstm_size: 32, epochs: 4, num_minibatches: 1}", "replay.samples_per_insert=0",
             "algo.rollout_timeout_s=5"),
        ),
        (
            "impala_come_and_go.yaml",
            ("algorithm=r2d2", "algo={gamma: 0.9, lr: 0.001, hidden_sizes: [64], lstm_size: 32,"
             " sequence_length: 8, sequence_overlap: 4, burn_in: 2, target_update_period: 100}",
             "replay.kind=prioritized", "replay.capacity=20000", "replay.min_size_to_sample=200",
             "replay.samples_per_insert=2", "learner.batch_size=32", "actor.chunk_steps=8"),
        ),
        (
            "impala_come_and_go.yaml",
            ("multiagent.policies=[{name: guide, critic: team}, {name: walkers, critic: team}]",),
        ),
    ],
    ids=["impala", "ppo_lstm", "r2d2", "impala_team_critic"],
)  # fmt: skip
def test_two_policies_learn_a_task_whose_agents_come_and_go(
    tmp_path: Path, family: tuple[str, tuple[str, ...]]
) -> None:
    config, overrides = family
    run_dir, last = launch(tmp_path, config, *overrides, "actor.report_interval_s=0.2")
    print(
        f"come_and_go: greedy team return {last['eval_return_mean']} after {last['time_s']} s, "
        f"{last['env_steps']} env steps, {last['agent_steps']} agent steps; by group "
        f"{last['eval_returns']} (perfect 33, random about 14)"
    )
    assert last["done"] is True and last["eval_return_mean"] >= 30.0
    # Turns: each env step is one agent's (the actors' reports bring the agent steps, their
    # chunks the env steps, so the two counts may be a report apart).
    assert last["env_steps"] > 0 and last["agent_steps"] > 0
    for policy in ("guide", "walkers"):
        assert (run_dir / "replay_snapshot" / policy).is_dir()
        assert f"policy/{policy}" in last["eval_returns"]
    walkers = Policy.from_checkpoint(run_dir, policy="walkers")
    if walkers.recurrent:  # a dict of agents takes feed-forward policies (docs/multi-agent.md)
        with pytest.raises(ValueError, match="recurrent policy acts on"):
            walkers.compute_actions({"walker_0": np.zeros(4, np.float32)})
        return
    env = come_and_go()
    env.reset(seed=3)
    right = total = 0
    for agent in env.agent_iter():
        obs, _, terminated, truncated, _ = env.last()
        if terminated or truncated:
            env.step(None)
            continue
        if agent.startswith("walker"):
            actions, _ = walkers.compute_actions({agent: obs})
            action = actions[agent]
            right += int(action == int(np.argmax(obs[:3])))
            total += 1
        else:
            action = int(np.argmax(obs[:2]))
        env.step(action)
    assert total == 15 and right >= 13, (right, total)  # its cue, nearly every time
    with pytest.raises(ValueError, match="network policies: guide, walkers"):
        Policy.from_checkpoint(run_dir)


def test_the_evaluation_actor_plays_every_policys_newest_weights(tmp_path: Path) -> None:
    """PPO publishes both policies of the speaker-listener config together, one version per
    rollout; each evaluation round plays the listener's newest weights beside the speaker's (an
    actor that waited on the lead policy alone kept the listener's first ones)."""
    run_dir, last = launch(tmp_path, "ppo_simple_speaker_listener.yaml", "run.stop_wall_s=20")
    speaker, listener = (eval_versions(run_dir, policy) for policy in ("speaker", "listener"))
    print(f"versions in the last rounds: speaker {speaker[-5:]}, listener {listener[-5:]}")
    assert len(speaker) == len(listener) >= 5
    assert speaker[-1] >= 20  # rollouts of 800 env steps: dozens of versions in 20 s
    assert all(abs(s - v) <= 2 for s, v in zip(speaker[-5:], listener[-5:], strict=True))


# simple_spread with continuous actions (each agent: Box(0, 1, (5,))), one policy for the three
CONTINUOUS_SPREAD = (
    "env.id=mpe2.simple_spread_v3:parallel_env",
    "env.kwargs={N: 3, max_cycles: 25, continuous_actions: true}",
    "env.num_envs=4",
    "multiagent.policies=[{name: shared}]",
    "multiagent.mapping=[{agents: '*', policy: shared}]",
    "algo.hidden_sizes=[64, 64]",
    "replay.min_size_to_sample=2000",
    "replay.samples_per_insert=64",
    "run.stop_env_steps=0",
    "run.stop_eval_return=-50",
    "run.stop_wall_s=150",
    "actor.report_interval_s=0.5",
)


def random_spread_return(episodes: int = 200) -> float:
    """The mean team return of uniform random continuous actions on ``CONTINUOUS_SPREAD``."""
    from mpe2 import simple_spread_v3

    env = simple_spread_v3.parallel_env(N=3, max_cycles=25, continuous_actions=True)
    total = 0.0
    for episode in range(episodes):
        env.reset(seed=episode)
        env.action_space(env.agents[0]).seed(episode)
        while env.agents:
            actions = {agent: env.action_space(agent).sample() for agent in env.agents}
            _, rewards, _, _, _ = env.step(actions)
            total += sum(rewards.values())
    env.close()
    return total / episodes


@pytest.mark.slow
@pytest.mark.parametrize(
    "family",
    [
        ("sac_pendulum.yaml", ()),
        ("ddpg_pendulum.yaml", ()),
        ("ddpg_pendulum.yaml", ("algorithm=td3",)),
    ],
    ids=["sac", "ddpg", "td3"],
)  # fmt: skip
def test_the_continuous_families_train_a_policy_shared_by_simple_spreads_agents(
    tmp_path: Path, family: tuple[str, tuple[str, ...]]
) -> None:
    config, overrides = family
    random_return = random_spread_return()
    run_dir, last = launch(tmp_path, config, *overrides, *CONTINUOUS_SPREAD)
    print(
        f"simple_spread, continuous actions: greedy team return {last['eval_return_mean']} after "
        f"{last['time_s']} s, {last['env_steps']} env steps (random actions {random_return:.1f})"
    )
    assert last["agent_steps"] >= 2.9 * last["env_steps"] > 0  # three agents act every step
    # random actions score about -79 here, standing still (the greedy start) about -76
    assert last["eval_return_mean"] >= -50 > random_return + 20

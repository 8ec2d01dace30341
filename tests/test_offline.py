"""Offline runs (``run.input_dataset``): behaviour cloning's losses by hand; a dataset's episodes
read back step for step and cut into the items an actor cuts from the same steps (chunk ->
dataset -> replay items, exact); and, with the launcher a user runs, BC and offline Ape-X from a
dataset that ``apexrl evaluate --dataset`` wrote of a solved run."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import REPO, run_launcher

from apexrl.acting.step_block import StepBlock
from apexrl.algos.bc import bc_box_loss, bc_discrete_loss
from apexrl.algos.transitions import cut_transitions
from apexrl.config import ConfigError, load_config
from apexrl.envs import VectorStep
from apexrl.external.spaces import ExternalSpaces
from apexrl.offline import feeder
from apexrl.offline.minari_datasets import RecordEpisodeSteps, write_dataset

minari = pytest.importorskip("minari")


def test_bc_losses_by_hand() -> None:
    # p(action 1) = 3 / (1 + 3) under logits (0, ln 3): the loss is -ln 0.75
    logits = torch.tensor([[0.0, math.log(3.0)]])
    assert float(bc_discrete_loss(logits, torch.tensor([1]))) == pytest.approx(-math.log(0.75))
    # (0.5 - 1)^2 + (-0.5 - 0)^2 = 0.5 for the first item, 0 for the second: mean 0.25
    predicted = torch.tensor([[0.5, -0.5], [0.2, 0.2]])
    assert float(bc_box_loss(predicted, torch.tensor([[1.0, 0.0], [0.2, 0.2]]))) == 0.25


def test_offline_runs_need_transitions_and_no_replay_ratio() -> None:
    with pytest.raises(ConfigError, match="ppo learns from its own actions"):
        load_config(REPO / "configs" / "ppo_cartpole.yaml", ["run.input_dataset=x/y-v0"])
    with pytest.raises(ConfigError, match="samples_per_insert 0"):
        load_config(REPO / "configs" / "apex_dqn_cartpole.yaml", ["run.input_dataset=x/y-v0"])


def play_episodes(num_episodes: int, seed: int) -> list[dict]:
    """Random CartPole episodes as ``apexrl evaluate --dataset`` records them, one cut short by
    a time limit."""
    episodes: list[dict] = []
    env = RecordEpisodeSteps(gym.make("CartPole-v1", max_episode_steps=12), num_episodes, episodes)
    rng = np.random.default_rng(seed)
    for i in range(num_episodes):
        env.reset(seed=seed + i)
        while len(episodes) == i:
            env.step(int(rng.integers(2)))
    env.close()
    return episodes


def actor_items(steps: dict[str, np.ndarray], gamma: float, n: int) -> dict[str, np.ndarray]:
    """The transitions an actor cuts from the same steps, played in one env (blocks of one)."""
    num_steps = len(steps["action"])
    block = StepBlock(num_steps + n - 1, n - 1)
    for t in range(num_steps + n - 1):
        r = min(t, num_steps - 1)
        pad = t >= num_steps
        obs = steps["next_obs"][r] if pad else steps["obs"][r]
        step = VectorStep(
            steps["next_obs"][r : r + 1],
            steps["next_obs"][r : r + 1],
            np.array([0.0 if pad else steps["reward"][r]], np.float32),
            steps["terminated"][r : r + 1],
            steps["truncated"][r : r + 1],
        )
        block.add(obs[None], steps["action"][r : r + 1], step, {})
    return cut_transitions(block, gamma, n)


def test_a_dataset_round_trips_to_the_items_an_actor_cuts(tmp_path, monkeypatch) -> None:
    """Recorded episodes -> a Minari dataset -> the feeder's steps are the recorded ones, and the
    items its core cuts (Ape-X, 3-step) are the transitions an actor cuts from those steps."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    episodes = play_episodes(4, seed=3)
    env = gym.make("CartPole-v1")
    write_dataset(
        "test/round-trip-v0",
        episodes,
        "CartPole-v1",
        env.observation_space,
        env.action_space,
        "test",
    )
    cfg = load_config(
        REPO / "configs" / "apex_dqn_cartpole.yaml",
        ["replay.samples_per_insert=0", "run.input_dataset=test/round-trip-v0", "algo.gamma=0.5"],
    )
    spaces = ExternalSpaces(cfg)
    from apexrl.acting.startup import make_envs_and_network

    envs, algorithm, net = make_envs_and_network(cfg, 1, "cpu")
    envs.close()
    core = algorithm.actor_core(net, cfg, 0, False, "cpu", np.random.default_rng(0))
    dataset = minari.load_dataset("test/round-trip-v0")
    for recorded, episode in zip(episodes, dataset.iterate_episodes(), strict=True):
        steps = feeder.episode_steps(spaces, episode)
        np.testing.assert_array_equal(steps["obs"], np.stack(recorded["observations"][:-1]))
        np.testing.assert_array_equal(steps["next_obs"], np.stack(recorded["observations"][1:]))
        np.testing.assert_array_equal(steps["action"], recorded["actions"])
        np.testing.assert_array_equal(steps["reward"], recorded["rewards"])
        np.testing.assert_array_equal(steps["terminated"], recorded["terminations"])
        np.testing.assert_array_equal(steps["truncated"], recorded["truncations"])
        fields, priorities = feeder.episode_items(core, steps, cfg.algo.n_step)
        expected = actor_items(steps, 0.5, 3)
        assert len(priorities) == len(steps["action"]) and np.all(priorities > 0)
        for name, value in expected.items():
            np.testing.assert_array_equal(fields[name], value, err_msg=name)
    last = feeder.episode_steps(spaces, list(dataset.iterate_episodes())[-1])
    # by hand, the last step of an episode of 12 steps cut by the time limit: one reward of 1
    assert last["truncated"][-1] and not last["terminated"][-1]
    fields, _ = feeder.episode_items(core, last, 3)
    assert fields["reward"][-3:].tolist() == [1.75, 1.5, 1.0]  # 1 + 0.5 + 0.25, 1 + 0.5, 1
    assert fields["num_steps"][-3:].tolist() == [3, 2, 1]


# --- launched offline runs -----------------------------------------------------------------------


def launch(args: list[str], datasets: Path, timeout_s: float) -> tuple[int, str]:
    os.environ["MINARI_DATASETS_PATH"] = str(datasets)
    try:
        return run_launcher(args, timeout_s)
    finally:
        del os.environ["MINARI_DATASETS_PATH"]


def last_record(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text().splitlines()[-1])


@pytest.fixture(scope="module")
def expert_dataset(tmp_path_factory) -> tuple[Path, str]:
    """50 greedy episodes of a PPO CartPole run solved with the launcher, written by
    ``apexrl evaluate --dataset``."""
    root = tmp_path_factory.mktemp("expert")
    datasets = root / "datasets"
    run_dir = root / "ppo"
    args = ["--config", str(REPO / "configs" / "ppo_cartpole.yaml"), "--actors", "2"]
    code, output = launch([*args, "--run-dir", str(run_dir)], datasets, 300)
    assert code == 0 and last_record(run_dir)["eval_return_mean"] >= 475, output[-2000:]
    played = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl",
            "evaluate",
            str(run_dir),
            "--episodes",
            "50",
            "--envs",
            "10",
            "--dataset",
            "cartpole/apexrl-expert-v0",
            "--out",
            str(root / "eval.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "MINARI_DATASETS_PATH": str(datasets)},
    )
    assert played.returncode == 0, played.stderr[-2000:]
    return datasets, "cartpole/apexrl-expert-v0"


@pytest.mark.slow
def test_behaviour_cloning_from_a_solved_runs_dataset_reaches_475(tmp_path, expert_dataset):
    datasets, dataset_id = expert_dataset
    os.environ["MINARI_DATASETS_PATH"] = str(datasets)
    try:
        returns = [
            float(e.rewards.sum()) for e in minari.load_dataset(dataset_id).iterate_episodes()
        ]
    finally:
        del os.environ["MINARI_DATASETS_PATH"]
    run_dir = tmp_path / "bc"
    args = ["--config", str(REPO / "configs" / "bc_cartpole.yaml"), "--actors", "0"]
    code, output = launch([*args, "--run-dir", str(run_dir)], datasets, 400)
    assert code == 0, output[-3000:]
    last = last_record(run_dir)
    print(
        f"\nBC from {len(returns)} episodes (mean return {np.mean(returns):.1f}, "
        f"{sum(len_ for len_ in map(int, returns))} steps): eval {last['eval_return_mean']} after "
        f"{last['time_s']:.0f} s, {last['learner_updates']} updates, replay {last['replay_size']}"
    )
    assert last["replay_size"] == sum(map(int, returns))  # every step of the dataset, once
    assert last["eval_return_mean"] >= 475 and last["time_s"] <= 180


def balancing_episodes(num_episodes: int, epsilon: float, seed: int) -> list[dict]:
    """CartPole episodes of a hand-written controller (push toward where the pole falls) that
    takes a random action with probability ``epsilon``: both actions tried in most states."""
    episodes: list[dict] = []
    env = RecordEpisodeSteps(gym.make("CartPole-v1"), num_episodes, episodes)
    rng = np.random.default_rng(seed)
    for i in range(num_episodes):
        obs, _ = env.reset(seed=seed + i)
        while len(episodes) == i:
            action = int(obs[2] + 0.5 * obs[3] > 0)
            if rng.random() < epsilon:
                action = int(rng.integers(2))
            obs, *_ = env.step(action)
    env.close()
    return episodes


@pytest.mark.slow
def test_offline_apex_dqn_learns_cartpole_from_a_dataset(tmp_path) -> None:
    """Ape-X DQN with no actors, from 60 episodes of an epsilon-0.3 controller written as a
    Minari dataset: the evaluation actor's greedy policy reaches 475."""
    datasets = tmp_path / "datasets"
    os.environ["MINARI_DATASETS_PATH"] = str(datasets)
    try:
        episodes = balancing_episodes(60, 0.3, seed=11)
        env = gym.make("CartPole-v1")
        write_dataset(
            "cartpole/apexrl-dqn-eps-v0",
            episodes,
            "CartPole-v1",
            env.observation_space,
            env.action_space,
            "a controller at epsilon 0.3",
        )
    finally:
        del os.environ["MINARI_DATASETS_PATH"]
    returns = [sum(e["rewards"]) for e in episodes]
    run_dir = tmp_path / "offline"
    args = ["--config", str(REPO / "configs" / "apex_dqn_cartpole_offline.yaml"), "--actors", "0"]
    code, output = launch([*args, "--run-dir", str(run_dir)], datasets, 420)
    assert code == 0, output[-3000:]
    last = last_record(run_dir)
    print(
        f"\noffline Ape-X DQN from {len(episodes)} episodes (mean return {np.mean(returns):.1f}, "
        f"{sum(map(len, (e['actions'] for e in episodes)))} steps): eval "
        f"{last['eval_return_mean']} after {last['time_s']:.0f} s, "
        f"{last['learner_updates']} updates"
    )
    assert last["eval_return_mean"] >= 475 and last["time_s"] <= 300


def test_the_training_actors_episodes_are_written_as_one_dataset(tmp_path) -> None:
    """``run.output_dataset``: a PPO CartPole run with 2 actors writes its training episodes as
    one Minari dataset when it ends, each episode whole, each action the one taken on its
    observation (CartPole's dynamics from each observation and action give the next one)."""
    datasets, run_dir = tmp_path / "datasets", tmp_path / "run"
    args = ["--config", str(REPO / "configs" / "ppo_cartpole.yaml"), "--actors", "2"]
    args += ["--run-dir", str(run_dir), "--set", "run.output_dataset=cartpole/train-v0"]
    # Past the solve (about 15 k env steps), so that whole training episodes of the solved
    # policy end before the run does: its evaluation alone stopping it may leave none.
    args += ["--set", "run.stop_eval_return=null", "--set", "run.stop_env_steps=40000"]
    code, output = launch(args, datasets, 300)
    assert code == 0, output[-3000:]
    assert "run.output_dataset cartpole/train-v0: " in output
    assert not (run_dir / "dataset_parts").exists()
    os.environ["MINARI_DATASETS_PATH"] = str(datasets)
    try:
        dataset = minari.load_dataset("cartpole/train-v0")
        episodes = list(dataset.iterate_episodes())
    finally:
        del os.environ["MINARI_DATASETS_PATH"]
    last = last_record(run_dir)
    returns = [float(e.rewards.sum()) for e in episodes]
    print(f"\n{len(episodes)} episodes, {dataset.total_steps} of {last['env_steps']} env steps")
    assert 0.5 * last["env_steps"] <= dataset.total_steps <= last["env_steps"]
    assert max(returns) >= 400 and min(returns) < 100  # from a fresh start to solved
    env = gym.make("CartPole-v1").unwrapped
    for episode in episodes[:: max(len(episodes) // 10, 1)]:
        ends = episode.terminations | episode.truncations
        assert ends[-1] and not ends[:-1].any()
        env.reset(seed=0)
        for t, action in enumerate(episode.actions):
            env.state = episode.observations[t].astype(np.float64)
            following, *_ = env.step(int(action))
            np.testing.assert_allclose(following, episode.observations[t + 1], atol=1e-5)


def test_the_launcher_refuses_what_an_offline_run_cannot_do(tmp_path) -> None:
    """Serial mode runs no feeder; an offline run with no dataset feeder but no actors either."""
    bc = str(REPO / "configs" / "bc_cartpole.yaml")
    for args, reason in (
        (["--serial", "--actors", "0", "--config", bc], "--serial runs no dataset feeder"),
        (["--actors", "0"], "--actors must be at least 1, or 0 with --external N"),
        (["--actors", "1", "--set", "run.output_dataset=bad id"], "not Minari's"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "apexrl", "local", "--logdir", str(tmp_path), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2 and reason in done.stderr, (args, done.stderr[-2000:])
    assert not any(tmp_path.iterdir())  # nothing was started

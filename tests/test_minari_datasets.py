"""Episodes out as Minari datasets: ``apexrl evaluate RUN --episodes N --dataset ID`` writes what
it plays, and ``minari.load_dataset(ID)`` reads back exactly those episodes — observations,
actions, rewards, terminations and truncations, in the env's own spaces — with no JAX imported.
Bad ids and taken ids are refused before anything is played, and an existing dataset is kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_policy import write_checkpoint

from apexrl.offline.minari_datasets import DatasetError, check_dataset_id

pytest.importorskip("minari")


def evaluate(run_dir: Path, datasets: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MINARI_DATASETS_PATH": str(datasets)}
    return subprocess.run(
        [sys.executable, "-m", "apexrl", "evaluate", str(run_dir), *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )


def load(datasets: Path, dataset_id: str) -> tuple[list, bool]:
    """The dataset's episodes as Minari gives them (in a fresh process, where JAX would show)."""
    code = (
        "import json, sys, minari\n"
        f"d = minari.load_dataset({dataset_id!r})\n"
        "out = [dict(obs=e.observations.tolist(), actions=e.actions.tolist(), "
        "rewards=e.rewards.tolist(), terminations=e.terminations.tolist(), "
        "truncations=e.truncations.tolist()) for e in d.iterate_episodes()]\n"
        "print(json.dumps(dict(episodes=out, jax='jax' in sys.modules, "
        "env=d.spec.env_spec.id, total_steps=d.total_steps)))\n"
    )
    env = {**os.environ, "MINARI_DATASETS_PATH": str(datasets)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("envs", [1, 3])
def test_evaluate_writes_the_episodes_it_played_as_a_minari_dataset(
    tmp_path: Path, envs: int
) -> None:
    run_dir = write_checkpoint(tmp_path / "run", "ppo", ("env.max_episode_steps=60",))
    datasets = tmp_path / "datasets"
    out = tmp_path / "eval.json"
    done = evaluate(
        run_dir, datasets, "--episodes", "5", "--envs", str(envs), "--seed", "3",
        "--out", str(out), "--dataset", "cartpole/apexrl-ppo-v0",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "dataset cartpole/apexrl-ppo-v0: 5 episodes" in done.stdout
    record = json.loads(out.read_text())
    data = load(datasets, "cartpole/apexrl-ppo-v0")
    assert not data["jax"]
    assert data["env"] == "CartPole-v1"
    episodes = data["episodes"]
    assert len(episodes) == 5
    # the same episodes the evaluation counted: returns and lengths, as a multiset
    assert sorted(sum(e["rewards"]) for e in episodes) == sorted(record["returns"])
    assert sorted(len(e["actions"]) for e in episodes) == sorted(record["lengths"])
    assert data["total_steps"] == sum(record["lengths"])
    for e in episodes:
        obs = np.asarray(e["obs"])
        assert obs.shape == (len(e["actions"]) + 1, 4)
        assert set(e["actions"]) <= {0, 1}
        ended = np.asarray(e["terminations"]) | np.asarray(e["truncations"])
        assert ended[-1] and not ended[:-1].any()
        if len(e["actions"]) == 60:  # cut by the time limit, not failed
            assert e["truncations"][-1] and not e["terminations"][-1]
        else:
            assert e["terminations"][-1]


def test_the_dataset_replays_exactly_in_the_env(tmp_path: Path) -> None:
    """The first episode's stored actions, replayed in CartPole from its reset seed, give back its
    stored observations, rewards and terminations bit for bit: what is stored is what happened."""
    import gymnasium as gym
    import minari

    run_dir = write_checkpoint(tmp_path / "run", "apex_dqn")
    datasets = tmp_path / "datasets"
    done = evaluate(run_dir, datasets, "--episodes", "2", "--seed", "11", "--dataset", "cp-v1")
    assert done.returncode == 0, done.stdout + done.stderr
    os.environ["MINARI_DATASETS_PATH"] = str(datasets)
    try:
        dataset = minari.load_dataset("cp-v1")
        episodes = list(dataset.iterate_episodes())
    finally:
        del os.environ["MINARI_DATASETS_PATH"]
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=11)  # the first episode's reset; the second resets unseeded
    first = episodes[0]
    assert np.array_equal(first.observations[0], obs)
    for t, action in enumerate(first.actions):
        obs, reward, terminated, truncated, _ = env.step(int(action))
        assert np.array_equal(first.observations[t + 1], obs)
        assert first.rewards[t] == reward and first.terminations[t] == terminated
    env.close()


def test_bad_and_taken_ids_are_refused_before_playing(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="not Minari's"):
        check_dataset_id("no version")
    run_dir = write_checkpoint(tmp_path / "run", "ppo")
    datasets = tmp_path / "datasets"
    assert evaluate(run_dir, datasets, "--episodes", "1", "--dataset", "keep-v0").returncode == 0
    kept = sorted(p.stat().st_mtime_ns for p in datasets.rglob("*") if p.is_file())
    done = evaluate(run_dir, datasets, "--episodes", "1", "--dataset", "keep-v0")
    assert done.returncode == 2
    assert "dataset keep-v0 exists already" in done.stderr
    assert "episodes" not in done.stdout  # nothing was played
    assert sorted(p.stat().st_mtime_ns for p in datasets.rglob("*") if p.is_file()) == kept
    done = evaluate(run_dir, datasets, "--episodes", "1", "--dataset", "bad id")
    assert done.returncode == 2 and "not Minari's" in done.stderr

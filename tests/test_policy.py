"""``apexrl.Policy`` in a user's own loop: for every family, the policy of a checkpoint plays the
episodes that ``apexrl evaluate`` plays for the same checkpoint and seed (a plain gymnasium env
stepped by hand, R2D2 carrying its recurrent state); continuous actions come back in the env's
bounds; bad input is refused with one line. No role is started: the checkpoints are written here
from a fresh learner core, as a learner writes them (determinism is the point, not skill)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import REPO

from apexrl import Policy, RecurrentState
from apexrl.config import dump_config, load_config
from apexrl.learning.checkpoint import save_checkpoint
from apexrl.learning.update import build_algo
from apexrl.runtime import rundir

FAMILIES = ("apex_dqn", "r2d2", "impala", "ppo")
EPISODES = 6
SEED = 123


def write_checkpoint(run_dir: Path, family: str, overrides: tuple[str, ...] = ()) -> Path:
    """A run directory holding ``config.yaml`` and the ``checkpoint.pt`` of a fresh learner
    core of ``configs/<family>_cartpole.yaml``."""
    path = REPO / "configs" / f"{family}_cartpole.yaml"
    cfg = load_config(path, [f"run.dir={run_dir}", *overrides])
    run_dir.mkdir(parents=True)
    torch.manual_seed(FAMILIES.index(family) + 7)
    algo, counters = build_algo(cfg, torch.device("cpu"), resume=False)
    counters = {**counters, "weights_version": 0}
    assert save_checkpoint(rundir.checkpoint_path(run_dir), algo, counters)
    rundir.config_path(run_dir).write_text(dump_config(cfg))
    return run_dir


def apexrl_evaluate(run_dir: Path, envs: int) -> tuple[dict, str]:
    """``apexrl evaluate`` on the run's checkpoint: its JSON record and what it printed."""
    out = run_dir / f"evaluate-{envs}.json"
    args = ["--episodes", str(EPISODES), "--envs", str(envs), "--seed", str(SEED)]
    done = subprocess.run(
        [sys.executable, "-m", "apexrl", "evaluate", str(run_dir), *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text()), done.stdout


def user_loop(policy: Policy, episodes: int, seed: int) -> list[float]:
    """What a user writes: one gymnasium env, reset by hand, the policy asked at every step."""
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    returns: list[float] = []
    episode_return, reward, start, state = 0.0, 0.0, True, None
    while len(returns) < episodes:
        action, state = policy.compute_actions(
            obs[None], state, prev_reward=np.array([reward]), episode_start=np.array([start])
        )
        obs, reward, terminated, truncated, _ = env.step(int(action[0]))
        episode_return += float(reward)
        start = terminated or truncated
        if start:
            returns.append(episode_return)
            episode_return = 0.0
            obs, _ = env.reset()
    env.close()
    return returns


@pytest.mark.parametrize("family", FAMILIES)
def test_the_checkpoint_policy_plays_what_apexrl_evaluate_plays(
    tmp_path: Path, family: str
) -> None:
    run_dir = write_checkpoint(tmp_path / family, family)
    record, printed = apexrl_evaluate(run_dir, envs=1)
    policy = Policy.from_checkpoint(run_dir, seed=SEED)
    assert policy.weights_version == 0
    assert policy.recurrent == (family == "r2d2")
    returns = user_loop(policy, EPISODES, SEED)
    assert returns == record["returns"], (returns, record["returns"])
    assert f"return  mean {np.mean(returns):.2f}  std {np.std(returns):.2f}" in printed, printed
    # Policy.evaluate plays as apexrl evaluate does, also on several envs at once.
    assert policy.evaluate(EPISODES)["returns"] == record["returns"]
    several, _ = apexrl_evaluate(run_dir, envs=3)
    assert policy.evaluate(EPISODES, num_envs=3)["returns"] == several["returns"]


def test_a_recurrent_state_is_carried_and_zeroed_at_an_episode_start(tmp_path: Path) -> None:
    policy = Policy.from_checkpoint(write_checkpoint(tmp_path / "r2d2", "r2d2"))
    obs = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    first, state = policy.compute_actions(obs)
    assert isinstance(state, RecurrentState)
    assert state.h.shape == state.c.shape == (3, policy.network.lstm_size)
    assert np.abs(state.h).sum() > 0 and list(state.prev_action) == list(first)
    again, _ = policy.compute_actions(obs, state, episode_start=np.ones(3, dtype=bool))
    assert list(again) == list(first)  # a zeroed state acts as the initial one
    _, carried = policy.compute_actions(obs, state, prev_reward=np.ones(3))
    assert not np.allclose(carried.h, state.h)
    with pytest.raises(ValueError, match="state is for 3 envs"):
        policy.compute_actions(obs[:2], state)


@pytest.mark.parametrize(
    "config, overrides",
    [
        ("ppo_pendulum", ()),
        ("ppo_pendulum", ("algo.squash_actions=true",)),
        ("impala_pendulum", ()),
    ],
)
def test_continuous_actions_come_back_in_the_env_bounds(config: str, overrides: tuple) -> None:
    path = REPO / "configs" / f"{config}.yaml"
    cfg = load_config(path, [*overrides, "algo.init_log_std=3"])
    policy = Policy(cfg, seed=1)
    assert (policy.action_space.low, policy.action_space.high) == (-2.0, 2.0)
    obs = np.random.default_rng(1).normal(scale=50.0, size=(256, 3))  # float64, cast to the env's
    for explore in (False, True):
        actions, state = policy.compute_actions(obs, explore=explore)
        assert state is None and actions.shape == (256, 1) and actions.dtype == np.float32
        assert (actions >= -2.0).all() and (actions <= 2.0).all()
    assert np.abs(actions).max() == pytest.approx(2.0)  # wide samples reach the bounds


def test_bad_input_is_refused_with_one_line(tmp_path: Path) -> None:
    run_dir = write_checkpoint(tmp_path / "ppo", "ppo")
    policy = Policy.from_checkpoint(rundir.checkpoint_path(run_dir))
    with pytest.raises(ValueError, match=r"obs_batch must be \[B, 4\], got shape \(4,\)"):
        policy.compute_actions(np.zeros(4))
    with pytest.raises(ValueError, match="no run directory or checkpoint"):
        Policy.from_checkpoint(tmp_path / "nowhere")
    rundir.checkpoint_path(run_dir).write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot load"):
        Policy.from_checkpoint(run_dir)
    with pytest.raises(ValueError, match="expected"):
        policy.set_weights({k: v[..., :1] for k, v in policy.get_weights().items()})

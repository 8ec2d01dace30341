"""The actor's vector envs: which kind an env id gets, and the episode seam of CartPole's numpy
vector env as apexrl resets it (``CartPoleSameStep``), checked against gymnasium's single-env
``CartPoleEnv`` stepped from the same states."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.classic_control import CartPoleEnv
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.vector import AutoresetMode

from apexrl.config import EnvConfig
from apexrl.envs import (
    CARTPOLE_NO_VELOCITY_ID,
    MIN_ENVS_FOR_VECTOR_ENTRY_POINT,
    CartPoleSameStep,
    make_vector_env,
    step_vector,
)

RESET_BOUND = 0.05  # CartPole resets every state variable uniformly in [-0.05, 0.05]


def balancing_actions(obs: np.ndarray) -> np.ndarray:
    """A linear controller that keeps CartPole up for 500 steps and more (to reach truncation)."""
    x, x_dot, theta, theta_dot = obs.T
    return (10 * theta + 2 * theta_dot + 0.2 * x + 0.5 * x_dot > 0).astype(np.int64)


def test_cartpole_gets_its_numpy_vector_env_reset_in_the_same_step() -> None:
    envs = make_vector_env(EnvConfig(id="CartPole-v1"), MIN_ENVS_FOR_VECTOR_ENTRY_POINT)
    assert isinstance(envs, CartPoleSameStep)
    assert isinstance(envs.unwrapped, CartPoleVectorEnv)
    assert envs.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    assert envs.unwrapped.max_episode_steps == 500  # CartPole-v1's time limit
    envs.close()


def test_an_id_without_a_vector_entry_point_gets_a_sync_vector_env() -> None:
    envs = make_vector_env(EnvConfig(id=CARTPOLE_NO_VELOCITY_ID), 8)
    assert isinstance(envs, gym.vector.SyncVectorEnv)
    assert envs.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    envs.close()


def test_a_few_envs_get_a_sync_vector_env() -> None:
    envs = make_vector_env(EnvConfig(id="CartPole-v1"), MIN_ENVS_FOR_VECTOR_ENTRY_POINT - 1)
    assert isinstance(envs, gym.vector.SyncVectorEnv)
    envs.close()


def test_max_episode_steps_reaches_the_vector_env() -> None:
    for num_envs in (1, 8):  # sync, vector entry point
        envs = make_vector_env(EnvConfig(id="CartPole-v1", max_episode_steps=7), num_envs)
        envs.reset(seed=0)
        lengths = []
        for t in range(1, 8):
            step = step_vector(envs, np.zeros(num_envs, dtype=np.int64))
            lengths += [t] * int(step.truncated.sum())
        envs.close()
        assert lengths == [7] * num_envs


@pytest.mark.parametrize("max_episode_steps", [0, 30])
def test_every_step_follows_cartpole_dynamics_and_ended_envs_restart_in_the_same_step(
    max_episode_steps: int,
) -> None:
    """Each env's step, final observations included, is what a single ``CartPoleEnv`` does from
    the same state; an env whose episode ended returns a fresh reset observation, and its next
    step starts from that state (every step moves every env: reward 1, no ignored action)."""
    num_envs = 8
    envs = make_vector_env(EnvConfig(max_episode_steps=max_episode_steps), num_envs)
    limit = max_episode_steps or 500
    single = CartPoleEnv()
    single.reset(seed=0)
    rng = np.random.default_rng(2)
    obs, _ = envs.reset(seed=2)
    lengths = np.zeros(num_envs, dtype=np.int64)
    num_terminated = num_truncated = 0
    for _ in range(400):
        state = envs.unwrapped.state.copy()  # [4, B] float64, what the step starts from
        np.testing.assert_array_equal(state.T.astype(np.float32), obs)
        action = rng.integers(0, 2, size=num_envs)
        step = step_vector(envs, action)
        lengths += 1
        assert np.all(step.reward == 1.0)
        for b in range(num_envs):
            single.state, single.steps_beyond_terminated = state[:, b].copy(), None
            expected_obs, _, expected_terminated, _, _ = single.step(int(action[b]))
            np.testing.assert_allclose(step.next_obs[b], expected_obs, rtol=0, atol=1e-6)
            assert step.terminated[b] == expected_terminated
            assert step.truncated[b] == (lengths[b] == limit)
            if step.terminated[b] or step.truncated[b]:
                assert np.all(np.abs(step.obs[b]) <= RESET_BOUND)
                assert not np.array_equal(step.obs[b], step.next_obs[b])
                lengths[b] = 0
            else:
                np.testing.assert_array_equal(step.obs[b], step.next_obs[b])
        num_terminated += int(step.terminated.sum())
        num_truncated += int(step.truncated.sum())
        obs = step.obs
    envs.close()
    assert num_terminated >= 10
    assert (num_truncated > 0) == (max_episode_steps > 0)


def test_cartpole_v1_truncates_after_500_steps() -> None:
    envs = make_vector_env(EnvConfig(id="CartPole-v1"), 4)
    obs, _ = envs.reset(seed=3)
    ends = []
    for t in range(1000):
        step = step_vector(envs, balancing_actions(obs))
        assert not step.terminated.any()
        ends += [(t, b) for b in np.flatnonzero(step.truncated)]
        obs = step.obs
    envs.close()
    assert ends == [(t, b) for t in (499, 999) for b in range(4)]


def test_a_seed_fixes_the_trajectory() -> None:
    def trajectory() -> np.ndarray:
        envs = make_vector_env(EnvConfig(), 4)
        obs, _ = envs.reset(seed=5)
        rng = np.random.default_rng(5)
        seen = [obs]
        for _ in range(100):
            step = step_vector(envs, rng.integers(0, 2, size=4))
            seen += [step.next_obs, step.obs]
        envs.close()
        return np.stack(seen)

    np.testing.assert_array_equal(trajectory(), trajectory())

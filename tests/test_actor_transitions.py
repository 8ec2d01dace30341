"""The actor's n-step transitions on a real CartPole vector env, checked against a recording.

The actor's loop is reproduced without sockets: ``step_vector`` -> ``StepBlock.add`` ->
``build_transitions`` (Ape-X's actor core) when the block is full -> ``keep_overlap``. A thin
wrapper records what the vector env itself returned (its raw observations and
``info["final_obs"]``), and every emitted transition is checked against that recording: which
(step, env) it starts at, its reward, window length, flags, ``next_obs`` and initial priority.

CartPole pays 1 per step, so a window of m steps has reward ``1 + G + ... + G ** (m - 1)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import pytest
import torch

from apexrl.acting.step_block import StepBlock
from apexrl.algos.apex_dqn import build_transitions
from apexrl.config import EnvConfig
from apexrl.envs import VectorStep, make_vector_env, step_vector
from apexrl.models import build_q_network

G = 0.9  # gamma
REWARD = {1: 1.0, 2: 1 + G, 3: 1 + G + G**2}  # window reward by window length m
NUM_ENVS = 4
CHUNK_STEPS = 8
RESET_BOUND = 0.05  # CartPole resets every state variable uniformly in [-0.05, 0.05]


class RecordingEnvs:
    """Passes ``step`` through to a vector env and keeps what the env returned, info included."""

    def __init__(self, envs: gym.vector.VectorEnv) -> None:
        self.envs = envs
        self.returned: list[tuple] = []

    def step(self, actions: np.ndarray) -> tuple:
        out = self.envs.step(actions)
        obs, reward, terminated, truncated, info = out
        self.returned.append(
            (obs.copy(), reward.copy(), terminated.copy(), truncated.copy(), dict(info))
        )
        return out


@dataclass
class Run:
    """Per-step recordings ``[S, B, ...]`` and the chunks the actor emitted."""

    acted_obs: np.ndarray  # [S + 1, B, 4] the observation each action was chosen on (and the last)
    action: np.ndarray  # [S, B]
    reward: np.ndarray  # [S, B] as returned by the env
    terminated: np.ndarray  # [S, B]
    truncated: np.ndarray  # [S, B]
    final_obs: dict[tuple[int, int], np.ndarray]  # (step, env) -> info["final_obs"][env]
    returned_obs: np.ndarray  # [S, B, 4] the env's own obs (reset obs at an episode end)
    chunks: list[tuple[dict[str, np.ndarray], np.ndarray]]  # (fields, priorities) per block
    net: torch.nn.Module


def run_actor(
    env_cfg: EnvConfig, n: int, num_blocks: int, seed: int = 0, send_after_overlap: bool = False
) -> Run:
    """The actor's inner loop with uniformly random actions, until ``num_blocks`` were cut.

    A chunk is "sent" by copying its arrays, as the codec does. By default that happens right after
    ``build_transitions``; ``send_after_overlap`` copies them after ``keep_overlap`` instead, the
    order of ``actor.main``.
    """
    torch.manual_seed(seed)
    envs = make_vector_env(env_cfg, NUM_ENVS)
    recorder = RecordingEnvs(envs)
    obs_shape = envs.single_observation_space.shape
    net = build_q_network(obs_shape, int(envs.single_action_space.n), (16,), dueling=True)
    block = StepBlock(CHUNK_STEPS + n - 1, overlap=n - 1)
    rng = np.random.default_rng(seed)
    obs, _ = envs.reset(seed=seed)
    acted_obs, actions, chunks = [], [], []
    while len(chunks) < num_blocks:
        with torch.inference_mode():
            q = net(torch.as_tensor(obs)).q.numpy()
        action = rng.integers(0, 2, size=NUM_ENVS)
        step = step_vector(recorder, action)
        acted_obs.append(obs.copy())
        actions.append(action)
        block.add(obs, action, step, {"q_taken": q[np.arange(NUM_ENVS), action]})
        if block.full:
            fields, priorities = build_transitions(block, net, G, n, "cpu")
            if send_after_overlap:
                block.keep_overlap()
            chunks.append(({k: v.copy() for k, v in fields.items()}, priorities.copy()))
            if not send_after_overlap:
                block.keep_overlap()
            assert block.size == n - 1
        obs = step.obs
    acted_obs.append(obs.copy())
    envs.close()

    returned = recorder.returned
    final_obs = {}
    for t, (_, _, _, _, info) in enumerate(returned):
        if "final_obs" in info:
            for b in np.flatnonzero(info["_final_obs"]):
                final_obs[(t, int(b))] = np.asarray(info["final_obs"][b])
    return Run(
        acted_obs=np.stack(acted_obs),
        action=np.stack(actions),
        reward=np.stack([r[1] for r in returned]),
        terminated=np.stack([r[2] for r in returned]),
        truncated=np.stack([r[3] for r in returned]),
        final_obs=final_obs,
        returned_obs=np.stack([r[0] for r in returned]),
        chunks=chunks,
        net=net,
    )


def locate(run: Run) -> list[tuple[int, int]]:
    """(step, env) of every emitted transition, found by looking its ``obs`` up in the recording.

    CartPole states are continuous, so every recorded observation is distinct (checked here).
    """
    num_steps = run.action.shape[0]
    where = {
        run.acted_obs[t, b].tobytes(): (t, b) for t in range(num_steps) for b in range(NUM_ENVS)
    }
    assert len(where) == num_steps * NUM_ENVS
    return [where[o.tobytes()] for fields, _ in run.chunks for o in fields["obs"]]


def expected_window(run: Run, t: int, b: int, n: int) -> tuple[int, bool, bool, np.ndarray]:
    """(m, terminated, truncated, next_obs) of the window starting at step t of env b."""
    for k in range(n):
        if run.terminated[t + k, b] or run.truncated[t + k, b]:
            terminated = bool(run.terminated[t + k, b])
            return k + 1, terminated, not terminated, run.final_obs[(t + k, b)]
    return n, False, False, run.acted_obs[t + n, b]


def concat(run: Run) -> dict[str, np.ndarray]:
    return {
        name: np.concatenate([fields[name] for fields, _ in run.chunks])
        for name in run.chunks[0][0]
    }


def check_transitions(run: Run, n: int) -> list[tuple[int, bool, bool, int]]:
    """Check every emitted field against the recording; returns (m, terminated, truncated, t)."""
    fields = concat(run)
    seen = []
    for i, (t, b) in enumerate(locate(run)):
        m, terminated, truncated, next_obs = expected_window(run, t, b, n)
        assert fields["action"][i] == run.action[t, b]
        assert fields["num_steps"][i] == m
        assert fields["reward"][i] == pytest.approx(REWARD[m])
        assert bool(fields["terminated"][i]) is terminated
        assert bool(fields["truncated"][i]) is truncated
        np.testing.assert_array_equal(fields["next_obs"][i], next_obs)
        if terminated or truncated:
            # the episode's final observation, not the reset observation the env returned
            assert not np.array_equal(next_obs, run.returned_obs[t + m - 1, b])
        seen.append((m, terminated, truncated, t))
    return seen


# --- step_vector ----------------------------------------------------------------------------------


@pytest.mark.parametrize("max_episode_steps", [0, 5])
def test_step_vector_returns_the_final_obs_as_next_obs_and_the_reset_obs_as_obs(
    max_episode_steps: int,
) -> None:
    envs = make_vector_env(EnvConfig(max_episode_steps=max_episode_steps), NUM_ENVS)
    recorder = RecordingEnvs(envs)
    envs.reset(seed=1)
    rng = np.random.default_rng(1)
    num_ends = 0
    for _ in range(60):
        step = step_vector(recorder, rng.integers(0, 2, size=NUM_ENVS))
        obs, reward, terminated, truncated, info = recorder.returned[-1]
        np.testing.assert_array_equal(step.obs, obs)
        np.testing.assert_array_equal(step.reward, reward)
        assert step.reward.dtype == np.float32
        np.testing.assert_array_equal(step.terminated, terminated)
        np.testing.assert_array_equal(step.truncated, truncated)
        for b in range(NUM_ENVS):
            if terminated[b] or truncated[b]:
                num_ends += 1
                np.testing.assert_array_equal(step.next_obs[b], info["final_obs"][b])
                assert np.all(np.abs(step.obs[b]) <= RESET_BOUND)  # a fresh reset state
                assert not np.array_equal(step.next_obs[b], step.obs[b])
            else:
                assert "final_obs" not in info or not info["_final_obs"][b]
                np.testing.assert_array_equal(step.next_obs[b], step.obs[b])
    envs.close()
    assert num_ends >= 5


# --- episode seams --------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [3, 1])
def test_transitions_across_terminations_match_the_recording(n: int) -> None:
    num_blocks = 30
    run = run_actor(EnvConfig(), n=n, num_blocks=num_blocks)
    assert np.all(run.reward == 1.0)  # CartPole's reward, which REWARD relies on
    seen = check_transitions(run, n)
    assert len(seen) == num_blocks * CHUNK_STEPS * NUM_ENVS

    terminated = [(m, t) for m, term, _, t in seen if term]
    assert not any(trunc for _, _, trunc, _ in seen)  # no episode reaches CartPole's 500 steps
    assert len(terminated) >= 20  # random play ends an episode every ~20 steps
    assert {m for m, _ in terminated} == set(range(1, n + 1))  # every window length occurs
    if n > 1:
        # some windows start in one chunk and end their episode in the next: the block seam
        assert any(t // CHUNK_STEPS != (t + m - 1) // CHUNK_STEPS for m, t in terminated)


def test_truncated_windows_bootstrap_from_the_final_obs() -> None:
    n = 3
    run = run_actor(EnvConfig(max_episode_steps=5), n=n, num_blocks=10)
    assert not run.terminated.any()  # CartPole cannot fall within 5 steps
    # All envs reset together and truncate together: every 5th step, t = 4, 9, 14, ...
    num_steps = run.truncated.shape[0]  # 10 * 8 + 2
    np.testing.assert_array_equal(run.truncated.all(axis=1), np.arange(num_steps) % 5 == 4)
    np.testing.assert_array_equal(run.truncated.any(axis=1), run.truncated.all(axis=1))
    seen = check_transitions(run, n)
    # The episode step j = t % 5 decides the window: starts j = 0, 1, 2 have 3 steps left
    # (j = 2 ends exactly on the truncation), j = 3 has 2 steps, j = 4 has 1.
    for m, terminated, truncated, t in seen:
        j = t % 5
        assert m == {0: 3, 1: 3, 2: 3, 3: 2, 4: 1}[j]
        assert truncated is (j >= 2)
        assert terminated is False


# --- priorities -----------------------------------------------------------------------------------


@pytest.mark.parametrize("max_episode_steps", [0, 5])
def test_priorities_are_the_absolute_n_step_td_error_of_the_same_net(
    max_episode_steps: int,
) -> None:
    run = run_actor(EnvConfig(max_episode_steps=max_episode_steps), n=3, num_blocks=10)
    fields = concat(run)
    priorities = np.concatenate([p for _, p in run.chunks])
    assert priorities.shape == fields["action"].shape
    assert priorities.dtype == np.float64
    assert np.all(np.isfinite(priorities)) and np.all(priorities >= 0)

    with torch.no_grad():
        q = run.net(torch.from_numpy(fields["obs"])).q.double().numpy()
        q_next = run.net(torch.from_numpy(fields["next_obs"])).q.double().numpy()
    q_sa = q[np.arange(len(q)), fields["action"]]
    # y = r + G^m * (1 - terminated) * max_a Q(s_{t+m}, a); truncation still bootstraps.
    bootstrap = G ** fields["num_steps"] * ~fields["terminated"] * q_next.max(axis=1)
    target = fields["reward"].astype(np.float64) + bootstrap
    np.testing.assert_allclose(priorities, np.abs(target - q_sa) + 1e-6, rtol=1e-5, atol=1e-5)
    if max_episode_steps == 5:
        assert np.any(fields["truncated"] & (bootstrap != 0))


# --- the overlap between blocks -------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3])
def test_consecutive_blocks_emit_each_step_and_env_exactly_once(n: int) -> None:
    run = run_actor(EnvConfig(), n=n, num_blocks=2)
    first, second = (fields for fields, _ in run.chunks)
    assert len(first["action"]) == len(second["action"]) == CHUNK_STEPS * NUM_ENVS
    located = locate(run)
    assert sorted(located) == [(t, b) for t in range(2 * CHUNK_STEPS) for b in range(NUM_ENVS)]
    # In order, too: block k holds starts k * 8 .. k * 8 + 7, time-major, env-minor.
    assert located == [(t, b) for t in range(2 * CHUNK_STEPS) for b in range(NUM_ENVS)]
    # Steps 8 .. 8 + n - 2 were kept from the first block for the second: 10 = 8 + 3 - 1 steps
    # were stepped for the first block, and 8 more for the second.
    assert run.action.shape[0] == 2 * CHUNK_STEPS + n - 1
    check_transitions(run, n)


def test_keep_overlap_moves_the_last_n_minus_1_steps_to_the_front() -> None:
    block = StepBlock(5, overlap=2)
    for t in range(5):
        obs = np.full((1, 2), t, np.float32)
        step = VectorStep(obs + 1, obs + 1, np.array([t], np.float32), np.array([t == 3]), [False])
        block.add(obs, np.array([t]), step, {"q_taken": np.array([10.0 * t])})
    assert block.full
    block.keep_overlap()
    assert block.size == 2 and not block.full
    np.testing.assert_array_equal(block.obs[:2, 0, 0], [3.0, 4.0])
    np.testing.assert_array_equal(block.next_obs[:2, 0, 0], [4.0, 5.0])
    np.testing.assert_array_equal(block.action[:2, 0], [3, 4])
    np.testing.assert_array_equal(block.reward[:2, 0], [3.0, 4.0])
    np.testing.assert_array_equal(block.terminated[:2, 0], [True, False])
    np.testing.assert_array_equal(block.extras["q_taken"][:2, 0], [30.0, 40.0])


def test_a_chunk_sent_after_keep_overlap_is_unchanged() -> None:
    n = 3
    sent_first = concat(run_actor(EnvConfig(), n=n, num_blocks=2))
    sent_after = concat(run_actor(EnvConfig(), n=n, num_blocks=2, send_after_overlap=True))
    for name in sent_first:
        np.testing.assert_array_equal(sent_after[name], sent_first[name], err_msg=name)

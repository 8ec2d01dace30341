"""Actor cores acting for some of their lanes at a time (``rows``; ``algos.ActorCore``), as the
multi-agent actor's agent slots do:

- a recurrent core (R2D2; IMPALA and PPO with an LSTM) given the lanes' steps in changing
  subsets and out of step with each other acts, stores and resets exactly as one that acts for
  all lanes together on every step, across an episode end in one lane;
- a lane beyond the ones seen grows the state from the initial one, the other lanes untouched;
- R2D2's sequences of lanes cut some at a time, each lane at its own block, are those of one
  cut of all lanes per block;
- the feed-forward cores take ``rows`` and change nothing.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from apexrl.acting.step_block import StepBlock
from apexrl.algos import load_algorithm
from apexrl.config import Config, load_config
from apexrl.envs import VectorStep

REPO = Path(__file__).resolve().parents[1]
OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACTION_SPACE = gym.spaces.Discrete(5)
NUM_LANES = 3
LSTM = ["algo.lstm_size=8", "algo.prev_action_reward=true", "algo.hidden_sizes=[16]"]

RECURRENT = {
    "r2d2": (
        "r2d2_cartpole.yaml",
        [
            "algo.lstm_size=8",
            "algo.hidden_sizes=[16]",
            "algo.sequence_length=4",
            "algo.sequence_overlap=1",
            "algo.burn_in=1",
            "algo.n_step=2",
            "actor.chunk_steps=3",
        ],
    ),
    "impala-lstm": ("impala_cartpole.yaml", ["algo.unroll_length=5", *LSTM]),
    "ppo-lstm": ("ppo_cartpole.yaml", ["algo.unroll_length=5", *LSTM]),
}
FEED_FORWARD = {
    "apex_dqn": ("apex_dqn_cartpole.yaml", ["algo.hidden_sizes=[16]", "algo.n_step=2"]),
    "impala": ("impala_cartpole.yaml", ["algo.hidden_sizes=[16]", "algo.unroll_length=5"]),
    "ppo": ("ppo_cartpole.yaml", ["algo.hidden_sizes=[16]", "algo.unroll_length=5"]),
    "sac": ("sac_pendulum.yaml", ["algo.hidden_sizes=[16]"]),
    "bc": ("bc_cartpole.yaml", ["algo.hidden_sizes=[16]"]),
}
START_FIELDS = ("recurrent_state", "prev_action", "prev_reward")


def config(case: str, table: dict) -> Config:
    config_file, overrides = table[case]
    return load_config(REPO / "configs" / config_file, [*overrides, "actor.num_actors=1"])


def two_cores(cfg: Config, action_space: gym.Space = ACTION_SPACE):
    """Two greedy (evaluation) cores on one network."""
    algorithm = load_algorithm(cfg.algorithm)
    torch.manual_seed(0)
    net = algorithm.make_network(OBS_SPACE, action_space, cfg)
    cores = [
        algorithm.actor_core(net, cfg, 0, True, "cpu", np.random.default_rng(seed))
        for seed in (0, 1)
    ]
    return net, *cores


def vector_step(obs, reward, terminated, truncated) -> VectorStep:
    return VectorStep(obs, obs, reward.astype(np.float32), terminated, truncated)


def assert_same_extras(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


# --- acting for some lanes ------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(RECURRENT))
def test_acting_for_lanes_in_changing_subsets_matches_acting_for_all_lanes(case: str) -> None:
    """Core ``all`` acts for the 3 lanes together on each of 8 steps; core ``lanes`` takes the
    same steps lane by lane in random subsets (random order), each lane at its own pace, and
    observes them in another grouping. Each lane gets the same actions and extras from both,
    also after lane 1's episode terminates at step 3 (its state alone starts again) and lane 0's
    is truncated at step 5."""
    num_steps = 8
    _, all_lanes, lanes = two_cores(config(case, RECURRENT))
    rng = np.random.default_rng(2)
    obs = rng.uniform(-1, 1, (num_steps, NUM_LANES, 4)).astype(np.float32)
    reward = rng.normal(size=(num_steps, NUM_LANES)).astype(np.float32)
    terminated = np.zeros((num_steps, NUM_LANES), dtype=bool)
    truncated = np.zeros((num_steps, NUM_LANES), dtype=bool)
    terminated[3, 1], truncated[5, 0] = True, True

    steps = []
    for t in range(num_steps):
        action, extra = all_lanes.act(obs[t])
        all_lanes.observe(action, vector_step(obs[t], reward[t], terminated[t], truncated[t]))
        steps.append({"action": action, **extra})
    want_all = {name: np.stack([s[name] for s in steps]) for name in steps[0]}  # [T, L, ...]
    assert np.abs(want_all["recurrent_state"][4, 1]).sum() == 0  # lane 1 started again
    assert np.abs(want_all["recurrent_state"][4, [0, 2]]).sum(-1).min() > 0

    t_of = np.zeros(NUM_LANES, dtype=np.int64)  # each lane's next step
    groupings = []
    while (t_of < num_steps).any():
        waiting = np.flatnonzero(t_of < num_steps)
        rows = rng.permutation(waiting)[: rng.integers(1, len(waiting) + 1)]
        groupings.append(rows.tolist())
        t = t_of[rows]
        action, extra = lanes.act(obs[t, rows], rows=rows)
        np.testing.assert_array_equal(action, want_all["action"][t, rows])
        assert_same_extras(extra, {name: want_all[name][t, rows] for name in extra})
        half = rng.integers(0, len(rows) + 1)  # observe the lanes' steps in two groups
        for part in (slice(None, half), slice(half, None)):
            part_t, part_rows = t[part], rows[part]
            if len(part_rows):
                step = vector_step(
                    obs[part_t, part_rows],
                    reward[part_t, part_rows],
                    terminated[part_t, part_rows],
                    truncated[part_t, part_rows],
                )
                lanes.observe(action[part], step, rows=part_rows)
        t_of[rows] += 1
    assert any(len(rows) < NUM_LANES for rows in groupings), groupings
    np.testing.assert_allclose(lanes.state.h.numpy(), all_lanes.state.h.numpy(), atol=1e-6)
    np.testing.assert_array_equal(lanes.prev_action, all_lanes.prev_action)
    np.testing.assert_array_equal(lanes.prev_reward, all_lanes.prev_reward)


@pytest.mark.parametrize("case", ["r2d2", "ppo-lstm"])
def test_a_lane_beyond_the_state_grows_it_from_the_initial_state(case: str) -> None:
    """Lanes 0 and 1 act twice; lane 4 then acts from the initial state (as a fresh core's first
    step), the state grows to 5 lanes with lanes 2 and 3 initial, and lanes 0 and 1 keep theirs;
    observing a lane beyond them (6) grows it too."""
    cfg = config(case, RECURRENT)
    _, core, fresh = two_cores(cfg)
    rng = np.random.default_rng(0)
    obs = rng.uniform(-1, 1, (3, 2, 4)).astype(np.float32)
    ones, no = np.ones(2, np.float32), np.zeros(2, bool)
    for t in range(2):
        action, _ = core.act(obs[t], rows=np.array([0, 1]))
        core.observe(action, vector_step(obs[t], ones, no, no), rows=np.array([0, 1]))
    kept = core.state.h.clone(), core.prev_action.copy(), core.prev_reward.copy()
    assert kept[0].abs().sum(1).min() > 0 and kept[2].tolist() == [1.0, 1.0]

    action, extras = core.act(obs[2, :1], rows=np.array([4]))
    want_action, want_extras = fresh.act(obs[2, :1])
    np.testing.assert_array_equal(action, want_action)
    assert_same_extras(extras, want_extras)
    for name in START_FIELDS:
        assert np.abs(extras[name]).sum() == 0, name
    assert core.state.h.shape[0] == 5 and len(core.prev_action) == len(core.prev_reward) == 5
    assert torch.equal(core.state.h[:2], kept[0])
    assert core.state.h[2:4].abs().sum() == 0 and core.state.c[2:4].abs().sum() == 0
    assert core.state.h[4].abs().sum() > 0  # lane 4 stepped
    np.testing.assert_array_equal(core.prev_action[:2], kept[1])
    assert core.prev_reward.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]

    ended = vector_step(obs[2, :1], np.full(1, 2.0), np.ones(1, bool), np.zeros(1, bool))
    core.observe(np.array([3]), ended, rows=np.array([6]))
    assert core.state.h.shape[0] == 7 and core.prev_reward.tolist()[5:] == [0.0, 0.0]
    assert torch.equal(core.state.h[:2], kept[0]) and core.state.h[4].abs().sum() > 0


# --- R2D2's sequences -----------------------------------------------------------------------------


def lane_steps(num_blocks: int, block_steps: int, rng: np.random.Generator) -> dict:
    """``[T, NUM_LANES, ...]`` step fields and R2D2 extras of ``num_blocks`` blocks; each
    observation names its lane and step (``1000 * lane + t``), and episodes end in each lane at
    its own steps (a truncation in lane 2)."""
    num_steps = num_blocks * block_steps
    t = np.arange(num_steps, dtype=np.float32)[:, None]
    lane = np.arange(NUM_LANES, dtype=np.float32)[None, :]
    obs = np.repeat((1000 * lane + t)[..., None], 4, axis=-1) / 1000  # [T, L, 4]
    terminated = np.zeros((num_steps, NUM_LANES), dtype=bool)
    truncated = np.zeros((num_steps, NUM_LANES), dtype=bool)
    terminated[[4, 13], 0] = True
    terminated[7, 1] = True
    truncated[10, 2] = True
    return {
        "obs": obs.astype(np.float32),
        "action": rng.integers(0, ACTION_SPACE.n, (num_steps, NUM_LANES)),
        "reward": rng.normal(size=(num_steps, NUM_LANES)).astype(np.float32),
        "terminated": terminated,
        "truncated": truncated,
        "next_obs": (obs + 0.0005).astype(np.float32),
        "recurrent_state": rng.normal(size=(num_steps, NUM_LANES, 2, 8)).astype(np.float32),
        "prev_action": rng.integers(0, ACTION_SPACE.n, (num_steps, NUM_LANES)),
        "prev_reward": rng.normal(size=(num_steps, NUM_LANES)).astype(np.float32),
        "weights_version": np.zeros((num_steps, NUM_LANES), dtype=np.int64),
    }


def by_lane_and_start(fields: list[dict], priorities: list[np.ndarray]) -> dict:
    """(lane, first step) -> (sequence's fields, priority), over the cuts' items."""
    out = {}
    for f, p in zip(fields, priorities, strict=True):
        for i in range(len(p)):
            lane, t0 = divmod(int(round(f["obs"][i, 0, 0] * 1000)), 1000)
            out[lane, t0] = ({name: value[i] for name, value in f.items()}, p[i])
    return out


def test_r2d2_sequences_of_lanes_cut_some_at_a_time_are_those_of_all_lanes_cut_together() -> None:
    """6 blocks of 3 steps of 3 lanes: core ``all`` cuts each block of all lanes; core ``lanes``
    cuts random subsets of lanes (random column order), each lane at its own next block. Per
    lane and first step, the same sequences (bit for bit) with the same priorities."""
    cfg = config("r2d2", RECURRENT)
    _, all_lanes, lanes = two_cores(cfg)
    rng = np.random.default_rng(3)
    block_steps, num_blocks = all_lanes.block_steps, 6
    steps = lane_steps(num_blocks, block_steps, rng)
    extra_names = (*START_FIELDS, "weights_version")

    def block_of(block_index: np.ndarray, rows: np.ndarray) -> StepBlock:
        t = block_index[:, None] * block_steps + np.arange(block_steps)[None, :]  # [B, T]
        arrays = {name: np.swapaxes(v[t, rows[:, None]], 0, 1).copy() for name, v in steps.items()}
        return StepBlock.of(arrays, extra_names, all_lanes.block_overlap)

    want_fields, want_priorities = [], []
    for k in range(num_blocks):
        fields, priorities = all_lanes.items(block_of(np.full(NUM_LANES, k), np.arange(NUM_LANES)))
        if fields:
            want_fields.append(fields)
            want_priorities.append(priorities)
    want = by_lane_and_start(want_fields, want_priorities)

    got_fields, got_priorities = [], []
    next_block = np.zeros(NUM_LANES, dtype=np.int64)
    while (next_block < num_blocks).any():
        waiting = np.flatnonzero(next_block < num_blocks)
        rows = rng.permutation(waiting)[: rng.integers(1, len(waiting) + 1)]
        fields, priorities = lanes.items(block_of(next_block[rows], rows), rows=rows)
        if fields:
            got_fields.append(fields)
            got_priorities.append(priorities)
        next_block[rows] += 1
    got = by_lane_and_start(got_fields, got_priorities)

    assert {lane for lane, _ in want} == {0, 1, 2}
    assert any(not f["starts_episode"] for f, _ in want.values())  # overlaps mid-episode
    assert any(not f["mask"].all() for f, _ in want.values())  # padded at an episode end
    assert got.keys() == want.keys()
    for key, (fields, priority) in want.items():
        for name, value in fields.items():
            np.testing.assert_array_equal(got[key][0][name], value, err_msg=f"{key} {name}")
        np.testing.assert_allclose(got[key][1], priority, rtol=1e-5, err_msg=str(key))


# --- feed-forward cores ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(FEED_FORWARD))
def test_feed_forward_cores_take_rows_and_change_nothing(case: str) -> None:
    cfg = config(case, FEED_FORWARD)
    box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = box if case == "sac" else ACTION_SPACE
    _, core, same = two_cores(cfg, action_space)
    obs = np.random.default_rng(0).uniform(-1, 1, (2, 4)).astype(np.float32)
    rows = np.array([5, 1])
    action, extras = core.act(obs, rows=rows)
    want_action, want_extras = same.act(obs)
    np.testing.assert_array_equal(action, want_action)
    assert_same_extras(extras, want_extras)
    step = vector_step(obs, np.ones(2), np.array([True, False]), np.zeros(2, bool))
    core.observe(action, step, rows=rows)
    block = StepBlock(core.block_steps, core.block_overlap)
    for _ in range(core.block_steps):
        action, extras = core.act(obs, rows=rows)
        block.add(obs, action, step, {**extras, "weights_version": np.zeros(2, np.int64)})
    fields, priorities = core.items(block, rows=rows)
    want_fields, want_priorities = same.items(block)
    assert fields.keys() == want_fields.keys()
    for name in fields:
        np.testing.assert_array_equal(fields[name], want_fields[name], err_msg=name)
    if priorities is None:
        assert want_priorities is None
    else:
        np.testing.assert_allclose(priorities, want_priorities)

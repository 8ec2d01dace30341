"""``PolicyLanes``: one policy's agent slots filled at their own pace and cut by a real actor core
(IMPALA, PPO, Ape-X) of the policy's own config (``policy_config`` of ``Twins``, whose agents
observe ``Box(4,)`` and act in ``Discrete(2)``; ``multiagent_envs_for_tests``).

Every step here is made by hand: lane ``l``'s step ``t`` observes ``[t, l, 0, 0]`` and leads to
``[t + 1, l, 0, 0]``, so an item shows which lane and step each of its values came from.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from apexrl.algos import ActorCore, load_algorithm
from apexrl.config import Config, config_from_dict
from apexrl.multiagent.lanes import PolicyLanes
from apexrl.multiagent.policies import num_lanes, policy_config, policy_spaces

TWINS = "multiagent_envs_for_tests:twins"
OBS_SPACE = gym.spaces.Box(-100.0, 100.0, (4,), np.float32)  # a Twins agent's
ACTION_SPACE = gym.spaces.Discrete(2)


def run_config(algorithm: str, num_envs: int, **algo) -> Config:
    """A run of ``algorithm`` on Twins whose policy ``twin`` plays both agents."""
    replay = {"capacity": 64, "min_size_to_sample": 4, "samples_per_insert": 0.0}
    if algorithm != "apex_dqn":
        replay["kind"] = "fifo"
    return config_from_dict(
        {
            "algorithm": algorithm,
            "env": {"id": TWINS, "num_envs": num_envs},
            "multiagent": {"policies": [{"name": "twin"}], "mapping": [{"policy": "twin"}]},
            "algo": {"hidden_sizes": [8], **algo},
            "actor": {"chunk_steps": 2},
            "replay": replay,
            "learner": {"batch_size": 4, "publish_period": 1},
        }
    )


def policy_lanes(algorithm: str, num_envs: int, **algo) -> tuple[Config, ActorCore, PolicyLanes]:
    """Policy ``twin`` of ``run_config``: its config, a training actor's core and its lanes
    (``num_envs`` envs x 2 agents)."""
    cfg = run_config(algorithm, num_envs, **algo)
    spaces = policy_spaces(cfg)["twin"]
    obs_space, action_space, agents = spaces.obs_space, spaces.action_space, spaces.agents
    assert (obs_space, action_space, agents) == (OBS_SPACE, ACTION_SPACE, ["left", "right"])
    policy_cfg = policy_config(cfg, "twin", spaces)
    family = load_algorithm(policy_cfg.algorithm)
    torch.manual_seed(0)
    net = family.make_network(OBS_SPACE, ACTION_SPACE, policy_cfg)
    core = family.actor_core(net, policy_cfg, 0, False, "cpu", np.random.default_rng(0))
    return policy_cfg, core, PolicyLanes(core, num_lanes(cfg, agents), spaces.masked)


def obs_of(lanes: list[int], t: int) -> np.ndarray:
    return np.array([[t, lane, 0, 0] for lane in lanes], dtype=np.float32)


def act(core: ActorCore, lanes: PolicyLanes, ids: list[int], t: int, version: int = 0) -> None:
    """Lanes ``ids`` act on their step ``t`` with weights ``version``."""
    rows = np.array(ids, dtype=np.int64)
    action, extras = core.act(obs_of(ids, t), None, rows)
    lanes.acted(rows, obs_of(ids, t), action, extras, None, version)


def complete(
    lanes: PolicyLanes, ids: list[int], t: int, rewards: list[float], terminated: bool = False
) -> None:
    """What followed step ``t`` of lanes ``ids``: ``rewards`` and the next observation."""
    n = len(ids)
    lanes.completed(
        np.array(ids, dtype=np.int64),
        np.array(rewards, dtype=np.float32),
        np.full(n, terminated),
        np.zeros(n, dtype=bool),
        obs_of(ids, t + 1),
        None,
    )


def step(core, lanes, ids: list[int], t: int, version: int = 0, terminated: bool = False) -> None:
    """A whole step ``t`` of lanes ``ids``; lane ``l`` gets reward ``10 * l + t``."""
    act(core, lanes, ids, t, version)
    complete(lanes, ids, t, [10 * lane + t for lane in ids], terminated)


def item_layout(fields: dict[str, np.ndarray]) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    return {name: (array.dtype, array.shape[1:]) for name, array in fields.items()}


# --- lanes at their own pace ------------------------------------------------------------------


def test_lanes_fill_at_their_own_time_index_and_only_full_lanes_are_cut() -> None:
    cfg, core, lanes = policy_lanes("impala", num_envs=2, unroll_length=3)
    assert (lanes.num_lanes, lanes.num_steps, lanes.overlap) == (2 * 2, 3, 0)
    step(core, lanes, [0, 1, 2], t=0)
    step(core, lanes, [1, 0], t=1)  # any order, any subset
    step(core, lanes, [0], t=2)
    assert lanes.size.tolist() == [3, 2, 1, 0]
    rewards = lanes.arrays["reward"]  # [T, L]: lane l's step t at [t, l]
    assert rewards[:3, 0].tolist() == [0, 1, 2]
    assert rewards[:2, 1].tolist() == [10, 11]
    assert rewards[0, 2] == 20

    cut = lanes.cut()
    assert cut.num_lanes == 1 and cut.priorities is None  # lane 0 only: the others are not full
    spec = cfg.algo.item_spec(OBS_SPACE, ACTION_SPACE)
    assert item_layout(cut.fields) == {name: (np.dtype(d), s) for name, (d, s) in spec.items()}
    assert cut.fields["reward"].tolist() == [[0, 1, 2]]
    assert cut.fields["obs"][0, :, :2].tolist() == [[0, 0], [1, 0], [2, 0]]  # [t, lane]
    assert cut.fields["next_obs"][0, :, 0].tolist() == [1, 2, 3]
    assert lanes.size.tolist() == [0, 2, 1, 0]  # no overlap: lane 0 starts again
    assert lanes.cut() is None

    step(core, lanes, [1], t=2)  # lane 1's third step goes to its time index 2
    cut = lanes.cut()
    assert cut.fields["reward"].tolist() == [[10, 11, 12]]
    assert lanes.size.tolist() == [0, 0, 1, 0]
    assert lanes.stored_steps == 3 + 2 + 1 + 1


def test_lanes_full_together_are_cut_as_one_block_in_lane_order() -> None:
    _, core, lanes = policy_lanes("impala", num_envs=2, unroll_length=2)
    step(core, lanes, [3, 1], t=0)
    step(core, lanes, [1, 3], t=1)
    cut = lanes.cut()
    assert cut.num_lanes == 2
    assert cut.fields["reward"].tolist() == [[10, 11], [30, 31]]  # lanes 1 and 3
    assert cut.fields["weights_version"].tolist() == [[0, 0], [0, 0]]


def test_apex_n_step_overlap_is_kept_per_lane() -> None:
    # n = 2, chunk_steps = 2: a lane's block is 2 + 2 - 1 = 3 steps; a cut gives the 2
    # transitions starting at its first 2 steps and keeps its last step for the next block.
    _, core, lanes = policy_lanes("apex_dqn", num_envs=1, n_step=2, gamma=0.5)
    assert (lanes.num_lanes, lanes.num_steps, lanes.overlap) == (2, 3, 1)
    for t in range(3):
        step(core, lanes, [0], t)  # rewards 0, 1, 2
    step(core, lanes, [1], t=0)  # 10
    step(core, lanes, [1], t=1, terminated=True)  # 11, and lane 1's agent is done
    cut = lanes.cut()
    assert cut.fields["reward"].tolist() == [0 + 0.5 * 1, 1 + 0.5 * 2]
    assert cut.fields["num_steps"].tolist() == [2, 2]
    assert cut.fields["obs"][:, 0].tolist() == [0, 1]
    assert cut.fields["next_obs"][:, 0].tolist() == [2, 3]  # 2 steps on
    assert lanes.size.tolist() == [1, 2]  # lane 0 keeps its step 2

    step(core, lanes, [0], t=3)
    step(core, lanes, [0, 1], t=4)  # lane 0: steps 2, 3, 4; lane 1: steps 0, 1, 4
    cut = lanes.cut()
    assert cut.num_lanes == 2
    # transitions are time-major over the lanes cut: (t0, lane 0), (t0, lane 1), (t1, ...)
    assert cut.fields["obs"][:, :2].tolist() == [[2, 0], [0, 1], [3, 0], [1, 1]]
    assert cut.fields["reward"].tolist() == [
        2 + 0.5 * 3,
        10 + 0.5 * 11,  # lane 1's window ends where its agent terminated
        3 + 0.5 * 4,
        11,  # a window of 1: the terminal step
    ]
    assert cut.fields["num_steps"].tolist() == [2, 2, 2, 1]
    assert cut.fields["terminated"].tolist() == [False, True, False, True]
    assert cut.priorities.shape == (4,) and np.isfinite(cut.priorities).all()
    assert lanes.size.tolist() == [1, 1]


# --- synchronous cores (PPO): one unroll per lane and weights version ------------------------


def test_synchronous_lane_starts_again_when_a_newer_versions_step_arrives() -> None:
    _, core, lanes = policy_lanes("ppo", num_envs=1, unroll_length=2)
    assert lanes.synchronous
    step(core, lanes, [0], t=0, version=1)
    step(core, lanes, [0], t=1, version=2)  # version 1's step is dropped
    assert lanes.dropped_steps == 1 and lanes.size.tolist() == [1, 0]
    assert lanes.arrays["reward"][0, 0] == 1 and lanes.arrays["weights_version"][0, 0] == 2


def test_synchronous_share_is_one_unroll_per_lane_then_the_versions_steps_are_dropped() -> None:
    _, core, lanes = policy_lanes("ppo", num_envs=1, unroll_length=2)  # 2 lanes
    step(core, lanes, [0], t=0, version=2)
    step(core, lanes, [0], t=1, version=2)
    assert lanes.cut().weights_version == 2
    assert not lanes.share_full(2)  # 1 of 2 unrolls
    step(core, lanes, [1], t=0, version=2)
    step(core, lanes, [1], t=1, version=2)
    cut = lanes.cut()
    assert cut.fields["weights_version"].tolist() == [[2, 2]]
    assert lanes.share_full(2) and not lanes.share_full(3)
    step(core, lanes, [0], t=2, version=2)  # the share of version 2 is cut: dropped
    step(core, lanes, [1], t=2, version=2)
    assert lanes.dropped_steps == 2 and lanes.size.tolist() == [0, 0]
    step(core, lanes, [0], t=3, version=3)
    assert lanes.size.tolist() == [1, 0] and lanes.dropped_steps == 2


def test_synchronous_share_takes_no_more_unrolls_than_lanes_whichever_lanes_fill_them() -> None:
    # One seat of a turn-based game: lane 0 plays while lane 1 waits, so lane 0 fills two
    # unrolls of the share; when both lanes fill at once, the cut takes what the share has room
    # for (1), not both: a third unroll would reach the learner after its rollout.
    _, core, lanes = policy_lanes("ppo", num_envs=1, unroll_length=2)  # 2 lanes
    step(core, lanes, [0], t=0, version=2)
    step(core, lanes, [0], t=1, version=2)
    assert len(lanes.cut().fields["reward"]) == 1
    step(core, lanes, [0, 1], t=2, version=2)
    step(core, lanes, [0, 1], t=3, version=2)
    cut = lanes.cut()
    assert cut.fields["reward"].tolist() == [[2, 3]] and cut.num_lanes == 1  # lane 0's
    assert lanes.share_full(2) and lanes.cut() is None  # lane 1 stays full, not cut
    step(core, lanes, [1], t=4, version=3)  # version 3: lane 1 starts again
    assert lanes.size.tolist() == [0, 1] and lanes.dropped_steps == 2


def test_asynchronous_core_keeps_steps_of_every_version() -> None:
    _, core, lanes = policy_lanes("impala", num_envs=1, unroll_length=2)
    step(core, lanes, [0], t=0, version=1)
    step(core, lanes, [0], t=1, version=2)
    cut = lanes.cut()
    assert cut.fields["weights_version"].tolist() == [[1, 2]] and cut.weights_version == 2
    assert lanes.dropped_steps == 0 and not lanes.share_full(2)


# --- release -----------------------------------------------------------------------------------


def test_release_drops_the_lanes_pending_step() -> None:
    _, core, lanes = policy_lanes("impala", num_envs=1, unroll_length=2)
    step(core, lanes, [0], t=0)
    act(core, lanes, [0], t=1)
    lanes.release(0)  # its agent is gone before the step's outcome
    complete(lanes, [0], t=1, rewards=[99.0])
    assert lanes.size.tolist() == [1, 0] and lanes.stored_steps == 1
    complete(lanes, [1], t=0, rewards=[99.0])  # a lane that never acted has nothing to store
    assert lanes.size.tolist() == [1, 0]
    step(core, lanes, [0], t=5)  # the next agent in the lane goes on from the kept step
    assert lanes.cut().fields["reward"].tolist() == [[0, 5]]


def test_synchronous_lane_without_a_pending_step_is_left_alone() -> None:
    _, core, lanes = policy_lanes("ppo", num_envs=1, unroll_length=3)
    step(core, lanes, [1], t=0, version=1)
    act(core, lanes, [1], t=1, version=2)
    lanes.release(1)  # lane 1's version-2 step is dropped before its outcome
    step(core, lanes, [0], t=0, version=1)
    act(core, lanes, [0], t=1, version=1)
    complete(lanes, [0, 1], t=1, rewards=[1.0, 99.0])  # lane 1 has nothing pending
    assert lanes.size.tolist() == [2, 1]
    assert lanes.dropped_steps == 0


def test_players_without_a_params_client_fill_every_lane_of_a_parallel_env_together() -> None:
    from apexrl.multiagent.players import make_players
    from apexrl.multiagent.stepping import AgentEnvs

    cfg = run_config("impala", num_envs=2, unroll_length=3)
    players = make_players(cfg, None, 0, False, "cpu", "actor", np.random.default_rng(0), 2)
    envs = AgentEnvs(cfg, 2, players)
    try:
        envs.reset(seed=0)
        for _ in range(3):  # both agents of both envs act every step: 4 lanes, all full at once
            envs.step()
        lanes = players["twin"].lanes
        assert lanes.size.tolist() == [3, 3, 3, 3]
        cut = lanes.cut()
        assert cut.num_lanes == 4 and cut.weights_version == -1
    finally:
        envs.close()


def test_cuts_gathered_into_one_chunk_keep_every_item_in_order() -> None:
    from apexrl.multiagent.actor import merged, num_items
    from apexrl.multiagent.lanes import CutItems

    first = CutItems({"obs": np.array([[0.0], [1.0]])}, np.array([0.5, 1.5]), 3, 2)
    second = CutItems({"obs": np.array([[2.0]])}, np.array([2.5]), 5, 1)
    fields, priorities, version = merged([first, second])
    assert fields["obs"].ravel().tolist() == [0.0, 1.0, 2.0]
    assert priorities.tolist() == [0.5, 1.5, 2.5]
    assert version == 5  # the newest version among them
    assert num_items([first, second]) == 3
    fifo = CutItems({"obs": np.zeros((1, 1))}, None, 0, 1)
    assert merged([fifo, fifo])[1] is None  # a FIFO table's items carry no priorities

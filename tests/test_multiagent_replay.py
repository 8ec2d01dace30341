"""``PolicyTables``: a multi-agent run's replay, one table per trained policy, driven without
sockets (``handle`` then ``drain``, as the server loop does; ``test_replay_service.py`` does the
same for one ``ReplayService``).

The run is IMPALA on MPE's simple_speaker_listener with one policy per agent (the speaker
observes 3 numbers and says one of 3 words, the listener observes 11 and moves one of 5 ways),
one env per actor, so each policy has one lane. Its chunks hold real items: 4 steps of the env,
cut by each policy's own actor core through its ``PolicyLanes``, and sent as the actor sends them
(``acting.chunks.make_chunk``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from unittest.mock import ANY

import builders
import numpy as np
import pytest
import torch

from apexrl.acting.chunks import make_chunk
from apexrl.algos import load_algorithm
from apexrl.config import Config, config_from_dict
from apexrl.multiagent.envs import AgentEnv, agent_views, make_pettingzoo_env
from apexrl.multiagent.lanes import PolicyLanes
from apexrl.multiagent.policies import num_lanes, policy_config, policy_spaces
from apexrl.multiagent.replay_tables import PolicyTables
from apexrl.replay.service import ReplayService
from apexrl.replay.serving import Reply
from apexrl.transport.messages import (
    ActorReport,
    Error,
    InsertAck,
    PublishedVersion,
    SampleBatch,
    SampleRequest,
    TrajectoryChunk,
)

ACTOR = b"actor"
LEARNER = b"learner"
UNROLL = 4  # env steps per unroll: one item per lane and cut
SPEAKER_LISTENER = "mpe2.simple_speaker_listener_v4:parallel_env"


def run_config(run_dir: Path, **multiagent) -> Config:
    """IMPALA on simple_speaker_listener, a policy per agent, FIFO tables that serve any item."""
    section = {
        "policies": [{"name": "speaker"}, {"name": "listener"}],
        "mapping": [
            {"agents": "speaker_*", "policy": "speaker"},
            {"agents": "listener_*", "policy": "listener"},
        ],
        **multiagent,
    }
    return config_from_dict(
        {
            "algorithm": "impala",
            "env": {
                "id": SPEAKER_LISTENER,
                "kwargs": {"continuous_actions": False, "max_cycles": 25},
                "num_envs": 1,
            },
            "algo": {"unroll_length": UNROLL, "hidden_sizes": [8]},
            "replay": {
                "kind": "fifo",
                "capacity": 16,
                "min_size_to_sample": 1,
                "samples_per_insert": 0.0,
            },
            "learner": {"batch_size": 1},
            "run": {"dir": str(run_dir)},
            "multiagent": section,
        }
    )


@pytest.fixture(scope="module")
def cut_items(tmp_path_factory) -> dict[str, dict[str, np.ndarray]]:
    """Each policy's items of one unroll of 4 real env steps, cut by its own actor core."""
    cfg = run_config(tmp_path_factory.mktemp("run"))
    spaces = policy_spaces(cfg)
    cores, lanes = {}, {}
    torch.manual_seed(0)
    for name, (obs_space, action_space, masked, agents, _) in spaces.items():
        policy_cfg = policy_config(cfg, name, spaces[name])
        family = load_algorithm(policy_cfg.algorithm)
        net = family.make_network(obs_space, action_space, policy_cfg)
        cores[name] = family.actor_core(net, policy_cfg, 0, False, "cpu", np.random.default_rng(0))
        lanes[name] = PolicyLanes(cores[name], num_lanes(cfg, agents), masked)
    policy = {"speaker_0": "speaker", "listener_0": "listener"}
    env = make_pettingzoo_env(cfg.env)
    agent_env = AgentEnv(env, agent_views(env))
    lane = np.zeros(1, dtype=np.int64)  # one env: each policy's agent holds lane 0
    decisions = agent_env.reset(seed=0, episode=0)
    for _ in range(UNROLL):
        actions = {}
        for decision in decisions:
            name = policy[decision.agent]
            action, extras = cores[name].act(decision.obs[None], None, lane)
            lanes[name].acted(lane, decision.obs[None], action, extras, None, 0)
            actions[decision.agent] = int(action[0])
        outcomes, decisions, _ = agent_env.step(actions)
        for o in outcomes:
            lanes[policy[o.agent]].completed(
                lane,
                np.array([o.reward]),
                np.array([o.terminated]),
                np.array([o.truncated]),
                o.next_obs[None],
                None,
            )
    agent_env.close()
    return {name: lanes[name].cut().fields for name in spaces}


def chunk_of(
    cfg: Config, policy: str, fields: dict, sequence: int, env_steps: int, **changes
) -> TrajectoryChunk:
    """The chunk an actor sends of ``policy``'s items; ``changes`` break it."""
    spaces = policy_spaces(cfg)[policy]
    policy_cfg = policy_config(cfg, policy, spaces)
    chunk = make_chunk(
        policy_cfg,
        actor_id=0,
        incarnation=1,
        sequence=sequence,
        weights_version=0,
        env_steps=env_steps,
        fields=fields,
        priorities=None,
        agent_steps=policy_cfg.algo.steps_in_items(fields),
    )
    return dataclasses.replace(chunk, **changes)


def send(tables: PolicyTables | ReplayService, identity: bytes, msg) -> list[Reply]:
    """What the server loop does per message: handle it, then drain."""
    return tables.handle(identity, msg) + tables.drain()


def refusal(replies: list[Reply]) -> str:
    (reply,) = replies
    assert reply.identity == ACTOR and isinstance(reply.message, Error)
    return reply.message.reason


def test_cut_items_have_each_policys_own_layout(cut_items) -> None:
    assert cut_items["speaker"]["obs"].shape == (1, UNROLL, 3)
    assert cut_items["listener"]["obs"].shape == (1, UNROLL, 11)
    assert cut_items["speaker"]["action"].max() < 3 and cut_items["listener"]["action"].max() < 5
    # both agents get the same reward each step (minus the listener's distance to the goal)
    np.testing.assert_array_equal(cut_items["speaker"]["reward"], cut_items["listener"]["reward"])


def test_each_policys_chunk_goes_to_its_own_table(tmp_path, cut_items) -> None:
    cfg = run_config(tmp_path)
    tables = PolicyTables(cfg)
    assert list(tables.by_policy) == ["speaker", "listener"]
    # One tick of the actor cut both: the first chunk brings the 4 env steps, the other none
    # (here 3 and 1, to tell them apart in the sum).
    speaker = chunk_of(cfg, "speaker", cut_items["speaker"], sequence=0, env_steps=3)
    listener = chunk_of(cfg, "listener", cut_items["listener"], sequence=1, env_steps=1)
    assert (speaker.agent_steps, speaker.table) == (UNROLL, "speaker")
    assert send(tables, ACTOR, speaker) == [Reply(ACTOR, InsertAck("speaker", 1, 1, 0))]
    assert send(tables, ACTOR, listener) == [Reply(ACTOR, InsertAck("listener", 1, 1, 1))]

    stats = tables.stats()
    assert stats["replay/env_steps"] == 3 + 1
    assert stats["replay/speaker/size"] == stats["replay/listener/size"] == 1
    assert stats["replay/size"] == 1 + 1
    assert stats["replay/rejected_messages"] == 0

    for name, width in (("speaker", 3), ("listener", 11)):
        (reply,) = send(tables, LEARNER, SampleRequest(name, 1))
        batch = reply.message
        assert isinstance(batch, SampleBatch) and batch.table == name
        assert batch.fields["obs"].shape == (1, UNROLL, width)
        np.testing.assert_array_equal(batch.fields["obs"], cut_items[name]["obs"])


def test_a_report_brings_its_group_returns(tmp_path) -> None:
    tables = PolicyTables(run_config(tmp_path))
    report = ActorReport(
        actor_id=0,
        incarnation=1,
        is_eval=False,
        env_steps=50,
        weights_version=0,
        episode_returns=np.array([-30.0, -10.0]),  # the team's
        episode_lengths=np.array([25, 25]),
        group_returns={
            "team": np.array([-30.0, -10.0]),
            "policy/speaker": np.array([-15.0, -5.0]),
            "agent/listener_0": np.array([-15.0, -5.0]),
        },
        agent_steps=2 * 50,
    )
    assert send(tables, ACTOR, report) == []
    stats = tables.stats()
    assert stats["replay/return_mean/team"] == (-30 - 10) / 2
    assert stats["replay/return_mean/policy/speaker"] == (-15 - 5) / 2
    assert stats["replay/return_mean/agent/listener_0"] == -10.0
    assert stats["replay/agent_steps"] == 100
    assert stats["replay/train_return_mean"] == -20.0


@pytest.mark.parametrize(
    ("multiagent", "table", "reason"),
    [
        ({}, "narrator", "no replay table 'narrator': this run's tables are the trained "),
        (
            {"policies": [{"name": "speaker", "fixed": "random"}, {"name": "listener"}]},
            "speaker",
            "no replay table 'speaker': this run's tables are the trained policies listener",
        ),
        (
            {"policies_to_train": ["listener"]},
            "speaker",
            "no replay table 'speaker': this run's tables are the trained policies listener",
        ),
    ],
    ids=["made-up", "fixed", "not-trained"],
)
def test_a_chunk_for_a_table_the_run_lacks_is_refused(
    tmp_path, cut_items, multiagent: dict, table: str, reason: str
) -> None:
    cfg = run_config(tmp_path, **multiagent)
    tables = PolicyTables(cfg)
    chunk = chunk_of(cfg, "listener", cut_items["listener"], sequence=0, env_steps=4, table=table)
    assert refusal(send(tables, ACTOR, chunk)).startswith(reason)
    stats = tables.stats()
    assert stats["replay/size"] == 0 and stats["replay/env_steps"] == 0
    assert stats["replay/rejected_messages"] == 1


def test_published_versions_of_policies_without_a_table(tmp_path) -> None:
    section = {
        "policies": [
            {"name": "speaker", "fixed": "random"},
            {"name": "listener"},
        ],
    }
    tables = PolicyTables(run_config(tmp_path, **section))
    assert list(tables.by_policy) == ["listener"]
    assert send(tables, LEARNER, PublishedVersion(3, policy="listener")) == []
    assert tables.by_policy["listener"].run.published_version == 3
    reason = send(tables, LEARNER, PublishedVersion(1, policy="speaker"))[0].message.reason
    assert reason.startswith("no replay table 'speaker'")

    untrained = PolicyTables(run_config(tmp_path, policies_to_train=["listener"]))
    assert send(untrained, LEARNER, PublishedVersion(1, policy="speaker")) == []  # ignored


@pytest.mark.parametrize(
    ("agent_steps", "reason"),
    [
        # IMPALA's actors carry no step uncut: the claim must be the items' 4 steps
        (UNROLL - 1, "a chunk of items that account for 4 env steps claims 3"),
        # more than 1 lane's unroll of 4 steps is more than any chunk of the policy holds
        (UNROLL + 1, "a chunk's agent_steps 5 is more than an actor's chunk carries: at most 4"),
    ],
)
def test_a_chunk_whose_agent_steps_do_not_match_its_items_is_refused(
    tmp_path, cut_items, agent_steps: int, reason: str
) -> None:
    cfg = run_config(tmp_path)
    tables = PolicyTables(cfg)
    chunk = chunk_of(cfg, "speaker", cut_items["speaker"], 0, env_steps=4, agent_steps=agent_steps)
    assert refusal(send(tables, ACTOR, chunk)).startswith(reason)
    assert tables.stats()["replay/size"] == 0


def test_single_and_multi_agent_chunks_each_go_to_their_own_kind_of_replay(
    tmp_path, cut_items
) -> None:
    cfg = run_config(tmp_path)
    tables = PolicyTables(cfg)
    single = chunk_of(cfg, "speaker", cut_items["speaker"], 0, env_steps=4, agent_steps=-1)
    reason = "a chunk of a multi-agent run carries its agent_steps, one of a single-agent run none"
    assert refusal(send(tables, ACTOR, single)) == reason
    assert tables.stats()["replay/size"] == 0

    service = ReplayService(builders.config("env.num_envs=2", "actor.chunk_steps=1", path=None))
    valid = builders.chunk(service.cfg, [1.0, 1.0])
    assert send(service, ACTOR, valid) == [Reply(ACTOR, InsertAck(ANY, 2, 2, ANY))]
    multi = builders.chunk(service.cfg, [1.0, 1.0])
    multi = dataclasses.replace(multi, agent_steps=multi.env_steps)
    assert refusal(send(service, ACTOR, multi)) == reason
    assert service.table.size == 2

"""The replay server against hostile but well-formed messages: each decodes cleanly, and each must
be answered with ``Error``, counted in ``replay/rejected_messages`` and change nothing.

The item layouts that replay enforces come from the algorithms' hyperparameters
(``item_spec``); the first tests check them against chunks made by the real actor cores, so that
no honest actor is ever refused. ``ReplayService`` is then driven directly with many hostile
cases, and a real replay server process over a real socket with one of each class.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

import builders
import numpy as np
import pytest
import torch
from conftest import (
    CONFIG,
    REPO,
    SMALL_OVERRIDES,
    Processes,
    free_addr,
    request,
    server_stats,
    set_args,
    wait_for_server,
)

from apexrl.acting.chunks import make_chunk as actor_chunk
from apexrl.acting.step_block import StepBlock
from apexrl.algos import load_algorithm
from apexrl.config import Config, load_config
from apexrl.envs import make_vector_env, step_vector
from apexrl.replay.admission import (
    MAX_ABS_RETURN,
    MAX_EPISODE_STEPS,
    MAX_REPORT_ENV_STEPS,
    MAX_RUN_ENV_STEPS,
    NUM_EVAL_ACTOR_IDS,
)
from apexrl.replay.service import ReplayService
from apexrl.replay.serving import Reply
from apexrl.replay.tables import MAX_PRIORITY
from apexrl.runtime.lifecycle import StartupError
from apexrl.transport.codec import decode, encode
from apexrl.transport.messages import (
    ActorReport,
    Error,
    InsertAck,
    Message,
    PriorityUpdate,
    RestoreCounters,
    SampleBatch,
    SampleRequest,
    Stats,
    StatsRequest,
    TrajectoryChunk,
)

ACTOR, LEARNER, PEER = b"actor", b"learner", b"stranger"
TABLE = "apex_dqn"


# --- the item layouts against real actor cores --------------------------------------------------


def actor_chunks(cfg: Config, num_vector_steps: int) -> list[TrajectoryChunk]:
    """Step a training actor's envs with its real core as ``actor.main`` does, and return its
    chunks as the replay server receives them (encoded, then decoded)."""
    envs = make_vector_env(cfg.env, cfg.env.num_envs, cfg.unit_actions, cfg.product_discrete)
    algorithm = load_algorithm(cfg.algorithm)
    torch.manual_seed(0)
    net = algorithm.make_network(envs.single_observation_space, envs.single_action_space, cfg)
    core = algorithm.actor_core(net, cfg, 0, False, "cpu", np.random.default_rng(0))
    block = StepBlock(core.block_steps, core.block_overlap)
    obs, _ = envs.reset(seed=0)
    chunks, steps_since_chunk = [], 0
    for _ in range(num_vector_steps):
        action, extras = core.act(obs)
        step = step_vector(envs, action)
        core.observe(action, step)
        steps_since_chunk += cfg.env.num_envs
        version = np.full(cfg.env.num_envs, -1, dtype=np.int64)
        block.add(obs, action, step, {**extras, "weights_version": version})
        if block.full:
            fields, priorities = core.items(block)
            block.keep_overlap()
            sequence = len(chunks)
            chunk = actor_chunk(cfg, 0, 1, sequence, -1, steps_since_chunk, fields, priorities)
            if chunk is not None:
                chunks.append(decode(encode(chunk)))
                steps_since_chunk = 0
        obs = step.obs
    envs.close()
    return chunks


REAL_CORES = {
    "apex_dqn-CartPole": (
        "apex_dqn_cartpole.yaml",
        ["algo.hidden_sizes=[16]", "actor.chunk_steps=8"],
    ),
    "r2d2-CartPole": (
        "r2d2_cartpole.yaml",
        [
            "algo.hidden_sizes=[16]",
            "algo.lstm_size=8",
            "algo.sequence_length=6",
            "algo.sequence_overlap=2",
            "algo.burn_in=1",
            "actor.chunk_steps=2",  # shorter than a sequence: some blocks end none
        ],
    ),
    "impala-CartPole": ("impala_cartpole.yaml", ["algo.unroll_length=5"]),
    "impala-Pendulum": ("impala_pendulum.yaml", ["algo.unroll_length=5"]),
    "ppo-CartPole": ("ppo_cartpole.yaml", ["algo.unroll_length=5"]),
    "ppo-Pendulum": ("ppo_pendulum.yaml", ["algo.unroll_length=5"]),
}


@pytest.mark.parametrize("name", list(REAL_CORES))
def test_item_spec_matches_the_chunks_of_the_real_actor_core_and_replay_takes_them(
    name: str,
) -> None:
    config_file, overrides = REAL_CORES[name]
    cfg = load_config(
        REPO / "configs" / config_file,
        [
            *overrides,
            "env.num_envs=3",
            "actor.num_actors=1",
            "replay.capacity=2000",
            "replay.samples_per_insert=0",
            "replay.min_size_to_sample=1",
        ],
    )
    chunks = actor_chunks(cfg, num_vector_steps=60)
    assert len(chunks) >= 5, name
    service = ReplayService(cfg)
    spec = service.item_spec
    num_items = 0
    for chunk in chunks:
        layout = {key: (value.dtype, value.shape[1:]) for key, value in chunk.fields.items()}
        assert layout == spec, name
        assert chunk.env_steps <= service.bounds.env_steps
        replies = service.handle(ACTOR, chunk) + service.drain()
        num_items += len(chunk.priorities)
        assert replies == [
            Reply(
                ACTOR, InsertAck(cfg.replay.table, len(chunk.priorities), num_items, chunk.sequence)
            )
        ]
    assert service.rejected_messages == 0
    if name.startswith("apex_dqn"):  # the first chunk carries the n - 1 steps of the overlap
        bound = (cfg.actor.chunk_steps + cfg.algo.n_step - 1) * 3
        assert chunks[0].env_steps == service.bounds.env_steps == bound
    if name.startswith("r2d2"):  # blocks that ended no sequence pass their steps on
        assert max(chunk.env_steps for chunk in chunks) > cfg.actor.chunk_steps * 3


def test_box_actions_are_float32_of_the_space_shape_and_discrete_ones_int64() -> None:
    impala = load_config(REPO / "configs" / "impala_pendulum.yaml", ["algo.unroll_length=5"])
    spec = ReplayService(impala).item_spec
    assert spec["action"] == (np.dtype(np.float32), (5, 1))
    assert spec["obs"] == (np.dtype(np.float32), (5, 3))
    r2d2 = load_config(REPO / "configs" / "r2d2_cartpole.yaml")
    spec = ReplayService(r2d2).item_spec
    length, lstm = r2d2.algo.sequence_length, r2d2.algo.lstm_size
    assert spec["action"] == (np.dtype(np.int64), (length,))
    assert spec["prev_action"] == (np.dtype(np.int64), ())
    assert spec["obs"] == (np.dtype(np.float32), (length + 1, 4))
    assert spec["recurrent_state"] == (np.dtype(np.float32), (2, lstm))


# --- ReplayService, directly ----------------------------------------------------------------------


def make_config(*overrides: str) -> Config:
    """Ape-X on CartPole with 2 actors and 1 learner; chunks of at most 2 x 2 = 4 items and
    (2 + 3 - 1) x 2 = 8 env steps; batches of 4; priorities ** 0.5; no sample-to-insert ratio."""
    return builders.config(
        "actor.num_actors=2",
        "actor.chunk_steps=2",
        "env.num_envs=2",
        "replay.capacity=100",
        "replay.min_size_to_sample=4",
        "replay.samples_per_insert=0",
        "replay.priority_exponent=0.5",
        "learner.batch_size=4",
        *overrides,
        path=None,
    )


def make_chunk(first_key: int, priorities: list[float], **fields: np.ndarray) -> TrajectoryChunk:
    """Ape-X CartPole transitions whose observations and rewards carry the key each item gets
    (``builders.items``); ``fields`` replace (or, with None, remove) fields of the valid chunk."""
    return builders.chunk(
        make_config(),
        priorities,
        first_key=first_key,
        env_steps=len(priorities),
        incarnation=7,
        **fields,
    )


def make_report(
    returns: list[float],
    lengths: list[int] | None = None,
    env_steps: int = 100,
    actor_id: int = 0,
    is_eval: bool = False,
) -> ActorReport:
    lengths = [10] * len(returns) if lengths is None else lengths
    return ActorReport(
        actor_id,
        1,
        is_eval,
        env_steps,
        0,
        np.asarray(returns, np.float64),
        np.asarray(lengths, np.int64),
    )


def loaded_service(*overrides: str) -> ReplayService:
    """A service holding keys 0..3 with priorities 1, 4, 9, 16 (P(key k) = (k + 1) / 10), one
    training and one evaluation report, and a priority update of learner 0 that changed none."""
    service = ReplayService(make_config(*overrides))
    for chunk in (make_chunk(0, [1.0, 4.0]), make_chunk(2, [9.0, 16.0])):
        assert isinstance((service.handle(ACTOR, chunk) + service.drain())[0].message, InsertAck)
    service.handle(ACTOR, make_report([5.0, 7.0]))
    service.handle(b"eval", make_report([9.0], is_eval=True))
    service.handle(LEARNER, PriorityUpdate(TABLE, 0, np.array([99]), np.array([3.0])))
    return service


def snapshot(service: ReplayService) -> dict[str, object]:
    """Everything a message could change, but the counts of what was received and refused."""
    values = service.stats()
    for name in ("replay/rejected_messages", "replay/items_received", "replay/items_refused"):
        del values[name]
    table, limiter = service.table, service.limiter
    return {
        "stats": {k: v for k, v in values.items() if v == v},  # NaN means compare unequal
        "table": (table.size, table.num_inserted, table.num_sampled, table.max_priority),
        "limiter": (limiter.num_inserted, limiter.num_sampled),
        "actors": sorted(service.actors.last_seen),
        "ranks": dict(service.priority_updates_by_rank),
        "returns": (list(service.run.train_returns), list(service.run.eval_returns)),
    }


def assert_contents_unchanged(service: ReplayService) -> None:
    """The stored items and their priorities are still the four that went in."""
    replies = service.handle(LEARNER, SampleRequest(TABLE, 4)) + service.drain()
    batch = replies[0].message
    assert isinstance(batch, SampleBatch), replies
    np.testing.assert_allclose(batch.probabilities, (batch.keys + 1) / 10)
    np.testing.assert_array_equal(batch.fields["reward"], batch.keys)
    np.testing.assert_array_equal(batch.fields["obs"][:, 3], batch.keys)


def byte_bools(values: list[int]) -> np.ndarray:
    """A bool array whose bytes are ``values``: what a peer can put on the wire."""
    return np.frombuffer(bytes(values), dtype=np.bool_)


# name -> (the hostile message, a phrase of the reason). CHUNK_BOUND: (2 + 3 - 1) * 2 env steps.
CHUNK_BOUND = 8
HOSTILE: dict[str, tuple[Callable[[], Message], str]] = {
    # chunks: not this config's items
    "chunk for another table": (
        lambda: dataclasses.replace(make_chunk(4, [1.0, 1.0]), table="r2d2"),
        "unknown table 'r2d2'",
    ),
    "chunk from actor id -1": (
        lambda: dataclasses.replace(make_chunk(4, [1.0]), actor_id=-1),
        "actor_id -1 is outside 0..1",
    ),
    "chunk from an invented actor id": (
        lambda: dataclasses.replace(make_chunk(4, [1.0]), actor_id=2**40),
        "actor.num_actors",
    ),
    "chunk of no items": (lambda: make_chunk(4, []), "at least one item"),
    "chunk of more items than an actor sends": (
        lambda: make_chunk(4, [1.0] * 5),
        "a chunk of 5 items is more than an actor sends: at most 4",
    ),
    "chunk with more env steps than its items carry": (
        lambda: dataclasses.replace(make_chunk(4, [1.0]), env_steps=CHUNK_BOUND + 1),
        f"env_steps {CHUNK_BOUND + 1} is more than an actor's chunk carries",
    ),
    "chunk with an absurd env step count": (
        lambda: dataclasses.replace(make_chunk(4, [1.0]), env_steps=2**62),
        "env_steps",
    ),
    "chunk with an absurd priority": (
        lambda: make_chunk(4, [1.0, MAX_PRIORITY * 10]),
        "priorities must be <=",
    ),
    "chunk without a field": (lambda: make_chunk(4, [1.0], next_obs=None), "field 'next_obs'"),
    "chunk with an extra field": (
        lambda: make_chunk(4, [1.0], junk=np.zeros(1, np.float32)),
        "field 'junk'",
    ),
    "chunk with float64 observations": (
        lambda: make_chunk(4, [1.0], obs=np.zeros((1, 4), np.float64)),
        "field 'obs'",
    ),
    "chunk with observations of another shape": (
        lambda: make_chunk(4, [1.0], obs=np.zeros((1, 5), np.float32)),
        "field 'obs'",
    ),
    "chunk with int32 actions": (
        lambda: make_chunk(4, [1.0], action=np.zeros(1, np.int32)),
        "field 'action'",
    ),
    "chunk with uint8 instead of bool": (
        lambda: make_chunk(4, [1.0], terminated=np.zeros(1, np.uint8)),
        "field 'terminated'",
    ),
    "chunk with bools that are not 0 or 1": (
        lambda: make_chunk(4, [1.0, 1.0], truncated=byte_bools([0, 2])),
        "field 'truncated' holds bytes other than 0 and 1",
    ),
    "chunk with a NaN reward": (
        lambda: make_chunk(4, [1.0, 1.0], reward=np.array([0.0, np.nan], np.float32)),
        "field 'reward' holds non-finite values",
    ),
    "chunk with an infinite observation": (
        lambda: make_chunk(4, [1.0], obs=np.array([[0, np.inf, 0, 0]], np.float32)),
        "field 'obs' holds non-finite values",
    ),
    "chunk with a NaN next observation": (
        lambda: make_chunk(4, [1.0], next_obs=np.full((1, 4), np.nan, np.float32)),
        "field 'next_obs' holds non-finite values",
    ),
    "chunk with a negative action": (
        lambda: make_chunk(4, [1.0], action=np.array([-1])),
        "outside the action space's 0..1",
    ),
    "chunk with an action past the last": (
        lambda: make_chunk(4, [1.0, 1.0], action=np.array([0, 2])),
        "field 'action' holds actions in [0, 2]",
    ),
    "chunk with an n-step window of 0 steps": (
        lambda: make_chunk(4, [1.0], num_steps=np.array([0])),
        "field 'num_steps' holds values in [0, 0], outside 1..3",
    ),
    "chunk with a huge n-step window": (
        lambda: make_chunk(4, [1.0, 1.0], num_steps=np.array([3, 2**62])),
        "field 'num_steps' holds values in [3, 4611686018427387904], outside 1..3",
    ),
    # sample requests no setting can serve
    "sample request for another table": (lambda: SampleRequest("r2d2", 4), "unknown table"),
    "sample request above learner.batch_size": (
        lambda: SampleRequest(TABLE, 5),
        "batch_size 5 exceeds learner.batch_size 4",
    ),
    "sample request above the capacity": (lambda: SampleRequest(TABLE, 2**40), "exceeds"),
    # priority updates
    "priority update for another table": (
        lambda: PriorityUpdate("r2d2", 0, np.array([0]), np.array([1.0])),
        "unknown table",
    ),
    "priority update with int32 keys": (
        lambda: PriorityUpdate(TABLE, 0, np.array([0, 1], np.int32), np.array([1.0, 2.0])),
        "keys must be int64, got int32",
    ),
    "priority update with an absurd priority": (
        lambda: PriorityUpdate(TABLE, 0, np.array([0]), np.array([1e300])),
        "priorities must be <=",
    ),
    "priority update from rank 1 of 1": (
        lambda: PriorityUpdate(TABLE, 1, np.array([0]), np.array([1.0])),
        "learner_rank 1 is outside 0..0",
    ),
    "priority update from an invented rank": (
        lambda: PriorityUpdate(TABLE, -(2**40), np.array([0]), np.array([1.0])),
        "learner.world_size",
    ),
    # actor reports and counters
    "report of absurd env steps": (
        lambda: make_report([1.0], env_steps=MAX_REPORT_ENV_STEPS + 1),
        "env_steps",
    ),
    "report of more episodes than env steps": (
        lambda: make_report([1.0, 2.0, 3.0], env_steps=2),
        "3 episodes cannot end in 2 env steps",
    ),
    "report of a NaN return": (lambda: make_report([1.0, np.nan]), "finite"),
    "report of an infinite return": (lambda: make_report([-np.inf]), "finite"),
    "report of an absurd return": (lambda: make_report([MAX_ABS_RETURN * 2]), "within"),
    "report of an episode of no steps": (lambda: make_report([1.0], [0]), "episode lengths"),
    "report of a negative length": (lambda: make_report([1.0], [-5]), "episode lengths"),
    "report of an absurd length": (
        lambda: make_report([1.0], [MAX_EPISODE_STEPS + 1]),
        "episode lengths",
    ),
    "report from an actor id past actor.num_actors": (
        lambda: make_report([1.0], actor_id=2),
        "actor_id 2 is outside 0..1",
    ),
    "report from a negative actor id": (lambda: make_report([], actor_id=-3), "actor_id -3"),
    "evaluation report from an invented id": (
        lambda: make_report([1.0], actor_id=NUM_EVAL_ACTOR_IDS, is_eval=True),
        "evaluation actor_id",
    ),
    "restore of absurd env steps": (
        lambda: RestoreCounters(MAX_RUN_ENV_STEPS + 1),
        "RestoreCounters env_steps",
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_message_is_refused_counted_and_changes_nothing(name: str) -> None:
    message, reason = HOSTILE[name]
    service = loaded_service()
    before = snapshot(service)
    replies = service.handle(PEER, message()) + service.drain()
    assert [(r.identity, type(r.message)) for r in replies] == [(PEER, Error)], replies
    assert reason in replies[0].message.reason
    assert service.rejected_messages == 1
    assert snapshot(service) == before
    assert_contents_unchanged(service)


def test_the_first_chunk_does_not_decide_the_layout() -> None:
    service = ReplayService(make_config())
    junk = dataclasses.replace(make_chunk(0, [1.0, 1.0]), fields={"x": np.zeros((2, 7), np.uint8)})
    replies = service.handle(PEER, junk) + service.drain()
    assert isinstance(replies[0].message, Error) and "field 'action'" in replies[0].message.reason
    assert (service.table.size, service.table.num_inserted) == (0, 0)
    chunk = make_chunk(0, [1.0, 1.0])
    ack = service.handle(ACTOR, chunk) + service.drain()
    assert ack == [Reply(ACTOR, InsertAck(TABLE, 2, 2, chunk.sequence))]


def test_invented_ids_do_not_grow_the_bookkeeping() -> None:
    service = ReplayService(make_config())  # 2 actors, 1 learner
    for i in range(-100, 100):
        service.handle(PEER, make_report([], actor_id=i))
        service.handle(PEER, make_report([], actor_id=i, is_eval=True))
        service.handle(PEER, PriorityUpdate(TABLE, i, np.array([0]), np.array([1.0])))
    assert len(service.actors.last_seen) == 2 + NUM_EVAL_ACTOR_IDS
    assert list(service.priority_updates_by_rank) == [0]
    assert service.rejected_messages == 200 * 3 - (2 + NUM_EVAL_ACTOR_IDS + 1)


def test_held_inserts_are_bounded_in_bytes() -> None:
    # A CartPole transition is 16 + 8 + 4 + 8 + 1 + 1 + 16 = 54 bytes, plus an 8-byte priority:
    # a chunk of 4 holds 248 bytes, and 300 bytes hold one. The ratio 1 with the automatic slack
    # 4 * 1 + 4 = 8 lets 4 + 8 = 12 items in before it holds a chunk back.
    service = ReplayService(
        make_config("replay.samples_per_insert=1", "replay.max_pending_insert_bytes=300")
    )
    for i in range(3):
        assert service.handle(ACTOR, make_chunk(4 * i, [1.0] * 4)) == []
        assert isinstance(service.drain()[0].message, InsertAck)
    assert service.handle(ACTOR, make_chunk(12, [1.0] * 4)) + service.drain() == []  # held
    assert service.stats()["replay/pending_insert_bytes"] == 248
    replies = service.handle(PEER, make_chunk(16, [1.0] * 4))
    assert replies[0].message.reason.startswith("too many bytes of inserts waiting (248 + 248")
    assert service.stats()["replay/pending_inserts"] == 1
    # A sample makes room: the held chunk goes in and its bytes are released.
    replies = service.handle(LEARNER, SampleRequest(TABLE, 4)) + service.drain()
    assert [type(r.message) for r in replies] == [SampleBatch, InsertAck]
    assert service.stats()["replay/pending_insert_bytes"] == 0


def test_max_pending_insert_bytes_below_one_chunk_is_refused_at_start() -> None:
    with pytest.raises(StartupError, match="replay.max_pending_insert_bytes 200 is less than one"):
        ReplayService(make_config("replay.max_pending_insert_bytes=200"))


def test_held_sample_requests_are_bounded() -> None:
    service = ReplayService(make_config("replay.max_pending_samples=4"))  # 4 = prefetch_batches
    for _ in range(4):
        assert service.handle(LEARNER, SampleRequest(TABLE, 4)) + service.drain() == []  # empty
    replies = service.handle(PEER, SampleRequest(TABLE, 4))
    assert replies == [Reply(PEER, Error("too many sample requests waiting; retry later"))]
    assert service.stats()["replay/pending_samples"] == 4


# --- the last line of defence -------------------------------------------------------------------


def fail(*args: object) -> None:
    raise RuntimeError("a bug")


def test_a_message_whose_handling_raises_is_answered_and_the_server_carries_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    service = loaded_service()
    monkeypatch.setattr(service.table, "update_priorities", fail)
    update = PriorityUpdate(TABLE, 0, np.array([0]), np.array([2.0]))
    with caplog.at_level(logging.ERROR, logger="apexrl.replay_server"):
        for _ in range(3):
            replies = service.handle(LEARNER, update)
            assert replies == [
                Reply(LEARNER, Error("replay server failed to handle a PriorityUpdate"))
            ]
    assert service.rejected_messages == 3
    tracebacks = [r for r in caplog.records if r.exc_info is not None]
    assert len(tracebacks) == 1 and "PriorityUpdate" in tracebacks[0].getMessage()
    assert len(caplog.records) == 3  # one record per failure, the traceback only the first time
    reply = service.handle(PEER, StatsRequest())[0].message
    assert isinstance(reply, Stats) and reply.values["replay/rejected_messages"] == 3
    assert_contents_unchanged(service)


def test_a_held_request_whose_serving_raises_is_answered_and_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = loaded_service()
    with monkeypatch.context() as patch:
        patch.setattr(service.table, "sample", fail)
        assert service.handle(LEARNER, SampleRequest(TABLE, 4)) == []
        replies = service.drain()
    assert replies == [Reply(LEARNER, Error("replay server failed to handle a SampleRequest"))]
    assert (service.rejected_messages, service.stats()["replay/pending_samples"]) == (1, 0)
    with monkeypatch.context() as patch:
        patch.setattr(service.table, "insert_many", fail)
        assert service.handle(ACTOR, make_chunk(4, [1.0])) == []
        replies = service.drain()
    assert replies == [Reply(ACTOR, Error("replay server failed to handle a TrajectoryChunk"))]
    assert service.stats()["replay/pending_inserts"] == 0
    assert service.stats()["replay/pending_insert_bytes"] == 0
    assert_contents_unchanged(service)


# --- a real replay server over a real socket ----------------------------------------------------


def test_a_replay_server_process_refuses_one_of_each_and_keeps_serving(
    procs: Processes, tmp_path: Path
) -> None:
    addr = free_addr()
    # SMALL_OVERRIDES: chunks of 8 x 2 = 16 transitions, 1 learner, batches of 32.
    overrides = [*SMALL_OVERRIDES, "replay.min_size_to_sample=4", "actor.num_actors=2"]
    replay = procs.start(
        "replay",
        "replay",
        "--config",
        str(CONFIG),
        "--run-dir",
        str(tmp_path / "run"),
        "--bind",
        addr,
        *set_args(overrides),
    )
    wait_for_server(replay, addr)
    hostile = [
        dataclasses.replace(  # first
            make_chunk(0, [1.0, 1.0]), fields={"x": np.zeros((2, 7), np.uint8)}
        ),
        make_chunk(0, [1.0, 1.0], reward=np.array([np.nan, 0.0], np.float32)),
        make_chunk(0, [1.0] * 17),  # more items than an actor sends
        make_chunk(0, [1.0], action=np.array([7])),
        make_report([np.inf]),
        make_report([1.0], actor_id=5),
        RestoreCounters(2**52),
        SampleRequest(TABLE, 33),
        PriorityUpdate(TABLE, 0, np.array([0], np.int16), np.array([1.0])),
        PriorityUpdate(TABLE, 3, np.array([0]), np.array([1.0])),
    ]
    for message in hostile:
        reply = request(addr, message)
        assert isinstance(reply, Error), f"{message!r}: {reply!r}\n{replay.tail()}"
    assert replay.alive(), replay.tail()
    ack = request(addr, make_chunk(0, [1.0] * 16))
    assert isinstance(ack, InsertAck) and ack.table_size == 16, ack
    batch = request(addr, SampleRequest(TABLE, 4))
    assert isinstance(batch, SampleBatch) and batch.keys.shape == (4,), batch
    np.testing.assert_array_equal(batch.fields["reward"], batch.keys)
    stats = server_stats(addr)
    assert stats["replay/rejected_messages"] == len(hostile), stats
    assert (stats["replay/size"], stats["replay/env_steps"]) == (16, 16)
    code, _ = replay.stop(8.0)
    assert code == 0, replay.tail()

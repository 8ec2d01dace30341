"""The replay server's and parameter server's message handling, without sockets.

``ReplayService.handle`` / ``drain`` and ``ParamStore.handle`` are driven with message objects; the
rate-limiter and sampling numbers are worked out by hand in the comments.
"""

from __future__ import annotations

import dataclasses
import math
import types
from unittest.mock import ANY

import builders
import numpy as np
import pytest

from apexrl.config import Config, ReplayConfig
from apexrl.config.rules import check_replay_config
from apexrl.param_server import ParamStore
from apexrl.replay.service import ReplayService
from apexrl.replay.serving import Reply
from apexrl.replay.tables import FifoQueue
from apexrl.transport.messages import (
    ActorReport,
    Error,
    InsertAck,
    Params,
    ParamsNotModified,
    ParamsRequest,
    PriorityUpdate,
    PublishAck,
    PublishParams,
    RestoreCounters,
    SampleBatch,
    SampleRequest,
    Shutdown,
    Stats,
    StatsRequest,
    TrajectoryChunk,
)

ACTOR = b"actor"
LEARNER = b"learner"
TABLE = "apex_dqn"


def make_config(*overrides: str) -> Config:
    """A small replay: capacity 100, sampling from 4 items, 1 sample per insert, slack 2 items,
    chunks of 2 items (1 step x 2 envs) and batches of 2."""
    return builders.config(
        "actor.chunk_steps=1",
        "env.num_envs=2",
        "replay.capacity=100",
        "replay.min_size_to_sample=4",
        "replay.samples_per_insert=1",
        "replay.rate_error_buffer=2",
        "replay.priority_exponent=0.5",
        "learner.batch_size=2",
        "run.stop_eval_episodes=3",
        *overrides,
        path=None,
    )


def make_chunk(
    first_key: int, priorities: list[float], table: str = TABLE, obs_dtype: type = np.float32
) -> TrajectoryChunk:
    """A chunk of Ape-X CartPole transitions (the config's item layout) whose rewards and
    observations carry the key each item will get, so samples can be checked by content; another
    ``table`` or ``obs_dtype`` breaks the valid chunk."""
    valid = builders.chunk(
        make_config(), priorities, first_key=first_key, env_steps=len(priorities), incarnation=7
    )
    fields = {**valid.fields, "obs": valid.fields["obs"].astype(obs_dtype)}
    return dataclasses.replace(valid, table=table, fields=fields)


def messages(replies: list[Reply]) -> list[tuple[bytes, type]]:
    return [(reply.identity, type(reply.message)) for reply in replies]


def send(service: ReplayService, identity: bytes, msg) -> list[Reply]:
    """What the server loop does per message: handle it, then drain."""
    return service.handle(identity, msg) + service.drain()


def report(is_eval: bool, env_steps: int, returns: list[float], actor_id: int = 0) -> ActorReport:
    return ActorReport(
        actor_id=actor_id,
        incarnation=1,
        is_eval=is_eval,
        env_steps=env_steps,
        weights_version=0,
        episode_returns=np.asarray(returns, dtype=np.float64),
        episode_lengths=np.full(len(returns), 10, dtype=np.int64),
    )


# --- rate limiting of inserts and samples ---------------------------------------------------------


def test_chunk_is_held_while_the_rate_limiter_blocks_and_acked_after_a_sample() -> None:
    service = ReplayService(make_config())
    # Limiter with spi = 1, min_size = 4, error_buffer = 2, diff = inserted - sampled:
    #   insert n allowed while inserted + n <= 4, or if diff + n <= 4 * 1 + 2 = 6
    #   sample n allowed if inserted >= 4 and diff - n >= 4 * 1 - 2 = 2
    # chunk 0: 0 + 2 <= 4 (filling)              -> acked, diff 2
    # chunk 1: 2 + 2 <= 4 (filling)              -> acked, diff 4
    # chunk 2: 4 + 2 > 4, but diff + 2 = 6 <= 6  -> acked, diff 6
    # chunk 3: diff + 2 = 8 > 6                  -> held, no reply
    acks = [send(service, ACTOR, make_chunk(2 * i, [1.0, 1.0])) for i in range(3)]
    for i, replies in enumerate(acks):
        assert len(replies) == 1
        assert replies[0].identity == ACTOR
        assert replies[0].message == InsertAck(
            TABLE, num_inserted=2, table_size=2 * (i + 1), sequence=ANY
        )
    assert send(service, ACTOR, make_chunk(6, [1.0, 1.0])) == []
    assert service.drain() == []  # still held: nothing changed
    assert service.stats()["replay/pending_inserts"] == 1.0
    assert service.table.size == 6

    # A sample of 2: diff - 2 = 4 >= 2 -> served, diff 4. Then chunk 3: diff + 2 = 6 <= 6 -> acked.
    replies = send(service, LEARNER, SampleRequest(TABLE, 2))
    assert messages(replies) == [(LEARNER, SampleBatch), (ACTOR, InsertAck)]
    assert replies[0].message.table_size == 6  # sampled before chunk 3 went in
    assert replies[1].message == InsertAck(TABLE, num_inserted=2, table_size=8, sequence=ANY)
    stats = service.stats()
    assert stats["replay/pending_inserts"] == 0.0
    assert (stats["replay/num_inserted"], stats["replay/num_sampled"]) == (8.0, 2.0)


def test_sample_request_is_held_until_min_size_then_answered() -> None:
    service = ReplayService(make_config())
    # Priorities 1, 4, 9, 16 with exponent 0.5: tree values 1, 2, 3, 4, total 10,
    # so P(key k) = (k + 1) / 10.
    assert send(service, ACTOR, make_chunk(0, [1.0, 4.0])) != []
    assert send(service, LEARNER, SampleRequest(TABLE, 2)) == []  # 2 items < min size 4
    assert service.stats()["replay/pending_samples"] == 1.0

    # The second chunk brings 4 items: inserted >= 4 and diff - 2 = 4 - 2 = 2 >= 2 -> served.
    replies = send(service, ACTOR, make_chunk(2, [9.0, 16.0]))
    assert messages(replies) == [(ACTOR, InsertAck), (LEARNER, SampleBatch)]
    batch = replies[1].message
    assert batch.table == TABLE
    assert batch.table_size == 4
    assert batch.keys.dtype == np.int64 and batch.keys.shape == (2,)
    assert set(batch.keys.tolist()) <= {0, 1, 2, 3}
    np.testing.assert_allclose(batch.probabilities, (batch.keys + 1) / 10)
    assert set(batch.fields) == set(service.item_spec)
    np.testing.assert_array_equal(batch.fields["reward"], batch.keys)
    np.testing.assert_array_equal(batch.fields["obs"], np.repeat(batch.keys[:, None], 4, axis=1))
    assert batch.fields["obs"].dtype == np.float32
    assert service.stats()["replay/pending_samples"] == 0.0


def test_sample_request_for_more_than_the_table_holds_waits() -> None:
    service = ReplayService(
        make_config("replay.samples_per_insert=0", "actor.chunk_steps=2", "learner.batch_size=6")
    )
    send(service, ACTOR, make_chunk(0, [1.0] * 4))
    assert send(service, LEARNER, SampleRequest(TABLE, 6)) == []  # 4 items stored, 6 asked
    replies = send(service, ACTOR, make_chunk(4, [1.0] * 2))
    assert messages(replies) == [(ACTOR, InsertAck), (LEARNER, SampleBatch)]
    assert replies[1].message.table_size == 6


# --- priorities -----------------------------------------------------------------------------------


def sample_all(service: ReplayService, batch_size: int = 4) -> SampleBatch:
    (reply,) = send(service, LEARNER, SampleRequest(TABLE, batch_size))
    assert isinstance(reply.message, SampleBatch)
    return reply.message


def test_priority_update_changes_the_probabilities_of_the_next_batch() -> None:
    service = ReplayService(
        make_config("replay.samples_per_insert=0", "actor.chunk_steps=2", "learner.batch_size=4")
    )
    send(service, ACTOR, make_chunk(0, [1.0, 4.0, 9.0, 16.0]))
    before = sample_all(service)
    # p ** 0.5 = 1, 2, 3, 4; total 10: P(key k) = (k + 1) / 10
    np.testing.assert_allclose(before.probabilities, (before.keys + 1) / 10)
    # Stratified: draw i falls in [2.5 i, 2.5 (i + 1)). The last, in [7.5, 10), lies in key 3's
    # share [6, 10).
    assert before.keys[-1] == 3

    update = PriorityUpdate(TABLE, 0, np.array([0, 1, 2, 3]), np.array([16.0, 9.0, 4.0, 1.0]))
    assert send(service, LEARNER, update) == []  # no reply
    assert service.stats()["replay/priority_updates"] == 4.0
    after = sample_all(service)
    # p ** 0.5 = 4, 3, 2, 1; total 10: P(key k) = (4 - k) / 10
    np.testing.assert_allclose(after.probabilities, (4 - after.keys) / 10)
    # Now key 0 owns [0, 4), so the first draw, in [0, 2.5), is key 0.
    assert after.keys[0] == 0


def test_priority_update_for_evicted_keys_is_ignored() -> None:
    service = ReplayService(
        make_config(
            "replay.capacity=4",
            "replay.samples_per_insert=0",
            "learner.batch_size=4",
            "actor.chunk_steps=2",
        )
    )
    send(service, ACTOR, make_chunk(0, [1.0, 4.0, 9.0, 16.0]))
    send(service, ACTOR, make_chunk(4, [25.0, 36.0]))  # evicts keys 0 and 1
    # Stored keys 2, 3, 4, 5 with p ** 0.5 = 3, 4, 5, 6; total 18: P(key k) = (k + 1) / 18
    stale = PriorityUpdate(TABLE, 0, np.array([0, 1]), np.array([10_000.0, 10_000.0]))
    assert send(service, LEARNER, stale) == []
    assert service.stats()["replay/priority_updates"] == 0.0
    batch = sample_all(service, batch_size=4)
    assert set(batch.keys.tolist()) <= {2, 3, 4, 5}
    np.testing.assert_allclose(batch.probabilities, (batch.keys + 1) / 18)

    # One stale key and one stored key: only key 2 changes, to 81 ** 0.5 = 9; total 9 + 4 + 5 + 6.
    mixed = PriorityUpdate(TABLE, 0, np.array([1, 2]), np.array([10_000.0, 81.0]))
    send(service, LEARNER, mixed)
    assert service.stats()["replay/priority_updates"] == 1.0
    batch = sample_all(service, batch_size=4)
    expected = {2: 9 / 24, 3: 4 / 24, 4: 5 / 24, 5: 6 / 24}
    np.testing.assert_allclose(batch.probabilities, [expected[k] for k in batch.keys.tolist()])


# --- rejected messages ----------------------------------------------------------------------------


def rejected(service: ReplayService) -> float:
    return service.stats()["replay/rejected_messages"]


def test_chunk_for_an_unknown_table_is_rejected() -> None:
    service = ReplayService(make_config())
    replies = send(service, ACTOR, make_chunk(0, [1.0, 1.0], table="r2d2"))
    assert messages(replies) == [(ACTOR, Error)]
    assert "unknown table 'r2d2'" in replies[0].message.reason
    assert rejected(service) == 1.0
    assert service.table.size == 0


@pytest.mark.parametrize(
    "msg",
    [
        SampleRequest("r2d2", 2),
        PriorityUpdate("r2d2", 0, np.array([0]), np.array([1.0])),
    ],
)
def test_requests_for_an_unknown_table_are_rejected(msg) -> None:
    service = ReplayService(make_config())
    replies = send(service, LEARNER, msg)
    assert messages(replies) == [(LEARNER, Error)]
    assert "unknown table 'r2d2'" in replies[0].message.reason
    assert rejected(service) == 1.0


def test_sample_request_larger_than_the_capacity_is_rejected() -> None:
    service = ReplayService(make_config())
    replies = send(service, LEARNER, SampleRequest(TABLE, 101))
    assert messages(replies) == [(LEARNER, Error)]
    assert "exceeds the capacity" in replies[0].message.reason
    assert rejected(service) == 1.0


@pytest.mark.parametrize(
    "bad_chunk",
    [
        make_chunk(2, [1.0, 1.0], obs_dtype=np.float64),  # another dtype
        dataclasses.replace(  # fields missing: only the actions
            make_chunk(0, [1.0, 1.0]), fields={"action": np.arange(2)}
        ),
        dataclasses.replace(  # fields missing, and the observations of another trailing shape
            make_chunk(0, [1.0, 1.0]),
            fields={"obs": np.zeros((2, 5), np.float32), "action": np.arange(2)},
        ),
    ],
)
def test_chunk_with_mismatched_fields_is_rejected_and_changes_nothing(bad_chunk) -> None:
    service = ReplayService(make_config())
    send(service, ACTOR, make_chunk(0, [1.0, 1.0]))
    # Built when the tests were collected: numbered before the chunk above, it would be a copy of
    # a stored chunk, acknowledged without a look at its items.
    bad_chunk = dataclasses.replace(bad_chunk, sequence=2**40)
    replies = send(service, b"other", bad_chunk)
    assert messages(replies) == [(b"other", Error)]
    assert "field" in replies[0].message.reason
    assert rejected(service) == 1.0
    assert (service.table.size, service.limiter.num_inserted) == (2, 2)
    # The table still takes well-formed chunks.
    assert messages(send(service, ACTOR, make_chunk(2, [1.0, 1.0]))) == [(ACTOR, InsertAck)]


def test_chunks_beyond_max_pending_inserts_are_rejected() -> None:
    service = ReplayService(make_config("replay.max_pending_inserts=2"))
    for i in range(3):  # as in the rate-limit test: 3 chunks of 2 go in, then diff = 6 blocks
        send(service, ACTOR, make_chunk(2 * i, [1.0, 1.0]))
    assert send(service, b"a", make_chunk(6, [1.0, 1.0])) == []  # held (1 pending)
    assert send(service, b"b", make_chunk(6, [1.0, 1.0])) == []  # held (2 pending)
    replies = send(service, b"c", make_chunk(6, [1.0, 1.0]))
    assert messages(replies) == [(b"c", Error)]
    assert "too many inserts waiting" in replies[0].message.reason
    assert rejected(service) == 1.0
    assert service.stats()["replay/pending_inserts"] == 2.0


def test_unexpected_message_kind_is_rejected() -> None:
    service = ReplayService(make_config())
    for msg in (Params(3, {"w": np.zeros(2, np.float32)}), InsertAck(TABLE, 1, 1)):
        replies = send(service, ACTOR, msg)
        assert messages(replies) == [(ACTOR, Error)]
        assert f"does not accept {type(msg).__name__}" in replies[0].message.reason
    assert rejected(service) == 2.0


# --- the FIFO queue (IMPALA, PPO) -----------------------------------------------------------------


def make_fifo_config(*overrides: str, **fifo_options: int | bool) -> Config:
    """A FIFO of 4 items fed chunks of 2, read in batches of 2, sampling from 2 items, 1 sample
    per insert, slack 4 items: the rate limiter lets up to 2 + 4 = 6 unread items in, so a full
    queue, not the limiter, holds the third chunk back.

    ``fifo_options`` (``max_times_sampled``, ``evict_unread``) are config overrides where
    ``ReplayConfig`` has these fields, and otherwise set on a stand-in for ``cfg.replay`` (the
    server reads them with getattr).
    """
    fields = {f.name for f in dataclasses.fields(ReplayConfig)}
    known = {name: value for name, value in fifo_options.items() if name in fields}
    cfg = make_config(
        "replay.kind=fifo",
        "replay.capacity=4",
        "replay.min_size_to_sample=2",
        "replay.rate_error_buffer=4",
        *overrides,
        *(f"replay.{name}={str(value).lower()}" for name, value in known.items()),
    )
    if len(known) == len(fifo_options):
        return cfg
    replay = types.SimpleNamespace(**{**dataclasses.asdict(cfg.replay), **fifo_options})
    return dataclasses.replace(cfg, replay=replay)


def sample_keys(service: ReplayService, batch_size: int = 2) -> list[int]:
    (reply,) = send(service, LEARNER, SampleRequest(TABLE, batch_size))
    assert isinstance(reply.message, SampleBatch)
    np.testing.assert_array_equal(reply.message.fields["reward"], reply.message.keys)
    return reply.message.keys.tolist()


def test_fifo_config_is_deadlock_free() -> None:
    cfg = make_fifo_config()
    check_replay_config(
        cfg.replay.kind,
        cfg.replay.capacity,
        cfg.replay.samples_per_insert,
        cfg.rate_error_buffer,
        cfg.replay.min_size_to_sample,
        cfg.chunk_items,
        cfg.learner.batch_size,
    )
    service = ReplayService(cfg)
    assert isinstance(service.table, FifoQueue)
    assert (service.table.max_times_sampled, service.table.evict_unread) == (1, False)


def test_full_fifo_holds_a_chunk_back_until_a_sample_makes_room() -> None:
    service = ReplayService(make_fifo_config())
    # Limiter: insert n allowed while inserted + n <= 2 or diff + n <= 2 * 1 + 4 = 6, and here
    # diff = the unread items. Chunk 0: 0 + 2 <= 2 (filling); chunk 1: 2 + 2 <= 6; chunk 2:
    # 4 + 2 <= 6, but the queue holds 4 of 4 items -> held, no reply.
    for i in range(2):
        assert send(service, ACTOR, make_chunk(2 * i, [1.0, 1.0])) == [
            Reply(ACTOR, InsertAck(TABLE, num_inserted=2, table_size=2 * (i + 1), sequence=ANY))
        ]
    assert send(service, ACTOR, make_chunk(4, [1.0, 1.0])) == []
    assert service.limiter.can_insert(2) and not service.table.can_insert(2)
    assert service.drain() == []  # still held: nothing changed
    assert service.stats()["replay/pending_inserts"] == 1.0

    # A sample of 2 (diff 4 - 2 >= 2 - 4) delivers keys 0 and 1 and makes room: chunk 2 goes in.
    replies = send(service, LEARNER, SampleRequest(TABLE, 2))
    assert messages(replies) == [(LEARNER, SampleBatch), (ACTOR, InsertAck)]
    assert replies[0].message.keys.tolist() == [0, 1]
    assert replies[0].message.table_size == 4  # sampled before chunk 2 went in
    np.testing.assert_array_equal(replies[0].message.probabilities, [1.0, 1.0])
    assert replies[1].message == InsertAck(TABLE, num_inserted=2, table_size=4, sequence=ANY)

    # Every item is delivered once, in order; nothing was dropped.
    assert sample_keys(service) == [2, 3]
    assert sample_keys(service) == [4, 5]
    assert send(service, LEARNER, SampleRequest(TABLE, 2)) == []  # empty: held
    stats = service.stats()
    assert (stats["replay/num_inserted"], stats["replay/num_sampled"]) == (6.0, 6.0)
    assert (stats["replay/size"], stats["replay/evicted_unread"]) == (0.0, 0.0)
    assert (stats["replay/pending_inserts"], stats["replay/pending_samples"]) == (0.0, 1.0)
    assert stats["replay/env_steps"] == 6.0


def test_fifo_that_evicts_takes_every_chunk_and_counts_the_items_it_drops() -> None:
    service = ReplayService(make_fifo_config(evict_unread=True))
    assert service.stats()["replay/evicted_unread"] == 0.0
    for i in range(3):  # as above, but the third chunk goes in at once and evicts keys 0 and 1
        replies = send(service, ACTOR, make_chunk(2 * i, [1.0, 1.0]))
        assert replies == [Reply(ACTOR, InsertAck(TABLE, 2, min(2 * (i + 1), 4), ANY))]
    stats = service.stats()
    assert (stats["replay/size"], stats["replay/num_inserted"]) == (4.0, 6.0)
    assert stats["replay/evicted_unread"] == 2.0
    assert sample_keys(service) == [2, 3]
    # diff 6 - 2 = 4: chunk 3 (4 + 2 <= 6) lands in a queue of 2 items, evicting nothing.
    send(service, ACTOR, make_chunk(6, [1.0, 1.0]))
    assert sample_keys(service) == [4, 5]
    assert service.stats()["replay/evicted_unread"] == 2.0


def test_fifo_max_times_sampled_two_serves_each_item_twice_then_drops_it() -> None:
    # 2 samples per insert, so the limiter asks for what the queue gives. Limiter: insert n
    # allowed while inserted + n <= 2 or diff + 2 n <= 2 * 2 + 4 = 8; sample b needs
    # diff - b >= 2 * 2 - 4 = 0.
    service = ReplayService(make_fifo_config("replay.samples_per_insert=2", max_times_sampled=2))
    assert service.table.max_times_sampled == 2
    send(service, ACTOR, make_chunk(0, [1.0, 1.0]))  # filling; diff 4
    send(service, ACTOR, make_chunk(2, [1.0, 1.0]))  # 4 + 4 <= 8; diff 8
    assert send(service, ACTOR, make_chunk(4, [1.0, 1.0])) == []  # 8 + 4 > 8 and the queue full
    # The first batch reads keys 0, 1 once (diff 6); the second reads them again (diff 4), so
    # they leave: now 4 + 4 <= 8 and the queue has room, and chunk 2 is acked.
    assert sample_keys(service) == [0, 1]
    replies = send(service, LEARNER, SampleRequest(TABLE, 2))
    assert messages(replies) == [(LEARNER, SampleBatch), (ACTOR, InsertAck)]
    assert replies[0].message.keys.tolist() == [0, 1]
    assert [sample_keys(service) for _ in range(4)] == [[2, 3], [2, 3], [4, 5], [4, 5]]
    assert send(service, LEARNER, SampleRequest(TABLE, 2)) == []  # every item read twice: empty
    stats = service.stats()
    assert (stats["replay/num_inserted"], stats["replay/num_sampled"]) == (6.0, 12.0)
    assert (stats["replay/size"], stats["replay/evicted_unread"]) == (0.0, 0.0)


def test_chunk_larger_than_the_fifo_is_refused_at_once_and_the_server_keeps_serving() -> None:
    service = ReplayService(make_fifo_config())
    send(service, ACTOR, make_chunk(0, [1.0, 1.0]))
    send(service, ACTOR, make_chunk(2, [1.0, 1.0]))
    assert send(service, ACTOR, make_chunk(4, [1.0, 1.0])) == []  # held: the queue is full
    # A chunk of 5 items could never fit in 4: an Error now, not a wait behind the held chunk.
    replies = send(service, b"big", make_chunk(4, [1.0] * 5))
    assert messages(replies) == [(b"big", Error)]
    assert "a chunk of 5 items exceeds the FIFO queue's capacity of 4 items" in (
        replies[0].message.reason
    )
    assert rejected(service) == 1.0
    assert service.stats()["replay/pending_inserts"] == 1.0
    replies = send(service, LEARNER, SampleRequest(TABLE, 2))
    assert messages(replies) == [(LEARNER, SampleBatch), (ACTOR, InsertAck)]
    assert [sample_keys(service), sample_keys(service)] == [[2, 3], [4, 5]]
    assert service.stats()["replay/num_inserted"] == 6.0  # the 5 refused items never went in


def test_prioritized_stats_have_no_evicted_unread() -> None:
    assert "replay/evicted_unread" not in ReplayService(make_config()).stats()


@pytest.mark.parametrize("cfg", [make_config(), make_fifo_config()], ids=["prioritized", "fifo"])
def test_chunk_of_no_items_is_rejected(cfg: Config) -> None:
    service = ReplayService(cfg)
    empty = make_chunk(0, [])
    replies = send(service, ACTOR, empty)
    assert messages(replies) == [(ACTOR, Error)]
    assert "at least one item" in replies[0].message.reason
    assert messages(send(service, ACTOR, make_chunk(0, [1.0, 1.0]))) == [(ACTOR, InsertAck)]


# --- actor reports and stats ----------------------------------------------------------------------


def test_actor_reports_are_aggregated() -> None:
    service = ReplayService(make_config())  # run.stop_eval_episodes = 3: the eval window
    assert service.handle(ACTOR, report(False, env_steps=100, returns=[1.0, 2.0])) == []
    service.handle(ACTOR, report(False, env_steps=50, returns=[], actor_id=1))
    service.handle(b"eval", report(True, env_steps=999, returns=[10.0, 20.0]))
    service.handle(b"eval", report(True, env_steps=999, returns=[30.0, 40.0]))
    stats = service.stats()
    assert stats["replay/env_steps"] == 0  # training env steps are counted from inserted chunks
    assert stats["eval/env_steps"] == 999 + 999
    assert stats["replay/train_episodes"] == 2.0
    assert stats["replay/train_return_mean"] == (1.0 + 2.0) / 2
    assert stats["eval/episodes"] == 4.0
    assert stats["eval/episodes_in_window"] == 3.0  # the oldest, 10, left the window
    assert stats["eval/return_mean"] == (20.0 + 30.0 + 40.0) / 3
    # training actors 0 and 1, and the evaluation actor (counted apart from training actor 0)
    assert stats["replay/active_actors"] == 3.0


def test_env_steps_are_counted_at_insert_and_agree_with_the_table() -> None:
    service = ReplayService(make_config())
    send(service, ACTOR, make_chunk(0, [1.0, 1.0]))
    assert service.stats()["replay/env_steps"] == 2.0 == service.stats()["replay/size"]
    refused = make_chunk(2, [1.0])
    send(service, ACTOR, dataclasses.replace(refused, table="other"))  # rejected: not counted
    assert service.stats()["replay/env_steps"] == 2.0


def test_restore_counters_sets_a_floor_under_the_env_steps() -> None:
    fresh = ReplayService(make_config())
    (reply,) = fresh.handle(LEARNER, RestoreCounters(env_steps=5000))
    assert isinstance(reply.message, Stats) and reply.message.values["replay/env_steps"] == 5000
    send(fresh, ACTOR, make_chunk(0, [1.0, 1.0]))
    assert fresh.stats()["replay/env_steps"] == 5000 + 2  # this session's steps add to it
    # A replay server that kept running through a learner restart has counted them already.
    running = ReplayService(make_config())
    for i in range(3):
        send(running, ACTOR, make_chunk(2 * i, [1.0, 1.0]))
    running.handle(LEARNER, RestoreCounters(env_steps=4))
    assert running.stats()["replay/env_steps"] == 6.0


def test_stats_before_any_episode_report_nan_means() -> None:
    stats = ReplayService(make_config()).stats()
    assert math.isnan(stats["replay/train_return_mean"])
    assert math.isnan(stats["eval/return_mean"])
    assert stats["eval/episodes_in_window"] == 0.0


def test_stats_request_is_answered_with_the_counters() -> None:
    service = ReplayService(make_config())
    send(service, ACTOR, make_chunk(0, [1.0, 1.0]))
    send(service, ACTOR, make_chunk(2, [1.0, 1.0]))
    send(service, LEARNER, SampleRequest(TABLE, 2))  # diff 4: 4 - 2 = 2 >= 2, served
    send(service, LEARNER, SampleRequest(TABLE, 2))  # diff 2: 2 - 2 = 0 < 2, held
    service.handle(ACTOR, report(False, env_steps=32, returns=[9.0]))
    (reply,) = service.handle(b"peer", StatsRequest())
    assert reply.identity == b"peer"
    assert isinstance(reply.message, Stats)
    assert reply.message.role == "replay"
    values = reply.message.values
    assert values["replay/size"] == 4.0
    assert values["replay/num_inserted"] == 4.0
    assert values["replay/num_sampled"] == 2.0
    assert values["replay/pending_samples"] == 1.0
    assert values["replay/pending_inserts"] == 0.0
    assert values["replay/rejected_messages"] == 0.0
    assert values["replay/env_steps"] == 4.0  # the two inserted chunks' env steps, 2 + 2
    assert values["replay/train_return_mean"] == 9.0


# --- shutdown -------------------------------------------------------------------------------------


def test_shutdown_answers_held_requests_and_every_later_one() -> None:
    service = ReplayService(make_config())
    for i in range(3):
        send(service, ACTOR, make_chunk(2 * i, [1.0, 1.0]))
    assert send(service, ACTOR, make_chunk(6, [1.0, 1.0])) == []  # held: diff 6 + 2 > 6
    assert service.handle(LEARNER, SampleRequest(TABLE, 2)) == []  # held until the next drain

    replies = service.handle(b"launcher", Shutdown("done"))
    assert messages(replies) == [(ACTOR, Shutdown), (LEARNER, Shutdown)]
    assert service.stopping
    assert service.stats()["replay/pending_inserts"] == 0.0
    assert service.stats()["replay/pending_samples"] == 0.0

    for msg in (
        make_chunk(8, [1.0, 1.0]),
        SampleRequest(TABLE, 2),
        StatsRequest(),
        report(False, 8, []),
        Params(0, {"w": np.zeros(1, np.float32)}),
    ):
        later = service.handle(b"late", msg)
        assert messages(later) == [(b"late", Shutdown)]
    assert service.table.size == 6  # nothing went in after the shutdown


# --- parameter server -----------------------------------------------------------------------------


WEIGHTS = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(3, np.float32)}


def test_params_request_before_any_publish_is_not_modified() -> None:
    store = ParamStore()
    assert store.handle(ParamsRequest(-1)) == ParamsNotModified(-1)
    assert store.handle(ParamsRequest(4)) == ParamsNotModified(-1)
    assert store.stats()["params/num_served"] == 0.0


def test_params_are_served_when_the_asker_holds_another_version() -> None:
    store = ParamStore()
    assert store.handle(PublishParams(0, 0, WEIGHTS)) == PublishAck(0)
    for have in (-1, 3):
        reply = store.handle(ParamsRequest(have))
        assert isinstance(reply, Params) and reply.version == 0
        assert set(reply.arrays) == {"w", "b"}
        np.testing.assert_array_equal(reply.arrays["w"], WEIGHTS["w"])
    assert store.handle(ParamsRequest(0)) == ParamsNotModified(0)
    assert store.stats() == {
        "params/version": 0.0,
        "params/num_served": 2.0,
        "params/num_served_shm": 0.0,
        "params/rejected_messages": 0.0,
    }


def test_published_arrays_are_copied() -> None:
    store = ParamStore()
    arrays = {"w": np.ones(3, np.float32)}
    store.handle(PublishParams(1, 0, arrays))
    arrays["w"][:] = 5.0
    np.testing.assert_array_equal(store.handle(ParamsRequest(-1)).arrays["w"], np.ones(3))


def test_a_lower_version_after_a_learner_restart_is_served() -> None:
    store = ParamStore()
    store.handle(PublishParams(7, 0, WEIGHTS))
    restarted = {"w": np.full((2, 3), 9.0, np.float32), "b": np.ones(3, np.float32)}
    assert store.handle(PublishParams(0, 0, restarted)) == PublishAck(0)
    reply = store.handle(ParamsRequest(7))  # an actor still holding the old learner's weights
    assert isinstance(reply, Params) and reply.version == 0
    np.testing.assert_array_equal(reply.arrays["w"], restarted["w"])
    assert store.handle(ParamsRequest(0)) == ParamsNotModified(0)


def test_param_store_shutdown_answers_everything_with_shutdown() -> None:
    store = ParamStore()
    store.handle(PublishParams(0, 0, WEIGHTS))
    assert isinstance(store.handle(Shutdown("done")), Shutdown)
    assert store.stopping
    for msg in (ParamsRequest(-1), PublishParams(1, 0, WEIGHTS), StatsRequest()):
        assert isinstance(store.handle(msg), Shutdown)
    assert store.version == 0  # the publish after the shutdown was not taken


def test_param_store_stats_request() -> None:
    store = ParamStore()
    store.handle(PublishParams(2, 0, WEIGHTS))
    store.handle(ParamsRequest(-1))
    assert store.handle(StatsRequest()) == Stats(
        "params",
        {
            "params/version": 2.0,
            "params/num_served": 1.0,
            "params/num_served_shm": 0.0,
            "params/rejected_messages": 0.0,
        },
    )


@pytest.mark.parametrize(
    "msg",
    [
        SampleRequest(TABLE, 2),
        Params(0, {"w": np.zeros(1, np.float32)}),
        InsertAck(TABLE, 1, 1),
        make_chunk(0, [1.0]),
    ],
)
def test_param_store_rejects_unexpected_kinds(msg) -> None:
    store = ParamStore()
    reply = store.handle(msg)
    assert isinstance(reply, Error)
    assert f"does not accept {type(msg).__name__}" in reply.reason
    assert store.stats()["params/rejected_messages"] == 1.0
    assert store.version == -1

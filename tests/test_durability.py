"""Replay's durability and item accounting: no acknowledged chunk is lost, none is stored twice,
and the counts add up.

Unit level: the chunk log's records round-trip; a record cut short at a segment's end is ignored
and a corrupt one refused (its segment set aside) without ending anything; a snapshot deletes the
segments it holds; a ``ReplayService`` that "dies" (no final snapshot) and a fresh one on the same
run directory get back, from snapshot plus log, exactly the items that were acknowledged; a FIFO
queue's deliveries are replayed too, and so are the learners' priority updates, those written by
then (``replay.priority_log_period_s``); a chunk sent again is acknowledged without being stored
twice; without durability the ack ledger counts what a restart lost. Process level: a real replay
server receiving a stream of chunks from the actors' ``ReplayClient`` is SIGKILLed mid-stream and
started again on the same run directory; the client sends its unacknowledged chunk again, every
acknowledged chunk is there exactly once, and ``replay/items_lost`` is 0.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from pathlib import Path

import builders
import numpy as np
import pytest
import zmq
from conftest import (
    CONFIG,
    REPO,
    SMALL_OVERRIDES,
    Processes,
    free_addr,
    request,
    run_launcher,
    server_stats,
    set_args,
    wait_for_server,
    wait_until,
)

from apexrl.clients.peers import Link, Peer
from apexrl.clients.replay import ReplayClient
from apexrl.config import Config, ConfigError
from apexrl.replay.accounting import INCARNATIONS_PER_ACTOR, StoredChunks
from apexrl.replay.chunk_log import (
    CHUNK,
    DELIVERY,
    LOG_DIR,
    PRIORITIES,
    SAMPLED,
    SEGMENT,
    ChunkLog,
    read_records,
    segment_first_key,
    segment_name,
    segment_numbers,
)
from apexrl.replay.persistence import (
    commit_stored,
    note_snapshot,
    open_chunk_log,
    open_snapshots,
    start_snapshot,
)
from apexrl.replay.service import ReplayService
from apexrl.replay.snapshot import SNAPSHOT_FILE, read_snapshot
from apexrl.runtime import rundir
from apexrl.transport.codec import decode, encode
from apexrl.transport.messages import (
    ActorReport,
    InsertAck,
    PriorityUpdate,
    SampleBatch,
    SampleRequest,
    TrajectoryChunk,
)

ACTOR = b"actor"
CHUNK_ITEMS = 16  # actor.chunk_steps 8 * env.num_envs 2: what one actor chunk may carry
INCARNATION = 7


def make_cfg(run_dir: Path, *overrides: str) -> Config:
    cfg = builders.config(
        f"run.dir={run_dir}",
        "replay.capacity=4000",
        "replay.samples_per_insert=0",  # no learner here: nothing holds inserts back
        "replay.min_size_to_sample=16",
        *overrides,
        small=True,
    )
    cfg.validate()
    return cfg


def chunk(cfg: Config, number: int) -> TrajectoryChunk:
    """Chunk ``number`` of one actor incarnation: its items' rewards are
    ``number * CHUNK_ITEMS + 0 .. 15``, so a table's contents name the chunks it holds."""
    return builders.chunk(
        cfg,
        [1.0] * CHUNK_ITEMS,
        first_key=number * CHUNK_ITEMS,
        env_steps=CHUNK_ITEMS,
        incarnation=INCARNATION,
        sequence=number,
        weights_version=-1,
    )


class Server:
    """A ``ReplayService`` started as ``main`` starts it (snapshot, then chunk log), fed as its
    loop feeds it (handle, drain, commit before the acks)."""

    def __init__(self, cfg: Config) -> None:
        self.service = ReplayService(cfg)
        self.snapshots, segment = open_snapshots(self.service)
        self.ledger = open_chunk_log(self.service, segment)

    def send(self, msg, identity: bytes = ACTOR) -> list:
        frames = encode(msg) if isinstance(msg, TrajectoryChunk) else None
        replies = self.service.handle(identity, msg, frames) + self.service.drain()
        commit_stored(self.service, self.ledger)
        return replies

    def snapshot(self) -> None:
        """A snapshot written whole (as the background thread would), its log segments gone."""
        service, writer = self.service, self.snapshots.writer
        snap = start_snapshot(service, self.snapshots)
        result = writer.write_now(snap, service.progress(), service.table.size)
        note_snapshot(service, self.snapshots, result)

    def die(self) -> None:
        """What a SIGKILL leaves: no final snapshot; the files as written."""
        if self.service.chunk_log is not None:
            self.service.chunk_log.close()
        self.ledger.close()


def stored_rewards(service: ReplayService) -> np.ndarray:
    """The first reward element of every stored item, oldest first (a snapshot's copy)."""
    return service.export_snapshot().arrays["field/reward"].reshape(-1)


def assert_counts_add_up(stats: dict[str, float]) -> None:
    """The identities of ``replay/accounting.py``."""
    item = {k[len("replay/items_") :]: v for k, v in stats.items() if k.startswith("replay/items_")}
    held_in = item["stored"] + item["duplicates"] + item["refused"] + item["held"]
    assert item["received"] == held_in, item
    gone = item["evicted_capacity"] + item["evicted_for_frames"] + item["consumed"]
    assert item["stored"] == item["size"] + gone, item


# --- the log's records --------------------------------------------------------------------------


def write_log(directory: Path, cfg: Config, numbers: range) -> list[TrajectoryChunk]:
    log = ChunkLog(directory, fsync=False)
    chunks = [chunk(cfg, n) for n in numbers]
    for c in chunks:
        log.append_chunk(encode(c))
    log.append_delivery(32)
    assert log.commit() > 0
    log.close()
    return chunks


def test_records_round_trip_through_a_segment(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    chunks = write_log(tmp_path, cfg, range(3))
    records = list(read_records(tmp_path, 0))
    assert [r.kind for r in records] == [SEGMENT, CHUNK, CHUNK, CHUNK, DELIVERY]
    assert records[0].first_key == 0  # the key its first chunk's first item got
    assert segment_first_key(tmp_path / segment_name(0)) == 0
    records = records[1:]
    for record, sent in zip(records, chunks, strict=False):
        got = decode(record.frames)
        assert (got.sequence, got.incarnation) == (sent.sequence, INCARNATION)
        np.testing.assert_array_equal(got.fields["reward"], sent.fields["reward"])
    assert records[-1].num_delivered == 32
    assert segment_numbers(tmp_path) == [0]


def test_a_record_cut_short_is_ignored_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_log(tmp_path, make_cfg(tmp_path), range(3))
    path = tmp_path / segment_name(0)
    data = path.read_bytes()
    path.write_bytes(data[:-20])  # the delivery record, killed mid-write
    with caplog.at_level(logging.WARNING):
        kinds = [r.kind for r in read_records(tmp_path, 0)]
    assert kinds == [SEGMENT, CHUNK, CHUNK, CHUNK]
    assert "cut short" in caplog.text
    path.write_bytes(data[: len(data) // 2])  # inside the second chunk's record
    assert len(list(read_records(tmp_path, 0))) == 2  # the segment's record and the first chunk


def test_a_corrupt_record_is_refused_and_its_segment_set_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = make_cfg(tmp_path)
    write_log(tmp_path, cfg, range(3))
    path = tmp_path / segment_name(0)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the second chunk's record: its CRC fails
    path.write_bytes(bytes(data))
    write_log(tmp_path, cfg, range(3, 4))  # a later segment is still read
    with caplog.at_level(logging.ERROR):
        records = list(read_records(tmp_path, 0))
    assert [decode(r.frames).sequence for r in records if r.kind == CHUNK] == [0, 3]
    assert "refused the rest of the chunk log segment" in caplog.text
    assert not path.exists() and len(list(tmp_path.glob("refused-*"))) == 1


def test_garbage_in_the_log_never_ends_a_server(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    log_dir = rundir.replay_snapshot_dir(tmp_path) / LOG_DIR
    log_dir.mkdir(parents=True)
    (log_dir / segment_name(0)).write_bytes(np.random.default_rng(0).bytes(5000))
    log = ChunkLog(log_dir, fsync=False, first_segment=1)
    log.append_chunk([b"not a message"])  # a whole record that does not decode
    log.append_chunk(encode(chunk(cfg, 0)))
    log.commit()
    log.close()
    server = Server(cfg)
    assert server.service.table.size == CHUNK_ITEMS  # the one good chunk
    assert server.service.counts.recovered == CHUNK_ITEMS


# --- restarts: snapshot + log -------------------------------------------------------------------


def test_a_restart_brings_back_every_acknowledged_chunk_from_snapshot_and_log(
    tmp_path: Path,
) -> None:
    cfg = make_cfg(tmp_path)
    first = Server(cfg)
    acks = [r for n in range(5) for r in first.send(chunk(cfg, n))]
    first.snapshot()  # chunks 0..4: their items stay in the log, the snapshot holds the rest
    log_dir = rundir.replay_snapshot_dir(tmp_path) / LOG_DIR
    assert segment_numbers(log_dir) == [0]
    snap = read_snapshot(rundir.replay_snapshot_dir(tmp_path) / SNAPSHOT_FILE)
    assert snap.meta["items_in_log"] and set(snap.arrays) == {"priorities"}
    acks += [r for n in range(5, 8) for r in first.send(chunk(cfg, n))]  # only in the log
    assert [r.message.sequence for r in acks] == list(range(8))
    assert all(isinstance(r.message, InsertAck) for r in acks)
    before = first.service.stats()
    first.die()

    second = Server(cfg)
    service = second.service
    np.testing.assert_array_equal(stored_rewards(service), np.arange(8 * CHUNK_ITEMS))
    assert service.table.num_inserted == 8 * CHUNK_ITEMS  # the same keys
    stats = service.stats()
    assert stats["replay/items_lost"] == 0
    assert stats["replay/items_recovered"] == 3 * CHUNK_ITEMS
    assert stats["replay/env_steps"] == before["replay/env_steps"]
    assert_counts_add_up(stats)
    # The actor sends its last chunk again (its ack was lost): acknowledged, not stored twice.
    again = second.send(chunk(cfg, 7))
    assert again[0].message == InsertAck(cfg.replay.table, 0, 8 * CHUNK_ITEMS, 7)
    assert service.counts.duplicates == CHUNK_ITEMS and service.table.size == 8 * CHUNK_ITEMS
    assert_counts_add_up(service.stats())
    second.die()


def test_a_restart_of_a_fifo_queue_replays_its_deliveries(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, "replay.kind=fifo", "replay.min_size_to_sample=1")
    first = Server(cfg)
    for n in range(4):
        first.send(chunk(cfg, n))
    first.snapshot()
    first.send(chunk(cfg, 4))
    batch = first.send(SampleRequest(cfg.replay.table, 24), identity=b"learner")
    assert isinstance(batch[0].message, SampleBatch)
    first.die()
    second = Server(cfg)
    # Delivered items stay delivered: the queue holds keys 24..79, as before the kill.
    np.testing.assert_array_equal(stored_rewards(second.service), np.arange(24, 5 * CHUNK_ITEMS))
    assert second.service.counts.consumed == 24
    assert_counts_add_up(second.service.stats())
    second.die()


def priorities_of(service: ReplayService) -> np.ndarray:
    """The stored items' sum-tree values, oldest first (what sampling is drawn from)."""
    return service.export_snapshot().arrays["priorities"]


def test_a_restart_brings_back_the_learners_priorities_up_to_the_flush_period(
    tmp_path: Path,
) -> None:
    cfg = make_cfg(tmp_path, "replay.priority_log_period_s=0")
    first = Server(cfg)
    for n in range(3):
        first.send(chunk(cfg, n))
    first.snapshot()  # chunks 0..2 with their inserts' priorities
    for n in range(3, 6):
        first.send(chunk(cfg, n))  # in the log only
    keys = np.arange(0, 6 * CHUNK_ITEMS, 3, dtype=np.int64)  # items before and after it
    update = PriorityUpdate(cfg.replay.table, 0, keys, np.linspace(0.5, 9.0, len(keys)))
    first.send(update, identity=b"learner")
    again = PriorityUpdate(cfg.replay.table, 0, keys[:4], np.full(4, 20.0))  # the last one wins
    first.send(again, identity=b"learner")
    before = priorities_of(first.service)
    assert not np.allclose(before[keys[:4]], before[1:5])  # the updates changed something
    first.die()
    second = Server(cfg)
    np.testing.assert_array_equal(priorities_of(second.service), before)
    records = list(read_records(rundir.replay_snapshot_dir(tmp_path) / LOG_DIR, 0))
    assert [r.kind for r in records].count(PRIORITIES) == 2
    second.die()


def test_a_restart_keeps_the_samples_taken_since_the_snapshot_against_the_inserts(
    tmp_path: Path,
) -> None:
    """The learners' samples after the snapshot are logged with the priorities: a restarted
    server's rate limiter does not count them again as owed (which held every actor back until
    the learners had sampled that much once more)."""
    cfg = make_cfg(tmp_path, "replay.priority_log_period_s=0", "replay.samples_per_insert=2")
    first = Server(cfg)
    for n in range(4):
        first.send(chunk(cfg, n))
    first.snapshot()
    for _ in range(5):  # 80 items sampled after the snapshot
        reply = first.send(SampleRequest(cfg.replay.table, 16), identity=b"learner")
        assert isinstance(reply[0].message, SampleBatch)
    counts = (first.service.limiter.num_sampled, first.service.table.num_sampled)
    assert counts == (80, 80)
    first.die()
    second = Server(cfg)
    assert (second.service.limiter.num_sampled, second.service.table.num_sampled) == counts
    records = list(read_records(rundir.replay_snapshot_dir(tmp_path) / LOG_DIR, 0))
    # period 0: one record a pass of the server loop that sampled
    assert [r.sampled for r in records if r.kind == SAMPLED] == [
        (16 * k, 16 * k) for k in (1, 2, 3, 4, 5)
    ]
    second.die()


def test_priority_updates_wait_for_their_period_and_a_kill_loses_only_those(
    tmp_path: Path,
) -> None:
    cfg = make_cfg(tmp_path, "replay.priority_log_period_s=3600")
    first = Server(cfg)
    for n in range(2):
        first.send(chunk(cfg, n))
    inserted = priorities_of(first.service)
    keys = np.arange(0, 2 * CHUNK_ITEMS, dtype=np.int64)
    first.send(PriorityUpdate(cfg.replay.table, 0, keys, np.full(len(keys), 7.0)), b"learner")
    assert not np.array_equal(priorities_of(first.service), inserted)
    first.die()  # within the hour: the update was never written
    second = Server(cfg)
    np.testing.assert_array_equal(priorities_of(second.service), inserted)
    log_dir = rundir.replay_snapshot_dir(tmp_path) / LOG_DIR
    assert PRIORITIES not in [r.kind for r in read_records(log_dir, 0)]
    second.die()


def test_without_durability_a_restart_counts_what_it_lost(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, "replay.durable=false")
    first = Server(cfg)
    for n in range(3):
        first.send(chunk(cfg, n))
    first.snapshot()
    first.send(chunk(cfg, 3))  # acknowledged, then the server is killed before a snapshot
    first.die()
    second = Server(cfg)
    assert second.service.table.size == 3 * CHUNK_ITEMS
    assert second.service.stats()["replay/items_lost"] == CHUNK_ITEMS
    second.die()
    third = Server(cfg)  # the count survives another restart
    assert third.service.counts.lost == CHUNK_ITEMS
    third.die()


def test_a_copy_sent_while_the_first_is_held_is_stored_once(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, "replay.samples_per_insert=1", "replay.min_size_to_sample=16")
    server = Server(cfg)
    held = 0
    while server.send(chunk(cfg, held)):  # acknowledged at once until the rate limiter holds one
        held += 1
        assert held < 10
    copy = server.send(chunk(cfg, held), identity=b"fresh socket")  # sent again: both held
    assert copy == [] and server.service.stats()["replay/items_held"] == 2 * CHUNK_ITEMS
    acks = []
    for _ in range(3):  # samples make room for the held chunks, one after the other
        replies = server.send(SampleRequest(cfg.replay.table, 16), identity=b"learner")
        acks += [r for r in replies if isinstance(r.message, InsertAck)]
    assert [(r.identity, r.message.num_inserted) for r in acks] == [
        (ACTOR, CHUNK_ITEMS),
        (b"fresh socket", 0),
    ]
    assert server.service.table.num_inserted == (held + 1) * CHUNK_ITEMS
    assert_counts_add_up(server.service.stats())
    server.die()


def test_snapshots_bound_the_log_to_the_segments_of_stored_items(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, f"replay.capacity={6 * CHUNK_ITEMS}")  # six chunks
    server = Server(cfg)
    log_dir = rundir.replay_snapshot_dir(tmp_path) / LOG_DIR
    kept = []
    for round_ in range(5):
        for n in range(4):
            server.send(chunk(cfg, 4 * round_ + n))
        server.snapshot()
        kept.append(segment_numbers(log_dir))
    # Four chunks a segment, six stored: the segments of the last two rounds stay, the rest go
    # once a snapshot is on disk.
    assert kept == [[0], [0, 1], [1, 2], [2, 3], [3, 4]]
    server.die()
    snap = read_snapshot(rundir.replay_snapshot_dir(tmp_path) / SNAPSHOT_FILE)
    assert snap.meta["items"]["stored"] == 20 * CHUNK_ITEMS and snap.meta["items_in_log"]
    again = Server(cfg)  # the last six chunks, from the two segments left
    np.testing.assert_array_equal(
        stored_rewards(again.service), np.arange(14 * CHUNK_ITEMS, 20 * CHUNK_ITEMS)
    )
    assert again.service.table.num_inserted == 20 * CHUNK_ITEMS
    assert again.service.stats()["replay/items_lost"] == 0
    again.die()


def test_a_snapshot_holds_its_items_whole_until_the_log_holds_them_all(tmp_path: Path) -> None:
    capacity = f"replay.capacity={6 * CHUNK_ITEMS}"
    first = Server(make_cfg(tmp_path, capacity, "replay.durable=false"))
    for n in range(4):
        first.send(chunk(make_cfg(tmp_path), n))
    first.snapshot()  # chunks 0..3, whole: there is no log
    first.die()
    cfg = make_cfg(tmp_path, capacity)  # durable from here on: the log begins at chunk 4
    second = Server(cfg)
    second.send(chunk(cfg, 4))
    second.snapshot()
    snap = read_snapshot(rundir.replay_snapshot_dir(tmp_path) / SNAPSHOT_FILE)
    assert not snap.meta["items_in_log"] and "field/reward" in snap.arrays  # chunks 0..3 too
    for n in range(5, 11):  # chunks 0..4 evicted: the log holds every stored item
        second.send(chunk(cfg, n))
    second.snapshot()
    snap = read_snapshot(rundir.replay_snapshot_dir(tmp_path) / SNAPSHOT_FILE)
    assert snap.meta["items_in_log"] and set(snap.arrays) == {"priorities"}
    second.die()
    third = Server(cfg)
    np.testing.assert_array_equal(
        stored_rewards(third.service), np.arange(5 * CHUNK_ITEMS, 11 * CHUNK_ITEMS)
    )
    assert third.service.stats()["replay/items_lost"] == 0
    third.die()


def test_a_snapshot_after_a_segment_that_never_held_a_record_still_finds_its_items(
    tmp_path: Path,
) -> None:
    cfg = make_cfg(tmp_path)
    first = Server(cfg)
    for n in range(2):
        first.send(chunk(cfg, n))
    first.snapshot()
    first.snapshot()  # nothing between the two: segment 1 was begun and never written
    first.send(chunk(cfg, 2))
    first.snapshot()
    first.send(chunk(cfg, 3))
    first.die()
    log_dir = rundir.replay_snapshot_dir(tmp_path) / LOG_DIR
    assert segment_numbers(log_dir) == [0, 2, 3]
    second = Server(cfg)  # the items of segments 0 and 2, then segment 3 read back
    np.testing.assert_array_equal(stored_rewards(second.service), np.arange(4 * CHUNK_ITEMS))
    assert second.service.stats()["replay/items_lost"] == 0
    second.send(chunk(cfg, 4))
    second.snapshot()  # the log still holds every item: the snapshot leaves them there
    snap = read_snapshot(rundir.replay_snapshot_dir(tmp_path) / SNAPSHOT_FILE)
    assert snap.meta["items_in_log"]
    assert segment_numbers(log_dir)[:2] == [0, 2]  # their items are stored: they stay
    second.die()
    third = Server(cfg)
    np.testing.assert_array_equal(stored_rewards(third.service), np.arange(5 * CHUNK_ITEMS))
    third.die()


def test_a_snapshot_whose_log_is_gone_is_refused_and_the_log_read_as_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = make_cfg(tmp_path)
    first = Server(cfg)
    for n in range(3):
        first.send(chunk(cfg, n))
    first.snapshot()
    first.send(chunk(cfg, 3))
    first.die()
    log_dir = rundir.replay_snapshot_dir(tmp_path) / LOG_DIR
    (log_dir / segment_name(0)).unlink()  # the segment holding chunks 0..2
    with caplog.at_level(logging.INFO):
        second = Server(cfg)
    assert "does not hold its items" in caplog.text and "refused the replay snapshot" in caplog.text
    np.testing.assert_array_equal(
        stored_rewards(second.service), np.arange(3 * CHUNK_ITEMS, 4 * CHUNK_ITEMS)
    )
    assert second.service.stats()["replay/items_lost"] == 3 * CHUNK_ITEMS  # said, not hidden
    second.die()


def test_chunk_numbers_are_kept_per_actor_and_recent_incarnation() -> None:
    chunks = StoredChunks()
    chunks.add(0, 11, 5)
    assert chunks.stored(0, 11, 5) and chunks.stored(0, 11, 0)
    assert not chunks.stored(0, 11, 6)  # the next chunk
    assert not chunks.stored(0, 12, 0) and not chunks.stored(1, 11, 0)  # another process or id
    for incarnation in range(12, 12 + INCARNATIONS_PER_ACTOR):
        chunks.add(0, incarnation, 0)
    assert not chunks.stored(0, 11, 5)  # the oldest incarnation is forgotten
    rows = chunks.export()
    assert StoredChunks.restore(rows + [[3, 1, 1]], num_actors=2).export() == rows


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (("replay.snapshot_interval_s=0",), "replay.durable needs replay snapshots"),
        (("replay.durable=false", "replay.log_fsync=true"), "replay.log_fsync needs"),
    ],
)
def test_durability_settings_that_cannot_work_are_refused(
    tmp_path: Path, overrides: tuple[str, ...], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        make_cfg(tmp_path, *overrides)


# --- a real replay server, killed mid-stream ----------------------------------------------------


def replay_args(run_dir: Path, addr: str, *overrides: str) -> list[str]:
    args = ["replay", "--config", str(CONFIG), "--run-dir", str(run_dir), "--bind", addr]
    return [*args, *set_args([*SMALL_OVERRIDES, *overrides])]


class Stream:
    """The actors' ``ReplayClient`` sending chunks 0, 1, 2, ... in a thread, one in flight,
    sending again what replay did not answer; ``acked`` is how many were acknowledged."""

    def __init__(self, cfg: Config, addr: str) -> None:
        self.cfg, self.ctx, self.stop = cfg, zmq.Context(), threading.Event()
        self.client = ReplayClient(Link(self.ctx, Peer("replay server", addr)), self.stop, 2.0, 30)
        self.pause = threading.Event()
        self.idle = threading.Event()  # the thread has seen the pause: it sends nothing more
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    @property
    def acked(self) -> int:
        return self.sent - int(self.client.awaiting_ack)

    def _run(self) -> None:
        # An actor reports as it starts sending (replay's Stats then show its progress).
        self.client.report(report(self.cfg))
        while not self.stop.is_set():
            if self.pause.is_set():
                self.idle.set()
                self.client.poll(timeout_ms=20)
                continue
            self.client.send_chunk(chunk(self.cfg, self.sent))  # after the previous one's ack
            if not self.stop.is_set():  # a stop can end the wait for that ack: nothing sent
                self.sent += 1
            time.sleep(0.002)  # about 300 chunks a second: the table never fills

    def finish(self, timeout_s: float) -> None:
        """Stop sending and wait for the last chunk's ack (once the thread has seen the pause:
        a chunk it was about to send when the pause came is counted, then acknowledged)."""
        self.pause.set()
        assert wait_until(self.idle.is_set, timeout_s), "the sending thread did not pause"
        assert wait_until(lambda: not self.client.awaiting_ack, timeout_s), "no last ack"
        self.stop.set()
        self.thread.join(10.0)
        self.client.link.close()
        self.ctx.term()


def report(cfg: Config) -> ActorReport:
    empty = np.zeros(0)
    return ActorReport(0, INCARNATION, False, 0, -1, empty, empty.astype(np.int64))


def test_a_killed_replay_server_loses_no_acknowledged_chunk(
    procs: Processes, tmp_path: Path
) -> None:
    addr, run_dir = free_addr(), tmp_path / "run"
    overrides = (
        "replay.capacity=200000",
        "replay.samples_per_insert=0",
        "replay.snapshot_interval_s=1.5",
    )
    cfg = make_cfg(run_dir, *overrides)
    first = procs.start("replay", *replay_args(run_dir, addr, *overrides))
    wait_for_server(first, addr)
    stream = Stream(cfg, addr)
    stream.thread.start()
    try:
        assert wait_until(
            lambda: (server_stats(addr) or {}).get("replay/snapshot_items", 0) > 0, 20.0
        ), first.tail()
        sent_before = stream.sent
        assert wait_until(lambda: stream.sent > sent_before + 20, 20.0)  # some only in the log
        first.popen.send_signal(signal.SIGKILL)
        assert first.wait(10.0) == -signal.SIGKILL
        acked_before_kill = stream.acked
        second = procs.start("replay-again", *replay_args(run_dir, addr, *overrides))
        stats = wait_for_server(second, addr)
        assert "read back from the chunk log" in second.log(), second.tail()
        assert stats["replay/items_lost"] == 0, stats
        assert stats["replay/items_recovered"] > 0, stats
        assert stats["replay/size"] >= acked_before_kill * CHUNK_ITEMS, (stats, acked_before_kill)
        assert wait_until(lambda: stream.acked > acked_before_kill + 10, 20.0), second.tail()
        stream.finish(20.0)
    finally:
        stream.stop.set()
    stats = server_stats(addr)
    assert stats["replay/items_lost"] == 0
    assert_counts_add_up(stats)
    sent = stream.sent
    assert stats["replay/size"] == sent * CHUNK_ITEMS, (stats, sent)  # each chunk once
    code, _ = second.stop(15.0)
    assert code == 0, second.tail()
    third = Server(cfg)  # the final snapshot and the log it leaves
    rewards = stored_rewards(third.service)
    np.testing.assert_array_equal(rewards, np.arange(sent * CHUNK_ITEMS))  # in order, once
    third.die()
    print(
        f"\nreplay killed after {acked_before_kill} acknowledged chunks: all back "
        f"({int(stats['replay/items_recovered'])} items from the log), "
        f"{int(stats['replay/items_duplicates'])} duplicate items, {sent} chunks in all"
    )


def test_a_sigkilled_replay_server_comes_back_with_the_learners_priorities(
    procs: Processes, tmp_path: Path
) -> None:
    addr, run_dir = free_addr(), tmp_path / "run"
    period_s = 0.2
    overrides = (
        "replay.capacity=4000",
        "replay.samples_per_insert=0",
        "replay.snapshot_interval_s=3600",  # the inserts and the updates are in the log only
        f"replay.priority_log_period_s={period_s}",
    )
    cfg = make_cfg(run_dir, *overrides)
    first = procs.start("replay", *replay_args(run_dir, addr, *overrides))
    wait_for_server(first, addr)
    for n in range(4):
        assert isinstance(request(addr, chunk(cfg, n)), InsertAck), first.tail()
    keys = np.arange(0, 4 * CHUNK_ITEMS, 3, dtype=np.int64)
    values = np.linspace(0.5, 30.0, len(keys))
    update = PriorityUpdate(cfg.replay.table, 0, keys, values)
    reply = request(addr, update, timeout_s=0.5)  # answered by nothing: priorities go one way
    assert reply is None, reply

    def applied() -> bool:  # replay/priority_updates counts the items updated
        return (server_stats(addr) or {}).get("replay/priority_updates", 0) == len(keys)

    assert wait_until(applied, 10.0), first.tail()
    time.sleep(5 * period_s)  # past the flush period: the update's record is written
    first.popen.send_signal(signal.SIGKILL)
    assert first.wait(10.0) == -signal.SIGKILL

    second = procs.start("replay-again", *replay_args(run_dir, addr, *overrides))
    stats = wait_for_server(second, addr)
    assert stats["replay/size"] == 4 * CHUNK_ITEMS and stats["replay/items_lost"] == 0, stats
    code, _ = second.stop(15.0)  # a clean stop writes the snapshot the priorities are read from
    assert code == 0, second.tail()
    snap = read_snapshot(rundir.replay_snapshot_dir(run_dir) / SNAPSHOT_FILE)
    stored = snap.arrays["priorities"]
    alpha = cfg.replay.priority_exponent
    np.testing.assert_allclose(stored[keys], values**alpha, rtol=1e-6)
    others = np.setdiff1d(np.arange(4 * CHUNK_ITEMS), keys)
    np.testing.assert_allclose(stored[others], 1.0**alpha)  # the inserts' priority
    print(f"\nreplay SIGKILLed {5 * period_s:.1f} s after a priority update: all {len(keys)} back")


# --- the accounting of a real run ---------------------------------------------------------------


def test_a_ppo_run_reports_item_counts_that_add_up(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    overrides = (
        "algo.hidden_sizes=[32]",
        "algo.unroll_length=16",
        "env.num_envs=2",
        "replay.capacity=64",
        "replay.min_size_to_sample=2",
        "learner.batch_size=2",
        "learner.publish_period=1",
        "learner.report_interval_s=1",
        "run.stop_env_steps=3000",
        "run.stop_eval_return=null",
    )
    args = ["--config", str(REPO / "configs" / "ppo_cartpole.yaml"), "--actors", "2"]
    args += ["--run-dir", str(run_dir), "--no-eval", *set_args(list(overrides))]
    code, output = run_launcher(args, timeout_s=180.0)
    assert code == 0, output[-3000:]
    records = [json.loads(line) for line in rundir.result_path(run_dir).read_text().splitlines()]
    items = records[-1]["replay_items"]
    assert (
        items["received"]
        == items["stored"] + items["duplicates"] + items["refused"] + (items["held"])
    ), items
    gone = items["evicted_capacity"] + items["evicted_for_frames"] + items["consumed"]
    assert items["stored"] == items["size"] + gone, items
    assert items["lost"] == 0 and items["stale_dropped"] <= items["consumed"], items
    assert items["stored"] > 0, items
    print(f"\nPPO run, replay's items at its end: {items}")

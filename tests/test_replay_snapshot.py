"""Replay snapshots: a replay server's table, keys and counters survive a restart.

Unit level, a ``ReplayService`` fed through its message handlers round-trips through a snapshot
file exactly (prioritized table and FIFO queue); a corrupt or mismatched snapshot is refused and
the server starts empty; an interrupted write never replaces a good snapshot. Process level, a
real replay server is SIGKILLed and started again on the same run directory and address.
"""

from __future__ import annotations

import io
import json
import logging
import signal
import struct
import zipfile
from pathlib import Path

import builders
import numpy as np
import pytest
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
    wait_until,
)

from apexrl.config import Config, ConfigError
from apexrl.replay import snapshot as snapshot_module
from apexrl.replay.persistence import restore_snapshot
from apexrl.replay.service import ReplayService
from apexrl.replay.snapshot import (
    SNAPSHOT_FILE,
    SnapshotError,
    read_snapshot,
    write_snapshot,
)
from apexrl.runtime import rundir
from apexrl.transport.messages import (
    ActorReport,
    InsertAck,
    PriorityUpdate,
    SampleBatch,
    SampleRequest,
    Shutdown,
    TrajectoryChunk,
)

CHUNK_ITEMS = 16  # actor.chunk_steps 8 * env.num_envs 2: what one actor chunk may carry
# Alpha 1 makes P(i) = p_i / sum_k p_k, easy to check by hand.
PRIORITIZED = (
    "replay.capacity=64",
    "replay.min_size_to_sample=32",
    "replay.priority_exponent=1.0",
)
FIFO = (
    "replay.kind=fifo",
    "replay.capacity=64",
    "replay.min_size_to_sample=32",
    "replay.max_times_sampled=2",
    "replay.samples_per_insert=2",
)


def make_cfg(*overrides: str, path: Path = CONFIG) -> Config:
    cfg = builders.config(*overrides, path=path, small=True)
    cfg.validate()
    return cfg


def chunk(first_key: int, num_items: int = CHUNK_ITEMS, priority: float = 1.0) -> TrajectoryChunk:
    """A valid CartPole Ape-X chunk whose item with key ``k`` has ``obs[0] == k`` (keys count
    items in insertion order from 0, so ``first_key`` is the number of items inserted before)."""
    keys = np.arange(first_key, first_key + num_items)
    obs = np.stack([keys, -keys, keys % 7, np.ones_like(keys)], axis=1).astype(np.float32)
    return builders.chunk(  # actions key % 2, num_steps n_step = 3
        make_cfg(),
        np.full(num_items, priority) + (keys % 4),
        first_key=first_key,
        env_steps=num_items,
        obs=obs,
        reward=(keys % 3).astype(np.float32),
        terminated=keys % 5 == 0,
        truncated=keys % 11 == 0,
        next_obs=obs + 0.5,
    )


def insert(service: ReplayService, first_key: int, num_chunks: int) -> None:
    for i in range(num_chunks):
        assert service.handle(b"actor", chunk(first_key + i * CHUNK_ITEMS)) == []
        replies = service.drain()
        assert [type(r.message) for r in replies] == [InsertAck], replies


def sample(service: ReplayService, batch_size: int = 32) -> SampleBatch:
    assert service.handle(b"learner", SampleRequest("apex_dqn", batch_size)) == []
    (reply,) = service.drain()
    assert isinstance(reply.message, SampleBatch), reply.message
    return reply.message


def report(service: ReplayService, returns: list[float], is_eval: bool = False) -> None:
    msg = ActorReport(0, 1, is_eval, 100, 0, np.array(returns), np.full(len(returns), 10, np.int64))
    assert service.handle(b"actor", msg) == []


def used_service(*overrides: str) -> ReplayService:
    """A service after inserts past its capacity (keys wrap around the slots), samples, priority
    updates and episode reports, all through its message handlers."""
    service = ReplayService(make_cfg(*overrides), seed=3)
    insert(service, 0, 5)  # 80 items into 64 slots: keys 16..79 stay
    sample(service)
    if service.cfg.replay.kind == "prioritized":
        update = PriorityUpdate(
            "apex_dqn", 0, np.array([20, 21, 3], np.int64), np.array([9.0, 0.5, 4.0])
        )
        assert service.handle(b"learner", update) == []
    report(service, [10.0, 20.0])
    report(service, [475.0], is_eval=True)
    return service


def round_trip(service: ReplayService, tmp_path: Path) -> ReplayService:
    write_snapshot(tmp_path, service.export_snapshot())
    restored = ReplayService(service.cfg, seed=3)
    restored.load_snapshot(read_snapshot(tmp_path / SNAPSHOT_FILE))
    return restored


def stored_state(service: ReplayService) -> dict[str, np.ndarray]:
    arrays, scalars = service.table.export_state()
    return {**arrays, **{k: np.array(v) for k, v in scalars.items()}}


def assert_same_state(a: ReplayService, b: ReplayService) -> None:
    state_a, state_b = stored_state(a), stored_state(b)
    assert state_a.keys() == state_b.keys()
    for name in state_a:
        assert state_a[name].dtype == state_b[name].dtype, name
        np.testing.assert_array_equal(state_a[name], state_b[name], err_msg=name)
    stats_a, stats_b = a.stats(), b.stats()
    for name in ("replay/active_actors",):  # not part of a snapshot: who is connected now
        stats_a.pop(name), stats_b.pop(name)
    np.testing.assert_equal(stats_a, stats_b)  # NaN (no returns yet) equals NaN here
    assert (a.limiter.num_inserted, a.limiter.num_sampled) == (
        b.limiter.num_inserted,
        b.limiter.num_sampled,
    )
    assert list(a.run.train_returns) == list(b.run.train_returns)
    assert list(a.run.eval_returns) == list(b.run.eval_returns)


# --- round trips --------------------------------------------------------------------------------


def test_prioritized_service_round_trips_exactly(tmp_path: Path) -> None:
    service = used_service(*PRIORITIZED)
    restored = round_trip(service, tmp_path)
    assert_same_state(service, restored)
    assert restored.table.size == 64 and restored.table.num_inserted == 80
    assert restored.run.env_steps == 5 * CHUNK_ITEMS
    assert list(restored.run.train_returns) == [10.0, 20.0]
    assert list(restored.run.eval_returns) == [475.0]
    # The stored items are keys 16..79, oldest first, each with obs[0] == its key.
    arrays, _ = restored.table.export_state()
    np.testing.assert_array_equal(arrays["field/obs"][:, 0], np.arange(16, 80))
    # Raw priorities: 1 + key % 4, but key 20 was updated to 9 and key 21 to 0.5 (key 3 was gone).
    expected = 1.0 + np.arange(16, 80) % 4
    expected[20 - 16], expected[21 - 16] = 9.0, 0.5
    np.testing.assert_array_equal(arrays["priorities"], expected)
    # Same seed, same table: the same draws with the same probabilities, P(i) = p_i / sum p.
    batch, again = sample(service), sample(restored)
    np.testing.assert_array_equal(batch.keys, again.keys)
    np.testing.assert_array_equal(batch.probabilities, again.probabilities)
    np.testing.assert_array_equal(again.fields["obs"][:, 0], again.keys)
    np.testing.assert_allclose(
        again.probabilities, expected[again.keys - 16] / expected.sum(), rtol=1e-12
    )
    # Keys continue: a priority update for an item stored before the snapshot finds it.
    for s in (service, restored):
        update = PriorityUpdate("apex_dqn", 0, np.array([79], np.int64), np.array([100.0]))
        s.handle(b"learner", update)
    assert_same_state(service, restored)
    insert(restored, 80, 1)
    assert restored.table.num_inserted == 96  # the next chunk gets keys 80..95


def test_fifo_service_round_trips_exactly(tmp_path: Path) -> None:
    service = ReplayService(make_cfg(*FIFO), seed=3)
    insert(service, 0, 4)  # 64 items: full
    first = sample(service)  # keys 0..31 read once, stay (read twice to leave)
    report(service, [7.0])
    restored = round_trip(service, tmp_path)
    assert_same_state(service, restored)
    np.testing.assert_array_equal(first.keys, np.arange(32))
    arrays, scalars = restored.table.export_state()
    np.testing.assert_array_equal(arrays["times_sampled"], [1] * 32 + [0] * 32)
    assert scalars == {"next_key": 64, "size": 64, "num_sampled": 32, "num_evicted": 0}
    # The queue goes on where it was: keys 0..31 a second time (then they leave), then 32..63.
    for expected_keys in (np.arange(32), np.arange(32, 64)):
        batch, again = sample(service), sample(restored)
        np.testing.assert_array_equal(batch.keys, expected_keys)
        np.testing.assert_array_equal(again.keys, expected_keys)
        np.testing.assert_array_equal(again.fields["obs"][:, 0], expected_keys)
    assert restored.table.size == 32


# --- refusals -----------------------------------------------------------------------------------


def assert_refused_and_empty(
    service: ReplayService, directory: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="apexrl.replay_server"):
        restore_snapshot(service, directory)
    refusals = [r for r in caplog.records if "refused the replay snapshot" in r.getMessage()]
    assert len(refusals) == 1 and refusals[0].levelno == logging.ERROR, caplog.text
    assert service.table.size == 0 and service.table.num_inserted == 0
    assert service.run.env_steps == 0 and service.limiter.num_inserted == 0
    assert not (directory / SNAPSHOT_FILE).exists()  # set aside, not overwritten by the next
    assert len(list(directory.glob(f"refused-*-{SNAPSHOT_FILE}"))) == 1


def good_snapshot(directory: Path) -> bytes:
    write_snapshot(directory, used_service(*PRIORITIZED).export_snapshot())
    return (directory / SNAPSHOT_FILE).read_bytes()


def test_snapshot_of_another_item_spec_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Acrobot's observations have 6 numbers, CartPole's 4: same algorithm, other item spec.
    acrobot = ReplayService(make_cfg(*PRIORITIZED, path=REPO / "configs/apex_dqn_acrobot.yaml"))
    assert acrobot.item_spec["obs"][1] == (6,)
    write_snapshot(tmp_path, acrobot.export_snapshot())
    assert_refused_and_empty(ReplayService(make_cfg(*PRIORITIZED)), tmp_path, caplog)
    assert "item_spec" in caplog.text


@pytest.mark.parametrize("other", ["replay.capacity=128", "replay.priority_exponent=0.5", "fifo"])
def test_snapshot_of_another_table_layout_is_refused(
    other: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good_snapshot(tmp_path)
    overrides = FIFO if other == "fifo" else (*PRIORITIZED, other)
    assert_refused_and_empty(ReplayService(make_cfg(*overrides)), tmp_path, caplog)


def corrupt(data: bytes, how: str) -> bytes:
    if how == "truncated":
        return data[: len(data) // 2]
    if how == "flipped byte":  # inside an array's bytes: the zip CRC check fails
        member = zipfile.ZipFile(io.BytesIO(data)).getinfo("field/obs.npy")
        # Past the local file header (30 bytes, the name, the extra field) and the .npy header.
        name_bytes, extra_bytes = struct.unpack_from("<HH", data, member.header_offset + 26)
        inside = member.header_offset + 30 + name_bytes + extra_bytes + member.file_size // 2
        flipped = bytearray(data)
        flipped[inside] ^= 0xFF
        return bytes(flipped)
    if how == "empty":
        return b""
    if how == "not a zip":
        return np.random.default_rng(0).bytes(4096)
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["truncated", "flipped byte", "empty", "not a zip"])
def test_corrupt_snapshot_is_refused(
    how: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = good_snapshot(tmp_path)
    (tmp_path / SNAPSHOT_FILE).write_bytes(corrupt(data, how))
    with pytest.raises(SnapshotError):
        read_snapshot(tmp_path / SNAPSHOT_FILE)
    assert_refused_and_empty(ReplayService(make_cfg(*PRIORITIZED)), tmp_path, caplog)


def rewrite(directory: Path, change: str) -> None:
    """Rewrite a good snapshot with one well-formed but wrong part."""
    snap = read_snapshot(directory / SNAPSHOT_FILE)
    arrays, meta = dict(snap.arrays), json.loads(json.dumps(snap.meta))
    if change == "action out of range":
        arrays["field/action"] = arrays["field/action"] + 2
    elif change == "size beyond the arrays":
        meta["table"]["size"] += 1
    elif change == "negative env steps":
        meta["counters"]["env_steps"] = -5
    elif change == "zero priority":
        arrays["priorities"] = np.zeros_like(arrays["priorities"])
    elif change == "missing field":
        del arrays["field/next_obs"]
    elif change == "float keys":
        meta["table"]["next_key"] = 80.5
    elif change == "no counters":
        del meta["counters"]
    else:
        raise AssertionError(change)
    write_snapshot(directory, snapshot_module.Snapshot(arrays, meta))


@pytest.mark.parametrize(
    "change",
    [
        "action out of range",
        "size beyond the arrays",
        "negative env steps",
        "zero priority",
        "missing field",
        "float keys",
        "no counters",
    ],
)
def test_snapshot_with_junk_is_refused(
    change: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good_snapshot(tmp_path)
    rewrite(tmp_path, change)
    assert_refused_and_empty(ReplayService(make_cfg(*PRIORITIZED)), tmp_path, caplog)


# --- interrupted writes -------------------------------------------------------------------------


def test_write_that_fails_midway_leaves_the_previous_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = good_snapshot(tmp_path)
    bigger = used_service(*PRIORITIZED)
    insert(bigger, 80, 1)

    def fail(_fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(snapshot_module.os, "fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        write_snapshot(tmp_path, bigger.export_snapshot())
    assert (tmp_path / SNAPSHOT_FILE).read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == [SNAPSHOT_FILE]  # no temp file left


def test_unfinished_write_left_by_a_killed_server_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = good_snapshot(tmp_path)
    # What a server killed mid-write leaves: its temporary file, cut short.
    partial = tmp_path / ".snapshot-k1ll3d.npz.tmp"
    partial.write_bytes(data[: len(data) // 3])
    service = ReplayService(make_cfg(*PRIORITIZED))
    with caplog.at_level(logging.INFO, logger="apexrl.replay_server"):
        restore_snapshot(service, tmp_path)
    assert "refused" not in caplog.text
    assert service.table.size == 64 and service.table.num_inserted == 80
    assert not partial.exists()
    assert (tmp_path / SNAPSHOT_FILE).read_bytes() == data


# --- a real replay server, killed and started again ---------------------------------------------


def replay_args(run_dir: Path, addr: str, *overrides: str) -> list[str]:
    args = ["replay", "--config", str(CONFIG), "--run-dir", str(run_dir), "--bind", addr]
    return [*args, *set_args([*SMALL_OVERRIDES, *overrides])]


def insert_over_socket(addr: str, first_key: int, num_chunks: int) -> None:
    for i in range(num_chunks):
        ack = request(addr, chunk(first_key + i * CHUNK_ITEMS))
        assert isinstance(ack, InsertAck), ack


def test_killed_replay_server_comes_back_with_its_items(procs: Processes, tmp_path: Path) -> None:
    addr, run_dir = free_addr(), tmp_path / "run"
    overrides = (
        "replay.capacity=2000",
        "replay.min_size_to_sample=32",
        "replay.samples_per_insert=0",  # no ratio: sampling right after the restart
        "replay.snapshot_interval_s=1.0",
    )
    first = procs.start("replay", *replay_args(run_dir, addr, *overrides))
    wait_for_server(first, addr)
    insert_over_socket(addr, 0, 20)  # keys 0..319
    # Wait for a snapshot that holds all of them.
    stats = wait_until(
        lambda: (s := server_stats(addr)) and s.get("replay/snapshot_items") == 320 and s,
        timeout_s=20.0,
    )
    assert stats, f"no snapshot of 320 items\n{first.tail()}"
    snapshot_s = stats["replay/snapshot_s"]
    insert_over_socket(addr, 320, 3)  # keys 320..367, most likely after the last snapshot
    inserted = server_stats(addr)
    first.popen.send_signal(signal.SIGKILL)
    assert first.wait(10.0) == -signal.SIGKILL
    assert "replay snapshot: 320 items" in first.log()

    second = procs.start("replay-again", *replay_args(run_dir, addr, *overrides))
    stats = wait_for_server(second, addr)
    assert "loaded the replay snapshot" in second.log(), second.tail()
    size = int(stats["replay/size"])
    lost = int(inserted["replay/size"]) - size
    print(
        f"\nreplay restart: {size} of {int(inserted['replay/size'])} items back, {lost} lost "
        f"(inserted after the last snapshot); a snapshot of 320 items took {snapshot_s:.4f} s"
    )
    assert size in (320, 336, 352, 368), size  # whole chunks, at least the awaited snapshot
    assert stats["replay/env_steps"] == size
    assert stats["replay/num_inserted"] == size  # keys continue from the snapshot's next key

    # A sample returns stored items: obs[0] of the item with key k is k.
    batch = request(addr, SampleRequest("apex_dqn", 32))
    assert isinstance(batch, SampleBatch), batch
    assert batch.keys.max() < size
    np.testing.assert_array_equal(batch.fields["obs"][:, 0], batch.keys)
    # A priority update for a key from before the kill changes that item's probability: raw
    # priorities are 1 + key % 4 (alpha 0.6 here); key 5 gets 1e6.
    update = PriorityUpdate("apex_dqn", 0, np.array([5], np.int64), np.array([1e6]))
    assert request(addr, update, timeout_s=0.5) is None  # no reply to a priority update
    assert wait_until(lambda: server_stats(addr)["replay/priority_updates"] == 1, 5.0)
    batch = request(addr, SampleRequest("apex_dqn", 32))
    assert isinstance(batch, SampleBatch), batch
    mass = (1.0 + np.arange(size) % 4) ** 0.6
    expected = 1e6**0.6 / (mass.sum() - mass[5] + 1e6**0.6)
    assert expected > 0.8
    drawn = batch.probabilities[batch.keys == 5]
    assert drawn.size >= 16, batch.keys  # stratified: about expected * 32 draws
    np.testing.assert_allclose(drawn, expected, rtol=1e-9)
    np.testing.assert_array_equal(batch.fields["obs"][batch.keys == 5, 0], 5.0)

    code, _ = second.stop(10.0)
    assert code == 0, second.tail()
    assert (rundir.replay_snapshot_dir(run_dir) / SNAPSHOT_FILE).is_file()


@pytest.mark.parametrize(
    "stop_by, durable", [("SIGTERM", "false"), ("Shutdown message", "false"), ("SIGTERM", "true")]
)
def test_clean_stop_writes_a_snapshot(
    stop_by: str, durable: str, procs: Processes, tmp_path: Path
) -> None:
    addr, run_dir = free_addr(), tmp_path / "run"
    overrides = (
        "replay.capacity=2000",
        "replay.snapshot_interval_s=3600",  # none on the way
        f"replay.durable={durable}",
    )
    server = procs.start("replay", *replay_args(run_dir, addr, *overrides))
    wait_for_server(server, addr)
    insert_over_socket(addr, 0, 2)
    assert not (rundir.replay_snapshot_dir(run_dir) / SNAPSHOT_FILE).exists()
    if stop_by == "SIGTERM":
        server.popen.send_signal(signal.SIGTERM)
    else:
        request(addr, Shutdown("test"), timeout_s=0.5)
    assert server.wait(15.0) == 0, server.tail()
    snap = read_snapshot(rundir.replay_snapshot_dir(run_dir) / SNAPSHOT_FILE)
    assert snap.meta["table"]["next_key"] == 32 and snap.meta["table"]["size"] == 32
    assert snap.meta["counters"]["env_steps"] == 2 * CHUNK_ITEMS
    if durable == "true":  # the items stay in the chunk log, the snapshot has their priorities
        assert snap.meta["items_in_log"] and set(snap.arrays) == {"priorities"}
        assert snap.arrays["priorities"].shape == (32,)
    else:
        np.testing.assert_array_equal(snap.arrays["field/obs"][:, 0], np.arange(32))
    assert "replay snapshot: 32 items" in server.log()


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_snapshot_interval_must_be_a_finite_non_negative_number(value: str) -> None:
    with pytest.raises(ConfigError, match="replay.snapshot_interval_s"):
        make_cfg(f"replay.snapshot_interval_s={value}")
    no_snapshots = make_cfg("replay.snapshot_interval_s=0", "replay.durable=false")
    assert no_snapshots.replay.snapshot_interval_s == 0.0


def test_a_resumed_run_does_not_count_the_snapshots_evaluation_returns(tmp_path: Path) -> None:
    """A replay server restarted within a session keeps the evaluation window; one started for a
    resumed run (``run.resume``) keeps items and counters but not the window, which the stop
    condition reads for the current session only."""
    used = used_service(*PRIORITIZED)
    write_snapshot(tmp_path, used.export_snapshot())
    same_session = ReplayService(used.cfg, seed=3)
    restore_snapshot(same_session, tmp_path)
    assert list(same_session.run.eval_returns) == [475.0]
    resumed = ReplayService(make_cfg(*PRIORITIZED, "run.resume=true"), seed=3)
    restore_snapshot(resumed, tmp_path)
    assert resumed.table.size == used.table.size and resumed.run.env_steps == used.run.env_steps
    assert list(resumed.run.eval_returns) == []
    assert resumed.stats()["eval/episodes_in_window"] == 0

"""Stacked frames sent and stored once (``transport/frames.py``, ``replay/frames.py``).

Real Pong frames from ale-py's vector env, cut into items by the algorithms' own actor cores:

- packing is exact: the stacks rebuilt from a chunk's frames equal the items byte for byte,
  across episode ends, for Ape-X transitions, R2D2 sequences and IMPALA/PPO unrolls, and a chunk
  carries each frame once;
- replay stores the references and rebuilds the stacks of what it samples; items whose frames a
  full ring overwrites leave the table (counted) and are never sampled;
- what a chunk's frames and references may be is checked: a reference outside the chunk, frames
  of the wrong shape, more frames than references, none at all are refused and change nothing;
- a snapshot keeps the frames its items reference;
- a run of the launcher on Pong streams packed chunks from real actors and trains on the stacks
  its learner rebuilds.
"""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_launcher
from test_algos import collect
from test_durability import Server  # a replay service started and fed as its server does

from apexrl.config import load_config
from apexrl.replay.chunk_log import LOG_DIR, segment_numbers
from apexrl.replay.service import ReplayService
from apexrl.replay.snapshot import SNAPSHOT_FILE, read_snapshot
from apexrl.replay.tables import FifoQueue, PrioritizedTable
from apexrl.transport import frames as wire_frames
from apexrl.transport.codec import decode, encode
from apexrl.transport.frames import (
    FrameLayout,
    config_frame_layout,
    frame_layout,
    pack_frames,
    unpack_frames,
)
from apexrl.transport.messages import (
    Error,
    InsertAck,
    PriorityUpdate,
    SampleBatch,
    SampleRequest,
    TrajectoryChunk,
)

REPO = Path(__file__).resolve().parents[1]
SEQUENCES = itertools.count()  # chunk numbers: replay stores each (actor, incarnation, number) once
PONG = [
    "env.id=ALE/Pong-v5",
    "env.atari.max_episode_frames=240",  # 60 steps a game: chunks cross episode ends
    "actor.num_actors=1",
]
FAMILIES = {
    "apex_dqn": ("apex_dqn_cartpole.yaml", ["actor.chunk_steps=16"]),
    "r2d2": (
        "r2d2_cartpole.yaml",
        ["algo.sequence_length=8", "algo.sequence_overlap=4", "algo.burn_in=2"],
    ),
    "impala": ("impala_cartpole.yaml", []),
    "ppo": ("ppo_cartpole.yaml", ["algo.normalize_obs=false"]),
}


def pong_config(family: str, *more: str):
    config, overrides = FAMILIES[family]
    return load_config(REPO / "configs" / config, [*PONG, *overrides, *more])


@functools.cache
def pong_items(family: str, num_blocks: int, *more: str):
    cfg = pong_config(family, *more)
    _, spaces, chunks = collect(cfg, num_blocks=num_blocks, version=0)
    spec = cfg.algo.item_spec(*spaces)
    return cfg, spec, chunks


@pytest.mark.parametrize("family", list(FAMILIES))
def test_packed_frames_rebuild_every_stack_exactly_and_hold_each_frame_once(family) -> None:
    cfg, spec, chunks = pong_items(family, num_blocks=6)
    layout = config_frame_layout(cfg, spec)
    assert layout is not None and layout.stack == 4 and layout.frame_shape == (84, 84)
    expected = ("obs",) if family == "r2d2" else ("obs", "next_obs")
    assert layout.fields == expected
    ended = 0
    for fields, _ in chunks:
        frames, packed = pack_frames(fields, layout)
        assert frames.dtype == np.uint8 and frames.shape[1:] == (84, 84)
        rebuilt = unpack_frames(frames, packed, layout)
        for name in fields:
            np.testing.assert_array_equal(rebuilt[name], fields[name])
        # Each distinct frame once.
        flat = frames.reshape(frames.shape[0], -1)
        assert np.unique(flat, axis=0).shape[0] == frames.shape[0]
        stacked = sum(fields[name].size for name in layout.fields) // (84 * 84)
        assert frames.shape[0] < stacked / 2
        for name in fields:
            if name in ("terminated", "truncated", "done"):
                ended += int(fields[name].sum())
    assert ended > 0  # the chunks crossed episode ends


def test_a_chunk_on_the_wire_carries_frames_once() -> None:
    cfg, spec, chunks = pong_items("apex_dqn", num_blocks=1)
    layout = config_frame_layout(cfg, spec)
    fields, priorities = chunks[0]
    frames, packed = pack_frames(fields, layout)
    chunk = TrajectoryChunk("apex_dqn", 0, 1, 0, 0, 16, priorities, packed, frames)
    stacks = TrajectoryChunk("apex_dqn", 0, 1, 1, 0, 16, priorities, fields)
    sent = sum(len(f) for f in encode(chunk))
    assert sent * 3 < sum(len(f) for f in encode(stacks))
    decoded = decode(encode(chunk))
    np.testing.assert_array_equal(decoded.frames, frames)
    assert decoded.fields["obs"].dtype == np.int32 and decoded.fields["obs"].shape[1:] == (4,)


def test_packing_stays_exact_when_two_frames_share_a_fingerprint(monkeypatch) -> None:
    cfg, spec, chunks = pong_items("impala", num_blocks=1)
    layout = config_frame_layout(cfg, spec)
    fields = chunks[0][0]
    monkeypatch.setattr(
        wire_frames, "_fingerprints", lambda flat: np.zeros(flat.shape[0], np.uint64)
    )
    frames, packed = pack_frames(fields, layout)
    np.testing.assert_array_equal(unpack_frames(frames, packed, layout)["obs"], fields["obs"])


def test_only_stacked_atari_frames_are_packed() -> None:
    spec = {"obs": (np.dtype(np.uint8), (4, 84, 84)), "reward": (np.dtype(np.float32), ())}
    assert frame_layout(spec, (4, 84, 84), True) == FrameLayout(("obs",), 4, (84, 84))
    assert frame_layout(spec, (4, 84, 84), False) is None
    assert frame_layout(spec, (1, 84, 84), True) is None  # one frame: nothing shared
    assert frame_layout({"obs": (np.dtype(np.float32), (4,))}, (4,), True) is None
    cfg = load_config(REPO / "configs" / "apex_dqn_cartpole.yaml", ["env.id=MinAtar/Breakout-v1"])
    minatar = {"obs": (np.dtype(np.uint8), (4, 10, 10))}
    assert config_frame_layout(cfg, minatar) is None  # channels, not a stack of frames
    pong = pong_config("apex_dqn", "replay.store_frames_once=false")
    assert config_frame_layout(pong, {"obs": (np.dtype(np.uint8), (4, 84, 84))}) is None


@functools.cache
def _packed_chunks(family: str, num_blocks: int):
    cfg, spec, chunks = pong_items(family, num_blocks)
    layout = config_frame_layout(cfg, spec)
    packed = []
    for fields, _ in chunks:
        frames, refs = pack_frames(fields, layout)
        packed.append((fields, refs, frames))
    return spec, layout, packed


@pytest.mark.parametrize("kind", ["prioritized", "fifo"])
def test_replay_rebuilds_what_it_samples_and_drops_items_whose_frames_are_gone(kind) -> None:
    spec, layout, chunks = _packed_chunks("apex_dqn", num_blocks=8)
    per_chunk = [frames.shape[0] for _, _, frames in chunks]
    items = sum(len(fields["obs"]) for fields, _, _ in chunks)
    # Room for every item, but for about three chunks' frames only.
    ring = 3 * max(per_chunk)
    if kind == "prioritized":
        table = PrioritizedTable(items, 0.6, spec=spec, frames=(layout, ring))
    else:
        table = FifoQueue(items, evict_unread=True, spec=spec, frames=(layout, ring))
    originals = {}
    for fields, refs, frames in chunks:
        table.check_items(refs)
        keys = table.insert(refs, np.ones(len(refs["obs"])), frames)
        for i, key in enumerate(keys):
            originals[int(key)] = {name: fields[name][i] for name in fields}
    assert table.num_evicted_for_frames > 0
    assert table.size == items - table.num_evicted_for_frames
    assert table.size >= len(chunks[-1][0]["obs"])  # the newest chunk is whole
    oldest_kept = items - table.size
    rng = np.random.default_rng(0)
    for _ in range(5):
        batch_size = min(32, table.size)
        keys, fields, _ = table.sample(batch_size, rng)
        frames, batch = table.batch_frames(fields)
        rebuilt = unpack_frames(frames, batch, layout)
        for i, key in enumerate(keys):
            assert key >= oldest_kept  # a dropped item is never sampled
            for name, value in originals[int(key)].items():
                np.testing.assert_array_equal(rebuilt[name][i], value)
        if kind == "fifo":
            oldest_kept += batch_size


def service_config(*more: str):
    return pong_config(
        "apex_dqn",
        "replay.capacity=256",
        "replay.min_size_to_sample=16",
        "learner.batch_size=16",
        "replay.samples_per_insert=0",
        *more,
    )


def _chunk_message(refs, frames, priorities=None, env_steps=16):
    num = len(refs["obs"])
    priorities = np.ones(num) if priorities is None else priorities
    return TrajectoryChunk(
        "apex_dqn", 0, 1, next(SEQUENCES), 0, env_steps, priorities, refs, frames
    )


def test_the_replay_service_takes_packed_chunks_and_serves_packed_batches() -> None:
    cfg = service_config()
    _, layout, chunks = _packed_chunks("apex_dqn", num_blocks=1)
    fields, refs, frames = chunks[0]
    service = ReplayService(cfg)
    assert service.frame_layout == layout
    assert service.handle(b"a", _chunk_message(refs, frames)) == []
    replies = service.drain()
    assert [type(r.message) for r in replies] == [InsertAck]
    service.handle(b"l", SampleRequest("apex_dqn", 16))
    (reply,) = service.drain()
    batch = decode(encode(reply.message))
    assert isinstance(batch, SampleBatch) and batch.frames.shape[1:] == (84, 84)
    assert batch.fields["obs"].dtype == np.int32
    assert wire_frames.frame_refs_fit(batch.frames, batch.fields)
    rebuilt = unpack_frames(batch.frames, batch.fields, layout)
    for i, key in enumerate(batch.keys):
        for name in ("obs", "next_obs", "reward", "action"):
            np.testing.assert_array_equal(rebuilt[name][i], fields[name][key])


def _broken(refs, frames):
    out_of_range = {**refs, "obs": refs["obs"].copy()}
    out_of_range["obs"][0, 0] = frames.shape[0]
    negative = {**refs, "next_obs": refs["next_obs"].copy()}
    negative["next_obs"][-1, -1] = -1
    num_refs = refs["obs"].size + refs["next_obs"].size
    return {
        "a reference outside the chunk's frames": (out_of_range, frames),
        "a negative reference": (negative, frames),
        "frames of another shape": (refs, np.zeros((frames.shape[0], 84, 80), np.uint8)),
        "no frames": (refs, np.zeros((0, 84, 84), np.uint8)),
        "more frames than references": (refs, np.zeros((num_refs + 1, 84, 84), np.uint8)),
        "whole stacks instead of references": (
            {**refs, "obs": np.zeros((*refs["obs"].shape, 84, 84), np.uint8)},
            frames,
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "a reference outside the chunk's frames",
        "a negative reference",
        "frames of another shape",
        "no frames",
        "more frames than references",
        "whole stacks instead of references",
    ],
)
def test_a_chunk_whose_frames_do_not_fit_is_refused_and_changes_nothing(case) -> None:
    cfg = service_config()
    _, _, chunks = _packed_chunks("apex_dqn", num_blocks=1)
    _, refs, frames = chunks[0]
    service = ReplayService(cfg)
    bad_refs, bad_frames = _broken(refs, frames)[case]
    try:
        message = decode(encode(_chunk_message(bad_refs, bad_frames)))
    except Exception:  # refused by the wire schema already
        return
    (reply,) = service.handle(b"a", message)
    assert isinstance(reply.message, Error), case
    assert service.drain() == [] and service.table.size == 0
    assert service.rejected_messages == 1


def test_a_replay_of_whole_observations_refuses_frames() -> None:
    cfg = service_config("replay.store_frames_once=false")
    _, _, chunks = _packed_chunks("apex_dqn", num_blocks=1)
    fields, _, frames = chunks[0]
    service = ReplayService(cfg)
    assert service.frame_layout is None
    (reply,) = service.handle(b"a", _chunk_message(fields, frames))
    assert isinstance(reply.message, Error) and "no frames" in reply.message.reason
    assert service.handle(b"a", _chunk_message(fields, np.zeros((0, 0, 0), np.uint8))) == []
    assert [type(r.message) for r in service.drain()] == [InsertAck]


@pytest.mark.parametrize("kind", ["prioritized", "fifo"])
def test_a_killed_durable_replay_of_frames_comes_back_from_snapshot_and_log(
    kind: str, tmp_path: Path
) -> None:
    """A durable replay's snapshots hold no frames: its items stay in the chunk log, whose
    segments go once all their items have left. After a kill the items come back with their
    keys, frames, and priorities or deliveries (a queue's oldest item inside a chunk)."""
    _, layout, chunks = _packed_chunks("apex_dqn", num_blocks=8)
    per_chunk = len(chunks[0][1]["obs"])
    cfg = service_config(
        f"run.dir={tmp_path}",
        "env.num_envs=4",  # chunks of 64 items, as these
        f"replay.kind={kind}",
        f"replay.capacity={3 * per_chunk + per_chunk // 2}",  # 3.5 chunks
        "replay.min_size_to_sample=1",
        "replay.priority_log_period_s=0",
        "replay.evict_unread=true" if kind == "fifo" else "replay.priority_exponent=0.6",
    )
    first = Server(cfg)
    for step, (_, refs, frames) in enumerate(chunks[:7] * 2):  # 14 chunks: 4 x capacity
        first.send(_chunk_message(refs, frames, np.linspace(0.5, 2.0, per_chunk), per_chunk))
        if step == 12 and kind == "fifo":
            first.send(SampleRequest("apex_dqn", 16), b"learner")  # the oldest now inside a chunk
        if step in (5, 9, 12):
            first.snapshot()
    if kind == "prioritized":
        keys = np.arange(first.service.table.num_inserted - 40, first.service.table.num_inserted)
        first.send(PriorityUpdate("apex_dqn", 0, keys, np.linspace(3, 9, 40)), b"learner")
    else:
        first.send(SampleRequest("apex_dqn", 16), b"learner")  # delivered: they stay gone
    first.die()
    snap = read_snapshot(tmp_path / "replay_snapshot" / SNAPSHOT_FILE)
    assert snap.meta["items_in_log"] and not any(k.startswith("field/") for k in snap.arrays)
    # The last snapshot's oldest item was in chunk 9 of 13: the segments of chunks 6..9 and
    # after stay, the first two go.
    # Segments: chunks 0..5, 6..9, 10..12, then 13. At the last snapshot the frame ring (322
    # frames) held the frames of chunks 10..12 only, so their items were the stored ones (and
    # 16 of them delivered from the queue): the first two segments are gone.
    assert first.snapshots.oldest_key == 10 * per_chunk + (16 if kind == "fifo" else 0)
    assert segment_numbers(tmp_path / "replay_snapshot" / LOG_DIR) == [2, 3]

    second = Server(cfg)
    before, after = first.service, second.service
    assert (after.table.num_inserted, after.table.size) == (
        before.table.num_inserted,
        before.table.size,
    )
    assert after.stats()["replay/items_lost"] == 0
    np.testing.assert_array_equal(
        after.export_snapshot(items_in_log=True).arrays[
            "priorities" if kind == "prioritized" else "times_sampled"
        ],
        before.export_snapshot(items_in_log=True).arrays[
            "priorities" if kind == "prioritized" else "times_sampled"
        ],
    )
    for replay in (before, after):
        replay.rng = np.random.default_rng(7)
        replay.handle(b"l", SampleRequest("apex_dqn", 16))
    (was,), (now,) = before.drain(), after.drain()
    np.testing.assert_array_equal(was.message.keys, now.message.keys)
    np.testing.assert_array_equal(was.message.probabilities, now.message.probabilities)
    rebuilt_was = unpack_frames(was.message.frames, was.message.fields, layout)
    rebuilt_now = unpack_frames(now.message.frames, now.message.fields, layout)
    for name in ("obs", "next_obs", "reward", "action"):
        np.testing.assert_array_equal(rebuilt_was[name], rebuilt_now[name])
    second.die()


def test_a_snapshot_keeps_the_frames_its_items_reference() -> None:
    cfg = service_config()
    _, layout, chunks = _packed_chunks("apex_dqn", num_blocks=3)
    service = ReplayService(cfg)
    for _, refs, frames in chunks:
        service.handle(b"a", _chunk_message(refs, frames))
    service.drain()
    snapshot = service.export_snapshot()
    assert "field/frame_ring/frames" in snapshot.arrays
    restored = ReplayService(cfg)
    restored.load_snapshot(snapshot)
    assert restored.table.size == service.table.size
    for replay in (service, restored):
        replay.rng = np.random.default_rng(7)
        replay.handle(b"l", SampleRequest("apex_dqn", 16))
    (before,), (after,) = service.drain(), restored.drain()
    np.testing.assert_array_equal(before.message.keys, after.message.keys)
    for name in ("obs", "next_obs"):
        np.testing.assert_array_equal(
            unpack_frames(before.message.frames, before.message.fields, layout)[name],
            unpack_frames(after.message.frames, after.message.fields, layout)[name],
        )
    # A snapshot whose items reference frames it does not hold is refused.
    arrays = dict(snapshot.arrays)
    arrays["field/obs"] = arrays["field/obs"] - 10**6
    broken = type(snapshot)(arrays, snapshot.meta)
    with pytest.raises(Exception, match="frames"):
        ReplayService(cfg).load_snapshot(broken)


@pytest.mark.parametrize("config", ["apex_dqn_pong", "impala_pong"])
def test_a_pong_run_streams_frames_once_and_trains(tmp_path: Path, config: str) -> None:
    code, output = run_launcher(
        [
            "--actors",
            "1",
            "--learners",
            "1",
            "--config",
            str(REPO / "configs" / f"{config}.yaml"),
            "--logdir",
            str(tmp_path),
            "--set",
            "env.num_envs=4",
            "--set",
            "replay.min_size_to_sample=64" if config == "apex_dqn_pong" else "learner.batch_size=4",
            "--set",
            "learner.batch_size=32" if config == "apex_dqn_pong" else "replay.min_size_to_sample=4",
            "--set",
            "run.stop_env_steps=1500",
            "--set",
            "run.stop_wall_s=240",
        ],
        360,
    )
    assert code == 0, output[-3000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    last = json.loads((run_dir / "result.json").read_text().splitlines()[-1])
    assert last["done"] is True and last["env_steps"] >= 1500, last
    assert last["learner_updates"] >= 1, output[-3000:]
    assert last["frames"] == 4 * last["env_steps"]


def test_a_learner_checks_a_batchs_references_before_it_rebuilds_stacks() -> None:
    frames = np.zeros((3, 84, 84), np.uint8)
    good = {"obs": np.array([[0, 1, 2, 2]], np.int32), "reward": np.zeros(1, np.float32)}
    assert wire_frames.frame_refs_fit(frames, good)
    assert wire_frames.frame_refs_fit(np.zeros((0, 0, 0), np.uint8), {"obs": np.zeros((1, 4))})
    for bad in (
        {"obs": np.array([[0, 1, 2, 3]], np.int32)},  # past the batch's frames
        {"obs": np.array([[0, -1, 2, 2]], np.int32)},
        {"obs": np.array([[0, 1, 2, 2]], np.int64)},  # not the wire's reference type
        {"next_obs": np.array([[0, 1, 2, 9]], np.int32)},
    ):
        assert not wire_frames.frame_refs_fit(frames, bad), bad


@pytest.mark.parametrize("family", ["impala", "r2d2"])
def test_replay_serves_unrolls_and_sequences_whose_stacks_are_the_actors(family) -> None:
    """IMPALA's unrolls (FIFO) and R2D2's sequences (prioritized): every sampled item, rebuilt
    from its batch's frames, equals the item the actor core cut."""
    spec, layout, chunks = _packed_chunks(family, num_blocks=4)
    items = sum(len(fields["obs"]) for fields, _, _ in chunks)
    frames_room = sum(frames.shape[0] for _, _, frames in chunks)
    if family == "impala":
        table = FifoQueue(items, spec=spec, frames=(layout, frames_room))
    else:
        table = PrioritizedTable(items, 0.6, spec=spec, frames=(layout, frames_room))
    originals = {}
    for fields, refs, frames in chunks:
        for i, key in enumerate(table.insert(refs, np.ones(len(refs["obs"])), frames)):
            originals[int(key)] = {name: fields[name][i] for name in fields}
    assert table.num_evicted_for_frames == 0
    keys, fields, _ = table.sample(items, np.random.default_rng(1))
    frames, batch = table.batch_frames(fields)
    rebuilt = unpack_frames(frames, batch, layout)
    for i, key in enumerate(keys):
        for name, value in originals[int(key)].items():
            np.testing.assert_array_equal(rebuilt[name][i], value, err_msg=f"{name} of {key}")

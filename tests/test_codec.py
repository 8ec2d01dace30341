"""Tests for the wire codec: every message round-trips; every malformed input is a DecodeError."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from typing import Any

import lz4.block
import msgpack
import numpy as np
import pytest
import zmq

from apexrl.transport import external_messages as em
from apexrl.transport import messages
from apexrl.transport.codec import DecodeError, Limits, decode, encode
from apexrl.transport.messages import SCHEMA_VERSION

# --- examples of every message kind --------------------------------------------------------------


def _example_messages() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    n = 6
    chunk_fields = {
        # Atari-like frames: large and very compressible, so they go LZ4.
        "obs": np.tile(np.arange(84, dtype=np.uint8), (n, 4, 84, 1)),
        "action": rng.integers(0, 6, size=n).astype(np.int64),
        "reward": rng.normal(size=n).astype(np.float32),
        "num_steps": np.full(n, 3, dtype=np.int8),
        "terminated": np.array([False, False, True, False, False, False]),
        "truncated": np.array([False, False, False, False, False, True]),
        "q_values": rng.normal(size=(n, 6)).astype(np.float16),
        "recurrent_state": rng.normal(size=(n, 2, 16)).astype(np.float64),
        "lives": np.arange(n, dtype=np.uint16),
        "seed": np.arange(n, dtype=np.uint64) + 2**63,
    }
    return {
        "TrajectoryChunk": messages.TrajectoryChunk(
            table="replay",
            actor_id=3,
            incarnation=-(2**62),
            sequence=2**40,
            weights_version=17,
            env_steps=2**40,
            priorities=rng.uniform(0.1, 2.0, size=n),
            fields=chunk_fields,
        ),
        "InsertAck": messages.InsertAck(table="replay", num_inserted=6, table_size=1000),
        "SampleRequest": messages.SampleRequest(table="replay", batch_size=32),
        "SampleBatch": messages.SampleBatch(
            table="replay",
            table_size=0,
            keys=np.zeros(0, dtype=np.int64),
            probabilities=np.zeros(0, dtype=np.float64),
            fields={"obs": np.zeros((0, 4, 84, 84), dtype=np.uint8)},
        ),
        "PriorityUpdate": messages.PriorityUpdate(
            table="replay",
            learner_rank=1,
            keys=np.array([5, 9, 2**40], dtype=np.int64),
            priorities=np.array([0.0, 1.5, 1e-8]),
        ),
        "ActorReport": messages.ActorReport(
            actor_id=0,
            incarnation=12345,
            is_eval=True,
            env_steps=4000,
            weights_version=-1,
            episode_returns=np.array([21.0, -3.5]),
            episode_lengths=np.array([200, 31], dtype=np.int64),
        ),
        "StatsRequest": messages.StatsRequest(),
        "Stats": messages.Stats(
            role="replay",
            values={"replay/size": 1000.0, "replay/inserts_per_s": float("nan"), "x": -0.0},
        ),
        "ParamsRequest": messages.ParamsRequest(have_version=-1),
        "Params": messages.Params(
            version=4,
            arrays={
                # torch state_dict names: the wire name "arrays.torso.0.weight" splits at the
                # first dot.
                "torso.0.weight": rng.normal(size=(64, 4)).astype(np.float32),
                "torso.0.bias": np.zeros(64, dtype=np.float32),
                "scalar": np.array(2.5, dtype=np.float32),
            },
        ),
        "ParamsNotModified": messages.ParamsNotModified(version=4),
        "MatchRequest": messages.MatchRequest(
            actor_id=3,
            want=64,
            tickets=np.array([7, 9], dtype=np.int64),
            versions=np.array([[40, 52], [52, 52]], dtype=np.int64),
            returns=np.array([[-1.0, 1.0], [0.0, 0.0]]),
        ),
        "Matches": messages.Matches(
            tickets=np.array([10, 11], dtype=np.int64),
            versions=np.array([[-1, 40], [80, -1]], dtype=np.int64),
        ),
        "RestoreCounters": messages.RestoreCounters(env_steps=123_456_789),
        "PublishedVersion": messages.PublishedVersion(version=2**40),
        "PublishParams": messages.PublishParams(
            version=5,
            env_steps=77,
            arrays={"head_weight": np.ones((1024, 64), dtype=np.float32)},
        ),
        "PublishAck": messages.PublishAck(version=5),
        "Shutdown": messages.Shutdown(reason="done: 10000 env steps ✓"),
        "Error": messages.Error(reason=""),
        "ExternalHello": em.ExternalHello(),
        "ExternalSetup": em.ExternalSetup(config_yaml="algorithm: ppo\n", actor_id=3),
        "StartEpisode": em.StartEpisode(episode_id="ep-1", training=False),
        "GetAction": em.GetAction(episode_id="ep-1", obs=np.arange(4, dtype=np.float32)),
        "ActionReply": em.ActionReply(
            episode_id="ep-1", action=np.array(1, dtype=np.int64), weights_version=7
        ),
        "LogAction": em.LogAction(
            episode_id="ep-1",
            obs=np.zeros((2, 3), dtype=np.uint8),
            action=np.array([0.5, -1.0], dtype=np.float32),
            weights_version=2,
            extras={"behaviour_logp": np.array(-0.7, dtype=np.float32)},
            local=True,
        ),
        "LogReturns": em.LogReturns(episode_id="ep-1", reward=-1.5),
        "EndEpisode": em.EndEpisode(
            episode_id="ep-1", obs=np.ones(4, dtype=np.float32), truncated=True
        ),
        "EpisodeAck": em.EpisodeAck(episode_id="ep-1"),
    }


EXAMPLES = _example_messages()


def _assert_same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), where
        assert a.dtype == b.dtype, f"{where}: {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{where}: {a.shape} != {b.shape}"
        assert np.array_equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r} != {b!r}"


def _assert_messages_equal(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    for f in dataclasses.fields(a):
        _assert_same(getattr(a, f.name), getattr(b, f.name), f.name)


def _header(frames: list[Any]) -> dict[str, Any]:
    return msgpack.unpackb(frames[0])


# --- round trips ---------------------------------------------------------------------------------


def test_examples_cover_every_message_kind() -> None:
    assert set(EXAMPLES) == set(messages.MESSAGE_TYPES)
    for kind, msg in EXAMPLES.items():
        assert type(msg).__name__ == kind


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_round_trip(kind: str) -> None:
    msg = EXAMPLES[kind]
    frames = encode(msg)
    decoded = decode(frames)
    _assert_messages_equal(msg, decoded)
    header = _header(frames)
    assert header["v"] == SCHEMA_VERSION and header["kind"] == kind
    assert len(frames) == 1 + len(header["arrays"])


def test_round_trip_from_bytes_bytearray_and_zmq_frames() -> None:
    msg = EXAMPLES["TrajectoryChunk"]
    frames = encode(msg)
    for convert in (bytes, bytearray, memoryview, lambda f: zmq.Frame(bytes(f))):
        _assert_messages_equal(msg, decode([convert(f) for f in frames]))


def test_large_compressible_array_uses_lz4_and_small_ones_stay_raw() -> None:
    header = _header(encode(EXAMPLES["TrajectoryChunk"]))
    by_name = {d["name"]: d for d in header["arrays"]}
    obs = by_name["fields.obs"]
    assert obs["codec"] == "lz4"
    assert obs["raw_nbytes"] == 6 * 4 * 84 * 84
    assert obs["nbytes"] < obs["raw_nbytes"]
    assert by_name["fields.terminated"] == {
        "name": "fields.terminated",
        "dtype": "|b1",
        "shape": [6],
        "codec": "raw",
        "nbytes": 6,
        "raw_nbytes": 6,
    }
    assert by_name["priorities"]["dtype"] == "<f8"


def test_incompressible_array_falls_back_to_raw() -> None:
    noise = np.random.default_rng(1).integers(0, 256, size=100_000, dtype=np.uint8)
    msg = messages.PublishParams(version=0, env_steps=0, arrays={"w": noise})
    frames = encode(msg, compress_min_bytes=0)
    (descriptor,) = _header(frames)["arrays"]
    assert descriptor["codec"] == "raw"
    _assert_messages_equal(msg, decode(frames))


def test_raw_frames_share_memory_with_contiguous_arrays() -> None:
    weights = np.random.default_rng(2).normal(size=(100, 100))
    frames = encode(messages.Params(version=1, arrays={"w": weights}), compress_min_bytes=2**40)
    assert np.shares_memory(np.frombuffer(frames[1], dtype=np.float64), weights)


def test_non_contiguous_and_big_endian_arrays_are_sent_as_little_endian_c_order() -> None:
    base = np.arange(24, dtype=">i4").reshape(4, 6)
    msg = messages.Params(version=1, arrays={"t": base.T, "s": base[:, ::2]})
    decoded = decode(encode(msg))
    assert decoded.arrays["t"].dtype == np.dtype("<i4")
    assert np.array_equal(decoded.arrays["t"], base.T)
    assert np.array_equal(decoded.arrays["s"], base[:, ::2])


def test_decoded_arrays_are_read_only() -> None:
    decoded = decode(encode(EXAMPLES["TrajectoryChunk"]))
    for array in [decoded.priorities, *decoded.fields.values()]:
        assert not array.flags.writeable


def test_chunk_with_zero_rows_round_trips() -> None:
    msg = messages.TrajectoryChunk(
        table="t",
        actor_id=0,
        incarnation=0,
        sequence=0,
        weights_version=0,
        env_steps=0,
        priorities=np.zeros(0),
        fields={"obs": np.zeros((0, 3), dtype=np.float32), "done": np.zeros(0, dtype=bool)},
    )
    _assert_messages_equal(msg, decode(encode(msg)))


def test_float_fields_accept_ints_on_the_wire() -> None:
    frames = encode(messages.Stats(role="r", values={"a": 1.0}))
    header = _header(frames)
    header["scalars"]["values"]["a"] = 3
    decoded = decode([msgpack.packb(header)])
    assert decoded.values == {"a": 3.0} and type(decoded.values["a"]) is float


# --- encode rejects programming errors -----------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: {"kind": "Shutdown"}, TypeError),
        (lambda: dataclasses.make_dataclass("Shutdown", [("reason", str)])("x"), TypeError),
        (lambda: messages.Shutdown(reason=3), TypeError),
        (lambda: messages.ParamsRequest(have_version=True), TypeError),
        (lambda: messages.ParamsRequest(have_version=2**63), ValueError),
        (lambda: messages.ParamsRequest(have_version=1.0), TypeError),
        (lambda: messages.Stats(role="r", values={"a": "b"}), TypeError),
        (lambda: messages.Stats(role="r", values={1: 2.0}), TypeError),
        (lambda: messages.Params(version=1, arrays={"": np.zeros(1)}), ValueError),
        (lambda: messages.Params(version=1, arrays={"a": [1.0]}), TypeError),
        (lambda: messages.Params(version=1, arrays={"a": np.array([None])}), ValueError),
        (lambda: messages.Params(version=1, arrays={"a": np.array(["x"])}), ValueError),
        (lambda: messages.Params(version=1, arrays={"a": np.zeros(2, np.complex64)}), ValueError),
    ],
)
def test_encode_rejects_wrong_types(make: Callable[[], Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        encode(make())


def test_encode_accepts_numpy_scalars() -> None:
    msg = messages.InsertAck(table="t", num_inserted=np.int32(4), table_size=np.int64(9))
    decoded = decode(encode(msg))
    assert decoded == messages.InsertAck(table="t", num_inserted=4, table_size=9)
    assert type(decoded.num_inserted) is int


# --- decode rejects bad input --------------------------------------------------------------------


def _valid_frames() -> list[bytes]:
    return [bytes(f) for f in encode(EXAMPLES["TrajectoryChunk"])]


def _with_header(mutate: Callable[[dict[str, Any]], Any]) -> Callable[[], list[bytes]]:
    """Frames of a valid chunk whose header was changed by ``mutate``."""

    def build() -> list[bytes]:
        frames = _valid_frames()
        header = _header(frames)
        mutate(header)
        return [msgpack.packb(header), *frames[1:]]

    return build


def _descriptor(header: dict[str, Any], name: str) -> dict[str, Any]:
    return next(d for d in header["arrays"] if d["name"] == name)


def _set_descriptor(array_name: str, **changes: Any) -> Callable[[], list[bytes]]:
    return _with_header(lambda h: _descriptor(h, array_name).update(changes))


def _hand_built(kind: str, scalars: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[bytes]:
    """Frames built without ``encode``, for messages that ``encode`` would never produce."""
    descriptors = [
        {
            "name": name,
            "dtype": a.dtype.str,
            "shape": list(a.shape),
            "codec": "raw",
            "nbytes": a.nbytes,
            "raw_nbytes": a.nbytes,
        }
        for name, a in arrays.items()
    ]
    header = {"v": SCHEMA_VERSION, "kind": kind, "scalars": scalars, "arrays": descriptors}
    return [msgpack.packb(header), *(a.tobytes() for a in arrays.values())]


def _frames_edit(edit: Callable[[list[bytes]], Any]) -> Callable[[], list[bytes]]:
    def build() -> list[bytes]:
        frames = _valid_frames()
        edit(frames)
        return frames

    return build


def _index_of(name: str) -> int:
    names = [d["name"] for d in _header(_valid_frames())["arrays"]]
    return 1 + names.index(name)


def _zero_dim_beside(*huge: int) -> Callable[[], list[bytes]]:
    """An empty array whose header claims huge dimensions beside a zero one: 0 bytes by the
    product, but a shape no array may have."""

    def build() -> list[bytes]:
        frames = _hand_built("Params", {"version": 1}, {"arrays.w": np.zeros((0, 2), np.float32)})
        header = _header(frames)
        header["arrays"][0]["shape"] = [0, *huge]
        return [msgpack.packb(header), *frames[1:]]

    return build


def _truncate_last(frames: list[bytes]) -> None:
    """The last array frame that holds bytes loses its last byte."""
    last = max(i for i, frame in enumerate(frames) if len(frame) > 0)
    frames[last] = frames[last][:-1]


def _remove_array(name: str) -> Callable[[], list[bytes]]:
    def build() -> list[bytes]:
        frames = _valid_frames()
        index = _index_of(name)
        header = _header(frames)
        del header["arrays"][index - 1]
        return [msgpack.packb(header), *frames[1:index], *frames[index + 1 :]]

    return build


def _add_array(name: str, array: np.ndarray) -> Callable[[], list[bytes]]:
    def build() -> list[bytes]:
        frames = _valid_frames()
        header = _header(frames)
        header["arrays"].append(
            {
                "name": name,
                "dtype": array.dtype.str,
                "shape": list(array.shape),
                "codec": "raw",
                "nbytes": array.nbytes,
                "raw_nbytes": array.nbytes,
            }
        )
        return [msgpack.packb(header), *frames[1:], array.tobytes()]

    return build


def _corrupt_lz4(frames: list[bytes]) -> None:
    index = _index_of("fields.obs")
    frames[index] = b"\xff" * len(frames[index])


def _pair(keys: np.ndarray, priorities: np.ndarray) -> Callable[[], list[bytes]]:
    return lambda: _hand_built(
        "PriorityUpdate",
        {"table": "t", "learner_rank": 0},
        {"keys": keys, "priorities": priorities},
    )


_OK_KEYS = np.arange(3, dtype=np.int64)

BAD_INPUTS: dict[str, Callable[[], list[Any]]] = {
    "no frames": lambda: [],
    "garbage header": lambda: [b"\xc1\x00garbage"],
    "empty header": lambda: [b""],
    "truncated header": lambda: [_valid_frames()[0][:-3], *_valid_frames()[1:]],
    "trailing bytes after header": lambda: [_valid_frames()[0] + b"\x00", *_valid_frames()[1:]],
    "header is a list": lambda: [msgpack.packb([SCHEMA_VERSION, "Shutdown", {}, []])],
    "header is an int": lambda: [msgpack.packb(7)],
    "header with int keys": lambda: [msgpack.packb({1: 2})],
    "header with extra key": _with_header(lambda h: h.update(pickle="cos\nsystem")),
    "header missing key": _with_header(lambda h: h.pop("scalars")),
    "header with bin value": _with_header(lambda h: h["scalars"].update(table=b"replay")),
    "header with ext value": lambda: [
        msgpack.packb(
            {
                "v": 1,
                "kind": "Shutdown",
                "scalars": {"reason": msgpack.ExtType(1, b"x")},
                "arrays": [],
            }
        )
    ],
    "wrong version": _with_header(lambda h: h.update(v=SCHEMA_VERSION + 1)),
    "version is a bool": _with_header(lambda h: h.update(v=True)),
    "version is a str": _with_header(lambda h: h.update(v="1")),
    "unknown kind": _with_header(lambda h: h.update(kind="Pickle")),
    "kind is not a str": _with_header(lambda h: h.update(kind=["TrajectoryChunk"])),
    "kind of another message": _with_header(lambda h: h.update(kind="Shutdown")),
    "scalars not a map": _with_header(lambda h: h.update(scalars=[1, 2])),
    "missing scalar field": _with_header(lambda h: h["scalars"].pop("table")),
    "extra scalar field": _with_header(lambda h: h["scalars"].update(extra=1)),
    "str for int": _with_header(lambda h: h["scalars"].update(actor_id="3")),
    "bool for int": _with_header(lambda h: h["scalars"].update(actor_id=True)),
    "float for int": _with_header(lambda h: h["scalars"].update(actor_id=3.0)),
    "int over int64": _with_header(lambda h: h["scalars"].update(actor_id=2**63)),
    "nil for str": _with_header(lambda h: h["scalars"].update(table=None)),
    "int for bool": lambda: _hand_built(
        "ActorReport",
        {"actor_id": 0, "incarnation": 0, "is_eval": 1, "env_steps": 0, "weights_version": 0},
        {"episode_returns": np.zeros(0), "episode_lengths": np.zeros(0, np.int64)},
    ),
    "str in float map": lambda: _hand_built("Stats", {"role": "r", "values": {"a": "1"}}, {}),
    "bool in float map": lambda: _hand_built("Stats", {"role": "r", "values": {"a": True}}, {}),
    "float map is a list": lambda: _hand_built("Stats", {"role": "r", "values": [1.0]}, {}),
    "arrays not a list": _with_header(lambda h: h.update(arrays={})),
    "descriptor not a map": _with_header(lambda h: h["arrays"].__setitem__(0, "priorities")),
    "descriptor missing key": _with_header(lambda h: h["arrays"][0].pop("codec")),
    "descriptor extra key": _with_header(lambda h: h["arrays"][0].update(offset=0)),
    "name not a str": _set_descriptor("priorities", name=1),
    "dtype object": _set_descriptor("fields.reward", dtype="|O"),
    "dtype big-endian": _set_descriptor("fields.reward", dtype=">f4"),
    "dtype unicode": _set_descriptor("fields.reward", dtype="<U1"),
    "dtype native spelling": _set_descriptor("fields.reward", dtype="=f4"),
    "dtype complex": _set_descriptor("priorities", dtype="<c8"),
    "dtype void": _set_descriptor("priorities", dtype="|V8"),
    "dtype datetime": _set_descriptor("priorities", dtype="<M8[ns]"),
    "dtype structured": _set_descriptor("priorities", dtype=[["a", "<f8"]]),
    "shape size mismatch": _set_descriptor("priorities", shape=[5]),
    "shape not a list": _set_descriptor("priorities", shape=6),
    "negative dim": _set_descriptor("priorities", shape=[-6]),
    "negative dims that multiply out": _set_descriptor("fields.q_values", shape=[-6, -6]),
    "zero dim beside one over int64": _zero_dim_beside(2**63 - 1),
    "zero dim beside two huge ones": _zero_dim_beside(2**40, 2**40),
    "float dim": _set_descriptor("priorities", shape=[6.0]),
    "bool dim": _set_descriptor("fields.terminated", shape=[True] * 6),
    "too many dims": lambda: _hand_built(
        "Params", {"version": 1}, {"arrays.a": np.zeros((1,) * 9, dtype=np.float32)}
    ),
    "unknown codec": _set_descriptor("priorities", codec="zstd"),
    "negative nbytes": _set_descriptor("priorities", nbytes=-1),
    "nbytes not an int": _set_descriptor("priorities", nbytes="48"),
    "raw nbytes != raw_nbytes": _set_descriptor("priorities", nbytes=40),
    "frame longer than nbytes": _frames_edit(lambda f: f.__setitem__(1, f[1] + b"\x00")),
    "truncated array frame": _frames_edit(_truncate_last),
    "truncated lz4 frame": _frames_edit(
        lambda f: f.__setitem__(_index_of("fields.obs"), f[_index_of("fields.obs")][:-1])
    ),
    "corrupt lz4 data": _frames_edit(_corrupt_lz4),
    "lz4 that decompresses short": _set_descriptor(
        "fields.obs", shape=[6, 4, 84, 85], raw_nbytes=6 * 4 * 84 * 85
    ),
    "extra frame": _frames_edit(lambda f: f.append(b"\x00" * 8)),
    "missing frame": _frames_edit(lambda f: f.pop()),
    "missing array field": _remove_array("priorities"),
    "extra array field": _add_array("bogus", np.zeros(6)),
    "array dict name with empty key": _add_array("fields.", np.zeros(6)),
    "key under a plain array field": _add_array("priorities.x", np.zeros(6)),
    "duplicate array": _add_array("fields.reward", np.zeros(6, dtype=np.float32)),
    "duplicate plain array": _add_array("priorities", np.zeros(6)),
    "lengths disagree (__post_init__)": _pair(_OK_KEYS, np.ones(2)),
    "negative priority (__post_init__)": _pair(_OK_KEYS, np.array([1.0, -1.0, 0.0])),
    "float keys (__post_init__)": _pair(np.arange(3.0), np.ones(3)),
    "2-D keys (__post_init__)": _pair(np.zeros((3, 1), dtype=np.int64), np.ones(3)),
    "chunk without fields (__post_init__)": lambda: _hand_built(
        "TrajectoryChunk",
        {"table": "t", "actor_id": 0, "incarnation": 0, "weights_version": 0},
        {"priorities": np.ones(2)},
    ),
    "zero batch size (__post_init__)": lambda: _hand_built(
        "SampleRequest", {"table": "t", "batch_size": 0}, {}
    ),
    "header over max_header_bytes": lambda: encode(messages.Shutdown(reason="x" * 2**20)),
    "too many frames": lambda: [_valid_frames()[0], *([b""] * 1024)],
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_decode_rejects(case: str) -> None:
    with pytest.raises(DecodeError):
        decode(BAD_INPUTS[case]())


def test_bad_inputs_differ_from_a_valid_message_only_in_their_defect() -> None:
    # The helpers above must produce a decodable message when they change nothing.
    decode(_with_header(lambda h: None)())
    decode(_pair(_OK_KEYS, np.ones(3))())
    decode(_frames_edit(lambda f: None)())


def test_version_mismatch_names_both_versions() -> None:
    with pytest.raises(DecodeError, match=f"{SCHEMA_VERSION + 7}.*{SCHEMA_VERSION}"):
        decode(_with_header(lambda h: h.update(v=SCHEMA_VERSION + 7))())


def test_lz4_bomb_is_rejected_before_decompressing(monkeypatch: pytest.MonkeyPatch) -> None:
    zeros = messages.PublishParams(
        version=1, env_steps=0, arrays={"w": np.zeros(2**20, dtype=np.uint8)}
    )
    frames = encode(zeros)
    assert _header(frames)["arrays"][0]["codec"] == "lz4"
    assert len(frames[1]) < 2**13  # a few KiB that claim a MiB

    def must_not_run(*args: Any, **kwargs: Any) -> bytes:
        raise AssertionError("decompressed an array over the limit")

    monkeypatch.setattr(lz4.block, "decompress", must_not_run)
    with pytest.raises(DecodeError, match="over the limit"):
        decode(frames, Limits(max_array_bytes=2**20 - 1))


def test_many_lz4_frames_are_bounded_by_the_message_limit() -> None:
    arrays = {f"w{i}": np.zeros(2**16, dtype=np.uint8) for i in range(8)}
    frames = encode(messages.PublishParams(version=1, env_steps=0, arrays=arrays))
    assert sum(len(f) for f in frames) < 2**16
    with pytest.raises(DecodeError, match="decompressed"):
        decode(frames, Limits(max_message_bytes=2**16))


def test_message_over_max_message_bytes_is_rejected() -> None:
    frames = encode(EXAMPLES["PublishParams"], compress_min_bytes=2**40)
    with pytest.raises(DecodeError, match="over the limit"):
        decode(frames, Limits(max_message_bytes=sum(len(f) for f in frames) - 1))
    decode(frames, Limits(max_message_bytes=sum(len(f) for f in frames)))


def test_limits_on_frames_and_header_are_configurable() -> None:
    frames = encode(EXAMPLES["TrajectoryChunk"])
    with pytest.raises(DecodeError):
        decode(frames, Limits(max_frames=len(frames) - 1))
    with pytest.raises(DecodeError):
        decode(frames, Limits(max_header_bytes=len(frames[0]) - 1))
    with pytest.raises(DecodeError):
        decode(frames, Limits(max_ndim=3))
    decode(frames, Limits(max_frames=len(frames), max_header_bytes=len(frames[0]), max_ndim=4))


# --- fuzzing -------------------------------------------------------------------------------------

_FUZZ_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2**63,
    -(2**63),
    2**64 - 1,
    1.5,
    float("nan"),
    float("inf"),
    "",
    "x",
    "<f8",
    "|O",
    "lz4",
    "raw",
    [],
    [1],
    [-1, 2],
    [2**62, 2**62],
    {},
    {"a": 1},
]


def _mutate_structure(node: Any, rng: random.Random) -> Any:
    """Replace one randomly chosen value somewhere inside a decoded header."""
    if isinstance(node, dict) and node and rng.random() < 0.9:
        key = rng.choice(list(node))
        node[key] = _mutate_structure(node[key], rng)
        return node
    if isinstance(node, list) and node and rng.random() < 0.9:
        index = rng.randrange(len(node))
        node[index] = _mutate_structure(node[index], rng)
        return node
    return rng.choice(_FUZZ_VALUES)


def _fuzz_case(rng: random.Random, valid: list[list[bytes]]) -> list[bytes]:
    choice = rng.random()
    if choice < 0.2:  # random bytes
        return [rng.randbytes(rng.randrange(64)) for _ in range(rng.randrange(1, 4))]
    frames = list(rng.choice(valid))
    if choice < 0.6:  # structured header mutation
        header = _mutate_structure(msgpack.unpackb(frames[0]), rng)
        frames[0] = msgpack.packb(header)
        return frames
    index = rng.randrange(len(frames))
    data = bytearray(frames[index])
    if choice < 0.85 and data:  # flip bytes
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif data:  # truncate or extend
        data = data[: rng.randrange(len(data))] + rng.randbytes(rng.randrange(3))
    frames[index] = bytes(data)
    if rng.random() < 0.1:
        frames.insert(rng.randrange(len(frames) + 1), rng.randbytes(rng.randrange(16)))
    return frames


def test_fuzz_decode_returns_a_message_or_raises_decode_error() -> None:
    rng = random.Random(1234)
    small_chunk = messages.TrajectoryChunk(
        table="t",
        actor_id=1,
        incarnation=2,
        sequence=5,
        weights_version=3,
        env_steps=0,
        priorities=np.ones(2),
        fields={"obs": np.zeros((2, 3), np.uint8), "big": np.zeros((2, 64), np.float32)},
    )
    sources = [small_chunk, *EXAMPLES.values()]
    valid = [[bytes(f) for f in encode(m, compress_min_bytes=256)] for m in sources]
    outcomes = {"message": 0, "error": 0}
    for _ in range(2000):
        frames = _fuzz_case(rng, valid)
        try:
            msg = decode(frames)
        except DecodeError:
            outcomes["error"] += 1
        else:
            assert type(msg) in messages.MESSAGE_TYPES.values()
            outcomes["message"] += 1
    # Both outcomes occur, so the fuzzer reaches past the first checks.
    assert outcomes["message"] > 0 and outcomes["error"] > 0, outcomes

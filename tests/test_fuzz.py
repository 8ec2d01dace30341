"""Fuzzing every listening socket: a real replay server and a real parameter server each receive
100,000 hostile messages from one DEALER, and must stay up, answer, count what they refused,
still serve valid requests, and (replay) hold only valid items afterwards.

The messages, from a fixed seed: random frames, truncated valid messages, valid messages with
mutated bytes (header and array frames), valid headers with wrong array descriptors, messages
beyond the codec's ``Limits``, and well-formed messages of every kind in ``messages.py`` (but
``Shutdown``, which would stop the server) with random field values. They are pipelined: a
``StatsRequest`` every ``SYNC_EVERY`` messages is the only wait, and replies are read as they come,
so neither side reaches the sockets' high-water mark. Frames over the sockets' ``MAXMSGSIZE`` go
once from a DEALER of their own and as a raw ZMTP frame header, since libzmq drops such a peer.
The learner and the actors bind nothing; the learner group's rendezvous store is torch's.
"""

from __future__ import annotations

import dataclasses
import math
import time
import typing
from collections import Counter
from pathlib import Path

import builders
import lz4.block
import msgpack
import numpy as np
import pytest
import zmq
from conftest import CONFIG, Processes, RoleProcess, request, server_stats, wait_for_server
from test_roles import Run, send_raw_tcp, zmtp_huge_frame

from apexrl.config import Config, load_config
from apexrl.param_server import network_layout
from apexrl.transport import messages, sockets
from apexrl.transport.codec import ALLOWED_DTYPES, DEFAULT_LIMITS, encode
from apexrl.transport.messages import (
    MESSAGE_TYPES,
    SCHEMA_VERSION,
    ActorReport,
    Error,
    InsertAck,
    Message,
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
    StatsRequest,
    TrajectoryChunk,
)

pytestmark = pytest.mark.slow

SEED = 20_26
NUM_MESSAGES = 100_000  # per server
SYNC_EVERY = 400  # messages between two StatsRequest round trips (HIGH_WATER_MARK is 1000)
SYNC_TIMEOUT_S = 60.0  # a server that does not answer a StatsRequest within this is stuck
SWEEP_BATCH = 256  # items per SampleRequest of the final sweep over the table

# Replay without a rate ratio (valid chunks go in at once, sampling is free) and with uniform
# sampling from a small table, so a sweep of batches sees every stored item.
FUZZ_OVERRIDES = (
    "replay.samples_per_insert=0",
    "replay.min_size_to_sample=1",
    "replay.capacity=2000",
    "replay.priority_exponent=0",
    f"learner.batch_size={SWEEP_BATCH}",
)
KINDS = [kind for kind in MESSAGE_TYPES if kind != "Shutdown"]
DTYPES = sorted(dtype.str for dtype in ALLOWED_DTYPES)
EDGE_INTS = (0, 1, -1, 2, 3, 255, 2**31, -(2**31), 2**53, 2**63 - 1, -(2**63))
EDGE_FLOATS = (0.0, -0.0, 1.0, -1.0, math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324)
CATEGORIES = {  # name: share of the messages
    "random_frames": 0.2,
    "truncated": 0.15,
    "mutated": 0.2,
    "bad_descriptor": 0.15,
    "oversized": 0.03,
    "well_formed": 0.27,
}


def pack(kind: str, scalars: dict, arrays: dict[str, np.ndarray]) -> list[bytes]:
    """Frames of a message as the codec lays them out, without the checks of ``encode`` (so
    values that ``__post_init__`` refuses can be sent)."""
    descriptors, frames = [], []
    for name, array in arrays.items():
        data = np.ascontiguousarray(array).tobytes()
        dtype = array.dtype.str
        descriptors.append(
            {
                "name": name,
                "dtype": dtype,
                "shape": list(array.shape),
                "codec": "raw",
                "nbytes": len(data),
                "raw_nbytes": len(data),
            }
        )
        frames.append(data)
    header = {"v": SCHEMA_VERSION, "kind": kind, "scalars": scalars, "arrays": descriptors}
    return [msgpack.packb(header, use_bin_type=True), *frames]


def field_kinds(cls: type) -> dict[str, object]:
    hints = typing.get_type_hints(cls, vars(messages))
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


class Fuzzer:
    """Makes the hostile messages of one run's config, from one seed."""

    def __init__(self, cfg: Config, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.cfg = cfg
        self.item_layout = builders.item_layout(cfg)
        self.spec = self.item_layout.spec
        self.num_actions = self.item_layout.num_actions
        self.layout = network_layout(cfg)
        self.table = cfg.replay.table
        self.max_items = cfg.chunk_items
        self.max_env_steps = cfg.algo.max_env_steps_per_chunk(
            cfg.actor.chunk_steps, cfg.env.num_envs
        )
        self.big_header = msgpack.packb({"v": SCHEMA_VERSION, "pad": "x" * (2**20 + 1)})

    # -- valid messages --------------------------------------------------------------------------

    def valid_items(self, num_items: int) -> dict[str, np.ndarray]:
        return builders.random_items(self.item_layout, num_items, self.rng)

    def valid_chunk(self) -> TrajectoryChunk:
        num_items = int(self.rng.integers(1, self.max_items + 1))
        return TrajectoryChunk(
            self.table,
            int(self.rng.integers(0, self.cfg.actor.num_actors)),
            int(self.rng.integers(0, 2**31)),
            int(self.rng.integers(0, 2**40)),
            int(self.rng.integers(0, 100)),
            int(self.rng.integers(0, self.max_env_steps + 1)),
            self.rng.random(num_items) * 10,
            self.valid_items(num_items),
        )

    def valid_publish(self) -> PublishParams:
        arrays = {
            name: self.rng.normal(0, 0.1, spec.shape).astype(spec.dtype)
            for name, spec in self.layout.items()
        }
        return PublishParams(int(self.rng.integers(0, 1000)), 0, arrays)

    def valid_message(self) -> Message:
        """A valid message of a random kind (server-to-client kinds included), never Shutdown."""
        choice = int(self.rng.integers(0, 10))
        keys = np.arange(4, dtype=np.int64)
        return [
            self.valid_chunk,
            self.valid_publish,
            lambda: SampleRequest(self.table, 4),
            lambda: PriorityUpdate(self.table, 0, keys, np.ones(4)),
            lambda: ActorReport(0, 1, False, 10, 0, np.array([9.0]), np.array([10])),
            lambda: RestoreCounters(int(self.rng.integers(0, 10**6))),
            lambda: StatsRequest(),
            lambda: ParamsRequest(int(self.rng.integers(-1, 5))),
            lambda: InsertAck(self.table, 1, 1),
            lambda: SampleBatch(self.table, 4, keys, np.ones(4), self.valid_items(4)),
        ][choice]()

    def valid_frames(self) -> list[bytes]:
        return [bytes(frame) for frame in encode(self.valid_message())]

    # -- the hostile categories ------------------------------------------------------------------

    def message(self) -> tuple[str, list[bytes]]:
        names = list(CATEGORIES)
        name = names[self.rng.choice(len(names), p=list(CATEGORIES.values()))]
        return name, getattr(self, name)()

    def some_bytes(self, max_log2: int = 16) -> bytes:
        return self.rng.bytes(int(2 ** self.rng.uniform(0, max_log2)) - 1)

    def random_frames(self) -> list[bytes]:
        num_frames = int(self.rng.integers(1, 9)) if self.rng.random() < 0.95 else 200
        return [self.some_bytes(self.rng.choice([4, 10, 16])) for _ in range(num_frames)]

    def truncated(self) -> list[bytes]:
        frames = self.valid_frames()
        how = int(self.rng.integers(0, 3))
        if how == 0 or len(frames) == 1:  # the header cut short
            frames[0] = frames[0][: int(self.rng.integers(0, len(frames[0])))]
        elif how == 1:  # an array frame cut short
            i = int(self.rng.integers(1, len(frames)))
            frames[i] = frames[i][: int(self.rng.integers(0, max(len(frames[i]), 1)))]
        else:  # trailing frames missing
            frames = frames[: int(self.rng.integers(1, len(frames)))]
        return frames

    def mutated(self) -> list[bytes]:
        frames = self.valid_frames()
        i = (
            0
            if len(frames) == 1 or self.rng.random() < 0.5
            else int(self.rng.integers(1, len(frames)))
        )
        data = bytearray(frames[i])
        if not data:
            data = bytearray(self.rng.bytes(4))
        for _ in range(int(self.rng.integers(1, 9))):
            if not data:
                break
            what, at = self.rng.random(), int(self.rng.integers(0, len(data)))
            if what < 0.8:
                data[at] = int(self.rng.integers(0, 256))
            elif what < 0.9:
                del data[at]
            else:
                data.insert(at, int(self.rng.integers(0, 256)))
        frames[i] = bytes(data)
        return frames

    def bad_descriptor(self) -> list[bytes]:
        while True:
            frames = self.valid_frames()
            if len(frames) > 1:
                break
        header = msgpack.unpackb(frames[0], raw=False)
        descriptors = header["arrays"]
        i = int(self.rng.integers(0, len(descriptors)))
        d = dict(descriptors[i])
        choice = int(self.rng.integers(0, 17))
        if choice == 0:
            d["dtype"] = str(self.rng.choice([*DTYPES, "|O", "<U4", "|V8", ">f4", "<c8", ""]))
        elif choice == 1:
            d["dtype"] = [5, None, 1.5, b"<f4"][int(self.rng.integers(0, 4))]
        elif choice == 2:  # the same byte count in another shape: fine for the codec
            d["shape"] = [math.prod(d["shape"])]
        elif choice == 3:
            d["shape"] = [[], [-1], [2**40], [1] * 9, ["a"], 7, None, [2**64 - 1]][
                int(self.rng.integers(0, 8))
            ]
        elif choice == 4:  # a zero-sized array with a dimension beyond what numpy can hold
            d["shape"], d["nbytes"], d["raw_nbytes"] = [0, 2**63], 0, 0
            frames[i + 1] = b""
        elif choice == 5:
            d["nbytes"] = d["nbytes"] + int(self.rng.choice([-1, 1, 2**40]))
        elif choice == 6:
            d["raw_nbytes"] = d["raw_nbytes"] + int(self.rng.choice([-1, 1]))
        elif choice == 7:
            d["nbytes"] = [-1, 2**64 - 1, 1.5, "8", None][int(self.rng.integers(0, 5))]
        elif choice == 8:  # raw bytes called LZ4: bad LZ4 data, or a size that does not match
            d["codec"] = "lz4"
        elif choice == 9:
            d["codec"] = ["zstd", "", None, 0, "RAW"][int(self.rng.integers(0, 5))]
        elif choice == 10:
            d["name"] = ["", ".", "fields.", "fields", "nope", 3, "arrays..x"][
                int(self.rng.integers(0, 7))
            ]
        elif choice == 11:
            d["name"] = descriptors[(i + 1) % len(descriptors)]["name"]  # a duplicate
        elif choice == 12:
            d["extra"] = 1
        elif choice == 13:
            del d[str(self.rng.choice(sorted(d)))]
        elif choice == 14:
            d = [None, [], 3, "x"][int(self.rng.integers(0, 4))]
        elif choice == 15:  # a descriptor too few, or too many
            if self.rng.random() < 0.5:
                del descriptors[i]
            else:
                descriptors.append(d)
        else:  # the same bytes as another allowed dtype of the same item size
            same = [s for s in DTYPES if np.dtype(s).itemsize == np.dtype(d["dtype"]).itemsize]
            d["dtype"] = str(self.rng.choice(same))
        if choice != 15:
            descriptors[i] = d
        return [msgpack.packb(header, use_bin_type=True), *frames[1:]]

    def oversized(self) -> list[bytes]:
        limits = DEFAULT_LIMITS
        over_array = limits.max_array_bytes + 8
        choice = int(self.rng.integers(0, 6))
        if choice == 0:  # a header frame over max_header_bytes
            return [self.big_header]
        if choice == 1:  # more frames than max_frames
            return [self.valid_frames()[0]] + [b""] * limits.max_frames
        if choice == 2:  # an array over max_array_bytes, declared as a tiny LZ4 frame
            arrays = [lz4_descriptor("fields.obs", [over_array // 4], over_array)]
            return [tiny_chunk_header(arrays), b"\0" * 16]
        if choice == 3:  # arrays within max_array_bytes each, over max_message_bytes together
            each = limits.max_array_bytes // 4 * 4
            count = limits.max_message_bytes // each + 1
            arrays = [lz4_descriptor(f"fields.f{k}", [each // 4], each) for k in range(count)]
            return [tiny_chunk_header(arrays), *([b"\0" * 16] * count)]
        if choice == 4:  # a msgpack array header announcing 2**32 - 1 elements
            return [b"\xdd\xff\xff\xff\xff"]
        # a valid LZ4 block that expands to 8 MiB of zeros: within limits, then refused
        raw = 8 * 2**20
        block = lz4.block.compress(bytes(raw), store_size=False)
        arrays = [lz4_descriptor("fields.obs", [raw // 4], raw, nbytes=len(block))]
        return [tiny_chunk_header(arrays), block]

    def well_formed(self) -> list[bytes]:
        """A message of any kind with the right header layout and random values of the field
        types (numbers at their edges, arrays of any allowed dtype and shape)."""
        kind = KINDS[int(self.rng.integers(0, len(KINDS)))]
        cls = MESSAGE_TYPES[kind]
        if cls is TrajectoryChunk and self.rng.random() < 0.5:
            return self.near_valid_chunk()
        if cls is PublishParams and self.rng.random() < 0.5:
            return self.near_valid_publish()
        scalars, arrays = {}, {}
        for name, hint in field_kinds(cls).items():
            if hint is np.ndarray:
                arrays[name] = self.random_array()
            elif hint == dict[str, np.ndarray]:
                for k in range(int(self.rng.integers(0, 4))):
                    arrays[f"{name}.{self.random_key(k)}"] = self.random_array()
            elif hint == dict[str, float]:
                scalars[name] = {self.random_key(k): self.random_float() for k in range(3)}
            else:
                scalars[name] = self.random_scalar(hint)
        return pack(kind, scalars, arrays)

    def near_valid_chunk(self) -> list[bytes]:
        """A chunk of the run's layout with random values, most with one thing wrong."""
        chunk = self.valid_chunk()
        fields = dict(chunk.fields)
        priorities = chunk.priorities
        scalars = {
            "table": chunk.table,
            "actor_id": chunk.actor_id,
            "incarnation": chunk.incarnation,
            "weights_version": chunk.weights_version,
            "env_steps": chunk.env_steps,
        }
        name = str(self.rng.choice(sorted(fields)))
        array = fields[name].copy()
        flat = array.reshape(-1)
        choice = int(self.rng.integers(0, 13))
        if choice == 0 and array.dtype.kind == "f":
            flat[int(self.rng.integers(0, flat.size))] = self.rng.choice([np.nan, np.inf, -np.inf])
        elif choice == 1 and name in self.cfg.algo.ACTION_FIELDS:
            flat[int(self.rng.integers(0, flat.size))] = self.rng.choice(
                [-1, self.num_actions, 2**62, -(2**63)]
            )
        elif choice == 2 and array.dtype.kind == "b":
            array = array.view(np.uint8)
            array.reshape(-1)[0] = int(self.rng.integers(2, 256))
            array = array.view(np.bool_)
        elif choice == 3:
            array = array.astype(self.rng.choice(DTYPES))
        elif choice == 4:
            array = array.reshape(array.shape[0], -1)[:, :0] if array.ndim > 1 else array[:0]
        elif choice == 5:
            array = np.concatenate([array, array])
        elif choice == 6:
            del fields[name]
        elif choice == 7:
            fields["extra"] = array
        elif choice == 8:
            priorities = priorities.copy()
            priorities[0] = self.rng.choice([np.nan, -1.0, np.inf, 1e300])
        elif choice == 9:
            scalars[str(self.rng.choice(["actor_id", "env_steps"]))] = int(
                self.rng.choice(EDGE_INTS)
            )
        elif choice == 10:
            scalars["table"] = str(self.rng.choice(["", "other", self.table.upper()]))
        elif choice == 11:  # more items than an actor sends
            fields = self.valid_items(self.max_items + 1)
            priorities = np.ones(self.max_items + 1)
        # choice 12 and the choices that do not apply to this field: a valid chunk
        if choice not in (6, 7, 11):
            fields[name] = array
        return pack("TrajectoryChunk", scalars, {"priorities": priorities, **prefixed(fields)})

    def near_valid_publish(self) -> list[bytes]:
        """The run's network with random weights, most with one array wrong."""
        arrays = dict(self.valid_publish().arrays)
        name = str(self.rng.choice(sorted(arrays)))
        choice = int(self.rng.integers(0, 6))
        if choice == 0:
            arrays[name] = arrays[name].copy()
            arrays[name].reshape(-1)[0] = np.nan
        elif choice == 1:
            arrays[name] = arrays[name].astype(np.float64)
        elif choice == 2:
            arrays[name] = arrays[name].reshape(-1)[:-1]
        elif choice == 3:
            del arrays[name]
        elif choice == 4:
            arrays["extra.weight"] = arrays[name]
        version = int(self.rng.choice([*EDGE_INTS, 7]))
        scalars = {"version": version, "env_steps": int(self.rng.choice(EDGE_INTS))}
        return pack("PublishParams", scalars, {f"arrays.{k}": a for k, a in arrays.items()})

    def random_key(self, k: int) -> str:
        return ["", "a", "é", "x.y", "w" * 300, str(k)][int(self.rng.integers(0, 6))] + str(k)

    def random_float(self) -> float:
        if self.rng.random() < 0.5:
            return float(self.rng.choice(EDGE_FLOATS))
        return float(self.rng.normal(0, 1e6))

    def random_scalar(self, hint: object) -> object:
        if self.rng.random() < 0.05:  # a value of the wrong type
            return [None, "s", 1.5, [1], {"a": 1}, b"b", True][int(self.rng.integers(0, 7))]
        if hint is int:
            return int(self.rng.choice(EDGE_INTS))
        if hint is float:
            return self.random_float()
        if hint is bool:
            return bool(self.rng.random() < 0.5)
        return [self.table, "", "x" * 1000, "\u2603", "apex_dqn\0"][int(self.rng.integers(0, 5))]

    def random_array(self) -> np.ndarray:
        dtype = np.dtype(str(self.rng.choice(DTYPES)))
        ndim = int(self.rng.integers(0, 4))
        shape = tuple(int(self.rng.choice([0, 1, 2, 3, 4, 7, 16])) for _ in range(ndim))
        count = math.prod(shape)
        return np.frombuffer(self.rng.bytes(count * dtype.itemsize), dtype).reshape(shape)


def prefixed(fields: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {f"fields.{name}": array for name, array in fields.items()}


def lz4_descriptor(name: str, shape: list[int], raw_nbytes: int, nbytes: int = 16) -> dict:
    return {
        "name": name,
        "dtype": "<f4",
        "shape": shape,
        "codec": "lz4",
        "nbytes": nbytes,
        "raw_nbytes": raw_nbytes,
    }


def tiny_chunk_header(arrays: list[dict]) -> bytes:
    scalars = {"table": "apex_dqn", "actor_id": 0, "incarnation": 1, "weights_version": 0}
    header = {
        "v": SCHEMA_VERSION,
        "kind": "TrajectoryChunk",
        "scalars": {**scalars, "env_steps": 1},
        "arrays": arrays,
    }
    return msgpack.packb(header, use_bin_type=True)


# --- sending ------------------------------------------------------------------------------------


class Replies:
    """What came back: counts by kind, the reasons of Errors that say handling failed, and the
    last synchronisation marker seen."""

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.last_marker = ""

    def take(self, msg: Message) -> None:
        self.kinds[type(msg).__name__] += 1
        if isinstance(msg, Error) and "failed to handle" in msg.reason:
            self.failures[msg.reason] += 1
        if isinstance(msg, Error) and "'sync-" in msg.reason:
            self.last_marker = msg.reason


def marker(i: int) -> list[bytes]:
    """A message of the unknown kind ``sync-<i>``: every server answers it with an Error that
    names the kind, so its reply says that every earlier reply has been read (one peer's
    requests are answered in order; held inserts and samples are answered later, but only
    with InsertAck, SampleBatch or a counted Error)."""
    header = {"v": SCHEMA_VERSION, "kind": f"sync-{i}", "scalars": {}, "arrays": []}
    return [msgpack.packb(header)]


def drain(sock: zmq.Socket, replies: Replies, until: str = "", timeout_s: float = 0.0) -> bool:
    """Read every reply that is there, and wait up to ``timeout_s`` for the Error that names
    ``until`` (True when it came). Every reply must decode: a server never answers garbage."""
    deadline = time.monotonic() + timeout_s
    while until not in replies.last_marker or not until:
        wait_ms = max(int((deadline - time.monotonic()) * 1000), 0)
        msg = sockets.recv(sock, timeout_ms=wait_ms)
        if msg is None:
            break
        replies.take(msg)
    return until in replies.last_marker


def fuzz(proc: RoleProcess, addr: str, fuzzer: Fuzzer) -> tuple[Replies, Counter[str], float]:
    """Send ``NUM_MESSAGES`` hostile messages to ``addr``; returns the replies, the messages sent
    by category and the seconds it took. A round trip every ``SYNC_EVERY`` messages keeps at
    most that many in flight, and the last one reads every reply."""
    replies, sent = Replies(), Counter()
    ctx = sockets.make_context()
    with sockets.closing(ctx):
        sock = sockets.connect(ctx, zmq.DEALER, addr)
        started = time.monotonic()
        for i in range(1, NUM_MESSAGES + 1):
            category, frames = fuzzer.message()
            sent[category] += 1
            sock.send_multipart(frames, copy=False)
            drain(sock, replies)
            if i % SYNC_EVERY == 0 or i == NUM_MESSAGES:
                sock.send_multipart(marker(i))
                deadline = time.monotonic() + SYNC_TIMEOUT_S
                while not drain(sock, replies, f"'sync-{i}'", 1.0):
                    if proc.alive() and time.monotonic() < deadline:
                        continue
                    pytest.fail(
                        f"no answer to the marker after {i} messages (server alive: "
                        f"{proc.alive()}; sent {dict(sent)}, replies {dict(replies.kinds)})\n"
                        f"{proc.tail(60)}"
                    )
        took_s = time.monotonic() - started
    return replies, sent, took_s


def send_over_maxmsgsize(addr: str) -> None:
    """One frame over ``MAXMSGSIZE`` from a DEALER, and a ZMTP frame header announcing 2**40
    bytes over raw TCP: libzmq drops both peers before allocating anything."""
    ctx = sockets.make_context()
    with sockets.closing(ctx):
        sock = sockets.connect(ctx, zmq.DEALER, addr)
        sock.send(bytes(DEFAULT_LIMITS.max_message_bytes + 1), copy=False)
        assert sockets.recv(sock, timeout_ms=2000) is None
    for _ in range(3):
        send_raw_tcp(addr, zmtp_huge_frame())


def run_fuzz(procs: Processes, tmp_path: Path, server: str) -> tuple[Run, Replies, float]:
    run = Run(tmp_path, overrides=FUZZ_OVERRIDES)
    cfg = load_config(CONFIG, list(run.overrides))
    proc = procs.start(server, *run.args(server))
    addr = run.addr(server)
    metric = f"{server}/rejected_messages"
    before = wait_for_server(proc, addr)[metric]
    replies, sent, took_s = fuzz(proc, addr, Fuzzer(cfg, SEED))
    after = server_stats(addr)[metric]
    print(
        f"\n{server}: {NUM_MESSAGES} messages in {took_s:.1f} s, {NUM_MESSAGES / took_s:.0f} "
        f"messages/s; sent {dict(sorted(sent.items()))}; replies "
        f"{dict(sorted(replies.kinds.items()))}; rejected_messages {before:.0f} -> {after:.0f}"
    )
    assert not replies.failures, f"handling failed (a server bug): {dict(replies.failures)}"
    # Every refusal is answered with one Error, and every reply was read.
    assert after - before == replies.kinds["Error"] > NUM_MESSAGES // 2, (before, after)

    send_over_maxmsgsize(addr)
    assert proc.alive(), proc.tail(60)
    stats = server_stats(addr)
    assert stats is not None, f"{server} does not answer after the fuzzing\n{proc.tail(60)}"
    assert "Traceback" not in proc.log(), proc.tail(60)
    return run, replies, took_s


def test_replay_server_survives_fuzzing_and_holds_only_valid_items(
    procs: Processes, tmp_path: Path
) -> None:
    run, replies, _ = run_fuzz(procs, tmp_path, "replay")
    addr = run.replay_addr
    assert replies.kinds["InsertAck"] > 0 and replies.kinds["SampleBatch"] > 0, replies.kinds
    fuzzer = Fuzzer(load_config(CONFIG, list(run.overrides)), SEED + 1)
    assert isinstance(request(addr, fuzzer.valid_chunk()), InsertAck)
    batch = request(addr, SampleRequest("apex_dqn", 4))
    assert isinstance(batch, SampleBatch) and batch.keys.shape == (4,), batch

    # Sweep the table (uniform sampling) until every stored key was seen, checking each item.
    stats = server_stats(addr)
    size, num_inserted = int(stats["replay/size"]), int(stats["replay/num_inserted"])
    stored = set(range(num_inserted - size, num_inserted))
    seen: set[int] = set()
    num_steps_seen: set[int] = set()
    batch_size = min(SWEEP_BATCH, size)  # a request for more than the table holds would wait
    for _ in range(60 * max(size // batch_size, 1)):
        batch = request(addr, SampleRequest("apex_dqn", batch_size))
        assert isinstance(batch, SampleBatch), batch
        assert set(batch.fields) == set(fuzzer.spec), sorted(batch.fields)
        for name, (dtype, shape) in fuzzer.spec.items():
            array = batch.fields[name]
            assert array.dtype == dtype and array.shape == (batch_size, *shape), name
            if array.dtype.kind == "f":
                assert np.isfinite(array).all(), f"{name} holds non-finite values"
            if array.dtype.kind == "b":
                assert array.view(np.uint8).max() <= 1, f"{name} holds non-bool bytes"
        action = batch.fields["action"]
        assert 0 <= action.min() and action.max() < fuzzer.num_actions, (action.min(), action.max())
        num_steps_seen.update(np.unique(batch.fields["num_steps"]).tolist())
        seen.update(batch.keys.tolist())
        if seen >= stored:
            break
    assert seen == stored, f"{len(stored - seen)} of {size} stored items never sampled"
    print(f"replay: swept all {size} stored items; num_steps values {sorted(num_steps_seen)}")
    code, _ = procs.started[0].stop(10.0)
    assert code == 0, procs.started[0].tail()


def test_parameter_server_survives_fuzzing_and_serves_the_last_valid_publish(
    procs: Processes, tmp_path: Path
) -> None:
    run, replies, _ = run_fuzz(procs, tmp_path, "params")
    addr = run.params_addr
    assert replies.kinds["PublishAck"] > 0, replies.kinds
    fuzzer = Fuzzer(load_config(CONFIG, list(run.overrides)), SEED + 1)
    publish = fuzzer.valid_publish()
    ack = request(addr, PublishParams(123_456, 1, publish.arrays))
    assert isinstance(ack, PublishAck) and ack.version == 123_456, ack
    params = request(addr, ParamsRequest(-1))
    assert isinstance(params, Params) and params.version == 123_456, params
    assert params.arrays.keys() == publish.arrays.keys()
    for name, array in publish.arrays.items():
        np.testing.assert_array_equal(params.arrays[name], array)
    assert isinstance(request(addr, ParamsRequest(123_456)), ParamsNotModified)
    # A stranger's Shutdown was never among the fuzz: the server stops cleanly on SIGTERM.
    assert not isinstance(request(addr, StatsRequest()), Shutdown)
    code, _ = procs.started[0].stop(10.0)
    assert code == 0, procs.started[0].tail()

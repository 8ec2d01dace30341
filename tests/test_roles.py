"""Each role as a real process on loopback: starting alone, stopping on SIGTERM and on ``Shutdown``,
surviving garbage on its socket, a whole run's data flow, the stop condition, resuming, and the
clear exit-2 errors of a bad config or environment."""

from __future__ import annotations

import json
import random
import re
import signal
import socket
import struct
import time
from pathlib import Path
from urllib.parse import urlsplit

import builders
import msgpack
import numpy as np
import pytest
import torch
from conftest import (
    CONFIG,
    SMALL_OVERRIDES,
    Processes,
    RoleProcess,
    free_addr,
    request,
    send_frames,
    server_stats,
    set_args,
    wait_for_server,
    wait_until,
)

from apexrl.param_server import network_layout
from apexrl.transport.codec import encode
from apexrl.transport.messages import (
    Error,
    InsertAck,
    Params,
    ParamsNotModified,
    ParamsRequest,
    PublishAck,
    PublishParams,
    SampleBatch,
    SampleRequest,
    Shutdown,
    StatsRequest,
    TrajectoryChunk,
)

SERVERS = ("replay", "params")
STOP_BOUND_S = 8.0  # a stopped role must exit within this (generous on a loaded two-core box)


class Run:
    """Addresses and run directory shared by the roles of one test."""

    def __init__(
        self, tmp_path: Path, overrides: tuple[str, ...] = (), config: Path = CONFIG
    ) -> None:
        self.replay_addr = free_addr()
        self.params_addr = free_addr()
        self.run_dir = tmp_path / "run"
        self.overrides = SMALL_OVERRIDES + overrides
        self.config = config

    def args(self, role: str, *extra: str) -> list[str]:
        common = ["--config", str(self.config), "--run-dir", str(self.run_dir)]
        if role == "replay":
            common += ["--bind", self.replay_addr]
        elif role == "params":
            common += ["--bind", self.params_addr]
        else:
            common += ["--replay", self.replay_addr, "--params", self.params_addr]
        return [role, *common, *extra, *set_args(self.overrides)]

    def addr(self, server: str) -> str:
        return self.replay_addr if server == "replay" else self.params_addr

    def results(self) -> list[dict]:
        path = self.run_dir / "result.json"
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def start_servers(procs: Processes, run: Run) -> dict[str, RoleProcess]:
    started = {name: procs.start(name, *run.args(name)) for name in SERVERS}
    for name, proc in started.items():
        wait_for_server(proc, run.addr(name))
    return started


def assert_exits(proc: RoleProcess, within_s: float, procs: Processes) -> None:
    code = proc.wait(within_s)
    assert code == 0, f"{proc.name}: exit code {code} (None: still running)\n{procs.tails()}"


def stop_and_check(procs: Processes, roles: list[RoleProcess]) -> None:
    """SIGTERM all of ``roles`` at once; each must exit 0 within ``STOP_BOUND_S``."""
    started = time.monotonic()
    for proc in roles:
        proc.popen.send_signal(signal.SIGTERM)
    for proc in roles:
        code = proc.wait(max(STOP_BOUND_S - (time.monotonic() - started), 0.1))
        assert code == 0, f"{proc.name} after SIGTERM: exit code {code}\n{procs.tails()}"


# --- servers alone ------------------------------------------------------------------------------


def test_servers_start_alone_and_stop_on_sigterm(procs: Processes, tmp_path: Path) -> None:
    run = Run(tmp_path)
    servers = start_servers(procs, run)
    assert server_stats(run.replay_addr)["replay/size"] == 0
    assert server_stats(run.params_addr)["params/version"] == -1
    for proc in servers.values():
        code, took_s = proc.stop(STOP_BOUND_S)
        assert code == 0, f"exit code {code}\n{proc.tail()}"
        assert took_s < 5.0, f"{proc.name} took {took_s:.1f} s to stop"
        assert "received SIGTERM" in proc.log()


def test_servers_stop_on_shutdown_message(procs: Processes, tmp_path: Path) -> None:
    run = Run(tmp_path)
    servers = start_servers(procs, run)
    for name in servers:
        # params answers Shutdown with Shutdown; replay sends nothing back (its docstring).
        reply = request(run.addr(name), Shutdown("test"), timeout_s=0.5)
        assert reply is None or isinstance(reply, Shutdown), f"{name} answered {reply!r}"
        # During the grace period every request is answered with Shutdown, so peers stop too.
        assert isinstance(request(run.addr(name), StatsRequest()), Shutdown)
    for proc in servers.values():
        # SHUTDOWN_GRACE_S (3 s) of answering Shutdown, then exit.
        assert_exits(proc, 3.0 + STOP_BOUND_S, procs)


# --- garbage ------------------------------------------------------------------------------------


def valid_message(server: str) -> TrajectoryChunk | PublishParams:
    """A valid message with arrays, the base of the malformed variants."""
    if server == "replay":
        return chunk(num_items=8)
    # The parameter server accepts only the run's network layout.
    layout = network_layout(builders.config(small=True))
    return PublishParams(3, 0, {name: np.ones(a.shape, a.dtype) for name, a in layout.items()})


def chunk(num_items: int) -> TrajectoryChunk:
    """A valid chunk of the small run's Ape-X CartPole transitions."""
    return builders.chunk(builders.config(small=True), np.ones(num_items))


def malformed_frames(server: str) -> dict[str, list[bytes]]:
    """Multipart messages that must each be answered with ``Error``."""
    rng = random.Random(0)
    frames = [bytes(f) for f in encode(valid_message(server))]
    header = msgpack.unpackb(frames[0], raw=False)

    def with_header(**changes: object) -> list[bytes]:
        return [msgpack.packb({**header, **changes}), *frames[1:]]

    huge_array = dict(header["arrays"][0], shape=[2**40], nbytes=2**43, raw_nbytes=2**43)
    last = max(i for i, frame in enumerate(frames) if frame)  # the last array frame with bytes
    truncated = [*frames[:last], frames[last][:-3], *frames[last + 1 :]]
    return {
        "empty frame": [b""],
        "random bytes": [rng.randbytes(64)],
        "random multipart": [rng.randbytes(1), rng.randbytes(300), rng.randbytes(3)],
        "truncated header": [frames[0][: len(frames[0]) // 2], *frames[1:]],
        "missing array frame": frames[:-1],
        "truncated array frame": truncated,
        "extra frame": [*frames, b"extra"],
        "wrong version": with_header(v=99),
        "unknown kind": with_header(kind="NoSuchMessage"),
        "huge declared array": with_header(arrays=[huge_array, *header["arrays"][1:]]),
        "huge declared msgpack array": [b"\xdd\xff\xff\xff\xff"],
        "object dtype": with_header(
            arrays=[dict(header["arrays"][0], dtype="|O"), *header["arrays"][1:]]
        ),
    }


def zmtp_huge_frame() -> bytes:
    """A ZMTP 3.0 greeting, a READY for a DEALER and then a frame announcing 2**40 bytes, which
    MAXMSGSIZE must refuse before allocating anything."""
    greeting = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" * 32
    prop = b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    ready = b"\x05READY" + prop
    return greeting + b"\x04" + bytes([len(ready)]) + ready + b"\x02" + struct.pack(">Q", 2**40)


def send_raw_tcp(addr: str, payload: bytes) -> None:
    parts = urlsplit(addr)
    with socket.create_connection((parts.hostname, parts.port), timeout=2.0) as sock:
        try:
            sock.sendall(payload)
            sock.recv(256)  # the server's greeting, or nothing when it drops us
        except (TimeoutError, ConnectionError):
            pass


def serves_normal_requests(server: str, addr: str) -> None:
    if server == "replay":
        ack = request(addr, chunk(num_items=8))
        assert isinstance(ack, InsertAck), ack
        batch = request(addr, SampleRequest("apex_dqn", 4))
        assert isinstance(batch, SampleBatch) and batch.keys.shape == (4,), batch
    else:
        assert isinstance(request(addr, ParamsRequest(-1)), ParamsNotModified)
        assert isinstance(request(addr, valid_message("params")), PublishAck)
        params = request(addr, ParamsRequest(-1))
        assert isinstance(params, Params) and params.version == 3, params


def settled_count(addr: str, metric: str) -> float:
    """The metric once two reads 0.2 s apart agree (frames may still be in libzmq's queues)."""
    previous = server_stats(addr)[metric]
    for _ in range(10):
        time.sleep(0.2)
        current = server_stats(addr)[metric]
        if current == previous:
            return current
        previous = current
    pytest.fail(f"{metric} keeps changing: {current}")


@pytest.mark.parametrize("server", SERVERS)
def test_server_survives_garbage(procs: Processes, tmp_path: Path, server: str) -> None:
    run = Run(tmp_path, overrides=("replay.min_size_to_sample=4",))
    proc = procs.start(server, *run.args(server))
    addr = run.addr(server)
    metric = f"{server}/rejected_messages"
    before = wait_for_server(proc, addr)[metric]

    # (a) not ZeroMQ at all. libzmq still speaks ZMTP 1.0, which has no signature, so random
    # bytes may reach the server as frames (and be rejected); the rest just closes the connection.
    rng = random.Random(1)
    for payload in (
        rng.randbytes(64),
        rng.randbytes(5000),
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        zmtp_huge_frame(),
    ):
        send_raw_tcp(addr, payload)
    assert proc.alive(), proc.tail()
    after_raw = settled_count(addr, metric)
    assert after_raw >= before

    # (b) malformed multipart messages from a DEALER: each answered with Error and counted.
    cases = malformed_frames(server)
    for name, frames in cases.items():
        reply = send_frames(addr, frames)
        assert isinstance(reply, Error), f"{name}: {reply!r}\n{proc.tail()}"

    # (c) a valid message of a kind this server does not take.
    unexpected = InsertAck("apex_dqn", 1, 1) if server == "replay" else SampleRequest("x", 1)
    reply = request(addr, unexpected)
    assert isinstance(reply, Error), reply
    assert "does not accept" in reply.reason

    assert proc.alive(), proc.tail()
    assert server_stats(addr)[metric] == after_raw + len(cases) + 1
    serves_normal_requests(server, addr)
    code, _ = proc.stop(STOP_BOUND_S)
    assert code == 0, proc.tail()


# --- a whole run --------------------------------------------------------------------------------


def actor_weights_versions(run_dir: Path, role: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb" / role))
    acc.Reload()
    if "actor/weights_version" not in acc.Tags()["scalars"]:
        return []
    return [event.value for event in acc.Scalars("actor/weights_version")]


def test_pipeline_data_updates_weights_and_priorities_flow(
    procs: Processes, tmp_path: Path
) -> None:
    run = Run(tmp_path)
    servers = start_servers(procs, run)
    learner = procs.start("learner", *run.args("learner"))
    actor = procs.start("actor_0", *run.args("actor", "--id", "0", "--num-actors", "1"))

    def replay_stats() -> dict[str, float]:
        return server_stats(run.replay_addr) or {}

    first = wait_until(lambda: replay_stats().get("replay/env_steps", 0) > 0, 60)
    assert first, f"no env steps reached replay\n{procs.tails()}"
    grew = wait_until(lambda: replay_stats().get("replay/size", 0) >= 400, 30)
    assert grew, f"replay did not fill up: {replay_stats()}\n{procs.tails()}"
    updated = wait_until(lambda: [r for r in run.results() if r["learner_updates"] > 0], 30)
    assert updated, f"no result.json line with updates\n{procs.tails()}"
    assert wait_until(lambda: replay_stats().get("replay/priority_updates", 0) > 0, 10)
    published = wait_until(
        lambda: (server_stats(run.params_addr) or {})["params/version"] >= 10, 30
    )
    assert published, f"params version stuck: {server_stats(run.params_addr)}\n{procs.tails()}"

    # The actor's event file is flushed every few seconds; wait until it shows the weights
    # changing under it, up to a version >= 10 (how soon depends on the machine's load).
    def versions_seen() -> list[float]:
        versions = actor_weights_versions(run.run_dir, "actor_0")
        return versions if len(set(versions)) >= 2 and max(versions) >= 10 else []

    versions = wait_until(versions_seen, 30, 1.0)
    assert versions, f"actor never reported weights up to version 10\n{actor.tail()}"
    stats = replay_stats()
    assert stats["replay/env_steps"] > first and stats["replay/rejected_messages"] == 0, stats

    stop_and_check(procs, [actor, learner, *servers.values()])
    all_versions = actor_weights_versions(run.run_dir, "actor_0")
    assert len(set(all_versions)) >= 2 and max(all_versions) >= 10, all_versions
    assert (run.run_dir / "checkpoint.pt").is_file()
    assert (run.run_dir / "config.yaml").is_file()


def test_stop_condition_ends_every_role_by_itself(procs: Processes, tmp_path: Path) -> None:
    run = Run(tmp_path, overrides=("run.stop_env_steps=3000",))
    servers = start_servers(procs, run)
    learner = procs.start("learner", *run.args("learner"))
    actor = procs.start("actor_0", *run.args("actor", "--id", "0", "--num-actors", "1"))
    evaluator = procs.start("eval", *run.args("actor", "--eval"))

    assert_exits(learner, 90.0, procs)
    results = run.results()
    assert results and results[-1]["done"] is True, results[-3:]
    assert results[-1]["env_steps"] >= 3000
    assert "stop condition met" in learner.log()
    for proc in (*servers.values(), actor, evaluator):
        # The servers answer Shutdown for their grace period, which also reaches the actors.
        assert_exits(proc, 3.0 + STOP_BOUND_S, procs)
    assert "servers are shutting down" in actor.log(), actor.tail()
    assert "servers are shutting down" in evaluator.log(), evaluator.tail()


def first_weights_version(proc: RoleProcess) -> int | None:
    """The weights version an actor played first (its "playing weights version N" line)."""
    found = re.search(r"playing weights version (\d+)", proc.log())
    return int(found.group(1)) if found else None


def test_a_learner_stopped_alone_resumes_with_the_servers_still_running(
    procs: Processes, tmp_path: Path
) -> None:
    run = Run(tmp_path, overrides=("learner.checkpoint_period=20",))
    servers = start_servers(procs, run)
    actor = procs.start("actor_0", *run.args("actor", "--id", "0", "--num-actors", "1"))
    first = procs.start("learner", *run.args("learner"))
    assert wait_until(lambda: [r for r in run.results() if r["learner_updates"] >= 40], 60)
    code, _ = first.stop(STOP_BOUND_S)  # SIGTERM to the learner alone: the rest runs on
    assert code == 0, first.tail()
    stopped_at = int(first.log().rsplit("stopped after ", 1)[1].split()[0])
    assert all(p.alive() for p in (actor, *servers.values())), procs.tails()
    num_lines = len(run.results())

    second = procs.start("learner_resumed", *run.args("learner", "--resume"))
    resumed = wait_until(lambda: f"at update {stopped_at}," in second.log(), 30)
    assert resumed, f"expected 'resumed ... at update {stopped_at}'\n{second.tail()}"
    assert wait_until(
        lambda: [r for r in run.results()[num_lines:] if r["learner_updates"] > stopped_at], 30
    ), f"{run.results()[num_lines:]}\n{second.tail()}"
    after = run.results()[num_lines:]
    assert all(r["learner_updates"] >= stopped_at for r in after)
    # Replay kept counting through the restart: the count did not start over.
    assert after[0]["env_steps"] >= run.results()[num_lines - 1]["env_steps"]
    stop_and_check(procs, [actor, second, *servers.values()])


def test_a_stopped_run_resumes_with_every_counter_and_the_checkpoints_policy(
    procs: Processes, tmp_path: Path
) -> None:
    run = Run(tmp_path, overrides=("learner.checkpoint_period=20",))
    servers = start_servers(procs, run)
    actor = procs.start("actor_0", *run.args("actor", "--id", "0", "--num-actors", "1"))
    first = procs.start("learner", *run.args("learner"))
    assert wait_until(lambda: [r for r in run.results() if r["learner_updates"] >= 40], 60)
    stopper = procs.start("stop", "stop", "--replay", run.replay_addr, "--params", run.params_addr)
    assert stopper.wait(STOP_BOUND_S) == 0, stopper.tail()
    for proc in (first, *servers.values(), actor):
        assert_exits(proc, 3.0 + STOP_BOUND_S, procs)
    stopped_at = int(first.log().rsplit("stopped after ", 1)[1].split()[0])
    assert stopped_at >= 40
    counters = torch.load(run.run_dir / "checkpoint.pt", weights_only=True)["counters"]
    before = run.results()
    assert counters["env_steps"] >= before[-1]["env_steps"] > 0, (counters, before[-1])
    assert counters["elapsed_ms"] / 1000 >= before[-1]["time_s"]

    # The whole run again, resumed: the actors wait for the checkpoint's weights.
    servers = start_servers(procs, run)
    second = procs.start("learner_resumed", *run.args("learner", "--resume"))
    actor = procs.start(
        "actor_0_resumed", *run.args("actor", "--id", "0", "--num-actors", "1", "--resume")
    )
    evaluator = procs.start("eval", *run.args("actor", "--eval", "--resume"))
    resumed = wait_until(lambda: f"at update {stopped_at}" in second.log(), 30)
    assert resumed, f"expected 'resumed ... at update {stopped_at}'\n{second.tail()}"
    assert wait_until(
        lambda: [r for r in run.results()[len(before) :] if r["learner_updates"] > stopped_at], 30
    ), f"{run.results()[len(before) :]}\n{second.tail()}"
    after = run.results()[len(before) :]
    assert all(r["learner_updates"] >= stopped_at for r in after), after
    assert all(r["env_steps"] >= counters["env_steps"] for r in after), (counters, after)
    assert after[0]["time_s"] >= counters["elapsed_ms"] / 1000, after[0]
    for proc in (actor, evaluator):
        assert wait_until(lambda p=proc: first_weights_version(p) is not None, 20), proc.tail()
        assert first_weights_version(proc) >= stopped_at, proc.tail()
    stop_and_check(procs, [actor, evaluator, second, *servers.values()])


def test_a_hand_started_run_logs_under_its_run_dir_and_stops_from_one_command(
    procs: Processes, tmp_path: Path
) -> None:
    run = Run(tmp_path)
    servers = start_servers(procs, run)
    roles = [
        procs.start("learner", *run.args("learner")),
        procs.start("actor_0", *run.args("actor", "--id", "0", "--num-actors", "1")),
        procs.start("eval", *run.args("actor", "--eval")),
        *servers.values(),
    ]
    assert wait_until(lambda: [r for r in run.results() if r["learner_updates"] > 0], 60), (
        procs.tails()
    )
    stopper = procs.start("stop", "stop", "--replay", run.replay_addr, "--params", run.params_addr)
    assert stopper.wait(STOP_BOUND_S) == 0, stopper.tail()
    for proc in roles:
        assert_exits(proc, 3.0 + STOP_BOUND_S, procs)
    logs = run.run_dir / "logs"
    for name in ("replay", "params", "learner", "actor_0", "eval"):
        text = (logs / f"{name}.log").read_text()
        assert f" {name} INFO " in text, f"{name}.log:\n{text[-2000:]}"
    assert "stop condition met" not in (logs / "learner.log").read_text()
    assert (run.run_dir / "checkpoint.pt").is_file()  # the run can be resumed


# --- clear errors -------------------------------------------------------------------------------


def test_bad_config_env_and_actor_id_exit_2(procs: Processes, tmp_path: Path) -> None:
    typo = builders.write_config(
        tmp_path, CONFIG.read_text().replace("  capacity:", "  capacty:"), "typo.yaml"
    )
    run = Run(tmp_path)
    cases = {
        "typo": (
            procs.start("typo", "replay", "--config", str(typo), "--bind", free_addr()),
            "replay.capacty",
        ),
        "no_env": (
            procs.start("no_env", *run.args("actor", "--set", "env.id=NoSuchEnv-v0")),
            "NoSuchEnv-v0",
        ),
        "bad_id": (
            procs.start("bad_id", *run.args("actor", "--id", "9", "--set", "actor.num_actors=4")),
            "actor id 9",
        ),
    }
    for name, (proc, expected) in cases.items():
        code = proc.wait(60)
        assert code == 2, f"{name}: exit code {code}\n{proc.tail()}"
        text = proc.log()
        assert expected in text, f"{name}: {expected!r} not in\n{proc.tail()}"
        assert "Traceback" not in text, proc.tail()
    assert "did you mean 'replay.capacity'" in cases["typo"][0].log(), (
        "the nearest valid key is suggested"
    )
    # Nothing was started: no role wrote metrics.
    assert not list(run.run_dir.rglob("events.out.tfevents.*"))

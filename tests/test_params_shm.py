"""Weights through shared memory: a real parameter server process writes each version once into
``/dev/shm``, a client on this host reads it from there (a client that asks over TCP gets the
bytes), a tampered or swapped file makes the client fall back to TCP, and no file outlives its
server (on SIGTERM, and after a SIGKILL at the next server's start).

The client is ``apexrl.clients.params.ParamsClient`` with a real network and a real DEALER socket;
the file format is driven directly in a temporary directory. ``test_params_hold.py`` has the
server's held requests (long polls).
"""

from __future__ import annotations

import os
import signal
import struct
from pathlib import Path

import builders
import numpy as np
import pytest
import torch
import zmq
from conftest import (
    CONFIG,
    SMALL_OVERRIDES,
    Processes,
    free_addr,
    request,
    server_stats,
    set_args,
    wait_for_server,
    wait_until,
)

from apexrl.algos import load_algorithm
from apexrl.clients.params import ParamsClient, load_weights
from apexrl.envs import make_vector_env
from apexrl.models import params_to_arrays
from apexrl.param_server import ParamStore
from apexrl.transport import shm, sockets
from apexrl.transport.codec import DEFAULT_LIMITS, encode
from apexrl.transport.messages import Params, ParamsRequest, PublishAck, PublishParams

pytestmark = pytest.mark.skipif(
    not shm.host_identity(shm.SHM_DIR), reason="no usable /dev/shm on this machine"
)


# A CartPole network of 2 MiB: weights of param_server.SHM_MIN_BYTES and more go through shm.
NETWORK = "algo.hidden_sizes=[1024,512]"
OVERRIDES = (*SMALL_OVERRIDES, NETWORK)


def network(seed: int) -> torch.nn.Module:
    cfg = builders.config(NETWORK, small=True)
    torch.manual_seed(seed)
    envs = make_vector_env(cfg.env, 1)
    spaces = envs.single_observation_space, envs.single_action_space
    envs.close()
    return load_algorithm(cfg.algorithm).make_network(*spaces, cfg)


def start_server(procs: Processes, run_dir: Path, name: str = "params") -> tuple[object, str]:
    addr = free_addr()
    args = ["params", "--config", str(CONFIG), "--run-dir", str(run_dir), "--bind", addr]
    server = procs.start(name, *args, *set_args(OVERRIDES))
    wait_for_server(server, addr, timeout_s=60)
    return server, addr


def files_of(incarnation: str) -> list[str]:
    return sorted(n for n in os.listdir(shm.SHM_DIR) if n.startswith(shm.PREFIX + incarnation))


def incarnation_of(file_name: str) -> str:
    return file_name[len(shm.PREFIX) :].split("-")[0]


class Client:
    """A ParamsClient on a fresh DEALER, with the helpers a test needs."""

    def __init__(self, addr: str, shm_dir: Path | None = shm.SHM_DIR) -> None:
        self.ctx = sockets.make_context()
        self.sock = sockets.connect(self.ctx, zmq.DEALER, addr)
        self.net = network(seed=99)
        self.params = ParamsClient(self.sock, self.net, timeout_s=30.0, shm_dir=shm_dir)

    def fetch(self, version: int, timeout_s: float = 20.0) -> bool:
        """Ask until the client holds ``version`` (at most ``timeout_s``)."""

        def holds() -> bool:
            self.params.request()
            self.params.poll(timeout_ms=100)
            return self.params.version == version

        return bool(wait_until(holds, timeout_s, interval_s=0.0))

    def assert_holds(self, arrays: dict[str, np.ndarray]) -> None:
        for name, tensor in self.net.state_dict().items():
            np.testing.assert_array_equal(tensor.numpy(), arrays[name], err_msg=name)

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


def test_a_local_client_reads_the_weights_from_shared_memory(
    procs: Processes, tmp_path: Path
) -> None:
    server, addr = start_server(procs, tmp_path / "run")
    weights = params_to_arrays(network(seed=0))
    assert request(addr, PublishParams(0, 10, weights)) == PublishAck(0)
    local, remote = Client(addr), Client(addr, shm_dir=None)
    try:
        assert local.fetch(0), server.tail()
        assert remote.fetch(0), server.tail()
        local.assert_holds(weights)
        remote.assert_holds(weights)
        assert (local.params.num_loaded_shm, local.params.num_shm_fallbacks) == (1, 0)
        assert remote.params.num_loaded_shm == 0
        stats = server_stats(addr)
        assert (stats["params/num_served"], stats["params/num_served_shm"]) == (2.0, 1.0)

        # The reply names a file of this server; after three more versions it keeps two files.
        probe = request(addr, ParamsRequest(-1, shm.host_identity()))
        assert isinstance(probe, Params) and probe.shm_file and not probe.arrays, probe
        incarnation = incarnation_of(probe.shm_file)
        later = params_to_arrays(network(seed=1))
        for version in (1, 2, 3):
            assert request(addr, PublishParams(version, 20, later)) == PublishAck(version)
        assert local.fetch(3), server.tail()
        local.assert_holds(later)
        assert local.params.num_loaded_shm == 2
        names = files_of(incarnation)
        assert names == sorted(
            [f"{shm.PREFIX}{incarnation}-2.bin", f"{shm.PREFIX}{incarnation}-3.bin"]
            + [f"{shm.PREFIX}{incarnation}.lock"]
        ), names
    finally:
        local.close()
        remote.close()
    code, _ = server.stop(10.0)
    assert code == 0, server.tail()
    assert files_of(incarnation) == []  # SIGTERM: nothing left behind


def tamper_token(path: Path) -> None:
    with open(path, "r+b") as file:
        file.seek(shm.HEADER.size - shm.TOKEN_BYTES)
        file.write(bytes(shm.TOKEN_BYTES))


def tamper_nan(path: Path) -> None:
    """A NaN in the last weights frame; header and layout stay valid."""
    data = bytearray(path.read_bytes())
    data[-4:] = struct.pack("<f", float("nan"))
    path.write_bytes(data)


def tamper_truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 8)


def tamper_symlink(path: Path) -> None:
    copy = path.with_name(path.name + ".copy")
    os.replace(path, copy)
    os.symlink(copy, path)


def tamper_swap(path: Path) -> None:
    """Another well-formed file (another token) under the same name."""
    data = bytearray(path.read_bytes())
    data[shm.HEADER.size - 1] ^= 0xFF
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


TAMPERING = {
    "token": tamper_token,
    "NaN": tamper_nan,
    "truncated": tamper_truncate,
    "symlink": tamper_symlink,
    "swapped": tamper_swap,
}


@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_a_tampered_file_makes_the_client_fall_back_to_tcp(
    procs: Processes, tmp_path: Path, case: str
) -> None:
    server, addr = start_server(procs, tmp_path / "run")
    weights = params_to_arrays(network(seed=0))
    assert request(addr, PublishParams(0, 10, weights)) == PublishAck(0)
    probe = request(addr, ParamsRequest(-1, shm.host_identity()))
    path = shm.SHM_DIR / probe.shm_file
    TAMPERING[case](path)
    client = Client(addr)
    try:
        assert client.fetch(0), server.tail()
        client.assert_holds(weights)  # the server's weights, over TCP
        assert (client.params.num_loaded_shm, client.params.num_shm_fallbacks) == (0, 1)
        assert client.params.num_rejected == 0
        assert client.params.shm_host  # one failure: it still offers shm for the next version
    finally:
        client.close()
        for leftover in (path.with_name(path.name + ".copy"),):
            leftover.unlink(missing_ok=True)  # the symlink case's target is the test's own
    code, _ = server.stop(10.0)
    assert code == 0, server.tail()


def test_files_of_a_killed_server_are_removed_by_the_next_one(
    procs: Processes, tmp_path: Path
) -> None:
    first, addr = start_server(procs, tmp_path / "run1", "params_1")
    weights = params_to_arrays(network(seed=0))
    assert request(addr, PublishParams(0, 10, weights)) == PublishAck(0)
    incarnation = incarnation_of(request(addr, ParamsRequest(-1, shm.host_identity())).shm_file)
    first.popen.send_signal(signal.SIGKILL)
    first.popen.wait(10)
    assert len(files_of(incarnation)) == 2  # the weights file and the lock
    second, _ = start_server(procs, tmp_path / "run2", "params_2")
    assert files_of(incarnation) == []
    code, _ = second.stop(10.0)
    assert code == 0, second.tail()


# --- the file format and the client, in a temporary directory -----------------------------------


def write_version(tmp_path: Path, version: int, arrays: dict[str, np.ndarray]):
    writer = shm.ShmWriter(tmp_path, shm.host_identity(tmp_path))
    frames = [bytes(f) for f in encode(Params(version, arrays), compress_min_bytes=1 << 62)]
    return writer, writer.write(version, frames)


def test_map_frames_checks_the_name_size_and_header(tmp_path: Path) -> None:
    arrays = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float32)}
    writer, ref = write_version(tmp_path, 7, arrays)
    mapping, frames = shm.map_frames(tmp_path, ref, 7, DEFAULT_LIMITS)
    expected = encode(Params(7, arrays), compress_min_bytes=1 << 62)
    assert [bytes(f) for f in frames] == [bytes(f) for f in expected]
    assert all(f.readonly for f in frames)  # the server's pages: an actor cannot write them
    bad = {
        "another version": (ref, 8, "holds another write"),
        "another token": (ref._replace(token="0" * 32), 7, "holds another write"),
        "another size": (ref._replace(nbytes=ref.nbytes - 1), 7, "bytes, expected"),
        "too large": (ref._replace(nbytes=1 << 40), 7, "out of bounds"),
        "a path": (ref._replace(name="../" + ref.name), 7, "not a weights file name"),
        "a foreign name": (ref._replace(name="passwd"), 7, "not a weights file name"),
        "a missing file": (ref._replace(name=ref.name[:-6] + "-5.bin"), 7, "cannot open"),
    }
    for bad_ref, version, reason in bad.values():
        with pytest.raises(shm.ShmError, match=reason):
            shm.map_frames(tmp_path, bad_ref, version, DEFAULT_LIMITS)
    # Superseded versions are unlinked, never rewritten: a mapping outlives its file's name.
    for version in (8, 9):
        writer.write(version, [bytes(f) for f in encode(Params(version, {}))])
    assert not (tmp_path / ref.name).exists()
    assert [bytes(f) for f in frames] == [bytes(f) for f in expected]
    del frames, mapping
    writer.close()
    assert os.listdir(tmp_path) == []


class FakeServer:
    """A ROUTER that answers each ParamsRequest with the test's reply and records the requests."""

    def __init__(self) -> None:
        self.ctx = sockets.make_context()
        self.sock = sockets.bind(self.ctx, zmq.ROUTER, "tcp://127.0.0.1:0")
        self.addr = sockets.bound_address(self.sock)
        self.requests: list[ParamsRequest] = []

    def answer(self, reply_for) -> None:
        received = sockets.recv_from(self.sock, timeout_ms=5000)
        assert received is not None and isinstance(received.message, ParamsRequest)
        self.requests.append(received.message)
        sockets.send_to(self.sock, received.identity, reply_for(received.message))

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


def test_the_client_opens_only_its_own_directory_and_names(tmp_path: Path) -> None:
    """A reply naming a valid file under a foreign name, or one the client did not ask for, is
    never read: the client asks over TCP instead."""
    net = network(seed=0)
    weights = params_to_arrays(net)
    writer, ref = write_version(tmp_path, 0, weights)
    foreign = tmp_path / "weights.bin"  # the same bytes under a name outside the pattern
    foreign.write_bytes((tmp_path / ref.name).read_bytes())
    server = FakeServer()
    ctx = sockets.make_context()
    sock = sockets.connect(ctx, zmq.DEALER, server.addr)
    client = ParamsClient(sock, network(seed=5), timeout_s=30.0, shm_dir=tmp_path)
    tcp_only = ParamsClient(
        sockets.connect(ctx, zmq.DEALER, server.addr), network(seed=5), 30.0, shm_dir=None
    )
    try:
        client.request()
        server.answer(lambda req: Params(0, {}, "weights.bin", ref.nbytes, ref.token))
        assert not client.poll(timeout_ms=5000)
        server.answer(lambda req: Params(0, weights))
        assert client.poll(timeout_ms=5000) and client.version == 0
        assert server.requests[0].shm_host == shm.host_identity(tmp_path)
        assert server.requests[1].shm_host == ""  # the fallback asks for the bytes
        assert (client.num_loaded_shm, client.num_shm_fallbacks) == (0, 1)

        tcp_only.request()
        server.answer(lambda req: Params(0, {}, ref.name, ref.nbytes, ref.token))
        assert not tcp_only.poll(timeout_ms=5000)
        server.answer(lambda req: Params(0, weights))
        assert tcp_only.poll(timeout_ms=5000) and tcp_only.num_loaded_shm == 0
        assert [r.shm_host for r in server.requests[2:]] == ["", ""]

        # The genuine file under its own name is read.
        client.rejected_version, client.version = None, -1
        client.request()
        server.answer(lambda req: Params(0, {}, ref.name, ref.nbytes, ref.token))
        assert client.poll(timeout_ms=5000) and client.num_loaded_shm == 1
    finally:
        server.close()
        ctx.destroy(linger=0)
        writer.close()


def test_load_weights_is_all_or_nothing_and_copies_into_the_tensors() -> None:
    net = network(seed=0)
    tensors = {name: tensor.data_ptr() for name, tensor in net.state_dict().items()}
    before = {name: t.clone() for name, t in net.state_dict().items()}
    good = params_to_arrays(network(seed=1))
    name = next(iter(good))
    bad_cases = {
        "NaN": ({**good, name: np.full_like(good[name], np.nan)}, "holds NaN or infinite"),
        "shape": ({**good, name: np.zeros((1,), good[name].dtype)}, "has shape"),
        "dtype": ({**good, name: good[name].astype(np.float64)}, "has dtype float64"),
        "missing": ({k: v for k, v in good.items() if k != name}, "missing array"),
    }
    for arrays, reason in bad_cases.values():
        with pytest.raises(ValueError, match=reason):
            load_weights(net, arrays)
        for k, t in net.state_dict().items():
            assert torch.equal(t, before[k])
    load_weights(net, good)
    for k, t in net.state_dict().items():
        np.testing.assert_array_equal(t.numpy(), good[k])
        assert t.data_ptr() == tensors[k]  # in place


def test_weights_under_the_shm_threshold_go_over_tcp(tmp_path: Path) -> None:
    writer = shm.ShmWriter(tmp_path, shm.host_identity(tmp_path))
    store = ParamStore(shm_writer=writer)  # SHM_MIN_BYTES: 1 MiB
    small = {"w": np.ones((4, 4), np.float32)}
    assert store.handle(PublishParams(0, 0, small)) == PublishAck(0)
    reply = store.handle(ParamsRequest(-1, writer.host))
    assert isinstance(reply, Params) and not reply.shm_file
    np.testing.assert_array_equal(reply.arrays["w"], small["w"])
    assert os.listdir(tmp_path) == [writer.lock_path.name]  # no weights file
    writer.close()
    assert os.listdir(tmp_path) == []

"""Held parameter requests (long polls): the parameter server keeps the request of an actor that
already holds the current version until the next publish, answers every held request at that
publish (from frames encoded once), and answers ``ParamsNotModified`` to one held ``hold_s``; a
client whose request was held asks again at once.

A real server process with real DEALER sockets and ``ParamsClient``s (shared memory and TCP) for
the whole path; ``ParamStore`` directly for the rules; a test-controlled ROUTER for the client.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import zmq
from conftest import Processes, request
from test_params_shm import Client, FakeServer, network, start_server

from apexrl import param_server
from apexrl.clients.params import HELD_AGAIN_AFTER_S, ParamsClient
from apexrl.models import params_to_arrays
from apexrl.param_server import ParamStore
from apexrl.transport import shm, sockets
from apexrl.transport.codec import decode
from apexrl.transport.messages import (
    Params,
    ParamsNotModified,
    ParamsRequest,
    PublishAck,
    PublishParams,
    Shutdown,
    StatsRequest,
)

SMALL = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float32)}


def test_a_publish_reaches_every_waiting_client_at_once(procs: Processes, tmp_path: Path) -> None:
    """Six clients that hold version 0 ask again and get no answer: the server holds them. The
    publish of version 1 answers all six at once, local clients from shared memory."""
    if not shm.host_identity(shm.SHM_DIR):
        pytest.skip("no usable /dev/shm on this machine")
    server, addr = start_server(procs, tmp_path / "run")
    first, second = params_to_arrays(network(seed=0)), params_to_arrays(network(seed=1))
    assert request(addr, PublishParams(0, 10, first)) == PublishAck(0)
    local = [Client(addr) for _ in range(3)]
    remote = [Client(addr, shm_dir=None) for _ in range(3)]
    clients = local + remote
    try:
        for client in clients:
            assert client.fetch(0), server.tail()
        for client in clients:
            client.params.request()  # holds version 0: the server keeps this request
        time.sleep(0.3)
        assert [c.sock.poll(0, zmq.POLLIN) for c in clients] == [0] * 6, "answered at once"
        published = time.monotonic()
        assert request(addr, PublishParams(1, 20, second)) == PublishAck(1)
        for client in clients:
            assert client.params.poll(timeout_ms=5000), server.tail()
            assert client.params.version == 1
            client.assert_holds(second)
        # Answered by the publish, not by the hold's end (ParamsNotModified, no load above).
        assert time.monotonic() - published < param_server.HOLD_S
        assert [c.params.num_loaded_shm for c in local] == [2, 2, 2]
        assert [c.params.num_loaded_shm for c in remote] == [0, 0, 0]

        # Nothing newer: a held request is answered ParamsNotModified after HOLD_S.
        started = time.monotonic()
        reply = request(addr, ParamsRequest(1, ""), timeout_s=3 * param_server.HOLD_S)
        assert reply == ParamsNotModified(1)
        assert time.monotonic() - started >= 0.9 * param_server.HOLD_S
    finally:
        for client in clients:
            client.close()
    code, _ = server.stop(10.0)
    assert code == 0, server.tail()


def test_the_store_holds_only_requests_of_clients_with_the_current_version() -> None:
    store = ParamStore(hold_s=0.5)
    now = 100.0
    assert not store.hold(b"a", ParamsRequest(-1), now)  # nothing published: answered at once
    assert store.handle(PublishParams(0, 0, SMALL)) == PublishAck(0)
    assert store.due_replies(now) == []
    assert not store.hold(b"a", ParamsRequest(-1), now)  # a late joiner gets weights at once
    assert not store.hold(b"a", ParamsRequest(3), now)  # another version (a restarted learner)
    assert not store.hold(b"a", StatsRequest(), now)
    assert store.hold(b"a", ParamsRequest(0), now)
    assert not store.hold(b"a", ParamsRequest(0), now)  # one held request per identity
    assert store.hold(b"b", ParamsRequest(0), now + 0.1)
    assert store.due_replies(now + 0.4) == []
    [(identity, frames)] = store.due_replies(now + 0.5)
    assert identity == b"a" and decode(frames) == ParamsNotModified(0)

    assert store.hold(b"c", ParamsRequest(0), now + 0.55)
    assert store.handle(PublishParams(1, 0, SMALL)) == PublishAck(1)
    due = store.due_replies(now + 0.56)
    assert [identity for identity, _ in due] == [b"b", b"c"]
    for _, frames in due:
        assert frames is store.params_frames  # encoded once at publish, never per client
        assert decode(frames).version == 1
    assert store.held == {} and store.num_served == 2


def test_held_shm_and_tcp_requests_get_the_replies_encoded_at_publish(tmp_path: Path) -> None:
    writer = shm.ShmWriter(tmp_path, shm.host_identity(tmp_path))
    store = ParamStore(shm_writer=writer, shm_min_bytes=0)
    try:
        assert store.handle(PublishParams(0, 0, SMALL)) == PublishAck(0)
        assert store.hold(b"local", ParamsRequest(0, writer.host), 0.0)
        assert store.hold(b"remote", ParamsRequest(0, ""), 0.0)
        assert store.hold(b"foreign", ParamsRequest(0, "another host"), 0.0)
        assert store.handle(PublishParams(1, 0, SMALL)) == PublishAck(1)
        replies = dict(store.due_replies(0.0))
        assert replies[b"local"] is store.shm_frames
        assert replies[b"remote"] is replies[b"foreign"] is store.params_frames
        local = decode(replies[b"local"])
        assert isinstance(local, Params) and local.version == 1
        assert local.shm_file == store.shm_ref.name and not local.arrays
        assert store.num_served_shm == 1
    finally:
        writer.close()


def test_a_shutdown_answers_the_held_requests_and_the_held_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(param_server, "MAX_HELD", 2)
    store = ParamStore()
    store.handle(PublishParams(0, 0, SMALL))
    store.due_replies(0.0)
    assert store.hold(b"a", ParamsRequest(0), 0.0) and store.hold(b"b", ParamsRequest(0), 0.0)
    assert not store.hold(b"c", ParamsRequest(0), 0.0)  # past MAX_HELD: answered at once
    assert store.handle(Shutdown("test")) == Shutdown("parameter server is stopping")
    replies = store.due_replies(0.0)
    assert [identity for identity, _ in replies] == [b"a", b"b"]
    assert all(isinstance(decode(frames), Shutdown) for _, frames in replies)
    assert not store.hold(b"a", ParamsRequest(0), 0.0)  # a stopping server holds nothing


def test_a_client_whose_request_was_held_asks_again_at_once() -> None:
    """After a ParamsNotModified that came ``HELD_AGAIN_AFTER_S`` or later, the client sends its
    next request by itself; after a prompt one it waits for its own schedule."""
    server = FakeServer()
    ctx = sockets.make_context()
    net = network(seed=0)
    client = ParamsClient(sockets.connect(ctx, zmq.DEALER, server.addr), net, 30.0, None)
    try:
        client.request()
        server.answer(lambda req: Params(0, params_to_arrays(net)))
        assert client.poll(timeout_ms=5000) and client.version == 0

        client.request()
        time.sleep(HELD_AGAIN_AFTER_S + 0.1)  # as a server holding the request
        server.answer(lambda req: ParamsNotModified(0))
        assert not client.poll(timeout_ms=5000)
        server.answer(lambda req: ParamsNotModified(0))  # the client asked again by itself
        assert [r.have_version for r in server.requests] == [-1, 0, 0]
        assert not client.poll(timeout_ms=5000)  # a prompt answer: no new request
        assert server.sock.poll(300, zmq.POLLIN) == 0
    finally:
        server.close()
        ctx.destroy(linger=0)


def test_a_request_reads_the_waiting_answer_first() -> None:
    """An actor that reads its sockets only at block ends, busy past its timeout, finds the
    answer waiting when it asks again: the request loads those weights and asks for the next
    version, instead of replacing its socket."""
    server = FakeServer()
    ctx = sockets.make_context()
    net = network(seed=0)
    weights = params_to_arrays(network(seed=3))
    client = ParamsClient(sockets.connect(ctx, zmq.DEALER, server.addr), net, 0.2, None)
    try:
        client.request()
        server.answer(lambda req: Params(4, weights))
        time.sleep(0.4)  # past timeout_s, the answer unread
        client.request()
        assert client.version == 4 and client.link.num_resets == 0
        assert not client.link.peer.silent
        server.answer(lambda req: ParamsNotModified(4))
        assert [r.have_version for r in server.requests] == [-1, 4]
        for name, tensor in net.state_dict().items():
            np.testing.assert_array_equal(tensor.numpy(), weights[name], err_msg=name)
    finally:
        server.close()
        ctx.destroy(linger=0)

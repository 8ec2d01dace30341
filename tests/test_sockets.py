"""Tests for the socket helpers over real ZeroMQ sockets on tcp://127.0.0.1 random ports."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import numpy as np
import pytest
import zmq

from apexrl.transport import messages, sockets
from apexrl.transport.codec import DEFAULT_LIMITS, DecodeError, Limits

SocketFactory = Callable[..., zmq.Socket]
TIMEOUT_MS = 2000  # generous: on loopback a message takes well under a millisecond


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = sockets.make_context()
    with sockets.closing(context):
        yield context


@pytest.fixture
def opened(ctx: zmq.Context) -> Iterator[list[zmq.Socket]]:
    """Sockets a test opened, closed at teardown (an unclosed socket warns when collected)."""
    socks: list[zmq.Socket] = []
    yield socks
    for sock in socks:
        sock.close(linger=0)


@pytest.fixture
def bind_router(ctx: zmq.Context, opened: list[zmq.Socket]) -> SocketFactory:
    def bind(limits: Limits = DEFAULT_LIMITS) -> zmq.Socket:
        opened.append(sockets.bind(ctx, zmq.ROUTER, "tcp://127.0.0.1:0", limits=limits))
        return opened[-1]

    return bind


@pytest.fixture
def connect_dealer(ctx: zmq.Context, opened: list[zmq.Socket]) -> SocketFactory:
    def connect(router: zmq.Socket) -> zmq.Socket:
        opened.append(sockets.connect(ctx, zmq.DEALER, sockets.bound_address(router)))
        return opened[-1]

    return connect


@pytest.fixture
def router(bind_router: SocketFactory) -> zmq.Socket:
    return bind_router()


def _port(sock: zmq.Socket) -> int:
    port = urlsplit(sockets.bound_address(sock)).port
    assert port is not None
    return port


def _request_reply(dealer: zmq.Socket, router: zmq.Socket) -> None:
    """One DEALER -> ROUTER -> DEALER exchange, with an LZ4-compressed array in the reply."""
    sockets.send(dealer, messages.SampleRequest(table="replay", batch_size=4))
    received = sockets.recv_from(router, TIMEOUT_MS)
    assert received is not None and received.error is None
    assert received.message == messages.SampleRequest(table="replay", batch_size=4)

    obs = np.zeros((4, 84, 84), dtype=np.uint8)
    obs[:, 10:20, 30:40] = 255
    batch = messages.SampleBatch(
        table="replay",
        table_size=100,
        keys=np.arange(4, dtype=np.int64),
        probabilities=np.full(4, 0.01),
        fields={"obs": obs, "terminated": np.array([False, True, False, False])},
    )
    sockets.send_to(router, received.identity, batch)
    reply = sockets.recv(dealer, TIMEOUT_MS)
    assert isinstance(reply, messages.SampleBatch)
    assert np.array_equal(reply.fields["obs"], obs)
    assert reply.fields["terminated"].dtype == np.bool_
    assert np.array_equal(reply.keys, batch.keys)


def test_bind_to_port_zero_or_star_picks_a_free_port(
    ctx: zmq.Context, opened: list[zmq.Socket]
) -> None:
    for addr in ("tcp://127.0.0.1:0", "tcp://127.0.0.1:*"):
        opened.append(sockets.bind(ctx, zmq.ROUTER, addr))
        assert sockets.bound_address(opened[-1]).startswith("tcp://127.0.0.1:")
        assert _port(opened[-1]) > 0


def test_sockets_are_configured(
    bind_router: SocketFactory, connect_dealer: SocketFactory, router: zmq.Socket
) -> None:
    bound = bind_router(Limits(max_message_bytes=12345))
    dealer = connect_dealer(router)
    assert bound.getsockopt(zmq.MAXMSGSIZE) == 12345
    assert router.getsockopt(zmq.MAXMSGSIZE) == Limits().max_message_bytes
    for sock in (bound, router, dealer):
        assert sock.getsockopt(zmq.LINGER) == 0
        assert sock.getsockopt(zmq.SNDHWM) == sockets.HIGH_WATER_MARK
        assert sock.getsockopt(zmq.RCVHWM) == sockets.HIGH_WATER_MARK
        assert sock.getsockopt(zmq.SNDTIMEO) == sockets.SEND_TIMEOUT_MS


def test_a_send_to_a_peer_that_is_gone_times_out_instead_of_blocking(
    ctx: zmq.Context, opened: list[zmq.Socket]
) -> None:
    """Nothing listens at the address: once HIGH_WATER_MARK messages are queued, the next send
    raises zmq.Again after the send timeout instead of blocking the role forever."""
    port_holder = sockets.bind(ctx, zmq.ROUTER, "tcp://127.0.0.1:0")
    addr = sockets.bound_address(port_holder)
    port_holder.close(linger=0)  # a free port that nobody serves
    dealer = sockets.connect(ctx, zmq.DEALER, addr, send_timeout_ms=200)
    opened.append(dealer)
    assert dealer.getsockopt(zmq.SNDTIMEO) == 200
    with pytest.raises(zmq.Again):  # without the timeout this send would block for ever
        for _ in range(10 * sockets.HIGH_WATER_MARK):
            sockets.send(dealer, messages.StatsRequest())


def test_dealer_router_round_trip(connect_dealer: SocketFactory, router: zmq.Socket) -> None:
    _request_reply(connect_dealer(router), router)


def test_two_dealers_get_their_own_replies(
    connect_dealer: SocketFactory, router: zmq.Socket
) -> None:
    dealers = [connect_dealer(router) for _ in range(2)]
    for i, dealer in enumerate(dealers):
        sockets.send(dealer, messages.ParamsRequest(have_version=i))
    for _ in dealers:
        received = sockets.recv_from(router, TIMEOUT_MS)
        assert received is not None and isinstance(received.message, messages.ParamsRequest)
        reply = messages.ParamsNotModified(version=received.message.have_version)
        sockets.send_to(router, received.identity, reply)
    for i, dealer in enumerate(dealers):
        assert sockets.recv(dealer, TIMEOUT_MS) == messages.ParamsNotModified(version=i)


def test_recv_times_out_with_none(connect_dealer: SocketFactory, router: zmq.Socket) -> None:
    dealer = connect_dealer(router)
    start = time.monotonic()
    assert sockets.recv(dealer, 50) is None
    assert time.monotonic() - start >= 0.04
    assert sockets.recv_from(router, 0) is None


def test_negative_timeout_is_refused(connect_dealer: SocketFactory, router: zmq.Socket) -> None:
    with pytest.raises(ValueError):
        sockets.recv(connect_dealer(router), -1)
    with pytest.raises(ValueError):
        sockets.recv_from(router, -1)


def test_garbage_frames_give_an_error_with_the_identity(
    connect_dealer: SocketFactory, router: zmq.Socket
) -> None:
    dealer = connect_dealer(router)
    sockets.send(dealer, messages.StatsRequest())
    first = sockets.recv_from(router, TIMEOUT_MS)
    assert first is not None and first.message == messages.StatsRequest()

    for garbage in ([b"junk", b"more junk"], [b""], [b"\x93\x01\x02\x03"]):
        dealer.send_multipart(garbage)
        received = sockets.recv_from(router, TIMEOUT_MS)
        assert received is not None
        assert received.message is None and isinstance(received.error, DecodeError)
        assert received.identity == first.identity
        sockets.send_to(router, received.identity, messages.Error(reason=str(received.error)))
        reply = sockets.recv(dealer, TIMEOUT_MS)
        assert isinstance(reply, messages.Error) and reply.reason

    # The ROUTER still serves the same peer.
    sockets.send(dealer, messages.StatsRequest())
    received = sockets.recv_from(router, TIMEOUT_MS)
    assert received is not None and received.message == messages.StatsRequest()


def test_recv_raises_decode_error_on_garbage(
    connect_dealer: SocketFactory, router: zmq.Socket
) -> None:
    dealer = connect_dealer(router)
    sockets.send(dealer, messages.StatsRequest())
    received = sockets.recv_from(router, TIMEOUT_MS)
    assert received is not None
    router.send_multipart([received.identity, b"not msgpack \xc1"])
    with pytest.raises(DecodeError):
        sockets.recv(dealer, TIMEOUT_MS)


def test_send_to_a_gone_peer_is_dropped_silently(router: zmq.Socket) -> None:
    sockets.send_to(router, b"\x00no-such-peer", messages.Shutdown(reason="bye"))


def test_sender_may_reuse_its_array_right_after_send(
    connect_dealer: SocketFactory, router: zmq.Socket
) -> None:
    dealer = connect_dealer(router)
    weights = np.random.default_rng(0).normal(size=2**18)  # 2 MiB, incompressible: sent raw
    expected = weights.copy()
    sockets.send(dealer, messages.PublishParams(version=1, env_steps=0, arrays={"w": weights}))
    weights[:] = 0.0
    received = sockets.recv_from(router, TIMEOUT_MS)
    assert received is not None and isinstance(received.message, messages.PublishParams)
    assert np.array_equal(received.message.arrays["w"], expected)


def test_raw_tcp_junk_does_not_break_the_router(
    connect_dealer: SocketFactory, router: zmq.Socket
) -> None:
    rng = random.Random(7)
    for size in (1, 10, 64, 4096):
        with socket.create_connection(("127.0.0.1", _port(router)), timeout=2) as conn:
            conn.sendall(rng.randbytes(size))
    # libzmq may read junk as a ZMTP 1.0 peer and deliver frames: they must come back as errors.
    while (received := sockets.recv_from(router, 50)) is not None:
        assert received.message is None and isinstance(received.error, DecodeError)
    _request_reply(connect_dealer(router), router)


def _zmtp_dealer_greeting() -> bytes:
    """A ZMTP 3.0 NULL-mechanism greeting and READY command, as a DEALER sends them."""
    greeting = b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\x00")
    greeting += b"\x00" + b"\x00" * 31  # as-server = 0, filler
    body = b"\x05READY" + b"\x0bSocket-Type" + (6).to_bytes(4, "big") + b"DEALER"
    return greeting + bytes([0x04, len(body)]) + body


def _closed_by_peer(conn: socket.socket, timeout_s: float) -> bool:
    conn.settimeout(timeout_s)
    try:
        while conn.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def test_oversized_frame_drops_the_peer(
    bind_router: SocketFactory, connect_dealer: SocketFactory
) -> None:
    router = bind_router(Limits(max_message_bytes=2**20))
    with socket.create_connection(("127.0.0.1", _port(router)), timeout=2) as conn:
        conn.sendall(_zmtp_dealer_greeting())
        # A long message frame that announces 1 TiB; MAXMSGSIZE makes libzmq hang up at once.
        conn.sendall(b"\x02" + (2**40).to_bytes(8, "big"))
        assert _closed_by_peer(conn, timeout_s=2.0)
    assert sockets.recv_from(router, 50) is None
    _request_reply(connect_dealer(router), router)


def test_closing_closes_sockets_and_context() -> None:
    context = sockets.make_context()
    with sockets.closing(context):
        bound = sockets.bind(context, zmq.ROUTER, "tcp://127.0.0.1:0")
        dealer = sockets.connect(context, zmq.DEALER, sockets.bound_address(bound))
        sockets.send(dealer, messages.StatsRequest())  # unsent data must not block the close
    assert bound.closed and dealer.closed and context.closed

    context = sockets.make_context()
    sock = context.socket(zmq.DEALER)
    with pytest.raises(RuntimeError), sockets.closing(sock, context):
        raise RuntimeError("the block failed")
    assert sock.closed and context.closed


def test_received_holds_exactly_one_of_message_and_error() -> None:
    with pytest.raises(ValueError):
        sockets.Received(identity=b"x", message=None, error=None)
    with pytest.raises(ValueError):
        sockets.Received(identity=b"x", message=messages.StatsRequest(), error=DecodeError("both"))

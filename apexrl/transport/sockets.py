"""ZeroMQ sockets for apexrl: create, send a message, receive a message with a timeout.

Plain functions over ``zmq.Socket``; the wire format lives in ``codec.py`` and the links (who binds,
who connects) are listed in ``apexrl/transport/__init__.py``. Every socket gets ``LINGER`` 0 so a
process can always close and exit at once, and every receive takes a timeout.

A bound socket faces peers it cannot trust, so it gets ``MAXMSGSIZE``: a peer that announces an
oversized frame is disconnected by libzmq before anything is allocated (connected sockets get the
same bound, which ``decode`` would enforce anyway). A ROUTER keeps
``ROUTER_MANDATORY`` off, so a reply to a peer that has gone away is dropped silently instead of
raising. No send waits forever: a DEALER's send that stays blocked at the high-water mark for
``SEND_TIMEOUT_MS`` raises ``zmq.Again``, which ends the role with the error in its log (the
launcher restarts it) rather than leaving it hung.

With CURVE keys (``auth.server_keys`` / ``auth.client_keys``) a bound socket is a CURVE server
whose process answers authentication through ``auth``'s ZAP handler, a connected socket is a
CURVE client, and ``recv_from`` says which role sent each message.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import zmq

from apexrl.transport.auth import (
    AllowList,
    ClientKeys,
    ServerKeys,
    split_identity,
    start_zap_handler,
)
from apexrl.transport.codec import (
    DEFAULT_LIMITS,
    DecodeError,
    Limits,
    NotPermitted,
    decode,
    encode,
)
from apexrl.transport.gate import RoleGate
from apexrl.transport.messages import Message

# A CURVE server socket's allow-list (``bind``), read by ``recv_from`` for each message.
_ALLOW_LISTS: weakref.WeakKeyDictionary[zmq.Socket, AllowList] = weakref.WeakKeyDictionary()
MAX_DROPPED_PER_CALL = 1000  # messages of revoked keys one recv_from skips before it returns
HIGH_WATER_MARK = 1000  # messages queued per peer before sends block (DEALER) or drop (ROUTER)
SEND_TIMEOUT_MS = 60_000  # a send blocked this long at the high-water mark raises zmq.Again


@dataclass(frozen=True)
class Received:
    """What a ROUTER got from one peer: a message, or the reason its frames were rejected.

    Exactly one of ``message`` and ``error`` is set; ``identity`` is always there, so a server can
    answer a malformed request with an ``Error``. ``role`` is the role the peer authenticated as
    (CURVE, from the allow-list); None on a socket without CURVE. ``bound_id``: the actor id the
    peer's key is bound to (an actor's own key), None for any other. ``frames``: the message's
    frames as they arrived (identity excluded; ZeroMQ's buffers, not copied), for a server that
    keeps a message as it came (replay's chunk log).
    """

    identity: bytes
    message: Message | None
    error: DecodeError | None
    role: str | None = None
    frames: tuple[zmq.Frame, ...] = ()
    bound_id: int | None = None

    def __post_init__(self) -> None:
        if (self.message is None) == (self.error is None):
            raise ValueError("exactly one of message and error must be set")


class SharedContext(zmq.Context):
    """The one ZeroMQ context of a serial run (``launch.serial``: every role in a thread of one
    process, linked by ``inproc://`` endpoints, which connect only sockets of one context).

    Each role ends its context in its ``finally``; here that would end the sockets of every other
    role, so ``term`` and ``destroy`` do nothing until ``end``, which the serial runner calls
    once every role has stopped. (A subclass rather than a wrapper: every ``zmq.Context`` use,
    monitors included, keeps working on it.)
    """

    _ended = False

    def term(self) -> None:
        if self._ended:
            super().term()

    def destroy(self, linger: int | None = None) -> None:
        if self._ended:
            super().destroy(linger)

    def end(self) -> None:
        """Close whatever sockets are left (``LINGER`` 0) and terminate the context."""
        self._ended = True
        super().destroy(linger=0)


_shared_context: SharedContext | None = None


def make_context() -> zmq.Context:
    """A fresh ZeroMQ context for one process (not the global instance); in a serial run, the
    run's ``SharedContext``."""
    return _shared_context if _shared_context is not None else zmq.Context()


def share_context() -> SharedContext:
    """Make every later ``make_context`` return one new ``SharedContext`` (serial mode)."""
    global _shared_context
    _shared_context = SharedContext()
    return _shared_context


def unshare_context() -> None:
    """Let ``make_context`` make fresh contexts again (the shared one is ended separately)."""
    global _shared_context
    _shared_context = None


def _configure(sock: zmq.Socket, limits: Limits, send_timeout_ms: int = SEND_TIMEOUT_MS) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, send_timeout_ms)
    sock.setsockopt(zmq.SNDHWM, HIGH_WATER_MARK)
    sock.setsockopt(zmq.RCVHWM, HIGH_WATER_MARK)
    sock.setsockopt(zmq.MAXMSGSIZE, limits.max_message_bytes)
    if sock.type == zmq.ROUTER:
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)


def bind(
    ctx: zmq.Context,
    socket_type: int,
    addr: str,
    *,
    limits: Limits = DEFAULT_LIMITS,
    curve: ServerKeys | None = None,
) -> zmq.Socket:
    """Create a socket of ``socket_type`` bound to ``addr``.

    A port of ``0`` or ``*`` (``tcp://127.0.0.1:0``) picks a free port; ``bound_address`` says
    which. Frames over ``limits.max_message_bytes`` make libzmq drop the sending peer. With
    ``curve`` the socket is a CURVE server that admits only the clients ``curve`` lists; it starts
    ``ctx``'s ZAP handler first (one CURVE server socket per context).
    """
    if curve is not None:
        allow_list = AllowList(curve.client_roles, curve.allow_list)
        start_zap_handler(ctx, allow_list)
    sock = ctx.socket(socket_type)
    try:
        _configure(sock, limits)
        if curve is not None:
            sock.setsockopt(zmq.CURVE_SERVER, 1)
            sock.setsockopt(zmq.CURVE_SECRETKEY, curve.secret_key)
            sock.setsockopt(zmq.CURVE_PUBLICKEY, curve.public_key)
        sock.bind(addr)
    except BaseException:
        sock.close(linger=0)
        raise
    if curve is not None:
        _ALLOW_LISTS[sock] = allow_list  # what recv_from checks each message's sender against
    return sock


def connect(
    ctx: zmq.Context,
    socket_type: int,
    addr: str,
    *,
    limits: Limits = DEFAULT_LIMITS,
    curve: ClientKeys | None = None,
    send_timeout_ms: int = SEND_TIMEOUT_MS,
) -> zmq.Socket:
    """Create a socket of ``socket_type`` connected to ``addr`` (ZeroMQ reconnects by itself).

    ``limits`` sets ``MAXMSGSIZE`` as in ``bind``; with ``curve`` the socket is a CURVE client. A
    send that the peer has not made room for within ``send_timeout_ms`` (``HIGH_WATER_MARK``
    messages queued to a peer that is gone) raises ``zmq.Again`` instead of blocking forever.
    """
    sock = ctx.socket(socket_type)
    try:
        _configure(sock, limits, send_timeout_ms)
        if curve is not None:
            sock.setsockopt(zmq.CURVE_SERVERKEY, curve.server_key)
            sock.setsockopt(zmq.CURVE_PUBLICKEY, curve.public_key)
            sock.setsockopt(zmq.CURVE_SECRETKEY, curve.secret_key)
        sock.connect(addr)
    except BaseException:
        sock.close(linger=0)
        raise
    return sock


def bound_address(sock: zmq.Socket) -> str:
    """The endpoint ``sock`` was last bound to, with the real port (``tcp://127.0.0.1:43127``)."""
    return sock.getsockopt(zmq.LAST_ENDPOINT).decode().rstrip("\0")


def _send_frames(sock: zmq.Socket, frames: list[bytes | memoryview], flags: int) -> None:
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        more = zmq.SNDMORE if i < last else 0
        # bytes (header, LZ4 output) are immutable: hand them over without a copy. A memoryview
        # is the sender's own array, which ZeroMQ would read later from its I/O thread; copy it
        # now so the caller may reuse its buffers as soon as send() returns.
        sock.send(frame, flags | more, copy=isinstance(frame, memoryview))


def send(
    sock: zmq.Socket, msg: Message, *, flags: int = 0, compress_min_bytes: int = 16384
) -> None:
    """Encode ``msg`` and send it (DEALER side). ``flags=zmq.NOBLOCK`` raises ``zmq.Again``
    instead of blocking at the high-water mark."""
    _send_frames(sock, encode(msg, compress_min_bytes=compress_min_bytes), flags)


def send_to(
    sock: zmq.Socket,
    identity: bytes,
    msg: Message,
    *,
    flags: int = 0,
    compress_min_bytes: int = 16384,
) -> None:
    """Send ``msg`` from a ROUTER to the peer ``identity``; dropped if that peer is gone."""
    _send_frames(sock, [identity, *encode(msg, compress_min_bytes=compress_min_bytes)], flags)


def send_encoded_to(sock: zmq.Socket, identity: bytes, frames: list[bytes]) -> None:
    """Send frames that ``codec.encode`` made earlier, as immutable ``bytes`` (a reply encoded
    once and sent to many peers); ZeroMQ reads them without a copy."""
    sock.send_multipart([identity, *frames], copy=False)


def _check_timeout(timeout_ms: int) -> None:
    if timeout_ms < 0:
        raise ValueError(f"timeout_ms must be >= 0 (every wait is bounded), got {timeout_ms}")


def _readable(sock: zmq.Socket, timeout_ms: int) -> bool:
    _check_timeout(timeout_ms)
    if timeout_ms == 0:  # reading the socket's event flags costs a fraction of a zero-time poll
        return bool(sock.getsockopt(zmq.EVENTS) & zmq.POLLIN)
    return bool(sock.poll(timeout_ms, zmq.POLLIN))


def recv(sock: zmq.Socket, timeout_ms: int, limits: Limits = DEFAULT_LIMITS) -> Message | None:
    """Wait up to ``timeout_ms`` for one message; ``None`` on timeout.

    Raises ``DecodeError`` when the frames are not a valid message.
    """
    if not _readable(sock, timeout_ms):
        return None
    return decode(sock.recv_multipart(copy=False), limits)


def recv_from(
    sock: zmq.Socket,
    timeout_ms: int,
    limits: Limits = DEFAULT_LIMITS,
    gates: Mapping[str, RoleGate] | None = None,
) -> Received | None:
    """Wait up to ``timeout_ms`` for one message on a ROUTER; ``None`` on timeout.

    Bad frames do not raise: they come back as a ``Received`` with ``error`` set, so the server
    can reply with an ``Error`` and carry on. On a CURVE server, ``role`` is the role in the User-Id
    that the ZAP handler gave the peer's connection (a message of a key revoked since is dropped),
    and with ``gates`` (role -> ``RoleGate``) the message
    is decoded under that role's limits and refused, before its arrays are looked at, when its
    kind is not one the role may send here (a role without a gate may send nothing).
    """
    if not _readable(sock, timeout_ms):
        return None
    frames = sock.recv_multipart(copy=False)
    for _ in range(MAX_DROPPED_PER_CALL):  # a key revoked since its connection: it gets nothing
        user_id = _user_id(sock, frames[-1])
        if _still_admitted(sock, user_id):
            break
        if not _readable(sock, 0):
            return None
        frames = sock.recv_multipart(copy=False)
    else:
        return None
    identity = frames[0].bytes
    role, bound_id = (None, None) if user_id is None else split_identity(user_id)
    body = tuple(frames[1:])
    kinds = None

    def refused(error: DecodeError) -> Received:
        return Received(identity, None, error, role, body, bound_id)

    if gates is not None and role is not None:
        gate = gates.get(role)
        if gate is None:
            return refused(DecodeError(f"role {role!r} may send nothing to this server"))
        limits, kinds = gate.limits, gate.kinds
    try:
        return Received(identity, decode(body, limits, kinds), None, role, body, bound_id)
    except NotPermitted as exc:
        return refused(DecodeError(f"role {role!r} {exc}"))
    except DecodeError as exc:
        if kinds is not None:  # the role's limits may be what it broke: say whose they are
            exc = DecodeError(f"from role {role!r}: {exc}")
        return refused(exc)
    except Exception as exc:  # a decoder bug must not end the server: the frames are refused
        return refused(DecodeError(f"undecodable message ({type(exc).__name__}: {exc})"))


def _user_id(sock: zmq.Socket, frame: zmq.Frame) -> str | None:
    """The User-Id the ZAP handler gave the peer's connection (``<identity>@<key>``; "" where it
    gave none: a peer that may send nothing); None on a socket without CURVE."""
    if not sock.getsockopt(zmq.CURVE_SERVER):
        return None
    try:
        return frame.get("User-Id")
    except zmq.ZMQError:
        return ""


def _still_admitted(sock: zmq.Socket, user_id: str | None) -> bool:
    """Whether the peer of a CURVE server's message is still in its allow-list (always true on
    a socket without CURVE)."""
    allow_list = _ALLOW_LISTS.get(sock)
    return allow_list is None or user_id is None or allow_list.admits(user_id)


@contextmanager
def closing(*resources: zmq.Socket | zmq.Context) -> Iterator[None]:
    """Close the given sockets, then destroy the given contexts, however the block exits.

    Destroying a context also closes any socket of it not listed, with ``LINGER`` 0, so
    ``with closing(ctx):`` is enough and never hangs on unsent messages.
    """
    for resource in resources:
        if not isinstance(resource, (zmq.Socket, zmq.Context)):
            raise TypeError(f"closing() takes sockets and contexts, got {type(resource)}")
    try:
        yield
    finally:
        for resource in resources:
            if isinstance(resource, zmq.Socket):
                resource.close(linger=0)
        for resource in resources:
            if isinstance(resource, zmq.Context):
                resource.destroy(linger=0)

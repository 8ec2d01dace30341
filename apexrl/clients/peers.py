"""What a client role (actor, learner) knows of a server it talks to, and a connection to it that
notices when the server goes away.

ZeroMQ reconnects a DEALER by itself, but whatever a server held for a client when it stopped (a
chunk waiting for its ack, held sample requests, a publish) is gone with it, and a client that
waits for those replies would wait forever. A ``Link`` watches its socket with a ZeroMQ monitor:
a dropped connection means that the server stopped or restarted. The client then calls
``Link.reset``, which closes the socket together with whatever it still queued (so nothing sent
before reaches the new server twice, and no late reply to a forgotten request is read) and
connects a fresh one to the same address, and sends its unanswered requests again. A server that
keeps its connection but answers nothing for the client's timeout is handled the same way.
Over ``inproc://`` (a serial run, ``launch.serial``) the monitor reports no drop at all; there the
servers are threads of the client's own process that never restart, and the timeout remains.

``Peer`` keeps the time of the server's last answer (the ``*_silent_s`` gauges) and logs once
when the server stops answering and once when it answers again. A client raises ``PeerShutdown``
when a server answers with ``Shutdown``: the run is over.
"""

from __future__ import annotations

import logging
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from apexrl.transport import auth, sockets

log = logging.getLogger(__name__)


class PeerShutdown(Exception):
    """A server answered with ``Shutdown``: the run is over."""


class Peer:
    """One server as a client sees it: when it last answered, and whether it is silent now."""

    def __init__(self, name: str, addr: str) -> None:
        self.name, self.addr = name, addr
        self.last_heard = time.monotonic()
        self.silent = False  # lost and not heard from since

    def heard(self) -> None:
        """The server answered."""
        now = time.monotonic()
        if self.silent:
            self.silent = False
            log.info(
                "the %s at %s answers again after %.1f s",
                self.name,
                self.addr,
                now - self.last_heard,
            )
        self.last_heard = now

    def silent_s(self) -> float:
        """Seconds since the server last answered."""
        return time.monotonic() - self.last_heard

    def lost(self, why: str) -> None:
        """The server stopped answering (``why``); logged once until it answers again."""
        if not self.silent:
            self.silent = True
            log.warning("the %s at %s is not answering (%s)", self.name, self.addr, why)


class Link:
    """A DEALER socket connected to one server, replaced by ``reset``; ``dropped`` says whether
    the connection dropped since it was last asked."""

    def __init__(self, ctx: zmq.Context, peer: Peer, curve: auth.ClientKeys | None = None) -> None:
        self.ctx, self.peer, self.curve = ctx, peer, curve
        self.num_resets = 0
        self._monitor: zmq.Socket | None = None
        self._connect()

    @classmethod
    def around(cls, sock: zmq.Socket) -> Link:
        """A link around a socket made elsewhere: it reports no drop and ``reset`` keeps the
        socket (a client then sends again on the same socket)."""
        link = cls.__new__(cls)
        endpoint = sock.getsockopt(zmq.LAST_ENDPOINT).decode().rstrip("\0")
        link.ctx, link.peer, link.curve = sock.context, Peer("server", endpoint), None
        link.num_resets, link.sock, link._monitor = 0, sock, None
        return link

    def _connect(self) -> None:
        self.sock = sockets.connect(self.ctx, zmq.DEALER, self.peer.addr, curve=self.curve)
        self._monitor = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)

    def dropped(self) -> bool:
        """Whether the connection dropped since the last call (the server stopped or restarted,
        and whatever it held for this socket is lost)."""
        dropped = False
        while self._monitor is not None and self._monitor.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            recv_monitor_message(self._monitor)
            dropped = True
        return dropped

    def reset(self) -> None:
        """Close the socket with everything it queued and connect a fresh one."""
        self.num_resets += 1
        if self._monitor is None:
            return  # a socket made elsewhere (``around``) stays
        self.close()
        self._connect()

    def close(self) -> None:
        if self._monitor is not None:
            self.sock.disable_monitor()
            self._monitor.close(linger=0)
        self.sock.close()  # with the socket's own LINGER (0 unless its owner set one)

"""Serial mode's Stats relay: how ``apexrl status`` reaches a serial run's in-process servers.

A serial run's servers bind ``inproc://`` addresses, which only sockets of its own process reach.
The relay binds one ROUTER per server on a loopback TCP port (``tcp://127.0.0.1:<free port>``,
without CURVE keys, like the serial run itself) in a thread of the serial runner, and answers
each ``StatsRequest`` with the ``Stats`` it asks the in-process server for (``server_stats``).
It relays nothing else: a message of any other kind, or one that does not decode, is dropped, so
a client of the relay can read the run but not control it. The serial runner records the relay's
addresses in ``roles.json`` (``stats``), where ``apexrl status RUN_DIR`` finds them.

Binds:     ROUTER tcp://127.0.0.1:<port>, one per server   in: StatsRequest    out: Stats
Connects:  DEALER the server's inproc:// address          out: StatsRequest   in: Stats
"""

from __future__ import annotations

import logging
import threading

import zmq

from apexrl.tools.server_stats import server_stats
from apexrl.transport import sockets
from apexrl.transport.messages import Stats, StatsRequest

log = logging.getLogger(__name__)

LOOPBACK = "tcp://127.0.0.1:0"  # a free port on loopback
POLL_MS = 100  # between two looks at the stop event
ASK_TIMEOUT_MS = 1000  # for the in-process server's answer; the client then hears nothing
JOIN_TIMEOUT_S = 5.0


class StatsRelay:
    """The relay's sockets and its thread: ``start``, then ``close`` before the run's context
    ends."""

    def __init__(self, ctx: zmq.Context, servers: dict[str, str]) -> None:
        """``servers``: role name (``replay``, ``params``) -> its in-process address."""
        self.ctx, self.servers = ctx, servers
        self.sockets = {name: sockets.bind(ctx, zmq.ROUTER, LOOPBACK) for name in servers}
        self.addresses = {name: sockets.bound_address(s) for name, s in self.sockets.items()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="stats_relay", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        for sock in self.sockets.values():
            poller.register(sock, zmq.POLLIN)
        while not self._stop.is_set():
            ready = dict(poller.poll(POLL_MS))
            for name, sock in self.sockets.items():
                if sock in ready:
                    self._answer(name, sock)

    def _answer(self, name: str, sock: zmq.Socket) -> None:
        received = sockets.recv_from(sock, timeout_ms=0)
        if received is None or not isinstance(received.message, StatsRequest):
            return
        values = server_stats(self.ctx, self.servers[name], ASK_TIMEOUT_MS)
        if values is not None:
            sockets.send_to(sock, received.identity, Stats(name, values))

    def close(self) -> None:
        """Stop the thread and close the sockets (left to the context's end if it is stuck)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(JOIN_TIMEOUT_S)
        if self._thread.is_alive():
            log.warning("the Stats relay did not stop within %.0f s", JOIN_TIMEOUT_S)
            return
        for sock in self.sockets.values():
            sock.close(linger=0)

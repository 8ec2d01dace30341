"""Asking a server for its ``Stats`` from outside the run's roles.

Connects:  DEALER to a replay or parameter server (as a CURVE client with the keys given)
           out: StatsRequest     in: Stats

``apexrl status`` reads a run with it, the local launcher waits with it for the servers to come
up and for every actor to step, and serial mode's Stats relay (``apexrl.launch.stats_relay``)
asks its in-process servers with it.
"""

from __future__ import annotations

import time

import zmq

from apexrl.transport import auth, sockets
from apexrl.transport.codec import DecodeError
from apexrl.transport.messages import Stats, StatsRequest


def server_stats(
    ctx: zmq.Context, addr: str, timeout_ms: int, curve: auth.ClientKeys | None = None
) -> dict[str, float] | None:
    """Ask a server for its ``Stats`` (as a CURVE client with ``curve``); None when it does not
    answer in time."""
    sock = sockets.connect(ctx, zmq.DEALER, addr, curve=curve)
    try:
        try:
            sockets.send(sock, StatsRequest(), flags=zmq.NOBLOCK)
        except zmq.Again:  # no pipe to queue it in: an inproc:// server that has closed
            return None
        deadline = time.monotonic() + timeout_ms / 1000
        while time.monotonic() < deadline:
            try:
                msg = sockets.recv(sock, timeout_ms=50)
            except DecodeError:
                continue
            if isinstance(msg, Stats):
                return msg.values
        return None
    finally:
        sock.close(linger=0)

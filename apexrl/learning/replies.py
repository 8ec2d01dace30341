"""What the learner's links to both servers share (``replay_link`` to replay, ``publisher`` to
the parameter server): reading the replies that wait on a socket, a malformed one logged and
turned into ``Error``, and how often each link looks at its connection monitor for a server gone
away.
"""

from __future__ import annotations

import logging

import zmq

from apexrl.transport import sockets
from apexrl.transport.codec import DecodeError
from apexrl.transport.messages import Error, Message

log = logging.getLogger("apexrl.learner")  # the learner's log lines, whichever part writes them

DROP_CHECK_INTERVAL_S = 0.1  # seconds between looks at the servers' connection monitors


def receive_now(sock: zmq.Socket, timeout_ms: int = 0) -> Message | None:
    """One waiting reply, or None; a malformed one is logged and returned as ``Error``."""
    try:
        return sockets.recv(sock, timeout_ms)
    except DecodeError as exc:
        log.warning("bad message: %s", exc)
        return Error(str(exc))

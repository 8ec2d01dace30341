"""Control of a running run from any host: ``apexrl stop`` asks both servers to shut down.

Connects:  DEALER cfg.net.replay_addr, DEALER cfg.net.params_addr
           out: Shutdown, then StatsRequest     in: Shutdown (the server is stopping), Stats

A server that receives ``Shutdown`` answers every later request with ``Shutdown`` for a grace
period, so the actors stop, and the learner stops when replay tells it so (writing its checkpoint:
the run can be resumed). This works the same for a run started by the launcher and for roles
started by hand on several hosts.
"""

from __future__ import annotations

import logging
import time

import zmq

from apexrl.config import Config
from apexrl.transport import auth, sockets
from apexrl.transport.codec import DecodeError
from apexrl.transport.messages import Shutdown, StatsRequest

log = logging.getLogger(__name__)


def ask_to_stop(
    ctx: zmq.Context,
    addr: str,
    reason: str,
    timeout_s: float,
    curve: auth.ClientKeys | None = None,
) -> bool:
    """Send ``Shutdown`` to the server at ``addr``; True once it says it is stopping. A run with
    CURVE keys takes the learner's key (``curve``): only a learner may stop the servers."""
    sock = sockets.connect(ctx, zmq.DEALER, addr, curve=curve)
    try:
        sockets.send(sock, Shutdown(reason))
        # A stopping server answers any request with Shutdown: that is the confirmation.
        sockets.send(sock, StatsRequest())
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                msg = sockets.recv(sock, timeout_ms=100)
            except DecodeError:
                continue
            if isinstance(msg, Shutdown):
                return True
        return False
    finally:
        sock.close(linger=0)


def stop_run(cfg: Config, timeout_s: float = 5.0) -> int:
    """Stop the run whose servers ``cfg.net`` names; 0 when both confirmed, 1 otherwise."""
    ctx = sockets.make_context()
    failed = []
    try:
        for name, addr in (("replay", cfg.net.replay_addr), ("params", cfg.net.params_addr)):
            curve = auth.client_keys(cfg.net, "learner", name)
            if ask_to_stop(ctx, addr, "apexrl stop", timeout_s, curve):
                log.info("%s server at %s is stopping", name, addr)
            else:
                failed.append(f"{name} server at {addr}")
    finally:
        ctx.term()
    if failed:
        log.error("no answer within %.0f s from the %s", timeout_s, " and the ".join(failed))
        return 1
    log.info("the run is stopping: actors and learners stop when the servers tell them")
    return 0

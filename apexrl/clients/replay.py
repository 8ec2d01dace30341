"""Replay client: an acting role's side of the replay server (the actor's chunks and reports,
the evaluation actor's rounds), with one chunk in flight.

Connects:  DEALER cfg.net.replay_addr   out: TrajectoryChunk     in: InsertAck, Error, Shutdown
                                        out: ActorReport         (no reply)
                                        out: StatsRequest        in: Stats

The next chunk is sent only after replay acknowledged the previous one, so a replay server that
holds inserts back (rate limiter) slows the actor down. A chunk replay lost (its connection
dropped, or no answer for the client's timeout) is sent again on a fresh socket
(``clients.peers``). Each report is followed by a ``StatsRequest``, whose answer carries the run's
env steps: the x-axis of an acting role's TensorBoard scalars.
"""

from __future__ import annotations

import logging
import time

import zmq

from apexrl.clients.peers import Link, Peer, PeerShutdown
from apexrl.config import NetConfig
from apexrl.transport import auth, sockets
from apexrl.transport.codec import DecodeError
from apexrl.transport.messages import (
    ActorReport,
    Error,
    InsertAck,
    Shutdown,
    Stats,
    StatsRequest,
    TrajectoryChunk,
)

log = logging.getLogger(__name__)

PROBE_INTERVAL_S = 1.0  # seconds of silence from replay, while waiting, before asking for Stats


def replay_link(ctx: zmq.Context, net: NetConfig, key_role: str) -> Link:
    """A link to the run's replay server for a client that holds ``key_role``'s CURVE key (which
    decides what the server lets it send)."""
    return Link(
        ctx, Peer("replay server", net.replay_addr), auth.client_keys(net, key_role, "replay")
    )


class ReplayClient:
    """Sends chunks with one in flight, and reports; ``send_chunk`` waits for the previous ack.

    A chunk that replay does not answer is sent again: at once when the connection drops (the
    replay server stopped or restarted, and a chunk it held is gone) and after ``timeout_s``
    without any answer from replay. While a chunk is unanswered the client asks for ``Stats``
    every ``PROBE_INTERVAL_S``, so a server that holds the chunk back under its rate limiter
    still answers and the chunk is not sent twice. A chunk sent again goes out on a fresh socket,
    so the copy queued in the old one never arrives; replay gets a chunk twice only when it stored
    the chunk and its ack was lost (the server stopped between the two), or when a server that
    stalled for longer than ``timeout_s`` wakes up. It stores each chunk once (by the chunk's
    sequence number) and acknowledges a copy again; a durable replay (``replay.durable``) keeps
    every chunk it acknowledged across a restart, and one it never acknowledged is sent again
    here. An ack names its chunk's sequence number: only the ack of the chunk in flight ends the
    wait, never a late one for an earlier chunk.
    """

    def __init__(self, link: Link, stop, timeout_s: float, warn_after_s: float) -> None:
        self.link, self.stop, self.timeout_s = link, stop, timeout_s
        self.warn_after_s = warn_after_s  # warn about a chunk held back for this long
        self.chunk: TrajectoryChunk | None = None  # sent, not yet answered
        self.stats_asked = False  # a StatsRequest is unanswered
        self.asked_at = 0.0  # when the oldest unanswered request (chunk or stats) was sent
        self.last_probe = time.monotonic()
        self.wait_s = 0.0  # time spent blocked on acks (flow control)
        self.run_env_steps: int | None = None  # from the latest Stats; None: none since asked

    @property
    def awaiting_ack(self) -> bool:
        return self.chunk is not None

    def poll(self, timeout_ms: int = 0) -> None:
        try:
            msg = sockets.recv(self.link.sock, timeout_ms)
        except DecodeError as exc:
            log.warning("bad message from the replay server: %s", exc)
            msg = None
        if msg is not None:
            self.link.peer.heard()
            self.asked_at = time.monotonic()  # what is still unanswered waits from now on
        if isinstance(msg, InsertAck):
            if self.chunk is not None and msg.sequence == self.chunk.sequence:
                self.chunk = None
        elif isinstance(msg, Error):
            self.chunk = None
            log.warning("replay server rejected a chunk: %s", msg.reason)
        elif isinstance(msg, Stats):
            self.stats_asked = False
            self.run_env_steps = int(msg.values.get("replay/env_steps", 0))
        elif isinstance(msg, Shutdown):
            raise PeerShutdown(msg.reason)
        self._check_replay()

    def _check_replay(self) -> None:
        """Send the unanswered chunk again when the connection dropped or replay is silent, and
        ask for ``Stats`` while waiting so that a live server answers something."""
        if self.link.dropped():
            self._send_again("the connection dropped")
            return
        if self.chunk is None and not self.stats_asked:
            return
        now = time.monotonic()
        waited_s = now - self.asked_at
        if waited_s > self.timeout_s:
            self._send_again(f"no answer for {waited_s:.0f} s")
        elif waited_s > PROBE_INTERVAL_S and now - self.last_probe > PROBE_INTERVAL_S:
            self.last_probe = now
            self._ask_stats()

    def _send_again(self, why: str) -> None:
        self.link.peer.lost(why)
        self.link.reset()
        self.asked_at = time.monotonic()
        if self.chunk is not None:
            sockets.send(self.link.sock, self.chunk)
        if self.stats_asked:
            self._ask_stats()

    def _ask_stats(self) -> None:
        self._mark_asked()
        sockets.send(self.link.sock, StatsRequest())
        self.stats_asked = True

    def _mark_asked(self) -> None:
        if self.chunk is None and not self.stats_asked:
            self.asked_at = time.monotonic()  # nothing was unanswered: the wait starts now

    def send_chunk(self, chunk: TrajectoryChunk) -> None:
        started = time.monotonic()
        warned_at = started
        while self.chunk is not None and not self.stop.is_set():
            self.poll(timeout_ms=50)
            if time.monotonic() - warned_at > self.warn_after_s and not self.link.peer.silent:
                warned_at = time.monotonic()
                log.warning("replay has not acknowledged a chunk for %.0f s", warned_at - started)
        self.wait_s += time.monotonic() - started
        if not self.stop.is_set():
            self._mark_asked()
            sockets.send(self.link.sock, chunk)
            self.chunk = chunk

    def report(self, report: ActorReport) -> None:
        """Send the report, then ask for the run's env steps as replay counts them after it."""
        sockets.send(self.link.sock, report)
        self._ask_stats()
        self.run_env_steps = None

"""Parameter server: holds the latest versioned weights from the learner and hands them to actors.

Binds:  ROUTER cfg.net.params_addr
        in:  PublishParams  -> PublishAck            (from the learner)
             ParamsRequest  -> Params                (the held version differs from the asker's)
                            -> ParamsNotModified     (it does not: no weight bytes are sent)
             StatsRequest   -> Stats
             Shutdown       -> the server stops; for a short grace period it answers every request
                               with Shutdown so actors stop too
             anything malformed or unexpected -> Error, counted in params/rejected_messages

A late joiner asks with ``have_version = -1`` and gets the current weights at once. Versions are
compared for equality, not order, so a learner that restarts from scratch (versions from 0 again)
still reaches every actor.

The ``Params`` reply of each version is encoded once, at publish, into immutable ``bytes`` frames
that every reply hands to ZeroMQ without a copy: 32 actors asking for a 6.4 MiB Nature CNN then
cost the server one copy instead of 32 copies and 32 encodings.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import zmq

from apexrl import lifecycle
from apexrl.config import Config
from apexrl.metrics import MetricsWriter
from apexrl.transport import sockets
from apexrl.transport.codec import decode, encode
from apexrl.transport.messages import (
    Error,
    Message,
    Params,
    ParamsNotModified,
    ParamsRequest,
    PublishAck,
    PublishParams,
    Shutdown,
    Stats,
    StatsRequest,
)

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 3.0  # seconds a stopping server keeps answering Shutdown
REPORT_INTERVAL_S = 5.0  # seconds between metric writes
NO_COMPRESSION = 1 << 62  # float weights do not compress; never spend CPU trying


class ParamStore:
    """The latest weights and the counters; ``handle`` maps one request to its reply."""

    def __init__(self) -> None:
        self.version = -1
        self.env_steps = 0  # the run's env steps at the latest publish: the metrics' x-axis
        self.arrays: dict[str, np.ndarray] = {}  # read-only views into params_frames
        self.params_frames: list[bytes] = []  # Params(version, arrays), encoded
        self.rejected_messages = 0
        self.num_served = 0
        self.stopping = False

    def handle(self, msg: Message) -> Message:
        if self.stopping:
            return Shutdown("parameter server is stopping")
        if isinstance(msg, ParamsRequest):
            if self.version >= 0 and msg.have_version != self.version:
                self.num_served += 1
                return Params(self.version, self.arrays)
            return ParamsNotModified(self.version)
        if isinstance(msg, PublishParams):
            if msg.version <= self.version:
                log.warning(
                    "publish of version %d after %d: the learner restarted",
                    msg.version,
                    self.version,
                )
            self.version = msg.version
            self.env_steps = msg.env_steps
            # bytes() copies the arrays out of the received frames, once per version.
            frames = encode(Params(msg.version, msg.arrays), compress_min_bytes=NO_COMPRESSION)
            self.params_frames = [bytes(frame) for frame in frames]
            self.arrays = decode(self.params_frames).arrays
            return PublishAck(self.version)
        if isinstance(msg, StatsRequest):
            return Stats("params", self.stats())
        if isinstance(msg, Shutdown):
            log.info("shutdown requested: %s", msg.reason)
            self.stopping = True
            return Shutdown("parameter server is stopping")
        return self.reject(f"parameter server does not accept {type(msg).__name__}")

    def encoded(self, reply: Message) -> list[bytes]:
        """The frames of ``reply``: the cached ones for the current ``Params``."""
        if isinstance(reply, Params) and reply.version == self.version and self.params_frames:
            return self.params_frames
        return [bytes(frame) for frame in encode(reply, compress_min_bytes=NO_COMPRESSION)]

    def reject(self, reason: str) -> Error:
        self.rejected_messages += 1
        log.warning("rejected a message: %s", reason)
        return Error(reason)

    def stats(self) -> dict[str, float]:
        return {
            "params/version": float(self.version),
            "params/num_served": float(self.num_served),
            "params/rejected_messages": float(self.rejected_messages),
        }


def main(cfg: Config) -> int:
    """Run the parameter server until SIGINT/SIGTERM or a ``Shutdown`` message; returns 0."""
    stop = lifecycle.install_stop_handlers()
    store = ParamStore()
    writer = MetricsWriter(cfg.run_dir / "tb" / "params")
    ctx = sockets.make_context()
    sock = sockets.bind(ctx, zmq.ROUTER, cfg.net.params_addr)
    log.info("parameter server on %s", sockets.bound_address(sock))
    stopping_since: float | None = None
    last_report = time.monotonic()
    try:
        while not stop.is_set():
            received = sockets.recv_from(sock, timeout_ms=100)
            if received is not None:
                if received.error is not None:
                    reply = store.reject(str(received.error))
                else:
                    reply = store.handle(received.message)
                sockets.send_encoded_to(sock, received.identity, store.encoded(reply))
            if store.stopping:
                stopping_since = stopping_since or time.monotonic()
                if time.monotonic() - stopping_since > SHUTDOWN_GRACE_S:
                    break
            if time.monotonic() - last_report >= REPORT_INTERVAL_S:
                last_report = time.monotonic()
                writer.scalars(store.stats(), step=store.env_steps)
    finally:
        writer.scalars(store.stats(), step=store.env_steps)  # the curve's last point
        writer.close()
        sock.close(linger=0)
        ctx.term()
    log.info("parameter server stopped")
    return 0

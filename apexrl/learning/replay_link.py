"""The learner's link to replay: the batches it trains on and the control messages beside them.

Connects:  DEALER cfg.net.replay_addr (batches)   out: SampleRequest, PriorityUpdate
                                                  in: SampleBatch, Error
           DEALER cfg.net.replay_addr (control)   out: StatsRequest, RestoreCounters, Shutdown
                                                  in: Stats

``learner.prefetch_batches`` sample requests stay in flight (``BatchStream``): a batch that
arrives is replaced by a new request at once, before the update that uses it. ZeroMQ's I/O thread
receives the replies in the background while the learner computes, so when replay holds data the
next batch is already in the socket's queue. (A Python prefetch thread measured no better: its GIL
hand-offs cost what the decoding it moves would save.) An update's new priorities go out on the
batches socket too, next to the request that replaces its batch; the control socket carries only
the rare messages. A batch with a NaN or an infinity in a float field is skipped (``finite``).

When replay's connection drops or replay answers nothing for ``learner.resend_timeout_s``, the
sample requests in flight are forgotten and asked again and the run's env steps are restored on
the server (``ReplayLinks``). A resumed learner first tells replay the run's env steps so far
(``restore_counters``); ``run_env_steps`` is the run's count as the learner knows it.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import torch
import zmq

from apexrl.algos import SampledBatch
from apexrl.clients.peers import Link, Peer, PeerShutdown
from apexrl.config import Config
from apexrl.learning.finite import SKIP_LOG_INTERVAL_S, RateLimitedLog, non_finite_fields
from apexrl.learning.replies import DROP_CHECK_INTERVAL_S, receive_now
from apexrl.transport import auth, sockets
from apexrl.transport.codec import DecodeError
from apexrl.transport.frames import OBSERVATION_FIELDS, frame_refs_fit
from apexrl.transport.messages import (
    Error,
    Message,
    PriorityUpdate,
    PublishedVersion,
    RestoreCounters,
    SampleBatch,
    SampleRequest,
    Shutdown,
    Stats,
    StatsRequest,
)

log = logging.getLogger("apexrl.learner")  # the learner's log lines, whichever part writes them


class BatchStream:
    """Keeps ``depth`` sample requests in flight on its own socket and hands out the replies with
    their fields as tensors on the learner's device. ``forget`` drops the requests in flight
    (replay lost them) with the socket they were sent on; ``next`` asks again."""

    def __init__(self, link: Link | zmq.Socket, cfg: Config, device: torch.device) -> None:
        self.link = link if isinstance(link, Link) else Link.around(link)
        self.cfg, self.device = cfg, device
        self.request = SampleRequest(cfg.replay.table, cfg.learner.batch_size)
        self.depth = cfg.learner.prefetch_batches
        self.in_flight = 0
        self.num_skipped = 0  # batches with non-finite values, not trained on
        self.skip_log = RateLimitedLog(SKIP_LOG_INTERVAL_S)

    def next(self, timeout_ms: int) -> SampledBatch | None:
        """The next batch, or None when none arrived within ``timeout_ms``."""
        self._top_up()
        try:
            msg = sockets.recv(self.link.sock, timeout_ms)
        except DecodeError as exc:
            log.warning("bad message from replay: %s", exc)
            return None
        if msg is not None:
            self.link.peer.heard()
        if isinstance(msg, SampleBatch):
            self.in_flight -= 1
            self._top_up()  # before the update: ``depth`` requests in flight while it runs
            bad = non_finite_fields(msg)
            if bad:
                self.num_skipped += 1
                self.skip_log.warning(
                    "skipped a batch whose %s hold NaN or infinite values (%d batches skipped)",
                    ", ".join(bad),
                    self.num_skipped,
                )
                return None
            if not frame_refs_fit(msg.frames, msg.fields):
                self.num_skipped += 1
                self.skip_log.warning(
                    "skipped a batch whose frame references fall outside its %d frames",
                    msg.frames.shape[0],
                )
                return None
            return self._to_device(msg)
        if isinstance(msg, Error):
            self.in_flight -= 1
            log.warning("replay refused a sample request: %s", msg.reason)
        elif isinstance(msg, Shutdown):
            raise PeerShutdown(msg.reason)
        return None

    def send_priorities(self, update: PriorityUpdate) -> None:
        """Send an update's new priorities (no reply) on this socket."""
        sockets.send(self.link.sock, update)

    def forget(self) -> None:
        self.link.reset()
        self.in_flight = 0

    def _top_up(self) -> None:
        while self.in_flight < self.depth:
            sockets.send(self.link.sock, self.request)
            self.in_flight += 1

    def _to_device(self, batch: SampleBatch) -> SampledBatch:
        cuda = self.device.type == "cuda"

        def tensor(array: np.ndarray) -> torch.Tensor:
            t = torch.from_numpy(np.array(array))  # decoded arrays are read-only views
            return t.pin_memory().to(self.device, non_blocking=True) if cuda else t

        fields = {name: tensor(array) for name, array in batch.fields.items()}
        if batch.frames.size:  # stacked frames sent once: the stacks are rebuilt here, uint8
            frames = tensor(batch.frames)
            for name in OBSERVATION_FIELDS:
                if name in fields:
                    fields[name] = frames[fields[name].long()]
        return SampledBatch(
            np.array(batch.keys), fields, np.array(batch.probabilities), batch.table_size
        )


class ReplayLinks:
    """The learner's two connections to replay, batches (``BatchStream``) and control
    (priorities, stats, counters), and what it knows of the server.

    When either connection drops (replay stopped or restarted) or replay answers nothing for
    ``timeout_s`` (the learner asks for ``Stats`` every few seconds, so a live server answers),
    both sockets are replaced: the sample requests in flight are forgotten and asked again, and
    the chief tells the server the run's env steps again (``RestoreCounters``), so that a replay
    server that came back without its data continues the run's count (one that restored its
    data keeps its own count, which is not lower).
    """

    def __init__(
        self,
        ctx: zmq.Context,
        cfg: Config,
        device: torch.device,
        keys: auth.ClientKeys | None,
        tables: dict[str, Config] | None = None,
    ) -> None:
        self.peer = Peer("replay server", cfg.net.replay_addr)
        # One stream per table: the run's, or each trained policy's (``tables``: its config).
        tables = tables if tables is not None else {"": cfg}
        self.streams = {
            name: BatchStream(Link(ctx, self.peer, keys), table_cfg, device)
            for name, table_cfg in tables.items()
        }
        self.batches = next(iter(self.streams.values()))
        self.control = Link(ctx, self.peer, keys)
        self.timeout_s = cfg.learner.resend_timeout_s
        self.last_reset = self.last_check = time.monotonic()
        # The chief's last announced to replay, per policy ("": a single-agent run's)
        self.published_versions: dict[str, int] = {}

    def announce_version(self, version: int, policy: str = "") -> None:
        """The chief, before it publishes ``version`` (of ``policy``): tell replay, so that it
        takes chunks and reports of actors that play it (``PublishedVersion``); told again after
        a reconnect."""
        self.published_versions[policy] = version
        sockets.send(self.control.sock, PublishedVersion(version, policy))

    def receive(self, timeout_ms: int = 0) -> Message | None:
        """A reply on the control socket within ``timeout_ms``, or None."""
        msg = receive_now(self.control.sock, timeout_ms)
        if msg is not None:
            self.peer.heard()
        return msg

    def check(self, env_steps: int | None) -> bool:
        """Re-connect and ask again when replay went away; True when it did. ``env_steps``: the
        run's count to restore (the chief's), or None. Looks at most every
        ``DROP_CHECK_INTERVAL_S``: the learner calls it after every update."""
        now = time.monotonic()
        if now - self.last_check < DROP_CHECK_INTERVAL_S:
            return False
        self.last_check = now
        dropped = False
        for stream in self.streams.values():
            dropped = stream.link.dropped() or dropped
        dropped = self.control.dropped() or dropped  # all read: each reports its own drop
        silent_s = time.monotonic() - max(self.peer.last_heard, self.last_reset)
        if not dropped and silent_s <= self.timeout_s:
            return False
        self.peer.lost("the connection dropped" if dropped else f"no answer for {silent_s:.0f} s")
        for stream in self.streams.values():
            stream.forget()
        self.control.reset()
        self.last_reset = time.monotonic()
        if env_steps:
            sockets.send(self.control.sock, RestoreCounters(env_steps))
        for policy, version in self.published_versions.items():
            sockets.send(self.control.sock, PublishedVersion(version, policy))
        sockets.send(self.control.sock, StatsRequest())
        return True

    def close(self, linger_ms: int) -> None:
        for link in (*(stream.link for stream in self.streams.values()), self.control):
            link.sock.setsockopt(zmq.LINGER, linger_ms)
            link.close()


def run_env_steps(stats: dict[str, float], counters: dict[str, int]) -> int:
    """The run's training env steps: replay's latest count, never below the checkpoint's."""
    return max(int(stats.get("replay/env_steps", 0)), counters["env_steps"])


def restore_counters(replay: ReplayLinks, env_steps: int, stop: threading.Event) -> dict | None:
    """Tell replay where a resumed run's env steps stand and wait for its ``Stats`` (sent again
    when replay went away meanwhile); None when stopped while waiting."""
    started = last_log = time.monotonic()
    sockets.send(replay.control.sock, RestoreCounters(env_steps))
    while not stop.is_set():
        msg = replay.receive(timeout_ms=200)
        if isinstance(msg, Stats):
            return msg.values
        replay.check(env_steps)
        if time.monotonic() - last_log > 10.0:
            last_log = time.monotonic()
            log.info("waiting for the replay server (%.0f s)", last_log - started)
    return None

"""The learner's link to the parameter server: publishing its weights.

Connects:  DEALER cfg.net.params_addr             out: PublishParams, Shutdown   in: PublishAck

Rank 0 alone publishes. At most one publish waits for its ack (``Publisher``); a publish that the
parameter server lost (it stopped or restarted, or its ack is late) is sent again with the latest
weights. Each publish's arrays are handed to ``Publisher.on_publish`` (the learner keeps the
judged versions': ``judged``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

import numpy as np
import zmq

from apexrl.algos import LearnerCore
from apexrl.clients.peers import Link
from apexrl.learning.replies import DROP_CHECK_INTERVAL_S, receive_now
from apexrl.models import params_to_arrays
from apexrl.transport import sockets
from apexrl.transport.messages import Error, PublishAck, PublishParams, Stats, StatsRequest

log = logging.getLogger("apexrl.learner")  # the learner's log lines, whichever part writes them

NO_COMPRESSION = 1 << 62  # float weights do not compress; never spend CPU trying


class Publisher:
    """Publishes weights to the parameter server with at most one publish waiting for its ack.

    A publish asked for while one is unacknowledged is sent, with the weights of that moment, when
    the ack comes: a parameter server that is down never gets publishes (each a full copy of the
    weights) queued up for it, and the learner never blocks on it. When the connection drops
    (the server stopped or restarted) or an ack does not come within ``timeout_s``, the socket is
    replaced and the latest weights are published again: a restarted server holds no weights until
    then. ``Stats`` requests every ``probe_interval_s`` keep ``peer.silent_s`` meaningful between
    publishes.
    """

    def __init__(
        self,
        link: Link,
        algo: LearnerCore,
        timeout_s: float,
        probe_interval_s: float,
        policy: str = "",
    ) -> None:
        self.link, self.algo = link, algo
        self.policy = policy  # the multi-agent run's policy these weights are; "": the run's
        self.timeout_s, self.probe_interval_s = timeout_s, probe_interval_s
        self.sent_at: float | None = None  # of the unacknowledged publish
        self.due = False  # a publish waits for the previous one's ack
        self.env_steps = 0  # the run's env steps to publish with
        self.env_task = ""  # JSON text the actors set on their envs with each version; "": none
        self.last_probe = self.last_check = time.monotonic()
        self.server_stats: dict[str, float] = {}  # the parameter server's, from the last probe
        # Called with (version, weights) of every publish sent (the arrays are the message's own).
        self.on_publish: Callable[[int, dict[str, np.ndarray]], None] | None = None
        # Called with the version of every publish just before it is sent (the learner tells
        # replay: ``PublishedVersion``).
        self.before_publish: Callable[[int], None] | None = None

    def task_in_force(self) -> object:
        """The env task sent with the weights, decoded; None when none was set."""
        return json.loads(self.env_task) if self.env_task else None

    def publish(self, env_steps: int) -> None:
        self.due, self.env_steps = True, env_steps
        self._send_if_free()

    def poll(self, timeout_ms: int = 0) -> bool:
        """Read the replies, re-connect when the server went away and send a due publish; True
        when an ack came."""
        acked = False
        msg = receive_now(self.link.sock, timeout_ms)
        while msg is not None:
            self.link.peer.heard()
            if isinstance(msg, PublishAck):
                self.sent_at, acked = None, True
            elif isinstance(msg, Stats):
                self.server_stats = msg.values
            elif isinstance(msg, Error) and self.sent_at is not None:
                self.sent_at = None  # refused (logged by the server); the next publish may pass
                log.warning("the parameter server refused a publish: %s", msg.reason)
            msg = receive_now(self.link.sock)
        now = time.monotonic()
        if not acked and now - self.last_check < DROP_CHECK_INTERVAL_S:
            self._send_if_free()
            return acked
        self.last_check = now
        dropped = self.link.dropped()
        late = self.sent_at is not None and now - self.sent_at > self.timeout_s
        if dropped or late:
            self.link.peer.lost(
                "the connection dropped" if dropped else f"no ack for {now - self.sent_at:.0f} s"
            )
            self.link.reset()
            self.due = self.due or self.sent_at is not None or dropped
            self.sent_at = None
        elif now - self.last_probe >= self.probe_interval_s:
            self.last_probe = now
            sockets.send(self.link.sock, StatsRequest())
        self._send_if_free()
        return acked

    def wait_for_ack(self, stop: threading.Event) -> bool:
        """Wait until the publish in flight is acknowledged; False when stopped first."""
        started = last_log = time.monotonic()
        while not stop.is_set():
            if self.poll(timeout_ms=200) or (self.sent_at is None and not self.due):
                return True
            if time.monotonic() - last_log > 10.0:
                last_log = time.monotonic()
                log.info(
                    "waiting for the parameter server at %s (%.0f s)",
                    self.link.peer.addr,
                    last_log - started,
                )
        return False

    def _send_if_free(self) -> None:
        if self.due and self.sent_at is None:
            if self.before_publish is not None:
                self.before_publish(self.algo.num_updates)
            arrays = publish(self.link.sock, self.algo, self.env_steps, self.env_task, self.policy)
            self.sent_at, self.due = time.monotonic(), False
            if self.on_publish is not None:
                self.on_publish(self.algo.num_updates, arrays)


def publish(
    sock: zmq.Socket, algo: LearnerCore, env_steps: int, env_task: str = "", policy: str = ""
) -> dict[str, np.ndarray]:
    """Send the weights as version ``algo.num_updates`` of ``policy`` (with the env task in
    force); returns them (copies, for the caller to keep)."""
    arrays = params_to_arrays(algo.network)
    msg = PublishParams(algo.num_updates, env_steps, arrays, env_task, policy)
    sockets.send(sock, msg, compress_min_bytes=NO_COMPRESSION)
    return msg.arrays

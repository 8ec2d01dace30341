"""Replay server: stores actors' items in a prioritized table (Ape-X, R2D2) or a FIFO queue
(IMPALA, PPO) and serves batches to learners, under a samples-per-insert rate limiter.

Binds:  ROUTER cfg.net.replay_addr
        in:  TrajectoryChunk -> InsertAck (held back while the rate limiter blocks inserts or a
                                FIFO queue is full, so an actor with one chunk in flight is
                                slowed down, never dropped); Error for a chunk that does not
                                match the table or is larger than a FIFO queue
             SampleRequest   -> SampleBatch (held back until sampling is allowed)
             PriorityUpdate, ActorReport -> no reply
             StatsRequest    -> Stats
             RestoreCounters -> Stats (a resumed run's env steps become the floor of the count)
             Shutdown        -> the server stops; for a short grace period it answers every
                                request, held ones included, with Shutdown so actors stop too
             anything malformed or unexpected -> Error, counted in replay/rejected_messages

The replay server is also where actors' episode reports meet: it keeps the run's total of
training env steps (counted from inserted chunks, so it describes the data in the table) and the
recent training and evaluation returns, and serves them in ``Stats`` to the learner, which decides
when the run is done, and to every role, which writes its TensorBoard scalars at that count: one
x-axis for the whole run.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass

import numpy as np
import zmq

from apexrl import lifecycle
from apexrl.config import Config
from apexrl.metrics import MetricsWriter, RateMeter
from apexrl.replay.tables import FifoQueue, RateLimiter, make_table
from apexrl.transport import sockets
from apexrl.transport.messages import (
    ActorReport,
    Error,
    InsertAck,
    Message,
    PriorityUpdate,
    RestoreCounters,
    SampleBatch,
    SampleRequest,
    Shutdown,
    Stats,
    StatsRequest,
    TrajectoryChunk,
)

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 3.0  # seconds a stopping server keeps answering Shutdown
TRAIN_RETURN_WINDOW = 100  # training episodes in replay/train_return_mean
MAX_MESSAGES_PER_PASS = 64  # messages handled before held inserts and samples are served


@dataclass(frozen=True)
class Reply:
    identity: bytes
    message: Message


class ReplayService:
    """The replay server's state and message handling, kept apart from the socket loop so it can
    be tested without sockets. ``handle`` and ``drain`` return the replies to send."""

    def __init__(self, cfg: Config, seed: int = 0) -> None:
        self.cfg = cfg
        self.table_name = cfg.replay.table
        # The FIFO options default to a queue that delivers each item once and never drops an
        # unread one, for configs that do not have these keys.
        self.table = make_table(
            cfg.replay.kind,
            cfg.replay.capacity,
            cfg.replay.priority_exponent,
            max_times_sampled=cfg.replay.max_times_sampled,
            evict_unread=cfg.replay.evict_unread,
        )
        self.limiter = RateLimiter(
            samples_per_insert=cfg.replay.samples_per_insert,
            min_size_to_sample=cfg.replay.min_size_to_sample,
            error_buffer=cfg.rate_error_buffer,
        )
        self.rng = np.random.default_rng(seed)
        self.pending_inserts: collections.deque[tuple[bytes, TrajectoryChunk]] = collections.deque()
        self.pending_samples: collections.deque[tuple[bytes, SampleRequest]] = collections.deque()
        self.rejected_messages = 0
        self.priority_updates_applied = 0  # items whose priority changed
        self.priority_updates_by_rank: dict[int, int] = {}  # PriorityUpdate messages per learner
        self.env_steps = 0  # the run's training env steps (resumed runs: from the checkpoint on)
        self.eval_env_steps = 0
        self.train_episodes = 0
        self.eval_episodes = 0
        self.train_returns: collections.deque[float] = collections.deque(maxlen=TRAIN_RETURN_WINDOW)
        self.eval_returns: collections.deque[float] = collections.deque(
            maxlen=cfg.run.stop_eval_episodes
        )
        self.actors_last_seen: dict[tuple[bool, int], float] = {}  # (is_eval, actor id)
        self.stopping = False

    # -- dispatch --------------------------------------------------------------------------------

    def reject(self, identity: bytes, reason: str) -> list[Reply]:
        self.rejected_messages += 1
        log.warning("rejected a message: %s", reason)
        return [Reply(identity, Error(reason))]

    def handle(self, identity: bytes, msg: Message) -> list[Reply]:
        if self.stopping:
            return [Reply(identity, Shutdown("replay server is stopping"))]
        if isinstance(msg, TrajectoryChunk):
            return self._on_chunk(identity, msg)
        if isinstance(msg, SampleRequest):
            if msg.table != self.table_name:
                return self.reject(identity, f"unknown table {msg.table!r}")
            if msg.batch_size > self.cfg.replay.capacity:
                return self.reject(identity, f"batch_size {msg.batch_size} exceeds the capacity")
            self.pending_samples.append((identity, msg))
            return []
        if isinstance(msg, PriorityUpdate):
            if msg.table != self.table_name:
                return self.reject(identity, f"unknown table {msg.table!r}")
            self.priority_updates_applied += self.table.update_priorities(msg.keys, msg.priorities)
            by_rank = self.priority_updates_by_rank
            by_rank[msg.learner_rank] = by_rank.get(msg.learner_rank, 0) + 1
            return []
        if isinstance(msg, ActorReport):
            self._on_report(msg)
            return []
        if isinstance(msg, StatsRequest):
            return [Reply(identity, Stats(role="replay", values=self.stats()))]
        if isinstance(msg, RestoreCounters):
            if msg.env_steps > self.env_steps:
                log.info("the run resumes at %d env steps", msg.env_steps)
            self.env_steps = max(self.env_steps, msg.env_steps)
            return [Reply(identity, Stats(role="replay", values=self.stats()))]
        if isinstance(msg, Shutdown):
            log.info("shutdown requested: %s", msg.reason)
            return self.begin_shutdown()
        return self.reject(identity, f"replay server does not accept {type(msg).__name__}")

    def _on_chunk(self, identity: bytes, chunk: TrajectoryChunk) -> list[Reply]:
        if chunk.table != self.table_name:
            return self.reject(identity, f"unknown table {chunk.table!r}")
        try:
            self.table.can_insert(chunk.priorities.shape[0])  # raises for a chunk that never fits
        except ValueError as exc:
            return self.reject(identity, str(exc))
        if len(self.pending_inserts) >= self.cfg.replay.max_pending_inserts:
            return self.reject(identity, "too many inserts waiting; retry later")
        self.actors_last_seen[(False, chunk.actor_id)] = time.monotonic()
        self.pending_inserts.append((identity, chunk))
        return []

    def _on_report(self, report: ActorReport) -> None:
        self.actors_last_seen[(report.is_eval, report.actor_id)] = time.monotonic()
        returns = report.episode_returns.tolist()
        if report.is_eval:
            self.eval_env_steps += report.env_steps
            self.eval_episodes += len(returns)
            self.eval_returns.extend(returns)
        else:
            self.train_episodes += len(returns)
            self.train_returns.extend(returns)

    def drain(self) -> list[Reply]:
        """Admit held inserts and serve held sample requests as far as the rate limiter allows and,
        for inserts, a FIFO queue has room: a chunk waits at the head of the line until then."""
        replies: list[Reply] = []
        progress = True
        while progress:
            progress = False
            while self.pending_inserts:
                identity, chunk = self.pending_inserts[0]
                num_items = chunk.priorities.shape[0]
                if not (self.limiter.can_insert(num_items) and self.table.can_insert(num_items)):
                    break
                self.pending_inserts.popleft()
                try:
                    self.table.insert(chunk.fields, chunk.priorities)
                except ValueError as exc:  # fields that do not match the table's items
                    replies += self.reject(identity, str(exc))
                    continue
                self.limiter.record_insert(num_items)
                self.env_steps += chunk.env_steps
                replies.append(
                    Reply(identity, InsertAck(self.table_name, num_items, self.table.size))
                )
                progress = True
            while self.pending_samples:
                identity, request = self.pending_samples[0]
                if self.table.size < request.batch_size or not self.limiter.can_sample(
                    request.batch_size
                ):
                    break
                self.pending_samples.popleft()
                table_size = self.table.size
                keys, fields, probabilities = self.table.sample(request.batch_size, self.rng)
                self.limiter.record_sample(request.batch_size)
                replies.append(
                    Reply(
                        identity,
                        SampleBatch(self.table_name, table_size, keys, probabilities, fields),
                    )
                )
                progress = True
        return replies

    def begin_shutdown(self) -> list[Reply]:
        self.stopping = True
        held = [identity for identity, _ in self.pending_inserts]
        held += [identity for identity, _ in self.pending_samples]
        self.pending_inserts.clear()
        self.pending_samples.clear()
        return [Reply(identity, Shutdown("replay server is stopping")) for identity in held]

    def stats(self) -> dict[str, float]:
        now = time.monotonic()
        values = {
            "replay/size": float(self.table.size),
            "replay/num_inserted": float(self.table.num_inserted),
            "replay/num_sampled": float(self.table.num_sampled),
            "replay/rejected_messages": float(self.rejected_messages),
            "replay/pending_inserts": float(len(self.pending_inserts)),
            "replay/pending_samples": float(len(self.pending_samples)),
            "replay/priority_updates": float(self.priority_updates_applied),
            "replay/env_steps": float(self.env_steps),
            "replay/train_episodes": float(self.train_episodes),
            "replay/train_return_mean": _mean(self.train_returns),
            "replay/active_actors": float(
                sum(1 for seen in self.actors_last_seen.values() if now - seen < 30.0)
            ),
            "eval/episodes": float(self.eval_episodes),
            "eval/env_steps": float(self.eval_env_steps),
            "eval/return_mean": _mean(self.eval_returns),
            "eval/episodes_in_window": float(len(self.eval_returns)),
            **{
                f"replay/priority_updates_rank_{rank}": float(count)
                for rank, count in self.priority_updates_by_rank.items()
            },
        }
        if isinstance(self.table, FifoQueue):  # items dropped before their last delivery
            values["replay/evicted_unread"] = float(self.table.num_evicted)
        return values


def _mean(values: collections.deque[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def main(cfg: Config) -> int:
    """Run the replay server until SIGINT/SIGTERM or a ``Shutdown`` message; returns 0."""
    stop = lifecycle.install_stop_handlers()
    service = ReplayService(cfg)
    writer = MetricsWriter(cfg.run_dir / "tb" / "replay")
    inserts, samples = RateMeter(), RateMeter()
    ctx = sockets.make_context()
    sock = sockets.bind(ctx, zmq.ROUTER, cfg.net.replay_addr)
    log.info(
        "replay server on %s (%s, capacity %d)",
        sockets.bound_address(sock),
        cfg.replay.kind,
        cfg.replay.capacity,
    )
    stopping_since: float | None = None
    last_report = time.monotonic()
    try:
        while not stop.is_set():
            # Handle every message that is ready (up to a bound) before the table work in drain():
            # one message per pass would run drain() and the clock checks once per message.
            replies: list[Reply] = []
            received = sockets.recv_from(sock, timeout_ms=50)
            num_handled = 0
            while received is not None:
                if received.error is not None:
                    replies += service.reject(received.identity, str(received.error))
                else:
                    replies += service.handle(received.identity, received.message)
                num_handled += 1
                if (
                    num_handled >= MAX_MESSAGES_PER_PASS
                    or len(service.pending_inserts) >= cfg.replay.max_pending_inserts
                ):
                    break  # serve what is held before reading on, so no chunk is refused for it
                received = sockets.recv_from(sock, timeout_ms=0)
            if service.stopping:
                stopping_since = stopping_since or time.monotonic()
                if time.monotonic() - stopping_since > SHUTDOWN_GRACE_S:
                    break
            else:
                before = (service.table.num_inserted, service.table.num_sampled)
                replies += service.drain()
                inserts.add(service.table.num_inserted - before[0])
                samples.add(service.table.num_sampled - before[1])
            for reply in replies:
                sockets.send_to(sock, reply.identity, reply.message)
            if time.monotonic() - last_report >= cfg.replay.report_interval_s:
                last_report = time.monotonic()
                values = service.stats()
                values["replay/inserts_per_s"] = inserts.rate()
                values["replay/samples_per_s"] = samples.rate()
                writer.scalars(values, step=service.env_steps)
    finally:
        writer.scalars(service.stats(), step=service.env_steps)  # the curve's last point
        writer.close()
        sock.close(linger=0)
        ctx.term()
    log.info("replay server stopped")
    return 0

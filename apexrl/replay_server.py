"""Replay server: stores actors' items in a prioritized table (Ape-X, R2D2) or a FIFO queue
(IMPALA, PPO) and serves batches to learners, under a samples-per-insert rate limiter.

Binds:  ROUTER cfg.net.replay_addr
        in:  TrajectoryChunk -> InsertAck (held back while the rate limiter blocks inserts or a
                                FIFO queue is full, so an actor with one chunk in flight is
                                slowed down, never dropped)
             SampleRequest   -> SampleBatch (held back until sampling is allowed)
             PriorityUpdate, ActorReport -> no reply
             StatsRequest    -> Stats
             RestoreCounters -> Stats (a resumed run's env steps become the floor of the count)
             Shutdown        -> the server stops; for a short grace period it answers every
                                request, held ones included, with Shutdown so actors stop too
             anything malformed or unexpected, or that no actor or learner of this config
             would send (``ReplayService`` lists the checks) -> Error, counted in
                                replay/rejected_messages; the message changes nothing

The replay server is also where actors' episode reports meet: it keeps the run's bookkeeping
(``replay/bookkeeping.py``: the training env steps counted from inserted chunks, episodes, recent
training and evaluation returns, evaluation rounds and the custom metrics of the run's callbacks)
and serves it in ``Stats`` to the learner, which decides when the run is done, and to every role,
which writes its TensorBoard scalars at that count: one x-axis for the whole run.

Snapshots (``replay/snapshot.py``): every ``replay.snapshot_interval_s`` and at a clean stop the
server writes its table (items, keys, priorities or delivery counts), the rate limiter's counters
and the run's counters to ``<run dir>/replay_snapshot/``, and at start it loads the one there, so
a replay server that is killed and started again goes on with the same items under the same keys
(a learner's priority updates for them still apply). The server loop pauses only to copy the
table; a thread writes the copy. A snapshot that does not fit this config or is corrupt is
refused with one log line, set aside, and the server starts empty.

Durability (``replay/chunk_log.py``, ``replay.durable``): every chunk stored, as its frames came
off the wire, goes to the chunk log before its ``InsertAck``: the chunks stored in one pass of the
loop are written together (``commit_stored``), then their acks go out. Each snapshot starts a new
log segment and leaves the items out: the log's segments hold them (frames once, as compressed as
they came) until every item of a segment has left the table. At start the server loads the
snapshot, its items from the segments before it, and then the log's records after it
(``open_chunk_log``), so a killed server comes back with every chunk it acknowledged. Chunks carry
their actor's sequence numbers: one stored before (its ack was lost and the actor sent it again)
is acknowledged again without being stored twice.
``replay/accounting.py`` counts what became of every item (``replay/items_*`` in ``Stats``).

Here: the server loop, ``main`` and ``serve``, around the service (``replay/service.py``:
``ReplayService``, the table, the rate limiter and what is held back, the checks that need their
state, and what goes in a snapshot; a multi-agent run's server holds one per trained policy,
``apexrl.multiagent.replay_tables``). Around them: the socket,
its replies and the reading of one pass's messages (``replay/serving.py``), the held chunks and
their bounds (``replay/held.py``), the values of ``Stats`` and the throughput written with them
(``replay/reporting.py``), and what outlives the process, loading and writing snapshots and the
chunk log (``replay/persistence.py``). The parts it composes are those of ``apexrl/replay/`` (its
``__init__`` lists them).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from apexrl.config import Config
from apexrl.multiagent.replay_tables import PolicyTables
from apexrl.replay.chunk_log import AckLedger
from apexrl.replay.persistence import (
    Snapshots,
    commit_stored,
    open_chunk_log,
    open_snapshots,
    snapshot_if_due,
    write_final_snapshot,
)
from apexrl.replay.reporting import Throughput
from apexrl.replay.service import ReplayService
from apexrl.replay.serving import bind_socket, handle_ready_messages
from apexrl.runtime import lifecycle, rundir
from apexrl.runtime.metrics import MetricsWriter
from apexrl.transport import sockets

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 3.0  # seconds a stopping server keeps answering Shutdown


@dataclass
class Persisted:
    """A service's snapshots and chunk log in the server loop."""

    service: ReplayService
    snapshots: Snapshots | None
    ledger: AckLedger
    last_snapshot: float


def open_persisted(service: ReplayService) -> Persisted:
    """Load ``service``'s snapshot and then its chunk log (the chunks since)."""
    snapshots, log_segment = open_snapshots(service)
    ledger = open_chunk_log(service, log_segment)
    return Persisted(service, snapshots, ledger, time.monotonic())


def make_service(cfg: Config) -> ReplayService | PolicyTables:
    """The server's service: one table, or one per trained policy of a multi-agent run
    (``apexrl.multiagent.replay_tables``)."""
    if cfg.multiagent.enabled:
        return PolicyTables(cfg)
    return ReplayService(cfg)


def main(cfg: Config) -> int:
    """Run the replay server until SIGINT/SIGTERM or a ``Shutdown`` message; returns 0."""
    stop = lifecycle.install_stop_handlers()
    server = make_service(cfg)
    persisted: list[Persisted] = []
    writer = None
    sock = ctx = None
    try:
        for service in server.services:
            persisted.append(open_persisted(service))
        writer = MetricsWriter(rundir.tensorboard_dir(cfg.run_dir, "replay"))
        throughput = Throughput()
        ctx = sockets.make_context()
        sock = bind_socket(ctx, cfg)
        serve(sock, server, persisted, throughput, writer, stop)
    finally:
        if writer is not None:
            writer.scalars(server.stats(), step=server.env_steps)  # the curve's last point
            writer.close()
        for kept in persisted:
            if kept.service.chunk_log is not None:
                kept.service.chunk_log.close()
            kept.ledger.close()
        if sock is not None:
            sock.close(linger=0)
            ctx.term()
    log.info("replay server stopped")
    return 0


def serve(
    sock,
    server: ReplayService | PolicyTables,
    persisted: list[Persisted],
    throughput: Throughput,
    writer: MetricsWriter,
    stop,
) -> None:
    """The server loop: read a pass's messages, admit and serve what is held, write the stored
    chunks to their logs, send the replies, snapshot when due; at a clean stop (not an
    exception) the snapshots to go on from."""
    stopping_since: float | None = None
    while not stop.is_set():
        replies = handle_ready_messages(sock, server)
        if server.stopping:
            stopping_since = stopping_since or time.monotonic()
            if time.monotonic() - stopping_since > SHUTDOWN_GRACE_S:
                break
        else:
            replies += throughput.drain(server)
        for kept in persisted:
            commit_stored(kept.service, kept.ledger)  # the chunk log, before the acks
        for reply in replies:
            sockets.send_to(sock, reply.identity, reply.message)
        if not server.stopping:
            for kept in persisted:
                if kept.snapshots is not None:
                    kept.last_snapshot = snapshot_if_due(
                        kept.service, kept.snapshots, kept.last_snapshot
                    )
        throughput.report_if_due(server, writer)
    for kept in persisted:
        if kept.snapshots is not None:
            write_final_snapshot(kept.service, kept.snapshots)

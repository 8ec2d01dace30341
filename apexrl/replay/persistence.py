"""What outlives a replay server process: its snapshots and its chunk log.

At start (``main`` in ``replay_server.py``): ``open_snapshots`` loads the run directory's snapshot
into a fresh service, then ``open_chunk_log`` reads the chunk log's records after it back in
(``replay.durable``) and counts as lost the acknowledged items that did not come back (the ack
ledger). In the loop: ``commit_stored`` writes the chunks stored in a pass before their acks go
out, and ``snapshot_if_due`` copies the state for a thread to write, beginning a new log segment
(``start_snapshot``); the older segments go once it is on disk (``note_snapshot``). At a clean
stop: ``write_final_snapshot``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from apexrl.config import Config
from apexrl.replay.accounting import ItemCounts
from apexrl.replay.bookkeeping import RunBookkeeping
from apexrl.replay.chunk_log import (
    CHUNK,
    DELIVERY,
    LOG_DIR,
    AckLedger,
    ChunkLog,
    Record,
    read_records,
)
from apexrl.replay.snapshot import (
    SNAPSHOT_FILE,
    Snapshot,
    SnapshotWriter,
    WriteResult,
    load_snapshot_file,
)
from apexrl.replay.state import log_segment_of
from apexrl.replay.tables import FifoQueue, PrioritizedTable
from apexrl.transport.codec import DecodeError, decode
from apexrl.transport.messages import TrajectoryChunk


class ReplayService(Protocol):
    """What of the replay server's service (``replay.service.ReplayService``) this module uses."""

    cfg: Config
    table: PrioritizedTable | FifoQueue
    run: RunBookkeeping
    counts: ItemCounts
    chunk_log: ChunkLog | None
    last_snapshot: WriteResult | None
    snapshot_dir: Path

    def progress(self) -> tuple[int, ...]: ...
    def export_snapshot(self, log_segment: int = 0) -> Snapshot: ...
    def load_snapshot(self, snapshot: Snapshot) -> None: ...
    def recover_chunk(self, chunk: TrajectoryChunk) -> int: ...
    def recover_delivery(self, num_items: int) -> None: ...


log = logging.getLogger("apexrl.replay_server")  # the replay server's log lines


def restore_snapshot(service: ReplayService, directory: Path) -> Snapshot | None:
    """Load ``directory``'s snapshot into a fresh ``service``, if there is one, and return it. One
    that cannot be used is refused with one log line and set aside, and the service stays
    empty."""
    snapshot = load_snapshot_file(directory, service.load_snapshot)
    if snapshot is None:
        return None
    if service.cfg.run.resume and service.run.eval_returns:
        # A resumed run's stop condition judges this session's evaluation episodes only.
        log.info(
            "a resumed run: the snapshot's %d evaluation returns are not counted",
            len(service.run.eval_returns),
        )
        service.run.forget_eval_returns()
    table = service.table
    log.info(
        "loaded the replay snapshot %s: %d items (keys %d..%d), %d env steps, written %.1f s ago",
        directory / SNAPSHOT_FILE,
        table.size,
        table.num_inserted - table.size,
        table.num_inserted - 1,
        service.run.env_steps,
        time.time() - snapshot.meta["written_at"],
    )
    return snapshot


@dataclass
class Snapshots:
    """The writer of the next snapshots, and the chunk log segment begun with the one being
    written (its older segments are deleted once it is on disk)."""

    writer: SnapshotWriter
    log_segment: int | None = None


def open_snapshots(service: ReplayService) -> tuple[Snapshots | None, int]:
    """With ``replay.snapshot_interval_s``: restore the run directory's snapshot and return the
    writer of the next ones; without: None. Also the first chunk log segment the snapshot loaded
    does not hold (0 without one)."""
    directory = service.snapshot_dir
    if service.cfg.replay.snapshot_interval_s > 0:
        snapshot = restore_snapshot(service, directory)
        writer = SnapshotWriter(directory, progress=service.progress())
        return Snapshots(writer), 0 if snapshot is None else log_segment_of(snapshot)
    if (directory / SNAPSHOT_FILE).exists():
        log.info(
            "replay.snapshot_interval_s is 0: the replay snapshot in %s is not loaded",
            service.cfg.run_dir,
        )
    return None, 0


def open_chunk_log(service: ReplayService, first_segment: int) -> AckLedger:
    """After the snapshot: read the chunk log's records from ``first_segment`` on back into
    ``service`` and open the log for the chunks to come (``replay.durable``); count as lost the
    acknowledged items that did not come back. Returns the ack ledger."""
    directory = service.snapshot_dir
    if service.cfg.replay.durable:
        read_chunk_log(service, directory / LOG_DIR, first_segment)
        service.chunk_log = ChunkLog(
            directory / LOG_DIR,
            service.cfg.replay.log_fsync,
            first_segment,
            service.cfg.replay.priority_log_period_s,
        )
    ledger = AckLedger(directory)
    acked = ledger.read()
    if acked is not None:
        acked_stored, lost_before = acked
        missing = max(acked_stored - service.counts.stored, 0)
        service.counts.lost = lost_before + missing
        if missing:
            log.warning(
                "%d acknowledged items are lost: acknowledged %d, back after the restart %d%s",
                missing,
                acked_stored,
                service.counts.stored,
                "" if service.cfg.replay.durable else " (replay.durable is off)",
            )
    ledger.write(service.counts.stored, service.counts.lost)
    return ledger


def read_chunk_log(service: ReplayService, directory: Path, first_segment: int) -> None:
    """Store the chunk log's chunks (and repeat its FIFO deliveries and its priority updates)
    from ``first_segment`` on, in their order; a record that does not decode or fit is refused
    with a log line."""
    chunks = items = deliveries = updates = refused = 0
    for record in read_records(directory, first_segment):
        try:
            if record.kind == CHUNK:
                items += recover_record(service, record)
                chunks += 1
            elif record.kind == DELIVERY:
                service.recover_delivery(record.num_delivered)
                deliveries += 1
            else:
                service.table.update_priorities(*record.priorities)
                updates += 1
        except ValueError as exc:  # DecodeError included
            refused += 1
            log.error("refused a record of the chunk log: %s", exc)
    if chunks or deliveries or updates or refused:
        log.info(
            "read back from the chunk log: %d chunks (%d items), %d deliveries, %d priority "
            "updates, %d refused",
            chunks,
            items,
            deliveries,
            updates,
            refused,
        )


def recover_record(service: ReplayService, record: Record) -> int:
    chunk = decode(record.frames)
    if not isinstance(chunk, TrajectoryChunk):
        raise DecodeError(f"a {type(chunk).__name__}, not a chunk")
    return service.recover_chunk(chunk)


def commit_stored(service: ReplayService, ledger: AckLedger) -> None:
    """Write the chunks stored in this pass to the chunk log (one write), then the ack ledger:
    before the pass's acks are sent. An ``OSError`` ends the server: no ack may go out for a
    chunk that is not in the log."""
    if service.chunk_log is not None:
        service.chunk_log.append_priorities_if_due()
        service.chunk_log.commit()
    ledger.write(service.counts.stored, service.counts.lost)


def start_snapshot(service: ReplayService, snapshots: Snapshots) -> Snapshot:
    """The state as a snapshot, with a new chunk log segment begun: the snapshot holds the older
    ones."""
    segment = 0
    if service.chunk_log is not None:
        segment = service.chunk_log.rotate()
        snapshots.log_segment = segment
    return service.export_snapshot(segment)


def snapshot_if_due(service: ReplayService, snapshots: Snapshots, last_start: float) -> float:
    """Note a finished write; when the interval since ``last_start`` is over and no write is in
    progress, copy the state (the pause in the server loop) for the writer to write, unless it is
    on disk already. Returns the time of the last start."""
    writer = snapshots.writer
    note_snapshot(service, snapshots, writer.poll())
    now = time.monotonic()
    if now - last_start < service.cfg.replay.snapshot_interval_s or not writer.idle:
        return last_start
    if service.progress() != writer.written_progress:
        snapshot = start_snapshot(service, snapshots)
        writer.start(snapshot, service.progress(), service.table.size, time.monotonic() - now)
    return now


def note_snapshot(service: ReplayService, snapshots: Snapshots, result: WriteResult | None) -> None:
    """A snapshot is on disk: delete the chunk log segments it holds."""
    if result is None:
        return
    if service.chunk_log is not None and snapshots.log_segment is not None:
        service.chunk_log.drop_before(snapshots.log_segment)
    service.last_snapshot = result
    log.info(
        "replay snapshot: %d items, %.1f MB in %.3f s (%.3f s of it copying in the server loop)",
        result.num_items,
        result.num_bytes / 1e6,
        result.total_s,
        result.copy_s,
    )


def write_final_snapshot(service: ReplayService, snapshots: Snapshots) -> None:
    """At a clean stop: wait for a write in progress, then write the state as it is now unless
    that is on disk already."""
    writer = snapshots.writer
    note_snapshot(service, snapshots, writer.join())
    if service.progress() == writer.written_progress:
        return
    snapshot = start_snapshot(service, snapshots)
    try:
        result = writer.write_now(snapshot, service.progress(), service.table.size)
    except OSError as exc:
        log.error("writing the final replay snapshot to %s failed: %s", writer.directory, exc)
        return
    note_snapshot(service, snapshots, result)

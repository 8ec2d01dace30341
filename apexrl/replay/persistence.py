"""What outlives a replay server process: its snapshots and its chunk log.

At start (``main`` in ``replay_server.py``): ``open_snapshots`` loads the run directory's snapshot
into a fresh service (a durable server's snapshot leaves its items in the chunk log:
``refill_from_log`` puts them back from the segments before it), then ``open_chunk_log`` reads
the chunk log's records after it back in (``replay.durable``) and counts as lost the acknowledged
items that did not come back (the ack ledger). In the loop: ``commit_stored`` writes the chunks
stored in a pass before their acks go out, and ``snapshot_if_due`` copies the state for a thread
to write, beginning a new log segment (``start_snapshot``: without the items when the log holds
them all); once it is on disk the segments whose items have all left go (``note_snapshot``). At a
clean stop: ``write_final_snapshot``.
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
    SAMPLED,
    SEGMENT,
    AckLedger,
    ChunkLog,
    Record,
    read_records,
    read_segment,
    segment_first_key,
    segment_name,
    segment_numbers,
)
from apexrl.replay.snapshot import (
    SNAPSHOT_FILE,
    Snapshot,
    SnapshotError,
    SnapshotWriter,
    WriteResult,
    load_snapshot_file,
)
from apexrl.replay.state import Refill, log_segment_of
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
    def export_snapshot(self, log_segment: int = 0, items_in_log: bool = False) -> Snapshot: ...
    def load_snapshot(self, snapshot: Snapshot, refill: Refill | None = None) -> None: ...
    def check_logged_chunk(self, chunk: TrajectoryChunk) -> None: ...
    def recover_chunk(self, chunk: TrajectoryChunk) -> int: ...
    def recover_sampled(self, limiter_count: int, table_count: int) -> None: ...
    def recover_delivery(self, num_items: int) -> None: ...


log = logging.getLogger("apexrl.replay_server")  # the replay server's log lines


def restore_snapshot(service: ReplayService, directory: Path) -> Snapshot | None:
    """Load ``directory``'s snapshot into a fresh ``service``, if there is one, and return it. One
    that cannot be used is refused with one log line and set aside, and the service stays
    empty."""

    def load(snapshot: Snapshot) -> None:
        def refill(table: PrioritizedTable | FifoQueue, oldest: int, end: int, before: int) -> None:
            refill_from_log(service, table, range(oldest, end), before)

        service.load_snapshot(snapshot, refill)

    snapshot = load_snapshot_file(directory, load)
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
    oldest_key: int = 0  # the key of the oldest stored item when it was begun


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
        keys_match = read_chunk_log(service, directory / LOG_DIR, first_segment)
        service.chunk_log = ChunkLog(
            directory / LOG_DIR,
            service.cfg.replay.log_fsync,
            first_segment,
            service.cfg.replay.priority_log_period_s,
            next_key=service.table.num_inserted,
        )
        if not keys_match:
            service.chunk_log.forget_keys()
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


def read_chunk_log(service: ReplayService, directory: Path, first_segment: int) -> bool:
    """Store the chunk log's chunks (and repeat its FIFO deliveries and its priority updates)
    from ``first_segment`` on, in their order; a record that does not decode or fit is refused
    with a log line. Returns whether the table's keys still match the log's (every chunk stored
    under the keys its segment says), so that its segments may hold the items of later
    snapshots."""
    chunks = items = deliveries = updates = refused = 0
    keys_match = True
    for record in read_records(directory, first_segment):
        try:
            if record.kind == SEGMENT:
                keys_match &= record.first_key == service.table.num_inserted
            elif record.kind == CHUNK:
                stored = recover_record(service, record)
                keys_match &= stored > 0
                items += stored
                chunks += 1
            elif record.kind == DELIVERY:
                service.recover_delivery(record.num_delivered)
                deliveries += 1
            elif record.kind == SAMPLED:
                service.recover_sampled(*record.sampled)
            else:
                service.table.update_priorities(*record.priorities)
                updates += 1
        except ValueError as exc:  # DecodeError included
            refused += 1
            keys_match = False
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
    return keys_match


def refill_from_log(
    service: ReplayService,
    table: PrioritizedTable | FifoQueue,
    keys: range,
    before_segment: int,
) -> None:
    """Put the stored items ``keys`` of a snapshot that left them in the chunk log back into the
    empty ``table``, from the log's segments before ``before_segment`` (the snapshot's own), under
    the keys they had; their priorities or delivery counts are the snapshot's to set. Raises
    ``SnapshotError`` when the log does not hold them all, or holds a chunk this server would not
    store."""
    table.start_keys_at(keys.start)
    if not keys:
        return
    directory = service.snapshot_dir / LOG_DIR
    numbers = [n for n in segment_numbers(directory) if n < before_segment]
    first_keys = {n: segment_first_key(directory / segment_name(n)) for n in numbers}
    starts = [n for n in numbers if first_keys[n] is not None and first_keys[n] <= keys.start]
    if not starts:
        raise SnapshotError(
            f"the chunk log in {directory} does not hold its items (keys {keys.start}.."
            f"{keys.stop - 1}, segments before {before_segment})"
        )
    # Each segment's record says where its chunks begin: one gone, or cut short, breaks the chain
    # (a number missing between two is a segment begun and never written).
    key = first_keys[starts[-1]]
    for number in numbers[numbers.index(starts[-1]) :]:
        for record in read_segment(directory, number):
            if record.kind == SEGMENT and record.first_key != key:
                raise SnapshotError(
                    f"{segment_name(number)} starts at key {record.first_key}, "
                    f"the chunks before end at {key}"
                )
            if record.kind == CHUNK:
                key = refill_chunk(service, table, record, key, keys.start)
    if (key, table.num_inserted, table.size) != (keys.stop, keys.stop, len(keys)):
        raise SnapshotError(
            f"the chunk log holds items up to key {key - 1} and the table {table.size}, the "
            f"snapshot has {len(keys)} up to key {keys.stop - 1}"
        )


def refill_chunk(
    service: ReplayService,
    table: PrioritizedTable | FifoQueue,
    record: Record,
    key: int,
    oldest_key: int,
) -> int:
    """Store the items of a logged chunk whose first item had ``key`` that are not older than
    ``oldest_key``; returns the key after its last item."""
    try:
        chunk = logged_chunk(record)
        num_items = int(chunk.priorities.shape[0])
        if key + num_items > oldest_key:
            service.check_logged_chunk(chunk)
            cut = max(oldest_key - key, 0)
            fields = {name: array[cut:] for name, array in chunk.fields.items()}
            frames = [chunk.frames] if table.stores_frames else None
            table.insert_many([fields], [chunk.priorities[cut:]], frames)
    except (ValueError, RuntimeError) as exc:  # DecodeError included
        raise SnapshotError(f"a chunk of the log at key {key}: {exc}") from exc
    return key + num_items


def logged_chunk(record: Record) -> TrajectoryChunk:
    """A chunk record's chunk; ``DecodeError`` unless it decodes to one."""
    chunk = decode(record.frames)
    if not isinstance(chunk, TrajectoryChunk):
        raise DecodeError(f"a {type(chunk).__name__}, not a chunk")
    return chunk


def recover_record(service: ReplayService, record: Record) -> int:
    return service.recover_chunk(logged_chunk(record))


def commit_stored(service: ReplayService, ledger: AckLedger) -> None:
    """Write the chunks stored in this pass to the chunk log (one write), then the ack ledger:
    before the pass's acks are sent. An ``OSError`` ends the server: no ack may go out for a
    chunk that is not in the log."""
    if service.chunk_log is not None:
        service.chunk_log.append_updates_if_due()
        service.chunk_log.commit()
    ledger.write(service.counts.stored, service.counts.lost)


def start_snapshot(service: ReplayService, snapshots: Snapshots) -> Snapshot:
    """The state as a snapshot, with a new chunk log segment begun: the snapshot holds the older
    ones."""
    segment, items_in_log, table = 0, False, service.table
    if service.chunk_log is not None:
        segment = service.chunk_log.rotate(table.num_inserted)
        snapshots.log_segment = segment
        snapshots.oldest_key = table.num_inserted - table.size
        items_in_log = service.chunk_log.holds_from() <= snapshots.oldest_key
    return service.export_snapshot(segment, items_in_log)


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
    """A snapshot is on disk: delete the chunk log segments before it whose items are all gone."""
    if result is None:
        return
    if service.chunk_log is not None and snapshots.log_segment is not None:
        service.chunk_log.drop_gone(snapshots.log_segment, snapshots.oldest_key)
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

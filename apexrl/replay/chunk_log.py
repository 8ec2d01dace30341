"""Replay's chunk log: the chunks it stored since its last snapshot, on disk before it acknowledges
them, so that a replay server that is killed comes back (snapshot + the log's records after it)
with every chunk it acknowledged (``replay.durable``).

The log is a directory of segment files, ``<run dir>/replay_snapshot/chunk_log/segment-<n>.log``,
each a run of records::

    magic b"ACLG" | kind u32 | number of frames u32 | payload bytes u64 | crc32 u32 |
    payload: the frames' lengths (u64 each), then the frames

(little-endian; the CRC covers the first four fields and the payload). A chunk's record holds
its frames as they came off the wire (identity excluded: header and LZ4-compressed arrays, never
encoded again) and is read back with the codec's ``decode``; nothing is pickled. A FIFO queue's
delivery of ``N`` items is a record too (one frame, ``N`` as int64), so its items leave again at
the same point when the log is read back; so are the learners' priority updates (two frames: the
keys, int64, and their priorities, float64), so that a prioritized table comes back with the
priorities the learners gave it, not those of the inserts; and each segment's first record (one
int64 frame: the key of its first item).

- **Group commit.** ``append_*`` collect the records of one pass of the server loop; ``commit``
  writes them with one ``writev`` (into the kernel's page cache: safe against a killed process)
  and, with ``replay.log_fsync``, ``fdatasync``\\s them (safe against a machine crash); only then
  does the server send the pass's acks.
- **Segments and compaction.** Each segment begins with a record of the table key its first
  stored item got (the chunks after it follow in key order), so the log knows which items it
  holds (``holds_from``). When a snapshot starts, ``rotate`` begins a new segment; the snapshot
  leaves the items out when the log holds them all, and once it is on disk ``drop_gone`` deletes
  the segments before it whose items have all left the table. So the log holds about the table's
  capacity of chunks, plus one snapshot interval, and is never rewritten.
- **Priorities.** ``note_priorities`` keeps the updates of a table since the last write, the last
  per key (``PendingPriorities``), and ``append_updates_if_due`` writes them as one record
  every ``replay.priority_log_period_s`` or once ``PRIORITY_LOG_MAX_KEYS`` keys wait; a kill
  loses at most that period's updates (the items keep their earlier priorities). With them goes
  a record of the items sampled so far (the rate limiter's count and the table's), so that a
  restarted server's rate limiter does not hold the actors back for samples the learners took
  since the snapshot.
- **Reading back.** ``read_records`` yields the records of the segments from a number on. A record
  cut short at a segment's end (the server was killed mid-write; its chunk was never
  acknowledged) is ignored with a log line; a corrupt one (bad magic, sizes or CRC) ends the
  reading of its segment, which is set aside (renamed ``refused-...``) with one log line, as a
  corrupt snapshot is.

``AckLedger`` is a small file beside the snapshot with the number of items replay acknowledged as
stored (and lost before): after a restart, what is missing of them is counted as lost.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from apexrl.replay.snapshot import set_aside

log = logging.getLogger(__name__)

LOG_DIR = "chunk_log"  # under the snapshot directory
LEDGER_FILE = "acked_items"
MAGIC = b"ACLG"
CHUNK, DELIVERY, PRIORITIES, SEGMENT, SAMPLED = 1, 2, 3, 4, 5  # record kinds
KINDS = (CHUNK, DELIVERY, PRIORITIES, SEGMENT, SAMPLED)
PRIORITY_LOG_MAX_KEYS = 1 << 18  # keys waiting that make a priority record due at once
_HEAD = struct.Struct("<4sIIQ")  # magic, kind, number of frames, payload bytes
_CRC = struct.Struct("<I")
_LENGTH = struct.Struct("<Q")
_DELIVERY = struct.Struct("<q")
_SEGMENT_KEY = struct.Struct("<q")  # a segment record: the key of its first chunk's first item
_SAMPLED = struct.Struct("<qq")  # a sampled record: the rate limiter's and the table's counts
MAX_FRAMES = 4096  # frames in one record
MAX_RECORD_BYTES = 2**31  # payload bytes of one record (the codec bounds a message at 512 MiB)
_SEGMENT = re.compile(r"segment-(\d{12})\.log")
_IOV_MAX = 512  # buffers per writev call

Buffer = bytes | bytearray | memoryview


class LogCorrupt(ValueError):
    """A record of the chunk log that is whole but cannot be right."""


@dataclass(frozen=True)
class Record:
    """One record read back: its kind (``CHUNK``, ``DELIVERY`` or ``PRIORITIES``) and frames."""

    kind: int
    frames: list[memoryview]

    @property
    def num_delivered(self) -> int:
        """A delivery record's number of items."""
        return _DELIVERY.unpack(self.frames[0])[0]

    @property
    def first_key(self) -> int:
        """A segment record's key: the table key of the segment's first stored item."""
        return _SEGMENT_KEY.unpack(self.frames[0])[0]

    @property
    def sampled(self) -> tuple[int, int]:
        """A sampled record's items sampled so far: the rate limiter's count and the table's."""
        return _SAMPLED.unpack(self.frames[0])

    @property
    def priorities(self) -> tuple[np.ndarray, np.ndarray]:
        """A priority record's keys (int64) and priorities (float64), copies."""
        return (
            np.frombuffer(self.frames[0], dtype="<i8").astype(np.int64),
            np.frombuffer(self.frames[1], dtype="<f8").astype(np.float64),
        )


def segment_name(number: int) -> str:
    return f"segment-{number:012d}.log"


def segment_numbers(directory: Path) -> list[int]:
    """The numbers of the segments in ``directory``, ascending."""
    if not directory.is_dir():
        return []
    found = (_SEGMENT.fullmatch(path.name) for path in directory.iterdir())
    return sorted(int(match.group(1)) for match in found if match)


def encode_record(kind: int, frames: Sequence[Buffer]) -> list[Buffer]:
    """The buffers of one record (head, CRC, lengths, then ``frames`` themselves: no copy)."""
    views = [memoryview(frame).cast("B") for frame in frames]
    lengths = b"".join(_LENGTH.pack(view.nbytes) for view in views)
    payload_bytes = len(lengths) + sum(view.nbytes for view in views)
    head = _HEAD.pack(MAGIC, kind, len(views), payload_bytes)
    crc = zlib.crc32(lengths, zlib.crc32(head))
    for view in views:
        crc = zlib.crc32(view, crc)
    return [head, _CRC.pack(crc), lengths, *views]


def delivery_frames(num_items: int) -> list[bytes]:
    return [_DELIVERY.pack(num_items)]


def parse_records(data: memoryview, name: str) -> Iterator[Record]:
    """The records of one segment's bytes. Stops quietly (one log line) at a record cut short at
    the end; raises ``LogCorrupt`` at a corrupt one."""
    offset, end = 0, len(data)
    prefix = _HEAD.size + _CRC.size
    while offset < end:
        if end - offset < prefix:
            log.warning("%s: the last record is cut short (a write interrupted); ignored", name)
            return
        magic, kind, num_frames, payload_bytes = _HEAD.unpack_from(data, offset)
        if magic != MAGIC or kind not in KINDS:
            raise LogCorrupt(f"no record at byte {offset}")
        if num_frames > MAX_FRAMES or payload_bytes > MAX_RECORD_BYTES:
            raise LogCorrupt(f"a record of {num_frames} frames, {payload_bytes} bytes at {offset}")
        if payload_bytes < num_frames * _LENGTH.size:
            raise LogCorrupt(f"a record's payload is shorter than its lengths at byte {offset}")
        start = offset + prefix
        if end - start < payload_bytes:
            log.warning("%s: the last record is cut short (a write interrupted); ignored", name)
            return
        (crc,) = _CRC.unpack_from(data, offset + _HEAD.size)
        payload = data[start : start + payload_bytes]
        if zlib.crc32(payload, zlib.crc32(data[offset : offset + _HEAD.size])) != crc:
            raise LogCorrupt(f"the record at byte {offset} fails its CRC")
        frames, at = [], num_frames * _LENGTH.size
        for i in range(num_frames):
            (length,) = _LENGTH.unpack_from(payload, i * _LENGTH.size)
            frames.append(payload[at : at + length])
            at += length
        if at != payload_bytes:
            raise LogCorrupt(f"the record at byte {offset} holds {payload_bytes - at} extra bytes")
        if kind == DELIVERY and (num_frames != 1 or len(frames[0]) != _DELIVERY.size):
            raise LogCorrupt(f"the delivery record at byte {offset} is malformed")
        if kind == SEGMENT and (
            num_frames != 1
            or len(frames[0]) != _SEGMENT_KEY.size
            or _SEGMENT_KEY.unpack(frames[0])[0] < 0
        ):
            raise LogCorrupt(f"the segment record at byte {offset} is malformed")
        if kind == SAMPLED and (
            num_frames != 1
            or len(frames[0]) != _SAMPLED.size
            or min(_SAMPLED.unpack(frames[0])) < 0
        ):
            raise LogCorrupt(f"the sampled record at byte {offset} is malformed")
        if kind == PRIORITIES and (
            num_frames != 2 or len(frames[0]) != len(frames[1]) or len(frames[0]) % 8
        ):
            raise LogCorrupt(f"the priority record at byte {offset} is malformed")
        yield Record(kind, frames)
        offset = start + payload_bytes


def read_records(directory: Path, first_segment: int) -> Iterator[Record]:
    """Every record of the segments numbered ``first_segment`` and later, in order. A segment with
    a corrupt record is read up to it, then set aside with one log line; reading goes on with the
    next segment."""
    for number in segment_numbers(directory):
        if number >= first_segment:
            yield from read_segment(directory, number)


def read_segment(directory: Path, number: int) -> Iterator[Record]:
    """The records of one segment; one with a corrupt record is read up to it, then set aside
    with one log line."""
    path = directory / segment_name(number)
    data = memoryview(path.read_bytes())
    try:
        yield from parse_records(data, path.name)
    except LogCorrupt as exc:
        kept = set_aside(path)
        log.error("refused the rest of the chunk log segment %s: %s (%s)", path, exc, kept)


def segment_first_key(path: Path) -> int | None:
    """The key a segment's first item was stored under, from its segment record (the first
    record of every segment written since segments carry one); None without a whole one."""
    size = _HEAD.size + _CRC.size + _LENGTH.size + _SEGMENT_KEY.size
    try:
        with open(path, "rb") as file:
            data = memoryview(file.read(size))
    except OSError:
        return None
    if len(data) < size or _HEAD.unpack_from(data)[:2] != (MAGIC, SEGMENT):
        return None
    try:
        record = next(parse_records(data, path.name), None)
    except LogCorrupt:
        return None
    return None if record is None else record.first_key


def _write_all(fd: int, buffers: list[Buffer]) -> int:
    """``writev`` every buffer, resuming after partial writes; returns the bytes written."""
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    total = 0
    while views:
        written = os.writev(fd, views[:_IOV_MAX])
        total += written
        while views and written >= views[0].nbytes:
            written -= views[0].nbytes
            views.pop(0)
        if written:
            views[0] = views[0][written:]
    return total


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PendingPriorities:
    """A table's priority updates since the last write: the last priority of each key."""

    def __init__(self) -> None:
        self.keys: list[np.ndarray] = []
        self.priorities: list[np.ndarray] = []
        self.num_keys = 0

    def add(self, keys: np.ndarray, priorities: np.ndarray) -> None:
        self.keys.append(np.asarray(keys, dtype=np.int64))
        self.priorities.append(np.asarray(priorities, dtype=np.float64))
        self.num_keys += len(keys)

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        """The keys (each once, its last priority) and priorities; empties the buffer."""
        keys, priorities = np.concatenate(self.keys), np.concatenate(self.priorities)
        self.keys, self.priorities, self.num_keys = [], [], 0
        unique, last_from_end = np.unique(keys[::-1], return_index=True)
        return unique, priorities[::-1][last_from_end]


class ChunkLog:
    """The segment being written: records collected by ``append_*`` and written by ``commit``.

    ``first_segment``: the first segment the loaded snapshot does not hold (0 without one); the
    log writes to a new segment after every one there is, so a segment read back is never
    appended to. ``next_key``: the table key the next stored item gets, the first key of that
    segment (its segment record says so). ``first_keys`` holds the first key of each segment on
    disk that has one, so that the log knows which stored items it holds (``holds_from``) and
    which segments hold only items that are gone (``drop_gone``)."""

    def __init__(
        self,
        directory: Path,
        fsync: bool,
        first_segment: int = 0,
        priority_period_s: float = 1.0,
        next_key: int = 0,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.priority_period_s = priority_period_s
        self.pending_priorities = PendingPriorities()
        self.pending_sampled: tuple[int, int] | None = None  # the last counts noted, unwritten
        self.updates_written_at = time.monotonic()
        self.num_priority_records = 0  # priority records written since start
        self.num_priority_keys = 0  # keys in them
        existing = segment_numbers(self.directory)
        self.segment = max(first_segment, existing[-1] + 1 if existing else 0)
        self.first_keys: dict[int, int] = {}
        for number in existing:
            key = segment_first_key(self.directory / segment_name(number))
            if key is not None:
                self.first_keys[number] = key
        self.first_keys[self.segment] = int(next_key)
        self._fd: int | None = None
        self._pending: list[Buffer] = []
        self.num_records = 0  # records written since start
        self.num_bytes = 0  # bytes written since start

    def append_chunk(self, frames: Sequence[Buffer]) -> None:
        """A stored chunk's wire frames (identity excluded), written at the next ``commit``."""
        self._pending += encode_record(CHUNK, frames)
        self.num_records += 1

    def append_delivery(self, num_items: int) -> None:
        """A FIFO delivery of ``num_items`` items, written at the next ``commit``."""
        self._pending += encode_record(DELIVERY, delivery_frames(num_items))
        self.num_records += 1

    def note_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> None:
        """A priority update the table has applied, to be written by
        ``append_updates_if_due``."""
        self.pending_priorities.add(keys, priorities)

    def note_sampled(self, limiter_count: int, table_count: int) -> None:
        """The items a prioritized table has delivered so far (the rate limiter's count and the
        table's), to be written by ``append_updates_if_due``."""
        self.pending_sampled = (int(limiter_count), int(table_count))

    def append_updates_if_due(self, now: float | None = None, force: bool = False) -> None:
        """Append the waiting priority updates as one record, and the last sample counts as
        another, when ``priority_period_s`` has passed since the last (or
        ``PRIORITY_LOG_MAX_KEYS`` keys wait, or ``force``)."""
        pending = self.pending_priorities
        if pending.num_keys == 0 and self.pending_sampled is None:
            return
        now = time.monotonic() if now is None else now
        due = now - self.updates_written_at >= self.priority_period_s
        if not (force or due or pending.num_keys >= PRIORITY_LOG_MAX_KEYS):
            return
        if pending.num_keys:
            keys, priorities = pending.take()
            frames = [keys.astype("<i8").tobytes(), priorities.astype("<f8").tobytes()]
            self._pending += encode_record(PRIORITIES, frames)
            self.num_records += 1
            self.num_priority_records += 1
            self.num_priority_keys += len(keys)
        if self.pending_sampled is not None:
            self._pending += encode_record(SAMPLED, [_SAMPLED.pack(*self.pending_sampled)])
            self.num_records += 1
            self.pending_sampled = None
        self.updates_written_at = now

    def commit(self) -> int:
        """Write what was appended (and with ``fsync`` flush it to the disk); returns the bytes.
        Raises ``OSError`` when the disk refuses: no ack may then go out."""
        if not self._pending:
            return 0
        pending, self._pending = self._pending, []
        if self._fd is None:
            path = self.directory / segment_name(self.segment)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            if self.fsync:
                _sync_directory(self.directory)  # the new file's name survives a crash too
            start = [_SEGMENT_KEY.pack(self.first_keys[self.segment])]
            pending = encode_record(SEGMENT, start) + pending
        num_bytes = _write_all(self._fd, pending)
        if self.fsync:
            os.fdatasync(self._fd)
        self.num_bytes += num_bytes
        return num_bytes

    def rotate(self, next_key: int) -> int:
        """Begin a new segment (at a snapshot's start: the snapshot holds everything before),
        whose first item will have the table key ``next_key``; returns its number, the first
        segment a snapshot taken now does not hold."""
        self.append_updates_if_due(force=True)
        self.commit()
        self.close()
        self.segment += 1
        self.first_keys[self.segment] = int(next_key)
        return self.segment

    def holds_from(self) -> int:
        """The key from which on every stored item's chunk is in the log: the first key of the
        oldest segment with a segment record. (Segments go from the oldest on only; a number
        missing between two is a segment begun and never written, which held nothing; a log
        whose segments do not match the table's keys has forgotten them, ``forget_keys``.)"""
        return min(self.first_keys.values())

    def forget_keys(self) -> None:
        """The segments on disk no longer match the table's keys (a record read back was
        refused, or a segment's key was not the table's): none of them may serve a snapshot
        that leaves its items in the log."""
        self.first_keys = {self.segment: self.first_keys[self.segment]}

    def drop_gone(self, before_segment: int, oldest_key: int) -> int:
        """Delete the segments numbered below ``before_segment`` (a snapshot on disk holds what
        they did, up to their items) whose every item has left the table, the oldest stored item
        then having key ``oldest_key``; segments without a known first key go as well. Returns
        how many."""
        dropped = 0
        for number in segment_numbers(self.directory):
            if number >= min(before_segment, self.segment):
                break
            # where its items end: the next segment's first key (numbers missing between are
            # segments begun and never written)
            later = [key for n, key in self.first_keys.items() if n > number]
            if number in self.first_keys and later and min(later) > oldest_key:
                break  # it holds stored items, and so do all after it
            (self.directory / segment_name(number)).unlink(missing_ok=True)
            self.first_keys.pop(number, None)
            dropped += 1
        return dropped

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_LEDGER = struct.Struct("<4sQQI")  # magic, items acknowledged as stored, items lost, crc32
_LEDGER_MAGIC = b"ACKS"


class AckLedger:
    """``<snapshot dir>/acked_items``: the items replay has acknowledged as stored and those it
    has counted as lost, rewritten in place at each commit that changed them. A restarted server
    compares it with what its snapshot and log brought back."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / LEDGER_FILE
        self._fd: int | None = None
        self._written: tuple[int, int] | None = None

    def read(self) -> tuple[int, int] | None:
        """(stored, lost) as last written; None without a readable ledger."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        if len(data) != _LEDGER.size:
            log.warning("%s holds %d bytes, not a ledger; ignored", self.path, len(data))
            return None
        magic, stored, lost, crc = _LEDGER.unpack(data)
        if magic != _LEDGER_MAGIC or zlib.crc32(data[: -_CRC.size]) != crc:
            log.warning("%s fails its check; ignored", self.path)
            return None
        return stored, lost

    def write(self, stored: int, lost: int) -> None:
        if self._written == (stored, lost):
            return
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        body = _LEDGER.pack(_LEDGER_MAGIC, stored, lost, 0)[: -_CRC.size]
        os.pwrite(self._fd, body + _CRC.pack(zlib.crc32(body)), 0)
        self._written = (stored, lost)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

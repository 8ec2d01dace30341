"""Replay snapshots on disk: the replay server's table and run counters, so that a replay server
that is stopped or killed and started again on the same run directory goes on where it was.

A snapshot is one uncompressed ``.npz`` file, ``<run dir>/replay_snapshot/snapshot.npz``: the
table's arrays (stored items oldest first, their priorities or delivery counts) plus one array
``meta``, the UTF-8 bytes of a JSON object with every scalar (layout, keys, counters, return
windows). ``snapshot_contents.py`` decides what goes in; this module only writes and reads such
files:

- ``write_snapshot`` writes to a temporary name in the same directory, fsyncs it and renames it
  over the previous snapshot (``os.replace``), so a crash mid-write leaves the previous one whole;
- ``read_snapshot`` reads with ``np.load(..., allow_pickle=False)`` and raises ``SnapshotError``
  for anything that is not a readable snapshot of this format (no pickle anywhere);
- ``SnapshotWriter`` writes in a background thread, so that the server loop pauses only for the
  in-memory copy of the table;
- ``load_snapshot_file`` hands the snapshot of a directory to a loader at start, and sets aside
  (renames) one that cannot be read or that the loader refuses, so the next snapshot does not
  overwrite it.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from apexrl.runtime import rundir

log = logging.getLogger(__name__)

SNAPSHOT_DIR = rundir.REPLAY_SNAPSHOT  # under the run directory (rundir.replay_snapshot_dir)
SNAPSHOT_FILE = "snapshot.npz"
FORMAT_VERSION = 1
_TEMP_PREFIX = ".snapshot-"  # what a write in progress (or one cut short by a crash) is named
_TEMP_SUFFIX = ".npz.tmp"
MAX_META_BYTES = 1 << 24  # the JSON of one snapshot's scalars (return windows included)


class SnapshotError(ValueError):
    """A snapshot that cannot be used: unreadable, corrupt, or of another layout."""


@dataclass(frozen=True)
class Snapshot:
    """The arrays and scalars of one snapshot (``meta`` is the decoded JSON object)."""

    arrays: dict[str, np.ndarray]
    meta: dict


@dataclass(frozen=True)
class WriteResult:
    """A finished write: items stored, file bytes, seconds of the copy (in the server loop) and of
    the whole snapshot (copy and write)."""

    num_items: int
    num_bytes: int
    copy_s: float
    total_s: float


def write_snapshot(directory: Path, snapshot: Snapshot) -> int:
    """Write ``snapshot`` to ``directory/snapshot.npz`` atomically; returns the file's bytes.

    The file appears whole or not at all: it is written under a temporary name in the same
    directory, flushed to disk, then renamed over the previous snapshot, and the directory is
    synced so the rename survives a power cut. A failed write removes its temporary file and
    leaves the previous snapshot as it was.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if "meta" in snapshot.arrays:
        raise ValueError("'meta' is reserved for the scalars")
    meta = np.frombuffer(json.dumps(snapshot.meta, allow_nan=False).encode(), dtype=np.uint8)
    fd, temp_name = tempfile.mkstemp(prefix=_TEMP_PREFIX, suffix=_TEMP_SUFFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as file:
            np.savez(file, meta=meta, **snapshot.arrays)
            file.flush()
            os.fsync(file.fileno())
            num_bytes = file.tell()
        os.replace(temp_name, directory / SNAPSHOT_FILE)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return num_bytes


def read_snapshot(path: Path) -> Snapshot:
    """Read a snapshot written by ``write_snapshot``; raises ``SnapshotError`` if it is
    unreadable, truncated, fails its CRC checks or is not of this format.

    Only the file format is checked here; whether it fits a table is the loader's question.
    """
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise SnapshotError("not an .npz archive")
        with loaded:
            arrays = {name: loaded[name] for name in loaded.files}  # reading checks each CRC
    except SnapshotError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise SnapshotError(f"unreadable ({type(exc).__name__}: {exc})") from exc
    meta_bytes = arrays.pop("meta", None)
    if meta_bytes is None or meta_bytes.dtype != np.uint8 or meta_bytes.ndim != 1:
        raise SnapshotError("no 'meta' array of uint8")
    if meta_bytes.size > MAX_META_BYTES:
        raise SnapshotError(f"'meta' holds {meta_bytes.size} bytes, more than {MAX_META_BYTES}")
    try:
        meta = json.loads(meta_bytes.tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SnapshotError(f"'meta' is not JSON ({exc})") from exc
    if not isinstance(meta, dict):
        raise SnapshotError("'meta' is not a JSON object")
    if meta.get("format_version") != FORMAT_VERSION:
        raise SnapshotError(
            f"format version {meta.get('format_version')!r}, this server reads {FORMAT_VERSION}"
        )
    for name, array in arrays.items():
        if array.dtype.kind not in "biuf":
            raise SnapshotError(f"array {name!r} has dtype {array.dtype}, not a number type")
    return Snapshot(arrays, meta)


def remove_partial_writes(directory: Path) -> int:
    """Delete temporary files that a write cut short (a killed process) left behind; returns how
    many. Safe only while no write is in progress in ``directory``."""
    directory = Path(directory)
    if not directory.is_dir():
        return 0
    removed = 0
    for path in directory.glob(f"{_TEMP_PREFIX}*{_TEMP_SUFFIX}"):
        path.unlink(missing_ok=True)
        removed += 1
    return removed


def load_snapshot_file(directory: Path, load: Callable[[Snapshot], None]) -> Snapshot | None:
    """Hand ``directory``'s snapshot to ``load``, if there is one, and return it. One that cannot
    be read, or that ``load`` refuses with ``SnapshotError``, is refused with one log line and
    renamed aside (so the next snapshot does not overwrite it): None. Unfinished writes that a
    killed server left behind are removed first."""
    removed = remove_partial_writes(directory)
    if removed:
        log.warning("removed %d unfinished snapshot write(s) in %s", removed, directory)
    path = directory / SNAPSHOT_FILE
    if not path.is_file():
        return None
    try:
        snapshot = read_snapshot(path)
        load(snapshot)
    except SnapshotError as exc:
        kept = set_aside(path)
        log.error("refused the replay snapshot %s: %s; starting empty (%s)", path, exc, kept)
        return None
    return snapshot


def set_aside(path: Path) -> str:
    """Rename a refused file to ``refused-<time>-<name>`` beside it, so it is neither read again
    nor lost; says where it went, or why it could not be moved."""
    aside = path.with_name(f"refused-{time.strftime('%Y%m%d-%H%M%S')}-{path.name}")
    try:
        os.replace(path, aside)
        return f"kept as {aside}"
    except OSError as exc:
        return f"could not set it aside: {exc}"


class SnapshotWriter:
    """Writes snapshots in a background thread, one at a time, and remembers what is on disk.

    ``start`` hands over a snapshot the server has already copied out of its table; the thread
    only writes it. ``poll`` returns each finished write once (or logs its failure), ``join``
    waits for the write in progress, and ``write_now`` writes in the caller's thread. Each write
    comes with the server's ``progress`` (any value that changes with the state);
    ``written_progress`` is that of the last snapshot written whole (or loaded at start), so the
    server can skip a snapshot that would repeat it.
    """

    def __init__(self, directory: Path, progress: object = None) -> None:
        self.directory = Path(directory)
        self.written_progress = progress
        self._thread: threading.Thread | None = None
        self._pending_progress: object = None
        self._result: WriteResult | BaseException | None = None

    @property
    def idle(self) -> bool:
        """No write in progress, and the last one's result taken by ``poll``: ``start`` may run."""
        return self._thread is None

    def start(self, snapshot: Snapshot, progress: object, num_items: int, copy_s: float) -> None:
        if self._thread is not None:
            raise RuntimeError("a snapshot is still being written (or not yet polled)")
        started = time.monotonic() - copy_s
        self._pending_progress = progress

        def run() -> None:
            try:
                num_bytes = write_snapshot(self.directory, snapshot)
                self._result = WriteResult(num_items, num_bytes, copy_s, time.monotonic() - started)
            except BaseException as exc:  # reported by poll() in the server's thread
                self._result = exc

        self._thread = threading.Thread(target=run, name="replay-snapshot", daemon=True)
        self._thread.start()

    def poll(self) -> WriteResult | None:
        """The write that finished since the last call, if any (a failed one is logged)."""
        if self._thread is None or self._thread.is_alive():
            return None
        self._thread.join()
        self._thread = None
        result, self._result = self._result, None
        if isinstance(result, BaseException):
            log.error("writing the replay snapshot to %s failed: %s", self.directory, result)
            return None
        self.written_progress = self._pending_progress
        return result

    def join(self) -> WriteResult | None:
        """Wait for the write in progress; its result as ``poll`` gives it."""
        if self._thread is not None:
            self._thread.join()
        return self.poll()

    def write_now(self, snapshot: Snapshot, progress: object, num_items: int) -> WriteResult:
        """Write in this thread (after ``join``); raises ``OSError`` when the write fails."""
        if self._thread is not None:
            raise RuntimeError("a snapshot is still being written (join it first)")
        started = time.monotonic()
        num_bytes = write_snapshot(self.directory, snapshot)
        took_s = time.monotonic() - started
        self.written_progress = progress
        return WriteResult(num_items, num_bytes, 0.0, took_s)

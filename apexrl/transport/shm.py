"""Weights in shared memory: one copy of each version for all actors on the parameter server's host.

The parameter server writes the encoded ``Params`` of each accepted version (the same frames it
sends over TCP) once into a file of the host's shared-memory directory (``/dev/shm``). An actor
on the same host that asks for it gets a small ``Params`` naming the file instead of the weights,
maps the file read-only (``map_frames``) and decodes those frames exactly as it decodes a socket
payload (``codec.decode``); its weights are then copied once, from the server's pages into the
actor's tensors. 32 local actors cost one 6.4 MiB write instead of 32 TCP copies, and each actor
one copy instead of a read into a buffer plus a copy.

A file is never written again once it has its name: each version gets a new file, and a
superseded one is only unlinked, so a mapping of it stays valid and unchanged until it is closed.

File layout (little-endian), written under a temporary name and renamed into place, so a reader
sees a whole file or none::

    offset 0   HEADER    magic b"APXPARAM", format u32, num_frames u32, version i64,
                         nbytes u64 (the whole file), token 16 bytes (random per write)
    offset 48  num_frames x u64: the length of each frame
    then       the frames, each starting at a multiple of ALIGN bytes (zero padding between)

Trust: a reader checks the name (``NAME_PATTERN``, no directory part), opens it only inside its
own shared-memory directory without following links, checks that the file is a regular file of
its own user with the expected size, and that the header holds the version, size and token of
the reply; any mismatch raises ``ShmError`` and the actor asks for the weights over TCP. The
frames themselves are then validated by ``codec.decode`` like any frames from a socket. (Only a
process of the actor's own user, which could as well write into the actor's memory, can shrink
the file while it is mapped; the actor would then die of SIGBUS instead of falling back.)

Files of a server are named after its incarnation (a random 64-bit id) and removed when it stops.
A server that was killed leaves them behind, so each server removes at start the files of any
incarnation whose lock file (held with ``flock`` for a server's whole life) is no longer locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import mmap
import os
import re
import secrets
import socket
import stat
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from apexrl.transport.codec import Limits

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")  # the host's shared-memory file system (tmpfs)
PREFIX = "apexrl-params-"
NAME_PATTERN = re.compile(r"apexrl-params-[0-9a-f]{16}-[0-9]{1,19}\.bin")
LOCK_PATTERN = re.compile(r"apexrl-params-([0-9a-f]{16})\.lock")
MAGIC = b"APXPARAM"
FORMAT = 1
HEADER = struct.Struct("<8sIIqQ16s")
TOKEN_BYTES = 16
ALIGN = 64  # bytes: frames start aligned, so arrays decoded from them are aligned
KEEP_FILES = 2  # versions kept: an actor told the previous name a moment ago still finds it
# Page-table entries made at mmap time, in one go, instead of one page fault per 4 KiB page.
MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


class ShmError(Exception):
    """A shared-memory weights file that is missing, foreign or not the one a reply names."""


class ShmRef(NamedTuple):
    """Where one version's frames are: what a ``Params`` reply tells a local actor."""

    name: str  # file name inside the shared-memory directory
    nbytes: int  # size of the whole file
    token: str  # hex of the per-write random token in its header


def host_identity(shm_dir: Path = SHM_DIR) -> str:
    """Who shares ``shm_dir`` with whom: a digest of the boot id, host name, user and the
    directory's device and inode (two containers on one kernel have the same boot id but their own
    ``/dev/shm``). Empty when ``shm_dir`` cannot be used (missing, not a directory, no boot id)."""
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        info = os.stat(shm_dir)
    except OSError:
        return ""
    if not boot_id or not stat.S_ISDIR(info.st_mode) or not os.access(shm_dir, os.W_OK | os.X_OK):
        return ""
    identity = f"{boot_id}/{socket.gethostname()}/{os.getuid()}/{info.st_dev}:{info.st_ino}"
    return hashlib.sha256(identity.encode()).hexdigest()


def file_layout(lengths: Sequence[int]) -> tuple[list[int], int]:
    """The offset of each frame and the file's total size, for frames of ``lengths`` bytes."""
    offset = HEADER.size + 8 * len(lengths)
    offsets = []
    for length in lengths:
        offset = -(-offset // ALIGN) * ALIGN
        offsets.append(offset)
        offset += length
    return offsets, offset


class ShmWriter:
    """The parameter server's side: writes each version once, keeps the latest ``KEEP_FILES``,
    and removes every file of this incarnation on ``close``."""

    def __init__(self, shm_dir: Path, host: str) -> None:
        self.shm_dir, self.host = shm_dir, host
        self.incarnation = secrets.token_hex(8)
        self.num_writes = 0
        self.written: list[Path] = []
        self.lock_path = shm_dir / f"{PREFIX}{self.incarnation}.lock"
        # Locked before it gets its name, so a lock file that others can see is always held.
        unnamed = shm_dir / f"{PREFIX}{self.incarnation}.lock.tmp"
        self.lock_fd = os.open(unnamed, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.replace(unnamed, self.lock_path)
        except OSError:
            os.close(self.lock_fd)
            with contextlib.suppress(OSError):
                os.unlink(unnamed)
            raise

    def write(self, version: int, frames: Sequence[bytes]) -> ShmRef:
        """Write ``frames`` (an encoded ``Params``) as a new file; raises ``OSError`` when the
        directory is full or gone (the caller serves that version over TCP only)."""
        lengths = [len(frame) for frame in frames]
        offsets, nbytes = file_layout(lengths)
        token = secrets.token_bytes(TOKEN_BYTES)
        head = HEADER.pack(MAGIC, FORMAT, len(frames), version, nbytes, token)
        head += struct.pack(f"<{len(lengths)}Q", *lengths)
        name = f"{PREFIX}{self.incarnation}-{self.num_writes}.bin"
        self.num_writes += 1
        path, tmp = self.shm_dir / name, self.shm_dir / (name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb", buffering=0) as file:
                file.write(head)
                for frame, offset in zip(frames, offsets, strict=True):
                    file.seek(offset)  # the gap reads as zeros
                    file.write(frame)
                file.truncate(nbytes)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self.written.append(path)
        while len(self.written) > KEEP_FILES:
            _unlink(self.written.pop(0))
        return ShmRef(name, nbytes, token.hex())

    def close(self) -> None:
        """Remove every file of this incarnation, then the lock file."""
        for path in self.written:
            _unlink(path)
        self.written = []
        remove_incarnation(self.shm_dir, self.incarnation)
        _unlink(self.lock_path)
        os.close(self.lock_fd)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def remove_incarnation(shm_dir: Path, incarnation: str) -> None:
    """Remove the weights files (and temporaries) of one server incarnation."""
    for entry in os.scandir(shm_dir):
        if entry.name.startswith(f"{PREFIX}{incarnation}-"):
            _unlink(Path(entry.path))


def remove_orphans(shm_dir: Path) -> int:
    """Remove the files of servers that died without cleaning up (their lock is free); the
    number of incarnations removed."""
    removed = 0
    for entry in os.scandir(shm_dir):
        match = LOCK_PATTERN.fullmatch(entry.name)
        if match is None:
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its server is alive
            remove_incarnation(shm_dir, match.group(1))
            _unlink(Path(entry.path))
            removed += 1
        finally:
            os.close(fd)
    return removed


def open_writer(shm_dir: Path = SHM_DIR) -> ShmWriter | None:
    """A writer in ``shm_dir`` after removing orphaned files, or None (logged) when the directory
    cannot be used: every actor then gets the weights over TCP."""
    host = host_identity(shm_dir)
    if not host:
        log.info("no usable shared-memory directory %s: weights go over TCP only", shm_dir)
        return None
    try:
        removed = remove_orphans(shm_dir)
        if removed:
            log.info("removed the weights files of %d stopped parameter servers", removed)
        return ShmWriter(shm_dir, host)
    except OSError as exc:
        log.warning("cannot use %s for weights (%s): weights go over TCP only", shm_dir, exc)
        return None


def max_file_bytes(limits: Limits) -> int:
    """The largest file a reader accepts: a message at the codec's limits, with its table and
    alignment padding."""
    return limits.max_message_bytes + HEADER.size + limits.max_frames * (8 + ALIGN)


def map_frames(
    shm_dir: Path, ref: ShmRef, version: int, limits: Limits
) -> tuple[mmap.mmap, list[memoryview]]:
    """The frames of ``ref``'s file, as views of a read-only shared mapping of it (returned
    first; it is unmapped when the mapping and every view of it are gone). Raises ``ShmError``
    unless the file is exactly the one the reply describes."""
    if NAME_PATTERN.fullmatch(ref.name) is None:
        raise ShmError(f"not a weights file name: {ref.name[:80]!r}")
    if not HEADER.size <= ref.nbytes <= max_file_bytes(limits):
        raise ShmError(f"file size {ref.nbytes} is out of bounds")
    try:
        fd = os.open(shm_dir / ref.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise ShmError(f"cannot open {ref.name}: {exc.strerror}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise ShmError(f"{ref.name} is not a regular file of this user")
        if info.st_size != ref.nbytes:
            raise ShmError(f"{ref.name} is {info.st_size} bytes, expected {ref.nbytes}")
        try:
            mapping = mmap.mmap(
                fd, ref.nbytes, flags=mmap.MAP_SHARED | MAP_POPULATE, prot=mmap.PROT_READ
            )
        except OSError as exc:
            raise ShmError(f"cannot map {ref.name}: {exc.strerror}") from exc
    finally:
        os.close(fd)
    return mapping, split_frames(memoryview(mapping), ref, version, limits)


def split_frames(view: memoryview, ref: ShmRef, version: int, limits: Limits) -> list[memoryview]:
    """Check a file's header against the reply and cut it into its frames."""
    magic, file_format, num_frames, file_version, nbytes, token = HEADER.unpack_from(view)
    if magic != MAGIC or file_format != FORMAT:
        raise ShmError(f"{ref.name} is not a weights file of format {FORMAT}")
    if (file_version, nbytes, token.hex()) != (version, ref.nbytes, ref.token):
        raise ShmError(f"{ref.name} holds another write (version {file_version})")
    if not 1 <= num_frames <= limits.max_frames or HEADER.size + 8 * num_frames > nbytes:
        raise ShmError(f"{ref.name} announces {num_frames} frames")
    lengths = struct.unpack_from(f"<{num_frames}Q", view, HEADER.size)
    offsets, total = file_layout(lengths)
    if total != nbytes:
        raise ShmError(f"{ref.name}: frames of {sum(lengths)} bytes do not fill {nbytes} bytes")
    return [view[o : o + n] for o, n in zip(offsets, lengths, strict=True)]

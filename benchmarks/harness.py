"""Process harness shared by the benchmarks: free loopback addresses, starting a role as its own
``python -m apexrl`` process with its output in a log file, stopping processes (SIGTERM, then
SIGKILL after a bound) so a benchmark leaves nothing behind, also when it fails, and
``renumbered`` and ``as_actor``: an encoded chunk sent again as a new chunk, or by another
actor."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import msgpack

STOP_TIMEOUT_S = 20.0  # seconds between SIGTERM and SIGKILL


def free_addr() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def start(args: list[str], log: Path) -> subprocess.Popen:
    """``python -m apexrl <args>`` with stdout and stderr to ``log``."""
    return subprocess.Popen(
        [sys.executable, "-m", "apexrl", *args], stdout=log.open("wb"), stderr=subprocess.STDOUT
    )


def stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every live process, then SIGKILL those still alive after ``STOP_TIMEOUT_S``."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def renumbered(frames: list[bytes], sequence: int) -> list[bytes]:
    """The encoded ``TrajectoryChunk`` ``frames`` with chunk number ``sequence``: replay stores
    one (actor, incarnation, sequence) once, so a benchmark that sends one chunk's frames again
    and again gives each send its own number (only the small header frame is packed again)."""
    header = msgpack.unpackb(frames[0], raw=False)
    header["scalars"]["sequence"] = sequence
    return [msgpack.packb(header, use_bin_type=True), *frames[1:]]


def as_actor(frames: list[bytes], actor_id: int) -> list[bytes]:
    """The encoded ``TrajectoryChunk`` ``frames`` as actor ``actor_id``'s: replay numbers chunks
    per actor, so clients that send the same chunks must be different actors."""
    header = msgpack.unpackb(frames[0], raw=False)
    header["scalars"]["actor_id"] = actor_id
    return [msgpack.packb(header, use_bin_type=True), *frames[1:]]

"""Process harness shared by the benchmarks: free loopback addresses, starting a role as its own
``python -m apexrl`` process with its output in a log file, and stopping processes (SIGTERM, then
SIGKILL after a bound) so a benchmark leaves nothing behind, also when it fails."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

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

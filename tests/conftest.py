"""Shared fixtures for tests that run apexrl's roles as real processes on loopback.

``procs`` starts ``python -m apexrl <role> ...`` exactly as a user would, one log file per process,
and always stops what it started (SIGTERM, then SIGKILL after a bound), also when a test fails.
``request`` talks to a server over a real ZeroMQ DEALER with a bounded wait.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
import zmq

from apexrl.transport import sockets
from apexrl.transport.messages import Message, Stats, StatsRequest

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "apex_dqn_cartpole.yaml"
STOP_TIMEOUT_S = 10.0  # seconds between SIGTERM and SIGKILL at teardown

# A run small enough for two cores: tiny batches and networks, frequent reports and publishes.
SMALL_OVERRIDES = (
    "env.num_envs=2",
    "actor.chunk_steps=8",
    "actor.params_poll_steps=20",
    "actor.report_interval_s=0.5",
    "actor.eval_num_envs=2",
    "algo.hidden_sizes=[32]",
    "replay.capacity=20000",
    "replay.min_size_to_sample=200",
    "replay.samples_per_insert=1",  # keeps actors in step with the learner: CPU to spare
    "replay.report_interval_s=0.5",
    "learner.batch_size=32",
    "learner.publish_period=5",
    "learner.prefetch_batches=2",
    "learner.report_interval_s=1",
    "run.stop_wall_s=0",
    "run.stop_eval_return=null",
)

T = TypeVar("T")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_addr() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


def set_args(overrides: tuple[str, ...] | list[str]) -> list[str]:
    """``["a=1", "b=2"]`` -> ``["--set", "a=1", "--set", "b=2"]``."""
    return [arg for override in overrides for arg in ("--set", override)]


def log_tail(path: Path, num_lines: int = 40) -> str:
    """The last lines of a log file, indented, for assertion messages."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"    <no log: {exc}>"
    return "\n".join("    " + line for line in lines[-num_lines:])


def wait_until(predicate: Callable[[], T], timeout_s: float, interval_s: float = 0.1) -> T | None:
    """Poll ``predicate`` until it returns something truthy (returned) or ``timeout_s`` passes
    (the last falsy value is returned)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval_s)


def terminate(popen: subprocess.Popen, timeout_s: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM, wait up to ``timeout_s``, then SIGKILL; returns the exit code."""
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
    return popen.returncode


def run_apexrl(
    *args: str, timeout_s: float = 120, env: dict | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess:
    """``python -m apexrl ARGS`` (in the repository unless ``cwd``), to its end, its output
    captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "apexrl", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def run_launcher(args: list[str], timeout_s: float) -> tuple[int, str]:
    """``scripts/launch_local.sh ARGS`` with this Python, to its end: (exit code, its output).
    Past ``timeout_s`` its whole process group gets SIGTERM and ``TimeoutExpired`` is raised."""
    launcher = subprocess.Popen(
        ["bash", str(REPO / "scripts" / "launch_local.sh"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    try:
        output, _ = launcher.communicate(timeout=timeout_s)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGTERM)
            launcher.wait(timeout=30)
    return launcher.returncode, output


@dataclass
class RoleProcess:
    """One started role: its process and its log file (stdout and stderr together)."""

    name: str
    popen: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def tail(self, num_lines: int = 40) -> str:
        header = f"--- {self.name} (pid {self.pid}) {self.log_path}:"
        return f"{header}\n{log_tail(self.log_path, num_lines)}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait(self, timeout_s: float) -> int | None:
        """The exit code, or None when still running after ``timeout_s``."""
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout_s: float) -> tuple[int | None, float]:
        """SIGTERM and wait up to ``timeout_s``: (exit code or None, seconds taken)."""
        started = time.monotonic()
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
        code = self.wait(timeout_s)
        return code, time.monotonic() - started


class Processes:
    """Role processes a test started; ``stop_all`` ends every one of them (and only them)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[RoleProcess] = []

    def start(self, name: str, *args: str) -> RoleProcess:
        """Start ``python -m apexrl <args>``; output goes to ``<log_dir>/<name>.log``."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(log_path, "ab") as log_file:
            popen = subprocess.Popen(
                [sys.executable, "-m", "apexrl", *args],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        proc = RoleProcess(name, popen, log_path)
        self.started.append(proc)
        return proc

    def tails(self, num_lines: int = 25) -> str:
        return "\n".join(p.tail(num_lines) for p in self.started)

    def stop_all(self) -> None:
        alive = [p for p in self.started if p.alive()]
        for p in alive:
            p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for p in alive:
            terminate(p.popen, timeout_s=max(deadline - time.monotonic(), 0.01))


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    processes = Processes(tmp_path / "logs")
    try:
        yield processes
    finally:
        processes.stop_all()


def send_frames(addr: str, frames: list[bytes], timeout_s: float = 5.0) -> Message | None:
    """Send raw ``frames`` as one multipart message from a fresh DEALER and wait for one reply
    (None after ``timeout_s``). Replies are decoded: a server must never answer garbage."""
    ctx = sockets.make_context()
    with sockets.closing(ctx):
        sock = sockets.connect(ctx, zmq.DEALER, addr)
        sock.send_multipart(frames)
        return sockets.recv(sock, timeout_ms=int(timeout_s * 1000))


def request(addr: str, msg: Message, timeout_s: float = 5.0) -> Message | None:
    """Send ``msg`` from a fresh DEALER and wait up to ``timeout_s`` for the reply."""
    ctx = sockets.make_context()
    with sockets.closing(ctx):
        sock = sockets.connect(ctx, zmq.DEALER, addr)
        sockets.send(sock, msg)
        return sockets.recv(sock, timeout_ms=int(timeout_s * 1000))


def server_stats(addr: str, timeout_s: float = 2.0) -> dict[str, float] | None:
    """The server's ``Stats`` values, or None when it does not answer in time."""
    reply = request(addr, StatsRequest(), timeout_s)
    return reply.values if isinstance(reply, Stats) else None


def wait_for_server(proc: RoleProcess, addr: str, timeout_s: float = 30.0) -> dict[str, float]:
    """Poll ``addr`` with ``StatsRequest`` until it answers; fail with the log if the process
    dies or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            pytest.fail(f"{proc.name} exited with {proc.popen.returncode}\n{proc.tail()}")
        values = server_stats(addr, timeout_s=0.5)
        if values is not None:
            return values
    pytest.fail(f"{proc.name} did not answer StatsRequest within {timeout_s} s\n{proc.tail()}")

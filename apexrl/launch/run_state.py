"""A run's state as its run directory records it, written and read in this one place.

- ``result.json`` (the learner's records, one JSON object a line): ``result_size`` and
  ``run_finished`` tell a launcher that the learner met its stop condition in this session;
  ``last_result`` is the learner's last record (``apexrl status``);
- ``roles.json`` (the launcher's roles): ``save_roles`` writes it (the local launcher and serial
  mode), ``read_roles`` reads it back (``apexrl status``) with whether the launcher that wrote it
  is still alive; ``wait_for_run_end`` waits, once the learner's last record ends the run,
  until the launcher has stopped every role (and so the learner wrote its last checkpoint).
  Serial mode also records there the loopback addresses where its in-process
  servers answer ``StatsRequest`` (``stats``);
- the roles' logs (``logs/``): ``log_tail`` is the excerpt of a log that a failure shows.

The file names come from ``apexrl.runtime.rundir``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from apexrl.runtime import lifecycle, rundir

log = logging.getLogger(__name__)

RESULT_TAIL_BYTES = 65536  # the last result.json line is in this many bytes from its end


def result_size(run_dir: Path) -> int:
    """Bytes of ``result.json`` now: a session reads only what it writes after them."""
    try:
        return rundir.result_path(run_dir).stat().st_size
    except OSError:
        return 0


def run_finished(run_dir: Path, offset: int = 0) -> bool:
    """Whether the learner's last ``result.json`` line after byte ``offset`` (the size the file
    had when this session started) says the stop condition was met. Only the file's last
    ``RESULT_TAIL_BYTES`` are read: the launchers ask five times a second, and the file grows
    with the run (about 10 MB an hour on CartPole, a line per evaluation round)."""
    try:
        with open(rundir.result_path(run_dir), "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(offset, size - RESULT_TAIL_BYTES))
            lines = f.read().decode(errors="replace").splitlines()
        return bool(lines) and json.loads(lines[-1]).get("done") is True
    except (OSError, ValueError):
        return False


def last_result(run_dir: Path) -> tuple[dict | None, float | None]:
    """The last record of ``result.json`` and the seconds since the file was written."""
    path = rundir.result_path(run_dir)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(size - RESULT_TAIL_BYTES, 0))
            lines = f.read().decode(errors="replace").splitlines()
        age = time.time() - path.stat().st_mtime
    except OSError:
        return None, None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            return record, age
    return None, age


def save_roles(run_dir: Path, states: list[dict], stats: dict[str, str] | None = None) -> None:
    """Write ``roles.json`` atomically: this process's PID, the host, the time, ``states`` (each
    role's name, PID, restarts, state and exit code) and, from serial mode, ``stats`` (role ->
    address that answers its ``StatsRequest``); a failure is only logged."""
    record = {"launcher_pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}
    if stats:
        record["stats"] = stats
    path = rundir.roles_path(run_dir)
    try:
        lifecycle.write_atomic(path, json.dumps({**record, "roles": states}, indent=1) + "\n")
    except OSError as exc:
        log.warning("could not write %s: %s", path, exc)


@dataclass(frozen=True)
class RolesRecord:
    """What ``roles.json`` says; empty when there is none."""

    roles: list[dict] = field(default_factory=list)
    launcher_alive: bool | None = None  # None: unknown (no file, or written on another host)
    stats: dict[str, str] = field(default_factory=dict)  # serial mode: role -> Stats address


def read_roles(run_dir: Path) -> RolesRecord:
    """``roles.json``'s roles, whether the launcher that wrote it is alive, and its Stats
    addresses."""
    try:
        record = json.loads(rundir.roles_path(run_dir).read_text())
    except (OSError, ValueError):
        return RolesRecord()
    if not isinstance(record, dict) or not isinstance(record.get("roles"), list):
        return RolesRecord()
    alive = None
    pid = record.get("launcher_pid")
    if record.get("host") == socket.gethostname() and isinstance(pid, int):
        alive = _process_alive(pid)
    stats = record.get("stats")
    if not isinstance(stats, dict):
        stats = {}
    return RolesRecord(record["roles"], alive, {str(k): str(v) for k, v in stats.items()})


def wait_for_run_end(run_dir: Path, timeout_s: float) -> bool:
    """When the learner's last record says the run met its stop condition and the launcher
    that wrote ``roles.json`` still runs on this host (stopping the roles), wait until it has
    gone: by then the learner's ``checkpoint.pt`` is the run's last (the judged version's weights
    when the run stopped on its evaluation condition). False when it did not go in time."""
    if not run_finished(run_dir):
        return True
    deadline = time.monotonic() + timeout_s
    while read_roles(run_dir).launcher_alive:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (an exited process that its parent has not reaped yet does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: kill's answer stands
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def log_tail(path: Path, num_lines: int = 15, missing: str = "", error_lines: int = 0) -> str:
    """The last ``num_lines`` lines of the log at ``path``, indented; with ``error_lines``, its
    ERROR and traceback lines and the three after each (a child's last lines), up to that many,
    before them. ``missing`` (``{exc}`` filled in) when the log cannot be read."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return missing.format(exc=exc)
    shown: list[int] = []
    for i, line in enumerate(lines):
        if error_lines and (" ERROR " in line or line.startswith("Traceback")):
            shown.extend(range(i, min(i + 4, len(lines))))
    last = range(max(len(lines) - num_lines, 0), len(lines))
    picked = sorted(set(shown[:error_lines]) | set(last))
    return "\n".join("    " + lines[i] for i in picked)

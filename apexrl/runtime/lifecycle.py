"""Process life cycle: a stop event set by SIGINT/SIGTERM, and device/thread set-up for a role.

Every role's ``main`` calls ``install_stop_handlers()`` first and runs ``while not stop.is_set()``
with bounded waits, so a signal ends it within one poll interval and its ``finally`` blocks run.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

from apexrl.runtime import rundir

log = logging.getLogger(__name__)


class StartupError(RuntimeError):
    """A role cannot start as configured (a missing device, an actor id outside the run)."""


STOP_POLL_S = 0.05  # wait_for_stop's longest sleep between two looks at the event
_shared_stop: threading.Event | None = None  # a serial run's stop event (``share_stop``)
_thread_stops: dict[str, threading.Event] = {}  # a serial run's own events of some roles


def share_stop(
    stop: threading.Event | None, by_thread: dict[str, threading.Event] | None = None
) -> None:
    """Serial mode: every later ``install_stop_handlers`` returns ``stop`` and installs nothing
    (roles run in threads, where Python refuses signal handlers; the serial runner installs them
    once, in the main thread), or, in a thread whose name ``by_thread`` holds, that thread's own
    event (the serial runner stops the servers after their clients). ``None`` ends that."""
    global _shared_stop, _thread_stops
    _shared_stop = stop
    _thread_stops = dict(by_thread or {}) if stop is not None else {}


def install_stop_handlers() -> threading.Event:
    """Return an event that SIGINT and SIGTERM set. A second signal of either kind raises
    ``KeyboardInterrupt`` so a role stuck outside its loop can still be interrupted. In a serial
    run, the run's shared stop event or this role's own (``share_stop``)."""
    if _shared_stop is not None:
        return _thread_stops.get(threading.current_thread().name, _shared_stop)
    stop = threading.Event()
    received: list[int] = []

    def handle(signum: int, _frame: object) -> None:
        # Count before touching the event: a second signal can arrive while the first handler
        # is inside Event.set(), which holds a lock that a nested set() would wait on forever.
        received.append(signum)
        if len(received) > 1:
            raise KeyboardInterrupt
        log.info("received %s; stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)
    return stop


def wait_for_stop(stop: threading.Event, timeout_s: float) -> bool:
    """Whether ``stop`` is set, after up to ``timeout_s``: ``stop.wait`` for the main thread,
    where the stop handlers run, without holding the event's lock meanwhile (``Event.wait``
    holds it between its looks; a handler that ran then would wait for it forever in
    ``Event.set``)."""
    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(left, STOP_POLL_S))
    return True


def request_stop(stop: threading.Event) -> None:
    """Set ``stop`` (unless a signal has set it) from the main thread, where the stop handlers
    run, without holding the event's lock there: a helper thread sets it (a handler that ran
    while this thread held the lock would wait for it forever in ``Event.set``)."""
    if not stop.is_set():
        setter = threading.Thread(target=stop.set, name="request_stop")
        setter.start()
        setter.join()


def new_incarnation() -> int:
    """A random id that tells one start of a process from the next (SEED RL's run id)."""
    return int.from_bytes(os.urandom(7), "little")


def resolve_device(name: str) -> str:
    """``"auto"`` -> ``"cuda"`` when a GPU is present, else ``"cpu"``; ``"cuda"`` without a GPU is
    an error that says so rather than a crash deep inside torch."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise StartupError(f"device {name!r} requested but CUDA is not available on this machine")
    return name


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a temporary file beside it, then a rename):
    a process reading the file meanwhile sees the old contents or the new, never a part."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def setup_logging(role: str) -> None:
    logging.basicConfig(
        level=os.environ.get("APEXRL_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s.%(msecs)03d {role} %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )


def log_to_file(path: Path) -> None:
    """Also write this process's log to ``path`` (``<run dir>/logs/<role>.log``), so a role
    started by hand logs where a launched one does. Nothing is added when stderr already goes to
    that file (the launcher and its fork server send a child's output there)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if path.exists() and os.path.samestat(os.fstat(2), path.stat()):
            return
    except OSError:
        pass
    handler = logging.FileHandler(path)
    if logging.root.handlers:
        handler.setFormatter(logging.root.handlers[0].formatter)
    logging.root.addHandler(handler)
    logging.captureWarnings(True)


SERIAL_LOG_FORMAT = "%(asctime)s.%(msecs)03d %(threadName)s[%(process)d] %(levelname)s %(message)s"


def setup_serial_logging(run_dir: Path, roles: list[str]) -> list[logging.Handler]:
    """Serial mode's logging: every line names its role (the thread it runs in) and the process,
    on the console and in ``<run dir>/logs/serial.log``; each role's own lines also go to
    ``logs/<role>.log`` as in a launched run. Returns the handlers added."""
    rundir.logs_dir(run_dir).mkdir(parents=True, exist_ok=True)
    formatter = logging.Formatter(SERIAL_LOG_FORMAT, datefmt="%H:%M:%S")
    if not logging.root.handlers:
        logging.basicConfig(level=os.environ.get("APEXRL_LOG_LEVEL", "INFO"))
    for handler in logging.root.handlers:
        handler.setFormatter(formatter)
    added: list[logging.Handler] = [logging.FileHandler(rundir.log_path(run_dir, "serial"))]
    for role in roles:
        handler = logging.FileHandler(rundir.log_path(run_dir, role))
        handler.addFilter(lambda record, role=role: record.threadName == role)
        added.append(handler)
    for handler in added:
        handler.setFormatter(formatter)
        logging.root.addHandler(handler)
    logging.captureWarnings(True)
    return added

"""Fork server: one pre-imported process that forks the run's roles for the launcher.

A role started with ``exec`` spends about 1.5 s of CPU importing torch, gymnasium and tensorboard,
and keeps its own copy of everything those imports build (about 165 MB per CartPole actor). The
launcher therefore starts this process once (``python -m
apexrl.launch.forkserver``): it imports all of
that, and then forks one child per role (servers, learners, actors) on request. A child shares the
imported pages with its siblings (they count in PSS, not in its unique memory) and starts within a
fraction of a second. The child runs exactly what ``apexrl <role> ...`` runs (``roles.main``, which
the command line calls for a role, with the same args), writes to its own log file
(``<run dir>/logs/<name>.log``) and shows that command line in ``ps``, so a forked role and one
started by hand are the same program. ``apexrl <role>`` keeps working on its own.

Launcher <-> server: JSON lines on the server's stdin and stdout.

    in:  {"op": "start", "name": "actor_3", "args": ["actor", "--id", "3", ...], "nice": 0,
          "cores": [0, 1] or null}  (its CPU affinity; null: every core)
         {"op": "signal", "pid": 1234, "signum": 15}   (ignored once that child has exited)
    out: {"event": "ready", "pid": ...}
         {"event": "started", "name": ..., "pid": ...} or {"event": "error", "name": ..., ...}
         {"event": "exited", "pid": ..., "code": ...}  (code as ``Popen.returncode``: -N = signal N)

The server is the parent of every role it forked, so it alone reaps them and only signals a PID
it has not reaped: no PID can be reused under it. EOF on stdin, SIGTERM or SIGINT make it stop its
children (SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``) and exit. It gets SIGTERM when the
launcher dies and each child gets SIGTERM when the server dies (``PR_SET_PDEATHSIG``): nothing
outlives the run.

``ForkServer`` is the launcher's side: it starts the server and hands out ``ForkedProcess``
handles that answer ``poll``/``wait``/``send_signal``/``kill`` like ``subprocess.Popen``.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import importlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

from apexrl import roles
from apexrl.launch.placement import pin
from apexrl.runtime import rundir
from apexrl.runtime.cores import lower_priority

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0  # seconds between SIGTERM and SIGKILL for the server's children
START_TIMEOUT_S = 10.0  # seconds the launcher waits for a "started" answer
# What the roles import; importing it here, once, is the whole point of the server.
PRELOAD = (
    "numpy",
    "torch",
    "zmq",
    "gymnasium",
    "yaml",
    "lz4.frame",
    "msgpack",
    "apexrl.roles",
    "apexrl.config",
    "apexrl.envs",
    "apexrl.runtime.metrics",
    "apexrl.models",
    "apexrl.actor",
    "apexrl.evaluation",
    "apexrl.learner",
    "apexrl.param_server",
    "apexrl.replay_server",
)


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``signum`` to this process when its parent dies (Linux)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signum)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def set_process_title(argv: list[str]) -> None:
    """Show ``argv`` in ``/proc/self/cmdline`` (``ps``) by writing over this process's original
    argument area, as setproctitle(3) does; cut to fit when the area is shorter."""
    try:
        stat = Path("/proc/self/stat").read_text()
        fields = stat.rsplit(")", 1)[1].split()  # fields[0] is field 3 of proc(5)
        arg_start, arg_end = int(fields[45]), int(fields[46])  # fields 48 and 49
    except (OSError, IndexError, ValueError):
        return
    size = arg_end - arg_start
    if size <= 1:
        return
    title = "\0".join(argv).encode(errors="replace")[: size - 1]
    ctypes.memmove(arg_start, title.ljust(size, b"\0"), size)


def _emit(message: dict) -> None:
    try:
        os.write(1, (json.dumps(message) + "\n").encode())
    except OSError:  # the launcher is gone; SIGTERM (PDEATHSIG) is on its way
        pass


def _preload(config_path: str) -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    # The env's own module (gymnasium imports it at the first make()).
    from apexrl.config import ConfigError, load_config
    from apexrl.envs import env_modules

    try:
        for module in env_modules(load_config(config_path, []).env):
            importlib.import_module(module)
    except (ConfigError, OSError, ImportError) as exc:
        log.warning("could not preload the env module: %s", exc)


def _thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def _run_child(
    args: list[str],
    log_path: Path,
    parent_pid: int,
    niceness: int,
    cores: tuple[int, ...] | None = None,
) -> NoReturn:
    """In a fresh fork: become ``apexrl <args>`` with its own session and log; never returns."""
    code = 1
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        # Blocked by the parent around fork(): a stop request that came meanwhile lands now.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
        os.setsid()  # a terminal's Ctrl-C reaches the launcher alone
        die_with_parent(signal.SIGTERM)
        if os.getppid() != parent_pid:  # the server died before PDEATHSIG was set
            os._exit(1)
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null_fd = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null_fd, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.close(null_fd)
        set_process_title([sys.executable, "-m", "apexrl", *args])
        lower_priority(niceness)
        pin(cores)
        logging.root.handlers.clear()  # the server's handler; the role sets up its own
        code = roles.main(args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    os._exit(code)


def _fork_child(request: dict, run_dir: Path) -> int:
    """Fork one child for a ``start`` request; returns its PID in the parent."""
    # Fork is safe here only because this process has run no torch op, made no zmq context and
    # started no thread (checked): the child inherits no lock held by a thread that is gone.
    if _thread_count() != 1:
        raise RuntimeError(f"the fork server has {_thread_count()} threads; refusing to fork")
    sys.stdout.flush()
    sys.stderr.flush()
    stop_signals = {signal.SIGINT, signal.SIGTERM}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    server_pid = os.getpid()
    try:
        pid = os.fork()
        if pid == 0:
            log_path = rundir.log_path(run_dir, request["name"])
            cores = request.get("cores")
            _run_child(
                list(request["args"]),
                log_path,
                server_pid,
                int(request.get("nice", 0)),
                None if cores is None else tuple(int(c) for c in cores),
            )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    return pid


def _reap(children: dict[int, str]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.pop(pid, None)
        _emit({"event": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status)})


def _stop_children(children: dict[int, str]) -> None:
    for pid in children:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while children and time.monotonic() < deadline:
        time.sleep(0.05)
        _reap(children)
    for pid, name in list(children.items()):
        log.warning("%s (pid %d) did not stop within %.0f s; killing it", name, pid, STOP_TIMEOUT_S)
        os.kill(pid, signal.SIGKILL)
    while children:
        time.sleep(0.01)
        _reap(children)


def serve(config_path: str, run_dir: Path) -> int:
    """The server's loop: preload, then fork on request until EOF or a stop signal."""
    stop = threading.Event()  # set from a signal handler only: no thread is started

    def handle(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)
    started = time.monotonic()
    _preload(config_path)
    gc.collect()
    gc.freeze()  # the children's collector leaves the preloaded objects (and their pages) alone
    log.info("preloaded in %.2f s; %d thread(s)", time.monotonic() - started, _thread_count())
    children: dict[int, str] = {}
    pending = b""
    _emit({"event": "ready", "pid": os.getpid()})
    try:
        while not stop.is_set():
            readable, _, _ = select.select([0], [], [], 0.1)
            _reap(children)
            if not readable:
                continue
            data = os.read(0, 65536)
            if not data:  # the launcher closed our stdin: the run is over
                break
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                request = json.loads(line)
                if request["op"] == "start":
                    try:
                        pid = _fork_child(request, run_dir)
                    except (OSError, RuntimeError) as exc:
                        _emit({"event": "error", "name": request["name"], "reason": str(exc)})
                        continue
                    children[pid] = request["name"]
                    _emit({"event": "started", "name": request["name"], "pid": pid})
                elif request["op"] == "signal" and request["pid"] in children:
                    os.kill(request["pid"], request["signum"])
    finally:
        _stop_children(children)
    log.info("stopped")
    return 0


class ForkedProcess:
    """The launcher's handle on one forked child: the subset of ``subprocess.Popen`` it uses."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server, self.pid = server, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            self.server.request({"op": "signal", "pid": self.pid, "signum": int(signum)})

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """Starts the fork server process and talks to it (the launcher's side)."""

    def __init__(self, config_path: Path, run_dir: Path) -> None:
        self.log_path = rundir.logs_dir(run_dir) / rundir.FORKSERVER_LOG
        self.ready = threading.Event()
        self._lock = threading.Condition()
        self._exited: dict[int, int] = {}
        self._started: dict[str, dict] = {}
        self._events_done = False  # the server's stdout reached EOF: no more events
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}  # else numpy's import starts threads
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "apexrl.launch.forkserver", "--config", str(config_path)]
                + ["--run-dir", str(run_dir)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_file,
                env=env,
                preexec_fn=die_with_parent,
                close_fds=True,
                start_new_session=True,
            )
        self._reader = threading.Thread(target=self._read, daemon=True, name="forkserver-events")
        self._reader.start()

    def _read(self) -> None:
        for line in iter(self.process.stdout.readline, b""):
            event = json.loads(line)
            with self._lock:
                if event["event"] == "ready":
                    self.ready.set()
                elif event["event"] == "exited":
                    self._exited[event["pid"]] = event["code"]
                else:
                    self._started[event["name"]] = event
                self._lock.notify_all()
        with self._lock:
            self._events_done = True
            self._lock.notify_all()

    def exit_code(self, pid: int) -> int | None:
        with self._lock:
            code = self._exited.get(pid)
            if code is None and self._events_done:
                # The server died without reporting it: the child got SIGTERM from the kernel.
                return -signal.SIGTERM
        return code

    def request(self, message: dict) -> None:
        try:
            self.process.stdin.write((json.dumps(message) + "\n").encode())
            self.process.stdin.flush()
        except (OSError, ValueError):  # the server is gone; the supervisor will say so
            pass

    def start(
        self,
        name: str,
        args: list[str],
        niceness: int = 0,
        cores: tuple[int, ...] | None = None,
    ) -> ForkedProcess:
        """Fork ``apexrl <args>`` with its output in ``<run dir>/logs/<name>.log``, at
        ``niceness`` on ``cores`` (None: every core)."""
        with self._lock:
            self._started.pop(name, None)
        request = {"op": "start", "name": name, "args": args, "nice": niceness}
        self.request({**request, "cores": None if cores is None else list(cores)})
        deadline = time.monotonic() + START_TIMEOUT_S
        with self._lock:
            while name not in self._started:
                left = deadline - time.monotonic()
                if left <= 0 or self.process.poll() is not None:
                    raise RuntimeError(f"the fork server did not start {name}")
                self._lock.wait(min(left, 0.1))
            event = self._started.pop(name)
        if event["event"] != "started":
            raise RuntimeError(f"the fork server could not start {name}: {event.get('reason')}")
        return ForkedProcess(self, event["pid"])

    def close(self, timeout_s: float = STOP_TIMEOUT_S + 5.0) -> None:
        """Close its stdin (it stops what is left and exits), wait, then kill it."""
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(timeout=1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m apexrl.launch.forkserver", description=__doc__)
    parser.add_argument("--config", required=True, help="the run's config (to preload its env)")
    parser.add_argument("--run-dir", required=True, help="children log to <run dir>/logs/")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("APEXRL_LOG_LEVEL", "INFO"),
        format="%(asctime)s.%(msecs)03d forkserver %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    return serve(args.config, Path(args.run_dir))


if __name__ == "__main__":
    sys.exit(main())

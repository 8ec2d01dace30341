"""Serial mode for real: ``scripts/launch_local.sh --serial`` runs every role of a run in threads
of one process over ZeroMQ's in-process transport, learns CartPole like a launched run, and stops
cleanly on Ctrl-C: the clients before the servers, and a signal never waits on the stop event's
lock."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from apexrl.config import load_config
from apexrl.launch.serial import RoleThread, join_all, stop_in_order, watch
from apexrl.runtime import lifecycle
from apexrl.transport import sockets
from apexrl.transport.messages import Shutdown, StatsRequest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "launch_local.sh"
PPO = REPO / "configs" / "ppo_cartpole.yaml"
ROLES = {"replay", "params", "learner", "actor_0", "actor_1", "eval"}
# "02:51:17.045 learner[910] INFO ...": the role (the thread) and the process of each line.
LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} (\w+)\[(\d+)\] ")


def start(tmp_path: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.Popen(
        ["bash", str(SCRIPT), "--serial", "--config", str(PPO), "--logdir", str(tmp_path), *args],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=open(tmp_path / "console.log", "wb"),  # noqa: SIM115 - the child's
        stderr=subprocess.STDOUT,
    )


@pytest.fixture
def serial_run(tmp_path: Path) -> Iterator[list[subprocess.Popen]]:
    """The started runs; any still alive at the end is killed (the test has failed then)."""
    runs: list[subprocess.Popen] = []
    yield runs
    for popen in runs:
        if popen.poll() is None:
            popen.kill()
            popen.wait()


def children_of(pid: int) -> dict[int, str]:
    """``pid``'s children and their command lines, from every one of its threads (Linux /proc)."""
    children: dict[int, str] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            for child in (task / "children").read_text().split():
                argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
                children[int(child)] = b" ".join(argv).decode(errors="replace")
        except (OSError, ValueError):
            pass
    return children


def wait_watching_children(popen: subprocess.Popen, timeout_s: float) -> dict[int, str]:
    """Wait for ``popen`` to exit; every child it had meanwhile (polled) once it runs the
    launcher (launch_local.sh runs a helper script before it execs Python)."""
    seen: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    while popen.poll() is None and time.monotonic() < deadline:
        try:
            launched = b"apexrl" in Path(f"/proc/{popen.pid}/cmdline").read_bytes()
        except OSError:
            launched = False
        if launched:
            seen.update(children_of(popen.pid))
        time.sleep(0.1)
    return seen


def run_dir_of(tmp_path: Path) -> Path:
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    return run_dir


def line_roles(log_text: str) -> dict[str, set[int]]:
    """Each role that logged, with the PIDs its lines carry."""
    roles: dict[str, set[int]] = {}
    for line in log_text.splitlines():
        match = LINE.match(line)
        if match:
            roles.setdefault(match.group(1), set()).add(int(match.group(2)))
    return roles


@pytest.mark.slow  # about 40 s: a learning run to 475
def test_a_serial_run_learns_cartpole_in_one_process(
    tmp_path: Path, serial_run: list[subprocess.Popen]
) -> None:
    popen = start(tmp_path, "--actors", "2", "--learners", "1")
    serial_run.append(popen)
    children = wait_watching_children(popen, timeout_s=300)
    console = (tmp_path / "console.log").read_text(errors="replace")
    assert popen.poll() == 0, console[-3000:]
    # launch_local.sh execs Python, whose PID is the run's one process: it started no other.
    assert children == {}, f"the serial run started processes {children}"
    roles = line_roles(console)
    assert ROLES <= set(roles), sorted(roles)
    assert set().union(*roles.values()) == {popen.pid}, roles
    run_dir = run_dir_of(tmp_path)
    last = json.loads((run_dir / "result.json").read_text().splitlines()[-1])
    assert last["done"] is True
    assert last["eval_return_mean"] >= 475.0
    assert last["eval_weights_version"] >= 0
    # Every role wrote its own log too, and all of them stopped.
    for role in ROLES:
        assert line_roles((run_dir / "logs" / f"{role}.log").read_text()) == {role: {popen.pid}}
    assert "did not stop" not in console
    assert "serial run ended with exit code 0" in console
    config = (run_dir / "config.yaml").read_text()
    assert "inproc://" in config and "keys_dir: ''" in config
    states = json.loads((run_dir / "roles.json").read_text())["roles"]
    assert {r["name"]: (r["pid"], r["state"]) for r in states} == {
        role: (popen.pid, "exited") for role in ROLES
    }


def test_ctrl_c_stops_a_serial_run_cleanly_with_status_130(
    tmp_path: Path, serial_run: list[subprocess.Popen]
) -> None:
    # No threshold: the run goes on until it is stopped.
    popen = start(tmp_path, "--actors", "1", "--set", "run.stop_eval_return=null")
    serial_run.append(popen)
    deadline = time.monotonic() + 120
    console = tmp_path / "console.log"
    while "first update done" not in console.read_text(errors="replace"):
        assert popen.poll() is None, console.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, "the learner never updated"
        time.sleep(0.2)
    popen.send_signal(signal.SIGINT)
    try:
        code = popen.wait(timeout=60)  # a hang guard: the roles stop within one poll interval
    except subprocess.TimeoutExpired:
        pytest.fail("the serial run did not stop on SIGINT:\n" + console.read_text()[-3000:])
    text = console.read_text(errors="replace")
    assert code == 130, text[-3000:]
    assert "did not stop" not in text and "crashed" not in text, text[-6000:]
    for role in ("replay server stopped", "parameter server stopped", "actor_0 stopped after"):
        assert role in text
    assert "learner rank 0 stopped" in text and "eval stopped" in text
    assert (run_dir_of(tmp_path) / "checkpoint.pt").is_file()


def test_roles_ending_the_shared_context_leave_it_to_the_runner() -> None:
    shared = sockets.share_context()
    stop = threading.Event()
    lifecycle.share_stop(stop)
    try:
        assert sockets.make_context() is shared
        server = sockets.bind(sockets.make_context(), zmq.ROUTER, "inproc://apexrl-test-replay")
        client_ctx = sockets.make_context()
        client = sockets.connect(client_ctx, zmq.DEALER, "inproc://apexrl-test-replay")
        client.close(linger=0)
        client_ctx.term()  # a role's finally: the server's socket keeps working
        other = sockets.connect(sockets.make_context(), zmq.DEALER, "inproc://apexrl-test-replay")
        sockets.send(other, StatsRequest())
        received = sockets.recv_from(server, timeout_ms=5000)
        assert received is not None and isinstance(received.message, StatsRequest)
        sockets.send_to(server, received.identity, Shutdown("done"))
        assert sockets.recv(other, timeout_ms=5000) == Shutdown("done")
        # In a role's thread, install_stop_handlers hands out the run's one event.
        got: list[threading.Event] = []
        thread = threading.Thread(target=lambda: got.append(lifecycle.install_stop_handlers()))
        thread.start()
        thread.join()
        assert got == [stop]
    finally:
        lifecycle.share_stop(None)
        sockets.unshare_context()
        shared.end()
    assert shared.closed and server.closed and other.closed
    assert sockets.make_context() is not shared


def test_a_role_that_raises_stops_the_run_with_status_1(tmp_path: Path) -> None:
    cfg = load_config(str(PPO), [f"run.dir={tmp_path}"])
    stop = threading.Event()

    def serve() -> int:
        stop.wait(30)
        return 0

    def crash() -> int:
        raise RuntimeError("an actor's bug")

    roles = [RoleThread(name, serve) for name in ("replay", "params", "learner")]
    roles.append(RoleThread("actor_0", crash))
    for role in roles:
        role.start()
    assert watch(roles, cfg, stop, offset=0) == 1
    stop.set()
    assert join_all(roles, timeout_s=10) == []
    assert [r.exit_code for r in roles] == [0, 0, 0, 1]


def test_the_servers_stop_after_their_clients() -> None:
    """Over inproc:// a send to a server that has closed its socket blocks for the socket's send
    timeout (a minute) instead of queueing: serial mode stops the clients first and the servers
    once the clients are gone, so a learner that publishes once more after the stop request
    (its update was under way) still gets its message through and stops in time."""
    stop, servers_stop = threading.Event(), threading.Event()
    shared = sockets.share_context()
    lifecycle.share_stop(stop, {"replay": servers_stop})
    addr = "inproc://apexrl-test-order"
    heard: list[object] = []

    def server() -> int:
        own_stop = lifecycle.install_stop_handlers()
        sock = sockets.bind(sockets.make_context(), zmq.ROUTER, addr)
        try:
            while not own_stop.is_set():
                received = sockets.recv_from(sock, timeout_ms=50)
                if received is not None:
                    heard.append(received.message)
        finally:
            sock.close(linger=0)
        return 0

    def late_client() -> int:
        run_stop = lifecycle.install_stop_handlers()
        sock = sockets.connect(sockets.make_context(), zmq.DEALER, addr)
        try:
            run_stop.wait(30)
            time.sleep(0.5)  # a last step under way: time enough for a server to close
            sockets.send(sock, StatsRequest())
        finally:
            sock.close(linger=0)
        return 0

    threads = [RoleThread("replay", server), RoleThread("learner", late_client)]
    try:
        threads[0].start()
        time.sleep(0.2)  # bound
        threads[1].start()
        started = time.monotonic()
        assert stop_in_order(threads, stop, servers_stop) == []
        assert time.monotonic() - started < 10
        assert [r.exit_code for r in threads] == [0, 0]
        assert heard == [StatsRequest()]
    finally:
        stop.set()
        servers_stop.set()
        lifecycle.share_stop(None)
        sockets.unshare_context()
        shared.end()


# The main thread waits for the stop event while SIGINT arrives: its handler sets that event.
WAITER = """
import threading
from apexrl.runtime import lifecycle
stop = lifecycle.install_stop_handlers()
def busy():
    while not stop.is_set():
        sum(range(1000))
for _ in range(2):
    threading.Thread(target=busy, daemon=True).start()
print("ready", flush=True)
while not lifecycle.wait_for_stop(stop, 0.0):
    pass
lifecycle.request_stop(stop)
print("stopped", flush=True)
"""


def test_a_signal_stops_a_main_thread_that_waits_for_the_stop_event() -> None:
    # Event.wait holds the event's lock between its looks: a handler that ran then would wait
    # for that lock forever in Event.set (a third of these runs hung with stop.wait(0)).
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for _ in range(10):
        popen = subprocess.Popen(
            [sys.executable, "-c", WAITER], env=env, stdout=subprocess.PIPE, text=True
        )
        try:
            assert popen.stdout.readline().strip() == "ready"
            time.sleep(random.uniform(0.02, 0.2))
            popen.send_signal(signal.SIGINT)
            out, _ = popen.communicate(timeout=20)
        finally:
            if popen.poll() is None:
                popen.kill()
                popen.wait()
        assert popen.returncode == 0 and out.strip() == "stopped", (popen.returncode, out)

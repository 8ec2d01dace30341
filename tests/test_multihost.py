"""A run across three hosts, made of network namespaces on this machine
(``scripts/netns_hosts.sh``): each role started alone with its command line and the run's CURVE
keys, as README's "Running on several machines" tells a user.

Host 1 (10.77.0.1) runs the replay server, the parameter server and the learner; host 2
(10.77.0.2) an actor and the evaluation actor; host 3 (10.77.0.3) an actor. Each host has its own
run directory and its own copy of the keys. The test checks that training progresses (replay
grows, learner updates and the actors' weights versions advance), that host 4, reachable but
without the run's keys, gets no answer, and that ``apexrl stop`` from host 3 ends every process.
Traffic goes only to 10.77.0.0/24 inside the namespaces, which the fixtures delete afterwards.

Run as a script (``python3 tests/test_multihost.py ADDR SERVER KEYS_DIR ROLE``), this file is the
probe a host uses to ask a server for its ``Stats``: ROLE is a client role whose key it uses,
``none`` (no CURVE) or ``stranger`` (a CURVE key of its own); it prints the values as JSON, or
``null`` when no answer came.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import zmq
import zmq.auth
from conftest import (
    CONFIG,
    REPO,
    SMALL_OVERRIDES,
    Processes,
    RoleProcess,
    set_args,
    wait_until,
)

from apexrl.config import NetConfig
from apexrl.transport import auth, sockets
from apexrl.transport.messages import Stats, StatsRequest

pytestmark = pytest.mark.slow

SCRIPT = REPO / "scripts" / "netns_hosts.sh"
NUM_HOSTS = 4  # hosts 1-3 run the roles; host 4 is a stranger on the same network
REPLAY_ADDR = "tcp://10.77.0.1:6000"
PARAMS_ADDR = "tcp://10.77.0.1:6001"
NO_REPLY_S = 3.0  # how long a refused client waits for the answer that must not come
STOP_BOUND_S = 3.0 + 15.0  # the servers' shutdown grace, then a stop on a loaded two-core box


# --- the probe (run inside a namespace) ---------------------------------------------------------


def probe(addr: str, server: str, keys_dir: str, role: str, timeout_s: float) -> dict | None:
    """The ``Stats`` values of the server at ``addr``, asked as ``role``; None without answer."""
    curve = None
    if role == "stranger":
        public_key, secret_key = zmq.curve_keypair()
        server_key, _ = zmq.auth.load_certificate(Path(keys_dir) / f"{server}.key")
        curve = auth.ClientKeys(public_key, secret_key, server_key)
    elif role != "none":
        curve = auth.client_keys(NetConfig(keys_dir=keys_dir), role, server)
    ctx = sockets.make_context()
    with sockets.closing(ctx):
        sock = sockets.connect(ctx, zmq.DEALER, addr, curve=curve)
        sockets.send(sock, StatsRequest())
        reply = sockets.recv(sock, timeout_ms=int(timeout_s * 1000))
    return reply.values if isinstance(reply, Stats) else None


# --- hosts --------------------------------------------------------------------------------------


@dataclass
class Hosts:
    """The namespaces of one test: host ``i`` is ``<prefix>-<i>`` with address 10.77.0.i."""

    prefix: str

    def ns(self, host: int) -> str:
        return f"{self.prefix}-{host}"

    def names(self) -> list[str]:
        return [f"{self.prefix}-br", *(self.ns(i) for i in range(1, NUM_HOSTS + 1))]

    def down(self) -> None:
        subprocess.run(["bash", str(SCRIPT), "down", self.prefix, str(NUM_HOSTS)], check=False)

    def existing(self) -> list[str]:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        present = {line.split()[0] for line in listed.splitlines() if line.strip()}
        return [name for name in self.names() if name in present]

    def stats(self, host: int, server: str, keys_dir: Path | str, role: str) -> dict | None:
        """``probe`` run on ``host``."""
        addr = REPLAY_ADDR if server == "replay" else PARAMS_ADDR
        command = [*self.exec_prefix(host), sys.executable, str(Path(__file__).resolve())]
        command += [addr, server, str(keys_dir), role]
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=60)
        assert done.returncode == 0, f"probe on host {host} failed:\n{done.stderr[-3000:]}"
        return json.loads(done.stdout)

    def exec_prefix(self, host: int) -> list[str]:
        return ["ip", "netns", "exec", self.ns(host)]


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2) to make network namespaces")
    made = Hosts(f"apx{os.getpid()}")
    up = subprocess.run(
        ["bash", str(SCRIPT), "up", made.prefix, str(NUM_HOSTS)], capture_output=True, text=True
    )
    if up.returncode != 0:
        made.down()
        pytest.skip(f"cannot make network namespaces ({SCRIPT.name} up): {up.stderr.strip()}")
    try:
        yield made
    finally:
        made.down()


@dataclass
class Cluster:
    hosts: Hosts
    procs: Processes

    def start(self, host: int, name: str, *args: str) -> RoleProcess:
        """``ip netns exec <host> python3 -m apexrl <args>``, as a user on that host would type
        it; ``ip netns exec`` execs the command, so the process is the role itself."""
        log_path = self.procs.log_dir / f"host{host}_{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        command = [*self.hosts.exec_prefix(host), sys.executable, "-m", "apexrl", *args]
        with open(log_path, "ab") as log_file:
            popen = subprocess.Popen(
                command,
                cwd=REPO,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        proc = RoleProcess(f"host{host}/{name}", popen, log_path)
        self.procs.started.append(proc)
        return proc


@pytest.fixture
def cluster(hosts: Hosts, tmp_path: Path) -> Iterator[Cluster]:
    """Roles in the namespaces; stopped before ``hosts`` deletes the namespaces."""
    processes = Processes(tmp_path / "logs")
    try:
        yield Cluster(hosts, processes)
    finally:
        processes.stop_all()


# --- the run ------------------------------------------------------------------------------------


def role_args(role: str, host_dir: Path, *extra: str) -> list[str]:
    common = ["--config", str(CONFIG), "--run-dir", str(host_dir / "run")]
    common += ["--keys", str(host_dir / "keys")]
    if role == "replay":
        common += ["--bind", REPLAY_ADDR]
    elif role == "params":
        common += ["--bind", PARAMS_ADDR]
    else:
        common += ["--replay", REPLAY_ADDR, "--params", PARAMS_ADDR]
    overrides = (*SMALL_OVERRIDES, "actor.num_actors=2")
    return [role, *common, *extra, *set_args(overrides)]


def results(host_dir: Path) -> list[dict]:
    path = host_dir / "run" / "result.json"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_run_across_three_hosts_trains_refuses_strangers_and_stops(
    cluster: Cluster, tmp_path: Path
) -> None:
    from test_roles import actor_weights_versions

    hosts, procs = cluster.hosts, cluster.procs
    made = subprocess.run(
        [sys.executable, "-m", "apexrl", "keys", str(tmp_path / "keys")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert made.returncode == 0, made.stderr
    host_dirs = {i: tmp_path / f"host{i}" for i in (1, 2, 3)}
    for host_dir in host_dirs.values():  # each host gets its own copy of the keys
        shutil.copytree(tmp_path / "keys", host_dir / "keys")
    h1, h2, h3 = host_dirs[1], host_dirs[2], host_dirs[3]

    servers = [
        cluster.start(1, "replay", *role_args("replay", h1)),
        cluster.start(1, "params", *role_args("params", h1)),
    ]
    for server in ("replay", "params"):
        answered = wait_until(lambda s=server: hosts.stats(1, s, h1 / "keys", "learner"), 60, 0.5)
        assert answered, f"{server} does not answer on host 1\n{procs.tails()}"
    learner = cluster.start(1, "learner", *role_args("learner", h1))
    actors = [
        cluster.start(2, "actor_0", *role_args("actor", h2, "--id", "0", "--num-actors", "2")),
        cluster.start(2, "eval", *role_args("actor", h2, "--eval")),
        cluster.start(3, "actor_1", *role_args("actor", h3, "--id", "1", "--num-actors", "2")),
    ]

    # Training progresses: replay fills from both actor hosts, the learner updates and publishes,
    # and each actor host plays newer weights.
    def replay_stats() -> dict:
        return hosts.stats(1, "replay", h1 / "keys", "learner") or {}

    first = wait_until(lambda: replay_stats().get("replay/size", 0) >= 400, 120, 1.0)
    assert first, f"replay did not fill up: {replay_stats()}\n{procs.tails()}"
    assert wait_until(lambda: replay_stats().get("replay/active_actors", 0) >= 2, 30, 1.0), (
        f"both actor hosts should be inserting: {replay_stats()}\n{procs.tails()}"
    )
    updated = wait_until(lambda: [r for r in results(h1) if r["learner_updates"] > 0], 60, 1.0)
    assert updated, f"no result.json line with updates\n{procs.tails()}"
    at_first = updated[0]["learner_updates"]
    more = wait_until(
        lambda: [r for r in results(h1) if r["learner_updates"] >= at_first + 20], 60, 1.0
    )
    assert more, f"learner updates stuck at {at_first}\n{procs.tails()}"
    for host_dir, role in ((h2, "actor_0"), (h3, "actor_1")):
        versions = wait_until(
            lambda d=host_dir, r=role: [v for v in actor_weights_versions(d / "run", r) if v > 0],
            60,
            1.0,
        )
        assert versions, f"{role} never played weights newer than version 0\n{procs.tails()}"
    stats = replay_stats()
    assert stats["eval/episodes"] > 0, f"no evaluation episodes reached replay: {stats}"
    assert stats["replay/rejected_messages"] == 0, stats
    print(
        f"\nreplay size {stats['replay/size']:.0f}, env steps {stats['replay/env_steps']:.0f}, "
        f"eval episodes {stats['eval/episodes']:.0f}, learner updates "
        f"{results(h1)[-1]['learner_updates']}, actor weights versions: "
        f"{max(actor_weights_versions(h2 / 'run', 'actor_0'))} (host 2), "
        f"{max(actor_weights_versions(h3 / 'run', 'actor_1'))} (host 3)"
    )

    # Host 4 reaches host 1 (with the learner's key it is answered), but without the run's keys
    # it gets nothing: neither as a plain client nor with a CURVE key of its own.
    stranger_keys = tmp_path / "host4_keys"  # only the servers' public keys
    stranger_keys.mkdir()
    for server in ("replay", "params"):
        shutil.copy(tmp_path / "keys" / f"{server}.key", stranger_keys)
        assert hosts.stats(4, server, h1 / "keys", "learner") is not None, "host 4 is unreachable"
        for role in ("none", "stranger"):
            reply = hosts.stats(4, server, stranger_keys, role)
            assert reply is None, f"{server} answered a {role} client on host 4: {reply}"
    assert all(p.alive() for p in procs.started), procs.tails()

    # `apexrl stop` with the learner's key, from host 3, ends every process on every host.
    stopper = cluster.start(
        3,
        "stop",
        "stop",
        "--replay",
        REPLAY_ADDR,
        "--params",
        PARAMS_ADDR,
        "--keys",
        str(h3 / "keys"),
    )
    assert stopper.wait(30) == 0, stopper.tail()
    for proc in (*servers, learner, *actors):
        code = proc.wait(STOP_BOUND_S)
        assert code == 0, f"{proc.name}: exit code {code} (None: still running)\n{procs.tails()}"
    assert "servers are shutting down" in actors[0].log(), actors[0].tail()
    assert (h1 / "run" / "checkpoint.pt").is_file()
    assert not [p.name for p in procs.started if p.alive()]

    hosts.down()
    assert hosts.existing() == [], f"namespaces left: {hosts.existing()}"


if __name__ == "__main__":
    result = probe(*sys.argv[1:5], timeout_s=NO_REPLY_S)
    print(json.dumps(result))

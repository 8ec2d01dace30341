"""A run across hosts made of network namespaces on this machine (``scripts/netns_hosts.sh``): each
role started alone with its command line and its host's bundle of the run's CURVE keys, as
docs/clusters.md tells a user.

Host 1 (10.77.0.1) runs the replay and parameter servers (the servers' bundle); host 2 the
learner (the learner's bundle); host 3 an actor and the evaluation actor (the actors' and eval
bundles); host 4 an actor (the actors' bundle); host 5 is a stranger on the same network. Each
host has its own run directory and only its own bundles.

- The run trains (replay grows, learner updates and the actors' weights versions advance), host 5
  without the run's keys gets no answer, host 4 cannot start a learner with the actors' bundle,
  and ``apexrl stop`` from the learner's host ends every process.
- Partitions: host 4 (an actor) and then host 2 (the learner) are cut off the network for
  ``CUT_S`` seconds each (``netns_hosts.sh cut``: packets dropped silently, no error on either
  side); once plugged back in, each reconnects by itself: the actor's reports reach replay again
  and the learner's updates advance, and no role died.

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
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

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

T = TypeVar("T")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "scripts" / "netns_hosts.sh"
NUM_HOSTS = 5  # hosts 1-4 run the roles; host 5 is a stranger on the same network
SERVERS, LEARNER, ACTORS_AND_EVAL, ACTOR, STRANGER = 1, 2, 3, 4, 5  # the hosts
# The bundles of the run's keys each host holds (``apexrl keys``).
HOST_BUNDLES = {SERVERS: ("servers",), LEARNER: ("learner",), ACTORS_AND_EVAL: ("actors", "eval")}
HOST_BUNDLES[ACTOR] = ("actors",)
ROLE_BUNDLE = {"replay": "servers", "params": "servers", "learner": "learner", "actor": "actors"}
REPLAY_ADDR = "tcp://10.77.0.1:6000"
PARAMS_ADDR = "tcp://10.77.0.1:6001"
NO_REPLY_S = 3.0  # how long a refused client waits for the answer that must not come
STOP_BOUND_S = 3.0 + 15.0  # the servers' shutdown grace, then a stop on a loaded two-core box
CUT_S = 30.0  # how long a host is cut off the network
CUT_SETTLE_S = 5.0  # into a cut: what was on the wire when the cable was pulled has arrived
RECONNECT_BOUND_S = 60.0  # a role plugged back in is heard from again within this


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
        try:
            done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=60)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"probe on host {host} hung:\n{exc.stderr}") from exc
        assert done.returncode == 0, f"probe on host {host} failed:\n{done.stderr[-3000:]}"
        return json.loads(done.stdout)

    def exec_prefix(self, host: int) -> list[str]:
        return ["ip", "netns", "exec", self.ns(host)]

    def cut_off(self, host: int, seconds: float, look: Callable[[], T]) -> tuple[T, T, float]:
        """Pull ``host``'s cable for ``seconds`` (plugged back in also when interrupted). Returns
        what ``look`` returns ``CUT_SETTLE_S`` into the cut and at its end, and the
        time.monotonic() of plugging the cable back in."""
        subprocess.run(["bash", str(SCRIPT), "cut", self.prefix, str(host)], check=True)
        cut_at = time.monotonic()
        try:
            time.sleep(CUT_SETTLE_S)
            early = look()
            time.sleep(max(0.0, cut_at + seconds - time.monotonic()))
            late = look()
        finally:
            subprocess.run(["bash", str(SCRIPT), "mend", self.prefix, str(host)], check=True)
        return early, late, time.monotonic()


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


def give_keys(tmp_path: Path) -> dict[int, Path]:
    """``apexrl keys`` once, then each host's directory with a copy of its own bundles only."""
    made = subprocess.run(
        [sys.executable, "-m", "apexrl", "keys", str(tmp_path / "keys")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert made.returncode == 0, made.stderr
    host_dirs = {}
    for host, bundles in HOST_BUNDLES.items():
        host_dirs[host] = tmp_path / f"host{host}"
        for bundle in bundles:
            shutil.copytree(tmp_path / "keys" / bundle, host_dirs[host] / "keys" / bundle)
    return host_dirs


def role_args(role: str, host_dir: Path, *extra: str, bundle: str = "") -> list[str]:
    """The command line of ``role`` on the host of ``host_dir``, with the bundle of its role
    (or ``bundle``)."""
    bundle = bundle or ("eval" if "--eval" in extra else ROLE_BUNDLE[role])
    common = ["--config", str(CONFIG), "--run-dir", str(host_dir / "run")]
    common += ["--keys", str(host_dir / "keys" / bundle)]
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


def learner_updates(host_dir: Path) -> int:
    lines = results(host_dir)
    return lines[-1]["learner_updates"] if lines else 0


@dataclass
class Run:
    """A run's roles on hosts 1-4 and what each host holds."""

    cluster: Cluster
    host_dirs: dict[int, Path]
    roles: dict[str, RoleProcess]

    def replay_stats(self) -> dict:
        """Replay's ``Stats``, asked from the actors' and evaluation host with the eval key."""
        probe_keys = self.host_dirs[ACTORS_AND_EVAL] / "keys" / "eval"
        return self.cluster.hosts.stats(ACTORS_AND_EVAL, "replay", probe_keys, "eval") or {}

    def alive(self) -> list[str]:
        return [name for name, proc in self.roles.items() if proc.alive()]

    def stop(self) -> None:
        """``apexrl stop`` from the learner's host (its bundle holds the learner's key, which
        stopping takes); every role ends with 0."""
        h2 = self.host_dirs[LEARNER]
        stopper = self.cluster.start(
            LEARNER, "stop", "stop", "--replay", REPLAY_ADDR, "--params", PARAMS_ADDR,
            "--keys", str(h2 / "keys" / "learner"),
        )  # fmt: skip
        assert stopper.wait(30) == 0, stopper.tail()
        for proc in self.roles.values():
            code = proc.wait(STOP_BOUND_S)
            assert code == 0, f"{proc.name}: exit code {code} (None: still running)\n" + (
                self.cluster.procs.tails()
            )


def start_run(cluster: Cluster, tmp_path: Path, evaluate: bool) -> Run:
    """Servers on host 1, the learner on host 2, actor 0 (and the evaluation actor) on host 3,
    actor 1 on host 4, each with its host's bundle; returns once replay has data."""
    host_dirs = give_keys(tmp_path)
    h1, h2, h3, h4 = (host_dirs[i] for i in (SERVERS, LEARNER, ACTORS_AND_EVAL, ACTOR))
    roles = {
        "replay": cluster.start(SERVERS, "replay", *role_args("replay", h1)),
        "params": cluster.start(SERVERS, "params", *role_args("params", h1)),
    }
    learner_keys = h2 / "keys" / "learner"
    for server in ("replay", "params"):
        answered = wait_until(
            lambda s=server: cluster.hosts.stats(LEARNER, s, learner_keys, "learner"), 60, 0.5
        )
        assert answered, f"{server} does not answer on host 1\n{cluster.procs.tails()}"
    roles["learner"] = cluster.start(LEARNER, "learner", *role_args("learner", h2))
    actor_0 = role_args("actor", h3, "--id", "0", "--num-actors", "2")
    roles["actor_0"] = cluster.start(ACTORS_AND_EVAL, "actor_0", *actor_0)
    if evaluate:
        roles["eval"] = cluster.start(ACTORS_AND_EVAL, "eval", *role_args("actor", h3, "--eval"))
    actor_1 = role_args("actor", h4, "--id", "1", "--num-actors", "2")
    roles["actor_1"] = cluster.start(ACTOR, "actor_1", *actor_1)
    run = Run(cluster, host_dirs, roles)
    first = wait_until(lambda: run.replay_stats().get("replay/size", 0) >= 400, 120, 1.0)
    assert first, f"replay did not fill up: {run.replay_stats()}\n{cluster.procs.tails()}"
    return run


def test_a_run_across_hosts_trains_refuses_strangers_and_stops(
    cluster: Cluster, tmp_path: Path
) -> None:
    from test_roles import actor_weights_versions

    hosts, procs = cluster.hosts, cluster.procs
    run = start_run(cluster, tmp_path, evaluate=True)
    h2, h3, h4 = (run.host_dirs[i] for i in (LEARNER, ACTORS_AND_EVAL, ACTOR))

    # The actors' host holds no learner key: a learner started there stops at once, saying
    # which bundle it needs.
    usurper = cluster.start(ACTOR, "learner", *role_args("learner", h4, bundle="actors"))
    assert usurper.wait(60) == 2, usurper.tail()
    assert "holds no learner secret key: the learner needs the learner bundle" in usurper.log()

    # Training progresses: replay fills from both actor hosts, the learner updates and publishes,
    # and each actor host plays newer weights.
    assert wait_until(lambda: run.replay_stats().get("replay/active_actors", 0) >= 2, 30, 1.0), (
        f"both actor hosts should be inserting: {run.replay_stats()}\n{procs.tails()}"
    )
    updated = wait_until(lambda: learner_updates(h2) > 0, 60, 1.0)
    assert updated, f"no result.json line with updates\n{procs.tails()}"
    at_first = learner_updates(h2)
    more = wait_until(lambda: learner_updates(h2) >= at_first + 20, 60, 1.0)
    assert more, f"learner updates stuck at {at_first}\n{procs.tails()}"
    for host_dir, role in ((h3, "actor_0"), (h4, "actor_1")):
        versions = wait_until(
            lambda d=host_dir, r=role: [v for v in actor_weights_versions(d / "run", r) if v > 0],
            60,
            1.0,
        )
        assert versions, f"{role} never played weights newer than version 0\n{procs.tails()}"
    stats = run.replay_stats()
    assert stats["eval/episodes"] > 0, f"no evaluation episodes reached replay: {stats}"
    assert stats["replay/rejected_messages"] == 0, stats
    print(
        f"\nreplay size {stats['replay/size']:.0f}, env steps {stats['replay/env_steps']:.0f}, "
        f"eval episodes {stats['eval/episodes']:.0f}, learner updates {learner_updates(h2)}, "
        f"actor weights versions: {max(actor_weights_versions(h3 / 'run', 'actor_0'))} "
        f"(host 3), {max(actor_weights_versions(h4 / 'run', 'actor_1'))} (host 4)"
    )

    # Host 5 reaches host 1 (with the learner's key it is answered), but without the run's keys
    # it gets nothing: neither as a plain client nor with a CURVE key of its own.
    stranger_keys = tmp_path / "host5_keys"  # only the servers' public keys
    stranger_keys.mkdir()
    for server in ("replay", "params"):
        shutil.copy(tmp_path / "keys" / "learner" / f"{server}.key", stranger_keys)
        reachable = hosts.stats(STRANGER, server, h2 / "keys" / "learner", "learner")
        assert reachable is not None, "host 5 is unreachable"
        for role in ("none", "stranger"):
            reply = hosts.stats(STRANGER, server, stranger_keys, role)
            assert reply is None, f"{server} answered a {role} client on host 5: {reply}"
    assert sorted(run.alive()) == sorted(run.roles), procs.tails()

    # `apexrl stop` with the learner's key, from the learner's host, ends every process.
    run.stop()
    assert "servers are shutting down" in run.roles["actor_0"].log(), run.roles["actor_0"].tail()
    assert (h2 / "run" / "checkpoint.pt").is_file()
    assert not [p.name for p in procs.started if p.alive()]

    hosts.down()
    assert hosts.existing() == [], f"namespaces left: {hosts.existing()}"


def test_cut_off_hosts_reconnect_by_themselves_and_the_run_goes_on(
    cluster: Cluster, tmp_path: Path
) -> None:
    hosts, procs = cluster.hosts, cluster.procs
    run = start_run(cluster, tmp_path, evaluate=False)
    h2 = run.host_dirs[LEARNER]
    assert wait_until(lambda: learner_updates(h2) >= 10, 90, 1.0), procs.tails()
    assert wait_until(lambda: run.replay_stats().get("actor/1/env_steps", 0) > 0, 30, 1.0)

    # Actor 1's host is cut off: replay stops hearing from it, then hears from it again.
    early, during, mended = hosts.cut_off(ACTOR, CUT_S, run.replay_stats)
    steps_at_mend = during["actor/1/env_steps"]
    assert steps_at_mend == early["actor/1/env_steps"], f"the cut did not hold: {during}"
    assert during["actor/1/last_heard_s"] > CUT_S - CUT_SETTLE_S, f"the cut did not hold: {during}"
    heard = wait_until(
        lambda: run.replay_stats().get("actor/1/env_steps", 0) > steps_at_mend,
        RECONNECT_BOUND_S,
        0.5,
    )
    actor_back_s = time.monotonic() - mended
    assert heard, f"actor 1 was not heard from again\n{procs.tails()}"
    assert sorted(run.alive()) == sorted(run.roles), procs.tails()

    # The learner's host is cut off: replay serves it no batch meanwhile; once it is plugged
    # back in its updates advance again.
    early, during, mended = hosts.cut_off(LEARNER, CUT_S, run.replay_stats)
    sampled_at_cut, sampled_after = early["replay/num_sampled"], during["replay/num_sampled"]
    assert sampled_after == sampled_at_cut, f"replay served the cut-off learner: {during}"
    updates_at_mend = learner_updates(h2)
    sampled = wait_until(
        lambda: run.replay_stats().get("replay/num_sampled", 0) > sampled_after,
        RECONNECT_BOUND_S,
        0.5,
    )
    learner_back_s = time.monotonic() - mended
    assert sampled, f"the learner did not sample again\n{procs.tails()}"
    advanced = wait_until(lambda: learner_updates(h2) > updates_at_mend, RECONNECT_BOUND_S, 0.5)
    updates_s = time.monotonic() - mended
    assert advanced, f"learner updates stuck at {updates_at_mend}\n{procs.tails()}"
    assert sorted(run.alive()) == sorted(run.roles), procs.tails()
    print(
        f"\nafter a {CUT_S:.0f} s cut: actor 1's reports reach replay again {actor_back_s:.1f} s "
        f"after its host is plugged back in; the learner samples again after "
        f"{learner_back_s:.1f} s and its updates advance after {updates_s:.1f} s "
        f"(replay's samples at the cut {sampled_at_cut:.0f}, at its end {sampled_after:.0f})"
    )
    run.stop()
    assert not [p.name for p in procs.started if p.alive()]


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(50)  # a probe that hangs says where, before its 60 s end
    result = probe(*sys.argv[1:5], timeout_s=NO_REPLY_S)
    print(json.dumps(result))

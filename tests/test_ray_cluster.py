"""``apexrl ray`` on a Ray cluster of three nodes in this machine (``ray.cluster_utils.Cluster``:
a head and two worker nodes, each its own raylet, all at 127.0.0.2), driven as a user would:
``apexrl ray --address <the cluster>`` in its own process. The nodes listen on 127.0.0.2: Ray
resolves a cluster address of 127.0.0.1 to the machine's own network address, which a
loopback-only cluster does not listen on, and 127.0.0.2 is loopback too.

One run of Ape-X on CartPole with 2 actors and the evaluation actor, from a clean start:

- the servers and the learner run on the head, the actors on the two worker nodes (Ray's state
  API: each runner by its name ``<run>/<role>`` and its node);
- an actor whose process is killed is restarted and counted (``roles.json``);
- a replay server whose process is SIGKILLed comes back with every item it had acknowledged
  (``replay/items_lost`` 0, the chunk log read back) and the learner's updates go on;
- a worker node that is removed takes its runners with it: their roles start again on the other
  worker node, in new runners, counted as restarts;
- the learner's stop condition (a greedy return of 475 over 100 episodes: solved) ends the run
  with status 0, and no process of the run is left on any node.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from conftest import CONFIG, REPO, log_tail, wait_until

from apexrl.config import load_config
from apexrl.tools.server_stats import server_stats
from apexrl.tools.status import stats_keys

pytestmark = pytest.mark.slow

RUN_TIMEOUT_S = 900.0
START_TIMEOUT_S = 180.0  # three raylets, the runners and the roles on two cores
HEAD_CPUS, WORKER_CPUS = 3, 3  # the head: replay, params, learner; a worker: every actor's bundle
LOOPBACK = "127.0.0.2"  # every node's address (see the module docstring)


@pytest.fixture
def cluster() -> Iterator[object]:
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": HEAD_CPUS,
            "node_ip_address": LOOPBACK,
            "include_dashboard": True,  # the state API answers through it
            "dashboard_host": LOOPBACK,
        },
    )
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=WORKER_CPUS, node_ip_address=LOOPBACK)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


def roles_of(run_dir: Path) -> dict[str, dict]:
    try:
        record = json.loads((run_dir / "roles.json").read_text())
    except (OSError, ValueError):
        return {}
    return {role["name"]: role for role in record.get("roles", [])}


def running(run_dir: Path, names: list[str]) -> dict[str, dict] | None:
    roles = roles_of(run_dir)
    if all(roles.get(n, {}).get("state") == "running" for n in names):
        return roles
    return None


def runners(address: str, run_name: str) -> dict[str, str]:
    """The run's live runners by role name (a runner made again: ``actor_1#2``) -> node id."""
    from ray.util.state import list_actors

    alive = list_actors(address=address, filters=[("state", "=", "ALIVE")], limit=1000)
    prefix = f"{run_name}/"
    return {a.name.removeprefix(prefix): a.node_id for a in alive if a.name.startswith(prefix)}


def run_processes(run_dir: Path) -> list[int]:
    """PIDs of processes on this machine (every node) whose command line names the run."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if str(run_dir).encode() in cmdline:
                pids.append(int(entry.name))
    return pids


def test_a_run_on_a_three_node_ray_cluster_solves_cartpole_and_survives_its_faults(
    cluster: object, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    out = tmp_path / "driver.out"
    with open(out, "wb") as output:
        driver = subprocess.Popen(
            [
                sys.executable, "-m", "apexrl", "ray", "--address", cluster.address,
                "--config", str(CONFIG), "--actors", "2", "--run-dir", str(run_dir),
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
        )  # fmt: skip
    try:
        ran = drive_the_run(cluster, run_dir, driver, out)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGTERM)
            try:
                driver.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait()
        for pid in run_processes(run_dir):  # by their own ids: what a failure left behind
            os.kill(pid, signal.SIGKILL)
    print(ran)


def drive_the_run(cluster: object, run_dir: Path, driver: subprocess.Popen, out: Path) -> str:
    def tails() -> str:
        logs = run_dir / "logs"
        return f"driver:\n{log_tail(out)}\nlearner:\n{log_tail(logs / 'learner.log', 15)}"

    names = ["replay", "params", "learner", "actor_0", "actor_1", "eval"]
    roles = wait_until(lambda: running(run_dir, names), START_TIMEOUT_S, 0.5)
    assert roles, tails()
    head = cluster.head_node.node_id
    workers = {node.node_id for node in cluster.worker_nodes}
    placed = runners(cluster.address, run_dir.name)
    assert {placed[n] for n in ("replay", "params", "learner")} == {head}, placed
    assert {placed[n] for n in ("actor_0", "actor_1", "eval")} <= workers, placed
    cfg = load_config(str(run_dir / "config.yaml"))
    assert cfg.net.replay_addr.startswith(f"tcp://{LOOPBACK}:"), cfg.net.replay_addr

    # An actor's process killed: the supervisor starts it again in its runner.
    os.kill(roles["actor_0"]["pid"], signal.SIGKILL)
    assert wait_until(
        lambda: (r := running(run_dir, ["actor_0"])) and r["actor_0"]["restarts"] == 1, 60, 0.5
    ), tails()

    # The replay server SIGKILLed once it holds data: it comes back with what it acknowledged.
    ctx = zmq.Context()
    keys = stats_keys(cfg.net, "replay")  # as `apexrl status RUN_DIR` picks them

    def replay_stats() -> dict | None:
        return server_stats(ctx, cfg.net.replay_addr, timeout_ms=1000, curve=keys)

    assert wait_until(lambda: (s := replay_stats()) and s["replay/num_sampled"], 120, 1), tails()
    os.kill(roles_of(run_dir)["replay"]["pid"], signal.SIGKILL)
    assert wait_until(
        lambda: (r := running(run_dir, ["replay"])) and r["replay"]["restarts"] == 1, 60, 0.5
    ), tails()
    back = wait_until(replay_stats, 60, 1)
    assert back and back["replay/items_lost"] == 0 and back["replay/size"] > 0, back
    replay_log = (run_dir / "logs" / "replay.log").read_text()
    assert any(line in replay_log for line in ("read back from the chunk log", "loaded the replay"))
    sampled = back["replay/num_sampled"]
    assert wait_until(lambda: (s := replay_stats()) and s["replay/num_sampled"] > sampled, 60, 1)

    # A worker node removed: its roles start again on the other worker, in new runners.
    placed = runners(cluster.address, run_dir.name)
    gone = next(n for n in cluster.worker_nodes if n.node_id == placed["actor_1"])
    moved = [name for name, node in placed.items() if node == gone.node_id]
    restarts = {name: roles_of(run_dir)[name]["restarts"] for name in moved}
    cluster.remove_node(gone)

    def moved_back() -> dict | None:
        now = runners(cluster.address, run_dir.name)
        again = {n: now.get(f"{n}#2") for n in moved}
        roles = running(run_dir, moved)
        if (
            roles
            and all(again.values())
            and all(roles[n]["restarts"] == restarts[n] + 1 for n in moved)
        ):
            return again
        return None

    again = wait_until(moved_back, 180, 1)
    assert again, f"{moved}\n{tails()}"
    assert set(again.values()) <= workers - {gone.node_id}, again

    # On to the stop condition: CartPole solved, the run ends with 0 and leaves nothing.
    code = driver.wait(timeout=RUN_TIMEOUT_S)
    assert code == 0, tails()
    records = [json.loads(line) for line in (run_dir / "result.json").read_text().splitlines()]
    final = records[-1]
    assert final.get("done") and final["eval_return_mean"] >= 475.0, final
    left = wait_until(lambda: not run_processes(run_dir), 30, 0.5)
    assert left, f"processes left: {run_processes(run_dir)}"
    assert not runners(cluster.address, run_dir.name)
    ctx.term()
    return (
        f"\nray cluster: CartPole solved, greedy return {final['eval_return_mean']:.1f} after "
        f"{final.get('env_steps')} env steps, {final.get('time_s', 0):.0f} s; moved {moved}"
    )


# --- three hosts: network namespaces, each with its own `ray start` ------------------------------

NETNS_SCRIPT = REPO / "scripts" / "netns_hosts.sh"
NUM_HOSTS = 3
GCS_PORT, DASHBOARD_PORT = 6379, 8265
JOB_TIMEOUT_S = 600.0


def host_ip(host: int) -> str:
    return f"10.77.0.{host}"


@pytest.fixture
def netns_hosts() -> Iterator[str]:
    """Network namespaces ``<prefix>-1..3`` at 10.77.0.1-3; the prefix. Whatever still runs in
    them at the end is stopped by its PID (``ip netns pids``) before they are deleted."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2) to make network namespaces")
    prefix = f"apr{os.getpid()}"
    down = ["bash", str(NETNS_SCRIPT), "down", prefix, str(NUM_HOSTS)]
    up = subprocess.run(
        ["bash", str(NETNS_SCRIPT), "up", prefix, str(NUM_HOSTS)], capture_output=True, text=True
    )
    if up.returncode != 0:
        subprocess.run(down, check=False)
        pytest.skip(f"cannot make network namespaces: {up.stderr.strip()}")
    try:
        yield prefix
    finally:
        for host in range(1, NUM_HOSTS + 1):
            stop_namespace(f"{prefix}-{host}")
        subprocess.run(down, check=False)


def namespace_pids(ns: str) -> list[int]:
    listed = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(pid) for pid in listed.stdout.split()]


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def stop_pids(pids: list[int], timeout_s: float = 20.0) -> None:
    """SIGTERM to each PID, then SIGKILL to those still there after ``timeout_s``; returns once
    each has exited (a SIGKILLed process with much memory takes a moment to go)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not any(alive(p) for p in pids), timeout_s, 0.2)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not any(alive(p) for p in pids), 10.0, 0.1)


def stop_namespace(ns: str, rounds: int = 3) -> list[int]:
    """Stops every process in network namespace ``ns`` by its PID, again for any that one of
    them started while it was stopping; the PIDs still there after ``rounds`` rounds."""
    for _ in range(rounds):
        pids = [pid for pid in namespace_pids(ns) if alive(pid)]
        if not pids:
            return []
        stop_pids(pids)
    return [pid for pid in namespace_pids(ns) if alive(pid)]


@pytest.fixture
def ray_temp() -> Iterator[str]:
    """A short directory for Ray's session (its sockets' paths must fit in 107 bytes)."""
    path = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_ray_job_on_three_hosts_with_token_auth_trains_and_leaves_no_process(
    netns_hosts: str, ray_temp: str, tmp_path: Path
) -> None:
    token = tmp_path / "ray_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    env.pop("RAY_ADDRESS", None)
    ray_cli = str(Path(sys.executable).parent / "ray")

    def on_host(host: int, *command: str, timeout: float = 180.0) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ip", "netns", "exec", f"{netns_hosts}-{host}", *command],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            cwd=REPO,
        )

    head = on_host(
        1, ray_cli, "start", "--head", "--node-ip-address", host_ip(1), "--port", str(GCS_PORT),
        "--num-cpus", "3", "--dashboard-host", host_ip(1), "--dashboard-port", str(DASHBOARD_PORT),
        "--temp-dir", f"{ray_temp}/h1", "--disable-usage-stats",
    )  # fmt: skip
    assert head.returncode == 0, head.stdout + head.stderr
    for host in (2, 3):
        worker = on_host(
            host, ray_cli, "start", "--address", f"{host_ip(1)}:{GCS_PORT}",
            "--node-ip-address", host_ip(host), "--num-cpus", "2",
            "--temp-dir", f"{ray_temp}/h{host}",  # each host its own, as on its own disk
        )  # fmt: skip
        assert worker.returncode == 0, worker.stdout + worker.stderr

    # Without the token, the cluster refuses a client.
    stranger_env = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")}
    stranger = subprocess.run(
        ["ip", "netns", "exec", f"{netns_hosts}-2", ray_cli, "job", "list", "--address",
         f"http://{host_ip(1)}:{DASHBOARD_PORT}"],
        capture_output=True, text=True, env=stranger_env, timeout=120,
    )  # fmt: skip
    assert stranger.returncode != 0, stranger.stdout

    run_dir = tmp_path / "run"
    entrypoint = [
        sys.executable, "-m", "apexrl", "ray", "--address", "auto", "--config", str(CONFIG),
        "--actors", "2", "--run-dir", str(run_dir), "--set", "run.stop_wall_s=20",
        "--set", "run.stop_eval_return=null",
    ]  # fmt: skip
    job = on_host(
        2, ray_cli, "job", "submit", "--address", f"http://{host_ip(1)}:{DASHBOARD_PORT}",
        "--", *entrypoint, timeout=JOB_TIMEOUT_S,
    )  # fmt: skip
    output = job.stdout + job.stderr
    (tmp_path / "job.out").write_text(output)
    assert job.returncode == 0, output[-6000:]
    assert "succeeded" in output.lower(), output[-3000:]
    cfg = load_config(str(run_dir / "config.yaml"))
    assert cfg.net.replay_addr.startswith(f"tcp://{host_ip(1)}:"), cfg.net.replay_addr
    records = [json.loads(line) for line in (run_dir / "result.json").read_text().splitlines()]
    assert records[-1]["done"] and records[-1]["learner_updates"] > 0, records[-1]
    hosts_of = {r["name"]: r.get("host") for r in roles_of(run_dir).values()}
    assert {hosts_of[n] for n in ("replay", "params", "learner")} == {host_ip(1)}, hosts_of
    assert {hosts_of[n] for n in ("actor_0", "actor_1")} <= {host_ip(2), host_ip(3)}, hosts_of
    # The roles' lines reached the job's log prefixed with their role and node (Ray names the
    # node of a line from another node than the driver's, which runs on the head here).
    prefixes = set(re.findall(r"\((\w+) pid=\d+(?:, ip=([\d.]+))?\)", output))
    assert {node for role, node in prefixes if role == "learner"} <= {"", host_ip(1)}, prefixes
    actor_nodes = {node for role, node in prefixes if role.startswith("actor_")}
    assert actor_nodes and actor_nodes <= {host_ip(2), host_ip(3)}, prefixes
    # Every role's process has gone, on every host, once the job has ended.
    assert wait_until(lambda: not run_processes(run_dir), 30, 0.5), run_processes(run_dir)

    # Ray itself, stopped on each host by the PIDs in its namespace.
    for host in range(1, NUM_HOSTS + 1):
        assert namespace_pids(f"{netns_hosts}-{host}"), f"no Ray process on host {host}"
        assert not stop_namespace(f"{netns_hosts}-{host}")
    print(
        f"\nray job on 3 hosts: {records[-1]['env_steps']} env steps, "
        f"{records[-1]['learner_updates']} updates in {records[-1]['time_s']:.0f} s; "
        f"roles by host {hosts_of}"
    )

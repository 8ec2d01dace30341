"""Actor env steps/s against the raw step rates of CartPole's vector envs, from the same run.

For each number of envs, in this process and with random actions and no inference, the raw rate of:

- ``vector``: gymnasium's numpy ``CartPoleVectorEnv`` (``make_vec`` with the id's vector entry
  point), the fastest CartPole there is here;
- ``sync``: a ``SyncVectorEnv`` of single CartPole envs in ``SAME_STEP`` autoreset mode (what
  every actor stepped before apexrl used the vector entry point);
- ``actor_env``: ``apexrl.envs.make_vector_env``, the env the actor steps (the vector env reset
  in the same step, ``CartPoleSameStep``, from ``MIN_ENVS_FOR_VECTOR_ENTRY_POINT`` envs on; the
  sync one below).

Then one real actor process (``apexrl actor``) with that many CartPole envs, batched CPU inference,
sending its transitions to a real replay server process (no rate limit: ``samples_per_insert = 0``,
a large capacity) and reading weights from a real parameter server process, which this script
fills with a ``PublishParams`` of a freshly built network. The actor's rate is the replay server's
count of inserted transitions (``replay/num_inserted`` in ``Stats``): every env step becomes one
transition, so it is env steps/s that reached replay. ``actor_cpu`` is the same count per CPU
second the actor process used (``/proc``), a figure less sensitive to other load on the machine.

Each rate is the best of several short windows within ``--seconds``: on a shared machine the best
window is the one least disturbed by other processes, for the raw envs and the actor alike.
Finally the actor runs once more under cProfile at the largest number of envs, and the functions
with the largest share of its own time are printed.

    python benchmarks/actor_throughput.py [--seconds 10] [--envs 1 16 64] [--no-profile]
"""

from __future__ import annotations

import argparse
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import zmq
from harness import free_addr, start, stop

from apexrl.config import load_config
from apexrl.envs import make_vector_env
from apexrl.models import build_q_network, params_to_arrays
from apexrl.transport import sockets
from apexrl.transport.messages import PublishAck, PublishParams, Stats, StatsRequest

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "apex_dqn_cartpole.yaml"
SERVER_SETTINGS = ["replay.samples_per_insert=0", "replay.capacity=2000000"]
NUM_WINDOWS = 5  # windows per figure; the best counts
PROFILE_LINES = 14


def vector_entry_point_env(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point")


def sync_env(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    return gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
    )


def raw_steps_per_s(envs: gym.vector.VectorEnv, num_envs: int, seconds: float) -> float:
    """Env steps/s of ``envs`` stepped with random actions and no inference (best window)."""
    try:
        rng = np.random.default_rng(0)
        actions = rng.integers(0, 2, size=(1024, num_envs))
        envs.reset(seed=0)
        for i in range(50):  # warm-up
            envs.step(actions[i])
        best, steps = 0.0, 0
        for _ in range(NUM_WINDOWS):
            window_steps, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds / NUM_WINDOWS:
                for i in range(32):
                    envs.step(actions[(steps + i) % 1024])
                steps += 32
                window_steps += 32
            best = max(best, window_steps * num_envs / (time.perf_counter() - started))
        return best
    finally:
        envs.close()


def request(sock: zmq.Socket, msg, timeout_ms: int = 10_000):
    sockets.send(sock, msg)
    reply = sockets.recv(sock, timeout_ms)
    if reply is None:
        raise RuntimeError(f"no reply to {type(msg).__name__} within {timeout_ms} ms")
    return reply


def publish_fresh_weights(sock: zmq.Socket, config: Path) -> None:
    cfg = load_config(config)
    envs = gym.make(cfg.env.id)
    obs_shape, num_actions = envs.observation_space.shape, int(envs.action_space.n)
    envs.close()
    net = build_q_network(obs_shape, num_actions, cfg.algo.hidden_sizes, cfg.algo.dueling)
    # The parameter server builds its weights layout (imports torch) before it answers.
    reply = request(sock, PublishParams(0, 0, params_to_arrays(net)), timeout_ms=60_000)
    if not isinstance(reply, PublishAck):
        raise RuntimeError(f"parameter server did not acknowledge the weights: {reply!r}")


def num_inserted(sock: zmq.Socket) -> tuple[float, float]:
    """(replay/num_inserted, time of the reply)."""
    reply = request(sock, StatsRequest())
    if not isinstance(reply, Stats):
        raise RuntimeError(f"replay answered StatsRequest with {reply!r}")
    return reply.values["replay/num_inserted"], time.perf_counter()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds that process ``pid`` has used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_actor(
    num_envs: int,
    seconds: float,
    common: list[str],
    stats_sock: zmq.Socket,
    workdir: Path,
    launch: Callable[[list[str], Path], subprocess.Popen] = start,
) -> tuple[float, float]:
    """(env steps/s, env steps per CPU second) of one actor process with ``num_envs`` envs, as
    seen by the replay server: the best of ``NUM_WINDOWS`` windows after a warm-up."""
    log = workdir / f"actor_{num_envs}.log"
    actor = launch(
        ["actor", *common, "--set", f"env.num_envs={num_envs}", "--run-dir", str(workdir)], log
    )
    try:
        before, _ = num_inserted(stats_sock)
        deadline = time.monotonic() + 60
        while num_inserted(stats_sock)[0] == before:  # started, has weights, sends chunks
            if actor.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"actor did not start; see {log}")
            time.sleep(0.1)
        time.sleep(min(1.0, seconds / 2))  # warm-up
        best = best_cpu = 0.0
        for _ in range(NUM_WINDOWS):
            count0, t0 = num_inserted(stats_sock)
            cpu0 = cpu_seconds(actor.pid)
            time.sleep(seconds / NUM_WINDOWS)
            count1, t1 = num_inserted(stats_sock)
            cpu1 = cpu_seconds(actor.pid)
            best = max(best, (count1 - count0) / (t1 - t0))
            best_cpu = max(best_cpu, (count1 - count0) / max(cpu1 - cpu0, 1e-3))
        if actor.poll() is not None:
            raise RuntimeError(f"actor exited with {actor.returncode} while being measured")
    finally:
        stop([actor])
    return best, best_cpu


# Runs ``apexrl <args>`` under cProfile counting CPU time (waits on sockets cost none), with the
# imports done before the profile starts; the profile is written when the role returns.
PROFILED_ROLE = """
import cProfile, sys, time
import apexrl.actor, apexrl.algos.apex_dqn, apexrl.cli
profiler = cProfile.Profile(time.process_time)
code = profiler.runcall(apexrl.cli.main, sys.argv[2:])
profiler.dump_stats(sys.argv[1])
sys.exit(code)
"""


def profiled(profile_path: Path) -> Callable[[list[str], Path], subprocess.Popen]:
    """A ``harness.start`` that runs the role under cProfile (``PROFILED_ROLE``)."""

    def launch(args: list[str], log: Path) -> subprocess.Popen:
        command = [sys.executable, "-c", PROFILED_ROLE, str(profile_path), *args]
        return subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)

    return launch


def print_profile(profile_path: Path, num_envs: int) -> None:
    """The functions with the largest own time in the actor's profile, as shares of the loop's."""
    stats = pstats.Stats(str(profile_path))
    rows = []
    for (filename, line, name), (_, calls, own_s, _, _) in stats.stats.items():
        where = f"{Path(filename).name}:{line}({name})" if line else name
        rows.append((own_s, calls, where))
    total = sum(own for own, _, _ in rows)
    rows.sort(reverse=True)
    print(f"\nProfile of the actor at {num_envs} envs (cProfile, own CPU time after the imports):")
    print(f"{'share':>7} {'calls':>9}  function")
    for own_s, calls, where in rows[:PROFILE_LINES]:
        print(f"{own_s / total:>6.1%} {calls:>9}  {where}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measuring time per figure")
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 16, 64], help="env.num_envs")
    parser.add_argument("--config", type=Path, default=CONFIG, help="an Ape-X CartPole config")
    parser.add_argument(
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="profile the actor at the largest number of envs",
    )
    args = parser.parse_args()
    env_id = load_config(args.config).env.id
    workdir = Path(tempfile.mkdtemp(prefix="apexrl-bench-actor-"))
    replay_addr, params_addr = free_addr(), free_addr()
    # The servers check a chunk's size against chunk_steps x env.num_envs: the largest measured.
    server_settings = [*SERVER_SETTINGS, f"env.num_envs={max(args.envs)}"]
    settings = [arg for s in server_settings for arg in ("--set", s)]
    servers = [
        start(["replay", "--config", str(args.config), *settings, "--bind", replay_addr,
               "--run-dir", str(workdir)], workdir / "replay.log"),
        start(["params", "--config", str(args.config), *settings, "--bind", params_addr,
               "--run-dir", str(workdir)], workdir / "params.log"),
    ]  # fmt: skip
    common = ["--config", str(args.config), "--replay", replay_addr, "--params", params_addr]
    ctx = sockets.make_context()
    rows = []
    profile_path = workdir / "actor.prof"
    cfg = load_config(args.config)
    try:
        replay_sock = sockets.connect(ctx, zmq.DEALER, replay_addr)
        params_sock = sockets.connect(ctx, zmq.DEALER, params_addr)
        publish_fresh_weights(params_sock, args.config)
        for num_envs in args.envs:
            vector = raw_steps_per_s(
                vector_entry_point_env(env_id, num_envs), num_envs, args.seconds
            )
            sync = raw_steps_per_s(sync_env(env_id, num_envs), num_envs, args.seconds)
            own = raw_steps_per_s(make_vector_env(cfg.env, num_envs), num_envs, args.seconds)
            actor, actor_cpu = run_actor(num_envs, args.seconds, common, replay_sock, workdir)
            rows.append((num_envs, vector, sync, own, actor, actor_cpu))
        if args.profile:
            launch = profiled(profile_path)
            run_actor(max(args.envs), args.seconds / 2, common, replay_sock, workdir, launch)
    finally:
        ctx.destroy(linger=0)
        stop(servers)
    print(
        f"\nActor throughput, {env_id}, 1 actor process, CPU inference, best of {NUM_WINDOWS} "
        f"windows in {args.seconds:g} s per figure (logs in {workdir}); load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(
        f"{'envs':>5} {'vector':>9} {'sync':>9} {'actor_env':>9} {'actor':>9} "
        f"{'/vector':>7} {'/actor_env':>10} {'actor_cpu':>9}"
    )
    for num_envs, vector, sync, own, actor, actor_cpu in rows:
        print(
            f"{num_envs:>5} {vector:>9.0f} {sync:>9.0f} {own:>9.0f} {actor:>9.0f} "
            f"{actor / vector:>7.3f} {actor / own:>10.3f} {actor_cpu:>9.0f}"
        )
    print(
        "(env steps/s; vector: CartPoleVectorEnv, sync: SyncVectorEnv of single envs, "
        "actor_env: the env the actor steps; actor_cpu: actor env steps per CPU second)"
    )
    if args.profile and profile_path.exists():
        print_profile(profile_path, max(args.envs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Actor env steps/s against the raw step rate of the same gymnasium vector env.

For each number of envs: first the raw rate of ``apexrl.envs.make_vector_env`` (SAME_STEP
autoreset) stepped with random actions and no inference, in this process; then one real actor
process (``apexrl actor``) with that many CartPole envs, batched CPU inference, sending its
transitions to a real replay server process (no rate limit: ``samples_per_insert = 0``, a large
capacity) and reading weights from a real parameter server process, which this script fills with a
``PublishParams`` of a freshly built network. The actor's rate is the replay server's count of
inserted transitions (``replay/num_inserted`` in ``Stats``) over the measuring window: every env
step becomes one transition, so it is env steps/s that reached replay. Both rates come from this
same run, and the table gives their ratio.

    python benchmarks/actor_throughput.py [--seconds 10] [--envs 1 16 64]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
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


def raw_steps_per_s(num_envs: int, seconds: float) -> float:
    """Env steps/s of the actor's vector env with random actions and no inference."""
    cfg = load_config(CONFIG)
    envs = make_vector_env(cfg.env, num_envs)
    try:
        rng = np.random.default_rng(0)
        actions = rng.integers(0, 2, size=(1024, num_envs))
        envs.reset(seed=0)
        for i in range(50):  # warm-up
            envs.step(actions[i])
        steps, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            for i in range(64):
                envs.step(actions[(steps + i) % 1024])
            steps += 64
        return steps * num_envs / (time.perf_counter() - started)
    finally:
        envs.close()


def request(sock: zmq.Socket, msg, timeout_ms: int = 10_000):
    sockets.send(sock, msg)
    reply = sockets.recv(sock, timeout_ms)
    if reply is None:
        raise RuntimeError(f"no reply to {type(msg).__name__} within {timeout_ms} ms")
    return reply


def publish_fresh_weights(sock: zmq.Socket) -> None:
    cfg = load_config(CONFIG)
    envs = gym.make(cfg.env.id)
    obs_shape, num_actions = envs.observation_space.shape, int(envs.action_space.n)
    envs.close()
    net = build_q_network(obs_shape, num_actions, cfg.algo.hidden_sizes, cfg.algo.dueling)
    reply = request(sock, PublishParams(0, 0, params_to_arrays(net)))
    if not isinstance(reply, PublishAck):
        raise RuntimeError(f"parameter server did not acknowledge the weights: {reply!r}")


def num_inserted(sock: zmq.Socket) -> tuple[float, float]:
    """(replay/num_inserted, time of the reply)."""
    reply = request(sock, StatsRequest())
    if not isinstance(reply, Stats):
        raise RuntimeError(f"replay answered StatsRequest with {reply!r}")
    return reply.values["replay/num_inserted"], time.perf_counter()


def actor_steps_per_s(
    num_envs: int, seconds: float, common: list[str], stats_sock: zmq.Socket, workdir: Path
) -> float:
    """Env steps/s of one actor process with ``num_envs`` envs, as seen by the replay server."""
    actor = start(
        ["actor", *common, "--set", f"env.num_envs={num_envs}", "--run-dir", str(workdir)],
        workdir / f"actor_{num_envs}.log",
    )
    try:
        before, _ = num_inserted(stats_sock)
        deadline = time.monotonic() + 60
        while num_inserted(stats_sock)[0] == before:  # started, has weights, sends chunks
            if actor.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"actor did not start; see {workdir / f'actor_{num_envs}.log'}")
            time.sleep(0.1)
        time.sleep(min(1.0, seconds / 2))  # warm-up
        count0, t0 = num_inserted(stats_sock)
        time.sleep(seconds)
        count1, t1 = num_inserted(stats_sock)
        if actor.poll() is not None:
            raise RuntimeError(f"actor exited with {actor.returncode} while being measured")
    finally:
        stop([actor])
    return (count1 - count0) / (t1 - t0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measuring window per figure")
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 16, 64], help="env.num_envs")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="apexrl-bench-actor-"))
    replay_addr, params_addr = free_addr(), free_addr()
    settings = [arg for s in SERVER_SETTINGS for arg in ("--set", s)]
    servers = [
        start(["replay", "--config", str(CONFIG), *settings, "--bind", replay_addr,
               "--run-dir", str(workdir)], workdir / "replay.log"),
        start(["params", "--config", str(CONFIG), *settings, "--bind", params_addr,
               "--run-dir", str(workdir)], workdir / "params.log"),
    ]  # fmt: skip
    common = ["--config", str(CONFIG), "--replay", replay_addr, "--params", params_addr]
    ctx = sockets.make_context()
    rows = []
    try:
        replay_sock = sockets.connect(ctx, zmq.DEALER, replay_addr)
        params_sock = sockets.connect(ctx, zmq.DEALER, params_addr)
        publish_fresh_weights(params_sock)
        for num_envs in args.envs:
            raw = raw_steps_per_s(num_envs, args.seconds)
            actor = actor_steps_per_s(num_envs, args.seconds, common, replay_sock, workdir)
            rows.append((num_envs, raw, actor))
    finally:
        ctx.destroy(linger=0)
        stop(servers)
    print(
        f"\nActor throughput, CartPole-v1, 1 actor process, CPU inference, {args.seconds:g} s per "
        f"figure (logs in {workdir})"
    )
    print(f"{'envs':>6} {'raw steps/s':>12} {'actor steps/s':>14} {'ratio':>6}")
    for num_envs, raw, actor in rows:
        print(f"{num_envs:>6} {raw:>12.0f} {actor:>14.0f} {actor / raw:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

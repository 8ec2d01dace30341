"""``PolicyClient.get_action`` latency on loopback: remote and local inference, with 1 and with 64
concurrent episodes, against a live run.

One run is launched (``scripts/launch_local.sh --actors 0 --external 1 --no-eval`` with
``configs/<config>.yaml``, Ape-X DQN on CartPole by default: an asynchronous core, so that no
call waits for a rollout's training as PPO's would), with its CURVE keys. For each mode and
concurrency, that many threads each open their own ``PolicyClient`` and step their own CartPole
for ``--seconds``; every ``get_action`` is timed (``time.perf_counter`` around the call). The
figures: p50 and p99 of the calls in milliseconds and the env steps per second of all episodes
together. The learner trains on the steps meanwhile (on the same two cores): the figures are
those of a run, not of an idle server.

    python benchmarks/external_latency.py [--config apex_dqn_cartpole] [--seconds 20]
        [--episodes 1 64]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from apexrl import PolicyClient
from apexrl.external.client import policy_server_address

REPO = Path(__file__).resolve().parents[1]


def start_run(config: str, run_dir: Path, seconds: float) -> subprocess.Popen:
    args = ["--config", str(REPO / "configs" / f"{config}.yaml"), "--actors", "0"]
    args += ["--external", "1", "--no-eval", "--run-dir", str(run_dir)]
    args += ["--set", "run.stop_eval_return=null", "--set", f"run.stop_wall_s={seconds}"]
    return subprocess.Popen(
        ["bash", str(REPO / "scripts" / "launch_local.sh"), *args],
        stdout=open(run_dir.parent / "launcher.log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "PYTHON": sys.executable},
    )


def episode_loop(
    address: str, keys: str, inference: str, seconds: float, seed: int, latencies: list
) -> int:
    """Step one CartPole through one client for ``seconds``; its env steps."""
    env = gym.make("CartPole-v1")
    steps, deadline = 0, time.monotonic() + seconds
    with PolicyClient(address, inference, keys) as client:
        while time.monotonic() < deadline:
            episode = client.start_episode()
            obs, _ = env.reset(seed=seed + steps)
            while True:
                started = time.perf_counter()
                action = client.get_action(episode, obs)
                latencies.append(time.perf_counter() - started)
                obs, reward, terminated, truncated, _ = env.step(int(action))
                client.log_returns(episode, reward)
                steps += 1
                if terminated or truncated or time.monotonic() > deadline:
                    client.end_episode(episode, obs, truncated=not terminated)
                    break
    env.close()
    return steps


def measure(address: str, keys: str, inference: str, episodes: int, seconds: float) -> dict:
    latencies: list[list[float]] = [[] for _ in range(episodes)]
    steps = [0] * episodes

    def run(i: int) -> None:
        steps[i] = episode_loop(address, keys, inference, seconds, 1000 * i, latencies[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(episodes)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    calls = np.concatenate([np.asarray(x) for x in latencies]) * 1000.0
    return {
        "inference": inference,
        "episodes": episodes,
        "calls": len(calls),
        "p50_ms": float(np.percentile(calls, 50)),
        "p99_ms": float(np.percentile(calls, 99)),
        "env_steps_per_s": sum(steps) / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="apex_dqn_cartpole")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--episodes", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--keep", type=Path, help="keep the run directory here")
    args = parser.parse_args()
    torch.set_num_threads(1)  # local inference: one thread per client, as an actor infers
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = (args.keep or Path(tmp)) / "run"
        cases = [(m, n) for m in ("remote", "local") for n in args.episodes]
        launcher = start_run(args.config, run_dir, args.seconds * len(cases) + 120)
        try:
            address = policy_server_address(run_dir)
            keys = str(run_dir / "keys")
            rows = [measure(address, keys, mode, n, args.seconds) for mode, n in cases]
        finally:
            os.killpg(launcher.pid, signal.SIGTERM)
            launcher.wait(timeout=60)
    print(f"\nget_action on loopback, {args.config}, {args.seconds:.0f} s per case")
    heads = ("inference", "episodes", "calls", "p50 ms", "p99 ms", "steps/s")
    print(" ".join(f"{h:>{9 if i == 0 else 8}}" for i, h in enumerate(heads)))
    for r in rows:
        print(
            f"{r['inference']:>9} {r['episodes']:>8} {r['calls']:>8} {r['p50_ms']:>8.3f} "
            f"{r['p99_ms']:>8.3f} {r['env_steps_per_s']:>8.0f}"
        )


if __name__ == "__main__":
    main()

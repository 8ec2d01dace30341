"""Drive an environment from your own process: CartPole stepped here, its actions from a run's
policy server.

Run it from the repository root (about 20 s on two cores):

    python3 examples/external_env_client.py

It starts a PPO CartPole run whose actors are all external, the command you would type in a
shell of its own:

    apexrl local --config configs/ppo_cartpole.yaml --actors 0 --external 1

then reads the policy server's address from the run's ``roles.json`` (the ``addr`` of the role
``external_0``, also in the launcher's log) and the run's keys from ``<run dir>/keys``, and
plays CartPole episodes through ``PolicyClient`` until the run stops itself (its evaluation
reached 475) or ``--seconds`` have passed. It prints each ten episodes' mean return and the
run's last evaluation. ``--run-dir RUN`` drives a run already started instead; ``--inference
local`` acts in this process with the run's newest weights instead of asking the server.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym

from apexrl import PolicyClient
from apexrl.external.client import ExternalError, policy_server_address


def play(client: PolicyClient, env: gym.Env, seed: int) -> float:
    """One episode; its return."""
    episode = client.start_episode()
    obs, _ = env.reset(seed=seed)
    episode_return = 0.0
    while True:
        action = client.get_action(episode, obs)
        obs, reward, terminated, truncated, _ = env.step(int(action))
        client.log_returns(episode, reward)
        episode_return += reward
        if terminated or truncated:
            client.end_episode(episode, obs, truncated=truncated)
            return episode_return


def start_run(run_dir: Path) -> subprocess.Popen:
    """``apexrl local`` with one policy server and no actors, in its own session."""
    command = [sys.executable, "-m", "apexrl", "local", "--config", "configs/ppo_cartpole.yaml"]
    command += ["--actors", "0", "--external", "1", "--run-dir", str(run_dir)]
    run_dir.mkdir(parents=True)
    log = open(run_dir / "launcher.log", "w")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def drive(run_dir: Path, inference: str, seconds: float) -> None:
    """Play episodes through the run's policy server until the run ends or time is up."""
    address = policy_server_address(run_dir)
    keys = run_dir / "keys"
    env = gym.make("CartPole-v1")
    started, returns = time.monotonic(), []
    try:
        with PolicyClient(address, inference, str(keys) if keys.is_dir() else "", 10) as client:
            while time.monotonic() - started < seconds:
                returns.append(play(client, env, seed=len(returns)))
                if len(returns) % 10 == 0:
                    mean = sum(returns[-10:]) / 10
                    print(f"episodes {len(returns)}: mean return {mean:.1f}", flush=True)
    except ExternalError as exc:  # the run ended and its policy server went away
        print(f"stopped: {exc}", flush=True)
    finally:
        env.close()
    print(f"played {len(returns)} episodes in {time.monotonic() - started:.0f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, help="a run already started (default: start one)")
    parser.add_argument("--inference", choices=("remote", "local"), default="remote")
    parser.add_argument("--seconds", type=float, default=300.0)
    args = parser.parse_args()
    if args.run_dir is not None:
        drive(args.run_dir, args.inference, args.seconds)
        return
    run_dir = Path("runs/examples") / f"external-{time.strftime('%Y%m%d-%H%M%S')}"
    launcher = start_run(run_dir)
    try:
        drive(run_dir, args.inference, args.seconds)
        launcher.wait(timeout=60)  # the run stops itself at its evaluation threshold
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGTERM)
            launcher.wait(timeout=60)
    last = json.loads((run_dir / "result.json").read_text().splitlines()[-1])
    evaluation, steps = last["eval_return_mean"], last["env_steps"]
    print(f"run {run_dir}: evaluation {evaluation} after {steps} env steps")


if __name__ == "__main__":
    main()

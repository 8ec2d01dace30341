"""Drive an environment from your own process: CartPole stepped here, its actions from a run's
policy server.

Start a run whose actors are all external (one policy server, no actors of its own):

    apexrl local --config configs/ppo_cartpole.yaml --actors 0 --external 1

and, while it runs, from another shell (the run directory is in the launcher's first lines):

    python3 examples/external_env_client.py --run-dir runs/ppo-CartPole-v1-<time>

The client reads the policy server's address from the run's ``roles.json`` (the ``addr`` of the
role ``external_0``, also in the launcher's log) and the run's keys from ``<run dir>/keys``. It
plays episodes until the run ends (the run stops itself when its evaluation reaches 475) or
``--seconds`` have passed, and prints each ten episodes' mean return. ``--inference local``
acts in this process with the run's newest weights instead of asking the server each step.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import gymnasium as gym

from apexrl import PolicyClient
from apexrl.external.client import ExternalError


def policy_server_address(run_dir: Path, index: int = 0, timeout_s: float = 60.0) -> str:
    """The ``addr`` of role ``external_<index>`` in the run's ``roles.json``, once it is there."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            roles = json.loads((run_dir / "roles.json").read_text())["roles"]
            for role in roles:
                if role["name"] == f"external_{index}" and role["state"] == "running":
                    return role["addr"]
        except (OSError, ValueError, KeyError):
            pass  # not written yet, or being replaced
        time.sleep(0.5)
    raise SystemExit(f"no running policy server external_{index} in {run_dir}/roles.json")


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--inference", choices=("remote", "local"), default="remote")
    parser.add_argument("--seconds", type=float, default=300.0)
    args = parser.parse_args()
    address = policy_server_address(args.run_dir)
    keys = args.run_dir / "keys"
    env = gym.make("CartPole-v1")
    started, returns = time.monotonic(), []
    try:
        with PolicyClient(address, args.inference, str(keys) if keys.is_dir() else "") as client:
            while time.monotonic() - started < args.seconds:
                returns.append(play(client, env, seed=len(returns)))
                if len(returns) % 10 == 0:
                    mean = sum(returns[-10:]) / 10
                    print(f"episodes {len(returns)}: mean return {mean:.1f}", flush=True)
    except ExternalError as exc:  # the run ended and its policy server went away
        print(f"stopped: {exc}", flush=True)
    finally:
        env.close()
    print(f"played {len(returns)} episodes in {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()

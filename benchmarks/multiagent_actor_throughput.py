"""The multi-agent actor's agent steps/s against the single-agent actor's env steps/s, with as many
agent slots, from the same run.

Both actors play CartPole's dynamics with Ape-X DQN's actor core (batched CPU inference, n-step
transitions and their initial priorities, one chunk in flight to a real replay server, weights
from a real parameter server), so what differs is the multi-agent path alone: PettingZoo's
Parallel API, the seats, one forward pass per policy over every agent of every env, the lanes and
their cuts. Every agent step (every env step of the single-agent actor) becomes one transition,
so each rate is the replay server's count of inserted transitions per second
(``replay/num_inserted``), with the same per CPU second of the actor process:

- ``multi-agent``: ``apexrl.multiagent.tasks:cartpoles`` (``K`` CartPoles as the agents of one
  Parallel env), ``N`` envs per actor, one policy shared by the ``K`` agents: ``N * K`` slots;
- ``single-agent, sync``: ``N * K`` CartPole envs made from their entry point (a
  ``SyncVectorEnv`` of single envs: the same Python per pole as the multi-agent envs);
- ``single-agent, vector``: ``N * K`` envs of ``CartPole-v1``, gymnasium's numpy vector env (the
  fastest CartPole there is, what the CartPole configs step).

Each rate is the best of several windows (``benchmarks/actor_throughput.py``, whose functions it
uses); run it on a quiet machine.

    python benchmarks/multiagent_actor_throughput.py [--seconds 10] [--envs 8] [--agents 3]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import yaml
import zmq
from actor_throughput import request, run_actor
from harness import free_addr, start, stop

from apexrl.config import load_config
from apexrl.envs.spaces import network_spaces
from apexrl.models import params_to_arrays
from apexrl.multiagent.policies import policy_config, policy_spaces
from apexrl.transport import sockets
from apexrl.transport.messages import PublishAck, PublishParams

REPO = Path(__file__).resolve().parents[1]
BASE = REPO / "configs" / "apex_dqn_cartpole.yaml"
SERVER_SETTINGS = ["replay.samples_per_insert=0", "replay.capacity=2000000"]


def write_configs(workdir: Path, num_envs: int, num_agents: int) -> dict[str, Path]:
    """The three actors' configs, from the Ape-X CartPole config."""
    base = yaml.safe_load(BASE.read_text())
    base["run"] = {"stop_eval_return": None}
    multi = {
        **base,
        "env": {
            "id": "apexrl.multiagent.tasks:cartpoles",
            "kwargs": {"num_agents": num_agents},
            "num_envs": num_envs,
        },
        "multiagent": {
            "policies": [{"name": "shared"}],
            "mapping": [{"agents": "*", "policy": "shared"}],
        },
    }
    slots = num_envs * num_agents
    sync_env = {"id": "gymnasium.envs.classic_control:CartPoleEnv", "max_episode_steps": 500}
    sync = {**base, "env": {**sync_env, "num_envs": slots}}
    vector = {**base, "env": {"id": "CartPole-v1", "num_envs": slots}}
    paths = {}
    for name, cfg in (("multi-agent", multi), ("single-agent, sync", sync),
                      ("single-agent, vector", vector)):  # fmt: skip
        path = workdir / f"{name.replace(', ', '_')}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        paths[name] = path
    return paths


def publish_fresh_weights(sock: zmq.Socket, config: Path) -> None:
    """Fresh weights of the config's network (a multi-agent config's one policy, under its
    name), as a learner publishes its first."""
    from apexrl.algos import load_algorithm

    cfg, policy = load_config(config), ""
    if cfg.multiagent.enabled:
        policy = "shared"
        cfg = policy_config(cfg, policy, policy_spaces(cfg)[policy])
    net = load_algorithm(cfg.algorithm).make_network(*network_spaces(cfg), cfg)
    reply = request(sock, PublishParams(0, 0, params_to_arrays(net), policy=policy), 60_000)
    if not isinstance(reply, PublishAck):
        raise RuntimeError(f"parameter server did not acknowledge the weights: {reply!r}")


def measure(name: str, config: Path, seconds: float, workdir: Path) -> tuple[float, float]:
    """(steps/s, steps per CPU second) of one actor of ``config`` through real servers."""
    replay_addr, params_addr = free_addr(), free_addr()
    settings = [arg for s in SERVER_SETTINGS for arg in ("--set", s)]
    where = workdir / name.replace(", ", "_")
    where.mkdir()
    servers = [
        start(["replay", "--config", str(config), *settings, "--bind", replay_addr,
               "--run-dir", str(where)], where / "replay.log"),
        start(["params", "--config", str(config), *settings, "--bind", params_addr,
               "--run-dir", str(where)], where / "params.log"),
    ]  # fmt: skip
    ctx = sockets.make_context()
    try:
        params = sockets.connect(ctx, zmq.DEALER, params_addr)
        stats = sockets.connect(ctx, zmq.DEALER, replay_addr)
        with sockets.closing(params, stats, ctx):
            publish_fresh_weights(params, config)
            common = ["--config", str(config), "--replay", replay_addr, "--params", params_addr]
            common += settings
            num_envs = load_config(config).env.num_envs
            return run_actor(num_envs, seconds, common, stats, where)
    finally:
        stop(servers)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measuring time per actor")
    parser.add_argument("--envs", type=int, default=8, help="multi-agent envs per actor (N)")
    parser.add_argument("--agents", type=int, default=3, help="agents per env (K)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="apexrl-bench-ma-actor-"))
    configs = write_configs(workdir, args.envs, args.agents)
    slots = args.envs * args.agents
    print(
        f"Ape-X actor, CartPole dynamics, {slots} slots ({args.envs} envs x {args.agents} agents "
        f"for the multi-agent actor); transitions reaching replay per second (best of windows "
        f"within {args.seconds:g} s); logs in {workdir}"
    )
    rows = {name: measure(name, path, args.seconds, workdir) for name, path in configs.items()}
    print(f"\n{'actor':<24} {'steps/s':>10} {'per CPU s':>10} {'vs multi-agent':>15}")
    multi = rows["multi-agent"][0]
    for name, (rate, per_cpu) in rows.items():
        unit = "agent" if name == "multi-agent" else "env"
        print(f"{name:<24} {rate:>10,.0f} {per_cpu:>10,.0f} {rate / multi:>14.2f}x  ({unit} steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

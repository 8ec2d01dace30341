"""A two-player game's policy against a named fixed opponent, in both seats (``apexrl evaluate
--opponent``): the run's config with the policy in the first seat and the opponent in the other
in even episodes, the seats swapped in odd ones, judged by the policy's return.

The opponent is a fixed player: ``random`` or a scripted ``module:Class``
(``apexrl.multiagent.fixed``), never one of the training games' players, so what it measures is
read from evaluation episodes alone.
"""

from __future__ import annotations

from apexrl.config import Config, ConfigError, config_from_dict, config_to_dict
from apexrl.multiagent.envs import make_pettingzoo_env

OPPONENT = "opponent"  # the fixed player's policy name (another when the run has one of that name)


def opponent_config(cfg: Config, policy: str | None, opponent: str) -> Config:
    """``cfg`` with network policy ``policy`` (default: the first trained one) against fixed
    player ``opponent`` in both seats (module docstring); ``ConfigError`` naming what does not
    fit (not two agents, not a network policy, an opponent that is no fixed player)."""
    env = make_pettingzoo_env(cfg.env)
    try:
        agents = list(env.possible_agents)
    finally:
        env.close()
    if len(agents) != 2:
        raise ConfigError(
            f"--opponent plays two-player games; {cfg.env.id} has {len(agents)} agents"
        )
    name = policy or cfg.multiagent.trained[0]
    if name not in cfg.multiagent.networks:
        raise ConfigError(
            f"{name!r} is not a network policy of this run ({', '.join(cfg.multiagent.networks)})"
        )
    rival = OPPONENT if name != OPPONENT else f"{OPPONENT}_"
    first, second = agents
    data = config_to_dict(cfg)
    spec = next(s for s in data["multiagent"]["policies"] if s["name"] == name)
    data["multiagent"] = {
        "policies": [{**spec, "agents": ""}, {"name": rival, "fixed": opponent}],
        "mapping": [
            {"agents": first, "policy": name, "episodes": "even"},
            {"agents": second, "policy": rival, "episodes": "even"},
            {"agents": second, "policy": name, "episodes": "odd"},
            {"agents": first, "policy": rival, "episodes": "odd"},
        ],
        "mapping_fn": "",
        "policies_to_train": [name],
        "judge": f"policy:{name}",
    }
    return config_from_dict(data)

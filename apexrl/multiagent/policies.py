"""The policies of a multi-agent run as the roles use them: who plays which agent, what each
policy's spaces are, and each network policy's own config.

- ``PolicyMap``: the policy of an agent in an episode, from the mapping table or the user's
  ``mapping_fn`` (``multiagent.config``); a name that is not a policy is an error that says so.
- ``policy_spaces``: each policy's observation and action spaces, those of the agents it plays;
  agents of one policy must share them (different policies may differ).
- ``policy_config``: the run's config as one network policy sees it. Its ``algo`` is the run's
  with the policy's overrides, its replay table is named after it, and its *lanes* are its envs:
  an actor keeps one lane per agent slot of its envs that the policy can play (``num_lanes``), and
  everything that counts per env (a chunk's items, PPO's rollout of one unroll per env and actor,
  replay's bounds) counts per lane. ``algo.action_mask`` is set when its agents bring masks,
  ``algo.policy_obs_dim`` when its critic reads the team's observations (``critic: team``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Callable
from typing import NamedTuple

import gymnasium as gym
import numpy as np

from apexrl.config import Config, ConfigError, config_from_dict, config_to_dict
from apexrl.config.algos import ALGORITHM_CONFIGS
from apexrl.config.rules import FIXED_CHECKPOINT
from apexrl.envs import EnvError
from apexrl.multiagent.config import load_function
from apexrl.multiagent.envs import agent_views, make_pettingzoo_env, team_space
from apexrl.multiagent.fixed import make_fixed_policy

# The families whose value can read more than their policy: those with algo.policy_obs_dim
TEAM_CRITIC_ALGORITHMS = tuple(
    name
    for name, algo in ALGORITHM_CONFIGS.items()
    if "policy_obs_dim" in {f.name for f in dataclasses.fields(algo)}
)


class PolicyMap:
    """Agent -> policy name, per episode."""

    def __init__(self, cfg: Config) -> None:
        self.ma = cfg.multiagent
        self.names = set(self.ma.names)
        self.fn: Callable[[str, int], str] | None = None
        if self.ma.mapping_fn:
            self.fn = load_function("multiagent.mapping_fn", self.ma.mapping_fn)

    def __call__(self, agent: str, episode: int) -> str:
        if self.fn is None:
            name = self.ma.table_policy(agent, episode)
            if name is None:
                raise EnvError(f"multiagent.mapping has no rule for agent {agent!r}")
            return name
        name = self.fn(agent, episode)
        if name not in self.names:
            raise EnvError(
                f"multiagent.mapping_fn gave {name!r} for agent {agent!r}, which is not a "
                f"policy ({', '.join(sorted(self.names))})"
            )
        allowed = self.ma.spec(name).agents
        if allowed and not fnmatch.fnmatchcase(agent, allowed):
            raise EnvError(
                f"multiagent.mapping_fn seats policy {name!r} at agent {agent!r}, outside the "
                f"agents {allowed!r} it may play"
            )
        return name


def policy_agents(cfg: Config, possible_agents: list[str]) -> dict[str, list[str]]:
    """Each policy's agents: those its ``agents`` pattern names, else those the table maps to
    it."""
    ma = cfg.multiagent
    found = {}
    for spec in ma.policies:
        if spec.agents:
            agents = [a for a in possible_agents if fnmatch.fnmatchcase(a, spec.agents)]
        else:
            agents = [a for a in possible_agents if spec.name in ma.table_policies(a)]
        found[spec.name] = agents
    for agent in possible_agents:
        for episode in (0, 1):
            if not ma.mapping_fn and ma.table_policy(agent, episode) is None:
                raise ConfigError(
                    f"multiagent.mapping has no rule for agent {agent!r} in "
                    f"{'even' if episode == 0 else 'odd'} episodes"
                )
    return found


class PolicySpaces(NamedTuple):
    """What a policy plays with: its agents' spaces, whether they bring action masks, the agents."""

    obs_space: gym.Space  # a team critic's: the agent's own observation, then the team's
    action_space: gym.Space
    masked: bool
    agents: list[str]
    policy_obs_dim: int = 0  # a team critic's: the size of the agent's own part; 0: all of it


def policy_spaces(cfg: Config) -> dict[str, PolicySpaces]:
    """Each policy's spaces (those its agents share; with ``critic: team``, the observation
    followed by ``envs.team_space``); ``ConfigError`` when a policy's agents differ or it has
    none."""
    env = make_pettingzoo_env(cfg.env)
    try:
        possible = list(env.possible_agents)
        views = agent_views(env)
        actions = {agent: env.action_space(agent) for agent in possible}
    finally:
        env.close()
    found = {}
    team_critics = cfg.multiagent.team_critics
    for name, agents in policy_agents(cfg, possible).items():
        if not agents:
            raise ConfigError(
                f"policy {name!r} plays none of the env's agents ({', '.join(possible)})"
            )
        first = agents[0]
        for agent in agents[1:]:
            for what, a, b in (
                ("observation", views[first].space, views[agent].space),
                ("action", actions[first], actions[agent]),
            ):
                if a != b:
                    raise ConfigError(
                        f"policy {name!r} plays agents with different {what} spaces: {first} "
                        f"{a}, {agent} {b}; give them different policies"
                    )
        own = views[first].space
        masked = views[first].masked
        if name not in team_critics:
            found[name] = PolicySpaces(own, actions[first], masked, agents)
            continue
        try:
            team = team_space(views)
        except EnvError as exc:
            raise ConfigError(f"policy {name!r}: {exc}") from exc
        joined = gym.spaces.Box(
            np.concatenate([own.low, team.low]), np.concatenate([own.high, team.high])
        )
        found[name] = PolicySpaces(joined, actions[first], masked, agents, int(own.shape[0]))
    return found


def agents_per_env(spaces: dict[str, PolicySpaces]) -> int:
    """The agents of an env that some policy plays (``policy_spaces``' agents, together)."""
    return len({agent for found in spaces.values() for agent in found.agents})


def num_lanes(cfg: Config, agents: list[str]) -> int:
    """An actor's lanes of a policy: one per agent slot it can play in each env."""
    return cfg.env.num_envs * len(agents)


def policy_config(cfg: Config, name: str, spaces: PolicySpaces) -> Config:
    """The run's config as network policy ``name`` sees it (module docstring), ``spaces`` its
    ``policy_spaces``."""
    spec = cfg.multiagent.spec(name)
    data = config_to_dict(cfg)
    algo = {**data["algo"], **spec.algo}
    if spaces.masked:
        algo["action_mask"] = True
    if spaces.policy_obs_dim:
        if cfg.algorithm not in TEAM_CRITIC_ALGORITHMS:
            raise ConfigError(
                f"policy {name!r}: critic team is an actor-critic's option "
                f"({', '.join(TEAM_CRITIC_ALGORITHMS)}), not {cfg.algorithm}'s"
            )
        algo["policy_obs_dim"] = spaces.policy_obs_dim
    data["algo"] = algo
    data["replay"]["table"] = name
    data["env"]["num_envs"] = num_lanes(cfg, spaces.agents)
    try:
        return config_from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"policy {name!r}: {exc}") from exc


def policy_configs(cfg: Config) -> dict[str, Config]:
    """Every network policy's ``policy_config``, in the order of ``multiagent.policies``."""
    spaces = policy_spaces(cfg)
    return {name: policy_config(cfg, name, spaces[name]) for name in cfg.multiagent.networks}


def network_policy_spaces(cfg: Config, name: str) -> tuple[gym.Space, gym.Space]:
    """The observation and action spaces of network policy ``name``."""
    if name not in cfg.multiagent.networks:
        raise ConfigError(f"{name!r} is not a network policy of this run")
    found = policy_spaces(cfg)[name]
    return found.obs_space, found.action_space


def check_policies(cfg: Config) -> None:
    """What every role of a multi-agent run would find wrong, found once (the launcher's
    preflight): the env made and reset, each policy's agents, spaces and config, each network
    policy's action space against its algorithm, each scripted policy made. Raises ``EnvError``
    with one line."""
    from apexrl.envs import check_spaces

    env = make_pettingzoo_env(cfg.env)
    try:
        env.reset(seed=cfg.env.seed)
    except Exception as exc:
        raise EnvError(f"resetting environment {cfg.env.id!r} failed: {exc}") from exc
    finally:
        env.close()
    try:
        spaces = policy_spaces(cfg)
        for spec in cfg.multiagent.policies:
            found = spaces[spec.name]
            if spec.fixed.startswith(FIXED_CHECKPOINT):
                continue  # loaded by the launcher's checks (multiagent.checkpoint_player)
            if spec.fixed:
                make_fixed_policy(
                    spec.fixed, found.obs_space, found.action_space, np.random.default_rng(0)
                )
            else:
                policy_cfg = policy_config(cfg, spec.name, found)
                check_spaces(policy_cfg, found.obs_space, found.action_space)
    except ConfigError as exc:
        raise EnvError(str(exc)) from exc


def policy_name(cfg: Config, policy: str | None) -> str:
    """``policy``, checked to be a network policy of the run (None: the run's only one);
    ``ValueError`` naming them."""
    networks = cfg.multiagent.networks
    if policy is None and len(networks) == 1:
        return networks[0]
    if policy is None:
        raise ValueError(
            f"a multi-agent run has several policies (no policy given); its network policies: "
            f"{', '.join(networks)}"
        )
    if policy not in networks:
        raise ValueError(
            f"{policy!r} is not a network policy of the run; its network policies: "
            f"{', '.join(networks)}"
        )
    return policy

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
  replay's bounds) counts per lane. ``algo.action_mask`` is set when its agents bring masks.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable

import gymnasium as gym
import numpy as np

from apexrl.config import Config, ConfigError, config_from_dict, config_to_dict
from apexrl.envs import EnvError
from apexrl.multiagent.config import load_function
from apexrl.multiagent.envs import agent_views, make_pettingzoo_env
from apexrl.multiagent.fixed import make_fixed_policy


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


def policy_spaces(cfg: Config) -> dict[str, tuple[gym.Space, gym.Space, bool, list[str]]]:
    """Each policy's spaces (those its agents share), whether its agents bring action masks, and
    its agents; ``ConfigError`` when a policy's agents differ or it has none."""
    env = make_pettingzoo_env(cfg.env)
    try:
        possible = list(env.possible_agents)
        views = agent_views(env)
        actions = {agent: env.action_space(agent) for agent in possible}
    finally:
        env.close()
    found = {}
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
        masked = views[first].masked
        found[name] = (views[first].space, actions[first], masked, agents)
    return found


def agents_per_env(spaces: dict[str, tuple[gym.Space, gym.Space, bool, list[str]]]) -> int:
    """The agents of an env that some policy plays (``policy_spaces``' agents, together)."""
    return len({agent for *_, agents in spaces.values() for agent in agents})


def num_lanes(cfg: Config, agents: list[str]) -> int:
    """An actor's lanes of a policy: one per agent slot it can play in each env."""
    return cfg.env.num_envs * len(agents)


def policy_config(cfg: Config, name: str, agents: list[str], masked: bool) -> Config:
    """The run's config as network policy ``name`` sees it (module docstring)."""
    spec = cfg.multiagent.spec(name)
    data = config_to_dict(cfg)
    algo = {**data["algo"], **spec.algo}
    if masked:
        algo["action_mask"] = True
    data["algo"] = algo
    data["replay"]["table"] = name
    data["env"]["num_envs"] = num_lanes(cfg, agents)
    try:
        return config_from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"policy {name!r}: {exc}") from exc


def policy_configs(cfg: Config) -> dict[str, Config]:
    """Every network policy's ``policy_config``, in the order of ``multiagent.policies``."""
    spaces = policy_spaces(cfg)
    return {
        name: policy_config(cfg, name, spaces[name][3], spaces[name][2])
        for name in cfg.multiagent.networks
    }


def network_policy_spaces(cfg: Config, name: str) -> tuple[gym.Space, gym.Space]:
    """The observation and action spaces of network policy ``name``."""
    if name not in cfg.multiagent.networks:
        raise ConfigError(f"{name!r} is not a network policy of this run")
    obs_space, action_space, _, _ = policy_spaces(cfg)[name]
    return obs_space, action_space


def check_policies(cfg: Config) -> None:
    """What every role of a multi-agent run would find wrong, found once (the launcher's
    preflight): the env made and reset, each policy's agents, spaces and config, each network
    policy's action space against its algorithm, each scripted policy made. Raises ``EnvError``
    with one line."""
    from apexrl.envs import check_action_space

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
            obs_space, action_space, masked, agents = spaces[spec.name]
            if spec.fixed:
                make_fixed_policy(spec.fixed, obs_space, action_space, np.random.default_rng(0))
            else:
                policy_cfg = policy_config(cfg, spec.name, agents, masked)
                check_action_space(policy_cfg, action_space)
    except ConfigError as exc:
        raise EnvError(str(exc)) from exc

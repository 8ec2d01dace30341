"""The spaces a role's network is made for: those of one env of the config, as the actors make
it, or, in a multi-agent run, those of the policy whose config it is."""

from __future__ import annotations

import gymnasium as gym

from apexrl.config import Config
from apexrl.envs import check_action_space, make_vector_env


def network_spaces(cfg: Config) -> tuple[gym.Space, gym.Space]:
    """The observation and action spaces a role's network is made for, as the actors see them,
    checked against the algorithm: those of one env of ``cfg``, or, in a multi-agent run, those
    of the policy that ``cfg`` is the config of (``multiagent.policies.policy_config``: its
    replay table is named after it). Raises ``EnvError`` with one line."""
    if cfg.multiagent.enabled:
        from apexrl.multiagent.policies import network_policy_spaces

        obs_space, action_space = network_policy_spaces(cfg, cfg.replay.table)
    else:
        envs = make_vector_env(cfg.env, 1, cfg.unit_actions, cfg.product_discrete)
        obs_space, action_space = envs.single_observation_space, envs.single_action_space
        envs.close()
    check_action_space(cfg, action_space)
    return obs_space, action_space

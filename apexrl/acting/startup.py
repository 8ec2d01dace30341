"""What an acting role (the actor, the evaluation actor) builds when it starts: its vector env,
its algorithm and that algorithm's network, checked against each other before anything runs.
"""

from __future__ import annotations

import torch

from apexrl.algos import load_algorithm
from apexrl.config import Config
from apexrl.envs import EnvError, check_action_space, make_vector_env


def make_envs_and_network(cfg: Config, num_envs: int, device: str, precision: str = "fp32"):
    """An acting role's ``num_envs`` envs, its algorithm and its network on ``device`` in eval
    mode, inferring in ``precision`` (``apexrl.precision``: a training actor's
    ``actor.precision``; the evaluation actor's fp32); ``EnvError`` (envs closed) when the
    algorithm cannot act in the env's action space."""
    envs = make_vector_env(cfg.env, num_envs, cfg.unit_actions, cfg.product_discrete)
    try:
        check_action_space(cfg, envs.single_action_space)
    except EnvError:
        envs.close()
        raise
    algorithm = load_algorithm(cfg.algorithm)
    net = algorithm.make_network(envs.single_observation_space, envs.single_action_space, cfg)
    net.to(device).eval()
    if precision != "fp32":
        from apexrl import precision as numerics  # torch's autocast: training actors only

        space, where = envs.single_observation_space, torch.device(device)
        numerics.choose_and_apply(precision, where, [net], space, num_envs, False, "actor")
    return envs, algorithm, net

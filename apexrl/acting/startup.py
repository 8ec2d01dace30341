"""What an acting role (the actor, the evaluation actor) builds when it starts: its vector env,
its algorithm and that algorithm's network, checked against each other before anything runs.
"""

from __future__ import annotations

import gymnasium as gym
import torch

from apexrl.algos import load_algorithm
from apexrl.config import Config
from apexrl.envs import EnvError, check_action_space, make_vector_env
from apexrl.runtime import lifecycle


def make_envs_and_network(cfg: Config, num_envs: int, device: str, precision: str = "fp32"):
    """An acting role's ``num_envs`` envs, its algorithm and its network on ``device`` in eval
    mode, inferring in ``precision`` (``apexrl.models.precision``: a training actor's
    ``actor.precision``; the evaluation actor's fp32); ``EnvError`` (envs closed) when the
    algorithm cannot act in the env's action space."""
    envs = make_vector_env(cfg.env, num_envs, cfg.unit_actions, cfg.product_discrete)
    try:
        check_action_space(cfg, envs.single_action_space)
    except EnvError:
        envs.close()
        raise
    algorithm = load_algorithm(cfg.algorithm)
    net = make_network(
        cfg,
        envs.single_observation_space,
        envs.single_action_space,
        device,
        precision,
        num_envs,
    )
    return envs, algorithm, net


def make_network(
    cfg: Config,
    obs_space: gym.Space,
    action_space: gym.Space,
    device: str,
    precision: str,
    batch_rows: int,
) -> torch.nn.Module:
    """``cfg``'s network for these spaces on ``device`` in eval mode, inferring in
    ``precision`` (its probe on ``batch_rows`` observations at once)."""
    net = load_algorithm(cfg.algorithm).make_network(obs_space, action_space, cfg)
    net.to(device).eval()
    if precision != "fp32":
        from apexrl.models import precision as numerics  # torch's autocast: training actors only

        where = torch.device(device)
        numerics.choose_and_apply(precision, where, [net], obs_space, batch_rows, False, "actor")
    return net


def check_actor_id(cfg: Config, actor_id: int) -> None:
    if not 0 <= actor_id < cfg.actor.num_actors:
        raise lifecycle.StartupError(
            f"actor id {actor_id} is outside 0..{cfg.actor.num_actors - 1}; "
            "set actor.num_actors to the number of actors in the run"
        )

"""A multi-agent run's policies in the user's Python (``apexrl.Policy``, ``apexrl.Trainer``).

- ``policy_checkpoint``: one network policy of a run's checkpoint: its own config
  (``policies.policy_config``), its weights and their version;
- ``agent_actions``: a policy's actions for a dict of the agents it plays, ``{agent:
  observation}`` as the PettingZoo env gives them (a legal-action mask in the observation or
  none), in one forward pass: ``{agent: action}`` as the env takes them. A policy with a team
  critic acts on the agents' own observations alone: the team's part is left zero.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from apexrl.config import Config
from apexrl.multiagent.envs import ObservationView, make_pettingzoo_env
from apexrl.multiagent.players import ActionView
from apexrl.multiagent.policies import policy_name, policy_spaces


def policy_checkpoint(
    cfg: Config, checkpoint: Path, policy: str | None
) -> tuple[Config, dict[str, np.ndarray], int]:
    """Network policy ``policy`` of a multi-agent run's checkpoint: its config, weights and
    version; ``ValueError`` with one line for a missing policy or a file that is not the run's."""
    from apexrl.models import params_to_arrays
    from apexrl.multiagent.checkpoint_player import load_policy_core

    policy_cfg, core = load_policy_core(cfg, checkpoint, policy_name(cfg, policy))
    return policy_cfg, params_to_arrays(core.network), core.num_updates


def agent_actions(policy: Any, observations: dict[str, Any], explore: bool) -> dict[str, Any]:
    """``Policy.compute_actions`` of a dict of agents (module docstring)."""
    if policy.recurrent:
        raise ValueError("a recurrent policy acts on [B, *obs] arrays with its state")
    views = _views(policy)
    unknown = sorted(set(observations) - set(views))
    if unknown:
        raise ValueError(f"policy {policy.config.replay.table} plays no agent {unknown[0]!r}")
    agents = list(observations)
    seen = [views[agent].convert(observations[agent], None) for agent in agents]
    obs = np.stack([o for o, _ in seen])
    if getattr(policy.config.algo, "policy_obs_dim", 0):
        # a team critic's part of the observation, which the policy does not read
        width = policy.observation_space.shape[0] - obs.shape[1]
        obs = np.concatenate([obs, np.zeros((len(agents), width), obs.dtype)], axis=1)
    masks = None
    if any(mask is not None for _, mask in seen):
        masks = np.stack([mask for _, mask in seen])
    rows = np.arange(len(agents))
    with torch.inference_mode():
        action, _ = policy._core(explore).act(obs, masks, rows)
    view = ActionView(policy.action_space, policy.config.unit_actions)
    return {agent: view.env_action(action[k]) for k, agent in enumerate(agents)}


def _views(policy: Any) -> dict[str, ObservationView]:
    """The observation views of the agents ``policy`` plays (made once per Policy)."""
    views = getattr(policy, "_agent_views", None)
    if views is None:
        cfg = policy.config
        agents = policy_spaces(cfg)[cfg.replay.table].agents
        env = make_pettingzoo_env(cfg.env)
        try:
            views = {a: ObservationView(env.observation_space(a), a) for a in agents}
        finally:
            env.close()
        policy._agent_views = views
    return views

"""A multi-agent run's checkpoint played (``apexrl evaluate``, ``apexrl.tools.evaluate``): every
policy of the run plays its agents greedily, its weights read from the run's checkpoint
(``multiagent.learning``: every network policy's), fixed policies as they always play, for N
episodes (each env its share from a fresh reset, as the evaluation actor plays a round).
``outcome_shares``: a group's wins, draws and losses where every return is +1, 0 or -1 (a
two-player game's).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from apexrl.acting.rounds import round_quotas
from apexrl.config import Config
from apexrl.multiagent.learning import build_policy_cores
from apexrl.multiagent.players import NetworkPlayer, make_players
from apexrl.multiagent.rounds import MultiAgentRound, play_multiagent_round
from apexrl.multiagent.stepping import AgentEnvs
from apexrl.runtime import lifecycle


def outcome_shares(returns: np.ndarray) -> dict[str, float] | None:
    """Shares of +1, 0 and -1 returns (wins, draws, losses) when every return is one of them."""
    if returns.size == 0 or not np.isin(returns, (-1.0, 0.0, 1.0)).all():
        return None
    return {
        "wins": float((returns == 1.0).mean()),
        "draws": float((returns == 0.0).mean()),
        "losses": float((returns == -1.0).mean()),
    }


def load_weights(cfg: Config, checkpoint: Path, players: dict) -> dict[str, int]:
    """Every network policy's weights from ``checkpoint`` into its player; each one's version.
    Raises ``ValueError`` for a checkpoint that is not this run's."""
    from apexrl.learning.checkpoint import load_checkpoint
    from apexrl.models import arrays_to_params, params_to_arrays

    cores, _ = build_policy_cores(cfg, torch.device("cpu"), resume=False)
    load_checkpoint(checkpoint, cores, torch.device("cpu"))
    versions = {}
    for policy in cores.cores:
        player = players[policy.name]
        arrays_to_params(player.net, params_to_arrays(policy.core.network))
        player.fixed_version = versions[policy.name] = policy.core.num_updates
    return versions


def play_checkpoint(
    cfg: Config, checkpoint: Path, episodes: int, num_envs: int, seed: int
) -> tuple[MultiAgentRound, dict[str, int]]:
    """Play ``episodes`` greedy episodes of a multi-agent run's checkpoint on ``num_envs`` envs;
    the round and each network policy's version. ``ValueError`` for a checkpoint that is not
    the run's."""
    torch.set_num_threads(cfg.actor.torch_threads)
    device = lifecycle.resolve_device(cfg.actor.device)
    quotas = round_quotas(episodes, min(num_envs, episodes))
    rng = np.random.default_rng(seed)
    players = make_players(cfg, None, 0, True, device, "eval", rng, len(quotas))
    try:
        versions = load_weights(cfg, checkpoint, players)
    except Exception as exc:  # torch.load and load_state_dict raise many types
        raise ValueError(f"cannot load {checkpoint} as this run's policies: {exc}") from exc
    for player in players.values():
        if isinstance(player, NetworkPlayer):
            player.net.to(device).eval()
    envs = AgentEnvs(cfg, len(quotas), players)
    try:
        with torch.inference_mode():
            return play_multiagent_round(cfg, envs, quotas, seed), versions
    finally:
        envs.close()

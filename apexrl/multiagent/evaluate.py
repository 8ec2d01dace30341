"""``apexrl evaluate`` of a multi-agent run: every policy of the run plays its agents greedily, its
weights read from the run's checkpoint (``multiagent.learning``: every network policy's), fixed
policies as they always play, for N episodes (each env its share from a fresh reset, as the
evaluation actor plays a round).

Prints, for the judged return (``multiagent.judge``) and for every return group (``team``,
``policy/<name>``, ``agent/<name>``, ``policy/<name>/<agent>``: ``multiagent.returns``), the mean,
std, min and max over the episodes it played; for a group whose returns are all -1, 0 or +1 (a
two-player game's loss, draw and win) also the share of each; and the actions any policy took
outside its agents' legal-action masks (there should be none). Writes it all as JSON.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from apexrl import lifecycle
from apexrl.acting.rounds import round_quotas
from apexrl.config import Config
from apexrl.multiagent.evaluation import play_multiagent_round
from apexrl.multiagent.learning import build_policy_cores
from apexrl.multiagent.players import NetworkPlayer, make_players
from apexrl.multiagent.stepping import AgentEnvs


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


def evaluate_multiagent(args: argparse.Namespace, checkpoint: Path, cfg: Config) -> dict:
    """Play ``args.episodes`` episodes of a multi-agent run's checkpoint; the JSON record."""
    from apexrl.tools.evaluate import SEED_OFFSET, EvaluateError, format_stats, summary

    if args.record or args.dataset:
        raise EvaluateError("--record and --dataset take single-agent runs")
    torch.set_num_threads(cfg.actor.torch_threads)
    device = lifecycle.resolve_device(cfg.actor.device)
    quotas = round_quotas(args.episodes, min(args.envs, args.episodes))
    seed = cfg.env.seed + SEED_OFFSET if args.seed is None else args.seed
    rng = np.random.default_rng(seed)
    players = make_players(cfg, None, 0, True, device, "eval", rng, len(quotas))
    try:
        versions = load_weights(cfg, checkpoint, players)
    except Exception as exc:  # torch.load and load_state_dict raise many types
        raise EvaluateError(f"cannot load {checkpoint} as this run's policies: {exc}") from exc
    for player in players.values():
        if isinstance(player, NetworkPlayer):
            player.net.to(device).eval()
    envs = AgentEnvs(cfg, len(quotas), players)
    print(
        f"apexrl evaluate: {cfg.algorithm} on {cfg.env.id}, {checkpoint} (policies "
        f"{', '.join(f'{n} v{v}' for n, v in versions.items())}), {args.episodes} episodes on "
        f"{len(quotas)} envs",
        flush=True,
    )
    try:
        with torch.inference_mode():
            result = play_multiagent_round(cfg, envs, quotas, seed)
    finally:
        envs.close()
    groups = {}
    print(format_stats("return", summary(result.returns)) + f"  ({cfg.multiagent.judge})")
    for name, returns in sorted(result.groups.items()):
        entry = {"episodes": int(len(returns)), **summary(returns)}
        shares = outcome_shares(returns)
        if shares is not None:
            entry.update(shares)
        groups[name] = entry
        line = f"  {name:<28} {len(returns):5d} ep  mean {entry['mean']:8.3f}"
        if shares is not None:
            line += "  " + "  ".join(f"{k} {v:.3f}" for k, v in shares.items())
        print(line)
    print(f"illegal actions: {result.illegal_actions} of {result.agent_steps} agent steps")
    return {
        "checkpoint": str(checkpoint),
        "algorithm": cfg.algorithm,
        "env": cfg.env.id,
        "policy_versions": versions,
        "episodes": int(len(result.returns)),
        "envs": len(quotas),
        "seed": seed,
        "judge": cfg.multiagent.judge,
        "returns": result.returns.tolist(),
        "lengths": result.lengths.tolist(),
        "return": summary(result.returns) if len(result.returns) else {},
        "groups": groups,
        "illegal_actions": result.illegal_actions,
        "agent_steps": result.agent_steps,
        "env_steps": result.env_steps,
        "seconds": round(result.seconds, 3),
    }

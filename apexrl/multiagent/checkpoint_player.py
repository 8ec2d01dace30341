"""Another run's network policy as a fixed player: ``checkpoint:PATH[#POLICY]``.

``PATH`` is a run directory (its ``checkpoint.pt``) or a ``.pt`` file with the ``config.yaml``
beside it, as the roles see it (absolute, or relative to where the run was launched); ``POLICY``
one of that run's network policies (default: its only one). The player samples its moves from
its policy, as that run's training actors did (two greedy players would play one game over and
over); a deep-Q policy (Ape-X) plays as that run's evaluation actor does, greedy or with its
``actor.eval_epsilon``. It must see the game as this run's networks do: the same observation and
action spaces.
A recurrent policy is refused (a fixed player keeps no state per agent). Its weights are read
once, when the actor starts, with ``torch.load(weights_only=True)`` (no pickle), checked finite.

``fixed_player_policy`` makes any fixed player (random, scripted or a checkpoint's), for the
actors, the evaluation actor's rounds against fixed opponents and ``apexrl evaluate --opponent``;
``check_checkpoint_players`` loads every checkpoint player a config names, for the launcher's
checks before any role starts.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from apexrl.algos import LearnerCore, load_algorithm
from apexrl.config import Config, ConfigError, load_config
from apexrl.config.rules import FIXED_CHECKPOINT
from apexrl.envs.spaces import network_spaces
from apexrl.learning.checkpoint import load_checkpoint
from apexrl.models import (
    RecurrentActorCritic,
    RecurrentQNetwork,
    arrays_to_params,
    params_to_arrays,
)
from apexrl.multiagent.fixed import RandomPolicy, ScriptedPolicy, make_fixed_policy
from apexrl.multiagent.learning import PolicyCore, PolicyCores
from apexrl.multiagent.policies import policy_config, policy_name, policy_spaces
from apexrl.runtime import rundir

# Deep-Q families explore by their actors' epsilon schedule, not by a policy to sample: their
# checkpoint plays as their evaluation actor does (greedy, or with that run's actor.eval_epsilon)
EPSILON_FAMILIES = ("apex_dqn", "r2d2")


class CheckpointPolicy:
    """A network policy of another run's checkpoint, frozen, sampling its moves (module
    docstring). ``ConfigError`` naming the player when it cannot be had or does not fit."""

    def __init__(
        self, name: str, obs_space: gym.Space, action_space: gym.Space, rng: np.random.Generator
    ) -> None:
        self.name = name
        path, _, policy = name.removeprefix(FIXED_CHECKPOINT).partition("#")
        try:
            cfg, network = load_policy(Path(path), policy or None)
        except (ValueError, ConfigError) as exc:
            raise ConfigError(f"fixed player {name!r}: {exc}") from exc
        seen, acts = network_spaces(cfg)
        if seen.shape != obs_space.shape or seen.dtype != obs_space.dtype:
            raise ConfigError(
                f"fixed player {name!r} reads observations {seen.dtype}{list(seen.shape)}, this "
                f"run's agents give {obs_space.dtype}{list(obs_space.shape)} (the same env and "
                f"observation view as that run's are needed)"
            )
        if acts != action_space:
            raise ConfigError(
                f"fixed player {name!r} acts in {acts}, this run's agents in {action_space}"
            )
        algorithm = load_algorithm(cfg.algorithm)
        seed = np.random.default_rng(int(rng.integers(2**31)))
        greedy = cfg.algorithm in EPSILON_FAMILIES  # else a training actor's: samples its policy
        self.core = algorithm.actor_core(network, cfg, 0, greedy, "cpu", seed)

    def compute_actions(self, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        with torch.inference_mode():
            action, _ = self.core.act(obs, mask, np.arange(len(obs)))
        return np.asarray(action)


def load_policy(path: Path, policy: str | None) -> tuple[Config, torch.nn.Module]:
    """Network policy ``policy`` of the multi-agent run whose checkpoint ``path`` is: its own
    config (``policies.policy_config``) and an actor network holding its weights, on the CPU."""
    sources = rundir.checkpoint_sources(path)
    run_cfg = load_config(sources.config)
    if not run_cfg.multiagent.enabled:
        raise ValueError(f"{sources.checkpoint} is a single-agent run's: it plays no seat")
    cfg, learner = load_policy_core(run_cfg, sources.checkpoint, policy_name(run_cfg, policy))
    network = load_algorithm(cfg.algorithm).make_network(*network_spaces(cfg), cfg)
    if isinstance(network, RecurrentActorCritic | RecurrentQNetwork):
        raise ValueError(f"policy {cfg.replay.table} is recurrent: a fixed player keeps no state")
    arrays_to_params(network, params_to_arrays(learner.network))
    return cfg, network.eval()


def load_policy_core(run_cfg: Config, checkpoint: Path, name: str) -> tuple[Config, LearnerCore]:
    """Network policy ``name`` of a multi-agent run (``run_cfg``) as its checkpoint holds it:
    its own config and its learner core alone, on the CPU (the run's other policies are neither
    built nor read); ``ValueError`` with one line for a file that does not hold it."""
    cfg = policy_config(run_cfg, name, policy_spaces(run_cfg)[name])
    cpu = torch.device("cpu")
    learner = load_algorithm(cfg.algorithm).learner_core(*network_spaces(cfg), cfg, cpu)
    cores = PolicyCores([PolicyCore(name, cfg, learner, False)])
    try:
        load_checkpoint(checkpoint, cores, cpu)
    except Exception as exc:  # torch.load and load_state_dict raise many types: all unusable
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        raise ValueError(f"cannot load {checkpoint} as policy {name}: {first}") from exc
    return cfg, learner


def fixed_player_policy(
    fixed: str, obs_space: gym.Space, action_space: gym.Space, rng: np.random.Generator
) -> RandomPolicy | ScriptedPolicy | CheckpointPolicy:
    """The fixed player ``fixed`` names: random, scripted or another run's policy."""
    if fixed.startswith(FIXED_CHECKPOINT):
        return CheckpointPolicy(fixed, obs_space, action_space, rng)
    return make_fixed_policy(fixed, obs_space, action_space, rng)


def check_checkpoint_players(cfg: Config) -> None:
    """Load every checkpoint player of ``cfg`` (its fixed policies and ``league.eval_opponents``)
    against the spaces of the seats it would take; ``ConfigError`` with one line."""
    named = [spec for spec in cfg.multiagent.policies if spec.fixed.startswith(FIXED_CHECKPOINT)]
    opponents = [o for o in cfg.league.eval_opponents if o.startswith(FIXED_CHECKPOINT)]
    if not named and not opponents:
        return
    spaces = policy_spaces(cfg)
    rng = np.random.default_rng(0)
    for spec in named:
        found = spaces[spec.name]
        CheckpointPolicy(spec.fixed, found.obs_space, found.action_space, rng)
    if opponents:
        from apexrl.league.config import main_policy

        found = spaces[main_policy(cfg.league, cfg.multiagent.trained)]
        for name in opponents:
            try:
                CheckpointPolicy(name, found.obs_space, found.action_space, rng)
            except ConfigError as exc:
                raise ConfigError(f"league.eval_opponents: {exc}") from exc

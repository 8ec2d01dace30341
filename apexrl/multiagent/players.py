"""The players of a multi-agent actor: one per policy of the run.

- ``NetworkPlayer``: a network policy: its network and actor core (of its own config,
  ``policies.policy_config``), the client that loads its weights from the parameter server, and,
  for a trained policy on a training actor, its lanes (``lanes.PolicyLanes``), whose steps become
  its chunks. One batched forward pass acts for every agent of every env that it plays and that
  must act this step.
- ``FixedPlayer``: a fixed policy (``fixed``): random, scripted or another run's checkpoint,
  which no one trains here: no weights from the parameter server, no data.

``ActionView`` turns a network's action into the env's: a Discrete index as an int, a Box action
in [-1, 1] mapped onto the env's bounds where the family acts in [-1, 1] (``Config.unit_actions``),
else clipped to them.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
import zmq

from apexrl.acting.startup import make_network
from apexrl.algos import ActorCore, load_algorithm
from apexrl.clients.params import ParamsClient, params_link
from apexrl.config import Config
from apexrl.envs import VectorStep
from apexrl.multiagent.checkpoint_player import fixed_player_policy
from apexrl.multiagent.lanes import PolicyLanes
from apexrl.multiagent.policies import PolicySpaces, num_lanes, policy_config, policy_spaces


class ActionView:
    """A policy's actions as its env takes them."""

    def __init__(self, space: gym.Space, unit: bool) -> None:
        self.space = space
        self.discrete = isinstance(space, gym.spaces.Discrete)
        self.box = isinstance(space, gym.spaces.Box)
        self.unit = unit and self.box
        if self.box:
            self.low = space.low.astype(np.float64)
            self.high = space.high.astype(np.float64)

    def env_action(self, action: np.ndarray) -> Any:
        if self.discrete:
            return int(action)
        if self.box:
            action = np.asarray(action, dtype=np.float64)
            if self.unit:
                action = self.low + (np.clip(action, -1.0, 1.0) + 1.0) * 0.5 * (
                    self.high - self.low
                )
            return np.clip(action, self.low, self.high).astype(self.space.dtype)
        return np.asarray(action)


class NetworkPlayer:
    """A network policy in an actor (module docstring). Each agent it plays holds one of its
    ``num_rows`` rows while it plays (its lane, where the policy has lanes): its core keeps a
    recurrent state per row."""

    def __init__(
        self,
        name: str,
        cfg: Config,
        core: ActorCore,
        params: ParamsClient | None,
        lanes: PolicyLanes | None,
        masked: bool,
        actions: ActionView,
        num_rows: int,
    ) -> None:
        self.name, self.cfg, self.core, self.params = name, cfg, core, params
        self.net = core.network
        self.fixed_version = -1  # the version of weights loaded without a client (a checkpoint)
        self.lanes, self.masked, self.actions = lanes, masked, actions
        self.free = list(range(num_rows - 1, -1, -1))  # pop() takes row 0 first
        self.num_rows = num_rows
        self.last_action: np.ndarray | None = None  # [num_rows, ...]: each row's latest action

    @property
    def version(self) -> int:
        return self.fixed_version if self.params is None else self.params.version

    def take(self) -> int:
        """A free row for an agent that starts to act."""
        if not self.free:
            raise RuntimeError(f"policy {self.name}: all {self.num_rows} agent rows are taken")
        return self.free.pop()

    def release(self, row: int) -> None:
        """The row's agent is done (its last step completed, or its episode ended)."""
        if self.lanes is not None:
            self.lanes.release(row)
        self.free.append(row)

    def act(self, obs: np.ndarray, mask: np.ndarray | None, rows: np.ndarray) -> np.ndarray:
        """Actions for ``obs`` [n, *obs] of the agents in ``rows``; their pending steps go to
        the lanes."""
        action, extras = self.core.act(obs, mask if self.masked else None, rows)
        if self.last_action is None:
            self.last_action = np.zeros((self.num_rows, *action.shape[1:]), action.dtype)
        self.last_action[rows] = action
        if self.lanes is not None:
            self.lanes.acted(rows, obs, action, extras, mask, self.version)
        return action

    def completed(
        self,
        rows: np.ndarray,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        next_obs: np.ndarray,
        next_mask: np.ndarray | None,
    ) -> None:
        """What followed the actions of ``rows``: the core observes it (a recurrent core's
        state moves on, or starts again where the agent is done) and the lanes store it."""
        step = VectorStep(next_obs, next_obs, reward, terminated, truncated)
        self.core.observe(self.last_action[rows], step, rows=rows)
        if self.lanes is not None:
            self.lanes.completed(rows, reward, terminated, truncated, next_obs, next_mask)


class FixedPlayer:
    """A fixed policy in an actor: no weights, no lanes, no rows."""

    def __init__(self, name: str, policy: Any, actions: ActionView) -> None:
        self.name, self.policy, self.actions = name, policy, actions
        self.lanes = None
        self.masked = True  # a fixed policy keeps to the legal actions when the env gives them

    def take(self) -> int:
        return -1

    def release(self, row: int) -> None:
        pass

    def act(self, obs: np.ndarray, mask: np.ndarray | None, rows: np.ndarray) -> np.ndarray:
        return self.policy.compute_actions(obs, mask)

    def completed(self, *outcome: object) -> None:
        pass


Player = NetworkPlayer | FixedPlayer


def make_players(
    cfg: Config,
    ctx: zmq.Context | None,
    actor_id: int,
    evaluate: bool,
    device: str,
    key_role: str,
    rng: np.random.Generator,
    num_envs: int,
) -> dict[str, Player]:
    """Every policy's player on an actor of ``num_envs`` envs (``evaluate``: the evaluation
    actor's, greedy and without lanes); the network players' clients connect to the parameter
    server under ``key_role``'s CURVE key (``ctx`` None: no clients, the weights are loaded by
    the caller: ``apexrl evaluate``)."""
    spaces = policy_spaces(cfg)
    trained = set(cfg.multiagent.trained)
    players: dict[str, Player] = {}
    for spec in cfg.multiagent.policies:
        found = spaces[spec.name]
        if spec.fixed:
            policy = fixed_player_policy(spec.fixed, found.obs_space, found.action_space, rng)
            actions = ActionView(found.action_space, False)
            players[spec.name] = FixedPlayer(spec.name, policy, actions)
            continue
        rows = num_envs * len(found.agents)  # a training actor's: its lanes (num_lanes)
        lanes = spec.name in trained and not evaluate
        players[spec.name] = make_network_player(
            cfg, spec.name, found, ctx, actor_id, evaluate, device, key_role, rng, rows, lanes
        )
    return players


def make_network_player(
    cfg: Config,
    name: str,
    found: PolicySpaces,
    ctx: zmq.Context | None,
    actor_id: int,
    evaluate: bool,
    device: str,
    key_role: str,
    rng: np.random.Generator,
    num_rows: int,
    lanes: bool,
    snapshot: int = -1,
) -> NetworkPlayer:
    """Network policy ``name``'s player (spaces ``found``) of ``num_rows`` rows, with lanes
    where it trains here; ``snapshot`` >= 0: one of its pinned versions (a league's opponent),
    whose client asks for that version alone."""
    policy_cfg = policy_config(cfg, name, found)
    precision = "fp32" if evaluate else cfg.actor.precision
    net = make_network(policy_cfg, found.obs_space, found.action_space, device, precision, num_rows)
    algorithm = load_algorithm(policy_cfg.algorithm)
    seed = int(rng.integers(2**31))
    core = algorithm.actor_core(
        net, policy_cfg, actor_id, evaluate, device, np.random.default_rng(seed)
    )
    params = None
    if ctx is not None:
        link = params_link(ctx, cfg.net, key_role)
        timeout_s = cfg.actor.resend_timeout_s
        params = ParamsClient(link, net, timeout_s, policy=name, snapshot=snapshot)
    policy_lanes = PolicyLanes(core, num_lanes(cfg, found.agents), found.masked) if lanes else None
    actions = ActionView(found.action_space, policy_cfg.unit_actions)
    return NetworkPlayer(
        name, policy_cfg, core, params, policy_lanes, found.masked, actions, num_rows
    )


def close_players(players: dict[str, Player]) -> None:
    for player in players.values():
        if isinstance(player, NetworkPlayer) and player.params is not None:
            player.params.link.close()


def torch_threads(cfg: Config) -> None:
    torch.set_num_threads(cfg.actor.torch_threads)

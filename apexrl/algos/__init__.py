"""The algorithm seam: what an algorithm family gives the generic actor and learner loops.

An algorithm is one module under ``apexrl/algos/`` with a module-level ``ALGORITHM`` object that
satisfies ``Algorithm``; ``ALGORITHMS`` maps the config's ``algorithm:`` to that module, and
nothing else in the system knows which algorithm runs. Its hyperparameter dataclass lives in
``apexrl/config/algos.py`` (torch-free, so that the servers and the launcher can read a
config without importing torch).

- **Actor side** (``ActorCore``): a batch of observations -> actions and per-step ``extras``
  (Q of the action taken, behaviour log-probability, value, recurrent state, ...); each env step
  observed (a recurrent core resets at episode ends); and a full ``StepBlock`` -> replay items
  with their initial priorities (or ``None`` for a FIFO queue).
- **Learner side** (``LearnerCore``): a sampled batch -> a gradient, metrics and new priorities (or
  ``None``); applying the (possibly all-reduced) gradient; the weights it publishes.

The split follows rlpyt's agent / sampler / algo and RLlib's compute_actions /
postprocess_trajectory / loss, flattened into two small protocols.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

if TYPE_CHECKING:  # this package is imported by the torch-free config (config/algos.py)
    import gymnasium as gym
    import torch
    from torch import nn

    from apexrl.acting.step_block import StepBlock
    from apexrl.config import Config
    from apexrl.envs import VectorStep

# The config's ``algorithm:`` -> the module that holds its ``ALGORITHM``.
ALGORITHMS: dict[str, str] = {
    "apex_dqn": "apexrl.algos.apex_dqn",
    "r2d2": "apexrl.algos.r2d2",
    "impala": "apexrl.algos.impala",
    "ppo": "apexrl.algos.ppo",
    # DDPG, TD3 and SAC: one module, the config's algo class says which
    "ddpg": "apexrl.algos.q_policy",
    "td3": "apexrl.algos.q_policy",
    "sac": "apexrl.algos.q_policy",
    "bc": "apexrl.algos.bc",
}


class SampledBatch(NamedTuple):
    """A batch from replay, as the learner hands it to its core."""

    keys: np.ndarray  # [N] int64, for a priority update
    fields: dict[str, torch.Tensor]  # the items' fields on the learner's device, [N, ...]
    probabilities: np.ndarray  # [N] float64, P(i) of prioritized sampling (1 for a FIFO)
    table_size: int  # items the probabilities were computed over


class UpdateResult(NamedTuple):
    priorities: np.ndarray | None  # [N] float64 new priorities, or None (FIFO)
    metrics: dict[str, float]  # "learner/<name>" -> value


class ActorCore(Protocol):
    """The algorithm on an actor, acting for a batch of envs and cutting replay items.

    A core acts for *lanes*: the envs of a vector that step together (``rows`` None: the batch's
    ``B`` rows are lanes ``0 .. B - 1``, on every call), or the agent slots of a multi-agent
    actor, which act for some of their lanes at a time and complete a lane's step later
    (``rows``: int64 ``[B]``, the distinct lanes of the batch's rows, in any order and grouping).
    A recurrent core (R2D2; IMPALA and PPO with an LSTM) keeps its state per lane, grows it when
    ``rows`` names a lane it has not seen (a new lane starts at an episode's start) and touches
    the state of ``rows`` only, so a lane's actions, extras and items are the same however its
    steps are grouped with other lanes'; a feed-forward core ignores ``rows``."""

    network: nn.Module  # the weights the parameter server's versions are loaded into
    block_steps: int  # vector steps in a StepBlock
    block_overlap: int  # steps a block keeps after its items were cut
    synchronous: bool  # act with one weights version per chunk, then wait for the next (PPO)

    def act(
        self, obs: np.ndarray, mask: np.ndarray | None = None, rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions ``[B, ...]`` for observations ``[B, *obs]``, and the extras to store.

        ``mask``: bool ``[B, A]`` legal actions of a ``Discrete(A)`` action space (True: legal;
        turn-based games), at least one per row: no action outside it is ever chosen, whether
        greedy, explored or sampled. Cores of other action spaces raise ``ValueError`` on one.
        With ``algo.action_mask`` the actor adds ``action_mask`` (the mask of ``obs[t]``) and
        ``next_action_mask`` (that of ``next_obs[t]``) ``[B, A]`` to each step's extras, and
        ``items`` cuts the mask fields of the family's ``item_spec`` from them.

        ``rows``: int64 ``[B]``, the lanes ``obs`` belongs to (None: lanes ``0 .. B - 1``). A
        recurrent core steps those lanes' state only, and its extras (``recurrent_state``,
        ``prev_action``, ``prev_reward`` at the step's start) are theirs."""
        ...

    def observe(self, action: np.ndarray, step: VectorStep, rows: np.ndarray | None = None) -> None:
        """After every env step: the actions taken and what the envs returned, ``[B]`` arrays of
        lanes ``rows`` (None: lanes ``0 .. B - 1``). A recurrent core keeps the action and reward
        that those lanes' next input holds, and resets the state of lanes whose episode ended
        (terminated or truncated); the others have nothing to do."""
        ...

    def items(
        self, block: StepBlock, rows: np.ndarray | None = None
    ) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """Replay items (fields ``[N, ...]``, copies) of a full block and their priorities. ``N``
        may be 0 (R2D2: no sequence ended): the actor then sends nothing and keeps counting.

        ``rows``: int64 ``[B]``, the lanes of the block's ``B`` columns (None: lanes
        ``0 .. B - 1``). Only R2D2 carries steps across cuts (each lane's sequence in progress):
        cutting some lanes now and the others later gives each lane the sequences one cut of
        all lanes would."""
        ...


class LearnerCore(Protocol):
    """The algorithm on a learner: networks, optimizer, one update."""

    network: nn.Module  # the weights published to actors
    num_updates: int
    has_work: bool  # a gradient can be given without new data: do not wait for a batch
    # Whether the loop should take the next batch from replay now; False leaves it there (and
    # replay's rate limiter then holds the actors back): IMPALA's passes over a batch.
    wants_batch: bool

    def compute_gradients(self, batch: SampledBatch | None) -> UpdateResult | None:
        """Fill ``network``'s ``.grad`` with a gradient; None when there is none to give. The
        learner loop asks on every turn, with the batch that arrived or None: Ape-X and IMPALA
        take one gradient step per batch, PPO collects a rollout and then steps through its
        epochs on later turns."""
        ...

    def apply_gradients(self) -> float:
        """Apply the gradient in ``.grad`` (averaged over learners when there are several);
        returns the gradient norm. ``num_updates`` counts the weights versions: the learner
        publishes each new one (every ``learner.publish_period``)."""
        ...

    def agree(self, total: Callable[[list[float]], list[float]]) -> None:
        """Called on every turn before ``compute_gradients`` by every rank of a learner group,
        with ``total`` summing values over the ranks: a core whose ranks must decide together
        (PPO: is the rollout complete?) does it here; others do nothing."""
        ...

    def state_dict(self) -> dict[str, object]: ...

    def load_state_dict(self, state: dict[str, object]) -> None: ...


class Algorithm(Protocol):
    """One algorithm family: its network, its actor core and its learner core."""

    def make_network(self, obs_space: gym.Space, action_space: gym.Space, cfg: Config) -> nn.Module:
        """The network actors act with (the learner's ``network`` has the same structure)."""
        ...

    def actor_core(
        self,
        network: nn.Module,
        cfg: Config,
        actor_id: int,
        evaluate: bool,
        device: str,
        rng: np.random.Generator,
    ) -> ActorCore: ...

    def learner_core(
        self, obs_space: gym.Space, action_space: gym.Space, cfg: Config, device: torch.device
    ) -> LearnerCore: ...


def load_algorithm(name: str) -> Algorithm:
    """The ``ALGORITHM`` of the module that ``ALGORITHMS`` names (config validation has already
    refused unknown names)."""
    return importlib.import_module(ALGORITHMS[name]).ALGORITHM

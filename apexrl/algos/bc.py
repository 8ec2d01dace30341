"""Behaviour cloning: a policy trained to take the actions of a dataset (``run.input_dataset``,
served by replay as one-step transitions; ``apexrl.offline``).

- Discrete actions: the policy's logits, trained with the cross-entropy of the dataset's action
  (``bc_discrete_loss``); it acts with the most probable action.
- Box actions, in [-1, 1] (the envs map them onto their bounds): ``tanh`` of the policy's output,
  trained with the squared error to the dataset's action (``bc_box_loss``); it acts with it.

The items are Ape-X's transitions (``algos.transitions``) of one step; the learner reads their
``obs`` and ``action``. Replay samples them uniformly (``replay.priority_exponent: 0``); the
learner sends no priorities. The evaluation actor plays the policy as every family's does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from apexrl.acting.step_block import StepBlock
from apexrl.algos import SampledBatch, UpdateResult
from apexrl.algos.actor_critic import clip_and_step, load_trainer_state, trainer_state
from apexrl.algos.transitions import cut_transitions
from apexrl.config import Config
from apexrl.config.algos import BCConfig
from apexrl.envs import VectorStep
from apexrl.learning.optim import Adam
from apexrl.models.torsos import mlp_torso


def bc_discrete_loss(logits: Tensor, action: Tensor) -> Tensor:
    """Mean cross-entropy of the dataset's actions ``[N]`` under the logits ``[N, A]``."""
    return F.cross_entropy(logits.float(), action.long())


def bc_box_loss(predicted: Tensor, action: Tensor) -> Tensor:
    """Mean over items of the squared error ``sum_d (predicted_d - action_d)^2``, ``[N, D]``."""
    return ((predicted.float() - action.float()) ** 2).sum(dim=-1).mean()


class BCPolicy(nn.Module):
    """An MLP from the observation to the action's logits (Discrete) or, through ``tanh``, to an
    action in [-1, 1] (Box)."""

    def __init__(self, obs_dim: int, action_space: gym.Space, hidden_sizes: Sequence[int]) -> None:
        super().__init__()
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        width = int(action_space.n) if self.discrete else int(np.prod(action_space.shape))
        self.torso = mlp_torso(obs_dim, hidden_sizes)
        self.head = nn.Linear(self.torso.out_features, width)

    def forward(self, obs: Tensor) -> Tensor:
        out = self.head(self.torso(obs.float()))
        return out if self.discrete else torch.tanh(out)

    def act(self, obs: Tensor) -> Tensor:
        out = self(obs)
        return out.argmax(dim=-1) if self.discrete else out


class BCActorCore:
    """Acts with the policy; cuts a block into one-step transitions (their priorities ones)."""

    def __init__(self, network: BCPolicy, cfg: Config, device: str) -> None:
        self.network, self.device = network, device
        self.block_steps, self.block_overlap = cfg.actor.chunk_steps, 0
        self.synchronous = False

    def act(
        self, obs: np.ndarray, mask: np.ndarray | None = None, rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The policy's actions for ``obs`` ``[B, *obs]``; it takes no legal-action ``mask``
        (``ValueError``); ``rows`` (the lanes of ``obs``) changes nothing."""
        if mask is not None:
            raise ValueError("behaviour cloning does not take an action mask")
        with torch.inference_mode():
            action = self.network.act(torch.as_tensor(obs, device=self.device))
        return action.cpu().numpy(), {}

    def logged_extras(self, obs: np.ndarray, action: np.ndarray) -> dict[str, np.ndarray]:
        """A dataset's or a client's own actions need nothing more."""
        return {}

    def observe(self, action: np.ndarray, step: VectorStep, rows: np.ndarray | None = None) -> None:
        """Nothing to keep between steps: the policy is feed-forward."""

    def items(
        self, block: StepBlock, rows: np.ndarray | None = None
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        fields = cut_transitions(block, 1.0, 1)
        return fields, np.ones(len(fields["num_steps"]))


class BCLearner:
    """One Adam step on the loss of each sampled batch."""

    def __init__(self, network: BCPolicy, cfg: BCConfig, device: torch.device) -> None:
        self.cfg, self.device = cfg, torch.device(device)
        self.network = network.to(self.device)
        self.optimizer = Adam(self.network.parameters(), cfg.lr, cfg.adam_eps)
        self.num_updates = 0
        self.has_work = False
        self.wants_batch = True

    def compute_gradients(self, batch: SampledBatch | None) -> UpdateResult | None:
        if batch is None:
            return None
        obs, action = batch.fields["obs"], batch.fields["action"]
        out = self.network(obs)
        if self.network.discrete:
            loss = bc_discrete_loss(out, action)
            matched = (out.argmax(dim=-1) == action).float().mean()
        else:
            loss = bc_box_loss(out, action)
            matched = ((out - action).abs().amax(dim=-1) < 0.1).float().mean()
        for p in self.network.parameters():
            p.grad = None
        loss.backward()
        metrics = {"learner/loss": float(loss.detach()), "learner/matched_actions": float(matched)}
        return UpdateResult(None, metrics)

    def apply_gradients(self) -> float:
        norm = clip_and_step(self.network, self.optimizer, self.cfg.grad_clip_norm)
        self.num_updates += 1
        return norm

    def agree(self, total: Callable[[list[float]], list[float]]) -> None:
        """Nothing to decide together."""

    def state_dict(self) -> dict[str, object]:
        return trainer_state(self.network, self.optimizer, self.num_updates)

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.num_updates = load_trainer_state(state, self.network, self.optimizer)


class BCAlgorithm:
    def make_network(self, obs_space: gym.Space, action_space: gym.Space, cfg: Config) -> BCPolicy:
        if len(obs_space.shape) != 1:
            raise ValueError(f"bc takes a flat Box observation, got {obs_space}")
        return BCPolicy(int(obs_space.shape[0]), action_space, cfg.algo.hidden_sizes)

    def actor_core(
        self,
        network: nn.Module,
        cfg: Config,
        actor_id: int,
        evaluate: bool,
        device: str,
        rng: np.random.Generator,
    ) -> BCActorCore:
        return BCActorCore(network, cfg, device)

    def learner_core(
        self, obs_space: gym.Space, action_space: gym.Space, cfg: Config, device: torch.device
    ) -> BCLearner:
        return BCLearner(self.make_network(obs_space, action_space, cfg), cfg.algo, device)


ALGORITHM = BCAlgorithm()

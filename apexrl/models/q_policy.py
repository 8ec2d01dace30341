"""The networks of the Q-function policy gradients (DDPG, TD3, SAC) on flat observations.

``QPolicyNetwork`` holds what the learner publishes and the actors load: the policy, one critic
(DDPG) or two (TD3, SAC) and, for SAC, the log-temperature. Actions are in [-1, 1] per dim:

- ``DeterministicPolicy``: ``mu(s) = tanh(MLP(s))`` (DDPG, TD3);
- ``SquashedGaussianPolicy``: ``GaussianOutput(mean, log_std)`` of the pre-tanh Gaussian, the
  log-std state-dependent and clamped to ``[LOG_STD_MIN, LOG_STD_MAX]`` (SAC; sample with
  ``distributions.squashed_gaussian_sample``);
- ``QCritic``: ``Q(s, a) = MLP([s, a])``, ``[B]``.

Each part is an MLP of ``hidden_sizes`` with ReLU (``models.torsos.mlp_torso``), PyTorch's default
initialization, as the papers' reference implementations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from apexrl.models.actor_critic import LOG_STD_MAX, LOG_STD_MIN, ObsNormalizer
from apexrl.models.torsos import mlp_torso


class SquashedGaussianOutput(NamedTuple):
    """The pre-tanh Gaussian of a SAC policy: ``mean`` and ``log_std``, float32 ``[B, D]``."""

    mean: Tensor
    log_std: Tensor


def _as_float(x: Tensor) -> Tensor:
    return x if x.dtype == torch.float32 else x.to(torch.float32)


class DeterministicPolicy(nn.Module):
    """``mu(s) = tanh(Linear(MLP(s)))``: an action in [-1, 1]^D per observation."""

    def __init__(self, obs_dim: int, action_dim: int, hidden_sizes: Sequence[int]) -> None:
        super().__init__()
        self.torso = mlp_torso(obs_dim, hidden_sizes)
        self.head = nn.Linear(self.torso.out_features, action_dim)

    def forward(self, obs: Tensor) -> Tensor:
        return torch.tanh(self.head(self.torso(_as_float(obs))))


class SquashedGaussianPolicy(nn.Module):
    """The Gaussian before SAC's tanh: a mean head and a state-dependent log-std head on one
    MLP."""

    def __init__(self, obs_dim: int, action_dim: int, hidden_sizes: Sequence[int]) -> None:
        super().__init__()
        self.torso = mlp_torso(obs_dim, hidden_sizes)
        self.mean_head = nn.Linear(self.torso.out_features, action_dim)
        self.log_std_head = nn.Linear(self.torso.out_features, action_dim)

    def forward(self, obs: Tensor) -> SquashedGaussianOutput:
        features = self.torso(_as_float(obs))
        log_std = self.log_std_head(features).clamp(LOG_STD_MIN, LOG_STD_MAX)
        return SquashedGaussianOutput(mean=self.mean_head(features), log_std=log_std)


class QCritic(nn.Module):
    """``Q(s, a)``: an MLP over the observation and the action concatenated, one value each."""

    def __init__(self, obs_dim: int, action_dim: int, hidden_sizes: Sequence[int]) -> None:
        super().__init__()
        self.torso = mlp_torso(obs_dim + action_dim, hidden_sizes)
        self.head = nn.Linear(self.torso.out_features, 1)

    def forward(self, obs: Tensor, action: Tensor) -> Tensor:
        x = torch.cat([_as_float(obs), _as_float(action)], dim=-1)
        return self.head(self.torso(x)).squeeze(-1)


class QPolicyNetwork(nn.Module):
    """A policy, its critics and (SAC) the log-temperature, published together: actors act with
    the policy and make their transitions' initial priorities with the critics.

    Args:
        obs_dim, action_dim: sizes of a flat observation and of an action.
        hidden_sizes: widths of every MLP.
        num_critics: 1 (DDPG) or 2 (TD3, SAC).
        stochastic: a ``SquashedGaussianPolicy`` (SAC) instead of a ``DeterministicPolicy``.
        init_alpha: SAC's initial temperature (the ``log_alpha`` parameter holds its log); None:
            no temperature.
        normalize_obs: standardise observations with running statistics (``ObsNormalizer``,
            buffers that travel with the weights) before the policy and the critics read them.

    Read it through ``policy_output`` and ``q_values``, which apply the normalizer.
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden_sizes: Sequence[int],
        num_critics: int,
        stochastic: bool,
        init_alpha: float | None = None,
        normalize_obs: bool = False,
    ) -> None:
        super().__init__()
        if obs_dim < 1 or action_dim < 1:
            raise ValueError(f"obs_dim and action_dim must be >= 1, got {obs_dim}, {action_dim}")
        if num_critics not in (1, 2):
            raise ValueError(f"num_critics must be 1 or 2, got {num_critics}")
        policy = SquashedGaussianPolicy if stochastic else DeterministicPolicy
        self.normalizer = ObsNormalizer(obs_dim) if normalize_obs else None
        self.obs_dim, self.action_dim, self.stochastic = obs_dim, action_dim, stochastic
        self.policy = policy(obs_dim, action_dim, hidden_sizes)
        self.critics = nn.ModuleList(
            QCritic(obs_dim, action_dim, hidden_sizes) for _ in range(num_critics)
        )
        if init_alpha is not None:
            if not init_alpha > 0:
                raise ValueError(f"init_alpha must be > 0, got {init_alpha}")
            self.log_alpha = nn.Parameter(torch.tensor(float(init_alpha)).log().reshape(1))
        else:
            self.log_alpha = None
        # The learner's updates when these weights were published (a buffer: it travels with
        # them): 0 until learning starts, when the actors of a fresh run act at random.
        self.register_buffer("learner_updates", torch.zeros(1, dtype=torch.int64))  # 1-D: the wire

    def normalized(self, obs: Tensor) -> Tensor:
        """``obs`` as the policy and the critics read it."""
        return _as_float(obs) if self.normalizer is None else self.normalizer(obs)

    def policy_output(self, obs: Tensor) -> Tensor | SquashedGaussianOutput:
        """The policy's ``mu(s)`` ``[B, D]`` (DDPG, TD3) or its pre-tanh Gaussian (SAC)."""
        return self.policy(self.normalized(obs))

    def q_values(self, obs: Tensor, action: Tensor) -> list[Tensor]:
        """Every critic's ``Q(s, a)``, ``[B]`` each."""
        x = self.normalized(obs)
        return [critic(x, action) for critic in self.critics]

    def critic_parameters(self) -> list[nn.Parameter]:
        return list(self.critics.parameters())

    def alpha(self) -> Tensor:
        """SAC's temperature ``exp(log_alpha)`` as a scalar, detached."""
        if self.log_alpha is None:
            raise ValueError("this network has no temperature (DDPG, TD3)")
        return self.log_alpha.detach().exp().reshape(())

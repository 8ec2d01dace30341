"""Q-networks (Ape-X DQN): ``MLPQNetwork`` for flat observations (its Linear + ReLU layers are
what the actor's fused CPU path multiplies), ``ConvQNetwork`` for images on any convolutional torso
of ``apexrl.models.torsos``; both with the dueling or a plain head. ``build_q_network`` picks one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from apexrl.math.distributional import mean_values
from apexrl.models.noisy import NoisyLinear
from apexrl.models.torsos import build_torso, choose_torso, mlp_torso


class QOutput(NamedTuple):
    """Output of a Q-network.

    Fields:
        q: float32 ``[B, A]`` action values (of a distributional head: its distributions' means).
        logits: float ``[B, A, N]``, a distributional head's logits over its ``N`` atoms (C51);
            None for a scalar head.
    """

    q: Tensor
    logits: Tensor | None = None


def add_q_heads(
    net: nn.Module,
    in_features: int,
    num_actions: int,
    dueling: bool,
    atoms: Tensor | None = None,
    noisy: bool = False,
) -> None:
    """The Q head on ``net``: ``value_head`` and ``advantage_head`` (dueling, Wang et al. 2016) or
    one ``q_head``, each a Linear layer from ``in_features`` (a ``NoisyLinear`` with ``noisy``).
    The names are the published weights' (and what ``MLPQValues`` reads). With ``atoms`` (C51's
    support, ``[N]``) each action's output is ``N`` logits of a distribution over them
    (``net.atoms``, rebuilt from the config wherever the network is made, so it is not among the
    weights)."""
    num_atoms = 1 if atoms is None else atoms.numel()
    net.num_atoms = num_atoms
    if atoms is not None:
        net.register_buffer("atoms", atoms.to(torch.float32), persistent=False)
    linear = NoisyLinear if noisy else nn.Linear
    if dueling:
        net.value_head = linear(in_features, num_atoms)
        net.advantage_head = linear(in_features, num_actions * num_atoms)
    else:
        net.q_head = linear(in_features, num_actions * num_atoms)


def q_from_heads(net: nn.Module, features: Tensor, dueling: bool) -> QOutput:
    """Q-values from the heads of ``add_q_heads``: Q = V + A - mean_a' A (dueling) or the one
    head's output; leading dims of ``features`` are kept. A distributional head's logits are
    combined the same way per atom (dueling over logits), and Q is their distributions' mean."""
    if net.num_atoms == 1:
        if not dueling:
            return QOutput(q=net.q_head(features))
        advantage = net.advantage_head(features)
        return QOutput(
            q=net.value_head(features) + advantage - advantage.mean(dim=-1, keepdim=True)
        )
    lead, atoms = features.shape[:-1], net.num_atoms
    if dueling:
        advantage = net.advantage_head(features).view(*lead, -1, atoms)
        value = net.value_head(features).view(*lead, 1, atoms)
        logits = value + advantage - advantage.mean(dim=-2, keepdim=True)
    else:
        logits = net.q_head(features).view(*lead, -1, atoms)
    return QOutput(q=mean_values(logits, net.atoms), logits=logits)


class MLPQNetwork(nn.Module):
    """A Q-network for flat observations: an MLP torso and a dueling or plain linear head.

    Dueling head (Wang et al. 2016, "Dueling Network Architectures for Deep RL", eq. 9)::

        Q(s, a) = V(s) + A(s, a) - mean_a' A(s, a')

    Args:
        obs_dim: size of the flat observation.
        num_actions: A, the number of discrete actions.
        hidden_sizes: widths of the torso's Linear + ReLU layers (empty: the head reads ``obs``).
        dueling: use the dueling head; otherwise one Linear layer to A outputs.
    """

    def __init__(
        self,
        obs_dim: int,
        num_actions: int,
        hidden_sizes: Sequence[int] = (256, 256),
        dueling: bool = True,
        atoms: Tensor | None = None,
        noisy: bool = False,
    ) -> None:
        super().__init__()
        if obs_dim < 1:
            raise ValueError(f"obs_dim must be >= 1, got {obs_dim}")
        if num_actions < 1:
            raise ValueError(f"num_actions must be >= 1, got {num_actions}")
        if any(size < 1 for size in hidden_sizes):
            raise ValueError(f"hidden_sizes must all be >= 1, got {tuple(hidden_sizes)}")
        self.obs_dim = obs_dim
        self.num_actions = num_actions
        self.dueling = dueling

        self.torso = mlp_torso(obs_dim, hidden_sizes, "relu")
        add_q_heads(self, self.torso.out_features, num_actions, dueling, atoms, noisy)

    def forward(self, obs: Tensor) -> QOutput:
        """Q-values for a batch of observations.

        Args:
            obs: ``[B, obs_dim]`` (leading dims such as ``[T, B, obs_dim]`` also work); other dtypes
                are cast to float32.

        Returns:
            ``QOutput(q)`` with ``q`` of shape ``[B, A]`` (the input's leading dims, then A).
        """
        if obs.dim() < 1 or obs.shape[-1] != self.obs_dim:
            raise ValueError(f"obs must be [B, {self.obs_dim}], got shape {tuple(obs.shape)}")
        if obs.dtype != torch.float32:
            obs = obs.to(torch.float32)
        return q_from_heads(self, self.torso(obs), self.dueling)


class ConvQNetwork(nn.Module):
    """A Q-network for channel-first images: a convolutional torso (``nature_cnn`` by default,
    ``small_cnn``, ``impala_resnet`` or ``minatar_cnn``: ``apexrl.models.torsos``) and the same
    dueling or plain head as ``MLPQNetwork``.

    With the Nature CNN on 4 frames of 84x84 and 6 actions the network has 1,687,719 parameters
    (plain head: 1,687,206). Wang et al.'s dueling network instead splits into two 512-unit streams
    (about 3.3 M parameters); the shared layer keeps the Nature size and the MLP's head shape.

    Observations stay in the env's dtype (uint8) until here; the torso casts and scales them by
    ``pixel_scale`` (1/255 for Atari frames, 1 for MinAtar's 0/1 channels).

    Args:
        obs_shape: ``(C, H, W)``, channel-first (C stacked frames or MinAtar's channels).
        num_actions: A, the number of discrete actions.
        dueling: use the dueling head; otherwise one Linear layer to A outputs.
        torso: a convolutional torso's name, or ``auto`` (by image size).
        pixel_scale: what the torso multiplies pixel values by.
    """

    def __init__(
        self,
        obs_shape: Sequence[int],
        num_actions: int,
        dueling: bool = True,
        torso: str = "nature_cnn",
        pixel_scale: float = 1.0 / 255.0,
        atoms: Tensor | None = None,
        noisy: bool = False,
    ) -> None:
        super().__init__()
        obs_shape = tuple(obs_shape)
        if len(obs_shape) != 3 or min(obs_shape) < 1:
            raise ValueError(f"obs_shape must be (C, H, W), got {obs_shape}")
        if num_actions < 1:
            raise ValueError(f"num_actions must be >= 1, got {num_actions}")
        self.torso = build_torso(obs_shape, torso, pixel_scale=pixel_scale)
        self.obs_shape, self.num_actions, self.dueling = obs_shape, num_actions, dueling
        features = self.torso.out_features
        add_q_heads(self, features, num_actions, dueling, atoms, noisy)

    def forward(self, obs: Tensor) -> QOutput:
        """Q-values for a batch of image observations.

        Args:
            obs: ``[B, C, H, W]`` pixel values (uint8; other dtypes are cast to float32 and scaled
                the same way).

        Returns:
            ``QOutput(q)`` with ``q`` of shape ``[B, A]``.
        """
        return q_from_heads(self, self.torso(obs), self.dueling)


def build_q_network(
    obs_shape: tuple[int, ...],
    num_actions: int,
    hidden_sizes: Sequence[int] = (256, 256),
    dueling: bool = True,
    torso: str = "auto",
    pixel_scale: float = 1.0 / 255.0,
    atoms: Tensor | None = None,
    noisy: bool = False,
) -> nn.Module:
    """The Q-network for an observation shape: ``MLPQNetwork`` for flat ``(obs_dim,)``
    observations, ``ConvQNetwork`` for channel-first images ``(C, H, W)`` with the torso that
    ``choose_torso`` names (``hidden_sizes`` is then unused).

    Raises:
        ValueError: for any other observation shape, or a torso that cannot read it.
    """
    obs_shape = tuple(obs_shape)
    name = choose_torso(obs_shape, torso)
    if name == "mlp":
        return MLPQNetwork(obs_shape[0], num_actions, hidden_sizes, dueling, atoms, noisy)
    return ConvQNetwork(obs_shape, num_actions, dueling, name, pixel_scale, atoms, noisy)

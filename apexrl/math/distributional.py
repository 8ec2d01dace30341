"""Distributional Q-learning (C51, Bellemare, Dabney & Munos 2017; Rainbow, Hessel et al. 2018):
a categorical distribution over returns on a fixed support, trained by projecting the shifted
n-step target distribution back onto it. Pure functions of tensors.

Support: ``z_i = v_min + i * dz``, ``dz = (v_max - v_min) / (N - 1)``, ``i = 0..N-1``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from apexrl.math.targets import greedy_actions


def support(num_atoms: int, v_min: float, v_max: float) -> Tensor:
    """The ``N`` atoms ``z_i`` (float32), evenly spaced from ``v_min`` to ``v_max``."""
    if num_atoms < 2:
        raise ValueError(f"num_atoms must be at least 2 for a distribution, got {num_atoms}")
    if not v_min < v_max:
        raise ValueError(f"v_min must be below v_max, got {v_min} and {v_max}")
    return torch.linspace(v_min, v_max, num_atoms, dtype=torch.float32)


def n_step_discount(num_steps: Tensor, terminated: Tensor, gamma: float) -> Tensor:
    """``gamma^m`` for a window of ``m`` steps, 0 where it ended in a terminal state; a truncated
    window keeps its discount (it bootstraps from the episode's last observation)."""
    if num_steps.is_floating_point() or num_steps.dtype == torch.bool:
        raise ValueError(f"num_steps must be an integer tensor, got dtype {num_steps.dtype}")
    if terminated.dtype != torch.bool:
        raise ValueError(f"terminated must be bool, got dtype {terminated.dtype}")
    discount = torch.pow(gamma, num_steps.to(torch.float32))
    return torch.where(terminated, torch.zeros_like(discount), discount)


def categorical_projection(
    next_probs: Tensor, reward: Tensor, discount: Tensor, atoms: Tensor
) -> Tensor:
    """The target distribution ``m`` on ``atoms``: each atom ``z_j`` of the bootstrap state's
    distribution ``p_j`` (the double-Q action's, from the target network) is shifted to ``Tz_j =
    clip(reward + discount * z_j, v_min, v_max)`` and its mass split between the two atoms
    around it in proportion to nearness::

        b_j = (Tz_j - v_min) / dz,  l = floor(b_j),  u = ceil(b_j)
        m_l += p_j * (u - b_j),  m_u += p_j * (b_j - l)   (l == u: m_l += p_j)

    A terminal window (``discount`` 0) puts all its mass at ``clip(reward)``.

    Args:
        next_probs: float ``[B, N]``, each row a distribution over ``atoms``.
        reward: float ``[B]``, the window's discounted reward sum.
        discount: float ``[B]``, ``n_step_discount``.
        atoms: float ``[N]``, ``support(...)``.

    Returns:
        float32 ``[B, N]``, each row summing to its row of ``next_probs``' sum.
    """
    if next_probs.dim() != 2 or next_probs.shape[1] != atoms.numel():
        raise ValueError(
            f"next_probs must be [B, {atoms.numel()}], got shape {tuple(next_probs.shape)}"
        )
    for name, x in (("reward", reward), ("discount", discount)):
        if x.shape != next_probs.shape[:1]:
            raise ValueError(f"{name} must be [{next_probs.shape[0]}], got {tuple(x.shape)}")
    atoms = atoms.to(torch.float32)
    v_min, v_max = atoms[0], atoms[-1]
    delta = (v_max - v_min) / (atoms.numel() - 1)
    shifted = reward.float()[:, None] + discount.float()[:, None] * atoms[None, :]
    position = ((shifted.clamp(v_min, v_max) - v_min) / delta).clamp(0, atoms.numel() - 1)
    lower, upper = position.floor(), position.ceil()
    probs = next_probs.float()
    to_lower = probs * (upper - position + (lower == upper).float())
    to_upper = probs * (position - lower)
    projected = torch.zeros_like(probs)
    projected.scatter_add_(1, lower.long(), to_lower)
    projected.scatter_add_(1, upper.long(), to_upper)
    return projected


def double_q_target(
    next_q_online: Tensor,
    next_logits_target: Tensor,
    reward: Tensor,
    discount: Tensor,
    atoms: Tensor,
    legal: Tensor | None = None,
) -> Tensor:
    """The double-Q target distribution of a batch of n-step windows: the bootstrap action is the
    online network's greedy one by its means (``next_q_online`` ``[B, A]``, among the ``legal``
    actions where given), its distribution the target network's (``next_logits_target``
    ``[B, A, N]``), shifted and projected (``categorical_projection``). ``[B, N]``."""
    rows = torch.arange(next_q_online.shape[0], device=next_q_online.device)
    action = greedy_actions(next_q_online, legal)
    next_probs = torch.softmax(next_logits_target[rows, action].float(), dim=-1)
    return categorical_projection(next_probs, reward, discount, atoms)


def cross_entropy(target_probs: Tensor, logits: Tensor) -> Tensor:
    """``-sum_i m_i log p_i`` per row, with ``p = softmax(logits)``: C51's loss, and Rainbow's
    new priority of each item. ``[B, N]`` and ``[B, N]`` -> ``[B]``."""
    if target_probs.shape != logits.shape:
        raise ValueError(
            f"target_probs {tuple(target_probs.shape)} and logits {tuple(logits.shape)} differ"
        )
    return -(target_probs * torch.log_softmax(logits.float(), dim=-1)).sum(dim=-1)


def kl_divergence(target_probs: Tensor, logits: Tensor) -> Tensor:
    """``sum_i m_i log(m_i / p_i)`` per row (``0 log 0 = 0``): the cross-entropy less the
    target's entropy, so the same gradient in ``logits``; Rainbow's priority of each item, 0
    where the prediction is the target. ``[B, N]`` and ``[B, N]`` -> ``[B]``."""
    return item_priority("kl", cross_entropy(target_probs, logits), target_probs)


def item_priority(measure: str, cross_entropies: Tensor, target_probs: Tensor) -> Tensor:
    """Each item's priority measure (``algo.distributional_priority``) from its cross-entropy
    (``[B]``, computed once for the loss): ``"cross_entropy"`` itself, ``"kl"`` less the
    target's entropy (``sum_i m_i log m_i`` added)."""
    if measure == "cross_entropy":
        return cross_entropies
    target = target_probs.float()
    return cross_entropies + torch.special.xlogy(target, target).sum(dim=-1)


def mean_values(logits: Tensor, atoms: Tensor) -> Tensor:
    """Q-values, the means of the distributions: ``sum_i z_i softmax(logits)_i`` over the last
    axis (``[..., A, N]`` -> ``[..., A]``)."""
    return (torch.softmax(logits.float(), dim=-1) * atoms.to(torch.float32)).sum(dim=-1)

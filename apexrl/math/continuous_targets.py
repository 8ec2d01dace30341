"""Pure math of the Q-function policy gradients (DDPG, TD3, SAC): the critics' bootstrap, the
target policy's smoothing, the losses of the policy, the critics and the temperature, Polyak
averaging, and the actors' exploration noise.

The n-step part of a critic's target is ``targets.n_step_target`` (only ``terminated`` zeroes the
bootstrap; a time limit still bootstraps), with the bootstrap made here:

- DDPG (Lillicrap et al. 2016): ``Q'(s', mu'(s'))``, one target critic;
- TD3 (Fujimoto et al. 2018): ``min_i Q'_i(s', a')`` with
  ``a' = clip(mu'(s') + clip(eps, -c, c), -1, 1)``, ``eps ~ N(0, sigma)``;
- SAC (Haarnoja et al. 2018): ``min_i Q'_i(s', a') - alpha * log pi(a' | s')``, ``a' ~ pi(s')``.

Actions live in [-1, 1] per dim (the envs map them onto their Box bounds), so the clip of a
smoothed or noisy action is always to [-1, 1]. Conventions as ``apexrl.math.targets``: torch tensors
``[B]`` or ``[B, D]``, shapes checked at entry, no in-place mutation of inputs, every
hyperparameter an argument. ``exploration_noise_scales`` is numpy (the actors' side).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor


def _check_same_shape(name_a: str, a: Tensor, name_b: str, b: Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{name_a} and {name_b} must have the same shape, got {tuple(a.shape)} and "
            f"{tuple(b.shape)}"
        )


def min_q(q_values: Sequence[Tensor]) -> Tensor:
    """The elementwise minimum over the critics' values (TD3's and SAC's clipped double Q);
    one critic's values as they are (DDPG).

    Args:
        q_values: one float ``[B]`` tensor per critic (at least one), all of one shape.
    """
    if not q_values:
        raise ValueError("min_q needs at least one critic's values")
    for i, q in enumerate(q_values[1:], start=1):
        _check_same_shape("q_values[0]", q_values[0], f"q_values[{i}]", q)
    out = q_values[0]
    for q in q_values[1:]:
        out = torch.minimum(out, q)
    return out


def soft_bootstrap(q_next: Tensor, logp_next: Tensor, alpha: Tensor | float) -> Tensor:
    """SAC's soft value of the next state: ``q_next - alpha * logp_next`` (Haarnoja et al. 2018,
    eq. 3 with the entropy term of the sampled action).

    Args:
        q_next: float ``[B]``, ``min_i Q'_i(s', a')`` for ``a' ~ pi(s')``.
        logp_next: float ``[B]``, ``log pi(a' | s')``.
        alpha: the temperature, a float or a scalar tensor (used as given: pass it detached).
    """
    _check_same_shape("q_next", q_next, "logp_next", logp_next)
    return q_next - alpha * logp_next


def smoothed_target_action(mu_next: Tensor, noise: Tensor, noise_clip: float) -> Tensor:
    """TD3's target policy smoothing: ``clip(mu_next + clip(noise, -noise_clip, noise_clip), -1,
    1)``, where ``noise`` is drawn ``N(0, sigma)`` by the caller (Fujimoto et al. 2018, eq. 14).

    Args:
        mu_next: float ``[B, D]``, the target policy's actions ``mu'(s')`` in [-1, 1].
        noise: float ``[B, D]``, the Gaussian draw.
        noise_clip: c >= 0.
    """
    _check_same_shape("mu_next", mu_next, "noise", noise)
    if not noise_clip >= 0:
        raise ValueError(f"noise_clip must be >= 0, got {noise_clip}")
    return (mu_next + noise.clamp(-noise_clip, noise_clip)).clamp(-1.0, 1.0)


def critic_loss(q_values: Sequence[Tensor], target: Tensor, weights: Tensor) -> Tensor:
    """The critics' loss: ``sum_i mean(w * (Q_i(s, a) - y)^2) / 2``, each critic regressed on
    the same target ``y`` with the importance-sampling weights ``w`` (all ones for uniform
    replay).

    Args:
        q_values: one float ``[B]`` tensor per critic, differentiable.
        target: float ``[B]``, ``y`` (no gradient).
        weights: float ``[B]``.
    """
    if not q_values:
        raise ValueError("critic_loss needs at least one critic's values")
    _check_same_shape("target", target, "weights", weights)
    total = torch.zeros((), dtype=target.dtype, device=target.device)
    for i, q in enumerate(q_values):
        _check_same_shape(f"q_values[{i}]", q, "target", target)
        total = total + 0.5 * (weights * (q - target).square()).mean()
    return total


def td_errors_mean_abs(q_values: Sequence[Tensor], target: Tensor) -> Tensor:
    """``mean_i |y - Q_i(s, a)|`` per item, float ``[B]``: what a transition's new priority is
    made from (``targets.td_priorities``)."""
    if not q_values:
        raise ValueError("td_errors_mean_abs needs at least one critic's values")
    total = torch.zeros_like(target)
    for i, q in enumerate(q_values):
        _check_same_shape(f"q_values[{i}]", q, "target", target)
        total = total + (target - q).abs()
    return total / len(q_values)


def deterministic_policy_loss(q_of_policy: Tensor) -> Tensor:
    """DDPG's and TD3's policy loss, ``-mean Q(s, mu(s))`` (the deterministic policy gradient
    ascends Q)."""
    return -q_of_policy.mean()


def sac_policy_loss(logp: Tensor, q_of_policy: Tensor, alpha: Tensor | float) -> Tensor:
    """SAC's policy loss, ``mean(alpha * log pi(a~ | s) - min_i Q_i(s, a~))`` for reparameterized
    ``a~ ~ pi(s)`` (Haarnoja et al. 2018, eq. 7; ``alpha`` detached)."""
    _check_same_shape("logp", logp, "q_of_policy", q_of_policy)
    return (alpha * logp - q_of_policy).mean()


def temperature_loss(log_alpha: Tensor, logp: Tensor, target_entropy: float) -> Tensor:
    """SAC's temperature loss, ``-mean(log_alpha * (log pi(a~ | s) + H))`` with the log-probs
    detached (Haarnoja et al. 2018b, eq. 18, taken in log alpha as the published implementations
    do: the same fixed point, alpha stays positive). Its gradient raises alpha when the policy's
    entropy ``-log pi`` is below the target ``H`` and lowers it when above."""
    if log_alpha.numel() != 1:
        raise ValueError(f"log_alpha must hold one value, got shape {tuple(log_alpha.shape)}")
    return -(log_alpha.reshape(()) * (logp.detach() + target_entropy)).mean()


def polyak_average(target: Tensor, online: Tensor, tau: float) -> Tensor:
    """``(1 - tau) * target + tau * online``: one step of a target network's Polyak average
    (the learner applies it in place to every parameter)."""
    _check_same_shape("target", target, "online", online)
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"tau must be in [0, 1], got {tau}")
    return (1.0 - tau) * target + tau * online


def exploration_noise_scales(num_actors: int, noise: float, spread: float) -> np.ndarray:
    """The standard deviation of each actor's Gaussian exploration noise (DDPG, TD3), Ape-X
    style: log-spaced from ``noise / spread`` (actor 0) to ``noise * spread`` (the last), so that
    some actors explore more and some less than ``noise``; all ``noise`` with one actor or
    ``spread`` 1 (the papers' single actor).

    Returns:
        float64 ``[num_actors]``.
    """
    if num_actors < 1:
        raise ValueError(f"num_actors must be >= 1, got {num_actors}")
    if not noise >= 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    if not spread >= 1:
        raise ValueError(f"spread must be >= 1, got {spread}")
    if num_actors == 1:
        return np.full(1, float(noise))
    exponents = np.linspace(-1.0, 1.0, num_actors)
    return noise * spread**exponents

"""Policy distributions as small pure functions: sampling, log-probabilities and entropies of
categorical and diagonal Gaussian policies (optionally tanh-squashed), and the affine map between a
policy's [-1, 1] actions and an env's ``Box``.

Actors sample with them (``algos.actor_critic``); learners take log-probabilities and entropies
of the actions that were sampled. They read the outputs of ``models``' actor-critic networks
(``logits``; ``mean`` and ``log_std``) and hold no parameters themselves.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)


def categorical_sample(logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Actions drawn from softmax(logits).

    Args:
        logits: ``[B, A]``; ``-inf`` masks an action out.
        generator: a ``torch.Generator`` on ``logits``' device for reproducible draws.

    Returns:
        int64 ``[B]`` actions in ``[0, A)``.
    """
    _check_logits(logits)
    probs = torch.softmax(logits.detach(), dim=-1).reshape(-1, logits.shape[-1])
    actions = torch.multinomial(probs, 1, generator=generator)
    return actions.reshape(logits.shape[:-1])


def categorical_log_prob(logits: Tensor, action: Tensor) -> Tensor:
    """log softmax(logits)[action].

    Args:
        logits: ``[B, A]``.
        action: integer ``[B]`` actions in ``[0, A)`` (not range-checked: that would sync a GPU).

    Returns:
        float ``[B]``.
    """
    _check_logits(logits)
    if action.dtype.is_floating_point or action.dtype.is_complex or action.dtype == torch.bool:
        raise ValueError(f"action must be an integer tensor, got dtype {action.dtype}")
    if action.shape != logits.shape[:-1]:
        raise ValueError(
            f"action must have shape {tuple(logits.shape[:-1])} (logits' without the last dim), "
            f"got {tuple(action.shape)}"
        )
    log_probs = torch.log_softmax(logits, dim=-1)
    return log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)


def categorical_entropy(logits: Tensor) -> Tensor:
    """Entropy -sum_a p(a) log p(a) of softmax(logits), in nats.

    Masked (``-inf``) actions count 0, with finite gradients (the log-probs are clamped to the
    dtype's smallest finite value, as ``torch.distributions.Categorical`` does).

    Args:
        logits: ``[B, A]``.

    Returns:
        float ``[B]``.
    """
    _check_logits(logits)
    log_probs = torch.log_softmax(logits, dim=-1).clamp(min=torch.finfo(logits.dtype).min)
    return -(log_probs.exp() * log_probs).sum(dim=-1)


def mask_logits(logits: Tensor, legal: Tensor) -> Tensor:
    """Logits whose illegal actions get the dtype's most negative finite value: softmax gives
    them probability exactly 0, and log-probabilities, entropies and gradients stay finite (an
    ``-inf`` would give NaN where a row has no legal action, as a padded step may).

    Turn-based games give a legal-action mask with each observation; actors sample from these
    logits, and learners recompute log pi(a | s) and the entropy from them, so that the ratio
    pi / mu compares the same distributions and the entropy covers the legal actions only.

    Args:
        logits: ``[B, A]`` (any leading dims).
        legal: bool, of ``logits``' shape: True where the action is legal.

    Returns:
        ``logits``' shape and dtype, a new tensor.
    """
    _check_logits(logits)
    if legal.dtype != torch.bool:
        raise ValueError(f"legal must be a bool tensor, got dtype {legal.dtype}")
    if legal.shape != logits.shape:
        raise ValueError(
            f"legal must have logits' shape {tuple(logits.shape)}, got {tuple(legal.shape)}"
        )
    return logits.masked_fill(~legal, torch.finfo(logits.dtype).min)


def gaussian_sample(
    mean: Tensor, log_std: Tensor, generator: torch.Generator | None = None
) -> Tensor:
    """A draw ``mean + exp(log_std) * eps`` with ``eps ~ N(0, I)``: reparameterized, so it carries
    gradients to ``mean`` and ``log_std`` (call under ``torch.no_grad()`` to act).

    Args:
        mean: ``[B, D]``.
        log_std: ``[B, D]``, or any shape that broadcasts to ``mean``'s (such as ``[D]``).
        generator: a ``torch.Generator`` on ``mean``'s device for reproducible draws.

    Returns:
        ``[B, D]`` unbounded actions (not clipped: clip them, or use the squashed Gaussian, before
        ``scale_action`` to a bounded Box).
    """
    _check_gaussian(mean, log_std)
    noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype, device=mean.device)
    return mean + log_std.exp() * noise


def gaussian_log_prob(mean: Tensor, log_std: Tensor, action: Tensor) -> Tensor:
    """log N(action; mean, exp(log_std)^2 I), summed over the action dims.

    Args:
        mean: ``[B, D]``.
        log_std: ``[B, D]`` or broadcastable to it.
        action: ``[B, D]`` unbounded actions.

    Returns:
        float ``[B]``.
    """
    _check_gaussian(mean, log_std, action)
    z = (action - mean) * torch.exp(-log_std)
    return (-0.5 * z.square() - log_std - _HALF_LOG_2PI).sum(dim=-1)


def gaussian_entropy(log_std: Tensor) -> Tensor:
    """Entropy of a diagonal Gaussian, sum over dims of ``0.5 + 0.5 log(2 pi) + log_std``, in nats.

    Args:
        log_std: ``[B, D]`` (a ``[D]`` log-std gives a scalar).

    Returns:
        float ``[B]``.
    """
    if log_std.dim() < 1:
        raise ValueError(f"log_std must be [B, D], got shape {tuple(log_std.shape)}")
    return (log_std + (0.5 + _HALF_LOG_2PI)).sum(dim=-1)


class SquashedGaussianSample(NamedTuple):
    """A draw from a tanh-squashed Gaussian.

    Fields:
        action: ``[B, D]`` squashed actions ``tanh(u)`` in [-1, 1] (map them to the env's Box
            with ``scale_action``).
        log_prob: ``[B]`` their log-density (summed over dims, with the tanh correction).
        pre_tanh: ``[B, D]`` the Gaussian draw ``u``; ``log_prob`` from ``u`` is exact, whereas
            recovering ``u`` from ``action`` (``squashed_gaussian_log_prob``) loses precision
            near the edges, so keep ``u`` if the log-prob is needed later.
    """

    action: Tensor
    log_prob: Tensor
    pre_tanh: Tensor


def tanh_log_det_jacobian(pre_tanh: Tensor) -> Tensor:
    """log |d tanh(u) / du| = log(1 - tanh(u)^2), summed over the last dim.

    Computed as ``2 * (log 2 - u - softplus(-2u))``, which is the same quantity in exact
    arithmetic but finite and accurate for large ``|u|`` (where ``1 - tanh(u)^2`` rounds to 0).

    Args:
        pre_tanh: ``[B, D]`` unsquashed actions ``u``.

    Returns:
        float ``[B]``.
    """
    return (2.0 * (_LOG_2 - pre_tanh - F.softplus(-2.0 * pre_tanh))).sum(dim=-1)


def squashed_gaussian_sample(
    mean: Tensor, log_std: Tensor, generator: torch.Generator | None = None
) -> SquashedGaussianSample:
    """A draw ``a = tanh(u)``, ``u ~ N(mean, exp(log_std)^2 I)``, and its log-density

        log p(a) = log N(u; mean, std) - sum_d log(1 - tanh(u_d)^2)

    (change of variables; SAC, Haarnoja et al. 2018, appendix C). Reparameterized like
    ``gaussian_sample``.

    Args:
        mean: ``[B, D]``.
        log_std: ``[B, D]`` or broadcastable to it.
        generator: a ``torch.Generator`` on ``mean``'s device for reproducible draws.

    Returns:
        ``SquashedGaussianSample(action [B, D], log_prob [B], pre_tanh [B, D])``.
    """
    pre_tanh = gaussian_sample(mean, log_std, generator=generator)
    log_prob = gaussian_log_prob(mean, log_std, pre_tanh) - tanh_log_det_jacobian(pre_tanh)
    return SquashedGaussianSample(action=torch.tanh(pre_tanh), log_prob=log_prob, pre_tanh=pre_tanh)


def squashed_gaussian_log_prob(
    mean: Tensor, log_std: Tensor, squashed_action: Tensor, eps: float = 1e-6
) -> Tensor:
    """The log-density of squashed actions ``a = tanh(u)``, inverting ``u = atanh(a)``.

    ``a`` is first clamped to ``[-1 + eps, 1 - eps]`` so that ``atanh`` stays finite: actions at
    (or rounded to) +-1 get the log-prob of ``+-(1 - eps)``, an approximation. Away from the edges
    the result matches ``squashed_gaussian_sample``'s ``log_prob``.

    Args:
        mean: ``[B, D]``.
        log_std: ``[B, D]`` or broadcastable to it.
        squashed_action: ``[B, D]`` actions in [-1, 1] (unscaled: see ``unscale_action``).
        eps: the clamp margin, in (0, 1); the default suits float32.

    Returns:
        float ``[B]``.
    """
    if not 0.0 < eps < 1.0:
        raise ValueError(f"eps must be in (0, 1), got {eps}")
    _check_gaussian(mean, log_std, squashed_action)
    pre_tanh = torch.atanh(squashed_action.clamp(-1.0 + eps, 1.0 - eps))
    return gaussian_log_prob(mean, log_std, pre_tanh) - tanh_log_det_jacobian(pre_tanh)


def _check_logits(logits: Tensor) -> None:
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must be [B, A] with A >= 1, got shape {tuple(logits.shape)}")


def _check_gaussian(mean: Tensor, log_std: Tensor, action: Tensor | None = None) -> None:
    if mean.dim() < 1:
        raise ValueError(f"mean must be [B, D], got shape {tuple(mean.shape)}")
    try:
        broadcast = torch.broadcast_shapes(mean.shape, log_std.shape)
    except RuntimeError:
        broadcast = None
    if broadcast != mean.shape:
        raise ValueError(
            f"log_std of shape {tuple(log_std.shape)} does not broadcast to mean's shape "
            f"{tuple(mean.shape)}"
        )
    if action is not None and action.shape != mean.shape:
        raise ValueError(
            f"action must have mean's shape {tuple(mean.shape)}, got {tuple(action.shape)}"
        )


# Bounded continuous actions. A policy acts in [-1, 1] per dim (a squashed Gaussian's tanh range);
# the env's ``Box(low, high)`` gets the affine image ``low + (a + 1) * (high - low) / 2``, so -1
# maps to ``low``, 1 to ``high`` and 0 to the middle. Replay and the learner keep the [-1, 1]
# action; ``unscale_action`` is the inverse for actions that come from the env's side.

ArrayOrTensor = TypeVar("ArrayOrTensor", np.ndarray, Tensor)


def scale_action(
    action: ArrayOrTensor, low: np.ndarray | float, high: np.ndarray | float
) -> ArrayOrTensor:
    """Map ``action`` in [-1, 1] to the Box ``[low, high]``: ``low + (action + 1) * (high - low)
    / 2``. No clipping (values outside [-1, 1] land outside the Box).

    Args:
        action: ``[..., D]`` numpy array or tensor (the result is of the same kind, dtype and
            device).
        low, high: the Box bounds, floats or numpy arrays broadcastable to ``action`` (a Box's
            ``low`` and ``high``); finite, with ``high > low``.
    """
    low_, high_ = _box_bounds(action, low, high)
    return low_ + (action + 1.0) * (0.5 * (high_ - low_))


def unscale_action(
    action: ArrayOrTensor, low: np.ndarray | float, high: np.ndarray | float
) -> ArrayOrTensor:
    """The inverse of ``scale_action``: map ``action`` in ``[low, high]`` to [-1, 1],
    ``2 * (action - low) / (high - low) - 1``. No clipping. Arguments as ``scale_action``'s."""
    low_, high_ = _box_bounds(action, low, high)
    return 2.0 * (action - low_) / (high_ - low_) - 1.0


def _box_bounds(
    action: np.ndarray | Tensor, low: np.ndarray | float, high: np.ndarray | float
) -> tuple[Any, Any]:
    """Checked bounds, as tensors on ``action``'s device and in its dtype when it is a tensor,
    else as numpy arrays in its dtype (when floating)."""
    low_arr = np.asarray(low, dtype=np.float64)
    high_arr = np.asarray(high, dtype=np.float64)
    if not (np.all(np.isfinite(low_arr)) and np.all(np.isfinite(high_arr))):
        raise ValueError(
            f"the Box must be bounded to scale actions, got low={low_arr} and high={high_arr}"
        )
    if not np.all(high_arr > low_arr):
        raise ValueError(f"the Box needs high > low, got low={low_arr} and high={high_arr}")
    if isinstance(action, Tensor):
        dtype = action.dtype if action.dtype.is_floating_point else torch.float32
        return (
            torch.as_tensor(low_arr, dtype=dtype, device=action.device),
            torch.as_tensor(high_arr, dtype=dtype, device=action.device),
        )
    dtype = action.dtype if np.issubdtype(action.dtype, np.floating) else np.float64
    return low_arr.astype(dtype), high_arr.astype(dtype)


def product_categorical_log_prob(logits: Tensor, action: Tensor) -> Tensor:
    """log pi(a) of a product of categoricals (a MultiDiscrete action): the sum over its ``K``
    parts. ``logits`` ``[..., K, N]`` (``-inf`` past a part's size), ``action`` integer
    ``[..., K]``; returns ``[...]``."""
    return categorical_log_prob(logits, action).sum(dim=-1)


def product_categorical_entropy(logits: Tensor) -> Tensor:
    """The entropy of a product of independent categoricals: the sum of the parts'; ``[...]``."""
    return categorical_entropy(logits).sum(dim=-1)


def hybrid_log_prob_and_entropy(
    logits: Tensor, mean: Tensor, log_std: Tensor, action: Tensor, squash: bool = False
) -> tuple[Tensor, Tensor]:
    """log pi(a) and the entropy of a product of categoricals (``logits [..., K, N]``) and one
    diagonal Gaussian (``mean``, ``log_std`` ``[..., D]``; ``squash``: tanh-squashed, its entropy
    the Gaussian's before the tanh), for float rows ``action [..., K + D]``: the ``K`` indices
    first, then the ``D`` values. Both sums run over all parts."""
    k = logits.shape[-2]
    if action.shape[-1] != k + mean.shape[-1]:
        raise ValueError(
            f"a hybrid action has {k} indices and {mean.shape[-1]} values, got rows of "
            f"{action.shape[-1]}"
        )
    indices = action[..., :k].round().long()
    values = action[..., k:]
    logp = product_categorical_log_prob(logits, indices)
    if squash:
        logp = logp + squashed_gaussian_log_prob(mean, log_std, values)
    else:
        logp = logp + gaussian_log_prob(mean, log_std, values)
    return logp, product_categorical_entropy(logits) + gaussian_entropy(log_std)

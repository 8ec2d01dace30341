"""Pure RL math: n-step returns, double-Q bootstraps, prioritized-replay weights, exploration.

Everything the learners and actors compute that a paper writes as an equation lives here, so the
algorithm files (``apexrl/algos/*.py``) only call these functions and sum or average the results.

Conventions (see STYLE.md, "The math"):

- torch tensors, **time-major** ``[T, B, ...]``; names carry time suffixes (``r_t``).
- Episode ends arrive as two boolean flags with gymnasium semantics: ``terminated_t`` (the step
  from ``s_t`` reached a terminal state, whose value is 0) and ``truncated_t`` (the episode was cut
  off, e.g. by a time limit; the state still has a value). The discount
  ``gamma * (1 - terminated)`` is derived here, never carried on the wire. Truncation never zeroes
  a bootstrap.
- No config objects, no globals, no in-place mutation of inputs; every hyperparameter is an
  argument.
- Shapes are checked at entry; a mismatch raises ``ValueError`` naming both shapes.

The exploration helpers at the end (``per_actor_epsilon``, ``epsilon_greedy``) are numpy, because
actors select actions on numpy Q-values.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

# --------------------------------------------------------------------------------------------------
# Shape and value checks
# --------------------------------------------------------------------------------------------------


def _check_same_shape(name_a: str, a: Tensor, name_b: str, b: Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{name_a} and {name_b} must have the same shape, "
            f"got {tuple(a.shape)} and {tuple(b.shape)}"
        )


def _check_bool(name: str, x: Tensor) -> None:
    if x.dtype != torch.bool:
        raise ValueError(f"{name} must be a bool tensor, got dtype {x.dtype}")


def _check_gamma(gamma: float) -> None:
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")


# --------------------------------------------------------------------------------------------------
# n-step returns (Sutton & Barto 7.1; Ape-X, Horgan et al. 2018)
# --------------------------------------------------------------------------------------------------


class NStepWindow(NamedTuple):
    """The n-step window starting at each step ``t``; every field is ``[T - n + 1, B]``.

    Fields:
        reward: float32, sum_{k<m} gamma^k r_{t+k}.
        num_steps: int64, the window length m in [1, n].
        terminated: bool, the last step of the window (t + m - 1) terminated the episode.
        truncated: bool, the last step of the window was truncated and did not terminate.
        bootstrap_index: int64, t + m - 1: the index into the per-step ``next_obs`` array whose
            entry is the state to bootstrap from (at an episode end, the episode's final
            observation).
    """

    reward: Tensor
    num_steps: Tensor
    terminated: Tensor
    truncated: Tensor
    bootstrap_index: Tensor


def n_step_window(
    r_t: Tensor, terminated_t: Tensor, truncated_t: Tensor, gamma: float, n: int
) -> NStepWindow:
    """Discounted n-step reward sums that stop at episode ends.

    Reference: n-step return (Sutton & Barto 2018, eq. 7.1) as used by Ape-X (Horgan et al. 2018)
    with n = 3.

    For each start ``t`` in ``0 .. T - n``::

        m_t    = min(n, 1 + min{k >= 0 : terminated[t+k] or truncated[t+k]})
        reward = sum_{k=0}^{m_t - 1} gamma^k * r[t+k]

    Episode-boundary rule: a window never crosses an episode end. If step ``t + k`` ended the
    episode (terminated or truncated) with ``k < n - 1``, the window is shortened to
    ``m_t = k + 1`` and rewards after it (which belong to the next episode) are ignored, even if
    they are NaN. The flags of the last step of the window decide the bootstrap
    (``n_step_target``): terminated means no bootstrap; truncated still bootstraps from the final
    observation of the episode, ``next_obs[t + m_t - 1]``.

    Only starts with a full ``n`` steps of lookahead inside the ``T`` steps are returned, so a
    window that reaches the end of the array without an episode end always has ``m_t = n``.

    Args:
        r_t: float ``[T, B]``, the reward received after the action at step ``t``.
        terminated_t: bool ``[T, B]``, step ``t`` ended the episode in a terminal state.
        truncated_t: bool ``[T, B]``, step ``t`` ended the episode by truncation (time limit).
        gamma: discount factor in [0, 1].
        n: window length, ``1 <= n <= T``.

    Returns:
        ``NStepWindow`` with fields of shape ``[T - n + 1, B]``.
    """
    if r_t.dim() != 2:
        raise ValueError(f"r_t must be [T, B], got shape {tuple(r_t.shape)}")
    _check_same_shape("r_t", r_t, "terminated_t", terminated_t)
    _check_same_shape("r_t", r_t, "truncated_t", truncated_t)
    _check_bool("terminated_t", terminated_t)
    _check_bool("truncated_t", truncated_t)
    if not r_t.is_floating_point():
        raise ValueError(f"r_t must be a float tensor, got dtype {r_t.dtype}")
    _check_gamma(gamma)
    num_time_steps = r_t.shape[0]
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if num_time_steps < n:
        raise ValueError(f"need at least n = {n} time steps, got r_t of shape {tuple(r_t.shape)}")

    num_starts = num_time_steps - n + 1
    done_t = terminated_t | truncated_t
    # in_window[s, b]: offset k (current loop value) is still inside the window that starts at s.
    in_window = torch.ones((num_starts, r_t.shape[1]), dtype=torch.bool, device=r_t.device)
    reward = torch.zeros((num_starts, r_t.shape[1]), dtype=r_t.dtype, device=r_t.device)
    num_steps = torch.zeros((num_starts, r_t.shape[1]), dtype=torch.int64, device=r_t.device)
    for k in range(n):
        r_k = r_t[k : k + num_starts]
        # where() rather than a multiply: rewards past an episode end must not leak in, even NaN.
        reward = reward + torch.where(in_window, (gamma**k) * r_k, torch.zeros_like(r_k))
        num_steps = num_steps + in_window.to(torch.int64)
        in_window = in_window & ~done_t[k : k + num_starts]

    start = torch.arange(num_starts, dtype=torch.int64, device=r_t.device).unsqueeze(1)
    bootstrap_index = start + num_steps - 1
    terminated = torch.gather(terminated_t, 0, bootstrap_index)
    truncated = torch.gather(truncated_t, 0, bootstrap_index) & ~terminated
    return NStepWindow(
        reward=reward.to(torch.float32),
        num_steps=num_steps,
        terminated=terminated,
        truncated=truncated,
        bootstrap_index=bootstrap_index,
    )


def n_step_target(
    reward: Tensor, num_steps: Tensor, terminated: Tensor, q_bootstrap: Tensor, gamma: float
) -> Tensor:
    """The n-step Q-learning target from an ``NStepWindow``.

    Reference: Ape-X (Horgan et al. 2018); Sutton & Barto 2018, eq. 7.1::

        y = reward + gamma^m * (1 - terminated) * q_bootstrap

    Episode-boundary rule: only termination zeroes the bootstrap; a truncated window still
    bootstraps, with ``gamma^m`` for its shortened length m, from the value of the episode's final
    observation. ``q_bootstrap`` is used as given: compute it without gradients (target network).

    Args:
        reward: float ``[B]``, sum_{k<m} gamma^k r_{t+k}.
        num_steps: int ``[B]``, the window length m.
        terminated: bool ``[B]``, the window ended in a terminal state.
        q_bootstrap: float ``[B]``, the value of the state after the window, e.g.
            ``double_q_bootstrap(q_target(next_obs), q_online(next_obs))``.
        gamma: discount factor in [0, 1].

    Returns:
        float ``[B]`` in the dtype of ``q_bootstrap``.
    """
    _check_same_shape("reward", reward, "q_bootstrap", q_bootstrap)
    _check_same_shape("num_steps", num_steps, "q_bootstrap", q_bootstrap)
    _check_same_shape("terminated", terminated, "q_bootstrap", q_bootstrap)
    _check_bool("terminated", terminated)
    _check_gamma(gamma)
    if num_steps.is_floating_point() or num_steps.dtype == torch.bool:
        raise ValueError(f"num_steps must be an integer tensor, got dtype {num_steps.dtype}")
    dtype = q_bootstrap.dtype
    discount = torch.pow(gamma, num_steps.to(dtype))
    discount = torch.where(terminated, torch.zeros_like(discount), discount)
    return reward.to(dtype) + discount * q_bootstrap


def double_q_bootstrap(q_target_t: Tensor, q_online_t: Tensor) -> Tensor:
    """Double-Q bootstrap value: the target network evaluates the online network's greedy action.

    Reference: van Hasselt, Guez & Silver 2016, "Deep Reinforcement Learning with Double
    Q-learning"::

        q(s) = Q_target(s, argmax_a Q_online(s, a))

    Ties in ``Q_online`` go to the lowest action index.

    Args:
        q_target_t: float ``[B, A]`` (any leading dims), target-network Q-values at the bootstrap
            states.
        q_online_t: float ``[B, A]``, online-network Q-values at the same states.

    Returns:
        ``[B]`` in the dtype of ``q_target_t``.
    """
    _check_same_shape("q_target_t", q_target_t, "q_online_t", q_online_t)
    if q_target_t.dim() < 1 or q_target_t.shape[-1] < 1:
        raise ValueError(f"q_target_t must be [B, A] with A >= 1, got {tuple(q_target_t.shape)}")
    greedy_action = torch.argmax(q_online_t, dim=-1, keepdim=True)
    return torch.gather(q_target_t, -1, greedy_action).squeeze(-1)


# --------------------------------------------------------------------------------------------------
# Prioritized replay (Schaul et al. 2016)
# --------------------------------------------------------------------------------------------------


def importance_weights(probabilities: Tensor | np.ndarray, table_size: int, beta: float) -> Tensor:
    """Prioritized-replay importance-sampling weights, normalised by the batch maximum.

    Reference: Schaul, Quan, Antonoglou & Silver 2016, "Prioritized Experience Replay", sec. 3.4::

        w_i = (N * P(i))^(-beta) / max_j w_j

    where ``P(i)`` is the probability with which item ``i`` was sampled and ``N`` the number of
    items in the table. The largest weight in the batch is exactly 1 (the rarest sample).

    Args:
        probabilities: float64 or float32 ``[B]``, ``P(i)`` of each sampled item, all > 0.
        table_size: N, the number of items in the table when the batch was sampled, >= 1.
        beta: importance-sampling exponent, >= 0 (Ape-X: 0.4).

    Returns:
        float32 ``[B]`` in (0, 1].
    """
    probabilities = torch.as_tensor(probabilities)
    if probabilities.dim() != 1 or probabilities.shape[0] == 0:
        raise ValueError(f"probabilities must be [B] with B >= 1, got {tuple(probabilities.shape)}")
    if not probabilities.is_floating_point():
        raise ValueError(f"probabilities must be float, got dtype {probabilities.dtype}")
    if table_size < 1:
        raise ValueError(f"table_size must be >= 1, got {table_size}")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    p = probabilities.to(torch.float64)
    if not bool(torch.all(torch.isfinite(p) & (p > 0))):
        raise ValueError("probabilities must be finite and > 0")
    # Log space keeps (N * P)^(-beta) finite for tiny P and large N; dividing by the max is then a
    # subtraction.
    log_w = -beta * (np.log(table_size) + torch.log(p))
    return torch.exp(log_w - log_w.max()).to(torch.float32)


def td_priorities(td_error: Tensor, eps: float = 1e-6) -> Tensor:
    """New replay priorities from TD errors: ``p = |delta| + eps``.

    Reference: Schaul et al. 2016, sec. 3.3 (proportional prioritization). ``eps`` keeps every item
    sampleable. The result is detached and float64, the dtype of the replay sum tree.

    Args:
        td_error: float ``[B]`` (any shape).
        eps: small positive constant, >= 0.

    Returns:
        float64 tensor of the same shape, on the same device, with no gradient.
    """
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    return td_error.detach().abs().to(torch.float64) + eps


# --------------------------------------------------------------------------------------------------
# Exploration (numpy, for actors)
# --------------------------------------------------------------------------------------------------


def per_actor_epsilon(
    actor_index: int, num_actors: int, epsilon: float = 0.4, alpha: float = 7.0
) -> float:
    """Ape-X per-actor exploration rate, fixed for the actor's lifetime.

    Reference: Horgan et al. 2018, "Distributed Prioritized Experience Replay" (Atari setup)::

        eps_i = epsilon ^ (1 + alpha * i / (N - 1)),   i = 0 .. N - 1

    so actor 0 explores with ``epsilon`` and actor N - 1 with ``epsilon ^ (1 + alpha)``. With a
    single actor (N = 1) the formula divides by zero; we return ``epsilon``, the most exploratory
    end, because a lone actor is usually a debugging or small run that needs exploration.

    Args:
        actor_index: i, in ``0 .. num_actors - 1``.
        num_actors: N >= 1.
        epsilon: base exploration rate (Ape-X: 0.4).
        alpha: spread exponent (Ape-X: 7).
    """
    if num_actors < 1:
        raise ValueError(f"num_actors must be >= 1, got {num_actors}")
    if not 0 <= actor_index < num_actors:
        raise ValueError(f"actor_index must be in [0, {num_actors}), got {actor_index}")
    if num_actors == 1:
        return float(epsilon)
    return float(epsilon ** (1.0 + alpha * actor_index / (num_actors - 1)))


def epsilon_greedy(
    q_values: np.ndarray, epsilon: np.ndarray | float, rng: np.random.Generator
) -> np.ndarray:
    """Epsilon-greedy actions: uniform random with probability epsilon, else argmax_a q.

    Each row draws one uniform number and one random action whatever its epsilon, so the generator's
    stream does not depend on the epsilon values. Greedy ties go to the lowest action index.

    Args:
        q_values: ``[B, A]`` Q-values.
        epsilon: scalar or ``[B]`` per-row exploration rates in [0, 1].
        rng: the caller's generator (seeded per actor).

    Returns:
        int64 ``[B]`` actions in ``0 .. A - 1``.
    """
    q_values = np.asarray(q_values)
    if q_values.ndim != 2 or q_values.shape[1] < 1:
        raise ValueError(f"q_values must be [B, A] with A >= 1, got shape {q_values.shape}")
    num_rows, num_actions = q_values.shape
    epsilon = np.asarray(epsilon, dtype=np.float64)
    if epsilon.ndim != 0 and epsilon.shape != (num_rows,):
        raise ValueError(
            f"epsilon must be a scalar or [B], got shape {epsilon.shape} for q_values "
            f"of shape {q_values.shape}"
        )
    if np.any(~((epsilon >= 0.0) & (epsilon <= 1.0))):
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
    greedy = np.argmax(q_values, axis=1).astype(np.int64)
    random_actions = rng.integers(0, num_actions, size=num_rows, dtype=np.int64)
    explore = rng.random(num_rows) < epsilon
    return np.where(explore, random_actions, greedy)

"""Pure RL math: n-step returns, double-Q, R2D2 value rescaling, prioritized replay, V-trace,
GAE, PPO, exploration.

Everything the learners and actors compute that a paper writes as an equation lives here, so the
algorithm files (``apexrl/algos/*.py``) only call these functions and sum or average the results.

Conventions (the formulas and published settings: docs/algorithms.md):

- torch tensors, **time-major** ``[T, B, ...]``; names carry time suffixes (``r_t``).
- Episode ends arrive as two boolean flags with gymnasium semantics: ``terminated_t`` (the step
  from ``s_t`` reached a terminal state, whose value is 0) and ``truncated_t`` (the episode was cut
  off, e.g. by a time limit; the state still has a value). The discount
  ``gamma * (1 - terminated)`` is derived on the learner, never carried on the wire: the n-step
  functions take the flags and ``gamma``; ``vtrace`` and ``gae`` take the per-step
  ``discount_t = gamma * (1 - terminated_t)`` (bootstrapping) and
  ``done_t = terminated_t | truncated_t`` (where a trace stops). Truncation never zeroes a
  bootstrap, and no trace or window crosses an episode end.
- No config objects, no globals, no in-place mutation of inputs; every hyperparameter is an
  argument.
- Shapes are checked at entry; a mismatch raises ``ValueError`` naming both shapes.

The exploration helpers at the end (``per_actor_epsilon``, ``epsilon_greedy``,
``check_legal_actions``) are numpy, because actors select actions on numpy Q-values.
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


def _check_time_major(name: str, x: Tensor) -> None:
    if x.dim() != 2 or x.shape[0] < 1:
        raise ValueError(f"{name} must be [T, B] with T >= 1, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a float tensor, got dtype {x.dtype}")


def _check_trajectory(
    r_t: Tensor, v_tm1: Tensor, v_t: Tensor, discount_t: Tensor, done_t: Tensor
) -> None:
    """The five ``[T, B]`` inputs shared by ``vtrace`` and ``gae``."""
    _check_time_major("r_t", r_t)
    for name, x in (("v_tm1", v_tm1), ("v_t", v_t), ("discount_t", discount_t)):
        _check_same_shape("r_t", r_t, name, x)
        _check_time_major(name, x)
    _check_same_shape("r_t", r_t, "done_t", done_t)
    _check_bool("done_t", done_t)


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


def double_q_bootstrap(
    q_target_t: Tensor, q_online_t: Tensor, legal_t: Tensor | None = None
) -> Tensor:
    """Double-Q bootstrap value: the target network evaluates the online network's greedy action.

    Reference: van Hasselt, Guez & Silver 2016, "Deep Reinforcement Learning with Double
    Q-learning"::

        q(s) = Q_target(s, argmax_a Q_online(s, a))

    With ``legal_t`` (a turn-based game's legal-action mask) the argmax runs over the legal
    actions of ``s`` only::

        q(s) = Q_target(s, argmax_{a legal in s} Q_online(s, a)),   0 if no action is legal

    A state with no legal action can only be terminal (or padding), whose bootstrap the target
    zeroes anyway; 0 keeps it finite. Ties in ``Q_online`` go to the lowest action index.

    Args:
        q_target_t: float ``[B, A]`` (any leading dims), target-network Q-values at the bootstrap
            states.
        q_online_t: float ``[B, A]``, online-network Q-values at the same states.
        legal_t: bool ``[B, A]`` or None (every action legal): True where the action is legal.

    Returns:
        ``[B]`` in the dtype of ``q_target_t``.
    """
    _check_same_shape("q_target_t", q_target_t, "q_online_t", q_online_t)
    if q_target_t.dim() < 1 or q_target_t.shape[-1] < 1:
        raise ValueError(f"q_target_t must be [B, A] with A >= 1, got {tuple(q_target_t.shape)}")
    action = greedy_actions(q_online_t, legal_t).unsqueeze(-1)
    value = torch.gather(q_target_t, -1, action).squeeze(-1)
    if legal_t is None:
        return value
    return torch.where(legal_t.any(dim=-1), value, torch.zeros_like(value))


def greedy_actions(q_t: Tensor, legal_t: Tensor | None = None) -> Tensor:
    """``argmax_a Q(s, a)`` over the last axis, over the legal actions only with ``legal_t``
    (bool, same shape; a row without a legal action gives action 0); ties go to the lowest
    index. int64, the leading dims of ``q_t``."""
    if legal_t is None:
        return torch.argmax(q_t, dim=-1)
    _check_same_shape("q_t", q_t, "legal_t", legal_t)
    _check_bool("legal_t", legal_t)
    return torch.argmax(q_t.masked_fill(~legal_t, float("-inf")), dim=-1)


# --------------------------------------------------------------------------------------------------
# R2D2: value rescaling and n-step targets over a stored sequence (Kapturowski et al. 2019)
# --------------------------------------------------------------------------------------------------


def value_rescale(x: Tensor, eps: float = 1e-3) -> Tensor:
    """The invertible value transform of R2D2.

    Reference: Pohlen et al. 2018 ("Observe and Look Further", prop. A.2), used by R2D2
    (Kapturowski et al. 2019, sec. 2)::

        h(x) = sign(x) * (sqrt(|x| + 1) - 1) + eps * x

    Args:
        x: any float tensor.
        eps: the linear term's weight, > 0 (R2D2: 1e-3); it makes ``h`` strictly increasing.
    """
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def value_rescale_inverse(x: Tensor, eps: float = 1e-3) -> Tensor:
    """The exact inverse of ``value_rescale`` (Pohlen et al. 2018, prop. A.2)::

        h^-1(x) = sign(x) * (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)

    Computed in float64 and cast back: in float32 the ``sqrt(...) - 1`` loses the digits that
    ``/ (2 eps)`` then magnifies.
    """
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    x64 = x.to(torch.float64)
    root = (torch.sqrt(1.0 + 4.0 * eps * (x64.abs() + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return (torch.sign(x64) * (root.square() - 1.0)).to(x.dtype)


def rescaled_n_step_targets(
    r_t: Tensor,
    terminated_t: Tensor,
    truncated_t: Tensor,
    q_bootstrap_t: Tensor,
    gamma: float,
    n: int,
    eps: float = 1e-3,
) -> Tensor:
    """R2D2's n-step targets for every step of a stored sequence, in rescaled value space.

    Reference: Kapturowski et al. 2019, sec. 2 and 3::

        y_t = h( sum_{k<m} gamma^k r_{t+k} + gamma^m * (1 - terminated) * h^-1(q_bootstrap[t+m]) )

    The window from ``t`` has ``m = min(n, ...)`` steps and stops, like ``n_step_window``, at an
    episode end (termination: no bootstrap; truncation: bootstrap from the final observation) and
    also at the end of the sequence, where it bootstraps from position ``T``, the observation after
    the sequence's last step. Steps after an episode end (padding) get targets too; mask them.

    Args:
        r_t: float ``[T, B]``, reward after the action at step ``t``.
        terminated_t, truncated_t: bool ``[T, B]``, step ``t`` ended the episode that way.
        q_bootstrap_t: float ``[T + 1, B]``, the (rescaled) value of the state at each position,
            position ``t`` being the observation step ``t`` acted on and position ``T`` the one
            after the last step; e.g. ``double_q_bootstrap(q_target, q_online)``, no gradient.
        gamma: discount in [0, 1]; n: the return's length, >= 1; eps: of ``value_rescale``.

    Returns:
        float ``[T, B]`` in the dtype of ``q_bootstrap_t``.
    """
    if r_t.dim() != 2:
        raise ValueError(f"r_t must be [T, B], got shape {tuple(r_t.shape)}")
    num_steps, batch = r_t.shape
    if tuple(q_bootstrap_t.shape) != (num_steps + 1, batch):
        raise ValueError(
            f"q_bootstrap_t must be [T + 1, B] = [{num_steps + 1}, {batch}], "
            f"got {tuple(q_bootstrap_t.shape)}"
        )
    _check_same_shape("r_t", r_t, "terminated_t", terminated_t)
    _check_same_shape("r_t", r_t, "truncated_t", truncated_t)
    _check_bool("truncated_t", truncated_t)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    # The sequence's end stops every window and bootstraps from position T, as a truncation does;
    # n - 1 padding steps after it give every start a full window to look through.
    sequence_end = torch.zeros_like(truncated_t)
    sequence_end[-1] = True
    pad = torch.zeros((n - 1, batch), dtype=r_t.dtype, device=r_t.device)
    pad_flag = torch.zeros((n - 1, batch), dtype=torch.bool, device=r_t.device)
    window = n_step_window(
        torch.cat([r_t, pad]),
        torch.cat([terminated_t, pad_flag]),
        torch.cat([truncated_t | sequence_end, pad_flag]),
        gamma,
        n,
    )
    bootstrap = torch.gather(q_bootstrap_t, 0, window.bootstrap_index + 1)
    y = n_step_target(
        window.reward.to(torch.float64),
        window.num_steps,
        window.terminated,
        value_rescale_inverse(bootstrap.to(torch.float64), eps),
        gamma,
    )
    return value_rescale(y, eps).to(q_bootstrap_t.dtype)


def sequence_priorities(
    td_abs_t: Tensor, mask_t: Tensor, eta: float = 0.9, eps: float = 1e-6
) -> Tensor:
    """Replay priority of each sequence from the absolute TD errors of its trained steps.

    Reference: Kapturowski et al. 2019, sec. 2::

        p = eta * max_t |delta_t| + (1 - eta) * mean_t |delta_t|   (+ eps, over steps where mask)

    A sequence with no masked-in step gets ``eps``.

    Args:
        td_abs_t: float ``[T, B]``, |delta| per step.
        mask_t: bool ``[T, B]``, the steps that count.
        eta: in [0, 1] (R2D2: 0.9).
        eps: small constant >= 0 that keeps every sequence sampleable.

    Returns:
        float64 ``[B]``, detached.
    """
    _check_same_shape("td_abs_t", td_abs_t, "mask_t", mask_t)
    _check_bool("mask_t", mask_t)
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"eta must be in [0, 1], got {eta}")
    td = td_abs_t.detach().abs().to(torch.float64)
    masked = torch.where(mask_t, td, torch.zeros_like(td))
    count = mask_t.sum(dim=0)
    mean = masked.sum(dim=0) / count.clamp(min=1)
    return eta * masked.max(dim=0).values + (1.0 - eta) * mean + eps


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
# V-trace (IMPALA, Espeholt et al. 2018)
# --------------------------------------------------------------------------------------------------


class VTrace(NamedTuple):
    """V-trace outputs; both fields are ``[T, B]`` and carry no gradient.

    Fields:
        vs: the value targets v_s, regressed on by V(x_s).
        pg_advantage: rho_s * (r_s + gamma_s * v_{s+1} - V(x_s)), the policy-gradient advantage.
    """

    vs: Tensor
    pg_advantage: Tensor


def vtrace(
    r_t: Tensor,
    v_tm1: Tensor,
    v_t: Tensor,
    discount_t: Tensor,
    done_t: Tensor,
    log_rho_tm1: Tensor,
    *,
    clip_rho: float = 1.0,
    clip_c: float = 1.0,
    clip_pg_rho: float = 1.0,
) -> VTrace:
    """V-trace value targets and policy-gradient advantages for off-policy actor-critic.

    Reference: Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with Importance
    Weighted Actor-Learner Architectures", sec. 4.1 (eq. 1) and 4.2::

        v_s     = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t
        delta_t = rho_t * (r_t + gamma_t V(x_{t+1}) - V(x_t))
        rho_t   = min(clip_rho, pi(a_t|x_t) / mu(a_t|x_t)),  c_i = min(clip_c, pi / mu)

    computed by the equivalent backward recursion, with v_T = V(x_T) the bootstrap value::

        v_s - V(x_s) = delta_s + gamma_s c_s (v_{s+1} - V(x_{s+1}))
        pg_advantage_s = min(clip_pg_rho, pi / mu) * (r_s + gamma_s v_{s+1} - V(x_s))

    The paper's ``gamma^{t-s}`` becomes the product of per-step discounts. Pass ``math.inf`` as a
    threshold for no clipping. The paper uses rho-bar = c-bar = 1 and the same rho-bar in the
    advantage, hence the defaults.

    Episode-boundary rule: the trace never crosses an episode end. ``discount_t`` is
    ``gamma * (1 - terminated_t)``, so a terminated step does not bootstrap; ``done_t`` is
    ``terminated_t | truncated_t`` and cuts the correction term, so a truncated step bootstraps
    (with ``gamma``) from ``v_t``, the value of the episode's final observation, and nothing from
    the next episode reaches it. There ``v_{s+1}`` in the advantage is that value itself. Inside
    an episode ``v_t[s]`` should equal ``v_tm1[s + 1]``.

    Targets, not losses: computed under ``torch.no_grad()``; the outputs never carry gradient.

    Args:
        r_t: float ``[T, B]``, the reward received after the action at step ``s``.
        v_tm1: float ``[T, B]``, V(x_s), the learner's value of the observation at step ``s``.
        v_t: float ``[T, B]``, V(x_{s+1}), the value of the next observation: ``v_tm1[s + 1]``
            inside an episode, the final observation's value at an episode end, and the bootstrap
            value in the last row.
        discount_t: float ``[T, B]``, ``gamma * (1 - terminated_t)``.
        done_t: bool ``[T, B]``, ``terminated_t | truncated_t``.
        log_rho_tm1: float ``[T, B]``, ``log pi(a_s|x_s) - log mu(a_s|x_s)`` (learner policy pi,
            behaviour policy mu).
        clip_rho: rho-bar, truncation of the importance weight in delta, > 0.
        clip_c: c-bar, truncation of the trace coefficients c, >= 0.
        clip_pg_rho: truncation of the importance weight in the policy-gradient advantage, > 0.

    Returns:
        ``VTrace`` with ``[T, B]`` fields in the dtype of ``v_tm1``.
    """
    _check_trajectory(r_t, v_tm1, v_t, discount_t, done_t)
    _check_same_shape("r_t", r_t, "log_rho_tm1", log_rho_tm1)
    _check_time_major("log_rho_tm1", log_rho_tm1)
    if not clip_rho > 0:
        raise ValueError(f"clip_rho must be > 0, got {clip_rho}")
    if not clip_c >= 0:
        raise ValueError(f"clip_c must be >= 0, got {clip_c}")
    if not clip_pg_rho > 0:
        raise ValueError(f"clip_pg_rho must be > 0, got {clip_pg_rho}")

    with torch.no_grad():
        dtype = v_tm1.dtype
        r_t, v_t, discount_t = r_t.to(dtype), v_t.to(dtype), discount_t.to(dtype)
        rho = torch.exp(log_rho_tm1.to(dtype))
        delta = torch.clamp(rho, max=clip_rho) * (r_t + discount_t * v_t - v_tm1)
        # The trace weight of step s + 1 in step s; zero where step s ended the episode.
        trace = torch.where(
            done_t, torch.zeros_like(rho), discount_t * torch.clamp(rho, max=clip_c)
        )

        # acc[s] = v_s - V(x_s), built backwards from acc[T] = 0.
        acc = torch.zeros_like(v_tm1[0])
        vs_minus_v = []
        for s in reversed(range(v_tm1.shape[0])):
            acc = delta[s] + trace[s] * acc
            vs_minus_v.append(acc)
        vs_minus_v_tm1 = torch.stack(vs_minus_v[::-1])
        vs = v_tm1 + vs_minus_v_tm1

        # v_{s+1} = V(x_{s+1}) + (v_{s+1} - V(x_{s+1})), the correction cut at an episode end.
        next_correction = torch.cat([vs_minus_v_tm1[1:], torch.zeros_like(vs_minus_v_tm1[:1])])
        vs_t = v_t + torch.where(done_t, torch.zeros_like(next_correction), next_correction)
        pg_advantage = torch.clamp(rho, max=clip_pg_rho) * (r_t + discount_t * vs_t - v_tm1)
    return VTrace(vs=vs, pg_advantage=pg_advantage)


# --------------------------------------------------------------------------------------------------
# PPO (Schulman et al. 2017) with GAE (Schulman et al. 2016)
# --------------------------------------------------------------------------------------------------


def gae(
    r_t: Tensor, v_tm1: Tensor, v_t: Tensor, discount_t: Tensor, done_t: Tensor, lambda_: float
) -> Tensor:
    """Generalized advantage estimates over a time-major rollout.

    Reference: Schulman, Moritz, Levine, Jordan & Abbeel 2016, "High-Dimensional Continuous Control
    Using Generalized Advantage Estimation", eq. 16, in its recursive form::

        delta_t = r_t + gamma_t V(s_{t+1}) - V(s_t)
        A_t     = delta_t + gamma_t * lambda * (1 - done_t) * A_{t+1},   A_T = 0

    The value targets (returns) are ``A_t + V(s_t)``, i.e. ``gae(...) + v_tm1``. With lambda = 1
    they are the discounted return bootstrapped from the last ``v_t``; with lambda = 0 the
    advantage is the one-step TD error.

    Episode-boundary rule: the two roles of an episode end are separate arguments.
    ``discount_t = gamma * (1 - terminated_t)`` decides bootstrapping: a terminated step has
    ``delta_t = r_t - V(s_t)``; a truncated step bootstraps from ``v_t``, the value of the
    episode's final observation. ``done_t = terminated_t | truncated_t`` ends the recursion, so no
    advantage crosses an episode end, even though a truncated step keeps its discount.

    Targets, not losses: computed under ``torch.no_grad()``; the result never carries gradient.

    Args:
        r_t: float ``[T, B]``, the reward received after the action at step ``t``.
        v_tm1: float ``[T, B]``, V(s_t).
        v_t: float ``[T, B]``, V(s_{t+1}): ``v_tm1[t + 1]`` inside an episode, the final
            observation's value at an episode end, and the bootstrap value in the last row.
        discount_t: float ``[T, B]``, ``gamma * (1 - terminated_t)``.
        done_t: bool ``[T, B]``, ``terminated_t | truncated_t``.
        lambda_: the GAE lambda in [0, 1].

    Returns:
        float ``[T, B]`` advantages in the dtype of ``v_tm1``.
    """
    _check_trajectory(r_t, v_tm1, v_t, discount_t, done_t)
    if not 0.0 <= lambda_ <= 1.0:
        raise ValueError(f"lambda_ must be in [0, 1], got {lambda_}")

    with torch.no_grad():
        dtype = v_tm1.dtype
        r_t, v_t, discount_t = r_t.to(dtype), v_t.to(dtype), discount_t.to(dtype)
        delta = r_t + discount_t * v_t - v_tm1
        trace = torch.where(done_t, torch.zeros_like(discount_t), lambda_ * discount_t)
        acc = torch.zeros_like(v_tm1[0])
        advantages = []
        for t in reversed(range(v_tm1.shape[0])):
            acc = delta[t] + trace[t] * acc
            advantages.append(acc)
        return torch.stack(advantages[::-1])


def ppo_clip_loss(logp_t: Tensor, logp_old_t: Tensor, advantage_t: Tensor, clip: float) -> Tensor:
    """PPO's clipped surrogate policy loss (to minimise).

    Reference: Schulman, Wolski, Dhariwal, Radford & Klimov 2017, "Proximal Policy Optimization
    Algorithms", eq. 7::

        ratio_t = exp(logp_t - logp_old_t)
        loss    = -mean(min(ratio_t * A_t, clip(ratio_t, 1 - clip, 1 + clip) * A_t))

    The clipped term has zero gradient, so a sample whose ratio has already moved past
    ``1 + clip`` with A > 0 (or below ``1 - clip`` with A < 0) stops pushing; moves that make the
    objective worse are never clipped. ``logp_old_t`` and ``advantage_t`` are constants and are
    detached here. Any shape works (``[T, B]`` or a flat minibatch); the mean is over all elements.

    Episode-boundary rule: none here; episode ends enter through the advantages (``gae``).

    Args:
        logp_t: float, log pi(a_t|s_t) under the current policy (carries the gradient).
        logp_old_t: float, same shape, log pi_old(a_t|s_t) recorded at collection time.
        advantage_t: float, same shape, the advantage estimates (usually ``gae``, often
            normalised per minibatch by the caller).
        clip: epsilon, >= 0 (paper: 0.2).

    Returns:
        scalar loss in the dtype of ``logp_t``.
    """
    _check_same_shape("logp_t", logp_t, "logp_old_t", logp_old_t)
    _check_same_shape("logp_t", logp_t, "advantage_t", advantage_t)
    if not clip >= 0:
        raise ValueError(f"clip must be >= 0, got {clip}")
    advantage_t = advantage_t.detach().to(logp_t.dtype)
    ratio = torch.exp(logp_t - logp_old_t.detach().to(logp_t.dtype))
    clipped_ratio = torch.clamp(ratio, 1.0 - clip, 1.0 + clip)
    return -torch.mean(torch.minimum(ratio * advantage_t, clipped_ratio * advantage_t))


def clipped_value_loss(
    v_pred: Tensor, v_old: Tensor, v_target: Tensor, clip: float | None
) -> Tensor:
    """PPO value loss, optionally with the value prediction clipped around its old value.

    Reference: the value clipping of OpenAI Baselines' PPO2 (not in Schulman et al. 2017, which
    uses a plain squared error)::

        v_clipped = v_old + clip(v_pred - v_old, -clip, clip)
        loss      = 0.5 * mean(max((v_pred - v_target)^2, (v_clipped - v_target)^2))

    and ``0.5 * mean((v_pred - v_target)^2)`` when ``clip`` is None. ``v_old`` and ``v_target``
    are constants and are detached here. Any shape works; the mean is over all elements.

    Episode-boundary rule: none here; episode ends enter through ``v_target`` (``gae`` +
    ``v_tm1``, or ``vtrace(...).vs``).

    Args:
        v_pred: float, V(s_t) under the current network (carries the gradient).
        v_old: float, same shape, V(s_t) recorded at collection time.
        v_target: float, same shape, the regression target.
        clip: epsilon, >= 0, or None for no clipping.

    Returns:
        scalar loss in the dtype of ``v_pred``.
    """
    _check_same_shape("v_pred", v_pred, "v_old", v_old)
    _check_same_shape("v_pred", v_pred, "v_target", v_target)
    if clip is not None and not clip >= 0:
        raise ValueError(f"clip must be >= 0 or None, got {clip}")
    v_target = v_target.detach().to(v_pred.dtype)
    loss = torch.square(v_pred - v_target)
    if clip is not None:
        v_old = v_old.detach().to(v_pred.dtype)
        v_clipped = v_old + torch.clamp(v_pred - v_old, -clip, clip)
        loss = torch.maximum(loss, torch.square(v_clipped - v_target))
    return 0.5 * torch.mean(loss)


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
    q_values: np.ndarray,
    epsilon: np.ndarray | float,
    rng: np.random.Generator,
    legal: np.ndarray | None = None,
) -> np.ndarray:
    """Epsilon-greedy actions: uniform random with probability epsilon, else argmax_a q.

    Each row draws one uniform number and one random action whatever its epsilon, so the generator's
    stream does not depend on the epsilon values. Greedy ties go to the lowest action index.

    With ``legal`` (a turn-based game's legal-action mask) both choices keep to the legal actions
    of the row: the greedy one is the argmax over them, the random one uniform over them; every
    row needs at least one legal action.

    Args:
        q_values: ``[B, A]`` Q-values.
        epsilon: scalar or ``[B]`` per-row exploration rates in [0, 1].
        rng: the caller's generator (seeded per actor).
        legal: bool ``[B, A]`` or None (every action legal): True where the action is legal.

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
    if legal is None:
        greedy = np.argmax(q_values, axis=1).astype(np.int64)
        random_actions = rng.integers(0, num_actions, size=num_rows, dtype=np.int64)
    else:
        num_legal = check_legal_actions(legal, num_rows, num_actions)
        greedy = np.argmax(np.where(legal, q_values, -np.inf), axis=1).astype(np.int64)
        # The k-th legal action of each row, k uniform in 0 .. num_legal - 1.
        k = rng.integers(0, num_legal, dtype=np.int64)
        random_actions = np.argmax(np.cumsum(legal, axis=1) > k[:, None], axis=1).astype(np.int64)
    explore = rng.random(num_rows) < epsilon
    return np.where(explore, random_actions, greedy)


def check_legal_actions(legal: np.ndarray, num_rows: int, num_actions: int) -> np.ndarray:
    """Check a legal-action mask ``legal`` (bool ``[B, A]``, True: legal) for ``B = num_rows``
    states of ``A = num_actions`` actions, each with at least one legal action; returns the
    number of legal actions of each row, int64 ``[B]``."""
    legal = np.asarray(legal)
    if legal.dtype != np.bool_ or legal.shape != (num_rows, num_actions):
        raise ValueError(
            f"an action mask must be bool [B, A] = [{num_rows}, {num_actions}], "
            f"got {legal.dtype} {legal.shape}"
        )
    num_legal = legal.sum(axis=1, dtype=np.int64)
    if not num_legal.all():
        rows = np.flatnonzero(num_legal == 0).tolist()
        raise ValueError(f"an action mask allows no action in rows {rows}")
    return num_legal

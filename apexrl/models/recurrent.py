"""Networks with memory: R2D2's recurrent Q-network (a torso, an LSTM whose state the caller
carries, a dueling head) and IMPALA's and PPO's recurrent actor-critic (a torso, an LSTM, a policy
head and a value head)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from apexrl.envs.packing import PackedLayout
from apexrl.models.actor_critic import (
    CategoricalOutput,
    GaussianOutput,
    ObsNormalizer,
    PolicyValueOutput,
)
from apexrl.models.packed import HybridOutput, PackedTorso, mask_past_parts, parts_mask
from apexrl.models.q import add_q_heads, q_from_heads
from apexrl.models.torsos import build_torso


class LSTMState(NamedTuple):
    """The recurrent state of an LSTM core: ``h`` and ``c``, each float32 ``[B, H]``."""

    h: Tensor
    c: Tensor


def zero_where(state: LSTMState, ended: Tensor) -> LSTMState:
    """``state`` with the rows of the envs whose episode ended (``ended`` bool ``[B]``) zeroed:
    what an actor carries into an episode's first step."""
    keep = (~ended).unsqueeze(1)
    return LSTMState(state.h * keep, state.c * keep)


class RecurrentQOutput(NamedTuple):
    """Output of a recurrent Q-network over ``T`` steps.

    Fields:
        q: float32 ``[T, B, A]`` action values at each step.
        state: the ``LSTMState`` after the last step.
    """

    q: Tensor
    state: LSTMState


class RecurrentQNetwork(nn.Module):
    """R2D2's Q-network: a torso, an LSTM and a dueling head.

    Reference: Kapturowski et al. 2019, sec. 2 (the LSTM sits between the torso and the dueling
    head; its input also holds the previous action, one-hot, and the previous reward). On Atari the
    torso is the Nature CNN (the paper's, before its 512-unit LSTM); on flat observations an MLP.
    Input is time-major; the state is passed in and returned, so a caller unrolls from any stored
    state.

    Args:
        obs_shape: ``(obs_dim,)`` or a channel-first image ``(C, H, W)``.
        num_actions: A.
        hidden_sizes: widths of an MLP torso's Linear + ReLU layers (empty: the LSTM reads ``obs``).
        lstm_size: H, the LSTM's hidden size.
        dueling: dueling head (as ``MLPQNetwork``); otherwise one Linear layer to A outputs.
        prev_action_reward: feed the previous action and reward to the LSTM.
        torso: ``apexrl.models.torsos``' name, or ``auto`` (by observation shape).
        pixel_scale: what an image torso multiplies pixel values by.
        normalize_obs: standardise flat observations with running statistics before the torso
            (``ObsNormalizer``, ``self.normalizer``: part of the weights).
    """

    def __init__(
        self,
        obs_shape: Sequence[int],
        num_actions: int,
        hidden_sizes: Sequence[int] = (64,),
        lstm_size: int = 64,
        dueling: bool = True,
        prev_action_reward: bool = True,
        torso: str = "auto",
        pixel_scale: float = 1.0 / 255.0,
        normalize_obs: bool = False,
    ) -> None:
        super().__init__()
        obs_shape = tuple(obs_shape)
        if num_actions < 1 or lstm_size < 1:
            raise ValueError(
                f"num_actions and lstm_size must be >= 1, got {num_actions}, {lstm_size}"
            )
        if normalize_obs and len(obs_shape) != 1:
            raise ValueError(
                f"algo.normalize_obs takes flat observations, not shape {obs_shape} (images are "
                "scaled by their pixel range)"
            )
        self.normalizer = ObsNormalizer(obs_shape[0]) if normalize_obs else None
        self.obs_shape, self.num_actions, self.lstm_size = obs_shape, num_actions, lstm_size
        self.dueling, self.prev_action_reward = dueling, prev_action_reward
        self.torso = build_torso(obs_shape, torso, hidden_sizes, "relu", pixel_scale)
        features = self.torso.out_features
        if prev_action_reward:
            features += num_actions + 1
        self.lstm = nn.LSTM(features, lstm_size)
        add_q_heads(self, lstm_size, num_actions, dueling)

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> LSTMState:
        """The state at an episode's start: zeros."""
        zeros = torch.zeros(batch_size, self.lstm_size, device=device)
        return LSTMState(zeros, zeros.clone())

    def forward(
        self, obs: Tensor, prev_action: Tensor, prev_reward: Tensor, state: LSTMState
    ) -> RecurrentQOutput:
        """Q-values along ``T`` steps from ``state``.

        Args:
            obs: ``[T, B, *obs_shape]`` (images stay uint8 until the torso casts them).
            prev_action: int ``[T, B]``, the action before each step (any value at an episode's
                first step, where ``prev_reward`` and the one-hot are zero by the caller).
            prev_reward: float ``[T, B]``, the reward before each step.
            state: ``LSTMState`` at the first step, ``[B, H]`` each.
        """
        if obs.dim() != 2 + len(self.obs_shape) or tuple(obs.shape[2:]) != self.obs_shape:
            raise ValueError(
                f"obs must be [T, B, {', '.join(map(str, self.obs_shape))}], got shape "
                f"{tuple(obs.shape)}"
            )
        steps, batch = obs.shape[:2]
        flat = obs.reshape(steps * batch, *self.obs_shape)
        if len(self.obs_shape) == 1:  # an MLP torso reads float32; image torsos cast themselves
            flat = flat.to(torch.float32)
        if self.normalizer is not None:
            flat = self.normalizer(flat)
        x = self.torso(flat).view(steps, batch, -1)
        if self.prev_action_reward:
            one_hot = nn.functional.one_hot(prev_action.long(), self.num_actions)
            x = torch.cat([x, one_hot.to(x.dtype), prev_reward.to(x.dtype).unsqueeze(-1)], -1)
        out, (h, c) = self.lstm(x, (state.h.unsqueeze(0), state.c.unsqueeze(0)))
        q = q_from_heads(self, out, self.dueling).q
        return RecurrentQOutput(q=q, state=LSTMState(h.squeeze(0), c.squeeze(0)))


class RecurrentUnroll(NamedTuple):
    """A recurrent actor-critic over ``T`` steps.

    Fields:
        out: ``CategoricalOutput`` or ``GaussianOutput`` with leading dims ``[T, B]``.
        states: the ``LSTMState`` after each step, ``[T, B, H]`` each (``states.h[-1]``,
            ``states.c[-1]``: the state to go on from).
    """

    out: PolicyValueOutput
    states: LSTMState


def unroll_cell(
    lstm: nn.LSTMCell, x: Tensor, h: Tensor, c: Tensor, keep: Tensor
) -> tuple[Tensor, Tensor]:
    """``lstm`` over ``x`` ``[T, B, F]`` from ``(h, c)`` ``[B, H]``, the state multiplied by
    ``keep[t]`` ``[T, B, 1]`` before step ``t``; every step's ``h`` and ``c``, ``[T, B, H]``."""
    hs, cs = [], []
    for t in range(len(x)):
        h, c = lstm(x[t], (h * keep[t], c * keep[t]))
        hs.append(h)
        cs.append(c)
    return torch.stack(hs), torch.stack(cs)


class RecurrentActorCritic(nn.Module):
    """IMPALA's and PPO's network with memory (``algo.lstm_size`` > 0): a torso, an LSTM and a
    policy head and a value head on its output, for any action an actor-critic takes
    (``Discrete``, Box, MultiDiscrete, Tuple or Dict of Discrete and Box parts).

    Reference: Espeholt et al. 2018 (IMPALA's LSTM agent, previous action and reward as LSTM
    inputs), rlpyt's recurrent agents. The LSTM's input is the torso's features and, with
    ``prev_action_reward``, the previous action (a one-hot per Discrete part, Box values as they
    are) and the previous reward. The state is zeroed before a step whose ``reset`` is set (the
    first step of an episode), so one call unrolls across episode ends.

    With ``shared_lstm`` False (the default, as sb3-contrib's RecurrentPPO) the value has a torso
    and an LSTM of its own beside the policy's: a shared LSTM must also produce the value
    (returns of tens) from outputs in (-1, 1), and on CartPole without velocities its state
    saturates before the policy learns anything. The state then holds both: ``h`` and ``c`` are
    ``[B, 2H]``, the policy's ``H`` first (``state_size``).

    Args:
        obs_shape: ``(obs_dim,)`` or a channel-first image ``(C, H, W)``; ``(nbytes,)`` for
            packed rows (``layout``).
        num_actions: A for a categorical policy, or None.
        action_dim: D for a Gaussian policy (state-independent log-std), or None; with ``nvec``,
            the size of a Tuple or Dict action's Box parts together.
        nvec: the sizes of a MultiDiscrete action's parts, or of a Tuple or Dict action's
            Discrete parts (``envs.nested.HybridActions``): a categorical per part
            (``CategoricalOutput`` with logits ``[..., K, max(nvec)]``, ``-inf`` past each part's
            size), with ``action_dim`` beside one Gaussian over the Box parts (``HybridOutput``).
        hidden_sizes, activation, torso, pixel_scale: the torso's (``models.torsos``).
        lstm_size: H.
        prev_action_reward: feed the previous action and reward to the LSTM.
        init_log_std: a Gaussian policy's initial log-std.
        shared_lstm: one torso and LSTM for both heads instead of one each.
        layout: the ``apexrl.envs.packing`` layout of a Dict or Tuple observation: the observations
            are its uint8 rows and each torso is a ``PackedTorso`` (a torso per part); None: a
            flat or image observation.
    """

    def __init__(
        self,
        obs_shape: Sequence[int],
        num_actions: int | None = None,
        action_dim: int | None = None,
        hidden_sizes: Sequence[int] = (64,),
        activation: str = "tanh",
        lstm_size: int = 64,
        prev_action_reward: bool = False,
        torso: str = "auto",
        pixel_scale: float = 1.0 / 255.0,
        init_log_std: float = 0.0,
        shared_lstm: bool = False,
        layout: PackedLayout | None = None,
        nvec: Sequence[int] = (),
    ) -> None:
        super().__init__()
        nvec = tuple(int(n) for n in nvec)
        if (num_actions is None) == (action_dim is None and not nvec) or (num_actions and nvec):
            raise ValueError("give num_actions, or action_dim, nvec or both")
        if lstm_size < 1 or any(n < 1 for n in nvec):
            raise ValueError(f"lstm_size and nvec must be >= 1, got {lstm_size}, {nvec}")
        self.obs_shape, self.lstm_size = tuple(obs_shape), lstm_size
        self.num_actions, self.action_dim, self.nvec = num_actions, action_dim, nvec
        self.prev_action_reward, self.shared_lstm = prev_action_reward, shared_lstm
        self.packed = layout is not None
        if layout is not None and self.obs_shape != (layout.nbytes,):
            raise ValueError(f"packed rows are ({layout.nbytes},), got obs_shape {obs_shape}")

        def make_torso() -> nn.Module:
            if layout is not None:
                return PackedTorso(layout, hidden_sizes, activation, torso)
            return build_torso(self.obs_shape, torso, hidden_sizes, activation, pixel_scale)

        self.torso = make_torso()
        features = self.torso.out_features
        box_dim = action_dim or 0
        if prev_action_reward:  # one-hot Discrete parts, Box values, the reward
            features += (num_actions or 0) + sum(nvec) + box_dim + 1
        self.lstm = nn.LSTMCell(features, lstm_size)
        if not shared_lstm:
            self.value_torso = make_torso()
            self.value_lstm = nn.LSTMCell(features, lstm_size)
        self.max_n = max(nvec, default=0)
        width = (num_actions or 0) + len(nvec) * self.max_n + box_dim
        self.policy_head = nn.Linear(lstm_size, width)
        self.value_head = nn.Linear(lstm_size, 1)
        nn.init.orthogonal_(self.policy_head.weight, gain=0.01)
        nn.init.zeros_(self.policy_head.bias)
        if action_dim is not None:
            self.log_std = nn.Parameter(torch.full((action_dim,), float(init_log_std)))
        if nvec:
            self.register_buffer("logits_mask", parts_mask(nvec), persistent=False)

    @property
    def discrete(self) -> bool:
        """Whether the actions are one ``Discrete`` index."""
        return self.num_actions is not None

    def zero_actions(self, batch_size: int) -> np.ndarray:
        """The previous actions at an episode's start: zeros in the actions' shape and dtype
        (int64 indices for ``Discrete`` and MultiDiscrete, float32 rows otherwise)."""
        if self.discrete:
            return np.zeros(batch_size, dtype=np.int64)
        if not self.action_dim:
            return np.zeros((batch_size, len(self.nvec)), dtype=np.int64)
        return np.zeros((batch_size, len(self.nvec) + self.action_dim), dtype=np.float32)

    @property
    def state_size(self) -> int:
        """The width of ``h`` and ``c``: ``lstm_size``, twice that with a critic LSTM."""
        return self.lstm_size * (1 if self.shared_lstm else 2)

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> LSTMState:
        """The state at an episode's start: zeros."""
        zeros = torch.zeros(batch_size, self.state_size, device=device)
        return LSTMState(zeros, zeros.clone())

    def forward(
        self,
        obs: Tensor,
        prev_action: Tensor,
        prev_reward: Tensor,
        reset: Tensor,
        state: LSTMState,
    ) -> RecurrentUnroll:
        """Policy and value along ``T`` steps from ``state``.

        Args:
            obs: ``[T, B, *obs_shape]``.
            prev_action: ``[T, B]`` int (``Discrete``) or ``[T, B, D]`` float (``Box``): the
                action before each step (zero at an episode's first step, by the caller).
            prev_reward: ``[T, B]`` float, the reward before each step.
            reset: ``[T, B]`` bool, zero the state before the step.
            state: the ``LSTMState`` before step 0, ``[B, H]`` each.
        """
        if obs.dim() != 2 + len(self.obs_shape) or tuple(obs.shape[2:]) != self.obs_shape:
            raise ValueError(
                f"obs must be [T, B, {', '.join(map(str, self.obs_shape))}], got shape "
                f"{tuple(obs.shape)}"
            )
        steps, batch = obs.shape[:2]
        flat = obs.reshape(steps * batch, *self.obs_shape)
        if len(self.obs_shape) == 1 and not self.packed:  # packed rows stay uint8 bytes
            flat = flat.to(torch.float32)
        previous = self._previous_inputs(prev_action, prev_reward)
        keep = (~reset.bool()).float().unsqueeze(-1)
        cores = [(self.torso, self.lstm)]
        if not self.shared_lstm:
            cores.append((self.value_torso, self.value_lstm))
        hs, cs = [], []
        for i, (torso, lstm) in enumerate(cores):
            x = torso(flat).view(steps, batch, -1).float()
            if previous is not None:
                x = torch.cat([x, previous], -1)
            width = slice(i * self.lstm_size, (i + 1) * self.lstm_size)
            h, c = unroll_cell(lstm, x, state.h[:, width], state.c[:, width], keep)
            hs.append(h)
            cs.append(c)
        states = LSTMState(torch.cat(hs, -1), torch.cat(cs, -1))
        return RecurrentUnroll(self.heads(states.h), states)

    def _previous_inputs(self, prev_action: Tensor, prev_reward: Tensor) -> Tensor | None:
        """The previous action (a one-hot per Discrete part, Box values as they are) and reward,
        ``[T, B, width + 1]``."""
        if not self.prev_action_reward:
            return None
        one_hot = nn.functional.one_hot
        if self.discrete:
            parts = [one_hot(prev_action.long(), self.num_actions).float()]
        elif not self.nvec:
            parts = [prev_action.float()]
        else:
            indices = prev_action[..., : len(self.nvec)].long()
            parts = [one_hot(indices[..., k], n).float() for k, n in enumerate(self.nvec)]
            if self.action_dim:
                parts.append(prev_action[..., len(self.nvec) :].float())
        return torch.cat([*parts, prev_reward.float().unsqueeze(-1)], -1)

    def heads(self, features: Tensor) -> PolicyValueOutput:
        """The policy and value of LSTM outputs ``[..., state_size]`` (the policy's first,
        then the critic's when it has its own)."""
        policy_features = features[..., : self.lstm_size]
        value_features = features if self.shared_lstm else features[..., self.lstm_size :]
        value = self.value_head(value_features).squeeze(-1)
        policy = self.policy_head(policy_features)
        if self.discrete:
            return CategoricalOutput(logits=policy, value=value)
        if not self.nvec:
            return GaussianOutput(mean=policy, log_std=self.log_std.expand_as(policy), value=value)
        split = len(self.nvec) * self.max_n
        logits = policy[..., :split].unflatten(-1, (len(self.nvec), self.max_n))
        logits = mask_past_parts(logits, self.logits_mask)
        if not self.action_dim:
            return CategoricalOutput(logits=logits, value=value)
        mean = policy[..., split:]
        return HybridOutput(logits, mean, self.log_std.expand_as(mean), value)

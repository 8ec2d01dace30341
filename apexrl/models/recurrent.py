"""R2D2's recurrent Q-network: a torso (``apexrl.models.torsos``), an LSTM whose state the caller
carries, and a dueling head."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from apexrl.models.q import add_q_heads, q_from_heads
from apexrl.models.torsos import build_torso


class LSTMState(NamedTuple):
    """The recurrent state of an LSTM core: ``h`` and ``c``, each float32 ``[B, H]``."""

    h: Tensor
    c: Tensor


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
    ) -> None:
        super().__init__()
        obs_shape = tuple(obs_shape)
        if num_actions < 1 or lstm_size < 1:
            raise ValueError(
                f"num_actions and lstm_size must be >= 1, got {num_actions}, {lstm_size}"
            )
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
        x = self.torso(flat).view(steps, batch, -1)
        if self.prev_action_reward:
            one_hot = nn.functional.one_hot(prev_action.long(), self.num_actions)
            x = torch.cat([x, one_hot.to(x.dtype), prev_reward.to(x.dtype).unsqueeze(-1)], -1)
        out, (h, c) = self.lstm(x, (state.h.unsqueeze(0), state.c.unsqueeze(0)))
        q = q_from_heads(self, out, self.dueling)
        return RecurrentQOutput(q=q, state=LSTMState(h.squeeze(0), c.squeeze(0)))

"""Neural networks (``nn.Module`` only) and the weight format that carries them over the wire.

Actors and learners build the same network with ``build_q_network``. The learner publishes its
weights as ``params_to_arrays(net)`` (named numpy arrays, which the codec sends as raw frames, never
pickle) and actors load them with ``arrays_to_params``, which refuses anything that does not match
the network exactly.

``MLPQNetwork`` serves flat observations and ``NatureCNNQNetwork`` stacked image frames;
``RecurrentQNetwork`` (R2D2) adds an LSTM whose state the caller carries.
Models return ``NamedTuple`` outputs so that callers name what they use (``out.q``).

Actor-critics (IMPALA, PPO) are built with ``build_policy_network``: ``MLPActorCritic`` returns
``CategoricalOutput(logits, value)`` for discrete actions or ``GaussianOutput(mean, log_std,
value)`` for continuous ones. The policy distributions are pure functions of those outputs, in
``apexrl.distributions``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor, nn


class QOutput(NamedTuple):
    """Output of a Q-network.

    Fields:
        q: float32 ``[B, A]`` action values.
    """

    q: Tensor


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

        layers: list[nn.Module] = []
        in_features = obs_dim
        for size in hidden_sizes:
            layers += [nn.Linear(in_features, size), nn.ReLU()]
            in_features = size
        self.torso = nn.Sequential(*layers)
        if dueling:
            self.value_head = nn.Linear(in_features, 1)
            self.advantage_head = nn.Linear(in_features, num_actions)
        else:
            self.q_head = nn.Linear(in_features, num_actions)

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
        features = self.torso(obs)
        if not self.dueling:
            return QOutput(q=self.q_head(features))
        value = self.value_head(features)
        advantage = self.advantage_head(features)
        return QOutput(q=value + advantage - advantage.mean(dim=-1, keepdim=True))


class NatureCNNQNetwork(nn.Module):
    """The Nature DQN network (Mnih et al. 2015) for stacked image frames, with the same dueling
    or plain head as ``MLPQNetwork``.

    Torso: Conv 32x8x8 stride 4, Conv 64x4x4 stride 2, Conv 64x3x3 stride 1 (ReLU after each),
    then Linear to 512 + ReLU. The dueling head is two Linear layers (V and A) on those 512
    features, so with 4 frames of 84x84 and 6 actions the network has 1,687,719 parameters (plain
    head: 1,687,206). Wang et al.'s dueling network instead splits into two 512-unit streams
    (about 3.3 M parameters); the shared layer keeps the Nature size and the MLP's head shape.

    Observations are pixel values in [0, 255] (uint8 from the env and replay: 4x less memory and
    wire than float32), scaled by 1/255 inside ``forward``.

    Args:
        obs_shape: ``(C, H, W)``, channel-first (C stacked frames); H and W at least 36.
        num_actions: A, the number of discrete actions.
        dueling: use the dueling head; otherwise one Linear layer to A outputs.
    """

    def __init__(self, obs_shape: Sequence[int], num_actions: int, dueling: bool = True) -> None:
        super().__init__()
        obs_shape = tuple(obs_shape)
        if len(obs_shape) != 3 or min(obs_shape) < 1:
            raise ValueError(f"obs_shape must be (C, H, W), got {obs_shape}")
        channels, height, width = obs_shape
        out_h, out_w = _nature_conv_out(height), _nature_conv_out(width)
        if out_h < 1 or out_w < 1:
            raise ValueError(
                f"obs_shape {obs_shape} is too small for the Nature CNN: it needs channel-first "
                f"(C, H, W) images with H, W >= 36 (Atari: (4, 84, 84))"
            )
        if num_actions < 1:
            raise ValueError(f"num_actions must be >= 1, got {num_actions}")
        self.obs_shape = obs_shape
        self.num_actions = num_actions
        self.dueling = dueling
        self.torso = nn.Sequential(
            nn.Conv2d(channels, 32, kernel_size=8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, kernel_size=3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(64 * out_h * out_w, 512),
            nn.ReLU(),
        )
        if dueling:
            self.value_head = nn.Linear(512, 1)
            self.advantage_head = nn.Linear(512, num_actions)
        else:
            self.q_head = nn.Linear(512, num_actions)

    def forward(self, obs: Tensor) -> QOutput:
        """Q-values for a batch of image observations.

        Args:
            obs: ``[B, C, H, W]`` pixel values in [0, 255], uint8 (other dtypes are cast to
                float32 and scaled the same way).

        Returns:
            ``QOutput(q)`` with ``q`` of shape ``[B, A]``.
        """
        if obs.dim() != 4 or tuple(obs.shape[1:]) != self.obs_shape:
            raise ValueError(
                f"obs must be [B, {', '.join(map(str, self.obs_shape))}], got shape "
                f"{tuple(obs.shape)}"
            )
        # One float copy scaled in place: the uint8 -> float32 cast of a batch of frames is a large
        # share of a CPU update (three casts per update), and ``x * c`` would make a second copy.
        pixels = obs.to(torch.float32, copy=True).mul_(1.0 / 255.0)
        features = self.torso(pixels)
        if not self.dueling:
            return QOutput(q=self.q_head(features))
        value = self.value_head(features)
        advantage = self.advantage_head(features)
        return QOutput(q=value + advantage - advantage.mean(dim=-1, keepdim=True))


def _nature_conv_out(size: int) -> int:
    """Spatial size after the Nature CNN's three convolutions (no padding)."""
    for kernel, stride in ((8, 4), (4, 2), (3, 1)):
        size = (size - kernel) // stride + 1
    return size


def build_q_network(
    obs_shape: tuple[int, ...],
    num_actions: int,
    hidden_sizes: Sequence[int] = (256, 256),
    dueling: bool = True,
) -> nn.Module:
    """The Q-network for an observation shape: an MLP for flat ``(obs_dim,)`` observations, the
    Nature CNN for channel-first images ``(C, H, W)`` (``hidden_sizes`` is then unused).

    Raises:
        ValueError: for any other observation shape.
    """
    obs_shape = tuple(obs_shape)
    if len(obs_shape) == 3:
        return NatureCNNQNetwork(obs_shape, num_actions, dueling=dueling)
    if len(obs_shape) != 1:
        raise ValueError(
            f"build_q_network supports flat observations of shape (obs_dim,) and channel-first "
            f"images (C, H, W), got obs_shape {obs_shape} (flatten the observation with a "
            f"wrapper if it is not an image)"
        )
    return MLPQNetwork(obs_shape[0], num_actions, hidden_sizes=hidden_sizes, dueling=dueling)


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
    """R2D2's Q-network for flat observations: an MLP torso, an LSTM and a dueling head.

    Reference: Kapturowski et al. 2019, sec. 2 (the LSTM sits between the torso and the dueling
    head; its input also holds the previous action, one-hot, and the previous reward). Input is
    time-major; the state is passed in and returned, so a caller unrolls from any stored state.

    Args:
        obs_dim: size of the flat observation.
        num_actions: A.
        hidden_sizes: widths of the torso's Linear + ReLU layers (empty: the LSTM reads ``obs``).
        lstm_size: H, the LSTM's hidden size.
        dueling: dueling head (as ``MLPQNetwork``); otherwise one Linear layer to A outputs.
        prev_action_reward: feed the previous action and reward to the LSTM.
    """

    def __init__(
        self,
        obs_dim: int,
        num_actions: int,
        hidden_sizes: Sequence[int] = (64,),
        lstm_size: int = 64,
        dueling: bool = True,
        prev_action_reward: bool = True,
    ) -> None:
        super().__init__()
        if obs_dim < 1 or num_actions < 1 or lstm_size < 1:
            raise ValueError(
                f"obs_dim, num_actions and lstm_size must be >= 1, got {obs_dim}, "
                f"{num_actions}, {lstm_size}"
            )
        self.obs_dim, self.num_actions, self.lstm_size = obs_dim, num_actions, lstm_size
        self.dueling, self.prev_action_reward = dueling, prev_action_reward
        self.torso, features = _mlp_torso(obs_dim, hidden_sizes, "relu")
        if prev_action_reward:
            features += num_actions + 1
        self.lstm = nn.LSTM(features, lstm_size)
        if dueling:
            self.value_head = nn.Linear(lstm_size, 1)
            self.advantage_head = nn.Linear(lstm_size, num_actions)
        else:
            self.q_head = nn.Linear(lstm_size, num_actions)

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> LSTMState:
        """The state at an episode's start: zeros."""
        zeros = torch.zeros(batch_size, self.lstm_size, device=device)
        return LSTMState(zeros, zeros.clone())

    def forward(
        self, obs: Tensor, prev_action: Tensor, prev_reward: Tensor, state: LSTMState
    ) -> RecurrentQOutput:
        """Q-values along ``T`` steps from ``state``.

        Args:
            obs: ``[T, B, obs_dim]`` (cast to float32).
            prev_action: int ``[T, B]``, the action before each step (any value at an episode's
                first step, where ``prev_reward`` and the one-hot are zero by the caller).
            prev_reward: float ``[T, B]``, the reward before each step.
            state: ``LSTMState`` at the first step, ``[B, H]`` each.
        """
        if obs.dim() != 3 or obs.shape[-1] != self.obs_dim:
            raise ValueError(f"obs must be [T, B, {self.obs_dim}], got shape {tuple(obs.shape)}")
        x = self.torso(obs.to(torch.float32))
        if self.prev_action_reward:
            one_hot = nn.functional.one_hot(prev_action.long(), self.num_actions)
            x = torch.cat([x, one_hot.to(x.dtype), prev_reward.to(x.dtype).unsqueeze(-1)], -1)
        out, (h, c) = self.lstm(x, (state.h.unsqueeze(0), state.c.unsqueeze(0)))
        if self.dueling:
            advantage = self.advantage_head(out)
            q = self.value_head(out) + advantage - advantage.mean(dim=-1, keepdim=True)
        else:
            q = self.q_head(out)
        return RecurrentQOutput(q=q, state=LSTMState(h.squeeze(0), c.squeeze(0)))


class CategoricalOutput(NamedTuple):
    """Output of an actor-critic with a discrete (categorical) policy.

    Fields:
        logits: float32 ``[B, A]`` unnormalized log-probabilities of the A actions.
        value: float32 ``[B]`` state values V(s).
    """

    logits: Tensor
    value: Tensor


class GaussianOutput(NamedTuple):
    """Output of an actor-critic with a continuous (diagonal Gaussian) policy.

    The distribution is Normal(mean, exp(log_std)) per action dim, over the unbounded
    (pre-squash) action; whether the action is then squashed with tanh is the caller's choice
    (``distributions.gaussian_*`` or ``squashed_gaussian_*``), not the network's.

    Fields:
        mean: float32 ``[B, D]`` means.
        log_std: float32 ``[B, D]`` log standard deviations (with a state-independent log-std,
            the ``[D]`` parameter expanded over the batch, no copy).
        value: float32 ``[B]`` state values V(s).
    """

    mean: Tensor
    log_std: Tensor
    value: Tensor


PolicyValueOutput = CategoricalOutput | GaussianOutput
"""What an actor-critic returns: ``CategoricalOutput`` or ``GaussianOutput`` by action space."""

_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}

# Bounds of a state-dependent log-std (as in SAC implementations): exp(-20) to exp(2).
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


class MLPActorCritic(nn.Module):
    """An actor-critic for flat observations (IMPALA, PPO): MLP torso(s), a policy head and a
    value head.

    The policy is categorical over ``num_actions`` discrete actions, or a diagonal Gaussian over
    ``action_dim`` continuous dims: give exactly one of the two.

    Torso: Linear + activation layers of widths ``hidden_sizes``. With ``shared_torso=False``
    (the usual PPO setting, e.g. CartPole with two separate 64-64 tanh torsos) the policy and the
    value each have their own torso; with ``shared_torso=True`` both heads read one torso.

    Gaussian log-std: by default a state-independent ``[D]`` parameter ``log_std`` initialized
    to ``init_log_std``. With ``state_dependent_log_std=True`` a Linear head computes it from the
    policy features instead (its bias starts at ``init_log_std``), clamped to
    ``[LOG_STD_MIN, LOG_STD_MAX]`` = [-20, 2].

    Orthogonal init (``orthogonal_init=True``, the PPO convention of Engstrom et al. 2020,
    "Implementation Matters in Deep Policy Gradients"): hidden layers with gain sqrt(2), the
    policy output layer(s) with gain 0.01 (a near-uniform or near-``init_log_std`` initial
    policy), the value output with gain 1; all biases 0 (but the log-std head's). Otherwise
    PyTorch's default init.

    Args:
        obs_dim: size of the flat observation.
        num_actions: A, the number of discrete actions (categorical head), or None.
        action_dim: D, the size of a continuous action (Gaussian head), or None.
        hidden_sizes: widths of the torso's layers (empty: the heads read ``obs``).
        activation: ``"tanh"`` or ``"relu"``, after each torso layer.
        shared_torso: one torso for both heads instead of one each.
        init_log_std: initial log-std of a Gaussian policy (default 0.0: std 1); Gaussian only.
        state_dependent_log_std: compute the log-std from the observation; Gaussian only.
        orthogonal_init: initialize as described above.
    """

    def __init__(
        self,
        obs_dim: int,
        num_actions: int | None = None,
        action_dim: int | None = None,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        shared_torso: bool = False,
        init_log_std: float | None = None,
        state_dependent_log_std: bool = False,
        orthogonal_init: bool = True,
    ) -> None:
        super().__init__()
        if obs_dim < 1:
            raise ValueError(f"obs_dim must be >= 1, got {obs_dim}")
        _check_action_space(num_actions, action_dim, init_log_std, state_dependent_log_std)
        if any(size < 1 for size in hidden_sizes):
            raise ValueError(f"hidden_sizes must all be >= 1, got {tuple(hidden_sizes)}")
        if activation not in _ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}"
            )
        self.obs_dim = obs_dim
        self.num_actions = num_actions
        self.action_dim = action_dim
        self.shared_torso = shared_torso
        self.state_dependent_log_std = state_dependent_log_std
        if init_log_std is None:
            init_log_std = 0.0

        if shared_torso:
            self.torso, features = _mlp_torso(obs_dim, hidden_sizes, activation)
        else:
            self.policy_torso, features = _mlp_torso(obs_dim, hidden_sizes, activation)
            self.value_torso, _ = _mlp_torso(obs_dim, hidden_sizes, activation)
        policy_outputs = num_actions if num_actions is not None else action_dim
        assert policy_outputs is not None  # _check_action_space: exactly one is given
        self.policy_head = nn.Linear(features, policy_outputs)
        self.value_head = nn.Linear(features, 1)
        if action_dim is not None:
            if state_dependent_log_std:
                self.log_std_head = nn.Linear(features, action_dim)
            else:
                self.log_std = nn.Parameter(torch.full((action_dim,), float(init_log_std)))

        if orthogonal_init:
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    nn.init.orthogonal_(module.weight, gain=2.0**0.5)
                    nn.init.zeros_(module.bias)
            nn.init.orthogonal_(self.policy_head.weight, gain=0.01)
            nn.init.orthogonal_(self.value_head.weight, gain=1.0)
            if state_dependent_log_std:
                nn.init.orthogonal_(self.log_std_head.weight, gain=0.01)
        if state_dependent_log_std:
            nn.init.constant_(self.log_std_head.bias, float(init_log_std))

    @property
    def discrete(self) -> bool:
        """True for a categorical policy, False for a Gaussian one."""
        return self.num_actions is not None

    def forward(self, obs: Tensor) -> PolicyValueOutput:
        """Policy and value for a batch of observations.

        Args:
            obs: ``[B, obs_dim]`` (leading dims such as ``[T, B, obs_dim]`` also work); other dtypes
                are cast to float32.

        Returns:
            ``CategoricalOutput(logits [B, A], value [B])`` for a discrete policy,
            ``GaussianOutput(mean [B, D], log_std [B, D], value [B])`` for a continuous one (the
            input's leading dims in place of B).
        """
        if obs.dim() < 1 or obs.shape[-1] != self.obs_dim:
            raise ValueError(f"obs must be [B, {self.obs_dim}], got shape {tuple(obs.shape)}")
        if obs.dtype != torch.float32:
            obs = obs.to(torch.float32)
        if self.shared_torso:
            policy_features = value_features = self.torso(obs)
        else:
            policy_features = self.policy_torso(obs)
            value_features = self.value_torso(obs)
        value = self.value_head(value_features).squeeze(-1)
        policy = self.policy_head(policy_features)
        if self.discrete:
            return CategoricalOutput(logits=policy, value=value)
        if self.state_dependent_log_std:
            log_std = self.log_std_head(policy_features).clamp(LOG_STD_MIN, LOG_STD_MAX)
        else:
            log_std = self.log_std.expand_as(policy)
        return GaussianOutput(mean=policy, log_std=log_std, value=value)


def _check_action_space(
    num_actions: int | None,
    action_dim: int | None,
    init_log_std: float | None,
    state_dependent_log_std: bool,
) -> None:
    """Exactly one of ``num_actions`` (discrete) and ``action_dim`` (continuous), and Gaussian
    options only with ``action_dim``."""
    if (num_actions is None) == (action_dim is None):
        raise ValueError(
            f"give exactly one of num_actions (discrete actions: a categorical policy) and "
            f"action_dim (continuous actions: a Gaussian policy), got num_actions={num_actions} "
            f"and action_dim={action_dim}"
        )
    if num_actions is not None:
        if num_actions < 1:
            raise ValueError(f"num_actions must be >= 1, got {num_actions}")
        if init_log_std is not None or state_dependent_log_std:
            raise ValueError(
                "init_log_std and state_dependent_log_std are for a Gaussian policy (action_dim), "
                f"not a categorical one (num_actions={num_actions})"
            )
        return
    assert action_dim is not None
    if action_dim < 1:
        raise ValueError(f"action_dim must be >= 1, got {action_dim}")
    if init_log_std is not None and not math.isfinite(init_log_std):
        raise ValueError(f"init_log_std must be finite, got {init_log_std}")


def _mlp_torso(
    in_features: int, hidden_sizes: Sequence[int], activation: str
) -> tuple[nn.Sequential, int]:
    """Linear + activation layers, and the width of their output."""
    layers: list[nn.Module] = []
    for size in hidden_sizes:
        layers += [nn.Linear(in_features, size), _ACTIVATIONS[activation]()]
        in_features = size
    return nn.Sequential(*layers), in_features


class ObsNormalizer(nn.Module):
    """Running mean and variance of observations, kept as buffers so that they travel with the
    weights (``params_to_arrays`` sends the ``state_dict``); ``forward`` standardises and clips.

    ``update`` merges a batch's moments into the running ones (Chan et al.'s parallel algorithm),
    so the statistics are those of every observation seen, whatever the batch sizes.

    Args:
        obs_dim: size of the flat observation.
        clip: standardised values are clipped to ``[-clip, clip]``.
    """

    def __init__(self, obs_dim: int, clip: float = 10.0, eps: float = 1e-8) -> None:
        super().__init__()
        if obs_dim < 1:
            raise ValueError(f"obs_dim must be >= 1, got {obs_dim}")
        self.clip, self.eps = clip, eps
        self.register_buffer("mean", torch.zeros(obs_dim))
        self.register_buffer("var", torch.ones(obs_dim))
        self.register_buffer("count", torch.zeros(1))  # 1-D: the weight format has no scalars

    @torch.no_grad()
    def update(self, obs: Tensor) -> None:
        """Merge ``obs`` ``[..., obs_dim]`` into the running moments."""
        x = obs.reshape(-1, self.mean.shape[0]).double()
        self.merge(float(x.shape[0]), x.sum(dim=0).tolist(), x.pow(2).sum(dim=0).tolist())

    @torch.no_grad()
    def merge(self, n: float, total: list[float], total_sq: list[float]) -> None:
        """Merge a batch given by its count, sum and sum of squares (summed over learners)."""
        if n <= 0:
            return
        sums = torch.tensor(total, dtype=torch.float64)
        batch_mean = sums / n
        batch_var = (torch.tensor(total_sq, dtype=torch.float64) / n - batch_mean.pow(2)).clamp(0)
        batch_mean, batch_var = batch_mean.to(self.mean), batch_var.to(self.var)
        total = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta.pow(2) * self.count * n / total
        self.mean += delta * n / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def forward(self, obs: Tensor) -> Tensor:
        standardised = (obs.float() - self.mean) / torch.sqrt(self.var + self.eps)
        return standardised.clamp(-self.clip, self.clip)


class NormalizedObsNetwork(nn.Module):
    """``net(normalizer(obs))``: a network whose input statistics are part of its weights."""

    def __init__(self, normalizer: ObsNormalizer, net: nn.Module) -> None:
        super().__init__()
        self.normalizer, self.net = normalizer, net

    def forward(self, obs: Tensor):
        return self.net(self.normalizer(obs))


def build_policy_network(
    obs_shape: tuple[int, ...],
    num_actions: int | None = None,
    action_dim: int | None = None,
    hidden_sizes: Sequence[int] = (64, 64),
    activation: str = "tanh",
    shared_torso: bool = False,
    init_log_std: float | None = None,
    state_dependent_log_std: bool = False,
    orthogonal_init: bool = True,
) -> MLPActorCritic:
    """The actor-critic for an observation shape and an action space, given as plain numbers:
    ``num_actions`` for a discrete space (``Discrete(n)``: a categorical head), ``action_dim``
    for a continuous one (``Box`` of shape ``(D,)``: a Gaussian head). The other arguments are
    ``MLPActorCritic``'s.

    Raises:
        ValueError: unless ``obs_shape`` is flat ``(obs_dim,)`` and exactly one of
            ``num_actions`` and ``action_dim`` is given (Gaussian options only with
            ``action_dim``).
    """
    obs_shape = tuple(obs_shape)
    _check_action_space(num_actions, action_dim, init_log_std, state_dependent_log_std)
    if len(obs_shape) != 1:
        raise ValueError(
            f"build_policy_network supports flat observations of shape (obs_dim,), got obs_shape "
            f"{obs_shape} (there is no image actor-critic yet; flatten the observation with a "
            f"wrapper if it is not an image)"
        )
    return MLPActorCritic(
        obs_shape[0],
        num_actions=num_actions,
        action_dim=action_dim,
        hidden_sizes=hidden_sizes,
        activation=activation,
        shared_torso=shared_torso,
        init_log_std=init_log_std,
        state_dependent_log_std=state_dependent_log_std,
        orthogonal_init=orthogonal_init,
    )


# Policy distributions as pure functions of the network's outputs. Actors sample (under
# ``torch.no_grad()``); learners take log-probs and entropies (with gradients). Leading dims are
# free: ``[B, A]`` logits or ``[T, B, D]`` means work the same; the last dim is the action's.


def _numpy_dtype(name: str, dtype: torch.dtype) -> np.dtype:
    if dtype == torch.bfloat16:
        raise ValueError(f"parameter {name!r} is bfloat16, which numpy cannot represent")
    return torch.empty((), dtype=dtype).numpy().dtype


def params_to_arrays(module: nn.Module) -> dict[str, np.ndarray]:
    """The module's ``state_dict`` as contiguous numpy copies on the CPU, keyed by name.

    The arrays share no memory with the module, so the caller may send or keep them while training
    continues. Dtypes are kept (float32 for the networks here).
    """
    arrays: dict[str, np.ndarray] = {}
    for name, tensor in module.state_dict().items():
        _numpy_dtype(name, tensor.dtype)
        arrays[name] = np.ascontiguousarray(tensor.detach().cpu().numpy()).copy()
    return arrays


def arrays_to_params(module: nn.Module, arrays: dict[str, np.ndarray]) -> None:
    """Load named numpy arrays (from ``params_to_arrays``) into the module.

    Names, shapes and dtypes must match the module's ``state_dict`` exactly. Everything is checked
    before anything is written, so on ``ValueError`` (which names the first mismatch) the module is
    unchanged. The arrays may be read-only (decoded straight from message frames); they are copied.
    """
    state = module.state_dict()
    for name, tensor in state.items():
        if name not in arrays:
            raise ValueError(f"missing array for parameter {name!r}")
        array = arrays[name]
        if not isinstance(array, np.ndarray):
            raise ValueError(f"array {name!r} must be a numpy array, got {type(array).__name__}")
        expected_shape = tuple(tensor.shape)
        if array.shape != expected_shape:
            raise ValueError(f"array {name!r} has shape {array.shape}, expected {expected_shape}")
        expected_dtype = _numpy_dtype(name, tensor.dtype)
        if array.dtype != expected_dtype:
            raise ValueError(f"array {name!r} has dtype {array.dtype}, expected {expected_dtype}")
    unexpected = [name for name in arrays if name not in state]
    if unexpected:
        raise ValueError(f"unexpected array {unexpected[0]!r} (not a parameter of the module)")
    with torch.no_grad():
        for name, tensor in state.items():
            # state_dict() tensors share storage with the module's parameters and buffers.
            tensor.copy_(torch.from_numpy(np.array(arrays[name], copy=True)))

"""Actor-critics (IMPALA, PPO): a torso, a policy head and a value head.

``build_policy_network`` returns ``CategoricalOutput(logits, value)`` for discrete actions or
``GaussianOutput(mean, log_std, value)`` for continuous ones. The policy distributions are pure
functions of those outputs, in ``apexrl.math.distributions``. ``ObsNormalizer`` keeps running
observation statistics as buffers, so they travel with the weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from apexrl.models.torsos import ACTIVATIONS, build_torso, choose_torso, mlp_torso


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

    Asymmetric inputs (``policy_obs_dim`` > 0): the policy torso reads only the first
    ``policy_obs_dim`` numbers of the observation, the value torso all of it: a critic that sees
    more than the policy acts on (a multi-agent team critic, as MAPPO's, sees every agent's
    observation; the policy still acts on its own). Separate torsos only.

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
        policy_obs_dim: the numbers of the observation the policy reads (0: all of it).
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
        policy_obs_dim: int = 0,
    ) -> None:
        super().__init__()
        if obs_dim < 1:
            raise ValueError(f"obs_dim must be >= 1, got {obs_dim}")
        if not 0 <= policy_obs_dim <= obs_dim:
            raise ValueError(f"policy_obs_dim must be in [0, {obs_dim}], got {policy_obs_dim}")
        if policy_obs_dim and shared_torso:
            raise ValueError("policy_obs_dim needs separate torsos (shared_torso=False)")
        _check_action_space(num_actions, action_dim, init_log_std, state_dependent_log_std)
        if any(size < 1 for size in hidden_sizes):
            raise ValueError(f"hidden_sizes must all be >= 1, got {tuple(hidden_sizes)}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.obs_dim = obs_dim
        self.policy_obs_dim = policy_obs_dim or obs_dim
        self.num_actions = num_actions
        self.action_dim = action_dim
        self.shared_torso = shared_torso
        self.state_dependent_log_std = state_dependent_log_std
        if init_log_std is None:
            init_log_std = 0.0

        if shared_torso:
            self.torso = mlp_torso(obs_dim, hidden_sizes, activation)
        else:
            self.policy_torso = mlp_torso(self.policy_obs_dim, hidden_sizes, activation)
            self.value_torso = mlp_torso(obs_dim, hidden_sizes, activation)
        features = (self.torso if shared_torso else self.policy_torso).out_features
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
            policy_features = self.policy_torso(obs[..., : self.policy_obs_dim])
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

    @torch.no_grad()
    def merge_summed(self, values: list[float]) -> None:
        """Merge ``[count, *sums, *sums of squares]`` (``moments_of``, maybe summed over the
        learner ranks, so that every rank keeps the same statistics)."""
        dim = self.mean.shape[0]
        self.merge(values[0], values[1 : 1 + dim], values[1 + dim :])

    def moments_of(self, obs: Tensor | None) -> list[float]:
        """``[count, *sums, *sums of squares]`` of observations ``[..., obs_dim]`` (zeros for
        None): what ``merge_summed`` takes."""
        dim = self.mean.shape[0]
        if obs is None:
            return [0.0] * (1 + 2 * dim)
        x = obs.reshape(-1, dim).double()
        return [float(x.shape[0]), *x.sum(dim=0).tolist(), *x.pow(2).sum(dim=0).tolist()]

    def forward(self, obs: Tensor) -> Tensor:
        standardised = (obs.float() - self.mean) / torch.sqrt(self.var + self.eps)
        return standardised.clamp(-self.clip, self.clip)


class NormalizedObsNetwork(nn.Module):
    """``net(normalizer(obs))``: a network whose input statistics are part of its weights. What
    is not its own (a Q-network's ``num_atoms``, ``atoms``, ``dueling``) is read from ``net``."""

    def __init__(self, normalizer: ObsNormalizer, net: nn.Module) -> None:
        super().__init__()
        self.normalizer, self.net = normalizer, net

    def forward(self, obs: Tensor):
        return self.net(self.normalizer(obs))

    def __getattr__(self, name: str) -> object:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("net"), name)


class MirroredBoardNetwork(nn.Module):
    """A categorical actor-critic made symmetric under a board's left-right mirror, for boards
    whose actions are their columns (connect four): ``net`` reads the board and its mirror image
    (the last axis reversed) as one batch; the logits are the mean of the board's and the
    mirror's with its columns reversed, the value the mean of both values. So a position and its
    mirror image get mirrored policies and the same value, from the first update on (each game
    also teaches its mirror image)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, obs: Tensor) -> CategoricalOutput:
        n = obs.shape[0]
        out = self.net(torch.cat([obs, obs.flip(-1)]))
        logits = 0.5 * (out.logits[:n] + out.logits[n:].flip(-1))
        return CategoricalOutput(logits=logits, value=0.5 * (out.value[:n] + out.value[n:]))

    def __getattr__(self, name: str) -> object:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("net"), name)


class ImageActorCritic(nn.Module):
    """An actor-critic for channel-first images (IMPALA, PPO on Atari and MinAtar): one
    convolutional torso that both heads read (the IMPALA paper's and cleanRL's Atari PPO's shape),
    a categorical policy head and a value head.

    Init as ``MLPActorCritic`` with ``orthogonal_init``: every conv and Linear layer orthogonal with
    gain sqrt(2), the policy output with gain 0.01, the value output with gain 1, biases 0.

    Args:
        obs_shape: ``(C, H, W)``.
        num_actions: A.
        torso: ``nature_cnn``, ``small_cnn``, ``impala_resnet``, ``minatar_cnn`` or ``auto``
            (by image size).
        pixel_scale: what the torso multiplies pixel values by.
        orthogonal_init: initialize as described above; otherwise PyTorch's default.
    """

    def __init__(
        self,
        obs_shape: Sequence[int],
        num_actions: int,
        torso: str = "auto",
        pixel_scale: float = 1.0 / 255.0,
        orthogonal_init: bool = True,
    ) -> None:
        super().__init__()
        _check_action_space(num_actions, None, None, False)
        self.obs_shape, self.num_actions = tuple(obs_shape), num_actions
        self.torso = build_torso(self.obs_shape, torso, pixel_scale=pixel_scale)
        self.policy_head = nn.Linear(self.torso.out_features, num_actions)
        self.value_head = nn.Linear(self.torso.out_features, 1)
        if orthogonal_init:
            for module in self.modules():
                if isinstance(module, nn.Linear | nn.Conv2d):
                    nn.init.orthogonal_(module.weight, gain=2.0**0.5)
                    nn.init.zeros_(module.bias)
            nn.init.orthogonal_(self.policy_head.weight, gain=0.01)
            nn.init.orthogonal_(self.value_head.weight, gain=1.0)

    discrete = True

    def forward(self, obs: Tensor) -> CategoricalOutput:
        """Policy logits ``[N, A]`` and value ``[N]`` for ``[N, C, H, W]`` images; leading dims
        such as ``[T, B, C, H, W]`` also work (the outputs then keep them)."""
        lead = obs.shape[: obs.dim() - 3]
        features = self.torso(obs.reshape(-1, *self.obs_shape))
        logits = self.policy_head(features).view(*lead, self.num_actions)
        return CategoricalOutput(logits=logits, value=self.value_head(features).view(*lead))


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
    torso: str = "auto",
    pixel_scale: float = 1.0 / 255.0,
    policy_obs_dim: int = 0,
) -> MLPActorCritic | ImageActorCritic:
    """The actor-critic for an observation shape and an action space, given as plain numbers:
    ``num_actions`` for a discrete space (``Discrete(n)``: a categorical head), ``action_dim``
    for a continuous one (``Box`` of shape ``(D,)``: a Gaussian head). Flat observations get an
    ``MLPActorCritic`` (the other arguments are its), channel-first images an
    ``ImageActorCritic`` on the torso that ``choose_torso`` names. ``policy_obs_dim`` > 0: the
    policy reads only that many first numbers of a flat observation (``MLPActorCritic``).

    Raises:
        ValueError: unless exactly one of ``num_actions`` and ``action_dim`` is given (Gaussian
            options only with ``action_dim``; images only with ``num_actions``) and the torso can
            read ``obs_shape``.
    """
    obs_shape = tuple(obs_shape)
    _check_action_space(num_actions, action_dim, init_log_std, state_dependent_log_std)
    name = choose_torso(obs_shape, torso)
    if name != "mlp":
        if policy_obs_dim:
            raise ValueError(f"policy_obs_dim takes flat observations, not {obs_shape}")
        if num_actions is None:
            raise ValueError(f"image observations {obs_shape} need a discrete action space")
        return ImageActorCritic(obs_shape, num_actions, name, pixel_scale, orthogonal_init)
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
        policy_obs_dim=policy_obs_dim,
    )

"""What IMPALA and PPO share: a policy-and-value network, its actor core and its unroll items.

The network is ``models.build_policy_network``: a categorical head for a ``Discrete`` action space,
a Gaussian head (state-independent log-std) for a ``Box`` space, chosen from the env's space. Box
actions are sampled unbounded and stored as sampled; the env clips them to its bounds
(``envs.make_vector_env``), so the learner's log-probabilities are those of what was sampled.
With ``squash``, the Gaussian is tanh-squashed into [-1, 1], which the env maps onto its bounds,
and log-probabilities take the change of variables into account.

A replay item is one env's unroll of ``T`` steps, rows ``[N, T, ...]`` (the learner makes them
time-major ``[T, N, ...]``):

================  ======================  ==============================================
field             shape, dtype            meaning
================  ======================  ==============================================
obs               [N, T, *obs]            the observation each action was chosen on
action            [N, T, *action]         the action sampled (int64, or float32 for Box)
reward            [N, T] float32          r_t
terminated        [N, T] bool             the step reached a terminal state
truncated         [N, T] bool             the episode was cut off after the step
next_obs          [N, T, *obs]            s_{t+1} (the final observation at an episode end)
behaviour_logp    [N, T] float32          log mu(a_t | s_t) of the acting policy
value             [N, T] float32          V(s_t) of the acting network
weights_version   [N, T] int64            the weights version that chose a_t (-1: initial)
action_mask       [N, T, A] bool          with ``algo.action_mask`` only (a Discrete action):
                                          the legal actions at obs; the policy is the
                                          softmax over them (``masked_policy``), when acting
                                          and in the learner alike
================  ======================  ==============================================

``next_obs`` of every step (not only the last) lets a truncated episode bootstrap from the value
of its own final observation rather than the next episode's first one.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from apexrl.acting.step_block import StepBlock
from apexrl.envs import VectorStep, mirror_board_refusal
from apexrl.envs.nested import HybridActions, PackedBox
from apexrl.learning.optim import Adam
from apexrl.math.distributions import (
    categorical_entropy,
    categorical_log_prob,
    categorical_sample,
    gaussian_entropy,
    gaussian_log_prob,
    gaussian_sample,
    hybrid_log_prob_and_entropy,
    mask_logits,
    product_categorical_entropy,
    product_categorical_log_prob,
    squashed_gaussian_log_prob,
    squashed_gaussian_sample,
)
from apexrl.math.targets import check_legal_actions
from apexrl.models import (
    CategoricalOutput,
    MirroredBoardNetwork,
    NormalizedObsNetwork,
    ObsNormalizer,
    RecurrentActorCritic,
    build_policy_network,
)
from apexrl.models.packed import HybridOutput, PackedTorso, ProductActorCritic
from apexrl.models.torsos import build_torso, mlp_torso, pixel_scale

UNROLL_FIELDS = (
    "obs",
    "action",
    "reward",
    "terminated",
    "truncated",
    "next_obs",
    "behaviour_logp",
    "value",
    "weights_version",
)
# A recurrent unroll's fields of its first step only (``algos.recurrent_unrolls``): not time-major.
START_FIELDS = ("recurrent_state", "prev_action", "prev_reward")


def make_policy_network(
    obs_space: gym.Space,
    action_space: gym.Space,
    hidden_sizes: tuple[int, ...],
    activation: str,
    init_log_std: float,
    normalize_obs: bool = False,
    torso: str = "auto",
    lstm_size: int = 0,
    prev_action_reward: bool = False,
    shared_lstm: bool = False,
    policy_obs_dim: int = 0,
    mirror_board: bool = False,
) -> nn.Module:
    """A categorical policy for ``Discrete``, a Gaussian one for a flat ``Box``, with a value, on
    the torso ``torso`` names (``apexrl.models.torsos``); with ``normalize_obs``, behind a running
    observation normaliser (its statistics are buffers: they travel with the weights). With
    ``lstm_size`` > 0, an LSTM between the torso and the heads (``models.RecurrentActorCritic``;
    ``prev_action_reward``: it also reads the previous action and reward; ``shared_lstm``: one
    LSTM for the policy and the value, else one each). ``policy_obs_dim`` > 0: the policy reads
    only the first that many numbers of a flat observation, the value all of them (a team
    critic; ``models.MLPActorCritic``). ``mirror_board``: a board's channel-first planes whose
    ``Discrete`` actions are its columns, the policy made mirror-symmetric
    (``models.MirroredBoardNetwork``)."""
    if mirror_board:
        return mirrored_board_network(obs_space, action_space, normalize_obs, lstm_size, torso)
    if policy_obs_dim and (lstm_size > 0 or needs_product_network(obs_space, action_space)):
        raise ValueError(
            "algo.policy_obs_dim (a critic that sees more than the policy) takes a feed-forward "
            f"network, flat observations and a Discrete or Box action, not {action_space} with "
            f"algo.lstm_size {lstm_size}"
        )
    if lstm_size > 0:
        return recurrent_network(
            obs_space,
            action_space,
            hidden_sizes,
            activation,
            init_log_std,
            torso,
            lstm_size,
            prev_action_reward,
            shared_lstm,
        )
    if needs_product_network(obs_space, action_space):
        if normalize_obs:
            raise ValueError(
                "algo.normalize_obs does not take nested observations or MultiDiscrete, Tuple "
                f"or Dict actions yet (observations {obs_space}, actions {action_space})"
            )
        return product_network(
            obs_space, action_space, hidden_sizes, activation, init_log_std, torso
        )
    net = _policy_network(
        obs_space, action_space, hidden_sizes, activation, init_log_std, torso, policy_obs_dim
    )
    if normalize_obs:
        return NormalizedObsNetwork(ObsNormalizer(int(np.prod(obs_space.shape))), net)
    return net


def mirrored_board_network(
    obs_space: gym.Space, action_space: gym.Space, normalize_obs: bool, lstm_size: int, torso: str
) -> MirroredBoardNetwork:
    """``models.MirroredBoardNetwork`` around the image actor-critic of ``torso``; raises
    ``ValueError`` unless the observations are ``[C, H, W]`` planes and the actions
    ``Discrete(W)``, without normalize_obs or an LSTM."""
    refusal = mirror_board_refusal(obs_space, action_space)
    if refusal:
        raise ValueError(refusal)
    if normalize_obs or lstm_size > 0:
        raise ValueError("algo.mirror_board takes neither algo.normalize_obs nor an LSTM")
    return MirroredBoardNetwork(
        build_policy_network(
            obs_space.shape,
            num_actions=int(action_space.n),
            torso=torso,
            pixel_scale=pixel_scale(obs_space.high),
        )
    )


def recurrent_network(
    obs_space: gym.Space,
    action_space: gym.Space,
    hidden_sizes: tuple[int, ...],
    activation: str,
    init_log_std: float,
    torso: str,
    lstm_size: int,
    prev_action_reward: bool,
    shared_lstm: bool,
) -> RecurrentActorCritic:
    """``models.RecurrentActorCritic`` for a flat, image or packed (Dict or Tuple) observation and
    any action an actor-critic takes (``action_parts``)."""
    num_actions, nvec, box_dim = action_parts(action_space)
    packed = isinstance(obs_space, PackedBox)
    return RecurrentActorCritic(
        obs_space.shape,
        num_actions=num_actions,
        action_dim=box_dim or None,
        hidden_sizes=hidden_sizes,
        activation=activation,
        lstm_size=lstm_size,
        prev_action_reward=prev_action_reward,
        shared_lstm=shared_lstm,
        torso=torso,
        pixel_scale=1.0 if packed else pixel_scale(obs_space.high),
        init_log_std=init_log_std,
        layout=obs_space.layout if packed else None,
        nvec=nvec,
    )


def action_parts(action_space: gym.Space) -> tuple[int | None, tuple[int, ...], int]:
    """An actor-critic's action heads for ``action_space``: ``(A, (), 0)`` for ``Discrete(A)``,
    ``(None, nvec, 0)`` for a MultiDiscrete, ``(None, (), D)`` for a flat Box of D,
    ``(None, nvec, D)`` for a Tuple or Dict of Discrete parts of sizes ``nvec`` and Box parts of
    D values in all; ``ValueError`` for anything else."""
    if isinstance(action_space, gym.spaces.Discrete):
        return int(action_space.n), (), 0
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        if np.asarray(action_space.nvec).ndim != 1 or np.any(np.asarray(action_space.start) != 0):
            raise ValueError(f"only a flat MultiDiscrete starting at 0 is taken: {action_space}")
        return None, tuple(int(n) for n in action_space.nvec), 0
    if isinstance(action_space, HybridActions):
        return None, action_space.layout.nvec, action_space.layout.box_dim
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        return None, (), int(action_space.shape[0])
    raise ValueError(f"an actor-critic cannot act in {action_space}")


def _policy_network(
    obs_space: gym.Space,
    action_space: gym.Space,
    hidden_sizes: tuple[int, ...],
    activation: str,
    init_log_std: float,
    torso: str,
    policy_obs_dim: int = 0,
) -> nn.Module:
    if isinstance(action_space, gym.spaces.Discrete):
        return build_policy_network(
            obs_space.shape,
            num_actions=int(action_space.n),
            hidden_sizes=hidden_sizes,
            activation=activation,
            torso=torso,
            pixel_scale=pixel_scale(obs_space.high),
            policy_obs_dim=policy_obs_dim,
        )
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        return build_policy_network(
            obs_space.shape,
            action_dim=int(action_space.shape[0]),
            hidden_sizes=hidden_sizes,
            activation=activation,
            init_log_std=init_log_std,
            torso=torso,
            policy_obs_dim=policy_obs_dim,
        )
    raise ValueError(
        f"an actor-critic needs a Discrete or flat Box action space, got {action_space}"
    )


def needs_product_network(obs_space: gym.Space, action_space: gym.Space) -> bool:
    """Packed (nested) observations, or a MultiDiscrete or packed Tuple/Dict action."""
    return isinstance(obs_space, PackedBox) or isinstance(
        action_space, gym.spaces.MultiDiscrete | HybridActions
    )


def product_network(
    obs_space: gym.Space,
    action_space: gym.Space,
    hidden_sizes: tuple[int, ...],
    activation: str,
    init_log_std: float,
    torso: str,
) -> ProductActorCritic:
    """``models.ProductActorCritic`` for these spaces: a ``PackedTorso`` shared by the policy and
    the value for packed observations, two MLP torsos for flat ones (``MLPActorCritic``'s
    shape); images alone take the torso ``torso`` names."""
    if isinstance(obs_space, PackedBox):
        policy_torso = PackedTorso(obs_space.layout, hidden_sizes, activation, torso)
        value_torso = None
    elif len(obs_space.shape) == 1:
        policy_torso = mlp_torso(int(obs_space.shape[0]), hidden_sizes, activation)
        value_torso = mlp_torso(int(obs_space.shape[0]), hidden_sizes, activation)
    else:
        policy_torso = build_torso(obs_space.shape, torso, pixel_scale=pixel_scale(obs_space.high))
        value_torso = None
    num_actions, nvec, box_dim = action_parts(action_space)
    single = num_actions is not None
    if single:
        nvec = (num_actions,)
    return ProductActorCritic(
        obs_space.shape, policy_torso, nvec, box_dim, single, value_torso, init_log_std
    )


def masked_policy(out: object, legal: Tensor) -> CategoricalOutput:
    """``out`` of a categorical policy over one ``Discrete`` action with its illegal actions'
    logits masked out (``distributions.mask_logits``): sampling, the mode, log-probabilities and
    the entropy then keep to the legal actions. ``legal`` is bool, of the logits' shape;
    ``ValueError`` for any other policy (a legal-action mask needs a Discrete action)."""
    single = isinstance(out, CategoricalOutput) and out.logits.dim() == out.value.dim() + 1
    if not single:
        raise ValueError(
            f"an action mask needs a categorical policy over one Discrete action, got "
            f"{type(out).__name__}"
        )
    return out._replace(logits=mask_logits(out.logits, legal))


def log_prob_and_entropy(
    out: object, action: Tensor, squash: bool = False
) -> tuple[Tensor, Tensor]:
    """log pi(a | s) and the policy's entropy, over the leading dims of ``out`` (its value's):
    product distributions sum both over their parts. A squashed Gaussian's entropy has no closed
    form: the entropy given is the Gaussian's before the tanh."""
    if isinstance(out, HybridOutput):
        return hybrid_log_prob_and_entropy(out.logits, out.mean, out.log_std, action, squash)
    if isinstance(out, CategoricalOutput) and out.logits.dim() > out.value.dim() + 1:
        logits = out.logits
        return product_categorical_log_prob(logits, action), product_categorical_entropy(logits)
    if isinstance(out, CategoricalOutput):
        return categorical_log_prob(out.logits, action), categorical_entropy(out.logits)
    if squash:
        logp = squashed_gaussian_log_prob(out.mean, out.log_std, action)
        return logp, gaussian_entropy(out.log_std)
    return gaussian_log_prob(out.mean, out.log_std, action), gaussian_entropy(out.log_std)


class PolicyActorCore:
    """Samples from the policy (or, for evaluation, takes its mode) and stores the behaviour
    log-probability and value of every step; a block is ``T`` steps, cut into one unroll per env.
    Given a legal-action mask, the policy is the softmax over the legal actions
    (``masked_policy``); with ``action_mask``, the unrolls carry the block's masks."""

    def __init__(
        self,
        network: nn.Module,
        unroll_length: int,
        greedy: bool,
        device: str,
        seed: int,
        synchronous: bool = False,
        squash: bool = False,
        action_mask: bool = False,
    ) -> None:
        self.network, self.greedy, self.device, self.squash = network, greedy, device, squash
        self.action_mask = action_mask
        self.block_steps, self.block_overlap = unroll_length, 0
        self.synchronous = synchronous
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def policy(self, obs: Tensor, rows: np.ndarray | None = None) -> object:
        """The network's outputs for one step of every env (of lanes ``rows``, which a
        feed-forward policy has no use for)."""
        return self.network(obs)

    def act(
        self, obs: np.ndarray, mask: np.ndarray | None = None, rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions for ``obs`` ``[B, *obs]`` and their extras; ``mask`` bool ``[B, A]`` (True:
        legal; a Discrete action only) keeps the policy to the legal actions; ``rows``: the
        lanes of ``obs`` (``algos.ActorCore``), passed on to ``policy``."""
        with torch.inference_mode():
            out = self.policy(torch.as_tensor(obs, device=self.device), rows)
            if mask is not None:
                out = masked_policy(out, torch.as_tensor(mask, device=self.device))
                check_legal_actions(mask, *out.logits.shape)
            if isinstance(out, HybridOutput):
                action = self._hybrid_action(out)
            elif isinstance(out, CategoricalOutput):
                if self.greedy:
                    action = out.logits.argmax(dim=-1)
                else:
                    action = categorical_sample(out.logits, self.generator)
            elif self.squash:
                if self.greedy:
                    action = torch.tanh(out.mean)
                else:
                    action = squashed_gaussian_sample(out.mean, out.log_std, self.generator).action
            elif self.greedy:
                action = out.mean
            else:
                action = gaussian_sample(out.mean, out.log_std, self.generator)
            logp, _ = log_prob_and_entropy(out, action, self.squash)
        extras = {
            "behaviour_logp": logp.cpu().numpy().astype(np.float32),
            "value": out.value.cpu().numpy().astype(np.float32),
        }
        return action.cpu().numpy(), extras

    def _hybrid_action(self, out: HybridOutput) -> Tensor:
        """Float rows: each Discrete part's index (sampled, or its mode), then the Box values."""
        if self.greedy:
            indices = out.logits.argmax(dim=-1)
            values = torch.tanh(out.mean) if self.squash else out.mean
        else:
            indices = categorical_sample(out.logits, self.generator)
            if self.squash:
                values = squashed_gaussian_sample(out.mean, out.log_std, self.generator).action
            else:
                values = gaussian_sample(out.mean, out.log_std, self.generator)
        return torch.cat([indices.to(values.dtype), values], dim=-1)

    def observe(self, action: np.ndarray, step: VectorStep, rows: np.ndarray | None = None) -> None:
        """Nothing to keep between steps: the policy is feed-forward."""

    def items(
        self, block: StepBlock, rows: np.ndarray | None = None
    ) -> tuple[dict[str, np.ndarray], None]:
        return unroll_items(block, self.action_mask), None


def unroll_items(block: StepBlock, action_mask: bool = False) -> dict[str, np.ndarray]:
    """One unroll per env: the block's ``[T, B, ...]`` arrays as ``[B, T, ...]`` copies; with
    ``action_mask``, the block's ``action_mask`` extra (the legal actions at obs) too."""
    fields = {
        name: np.ascontiguousarray(np.swapaxes(block.arrays[name], 0, 1)) for name in UNROLL_FIELDS
    }
    if action_mask:
        mask = np.swapaxes(block.extras["action_mask"], 0, 1)
        fields["action_mask"] = np.ascontiguousarray(mask, dtype=np.bool_)
    return fields


def time_major(fields: dict[str, Tensor]) -> dict[str, Tensor]:
    """A batch of unrolls ``[N, T, ...]`` as ``[T, N, ...]`` (what ``targets`` expects); the
    start fields of a recurrent unroll stay ``[N, ...]``."""
    return {
        name: value if name in START_FIELDS else value.transpose(0, 1)
        for name, value in fields.items()
    }


class PendingMoments:
    """The observation moments of a learner's last batch, waiting to be merged into its
    network's ``ObsNormalizer`` at the next ``agree`` (summed over the learner ranks there, so
    every rank keeps the same statistics); nothing without a normalizer (``algo.normalize_obs``
    off). ``also`` are networks (a target network) whose statistics follow."""

    def __init__(self, network: nn.Module, also: tuple[nn.Module, ...] = ()) -> None:
        self.normalizer = getattr(network, "normalizer", None)
        self.followers = [net.normalizer for net in also] if self.normalizer is not None else []
        self.values: list[float] | None = None

    def add(self, obs: Tensor, real: Tensor | None = None) -> None:
        """Take in a batch's observations; ``real`` (bool ``[B, L]``, R2D2's sequence mask)
        leaves out the padding after an episode's end of observations ``[B, L + 1, ...]`` (and
        each sequence's last, the step its last one led to)."""
        if self.normalizer is None:
            return
        if real is not None:
            obs = obs[:, : real.shape[1]][real.bool()]
        self.values = self.normalizer.moments_of(obs)

    def merge(self, total: Callable[[list[float]], list[float]]) -> None:
        if self.normalizer is None:
            return
        summed = total(self.values or self.normalizer.moments_of(None))
        self.values = None
        self.normalizer.merge_summed(summed)
        for follower in self.followers:
            follower.load_state_dict(self.normalizer.state_dict())


def clip_and_step(network: nn.Module, optimizer: Adam, clip_norm: float) -> float:
    """Clip the global gradient norm (0: no clip) and take the optimizer step; the norm."""
    grad_norm = 0.0
    if clip_norm > 0:
        grad_norm = float(nn.utils.clip_grad_norm_(network.parameters(), clip_norm))
    optimizer.step()
    return grad_norm


def trainer_state(network: nn.Module, optimizer: Adam, num_updates: int) -> dict[str, object]:
    """What a checkpoint keeps of an actor-critic learner."""
    return {
        "network": network.state_dict(),
        "optimizer": optimizer.state_dict(),
        "num_updates": num_updates,
    }


def load_trainer_state(state: dict[str, object], network: nn.Module, optimizer: Adam) -> int:
    """Restore ``trainer_state``'s network and optimizer; returns its ``num_updates``."""
    network.load_state_dict(state["network"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["num_updates"])


def next_values(values: Tensor, obs: Tensor, next_obs: Tensor, network: nn.Module) -> Tensor:
    """``V(next_obs[t])`` for unrolls ``[T, N, ...]`` whose ``obs`` have the values ``values``.

    Within an episode the step after ``t`` starts from what step ``t`` ended in (``next_obs[t]``
    is ``obs[t + 1]``, bit for bit), so its value is ``values[t + 1]``, already computed; only the
    rest goes through the network: each unroll's last step and the steps that ended an episode
    (the env reset after them, so ``obs[t + 1]`` is the next episode's first). The same values
    as ``network(next_obs).value`` for about ``1/T`` of its cost."""
    same = torch.zeros(next_obs.shape[:2], dtype=torch.bool, device=next_obs.device)
    same[:-1] = (next_obs[:-1] == obs[1:]).flatten(2).all(-1)
    out = torch.empty_like(values)
    out[:-1] = values[1:]
    fresh = ~same
    out[fresh] = network(next_obs[fresh]).value.to(out.dtype)
    return out

"""Hyperparameters of each algorithm, one frozen dataclass per algorithm.

They live apart from the algorithms' torch code so that roles which never touch a network (the
replay and parameter servers, the launcher) can load a config without importing torch: that saves
each of them about 1.5 s of CPU at start and a few hundred MB of memory.

Each class also describes what its actors send, so the replay server can allocate its table and
refuse anything else before the first chunk arrives:

- ``item_spec(obs_space, action_space)``: the layout of one replay item, field name -> (dtype,
  per-item shape), exactly as the algorithm's actor core cuts it (checked against real chunks in
  ``tests/test_hostile_replay.py``);
- ``ACTION_FIELDS``: the item fields that hold actions (checked against the action space);
- ``item_int_ranges()``: other integer fields and the values they may hold (Ape-X's window
  length, whose gamma^m the target uses);
- ``items_per_chunk`` and ``max_env_steps_per_chunk``: the most items, and env steps, one chunk of
  an actor can carry;
- ``steps_in_items`` and ``carried_steps``: the env steps a chunk's items account for, and how
  many more an actor may have taken whose items it has not cut yet (so replay can hold the env
  steps a chunk claims to its items: ``replay/actors.py``).

The spaces are only read for ``shape``, ``dtype`` and their class name, so this module needs
neither torch nor gymnasium. Each ``validate`` checks its fields with the rules of
``apexrl/config/rules.py`` (``Config.validate`` calls it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from apexrl.config.rules import check_at_least_one, check_in_unit_interval, check_positive

ItemSpec = dict[str, tuple[np.dtype, tuple[int, ...]]]  # field -> (dtype, shape of one item)


# The torsos a config may name (apexrl.models.torsos builds them).
TORSOS = (
    "auto",
    "mlp",
    "nature_cnn",
    "small_cnn",
    "impala_resnet",
    "minatar_cnn",
    "board_cnn",
)


def _check_torso(torso: str) -> None:
    if torso not in TORSOS:
        raise ValueError(f"algo.torso must be one of {', '.join(TORSOS)}, got {torso!r}")


def _obs(obs_space: Any, *leading: int) -> tuple[np.dtype, tuple[int, ...]]:
    """Observations are stored as the env makes them: its space's dtype and shape."""
    return np.dtype(obs_space.dtype), (*leading, *obs_space.shape)


def action_array(action_space: Any, *leading: int) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and shape of ``[*leading]`` actions as actors store them (and ``Policy`` keeps
    a recurrent state's previous ones). A ``Discrete`` action is an int64 index, a
    ``MultiDiscrete`` one int64 indices; a ``Box`` action (and a Tuple or Dict one packed as
    ``HybridActions``) is the policy's float32 sample (whatever the space's dtype), of the
    space's shape."""
    kind = type(action_space).__name__
    if kind == "Discrete":
        return np.dtype(np.int64), tuple(leading)
    if kind in ("Box", "HybridActions"):  # HybridActions: apexrl.envs.nested's float32 rows
        return np.dtype(np.float32), (*leading, *action_space.shape)
    if kind == "MultiDiscrete":
        return np.dtype(np.int64), (*leading, *action_space.shape)
    raise ValueError(f"no item layout for a {kind} action space: {action_space}")


def _scalar(dtype: type, *leading: int) -> tuple[np.dtype, tuple[int, ...]]:
    return np.dtype(dtype), tuple(leading)


def action_mask_array(action_space: Any, *leading: int) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and shape of ``[*leading]`` legal-action masks (``algo.action_mask``): bool
    ``[*leading, A]`` for a ``Discrete(A)`` action space, True where the action is legal."""
    kind = type(action_space).__name__
    if kind != "Discrete":
        raise ValueError(f"algo.action_mask needs a Discrete action space, got {action_space}")
    return np.dtype(np.bool_), (*leading, int(action_space.n))


class NStepItems:
    """The replay items of Ape-X DQN and the Q-function policy gradients: one n-step transition
    per env step (``algos.transitions``). A dataclass with an ``n_step`` field inherits it."""

    n_step: int

    def items_per_chunk(self, chunk_steps: int, num_envs: int) -> int:
        """One n-step transition per env step."""
        return chunk_steps * num_envs

    def max_env_steps_per_chunk(self, chunk_steps: int, num_envs: int) -> int:
        """The first chunk also carries the ``n - 1`` steps its last windows reach into."""
        return (chunk_steps + self.n_step - 1) * num_envs

    def steps_in_items(self, fields: dict[str, np.ndarray]) -> int:
        """Env steps a chunk's items account for: one transition per step."""
        return len(fields["num_steps"])

    def carried_steps(self, num_envs: int) -> int:
        """Env steps an actor took whose transitions are not cut yet: the ``n - 1`` steps the
        last windows of each env reach into."""
        return (self.n_step - 1) * num_envs

    def item_int_ranges(self) -> dict[str, tuple[int, int]]:
        """Integer fields whose values the learner's math relies on: inclusive ranges."""
        return {"num_steps": (1, self.n_step)}

    def frames_per_item(self, stack: int, chunk_steps: int) -> float:
        """New frames per transition when frames are stored once: a chunk of ``chunk_steps``
        steps of an env holds their frames, the ``stack - 1`` before the first, the ``n`` its
        last windows reach and one more at an episode's end, shared by ``chunk_steps``
        transitions."""
        return (chunk_steps + stack + self.n_step) / chunk_steps

    def item_spec(self, obs_space: Any, action_space: Any) -> ItemSpec:
        """One n-step transition (``algos.transitions``); with ``action_mask``, the legal
        actions at its ``next_obs``."""
        spec = {
            "obs": _obs(obs_space),
            "action": action_array(action_space),
            "reward": _scalar(np.float32),
            "num_steps": _scalar(np.int64),
            "terminated": _scalar(np.bool_),
            "truncated": _scalar(np.bool_),
            "next_obs": _obs(obs_space),
        }
        if getattr(self, "action_mask", False):
            spec["next_action_mask"] = action_mask_array(action_space)
        return spec


DISTRIBUTIONAL_PRIORITIES = ("cross_entropy", "kl")


@dataclass(frozen=True)
class ApexDQNConfig(NStepItems):
    """Hyperparameters of Ape-X DQN (defaults: the paper's; CartPole values live in its config)."""

    ACTION_SPACES: ClassVar[tuple[str, ...]] = ("Discrete",)  # gymnasium space classes it acts in
    PRODUCT_DISCRETE: ClassVar[bool] = True  # a small MultiDiscrete acts as its product Discrete
    SYNCHRONOUS: ClassVar[bool] = False  # actors wait for each new weights version
    ACTION_FIELDS: ClassVar[tuple[str, ...]] = ("action",)  # item fields that hold actions

    gamma: float = 0.99  # discount per env step
    n_step: int = 3  # n of the n-step return
    lr: float = 0.00025 / 4  # Adam learning rate
    adam_eps: float = 1.5e-4  # Adam epsilon
    grad_clip_norm: float = 40.0  # global gradient-norm clip; 0 disables
    target_update_period: int = 2500  # learner updates between target-network syncs
    huber_delta: float = 1.0  # Huber loss threshold
    importance_exponent: float = 0.4  # beta of the importance-sampling weights
    priority_eps: float = 1e-6  # added to |TD| for new priorities
    hidden_sizes: tuple[int, ...] = (512,)  # MLP torso widths (flat observations)
    # "auto" (MLP for flat observations, MinAtar CNN under 36 pixels, small CNN under 64, else
    # Nature CNN), "mlp", "nature_cnn", "small_cnn", "impala_resnet", "minatar_cnn" or
    # "board_cnn" (board games' planes) (apexrl.models.torsos)
    torso: str = "auto"
    dueling: bool = True  # dueling head (Wang et al. 2016)
    # The agents' observations come with a legal-action mask: acting and targets honour it
    # (a Discrete action space only; the multi-agent actor adds the masks to its steps).
    action_mask: bool = False
    # Distributional Q-learning (C51, Bellemare et al. 2017): each action's return as a
    # distribution over num_atoms atoms evenly spaced from v_min to v_max; 1: scalar Q-values.
    # Rainbow's Atari values: 51, -10, 10.
    num_atoms: int = 1
    v_min: float = -10.0
    v_max: float = 10.0
    # A distributional item's new priority: "cross_entropy" (the loss itself) or "kl" (the
    # loss less the target distribution's entropy, which has the same gradient; Rainbow's
    # choice: an item whose prediction matches its target gets a priority near 0, not one near
    # the target's entropy)
    distributional_priority: str = "cross_entropy"
    # Standardise flat observations with running statistics of the learner's batches (merged
    # over learner ranks), published with the weights and applied alike by the actors
    normalize_obs: bool = False
    # Noisy nets (Fortunato et al. 2018): the Q head's Linear layers get factorised Gaussian noise
    # (sigma_0 0.5), fresh at each forward pass of the training actors and the learner, so the
    # policy explores by itself (set actor.epsilon to 0 for noise alone); greedy evaluation uses
    # the noise's means.
    noisy: bool = False

    def validate(self) -> None:
        _check_torso(self.torso)
        check_in_unit_interval("algo.gamma", self.gamma)
        check_at_least_one("algo.n_step", self.n_step)
        check_positive("algo.lr", self.lr)
        check_at_least_one("algo.target_update_period", self.target_update_period)
        _check_widths(self.hidden_sizes)
        check_at_least_one("algo.num_atoms", self.num_atoms)
        if self.num_atoms > 1 and not self.v_min < self.v_max:
            raise ValueError(
                f"a distributional head (algo.num_atoms {self.num_atoms}) needs algo.v_min below "
                f"algo.v_max, got {self.v_min} and {self.v_max}"
            )
        if self.distributional_priority not in DISTRIBUTIONAL_PRIORITIES:
            raise ValueError(
                f"algo.distributional_priority must be one of {DISTRIBUTIONAL_PRIORITIES}, got "
                f"{self.distributional_priority!r}"
            )


@dataclass(frozen=True)
class R2D2Config:
    """Hyperparameters of R2D2 (Kapturowski et al. 2019; defaults: the paper's, with an MLP torso
    for flat observations; CartPole values live in its configs)."""

    ACTION_SPACES: ClassVar[tuple[str, ...]] = ("Discrete",)
    PRODUCT_DISCRETE: ClassVar[bool] = True
    SYNCHRONOUS: ClassVar[bool] = False
    ACTION_FIELDS: ClassVar[tuple[str, ...]] = ("action", "prev_action")

    gamma: float = 0.997  # discount per env step
    n_step: int = 5  # n of the n-step return
    lr: float = 1e-4  # Adam learning rate
    adam_eps: float = 1e-3  # Adam epsilon
    grad_clip_norm: float = 40.0  # global gradient-norm clip; 0 disables
    target_update_period: int = 2500  # learner updates between target-network syncs
    importance_exponent: float = 0.6  # beta of the importance-sampling weights
    priority_eta: float = 0.9  # sequence priority: eta * max|td| + (1 - eta) * mean|td|
    priority_eps: float = 1e-6  # added to new priorities
    rescale_eps: float = 1e-3  # epsilon of the value rescaling h(x)
    sequence_length: int = 80  # steps per replay sequence
    sequence_overlap: int = 40  # steps adjacent sequences of an episode share
    burn_in: int = 40  # leading steps that only warm the stored state up (no loss, no gradient)
    hidden_sizes: tuple[int, ...] = (256,)  # MLP torso widths before the LSTM
    torso: str = "auto"  # as algo.torso of apex_dqn; an image torso's features feed the LSTM
    lstm_size: int = 512  # LSTM hidden size
    dueling: bool = True  # dueling head (Wang et al. 2016)
    prev_action_reward: bool = True  # the LSTM also reads the previous action and reward
    # The agents' observations come with a legal-action mask: acting and targets honour it
    # (a Discrete action space only; the multi-agent actor adds the masks to its steps).
    action_mask: bool = False
    num_atoms: int = 1  # 1 only: a distributional head (C51) is Ape-X DQN's (see validate)
    # Standardise flat observations with running statistics (merged over the learner ranks from
    # the sequences' real steps, published with the weights, saved in checkpoints), as Ape-X's.
    normalize_obs: bool = False

    def items_per_chunk(self, chunk_steps: int, num_envs: int) -> int:
        """At most one sequence ends per env step (``actor.chunk_steps`` vector steps make a
        chunk; most chunks carry far fewer)."""
        return chunk_steps * num_envs

    def max_env_steps_per_chunk(self, chunk_steps: int, num_envs: int) -> int:
        """Every env ends a sequence at least every ``sequence_length`` steps, and an actor sends
        a chunk at the end of the first block of ``chunk_steps`` vector steps that ended one; a
        block that ended none passes its env steps on to the next chunk."""
        return math.ceil(self.sequence_length / chunk_steps) * chunk_steps * num_envs

    def steps_in_items(self, fields: dict[str, np.ndarray]) -> int:
        """Env steps a chunk's sequences account for: their real steps, less the
        ``sequence_overlap`` steps a sequence that goes on from the previous one repeats."""
        real = int(np.count_nonzero(fields["mask"]))
        return real - self.sequence_overlap * int(np.count_nonzero(~fields["starts_episode"]))

    def carried_steps(self, num_envs: int) -> int:
        """Env steps an actor took that no sequence holds yet: at most a sequence of each env."""
        return self.sequence_length * num_envs

    def item_int_ranges(self) -> dict[str, tuple[int, int]]:
        """No integer field beyond the actions that the learner's math relies on."""
        return {}

    def frames_per_item(self, stack: int, chunk_steps: int) -> float:
        """New frames per sequence when frames are stored once, at most: its
        ``sequence_length + 1`` observations hold ``sequence_length + stack`` frames, and one more
        at an episode's end (sequences of one chunk that overlap share theirs)."""
        return self.sequence_length + stack + 1

    def item_spec(self, obs_space: Any, action_space: Any) -> ItemSpec:
        """One sequence (``algos.sequences``, ``algos.r2d2.R2D2ActorCore.items``)."""
        length = self.sequence_length
        spec = {
            "obs": _obs(obs_space, length + 1),
            "action": action_array(action_space, length),
            "reward": _scalar(np.float32, length),
            "terminated": _scalar(np.bool_, length),
            "truncated": _scalar(np.bool_, length),
            "recurrent_state": _scalar(np.float32, 2, self.lstm_size),
            "prev_action": action_array(action_space),
            "prev_reward": _scalar(np.float32),
            "mask": _scalar(np.bool_, length),
            "starts_episode": _scalar(np.bool_),
        }
        if self.action_mask:  # the legal actions at each observation, aligned with obs
            spec["action_mask"] = action_mask_array(action_space, length + 1)
        return spec

    def validate(self) -> None:
        _check_torso(self.torso)
        if self.num_atoms != 1:
            raise ValueError(
                f"algo.num_atoms {self.num_atoms}: R2D2 has no distributional head; its targets "
                "are value-rescaled n-step returns (h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x), "
                "which apexrl does not project onto a support. Use algorithm apex_dqn for C51, or "
                "algo.num_atoms 1"
            )
        check_in_unit_interval("algo.gamma", self.gamma)
        for name in ("n_step", "sequence_length", "target_update_period", "lstm_size"):
            check_at_least_one(f"algo.{name}", getattr(self, name))
        for name in ("lr", "rescale_eps"):
            check_positive(f"algo.{name}", getattr(self, name))
        if not 0 <= self.sequence_overlap < self.sequence_length:
            raise ValueError(
                f"algo.sequence_overlap must be in [0, sequence_length = {self.sequence_length}), "
                f"got {self.sequence_overlap}"
            )
        if not 0 <= self.burn_in < self.sequence_length:
            raise ValueError(
                f"algo.burn_in must be in [0, sequence_length = {self.sequence_length}), "
                f"got {self.burn_in}"
            )
        check_in_unit_interval("algo.priority_eta", self.priority_eta)
        if any(size < 1 for size in self.hidden_sizes):  # empty: the LSTM reads the observations
            raise ValueError(f"algo.hidden_sizes must be positive widths, got {self.hidden_sizes}")


ACTIVATIONS = ("tanh", "relu")


def _unroll_spec(unroll_length: int, obs_space: Any, action_space: Any) -> ItemSpec:
    """One env's unroll of ``T`` steps (``algos.actor_critic.unroll_items``)."""
    t = unroll_length
    return {
        "obs": _obs(obs_space, t),
        "action": action_array(action_space, t),
        "reward": _scalar(np.float32, t),
        "terminated": _scalar(np.bool_, t),
        "truncated": _scalar(np.bool_, t),
        "next_obs": _obs(obs_space, t),
        "behaviour_logp": _scalar(np.float32, t),
        "value": _scalar(np.float32, t),
        "weights_version": _scalar(np.int64, t),
    }


def _check_widths(hidden_sizes: tuple[int, ...]) -> None:
    """At least one layer, each of a positive width."""
    if not hidden_sizes or min(hidden_sizes) < 1:
        raise ValueError(f"algo.hidden_sizes must be positive widths, got {hidden_sizes}")


def _check_policy_network(hidden_sizes: tuple[int, ...], activation: str) -> None:
    """The actor-critics' network fields."""
    _check_widths(hidden_sizes)
    if activation not in ACTIVATIONS:
        raise ValueError(f"algo.activation must be one of {ACTIVATIONS}, got {activation!r}")


class UnrollItems:
    """The replay items of the actor-critics (IMPALA, PPO): one unroll of ``unroll_length``
    steps per env, a chunk holding one from every env of an actor (``actor.chunk_steps`` is not
    used: the unroll is the chunk). A dataclass with an ``unroll_length`` field inherits it."""

    unroll_length: int

    def items_per_chunk(self, chunk_steps: int, num_envs: int) -> int:
        """One unroll per env."""
        return num_envs

    def max_env_steps_per_chunk(self, chunk_steps: int, num_envs: int) -> int:
        """``unroll_length`` steps of every env."""
        return self.unroll_length * num_envs

    def steps_in_items(self, fields: dict[str, np.ndarray]) -> int:
        """Env steps a chunk's unrolls account for: ``unroll_length`` each."""
        return len(fields["action"]) * self.unroll_length

    def carried_steps(self, num_envs: int) -> int:
        """An actor sends every step in the unroll it ends: none carried."""
        return 0

    def item_int_ranges(self) -> dict[str, tuple[int, int]]:
        """No integer field beyond the actions that the learner's math relies on."""
        return {}

    def frames_per_item(self, stack: int, chunk_steps: int) -> float:
        """New frames per unroll when frames are stored once: its ``unroll_length + 1``
        observations of one env hold ``unroll_length + stack`` frames, and one more at an
        episode's end."""
        return self.unroll_length + stack + 1

    @property
    def ACTION_FIELDS(self) -> tuple[str, ...]:  # noqa: N802 - the other families' ClassVar
        """The item fields that hold actions: a recurrent unroll's start action too."""
        return ("action", "prev_action") if self.lstm_size > 0 else ("action",)

    def item_spec(self, obs_space: Any, action_space: Any) -> ItemSpec:
        """One unroll of ``unroll_length`` steps; with ``lstm_size`` > 0, the state, action and
        reward it starts from (``algos.recurrent_unrolls``); with ``action_mask``, the legal
        actions at each step's observation."""
        spec = _unroll_spec(self.unroll_length, obs_space, action_space)
        if self.lstm_size > 0:
            width = self.lstm_size * (1 if self.shared_lstm else 2)
            spec["recurrent_state"] = _scalar(np.float32, 2, width)
            spec["prev_action"] = action_array(action_space)
            spec["prev_reward"] = _scalar(np.float32)
        if self.action_mask:  # the legal actions at each observation, aligned with obs
            spec["action_mask"] = action_mask_array(action_space, self.unroll_length)
        return spec

    def check_memory(self) -> None:
        """``lstm_size`` and what it allows."""
        if self.lstm_size < 0:
            raise ValueError(f"algo.lstm_size must be >= 0 (0: no LSTM), got {self.lstm_size}")
        if self.prev_action_reward and self.lstm_size == 0:
            raise ValueError("algo.prev_action_reward needs an LSTM (algo.lstm_size > 0)")
        if self.lstm_size > 0 and getattr(self, "normalize_obs", False):
            raise ValueError("algo.normalize_obs is not supported with algo.lstm_size > 0")
        if self.policy_obs_dim < 0:
            raise ValueError(f"algo.policy_obs_dim must be >= 0, got {self.policy_obs_dim}")
        if self.policy_obs_dim and self.lstm_size > 0:
            raise ValueError("algo.policy_obs_dim is not supported with algo.lstm_size > 0")


@dataclass(frozen=True)
class ImpalaConfig(UnrollItems):
    """Hyperparameters of IMPALA with V-trace (Espeholt et al. 2018; defaults: the paper's
    except the optimizer, Adam here, and the small MLP; CartPole values live in its config).
    ``clip_ratio`` > 0 and ``passes`` > 1 make it APPO (``algos.impala``)."""

    ACTION_SPACES: ClassVar[tuple[str, ...]] = ("Discrete", "Box", "MultiDiscrete", "HybridActions")
    SYNCHRONOUS: ClassVar[bool] = False

    gamma: float = 0.99  # discount per env step
    unroll_length: int = 20  # T, env steps per unroll (one replay item per env)
    lr: float = 0.0006  # Adam learning rate
    adam_eps: float = 1e-8  # Adam epsilon
    grad_clip_norm: float = 40.0  # global gradient-norm clip; 0 disables
    clip_rho: float = 1.0  # rho-bar of V-trace's value targets
    clip_c: float = 1.0  # c-bar of V-trace's trace cutting
    clip_pg_rho: float = 1.0  # rho-bar of the policy-gradient advantage
    baseline_cost: float = 0.5  # weight of the value loss
    entropy_cost: float = 0.01  # weight of the entropy bonus
    clip_ratio: float = 0.0  # > 0: APPO, PPO's surrogate clips pi/mu at 1 +- it; 0: IMPALA's PG
    passes: int = 1  # gradient steps on each batch, one per learner turn (APPO: several)
    hidden_sizes: tuple[int, ...] = (64, 64)  # MLP torso widths (policy and value apart)
    activation: str = "tanh"  # "tanh" or "relu"
    torso: str = "auto"  # as algo.torso of apex_dqn; an image torso is shared by both heads
    init_log_std: float = 0.0  # Box actions: the Gaussian's initial log standard deviation
    squash_actions: bool = False  # Box actions: tanh-squash the Gaussian onto the env's bounds
    lstm_size: int = 0  # > 0: an LSTM of this size between the torso and the heads
    prev_action_reward: bool = False  # the LSTM also reads the previous action and reward
    shared_lstm: bool = False  # one LSTM for both heads; false: the value has its own
    # The agents' observations come with a legal-action mask: acting and targets honour it
    # (a Discrete action space only; the multi-agent actor adds the masks to its steps).
    action_mask: bool = False
    # > 0: the policy reads only the first this many numbers of a flat observation, the value all
    # of it (a critic that sees more than the policy acts on; a multi-agent policy with
    # multiagent.policies[].critic "team" gets it set); 0: both read everything
    policy_obs_dim: int = 0
    # Standardise flat observations with running statistics of the learner's batches (merged
    # over learner ranks), published with the weights and applied alike by the actors
    normalize_obs: bool = False

    def validate(self) -> None:
        _check_torso(self.torso)
        self.check_memory()
        check_in_unit_interval("algo.gamma", self.gamma)
        check_at_least_one("algo.unroll_length", self.unroll_length)
        check_at_least_one("algo.passes", self.passes)
        check_positive("algo.lr", self.lr)
        if not self.clip_ratio >= 0:
            raise ValueError(f"algo.clip_ratio must be >= 0 (0: no clip), got {self.clip_ratio}")
        for name in ("clip_rho", "clip_c", "clip_pg_rho"):
            check_positive(f"algo.{name}", getattr(self, name))
        if self.clip_c > self.clip_rho:
            raise ValueError(
                f"algo.clip_c ({self.clip_c}) must not exceed algo.clip_rho ({self.clip_rho})"
            )
        _check_policy_network(self.hidden_sizes, self.activation)


@dataclass(frozen=True)
class PPOConfig(UnrollItems):
    """Hyperparameters of synchronous PPO (Schulman et al. 2017) with GAE (Schulman et al. 2016);
    defaults: the paper's MuJoCo settings with Adam; CartPole values live in its config."""

    ACTION_SPACES: ClassVar[tuple[str, ...]] = ("Discrete", "Box", "MultiDiscrete", "HybridActions")
    # Actors wait for each new weights version, so the learner must publish every one.
    SYNCHRONOUS: ClassVar[bool] = True

    gamma: float = 0.99  # discount per env step
    gae_lambda: float = 0.95  # lambda of GAE
    unroll_length: int = 32  # T, env steps per env in each rollout (one replay item per env)
    lr: float = 0.0003  # Adam learning rate
    adam_eps: float = 1e-5  # Adam epsilon
    grad_clip_norm: float = 0.5  # global gradient-norm clip; 0 disables
    clip: float = 0.2  # epsilon of the clipped objective
    value_clip: float | None = None  # clip of the value prediction around its old value; null: off
    value_cost: float = 0.5  # weight of the value loss
    entropy_cost: float = 0.0  # weight of the entropy bonus
    epochs: int = 10  # passes over each rollout
    num_minibatches: int = 4  # minibatches per epoch
    normalize_advantages: bool = True  # per minibatch: zero mean, unit std
    rollout_timeout_s: float = 30.0  # train on what arrived once a rollout takes longer
    normalize_obs: bool = False  # running mean/std of observations, updated after each rollout
    hidden_sizes: tuple[int, ...] = (64, 64)  # MLP torso widths (policy and value apart)
    activation: str = "tanh"  # "tanh" or "relu"
    torso: str = "auto"  # as algo.torso of apex_dqn; an image torso is shared by both heads
    init_log_std: float = 0.0  # Box actions: the Gaussian's initial log standard deviation
    squash_actions: bool = False  # Box actions: tanh-squash the Gaussian onto the env's bounds
    lstm_size: int = 0  # > 0: an LSTM of this size between the torso and the heads; whole
    # unrolls per minibatch (algo.num_minibatches splits the rollout's unrolls)
    prev_action_reward: bool = False  # the LSTM also reads the previous action and reward
    shared_lstm: bool = False  # one LSTM for both heads; false: the value has its own
    # The agents' observations come with a legal-action mask: acting and targets honour it
    # (a Discrete action space only; the multi-agent actor adds the masks to its steps).
    action_mask: bool = False
    # > 0: the policy reads only the first this many numbers of a flat observation, the value all
    # of it (a critic that sees more than the policy acts on; a multi-agent policy with
    # multiagent.policies[].critic "team" gets it set); 0: both read everything
    policy_obs_dim: int = 0
    # A board whose Discrete actions are its columns (connect four's planes): the network reads
    # the board and its mirror image and averages, so that the policy is mirror-symmetric
    # (models.MirroredBoardNetwork; twice the network's compute)
    mirror_board: bool = False
    # Anneal the learning rate and the clip range linearly towards 0 over algo.anneal_env_steps
    # (the PPO paper's Atari runs, cleanRL and rl-baselines3-zoo): rollout k of K trains with
    # (1 - k / K) of each
    anneal_lr: bool = False
    anneal_clip: bool = False
    anneal_env_steps: int = 0  # the annealing's length; 0: run.stop_env_steps

    def validate(self) -> None:
        _check_torso(self.torso)
        self.check_memory()
        if self.mirror_board and self.lstm_size > 0:
            raise ValueError("algo.mirror_board is not supported with algo.lstm_size > 0")
        check_in_unit_interval("algo.gamma", self.gamma)
        check_in_unit_interval("algo.gae_lambda", self.gae_lambda)
        for name in ("unroll_length", "epochs", "num_minibatches"):
            check_at_least_one(f"algo.{name}", getattr(self, name))
        for name in ("lr", "clip", "rollout_timeout_s"):
            check_positive(f"algo.{name}", getattr(self, name))
        if self.value_clip is not None and self.value_clip <= 0:
            raise ValueError(f"algo.value_clip must be positive or null, got {self.value_clip}")
        _check_policy_network(self.hidden_sizes, self.activation)


@dataclass(frozen=True)
class QPolicyConfig(NStepItems):
    """What the Q-function policy gradients (DDPG, TD3, SAC; ``algos.q_policy``) share: n-step
    transitions with a Box action in [-1, 1] (the envs map it onto their bounds), critics
    regressed on ``targets.n_step_target``, target networks by Polyak averaging, MLPs on flat
    observations. Defaults: the papers' MuJoCo settings (Haarnoja et al. 2018, Fujimoto et al.
    2018); each config file names its departures."""

    ACTION_SPACES: ClassVar[tuple[str, ...]] = ("Box",)
    SYNCHRONOUS: ClassVar[bool] = False
    ACTION_FIELDS: ClassVar[tuple[str, ...]] = ("action",)
    UNIT_ACTIONS: ClassVar[bool] = True  # the policy acts in [-1, 1] (Config.unit_actions)
    AUTOCAST: ClassVar[bool] = False  # MLPs: learner.precision and actor.precision stay fp32
    NUM_CRITICS: ClassVar[int] = 2
    STOCHASTIC: ClassVar[bool] = False  # a squashed-Gaussian policy (SAC), else deterministic

    gamma: float = 0.99  # discount per env step
    n_step: int = 1  # n of the n-step return (Ape-X DPG: 5)
    tau: float = 0.005  # Polyak rate of the target networks
    policy_lr: float = 3e-4  # Adam learning rate of the policy
    critic_lr: float = 3e-4  # Adam learning rate of the critics
    adam_eps: float = 1e-8  # Adam epsilon
    grad_clip_norm: float = 0.0  # global gradient-norm clip; 0 disables
    hidden_sizes: tuple[int, ...] = (256, 256)  # MLP widths of the policy and of each critic
    # Actors act uniformly at random until the learner's first update, so replay's first
    # replay.min_size_to_sample transitions are random (SB3's learning_starts, the papers'
    # start steps); false: the initial policy acts.
    random_start: bool = True
    importance_exponent: float = 0.4  # beta of the importance-sampling weights (prioritized)
    priority_eps: float = 1e-6  # added to |TD| for new priorities
    policy_delay: int = 1  # critic updates per policy (and target) update
    # Standardise observations with running statistics of the learner's batches (merged over
    # learner ranks), published with the weights
    normalize_obs: bool = False

    def validate(self) -> None:
        check_in_unit_interval("algo.gamma", self.gamma)
        check_in_unit_interval("algo.tau", self.tau)
        check_at_least_one("algo.n_step", self.n_step)
        check_at_least_one("algo.policy_delay", self.policy_delay)
        for name in ("policy_lr", "critic_lr", "adam_eps"):
            check_positive(f"algo.{name}", getattr(self, name))
        if not self.grad_clip_norm >= 0:
            raise ValueError(
                f"algo.grad_clip_norm must be >= 0 (0: off), got {self.grad_clip_norm}"
            )
        _check_widths(self.hidden_sizes)


@dataclass(frozen=True)
class SACConfig(QPolicyConfig):
    """Hyperparameters of SAC (Haarnoja et al. 2018, with the learned temperature of 2018b):
    twin critics, a tanh-squashed Gaussian policy, the temperature tuned toward the target
    entropy (-|A| by default)."""

    STOCHASTIC: ClassVar[bool] = True

    alpha_lr: float = 3e-4  # Adam learning rate of log(alpha)
    init_alpha: float = 1.0  # the temperature at the start
    learn_alpha: bool = True  # tune alpha toward target_entropy; false: alpha stays init_alpha
    target_entropy: float | None = None  # null: -|A|, minus the action's dimension

    def validate(self) -> None:
        super().validate()
        for name in ("alpha_lr", "init_alpha"):
            check_positive(f"algo.{name}", getattr(self, name))
        if self.target_entropy is not None and not math.isfinite(self.target_entropy):
            raise ValueError(
                f"algo.target_entropy must be finite or null, got {self.target_entropy}"
            )


@dataclass(frozen=True)
class TD3Config(QPolicyConfig):
    """Hyperparameters of TD3 (Fujimoto et al. 2018): twin critics, target policy smoothing with
    clipped noise, the policy and targets updated every ``policy_delay`` critic updates, Gaussian
    exploration noise on the actors (log-spread over them by ``noise_spread``, Ape-X style)."""

    policy_delay: int = 2  # critic updates per policy (and target) update
    target_noise: float = 0.2  # sigma of the target policy's smoothing noise (0: none)
    target_noise_clip: float = 0.5  # c, the smoothing noise's clip
    exploration_noise: float = 0.1  # sigma of the actors' Gaussian noise, in [-1, 1] units
    noise_spread: float = 1.0  # actors' sigmas log-spaced from sigma / spread to sigma * spread

    def validate(self) -> None:
        super().validate()
        for name in ("target_noise", "target_noise_clip", "exploration_noise"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"algo.{name} must be >= 0, got {getattr(self, name)}")
        if not self.noise_spread >= 1:
            raise ValueError(f"algo.noise_spread must be >= 1, got {self.noise_spread}")


@dataclass(frozen=True)
class DDPGConfig(TD3Config):
    """Hyperparameters of DDPG (Lillicrap et al. 2016) as TD3's authors re-ran it ("our DDPG":
    256x256 networks, lr 3e-4, tau 0.005): one critic, no target smoothing, the policy updated
    with every critic update; with n_step > 1 and many actors it is Ape-X DPG (Horgan et al.
    2018)."""

    NUM_CRITICS: ClassVar[int] = 1

    policy_delay: int = 1
    target_noise: float = 0.0


@dataclass(frozen=True)
class BCConfig(NStepItems):
    """Behaviour cloning: the policy regressed on a dataset's actions (cross-entropy for a
    Discrete action, squared error in [-1, 1] for a Box one), from one-step transitions served
    by replay (``run.input_dataset``); only ``obs`` and ``action`` of each item are read."""

    ACTION_SPACES: ClassVar[tuple[str, ...]] = ("Discrete", "Box")
    SYNCHRONOUS: ClassVar[bool] = False
    ACTION_FIELDS: ClassVar[tuple[str, ...]] = ("action",)
    UNIT_ACTIONS: ClassVar[bool] = True  # Box actions in [-1, 1] (Config.unit_actions)
    AUTOCAST: ClassVar[bool] = False  # an MLP: fp32
    n_step: ClassVar[int] = 1  # one-step transitions

    lr: float = 1e-3  # Adam learning rate
    adam_eps: float = 1e-8  # Adam epsilon
    grad_clip_norm: float = 0.0  # global gradient-norm clip; 0 disables
    hidden_sizes: tuple[int, ...] = (64, 64)  # MLP widths of the policy

    def validate(self) -> None:
        check_positive("algo.lr", self.lr)
        check_positive("algo.adam_eps", self.adam_eps)
        if not self.grad_clip_norm >= 0:
            raise ValueError(
                f"algo.grad_clip_norm must be >= 0 (0: off), got {self.grad_clip_norm}"
            )
        _check_widths(self.hidden_sizes)


# The config's ``algorithm:`` -> its hyperparameters (``apexrl.algos.ALGORITHMS`` -> its code).
ALGORITHM_CONFIGS: dict[str, type] = {
    "apex_dqn": ApexDQNConfig,
    "r2d2": R2D2Config,
    "impala": ImpalaConfig,
    "ppo": PPOConfig,
    "sac": SACConfig,
    "td3": TD3Config,
    "ddpg": DDPGConfig,
    "bc": BCConfig,
}

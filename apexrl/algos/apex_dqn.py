"""Ape-X DQN (Horgan et al. 2018): double Q-learning with a dueling head, n-step targets and
prioritized replay whose initial priorities come from the actors.

``ApexDQNConfig`` holds the algorithm's hyperparameters; ``loss`` turns a sampled batch into an
importance-weighted Huber loss and new priorities using only ``targets.*``; ``QLearner`` (the
learner core) owns the online and target networks and the optimizer and performs one update;
``ApexActorCore`` acts epsilon-greedily (Ape-X's fixed per-actor epsilon) and cuts a block of
steps into n-step transitions with initial priorities from the actor's own network.

A replay item is one n-step transition (``algos.transitions``: obs, an int64 action, the
window's discounted reward, its length m, terminated, truncated, next_obs). With
``algo.action_mask`` (turn-based games) it also holds the legal actions at next_obs, and acting,
the actor's initial priorities and the learner's double-Q bootstrap keep to legal actions.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from apexrl.acting.step_block import StepBlock
from apexrl.algos import SampledBatch, UpdateResult
from apexrl.algos.actor_critic import PendingMoments, clip_and_step
from apexrl.algos.transitions import cut_transitions
from apexrl.config import Config
from apexrl.config.algos import ApexDQNConfig
from apexrl.envs import VectorStep
from apexrl.envs.nested import PackedBox
from apexrl.learning.optim import Adam
from apexrl.math import distributional, targets
from apexrl.models import MLPQNetwork, NormalizedObsNetwork, ObsNormalizer, build_q_network
from apexrl.models.noisy import has_noise, set_noise
from apexrl.models.packed import PackedTorso, TorsoQNetwork
from apexrl.models.torsos import pixel_scale


class LossOutput(NamedTuple):
    loss: torch.Tensor  # scalar, differentiable
    priorities: torch.Tensor  # [B] float64, new priorities for the sampled keys
    q_mean: torch.Tensor  # scalar, mean Q(s, a) of the batch
    td_abs_mean: torch.Tensor  # scalar


def loss(
    online: nn.Module,
    target: nn.Module,
    batch: dict[str, torch.Tensor],
    weights: torch.Tensor,
    cfg: ApexDQNConfig,
) -> LossOutput:
    """Importance-weighted Huber loss of double-Q n-step targets.

    Args:
        online, target: Q-networks mapping ``[B, *obs]`` to ``QOutput(q=[B, A])``.
        batch: the item fields (see the module docstring), as tensors on the learner's device.
        weights: ``[B]`` importance-sampling weights (``targets.importance_weights``).
    """
    q_t = online(batch["obs"]).q  # [B, A]
    q_sa = q_t.gather(1, batch["action"].long().unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        legal = batch["next_action_mask"].bool() if cfg.action_mask else None
        bootstrap = targets.double_q_bootstrap(
            target(batch["next_obs"]).q, online(batch["next_obs"]).q, legal
        )
        y = targets.n_step_target(
            batch["reward"], batch["num_steps"], batch["terminated"], bootstrap, cfg.gamma
        )
    td = y - q_sa
    per_item = F.huber_loss(q_sa, y, reduction="none", delta=cfg.huber_delta)
    return LossOutput(
        loss=(weights * per_item).mean(),
        priorities=targets.td_priorities(td, cfg.priority_eps),
        q_mean=q_sa.detach().mean(),
        td_abs_mean=td.detach().abs().mean(),
    )


def distributional_loss(
    online: nn.Module,
    target: nn.Module,
    batch: dict[str, torch.Tensor],
    weights: torch.Tensor,
    cfg: ApexDQNConfig,
) -> LossOutput:
    """C51's importance-weighted cross-entropy of the projected n-step double-Q target
    distribution (``math.distributional``; Rainbow's loss), which is also each item's new
    priority.

    The online network picks the bootstrap action by its distributions' means (among the legal
    actions with ``algo.action_mask``), the target network gives that action's distribution,
    which is shifted by the window's reward and ``gamma^m`` (0 after a terminal state; a
    truncated window bootstraps) and projected back onto the support.

    Args: as ``loss``; the networks also return ``QOutput.logits`` ``[B, A, N]``.
    """
    out = online(batch["obs"])
    rows = torch.arange(len(weights), device=weights.device)
    action = batch["action"].long()
    atoms = online.atoms
    with torch.no_grad():
        legal = batch["next_action_mask"].bool() if cfg.action_mask else None
        projected = distributional.double_q_target(
            online(batch["next_obs"]).q,
            target(batch["next_obs"]).logits,
            batch["reward"],
            distributional.n_step_discount(batch["num_steps"], batch["terminated"], cfg.gamma),
            atoms,
            legal,
        )
    logits_sa = out.logits[rows, action]  # [B, N]
    per_item = distributional.cross_entropy(projected, logits_sa)
    q_sa = out.q[rows, action]
    td = (projected * atoms).sum(-1) - q_sa.detach()
    new_priorities = distributional.item_priority(cfg.distributional_priority, per_item, projected)
    return LossOutput(
        loss=(weights * per_item).mean(),
        priorities=targets.td_priorities(new_priorities, cfg.priority_eps),
        q_mean=q_sa.detach().mean(),
        td_abs_mean=td.abs().mean(),
    )


def loss_of(cfg: ApexDQNConfig) -> Callable[..., LossOutput]:
    """The learner's loss: C51's with ``algo.num_atoms`` > 1, else the Huber loss."""
    return distributional_loss if cfg.num_atoms > 1 else loss


def atoms_of(cfg: ApexDQNConfig) -> torch.Tensor | None:
    """C51's support for ``algo.num_atoms`` > 1; None for a scalar head."""
    if cfg.num_atoms == 1:
        return None
    return distributional.support(cfg.num_atoms, cfg.v_min, cfg.v_max)


class QLearner:
    """Online and target Q-networks plus Adam (Ape-X, R2D2): one importance-weighted gradient step
    of ``loss_fn`` per batch, and the target network synced every ``target_update_period``."""

    def __init__(
        self,
        online: nn.Module,
        target: nn.Module,
        cfg: ApexDQNConfig,
        device: torch.device | str,
        loss_fn: Callable[..., LossOutput],
    ) -> None:
        self.cfg, self.loss_fn = cfg, loss_fn
        self.device = torch.device(device)
        self.online = online.to(self.device)
        self.target = target.to(self.device)
        self.target.load_state_dict(self.online.state_dict())
        self.target.requires_grad_(False)
        # apexrl's Adam, not torch.optim's: the same update without importing torch's compiler
        # (seconds before the first update).
        self.optimizer = Adam(self.online.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
        self.num_updates = 0
        self.has_work = False  # one gradient per batch
        self.wants_batch = True
        self.moments = PendingMoments(self.online, also=(self.target,))  # algo.normalize_obs

    @property
    def network(self) -> nn.Module:
        """The weights actors play with."""
        return self.online

    def update(self, batch: SampledBatch) -> UpdateResult:
        """One gradient step on one batch (a single learner)."""
        result = self.compute_gradients(batch)
        result.metrics["learner/grad_norm"] = self.apply_gradients()
        return result

    def compute_gradients(self, batch: SampledBatch | None) -> UpdateResult | None:
        """Fill the online network's ``.grad`` with this batch's gradient; new priorities."""
        if batch is None:
            return None
        weights = targets.importance_weights(
            batch.probabilities, batch.table_size, self.cfg.importance_exponent
        ).to(self.device)
        self.moments.add(batch.fields["obs"], batch.fields.get("mask"))  # R2D2's: real steps
        out = self.loss_fn(self.online, self.target, batch.fields, weights, self.cfg)
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        return UpdateResult(
            priorities=out.priorities.cpu().numpy(),
            metrics={
                "learner/loss": float(out.loss.detach()),
                "learner/q_mean": float(out.q_mean),
                "learner/td_abs_mean": float(out.td_abs_mean),
            },
        )

    def agree(self, total: Callable[[list[float]], list[float]]) -> None:
        """Merge the last batch's observation moments, summed over the ranks, into the online
        and target networks' statistics (``algo.normalize_obs``). Nothing else to decide with
        other ranks: one gradient per batch."""
        self.moments.merge(total)

    def apply_gradients(self) -> float:
        """Clip and apply the gradient in ``.grad`` (averaged over learners when there are
        several), count the update and sync the target network on schedule; the gradient norm."""
        grad_norm = clip_and_step(self.online, self.optimizer, self.cfg.grad_clip_norm)
        self.num_updates += 1
        if self.num_updates % self.cfg.target_update_period == 0:
            self.target.load_state_dict(self.online.state_dict())
        return grad_norm

    def state_dict(self) -> dict[str, object]:
        return {
            "online": self.online.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "num_updates": self.num_updates,
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.num_updates = int(state["num_updates"])


def apex_dqn_learner(
    obs_shape: tuple[int, ...],
    num_actions: int,
    cfg: ApexDQNConfig,
    device: torch.device | str,
    scale: float = 1.0 / 255.0,
) -> QLearner:
    """Ape-X's learner: two Q-networks of ``build_q_network`` and the n-step ``loss``
    (``scale``: what an image torso multiplies pixel values by)."""
    online, target = (
        build_q_network(
            obs_shape,
            num_actions,
            cfg.hidden_sizes,
            cfg.dueling,
            cfg.torso,
            scale,
            atoms_of(cfg),
            cfg.noisy,
        )
        for _ in range(2)
    )
    return QLearner(online, target, cfg, device, loss_of(cfg))


# --- the actor side ------------------------------------------------------------------------------


def build_transitions(
    block: StepBlock,
    net: nn.Module,
    gamma: float,
    n: int,
    device: str,
    q_values: Callable[[np.ndarray], np.ndarray] | None = None,
    action_mask: bool = False,
    distributional_priority: str = "cross_entropy",
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Cut the block's n-step transitions (``algos.transitions``) and their initial
    priorities, |n-step target - Q(s, a)| from the actor's own network (Ape-X).

    ``block.extras["q_taken"]`` ``[T, B]`` is Q(s_t, a_t) when the actor acted.
    ``q_values`` (``[N, *obs]`` -> ``[N, A]``, numpy) computes ``net``'s Q-values faster where the
    actor core has such a function (``actor_q_values``); by default ``net`` is called.
    ``action_mask``: the block has ``next_action_mask`` extras; the transitions keep them and the
    targets bootstrap from legal actions only. ``distributional_priority``: a distributional
    network's priority measure (``algo.distributional_priority``).
    """
    fields = cut_transitions(block, gamma, n, action_mask)
    if net.num_atoms > 1:
        priorities = distributional_priorities(
            net, fields, gamma, device, action_mask, distributional_priority
        )
        return fields, priorities
    flat = len(fields["num_steps"])
    q_taken = block.extras["q_taken"][: flat // block.obs.shape[1]].reshape(flat)
    with torch.inference_mode():
        if q_values is not None:
            q_next = torch.from_numpy(q_values(fields["next_obs"]))
        else:
            q_next = net(torch.as_tensor(fields["next_obs"], device=device)).q.cpu()
        legal = torch.from_numpy(fields["next_action_mask"]) if action_mask else None
        target = targets.n_step_target(
            torch.from_numpy(fields["reward"]),
            torch.from_numpy(fields["num_steps"]),
            torch.from_numpy(fields["terminated"]),
            targets.double_q_bootstrap(q_next, q_next, legal),
            gamma,
        )
        td = target - torch.from_numpy(q_taken)
    return fields, targets.td_priorities(td).numpy()


def distributional_priorities(
    net: nn.Module,
    fields: dict[str, np.ndarray],
    gamma: float,
    device: str,
    action_mask: bool,
    measure: str = "cross_entropy",
) -> np.ndarray:
    """Initial priorities of a distributional network's transitions: the cross-entropy (or the
    KL divergence, ``measure``) of the projected n-step target distribution (the actor's own
    network as both online and target) and the distribution of the action taken, as the
    learner's new priorities are."""
    with torch.inference_mode():
        logits = net(torch.as_tensor(fields["obs"], device=device)).logits.cpu()
        after = net(torch.as_tensor(fields["next_obs"], device=device))
        legal = torch.from_numpy(fields["next_action_mask"]).bool() if action_mask else None
        projected = distributional.double_q_target(
            after.q.cpu(),
            after.logits.cpu(),
            torch.from_numpy(fields["reward"]),
            distributional.n_step_discount(
                torch.from_numpy(fields["num_steps"]), torch.from_numpy(fields["terminated"]), gamma
            ),
            net.atoms.cpu(),
            legal,
        )
        rows = torch.arange(len(logits))
        taken = logits[rows, torch.from_numpy(fields["action"]).long()]
        per_item = distributional.cross_entropy(projected, taken)
        return targets.td_priorities(
            distributional.item_priority(measure, per_item, projected)
        ).numpy()


class _QValues(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).q


def trace_q_values(net: nn.Module, obs: torch.Tensor) -> torch.jit.ScriptModule:
    """``obs -> net(obs).q`` traced with TorchScript for the actor's fixed batch shape.

    At actor batch sizes a forward pass is mostly per-module Python overhead, which the trace
    removes (about a third of the call at 16 CartPole envs). The trace shares ``net``'s parameter
    tensors, so weights loaded into ``net`` later are used without tracing again.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # the shape check turns constant
        with torch.inference_mode():
            return torch.jit.trace(_QValues(net), obs, check_trace=False)


class MLPQValues:
    """``obs -> Q`` of an ``MLPQNetwork`` on the CPU, numpy in and out: one ``addmm`` per Linear
    layer, each writing into a buffer allocated once per batch size.

    At actor batch sizes (one row per env, or one block of transitions) a forward pass costs
    mostly its calls, not its arithmetic; this does the same operations as
    ``MLPQNetwork.forward`` in the same order with a quarter less time than the TorchScript trace.
    It reads ``net``'s parameter tensors (detached views), so weights loaded into ``net`` later,
    in place (``models.arrays_to_params``), are used at once.
    """

    def __init__(self, net: MLPQNetwork) -> None:
        self.torso = [
            (layer.weight.detach().t(), layer.bias.detach())
            for layer in net.torso
            if isinstance(layer, nn.Linear)
        ]
        self.dueling, self.num_actions = net.dueling, net.num_actions
        heads = (net.value_head, net.advantage_head) if net.dueling else (net.q_head,)
        self.heads = [(head.weight.detach().t(), head.bias.detach()) for head in heads]
        self._buffers: dict[int, list[torch.Tensor]] = {}

    @staticmethod
    def supports(net: nn.Module) -> bool:
        """Whether ``net`` is an ``MLPQNetwork`` with a scalar head whose torso is Linear + ReLU
        pairs."""
        if type(net) is not MLPQNetwork or net.num_atoms != 1 or has_noise(net):
            return False
        kinds = [type(layer) for layer in net.torso]
        return kinds == [nn.Linear, nn.ReLU] * (len(kinds) // 2)

    def _buffers_for(self, batch_size: int) -> list[torch.Tensor]:
        buffers = self._buffers.get(batch_size)
        if buffers is None:
            widths = [w.shape[1] for w, _ in self.torso + self.heads]
            buffers = [torch.empty(batch_size, width) for width in widths]
            if self.dueling:
                buffers += [torch.empty(batch_size, 1), torch.empty(batch_size, self.num_actions)]
            self._buffers[batch_size] = buffers
        return buffers

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """``[B, obs_dim]`` -> ``[B, A]`` float32; the result is overwritten by the next call
        with the same ``B``. Always in inference mode, so that a buffer made by a call inside
        it (the priorities of a block) serves one outside it (acting) at the same ``B``."""
        with torch.inference_mode():
            return self._q_values(obs)

    def _q_values(self, obs: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(np.asarray(obs, dtype=np.float32))
        buffers = self._buffers_for(x.shape[0])
        for (weight_t, bias), out in zip(self.torso, buffers, strict=False):
            x = torch.addmm(bias, x, weight_t, out=out).relu_()
        depth = len(self.torso)
        if not self.dueling:
            weight_t, bias = self.heads[0]
            return torch.addmm(bias, x, weight_t, out=buffers[depth]).numpy()
        (value_w, value_b), (advantage_w, advantage_b) = self.heads
        value = torch.addmm(value_b, x, value_w, out=buffers[depth])
        advantage = torch.addmm(advantage_b, x, advantage_w, out=buffers[depth + 1])
        mean, q = buffers[depth + 2], buffers[depth + 3]
        torch.mean(advantage, dim=-1, keepdim=True, out=mean)
        return torch.add(value, advantage, out=q).sub_(mean).numpy()


class TracedQValues:
    """``obs -> Q`` of any Q-network, numpy in and out, with the network traced at the first
    call (``trace_q_values``) and evaluated under ``torch.inference_mode`` on its device."""

    def __init__(self, net: nn.Module, device: str) -> None:
        self.net, self.device = net, device
        self._traced: torch.jit.ScriptModule | None = None

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        obs_t = torch.as_tensor(obs, device=self.device)
        with torch.inference_mode():
            if self._traced is None:
                self._traced = trace_q_values(self.net, obs_t)
            return self._traced(obs_t).cpu().numpy()


class EagerQValues:
    """``obs -> Q`` of a Q-network TorchScript cannot trace (a ``PackedTorso`` reinterprets
    bytes as floats, which the tracer has no op for), numpy in and out."""

    def __init__(self, net: nn.Module, device: str) -> None:
        self.net, self.device = net, device

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.net(torch.as_tensor(obs, device=self.device)).q.cpu().numpy()


def actor_q_values(net: nn.Module, device: str) -> Callable[[np.ndarray], np.ndarray]:
    """The fastest ``obs -> Q`` (numpy) for acting with ``net``: ``MLPQValues`` for an MLP on the
    CPU, otherwise ``TracedQValues``."""
    if torch.device(device).type == "cpu" and MLPQValues.supports(net):
        return MLPQValues(net)
    if isinstance(net, TorsoQNetwork):
        return EagerQValues(net, device)
    return TracedQValues(net, device)


class ApexActorCore:
    """Epsilon-greedy on the Q-network, with Q of the action taken kept for the priorities; with
    a legal-action mask, among the legal actions only."""

    def __init__(
        self,
        network: nn.Module,
        cfg: Config,
        epsilon: float,
        device: str,
        rng: np.random.Generator,
        noise: bool = True,
    ) -> None:
        self.network, self.epsilon, self.device, self.rng = network, epsilon, device, rng
        # A noisy network's noise: on for a training actor, off for greedy evaluation; set before
        # each use, as two cores of a ``Policy`` share one network.
        self.noisy = has_noise(network)
        self.noise = noise and self.noisy
        self.gamma, self.n = cfg.algo.gamma, cfg.algo.n_step
        self.action_mask = cfg.algo.action_mask
        self.distributional_priority = cfg.algo.distributional_priority
        # n - 1 steps overlap: their n-step windows end in the next block.
        self.block_steps = cfg.actor.chunk_steps + self.n - 1
        self.block_overlap = self.n - 1
        self.synchronous = False
        self.q_values = actor_q_values(network, device)
        self._batch_index = np.arange(0)  # 0 .. B - 1, to pick Q of the actions taken

    def act(
        self, obs: np.ndarray, mask: np.ndarray | None = None, rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Epsilon-greedy actions for ``obs`` ``[B, *obs]``; ``mask`` bool ``[B, A]`` (True:
        legal) keeps both the greedy and the random choice to legal actions. ``rows`` (the
        lanes of ``obs``) changes nothing: the policy is feed-forward."""
        if self.noisy:
            set_noise(self.network, self.noise)
        q = self.q_values(obs)
        action = targets.epsilon_greedy(q, self.epsilon, self.rng, mask)
        if len(self._batch_index) != len(action):
            self._batch_index = np.arange(len(action))
        return action, {"q_taken": q[self._batch_index, action]}

    def logged_extras(self, obs: np.ndarray, action: np.ndarray) -> dict[str, np.ndarray]:
        """The extras of actions taken by someone else (an external env's ``log_action``)."""
        q = self.q_values(obs)
        return {"q_taken": q[np.arange(len(action)), action]}

    def observe(self, action: np.ndarray, step: VectorStep, rows: np.ndarray | None = None) -> None:
        """Nothing to keep between steps: the policy is feed-forward."""

    def items(
        self, block: StepBlock, rows: np.ndarray | None = None
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The block's n-step transitions (whichever lanes its columns are) and priorities."""
        return build_transitions(
            block,
            self.network,
            self.gamma,
            self.n,
            self.device,
            q_values=self.q_values,
            action_mask=self.action_mask,
            distributional_priority=self.distributional_priority,
        )


def _num_actions(action_space: gym.Space) -> int:
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"Ape-X DQN needs a Discrete action space, got {action_space}")
    return int(action_space.n)


def actor_epsilon(cfg: Config, actor_id: int, evaluate: bool) -> float:
    """The fixed exploration of an actor: Ape-X's per-actor epsilon, or the evaluation actor's."""
    if evaluate:
        return cfg.actor.eval_epsilon
    return targets.per_actor_epsilon(
        actor_id, cfg.actor.num_actors, cfg.actor.epsilon, cfg.actor.epsilon_alpha
    )


class ApexDQNAlgorithm:
    """Ape-X DQN behind the algorithm seam (``apexrl.algos.Algorithm``)."""

    def make_network(self, obs_space: gym.Space, action_space: gym.Space, cfg: Config) -> nn.Module:
        """The Q-network for these spaces; with ``algo.normalize_obs``, behind an observation
        normaliser whose statistics are part of its weights (flat observations only)."""
        net = self._q_network(obs_space, action_space, cfg)
        if not cfg.algo.normalize_obs:
            return net
        if isinstance(obs_space, PackedBox) or len(obs_space.shape) != 1:
            raise ValueError(
                f"algo.normalize_obs takes flat observations, not {obs_space} (images are "
                "scaled by their pixel range)"
            )
        return NormalizedObsNetwork(ObsNormalizer(obs_space.shape[0]), net)

    def _q_network(self, obs_space: gym.Space, action_space: gym.Space, cfg: Config) -> nn.Module:
        algo = cfg.algo
        if isinstance(obs_space, PackedBox):  # a Dict or Tuple observation: a torso per part
            torso = PackedTorso(obs_space.layout, algo.hidden_sizes, "relu", algo.torso)
            return TorsoQNetwork(
                obs_space.shape,
                torso,
                _num_actions(action_space),
                algo.dueling,
                atoms_of(algo),
                algo.noisy,
            )
        return build_q_network(
            obs_space.shape,
            _num_actions(action_space),
            algo.hidden_sizes,
            algo.dueling,
            algo.torso,
            pixel_scale(obs_space.high),
            atoms_of(algo),
            algo.noisy,
        )

    def actor_core(
        self,
        network: nn.Module,
        cfg: Config,
        actor_id: int,
        evaluate: bool,
        device: str,
        rng: np.random.Generator,
    ) -> ApexActorCore:
        epsilon = actor_epsilon(cfg, actor_id, evaluate)
        return ApexActorCore(network, cfg, epsilon, device, rng, noise=not evaluate)

    def learner_core(
        self, obs_space: gym.Space, action_space: gym.Space, cfg: Config, device: torch.device
    ) -> QLearner:
        online, target = (self.make_network(obs_space, action_space, cfg) for _ in range(2))
        return QLearner(online, target, cfg.algo, device, loss_of(cfg.algo))


ALGORITHM = ApexDQNAlgorithm()

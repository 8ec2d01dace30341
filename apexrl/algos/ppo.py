"""Synchronous PPO (Schulman et al. 2017) with GAE (Schulman et al. 2016): the learner publishes
weights version k, every actor collects its share of rollout k with version k and no other (one
unroll per env, ``algos.actor_critic``) and waits; the learner trains on rollout k and publishes
k + 1.

On the learner, ``compute_gradients`` is asked on every turn of the learner loop:

1. it keeps the unrolls that arrive whose every step was chosen by version k, and drops (and
   counts, ``learner/stale_items_dropped``) any other: data of another version is never trained
   on;
2. once the rollout is complete (``actor.num_actors * env.num_envs`` unrolls, summed over the
   learner ranks in ``agree``, so that every rank starts the same steps at the same turn), or
   ``algo.rollout_timeout_s`` after version k was published with some unrolls in (a slow or dead
   actor does not stall the run; logged and counted in ``learner/incomplete_rollouts``), it
   computes GAE advantages and value targets with version k's values (``targets.gae``);
3. it then gives one minibatch gradient per turn, ``algo.epochs`` passes of
   ``algo.num_minibatches`` shuffled minibatches, with the clipped objective
   (``targets.ppo_clip_loss``) and the value loss (``targets.clipped_value_loss``);
4. after the last one, the observation statistics take in the rollout (``algo.normalize_obs``:
   a running mean and variance that are buffers of the network, so they are published with the
   weights), ``num_updates`` (the weights version) becomes k + 1 and the learner loop publishes
   it.

With ``algo.action_mask`` (turn-based games) each step's legal actions travel with the rollout
into the minibatches, and pi is the softmax over them (``actor_critic.masked_policy``), as the
actor's was, so the ratio and the entropy keep to them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from apexrl.algos import SampledBatch, UpdateResult
from apexrl.algos.actor_critic import (
    START_FIELDS,
    PolicyActorCore,
    clip_and_step,
    load_trainer_state,
    log_prob_and_entropy,
    make_policy_network,
    masked_policy,
    time_major,
    trainer_state,
)
from apexrl.algos.recurrent_unrolls import (
    actor_core_for,
    outputs_and_next_values,
    policy_outputs,
)
from apexrl.config import Config
from apexrl.config.algos import PPOConfig
from apexrl.learning.optim import Adam
from apexrl.math import targets
from apexrl.math.schedules import linear_remaining
from apexrl.models import RecurrentActorCritic

log = logging.getLogger(__name__)


def _alone(values: list[float]) -> list[float]:
    """The sum over the ranks of a single learner."""
    return values


def moments(obs: Tensor | None, dim: int) -> tuple[float, list[float], list[float]]:
    """Count, sum and sum of squares of observations ``[N, dim]`` (zeros for None)."""
    if obs is None:
        return 0.0, [0.0] * dim, [0.0] * dim
    x = obs.reshape(-1, dim).double()
    return float(x.shape[0]), x.sum(dim=0).tolist(), x.pow(2).sum(dim=0).tolist()


class PPOLearner:
    """The policy-and-value network and Adam; rollouts of one weights version, trained in epochs
    of minibatches."""

    def __init__(
        self,
        network: nn.Module,
        cfg: PPOConfig,
        rollout_items: int,
        device: torch.device,
        num_rollouts: float = 0.0,
    ) -> None:
        """``num_rollouts``: the run's length in rollouts, over which ``algo.anneal_lr`` and
        ``algo.anneal_clip`` anneal (0: the run has none; then neither may be set)."""
        self.cfg, self.device, self.rollout_items = cfg, device, rollout_items
        if (cfg.anneal_lr or cfg.anneal_clip) and num_rollouts <= 0:
            raise ValueError("annealing needs the run's length in rollouts")
        self.num_rollouts = num_rollouts
        self.clip = cfg.clip  # this rollout's clip range
        self.network = network.to(device)
        self.recurrent = isinstance(network, RecurrentActorCritic)
        # apexrl's Adam: torch.optim's would import torch's compiler (seconds) at start-up
        self.optimizer = Adam(self.network.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
        self.num_updates = 0  # the weights version: rollouts trained on
        self.pending: list[dict[str, Tensor]] = []  # unrolls of version num_updates, [n, T, ...]
        self.num_pending = 0
        self.version_since = time.monotonic()  # when the current version was made
        self.minibatches: list[Tensor] = []  # this rank's indices into ``rollout``, per step
        self.steps_left = 0  # gradient steps of the rollout in training (0: collecting)
        self.rollout: dict[str, Tensor] = {}  # the rollout in training, flat [T * N, ...]
        self.total = _alone  # sums values over the learner ranks (set by ``agree``)
        self.stale_items_dropped = 0
        self.incomplete_rollouts = 0
        self.wants_batch = True  # what arrives of another version is dropped, counted

    @property
    def has_work(self) -> bool:
        """Steps left, or a complete rollout: the learner loop need not wait for data."""
        return self.steps_left > 0 or self.num_pending >= self.rollout_items

    def agree(self, total: Callable[[list[float]], list[float]]) -> None:
        """While collecting, decide with the other ranks (if any) whether rollout k is complete:
        every rank then starts the same ``epochs * num_minibatches`` steps at the same turn."""
        self.total = total
        if self.steps_left > 0:
            return
        waited_s = time.monotonic() - self.version_since
        timed_out = float(waited_s > self.cfg.rollout_timeout_s)
        num_items, num_timed_out = total([float(self.num_pending), timed_out])
        if num_items >= self.rollout_items or (num_timed_out > 0 and num_items > 0):
            if num_items < self.rollout_items:
                self.incomplete_rollouts += 1
                log.warning(
                    "rollout %d: training on %d of %d unrolls after %.0f s "
                    "(algo.rollout_timeout_s)",
                    self.num_updates,
                    num_items,
                    self.rollout_items,
                    waited_s,
                )
            self._prepare_rollout()

    def compute_gradients(self, batch: SampledBatch | None) -> UpdateResult | None:
        if batch is not None:
            self._collect(batch.fields)
        if self.steps_left == 0:
            return None
        indices = self.minibatches.pop(0) if self.minibatches else None
        if indices is None or len(indices) == 0:
            return None  # this rank holds no data of the rollout: the others' gradient applies
        return self._minibatch_gradient(indices)

    def _collect(self, fields: dict[str, Tensor]) -> None:
        version = fields["weights_version"]
        current = (version == self.num_updates).all(dim=1)
        self.stale_items_dropped += int((~current).sum())
        if current.any():
            self.pending.append({name: value[current] for name, value in fields.items()})
            self.num_pending += int(current.sum())

    def _prepare_rollout(self) -> None:
        """GAE with the current (= acting) version's values; the epochs' shuffled minibatches
        of this rank's unrolls (none, if it holds none)."""
        cfg = self.cfg
        self.steps_left = cfg.epochs * cfg.num_minibatches
        self._anneal()
        if not self.pending:
            self.rollout, self.minibatches = {}, []
            return
        unrolls = {name: torch.cat([p[name] for p in self.pending]) for name in self.pending[0]}
        self.pending, self.num_pending = [], 0
        f = time_major(unrolls)  # [T, N, ...]
        with torch.no_grad():
            out, v_t = outputs_and_next_values(self.network, f)
            v_tm1 = out.value
            terminated = f["terminated"].bool()
            advantage = targets.gae(
                f["reward"].float(),
                v_tm1,
                v_t,
                cfg.gamma * (~terminated).float(),
                terminated | f["truncated"].bool(),
                cfg.gae_lambda,
            )
        steps = {
            "obs": f["obs"],
            "action": f["action"],
            "behaviour_logp": f["behaviour_logp"],
            "advantage": advantage,
            "value_target": advantage + v_tm1,
            "value_old": v_tm1,
        }
        if cfg.action_mask:
            steps["action_mask"] = f["action_mask"]
        if self.recurrent:  # minibatches of whole unrolls, [T, n, ...], from their states
            memory = ("reward", "terminated", "truncated", *START_FIELDS)
            self.rollout = {**steps, **{name: f[name] for name in memory}}
            count = advantage.shape[1]
        else:
            self.rollout = {name: v.reshape(-1, *v.shape[2:]) for name, v in steps.items()}
            count = advantage.numel()
        self.minibatches = [
            indices
            for _ in range(cfg.epochs)
            for indices in torch.randperm(count, device=self.device).tensor_split(
                cfg.num_minibatches
            )
        ]

    def _anneal(self) -> None:
        """This rollout's learning rate and clip range: the config's, times the fraction of
        the run left before it where annealed."""
        cfg = self.cfg
        left = 1.0
        if self.num_rollouts > 0:
            left = linear_remaining(self.num_updates, self.num_rollouts)
        self.optimizer.lr = cfg.lr * (left if cfg.anneal_lr else 1.0)
        self.clip = cfg.clip * (left if cfg.anneal_clip else 1.0)

    def _minibatch_gradient(self, indices: Tensor) -> UpdateResult:
        cfg = self.cfg
        if self.recurrent:
            mb = {
                name: value[indices] if name in START_FIELDS else value[:, indices]
                for name, value in self.rollout.items()
            }
        else:
            mb = {name: value[indices] for name, value in self.rollout.items()}
        out = policy_outputs(self.network, mb)
        if cfg.action_mask:
            out = masked_policy(out, mb["action_mask"].bool())
        logp, entropy = log_prob_and_entropy(out, mb["action"], cfg.squash_actions)
        advantage = mb["advantage"]
        if cfg.normalize_advantages and len(advantage) > 1:
            advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
        pg_loss = targets.ppo_clip_loss(logp, mb["behaviour_logp"], advantage, self.clip)
        value_loss = targets.clipped_value_loss(
            out.value, mb["value_old"], mb["value_target"], cfg.value_clip
        )
        entropy_mean = entropy.mean()
        loss = pg_loss + cfg.value_cost * value_loss - cfg.entropy_cost * entropy_mean
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            log_ratio = logp - mb["behaviour_logp"]
            clipped = ((log_ratio.exp() - 1.0).abs() > self.clip).float().mean()
        return UpdateResult(
            priorities=None,
            metrics={
                "learner/loss": float(loss.detach()),
                "learner/pg_loss": float(pg_loss.detach()),
                "learner/value_loss": float(value_loss.detach()),
                "learner/entropy": float(entropy_mean.detach()),
                "learner/approx_kl": float((-log_ratio).mean()),
                "learner/clip_fraction": float(clipped),
                "learner/lr": self.optimizer.lr,
                "learner/clip_range": self.clip,
                "learner/policy_lag": 0.0,  # only the current version is trained on
                "learner/stale_items_dropped": float(self.stale_items_dropped),
                "learner/incomplete_rollouts": float(self.incomplete_rollouts),
            },
        )

    def apply_gradients(self) -> float:
        grad_norm = clip_and_step(self.network, self.optimizer, self.cfg.grad_clip_norm)
        self.steps_left -= 1
        if self.steps_left == 0:  # the rollout's last step: the next weights version
            normalizer = getattr(self.network, "normalizer", None)
            if normalizer is not None:
                # After training, so that the rollout's behaviour log-probabilities and its
                # values were all computed with the statistics it was collected with; from
                # the moments of every rank's unrolls, so that every rank keeps the same.
                obs = self.rollout.get("obs")
                count, total, total_sq = moments(obs, normalizer.mean.shape[0])
                summed = self.total([count, *total, *total_sq])
                dim = len(total)
                normalizer.merge(summed[0], summed[1 : 1 + dim], summed[1 + dim :])
            self.num_updates += 1
            self.rollout = {}
            self.version_since = time.monotonic()
        return grad_norm

    def state_dict(self) -> dict[str, object]:
        return trainer_state(self.network, self.optimizer, self.num_updates)

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.num_updates = load_trainer_state(state, self.network, self.optimizer)
        self.version_since = time.monotonic()


class PPOAlgorithm:
    """Synchronous PPO behind the algorithm seam (``apexrl.algos.Algorithm``)."""

    def make_network(self, obs_space: gym.Space, action_space: gym.Space, cfg: Config) -> nn.Module:
        a = cfg.algo
        return make_policy_network(
            obs_space,
            action_space,
            a.hidden_sizes,
            a.activation,
            a.init_log_std,
            a.normalize_obs,
            torso=a.torso,
            lstm_size=a.lstm_size,
            prev_action_reward=a.prev_action_reward,
            shared_lstm=a.shared_lstm,
            policy_obs_dim=a.policy_obs_dim,
            mirror_board=a.mirror_board,
        )

    def actor_core(
        self,
        network: nn.Module,
        cfg: Config,
        actor_id: int,
        evaluate: bool,
        device: str,
        rng: np.random.Generator,
    ) -> PolicyActorCore:
        seed = int(rng.integers(2**62))
        a = cfg.algo
        return actor_core_for(network)(
            network,
            a.unroll_length,
            evaluate,
            device,
            seed,
            synchronous=True,
            squash=a.squash_actions,
            action_mask=a.action_mask,
        )

    def learner_core(
        self, obs_space: gym.Space, action_space: gym.Space, cfg: Config, device: torch.device
    ) -> PPOLearner:
        network = self.make_network(obs_space, action_space, cfg)
        rollout_items = cfg.actor.num_actors * cfg.env.num_envs
        # The annealing's env steps in rollouts of the actors' unrolls
        horizon = cfg.algo.anneal_env_steps or cfg.run.stop_env_steps
        num_rollouts = horizon / (rollout_items * cfg.algo.unroll_length)
        return PPOLearner(network, cfg.algo, rollout_items, device, num_rollouts)


ALGORITHM = PPOAlgorithm()

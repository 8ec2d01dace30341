"""IMPALA (Espeholt et al. 2018): an actor-critic trained off-policy from actors' unrolls, with
V-trace correcting for the lag between the acting and the learning policy.

Actors sample from their copy of the policy and send one unroll of ``T`` steps per env with the
behaviour log-probabilities (``algos.actor_critic``); replay serves them from a FIFO queue, each
unroll once by default (``replay.max_times_sampled``). The learner computes V-trace targets
(``targets.vtrace``) and minimises::

    loss = -mean(pg_advantage * log pi(a_t | s_t))            policy gradient
           + baseline_cost * 0.5 * mean((v_s - V(s_t))^2)      value
           - entropy_cost * mean(H(pi(. | s_t)))               entropy bonus

``learner/policy_lag`` is the learner's version minus the mean weights version that acted.

APPO (asynchronous PPO over V-trace, as RLlib's APPO and Sample Factory train it) is two options:

- ``algo.clip_ratio`` > 0 replaces the policy-gradient term with PPO's clipped surrogate on
  V-trace's advantage, the ratio taken against the behaviour policy that acted
  (``targets.ppo_clip_loss``)::

      ratio_t = pi(a_t | s_t) / mu(a_t | s_t)
      A_t     = pg_advantage_t = min(clip_pg_rho, ratio_t) * (r_t + gamma_t v_{t+1} - V(s_t))
      pg_loss = -mean(min(ratio_t * A_t, clip(ratio_t, 1 - clip_ratio, 1 + clip_ratio) * A_t))

- ``algo.passes`` > 1 takes that many gradient steps on each batch, one per turn of the learner
  loop (``has_work`` tells it not to wait for data meanwhile). Every pass recomputes V-trace's
  targets and advantages with the current network, as RLlib's APPO does (its V-trace is part of
  the loss; RLlib also keeps a target network for V-trace's importance weights, which apexrl
  does not). The core holds one batch besides the one in training (``wants_batch``): the next
  ones stay in replay, whose rate limiter then holds the actors back, so no unroll is dropped
  and the replay ratio is ``passes`` x ``replay.samples_per_insert``. ``num_updates`` counts
  every pass.

With ``clip_ratio = 0`` and ``passes = 1`` (the defaults) this is IMPALA exactly.

With ``algo.action_mask`` (turn-based games) pi is the softmax over each step's legal actions
(``actor_critic.masked_policy``), as the actor's mu was, so pi/mu and the entropy keep to them.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from apexrl.algos import SampledBatch, UpdateResult
from apexrl.algos.actor_critic import (
    PendingMoments,
    PolicyActorCore,
    clip_and_step,
    load_trainer_state,
    log_prob_and_entropy,
    make_policy_network,
    masked_policy,
    time_major,
    trainer_state,
)
from apexrl.algos.recurrent_unrolls import actor_core_for, outputs_and_next_values
from apexrl.config import Config
from apexrl.config.algos import ImpalaConfig
from apexrl.learning.optim import Adam
from apexrl.math import targets


class ImpalaLearner:
    """The policy-and-value network and Adam; V-trace actor-critic updates, ``algo.passes``
    per batch."""

    def __init__(self, network: nn.Module, cfg: ImpalaConfig, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        self.network = network.to(device)
        # apexrl's Adam: torch.optim's would import torch's compiler (seconds) at start-up
        self.optimizer = Adam(self.network.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
        self.num_updates = 0
        self.fields: dict[str, Tensor] = {}  # the batch in training, [T, N, ...]
        self.passes_left = 0  # gradient steps still to take on ``fields``
        self.waiting: dict[str, Tensor] | None = None  # a batch that arrived during them
        self.moments = PendingMoments(self.network)  # algo.normalize_obs

    @property
    def has_work(self) -> bool:
        """Passes left, or a batch waiting: the learner loop need not wait for data."""
        return self.passes_left > 0 or self.waiting is not None

    @property
    def wants_batch(self) -> bool:
        """One batch may wait while another trains; later ones stay in replay."""
        return self.waiting is None

    def compute_gradients(self, batch: SampledBatch | None) -> UpdateResult | None:
        """The next pass's gradient on the batch in training; once its ``algo.passes`` are
        done, the waiting batch or else the one that arrived starts. None without a batch."""
        if self.passes_left == 0 and self.waiting is not None:
            self._start(self.waiting)
        if batch is not None:
            if self.passes_left == 0:
                self._start(batch.fields)
            elif self.waiting is None:
                self.waiting = batch.fields
            else:  # the learner loop asks for no batch while one waits (``wants_batch``)
                raise RuntimeError("a batch arrived while another was waiting")
        if self.passes_left == 0:
            return None
        self.passes_left -= 1
        result = self._gradient(self.fields)
        if self.passes_left == 0:
            self.fields = {}
        return result

    def _start(self, fields: dict[str, Tensor]) -> None:
        """Train on these unrolls ``[N, T, ...]`` for the next ``algo.passes`` turns; their
        observations join the statistics (``algo.normalize_obs``) at the next ``agree``."""
        self.fields, self.waiting = time_major(fields), None
        self.passes_left = self.cfg.passes
        self.moments.add(self.fields["obs"])

    def _gradient(self, f: dict[str, Tensor]) -> UpdateResult:
        """The loss's gradient on unrolls ``[T, N, ...]``, V-trace computed with the current
        network."""
        cfg = self.cfg
        out, v_t = outputs_and_next_values(self.network, f)
        if cfg.action_mask:
            out = masked_policy(out, f["action_mask"].bool())
        logp, entropy = log_prob_and_entropy(out, f["action"], cfg.squash_actions)
        terminated = f["terminated"].bool()
        vt = targets.vtrace(
            f["reward"].float(),
            out.value.detach(),
            v_t,
            cfg.gamma * (~terminated).float(),
            terminated | f["truncated"].bool(),
            logp.detach() - f["behaviour_logp"],
            clip_rho=cfg.clip_rho,
            clip_c=cfg.clip_c,
            clip_pg_rho=cfg.clip_pg_rho,
        )
        if cfg.clip_ratio > 0:  # APPO: pi/mu against the behaviour policy, clipped
            pg_loss = targets.ppo_clip_loss(
                logp, f["behaviour_logp"], vt.pg_advantage, cfg.clip_ratio
            )
        else:
            pg_loss = -(vt.pg_advantage * logp).mean()
        baseline_loss = 0.5 * (vt.vs - out.value).pow(2).mean()
        entropy_mean = entropy.mean()
        loss = pg_loss + cfg.baseline_cost * baseline_loss - cfg.entropy_cost * entropy_mean
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        behaviour_version = f["weights_version"].float().mean()
        metrics = {
            "learner/loss": float(loss.detach()),
            "learner/pg_loss": float(pg_loss.detach()),
            "learner/baseline_loss": float(baseline_loss.detach()),
            "learner/entropy": float(entropy_mean.detach()),
            "learner/value_mean": float(out.value.detach().mean()),
            "learner/policy_lag": float(self.num_updates - behaviour_version),
        }
        if cfg.clip_ratio > 0:
            ratio = (logp.detach() - f["behaviour_logp"]).exp()
            clipped = ((ratio - 1.0).abs() > cfg.clip_ratio).float().mean()
            metrics["learner/clip_fraction"] = float(clipped)
        return UpdateResult(priorities=None, metrics=metrics)

    def agree(self, total: Callable[[list[float]], list[float]]) -> None:
        """Merge the last batch's observation moments into the statistics (``algo.normalize_obs``;
        summed over the ranks at every update, as each rank takes batches on its own). Nothing
        else to decide with other ranks: each rank takes the passes of its own batches, and a
        group averages the gradients of the ranks that have one."""
        self.moments.merge(total)

    def apply_gradients(self) -> float:
        grad_norm = clip_and_step(self.network, self.optimizer, self.cfg.grad_clip_norm)
        self.num_updates += 1
        return grad_norm

    def state_dict(self) -> dict[str, object]:
        return trainer_state(self.network, self.optimizer, self.num_updates)

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.num_updates = load_trainer_state(state, self.network, self.optimizer)


class ImpalaAlgorithm:
    """IMPALA behind the algorithm seam (``apexrl.algos.Algorithm``)."""

    def make_network(self, obs_space: gym.Space, action_space: gym.Space, cfg: Config) -> nn.Module:
        a = cfg.algo
        return make_policy_network(
            obs_space,
            action_space,
            a.hidden_sizes,
            a.activation,
            a.init_log_std,
            torso=a.torso,
            lstm_size=a.lstm_size,
            prev_action_reward=a.prev_action_reward,
            shared_lstm=a.shared_lstm,
            policy_obs_dim=a.policy_obs_dim,
            normalize_obs=a.normalize_obs,
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
            squash=a.squash_actions,
            action_mask=a.action_mask,
        )

    def learner_core(
        self, obs_space: gym.Space, action_space: gym.Space, cfg: Config, device: torch.device
    ) -> ImpalaLearner:
        return ImpalaLearner(self.make_network(obs_space, action_space, cfg), cfg.algo, device)


ALGORITHM = ImpalaAlgorithm()

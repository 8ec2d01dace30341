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
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from apexrl import targets
from apexrl.algos import SampledBatch, UpdateResult
from apexrl.algos.actor_critic import (
    PolicyActorCore,
    clip_and_step,
    load_trainer_state,
    log_prob_and_entropy,
    make_policy_network,
    time_major,
    trainer_state,
)
from apexrl.algos.hyperparams import ImpalaConfig
from apexrl.config import Config
from apexrl.optim import Adam


class ImpalaLearner:
    """The policy-and-value network and Adam; V-trace actor-critic updates."""

    def __init__(self, network: nn.Module, cfg: ImpalaConfig, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        self.network = network.to(device)
        # apexrl's Adam: torch.optim's would import torch's compiler (seconds) at start-up
        self.optimizer = Adam(self.network.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
        self.num_updates = 0
        self.has_work = False  # one gradient per batch

    def compute_gradients(self, batch: SampledBatch | None) -> UpdateResult | None:
        if batch is None:
            return None
        cfg = self.cfg
        f = time_major(batch.fields)  # [T, N, ...]
        out = self.network(f["obs"])
        with torch.no_grad():
            v_t = self.network(f["next_obs"]).value
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
        pg_loss = -(vt.pg_advantage * logp).mean()
        baseline_loss = 0.5 * (vt.vs - out.value).pow(2).mean()
        entropy_mean = entropy.mean()
        loss = pg_loss + cfg.baseline_cost * baseline_loss - cfg.entropy_cost * entropy_mean
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        behaviour_version = f["weights_version"].float().mean()
        return UpdateResult(
            priorities=None,
            metrics={
                "learner/loss": float(loss.detach()),
                "learner/pg_loss": float(pg_loss.detach()),
                "learner/baseline_loss": float(baseline_loss.detach()),
                "learner/entropy": float(entropy_mean.detach()),
                "learner/value_mean": float(out.value.detach().mean()),
                "learner/policy_lag": float(self.num_updates - behaviour_version),
            },
        )

    def agree(self, total: object) -> None:
        """Nothing to decide with other ranks: one gradient per batch."""

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
        return PolicyActorCore(
            network, a.unroll_length, evaluate, device, seed, squash=a.squash_actions
        )

    def learner_core(
        self, obs_space: gym.Space, action_space: gym.Space, cfg: Config, device: torch.device
    ) -> ImpalaLearner:
        return ImpalaLearner(self.make_network(obs_space, action_space, cfg), cfg.algo, device)


ALGORITHM = ImpalaAlgorithm()

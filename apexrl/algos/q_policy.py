"""The Q-function policy gradients behind the algorithm seam: DDPG, TD3 and SAC, distributed the
Ape-X way (Horgan et al. 2018's Ape-X DPG): many actors with their own exploration feed replay
n-step transitions with initial priorities from their own critics, and the learner's replay ratio
is replay's rate limiter (``replay.samples_per_insert``).

- ``QPolicyLearner`` (the learner core): the published ``QPolicyNetwork`` (policy, critics, SAC's
  log-temperature), its Polyak-averaged target copy and one Adam per part. One update is the
  critics' regression on the n-step target and, every ``algo.policy_delay`` updates (TD3: 2), the
  policy's and the temperature's steps, and the targets' Polyak step. Every gradient of an update
  is taken from the same weights before any is applied, so that a learner group averages them
  all in one all-reduce.
- ``QPolicyActorCore``: the policy's action (SAC: a sample of the squashed Gaussian; DDPG and TD3:
  ``mu(s)`` plus the actor's Gaussian noise, ``continuous_targets.exploration_noise_scales``),
  uniformly random actions until the learner's first update (``algo.random_start``), greedy
  actions (SAC: ``tanh`` of the mean) for evaluation; the items are ``algos.transitions``'
  n-step transitions, their priorities ``|y - Q(s, a)|`` from the actor's own networks when the
  table is prioritized (``replay.priority_exponent`` > 0).

The math is ``apexrl.math.targets`` (n-step targets, importance weights, priorities) and
``apexrl.math.continuous_targets`` (bootstraps, smoothing, losses, Polyak, noise scales).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from apexrl.acting.step_block import StepBlock
from apexrl.algos import SampledBatch, UpdateResult
from apexrl.algos.actor_critic import PendingMoments
from apexrl.algos.transitions import cut_transitions
from apexrl.config import Config
from apexrl.config.algos import QPolicyConfig
from apexrl.envs import VectorStep
from apexrl.learning.optim import Adam
from apexrl.math import continuous_targets as ct
from apexrl.math import targets
from apexrl.math.distributions import squashed_gaussian_sample
from apexrl.models.q_policy import QPolicyNetwork


def _sizes(obs_space: gym.Space, action_space: gym.Space) -> tuple[int, int]:
    """A flat observation's and a Box action's sizes; ``ValueError`` for anything else."""
    if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
        raise ValueError(f"DDPG, TD3 and SAC need a 1-d Box action space, got {action_space}")
    if len(obs_space.shape) != 1:
        raise ValueError(
            f"DDPG, TD3 and SAC take flat observations, got shape {obs_space.shape} "
            "(flatten them with a gymnasium wrapper in env.wrappers)"
        )
    return int(obs_space.shape[0]), int(action_space.shape[0])


def make_q_policy_network(obs_space: gym.Space, action_space: gym.Space, cfg: Config) -> nn.Module:
    """The network of ``cfg``'s family: its policy kind, critics and temperature."""
    algo: QPolicyConfig = cfg.algo
    obs_dim, action_dim = _sizes(obs_space, action_space)
    return QPolicyNetwork(
        obs_dim,
        action_dim,
        algo.hidden_sizes,
        algo.NUM_CRITICS,
        algo.STOCHASTIC,
        getattr(algo, "init_alpha", None) if algo.STOCHASTIC else None,
        algo.normalize_obs,
    )


def next_action_and_bootstrap(
    online: QPolicyNetwork,
    target: QPolicyNetwork,
    next_obs: torch.Tensor,
    cfg: QPolicyConfig,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """The value of the state after each window (no gradient): SAC's soft value with the online
    policy's sample, TD3's smoothed target action, DDPG's target action, on the target critics
    (or, on an actor, its own critics: ``target`` is ``online``)."""
    with torch.no_grad():
        if cfg.STOCHASTIC:
            out = online.policy_output(next_obs)
            sample = squashed_gaussian_sample(out.mean, out.log_std, generator)
            q_next = ct.min_q(target.q_values(next_obs, sample.action))
            return ct.soft_bootstrap(q_next, sample.log_prob, online.alpha())
        mu_next = target.policy_output(next_obs)
        sigma = getattr(cfg, "target_noise", 0.0)
        if sigma > 0:
            noise = sigma * torch.randn(mu_next.shape, generator=generator, device=mu_next.device)
            mu_next = ct.smoothed_target_action(mu_next, noise, cfg.target_noise_clip)
        return ct.min_q(target.q_values(next_obs, mu_next))


class QPolicyLearner:
    """The learner core of DDPG, TD3 and SAC (see the module docstring)."""

    def __init__(
        self, network: QPolicyNetwork, cfg: QPolicyConfig, device: torch.device, seed: int
    ) -> None:
        self.cfg, self.device = cfg, torch.device(device)
        self.network = network.to(self.device)
        self.target = copy.deepcopy(self.network).requires_grad_(False)
        self.policy_optimizer = Adam(network.policy.parameters(), cfg.policy_lr, cfg.adam_eps)
        self.critic_optimizer = Adam(network.critic_parameters(), cfg.critic_lr, cfg.adam_eps)
        learn_alpha = cfg.STOCHASTIC and getattr(cfg, "learn_alpha", False)
        self.alpha_optimizer = (
            Adam([network.log_alpha], cfg.alpha_lr, cfg.adam_eps) if learn_alpha else None
        )
        if not learn_alpha and network.log_alpha is not None:
            network.log_alpha.requires_grad_(False)
        entropy = getattr(cfg, "target_entropy", None)
        self.target_entropy = -float(network.action_dim) if entropy is None else float(entropy)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.num_updates = 0
        self.has_work = False  # one update per batch
        self.wants_batch = True
        self._params = [p for p in self.network.parameters() if p.requires_grad]
        self.moments = PendingMoments(self.network, also=(self.target,))  # normalize_obs

    @property
    def policy_step(self) -> bool:
        """Whether this update also steps the policy, the temperature and the targets."""
        return self.num_updates % self.cfg.policy_delay == 0

    def update(self, batch: SampledBatch) -> UpdateResult:
        """One update on one batch (a single learner)."""
        result = self.compute_gradients(batch)
        result.metrics["learner/grad_norm"] = self.apply_gradients()
        return result

    def compute_gradients(self, batch: SampledBatch | None) -> UpdateResult | None:
        """Fill ``.grad`` of the critics and, on a policy step, of the policy and the
        temperature, all from the current weights; new priorities."""
        if batch is None:
            return None
        cfg, net, fields = self.cfg, self.network, batch.fields
        weights = targets.importance_weights(
            batch.probabilities, batch.table_size, cfg.importance_exponent
        ).to(self.device)
        obs, action = fields["obs"], fields["action"]
        self.moments.add(obs)
        bootstrap = next_action_and_bootstrap(
            net, self.target, fields["next_obs"], cfg, self.generator
        )
        y = targets.n_step_target(
            fields["reward"], fields["num_steps"], fields["terminated"], bootstrap, cfg.gamma
        )
        q = net.q_values(obs, action)
        critic_loss = ct.critic_loss(q, y, weights)
        for p in self._params:
            p.grad = None
        critic_loss.backward()
        metrics = {
            "learner/loss": float(critic_loss.detach()),
            "learner/q_mean": float(q[0].detach().mean()),
        }
        if self.policy_step:
            metrics.update(self._policy_gradients(obs))
        td = ct.td_errors_mean_abs([qi.detach() for qi in q], y)
        metrics["learner/td_abs_mean"] = float(td.mean())
        return UpdateResult(targets.td_priorities(td, cfg.priority_eps).cpu().numpy(), metrics)

    def _policy_gradients(self, obs: torch.Tensor) -> dict[str, float]:
        """The policy's (and SAC's temperature's) gradients; the critics get none from them."""
        net = self.network
        net.critics.requires_grad_(False)
        try:
            if self.cfg.STOCHASTIC:
                out = net.policy_output(obs)
                sample = squashed_gaussian_sample(out.mean, out.log_std, self.generator)
                q_pi = ct.min_q(net.q_values(obs, sample.action))
                alpha = net.alpha()
                policy_loss = ct.sac_policy_loss(sample.log_prob, q_pi, alpha)
            else:
                q_pi = net.q_values(obs, net.policy_output(obs))[0]
                policy_loss = ct.deterministic_policy_loss(q_pi)
            policy_loss.backward()
        finally:
            net.critics.requires_grad_(True)
        metrics = {"learner/policy_loss": float(policy_loss.detach())}
        if self.cfg.STOCHASTIC:
            logp = sample.log_prob.detach()
            metrics.update({"learner/alpha": float(alpha), "learner/entropy": float(-logp.mean())})
            if self.alpha_optimizer is not None:
                ct.temperature_loss(net.log_alpha, logp, self.target_entropy).backward()
        return metrics

    def agree(self, total: Callable[[list[float]], list[float]]) -> None:
        """With ``algo.normalize_obs``, merge the last batch's observation moments, summed over
        the ranks (every rank takes the same), into the online and target networks' statistics.
        Nothing else to decide with other ranks: the policy steps are counted alike on each."""
        self.moments.merge(total)

    def apply_gradients(self) -> float:
        """Clip and apply the update's gradients, Polyak-average the targets on a policy step,
        count the update; the gradient norm."""
        grads = [p.grad for p in self._params if p.grad is not None]
        if self.cfg.grad_clip_norm > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(self._params, self.cfg.grad_clip_norm))
        else:
            norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
        self.critic_optimizer.step()
        if self.policy_step:
            self.policy_optimizer.step()
            if self.alpha_optimizer is not None:
                self.alpha_optimizer.step()
            self._polyak_step()
        self.num_updates += 1
        self.network.learner_updates.fill_(self.num_updates)
        return norm

    @torch.no_grad()
    def _polyak_step(self) -> None:
        online = [p for p in self.network.parameters()]
        for target, source in zip(self.target.parameters(), online, strict=True):
            target.lerp_(source, self.cfg.tau)  # (1 - tau) * target + tau * online

    def state_dict(self) -> dict[str, object]:
        state = {
            "network": self.network.state_dict(),
            "target": self.target.state_dict(),
            "policy_optimizer": self.policy_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "num_updates": self.num_updates,
        }
        if self.alpha_optimizer is not None:
            state["alpha_optimizer"] = self.alpha_optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.network.load_state_dict(state["network"])
        self.target.load_state_dict(state["target"])
        self.policy_optimizer.load_state_dict(state["policy_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        if self.alpha_optimizer is not None:
            self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
        self.num_updates = int(state["num_updates"])


class QPolicyActorCore:
    """Acting with the policy and cutting n-step transitions (see the module docstring)."""

    def __init__(
        self,
        network: QPolicyNetwork,
        cfg: Config,
        actor_id: int,
        evaluate: bool,
        device: str,
        rng: np.random.Generator,
    ) -> None:
        algo: QPolicyConfig = cfg.algo
        self.network, self.algo, self.device, self.rng = network, algo, device, rng
        self.greedy = evaluate
        self.random_start = algo.random_start and not evaluate
        self.noise = 0.0
        if not evaluate and not algo.STOCHASTIC:
            scales = ct.exploration_noise_scales(
                cfg.actor.num_actors, algo.exploration_noise, algo.noise_spread
            )
            self.noise = float(scales[min(actor_id, len(scales) - 1)])
        self.prioritized = cfg.replay.kind == "prioritized" and cfg.replay.priority_exponent > 0
        self.block_steps = cfg.actor.chunk_steps + algo.n_step - 1
        self.block_overlap = algo.n_step - 1
        self.synchronous = False
        self.generator = torch.Generator().manual_seed(int(rng.integers(2**62)))

    def act(
        self, obs: np.ndarray, mask: np.ndarray | None = None, rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions in [-1, 1] for ``obs`` ``[B, *obs]``; a legal-action ``mask`` has no meaning
        for a Box action (``ValueError``); ``rows`` (the lanes of ``obs``) changes nothing."""
        if mask is not None:
            raise ValueError(
                "an action mask needs a Discrete action; DDPG, TD3 and SAC act in a Box"
            )
        net = self.network
        with torch.inference_mode():
            obs_t = torch.as_tensor(obs, device=self.device)
            if self.random_start and int(net.learner_updates) == 0:
                shape = (len(obs), net.action_dim)
                action_t = torch.from_numpy(self.rng.uniform(-1.0, 1.0, shape).astype(np.float32))
            elif self.algo.STOCHASTIC:
                out = net.policy_output(obs_t)
                if self.greedy:
                    action_t = torch.tanh(out.mean)
                else:
                    action_t = squashed_gaussian_sample(
                        out.mean, out.log_std, self._generator_for(out.mean)
                    ).action
            else:
                action_t = net.policy_output(obs_t)
                if self.noise > 0:
                    noise = torch.randn(action_t.shape, generator=self._generator_for(action_t))
                    action_t = (action_t + self.noise * noise.to(action_t.device)).clamp(-1, 1)
            extras = {}
            if self.prioritized:
                action_t = action_t.to(obs_t.device)
                extras["q_taken"] = ct.min_q(net.q_values(obs_t, action_t)).cpu().numpy()
            return action_t.cpu().numpy().astype(np.float32), extras

    def logged_extras(self, obs: np.ndarray, action: np.ndarray) -> dict[str, np.ndarray]:
        """The extras of actions in [-1, 1] taken by someone else (an external env's
        ``log_action``)."""
        if not self.prioritized:
            return {}
        with torch.inference_mode():
            obs_t = torch.as_tensor(obs, device=self.device)
            action_t = torch.as_tensor(action, device=self.device)
            return {"q_taken": ct.min_q(self.network.q_values(obs_t, action_t)).cpu().numpy()}

    def _generator_for(self, like: torch.Tensor) -> torch.Generator | None:
        """The core's seeded generator where the draw is on the CPU (the default one on CUDA)."""
        return self.generator if like.device.type == "cpu" else None

    def observe(self, action: np.ndarray, step: VectorStep, rows: np.ndarray | None = None) -> None:
        """Nothing to keep between steps: the policy is feed-forward."""

    def items(
        self, block: StepBlock, rows: np.ndarray | None = None
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The block's n-step transitions and their initial priorities (ones for a uniform
        table)."""
        fields = cut_transitions(block, self.algo.gamma, self.algo.n_step)
        flat = len(fields["num_steps"])
        if not self.prioritized:
            return fields, np.ones(flat)
        q_taken = block.extras["q_taken"][: flat // block.obs.shape[1]].reshape(flat)
        with torch.inference_mode():
            as_tensor = {k: torch.as_tensor(v, device=self.device) for k, v in fields.items()}
            generator = self.generator if torch.device(self.device).type == "cpu" else None
            bootstrap = next_action_and_bootstrap(
                self.network, self.network, as_tensor["next_obs"], self.algo, generator
            )
            y = targets.n_step_target(
                as_tensor["reward"],
                as_tensor["num_steps"],
                as_tensor["terminated"],
                bootstrap,
                self.algo.gamma,
            )
            td = y.cpu() - torch.from_numpy(q_taken)
        return fields, targets.td_priorities(td, self.algo.priority_eps).numpy()


class QPolicyAlgorithm:
    """DDPG, TD3 or SAC behind the algorithm seam (``apexrl.algos.Algorithm``): which one is the
    config's ``algo`` class (``config.algos``)."""

    def make_network(self, obs_space: gym.Space, action_space: gym.Space, cfg: Config) -> nn.Module:
        return make_q_policy_network(obs_space, action_space, cfg)

    def actor_core(
        self,
        network: nn.Module,
        cfg: Config,
        actor_id: int,
        evaluate: bool,
        device: str,
        rng: np.random.Generator,
    ) -> QPolicyActorCore:
        return QPolicyActorCore(network, cfg, actor_id, evaluate, device, rng)

    def learner_core(
        self, obs_space: gym.Space, action_space: gym.Space, cfg: Config, device: torch.device
    ) -> QPolicyLearner:
        network = make_q_policy_network(obs_space, action_space, cfg)
        return QPolicyLearner(network, cfg.algo, device, cfg.learner.seed)


ALGORITHM = QPolicyAlgorithm()

"""A trained policy for the user's own code: numpy observations in, numpy actions out, in this
process, with no role started, no socket and no pickle.

``Policy.from_checkpoint`` reads a run's ``checkpoint.pt`` (``torch.load(weights_only=True)``,
through ``apexrl.tools.evaluate.load_policy_network``) and the ``config.yaml`` beside it; a
``Policy`` can also be made from a config and weights as ``Trainer.get_weights`` returns them.
It acts through the family's own actor core (``apexrl.algos``), the code an evaluation actor and
``apexrl evaluate`` act with, so that the same weights, seed and observations give the same
actions:

- ``explore=False``: the evaluation actor's policy (greedy Q, or the policy's mode; Ape-X and
  R2D2 with ``actor.eval_epsilon``, 0 by default);
- ``explore=True``: actor 0's (Ape-X's epsilon-greedy, samples of the policy).

R2D2, and IMPALA and PPO with ``algo.lstm_size`` > 0, carry a recurrent state
(``RecurrentState``: the LSTM's ``h`` and ``c``, and the previous action and reward its network
reads): ``compute_actions`` takes it and returns the next one; the caller passes the rewards
the last actions got (``prev_reward``) and marks the envs that start a new episode
(``episode_start``: their state is zeroed, as an actor does). Continuous actions come back
inside the env's bounds (clipped, or mapped from [-1, 1] for a tanh-squashed policy), as the
envs of a run take them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch

from apexrl.acting.rounds import play_round, round_quotas
from apexrl.algos import load_algorithm
from apexrl.config import Config, ConfigError, load_config
from apexrl.config.algos import action_array
from apexrl.envs import EnvError, check_action_space, make_vector_env
from apexrl.envs.nested import HybridActions, PackedBox
from apexrl.launch.run_state import wait_for_run_end
from apexrl.models import (
    LSTMState,
    RecurrentActorCritic,
    RecurrentQNetwork,
    arrays_to_params,
    params_to_arrays,
)
from apexrl.tools.evaluate import (
    SEED_OFFSET,
    EvaluateError,
    find_sources,
    load_policy_network,
    summary,
)

RUN_END_TIMEOUT_S = 60.0  # the longest wait for an ending run's launcher (from_checkpoint)


class RecurrentState(NamedTuple):
    """A recurrent policy's state for a batch of ``B`` envs (numpy)."""

    h: np.ndarray  # float32 [B, H], the LSTM's hidden state
    c: np.ndarray  # float32 [B, H], the LSTM's cell state
    prev_action: np.ndarray  # int64 [B], the action taken before (0 at an episode's start)
    prev_reward: np.ndarray  # float32 [B], the reward it got (0 at an episode's start)


class Policy:
    """The acting half of a trained agent, for a user's loop::

        policy = Policy.from_checkpoint("runs/ppo-CartPole-v1-20261201-021844")
        obs, _ = env.reset(seed=0)
        actions, state = policy.compute_actions(obs[None])

    Args:
        cfg: the run's config (its env, algorithm and network).
        weights: the network's arrays by name (``Trainer.get_weights``); None: a fresh network.
        device: where the network runs (``cpu``, ``cuda``).
        seed: seeds exploration (and evaluation epsilon); None: ``env.seed + 10000``, the seed
            ``apexrl evaluate`` plays with by default.
        weights_version: the version the weights are (reported by ``evaluate``); -1: unknown.
    """

    def __init__(
        self,
        cfg: Config,
        weights: dict[str, np.ndarray] | None = None,
        *,
        device: str = "cpu",
        seed: int | None = None,
        weights_version: int = -1,
    ) -> None:
        self.config, self.device = cfg, device
        self.seed = cfg.env.seed + SEED_OFFSET if seed is None else seed
        self.weights_version = weights_version
        self.algorithm = load_algorithm(cfg.algorithm)
        self.observation_space, self.action_space = env_spaces(cfg)
        self.network = self.algorithm.make_network(self.observation_space, self.action_space, cfg)
        if weights is not None:
            self.set_weights(weights)
        self.network.to(device).eval()
        self._cores: dict[bool, object] = {}

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        config: str | Path | None = None,
        overrides: Sequence[str] = (),
        *,
        best: bool = False,
        device: str = "cpu",
        seed: int | None = None,
        policy: str | None = None,
    ) -> Policy:
        """The policy of a checkpoint: a run directory (its ``checkpoint.pt``, or with ``best``
        its ``checkpoint_best.pt``) or a ``.pt`` file, read with the ``config.yaml`` beside it
        (or ``config``, with ``key=value`` ``overrides``); of a multi-agent run, the network
        policy named ``policy`` (None: the run's only one). Raises ``ValueError`` with one line
        when a file is missing or does not hold such a checkpoint. A run directory whose run
        met its stop condition while its launcher still stops the roles is read once the
        launcher has gone, so its ``checkpoint.pt`` is the run's last (the judged version's)."""
        if Path(path).is_dir() and not best:
            wait_for_run_end(Path(path), RUN_END_TIMEOUT_S)
        try:
            sources = find_sources(Path(path), best, None if config is None else str(config))
            cfg = load_config(sources.config, list(overrides))
        except (EvaluateError, ConfigError) as exc:
            raise ValueError(str(exc)) from exc
        if cfg.multiagent.enabled:  # one of the run's policies
            from apexrl.multiagent.api import policy_checkpoint

            cfg, weights, version = policy_checkpoint(cfg, sources.checkpoint, policy)
        elif policy is not None:
            raise ValueError(f"{sources.checkpoint} is a single-agent run's: it has no policy")
        else:
            weights, version = checkpoint_weights(cfg, sources.checkpoint)
        return cls(cfg, weights, device=device, seed=seed, weights_version=version)

    @property
    def recurrent(self) -> bool:
        """Whether the policy carries a state from step to step (R2D2; IMPALA and PPO with
        ``algo.lstm_size`` > 0)."""
        return isinstance(self.network, RecurrentQNetwork | RecurrentActorCritic)

    def get_weights(self) -> dict[str, np.ndarray]:
        """The network's arrays by name (copies)."""
        return params_to_arrays(self.network)

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Load arrays by name (all or nothing; ``ValueError`` names the first that does not
        fit the network)."""
        arrays_to_params(self.network, weights)

    def initial_state(self, batch_size: int) -> RecurrentState | None:
        """The state at an episode's start for ``batch_size`` envs; None for a policy without
        one."""
        if not self.recurrent:
            return None
        width = getattr(self.network, "state_size", self.network.lstm_size)
        zeros = np.zeros((batch_size, width), dtype=np.float32)
        dtype, shape = action_array(self.action_space)  # as replay stores previous actions
        return RecurrentState(
            zeros,
            zeros.copy(),
            np.zeros((batch_size, *shape), dtype=dtype),
            np.zeros(batch_size, dtype=np.float32),
        )

    @property
    def _prev_action_dtype(self) -> np.dtype:
        return action_array(self.action_space)[0]

    def compute_actions(
        self,
        obs_batch: np.ndarray,
        state: RecurrentState | None = None,
        explore: bool = False,
        *,
        prev_reward: np.ndarray | None = None,
        episode_start: np.ndarray | None = None,
    ) -> tuple[np.ndarray, RecurrentState | None]:
        """Actions for a batch of observations.

        Args:
            obs_batch: ``[B, *obs]`` observations as the env returns them; for a Dict or
                Tuple observation space, a dict (or tuple) of ``[B, *part]`` arrays; for a
                policy of a multi-agent run, a dict ``{agent: observation}`` of the agents it
                plays, as the PettingZoo env gives them (legal-action masks included): the
                actions come back as ``{agent: action}``, one forward pass for all of them.
            state: a recurrent policy's state from the last call (None: the initial state).
            explore: act as a training actor does (epsilon-greedy, samples of the policy)
                instead of as the evaluation actor does.
            prev_reward: ``[B]`` rewards of the last actions (a recurrent policy reads them).
            episode_start: ``[B]`` bool, True where an env starts a new episode (its state is
                zeroed).

        Returns:
            ``[B, ...]`` actions (int64 indices, ``[B, K]`` for a MultiDiscrete space, or floats
            inside the env's bounds; a list of ``B`` tuples or dicts for a Tuple or Dict action
            space) and the next state (None for a policy without one).
        """
        if isinstance(obs_batch, dict) and self.config.multiagent.enabled:
            from apexrl.multiagent.api import agent_actions

            return agent_actions(self, obs_batch, explore), None
        obs = self._checked_obs(obs_batch)
        core = self._core(explore)
        if not self.recurrent:
            action, _ = core.act(obs)
            return self._in_bounds(action), None
        state = self._start_state(len(obs), state, prev_reward, episode_start)
        load_state(core, state, self.device)
        action, _ = core.act(obs)
        action = np.asarray(action, dtype=self._prev_action_dtype)
        h, c = (x.detach().cpu().numpy().copy() for x in core.state)
        state = RecurrentState(h, c, action.copy(), np.zeros(len(obs), dtype=np.float32))
        return self._in_bounds(action), state

    def evaluate(self, episodes: int = 10, num_envs: int = 1, seed: int | None = None) -> dict:
        """Play ``episodes`` episodes without exploration, on ``num_envs`` fresh envs of the
        config, as ``apexrl evaluate --episodes N --envs K --seed S`` plays them (the same
        episodes for the same weights and seed; ``seed`` None: this policy's). Returns the
        returns, lengths and their statistics (``return``, ``length``: mean, std, min, max)."""
        if self.config.multiagent.enabled:
            raise ValueError(
                "a multi-agent run's policy plays with the others: apexrl evaluate RUN_DIR plays "
                "them all"
            )
        seed = self.seed if seed is None else seed
        quotas = round_quotas(episodes, min(num_envs, episodes))
        envs = make_vector_env(
            self.config.env, len(quotas), self.config.unit_actions, self.config.product_discrete
        )
        rng = np.random.default_rng(seed)
        core = self.algorithm.actor_core(self.network, self.config, 0, True, self.device, rng)
        try:
            with torch.inference_mode():
                result = play_round(envs, core, quotas, seed)
        finally:
            envs.close()
        return {
            "algorithm": self.config.algorithm,
            "env": self.config.env.id,
            "weights_version": self.weights_version,
            "episodes": len(result.returns),
            "envs": len(quotas),
            "seed": seed,
            "returns": result.returns.tolist(),
            "lengths": result.lengths.tolist(),
            "return": summary(result.returns),
            "length": summary(result.lengths.astype(np.float64)),
            "env_steps": result.env_steps,
            "seconds": round(result.seconds, 3),
        }

    def _core(self, explore: bool):
        """The family's actor core: actor 0's to explore, the evaluation actor's otherwise."""
        if explore not in self._cores:
            rng = np.random.default_rng(self.seed)
            self._cores[explore] = self.algorithm.actor_core(
                self.network, self.config, 0, not explore, self.device, rng
            )
        return self._cores[explore]

    def _checked_obs(self, obs_batch: np.ndarray) -> np.ndarray:
        if isinstance(self.observation_space, PackedBox):  # a Dict or Tuple of [B, ...] arrays
            return self.observation_space.layout.pack(obs_batch)
        obs = np.asarray(obs_batch, dtype=self.observation_space.dtype)
        if obs.ndim < 1 or obs.shape[1:] != self.observation_space.shape:
            raise ValueError(
                f"obs_batch must be [B, {', '.join(map(str, self.observation_space.shape))}], "
                f"got shape {obs.shape}"
            )
        return obs

    def _start_state(
        self,
        batch_size: int,
        state: RecurrentState | None,
        prev_reward: np.ndarray | None,
        episode_start: np.ndarray | None,
    ) -> RecurrentState:
        """The state to act from: ``state`` (or the initial one) with the rewards given, and
        zeroed where an episode starts (as an actor's core does after each step)."""
        state = self.initial_state(batch_size) if state is None else state
        if len(state.prev_action) != batch_size:
            raise ValueError(
                f"state is for {len(state.prev_action)} envs, obs_batch for {batch_size}"
            )
        h, c = np.array(state.h, dtype=np.float32), np.array(state.c, dtype=np.float32)
        action = np.array(state.prev_action, dtype=self._prev_action_dtype)
        reward = state.prev_reward if prev_reward is None else prev_reward
        reward = np.array(reward, dtype=np.float32).reshape(batch_size)
        if episode_start is not None:
            start = np.asarray(episode_start, dtype=bool).reshape(batch_size)
            h[start], c[start], action[start], reward[start] = 0.0, 0.0, 0, 0.0
        return RecurrentState(h, c, action, reward)

    def _in_bounds(self, action: np.ndarray) -> np.ndarray:
        """Box actions as the run's envs take them: mapped from [-1, 1] (a squashed policy)
        or clipped onto the env's bounds."""
        space = self.action_space
        if isinstance(space, HybridActions):  # one nested action (tuple or dict) per row
            return [space.layout.nested(row, self.config.unit_actions) for row in action]
        if hasattr(space, "product_of"):  # Ape-X on a MultiDiscrete: the parts of the index
            return np.stack(np.unravel_index(np.asarray(action), space.product_of), axis=-1)
        if not isinstance(space, gym.spaces.Box):
            return np.asarray(action, dtype=np.int64)
        action = np.asarray(action, dtype=np.float64)
        if self.config.unit_actions:
            action = space.low + (action + 1.0) * 0.5 * (space.high - space.low)
        return np.clip(action, space.low, space.high).astype(space.dtype)


def checkpoint_weights(cfg: Config, checkpoint: Path) -> tuple[dict[str, np.ndarray], int]:
    """The weights a checkpoint's learner published (by name) and their version (-1: not
    recorded); ``ValueError`` with one line when the file is not such a checkpoint of ``cfg``."""
    try:
        probe = probe_env(cfg)
        try:
            net, version = load_policy_network(cfg, checkpoint, probe, "cpu")
        finally:
            probe.close()
    except (EvaluateError, EnvError) as exc:
        raise ValueError(str(exc)) from exc
    return params_to_arrays(net), version


def probe_env(cfg: Config) -> gym.vector.VectorEnv:
    """One env of the config, checked against the algorithm."""
    envs = make_vector_env(cfg.env, 1, False, cfg.product_discrete)
    try:
        check_action_space(cfg, envs.single_action_space)
    except Exception:
        envs.close()
        raise
    return envs


def env_spaces(cfg: Config) -> tuple[gym.Space, gym.Space]:
    """The env's observation and action spaces (a Box with the env's own bounds, which the
    clipping or rescaling wrapper of ``make_vector_env`` hides); a multi-agent run's policy's
    (``cfg`` the policy's config)."""
    if cfg.multiagent.enabled:
        from apexrl.envs.spaces import network_spaces

        return network_spaces(cfg)
    envs = probe_env(cfg)
    try:
        action_space = envs.single_action_space
        if isinstance(action_space, gym.spaces.Box) and not isinstance(action_space, HybridActions):
            action_space = envs.env.single_action_space
        return envs.single_observation_space, action_space
    finally:
        envs.close()


def load_state(core, state: RecurrentState, device: str) -> None:
    """Put ``state`` into a recurrent actor core (what its ``observe`` leaves between steps)."""
    core.state = LSTMState(
        torch.as_tensor(state.h, device=device), torch.as_tensor(state.c, device=device)
    )
    core.prev_action = state.prev_action
    core.prev_reward = state.prev_reward

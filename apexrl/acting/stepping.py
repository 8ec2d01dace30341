"""How an actor steps its envs: act on the observations, step the envs, let the core observe the
step; one vector step ``[B, ...]`` of all the actor's envs per call, for the actor's step block.

Two ways, one interface (``reset``, ``step``, ``close``):

- ``PlainStepper``: act for all ``B`` envs, step all of them, again. The env and the network take
  turns, so an actor runs at best at ``1 / (1 / env_rate + 1 / inference_rate)``.
- ``OverlapStepper`` (``actor.overlap``): the envs in two halves, each its own vector env and
  its own actor core (Sample Factory's double-buffered sampling, rlpyt's alternating sampler).
  While half A's envs step in ale-py's C++ threads (``send``, later ``recv``, the GIL released),
  the network infers for half B, and the other way round::

      recv A(t), core A observes it
      act A(t+1), send A   <- B's envs step t
      recv B(t), core B observes it
      act B(t+1), send B   <- A's envs step t+1
      -> the step t of all B envs: A's first, then B's

  Each call chooses the actions of the next step: when it returns, both halves' envs are
  already stepping ``t+1``, so the actor's own work between two calls (the step block, cutting
  and sending chunks, with the priorities' forward pass) overlaps with all the envs.

Every env's trajectory is the one it has under ``PlainStepper``: its steps in order, reset in
the same step as before (``SAME_STEP``, the final observation in ``next_obs``), ``terminated``
and ``truncated`` as the env said, and with the same seeds (env ``i`` gets ``seed + i`` either
way) and the same actions, the same observations and rewards. Each half has its own actor core
(a recurrent core's state is per env and must see its own half's steps) and its own
``TrainingSignal`` (the lives of its envs); the actor cuts replay items with the first half's core,
which sees whole ``[T, B]`` blocks there as under ``PlainStepper``. Each step carries the weights
version that chose its action: the actions of step ``t+1`` are chosen before the actor reads
newer weights at the end of step ``t``, so newer weights act one step later than they would
under ``PlainStepper``.

Overlap needs ale-py's ``AtariVectorEnv`` (its ``send`` and ``recv``), at least two envs, and an
asynchronous core: a synchronous one (PPO) must act on every step of a chunk with the weights of
that chunk, which actions chosen one step ahead would not. Where any is missing the actor steps
plainly and says so in its log. Each half's env gets the cores that inference leaves
(``half_env_threads``).

The overlapped loop runs at about the slower of its two phases: where inference is the longer one
(a CNN on one CPU core), at about the rate of inference at half batches; where the envs are (a
GPU infers), at about the envs' own rate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple, Protocol

import gymnasium as gym
import numpy as np

from apexrl.algos import ActorCore
from apexrl.config import Config
from apexrl.envs import VectorStep, atari, step_vector
from apexrl.envs.training import TrainingSignal
from apexrl.runtime.cores import usable_cores

log = logging.getLogger(__name__)


class ActedStep(NamedTuple):
    """One vector step as the actor's block stores it, ``B`` envs in their order."""

    obs: np.ndarray  # [B, *obs] the observations the actions were chosen on
    action: np.ndarray  # [B, *action]
    extras: dict[str, np.ndarray]  # the core's extras and ``weights_version`` [B] int64
    step: VectorStep  # what the envs returned (raw rewards; episodes and callbacks count these)
    trained: VectorStep  # the step as training sees it (``apexrl.envs.training``)


class Stepper(Protocol):
    def reset(self, seed: int | None) -> np.ndarray:
        """Reset every env (env ``i`` with ``seed + i``); the observations ``[B, *obs]``."""
        ...

    def step(self, weights_version: int) -> ActedStep:
        """Act, step the envs and observe: the next vector step of all envs."""
        ...

    def close(self) -> None: ...


def weights_versions(versions: np.ndarray, version: int) -> np.ndarray:
    """The ``weights_version`` of each env's next step: ``versions`` while it is still
    ``version``, else a fresh array (the block may still hold the old one)."""
    if versions[0] != version:
        return np.full(len(versions), version, dtype=np.int64)
    return versions


class PlainStepper:
    """Act for all envs, then step all envs."""

    def __init__(self, envs: gym.vector.VectorEnv, core: ActorCore, signal: TrainingSignal):
        self.envs, self.core, self.signal = envs, core, signal
        self.obs = np.zeros(0)  # to act on next; set by reset()
        self.versions = np.full(envs.num_envs, -2, dtype=np.int64)

    def reset(self, seed: int | None) -> np.ndarray:
        self.obs, _ = self.envs.reset(seed=seed)
        return self.obs

    def step(self, weights_version: int) -> ActedStep:
        obs = self.obs
        action, extras = self.core.act(obs)
        step = step_vector(self.envs, action)
        trained = self.signal(step)  # clipped, lives; the raw step's returns count
        self.core.observe(action, trained)
        self.versions = weights_versions(self.versions, weights_version)
        self.obs = step.obs
        return ActedStep(obs, action, {**extras, "weights_version": self.versions}, step, trained)

    def close(self) -> None:
        self.envs.close()


class _Received:
    """A vector env whose ``step`` is the ``recv`` of actions sent before, so that
    ``step_vector`` turns what ``recv`` returns into a ``VectorStep`` as it does for ``step``."""

    def __init__(self, envs: gym.vector.VectorEnv) -> None:
        self.envs = envs

    def step(self, actions: np.ndarray) -> tuple:
        return self.envs.recv()


class HalfEnvs:
    """One half of an overlapping actor's envs: its vector env, its actor core, its training
    signal, and the step it has sent to the env and not yet received."""

    def __init__(self, envs: gym.vector.VectorEnv, core: ActorCore, signal: TrainingSignal):
        self.envs, self.core, self.signal = envs, core, signal
        self.received = _Received(envs)
        self.num_envs = envs.num_envs
        self.obs = np.zeros(0)  # to act on next
        self.sent: tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]] | None = None

    def reset(self, seed: int | None) -> np.ndarray:
        self.drain()
        self.obs, _ = self.envs.reset(seed=seed)
        return self.obs

    def act_and_send(self, weights_version: int) -> None:
        """Choose the actions on ``obs`` and hand them to the env's threads, without waiting."""
        action, extras = self.core.act(self.obs)
        version = np.full(self.num_envs, weights_version, dtype=np.int64)
        self.envs.send(action)
        self.sent = (self.obs, action, {**extras, "weights_version": version})

    def receive(self) -> ActedStep:
        """Wait for the step sent; the core observes it."""
        obs, action, extras = self.sent
        self.sent = None
        step = step_vector(self.received, action)
        trained = self.signal(step)
        self.core.observe(action, trained)
        self.obs = step.obs
        return ActedStep(obs, action, extras, step, trained)

    def drain(self) -> None:
        """Wait for a step still in the env's threads and drop it."""
        if self.sent is not None:
            self.sent = None
            self.envs.recv()


def join_steps(first: VectorStep, second: VectorStep) -> VectorStep:
    """Two halves' steps as one, ``first``'s envs first."""
    lives = None
    if first.lives is not None and second.lives is not None:
        lives = np.concatenate([first.lives, second.lives])
    return VectorStep(
        *(np.concatenate([a, b]) for a, b in zip(first[:5], second[:5], strict=True)), lives
    )


def join_acted(first: ActedStep, second: ActedStep) -> ActedStep:
    """Two halves' acted steps as one step of all envs, ``first``'s envs first."""
    step = join_steps(first.step, second.step)
    trained = step._replace(
        reward=np.concatenate([first.trained.reward, second.trained.reward]),
        terminated=np.concatenate([first.trained.terminated, second.trained.terminated]),
    )
    extras = {
        name: np.concatenate([value, second.extras[name]]) for name, value in first.extras.items()
    }
    return ActedStep(
        np.concatenate([first.obs, second.obs]),
        np.concatenate([first.action, second.action]),
        extras,
        step,
        trained,
    )


class OverlapStepper:
    """Steps one half of the envs while the network infers for the other (module docstring)."""

    def __init__(self, first: HalfEnvs, second: HalfEnvs) -> None:
        self.first, self.second = first, second

    def reset(self, seed: int | None) -> np.ndarray:
        second_seed = None if seed is None else seed + self.first.num_envs
        return np.concatenate([self.first.reset(seed), self.second.reset(second_seed)])

    def step(self, weights_version: int) -> ActedStep:
        first, second = self.first, self.second
        if first.sent is None:  # the first step after a reset
            first.act_and_send(weights_version)
            second.act_and_send(weights_version)  # while the first half's envs step
        first_step = first.receive()
        first.act_and_send(weights_version)  # its next step, while the second half's envs step
        second_step = second.receive()
        second.act_and_send(weights_version)  # its next step, while the first half's envs step
        return join_acted(first_step, second_step)

    def close(self) -> None:
        for half in (self.first, self.second):
            try:
                half.drain()
            finally:
                half.envs.close()


def can_overlap(cfg: Config, envs: gym.vector.VectorEnv, core: ActorCore) -> str:
    """Why the actor cannot overlap stepping and inference; "" when it can."""
    if not cfg.actor.overlap:
        return "actor.overlap is off"
    if envs.num_envs < 2:
        return "one env cannot be split"
    if not (atari.is_atari(cfg.env.id) and callable(getattr(envs, "send", None))):
        return f"{cfg.env.id} has no asynchronous vector env (ale-py's Atari games have one)"
    if core.synchronous:
        return f"{cfg.algorithm} acts with one weights version per chunk"
    return ""


def half_env_threads(cfg: Config, num_envs: int) -> int:
    """C++ threads of a half's vector env: the cores that inference leaves, at most one per env.
    While one half steps, the network infers on ``actor.torch_threads`` cores; more env threads
    would take the inference thread's core (on 2 cores, 2 threads per half step 10 % slower)."""
    return max(1, min(num_envs, usable_cores() - cfg.actor.torch_threads))


def make_stepper(
    cfg: Config,
    envs: gym.vector.VectorEnv,
    core: ActorCore,
    make_core: Callable[[np.random.Generator], ActorCore],
    seed: int,
) -> Stepper:
    """The actor's stepper over ``envs`` (which it then owns and closes) with ``core``: an
    ``OverlapStepper`` where ``can_overlap``, whose halves are fresh ale-py vector envs of
    ``cfg.env`` (``envs`` is closed) with ``core`` and a second core from ``make_core``;
    else a ``PlainStepper``."""
    why_not = can_overlap(cfg, envs, core)
    if why_not:
        if cfg.actor.overlap:
            log.info("stepping all %d envs, then inferring: %s", envs.num_envs, why_not)
        return PlainStepper(envs, core, TrainingSignal(cfg.env))
    num_envs = envs.num_envs
    envs.close()
    sizes = (num_envs - num_envs // 2, num_envs // 2)
    cores = (core, make_core(np.random.default_rng([seed, 1])))  # its own exploration noise
    halves = []
    try:
        for size, half_core in zip(sizes, cores, strict=True):
            half_envs = atari.make_vector_env(cfg.env, size, half_env_threads(cfg, size))
            halves.append(HalfEnvs(half_envs, half_core, TrainingSignal(cfg.env)))
    except BaseException:
        for half in halves:
            half.envs.close()
        raise
    log.info(
        "stepping %d + %d envs in turn, each half while inferring for the other (%d C++ threads"
        " each)",
        *sizes,
        half_env_threads(cfg, sizes[0]),
    )
    return OverlapStepper(*halves)

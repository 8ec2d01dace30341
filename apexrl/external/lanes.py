"""A policy server's episodes and lanes: the steps of external episodes as an actor's step
blocks.

An actor's vector env is ``B`` envs that step together; external episodes come and go and step
when their clients call. Each open episode runs in a *lane*: a step block of one env
(``StepBlock`` with ``B = 1``) that the run's actor core cuts into replay items as it cuts an
actor's blocks. A lane outlives its episode: the next episode to start takes a free lane and
continues its block, as an env of a vector resets and goes on, so a block may hold the end of
one episode and the start of the next (``terminated`` or ``truncated`` between them).

A step is whole when the client says what followed the action: the next ``GetAction`` (the
episode goes on), or ``EndEpisode`` (terminated, or ``truncated`` and still bootstrapping). Its
reward is the sum of the ``LogReturns`` since the action.

A synchronous core (PPO) acts with one weights version per unroll: a lane whose block holds
steps of an older version than the step added starts its block again, and once this server has
cut its share of a version's rollout (``share`` unrolls), further steps of that version are
dropped (``Lanes.dropped_steps``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from apexrl.acting.step_block import StepBlock
from apexrl.algos import ActorCore


@dataclass
class Lane:
    block: StepBlock
    version: int = -2  # the weights version of the block's steps (synchronous cores)
    steps_since_cut: int = 0  # steps added since the block was last cut


@dataclass
class PendingStep:
    """An action sent, waiting for what followed it."""

    obs: np.ndarray
    action: np.ndarray
    extras: dict[str, np.ndarray]
    version: int
    reward: float = 0.0


@dataclass
class Episode:
    lane: Lane | None  # None: a training-disabled episode, whose steps are not stored
    pending: PendingStep | None = None
    episode_return: float = 0.0
    length: int = 0


@dataclass
class CutItems:
    """What a full lane block gave: the core's items, their priorities, the env steps they
    hold and the newest weights version among them."""

    fields: dict[str, np.ndarray]
    priorities: np.ndarray | None
    env_steps: int
    weights_version: int


@dataclass
class Lanes:
    """The open episodes (by id) and the lanes they step in."""

    core: ActorCore
    share: int  # unrolls of one version a synchronous core cuts
    episodes: dict[str, Episode] = field(default_factory=dict)
    free: list[Lane] = field(default_factory=list)
    cut_per_version: Counter = field(default_factory=Counter)
    dropped_steps: int = 0
    stored_steps: int = 0

    def start(self, episode_id: str, training: bool) -> None:
        lane = None
        if training:
            lane = self.free.pop() if self.free else Lane(self._new_block())
        self.episodes[episode_id] = Episode(lane)

    def _new_block(self) -> StepBlock:
        return StepBlock(self.core.block_steps, self.core.block_overlap)

    def share_full(self, version: int) -> bool:
        return self.core.synchronous and self.cut_per_version[version] >= self.share

    def follow(
        self, episode: Episode, next_obs: np.ndarray, terminated: bool, truncated: bool
    ) -> CutItems | None:
        """The episode's pending step is whole: store it; the items when its block is full."""
        step, episode.pending = episode.pending, None
        if step is None:
            return None
        episode.episode_return += step.reward
        episode.length += 1
        lane = episode.lane
        if lane is None:
            return None
        return self._add(lane, step, next_obs, terminated, truncated)

    def _add(
        self, lane: Lane, step: PendingStep, next_obs: np.ndarray, terminated: bool, truncated: bool
    ) -> CutItems | None:
        block = lane.block
        if self.core.synchronous:
            if self.share_full(step.version):
                self.dropped_steps += 1
                return None
            if block.size > 0 and lane.version != step.version:
                self.dropped_steps += block.size
                block.clear()  # another version's steps: the unroll starts again
                lane.steps_since_cut = 0
            lane.version = step.version
        extras = {**step.extras, "weights_version": np.array(step.version, np.int64)}
        block.add_one(step.obs, step.action, step.reward, terminated, truncated, next_obs, extras)
        lane.steps_since_cut += 1
        self.stored_steps += 1
        if not block.full:
            return None
        newest = int(block.arrays["weights_version"].max())
        fields, priorities = self.core.items(block)
        held_before = block.size - lane.steps_since_cut
        block.keep_overlap()
        # The steps the items account for: those added, less those the block holds for its
        # next items (an n-step window's last steps), which the next chunk claims.
        env_steps = lane.steps_since_cut - (block.size - held_before)
        lane.steps_since_cut = 0
        if not fields or len(next(iter(fields.values()))) == 0:
            return None
        self.cut_per_version[newest] += 1
        return CutItems(fields, priorities, env_steps, newest)

    def end(self, episode_id: str) -> Episode:
        """Close an episode whose last step was followed; its lane is free again."""
        episode = self.episodes.pop(episode_id)
        if episode.lane is not None:
            self.free.append(episode.lane)
        return episode

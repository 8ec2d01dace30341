"""One network policy's lanes in a multi-agent actor: the agent slots it plays, each with its own
steps, cut into the policy's replay items by its actor core.

A single-agent actor's ``B`` envs step together, so its step block is ``[T, B]``. A policy's agents
do not: in a turn-based game each acts on its own turn, agents come and go, and an agent's step is
whole only when what followed its action is known (its next turn, or its end). So each agent of an
episode plays in a *lane* of its policy, taken when the agent first acts and given back when it is
done; the next agent to start takes a free lane and continues its steps, as an env of a vector
resets and goes on (``terminated`` or ``truncated`` lies between them). Lanes live in one ragged
block ``[T, L]`` whose lanes fill at their own pace (``size[L]``): a decision stores the lane's
pending step (observation, action, the core's extras, the legal actions), its outcome completes
it (reward, flags, next observation and its legal actions) and writes it at the lane's own time
index. Lanes that are full are cut together, as one ``[T, F]`` block, by the policy's actor core
(``core.items``), and keep the core's overlap; where every agent acts every step (a Parallel env
whose agents stay), all lanes fill on the same step and one cut takes them all, as in a
single-agent actor.

The core's extras of a step are stored with it, with ``weights_version``, and, for a policy whose
agents bring legal-action masks, ``action_mask`` (at ``obs``) and ``next_action_mask`` (at
``next_obs``), which the Q-learners' targets and the policy gradients' log-probabilities read.

A synchronous core (PPO) trains on one unroll per lane and weights version: a lane whose steps are
of an older version than the step completed starts again, and once ``num_lanes`` unrolls of a
version are cut, its later steps are dropped (``dropped_steps``) until the actor has newer weights.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from apexrl.acting.step_block import StepBlock
from apexrl.algos import ActorCore

STEP_FIELDS = ("obs", "action", "reward", "terminated", "truncated", "next_obs")


@dataclass
class CutItems:
    """What a cut gave: the core's items, their priorities and the newest weights version among
    their steps."""

    fields: dict[str, np.ndarray]
    priorities: np.ndarray | None
    weights_version: int
    num_lanes: int  # lanes cut


class PolicyLanes:
    """``num_lanes`` lanes of one network policy (module docstring)."""

    def __init__(self, core: ActorCore, num_lanes: int, masked: bool) -> None:
        self.core, self.num_lanes, self.masked = core, num_lanes, masked
        self.num_steps, self.overlap = core.block_steps, core.block_overlap
        self.synchronous = core.synchronous
        self.size = np.zeros(num_lanes, dtype=np.int64)
        self.arrays: dict[str, np.ndarray] = {}  # [T, L, ...]; allocated by the first step
        self.extra_names: tuple[str, ...] = ()
        self.pending: dict[str, np.ndarray] = {}  # [L, ...]: each lane's step waiting its outcome
        self.has_pending = np.zeros(num_lanes, dtype=bool)
        self.lane_version = np.full(num_lanes, -2, dtype=np.int64)  # synchronous cores
        self.cut_per_version: Counter = Counter()
        self.dropped_steps = 0
        self.stored_steps = 0

    def release(self, lane: int) -> None:
        """The lane's agent is done (its last step completed, or its episode ended without it):
        a step it still had pending is dropped."""
        self.has_pending[lane] = False

    # --- steps ---------------------------------------------------------------------------------

    def acted(
        self,
        lanes: np.ndarray,
        obs: np.ndarray,
        action: np.ndarray,
        extras: dict[str, np.ndarray],
        mask: np.ndarray | None,
        version: int,
    ) -> None:
        """Lanes ``lanes`` [n] acted: their pending steps, completed by ``completed``."""
        values = {"obs": obs, "action": action, **extras}
        values["weights_version"] = np.full(len(lanes), version, dtype=np.int64)
        if self.masked:
            values["action_mask"] = mask
        if not self.pending:
            self.pending = {
                name: np.zeros((self.num_lanes, *np.shape(v)[1:]), dtype=np.asarray(v).dtype)
                for name, v in values.items()
            }
        for name, value in values.items():
            self.pending[name][lanes] = value
        self.has_pending[lanes] = True

    def completed(
        self,
        lanes: np.ndarray,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        next_obs: np.ndarray,
        next_mask: np.ndarray | None,
    ) -> None:
        """What followed the pending steps of ``lanes`` [n]: store the whole steps."""
        keep = self.has_pending[lanes].copy()  # a lane that never acted has no step to complete
        if not keep.any():
            return
        self.has_pending[lanes] = False
        if self.synchronous:
            keep[keep] = self._current(lanes[keep])
        if not keep.any():
            return
        lanes = lanes[keep]
        step = {name: value[lanes] for name, value in self.pending.items()}
        step["reward"] = np.asarray(reward, dtype=np.float32)[keep]
        step["terminated"] = np.asarray(terminated, dtype=bool)[keep]
        step["truncated"] = np.asarray(truncated, dtype=bool)[keep]
        step["next_obs"] = next_obs[keep]
        if self.masked:
            step["next_action_mask"] = next_mask[keep]
        if not self.arrays:
            self._allocate(step)
        times = self.size[lanes]
        for name, array in self.arrays.items():
            array[times, lanes] = step[name]
        self.size[lanes] = times + 1
        self.stored_steps += len(lanes)

    def _allocate(self, step: dict[str, np.ndarray]) -> None:
        self.extra_names = tuple(name for name in step if name not in STEP_FIELDS)
        self.arrays = {
            name: np.zeros((self.num_steps, self.num_lanes, *v.shape[1:]), dtype=v.dtype)
            for name, v in step.items()
        }

    def _current(self, lanes: np.ndarray) -> np.ndarray:
        """Synchronous cores: which of the steps pending in ``lanes`` (distinct) are kept. A
        step of a version whose share is cut is dropped; a lane holding steps of another version
        than its step's starts again."""
        versions = self.pending["weights_version"][lanes]
        cut = [v for v in np.unique(versions).tolist() if self.share_full(v)]
        keep = ~np.isin(versions, cut)
        stale = keep & (self.size[lanes] > 0) & (self.lane_version[lanes] != versions)
        self.dropped_steps += int((~keep).sum()) + int(self.size[lanes[stale]].sum())
        self.size[lanes[stale]] = 0  # another version's steps: the unroll starts again
        self.lane_version[lanes[keep]] = versions[keep]
        return keep

    def share_full(self, version: int) -> bool:
        """A synchronous core has cut one unroll per lane of ``version``."""
        return self.synchronous and self.cut_per_version[version] >= self.num_lanes

    # --- cutting -------------------------------------------------------------------------------

    def _within_share(self, full: np.ndarray) -> np.ndarray:
        """Synchronous cores: the full lanes whose unrolls the share of their version still
        takes. A version's share is ``num_lanes`` unrolls, whichever lanes fill them (where a
        policy plays one seat of a turn-based game, half its lanes stay free and the others fill
        two each): more would reach the learner after its rollout, stale, and leave the
        learner's next rollout short of what its fixed-size batches take. A full lane left out
        is dropped by its next step (``_current``)."""
        if len(full) == 0:
            return full
        versions = self.lane_version[full]
        keep = np.zeros(len(full), dtype=bool)
        for version in np.unique(versions).tolist():
            room = max(self.num_lanes - self.cut_per_version[version], 0)
            keep[np.flatnonzero(versions == version)[:room]] = True
        return full[keep]

    def cut(self) -> CutItems | None:
        """The items of every full lane, cut as one block; None when no lane is full or the core
        cut no item yet."""
        full = np.flatnonzero(self.size == self.num_steps)
        if self.synchronous:
            full = self._within_share(full)
        if len(full) == 0:
            return None
        arrays = {name: array[:, full] for name, array in self.arrays.items()}  # copies
        block = StepBlock.of(arrays, self.extra_names, self.overlap)
        newest = int(arrays["weights_version"].max())
        fields, priorities = self.core.items(block, rows=full)
        if self.overlap:
            kept = slice(self.num_steps - self.overlap, self.num_steps)
            for array in self.arrays.values():
                array[: self.overlap, full] = array[kept, full]
        self.size[full] = self.overlap
        if not fields or len(next(iter(fields.values()))) == 0:
            return None
        if self.synchronous:
            self.cut_per_version[newest] += len(full)
        return CutItems(fields, priorities, newest, len(full))

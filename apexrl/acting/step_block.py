"""Time-major step storage of an actor: ``[T, B, ...]`` arrays allocated from one example step.

An actor adds one vector step at a time; when the block is full, the algorithm's actor core cuts
replay items from it (n-step transitions, unrolls, sequences) and the block keeps its last
``overlap`` steps, whose items end in the next block. Any observation and action dtype and shape
work, and so do any per-step ``extras`` an actor core returns with its actions (Q of the action
taken, behaviour log-probability, value, recurrent state): the arrays are allocated from the first
step added (rlpyt's ``buffer_from_example``).

==========  ====================  ===========================================================
field       shape                 meaning
==========  ====================  ===========================================================
obs         [T, B, *obs]          the observation each action was chosen on
action      [T, B, *action]       the action taken
reward      [T, B] float32        the reward of the step
terminated  [T, B] bool           the step reached a terminal state (no bootstrap)
truncated   [T, B] bool           the episode was cut off after the step (still bootstraps)
next_obs    [T, B, *obs]          the observation the step led to (the final one at an end)
extras      {name: [T, B, ...]}   what the actor core returned with the actions, and the
                                  ``weights_version`` [T, B] int64 that chose them (the
                                  generic actor adds it: on-policy learners need it)
==========  ====================  ===========================================================
"""

from __future__ import annotations

import numpy as np

from apexrl.envs import VectorStep


class StepBlock:
    """``num_steps`` vector steps of ``num_envs`` envs; the last ``overlap`` are kept on a cut."""

    def __init__(self, num_steps: int, overlap: int) -> None:
        if not 0 <= overlap < num_steps:
            raise ValueError(f"overlap must be in [0, {num_steps}), got {overlap}")
        self.num_steps, self.overlap = num_steps, overlap
        self.arrays: dict[str, np.ndarray] = {}  # allocated by the first add()
        self.extra_names: tuple[str, ...] = ()
        self._extra_keys: frozenset[str] = frozenset()
        self.size = 0

    @property
    def full(self) -> bool:
        return self.size == self.num_steps

    @property
    def obs(self) -> np.ndarray:
        return self.arrays["obs"]

    @property
    def action(self) -> np.ndarray:
        return self.arrays["action"]

    @property
    def reward(self) -> np.ndarray:
        return self.arrays["reward"]

    @property
    def terminated(self) -> np.ndarray:
        return self.arrays["terminated"]

    @property
    def truncated(self) -> np.ndarray:
        return self.arrays["truncated"]

    @property
    def next_obs(self) -> np.ndarray:
        return self.arrays["next_obs"]

    @property
    def extras(self) -> dict[str, np.ndarray]:
        return {name: self.arrays[name] for name in self.extra_names}

    def add(
        self, obs: np.ndarray, action: np.ndarray, step: VectorStep, extras: dict[str, np.ndarray]
    ) -> None:
        """Store one vector step: ``obs`` and ``action`` ``[B, ...]``, the env's ``step``."""
        if not self.arrays:
            self._allocate(obs, action, step, extras)
        elif extras.keys() != self._extra_keys:
            raise ValueError(f"step extras {sorted(extras)} differ from {sorted(self.extra_names)}")
        t = self.size
        arrays = self.arrays
        arrays["obs"][t] = obs
        arrays["action"][t] = action
        arrays["reward"][t] = step.reward
        arrays["terminated"][t] = step.terminated
        arrays["truncated"][t] = step.truncated
        arrays["next_obs"][t] = step.next_obs
        for name, value in extras.items():
            arrays[name][t] = value
        self.size = t + 1

    def _allocate(
        self, obs: np.ndarray, action: np.ndarray, step: VectorStep, extras: dict[str, np.ndarray]
    ) -> None:
        values = {
            "obs": obs,
            "action": action,
            "reward": step.reward,
            "terminated": step.terminated,
            "truncated": step.truncated,
            "next_obs": step.next_obs,
        }
        clash = values.keys() & extras.keys()
        if clash:
            raise ValueError(f"extras may not be named like a step field: {sorted(clash)}")
        values.update(extras)
        self.extra_names = tuple(extras)
        self._extra_keys = frozenset(extras)
        self.arrays = {
            name: np.zeros((self.num_steps, *np.shape(v)), dtype=np.asarray(v).dtype)
            for name, v in values.items()
        }

    @classmethod
    def of(
        cls, arrays: dict[str, np.ndarray], extra_names: tuple[str, ...], overlap: int
    ) -> StepBlock:
        """A full block over ``arrays`` (``[T, B, ...]`` each, the step fields and
        ``extra_names``): the steps of several lanes gathered for one cut
        (``apexrl.multiagent.lanes``)."""
        block = cls(len(next(iter(arrays.values()))), overlap)
        block.arrays = arrays
        block.extra_names = tuple(extra_names)
        block._extra_keys = frozenset(extra_names)
        block.size = block.num_steps
        return block

    def add_one(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: float,
        terminated: bool,
        truncated: bool,
        next_obs: np.ndarray,
        extras: dict[str, np.ndarray],
    ) -> None:
        """One step of a block of one env (``B = 1``) from that env's own values: the steps of
        a policy server's external episodes and of a dataset's episodes."""
        step = VectorStep(
            next_obs[None],
            next_obs[None],
            np.array([reward], np.float32),
            np.array([terminated]),
            np.array([truncated]),
        )
        one = {name: np.asarray(value)[None] for name, value in extras.items()}
        self.add(obs[None], np.asarray(action)[None], step, one)

    def clear(self) -> None:
        """Drop every step held (an unroll that has to start again)."""
        self.size = 0

    def keep_overlap(self) -> None:
        """After items were cut: keep the last ``overlap`` steps at the front."""
        for array in self.arrays.values():
            array[: self.overlap] = array[self.size - self.overlap : self.size]
        self.size = self.overlap

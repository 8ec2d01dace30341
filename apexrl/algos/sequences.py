"""Cutting each env's stream of steps into fixed-length, overlapping sequences (R2D2's replay unit).

Reference: Kapturowski et al. 2019, sec. 3: sequences of ``length`` steps, adjacent ones overlapping
by ``overlap`` steps, never crossing an episode end; each starts with the recurrent state the actor
had at its first step ("stored state").

Each env has its own sequence in progress, because episodes end at different steps in different
envs. A sequence is emitted when it holds ``length`` steps (the next one starts with its last
``overlap`` steps, mid-episode) or when the episode ends (it is padded to ``length`` and masked; the
next one starts empty at the new episode's first step, whose stored state is the exact zero state).

The builder keeps the sequences in progress per *lane*: an env of a vector that steps together, or
an agent slot of a multi-agent actor that adds the steps of some of its lanes at a time (``add``'s
``rows``). A lane's sequences depend on its own steps only, however they are grouped with other
lanes' steps.

An emitted sequence, with ``L = length`` and ``k`` valid steps:

===============  ==================  ========================================================
field            shape               meaning
===============  ==================  ========================================================
obs              [L + 1, *obs]       the observation of each step, then at ``k`` the one the
                                     last step led to (the final one at an episode end); zeros
                                     after
mask             [L] bool            the first ``k`` steps are real, the rest padding
starts_episode   [] bool             step 0 is its episode's first step
<next field>     [L + 1, ...]        a field passed per step with its value after the step
                                     (``next_fields``: a legal-action mask, whose value at
                                     ``k`` is that of the observation the last step led to),
                                     laid out like ``obs``
<step field>     [L, ...]            every other field passed per step (action, reward, ...),
                                     zero-padded
<start field>    [...]               fields named in ``start_fields``: their value at step 0
                                     only (stored recurrent state, previous action and reward)
===============  ==================  ========================================================
"""

from __future__ import annotations

import numpy as np


class SequenceBuilder:
    """Per-lane sequences in progress; ``add`` one step of some lanes (one vector step: all of
    them), get the sequences it completed. ``num_envs`` lanes to begin with; a lane beyond them
    is added with an empty sequence at an episode's start."""

    def __init__(
        self, num_envs: int, length: int, overlap: int, start_fields: tuple[str, ...] = ()
    ) -> None:
        if length < 1:
            raise ValueError(f"length must be >= 1, got {length}")
        if not 0 <= overlap < length:
            raise ValueError(f"overlap must be in [0, {length}), got {overlap}")
        self.num_envs, self.length, self.overlap = num_envs, length, overlap
        self.start_fields = start_fields
        self.buffers: dict[str, np.ndarray] = {}  # name -> [lanes, L, ...], allocated by add()
        self.count = np.zeros(num_envs, dtype=np.int64)  # steps in each lane's sequence
        self.starts_episode = np.ones(num_envs, dtype=bool)

    def add(
        self,
        fields: dict[str, np.ndarray],
        next_obs: np.ndarray,
        ended: np.ndarray,
        next_fields: dict[str, np.ndarray] | None = None,
        rows: np.ndarray | None = None,
    ) -> list[dict[str, np.ndarray]]:
        """Store one step of each of ``B`` lanes and return the sequences it completed, in the
        order of the lanes given.

        Args:
            fields: ``[B, ...]`` per field; must include ``obs``.
            next_obs: ``[B, *obs]``, the observation each step led to (final one at an end).
            ended: bool ``[B]``, the step ended its episode (terminated or truncated).
            next_fields: ``[B, ...]`` per field of ``fields`` that, like ``obs``, also keeps its
                value after the step (a legal-action mask: that of ``next_obs``).
            rows: int ``[B]``, the distinct lanes the steps are of (None: lanes ``0 .. B - 1``).
        """
        lanes = np.arange(len(ended)) if rows is None else np.asarray(rows, dtype=np.int64)
        if len(lanes) and lanes.max() >= self.num_envs:
            self._grow(int(lanes.max()) + 1)
        if not self.buffers:
            self.buffers = {
                name: np.zeros((self.num_envs, self.length, *np.shape(v)[1:]), np.asarray(v).dtype)
                for name, v in fields.items()
            }
        count = self.count[lanes]
        for name, value in fields.items():
            self.buffers[name][lanes, count] = value
        count += 1
        self.count[lanes] = count
        done = np.flatnonzero(ended | (count == self.length))
        after = {"obs": next_obs, **(next_fields or {})}
        sequences = [self._emit(lanes[i], {name: v[i] for name, v in after.items()}) for i in done]
        for i in done:
            lane = lanes[i]
            if ended[i]:
                self.count[lane], self.starts_episode[lane] = 0, True
            else:
                for buffer in self.buffers.values():
                    buffer[lane, : self.overlap] = buffer[lane, self.length - self.overlap :]
                self.count[lane], self.starts_episode[lane] = self.overlap, False
        return sequences

    def _grow(self, num_lanes: int) -> None:
        """Lanes up to ``num_lanes``, the new ones empty at an episode's start."""
        extra = num_lanes - self.num_envs
        self.buffers = {
            name: np.concatenate([b, np.zeros((extra, *b.shape[1:]), b.dtype)])
            for name, b in self.buffers.items()
        }
        self.count = np.concatenate([self.count, np.zeros(extra, dtype=np.int64)])
        self.starts_episode = np.concatenate([self.starts_episode, np.ones(extra, dtype=bool)])
        self.num_envs = num_lanes

    def _emit(self, env: int, after: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The sequence of lane ``env``; ``after``: the values after its last step (``obs``: the
        observation it led to)."""
        k = int(self.count[env])
        item: dict[str, np.ndarray] = {}
        for name, buffer in self.buffers.items():
            if name in self.start_fields:
                item[name] = buffer[env, 0].copy()
                continue
            extra = 1 if name in after else 0
            padded = np.zeros((self.length + extra, *buffer.shape[2:]), buffer.dtype)
            padded[:k] = buffer[env, :k]
            if name in after:
                padded[k] = after[name]
            item[name] = padded
        item["mask"] = np.arange(self.length) < k
        item["starts_episode"] = np.asarray(self.starts_episode[env])
        return item


def stack_sequences(sequences: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """``N`` sequences -> fields ``[N, ...]`` (empty dict for none)."""
    if not sequences:
        return {}
    return {name: np.stack([s[name] for s in sequences]) for name in sequences[0]}

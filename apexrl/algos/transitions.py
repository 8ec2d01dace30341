"""n-step transitions cut from an actor's ``StepBlock``: the replay items of Ape-X DQN and of the
Q-function policy gradients (DDPG, TD3, SAC), whatever the action (a Discrete index or a Box
vector).

=============  ==================  =====================================================
field          shape, dtype        meaning
=============  ==================  =====================================================
obs            [N, *obs]           observation s_t, in the env's dtype
action         [N, *action]        a_t: int64 (Discrete) or float32 (Box, in [-1, 1])
reward         [N] float32         sum_{k<m} gamma^k r_{t+k}
num_steps      [N] int64           m, the window length (<= n; shorter at episode ends)
terminated     [N] bool            the window ended by termination: no bootstrap
truncated      [N] bool            the window ended by truncation: still bootstraps
next_obs       [N, *obs]           s_{t+m} (the final observation at an episode end)
=============  ==================  =====================================================

With ``action_mask`` (a turn-based game's legal actions, ``algo.action_mask``), a transition also
holds ``next_action_mask`` [N, A] bool: the legal actions at its ``next_obs``, taken from the
block's ``next_action_mask`` extra (the mask of each step's ``next_obs``) at the same step.

The block holds ``chunk_steps + n - 1`` steps; the first ``chunk_steps`` start a transition
(``targets.n_step_window`` shortens windows at episode ends), the last ``n - 1`` are kept for the
next block. Items are copies: the block's storage is overwritten by ``keep_overlap()`` and later
steps.
"""

from __future__ import annotations

import numpy as np
import torch

from apexrl.acting.step_block import StepBlock
from apexrl.math import targets


def cut_transitions(
    block: StepBlock, gamma: float, n: int, action_mask: bool = False
) -> dict[str, np.ndarray]:
    """The block's n-step transitions (see the module docstring), env-major within each step;
    with ``action_mask``, their ``next_action_mask`` too."""
    window = targets.n_step_window(
        torch.from_numpy(block.reward),
        torch.from_numpy(block.terminated),
        torch.from_numpy(block.truncated),
        gamma,
        n,
    )
    num_starts, num_envs = window.reward.shape
    flat = num_starts * num_envs
    obs_shape = block.obs.shape[2:]
    action = block.action[:num_starts]
    integer = np.issubdtype(action.dtype, np.integer)
    # Fancy indexing copies: the items own their next_obs.
    last = window.bootstrap_index.numpy(), np.arange(num_envs)[None, :]
    next_obs = block.next_obs[last]
    fields = {
        "obs": block.obs[:num_starts].reshape(flat, *obs_shape).copy(),
        "action": action.reshape(flat, *action.shape[2:]).astype(
            np.int64 if integer else np.float32
        ),
        "reward": window.reward.numpy().reshape(flat).astype(np.float32),
        "num_steps": window.num_steps.numpy().reshape(flat).astype(np.int64),
        "terminated": window.terminated.numpy().reshape(flat),
        "truncated": window.truncated.numpy().reshape(flat),
        "next_obs": next_obs.reshape(flat, *obs_shape),
    }
    if action_mask:  # the mask of next_obs: the window's last step's
        next_mask = block.extras["next_action_mask"][last]
        next_mask = next_mask.reshape(flat, next_mask.shape[-1])
        fields["next_action_mask"] = next_mask.astype(np.bool_, copy=False)
    return fields

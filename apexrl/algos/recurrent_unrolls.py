"""Memory for IMPALA and PPO (``algo.lstm_size`` > 0): the actor carries each env's LSTM state
across steps and chunks and zeroes it at an episode's start; each unroll carries the state it
started from; the learner unrolls the network from there over the unroll's ``T`` steps, zeroing
the state after every episode end inside it.

An unroll item holds ``algos.actor_critic``'s fields and, at its first step only:

================  ======================  ==============================================
field             shape, dtype            meaning
================  ======================  ==============================================
recurrent_state   [N, 2, H] float32       the actor's LSTM (h, c) before step 0
prev_action       [N, *action]            the action before step 0 (0 at an episode start)
prev_reward       [N] float32             the reward before step 0 (0 at an episode start)
================  ======================  ==============================================

The inputs of the later steps follow from the unroll itself (``previous_inputs``): step ``t``
reads action ``t - 1`` and reward ``t - 1`` and goes on from the state after ``t - 1``, unless
step ``t - 1`` ended its episode, where the state and both inputs start from zero.

An actor core keeps one state, previous action and previous reward per *lane*: an env of a vector
that steps together (``rows`` None: lanes ``0 .. B - 1``), or an agent slot of a multi-agent actor
that acts for some of its lanes at a time (``rows``: their indices). The lane functions here
(``lane_inputs``, ``with_lane_state``, ``grown_lanes``, ``observed_lanes``) are R2D2's actor's too.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from apexrl.acting.step_block import StepBlock
from apexrl.algos.actor_critic import START_FIELDS, PolicyActorCore, next_values, unroll_items
from apexrl.envs import VectorStep
from apexrl.models import LSTMState, PolicyValueOutput, RecurrentActorCritic
from apexrl.models.recurrent import zero_where


def previous_inputs(
    action: Tensor,
    reward: Tensor,
    ended: Tensor,
    prev_action: Tensor,
    prev_reward: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """Each step's previous action, previous reward and reset flag, for unrolls ``[T, N, ...]``.

    Args:
        action: ``[T, N, *action]``; reward, ended: ``[T, N]``.
        prev_action: ``[N, *action]``, prev_reward: ``[N]``: the unroll's start inputs.

    Returns ``(prev_action [T, N, *action], prev_reward [T, N], reset [T, N] bool)``: step 0
    takes the start inputs and no reset (the stored state already is the episode's); step
    ``t > 0`` takes ``action[t - 1]`` and ``reward[t - 1]``, both zero with a reset where step
    ``t - 1`` ended its episode.
    """
    ended = ended.bool()
    reset = torch.zeros_like(ended)
    reset[1:] = ended[:-1]
    keep = ~reset
    actions = torch.cat([prev_action.unsqueeze(0), action[:-1]])
    rewards = torch.cat([prev_reward.unsqueeze(0).to(reward.dtype), reward[:-1]])
    mask = keep.view(*keep.shape, *([1] * (actions.dim() - 2)))
    return actions * mask.to(actions.dtype), rewards * keep.to(rewards.dtype), reset


def start_state(recurrent_state: Tensor) -> LSTMState:
    """An item's stored ``[N, 2, H]`` state as the network's ``LSTMState``."""
    state = recurrent_state.float()
    return LSTMState(state[:, 0].contiguous(), state[:, 1].contiguous())


def recurrent_outputs(network: RecurrentActorCritic, f: dict[str, Tensor]):
    """The network unrolled over time-major unrolls ``f`` (``[T, N, ...]``, the start fields
    ``[N, ...]``) from their stored states: a ``models.RecurrentUnroll``."""
    ended = f["terminated"].bool() | f["truncated"].bool()
    prev_action, prev_reward, reset = previous_inputs(
        f["action"], f["reward"], ended, f["prev_action"], f["prev_reward"]
    )
    return network(f["obs"], prev_action, prev_reward, reset, start_state(f["recurrent_state"]))


def recurrent_next_values(
    network: RecurrentActorCritic, f: dict[str, Tensor], values: Tensor, states: LSTMState
) -> Tensor:
    """``V(next_obs[t])`` with the state after step ``t``: ``values[t + 1]`` where step
    ``t + 1`` goes on from step ``t`` (``next_obs[t]`` is ``obs[t + 1]`` and the episode did not
    end), one LSTM step from ``states[t]`` on ``next_obs[t]`` (with action ``t`` and reward
    ``t`` as its previous inputs) for the rest: each unroll's last step and the episode ends."""
    obs, next_obs = f["obs"], f["next_obs"]
    ended = f["terminated"].bool() | f["truncated"].bool()
    same = torch.zeros(next_obs.shape[:2], dtype=torch.bool, device=next_obs.device)
    same[:-1] = (next_obs[:-1] == obs[1:]).flatten(2).all(-1) & ~ended[:-1]
    out = torch.empty_like(values)
    out[:-1] = values[1:]
    fresh = (~same).nonzero(as_tuple=True)
    if len(fresh[0]):
        state = LSTMState(states.h[fresh], states.c[fresh])
        step = network(
            next_obs[fresh].unsqueeze(0),
            f["action"][fresh].unsqueeze(0),
            f["reward"][fresh].unsqueeze(0),
            torch.zeros(1, len(fresh[0]), dtype=torch.bool, device=next_obs.device),
            state,
        )
        out[fresh] = step.out.value[0].to(out.dtype)
    return out


def outputs_and_next_values(
    network: nn.Module, f: dict[str, Tensor]
) -> tuple[PolicyValueOutput, Tensor]:
    """The policy-and-value outputs of time-major unrolls ``f`` and ``V(next_obs)`` (no
    gradient), for a feed-forward network or a recurrent one."""
    if isinstance(network, RecurrentActorCritic):
        unrolled = recurrent_outputs(network, f)
        with torch.no_grad():
            states = LSTMState(unrolled.states.h.detach(), unrolled.states.c.detach())
            v_t = recurrent_next_values(network, f, unrolled.out.value.detach(), states)
        return unrolled.out, v_t
    out = network(f["obs"])
    with torch.no_grad():
        v_t = next_values(out.value.detach(), f["obs"], f["next_obs"], network)
    return out, v_t


def policy_outputs(network: nn.Module, f: dict[str, Tensor]) -> PolicyValueOutput:
    """The outputs alone (PPO's minibatches: whole unrolls for a recurrent network)."""
    if isinstance(network, RecurrentActorCritic):
        return recurrent_outputs(network, f).out
    return network(f["obs"])


# --- lanes: the per-lane memory of a recurrent actor core -----------------------------------------


def lane_inputs(
    state: LSTMState, prev_action: np.ndarray, prev_reward: np.ndarray, rows: np.ndarray | None
) -> tuple[LSTMState, np.ndarray, np.ndarray]:
    """The state ``[B, H]``, previous actions and rewards ``[B, ...]`` of lanes ``rows`` (int
    ``[B]``; None: all lanes, the arrays themselves)."""
    if rows is None:
        return state, prev_action, prev_reward
    index = torch.as_tensor(rows, device=state.h.device)
    return LSTMState(state.h[index], state.c[index]), prev_action[rows], prev_reward[rows]


def with_lane_state(state: LSTMState, rows: np.ndarray, new: LSTMState) -> LSTMState:
    """``state`` of all lanes with the rows of lanes ``rows`` (int ``[B]``) replaced by ``new``
    ``[B, H]``; the other lanes' rows unchanged."""
    index = torch.as_tensor(rows, device=state.h.device)
    return LSTMState(state.h.index_copy(0, index, new.h), state.c.index_copy(0, index, new.c))


def grown_lanes(
    state: LSTMState,
    prev_action: np.ndarray,
    prev_reward: np.ndarray,
    fresh: tuple[LSTMState, np.ndarray],
) -> tuple[LSTMState, np.ndarray, np.ndarray]:
    """The lanes' state, previous actions and rewards followed by new lanes at an episode's start:
    ``fresh``, the network's initial state and zero actions for them (zero rewards)."""
    fresh_state, fresh_action = fresh
    grown = LSTMState(torch.cat([state.h, fresh_state.h]), torch.cat([state.c, fresh_state.c]))
    zero_rewards = np.zeros(len(fresh_action), dtype=prev_reward.dtype)
    return (
        grown,
        np.concatenate([prev_action, fresh_action.astype(prev_action.dtype)]),
        np.concatenate([prev_reward, zero_rewards]),
    )


def observed_lanes(
    state: LSTMState | None,
    prev_action: np.ndarray,
    prev_reward: np.ndarray,
    action: np.ndarray,
    step: VectorStep,
    rows: np.ndarray | None,
) -> tuple[LSTMState | None, np.ndarray, np.ndarray]:
    """The lanes' memory after lanes ``rows`` (int ``[B]``; None: all lanes, in order) took
    ``action`` ``[B, ...]`` and got ``step``: their previous action and reward are these, and
    where the episode ended the state and both are zero (the next input is an episode's first).
    With ``rows``, the arrays must hold those lanes already (they are updated in place)."""
    ended = step.terminated | step.truncated
    if rows is None:
        prev_action = np.asarray(action, dtype=prev_action.dtype).copy()
        prev_reward = step.reward.astype(np.float32).copy()
        if ended.any() and state is not None:
            state = zero_where(state, torch.as_tensor(ended, device=state.h.device))
            prev_action[ended], prev_reward[ended] = 0, 0.0
        return state, prev_action, prev_reward
    prev_action[rows] = np.asarray(action, dtype=prev_action.dtype)
    prev_reward[rows] = step.reward
    if ended.any():
        done = rows[ended]
        index = torch.as_tensor(done, device=state.h.device)
        state = LSTMState(state.h.index_fill(0, index, 0.0), state.c.index_fill(0, index, 0.0))
        prev_action[done], prev_reward[done] = 0, 0.0
    return state, prev_action, prev_reward


class RecurrentPolicyActorCore(PolicyActorCore):
    """``PolicyActorCore`` with each lane's LSTM state, previous action and reward kept across
    steps (and chunks) and zeroed where an episode ended; each step's are stored as extras,
    and an unroll takes those of its first step. Given ``rows``, it acts for those lanes only
    and leaves the others' memory as it is (the module docstring's lanes)."""

    def __init__(self, network: RecurrentActorCritic, *args, **kwargs) -> None:
        super().__init__(network, *args, **kwargs)
        self.state: LSTMState | None = None  # [L, H] each, allocated at the first act()
        self.prev_action = np.zeros(0, dtype=np.int64)
        self.prev_reward = np.zeros(0, dtype=np.float32)

    def _start(self, num_envs: int) -> None:
        net = self.network
        self.state = net.initial_state(num_envs, self.device)
        self.prev_action = net.zero_actions(num_envs)
        self.prev_reward = np.zeros(num_envs, dtype=np.float32)

    def _grow(self, num_lanes: int) -> None:
        """Lanes up to ``num_lanes``, the new ones at an episode's start."""
        if self.state is None:
            self._start(num_lanes)
            return
        extra = num_lanes - len(self.state.h)
        if extra > 0:
            fresh = self.network.initial_state(extra, self.device), self.network.zero_actions(extra)
            self.state, self.prev_action, self.prev_reward = grown_lanes(
                self.state, self.prev_action, self.prev_reward, fresh
            )

    def policy(self, obs: Tensor, rows: np.ndarray | None = None) -> PolicyValueOutput:
        """One step of lanes ``rows`` (None: all) from their state (``act`` starts it); their
        state moves on."""
        state, prev_action, prev_reward = lane_inputs(
            self.state, self.prev_action, self.prev_reward, rows
        )
        unrolled = self.network(
            obs.unsqueeze(0),
            torch.as_tensor(prev_action, device=self.device).unsqueeze(0),
            torch.as_tensor(prev_reward, device=self.device).unsqueeze(0),
            torch.zeros(1, len(obs), dtype=torch.bool, device=self.device),
            state,
        )
        new = LSTMState(unrolled.states.h[0], unrolled.states.c[0])
        self.state = new if rows is None else with_lane_state(self.state, rows, new)
        return type(unrolled.out)(*(x[0] for x in unrolled.out))

    def act(
        self, obs: np.ndarray, mask: np.ndarray | None = None, rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``PolicyActorCore.act`` from each lane's state, which moves on one step; ``rows``
        int ``[B]``: the lanes of ``obs`` (None: lanes ``0 .. B - 1``, and a batch of another
        size starts them all afresh)."""
        if rows is None:
            if self.state is None or len(self.state.h) != len(obs):
                self._start(len(obs))
        else:
            self._grow(int(rows.max()) + 1)
        state, prev_action, prev_reward = lane_inputs(
            self.state, self.prev_action, self.prev_reward, rows
        )
        starts = {
            "recurrent_state": torch.stack(state, 1).cpu().numpy(),  # [B, 2, H]
            "prev_action": prev_action.copy(),
            "prev_reward": prev_reward.copy(),
        }
        action, extras = super().act(obs, mask, rows)
        return action, {**extras, **starts}

    def observe(self, action: np.ndarray, step: VectorStep, rows: np.ndarray | None = None) -> None:
        if rows is not None:
            self._grow(int(rows.max()) + 1)
        self.state, self.prev_action, self.prev_reward = observed_lanes(
            self.state, self.prev_action, self.prev_reward, action, step, rows
        )

    def items(
        self, block: StepBlock, rows: np.ndarray | None = None
    ) -> tuple[dict[str, np.ndarray], None]:
        """One unroll per column of ``block`` (whichever lanes ``rows`` says they are)."""
        fields = unroll_items(block, self.action_mask)
        for name in START_FIELDS:
            fields[name] = block.extras[name][0].copy()  # the block is refilled
        return fields, None


def actor_core_for(network: nn.Module) -> type[PolicyActorCore]:
    """The actor core class for an actor-critic network: with memory or without."""
    if isinstance(network, RecurrentActorCritic):
        return RecurrentPolicyActorCore
    return PolicyActorCore

"""R2D2 (Kapturowski et al. 2019): a recurrent Q-network trained from prioritized replay of stored
sequences, with the actor's recurrent state stored at each sequence's start and a burn-in.

Actors act epsilon-greedily (Ape-X's fixed per-actor epsilon) with an LSTM Q-network whose state
each env keeps across steps and resets at its episode's start (``R2D2ActorCore``). Each env's
steps are cut into sequences of ``sequence_length`` steps overlapping by ``sequence_overlap``, never
crossing an episode end (``algos.sequences``), and sent with an initial priority from the actor's
own network. The learner (Ape-X's ``QLearner`` with ``sequence_loss``) unrolls the online and
target networks from the stored state; the first ``burn_in`` steps only warm the state up (no
loss and no gradient), then the double-Q n-step loss in rescaled value space
(``targets.rescaled_n_step_targets``) is masked over padding. A sequence that starts at its
episode's first step has an exact stored state (zeros) and needs no warm-up: all its steps are
trained on, so short episodes are learnt from too.

A replay item is one sequence (``L = sequence_length``; ``algos.sequences``):

===============  =====================  ==================================================
field            shape, dtype           meaning
===============  =====================  ==================================================
obs              [N, L + 1, *obs] f32   observations; position ``k`` (valid steps) holds the
                                        one after the last step
action           [N, L] int64           actions
reward           [N, L] float32         rewards
terminated       [N, L] bool            the step ended the episode in a terminal state
truncated        [N, L] bool            the step ended the episode by truncation
mask             [N, L] bool            real steps (False: padding after an episode end)
starts_episode   [N] bool               step 0 is the episode's first step
recurrent_state  [N, 2, H] float32      the actor's LSTM (h, c) before step 0
prev_action      [N] int64              the action before step 0 (0 at an episode start)
prev_reward      [N] float32            the reward before step 0 (0 at an episode start)
action_mask      [N, L + 1, A] bool     with ``algo.action_mask`` only: the legal actions at
                                        each observation, laid out like ``obs`` (none in
                                        padding); acting and the double-Q bootstrap keep to
                                        them
===============  =====================  ==================================================
"""

from __future__ import annotations

from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from apexrl.acting.step_block import StepBlock
from apexrl.algos.apex_dqn import QLearner, actor_epsilon
from apexrl.algos.recurrent_unrolls import grown_lanes, lane_inputs, observed_lanes, with_lane_state
from apexrl.algos.sequences import SequenceBuilder, stack_sequences
from apexrl.config import Config
from apexrl.config.algos import R2D2Config
from apexrl.envs import VectorStep
from apexrl.envs.nested import PackedBox
from apexrl.math import targets
from apexrl.models import LSTMState, RecurrentQNetwork
from apexrl.models.torsos import pixel_scale

START_FIELDS = ("recurrent_state", "prev_action", "prev_reward")


class SequenceLoss(NamedTuple):
    loss: torch.Tensor  # scalar, differentiable
    priorities: torch.Tensor  # [N] float64, new sequence priorities
    q_mean: torch.Tensor  # scalar, mean Q(s, a) over the trained steps
    td_abs_mean: torch.Tensor  # scalar, mean |td| over the trained steps


def unroll_inputs(fields: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Time-major network inputs over the ``L + 1`` positions of a batch of sequences: the
    observations, and the action and reward before each position."""
    obs = fields["obs"].transpose(0, 1)  # [L + 1, N, *obs]
    action = fields["action"].long()
    reward = fields["reward"].float()
    prev_action = torch.cat([fields["prev_action"].long().unsqueeze(1), action], 1).T
    prev_reward = torch.cat([fields["prev_reward"].float().unsqueeze(1), reward], 1).T
    return obs, prev_action, prev_reward


def stored_state(fields: dict[str, torch.Tensor]) -> LSTMState:
    state = fields["recurrent_state"].float()  # [N, 2, H]
    return LSTMState(state[:, 0].contiguous(), state[:, 1].contiguous())


def unroll_with_burn_in(
    net: RecurrentQNetwork,
    inputs: tuple[torch.Tensor, ...],
    state: LSTMState,
    burn_in: int,
    starts_episode: torch.Tensor,
) -> torch.Tensor:
    """Q-values ``[L + 1, N, A]`` from the stored state, where no gradient reaches the network
    through the first ``burn_in`` steps of a sequence that starts mid-episode (its state there
    is only warmed up); a sequence that starts an episode is differentiable throughout.

    Reference: Kapturowski et al. 2019, sec. 3 ("burn-in").
    """
    if burn_in == 0:
        return net(*inputs, state).q
    head_inputs = tuple(x[:burn_in] for x in inputs)
    tail_inputs = tuple(x[burn_in:] for x in inputs)
    if not bool(starts_episode.any()):
        with torch.no_grad():
            head = net(*head_inputs, state)
        return torch.cat([head.q, net(*tail_inputs, head.state).q])
    head = net(*head_inputs, state)
    keep = starts_episode.view(-1, 1)
    warmed = LSTMState(
        torch.where(keep, head.state.h, head.state.h.detach()),
        torch.where(keep, head.state.c, head.state.c.detach()),
    )
    return torch.cat([head.q, net(*tail_inputs, warmed).q])


def trained_steps(mask: torch.Tensor, starts_episode: torch.Tensor, burn_in: int) -> torch.Tensor:
    """bool ``[L, N]``: the real steps after the burn-in (every real step of a sequence that
    starts an episode). ``mask`` is ``[N, L]``."""
    after_burn_in = torch.arange(mask.shape[1], device=mask.device) >= burn_in  # [L]
    return (mask & (after_burn_in.unsqueeze(0) | starts_episode.view(-1, 1))).T


def sequence_loss(
    online: RecurrentQNetwork,
    target: RecurrentQNetwork,
    fields: dict[str, torch.Tensor],
    weights: torch.Tensor,
    cfg: R2D2Config,
) -> SequenceLoss:
    """Importance-weighted squared TD error of rescaled double-Q n-step targets over the trained
    steps of each sequence (mean per sequence), and the sequences' new priorities.

    Args:
        online, target: the two networks; both unroll from the stored state.
        fields: the items' fields (module docstring), ``[N, ...]`` tensors.
        weights: ``[N]`` importance-sampling weights.
    """
    inputs = unroll_inputs(fields)
    state = stored_state(fields)
    starts_episode = fields["starts_episode"].bool()
    q_online = unroll_with_burn_in(online, inputs, state, cfg.burn_in, starts_episode)
    action = fields["action"].long().T  # [L, N]
    q_taken = q_online[:-1].gather(2, action.unsqueeze(2)).squeeze(2)  # [L, N]
    with torch.no_grad():
        q_target = target(*inputs, state).q
        legal = fields["action_mask"].bool().transpose(0, 1) if cfg.action_mask else None
        bootstrap = targets.double_q_bootstrap(q_target, q_online.detach(), legal)  # [L + 1, N]
        y = targets.rescaled_n_step_targets(
            fields["reward"].float().T,
            fields["terminated"].bool().T,
            fields["truncated"].bool().T,
            bootstrap,
            cfg.gamma,
            cfg.n_step,
            cfg.rescale_eps,
        )
    trained = trained_steps(fields["mask"].bool(), starts_episode, cfg.burn_in)
    td = torch.where(trained, y - q_taken, torch.zeros_like(q_taken))
    num_trained = trained.sum(0).clamp(min=1)
    per_sequence = 0.5 * td.square().sum(0) / num_trained
    count = trained.sum().clamp(min=1)
    return SequenceLoss(
        loss=(weights * per_sequence).mean(),
        priorities=targets.sequence_priorities(td, trained, cfg.priority_eta, cfg.priority_eps),
        q_mean=(q_taken.detach() * trained).sum() / count,
        td_abs_mean=td.detach().abs().sum() / count,
    )


def build_network(obs_space: gym.Space, action_space: gym.Space, cfg: R2D2Config) -> nn.Module:
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"R2D2 needs a Discrete action space, got {action_space}")
    return RecurrentQNetwork(
        obs_space.shape,
        int(action_space.n),
        cfg.hidden_sizes,
        cfg.lstm_size,
        cfg.dueling,
        cfg.prev_action_reward,
        cfg.torso,
        pixel_scale(obs_space.high),
        cfg.normalize_obs,
    )


# --- the actor side ------------------------------------------------------------------------------


class R2D2ActorCore:
    """Epsilon-greedy on the recurrent Q-network (among the legal actions, given a mask); each
    lane's LSTM state, previous action and reward are kept across steps and zeroed where an
    episode ended, and its sequence in progress across blocks. A lane is an env of the vector,
    or, given ``rows``, an agent slot of a multi-agent actor that acts for some of its lanes at a
    time (``algos.recurrent_unrolls``' lanes)."""

    def __init__(
        self,
        network: RecurrentQNetwork,
        cfg: Config,
        epsilon: float,
        device: str,
        rng: np.random.Generator,
    ) -> None:
        self.network, self.cfg, self.epsilon = network, cfg.algo, epsilon
        self.device, self.rng = device, rng
        self.block_steps = cfg.actor.chunk_steps
        self.block_overlap = 0  # sequences are cut per lane as steps arrive
        self.synchronous = False
        self.state: LSTMState | None = None  # [L, H] each, allocated at the first act()
        self.prev_action = np.zeros(0, dtype=np.int64)
        self.prev_reward = np.zeros(0, dtype=np.float32)
        self.builder: SequenceBuilder | None = None

    def _grow(self, num_lanes: int) -> None:
        """Lanes up to ``num_lanes``, the new ones at an episode's start (zeros)."""
        have = 0 if self.state is None else len(self.state.h)
        if num_lanes <= have:
            return
        fresh = self.network.initial_state(num_lanes - have, self.device)
        if self.state is None:
            self.state = fresh
            self.prev_action = np.zeros(num_lanes, dtype=np.int64)
            self.prev_reward = np.zeros(num_lanes, dtype=np.float32)
            return
        self.state, self.prev_action, self.prev_reward = grown_lanes(
            self.state,
            self.prev_action,
            self.prev_reward,
            (fresh, np.zeros(num_lanes - have, dtype=np.int64)),
        )

    def act(
        self, obs: np.ndarray, mask: np.ndarray | None = None, rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Epsilon-greedy actions for ``obs`` ``[B, *obs]``; ``mask`` bool ``[B, A]`` (True:
        legal) keeps both the greedy and the random choice to legal actions. ``rows`` int
        ``[B]``: the lanes of ``obs`` (None: lanes ``0 .. B - 1``); only their state moves on."""
        if rows is None:
            if self.state is None:
                self._grow(len(obs))
        else:
            self._grow(int(rows.max()) + 1)
        state, prev_action, prev_reward = lane_inputs(
            self.state, self.prev_action, self.prev_reward, rows
        )
        extras = {
            "recurrent_state": torch.stack(state, 1).cpu().numpy(),  # [B, 2, H]
            "prev_action": prev_action.copy(),
            "prev_reward": prev_reward.copy(),
        }
        with torch.inference_mode():
            out = self.network(
                torch.as_tensor(obs, device=self.device).unsqueeze(0),
                torch.as_tensor(prev_action, device=self.device).unsqueeze(0),
                torch.as_tensor(prev_reward, device=self.device).unsqueeze(0),
                state,
            )
            self.state = out.state if rows is None else with_lane_state(self.state, rows, out.state)
        action = targets.epsilon_greedy(out.q[0].cpu().numpy(), self.epsilon, self.rng, mask)
        return action, extras

    def observe(self, action: np.ndarray, step: VectorStep, rows: np.ndarray | None = None) -> None:
        """Lanes ``rows`` (None: all, in order) took ``action`` and got ``step``."""
        if rows is not None:
            self._grow(int(rows.max()) + 1)
        self.state, self.prev_action, self.prev_reward = observed_lanes(
            self.state, self.prev_action, self.prev_reward, action, step, rows
        )

    def items(
        self, block: StepBlock, rows: np.ndarray | None = None
    ) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """The sequences the block's steps completed, with priorities from the actor's own
        network (online = target), as the learner would compute them. ``rows`` int ``[B]``: the
        lanes of the block's columns (None: lanes ``0 .. B - 1``); each lane's sequence in
        progress waits for its next steps, whichever block brings them."""
        if self.builder is None:
            num_lanes = block.reward.shape[1] if rows is None else 0
            self.builder = SequenceBuilder(
                num_lanes, self.cfg.sequence_length, self.cfg.sequence_overlap, START_FIELDS
            )
        sequences = []
        extras = block.extras
        for t in range(block.size):
            step_fields = {
                "obs": block.obs[t],
                "action": block.action[t].astype(np.int64),
                "reward": block.reward[t],
                "terminated": block.terminated[t],
                "truncated": block.truncated[t],
                **{name: extras[name][t] for name in START_FIELDS},
            }
            next_fields = None
            if self.cfg.action_mask:  # the masks of obs[t] and next_obs[t], laid out like obs
                step_fields["action_mask"] = extras["action_mask"][t].astype(np.bool_)
                next_fields = {"action_mask": extras["next_action_mask"][t]}
            ended = block.terminated[t] | block.truncated[t]
            sequences += self.builder.add(step_fields, block.next_obs[t], ended, next_fields, rows)
        fields = stack_sequences(sequences)
        if not fields:
            return {}, None
        return fields, self.initial_priorities(fields)

    def initial_priorities(self, fields: dict[str, np.ndarray]) -> np.ndarray:
        tensors = {name: torch.as_tensor(a, device=self.device) for name, a in fields.items()}
        weights = torch.ones(len(fields["mask"]), device=self.device)
        with torch.inference_mode():
            out = sequence_loss(self.network, self.network, tensors, weights, self.cfg)
        return out.priorities.cpu().numpy()


class R2D2Algorithm:
    """R2D2 behind the algorithm seam (``apexrl.algos.Algorithm``)."""

    def make_network(self, obs_space: gym.Space, action_space: gym.Space, cfg: Config) -> nn.Module:
        if isinstance(obs_space, PackedBox):
            raise ValueError(
                "R2D2 does not take Dict or Tuple observations yet (Ape-X, IMPALA and PPO do)"
            )
        return build_network(obs_space, action_space, cfg.algo)

    def actor_core(
        self,
        network: nn.Module,
        cfg: Config,
        actor_id: int,
        evaluate: bool,
        device: str,
        rng: np.random.Generator,
    ) -> R2D2ActorCore:
        epsilon = actor_epsilon(cfg, actor_id, evaluate)
        return R2D2ActorCore(network, cfg, epsilon, device, rng)

    def learner_core(
        self, obs_space: gym.Space, action_space: gym.Space, cfg: Config, device: torch.device
    ) -> QLearner:
        online = build_network(obs_space, action_space, cfg.algo)
        target = build_network(obs_space, action_space, cfg.algo)
        return QLearner(online, target, cfg.algo, device, sequence_loss)


ALGORITHM = R2D2Algorithm()

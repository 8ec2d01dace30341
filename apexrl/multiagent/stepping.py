"""How a multi-agent actor steps its PettingZoo envs: who sits where, one batched forward pass per
policy, then every env's step.

``AgentEnvs`` holds the actor's envs (``envs.AgentEnv``), the decisions each env waits for, and
each env's *seats*: the policy that plays an agent in the episode (``policies.PolicyMap``, asked
when the agent first acts, or the episode's match in a league, ``league.seating``) and the row it
holds in that policy's player (its lane). ``step`` is
one vector step:

1. every waiting decision is grouped by policy, and each policy acts for its whole group at once
   (all envs, all its agents) with the legal-action masks that came with them (a policy with a
   team critic sees each agent's observation followed by its env's ``team_state``);
2. each env takes its agents' actions: a Parallel env all of them, an AEC env its one;
3. the outcomes go back to their policies, which complete their agents' steps (``completed``), and
   an agent that is done gives its row back; an env whose episode ended reports it and resets.

It returns what the actor counts: the env steps, the agent steps per policy and the episodes that
ended, each with the policy that sat in every seat (``SeatedEpisode``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from apexrl.config import Config
from apexrl.multiagent.envs import AgentEnv, Decision, Episode, Outcome, make_pettingzoo_env
from apexrl.multiagent.envs import agent_views as make_views
from apexrl.multiagent.players import Player
from apexrl.multiagent.policies import PolicyMap


@dataclass
class Seat:
    policy: str
    row: int  # in the policy's player (-1: a fixed policy's agent)


@dataclass
class SeatedEpisode:
    """An episode that ended, with the policy of each of its agents."""

    episode: Episode
    policies: dict[str, str]  # agent -> policy
    env: int  # the env of the actor's vector that played it


@dataclass
class VectorTick:
    """What one ``AgentEnvs.step`` did."""

    env_steps: int = 0
    agent_steps: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    episodes: list[SeatedEpisode] = field(default_factory=list)
    illegal_actions: int = 0  # actions outside the agents' masks (none, unless a policy errs)


class AgentEnvs:
    """An actor's vector of PettingZoo envs with their seats (module docstring)."""

    def __init__(
        self, cfg: Config, num_envs: int, players: dict[str, Player], seating=None
    ) -> None:
        self.players = players
        self.mapping = PolicyMap(cfg)
        self.seating = seating  # a league's matches (league.seating.LeagueSeating); None: none
        self.team_critics = cfg.multiagent.team_critics
        self.envs: list[AgentEnv] = []
        try:
            for _ in range(num_envs):
                env = make_pettingzoo_env(cfg.env)
                self.envs.append(AgentEnv(env, make_views(env), cfg.env.max_episode_steps))
        except BaseException:
            self.close()
            raise
        self.decisions: list[list[Decision]] = [[] for _ in self.envs]
        self.seats: list[dict[str, Seat]] = [{} for _ in self.envs]
        self.played: list[dict[str, str]] = [{} for _ in self.envs]  # the episode's agent -> policy
        self.next_episode = 0

    def reset(self, seed: int | None) -> None:
        """Start every env's first episode (env ``i`` seeded with ``seed + i``)."""
        for i in range(len(self.envs)):
            self._start(i, None if seed is None else seed + i)

    def _start(self, i: int, seed: int | None) -> None:
        for seat in self.seats[i].values():
            self.players[seat.policy].release(seat.row)
        self.seats[i], self.played[i] = {}, {}
        self.decisions[i] = self.envs[i].reset(seed, self.next_episode)
        self.next_episode += 1
        if self.seating is not None:
            self.seating.start(i)

    def seat(self, i: int, agent: str) -> Seat:
        """The agent's seat in env ``i``: taken when it first acts in the episode."""
        seat = self.seats[i].get(agent)
        if seat is None:
            policy = self.mapping(agent, self.envs[i].episode)
            if self.seating is not None:
                policy = self.seating.policy(i, agent, policy)
            seat = self.seats[i][agent] = Seat(policy, self.players[policy].take())
            self.played[i][agent] = policy if self.seating is None else self.seating.group(policy)
        return seat

    def step(self) -> VectorTick:
        tick = VectorTick()
        actions: list[dict[str, object]] = [{} for _ in self.envs]
        for policy, group in self._groups().items():
            tick.illegal_actions += self._act(policy, group, actions)
            tick.agent_steps[policy] += len(group)
        outcomes: dict[str, list[tuple[int, Outcome]]] = defaultdict(list)
        done: list[Seat] = []
        for i, env in enumerate(self.envs):
            if not actions[i]:
                continue
            env_outcomes, decisions, episode = env.step(actions[i])
            tick.env_steps += 1
            for outcome in env_outcomes:
                seat = self.seats[i][outcome.agent]
                if seat.policy in self.team_critics:
                    next_obs = np.concatenate([outcome.next_obs, env.team_state()])
                    outcome = outcome._replace(next_obs=next_obs)
                outcomes[seat.policy].append((seat.row, outcome))
                if outcome.terminated or outcome.truncated:
                    done.append(seat)
                    del self.seats[i][outcome.agent]
            self.decisions[i] = decisions
            if episode is not None:
                tick.episodes.append(SeatedEpisode(episode, dict(self.played[i]), i))
                if self.seating is not None:
                    self.seating.ended(i, episode.returns)
        for policy, completed in outcomes.items():
            self._complete(policy, completed)
        for seat in done:
            self.players[seat.policy].release(seat.row)
        for i, decisions in enumerate(self.decisions):
            if not decisions:  # the episode ended (or the env had none to give)
                self._start(i, None)
        return tick

    def _groups(self) -> dict[str, list[tuple[int, Decision, Seat]]]:
        groups: dict[str, list[tuple[int, Decision, Seat]]] = defaultdict(list)
        for i, decisions in enumerate(self.decisions):
            for decision in decisions:
                seat = self.seat(i, decision.agent)
                groups[seat.policy].append((i, decision, seat))
        return groups

    def _act(
        self,
        policy: str,
        group: list[tuple[int, Decision, Seat]],
        actions: list[dict[str, object]],
    ) -> int:
        """One forward pass of ``policy`` for its agents that must act; returns the illegal
        actions among them (0 unless a policy errs)."""
        player = self.players[policy]
        obs = np.stack([decision.obs for _, decision, _ in group])
        if policy in self.team_critics:
            team = np.stack([self.envs[i].team_state() for i, _, _ in group])
            obs = np.concatenate([obs, team], axis=1)
        masks = _stack_masks([decision.mask for _, decision, _ in group])
        rows = np.fromiter((seat.row for _, _, seat in group), np.int64, len(group))
        action = player.act(obs, masks, rows)
        illegal = 0
        if masks is not None and np.issubdtype(np.asarray(action).dtype, np.integer):
            illegal = int((~masks[np.arange(len(group)), action]).sum())
        for k, (i, decision, _) in enumerate(group):
            actions[i][decision.agent] = player.actions.env_action(action[k])
        return illegal

    def _complete(self, policy: str, completed: list[tuple[int, Outcome]]) -> None:
        player = self.players[policy]
        rows = np.fromiter((row for row, _ in completed), np.int64, len(completed))
        outcomes = [outcome for _, outcome in completed]
        player.completed(
            rows,
            np.array([o.reward for o in outcomes], np.float32),
            np.array([o.terminated for o in outcomes]),
            np.array([o.truncated for o in outcomes]),
            np.stack([o.next_obs for o in outcomes]),
            _stack_masks([o.next_mask for o in outcomes]),
        )

    def release_seats(self) -> None:
        """Give every seat's row back to its player (the envs are left as they are): players
        shared with other ``AgentEnvs`` (the evaluation actor's opponents) keep their rows."""
        for i, seats in enumerate(self.seats):
            for seat in seats.values():
                self.players[seat.policy].release(seat.row)
            self.seats[i] = {}

    def close(self) -> None:
        for env in self.envs:
            env.close()


def _stack_masks(masks: list[np.ndarray | None]) -> np.ndarray | None:
    """The masks as [n, A] bool; None when no agent brought one (a row without one: all legal)."""
    if all(mask is None for mask in masks):
        return None
    size = next(len(mask) for mask in masks if mask is not None)
    return np.stack([np.ones(size, bool) if mask is None else mask for mask in masks])

"""A multi-agent episode's returns as the run reports them, and a training actor's interval of
them.

An episode's return depends on whose it is, and each reader wants its own:

- ``team``: every agent's rewards summed (what cooperative tasks such as MPE's simple_spread are
  scored on: "team return" in the papers);
- ``policy/<name>``: the rewards of every agent the policy played in the episode, summed (a shared
  policy's return counts all its agents, never only the last one);
- ``agent/<name>``: one agent's;
- ``policy/<name>/<agent>``: one agent's when that policy played it (a self-play policy's return
  as the first player and as the second).

``judged_return`` is the one the run is judged by (``multiagent.judge``): the episode return of
``result.json``, TensorBoard's ``episode_return`` and ``run.stop_eval_return``. An episode in
which the judged policy or agent did not play has no judged return.
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np

from apexrl.multiagent.config import MultiAgentConfig
from apexrl.multiagent.stepping import SeatedEpisode, VectorTick
from apexrl.runtime.metrics import MetricsWriter, RateMeter
from apexrl.transport.messages import MAX_RETURN_GROUPS, ActorReport


def group_returns(seated: SeatedEpisode) -> dict[str, float]:
    """The episode's return of every group it has (module docstring)."""
    returns = seated.episode.returns
    groups = {"team": float(sum(returns.values()))}
    by_policy: dict[str, float] = defaultdict(float)
    for agent, value in returns.items():
        policy = seated.policies.get(agent)
        groups[f"agent/{agent}"] = value
        if policy is not None:
            by_policy[policy] += value
            groups[f"policy/{policy}/{agent}"] = value
    groups.update({f"policy/{policy}": value for policy, value in by_policy.items()})
    return groups


def judged_return(judge: str, groups: dict[str, float]) -> float | None:
    """The episode's return as ``multiagent.judge`` says; None when it has none."""
    if judge == "team":
        return groups["team"]
    kind, _, name = judge.partition(":")
    return groups.get(f"{kind}/{name}")


class EpisodeReturns:
    """Episodes that ended since the last report: judged returns and lengths, and every group's
    returns (at most ``MAX_RETURN_GROUPS`` groups a report: team, policies and agents first)."""

    def __init__(self, ma: MultiAgentConfig) -> None:
        self.judge = ma.judge
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.groups: dict[str, list[float]] = defaultdict(list)

    def add(self, seated: SeatedEpisode) -> None:
        groups = group_returns(seated)
        judged = judged_return(self.judge, groups)
        if judged is not None:
            self.returns.append(judged)
            self.lengths.append(max(seated.episode.env_steps, 1))
        for name, value in groups.items():
            if name in self.groups or len(self.groups) < MAX_RETURN_GROUPS:
                if name.count("/") < 2 or len(self.groups) < MAX_RETURN_GROUPS // 2:
                    self.groups[name].append(value)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        return (
            np.asarray(self.returns, dtype=np.float64),
            np.asarray(self.lengths, dtype=np.int64),
            {name: np.asarray(values, dtype=np.float64) for name, values in self.groups.items()},
        )

    def clear(self) -> None:
        self.returns, self.lengths = [], []
        self.groups = defaultdict(list)


class MultiAgentMetrics:
    """A training actor's interval: env and agent steps, its episodes' returns, illegal actions;
    sent to replay as an ``ActorReport`` every ``actor.report_interval_s`` and written to
    TensorBoard at the run's env steps that replay answers with."""

    def __init__(
        self,
        writer: MetricsWriter,
        ma: MultiAgentConfig,
        actor_id: int,
        incarnation: int,
        report_interval_s: float,
    ) -> None:
        self.writer, self.actor_id, self.incarnation = writer, actor_id, incarnation
        self.report_interval_s = report_interval_s
        self.episodes = EpisodeReturns(ma)
        self.last_report = time.monotonic()
        self.env_steps = 0  # this actor's own, in this process
        self.agent_steps = 0
        self.agent_steps_by_policy: dict[str, int] = defaultdict(int)
        self.env_steps_since_report = 0
        self.agent_steps_since_report = 0
        self.illegal_actions = 0
        self.meter = RateMeter()
        self.pending: dict[str, float] = {}
        self.last_run_env_steps = 0
        self.extra_scalars = None  # a callable of more scalars for each report (a league's)

    def add(self, tick: VectorTick) -> None:
        self.env_steps += tick.env_steps
        self.env_steps_since_report += tick.env_steps
        self.meter.add(tick.env_steps)
        steps = sum(tick.agent_steps.values())
        self.agent_steps += steps
        self.agent_steps_since_report += steps
        for policy, count in tick.agent_steps.items():
            self.agent_steps_by_policy[policy] += count
        self.illegal_actions += tick.illegal_actions
        for seated in tick.episodes:
            self.episodes.add(seated)

    def report_if_due(self, replay, version: int) -> None:
        """Every ``report_interval_s``: the interval's report (replay holds its env steps to
        those the actor's chunks brought, give or take the steps not cut yet)."""
        now = time.monotonic()
        if now - self.last_report < self.report_interval_s:
            return
        self.write_pending(self.last_run_env_steps)
        self.last_report = now
        returns, lengths, groups = self.episodes.arrays()
        replay.report(
            ActorReport(
                self.actor_id,
                self.incarnation,
                False,
                self.env_steps_since_report,
                version,
                returns,
                lengths,
                {},
                groups,
                self.agent_steps_since_report,
            )
        )
        if len(returns):
            self.pending["actor/episode_return"] = float(returns.mean())
            self.pending["actor/episode_length"] = float(lengths.mean())
        for name, values in groups.items():
            self.pending[f"actor/return/{name}"] = float(values.mean())
        self.pending["actor/env_steps_per_s"] = self.meter.rate()
        self.pending["actor/env_steps"] = float(self.env_steps)
        self.pending["actor/agent_steps"] = float(self.agent_steps)
        self.pending["actor/illegal_actions"] = float(self.illegal_actions)
        if self.extra_scalars is not None:
            self.pending.update(self.extra_scalars())
        self.episodes.clear()
        self.env_steps_since_report = self.agent_steps_since_report = 0

    def write_pending(self, run_env_steps: int | None) -> None:
        if self.pending and run_env_steps is not None:
            self.writer.scalars(self.pending, run_env_steps)
            self.pending = {}
            self.last_run_env_steps = run_env_steps

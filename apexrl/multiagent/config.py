"""The ``multiagent`` section of a run's config: the named policies of a multi-agent run, which
agent each episode's agents are played by, and which policies train.

An empty ``policies`` is a single-agent run (every config from before multi-agent training). With
policies, ``env.id`` names a PettingZoo env (``apexrl.multiagent.envs``) and every agent of every
episode is played by one policy (``apexrl.multiagent.policies``):

- a *trained* policy learns with the run's ``algorithm``; its ``algo`` mapping overrides keys of
  the run's ``algo`` section for it alone (its learning rate, its network), and its spaces are
  those of the agents mapped to it;
- a policy that is *not trained* (named in ``policies_to_train`` by none when that list is given)
  acts with the weights its learner starts from and publishes once;
- a *fixed* policy never trains: ``random`` (uniform over the legal actions), a scripted
  ``module:Class``, or ``checkpoint:PATH[#POLICY]``, a network policy of another run's checkpoint,
  frozen (``apexrl.multiagent.fixed``).

The mapping is a table of agent-name patterns (``fnmatch``: ``speaker_*``), the first that matches
wins, each rule for every episode or for even or odd ones only (``episodes``: a two-player game's
seats swapped every other episode); or ``mapping_fn``, a ``module:function(agent_id, episode)``
that returns a policy name, called at the start of each agent's episode (``episode``: that env's
episode number in its actor, from 0), which can seat a policy anywhere from one episode to the
next. A policy's spaces must then be known before any episode: ``agents`` names the agents it may
play (a pattern).

A policy's ``critic: team`` gives its value the whole team's view: the agent's observation
followed by the latest observation of every agent of the env (zeros for one not seen yet in the
episode), while its policy reads the agent's own part alone (``algo.policy_obs_dim``). Its
agents' rewards then have a baseline that knows where the other agents are; its actions stay
those of an agent that sees only its own observation.

Torch-free and gymnasium-free, like every section: the servers and the launcher read it.
"""

from __future__ import annotations

import fnmatch
import importlib
from dataclasses import dataclass, field
from typing import Any

from apexrl.config.rules import ConfigError, check_fixed_player, check_import_name

# What a run's "return" is (result.json's returns, run.stop_eval_return): the team's (the sum over
# every agent of an episode), one policy's (the sum over the agents it played in an episode) or
# one agent's.
JUDGE_PREFIXES = ("policy:", "agent:")


@dataclass(frozen=True)
class PolicySpec:
    name: str = ""  # the policy's name: its replay table, its weights on the parameter server
    # "": a network of the run's algorithm; "random": uniform over the legal actions; a scripted
    # "module:Class"; or "checkpoint:PATH[#POLICY]", a network policy of another run's checkpoint
    # (a run directory or a .pt file; POLICY: which of its network policies, default its only one)
    # (apexrl.multiagent.fixed, apexrl.multiagent.checkpoint_player), never trained
    fixed: str = ""
    # Keys of the run's algo section set for this policy alone ({lr: 0.001, hidden_sizes: [64]})
    algo: dict[str, Any] = field(default_factory=dict)
    # The agents this policy may play (an fnmatch pattern), whose spaces it takes; "": the agents
    # the mapping table sends to it. Needed with mapping_fn.
    agents: str = ""
    # What the policy's value (critic) reads: "own", the agent's observation, as the policy; or
    # "team", the agent's observation and every agent's latest one (a centralized critic, as in
    # MAPPO; the policy still acts on the agent's own). An actor-critic's option (PPO, IMPALA).
    critic: str = "own"

    @property
    def trainable(self) -> bool:
        return not self.fixed


EPISODE_SELECTORS = ("all", "even", "odd")
CRITICS = ("own", "team")


@dataclass(frozen=True)
class AgentRule:
    agents: str = "*"  # fnmatch pattern of agent names ("speaker_*", "player_1")
    policy: str = ""  # the policy that plays them
    # The episodes the rule holds for: "all", or "even" or "odd" ones (an env's episode number in
    # its actor): seats swapped every other episode
    episodes: str = "all"

    def holds(self, agent: str, episode: int | None) -> bool:
        """Whether the rule maps ``agent`` in ``episode`` (None: in any episode)."""
        if not fnmatch.fnmatchcase(agent, self.agents):
            return False
        if episode is None or self.episodes == "all":
            return True
        return (episode % 2 == 0) == (self.episodes == "even")


@dataclass(frozen=True)
class MultiAgentConfig:
    policies: tuple[PolicySpec, ...] = ()  # empty: a single-agent run
    mapping: tuple[AgentRule, ...] = ()  # agent name -> policy: the first rule that matches
    # "module:function(agent_id, episode) -> policy name", instead of the mapping table; "": none
    mapping_fn: str = ""
    # The policies the learner trains; empty: every policy that is not fixed. A network policy left
    # out acts with its initial weights.
    policies_to_train: tuple[str, ...] = ()
    # The return the run reports and judges: "team" (every agent's rewards of an episode),
    # "policy:<name>" or "agent:<name>"
    judge: str = "team"

    @property
    def enabled(self) -> bool:
        return bool(self.policies)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.policies)

    def spec(self, name: str) -> PolicySpec:
        for spec in self.policies:
            if spec.name == name:
                return spec
        raise KeyError(name)

    @property
    def trained(self) -> tuple[str, ...]:
        """The policies the learner trains, in the order of ``policies``."""
        chosen = set(self.policies_to_train)
        return tuple(
            spec.name
            for spec in self.policies
            if spec.trainable and (not chosen or spec.name in chosen)
        )

    @property
    def team_critics(self) -> frozenset[str]:
        """The policies whose value reads the whole team's observations."""
        return frozenset(spec.name for spec in self.policies if spec.critic == "team")

    @property
    def networks(self) -> tuple[str, ...]:
        """The policies that are networks (trained or not), in the order of ``policies``."""
        return tuple(spec.name for spec in self.policies if spec.trainable)

    def table_policy(self, agent: str, episode: int) -> str | None:
        """The policy the mapping table gives ``agent`` in ``episode``; None when no rule
        matches."""
        for rule in self.mapping:
            if rule.holds(agent, episode):
                return rule.policy
        return None

    def table_policies(self, agent: str) -> set[str]:
        """Every policy the mapping table gives ``agent``, in even and in odd episodes (a rule
        that an earlier one hides gives none)."""
        found = {self.table_policy(agent, episode) for episode in (0, 1)}
        return {policy for policy in found if policy is not None}

    def validate(self) -> None:
        if not self.policies:
            if self.mapping or self.mapping_fn or self.policies_to_train or self.judge != "team":
                raise ValueError(
                    "multiagent.mapping, mapping_fn, policies_to_train and judge need "
                    "multiagent.policies"
                )
            return
        names = [spec.name for spec in self.policies]
        for i, name in enumerate(names):
            if not name.isidentifier():
                raise ValueError(
                    f"multiagent.policies[{i}].name must be letters, digits and _ (not first), "
                    f"got {name!r}"
                )
        duplicate = {name for name in names if names.count(name) > 1}
        if duplicate:
            raise ValueError(f"multiagent.policies names {sorted(duplicate)[0]!r} twice")
        for i, spec in enumerate(self.policies):
            if spec.fixed:
                check_fixed_player(f"multiagent.policies[{i}].fixed", spec.fixed)
            if spec.fixed and (spec.algo or spec.critic != "own"):
                raise ValueError(
                    f"multiagent.policies[{i}] ({spec.name}) is fixed ({spec.fixed}): it has no "
                    "algo to set and no critic"
                )
            if spec.critic not in CRITICS:
                raise ValueError(
                    f"multiagent.policies[{i}].critic must be own or team, got {spec.critic!r}"
                )
        if bool(self.mapping) == bool(self.mapping_fn):
            raise ValueError(
                "a multi-agent run maps agents to policies with multiagent.mapping (a table) or "
                "multiagent.mapping_fn (module:function), one of them"
            )
        for i, rule in enumerate(self.mapping):
            if rule.episodes not in EPISODE_SELECTORS:
                raise ValueError(
                    f"multiagent.mapping[{i}].episodes must be all, even or odd, got "
                    f"{rule.episodes!r}"
                )
            if rule.policy not in names:
                raise ValueError(
                    f"multiagent.mapping[{i}] maps {rule.agents!r} to {rule.policy!r}, which is "
                    f"not a policy (policies: {', '.join(names)})"
                )
        if self.mapping_fn:
            check_import_name("multiagent.mapping_fn", self.mapping_fn)
            for i, spec in enumerate(self.policies):
                if not spec.agents:
                    raise ValueError(
                        f"multiagent.policies[{i}] ({spec.name}) needs agents (the agents it may "
                        "play, a pattern) with multiagent.mapping_fn: its spaces are theirs"
                    )
        for name in self.policies_to_train:
            if name not in names:
                raise ValueError(f"multiagent.policies_to_train names {name!r}, not a policy")
            if self.spec(name).fixed:
                raise ValueError(
                    f"multiagent.policies_to_train names {name!r}, a fixed policy, which has "
                    "nothing to train"
                )
        if not self.trained:
            raise ValueError("a multi-agent run needs at least one policy to train")
        self._check_judge(names)

    def _check_judge(self, names: list[str]) -> None:
        if self.judge == "team":
            return
        kind, _, name = self.judge.partition(":")
        if f"{kind}:" not in JUDGE_PREFIXES or not name:
            raise ValueError(
                f"multiagent.judge must be team, policy:<name> or agent:<name>, got {self.judge!r}"
            )
        if kind == "policy" and name not in names:
            raise ValueError(f"multiagent.judge names policy {name!r}, not a policy")


def load_function(key: str, name: str) -> Any:
    """The object ``module:attr`` names; ``ConfigError`` naming ``key`` when it cannot be had."""
    module_name, _, attr = name.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{key} {name!r} cannot be loaded: {exc}") from exc
    if not callable(found):
        raise ConfigError(f"{key} {name!r} is not callable")
    return found

"""A multi-agent run's replay: one table per trained policy behind the replay server's socket.

Each trained policy gets a whole ``ReplayService`` of its own config (``policies.policy_config``:
its algorithm's table kind, capacity and rate limiter, its item layout from its own spaces, its
lanes as its envs), with its own held chunks and sample requests, its own snapshot and chunk log
under ``<run dir>/replay_snapshot/<policy>/``, and its own announced weights versions. A chunk, a
sample request and a priority update go to the table they name, and one that names a table the
run does not have (a fixed policy, a policy that is not trained, a made-up name) is refused with
``Error`` like any message no peer of the run would send.

What is the run's, not a table's, is kept once:

- the actors' roster (``replay/actors.py``): an actor's claims are held to its items summed over
  every table, and its reports to the env steps its chunks brought to any table;
- the episodes, returns and evaluation rounds, the return groups and the agent steps, which the
  reports bring: the *lead* table's bookkeeping (the first trained policy's) keeps them, and a
  report's weights version is the lead policy's;
- ``replay/env_steps``, the run's x-axis: the sum of every table's, since each chunk brings the
  env steps its actor took since its previous chunk of any policy.

``Stats`` are the lead table's, with the run's env steps, the tables' items summed, and each
table's own under ``replay/<policy>/...``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from apexrl.config import Config
from apexrl.multiagent.policies import agents_per_env, policy_config, policy_spaces
from apexrl.replay import admission
from apexrl.replay.actors import ActorRoster
from apexrl.replay.chunk_log import Buffer
from apexrl.replay.service import ReplayService
from apexrl.replay.serving import Reply
from apexrl.runtime import rundir
from apexrl.transport.messages import (
    ActorReport,
    Message,
    PriorityUpdate,
    PublishedVersion,
    RestoreCounters,
    SampleRequest,
    Shutdown,
    Stats,
    StatsRequest,
    TrajectoryChunk,
)

log = logging.getLogger("apexrl.replay_server")

SUMMED = ("size", "num_inserted", "num_sampled", "pending_inserts", "pending_samples")
PER_TABLE = (*SUMMED, "priority_updates")


class PolicyTables:
    """The tables of a multi-agent run (module docstring), with the interface of one
    ``ReplayService`` towards the server loop."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        spaces = policy_spaces(cfg)
        agents = agents_per_env(spaces)
        self.by_policy: dict[str, ReplayService] = {}
        base = rundir.replay_snapshot_dir(cfg.run_dir)
        for seed, name in enumerate(cfg.multiagent.trained):
            policy_cfg = policy_config(cfg, name, spaces[name])
            service = ReplayService(policy_cfg, seed, agents)
            service.snapshot_dir = base / name
            self.by_policy[name] = service
        self.lead = next(iter(self.by_policy.values()))
        carried = sum(s.actors.carried for s in self.by_policy.values())
        slack = sum(s.actors.report_slack for s in self.by_policy.values())
        roster = ActorRoster(carried, slack)
        for service in self.by_policy.values():
            service.actors = roster
        self.roster = roster
        # What each role may send: the largest table's bounds.
        self.gates = max(
            (s.gates for s in self.by_policy.values()),
            key=lambda g: g["actor"].limits.max_message_bytes,
        )
        log.info("replay tables: %s", ", ".join(self.by_policy))

    @property
    def services(self) -> list[ReplayService]:
        return list(self.by_policy.values())

    @property
    def stopping(self) -> bool:
        return self.lead.stopping

    @property
    def env_steps(self) -> int:
        return sum(s.run.env_steps for s in self.by_policy.values())

    def table_counts(self) -> tuple[int, int]:
        counts = [s.table_counts() for s in self.by_policy.values()]
        return sum(c[0] for c in counts), sum(c[1] for c in counts)

    def holds_full(self) -> bool:
        return any(s.holds_full() for s in self.by_policy.values())

    def reject(self, identity: bytes, reason: str) -> list[Reply]:
        return self.lead.reject(identity, reason)

    # -- dispatch --------------------------------------------------------------------------------

    def handle(
        self, identity: bytes, msg: Message, frames: Sequence[Buffer] | None = None
    ) -> list[Reply]:
        if isinstance(msg, (TrajectoryChunk, SampleRequest, PriorityUpdate)):
            service = self.by_policy.get(msg.table)
            if service is None:
                return self.reject(identity, self._no_table(msg.table))
            return service.handle(identity, msg, frames)
        if isinstance(msg, PublishedVersion):
            service = self.by_policy.get(msg.policy)
            if service is None:
                if msg.policy in self.cfg.multiagent.networks:
                    return []  # a policy that is not trained: no table holds its versions
                return self.reject(identity, self._no_table(msg.policy))
            return service.handle(identity, msg)
        if isinstance(msg, StatsRequest):
            values = {**self.stats(), **self.roster.stats()}
            return [Reply(identity, Stats(role="replay", values=values))]
        if isinstance(msg, RestoreCounters):
            try:
                admission.check_restore_counters(msg)
            except ValueError as exc:
                return self.reject(identity, str(exc))
            others = self.env_steps - self.lead.run.env_steps
            self.lead.run.resume_at(max(msg.env_steps - others, 0))
            return [Reply(identity, Stats(role="replay", values=self.stats()))]
        if isinstance(msg, Shutdown):
            log.info("shutdown requested: %s", msg.reason)
            return [r for s in self.by_policy.values() for r in s.begin_shutdown()]
        if isinstance(msg, ActorReport):
            return self.lead.handle(identity, msg)
        return self.lead.handle(identity, msg)  # refused there, with its reason

    def _no_table(self, name: str) -> str:
        return (
            f"no replay table {name[:64]!r}: this run's tables are the trained policies "
            f"{', '.join(self.by_policy)}"
        )

    def release_waiting(self) -> list[Reply]:
        return [r for s in self.by_policy.values() for r in s.release_waiting()]

    def drain(self) -> list[Reply]:
        return [r for s in self.by_policy.values() for r in s.drain()]

    # -- what it reports -------------------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        """The lead table's values, with the run's env steps, the tables' items summed and each
        table's own under ``replay/<policy>/``."""
        values = self.lead.stats()
        per_table = {name: s.stats() for name, s in self.by_policy.items()}
        values["replay/env_steps"] = float(self.env_steps)
        summed = [f"replay/{key}" for key in (*SUMMED, "rejected_messages")]
        summed += [key for key in values if key.startswith("replay/items_")]
        for key in summed:
            values[key] = sum(t.get(key, 0.0) for t in per_table.values())
        for name, table in per_table.items():
            for key in PER_TABLE:
                if f"replay/{key}" in table:
                    values[f"replay/{name}/{key}"] = table[f"replay/{key}"]
        return values

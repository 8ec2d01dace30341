"""What the replay server reports: the values of its ``Stats`` (``service_stats``: the table,
what is held back and refused, priority updates, the run's bookkeeping, the items' fates, the chunk
log and the last snapshot) and the items inserted and sampled per second that it writes with them
to TensorBoard (``Throughput``)."""

from __future__ import annotations

import collections
import time
from typing import Protocol

from apexrl.config import Config
from apexrl.replay.accounting import ItemCounts
from apexrl.replay.actors import ActorRoster
from apexrl.replay.bookkeeping import RunBookkeeping
from apexrl.replay.chunk_log import ChunkLog
from apexrl.replay.held import HeldInserts
from apexrl.replay.serving import Reply
from apexrl.replay.snapshot import WriteResult
from apexrl.replay.tables import FifoQueue, PrioritizedTable
from apexrl.runtime.metrics import MetricsWriter, RateMeter


class ReplayService(Protocol):
    """What of the replay server's service (``replay.service.ReplayService``) this module uses."""

    cfg: Config
    table: PrioritizedTable | FifoQueue
    run: RunBookkeeping
    actors: ActorRoster
    counts: ItemCounts
    rejected_messages: int
    pending_inserts: HeldInserts
    pending_samples: collections.deque
    priority_updates_applied: int
    priority_updates_by_rank: dict[int, int]
    chunk_log: ChunkLog | None
    last_snapshot: WriteResult | None

    @property
    def env_steps(self) -> int: ...
    def held_items(self) -> int: ...
    def stats(self) -> dict[str, float]: ...
    def drain(self) -> list[Reply]: ...
    def table_counts(self) -> tuple[int, int]: ...


def service_stats(service: ReplayService) -> dict[str, float]:
    """The replay server's values for ``Stats`` (the actors' own entries aside)."""
    table, run = service.table, service.run
    values = {
        "replay/size": float(table.size),
        "replay/num_inserted": float(table.num_inserted),
        "replay/num_sampled": float(table.num_sampled),
        "replay/rejected_messages": float(service.rejected_messages),
        "replay/pending_inserts": float(len(service.pending_inserts)),
        "replay/pending_insert_bytes": float(service.pending_inserts.num_bytes),
        "replay/pending_samples": float(len(service.pending_samples)),
        "replay/priority_updates": float(service.priority_updates_applied),
        **run.train_stats(),
        "replay/active_actors": float(service.actors.num_active(time.monotonic())),
        **run.eval_stats(),
        **{
            f"replay/priority_updates_rank_{rank}": float(count)
            for rank, count in service.priority_updates_by_rank.items()
        },
        **run.custom_stats(),
        **run.group_stats(),
        **service.counts.stats(service.held_items(), table.size),
    }
    if service.chunk_log is not None:
        values["replay/log_bytes"] = float(service.chunk_log.num_bytes)
    if isinstance(table, FifoQueue):  # items dropped before their last delivery
        values["replay/evicted_unread"] = float(table.num_evicted)
    if table.stores_frames:  # items dropped early: newer frames overwrote theirs
        values["replay/evicted_for_frames"] = float(table.num_evicted_for_frames)
    if service.last_snapshot is not None:
        values["replay/snapshot_s"] = service.last_snapshot.total_s
        values["replay/snapshot_items"] = float(service.last_snapshot.num_items)
    return values


class Throughput:
    """Items inserted and sampled per second, for ``replay/inserts_per_s`` and ``samples_per_s``,
    written with the service's stats every ``replay.report_interval_s``."""

    def __init__(self) -> None:
        self.inserts, self.samples = RateMeter(), RateMeter()
        self.last_report = time.monotonic()

    def drain(self, service: ReplayService) -> list[Reply]:
        """``service.drain()``, counting the items it moved."""
        inserted, sampled = service.table_counts()
        replies = service.drain()
        inserted_after, sampled_after = service.table_counts()
        self.inserts.add(inserted_after - inserted)
        self.samples.add(sampled_after - sampled)
        return replies

    def report_if_due(self, service: ReplayService, writer: MetricsWriter) -> None:
        if time.monotonic() - self.last_report < service.cfg.replay.report_interval_s:
            return
        self.last_report = time.monotonic()
        values = service.stats()
        values["replay/inserts_per_s"] = self.inserts.rate()
        values["replay/samples_per_s"] = self.samples.rate()
        writer.scalars(values, step=service.env_steps)

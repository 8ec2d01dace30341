"""The replay server's state that outlives a restart, and what a replay snapshot holds of it (the
file itself is ``snapshot.py``'s).

- ``ReplayState``: that state as one value: the table (items, keys, and priorities or delivery
  counts), the rate limiter's counters, the sampling rng, the run's bookkeeping, the counts of
  priority updates, the item counters and the chunk numbers stored per actor
  (``accounting.py``);
- ``new_state``: the state of a server of a config that has stored nothing;
- ``snapshot_layout``: what a snapshot must match to be loaded (the table's name, kind, capacity,
  priority exponent, max times sampled and item spec);
- ``export_snapshot``: copies of a state, as a ``Snapshot`` (with the number of the first chunk
  log segment it does not hold, ``LOG_SEGMENT``);
- ``restore_state``: a snapshot read back into a new state, all or nothing: it raises
  ``SnapshotError`` unless the snapshot fits the layout exactly and holds only what a server of
  this config could have stored.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from apexrl.config import Config
from apexrl.config.algos import ItemSpec
from apexrl.replay.accounting import ItemCounts, StoredChunks
from apexrl.replay.admission import ValueCheck, check_item_values
from apexrl.replay.bookkeeping import RunBookkeeping
from apexrl.replay.rate_limiter import RateLimiter
from apexrl.replay.snapshot import FORMAT_VERSION, Snapshot, SnapshotError
from apexrl.replay.tables import FifoQueue, PrioritizedTable, make_table
from apexrl.transport.frames import config_frame_capacity, config_frame_layout


class ReplayState(NamedTuple):
    """The replay server's state that a snapshot keeps."""

    table: PrioritizedTable | FifoQueue
    limiter: RateLimiter
    rng: np.random.Generator
    run: RunBookkeeping
    priority_updates: int  # items whose priority changed
    priority_updates_by_rank: dict[int, int]  # PriorityUpdate messages per learner rank
    counts: ItemCounts  # what became of the items replay was sent
    chunks: StoredChunks  # the chunk numbers stored per actor

    def progress(self) -> tuple[int, ...]:
        """Changes whenever a snapshot would differ from the last one."""
        run = self.run
        return (
            *self.counts.export(0).values(),
            self.table.num_inserted,
            self.table.num_sampled,
            self.priority_updates,
            run.env_steps,
            run.eval_env_steps,
            run.train_episodes,
            run.eval_episodes,
        )


def new_state(cfg: Config, item_spec: ItemSpec, seed: int = 0) -> ReplayState:
    """An empty table of ``cfg``, its storage allocated from ``item_spec``, a rate limiter that
    has counted nothing and an rng seeded with ``seed``. (The FIFO options default to a queue
    that delivers each item once and never drops an unread one.)"""
    replay = cfg.replay
    frames = config_frame_layout(cfg, item_spec)
    table = make_table(
        replay.kind,
        replay.capacity,
        replay.priority_exponent,
        max_times_sampled=replay.max_times_sampled,
        evict_unread=replay.evict_unread,
        spec=item_spec,
        frames=None if frames is None else (frames, config_frame_capacity(cfg, frames)),
    )
    limiter = RateLimiter(
        samples_per_insert=replay.samples_per_insert,
        min_size_to_sample=replay.min_size_to_sample,
        error_buffer=cfg.rate_error_buffer,
    )
    run = RunBookkeeping(eval_window=cfg.run.stop_eval_episodes)
    rng = np.random.default_rng(seed)
    return ReplayState(table, limiter, rng, run, 0, {}, ItemCounts(), StoredChunks())


def snapshot_layout(cfg: Config, item_spec: ItemSpec) -> dict:
    """What a snapshot must match to be loaded by a server of ``cfg`` (JSON values); with
    stacked frames stored once, also their fields and the frame ring's capacity."""
    replay = cfg.replay
    layout = {
        "table": replay.table,
        "kind": replay.kind,
        "capacity": replay.capacity,
        "priority_exponent": replay.priority_exponent,
        "max_times_sampled": replay.max_times_sampled,
        "item_spec": {
            name: [np.dtype(dtype).str, [int(n) for n in shape]]
            for name, (dtype, shape) in item_spec.items()
        },
    }
    frames = config_frame_layout(cfg, item_spec)
    if frames is not None:
        layout["frames"] = {
            "fields": list(frames.fields),
            "frame_capacity": config_frame_capacity(cfg, frames),
        }
    return layout


LOG_SEGMENT = "chunk_log_segment"  # meta: the first chunk log segment the snapshot does not hold
ITEMS_IN_LOG = "items_in_log"  # meta: true when the stored items are not in the snapshot but in
# the chunk log's segments before LOG_SEGMENT (a durable server's snapshots)

# Puts the stored items back into an empty table from the chunk log: (table, key of the oldest
# stored item, key after the newest, the first segment the snapshot does not hold); raises
# SnapshotError when the log does not hold them.
Refill = Callable[[PrioritizedTable | FifoQueue, int, int, int], None]


def export_snapshot(
    state: ReplayState,
    layout: dict,
    held_items: int = 0,
    log_segment: int = 0,
    items_in_log: bool = False,
) -> Snapshot:
    """Copies of everything ``restore_state`` needs to go on from ``state``; ``held_items``: the
    items of chunks held back (not counted as received: a restarted server no longer holds
    them); ``log_segment``: the chunk log's segment begun with this snapshot; ``items_in_log``:
    leave the stored items out, the chunk log's segments before ``log_segment`` hold them (the
    snapshot is then the table's priorities or delivery counts and the scalars)."""
    arrays, table_scalars = state.table.export_state(with_items=not items_in_log)
    counters, windows = state.run.export()
    meta = {
        "format_version": FORMAT_VERSION,
        "written_at": time.time(),
        "layout": layout,
        "table": table_scalars,
        "limiter": {
            "num_inserted": state.limiter.num_inserted,
            "num_sampled": state.limiter.num_sampled,
        },
        "counters": {**counters, "priority_updates": state.priority_updates},
        "priority_updates_by_rank": {
            str(rank): count for rank, count in state.priority_updates_by_rank.items()
        },
        **windows,
        "rng": state.rng.bit_generator.state,  # a dict of ints and names: JSON
        "items": state.counts.export(held_items),
        "stored_chunks": state.chunks.export(),
        LOG_SEGMENT: log_segment,
        ITEMS_IN_LOG: items_in_log,
    }
    return Snapshot(arrays, meta)


def restore_state(
    snapshot: Snapshot,
    cfg: Config,
    item_spec: ItemSpec,
    value_checks: list[ValueCheck],
    refill: Refill | None = None,
) -> ReplayState:
    """``snapshot`` loaded into a new state of ``cfg``, its item values passing
    ``value_checks``; ``refill`` puts back the items of a snapshot that left them in the chunk
    log. Raises ``SnapshotError`` for anything that does not fit."""
    layout, empty = snapshot_layout(cfg, item_spec), new_state(cfg, item_spec)
    try:
        return _restore_state(snapshot, layout, empty, value_checks, cfg.actor.num_actors, refill)
    except SnapshotError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise SnapshotError(f"{type(exc).__name__}: {exc}") from exc


def _restore_state(
    snapshot: Snapshot,
    layout: dict,
    empty: ReplayState,
    value_checks: list[ValueCheck],
    num_actors: int,
    refill: Refill | None,
) -> ReplayState:
    meta, arrays = snapshot.meta, snapshot.arrays
    items_in_log = meta.get(ITEMS_IN_LOG, False)
    if not isinstance(items_in_log, bool):
        raise SnapshotError(f"{ITEMS_IN_LOG} is {items_in_log!r}, not true or false")
    check_layout(meta["layout"], layout, arrays, items_in_log)
    log_segment = meta.get(LOG_SEGMENT, 0)
    if isinstance(log_segment, bool) or not isinstance(log_segment, int) or log_segment < 0:
        raise SnapshotError(f"{LOG_SEGMENT} is {log_segment!r}, not a segment number")
    if items_in_log:
        if refill is None:
            raise SnapshotError("its items are in the chunk log, which is not read here")
        size, next_key = int(meta["table"]["size"]), int(meta["table"]["next_key"])
        if not 0 <= size <= next_key:
            raise SnapshotError(f"a table of {size} items up to key {next_key}")
        refill(empty.table, next_key - size, next_key, log_segment)
    empty.table.import_state(arrays, meta["table"], items_held=items_in_log)
    if not items_in_log:  # those from the log were checked as they went back
        items = {n[len("field/") :]: a for n, a in arrays.items() if n.startswith("field/")}
        check_item_values(value_checks, items)
    empty.limiter.restore(meta["limiter"]["num_inserted"], meta["limiter"]["num_sampled"])
    counters = meta["counters"]
    empty.run.restore(counters, meta)
    by_rank = {int(rank): int(count) for rank, count in meta["priority_updates_by_rank"].items()}
    if any(rank < 0 or count < 0 for rank, count in by_rank.items()):
        raise SnapshotError("priority_updates_by_rank holds negative ranks or counts")
    rng = np.random.default_rng()
    rng.bit_generator.state = meta["rng"]
    written_at = float(meta["written_at"])
    if not math.isfinite(written_at):
        raise SnapshotError(f"written_at {written_at} is not a time")
    priority_updates = int(counters["priority_updates"])
    counts = ItemCounts.restore(meta.get("items", {}))
    chunks = StoredChunks.restore(meta.get("stored_chunks", []), num_actors)
    return ReplayState(
        empty.table, empty.limiter, rng, empty.run, priority_updates, by_rank, counts, chunks
    )


def log_segment_of(snapshot: Snapshot) -> int:
    """The first chunk log segment ``snapshot`` does not hold (0: it holds none)."""
    return int(snapshot.meta.get(LOG_SEGMENT, 0))


def check_layout(
    found: dict, layout: dict, arrays: dict[str, np.ndarray], items_in_log: bool = False
) -> None:
    """A snapshot's table is one of ``layout``: the same layout and the arrays it implies (none
    of the items' when they are in the chunk log)."""
    if found != layout:
        differ = sorted(k for k in layout if found.get(k) != layout[k])
        raise SnapshotError(
            f"its layout differs from this config's in {', '.join(differ) or 'extra keys'}: "
            f"the snapshot has { ({k: found.get(k) for k in differ}) }, "
            f"the config { ({k: layout[k] for k in differ}) }"
        )
    expected = set() if items_in_log else {f"field/{name}" for name in layout["item_spec"]}
    if "frames" in layout and not items_in_log:
        expected |= {f"field/frame_ring/{name}" for name in ("frames", "chunks", "next_key")}
    expected.add("priorities" if layout["kind"] == "prioritized" else "times_sampled")
    if set(arrays) != expected:
        raise SnapshotError(f"it holds arrays {sorted(arrays)}, expected {sorted(expected)}")

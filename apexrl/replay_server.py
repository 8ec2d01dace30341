"""Replay server: stores actors' items in a prioritized table (Ape-X, R2D2) or a FIFO queue
(IMPALA, PPO) and serves batches to learners, under a samples-per-insert rate limiter.

Binds:  ROUTER cfg.net.replay_addr
        in:  TrajectoryChunk -> InsertAck (held back while the rate limiter blocks inserts or a
                                FIFO queue is full, so an actor with one chunk in flight is
                                slowed down, never dropped)
             SampleRequest   -> SampleBatch (held back until sampling is allowed)
             PriorityUpdate, ActorReport -> no reply
             StatsRequest    -> Stats
             RestoreCounters -> Stats (a resumed run's env steps become the floor of the count)
             Shutdown        -> the server stops; for a short grace period it answers every
                                request, held ones included, with Shutdown so actors stop too
             anything malformed or unexpected, or that no actor or learner of this config
             would send (``ReplayService`` lists the checks) -> Error, counted in
                                replay/rejected_messages; the message changes nothing

The replay server is also where actors' episode reports meet: it keeps the run's total of
training env steps (counted from inserted chunks, so it describes the data in the table) and the
recent training and evaluation returns, and serves them in ``Stats`` to the learner, which decides
when the run is done, and to every role, which writes its TensorBoard scalars at that count: one
x-axis for the whole run. The custom metrics of the run's callbacks (``apexrl.callbacks``) that
training actors report are served as ``custom/<name>``: the mean of the last
``CUSTOM_METRIC_WINDOW`` interval means reported under that name, for at most
``MAX_CUSTOM_METRICS`` names (the first ones reported; later names are ignored, logged once).

Snapshots (``replay/snapshot.py``): every ``replay.snapshot_interval_s`` and at a clean stop the
server writes its table (items, keys, priorities or delivery counts), the rate limiter's counters
and the run's counters to ``<run dir>/replay_snapshot/``, and at start it loads the one there, so
a replay server that is killed and started again goes on with the same items under the same keys
(a learner's priority updates for them still apply). The server loop pauses only to copy the
table; a thread writes the copy. A snapshot that does not fit this config or is corrupt is
refused with one log line, set aside, and the server starts empty.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import zmq

from apexrl import lifecycle
from apexrl.callbacks import CUSTOM_METRIC_WINDOW, CUSTOM_PREFIX
from apexrl.config import Config
from apexrl.metrics import MetricsWriter, RateMeter
from apexrl.replay.actors import ActorProgress, actor_name, actor_stats
from apexrl.replay.admission import (
    MAX_ABS_RETURN,
    MAX_RUN_ENV_STEPS,
    check_id,
    check_item_values,
    check_priority_update,
    check_report,
    check_sample_request,
    check_table,
    env_spaces,
    item_value_checks,
)
from apexrl.replay.snapshot import (
    FORMAT_VERSION,
    SNAPSHOT_FILE,
    Snapshot,
    SnapshotError,
    SnapshotWriter,
    WriteResult,
    read_snapshot,
    remove_partial_writes,
    snapshot_dir,
)
from apexrl.replay.tables import FifoQueue, RateLimiter, check_priorities, make_table
from apexrl.transport import auth, sockets
from apexrl.transport.messages import (
    MAX_CUSTOM_METRICS,
    ActorReport,
    Error,
    InsertAck,
    Message,
    PriorityUpdate,
    RestoreCounters,
    SampleBatch,
    SampleRequest,
    Shutdown,
    Stats,
    StatsRequest,
    TrajectoryChunk,
)

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 3.0  # seconds a stopping server keeps answering Shutdown
TRAIN_RETURN_WINDOW = 100  # training episodes in replay/train_return_mean
MAX_MESSAGES_PER_PASS = 64  # messages handled before held inserts and samples are served


@dataclass(frozen=True)
class Reply:
    identity: bytes
    message: Message


class ReplayService:
    """The replay server's state and message handling, kept apart from the socket loop so it can
    be tested without sockets. ``handle`` and ``drain`` return the replies to send.

    Every message is checked against what a peer of this config can send before it touches any
    state; one that fails is answered with ``Error``, counted in ``replay/rejected_messages`` and
    changes nothing:

    - chunks: the table's name, an actor id in ``0..actor.num_actors-1``, 1 to ``cfg.chunk_items``
      items, at most ``algo.max_env_steps_per_chunk`` env steps, priorities in
      ``[0, MAX_PRIORITY]``, exactly the fields, dtypes and shapes of ``algo.item_spec`` (the
      table's storage is allocated from it at start), finite floats, bools that are 0 or 1, and
      Discrete actions in ``0..n-1``;
    - sample requests: the table's name and at most ``learner.batch_size`` items;
    - priority updates: the table's name, a rank in ``0..learner.world_size-1``, int64 keys and
      priorities in ``[0, MAX_PRIORITY]``;
    - actor reports and ``RestoreCounters``: the ``MAX_*`` bounds of ``replay/admission.py``;
    - held chunks (count and bytes) and held sample requests are bounded by ``replay.*`` keys.

    The checks that need only the config and the item spec are the functions of
    ``replay/admission.py``; those on the table's room and on what is held are made here.

    A ``ValueError`` while handling a message is such a refusal. Any other exception is a bug; it
    is answered with ``Error`` and counted as well, and logged once with its traceback per message
    kind, so that no message can end the server.
    """

    def __init__(self, cfg: Config, seed: int = 0) -> None:
        self.cfg = cfg
        self.table_name = cfg.replay.table
        obs_space, action_space = env_spaces(cfg)
        self.item_spec = cfg.algo.item_spec(obs_space, action_space)
        # Discrete actions are checked against their range; Box ones are floats, checked finite.
        self.num_actions: int | None = None
        if isinstance(action_space, gym.spaces.Discrete):
            self.num_actions = int(action_space.n)
        self.int_ranges = cfg.algo.item_int_ranges()
        self.value_checks = item_value_checks(
            self.item_spec, self.int_ranges, cfg.algo.ACTION_FIELDS, self.num_actions
        )
        self.max_chunk_items = cfg.chunk_items
        self.max_chunk_env_steps = cfg.algo.max_env_steps_per_chunk(
            cfg.actor.chunk_steps, cfg.env.num_envs
        )
        item_bytes = sum(
            np.dtype(dtype).itemsize * math.prod(shape) for dtype, shape in self.item_spec.values()
        )
        chunk_bytes = self.max_chunk_items * (item_bytes + 8)  # + a float64 priority per item
        if cfg.replay.max_pending_insert_bytes < chunk_bytes:
            raise lifecycle.StartupError(
                f"replay.max_pending_insert_bytes {cfg.replay.max_pending_insert_bytes} is less "
                f"than one chunk of {self.max_chunk_items} items ({chunk_bytes} bytes); raise it"
            )
        # The FIFO options default to a queue that delivers each item once and never drops an
        # unread one, for configs that do not have these keys.
        self.table = make_table(
            cfg.replay.kind,
            cfg.replay.capacity,
            cfg.replay.priority_exponent,
            max_times_sampled=cfg.replay.max_times_sampled,
            evict_unread=cfg.replay.evict_unread,
            spec=self.item_spec,
        )
        self.limiter = RateLimiter(
            samples_per_insert=cfg.replay.samples_per_insert,
            min_size_to_sample=cfg.replay.min_size_to_sample,
            error_buffer=cfg.rate_error_buffer,
        )
        self.rng = np.random.default_rng(seed)
        # (peer, chunk, its bytes) and (peer, request), oldest first
        self.pending_inserts: collections.deque[tuple[bytes, TrajectoryChunk, int]] = (
            collections.deque()
        )
        self.pending_insert_bytes = 0
        self.pending_samples: collections.deque[tuple[bytes, SampleRequest]] = collections.deque()
        self.rejected_messages = 0
        self.failed_kinds: set[str] = set()  # message kinds whose handling raised (logged once)
        self.priority_updates_applied = 0  # items whose priority changed
        self.priority_updates_by_rank: dict[int, int] = {}  # PriorityUpdate messages per learner
        self.env_steps = 0  # the run's training env steps (resumed runs: from the checkpoint on)
        self.eval_env_steps = 0
        self.train_episodes = 0
        self.eval_episodes = 0
        self.train_returns: collections.deque[float] = collections.deque(maxlen=TRAIN_RETURN_WINDOW)
        self.eval_returns: collections.deque[float] = collections.deque(
            maxlen=cfg.run.stop_eval_episodes
        )
        # The weights version each of those episodes was played with (-1: unknown, restored).
        self.eval_versions: collections.deque[int] = collections.deque(
            maxlen=cfg.run.stop_eval_episodes
        )
        self.eval_rounds = 0  # evaluation reports with episodes in them
        # Training actors' custom metrics: name -> the last interval means reported
        self.custom_metrics: dict[str, collections.deque[float]] = {}
        self.custom_names_refused = False  # logged once: a name over MAX_CUSTOM_METRICS
        self.actors_last_seen: dict[tuple[bool, int], float] = {}  # (is_eval, actor id)
        self.actor_progress: dict[tuple[bool, int], ActorProgress] = {}  # from their reports
        self.stopping = False
        self.last_snapshot: WriteResult | None = None

    # -- dispatch --------------------------------------------------------------------------------

    def reject(self, identity: bytes, reason: str) -> list[Reply]:
        self.rejected_messages += 1
        log.warning("rejected a message: %s", reason)
        return [Reply(identity, Error(reason))]

    def handle(self, identity: bytes, msg: Message) -> list[Reply]:
        if self.stopping:
            return [Reply(identity, Shutdown("replay server is stopping"))]
        try:
            return self._dispatch(identity, msg)
        except Exception as exc:  # the last line of defence: one message never ends the server
            return self._error_replies(identity, msg, exc)

    def _error_replies(self, identity: bytes, msg: Message, exc: Exception) -> list[Reply]:
        """The answer to a message whose handling raised: a refusal (``ValueError``) or a bug."""
        if isinstance(exc, ValueError):
            return self.reject(identity, str(exc))
        kind = type(msg).__name__
        self.rejected_messages += 1
        if kind in self.failed_kinds:
            log.error("handling a %s failed again: %s: %s", kind, type(exc).__name__, exc)
        else:
            self.failed_kinds.add(kind)
            log.error("handling a %s failed; answered with Error", kind, exc_info=exc)
        return [Reply(identity, Error(f"replay server failed to handle a {kind}"))]

    def _dispatch(self, identity: bytes, msg: Message) -> list[Reply]:
        """Handle one message; a ``ValueError`` refuses it before any state changed."""
        if isinstance(msg, TrajectoryChunk):
            self._admit_chunk(identity, msg)
            return []
        if isinstance(msg, SampleRequest):
            self._check_sample_request(msg)
            self.pending_samples.append((identity, msg))
            return []
        if isinstance(msg, PriorityUpdate):
            check_priority_update(msg, self.cfg)
            self.priority_updates_applied += self.table.update_priorities(msg.keys, msg.priorities)
            by_rank = self.priority_updates_by_rank
            by_rank[msg.learner_rank] = by_rank.get(msg.learner_rank, 0) + 1
            return []
        if isinstance(msg, ActorReport):
            check_report(msg, self.cfg, self.eval_env_steps)
            self._on_report(msg)
            return []
        if isinstance(msg, StatsRequest):
            values = {**self.stats(), **self.actors_stats()}
            return [Reply(identity, Stats(role="replay", values=values))]
        if isinstance(msg, RestoreCounters):
            if msg.env_steps > MAX_RUN_ENV_STEPS:
                raise ValueError(
                    f"RestoreCounters env_steps {msg.env_steps} exceeds {MAX_RUN_ENV_STEPS}"
                )
            if msg.env_steps > self.env_steps:
                log.info("the run resumes at %d env steps", msg.env_steps)
            self.env_steps = max(self.env_steps, msg.env_steps)
            return [Reply(identity, Stats(role="replay", values=self.stats()))]
        if isinstance(msg, Shutdown):
            log.info("shutdown requested: %s", msg.reason)
            return self.begin_shutdown()
        raise ValueError(f"replay server does not accept {type(msg).__name__}")

    def _admit_chunk(self, identity: bytes, chunk: TrajectoryChunk) -> None:
        """Check a chunk against what this config's actors send and hold it for ``drain``."""
        cfg = self.cfg
        check_table(chunk.table, cfg)
        check_id("actor_id", chunk.actor_id, cfg.actor.num_actors, "actor.num_actors")
        num_items = chunk.priorities.shape[0]
        self.table.can_insert(num_items)  # raises for a chunk that never fits
        if num_items < 1:
            raise ValueError("a chunk needs at least one item")
        if num_items > self.max_chunk_items:
            raise ValueError(
                f"a chunk of {num_items} items is more than an actor sends: at most "
                f"{self.max_chunk_items} ({cfg.algorithm} with actor.chunk_steps "
                f"{cfg.actor.chunk_steps} and env.num_envs {cfg.env.num_envs})"
            )
        if chunk.env_steps > self.max_chunk_env_steps:
            raise ValueError(
                f"a chunk's env_steps {chunk.env_steps} is more than an actor's chunk carries: "
                f"at most {self.max_chunk_env_steps} ({cfg.algorithm} with actor.chunk_steps "
                f"{cfg.actor.chunk_steps} and env.num_envs {cfg.env.num_envs})"
            )
        check_priorities(chunk.priorities, num_items)
        if len(self.pending_inserts) >= cfg.replay.max_pending_inserts:
            raise ValueError("too many inserts waiting; retry later")
        num_bytes = chunk.priorities.nbytes + sum(a.nbytes for a in chunk.fields.values())
        if self.pending_insert_bytes + num_bytes > cfg.replay.max_pending_insert_bytes:
            raise ValueError(
                f"too many bytes of inserts waiting ({self.pending_insert_bytes} + {num_bytes} > "
                f"replay.max_pending_insert_bytes {cfg.replay.max_pending_insert_bytes}); "
                "retry later"
            )
        self.table.check_items(chunk.fields)  # names, dtypes and shapes of the item spec
        self._check_item_values(chunk.fields)
        self.actors_last_seen[(False, chunk.actor_id)] = time.monotonic()
        self.pending_inserts.append((identity, chunk, num_bytes))
        self.pending_insert_bytes += num_bytes

    def _check_item_values(self, fields: dict[str, np.ndarray]) -> None:
        """Finite floats, bools stored as 0 or 1, Discrete actions and the algorithm's integer
        fields in range (``fields`` match the item spec already)."""
        check_item_values(self.value_checks, fields)

    def _check_sample_request(self, request: SampleRequest) -> None:
        check_sample_request(request, self.cfg)
        if len(self.pending_samples) >= self.cfg.replay.max_pending_samples:
            raise ValueError("too many sample requests waiting; retry later")

    def _on_report(self, report: ActorReport) -> None:
        now = time.monotonic()
        key = (report.is_eval, report.actor_id)
        self.actors_last_seen[key] = now
        progress = self.actor_progress.setdefault(key, ActorProgress())
        progress.env_steps += report.env_steps
        progress.weights_version = report.weights_version
        progress.marks.append((now, progress.env_steps))
        returns = report.episode_returns.tolist()
        if report.is_eval:
            self.eval_env_steps += report.env_steps
            self.eval_episodes += len(returns)
            self.eval_returns.extend(returns)
            self.eval_versions.extend([report.weights_version] * len(returns))
            self.eval_rounds += bool(returns)
        else:
            self.train_episodes += len(returns)
            self.train_returns.extend(returns)
            self._add_custom_metrics(report.custom_metrics)

    def _add_custom_metrics(self, values: dict[str, float]) -> None:
        for name, value in values.items():
            window = self.custom_metrics.get(name)
            if window is None:
                if len(self.custom_metrics) >= MAX_CUSTOM_METRICS:
                    if not self.custom_names_refused:
                        self.custom_names_refused = True
                        log.warning(
                            "custom metric %r ignored: the run reports more than %d names; "
                            "later new names are ignored too",
                            name,
                            MAX_CUSTOM_METRICS,
                        )
                    continue
                window = self.custom_metrics[name] = collections.deque(maxlen=CUSTOM_METRIC_WINDOW)
            window.append(value)

    def drain(self) -> list[Reply]:
        """Admit held inserts and serve held sample requests as far as the rate limiter allows and,
        for inserts, a FIFO queue has room: a chunk waits at the head of the line until then.

        A held message whose handling raises is answered with ``Error`` and dropped; the others
        carry on."""
        replies: list[Reply] = []
        progress = True
        while progress:
            inserted, progress = self._insert_held()
            replies += inserted
            while self.pending_samples:
                identity, request = self.pending_samples[0]
                try:
                    batch = self._try_sample(request)
                except Exception as exc:
                    batch = exc
                if batch is None:
                    break  # held
                self.pending_samples.popleft()
                if isinstance(batch, Exception):
                    replies += self._error_replies(identity, request, batch)
                    continue
                replies.append(Reply(identity, batch))
                progress = True
        return replies

    def _insert_held(self) -> tuple[list[Reply], bool]:
        """Insert the held chunks that the rate limiter and the table take now, oldest first.

        Consecutive chunks go in together (``insert_many``: one copy per field for all of them)
        as long as the limiter and the table would take them one after another, and as long as
        they fit in the table together. Returns the replies and whether any chunk went in."""
        replies: list[Reply] = []
        any_inserted = False
        batch: list[tuple[bytes, TrajectoryChunk]] = []
        num_items = 0
        while True:
            admitted = False
            if self.pending_inserts:
                identity, chunk, _ = self.pending_inserts[0]
                total = num_items + chunk.priorities.shape[0]
                try:
                    # Taking ``total`` items now is taking the batch's, then this chunk's.
                    admitted = (not batch or total <= self.table.capacity) and (
                        self.limiter.can_insert(total) and self.table.can_insert(total)
                    )
                except Exception as exc:
                    if not batch:
                        self._pop_held_insert()
                        replies += self._error_replies(identity, chunk, exc)
                        continue
                if admitted:
                    self._pop_held_insert()
                    batch.append((identity, chunk))
                    num_items = total
                    continue
            if not batch:
                return replies, any_inserted
            replies += self._insert_batch(batch)
            any_inserted = True
            batch, num_items = [], 0

    def _pop_held_insert(self) -> None:
        _, _, num_bytes = self.pending_inserts.popleft()
        self.pending_insert_bytes -= num_bytes

    def _insert_batch(self, batch: list[tuple[bytes, TrajectoryChunk]]) -> list[Reply]:
        """Insert admitted chunks (checked once, by ``_admit_chunk``); an ack for each."""
        chunks = [chunk for _, chunk in batch]
        size = self.table.size
        try:
            self.table.insert_many(
                [chunk.fields for chunk in chunks], [chunk.priorities for chunk in chunks]
            )
        except Exception as exc:
            return [
                r for identity, chunk in batch for r in self._error_replies(identity, chunk, exc)
            ]
        replies = []
        for identity, chunk in batch:
            num_items = chunk.priorities.shape[0]
            self.limiter.record_insert(num_items)
            self.env_steps += chunk.env_steps
            size = min(size + num_items, self.table.capacity)  # the size after this chunk
            replies.append(Reply(identity, InsertAck(self.table_name, num_items, size)))
        return replies

    def _try_sample(self, request: SampleRequest) -> SampleBatch | None:
        """Serve a held request if the table holds enough and the rate limiter allows it now."""
        batch_size = request.batch_size
        if self.table.size < batch_size or not self.limiter.can_sample(batch_size):
            return None
        table_size = self.table.size
        keys, fields, probabilities = self.table.sample(batch_size, self.rng)
        self.limiter.record_sample(batch_size)
        return SampleBatch(self.table_name, table_size, keys, probabilities, fields)

    def begin_shutdown(self) -> list[Reply]:
        self.stopping = True
        held = [identity for identity, _, _ in self.pending_inserts]
        held += [identity for identity, _ in self.pending_samples]
        self.pending_inserts.clear()
        self.pending_insert_bytes = 0
        self.pending_samples.clear()
        return [Reply(identity, Shutdown("replay server is stopping")) for identity in held]

    def stats(self) -> dict[str, float]:
        now = time.monotonic()
        values = {
            "replay/size": float(self.table.size),
            "replay/num_inserted": float(self.table.num_inserted),
            "replay/num_sampled": float(self.table.num_sampled),
            "replay/rejected_messages": float(self.rejected_messages),
            "replay/pending_inserts": float(len(self.pending_inserts)),
            "replay/pending_insert_bytes": float(self.pending_insert_bytes),
            "replay/pending_samples": float(len(self.pending_samples)),
            "replay/priority_updates": float(self.priority_updates_applied),
            "replay/env_steps": float(self.env_steps),
            "replay/train_episodes": float(self.train_episodes),
            "replay/train_return_mean": _mean(self.train_returns),
            "replay/active_actors": float(
                sum(1 for seen in self.actors_last_seen.values() if now - seen < 30.0)
            ),
            "eval/episodes": float(self.eval_episodes),
            "eval/env_steps": float(self.eval_env_steps),
            "eval/return_mean": _mean(self.eval_returns),
            "eval/episodes_in_window": float(len(self.eval_returns)),
            "eval/version": float(_single_version(self.eval_versions)),
            "eval/rounds": float(self.eval_rounds),
            **{
                f"replay/priority_updates_rank_{rank}": float(count)
                for rank, count in self.priority_updates_by_rank.items()
            },
        }
        for name, window in self.custom_metrics.items():
            values[CUSTOM_PREFIX + name] = _mean(window)
        if isinstance(self.table, FifoQueue):  # items dropped before their last delivery
            values["replay/evicted_unread"] = float(self.table.num_evicted)
        if self.last_snapshot is not None:
            values["replay/snapshot_s"] = self.last_snapshot.total_s
            values["replay/snapshot_items"] = float(self.last_snapshot.num_items)
        return values

    def actors_stats(self) -> dict[str, float]:
        """Each actor's entries (``actor/<id>/...``): what a ``StatsRequest`` gets besides
        ``stats()``. Not part of a snapshot, nor of TensorBoard: who reports now."""
        now = time.monotonic()
        values: dict[str, float] = {}
        for (is_eval, actor_id), progress in self.actor_progress.items():
            values.update(actor_stats(actor_name(is_eval, actor_id), progress, now))
        return values

    # -- snapshots -------------------------------------------------------------------------------

    def layout(self) -> dict:
        """What a snapshot must match to be loaded here (JSON values)."""
        replay = self.cfg.replay
        return {
            "table": self.table_name,
            "kind": replay.kind,
            "capacity": replay.capacity,
            "priority_exponent": replay.priority_exponent,
            "max_times_sampled": replay.max_times_sampled,
            "item_spec": {
                name: [np.dtype(dtype).str, [int(n) for n in shape]]
                for name, (dtype, shape) in self.item_spec.items()
            },
        }

    def progress(self) -> tuple[int, ...]:
        """Changes whenever a snapshot would differ from the last one."""
        table = self.table
        return (
            table.num_inserted,
            table.num_sampled,
            self.priority_updates_applied,
            self.env_steps,
            self.eval_env_steps,
            self.train_episodes,
            self.eval_episodes,
        )

    def export_snapshot(self) -> Snapshot:
        """Copies of everything ``load_snapshot`` needs to go on from here."""
        arrays, table_scalars = self.table.export_state()
        meta = {
            "format_version": FORMAT_VERSION,
            "written_at": time.time(),
            "layout": self.layout(),
            "table": table_scalars,
            "limiter": {
                "num_inserted": self.limiter.num_inserted,
                "num_sampled": self.limiter.num_sampled,
            },
            "counters": {
                "env_steps": self.env_steps,
                "eval_env_steps": self.eval_env_steps,
                "train_episodes": self.train_episodes,
                "eval_episodes": self.eval_episodes,
                "eval_rounds": self.eval_rounds,
                "priority_updates": self.priority_updates_applied,
            },
            "priority_updates_by_rank": {
                str(rank): count for rank, count in self.priority_updates_by_rank.items()
            },
            "train_returns": list(self.train_returns),
            "eval_returns": list(self.eval_returns),
            "eval_versions": list(self.eval_versions),
            "rng": self.rng.bit_generator.state,  # a dict of ints and names: JSON
        }
        return Snapshot(arrays, meta)

    def load_snapshot(self, snapshot: Snapshot) -> None:
        """Go on from ``snapshot``: table, keys, rate limiter and run counters. All or nothing:
        raises ``SnapshotError`` (changing nothing) unless it fits this config exactly and holds
        only what a server of this config could have stored."""
        try:
            self._load_snapshot(snapshot)
        except SnapshotError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise SnapshotError(f"{type(exc).__name__}: {exc}") from exc

    def _load_snapshot(self, snapshot: Snapshot) -> None:
        meta, arrays = snapshot.meta, snapshot.arrays
        layout = self.layout()
        if meta["layout"] != layout:
            differ = sorted(k for k in layout if meta["layout"].get(k) != layout[k])
            raise SnapshotError(
                f"its layout differs from this config's in {', '.join(differ) or 'extra keys'}: "
                f"the snapshot has { ({k: meta['layout'].get(k) for k in differ}) }, "
                f"the config { ({k: layout[k] for k in differ}) }"
            )
        expected = {f"field/{name}" for name in self.item_spec}
        expected.add("priorities" if self.cfg.replay.kind == "prioritized" else "times_sampled")
        if set(arrays) != expected:
            raise SnapshotError(f"it holds arrays {sorted(arrays)}, expected {sorted(expected)}")
        table = make_table(
            self.cfg.replay.kind,
            self.cfg.replay.capacity,
            self.cfg.replay.priority_exponent,
            max_times_sampled=self.cfg.replay.max_times_sampled,
            evict_unread=self.cfg.replay.evict_unread,
            spec=self.item_spec,
        )
        table.import_state(arrays, meta["table"])
        items = {
            name[len("field/") :]: a for name, a in arrays.items() if name.startswith("field/")
        }
        self._check_item_values(items)
        limiter = RateLimiter(
            samples_per_insert=self.limiter.samples_per_insert,
            min_size_to_sample=self.limiter.min_size_to_sample,
            error_buffer=self.limiter.error_buffer,
        )
        limiter.restore(meta["limiter"]["num_inserted"], meta["limiter"]["num_sampled"])
        counters = meta["counters"]
        for name in ("env_steps", "eval_env_steps", "train_episodes", "eval_episodes"):
            value = counters[name]
            if isinstance(value, bool) or not isinstance(value, int):
                raise SnapshotError(f"counter {name} is {value!r}, not an int")
            if not 0 <= value <= MAX_RUN_ENV_STEPS:
                raise SnapshotError(f"counter {name} {value} is outside 0..{MAX_RUN_ENV_STEPS}")
        returns = {}
        for name in ("train_returns", "eval_returns"):
            values = np.asarray(meta[name], dtype=np.float64)
            if values.ndim != 1 or not np.all(np.abs(values) <= MAX_ABS_RETURN):
                raise SnapshotError(f"{name} must be a list of returns within +-{MAX_ABS_RETURN:g}")
            returns[name] = values.tolist()
        # The weights version of each evaluation return (snapshots before they were kept: -1).
        eval_versions = meta.get("eval_versions", [-1] * len(returns["eval_returns"]))
        versions = np.asarray(eval_versions, dtype=np.int64)
        if versions.shape != (len(returns["eval_returns"]),) or versions.min(initial=0) < -1:
            raise SnapshotError("eval_versions must be one version >= -1 per evaluation return")
        eval_rounds = counters.get("eval_rounds", 0)
        if isinstance(eval_rounds, bool) or not isinstance(eval_rounds, int) or eval_rounds < 0:
            raise SnapshotError(f"counter eval_rounds is {eval_rounds!r}, not an int >= 0")
        by_rank = {
            int(rank): int(count) for rank, count in meta["priority_updates_by_rank"].items()
        }
        if any(rank < 0 or count < 0 for rank, count in by_rank.items()):
            raise SnapshotError("priority_updates_by_rank holds negative ranks or counts")
        rng = np.random.default_rng()
        rng.bit_generator.state = meta["rng"]
        written_at = float(meta["written_at"])
        if not math.isfinite(written_at):
            raise SnapshotError(f"written_at {written_at} is not a time")
        # Everything checked: take it over.
        self.table, self.limiter, self.rng = table, limiter, rng
        self.env_steps = counters["env_steps"]
        self.eval_env_steps = counters["eval_env_steps"]
        self.train_episodes = counters["train_episodes"]
        self.eval_episodes = counters["eval_episodes"]
        self.priority_updates_applied = int(counters["priority_updates"])
        self.priority_updates_by_rank = by_rank
        self.train_returns.clear()
        self.train_returns.extend(returns["train_returns"])
        self.eval_returns.clear()
        self.eval_returns.extend(returns["eval_returns"])
        self.eval_versions.clear()
        self.eval_versions.extend(versions.tolist())
        self.eval_rounds = eval_rounds


def _mean(values: collections.deque[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def _single_version(versions: collections.deque[int]) -> int:
    """The weights version every episode of the window was played with; -1 when they differ,
    are unknown or there are none."""
    if not versions or versions[0] < 0 or versions.count(versions[0]) != len(versions):
        return -1
    return versions[0]


def restore_snapshot(service: ReplayService, directory: Path) -> None:
    """Load ``directory``'s snapshot into a fresh ``service``, if there is one. One that cannot be
    used is refused with one log line and renamed aside (so the next snapshot does not overwrite
    it), and the service stays empty."""
    removed = remove_partial_writes(directory)
    if removed:
        log.warning("removed %d unfinished snapshot write(s) in %s", removed, directory)
    path = directory / SNAPSHOT_FILE
    if not path.is_file():
        return
    try:
        snapshot = read_snapshot(path)
        service.load_snapshot(snapshot)
    except SnapshotError as exc:
        aside = path.with_name(f"refused-{time.strftime('%Y%m%d-%H%M%S')}-{SNAPSHOT_FILE}")
        try:
            os.replace(path, aside)
            kept = f"kept as {aside}"
        except OSError as move_error:
            kept = f"could not set it aside: {move_error}"
        log.error("refused the replay snapshot %s: %s; starting empty (%s)", path, exc, kept)
        return
    if service.cfg.run.resume and service.eval_returns:
        # A resumed run's stop condition judges this session's evaluation episodes only.
        log.info(
            "a resumed run: the snapshot's %d evaluation returns are not counted",
            len(service.eval_returns),
        )
        service.eval_returns.clear()
        service.eval_versions.clear()
    table = service.table
    log.info(
        "loaded the replay snapshot %s: %d items (keys %d..%d), %d env steps, written %.1f s ago",
        path,
        table.size,
        table.num_inserted - table.size,
        table.num_inserted - 1,
        service.env_steps,
        time.time() - snapshot.meta["written_at"],
    )


def start_snapshot(service: ReplayService, writer: SnapshotWriter) -> None:
    """Copy the service's state (the pause in the server loop) and let ``writer`` write it."""
    started = time.monotonic()
    snapshot = service.export_snapshot()
    writer.start(snapshot, service.progress(), service.table.size, time.monotonic() - started)


def note_snapshot(service: ReplayService, result: WriteResult | None) -> None:
    if result is None:
        return
    service.last_snapshot = result
    log.info(
        "replay snapshot: %d items, %.1f MB in %.3f s (%.3f s of it copying in the server loop)",
        result.num_items,
        result.num_bytes / 1e6,
        result.total_s,
        result.copy_s,
    )


def write_final_snapshot(service: ReplayService, writer: SnapshotWriter) -> None:
    """At a clean stop: wait for a write in progress, then write the state as it is now unless
    that is on disk already."""
    note_snapshot(service, writer.join())
    if service.progress() == writer.written_progress:
        return
    snapshot = service.export_snapshot()
    try:
        result = writer.write_now(snapshot, service.progress(), service.table.size)
    except OSError as exc:
        log.error("writing the final replay snapshot to %s failed: %s", writer.directory, exc)
        return
    note_snapshot(service, result)


def main(cfg: Config) -> int:
    """Run the replay server until SIGINT/SIGTERM or a ``Shutdown`` message; returns 0."""
    stop = lifecycle.install_stop_handlers()
    service = ReplayService(cfg)
    snapshot_interval_s = cfg.replay.snapshot_interval_s
    snapshots: SnapshotWriter | None = None
    if snapshot_interval_s > 0:
        directory = snapshot_dir(cfg.run_dir)
        restore_snapshot(service, directory)
        snapshots = SnapshotWriter(directory, progress=service.progress())
    elif (snapshot_dir(cfg.run_dir) / SNAPSHOT_FILE).exists():
        log.info(
            "replay.snapshot_interval_s is 0: the replay snapshot in %s is not loaded", cfg.run_dir
        )
    last_snapshot = time.monotonic()
    writer = MetricsWriter(cfg.run_dir / "tb" / "replay")
    inserts, samples = RateMeter(), RateMeter()
    ctx = sockets.make_context()
    sock = sockets.bind(
        ctx, zmq.ROUTER, cfg.net.replay_addr, curve=auth.server_keys(cfg.net, "replay")
    )
    log.info(
        "replay server on %s (%s, capacity %d)",
        sockets.bound_address(sock),
        cfg.replay.kind,
        cfg.replay.capacity,
    )
    stopping_since: float | None = None
    last_report = time.monotonic()
    try:
        while not stop.is_set():
            # Handle every message that is ready (up to a bound) before the table work in drain():
            # one message per pass would run drain() and the clock checks once per message.
            replies: list[Reply] = []
            received = sockets.recv_from(sock, timeout_ms=50)
            num_handled = 0
            while received is not None:
                refused = received.error or auth.refusal(received.role, received.message)
                if refused is not None:
                    replies += service.reject(received.identity, str(refused))
                else:
                    replies += service.handle(received.identity, received.message)
                num_handled += 1
                if (
                    num_handled >= MAX_MESSAGES_PER_PASS
                    or len(service.pending_inserts) >= cfg.replay.max_pending_inserts
                ):
                    break  # serve what is held before reading on, so no chunk is refused for it
                received = sockets.recv_from(sock, timeout_ms=0)
            if service.stopping:
                stopping_since = stopping_since or time.monotonic()
                if time.monotonic() - stopping_since > SHUTDOWN_GRACE_S:
                    break
            else:
                before = (service.table.num_inserted, service.table.num_sampled)
                replies += service.drain()
                inserts.add(service.table.num_inserted - before[0])
                samples.add(service.table.num_sampled - before[1])
            for reply in replies:
                sockets.send_to(sock, reply.identity, reply.message)
            if snapshots is not None and not service.stopping:
                note_snapshot(service, snapshots.poll())
                due = time.monotonic() - last_snapshot >= snapshot_interval_s
                if due and snapshots.idle:
                    last_snapshot = time.monotonic()
                    if service.progress() != snapshots.written_progress:
                        start_snapshot(service, snapshots)
            if time.monotonic() - last_report >= cfg.replay.report_interval_s:
                last_report = time.monotonic()
                values = service.stats()
                values["replay/inserts_per_s"] = inserts.rate()
                values["replay/samples_per_s"] = samples.rate()
                writer.scalars(values, step=service.env_steps)
        # A clean stop (not an exception): the snapshot to go on from.
        if snapshots is not None:
            write_final_snapshot(service, snapshots)
    finally:
        writer.scalars(service.stats(), step=service.env_steps)  # the curve's last point
        writer.close()
        sock.close(linger=0)
        ctx.term()
    log.info("replay server stopped")
    return 0

"""The replay server's service: one table, its rate limiter and what is held back, the checks
that need their state, the run's bookkeeping, and what goes in a snapshot; ``handle`` and
``drain`` map messages to replies without any socket, so it is tested without one. The server
loop around it is ``apexrl.replay_server``; a multi-agent run's server holds one per trained
policy (``apexrl.multiagent.replay_tables``).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Sequence

import gymnasium as gym

from apexrl.config import Config
from apexrl.replay import admission
from apexrl.replay.actors import ActorRoster
from apexrl.replay.chunk_log import Buffer, ChunkLog
from apexrl.replay.held import HeldInsert, HeldInserts
from apexrl.replay.reporting import service_stats
from apexrl.replay.serving import Reply
from apexrl.replay.snapshot import Snapshot, WriteResult
from apexrl.replay.state import (
    Refill,
    ReplayState,
    export_snapshot,
    new_state,
    restore_state,
    snapshot_layout,
)
from apexrl.replay.tables import FifoQueue, PrioritizedTable
from apexrl.replay.versions import VersionWait, check_named_versions, named_versions
from apexrl.runtime import rundir
from apexrl.transport.codec import encode
from apexrl.transport.frames import check_frame_refs, config_frame_layout
from apexrl.transport.messages import (
    ActorReport,
    Error,
    InsertAck,
    Message,
    PriorityUpdate,
    PublishedVersion,
    RestoreCounters,
    SampleBatch,
    SampleRequest,
    Shutdown,
    Stats,
    StatsRequest,
    TrajectoryChunk,
)

log = logging.getLogger("apexrl.replay_server")  # the replay server's log lines


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
      Discrete actions in ``0..n-1``; with stacked frames stored once (``transport/frames.py``),
      uint8 frames of the frame shape, no more than its references and than the frame ring
      holds, and every reference inside the chunk's own frames;
    - sample requests: the table's name and at most ``learner.batch_size`` items;
    - priority updates: the table's name, a rank in ``0..learner.world_size-1``, int64 keys and
      priorities in ``[0, MAX_PRIORITY]``;
    - actor reports and ``RestoreCounters``: the ``MAX_*`` bounds of ``replay/admission.py``;
    - held chunks (count and bytes) and held sample requests are bounded by ``replay.*`` keys.

    The checks that need only the config and the item spec are the functions of
    ``replay/admission.py``; those on the table's room are made here, those on what is held by
    ``replay/held.py``.

    A ``ValueError`` while handling a message is such a refusal. Any other exception is a bug; it
    is answered with ``Error`` and counted as well, and logged once with its traceback per message
    kind, so that no message can end the server.
    """

    def __init__(self, cfg: Config, seed: int = 0, agents_per_env: int = 1) -> None:
        self.cfg = cfg
        self.snapshot_dir = rundir.replay_snapshot_dir(cfg.run_dir)  # its snapshot and chunk log
        self.table_name = cfg.replay.table
        obs_space, action_space = admission.env_spaces(cfg)
        self.item_spec = cfg.algo.item_spec(obs_space, action_space)
        # Discrete actions are checked against their range; Box ones are floats, checked finite
        # and, for a policy that acts in [-1, 1], inside it.
        num_actions = None
        if isinstance(action_space, gym.spaces.Discrete):
            num_actions = int(action_space.n)
        self.value_checks = admission.item_value_checks(
            self.item_spec,
            cfg.algo.item_int_ranges(),
            cfg.algo.ACTION_FIELDS,
            num_actions,
            # a packed hybrid row also holds Discrete indices: its Box values are clipped
            cfg.unit_actions and type(action_space) is gym.spaces.Box,
        ) + admission.nested_value_checks(
            obs_space, action_space, self.item_spec, cfg.algo.ACTION_FIELDS
        )
        self.bounds = admission.chunk_bounds(cfg, self.item_spec, agents_per_env)
        self.frame_layout = config_frame_layout(cfg, self.item_spec)  # None: whole observations
        admission.check_pending_bytes(cfg, self.bounds)
        # The table, the rate limiter, the rng, the run's bookkeeping and the priority updates
        self.hold(new_state(cfg, self.item_spec, seed))
        # held chunks (replay/held.py) and held sample requests (peer, request), oldest first
        replay = cfg.replay
        self.pending_inserts = HeldInserts(
            replay.max_pending_inserts, replay.max_pending_insert_bytes
        )
        self.pending_samples: collections.deque[tuple[bytes, SampleRequest]] = collections.deque()
        self.rejected_messages = 0
        self.failed_kinds: set[str] = set()  # message kinds whose handling raised (logged once)
        self.gates = admission.role_gates(cfg, self.bounds)  # checked before decoding
        carried = cfg.algo.carried_steps(cfg.env.num_envs)
        self.actors = ActorRoster(carried, admission.report_slack(cfg, self.bounds))
        # Chunks and reports that name a weights version no learner announced yet
        self.version_wait = VersionWait(2 * cfg.actor.num_actors + admission.NUM_EVAL_ACTOR_IDS)
        self.stopping = False
        self.last_snapshot: WriteResult | None = None
        self.chunk_log: ChunkLog | None = None  # with replay.durable: where stored chunks go
        self._arrived: tuple[Message, Sequence[Buffer]] | None = None  # a message, its frames

    def hold(self, state: ReplayState) -> None:
        """Go on from ``state``: a new one, or one restored from a snapshot."""
        self.table, self.limiter = state.table, state.limiter
        self.rng, self.run = state.rng, state.run
        self.priority_updates_applied = state.priority_updates  # items whose priority changed
        self.priority_updates_by_rank = state.priority_updates_by_rank  # messages per learner
        self.counts, self.chunks = state.counts, state.chunks  # items' fates, chunk numbers

    # -- dispatch --------------------------------------------------------------------------------

    def reject(self, identity: bytes, reason: str) -> list[Reply]:
        self.rejected_messages += 1
        log.warning("rejected a message: %s", reason)
        return [Reply(identity, Error(reason))]

    def handle(
        self, identity: bytes, msg: Message, frames: Sequence[Buffer] | None = None
    ) -> list[Reply]:
        """The replies to ``msg`` (``frames``: its frames off the wire, for the chunk log)."""
        if isinstance(msg, TrajectoryChunk):
            self.counts.received += _num_items(msg)
            self._arrived = None if frames is None else (msg, frames)
        return self._handle(identity, msg)

    def _handle(self, identity: bytes, msg: Message) -> list[Reply]:
        """``handle`` of a message counted as received already (one that waited)."""
        if self.stopping:
            if isinstance(msg, TrajectoryChunk):
                self.counts.refused += _num_items(msg)
            return [Reply(identity, Shutdown("replay server is stopping"))]
        try:
            return self._dispatch(identity, msg)
        except Exception as exc:  # the last line of defence: one message never ends the server
            return self._error_replies(identity, msg, exc)

    def _error_replies(self, identity: bytes, msg: Message, exc: Exception) -> list[Reply]:
        """The answer to a message whose handling raised: a refusal (``ValueError``) or a bug."""
        if isinstance(msg, TrajectoryChunk):
            self.counts.refused += _num_items(msg)
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
            if self._stored_before(msg):
                return [self._ack_duplicate(identity, msg)]
            self.table.can_insert(_num_items(msg))  # raises for a chunk that never fits
            admission.check_chunk_size(msg, self.cfg, self.bounds)
            if not self._wait_for_version(identity, msg):
                self._admit_chunk(identity, msg)
            return []
        if isinstance(msg, SampleRequest):
            self._hold_sample_request(identity, msg)
            return []
        if isinstance(msg, PriorityUpdate):
            self._update_priorities(msg)
            return []
        if isinstance(msg, ActorReport):
            admission.check_report(msg, self.cfg, self.run.eval_env_steps)
            if self._wait_for_version(identity, msg):
                return []
            self.actors.check_report(msg)
            self.run.check_custom_names(msg)
            self.run.check_groups(msg)
            self.actors.add_report(msg)
            self.run.add_report(msg)
            return []
        if isinstance(msg, PublishedVersion):
            self.run.note_published(msg.version)
            return self.release_waiting()
        if isinstance(msg, StatsRequest):
            values = {**self.stats(), **self.actors.stats()}
            return [Reply(identity, Stats(role="replay", values=values))]
        if isinstance(msg, RestoreCounters):
            admission.check_restore_counters(msg)
            self.run.resume_at(msg.env_steps)
            return [Reply(identity, Stats(role="replay", values=self.stats()))]
        if isinstance(msg, Shutdown):
            log.info("shutdown requested: %s", msg.reason)
            return self.begin_shutdown()
        raise ValueError(f"replay server does not accept {type(msg).__name__}")

    def _wait_for_version(self, identity: bytes, msg: TrajectoryChunk | ActorReport) -> bool:
        """Hold ``msg`` when it names a weights version newer than any announced
        (``replay/versions.py``); True when held."""
        if check_named_versions(msg, self.run.published_version) <= self.run.published_version:
            return False
        self.version_wait.hold(identity, msg)
        return True

    def release_waiting(self) -> list[Reply]:
        """Handle the held messages whose versions are announced now; refuse those that waited
        too long."""
        if not self.version_wait:
            return []
        waiting_items = self._waiting_items()
        ready, expired = self.version_wait.release(self.run.published_version)
        released = sum(_num_items(msg) for _, msg in ready if isinstance(msg, TrajectoryChunk))
        self.counts.refused += waiting_items - released - self._waiting_items()  # the expired
        replies = [r for identity, msg in ready for r in self._handle(identity, msg)]
        return replies + [r for identity, why in expired for r in self.reject(identity, why)]

    def _admit_chunk(self, identity: bytes, chunk: TrajectoryChunk) -> None:
        """Check a chunk whose origin, size and versions passed against what this config's
        actors send and hold it for ``drain``."""
        num_bytes = self.pending_inserts.check_room(chunk)
        self.table.check_items(chunk.fields)  # names, dtypes and shapes of the item spec
        admission.check_item_values(self.value_checks, chunk.fields)
        self._check_frames(chunk)
        balance = self.actors.check_chunk(chunk, self.cfg.algo.steps_in_items(chunk.fields))
        self.actors.add_chunk(chunk, balance)
        self.pending_inserts.append(HeldInsert(identity, chunk, num_bytes, self._frames_of(chunk)))

    def _frames_of(self, chunk: TrajectoryChunk) -> Sequence[Buffer] | None:
        """The frames ``chunk`` arrived in, when ``handle`` was given them."""
        if self._arrived is not None and self._arrived[0] is chunk:
            return self._arrived[1]
        return None

    def _stored_before(self, chunk: TrajectoryChunk) -> bool:
        """Whether this chunk (actor, incarnation, sequence) was stored already: a copy sent
        again because its ack was lost. Raises ``ValueError`` for a table or actor id that no
        actor of this config sends."""
        admission.check_chunk_origin(chunk, self.cfg)
        return self.chunks.stored(chunk.actor_id, chunk.incarnation, chunk.sequence)

    def _ack_duplicate(self, identity: bytes, chunk: TrajectoryChunk) -> Reply:
        """Acknowledge a chunk stored before without storing it again."""
        self.counts.duplicates += _num_items(chunk)
        return Reply(identity, InsertAck(self.table_name, 0, self.table.size, chunk.sequence))

    def held_items(self) -> int:
        """Items of the chunks held back: for the rate limiter or room, or for their version."""
        return self.pending_inserts.num_items() + self._waiting_items()

    def _waiting_items(self) -> int:
        """Items of the chunks that wait for their weights version to be announced."""
        waiting = self.version_wait.waiting
        return sum(_num_items(msg) for _, _, msg in waiting if isinstance(msg, TrajectoryChunk))

    def _check_frames(self, chunk: TrajectoryChunk) -> None:
        if self.frame_layout is None:
            if chunk.frames.size:
                raise ValueError("this replay stores whole observations: a chunk brings no frames")
            return
        check_frame_refs(chunk.frames, chunk.fields, self.frame_layout, self.table.frame_capacity())

    def _hold_sample_request(self, identity: bytes, request: SampleRequest) -> None:
        admission.check_sample_request(request, self.cfg)
        if len(self.pending_samples) >= self.cfg.replay.max_pending_samples:
            raise ValueError("too many sample requests waiting; retry later")
        self.pending_samples.append((identity, request))

    def _update_priorities(self, update: PriorityUpdate) -> None:
        admission.check_priority_update(update, self.cfg)
        self.priority_updates_applied += self.table.update_priorities(
            update.keys, update.priorities
        )
        if self.chunk_log is not None and self.cfg.replay.kind == "prioritized":
            self.chunk_log.note_priorities(update.keys, update.priorities)
        by_rank = self.priority_updates_by_rank
        by_rank[update.learner_rank] = by_rank.get(update.learner_rank, 0) + 1

    # -- held inserts and samples ----------------------------------------------------------------

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
        batch: list[HeldInsert] = []
        num_items = 0
        while True:
            admitted = False
            held = self.pending_inserts.first()
            if held is not None:
                identity, chunk = held.identity, held.chunk
                total = num_items + chunk.priorities.shape[0]
                try:
                    # Taking ``total`` items now is taking the batch's, then this chunk's.
                    admitted = (not batch or total <= self.table.capacity) and (
                        self.limiter.can_insert(total) and self.table.can_insert(total)
                    )
                except Exception as exc:
                    if not batch:
                        self.pending_inserts.pop()
                        replies += self._error_replies(identity, chunk, exc)
                        continue
                if admitted:
                    self.pending_inserts.pop()
                    batch.append(held)
                    num_items = total
                    continue
            if not batch:
                return replies, any_inserted
            replies += self._insert_batch(batch)
            any_inserted = True
            batch, num_items = [], 0

    def _insert_batch(self, batch: list[HeldInsert]) -> list[Reply]:
        """Insert admitted chunks (checked once, by ``_admit_chunk``); an ack for each, after
        each stored chunk's frames went to the chunk log (written before the acks are sent). A
        chunk stored before, or twice in ``batch`` (sent again while held), is acknowledged
        without being stored again."""
        replies, fresh, numbers = [], [], set()
        for held in batch:
            chunk = held.chunk
            number = (chunk.actor_id, chunk.incarnation, chunk.sequence)
            if number in numbers or self.chunks.stored(*number):
                replies.append(self._ack_duplicate(held.identity, chunk))
            else:
                numbers.add(number)
                fresh.append(held)
        if not fresh:
            return replies
        try:
            sizes = self._store([held.chunk for held in fresh])
        except Exception as exc:
            return replies + [
                r for held in fresh for r in self._error_replies(held.identity, held.chunk, exc)
            ]
        for held, size in zip(fresh, sizes, strict=True):
            if self.chunk_log is not None:
                self.chunk_log.append_chunk(held.frames or encode(held.chunk))
            num_items = _num_items(held.chunk)
            ack = InsertAck(self.table_name, num_items, size, held.chunk.sequence)
            replies.append(Reply(held.identity, ack))
        return replies

    def _store(self, chunks: list[TrajectoryChunk]) -> list[int]:
        """Insert checked chunks into the table and count them (rate limiter, env steps, chunk
        numbers, item counts); returns the table's size after each chunk."""
        table, counts = self.table, self.counts
        size, for_frames = table.size, table.num_evicted_for_frames
        table.insert_many(
            [chunk.fields for chunk in chunks],
            [chunk.priorities for chunk in chunks],
            [chunk.frames for chunk in chunks] if self.frame_layout else None,
        )
        num_items = sum(_num_items(chunk) for chunk in chunks)
        dropped_for_frames = table.num_evicted_for_frames - for_frames
        counts.stored += num_items
        counts.evicted_for_frames += dropped_for_frames
        counts.evicted_capacity += size + num_items - table.size - dropped_for_frames
        sizes = []
        for chunk in chunks:
            self.limiter.record_insert(_num_items(chunk))
            self.run.env_steps += chunk.env_steps
            self.chunks.add(chunk.actor_id, chunk.incarnation, chunk.sequence)
            size = min(size + _num_items(chunk), table.capacity)  # the size after this chunk
            sizes.append(size)
        return sizes

    def _try_sample(self, request: SampleRequest) -> SampleBatch | None:
        """Serve a held request if the table holds enough and the rate limiter allows it now."""
        batch_size = request.batch_size
        if self.table.size < batch_size or not self.limiter.can_sample(batch_size):
            return None
        table_size = self.table.size
        keys, fields, probabilities = self._deliver(batch_size)
        if self.frame_layout is None:
            return SampleBatch(self.table_name, table_size, keys, probabilities, fields)
        frames, fields = self.table.batch_frames(fields)
        return SampleBatch(self.table_name, table_size, keys, probabilities, fields, frames)

    def _deliver(self, batch_size: int) -> tuple:
        """Sample ``batch_size`` items and count it; a FIFO queue's delivery also goes to the
        chunk log, so that its items leave again at this point when the log is read back."""
        size = self.table.size
        sampled = self.table.sample(batch_size, self.rng)
        self.limiter.record_sample(batch_size)
        if isinstance(self.table, FifoQueue):
            self.counts.consumed += size - self.table.size
            if self.chunk_log is not None:
                self.chunk_log.append_delivery(batch_size)
        elif self.chunk_log is not None:  # the counts the rate limiter goes on from
            self.chunk_log.note_sampled(self.limiter.num_sampled, self.table.num_sampled)
        return sampled

    def begin_shutdown(self) -> list[Reply]:
        self.stopping = True
        # Answered with Shutdown, never stored
        self.counts.refused += self.pending_inserts.num_items()
        held = [held.identity for held in self.pending_inserts.clear()]
        held += [identity for identity, _ in self.pending_samples]
        self.pending_samples.clear()
        return [Reply(identity, Shutdown("replay server is stopping")) for identity in held]

    def stats(self) -> dict[str, float]:
        """This server's values for ``Stats`` (``replay/reporting.py``)."""
        return service_stats(self)

    @property
    def services(self) -> list[ReplayService]:
        """The services whose snapshots and chunk logs the server keeps: this one."""
        return [self]

    @property
    def env_steps(self) -> int:
        """The run's training env steps (the x-axis of the server's scalars)."""
        return self.run.env_steps

    def table_counts(self) -> tuple[int, int]:
        """Items inserted and sampled so far (``replay/inserts_per_s``, ``samples_per_s``)."""
        return self.table.num_inserted, self.table.num_sampled

    def holds_full(self) -> bool:
        """Held chunks are at their bound: serve them before reading on."""
        return self.pending_inserts.full()

    # -- snapshots -------------------------------------------------------------------------------

    @property
    def state(self) -> ReplayState:
        return ReplayState(
            self.table,
            self.limiter,
            self.rng,
            self.run,
            self.priority_updates_applied,
            self.priority_updates_by_rank,
            self.counts,
            self.chunks,
        )

    def progress(self) -> tuple[int, ...]:
        """Changes whenever a snapshot would differ from the last one."""
        return self.state.progress()

    def export_snapshot(self, log_segment: int = 0, items_in_log: bool = False) -> Snapshot:
        """Copies of everything ``load_snapshot`` needs to go on from here; ``log_segment``: the
        first chunk log segment it does not hold; ``items_in_log``: the stored items left out,
        the log's earlier segments hold them."""
        layout = snapshot_layout(self.cfg, self.item_spec)
        return export_snapshot(self.state, layout, self.held_items(), log_segment, items_in_log)

    def load_snapshot(self, snapshot: Snapshot, refill: Refill | None = None) -> None:
        """Go on from ``snapshot``: table, keys, rate limiter and run counters (``refill`` puts
        back items it left in the chunk log). All or nothing: raises ``SnapshotError``
        (changing nothing) unless it fits this config exactly and holds only what a server of
        this config could have stored."""
        self.hold(restore_state(snapshot, self.cfg, self.item_spec, self.value_checks, refill))

    # -- reading the chunk log back --------------------------------------------------------------

    def check_logged_chunk(self, chunk: TrajectoryChunk) -> None:
        """Raise ``ValueError`` unless a chunk read back from the chunk log is one this config's
        server stores (checked as one from an actor is; the table's room aside)."""
        admission.check_chunk_size(chunk, self.cfg, self.bounds)
        self.table.check_items(chunk.fields)
        admission.check_item_values(self.value_checks, chunk.fields)
        self._check_frames(chunk)

    def recover_chunk(self, chunk: TrajectoryChunk) -> int:
        """Store a chunk read back from the chunk log, checked as one from an actor is (the rate
        limiter and held chunks aside); returns its items, 0 for one stored already. Raises
        ``ValueError`` for a chunk this config's server would not store."""
        if self._stored_before(chunk):
            return 0
        if not self.table.can_insert(_num_items(chunk)):
            raise ValueError("the table has no room for it")
        self.check_logged_chunk(chunk)
        self.run.note_published(named_versions(chunk)[1])  # it was stored: its version published
        self.counts.received += _num_items(chunk)
        self._store([chunk])
        self.counts.recovered += _num_items(chunk)
        return _num_items(chunk)

    def recover_sampled(self, limiter_count: int, table_count: int) -> None:
        """A prioritized table's sample counts read back from the chunk log: the samples the
        learners took since the snapshot still count against the actors' inserts."""
        if not isinstance(self.table, PrioritizedTable):
            raise ValueError("sample counts apply to a prioritized table")
        self.limiter.restore(
            self.limiter.num_inserted, max(self.limiter.num_sampled, limiter_count)
        )
        self.table.recover_num_sampled(table_count)

    def recover_delivery(self, num_items: int) -> None:
        """A FIFO queue's delivery read back from the chunk log."""
        if not isinstance(self.table, FifoQueue) or not 0 < num_items <= self.table.size:
            raise ValueError(f"a delivery of {num_items} items does not fit this table")
        self._deliver(num_items)


def _num_items(chunk: TrajectoryChunk) -> int:
    return int(chunk.priorities.shape[0])

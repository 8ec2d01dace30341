"""Parameter server: holds the latest versioned weights from the learner and hands them to actors.

Binds:  ROUTER cfg.net.params_addr
        in:  PublishParams  -> PublishAck            (from the learner)
             ParamsRequest  -> Params                (the held version differs from the asker's)
                            -> ParamsNotModified     (it does not: no weight bytes are sent)
             MatchRequest   -> Matches               (a league's matches and outcomes, from actors)
             StatsRequest   -> Stats
             Shutdown       -> the server stops; for a short grace period it answers every request
                               with Shutdown so actors stop too
             anything malformed or unexpected -> Error, counted in params/rejected_messages

A publish is taken only when its arrays are exactly the run's network
(``weights.network_layout``: the same names, shapes and dtypes the learner's ``params_to_arrays``
gives), every float is finite and the ``Params`` reply it becomes decodes within the codec's
``Limits`` on an actor; any other is refused with ``Error`` and the held version stays. No
exception from handling one message stops the server: it is logged, answered with ``Error`` and
counted.

In a multi-agent run (``apexrl.multiagent``) the server holds one store per network policy, each
with its own layout and versions, and a request or publish names its policy; one for a policy the
run does not have is refused with ``Error``. With a league (``league.snapshot_every_versions``),
each trained policy's store also pins every N-th version it publishes as a snapshot
(``apexrl.league.snapshots``), and a ``ParamsRequest`` with ``snapshot`` set gets that version's
``Params`` exactly as published, ``ParamsNotModified`` when the asker holds it, or ``Error``
naming the pinned versions; such a request is never held. With ``league.matchmaking`` the main
policy's store also keeps the league (``apexrl.league.league``): a ``MatchRequest`` brings an
actor's finished matches (counted into payoffs and Elo ratings, or refused whole when one claims
what its match was not) and takes new ones. The pool and the league's state go to
``<run dir>/league/`` as they change and are read back when the server starts again (a restart
by the launcher, a resumed run: ``apexrl.league.keeping``).

A late joiner asks with ``have_version = -1`` and gets the current weights at once. Versions are
compared for equality, not order, so a learner that restarts from scratch (versions from 0 again)
still reaches every actor.

A ``ParamsRequest`` from an actor that already holds the current version is held (a long poll):
it is answered as soon as the next version is published, together with every other held request,
or with ``ParamsNotModified`` after ``HOLD_S`` (well inside any client's resend timeout, so the
actor still hears from the server). An actor thus gets each version at publish time instead of at
its next request, which on the actors' schedule (every ``actor.params_poll_steps`` env steps) can
be a whole poll interval later. A request for anything else is answered at once, as before.

The replies of each version are encoded once, at publish, into immutable ``bytes`` frames that
every reply hands to ZeroMQ without a copy (``sockets.send_encoded_to``): 32 actors asking for a
6.4 MiB Nature CNN over TCP then cost the server one copy instead of 32 copies and 32 encodings,
and 32 local actors cost it one small reply encoded once.

Weights of at least ``SHM_MIN_BYTES`` (a Nature CNN; a CartPole MLP is cheaper to send) are
also written once into a file in the host's shared memory (``apexrl.transport.shm``; removed when
the server stops). An actor whose ``ParamsRequest``
carries this host's ``shm_host`` gets a ``Params`` naming the file instead of the weights, and
reads them without any TCP copy; every other actor, and every actor while the shared-memory
directory is missing or full, gets the weights over the socket.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import zmq

from apexrl.config import Config
from apexrl.league import keeping
from apexrl.league.league import League, Refused
from apexrl.league.snapshots import SnapshotPool
from apexrl.runtime import lifecycle, rundir
from apexrl.runtime.metrics import MetricsWriter
from apexrl.transport import auth, gate, shm, sockets
from apexrl.transport.codec import DEFAULT_LIMITS, DecodeError, Limits, decode, encode
from apexrl.transport.messages import (
    MAX_MATCHES,
    Error,
    Matches,
    MatchRequest,
    Message,
    Params,
    ParamsNotModified,
    ParamsRequest,
    PublishAck,
    PublishParams,
    Shutdown,
    Stats,
    StatsRequest,
)
from apexrl.transport.weights import ArraySpec, layout_mismatch, network_layout, non_finite_arrays

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 3.0  # seconds a stopping server keeps answering Shutdown
REPORT_INTERVAL_S = 5.0  # seconds between metric writes
NO_COMPRESSION = 1 << 62  # float weights do not compress; never spend CPU trying
SHM_MIN_BYTES = 1 << 20  # bytes of encoded weights from which local actors read shared memory
HOLD_S = 1.0  # seconds a request of an actor holding the current version waits for the next one
MAX_HELD = 4096  # requests held at once; a request past these is answered at once


class HeldRequest(NamedTuple):
    """A ``ParamsRequest`` waiting for the next publish, and until when it may wait."""

    deadline: float  # time.monotonic() after which it is answered ParamsNotModified
    request: ParamsRequest


class ParamStore:
    """The latest weights and the counters; ``handle`` maps one request to its reply.

    ``layout`` is the run's network (``network_layout``); a store without one takes arrays of
    any names, shapes and dtypes. ``limits`` are those the actors decode ``Params`` with. With a
    ``shm_writer`` each version of at least ``shm_min_bytes`` is also written to shared memory for
    the actors of this host.

    ``hold`` keeps, for at most ``hold_s`` seconds, the requests of actors that hold the current
    version (by ROUTER identity, in arrival order, so the oldest deadline comes first);
    ``due_replies`` gives those to answer now.

    With ``snapshots``, every version published that the pool takes (``SnapshotPool.due``) is
    also pinned there, its ``Params`` frames as encoded at publish (``apexrl.league.snapshots``),
    and ``snapshot_frames`` answers a request for one.
    """

    def __init__(
        self,
        layout: dict[str, ArraySpec] | None = None,
        limits: Limits = DEFAULT_LIMITS,
        shm_writer: shm.ShmWriter | None = None,
        shm_min_bytes: int = SHM_MIN_BYTES,
        hold_s: float = HOLD_S,
        policy: str = "",
        snapshots: SnapshotPool | None = None,
        league: League | None = None,
        league_dir: Path | None = None,
    ) -> None:
        self.layout, self.limits, self.hold_s = layout, limits, hold_s
        self.snapshots = snapshots  # a league's pinned versions of this policy (None: no league)
        self.league = league  # the league this policy is the main of (matches, ratings)
        self.league_dir = league_dir  # where pinned versions are kept on disk (None: nowhere)
        self.num_served_snapshots = 0
        self.policy = policy  # a multi-agent run's policy whose weights these are
        self.shm_writer, self.shm_min_bytes = shm_writer, shm_min_bytes
        self.shm_ref: shm.ShmRef | None = None  # the current version's file; None: TCP only
        self.version = -1
        self.env_steps = 0  # the run's env steps at the latest publish: the metrics' x-axis
        self.env_task = ""  # the latest publish's env task (JSON text), served with its weights
        self.arrays: dict[str, np.ndarray] = {}  # read-only views into params_frames
        self.params_frames: list[bytes] = []  # Params(version, arrays), encoded
        self.shm_frames: list[bytes] = []  # Params naming the version's shm file, encoded
        self.held: dict[bytes, HeldRequest] = {}  # by identity, oldest first
        self.release_held = False  # a publish or a Shutdown came: answer every held request
        self.rejected_messages = 0
        self.num_served = 0
        self.num_served_shm = 0  # of num_served: answered with a shared-memory file
        self.stopping = False

    def handle(self, msg: Message) -> Message:
        if self.stopping:
            return Shutdown("parameter server is stopping")
        if isinstance(msg, ParamsRequest):
            if self.version >= 0 and msg.have_version != self.version:
                self.num_served += 1
                ref = self.shm_ref
                if ref is not None and msg.shm_host and msg.shm_host == self.shm_writer.host:
                    self.num_served_shm += 1
                    return Params(self.version, {}, ref.name, ref.nbytes, ref.token, self.env_task)
                return Params(self.version, self.arrays, env_task=self.env_task)
            return ParamsNotModified(self.version)
        if isinstance(msg, PublishParams):
            return self.publish(msg)
        if isinstance(msg, StatsRequest):
            return Stats("params", self.stats())
        if isinstance(msg, Shutdown):
            log.info("shutdown requested: %s", msg.reason)
            self.stopping = self.release_held = True
            return Shutdown("parameter server is stopping")
        return self.reject(f"parameter server does not accept {type(msg).__name__}")

    def publish(self, msg: PublishParams) -> Message:
        """Hold ``msg``'s weights as the new version, or refuse them and keep the held ones."""
        if self.layout is not None:
            mismatch = layout_mismatch(msg.arrays, self.layout)
            if mismatch is not None:
                return self.reject(f"publish of version {msg.version} refused: {mismatch}")
        bad = non_finite_arrays(msg.arrays)
        if bad:
            return self.reject(
                f"publish of version {msg.version} refused: array {bad[0]!r} holds NaN or "
                f"infinite values ({len(bad)} such arrays)"
            )
        # bytes() copies the arrays out of the received frames, once per version.
        params = Params(msg.version, msg.arrays, env_task=msg.env_task)
        frames = encode(params, compress_min_bytes=NO_COMPRESSION)
        params_frames = [bytes(frame) for frame in frames]
        try:
            # As an actor will decode them: weights over the limits would reach no actor.
            arrays = decode(params_frames, self.limits).arrays
        except DecodeError as exc:
            return self.reject(
                f"publish of version {msg.version} refused: its Params would exceed the codec's "
                f"limits ({exc})"
            )
        if msg.version <= self.version:
            log.warning(
                "publish of version %d after %d: the learner restarted", msg.version, self.version
            )
        self.version, self.env_steps = msg.version, msg.env_steps
        self.env_task = msg.env_task
        self.params_frames, self.arrays = params_frames, arrays
        self.shm_ref = self.write_shm(msg.version, params_frames)
        self.shm_frames = []
        if self.shm_ref is not None:
            ref = self.shm_ref
            shm_reply = Params(self.version, {}, ref.name, ref.nbytes, ref.token, self.env_task)
            self.shm_frames = [bytes(f) for f in encode(shm_reply)]
        self.pin_snapshot()
        self.release_held = True
        return PublishAck(self.version, self.policy)

    def pin_snapshot(self) -> None:
        """Pin the version just published when the league takes a snapshot of it: every
        ``every``-th version, or one its league asks for (``League.wants_snapshot``)."""
        if self.snapshots is None:
            return
        wanted = self.league is not None and self.league.wants_snapshot()
        if not (self.snapshots.due(self.version) or wanted):
            return
        evicted = self.snapshots.pin(self.version, self.params_frames)
        if self.league is not None:
            self.league.pinned(self.version)
            if evicted is not None:
                self.league.evicted(evicted)
        if self.league_dir is not None:
            keeping.keep_snapshot(self, self.version, evicted)
        log.info(
            "snapshot of %s version %d pinned (%d pinned%s)",
            self.policy or "the policy",
            self.version,
            len(self.snapshots),
            "" if evicted is None else f"; version {evicted} evicted",
        )

    def snapshot_frames(self, msg: ParamsRequest) -> list[bytes]:
        """The reply to a request for pinned version ``msg.snapshot``: its frames as published,
        ``ParamsNotModified`` to an asker that holds it, ``Error`` for one not pinned."""
        if self.stopping:
            return self.encoded(Shutdown("parameter server is stopping"))
        frames = None if self.snapshots is None else self.snapshots.get(msg.snapshot)
        if frames is None:
            pinned = ", ".join(map(str, self.snapshots.versions)) if self.snapshots else ""
            return self.encoded(
                self.reject(
                    f"policy {self.policy!r} has no snapshot {msg.snapshot} "
                    f"(pinned: {pinned or 'none'})"
                )
            )
        if msg.have_version == msg.snapshot:
            return self.encoded(ParamsNotModified(msg.snapshot))
        self.num_served_snapshots += 1
        return list(frames)

    def hold(self, identity: bytes, msg: Message, now: float) -> bool:
        """Keep ``msg`` until the next publish when it is a ``ParamsRequest`` of an actor that
        holds the current version; False (answer it now) for any other message, for a second
        request of one identity and past ``MAX_HELD``."""
        if (
            not isinstance(msg, ParamsRequest)
            or self.stopping
            or self.version < 0
            or msg.have_version != self.version
            or msg.snapshot >= 0
            or identity in self.held
            or len(self.held) >= MAX_HELD
        ):
            return False
        self.held[identity] = HeldRequest(now + self.hold_s, msg)
        return True

    def due_replies(self, now: float) -> list[tuple[bytes, list[bytes]]]:
        """The held requests to answer now, with their encoded replies: every one after a publish
        or a ``Shutdown``, else those held for ``hold_s``."""
        if self.release_held:
            due, self.held, self.release_held = self.held, {}, False
        else:
            due = {}
            for identity, held in self.held.items():
                if held.deadline > now:
                    break  # the rest arrived later
                due[identity] = held
            for identity in due:
                del self.held[identity]
        return [
            (identity, self.encoded(self.handle(held.request))) for identity, held in due.items()
        ]

    def write_shm(self, version: int, frames: list[bytes]) -> shm.ShmRef | None:
        """Write a version's frames to shared memory; None (TCP only) without a writer, for
        small weights, or when the write fails (the directory is full or gone)."""
        if self.shm_writer is None or sum(len(f) for f in frames) < self.shm_min_bytes:
            return None
        try:
            return self.shm_writer.write(version, frames)
        except OSError as exc:
            log.warning("version %d goes over TCP only: cannot write it to shm (%s)", version, exc)
            return None

    def encoded(self, reply: Message) -> list[bytes]:
        """The frames of ``reply``: the cached ones for the current version's ``Params``."""
        if isinstance(reply, Params) and reply.version == self.version:
            cached = self.shm_frames if reply.shm_file else self.params_frames
            if cached:
                return cached
        return [bytes(frame) for frame in encode(reply, compress_min_bytes=NO_COMPRESSION)]

    def reject(self, reason: str) -> Error:
        self.rejected_messages += 1
        log.warning("rejected a message: %s", reason)
        return Error(reason)

    def stats(self) -> dict[str, float]:
        values = {
            "params/version": float(self.version),
            "params/num_served": float(self.num_served),
            "params/num_served_shm": float(self.num_served_shm),
            "params/rejected_messages": float(self.rejected_messages),
        }
        if self.snapshots is not None:
            values["params/snapshots"] = float(len(self.snapshots))
            values["params/num_served_snapshots"] = float(self.num_served_snapshots)
        if self.league is not None:
            values.update(self.league.stats())
        return values


class ParamStores:
    """The stores of a run: one (policy "") for a single-agent run, one per network policy in a
    multi-agent run. A message is handled by the store of the policy it names; ``Stats`` and
    ``Shutdown`` are the server's."""

    def __init__(self, stores: dict[str, ParamStore], num_actors: int = 0) -> None:
        self.by_policy = stores
        self.first = next(iter(stores.values()))
        self.rejected_messages = 0  # refused before any store was chosen
        self.num_actors = num_actors  # the actor ids that may play a league's matches
        leagues = [store for store in stores.values() if store.league is not None]
        self.league_store = leagues[0] if leagues else None  # the main policy's

    @property
    def stopping(self) -> bool:
        return self.first.stopping

    @property
    def env_steps(self) -> int:
        return max(store.env_steps for store in self.by_policy.values())

    def store_for(self, msg: Message) -> ParamStore | None:
        """The store ``msg`` is for; None for a policy the run does not have."""
        policy = getattr(msg, "policy", "")
        return self.by_policy.get(policy)

    def handle(self, msg: Message) -> Message:
        if self.stopping:
            return Shutdown("parameter server is stopping")
        if isinstance(msg, Shutdown):
            for store in self.by_policy.values():
                reply = store.handle(msg)
            return reply
        if isinstance(msg, StatsRequest):
            return Stats("params", self.stats())
        if isinstance(msg, MatchRequest):
            return self.match(msg)
        store = self.store_for(msg)
        if store is None:
            return self.reject(f"this run has no policy named {getattr(msg, 'policy', '')!r}")
        return store.handle(msg)

    def reject(self, reason: str) -> Error:
        self.rejected_messages += 1
        log.warning("rejected a message: %s", reason)
        return Error(reason)

    def match(self, msg: MatchRequest) -> Message:
        """An actor's finished matches counted and its new ones drawn (``League``); ``Error``
        where the run makes no matches, for an actor id the run does not have, or when an
        outcome claims what its match was not (then nothing is counted)."""
        store = self.league_store
        if store is None or not store.league.cfg.matchmaking:
            return self.reject("this run's league makes no matches (league.matchmaking)")
        if not 0 <= msg.actor_id < self.num_actors:
            return self.reject(
                f"actor {msg.actor_id} plays no matches: the run's actors are 0 to "
                f"{self.num_actors - 1}"
            )
        try:
            store.league.results(
                msg.actor_id, msg.tickets, msg.versions, msg.returns, store.version
            )
        except Refused as exc:
            return self.reject(f"match outcomes of actor {msg.actor_id} refused: {exc}")
        tickets, versions = store.league.matches(msg.actor_id, min(msg.want, MAX_MATCHES))
        return Matches(tickets, versions)

    def save_league(self) -> None:
        keeping.save_leagues(self.by_policy.values())

    def stats(self) -> dict[str, float]:
        """One store's stats as they are; several stores' under ``params/<policy>/...``, with
        ``params/version`` the first policy's and the counts summed."""
        if len(self.by_policy) == 1 and "" in self.by_policy:
            values = self.first.stats()
        else:
            values = {}
            for policy, store in self.by_policy.items():
                for key, value in store.stats().items():
                    if key.startswith("league/"):
                        values[key] = value  # one league a run
                    else:
                        values[key.replace("params/", f"params/{policy}/", 1)] = value
            values["params/version"] = float(self.first.version)
            for name in ("num_served", "num_served_shm", "rejected_messages"):
                values[f"params/{name}"] = sum(
                    values[f"params/{policy}/{name}"] for policy in self.by_policy
                )
        values["params/rejected_messages"] += self.rejected_messages
        return values

    def due_replies(self, now: float) -> list[tuple[bytes, list[bytes]]]:
        return [reply for store in self.by_policy.values() for reply in store.due_replies(now)]

    def encoded(self, reply: Message) -> list[bytes]:
        return self.first.encoded(reply)


def answer(stores: ParamStores, received: sockets.Received) -> list[bytes] | None:
    """The encoded reply to one received message, or None when its store holds it until the next
    publish (``ParamStore.hold``). No exception from handling it escapes: it is logged with its
    traceback, counted as a rejected message and answered with ``Error``."""
    try:
        if received.error is not None:
            return stores.encoded(stores.reject(str(received.error)))
        refused = auth.refusal(received.role, received.message, received.bound_id)
        if refused is not None:
            return stores.encoded(stores.reject(refused))
        msg = received.message
        store = stores.store_for(msg)
        if isinstance(msg, ParamsRequest) and msg.snapshot >= 0 and store is not None:
            return store.snapshot_frames(msg)
        if store is not None and store.hold(received.identity, msg, time.monotonic()):
            return None
        if isinstance(msg, (ParamsRequest, PublishParams)) and store is not None:
            return store.encoded(store.handle(msg))
        return stores.encoded(stores.handle(msg))
    except Exception as exc:  # the last line of defence: one message never stops the server
        kind = type(received.message).__name__
        log.exception("handling a %s failed", kind)
        error = stores.reject(f"parameter server failed to handle {kind}: {exc}"[:1000])
        return [bytes(frame) for frame in encode(error)]


def load_layout(cfg: Config) -> dict[str, ArraySpec]:
    """The run's network layout (``network_layout``), logged with its size and the time it took."""
    started = time.monotonic()
    layout = network_layout(cfg)
    log.info(
        "weights layout of %s%s: %d arrays, %.1f MiB (%.2f s)",
        cfg.algorithm,
        f" (policy {cfg.replay.table})" if cfg.multiagent.enabled else "",
        len(layout),
        sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in layout.values()) / 2**20,
        time.monotonic() - started,
    )
    return layout


def policy_configs(cfg: Config) -> list[tuple[str, Config]]:
    """(policy, its config) of each store: ("", cfg) for a single-agent run, each network
    policy's config in a multi-agent run."""
    if not cfg.multiagent.enabled:
        return [("", cfg)]
    from apexrl.multiagent.policies import policy_configs as network_policy_configs

    return list(network_policy_configs(cfg).items())


def snapshot_pool(cfg: Config, policy: str) -> SnapshotPool | None:
    """A trained policy's pool of snapshots when the run's league takes them, else None."""
    if not cfg.league.enabled or policy not in cfg.multiagent.trained:
        return None
    return SnapshotPool(cfg.league.pool_size, cfg.league.snapshot_every_versions)


def bind_socket(ctx: zmq.Context, cfg: Config) -> zmq.Socket:
    sock = sockets.bind(
        ctx, zmq.ROUTER, cfg.net.params_addr, curve=auth.server_keys(cfg.net, "params")
    )
    log.info("parameter server on %s", sockets.bound_address(sock))
    return sock


def role_gates(stores: ParamStores) -> dict[str, gate.RoleGate]:
    """What each client role may send here: actors and evaluation actors ask (a message of a
    header's size), the learner also publishes (the largest layout's weights, or the store's
    limit)."""
    accepted = (ParamsRequest, PublishParams, MatchRequest, StatsRequest, Shutdown)
    publish_bytes = stores.first.limits.max_message_bytes
    layouts = [store.layout for store in stores.by_policy.values()]
    if all(layout is not None for layout in layouts):
        weights = max(
            sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in layout.values())
            for layout in layouts
        )
        publish_bytes = weights + gate.SMALL_MESSAGE_BYTES
    small = gate.SMALL_MESSAGE_BYTES
    return gate.role_gates(accepted, {"actor": small, "eval": small, "learner": publish_bytes})


def serve(
    sock: zmq.Socket, stores: ParamStores, stop: threading.Event, writer: MetricsWriter
) -> None:
    """Answer each request until ``stop`` is set or, after a ``Shutdown``, the grace period is
    over, and the held ones when a publish (or their deadline) comes; write the store's stats
    every ``REPORT_INTERVAL_S``. A CURVE peer's message is checked against its role's gate before
    it is decoded (``role_gates``)."""
    stopping_since: float | None = None
    last_report = time.monotonic()
    gates = role_gates(stores)
    limits = stores.first.limits
    while not stop.is_set():
        received = sockets.recv_from(sock, timeout_ms=100, limits=limits, gates=gates)
        if received is not None:
            reply = answer(stores, received)
            if reply is not None:
                sockets.send_encoded_to(sock, received.identity, reply)
        for identity, frames in stores.due_replies(time.monotonic()):
            sockets.send_encoded_to(sock, identity, frames)
        if stores.stopping:
            stopping_since = stopping_since or time.monotonic()
            if time.monotonic() - stopping_since > SHUTDOWN_GRACE_S:
                return
        if time.monotonic() - last_report >= REPORT_INTERVAL_S:
            last_report = time.monotonic()
            writer.scalars(stores.stats(), step=stores.env_steps)
            stores.save_league()


def main(cfg: Config) -> int:
    """Run the parameter server until SIGINT/SIGTERM or a ``Shutdown`` message; returns 0."""
    stop = lifecycle.install_stop_handlers()
    layouts = {policy: load_layout(policy_cfg) for policy, policy_cfg in policy_configs(cfg)}
    writer = MetricsWriter(rundir.tensorboard_dir(cfg.run_dir, "params"))
    ctx = sockets.make_context()
    sock = bind_socket(ctx, cfg)
    # last: nothing below raises before the try that removes them
    shm_writers = {policy: shm.open_writer() for policy in layouts}
    stores = ParamStores(
        {
            policy: ParamStore(
                layout,
                shm_writer=shm_writers[policy],
                policy=policy,
                snapshots=snapshot_pool(cfg, policy),
                league=keeping.make_league(cfg, policy),
                league_dir=rundir.league_dir(cfg.run_dir) if cfg.league.enabled else None,
            )
            for policy, layout in layouts.items()
        },
        cfg.actor.num_actors,
    )
    if cfg.league.enabled:  # a resumed run's, or this run's when the launcher restarts the server
        keeping.restore_leagues(stores.by_policy.values())
    try:
        serve(sock, stores, stop, writer)
    finally:
        stores.save_league()
        writer.scalars(stores.stats(), step=stores.env_steps)  # the curve's last point
        writer.close()
        sock.close(linger=0)
        ctx.term()
        for shm_writer in shm_writers.values():
            if shm_writer is not None:
                shm_writer.close()
    log.info("parameter server stopped")
    return 0

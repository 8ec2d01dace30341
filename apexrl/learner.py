"""Learner: pulls batches from replay, updates the algorithm's networks, sends new priorities back
(prioritized tables) and publishes weights to the parameter server.

Connects:  DEALER cfg.net.replay_addr (batches)   out: SampleRequest, PriorityUpdate
                                                  in: SampleBatch, Error
           DEALER cfg.net.replay_addr (control)   out: StatsRequest, RestoreCounters, Shutdown
                                                  in: Stats
           DEALER cfg.net.params_addr             out: PublishParams, Shutdown   in: PublishAck

``learner.prefetch_batches`` sample requests stay in flight: a batch that arrives is replaced by
a new request at once, before the update that uses it. ZeroMQ's I/O thread receives the replies in
the background while the learner computes, so when replay holds data the next batch is already in
the socket's queue. (A Python prefetch thread measured no better: its GIL hand-offs cost what the
decoding it moves would save.) An update's new priorities go out on the batches socket too, next
to the request that replaces its batch; the control socket carries only the rare messages.

The learner decides when the run is over (``run.stop_*``): it then writes a last ``result.json``
line, asks both servers to shut down (which tells the actors) and exits 0. A learner stopped by
SIGINT or SIGTERM writes its checkpoint and exits alone: the servers and actors keep running, and a
learner started with ``--resume`` continues (``apexrl stop`` ends a whole run). A resumed learner
first tells replay the run's env steps so far (``RestoreCounters``): env steps, updates, samples
and learner time all continue from the checkpoint.

Servers may go away and come back (``clients.peers``): when replay's connection drops or replay
answers nothing for ``learner.resend_timeout_s``, the sample requests in flight are forgotten and
asked again and the run's env steps are restored on the server (``ReplayLinks``); a publish that
the parameter server lost is sent again with the latest weights, and at most one publish waits
for its ack (``Publisher``). Each is logged once when it stops answering and once when it is
back; ``learner/replay_silent_s`` and ``learner/params_silent_s`` are the seconds since each last
answered.

Every scalar is written at the run's env steps (``replay/env_steps``), the x-axis that every role
shares.

Files in the run directory: ``config.yaml`` (resolved config), ``result.json`` (one JSON object per
report, with the run's custom metrics: ``apexrl.reporting``), ``checkpoint.pt`` (tensors and
numbers only, loaded with ``torch.load(weights_only=True)``) with the one before it as
``checkpoint.prev.pt``, and ``tb/learner`` (TensorBoard).

Nothing non-finite is trained on or kept: a batch with a NaN or an infinity in a float field is
skipped (``learner/skipped_batches``) and gets no priority update; a gradient whose loss or norm
is not finite is dropped (``learner/skipped_updates``); weights that are not finite are never
written to a checkpoint, and a resumed learner that cannot read the latest checkpoint loads the
previous one.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import zmq

from apexrl import lifecycle, rundir
from apexrl.algos import LearnerCore, SampledBatch, UpdateResult, load_algorithm
from apexrl.callbacks import make_train_result_callback
from apexrl.clients.peers import Link, Peer
from apexrl.config import Config, dump_config
from apexrl.distributed import GroupError, LearnerGroup
from apexrl.envs import check_action_space, make_vector_env
from apexrl.learning.judged import JudgedWeights
from apexrl.metrics import MetricsWriter
from apexrl.models import params_to_arrays
from apexrl.reporting import Reporter, eval_condition_version
from apexrl.transport import auth, sockets
from apexrl.transport.codec import DecodeError
from apexrl.transport.messages import (
    Error,
    Message,
    PriorityUpdate,
    PublishAck,
    PublishParams,
    RestoreCounters,
    SampleBatch,
    SampleRequest,
    Shutdown,
    Stats,
    StatsRequest,
)

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.pt"
PREVIOUS_CHECKPOINT_NAME = "checkpoint.prev.pt"  # the one before, kept when a new one is written
SKIP_LOG_INTERVAL_S = 10.0  # seconds between log lines about skipped batches or updates
DROP_CHECK_INTERVAL_S = 0.1  # seconds between looks at the servers' connection monitors
STATS_INTERVAL_S = 0.25  # the longest wait for replay's Stats (and so an evaluation verdict)
NO_COMPRESSION = 1 << 62  # float weights do not compress; never spend CPU trying


class PeerShutdown(Exception):
    """Replay answered with ``Shutdown``: the run is over."""


class BatchStream:
    """Keeps ``depth`` sample requests in flight on its own socket and hands out the replies with
    their fields as tensors on the learner's device. ``forget`` drops the requests in flight
    (replay lost them) with the socket they were sent on; ``next`` asks again."""

    def __init__(self, link: Link | zmq.Socket, cfg: Config, device: torch.device) -> None:
        self.link = link if isinstance(link, Link) else Link.around(link)
        self.cfg, self.device = cfg, device
        self.request = SampleRequest(cfg.replay.table, cfg.learner.batch_size)
        self.depth = cfg.learner.prefetch_batches
        self.in_flight = 0
        self.num_skipped = 0  # batches with non-finite values, not trained on
        self.skip_log = RateLimitedLog(SKIP_LOG_INTERVAL_S)

    def next(self, timeout_ms: int) -> SampledBatch | None:
        """The next batch, or None when none arrived within ``timeout_ms``."""
        self._top_up()
        try:
            msg = sockets.recv(self.link.sock, timeout_ms)
        except DecodeError as exc:
            log.warning("bad message from replay: %s", exc)
            return None
        if msg is not None:
            self.link.peer.heard()
        if isinstance(msg, SampleBatch):
            self.in_flight -= 1
            self._top_up()  # before the update: ``depth`` requests in flight while it runs
            bad = non_finite_fields(msg)
            if bad:
                self.num_skipped += 1
                self.skip_log.warning(
                    "skipped a batch whose %s hold NaN or infinite values (%d batches skipped)",
                    ", ".join(bad),
                    self.num_skipped,
                )
                return None
            return self._to_device(msg)
        if isinstance(msg, Error):
            self.in_flight -= 1
            log.warning("replay refused a sample request: %s", msg.reason)
        elif isinstance(msg, Shutdown):
            raise PeerShutdown(msg.reason)
        return None

    def send_priorities(self, update: PriorityUpdate) -> None:
        """Send an update's new priorities (no reply) on this socket."""
        sockets.send(self.link.sock, update)

    def forget(self) -> None:
        self.link.reset()
        self.in_flight = 0

    def _top_up(self) -> None:
        while self.in_flight < self.depth:
            sockets.send(self.link.sock, self.request)
            self.in_flight += 1

    def _to_device(self, batch: SampleBatch) -> SampledBatch:
        cuda = self.device.type == "cuda"

        def tensor(array: np.ndarray) -> torch.Tensor:
            t = torch.from_numpy(np.array(array))  # decoded arrays are read-only views
            return t.pin_memory().to(self.device, non_blocking=True) if cuda else t

        fields = {name: tensor(array) for name, array in batch.fields.items()}
        return SampledBatch(
            np.array(batch.keys), fields, np.array(batch.probabilities), batch.table_size
        )


class ReplayLinks:
    """The learner's two connections to replay, batches (``BatchStream``) and control
    (priorities, stats, counters), and what it knows of the server.

    When either connection drops (replay stopped or restarted) or replay answers nothing for
    ``timeout_s`` (the learner asks for ``Stats`` every few seconds, so a live server answers),
    both sockets are replaced: the sample requests in flight are forgotten and asked again, and
    the chief tells the server the run's env steps again (``RestoreCounters``), so that a replay
    server that came back without its data continues the run's count (one that restored its
    data keeps its own count, which is not lower).
    """

    def __init__(
        self,
        ctx: zmq.Context,
        cfg: Config,
        device: torch.device,
        keys: auth.ClientKeys | None,
    ) -> None:
        self.peer = Peer("replay server", cfg.net.replay_addr)
        self.batches = BatchStream(Link(ctx, self.peer, keys), cfg, device)
        self.control = Link(ctx, self.peer, keys)
        self.timeout_s = cfg.learner.resend_timeout_s
        self.last_reset = self.last_check = time.monotonic()

    def receive(self, timeout_ms: int = 0) -> Message | None:
        """A reply on the control socket within ``timeout_ms``, or None."""
        msg = receive_now(self.control.sock, timeout_ms)
        if msg is not None:
            self.peer.heard()
        return msg

    def check(self, env_steps: int | None) -> bool:
        """Re-connect and ask again when replay went away; True when it did. ``env_steps``: the
        run's count to restore (the chief's), or None. Looks at most every
        ``DROP_CHECK_INTERVAL_S``: the learner calls it after every update."""
        now = time.monotonic()
        if now - self.last_check < DROP_CHECK_INTERVAL_S:
            return False
        self.last_check = now
        dropped = self.batches.link.dropped()
        dropped = self.control.dropped() or dropped  # both read: each reports its own drop
        silent_s = time.monotonic() - max(self.peer.last_heard, self.last_reset)
        if not dropped and silent_s <= self.timeout_s:
            return False
        self.peer.lost("the connection dropped" if dropped else f"no answer for {silent_s:.0f} s")
        self.batches.forget()
        self.control.reset()
        self.last_reset = time.monotonic()
        if env_steps:
            sockets.send(self.control.sock, RestoreCounters(env_steps))
        sockets.send(self.control.sock, StatsRequest())
        return True

    def close(self, linger_ms: int) -> None:
        for link in (self.batches.link, self.control):
            link.sock.setsockopt(zmq.LINGER, linger_ms)
            link.close()


class Publisher:
    """Publishes weights to the parameter server with at most one publish waiting for its ack.

    A publish asked for while one is unacknowledged is sent, with the weights of that moment, when
    the ack comes: a parameter server that is down never gets publishes (each a full copy of the
    weights) queued up for it, and the learner never blocks on it. When the connection drops
    (the server stopped or restarted) or an ack does not come within ``timeout_s``, the socket is
    replaced and the latest weights are published again: a restarted server holds no weights until
    then. ``Stats`` requests every ``probe_interval_s`` keep ``peer.silent_s`` meaningful between
    publishes.
    """

    def __init__(
        self, link: Link, algo: LearnerCore, timeout_s: float, probe_interval_s: float
    ) -> None:
        self.link, self.algo = link, algo
        self.timeout_s, self.probe_interval_s = timeout_s, probe_interval_s
        self.sent_at: float | None = None  # of the unacknowledged publish
        self.due = False  # a publish waits for the previous one's ack
        self.env_steps = 0  # the run's env steps to publish with
        self.last_probe = self.last_check = time.monotonic()
        # Called with (version, weights) of every publish sent (the arrays are the message's own).
        self.on_publish: Callable[[int, dict[str, np.ndarray]], None] | None = None

    def publish(self, env_steps: int) -> None:
        self.due, self.env_steps = True, env_steps
        self._send_if_free()

    def poll(self, timeout_ms: int = 0) -> bool:
        """Read the replies, re-connect when the server went away and send a due publish; True
        when an ack came."""
        acked = False
        msg = receive_now(self.link.sock, timeout_ms)
        while msg is not None:
            self.link.peer.heard()
            if isinstance(msg, PublishAck):
                self.sent_at, acked = None, True
            elif isinstance(msg, Error) and self.sent_at is not None:
                self.sent_at = None  # refused (logged by the server); the next publish may pass
                log.warning("the parameter server refused a publish: %s", msg.reason)
            msg = receive_now(self.link.sock)
        now = time.monotonic()
        if not acked and now - self.last_check < DROP_CHECK_INTERVAL_S:
            self._send_if_free()
            return acked
        self.last_check = now
        dropped = self.link.dropped()
        late = self.sent_at is not None and now - self.sent_at > self.timeout_s
        if dropped or late:
            self.link.peer.lost(
                "the connection dropped" if dropped else f"no ack for {now - self.sent_at:.0f} s"
            )
            self.link.reset()
            self.due = self.due or self.sent_at is not None or dropped
            self.sent_at = None
        elif now - self.last_probe >= self.probe_interval_s:
            self.last_probe = now
            sockets.send(self.link.sock, StatsRequest())
        self._send_if_free()
        return acked

    def wait_for_ack(self, stop: threading.Event) -> bool:
        """Wait until the publish in flight is acknowledged; False when stopped first."""
        started = last_log = time.monotonic()
        while not stop.is_set():
            if self.poll(timeout_ms=200) or (self.sent_at is None and not self.due):
                return True
            if time.monotonic() - last_log > 10.0:
                last_log = time.monotonic()
                log.info(
                    "waiting for the parameter server at %s (%.0f s)",
                    self.link.peer.addr,
                    last_log - started,
                )
        return False

    def _send_if_free(self) -> None:
        if self.due and self.sent_at is None:
            arrays = publish(self.link.sock, self.algo, self.env_steps)
            self.sent_at, self.due = time.monotonic(), False
            if self.on_publish is not None:
                self.on_publish(self.algo.num_updates, arrays)


class RateLimitedLog:
    """Warnings about a repeating event: the first at once, then at most one per interval."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.last: float | None = None

    def warning(self, fmt: str, *args: object) -> None:
        now = time.monotonic()
        if self.last is None or now - self.last >= self.interval_s:
            self.last = now
            log.warning(fmt, *args)


def non_finite_fields(batch: SampleBatch) -> list[str]:
    """The float fields of ``batch`` (and its probabilities) holding a NaN or an infinity."""
    arrays = {**batch.fields, "probabilities": batch.probabilities}
    return [
        name
        for name, array in arrays.items()
        if array.dtype.kind == "f" and not np.isfinite(array).all()
    ]


def non_finite_tensors(state: object, prefix: str = "") -> list[str]:
    """The names of the float tensors in a (nested) state dict that hold a NaN or an infinity."""
    if isinstance(state, torch.Tensor):
        finite = not state.is_floating_point() or bool(torch.isfinite(state).all())
        return [] if finite else [prefix]
    if isinstance(state, dict):
        items = state.items()
    elif isinstance(state, (list, tuple)):
        items = enumerate(state)
    else:
        return []
    return [
        name
        for key, value in items
        for name in non_finite_tensors(value, f"{prefix}.{key}" if prefix else str(key))
    ]


def save_checkpoint(
    path: Path, algo: LearnerCore, counters: dict[str, int], keep_previous: bool = True
) -> bool:
    """Write the checkpoint atomically and, with ``keep_previous``, keep the one it replaces as
    ``checkpoint.prev.pt``.
    Weights (or optimizer state) that are not finite are not written: the error is logged, the
    checkpoints on disk stay as they are, and the result is False."""
    state = algo.state_dict()
    bad = non_finite_tensors(state)
    if bad:
        log.error(
            "checkpoint not written: %s hold NaN or infinite values (%d tensors); %s is kept",
            ", ".join(bad[:3]),
            len(bad),
            path.name,
        )
        return False
    tmp = path.with_suffix(".tmp")
    torch.save({"algo": state, "counters": counters}, tmp)
    if keep_previous and path.exists():
        os.replace(path, path.with_name(PREVIOUS_CHECKPOINT_NAME))
    os.replace(tmp, path)
    return True


def load_checkpoint(path: Path, algo: LearnerCore, device: torch.device) -> dict[str, int]:
    """Load a checkpoint written by ``save_checkpoint``; ``weights_only`` refuses anything but
    tensors and plain containers, so a tampered file cannot run code. A checkpoint with
    non-finite tensors raises ``ValueError`` before anything is loaded."""
    state = torch.load(path, map_location=device, weights_only=True)
    bad = non_finite_tensors(state)
    if bad:
        raise ValueError(f"{', '.join(bad[:3])} hold NaN or infinite values")
    algo.load_state_dict(state["algo"])
    return {k: int(v) for k, v in state["counters"].items()}


def resume_checkpoint(run_dir: Path, algo: LearnerCore, device: torch.device) -> dict[str, int]:
    """Load the run's latest checkpoint, or the previous one when the latest cannot be read
    (missing, truncated, tampered, not finite); raises ``FileNotFoundError`` when neither can."""
    latest, previous = run_dir / CHECKPOINT_NAME, run_dir / PREVIOUS_CHECKPOINT_NAME
    if not latest.is_file() and not previous.is_file():
        raise FileNotFoundError(f"run.resume is set but {latest} does not exist")
    try:
        return load_checkpoint(latest, algo, device)
    except Exception as exc:  # torch.load raises many types for a bad file; all mean unreadable
        reason = _brief(exc)
        if not previous.is_file():
            raise FileNotFoundError(
                f"cannot read {latest} ({reason}) and there is no {previous.name} to fall back on"
            ) from exc
        log.error(
            "cannot read %s (%s); loading the previous checkpoint %s", latest, reason, previous
        )
    try:
        return load_checkpoint(previous, algo, device)
    except Exception as exc:
        raise FileNotFoundError(f"cannot read {latest} nor {previous} ({_brief(exc)})") from exc


def _brief(exc: Exception) -> str:
    """An exception's type and the first line of its message, bounded."""
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {lines[0][:200] if lines else ''}"


def publish(sock: zmq.Socket, algo: LearnerCore, env_steps: int) -> dict[str, np.ndarray]:
    """Send the weights as version ``algo.num_updates``; returns them (copies, for the caller to
    keep)."""
    msg = PublishParams(algo.num_updates, env_steps, params_to_arrays(algo.network))
    sockets.send(sock, msg, compress_min_bytes=NO_COMPRESSION)
    return msg.arrays


def receive_now(sock: zmq.Socket, timeout_ms: int = 0) -> Message | None:
    """One waiting reply, or None; a malformed one is logged and returned as ``Error``."""
    try:
        return sockets.recv(sock, timeout_ms)
    except DecodeError as exc:
        log.warning("bad message: %s", exc)
        return Error(str(exc))


def build_algo(
    cfg: Config, device: torch.device, resume: bool
) -> tuple[LearnerCore, dict[str, int]]:
    """The algorithm's learner core with fresh weights, or restored from the run's checkpoint."""
    probe = make_vector_env(cfg.env, 1, cfg.unit_actions)
    spaces = probe.single_observation_space, probe.single_action_space
    probe.close()
    check_action_space(cfg, spaces[1])
    algo = load_algorithm(cfg.algorithm).learner_core(*spaces, cfg, device)
    # Every counter of the run that is not the algorithm's own (its updates): a resumed run
    # continues all of them.
    counters = {"num_samples": 0, "elapsed_ms": 0, "env_steps": 0}
    if resume:
        counters.update(resume_checkpoint(cfg.run_dir, algo, device))
        log.info(
            "resumed from %s at update %d, %d env steps, %.0f s of learner time",
            cfg.run_dir,
            algo.num_updates,
            counters["env_steps"],
            counters["elapsed_ms"] / 1000,
        )
    return algo, counters


class UpdateStep:
    """One update: a single learner's own gradient step, or, in a learner group, the gradient
    averaged over the ranks that had a batch (and the group's stop vote).

    A gradient whose norm, or whose rank's loss (the core's ``learner/loss`` metric), is not
    finite is dropped before the core applies it: every ``.grad`` is cleared, so the optimizer
    changes nothing, while the core still counts the step (PPO's epochs go on). The update's
    priorities are dropped with it. In a group, a rank with a non-finite loss fills its gradient
    with NaN, so that the averaged gradient, the same on every rank, makes every rank drop it.
    """

    def __init__(self, algo: LearnerCore, group: LearnerGroup | None) -> None:
        self.algo, self.group = algo, group
        self.params = list(algo.network.parameters())  # walking the modules costs per update
        self.num_skipped = 0  # gradient steps dropped for a non-finite loss or gradient
        self.skip_log = RateLimitedLog(SKIP_LOG_INTERVAL_S)
        self.first_logged = False

    def run(
        self, batch: SampledBatch | None, wants_stop: bool
    ) -> tuple[UpdateResult | None, int, bool]:
        """Returns this rank's result (None: no gradient from this rank this time), how many
        gradients the update averaged (0: no update happened) and whether the learners stop
        now. The core is asked even without a batch: PPO's epochs need no new data."""
        if self.group is None:
            self.algo.agree(lambda values: values)
            result = self.algo.compute_gradients(batch)
            if result is None:
                return None, 0, wants_stop
            result, grad_norm = self._apply(result)
            result.metrics["learner/grad_norm"] = grad_norm
            self._log_first()
            return result, 1, wants_stop
        self.algo.agree(self.group.sum)
        result = self.algo.compute_gradients(batch)
        if result is not None and not _finite_loss(result):
            for p in self.params:
                if p.grad is not None:
                    p.grad.fill_(math.nan)
        num_batches, stop_now = self.group.average_gradients(
            self.params, result is not None, wants_stop
        )
        if num_batches > 0:
            result, grad_norm = self._apply(result)
            if result is not None:
                result.metrics["learner/grad_norm"] = grad_norm
            self._log_first()
        return result, num_batches, stop_now

    def _log_first(self) -> None:
        """Log the first update (the start-up figures of benchmarks/learner_throughput.py)."""
        if not self.first_logged:
            self.first_logged = True
            log.info("first update done")

    def _apply(self, result: UpdateResult | None) -> tuple[UpdateResult | None, float]:
        """Apply the gradient in ``.grad``, or drop it when it or the loss is not finite."""
        grads = [p.grad for p in self.params if p.grad is not None]
        grad_norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
        if math.isfinite(grad_norm) and (result is None or _finite_loss(result)):
            return result, self.algo.apply_gradients()
        self.num_skipped += 1
        loss = result.metrics.get("learner/loss") if result is not None else None
        self.skip_log.warning(
            "dropped a gradient step: loss %s, gradient norm %s (%d steps dropped)",
            loss,
            grad_norm,
            self.num_skipped,
        )
        for p in self.params:
            p.grad = None
        self.algo.apply_gradients()  # no gradient: the core counts its step, nothing changes
        if result is not None:
            result = result._replace(priorities=None)
        return result, grad_norm


def _finite_loss(result: UpdateResult) -> bool:
    return math.isfinite(result.metrics.get("learner/loss", 0.0))


def join_group(cfg: Config, rank: int, device: torch.device) -> LearnerGroup | None:
    if cfg.learner.world_size == 1:
        if rank != 0:
            raise lifecycle.StartupError(f"rank {rank} given but learner.world_size is 1")
        return None
    return LearnerGroup(
        rank,
        cfg.learner.world_size,
        cfg.learner.rendezvous,
        cfg.learner.join_timeout_s,
        cfg.learner.collective_timeout_s,
        device,
    )


def main(cfg: Config, rank: int = 0) -> int:
    """Run one learner rank until a stop condition, SIGINT/SIGTERM, the servers' ``Shutdown`` or
    the loss of another rank (exit status 3)."""
    stop = lifecycle.install_stop_handlers()
    torch.set_num_threads(cfg.learner.torch_threads)
    torch.manual_seed(cfg.learner.seed)
    device = torch.device(lifecycle.resolve_device(cfg.learner.device))
    chief = rank == 0  # publishes weights, writes checkpoints and result.json
    on_train_result = make_train_result_callback(cfg.callbacks) if chief else None
    try:
        group = join_group(cfg, rank, device)
    except GroupError as exc:
        log.error("%s", exc)
        return 3
    algo, counters = build_algo(cfg, device, resume=chief and cfg.run.resume)
    if group is not None:
        try:
            state = group.broadcast_state({"algo": algo.state_dict(), "counters": counters})
        except GroupError as exc:
            log.error("%s", exc)
            return 3
        algo.load_state_dict(state["algo"])
        counters = {k: int(v) for k, v in state["counters"].items()}
    if chief:
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        # Roles started beside the learner read this file while it is written.
        lifecycle.write_atomic(cfg.run_dir / "config.yaml", dump_config(cfg))
    tb_name = "learner" if group is None else f"learner_{rank}"
    writer = MetricsWriter(cfg.run_dir / "tb" / tb_name)
    writer.text("config", "```\n" + dump_config(cfg) + "\n```")
    reporter = Reporter(
        cfg, writer, counters["elapsed_ms"] / 1000.0, counters["env_steps"], on_train_result
    )
    ctx = sockets.make_context()
    replay = ReplayLinks(ctx, cfg, device, auth.client_keys(cfg.net, "learner", "replay"))
    params_peer = Peer("parameter server", cfg.net.params_addr)
    params_link = Link(ctx, params_peer, auth.client_keys(cfg.net, "learner", "params"))
    publisher = Publisher(
        params_link, algo, cfg.learner.resend_timeout_s, cfg.learner.report_interval_s / 2
    )
    judged = JudgedWeights()
    if chief:
        publisher.on_publish = judged.remember
    stop_version: int | None = None  # the evaluated version the stop condition judged
    stats_interval_s = min(cfg.learner.report_interval_s / 2, STATS_INTERVAL_S)
    batches = replay.batches
    step = UpdateStep(algo, group)
    stats: dict[str, float] = {}
    last_stats_request = time.monotonic()
    reason: str | None = None
    peers_stopped = False
    exit_code = 0
    linger_ms = 0
    try:
        if chief and counters["env_steps"] > 0:
            # Before the first publish: actors of a resumed run wait for these weights, so no
            # chunk of this session reaches replay before its count is restored.
            restored = restore_counters(replay, counters["env_steps"], stop)
            if restored is None:
                return 0
            stats = restored
        if chief:
            publisher.publish(run_env_steps(stats, counters))
            # Stopped while waiting: a single learner just returns; a rank of a group goes on to
            # the first update, whose stop vote stops the other ranks with it (returning here
            # would look to them like a lost rank).
            if not publisher.wait_for_ack(stop) and group is None:
                return 0
            log.info(
                "learner on %s: published version %d; waiting for data", device, algo.num_updates
            )
        version_seen = algo.num_updates
        while True:
            waited = time.monotonic()
            batch = None
            try:
                batch = batches.next(timeout_ms=0 if algo.has_work else 50)
            except PeerShutdown as exc:
                log.info("replay is shutting down (%s); stopping", exc)
                peers_stopped = True
            reporter.wait_s += time.monotonic() - waited
            wants_stop = stop.is_set() or reason is not None or peers_stopped
            result, num_batches, stop_now = step.run(batch, wants_stop)
            if result is not None:
                if result.priorities is not None and batch is not None:
                    update = PriorityUpdate(cfg.replay.table, rank, batch.keys, result.priorities)
                    batches.send_priorities(update)
                reporter.metrics = result.metrics
            reporter.metrics["learner/skipped_batches"] = float(batches.num_skipped)
            reporter.metrics["learner/skipped_updates"] = float(step.num_skipped)
            reporter.metrics["learner/replay_silent_s"] = replay.peer.silent_s()
            reporter.metrics["learner/params_silent_s"] = params_peer.silent_s()
            if batch is not None:
                reporter.samples.add(len(batch.keys))
            if num_batches > 0:
                reporter.updates.add(1)
                reporter.total_samples.add(num_batches * cfg.learner.batch_size)
                counters["num_samples"] += num_batches * cfg.learner.batch_size
            if algo.num_updates != version_seen:  # a new weights version (PPO: per rollout)
                version_seen = algo.num_updates
                if chief and algo.num_updates % cfg.learner.publish_period == 0:
                    publisher.publish(run_env_steps(stats, counters))
                if chief and algo.num_updates % cfg.learner.checkpoint_period == 0:
                    counters["elapsed_ms"] = int(reporter.elapsed_s * 1000)
                    counters["env_steps"] = run_env_steps(stats, counters)
                    save_checkpoint(cfg.run_dir / CHECKPOINT_NAME, algo, counters)
            if stop_now:
                break
            if chief:
                publisher.poll()  # acks; a publish due, or lost with a restarted server
            msg = replay.receive()
            new_round = None
            if isinstance(msg, Stats):
                stats = msg.values
                new_round = judged.new_round(stats, cfg.run.stop_eval_episodes) if chief else None
                if new_round is not None and judged.is_best(new_round[1], new_round[0]):
                    counters["elapsed_ms"] = int(reporter.elapsed_s * 1000)
                    counters["env_steps"] = run_env_steps(stats, counters)
                    save_judged_checkpoint(
                        rundir.best_checkpoint_path(cfg.run_dir),
                        algo,
                        counters,
                        judged,
                        new_round[0],
                    )
            elif isinstance(msg, Shutdown):
                peers_stopped = True
            replay.check(run_env_steps(stats, counters) if chief else None)
            if time.monotonic() - last_stats_request >= stats_interval_s:
                last_stats_request = time.monotonic()
                sockets.send(replay.control.sock, StatsRequest())
            if not chief:
                if reporter.due():
                    reporter.report_rank(algo.num_updates, run_env_steps(stats, counters))
                continue
            # A new evaluation round is reported (and judged) at once, not at the next report.
            if stats and (reporter.due() or new_round is not None) and reason is None:
                reason = reporter.report(stats, algo.num_updates, counters["num_samples"])
                if reason is not None and new_round is not None:
                    stop_version = eval_condition_version(cfg.run, stats)
        if reason is not None:
            log.info("stop condition met: %s", reason)
            # The servers answer every later request with Shutdown, which stops the actors on
            # every host.
            sockets.send(replay.control.sock, Shutdown(f"learner: {reason}"))
            sockets.send(params_link.sock, Shutdown(f"learner: {reason}"))
            linger_ms = 1000  # let the two messages leave before the sockets close
    except GroupError as exc:
        log.error("%s; stopping", exc)
        exit_code = 3
    finally:
        if chief:
            counters["elapsed_ms"] = int(reporter.elapsed_s * 1000)
            counters["env_steps"] = run_env_steps(stats, counters)
            if stop_version is None:
                counters["weights_version"] = algo.num_updates
                save_checkpoint(cfg.run_dir / CHECKPOINT_NAME, algo, counters)
            else:  # the run met its evaluation condition: keep the weights that met it
                save_judged_checkpoint(
                    cfg.run_dir / CHECKPOINT_NAME, algo, counters, judged, stop_version
                )
        writer.close()
        replay.close(linger_ms)
        params_link.sock.setsockopt(zmq.LINGER, linger_ms)
        params_link.close()
        ctx.term()
        if group is not None:
            group.close()
    log.info(
        "learner rank %d stopped after %d updates, weights sha256 %s",
        rank,
        algo.num_updates,
        weights_digest(algo.network),
    )
    return exit_code


def save_judged_checkpoint(
    path: Path, algo: LearnerCore, counters: dict[str, int], judged: JudgedWeights, version: int
) -> None:
    """A checkpoint whose network holds the weights of published ``version`` (the learner's
    other state is its current one); the current weights when that version is no longer kept."""
    with judged.loaded(algo.network, version) as kept:
        counters["weights_version"] = version if kept else algo.num_updates
        written = save_checkpoint(path, algo, counters, keep_previous=path.name == CHECKPOINT_NAME)
    if written:
        log.info(
            "%s: weights version %d%s",
            path.name,
            counters["weights_version"],
            "" if kept else f" (version {version} was no longer kept)",
        )


def weights_digest(network: torch.nn.Module) -> str:
    """SHA-256 of the weights' bytes: equal on learners that hold equal weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(network.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def run_env_steps(stats: dict[str, float], counters: dict[str, int]) -> int:
    """The run's training env steps: replay's latest count, never below the checkpoint's."""
    return max(int(stats.get("replay/env_steps", 0)), counters["env_steps"])


def restore_counters(replay: ReplayLinks, env_steps: int, stop: threading.Event) -> dict | None:
    """Tell replay where a resumed run's env steps stand and wait for its ``Stats`` (sent again
    when replay went away meanwhile); None when stopped while waiting."""
    started = last_log = time.monotonic()
    sockets.send(replay.control.sock, RestoreCounters(env_steps))
    while not stop.is_set():
        msg = replay.receive(timeout_ms=200)
        if isinstance(msg, Stats):
            return msg.values
        replay.check(env_steps)
        if time.monotonic() - last_log > 10.0:
            last_log = time.monotonic()
            log.info("waiting for the replay server (%.0f s)", last_log - started)
    return None

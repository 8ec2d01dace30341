"""Learner: pulls batches from replay, updates the algorithm's networks, sends new priorities back
(prioritized tables) and publishes weights to the parameter server.

Connects:  DEALER cfg.net.replay_addr (batches)   out: SampleRequest, PriorityUpdate
                                                  in: SampleBatch, Error
           DEALER cfg.net.replay_addr (control)   out: StatsRequest, RestoreCounters, Shutdown
                                                  in: Stats
           DEALER cfg.net.params_addr             out: PublishParams, Shutdown   in: PublishAck

``main`` is the loop, one named step after another (``Learner``'s methods): receive a batch,
update, send its priorities, publish and checkpoint a new weights version, read the servers'
replies (keeping the best evaluated weights), report, and stop when the group votes to. Its parts
live in ``apexrl.learning``: the link to replay (``replay_link``: ``learner.prefetch_batches``
sample requests stay in flight), the publisher (``publisher``), checkpoints (``checkpoint``), the
update step and the learner group (``update``, ``group``), the reports and the stop rule
(``reporting``), the judged weights (``judged``), the checks for non-finite values
(``finite``) and the requests of the user's Python through the run directory (``user_requests``:
weights to publish as a new version, a checkpoint now).

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

Files in the run directory (``apexrl.runtime.rundir``): ``config.yaml`` (resolved config),
``result.json`` (one JSON object per report, with the run's custom metrics:
``apexrl.learning.reporting``), ``checkpoint.pt`` (tensors and numbers only, loaded with
``torch.load(weights_only=True)``) with the one before it as ``checkpoint.prev.pt``,
``checkpoint_best.pt`` (the best evaluated weights) and ``tb/learner`` (TensorBoard;
``tb/learner_<rank>`` in a group).

Nothing non-finite is trained on or kept: a batch with a NaN or an infinity in a float field is
skipped (``learner/skipped_batches``) and gets no priority update; a gradient whose loss or norm
is not finite is dropped (``learner/skipped_updates``); weights that are not finite are never
written to a checkpoint, and a resumed learner that cannot read the latest checkpoint loads the
previous one.
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial
from typing import NamedTuple

import torch
import yaml
import zmq

from apexrl.algos import LearnerCore, SampledBatch, UpdateResult
from apexrl.callbacks import TrainResultCallback, make_train_result_callback
from apexrl.clients.peers import Link, Peer, PeerShutdown
from apexrl.config import Config, dump_config
from apexrl.league.league import league_stats
from apexrl.learning.checkpoint import save_checkpoint, save_judged_checkpoint, weights_digest
from apexrl.learning.group import GroupError, LearnerGroup
from apexrl.learning.judged import JudgedWeights
from apexrl.learning.publisher import Publisher
from apexrl.learning.replay_link import BatchStream, ReplayLinks, restore_counters, run_env_steps
from apexrl.learning.reporting import Reporter, eval_condition_version
from apexrl.learning.update import UpdateStep, build_algo, join_group, share_start_state
from apexrl.learning.user_requests import UserRequests
from apexrl.multiagent.learning import PolicyCore
from apexrl.runtime import lifecycle, rundir
from apexrl.runtime.metrics import MetricsWriter
from apexrl.tracking import (
    TrackerFeed,
    TrackerMissing,
    check_installed,
    open_feed,
    outside_trackers,
    preload,
)
from apexrl.transport import auth, sockets
from apexrl.transport.messages import PriorityUpdate, Shutdown, Stats, StatsRequest

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.25  # the longest wait for replay's Stats (and so an evaluation verdict)

EvalRound = tuple[int, float]  # (weights version, mean return) of a new evaluation round


class PolicyTrainer:
    """One policy's training on a learner rank: its learner core, its update step, its stream of
    batches from its replay table and its publisher. A single-agent run has one, named ""; a
    multi-agent run one per network policy (``apexrl.multiagent.learning``), of which a policy
    that is not trained only publishes its first weights."""

    def __init__(
        self,
        name: str,
        cfg: Config,
        algo: LearnerCore,
        trained: bool,
        group: LearnerGroup | None,
        batches: BatchStream | None,
        publisher: Publisher,
    ) -> None:
        self.name, self.cfg, self.algo, self.trained = name, cfg, algo, trained
        self.step = UpdateStep(algo, group)
        self.batches, self.publisher = batches, publisher
        self.version_seen = algo.num_updates  # the weights version of the last publish check
        self.metrics_prefix = f"learner/{name}/" if name else "learner/"

    def new_version(self) -> bool:
        """Whether the weights changed version since the last call (PPO: once per rollout)."""
        if self.algo.num_updates == self.version_seen:
            return False
        self.version_seen = self.algo.num_updates
        return True

    def named(self, metrics: dict[str, float]) -> dict[str, float]:
        """An update's ``learner/<name>`` metrics under this policy's name."""
        if not self.name:
            return metrics
        return {self.metrics_prefix + k.removeprefix("learner/"): v for k, v in metrics.items()}


class Learner:
    """One learner rank: its parts (links to both servers, the policies' trainers, reporter,
    judged weights) and what its loop carries from one update to the next. Each method is one
    step of ``main``'s loop. Rank 0, the chief, alone publishes weights and writes
    ``config.yaml``, checkpoints and ``result.json``."""

    def __init__(
        self,
        cfg: Config,
        rank: int,
        device: torch.device,
        stop: threading.Event,
        group: LearnerGroup | None,
        training: Training,
        on_train_result: TrainResultCallback | None,
    ) -> None:
        self.cfg, self.rank, self.device, self.stop = cfg, rank, device, stop
        self.group, self.counters = group, training.counters
        self.checkpointed = training.checkpointed  # what checkpoint.pt holds
        self.chief = rank == 0
        if self.chief:
            cfg.run_dir.mkdir(parents=True, exist_ok=True)
            # Roles started beside the learner read this file while it is written.
            lifecycle.write_atomic(rundir.config_path(cfg.run_dir), dump_config(cfg))
        tracking = open_tracking(cfg) if self.chief else None  # before the learner's clock
        tb_name = "learner" if group is None else f"learner_{rank}"
        self.writer = MetricsWriter(rundir.tensorboard_dir(cfg.run_dir, tb_name))
        self.writer.text("config", "```\n" + dump_config(cfg) + "\n```")
        counters = self.counters
        self.reporter = Reporter(
            cfg,
            self.writer,
            counters["elapsed_ms"] / 1000.0,
            counters["env_steps"],
            on_train_result,
        )
        self.ctx = sockets.make_context()
        keys = auth.client_keys(cfg.net, "learner", "replay")
        tables = {p.name: p.cfg for p in training.policies if p.trained}
        self.replay = ReplayLinks(self.ctx, cfg, device, keys, tables)
        self.params_peer = Peer("parameter server", cfg.net.params_addr)
        keys = auth.client_keys(cfg.net, "learner", "params")
        probe_s = cfg.learner.report_interval_s / 2
        self.trainers = []
        for p in training.policies:
            link = Link(self.ctx, self.params_peer, keys)
            publisher = Publisher(link, p.core, cfg.learner.resend_timeout_s, probe_s, p.name)
            if self.chief:
                publisher.before_publish = partial(self.replay.announce_version, policy=p.name)
            batches = self.replay.streams[p.name] if p.trained else None
            self.trainers.append(
                PolicyTrainer(p.name, p.cfg, p.core, p.trained, group, batches, publisher)
            )
        self.lead = self.trainers[0]
        self.training = [t for t in self.trainers if t.trained]
        self.algo = self.lead.algo
        self.judged = JudgedWeights()
        self.single = not cfg.multiagent.enabled
        if self.chief and self.single:  # a multi-agent run's rounds judge several policies
            self.lead.publisher.on_publish = self.judged.remember
        self.requests = UserRequests(
            cfg.run_dir, self.algo, self.lead.publisher, group is not None, self.checkpointed
        )
        self.reporter.env_task = self.lead.publisher.task_in_force
        self.reporter.tracking = tracking
        self.stats: dict[str, float] = {}  # replay's latest Stats
        self.stats_interval_s = min(cfg.learner.report_interval_s / 2, STATS_INTERVAL_S)
        self.last_stats_request = time.monotonic()
        self.reason: str | None = None  # why the run is over (a stop condition met)
        self.stop_version: int | None = None  # the evaluated version the stop condition judged
        self.peers_stopped = False  # a server said Shutdown
        self.linger_ms = 0  # how long the sockets may keep unsent messages when they close

    def start(self) -> bool:
        """Rank 0: tell replay a resumed run's env steps, then publish the first weights and wait
        for the acks. False when stopped while waiting (the learner then just returns)."""
        if not self.chief:
            return True
        if self.counters["env_steps"] > 0:
            # Before the first publish: actors of a resumed run wait for these weights, so no
            # chunk of this session reaches replay before its count is restored.
            restored = restore_counters(self.replay, self.counters["env_steps"], self.stop)
            if restored is None:
                return False
            self.stats = restored
        for trainer in self.trainers:
            trainer.publisher.publish(self.env_steps())
        for trainer in self.trainers:
            # Stopped while waiting: a single learner just returns; a rank of a group goes on
            # to the first update, whose stop vote stops the other ranks with it (returning
            # here would look to them like a lost rank).
            if not trainer.publisher.wait_for_ack(self.stop) and self.group is None:
                return False
        log.info(
            "learner on %s: published version %s; waiting for data",
            self.device,
            ", ".join(f"{t.name or 'weights'} {t.algo.num_updates}" for t in self.trainers),
        )
        return True

    def env_steps(self) -> int:
        """The run's env steps: replay's latest count, never below the checkpoint's."""
        return run_env_steps(self.stats, self.counters)

    def receive_batch(self, trainer: PolicyTrainer) -> SampledBatch | None:
        """The trainer's next batch from replay, or None (also while the core wants none: the
        batches wait in replay); replay's ``Shutdown`` ends the run."""
        if not trainer.algo.wants_batch:
            return None
        waited = time.monotonic()
        batch = None
        try:
            timeout_ms = 0 if trainer.algo.has_work else 50 // len(self.training)
            batch = trainer.batches.next(timeout_ms=timeout_ms)
        except PeerShutdown as exc:
            log.info("replay is shutting down (%s); stopping", exc)
            self.peers_stopped = True
        self.reporter.wait_s += time.monotonic() - waited
        return batch

    def update(
        self, trainer: PolicyTrainer, batch: SampledBatch | None
    ) -> tuple[UpdateResult | None, int, bool]:
        """One update of the trainer's core (``UpdateStep.run``), with this rank's stop vote."""
        wants_stop = self.stop.is_set() or self.reason is not None or self.peers_stopped
        return trainer.step.run(batch, wants_stop)

    def send_priorities(
        self, trainer: PolicyTrainer, batch: SampledBatch | None, result: UpdateResult | None
    ) -> None:
        """The update's new priorities for the batch's items (prioritized tables)."""
        if result is not None and result.priorities is not None and batch is not None:
            table = trainer.cfg.replay.table
            update = PriorityUpdate(table, self.rank, batch.keys, result.priorities)
            trainer.batches.send_priorities(update)

    def count(
        self,
        trainer: PolicyTrainer,
        batch: SampledBatch | None,
        result: UpdateResult | None,
        num_batches: int,
    ) -> None:
        """The update's metrics and counts, for the next report and checkpoint."""
        reporter = self.reporter
        if result is not None:
            if self.single:
                reporter.metrics = result.metrics
            else:
                reporter.metrics.update(trainer.named(result.metrics))
        reporter.metrics[trainer.metrics_prefix + "skipped_batches"] = float(
            trainer.batches.num_skipped
        )
        reporter.metrics[trainer.metrics_prefix + "skipped_updates"] = float(
            trainer.step.num_skipped
        )
        reporter.metrics["learner/replay_silent_s"] = self.replay.peer.silent_s()
        reporter.metrics["learner/params_silent_s"] = self.params_peer.silent_s()
        if batch is not None:
            reporter.samples.add(len(batch.keys))
        if num_batches > 0:
            reporter.updates.add(1)
            samples = num_batches * trainer.cfg.learner.batch_size
            reporter.total_samples.add(samples)
            self.counters["num_samples"] += samples

    def publish(self, trainer: PolicyTrainer) -> None:
        """Rank 0: publish every ``learner.publish_period`` versions."""
        if self.chief and trainer.algo.num_updates % self.cfg.learner.publish_period == 0:
            trainer.publisher.publish(self.env_steps())

    def checkpoint(self, trainer: PolicyTrainer) -> None:
        """Rank 0: write ``checkpoint.pt`` every ``learner.checkpoint_period`` versions (of any
        policy: the checkpoint holds them all)."""
        if self.chief and trainer.algo.num_updates % self.cfg.learner.checkpoint_period == 0:
            self.sync_counters()
            path = rundir.checkpoint_path(self.cfg.run_dir)
            save_checkpoint(path, self.checkpointed, self.counters)

    def sync_counters(self) -> None:
        """Bring the counters a checkpoint keeps up to now: learner time and the run's env steps."""
        self.counters["elapsed_ms"] = int(self.reporter.elapsed_s * 1000)
        self.counters["env_steps"] = self.env_steps()

    def poll_params(self) -> None:
        """Rank 0: read the parameter server's acks; send a publish due, or lost with a restarted
        server."""
        if self.chief:
            for trainer in self.trainers:
                trainer.publisher.poll()

    def read_replay(self) -> EvalRound | None:
        """Read a reply on replay's control socket: ``Stats`` (rank 0: returns the new evaluation
        round they show, if any) or ``Shutdown``."""
        msg = self.replay.receive()
        if isinstance(msg, Stats):
            self.stats = msg.values
            if self.chief and self.single:
                return self.judged.new_round(self.stats, self.cfg.run.stop_eval_episodes)
        elif isinstance(msg, Shutdown):
            self.peers_stopped = True
        return None

    def keep_best(self, new_round: EvalRound | None) -> None:
        """Write ``checkpoint_best.pt`` when a new evaluation round beats every earlier one."""
        if new_round is not None and self.judged.is_best(new_round[1], new_round[0]):
            self.sync_counters()
            path = rundir.best_checkpoint_path(self.cfg.run_dir)
            save_judged_checkpoint(path, self.algo, self.counters, self.judged, new_round[0])

    def watch_replay(self) -> None:
        """Re-connect when replay went away; ask for its ``Stats`` every ``stats_interval_s``."""
        self.replay.check(self.env_steps() if self.chief else None)
        if time.monotonic() - self.last_stats_request >= self.stats_interval_s:
            self.last_stats_request = time.monotonic()
            sockets.send(self.replay.control.sock, StatsRequest())

    def report(self, new_round: EvalRound | None) -> None:
        """Write a report when one is due; rank 0 judges a new evaluation round at once, reports
        it when it ends the run, and keeps the stop reason its report gives. (A round is not a
        report of its own: a fast env plays several a second, and a record of each would grow
        ``result.json`` and the log by megabytes an hour.)"""
        if not self.chief:
            if self.reporter.due():
                self.reporter.report_rank(self.algo.num_updates, self.env_steps())
            return
        if not self.stats or self.reason is not None:
            return
        if not self.single:  # a multi-agent run's rounds: judged on the report that shows them
            new_round = None if self.reporter.judge(self.stats) is None else (0, 0.0)
        round_ends_run = new_round is not None and self.reporter.judge(self.stats) is not None
        if self.reporter.due() or round_ends_run:
            stats = {**self.stats, **league_stats(self.lead.publisher.server_stats)}
            self.reason = self.reporter.report(
                stats, self.algo.num_updates, self.counters["num_samples"]
            )
            if self.reason is not None and new_round is not None and self.single:
                self.stop_version = eval_condition_version(self.cfg.run, self.stats)

    def serve_requests(self) -> None:
        """Rank 0: what the user's Python asked for through the run directory
        (``user_requests``): weights to publish as a new version, a checkpoint now."""
        if self.chief:
            self.sync_counters()
            if self.requests.serve(self.counters):
                self.lead.version_seen = self.algo.num_updates  # published already

    def stop_servers_if_over(self) -> None:
        """When a stop condition was met, ask both servers to shut down."""
        if self.reason is None:
            return
        log.info("stop condition met: %s", self.reason)
        # The servers answer every later request with Shutdown, which stops the actors on
        # every host.
        sockets.send(self.replay.control.sock, Shutdown(f"learner: {self.reason}"))
        sockets.send(self.lead.publisher.link.sock, Shutdown(f"learner: {self.reason}"))
        self.linger_ms = 1000  # let the two messages leave before the sockets close

    def last_checkpoint(self) -> None:
        """Rank 0: the checkpoint a stopping learner leaves."""
        if not self.chief:
            return
        self.sync_counters()
        path = rundir.checkpoint_path(self.cfg.run_dir)
        if self.stop_version is None:
            self.counters["weights_version"] = self.algo.num_updates
            save_checkpoint(path, self.checkpointed, self.counters)
        else:  # the run met its evaluation condition: keep the weights that met it
            save_judged_checkpoint(path, self.algo, self.counters, self.judged, self.stop_version)
        if self.reporter.tracking is not None:
            self.reporter.tracking.close(path, ok=True, stop=self.stop)

    def close(self) -> None:
        self.writer.close()
        self.replay.close(self.linger_ms)
        for trainer in self.trainers:
            trainer.publisher.link.sock.setsockopt(zmq.LINGER, self.linger_ms)
            trainer.publisher.link.close()
        self.ctx.term()
        if self.group is not None:
            self.group.close()


class Training(NamedTuple):
    """What a learner rank trains: each policy's core (one, named "", in a single-agent run),
    what its checkpoints hold, and the run's counters."""

    policies: list[PolicyCore]
    checkpointed: object  # a LearnerCore, or multiagent.learning.PolicyCores
    counters: dict[str, int]


def build_training(cfg: Config, device: torch.device, resume: bool) -> Training:
    """The run's learner cores, fresh or resumed from its checkpoint."""
    if cfg.multiagent.enabled:
        from apexrl.multiagent.learning import build_policy_cores

        cores, counters = build_policy_cores(cfg, device, resume)
        return Training(cores.cores, cores, counters)
    algo, counters = build_algo(cfg, device, resume)
    return Training([PolicyCore("", cfg, algo, True)], algo, counters)


def set_up_torch(cfg: Config) -> torch.device:
    """Threads and seed as configured; the device the learner trains on."""
    torch.set_num_threads(cfg.learner.torch_threads)
    torch.manual_seed(cfg.learner.seed)
    return torch.device(lifecycle.resolve_device(cfg.learner.device))


def open_tracking(cfg: Config) -> TrackerFeed | None:
    """Rank 0's feed to the run's trackers besides TensorBoard (``run.trackers``); None without."""
    if not outside_trackers(cfg.run.trackers):
        return None
    try:
        check_installed(cfg.run.trackers)
    except TrackerMissing as exc:
        raise lifecycle.StartupError(str(exc)) from exc
    preload(cfg.run.trackers)  # their imports here: not in the feed's thread beside training
    cfg_dict = yaml.safe_load(dump_config(cfg))
    return open_feed(cfg_dict, cfg.run_dir, cfg.run.trackers)


def main(cfg: Config, rank: int = 0) -> int:
    """Run one learner rank until a stop condition, SIGINT/SIGTERM, the servers' ``Shutdown`` or
    the loss of another rank (exit status 3)."""
    stop = lifecycle.install_stop_handlers()
    device = set_up_torch(cfg)
    on_train_result = make_train_result_callback(cfg.callbacks) if rank == 0 else None
    try:
        group = join_group(cfg, rank, device)
        training = build_training(cfg, device, resume=rank == 0 and cfg.run.resume)
        counters = share_start_state(group, training.checkpointed, training.counters)
        training = training._replace(counters=counters)
    except GroupError as exc:
        log.error("%s", exc)
        return 3
    learner = Learner(cfg, rank, device, stop, group, training, on_train_result)
    exit_code = 0
    try:
        if not learner.start():
            return 0
        while True:
            stop_now = False
            for trainer in learner.training:  # every trained policy (one in a single-agent run)
                batch = learner.receive_batch(trainer)
                result, num_batches, stop_trainer = learner.update(trainer, batch)
                learner.send_priorities(trainer, batch, result)
                learner.count(trainer, batch, result, num_batches)
                if trainer.new_version():
                    learner.publish(trainer)
                    learner.checkpoint(trainer)
                stop_now = stop_now or stop_trainer
            if stop_now:
                break
            learner.poll_params()
            new_round = learner.read_replay()
            learner.keep_best(new_round)
            learner.watch_replay()
            learner.report(new_round)
            learner.serve_requests()
        learner.stop_servers_if_over()
    except GroupError as exc:
        log.error("%s; stopping", exc)
        exit_code = 3
    finally:
        learner.last_checkpoint()
        learner.close()
    for trainer in learner.trainers:
        log.info(
            "learner rank %d stopped after %d updates%s, weights sha256 %s",
            rank,
            trainer.algo.num_updates,
            f" of policy {trainer.name}" if trainer.name else "",
            weights_digest(trainer.algo.network),
        )
    return exit_code

"""Actor: steps a vector of gymnasium envs with one batched forward pass per step, cuts the steps
into replay items with the algorithm's actor core, and pushes them to replay.

Connects:  DEALER cfg.net.params_addr   out: ParamsRequest       in: Params, ParamsNotModified
           DEALER cfg.net.replay_addr   out: TrajectoryChunk     in: InsertAck, Error, Shutdown
                                        out: ActorReport         (no reply)
                                        out: StatsRequest        in: Stats

The loop knows no algorithm: ``core.act`` turns observations into actions and per-step extras,
``core.observe`` sees every env step (a recurrent core resets its state where an episode ended),
the steps go into a time-major ``StepBlock``, and when the block is full ``core.items`` cuts it into
replay items with their initial priorities (``apexrl.algos``; e.g. Ape-X's n-step transitions and
its per-actor epsilon_i = epsilon^(1 + alpha * i / (N - 1))). The actor keeps one chunk in flight:
the next chunk is sent only after replay acknowledged the previous one, so a replay server that
holds inserts back (rate limiter) slows the actor down.

An actor first asks the parameter server for weights. When the run has weights it plays with
them from its first step. A training actor of a fresh run whose learner has not published yet
starts with its own initial network (chunks carry ``weights_version`` -1 until the first version
arrives), so replay fills while the learner is still starting; an evaluation actor, and every
actor of a resumed run (``run.resume``), waits for the learner's weights instead, so no episode of
a random network is counted as the run's.

Servers may go away and come back (``clients.peers``): a chunk or weights request that a server
lost (its connection dropped, or it answered nothing for ``actor.resend_timeout_s``) is sent
again on a fresh socket, the actor logs once that the server is not answering and once that it
answers again, and it keeps acting with the weights it has meanwhile. ``actor/replay_silent_s``
is the seconds since replay last answered.

Each report to replay is followed by a ``StatsRequest``; the actor writes its TensorBoard scalars
at the run's env steps from the reply, the x-axis every role shares (its own env steps are the
scalar ``actor/env_steps``).

The evaluation actor (``apexrl actor --eval``) is ``apexrl.evaluation.main``: rounds of greedy
episodes of one frozen weights version each, the figure a run's success is judged on.

A run's callbacks (``callbacks`` in the config, ``apexrl.callbacks``) see a training actor's
episodes: the interval means of the custom metrics their ``on_episode_end`` returns go to replay
in each report and to TensorBoard as ``actor/custom/<name>``.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from apexrl import lifecycle
from apexrl.algos import load_algorithm
from apexrl.callbacks import EpisodeCallbacks, make_episode_callbacks
from apexrl.clients.params import ParamsClient, PeerShutdown
from apexrl.clients.peers import Link, Peer
from apexrl.config import Config
from apexrl.envs import EnvError, VectorStep, check_action_space, make_vector_env, step_vector
from apexrl.metrics import MetricsWriter, RateMeter
from apexrl.step_block import StepBlock
from apexrl.transport import auth, sockets
from apexrl.transport.codec import DecodeError
from apexrl.transport.messages import (
    ActorReport,
    Error,
    InsertAck,
    Shutdown,
    Stats,
    StatsRequest,
    TrajectoryChunk,
)

log = logging.getLogger(__name__)

PROBE_INTERVAL_S = 1.0  # seconds of silence from replay, while waiting, before asking for Stats


class ReplayClient:
    """Sends chunks with one in flight, and reports; ``send_chunk`` waits for the previous ack.

    A chunk that replay does not answer is sent again: at once when the connection drops (the
    replay server stopped or restarted, and a chunk it held is gone) and after ``timeout_s``
    without any answer from replay. While a chunk is unanswered the client asks for ``Stats``
    every ``PROBE_INTERVAL_S``, so a server that holds the chunk back under its rate limiter
    still answers and the chunk is not sent twice. A chunk sent again goes out on a fresh socket,
    so the copy queued in the old one never arrives; replay gets a chunk twice only when it stored
    the chunk and its ack was lost (the server stopped between the two), or when a server that
    stalled for longer than ``timeout_s`` wakes up: rare, and a duplicate chunk is harmless.
    """

    def __init__(self, link: Link, stop, timeout_s: float, warn_after_s: float) -> None:
        self.link, self.stop, self.timeout_s = link, stop, timeout_s
        self.warn_after_s = warn_after_s  # warn about a chunk held back for this long
        self.chunk: TrajectoryChunk | None = None  # sent, not yet answered
        self.stats_asked = False  # a StatsRequest is unanswered
        self.asked_at = 0.0  # when the oldest unanswered request (chunk or stats) was sent
        self.last_probe = time.monotonic()
        self.wait_s = 0.0  # time spent blocked on acks (flow control)
        self.run_env_steps: int | None = None  # from the latest Stats; None: none since asked

    @property
    def awaiting_ack(self) -> bool:
        return self.chunk is not None

    def poll(self, timeout_ms: int = 0) -> None:
        try:
            msg = sockets.recv(self.link.sock, timeout_ms)
        except DecodeError as exc:
            log.warning("bad message from the replay server: %s", exc)
            msg = None
        if msg is not None:
            self.link.peer.heard()
            self.asked_at = time.monotonic()  # what is still unanswered waits from now on
        if isinstance(msg, InsertAck):
            self.chunk = None
        elif isinstance(msg, Error):
            self.chunk = None
            log.warning("replay server rejected a chunk: %s", msg.reason)
        elif isinstance(msg, Stats):
            self.stats_asked = False
            self.run_env_steps = int(msg.values.get("replay/env_steps", 0))
        elif isinstance(msg, Shutdown):
            raise PeerShutdown(msg.reason)
        self._check_replay()

    def _check_replay(self) -> None:
        """Send the unanswered chunk again when the connection dropped or replay is silent, and
        ask for ``Stats`` while waiting so that a live server answers something."""
        if self.link.dropped():
            self._send_again("the connection dropped")
            return
        if self.chunk is None and not self.stats_asked:
            return
        now = time.monotonic()
        waited_s = now - self.asked_at
        if waited_s > self.timeout_s:
            self._send_again(f"no answer for {waited_s:.0f} s")
        elif waited_s > PROBE_INTERVAL_S and now - self.last_probe > PROBE_INTERVAL_S:
            self.last_probe = now
            self._ask_stats()

    def _send_again(self, why: str) -> None:
        self.link.peer.lost(why)
        self.link.reset()
        self.asked_at = time.monotonic()
        if self.chunk is not None:
            sockets.send(self.link.sock, self.chunk)
        if self.stats_asked:
            self._ask_stats()

    def _ask_stats(self) -> None:
        self._mark_asked()
        sockets.send(self.link.sock, StatsRequest())
        self.stats_asked = True

    def _mark_asked(self) -> None:
        if self.chunk is None and not self.stats_asked:
            self.asked_at = time.monotonic()  # nothing was unanswered: the wait starts now

    def send_chunk(self, chunk: TrajectoryChunk) -> None:
        started = time.monotonic()
        warned_at = started
        while self.chunk is not None and not self.stop.is_set():
            self.poll(timeout_ms=50)
            if time.monotonic() - warned_at > self.warn_after_s and not self.link.peer.silent:
                warned_at = time.monotonic()
                log.warning("replay has not acknowledged a chunk for %.0f s", warned_at - started)
        self.wait_s += time.monotonic() - started
        if not self.stop.is_set():
            self._mark_asked()
            sockets.send(self.link.sock, chunk)
            self.chunk = chunk

    def report(self, report: ActorReport) -> None:
        """Send the report, then ask for the run's env steps as replay counts them after it."""
        sockets.send(self.link.sock, report)
        self._ask_stats()
        self.run_env_steps = None


def wait_for_newer_weights(params: ParamsClient, stop, than_version: int, timeout_s: float) -> None:
    """A synchronous actor (PPO) after its share of rollout ``than_version``: wait until the
    learner has trained on the rollout and published the next version."""
    started = last_log = time.monotonic()
    while not stop.is_set() and params.version == than_version:
        params.request()
        params.poll(timeout_ms=100)
        if time.monotonic() - last_log > timeout_s:
            last_log = time.monotonic()
            log.info(
                "waiting for weights newer than version %d (%.0f s)",
                than_version,
                last_log - started,
            )


def wait_for_weights(params: ParamsClient, stop, need_version: bool, timeout_s: float) -> None:
    """Wait for the parameter server's first answer, and load its weights when it has some. With
    ``need_version``, wait until the learner has published (evaluation, resumed runs)."""
    started = last_log = time.monotonic()
    while not stop.is_set():
        params.request()
        params.poll(timeout_ms=200)
        if params.version >= 0:
            return
        if params.server_version is not None and not need_version:
            return  # a fresh run whose learner has not published yet: act with our own network
        if time.monotonic() - last_log > timeout_s / 3:
            last_log = time.monotonic()
            log.info("waiting for the learner's weights (%.0f s)", last_log - started)
        if params.server_version is not None:
            time.sleep(0.2)  # it answered "none yet": ask again shortly


class EpisodeMetrics:
    """Finished episodes and throughput since the last report: sent to replay as an
    ``ActorReport`` and written to TensorBoard at the run's env steps that replay answers with."""

    def __init__(
        self,
        writer: MetricsWriter,
        num_envs: int,
        actor_id: int,
        incarnation: int,
        evaluate: bool,
        report_interval_s: float,
        callbacks: EpisodeCallbacks | None = None,
    ) -> None:
        self.writer, self.prefix = writer, "eval" if evaluate else "actor"
        self.callbacks = callbacks
        self.actor_id, self.incarnation, self.evaluate = actor_id, incarnation, evaluate
        self.report_interval_s = report_interval_s
        self.last_report = time.monotonic()
        self.wait_at_report = 0.0  # the replay client's wait_s at the last report
        self.episode_return = np.zeros(num_envs)
        self.episode_length = np.zeros(num_envs, dtype=np.int64)
        self.finished_returns: list[float] = []
        self.finished_lengths: list[int] = []
        self.env_steps = 0  # this actor's own, in this process
        self.steps_since_report = 0
        self.steps_meter = RateMeter()
        self.pending: dict[str, float] = {}  # scalars waiting for the run's env steps
        self.last_run_env_steps = 0

    def add_step(
        self, reward: np.ndarray, ended: np.ndarray, action: np.ndarray, step: VectorStep
    ) -> None:
        num_envs = len(reward)
        self.episode_return += reward
        self.episode_length += 1
        if self.callbacks is not None:
            self.callbacks.step(action, step, ended, self.episode_return, self.episode_length)
        if ended.any():
            self.finished_returns += self.episode_return[ended].tolist()
            self.finished_lengths += self.episode_length[ended].tolist()
            self.episode_return[ended], self.episode_length[ended] = 0.0, 0
        self.env_steps += num_envs
        self.steps_since_report += num_envs
        self.steps_meter.add(num_envs)

    def report_if_due(self, replay: ReplayClient, params: ParamsClient) -> None:
        """Every ``report_interval_s``: send the interval's report; its scalars are written once
        replay says at which run env steps (``write_pending``), or at the next report if it does
        not answer."""
        now = time.monotonic()
        interval = now - self.last_report
        if interval < self.report_interval_s:
            return
        self.write_pending(self.last_run_env_steps)
        custom = {}
        if self.callbacks is not None:
            custom = self.callbacks.metrics.means()
            self.callbacks.metrics.clear()
        replay.report(
            ActorReport(
                self.actor_id,
                self.incarnation,
                self.evaluate,
                self.steps_since_report,
                params.version,
                np.asarray(self.finished_returns, dtype=np.float64),
                np.asarray(self.finished_lengths, dtype=np.int64),
                custom,
            )
        )
        p = self.prefix
        extra = {
            f"{p}/weights_version_lag": params.version_lag,
            f"{p}/weights_version": params.version,
            f"{p}/rejected_weights": params.num_rejected,
            f"{p}/insert_wait_fraction": (replay.wait_s - self.wait_at_report) / interval,
            f"{p}/replay_silent_s": replay.link.peer.silent_s(),
        }
        self.last_report, self.wait_at_report = now, replay.wait_s
        if self.finished_returns:  # the mean over the interval: one write, not one per episode
            self.pending[f"{p}/episode_return"] = float(np.mean(self.finished_returns))
            self.pending[f"{p}/episode_length"] = float(np.mean(self.finished_lengths))
        self.pending[f"{p}/env_steps_per_s"] = self.steps_meter.rate()
        self.pending[f"{p}/env_steps"] = float(self.env_steps)
        self.pending.update(extra)
        self.pending.update({f"{p}/custom/{name}": value for name, value in custom.items()})
        self.finished_returns.clear()
        self.finished_lengths.clear()
        self.steps_since_report = 0

    def write_pending(self, run_env_steps: int | None) -> None:
        if self.pending and run_env_steps is not None:
            self.writer.scalars(self.pending, run_env_steps)
            self.pending = {}
            self.last_run_env_steps = run_env_steps


def make_chunk(
    cfg: Config,
    actor_id: int,
    incarnation: int,
    weights_version: int,
    env_steps: int,
    fields: dict[str, np.ndarray],
    priorities: np.ndarray | None,
) -> TrajectoryChunk | None:
    """The chunk of the items an actor core cut, or None when it cut none."""
    num_items = len(next(iter(fields.values()))) if fields else 0
    if num_items == 0:
        return None
    if priorities is None:  # a FIFO table ignores them; the wire carries some
        priorities = np.ones(num_items)
    return TrajectoryChunk(
        cfg.replay.table, actor_id, incarnation, weights_version, env_steps, priorities, fields
    )


def make_envs_and_network(cfg: Config, num_envs: int, device: str):
    """An acting role's ``num_envs`` envs, its algorithm and its network on ``device`` in eval
    mode; ``EnvError`` (envs closed) when the algorithm cannot act in the env's action space."""
    envs = make_vector_env(cfg.env, num_envs, cfg.unit_actions)
    try:
        check_action_space(cfg, envs.single_action_space)
    except EnvError:
        envs.close()
        raise
    algorithm = load_algorithm(cfg.algorithm)
    net = algorithm.make_network(envs.single_observation_space, envs.single_action_space, cfg)
    net.to(device).eval()
    return envs, algorithm, net


def main(cfg: Config, actor_id: int = 0) -> int:
    """Run one actor until SIGINT/SIGTERM or a server's ``Shutdown``; returns 0. The evaluation
    actor (``apexrl actor --eval``) is ``apexrl.evaluation.main``."""
    stop = lifecycle.install_stop_handlers()
    if not 0 <= actor_id < cfg.actor.num_actors:
        raise lifecycle.StartupError(
            f"actor id {actor_id} is outside 0..{cfg.actor.num_actors - 1}; "
            "set actor.num_actors to the number of actors in the run"
        )
    torch.set_num_threads(cfg.actor.torch_threads)
    device = lifecycle.resolve_device(cfg.actor.device)
    incarnation = lifecycle.new_incarnation()
    num_envs = cfg.env.num_envs
    seed = cfg.env.seed + 10_000 * actor_id
    callbacks = make_episode_callbacks(cfg.callbacks)  # before the envs: it may raise
    envs, algorithm, net = make_envs_and_network(cfg, num_envs, device)
    core = algorithm.actor_core(net, cfg, actor_id, False, device, np.random.default_rng(seed))
    block = StepBlock(core.block_steps, core.block_overlap)
    # A synchronous actor acts with one weights version per chunk and then waits for the next.
    synchronous = core.synchronous
    role = f"actor_{actor_id}"
    writer = MetricsWriter(cfg.run_dir / "tb" / role)
    ctx = sockets.make_context()
    key_role = "actor"  # its CURVE key and so what servers let it send
    params_link = Link(
        ctx,
        Peer("parameter server", cfg.net.params_addr),
        auth.client_keys(cfg.net, key_role, "params"),
    )
    replay_link = Link(
        ctx,
        Peer("replay server", cfg.net.replay_addr),
        auth.client_keys(cfg.net, key_role, "replay"),
    )
    resend_s = cfg.actor.resend_timeout_s
    params = ParamsClient(params_link, net, resend_s)
    replay = ReplayClient(replay_link, stop, resend_s, cfg.actor.peer_timeout_s)
    metrics = EpisodeMetrics(
        writer, num_envs, actor_id, incarnation, False, cfg.actor.report_interval_s, callbacks
    )
    log.info("%s: %d envs of %s, %s, device %s", role, num_envs, cfg.env.id, cfg.algorithm, device)
    steps_since_poll = steps_since_chunk = 0
    try:
        need_version = cfg.run.resume or synchronous
        wait_for_weights(params, stop, need_version, cfg.actor.peer_timeout_s)
        if params.version >= 0:
            log.info("%s: playing weights version %d", role, params.version)
        obs, _ = envs.reset(seed=seed)
        if callbacks is not None:
            callbacks.reset(obs)
        version = np.full(num_envs, params.version, dtype=np.int64)  # weights_version per env
        while not stop.is_set():
            action, extras = core.act(obs)
            step = step_vector(envs, action)
            core.observe(action, step)
            steps_since_chunk += num_envs
            # The sockets are read and the report is checked once per block: replies wait in
            # the socket meanwhile, and a step stays cheap.
            block_end = False
            if version[0] != params.version:
                version = np.full(num_envs, params.version, dtype=np.int64)
            block.add(obs, action, step, {**extras, "weights_version": version})
            if block.full:
                block_end = True
                fields, priorities = core.items(block)
                block.keep_overlap()
                chunk = make_chunk(
                    cfg, actor_id, incarnation, params.version, steps_since_chunk,
                    fields, priorities,
                )  # fmt: skip
                if chunk is not None:  # None: no item yet, its steps go with the next one
                    replay.send_chunk(chunk)
                    steps_since_chunk = 0
                    if synchronous:
                        timeout_s = cfg.actor.peer_timeout_s
                        wait_for_newer_weights(params, stop, chunk.weights_version, timeout_s)
            metrics.add_step(step.reward, step.terminated | step.truncated, action, step)
            obs = step.obs
            steps_since_poll += num_envs
            if steps_since_poll >= cfg.actor.params_poll_steps and not synchronous:
                steps_since_poll = 0
                params.request()
            if block_end:
                replay.poll()
                metrics.write_pending(replay.run_env_steps)
                if not synchronous:
                    params.poll()
                metrics.report_if_due(replay, params)
    except PeerShutdown as exc:
        log.info("%s: stopping, the servers are shutting down (%s)", role, exc)
    finally:
        metrics.write_pending(metrics.last_run_env_steps)
        envs.close()
        writer.close()
        params_link.close()
        replay_link.close()
        ctx.term()
    log.info("%s stopped after %d env steps", role, metrics.env_steps)
    return 0

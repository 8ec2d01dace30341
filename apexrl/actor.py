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

Here: ``main`` and the steps of its loop. Its parts: the clients ``apexrl.clients.replay``
(``ReplayClient``) and ``apexrl.clients.params`` (``ParamsClient``, the waits for weights); the
envs and network ``apexrl.acting.startup``; the env stepping ``apexrl.acting.stepping`` (all envs,
then one forward pass; or, with ``actor.overlap``, half of the envs stepping in ale-py's threads
while the network infers for the other half); the episode bookkeeping and reports
``apexrl.acting.episodes``, the chunks ``apexrl.acting.chunks``, the step block
``apexrl.acting.step_block``.
"""

from __future__ import annotations

import logging
from functools import partial

import numpy as np
import torch
import zmq

from apexrl.acting.chunks import ChunkNumbers, cut_chunk
from apexrl.acting.env_tasks import EnvTasks
from apexrl.acting.episodes import EpisodeMetrics
from apexrl.acting.startup import check_actor_id, make_envs_and_network
from apexrl.acting.step_block import StepBlock
from apexrl.acting.stepping import make_stepper
from apexrl.callbacks import make_episode_callbacks
from apexrl.clients.params import (
    ParamsClient,
    params_link,
    wait_for_newer_weights,
    wait_for_weights,
)
from apexrl.clients.peers import PeerShutdown
from apexrl.clients.replay import ReplayClient, replay_link
from apexrl.config import Config
from apexrl.offline.training_episodes import make_training_episodes
from apexrl.runtime import lifecycle, rundir
from apexrl.runtime.metrics import MetricsWriter
from apexrl.transport import auth, sockets
from apexrl.transport.messages import TrajectoryChunk

log = logging.getLogger(__name__)


def connect(
    ctx: zmq.Context, cfg: Config, net: torch.nn.Module, stop, actor_id: int
) -> tuple[ParamsClient, ReplayClient]:
    """The clients of actor ``actor_id`` of the parameter server (loading weights into ``net``)
    and of replay, under its CURVE key (its own, else the actors' shared one): what servers let
    it send, and as which actor."""
    key_role = auth.actor_identity(actor_id)
    resend_s = cfg.actor.resend_timeout_s
    params = ParamsClient(params_link(ctx, cfg.net, key_role), net, resend_s)
    replay = ReplayClient(
        replay_link(ctx, cfg.net, key_role), stop, resend_s, cfg.actor.peer_timeout_s
    )
    return params, replay


def send_chunk(
    cfg: Config,
    chunk: TrajectoryChunk,
    replay: ReplayClient,
    params: ParamsClient,
    stop,
    synchronous: bool,
) -> None:
    """Send ``chunk`` once replay acknowledged the previous one; a synchronous actor then waits
    for the weights the learner trains on the rollout."""
    replay.send_chunk(chunk)
    if synchronous:
        timeout_s = cfg.actor.peer_timeout_s
        wait_for_newer_weights(params, stop, chunk.weights_version, timeout_s)


def poll_params(cfg: Config, params: ParamsClient, steps_since_poll: int) -> int:
    """An asynchronous actor's look at the parameter server after each step: it answers a held
    request when it publishes, so new weights are loaded the step they arrive (a socket check
    when none has); a new request goes every ``actor.params_poll_steps`` env steps. Returns the
    env steps since the last request."""
    params.poll()
    if steps_since_poll >= cfg.actor.params_poll_steps:
        steps_since_poll = 0
        params.request()
    return steps_since_poll


def exchange(
    replay: ReplayClient,
    params: ParamsClient,
    metrics: EpisodeMetrics,
    synchronous: bool,
    tasks: EnvTasks,
) -> None:
    """At a block's end: read the servers' replies, write the scalars replay gave a step for,
    report if due, and give the envs the env task the weights brought."""
    replay.poll()
    metrics.write_pending(replay.run_env_steps)
    if not synchronous:
        params.poll()
    metrics.report_if_due(replay, params)
    tasks.apply(params.env_task)  # a new env task came with the weights


def main(cfg: Config, actor_id: int = 0) -> int:
    """Run one actor until SIGINT/SIGTERM or a server's ``Shutdown``; returns 0. The evaluation
    actor (``apexrl actor --eval``) is ``apexrl.evaluation.main``."""
    stop = lifecycle.install_stop_handlers()
    check_actor_id(cfg, actor_id)
    torch.set_num_threads(cfg.actor.torch_threads)
    device = lifecycle.resolve_device(cfg.actor.device)
    incarnation = lifecycle.new_incarnation()
    num_envs = cfg.env.num_envs
    seed = cfg.env.seed + 10_000 * actor_id
    callbacks = make_episode_callbacks(cfg.callbacks)  # before the envs: it may raise
    envs, algorithm, net = make_envs_and_network(cfg, num_envs, device, cfg.actor.precision)
    new_core = partial(algorithm.actor_core, net, cfg, actor_id, False, device)  # rng -> core
    core = new_core(np.random.default_rng(seed))  # it also cuts the block's items
    stepper = make_stepper(cfg, envs, core, new_core, seed)  # plain or overlapped (actor.overlap)
    block = StepBlock(core.block_steps, core.block_overlap)
    # (weights version, env steps) -> the full block's chunk, numbered 0, 1, 2, ... per incarnation
    cut = partial(cut_chunk, cfg, core, block, actor_id, incarnation, ChunkNumbers())
    # A synchronous actor acts with one weights version per chunk and then waits for the next.
    synchronous = core.synchronous
    role = f"actor_{actor_id}"
    writer = MetricsWriter(rundir.tensorboard_dir(cfg.run_dir, role))
    ctx = sockets.make_context()
    params, replay = connect(ctx, cfg, net, stop, actor_id)
    metrics = EpisodeMetrics(
        writer, num_envs, actor_id, incarnation, False, cfg.actor.report_interval_s, callbacks
    )
    tasks = EnvTasks(envs, role)
    recorded = make_training_episodes(cfg, actor_id, num_envs)  # run.output_dataset, or None
    log.info("%s: %d envs of %s, %s, device %s", role, num_envs, cfg.env.id, cfg.algorithm, device)
    steps_since_poll = steps_since_chunk = 0
    try:
        need_version = cfg.run.resume or synchronous
        wait_for_weights(params, stop, need_version, cfg.actor.peer_timeout_s)
        if params.version >= 0:
            log.info("%s: playing weights version %d", role, params.version)
        obs = stepper.reset(seed)
        if callbacks is not None:
            callbacks.reset(obs)
        while not stop.is_set():
            acted = stepper.step(params.version)  # act, step the envs, the core observes
            steps_since_chunk += num_envs
            # Replay's socket is read and the report is checked once per block: its replies
            # wait in the socket meanwhile, and a step stays cheap.
            block.add(acted.obs, acted.action, acted.trained, acted.extras)
            block_end = block.full
            if block_end:
                chunk = cut(params.version, steps_since_chunk)
                if chunk is not None:  # None: no item yet, its steps go with the next one
                    send_chunk(cfg, chunk, replay, params, stop, synchronous)
                    steps_since_chunk = 0
            step = acted.step
            metrics.add_step(step.reward, step.terminated | step.truncated, acted.action, step)
            if recorded is not None:
                recorded.add(acted.obs, acted.action, step)
            steps_since_poll += num_envs
            if not synchronous:
                steps_since_poll = poll_params(cfg, params, steps_since_poll)
            if block_end:
                exchange(replay, params, metrics, synchronous, tasks)
    except PeerShutdown as exc:
        log.info("%s: stopping, the servers are shutting down (%s)", role, exc)
    finally:
        metrics.write_pending(metrics.last_run_env_steps)
        if recorded is not None:
            recorded.close()
        stepper.close()
        writer.close()
        params.link.close()
        replay.link.close()
        ctx.term()
    log.info("%s stopped after %d env steps", role, metrics.env_steps)
    return 0

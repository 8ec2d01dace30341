"""Evaluation: the run's success is judged on rounds of greedy episodes, each round played by one
frozen weights version.

The evaluation actor (``apexrl actor --eval``) takes the newest weights, plays exactly
``run.stop_eval_episodes`` episodes with them on ``actor.eval_num_envs`` envs at once (each env
plays its share of the round's episodes from a fresh reset; episodes an env plays past its share
are not counted, so short episodes are not over-represented), sends the round to replay as one
``ActorReport`` carrying that version, and only then asks for newer weights. The replay server's
evaluation window holds the last ``run.stop_eval_episodes`` episodes, so after a round it is that
round alone, one version (``eval/version``; -1 while the window mixes versions). The learner asks
replay for its ``Stats`` several times a second and checks the stop condition on every new round,
so a round's verdict reaches it within a fraction of a second.

The evaluation actor runs at niceness ``Config.eval_niceness``: where no evaluation return stops
the run it uses the CPU the training roles leave idle and yields to them otherwise; where one
does, it decides when the run ends and runs as they do. It starts a round at most every
``actor.eval_interval_s`` seconds (0: as soon as newer weights are there). Every round's scalars
go to TensorBoard; its log has a round's line at most every ``actor.report_interval_s``.

The learner's side of it (which weights were judged) is ``apexrl.learning.judged``.

A round's quotas and its play are ``apexrl.acting.rounds`` (also used by ``apexrl evaluate``
and ``Policy``); the videos of ``actor.eval_video_interval_s``, ``apexrl.acting.eval_videos``.
Here: a round's report (``report_round``) and ``main``; a round's log lines and scalars are
``apexrl.acting.round_reports``'s.
The clients it reaches the servers with are ``apexrl.clients.replay`` and
``apexrl.clients.params``; its envs and network are made as the actor's are
(``apexrl.acting.startup``).
"""

from __future__ import annotations

import contextlib
import logging

import numpy as np

from apexrl.acting.eval_videos import EvalVideos
from apexrl.acting.round_reports import RoundLines, RoundScalars, round_scalars, start_evaluation
from apexrl.acting.rounds import Round, play_round, rest_after_round
from apexrl.acting.startup import make_envs_and_network
from apexrl.clients.params import (
    ParamsClient,
    params_link,
    wait_for_newer_weights,
    wait_for_weights,
)
from apexrl.clients.peers import PeerShutdown
from apexrl.clients.replay import ReplayClient, replay_link
from apexrl.config import Config
from apexrl.runtime import rundir
from apexrl.runtime.metrics import MetricsWriter
from apexrl.transport import sockets
from apexrl.transport.messages import ActorReport

log = logging.getLogger("apexrl.actor")


def report_round(replay: ReplayClient, incarnation: int, version: int, result: Round) -> None:
    """Send the round to replay as one ``ActorReport`` of weights ``version``."""
    replay.report(
        ActorReport(0, incarnation, True, result.env_steps, version, result.returns, result.lengths)
    )


def main(cfg: Config) -> int:
    """Run the evaluation actor until SIGINT/SIGTERM or a server's ``Shutdown``; returns 0."""
    stop, device, incarnation, quotas, seed = start_evaluation(cfg)
    num_episodes = cfg.run.stop_eval_episodes
    envs, algorithm, net = make_envs_and_network(cfg, len(quotas), device)
    videos = EvalVideos(cfg, algorithm, net, device)
    rng = np.random.default_rng(seed)
    writer = MetricsWriter(rundir.tensorboard_dir(cfg.run_dir, "eval"))
    ctx = sockets.make_context()
    timeout_s, resend_s = cfg.actor.peer_timeout_s, cfg.actor.resend_timeout_s
    params = ParamsClient(params_link(ctx, cfg.net, "eval"), net, resend_s)
    replay = ReplayClient(replay_link(ctx, cfg.net, "eval"), stop, resend_s, timeout_s)
    scalars = RoundScalars(writer, replay)
    lines = RoundLines(cfg.actor.report_interval_s)
    log.info(
        "eval: %d envs of %s, rounds of %d episodes, %s, device %s, nice %d",
        len(quotas),
        cfg.env.id,
        num_episodes,
        cfg.algorithm,
        device,
        cfg.eval_niceness,
    )

    def keep_going() -> bool:
        replay.poll()  # a Shutdown raises PeerShutdown
        scalars.write_pending()
        return not stop.is_set()

    judged, num_rounds, total_steps = -1, 0, 0
    try:
        wait_for_weights(params, stop, True, timeout_s)
        if params.version >= 0:
            log.info("eval: playing weights version %d", params.version)
        while not stop.is_set():
            if params.version == judged:
                wait_for_newer_weights(params, stop, judged, timeout_s)
                continue
            version = params.version
            core = algorithm.actor_core(net, cfg, 0, True, device, rng)  # fresh state per round
            result = play_round(envs, core, quotas, seed + num_rounds, keep_going)
            if result is None:
                break
            num_rounds += 1
            total_steps += result.env_steps
            report_round(replay, incarnation, version, result)
            lines.add(version, result)
            judged = version
            scalars.add(round_scalars(result, version, total_steps))
            if not videos.after_round(version, keep_going):
                break
            if not rest_after_round(cfg.actor.eval_interval_s, result.seconds, keep_going):
                break
            replay.poll(timeout_ms=10)
            scalars.write_pending()
            params.request()
    except PeerShutdown as exc:
        log.info("eval: stopping, the servers are shutting down (%s)", exc)
    finally:
        with contextlib.suppress(PeerShutdown):
            replay.poll(timeout_ms=100 if scalars.pending else 0)
        scalars.write_pending()
        envs.close()
        writer.close()
        params.link.close()
        replay.link.close()
        ctx.term()
    log.info("eval stopped after %d rounds, %d env steps", num_rounds, total_steps)
    return 0

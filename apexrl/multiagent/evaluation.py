"""The evaluation actor of a multi-agent run: rounds of greedy episodes, each played by one frozen
weights version of every network policy.

As the single-agent evaluation actor (``apexrl.evaluation``) does, it plays exactly
``run.stop_eval_episodes`` episodes a round on ``actor.eval_num_envs`` envs, each env its quota
from a fresh reset (episodes past an env's quota are not counted), reports the round to replay
in one ``ActorReport`` (the judged returns, every group's returns, the agent steps) under the lead
policy's weights version, and only then takes newer weights: every policy's client reads the
reply that came during the round and asks again, and where the lead policy has none newer the
actor waits for its next version and takes every other policy's newest (TensorBoard's
``eval/weights_version/<policy>``: the version of each that played the round). Network policies
play greedily (their cores' evaluation mode: the mode of a policy, ``actor.eval_epsilon`` for
Q-learners), fixed ones as they always do; actions outside the agents' legal-action masks are
counted (``eval/illegal_actions``). With ``league.eval_opponents`` each round is instead the
league's main policy against each named fixed player in both seats (``league.evaluation``).
Rounds start at most every ``actor.eval_interval_s`` seconds, as in ``apexrl.evaluation``.
"""

from __future__ import annotations

import contextlib
import logging

import numpy as np

from apexrl.acting.round_reports import RoundLines, RoundScalars, round_scalars, start_evaluation
from apexrl.acting.rounds import rest_after_round
from apexrl.clients.params import wait_for_newer_weights, wait_for_weights
from apexrl.clients.peers import PeerShutdown
from apexrl.clients.replay import ReplayClient, replay_link
from apexrl.config import Config
from apexrl.league.config import main_policy
from apexrl.league.evaluation import OpponentRounds
from apexrl.multiagent.players import NetworkPlayer, Player, close_players, make_players
from apexrl.multiagent.rounds import MultiAgentRound, play_multiagent_round
from apexrl.multiagent.stepping import AgentEnvs
from apexrl.runtime import rundir
from apexrl.runtime.metrics import MetricsWriter
from apexrl.transport import sockets
from apexrl.transport.messages import ActorReport

log = logging.getLogger("apexrl.actor")


def main(cfg: Config) -> int:
    """Run the multi-agent evaluation actor until SIGINT/SIGTERM or a server's ``Shutdown``."""
    stop, device, incarnation, quotas, seed = start_evaluation(cfg)
    num_episodes = cfg.run.stop_eval_episodes
    ctx = sockets.make_context()
    rng = np.random.default_rng(seed)
    players = make_players(cfg, ctx, 0, True, device, "eval", rng, len(quotas))
    networks = [p for p in players.values() if isinstance(p, NetworkPlayer)]
    lead = next(p for p in networks if p.name in cfg.multiagent.trained)
    if cfg.league.eval_opponents:
        lead = players[main_policy(cfg.league, cfg.multiagent.trained)]
    timeout_s, resend_s = cfg.actor.peer_timeout_s, cfg.actor.resend_timeout_s
    replay = ReplayClient(replay_link(ctx, cfg.net, "eval"), stop, resend_s, timeout_s)
    writer = MetricsWriter(rundir.tensorboard_dir(cfg.run_dir, "eval"))
    scalars = RoundScalars(writer, replay)
    lines = RoundLines(cfg.actor.report_interval_s)
    envs = None

    def keep_going() -> bool:
        replay.poll()  # a Shutdown raises PeerShutdown
        scalars.write_pending()
        return not stop.is_set()

    judged, num_rounds, total_steps = -1, 0, 0
    try:
        if cfg.league.eval_opponents:  # the main policy against fixed players
            envs = OpponentRounds(cfg, players, len(quotas), rng)
        else:
            envs = AgentEnvs(cfg, len(quotas), players)
        log.info(
            "eval: %d envs of %s, rounds of %d episodes, policies %s, nice %d",
            len(quotas),
            cfg.env.id,
            num_episodes,
            ", ".join(players),
            cfg.eval_niceness,
        )
        for player in networks:
            wait_for_weights(player.params, stop, True, timeout_s)
        while not stop.is_set():
            if lead.version == judged:
                wait_for_newer_weights(lead.params, stop, judged, timeout_s)
                take_newest(players)
                continue
            version = lead.version
            versions = {player.name: player.version for player in networks}
            result = play_round(cfg, envs, quotas, seed + num_rounds, keep_going)
            if result is None:
                break
            num_rounds += 1
            total_steps += result.env_steps
            replay.report(round_report(incarnation, version, result))
            if len(result.returns):
                lines.add(version, result)
            judged = version
            scalars.add(multiagent_round_scalars(result, versions, lead.name, total_steps))
            if not rest_after_round(cfg.actor.eval_interval_s, result.seconds, keep_going):
                break
            replay.poll(timeout_ms=10)
            scalars.write_pending()
            for player in networks:  # each reads the reply it got, if any, and asks again
                player.params.request()
    except PeerShutdown as exc:
        log.info("eval: stopping, the servers are shutting down (%s)", exc)
    finally:
        with contextlib.suppress(PeerShutdown):
            replay.poll(timeout_ms=100 if scalars.pending else 0)
        scalars.write_pending()
        if envs is not None:
            envs.close()
        writer.close()
        replay.link.close()
        close_players(players)
        ctx.term()
    log.info("eval stopped after %d rounds, %d env steps", num_rounds, total_steps)
    return 0


def play_round(
    cfg: Config, envs: AgentEnvs | OpponentRounds, quotas: np.ndarray, seed: int, keep_going
) -> MultiAgentRound | None:
    """A round of the run's own games, or of the league's against fixed players."""
    if isinstance(envs, OpponentRounds):
        return envs.play(seed, keep_going)
    return play_multiagent_round(cfg, envs, quotas, seed, keep_going)


def round_report(incarnation: int, version: int, result: MultiAgentRound) -> ActorReport:
    """A round as one evaluation ``ActorReport`` of the lead policy's ``version``."""
    return ActorReport(
        0,
        incarnation,
        True,
        result.env_steps,
        version,
        result.returns,
        result.lengths,
        {},
        result.groups,
        result.agent_steps,
    )


def multiagent_round_scalars(
    result: MultiAgentRound, versions: dict[str, int], lead: str, total_steps: int
) -> dict[str, float]:
    """A round's TensorBoard scalars: the judged returns' (none when no episode had one), each
    group's mean, the illegal actions and each network policy's weights version (``versions``;
    the lead policy's is the round's)."""
    version = versions[lead]
    values = {"eval/weights_version": float(version)}
    if len(result.returns):
        values = round_scalars(result, version, total_steps)
    for name, policy_version in versions.items():
        values[f"eval/weights_version/{name}"] = float(policy_version)
    values["eval/illegal_actions"] = float(result.illegal_actions)
    for name, returns in result.groups.items():
        values[f"eval/return/{name}"] = float(returns.mean())
    return values


def take_newest(players: dict[str, Player]) -> None:
    """Load every network policy's newest weights where the server has newer ones."""
    for player in players.values():
        if isinstance(player, NetworkPlayer):
            player.params.request()
            player.params.poll(timeout_ms=100)

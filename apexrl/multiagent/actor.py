"""Multi-agent actor: steps a vector of PettingZoo envs, every agent played by its policy, and
pushes each trained policy's steps to its own replay table.

Connects:  DEALER cfg.net.params_addr, one per network policy   out: ParamsRequest (its policy)
                                                                in: Params, ParamsNotModified
           DEALER cfg.net.replay_addr    out: TrajectoryChunk (table: the policy), ActorReport,
                                              StatsRequest
                                         in: InsertAck, Stats, Error, Shutdown

With ``league.matchmaking`` one more DEALER to the parameter server carries the league's matches
(``MatchRequest`` / ``Matches``; ``apexrl.league.seating``): each episode's seats come from its
match, a snapshot's seat played by a frozen player of that version, and each outcome goes back.

``apexrl actor`` runs this loop when the config has ``multiagent.policies``. Each step of it is a
vector step of all envs (``stepping.AgentEnvs``): one forward pass per policy over every agent of
every env it plays, then each env's step; each trained policy's lanes collect its agents' steps
(``lanes``), and whenever lanes are full the policy's actor core cuts them into replay items, sent
as one chunk of that policy's table. A chunk claims the agent steps its items account for and
brings the env steps the actor took since its previous chunk of any policy (at most what replay
lets one chunk bring; the rest goes with the next), so the run's env steps count each env step
once however many agents acted in it.

As a single-agent actor does, it keeps one chunk in flight, polls the parameter server for each
policy's newer weights every ``actor.params_poll_steps`` env steps, and reports its episodes
every ``actor.report_interval_s`` (``returns.MultiAgentMetrics``: the judged returns, every
group's and the agent steps). Where every trained policy is synchronous (PPO) the actor waits,
once each has its share of a weights version cut (one unroll per lane), for their next versions.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from apexrl.acting.chunks import ChunkNumbers, make_chunk
from apexrl.acting.startup import check_actor_id
from apexrl.clients.params import wait_for_newer_weights, wait_for_weights
from apexrl.clients.peers import PeerShutdown
from apexrl.clients.replay import ReplayClient, replay_link
from apexrl.config import Config
from apexrl.league.config import main_policy
from apexrl.league.seating import LeagueSeating
from apexrl.multiagent.lanes import CutItems
from apexrl.multiagent.players import (
    NetworkPlayer,
    close_players,
    make_network_player,
    make_players,
)
from apexrl.multiagent.policies import agents_per_env, policy_spaces
from apexrl.multiagent.returns import MultiAgentMetrics
from apexrl.multiagent.stepping import AgentEnvs
from apexrl.runtime import lifecycle, rundir
from apexrl.runtime.metrics import MetricsWriter
from apexrl.transport import auth, sockets

log = logging.getLogger("apexrl.actor")


class ChunkSender:
    """Cuts each trained policy's full lanes into chunks and sends them, numbered per actor
    process, each bringing the env steps taken since the previous one (``env_steps``).

    Where agents come and go, a policy's lanes fill out of step, and each step may cut a lane or
    two: an asynchronous policy's cuts are gathered into one chunk until it holds half of what a
    chunk may (``chunk_items``) or ``MAX_HELD_S`` passed, so that a chunk (one round trip to replay)
    carries about as many items as a single-agent actor's. A synchronous policy (PPO) sends each
    cut at once: the learner waits for its rollout."""

    def __init__(
        self, cfg: Config, actor_id: int, incarnation: int, trained: list[NetworkPlayer]
    ) -> None:
        self.actor_id, self.incarnation = actor_id, incarnation
        self.trained = trained
        self.numbers = ChunkNumbers()
        self.env_steps = 0  # taken since the last chunk, not yet brought
        agents = agents_per_env(policy_spaces(cfg))
        self.bring_at_most = {
            player.name: agents
            * player.cfg.algo.max_env_steps_per_chunk(
                player.cfg.actor.chunk_steps, player.cfg.env.num_envs
            )
            for player in trained
        }
        self.held: dict[str, list[CutItems]] = {player.name: [] for player in trained}
        self.held_since: dict[str, float] = {}

    def send_cut(self, replay: ReplayClient) -> None:
        """Cut every trained policy's full lanes; send what is due."""
        now = time.monotonic()
        for player in self.trained:
            cut = player.lanes.cut()
            held = self.held[player.name]
            if cut is not None:
                if held and not self._fits(player, [*held, cut]):
                    self._send(player, replay)
                held.append(cut)
                self.held_since.setdefault(player.name, now)
            if held and (
                player.core.synchronous
                or num_items(held) >= player.cfg.chunk_items // 2
                or now - self.held_since[player.name] >= MAX_HELD_S
            ):
                self._send(player, replay)

    def _fits(self, player: NetworkPlayer, cuts: list[CutItems]) -> bool:
        """Whether ``cuts`` fit one chunk: its items and the steps they account for within what
        replay takes of one (``admission.chunk_bounds``)."""
        cfg = player.cfg
        if num_items(cuts) > cfg.chunk_items:
            return False
        steps = sum(cfg.algo.steps_in_items(cut.fields) for cut in cuts)
        return steps <= cfg.algo.max_env_steps_per_chunk(cfg.actor.chunk_steps, cfg.env.num_envs)

    def _send(self, player: NetworkPlayer, replay: ReplayClient) -> None:
        """One chunk of the player's held cuts."""
        held = self.held[player.name]
        fields, priorities, version = merged(held)
        held.clear()
        self.held_since.pop(player.name, None)
        brought = min(self.env_steps, self.bring_at_most[player.name])
        chunk = make_chunk(
            player.cfg,
            self.actor_id,
            self.incarnation,
            self.numbers.take(),
            version,
            brought,
            fields,
            priorities,
            agent_steps=player.cfg.algo.steps_in_items(fields),
        )
        if chunk is not None:
            replay.send_chunk(chunk)
            self.env_steps -= brought


MAX_HELD_S = 0.25  # the longest an asynchronous policy's cut waits for others to share a chunk


def num_items(cuts: list[CutItems]) -> int:
    return sum(len(next(iter(cut.fields.values()))) for cut in cuts)


def merged(cuts: list[CutItems]) -> tuple[dict[str, np.ndarray], np.ndarray | None, int]:
    """The items of several cuts as one chunk's: fields and priorities concatenated, the newest
    weights version."""
    if len(cuts) == 1:
        return cuts[0].fields, cuts[0].priorities, cuts[0].weights_version
    fields = {name: np.concatenate([cut.fields[name] for cut in cuts]) for name in cuts[0].fields}
    priorities = None
    if cuts[0].priorities is not None:
        priorities = np.concatenate([cut.priorities for cut in cuts])
    return fields, priorities, max(cut.weights_version for cut in cuts)


def wait_if_synchronous(cfg: Config, trained: list[NetworkPlayer], stop) -> None:
    """Where every trained policy is synchronous (PPO) and each has cut its share of its
    version, wait for each one's next version."""
    if not trained or not all(player.core.synchronous for player in trained):
        return
    if all(player.lanes.share_full(player.version) for player in trained):
        for player in trained:
            wait_for_newer_weights(player.params, stop, player.version, cfg.actor.peer_timeout_s)


def poll_params(cfg: Config, players: list[NetworkPlayer], steps_since_poll: int) -> int:
    """An asynchronous policy's look at the parameter server after each step, and a new request
    every ``actor.params_poll_steps`` env steps; returns the env steps since the last request."""
    due = steps_since_poll >= cfg.actor.params_poll_steps
    for player in players:
        player.params.poll()
        if due:
            player.params.request()
    return 0 if due else steps_since_poll


def league_seating(cfg, ctx, actor_id: int, players: dict, device: str, rng) -> LeagueSeating:
    """The actor's seats in its league's matches, whose snapshot players it makes here: frozen
    copies of the main policy, acting as it does in training, without lanes."""
    main = main_policy(cfg.league, cfg.multiagent.trained)
    spaces = policy_spaces(cfg)[main]

    def snapshot_player(version: int) -> NetworkPlayer:
        return make_network_player(
            cfg,
            main,
            spaces,
            ctx,
            actor_id,
            False,
            device,
            auth.actor_identity(actor_id),
            rng,
            cfg.env.num_envs,
            lanes=False,
            snapshot=version,
        )

    return LeagueSeating(cfg, ctx, actor_id, players, spaces.agents, snapshot_player)


def main(cfg: Config, actor_id: int = 0) -> int:
    """Run one multi-agent actor until SIGINT/SIGTERM or a server's ``Shutdown``; returns 0."""
    stop = lifecycle.install_stop_handlers()
    check_actor_id(cfg, actor_id)
    torch.set_num_threads(cfg.actor.torch_threads)
    device = lifecycle.resolve_device(cfg.actor.device)
    incarnation = lifecycle.new_incarnation()
    seed = cfg.env.seed + 10_000 * actor_id
    role = f"actor_{actor_id}"
    ctx = sockets.make_context()
    rng = np.random.default_rng(seed)
    identity = auth.actor_identity(actor_id)  # its own CURVE key where it has one
    players = make_players(cfg, ctx, actor_id, False, device, identity, rng, cfg.env.num_envs)
    networks = [p for p in players.values() if isinstance(p, NetworkPlayer)]
    trained = [p for p in networks if p.lanes is not None]
    asynchronous = [p for p in networks if not p.core.synchronous]
    envs = replay = writer = metrics = seating = None
    try:
        if cfg.league.matchmaking:
            seating = league_seating(cfg, ctx, actor_id, players, device, rng)
        envs = AgentEnvs(cfg, cfg.env.num_envs, players, seating)
        replay = ReplayClient(
            replay_link(ctx, cfg.net, identity),
            stop,
            cfg.actor.resend_timeout_s,
            cfg.actor.peer_timeout_s,
        )
        writer = MetricsWriter(rundir.tensorboard_dir(cfg.run_dir, role))
        metrics = MultiAgentMetrics(
            writer, cfg.multiagent, actor_id, incarnation, cfg.actor.report_interval_s
        )
        if seating is not None:
            metrics.extra_scalars = seating.stats
        sender = ChunkSender(cfg, actor_id, incarnation, trained)
        log.info(
            "%s: %d envs of %s, policies %s, device %s",
            role,
            cfg.env.num_envs,
            cfg.env.id,
            ", ".join(players),
            device,
        )
        for player in networks:
            need_version = cfg.run.resume or player.core.synchronous
            wait_for_weights(player.params, stop, need_version, cfg.actor.peer_timeout_s)
        envs.reset(seed)
        lead = trained[0] if trained else networks[0]
        steps_since_poll = 0
        while not stop.is_set():
            tick = envs.step()
            metrics.add(tick)
            sender.env_steps += tick.env_steps
            sender.send_cut(replay)
            wait_if_synchronous(cfg, trained, stop)
            steps_since_poll = poll_params(cfg, asynchronous, steps_since_poll + tick.env_steps)
            if seating is not None:
                seating.poll()
            replay.poll()
            metrics.write_pending(replay.run_env_steps)
            metrics.report_if_due(replay, lead.version)
    except PeerShutdown as exc:
        log.info("%s: stopping, the servers are shutting down (%s)", role, exc)
    finally:
        if envs is not None:
            envs.close()
        if metrics is not None:
            metrics.write_pending(metrics.last_run_env_steps)
        if writer is not None:
            writer.close()
        if replay is not None:
            replay.link.close()
        if seating is not None:
            seating.close()
        close_players(players)
        ctx.term()
    log.info("%s stopped after %d env steps", role, metrics.env_steps if metrics else 0)
    return 0

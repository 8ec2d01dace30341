"""A training actor's side of a league's matches: who sits in each seat of each episode, and the
outcome back to the parameter server.

Connects:  DEALER cfg.net.params_addr   out: MatchRequest (finished matches, how many it wants)
                                        in:  Matches, Error, Shutdown

``LeagueSeating`` keeps a queue of matches drawn by the parameter server (``league.League``)
two matches per env ahead, asked for again (with the outcomes of the matches played since)
whenever it runs low, one request in flight, sent again on a fresh socket when unanswered for
``actor.resend_timeout_s``. When an env starts an episode it takes the first match whose players
are loaded: the seat of the latest version is played by the main policy's own player (its lanes
train on it), a snapshot's seat by a frozen player of that pinned version (a ``NetworkPlayer``
key ``main@<version>``, loaded once from the parameter server; past ``league.pool_size`` of them,
those no match needs are dropped).
Without a match ready (the server slow or away) the episode is seated as the mapping says and
counts for no one. When the episode ends, its match goes back with the version that played each
seat and each seat's return.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

import numpy as np
import zmq

from apexrl.clients.params import params_link
from apexrl.clients.peers import PeerShutdown
from apexrl.config import Config, ConfigError
from apexrl.league.config import main_policy
from apexrl.league.league import LATEST, SEATS, player_name
from apexrl.transport import auth, sockets
from apexrl.transport.codec import DecodeError
from apexrl.transport.messages import MAX_MATCHES, Error, Matches, MatchRequest, Shutdown

log = logging.getLogger(__name__)

LOAD_TIMEOUT_S = 30.0  # a match whose snapshot does not load by then is dropped


class Match:
    def __init__(self, ticket: int, versions: tuple[int, ...], since: float) -> None:
        self.ticket, self.versions, self.since = ticket, versions, since


class LeagueSeating:
    """An actor's seats in its league's matches (module docstring). ``players`` is the actor's
    dict of players, to which snapshot players are added and from which they are removed;
    ``make_snapshot_player(version)`` makes one (its client asks for that version)."""

    def __init__(
        self,
        cfg: Config,
        ctx: zmq.Context,
        actor_id: int,
        players: dict,
        agents: list[str],
        make_snapshot_player: Callable[[int], object],
    ) -> None:
        if len(agents) != SEATS:
            raise ConfigError(
                f"league.matchmaking seats two-player games; {cfg.env.id} has {len(agents)} agents"
            )
        self.main = main_policy(cfg.league, cfg.multiagent.trained)
        for agent in agents:
            if (
                cfg.multiagent.table_policies(agent) != {self.main}
                and not cfg.multiagent.mapping_fn
            ):
                raise ConfigError(
                    f"league.matchmaking seats {self.main} in both seats: map {agent} to it"
                )
        self.cfg, self.actor_id, self.players, self.agents = cfg, actor_id, players, agents
        self.make_snapshot_player = make_snapshot_player
        self.link = params_link(ctx, cfg.net, auth.actor_identity(actor_id))
        self.timeout_s = cfg.actor.resend_timeout_s
        self.want = min(2 * cfg.env.num_envs, MAX_MATCHES)
        self.queue: deque[Match] = deque()
        self.playing: dict[int, Match] = {}  # env -> its episode's match
        self.finished: list[tuple[int, list[int], list[float]]] = []
        self.in_flight: tuple[MatchRequest, float] | None = None
        self.snapshots: dict[int, str] = {}  # version -> the key of its player in ``players``
        self.asked: dict[int, float] = {}  # version -> when its player last asked for it
        self.matches_played = 0
        self.unmatched_episodes = 0

    # --- seats --------------------------------------------------------------------------------

    def start(self, env: int) -> None:
        """Env ``env`` starts an episode: its match, if one is ready."""
        self.playing.pop(env, None)
        for k, match in enumerate(self.queue):
            if all(self.loaded(v) for v in match.versions):
                del self.queue[k]
                self.playing[env] = match
                return
        self.unmatched_episodes += 1

    def policy(self, env: int, agent: str, mapped: str) -> str:
        """The player of ``agent`` in env ``env``'s episode: its match's seat, else ``mapped``."""
        match = self.playing.get(env)
        if match is None:
            return mapped
        version = match.versions[self.agents.index(agent)]
        return self.main if version == LATEST else self.snapshots[version]

    def group(self, player: str) -> str:
        """The policy a player's returns count for: a snapshot's, ``<main>_snapshot``."""
        return f"{self.main}_snapshot" if "@" in player else player

    def ended(self, env: int, returns: dict[str, float]) -> None:
        """Env ``env``'s episode ended with ``returns`` per agent: its match's outcome."""
        match = self.playing.pop(env, None)
        if match is None:
            return
        latest = self.players[self.main].version
        if latest < 0:  # played before the first weights came: no version to report
            self.unmatched_episodes += 1
            return
        versions = [latest if v == LATEST else v for v in match.versions]
        self.finished.append(
            (match.ticket, versions, [float(returns.get(a, 0.0)) for a in self.agents])
        )
        self.matches_played += 1

    def loaded(self, version: int) -> bool:
        if version == LATEST:
            return True
        key = self.snapshots.get(version)
        return key is not None and self.players[key].version == version

    # --- the parameter server -----------------------------------------------------------------

    def poll(self) -> None:
        """Read the reply in flight; load the snapshots the matches need; ask for more matches
        (with the outcomes since) when the queue runs low or outcomes wait."""
        self._receive()
        now = time.monotonic()
        for version, key in self.snapshots.items():
            params = self.players[key].params
            if params.version < 0:
                params.poll()
                if params.version < 0 and now - self.asked.get(version, 0.0) >= 1.0:
                    self.asked[version] = now
                    params.request()
        self._drop_lapsed()
        if self.in_flight is not None:
            if now - self.in_flight[1] < self.timeout_s and not self.link.dropped():
                return
            self.link.peer.lost("no answer to a match request")
            self.link.reset()
            self._send(self.in_flight[0])  # the same outcomes: counted once by their tickets
            return
        if len(self.queue) < self.cfg.env.num_envs or len(self.finished) >= self.want:
            outcomes, self.finished = self.finished[:MAX_MATCHES], self.finished[MAX_MATCHES:]
            self._send(self._request(outcomes))

    def _request(self, outcomes: list[tuple[int, list[int], list[float]]]) -> MatchRequest:
        want = max(self.want - len(self.queue), 0)
        if not outcomes:
            return MatchRequest(self.actor_id, want)
        return MatchRequest(
            self.actor_id,
            want,
            np.array([t for t, _, _ in outcomes], dtype=np.int64),
            np.array([v for _, v, _ in outcomes], dtype=np.int64),
            np.array([r for _, _, r in outcomes], dtype=np.float64),
        )

    def _send(self, request: MatchRequest) -> None:
        sockets.send(self.link.sock, request)
        self.in_flight = (request, time.monotonic())

    def _receive(self) -> None:
        if self.in_flight is None or not self.link.sock.poll(0, zmq.POLLIN):
            return
        try:
            msg = sockets.recv(self.link.sock, 0)
        except DecodeError as exc:
            log.warning("bad message from the parameter server: %s", exc)
            return
        self.link.peer.heard()
        self.in_flight = None
        if isinstance(msg, Shutdown):
            raise PeerShutdown(msg.reason)
        if isinstance(msg, Error):
            log.warning("the parameter server refused a match request: %s", msg.reason)
            return
        if isinstance(msg, Matches):
            now = time.monotonic()
            for ticket, versions in zip(msg.tickets.tolist(), msg.versions.tolist(), strict=True):
                self.queue.append(Match(ticket, tuple(versions), now))
            self._keep_snapshots()

    def _keep_snapshots(self) -> None:
        """A player for every snapshot a match needs; of the others, the most recently made
        are kept up to the pool's size (a snapshot the draws skip for a while comes back)."""
        needed = {v for m in [*self.queue, *self.playing.values()] for v in m.versions}
        needed.discard(LATEST)
        for version in sorted(needed - set(self.snapshots)):
            key = player_name(self.main, version)
            self.players[key] = self.make_snapshot_player(version)
            self.snapshots[version] = key  # insertion order: the oldest made first
        unneeded = [v for v in self.snapshots if v not in needed]
        for version in unneeded[: max(len(self.snapshots) - self.cfg.league.pool_size, 0)]:
            key = self.snapshots.pop(version)
            self.asked.pop(version, None)
            self.players.pop(key).params.link.close()

    def _drop_lapsed(self) -> None:
        """Matches whose snapshot did not load in ``LOAD_TIMEOUT_S`` (evicted meanwhile). The
        queue is in arrival order: while its first match is younger, none can have lapsed."""
        now = time.monotonic()
        if not self.queue or now - self.queue[0].since < LOAD_TIMEOUT_S:
            return
        kept = deque(
            m
            for m in self.queue
            if now - m.since < LOAD_TIMEOUT_S or all(self.loaded(v) for v in m.versions)
        )
        if len(kept) != len(self.queue):
            log.info("dropped %d matches whose snapshots did not load", len(self.queue) - len(kept))
            self.queue = kept
            self._keep_snapshots()

    def stats(self) -> dict[str, float]:
        return {
            "actor/league_matches": float(self.matches_played),
            "actor/league_unmatched_episodes": float(self.unmatched_episodes),
            "actor/league_snapshots_loaded": float(len(self.snapshots)),
        }

    def close(self) -> None:
        """Close the snapshot players (they leave ``players``) and the link."""
        for key in self.snapshots.values():
            self.players.pop(key).params.link.close()
        self.snapshots.clear()
        self.link.close()

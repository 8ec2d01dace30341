"""The league of a self-play run as the parameter server keeps it: who plays whom, who won, how
strong each player is.

The players are the main policy's latest version (named as the policy, ``main``) and each of its
pinned snapshots (``main@<version>``, ``player_name``). ``League``:

- **matches** (``matches``): for each episode an actor is about to play, a ticket and the version
  that sits in each of the game's two seats: the latest in one (seat ``ticket % 2``, so the main
  policy plays both seats over time), and opposite it the latest again (``league.matchmaking
  latest``, and ``latest_share`` of the others) or a snapshot drawn uniformly or by prioritized
  fictitious self-play from the latest's win rate against each (``ratings.pfsp_weights``);
- **outcomes** (``results``): a finished match comes back under its ticket with the version that
  played each seat and each seat's return (the higher return wins; equal ones draw). The payoff
  table and the Elo ratings take it; a match of the latest against itself counts as played and
  rates no one. An outcome that claims what its match was not (a ticket never given, one given to
  another actor, a snapshot seat played by another version, a latest seat by a version the policy
  never published) refuses the whole message and changes nothing; one of a match already counted,
  or whose snapshot left the pool, is dropped and counted (``stale_results``);
- **snapshots** (``pinned``, ``evicted``, ``wants_snapshot``): a new snapshot starts from the
  latest's rating; one evicted leaves the table and the ratings; with ``league.snapshot_win_rate``
  the latest is pinned again once its score over its last ``win_rate_games`` games against the
  pool passes the rate (and first at its first publish, so that there is a pool to play);
- **state** (``to_dict``, ``load``): what a restarted or resumed parameter server reads back; the
  matches it gave out are not kept (their outcomes are dropped as stale), and it numbers new ones
  past any it may have given after its last save.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import NamedTuple

import numpy as np

from apexrl.league.config import LeagueConfig
from apexrl.league.ratings import ELO_START, PayoffTable, elo_update, pfsp_weights

LATEST = -1  # a seat's version in a match: whatever the actor holds newest
SEATS = 2  # a league's games are two-player
MAX_TICKETS_PER_ACTOR = 4096  # matches given out and not yet back; past it the oldest lapse
# A restored league numbers its matches on past this many more: those given between the last
# save and a restart are then ones it never counts (dropped as stale), never numbers given again.
TICKETS_SKIPPED_ON_RESTORE = 1 << 20


def player_name(main: str, version: int) -> str:
    """The league's name of ``main``'s ``version`` (``LATEST``: the policy's own name)."""
    return main if version == LATEST else f"{main}@{version}"


class Ticket(NamedTuple):
    actor_id: int
    versions: tuple[int, ...]  # per seat: LATEST or a snapshot's version


class Refused(ValueError):
    """An outcome claims what its match was not: the whole message is refused."""


class League:
    """One main policy's league (module docstring). ``latest_version`` is asked for the version
    the policy last published (the parameter server's store)."""

    def __init__(self, cfg: LeagueConfig, main: str, rng: np.random.Generator) -> None:
        self.cfg, self.main, self.rng = cfg, main, rng
        self.payoffs = PayoffTable()
        self.ratings: dict[str, float] = {main: ELO_START}
        self.pool: list[int] = []  # the snapshots' versions, oldest first
        self.tickets: dict[int, OrderedDict[int, Ticket]] = {}  # actor -> ticket -> match
        self.next_ticket = 1
        self.games = 0  # outcomes counted
        self.self_play_games = 0  # of them: the latest against itself
        self.stale_results = 0
        self.refused_results = 0
        self.recent: deque[float] = deque(maxlen=cfg.win_rate_games)  # latest vs pool scores

    # --- matches ------------------------------------------------------------------------------

    def matches(self, actor_id: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """``count`` new matches for ``actor_id``: tickets int64 ``[count]`` and each seat's
        version int64 ``[count, 2]``."""
        tickets = np.arange(self.next_ticket, self.next_ticket + count, dtype=np.int64)
        self.next_ticket += count
        versions = np.full((count, SEATS), LATEST, dtype=np.int64)
        opponents = self.opponents(count)
        given = self.tickets.setdefault(actor_id, OrderedDict())
        for k, ticket in enumerate(tickets.tolist()):
            versions[k, 1 - ticket % SEATS] = opponents[k]
            given[ticket] = Ticket(actor_id, tuple(versions[k].tolist()))
        while len(given) > MAX_TICKETS_PER_ACTOR:
            given.popitem(last=False)
        return tickets, versions

    def opponents(self, count: int) -> list[int]:
        """Who sits opposite the latest in each of ``count`` matches (module docstring)."""
        if not self.pool or self.cfg.matchmaking not in ("uniform", "pfsp"):
            return [LATEST] * count
        if self.cfg.matchmaking == "pfsp":
            rates = [self.payoffs.win_rate(self.main, self.name(v)) for v in self.pool]
            weights = pfsp_weights(rates, self.cfg.pfsp_weighting)
        else:
            weights = np.full(len(self.pool), 1.0 / len(self.pool))
        drawn = self.rng.choice(np.asarray(self.pool, dtype=np.int64), size=count, p=weights)
        latest = self.rng.random(count) < self.cfg.latest_share
        return [LATEST if own else int(v) for own, v in zip(latest, drawn, strict=True)]

    def name(self, version: int) -> str:
        return player_name(self.main, version)

    # --- outcomes -----------------------------------------------------------------------------

    def results(
        self,
        actor_id: int,
        tickets: np.ndarray,
        versions: np.ndarray,
        returns: np.ndarray,
        latest_version: int,
    ) -> None:
        """Count the outcomes of finished matches; ``Refused`` (nothing counted) when any claims
        what its match was not (module docstring)."""
        if len(set(tickets.tolist())) != len(tickets):
            self._refuse("a match's outcome is sent once per message")
        matches = [
            self._check(actor_id, int(ticket), versions[k], latest_version)
            for k, ticket in enumerate(tickets.tolist())
        ]
        for k, match in enumerate(matches):
            if match is None:
                self.stale_results += 1
                continue
            del self.tickets[actor_id][int(tickets[k])]
            if any(v != LATEST and v not in self.pool for v in match.versions):
                self.stale_results += 1  # its snapshot left the pool
                continue
            self._count(match, returns[k])

    def _check(
        self, actor_id: int, ticket: int, versions: np.ndarray, latest_version: int
    ) -> Ticket | None:
        """The match of an outcome; None for one counted before (a request sent again) or
        lapsed; ``Refused`` for one that claims what its match was not."""
        if not 0 < ticket < self.next_ticket:
            self._refuse(f"match {ticket} was never given")
        match = self.tickets.get(actor_id, {}).get(ticket)
        if match is None:
            for other, given in self.tickets.items():
                if ticket in given:
                    self._refuse(f"match {ticket} was given to actor {other}, not {actor_id}")
            return None
        if len(versions) != len(match.versions):
            self._refuse(f"match {ticket} has {len(match.versions)} seats, not {len(versions)}")
        seats = zip(versions.tolist(), match.versions, strict=True)
        for seat, (claimed, given) in enumerate(seats):
            if given == LATEST and claimed > latest_version:
                self._refuse(
                    f"match {ticket}, seat {seat}: the latest {self.main} played it, whose "
                    f"newest version is {latest_version}, not {claimed}"
                )
            if given != LATEST and claimed != given:
                self._refuse(
                    f"match {ticket}, seat {seat}: snapshot {self.name(given)} played it, "
                    f"not version {claimed}"
                )
        return match

    def _refuse(self, reason: str) -> None:
        self.refused_results += 1
        raise Refused(reason)

    def _count(self, match: Ticket, returns: np.ndarray) -> None:
        self.games += 1
        first, second = match.versions
        if first == second == LATEST:
            self.self_play_games += 1
            return
        score_first = 1.0 if returns[0] > returns[1] else 0.5 if returns[0] == returns[1] else 0.0
        a, b = self.name(first), self.name(second)
        self.payoffs.add(a, b, score_first)
        self.ratings[a], self.ratings[b] = elo_update(self.ratings[a], self.ratings[b], score_first)
        if LATEST in match.versions:
            self.recent.append(score_first if first == LATEST else 1.0 - score_first)

    # --- snapshots ----------------------------------------------------------------------------

    def wants_snapshot(self) -> bool:
        """Whether the version just published is to be pinned for the latest's win rate
        (``league.snapshot_win_rate``): the first of the run, and each after the latest beat the
        pool often enough."""
        if self.cfg.snapshot_win_rate <= 0:
            return False
        if not self.pool:
            return True
        full = len(self.recent) == self.recent.maxlen
        return full and float(np.mean(self.recent)) >= self.cfg.snapshot_win_rate

    def pinned(self, version: int) -> None:
        """``version`` joined the pool: rated as the latest is now."""
        if version not in self.pool:
            self.pool.append(version)
        self.ratings[self.name(version)] = self.ratings[self.main]
        self.recent.clear()

    def evicted(self, version: int) -> None:
        """``version`` left the pool: out of the ratings and the payoff table."""
        if version in self.pool:
            self.pool.remove(version)
        name = self.name(version)
        self.ratings.pop(name, None)
        self.payoffs.games = {
            pair: counts for pair, counts in self.payoffs.games.items() if name not in pair
        }

    # --- reading ------------------------------------------------------------------------------

    def win_rate_vs_pool(self) -> float | None:
        """The latest's score over its recent games against the pool (draws half)."""
        return float(np.mean(self.recent)) if self.recent else None

    def stats(self) -> dict[str, float]:
        """The league's scalars: games, pool, every player's rating (``league/elo/latest``,
        ``league/elo/v<version>``), each snapshot's record against the latest."""
        values = {
            "league/games": float(self.games),
            "league/self_play_games": float(self.self_play_games),
            "league/pool_size": float(len(self.pool)),
            "league/stale_results": float(self.stale_results),
            "league/refused_results": float(self.refused_results),
            "league/elo/latest": self.ratings[self.main],
        }
        rate = self.win_rate_vs_pool()
        if rate is not None:
            values["league/win_rate_vs_pool"] = rate
        for version in self.pool:
            name = self.name(version)
            values[f"league/elo/v{version}"] = self.ratings[name]
            wins, draws, losses = self.payoffs.record(self.main, name)
            values[f"league/payoff/v{version}/wins"] = float(wins)
            values[f"league/payoff/v{version}/draws"] = float(draws)
            values[f"league/payoff/v{version}/losses"] = float(losses)
        return values

    def to_dict(self) -> dict:
        """The state a resumed run goes on from (tickets given out are not kept)."""
        return {
            "main": self.main,
            "pool": list(self.pool),
            "ratings": dict(self.ratings),
            "payoffs": self.payoffs.to_dict(),
            "games": self.games,
            "self_play_games": self.self_play_games,
            "next_ticket": self.next_ticket,
            "recent": list(self.recent),
        }

    def load(self, data: dict) -> None:
        """``to_dict``'s state back (the pool as the caller pinned it again); ``ValueError``
        for anything else."""
        if not isinstance(data, dict) or data.get("main") != self.main:
            raise ValueError(f"league state is not {self.main!r}'s")
        pool = data.get("pool")
        if not isinstance(pool, list) or not all(isinstance(v, int) and v >= 0 for v in pool):
            raise ValueError("league state: pool must be a list of versions")
        ratings = data.get("ratings")
        names = {self.main, *(self.name(v) for v in pool)}
        if (
            not isinstance(ratings, dict)
            or set(ratings) != names
            or not all(isinstance(r, (int, float)) and np.isfinite(r) for r in ratings.values())
        ):
            raise ValueError("league state: ratings must rate the latest and every snapshot")
        payoffs = PayoffTable.from_dict(data.get("payoffs", {}))
        if not all(a in names and b in names for a, b in payoffs.games):
            raise ValueError("league state: payoffs name a player not in the league")
        counts = [data.get(key) for key in ("games", "self_play_games", "next_ticket")]
        if not all(isinstance(n, int) and n >= 0 for n in counts):
            raise ValueError("league state: games and next_ticket must be counts")
        recent = data.get("recent", [])
        if not isinstance(recent, list) or not all(s in (0, 0.5, 1) for s in recent):
            raise ValueError("league state: recent must hold scores 0, 1/2 or 1")
        self.pool = list(pool)
        self.ratings = {name: float(r) for name, r in ratings.items()}
        self.payoffs = payoffs
        self.games, self.self_play_games, next_ticket = counts
        self.next_ticket = max(next_ticket, 1) + TICKETS_SKIPPED_ON_RESTORE
        self.recent.clear()
        self.recent.extend(float(s) for s in recent)


def league_stats(server_stats: dict[str, float]) -> dict[str, float]:
    """The league's part of a parameter server's stats (``League.stats``)."""
    return {name: value for name, value in server_stats.items() if name.startswith("league/")}

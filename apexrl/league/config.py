"""The ``league`` section of a run's config: self-play in a multi-agent run.

- **Snapshots**: every trained policy's published version is pinned on the parameter server every
  ``snapshot_every_versions`` versions, and the league's ``main`` policy's also when its win rate
  against its pool passes ``snapshot_win_rate``: a frozen opponent, served like any weights, the
  oldest evicted past ``pool_size``.
- **Matchmaking** (``matchmaking``, a two-player game whose two seats the mapping gives ``main``):
  before each episode the actor takes a match from the parameter server, which names who plays
  each seat: ``main``'s latest version in one (each seat in turn) and, in the other, its latest
  version too (``latest``: plain self-play) or one of its snapshots, drawn uniformly (``uniform``,
  fictitious self-play) or by how hard each is for the latest (``pfsp``, prioritized fictitious
  self-play, ``pfsp_weighting``); ``latest_share`` of the matches are self-play whatever the
  drawing. Each finished match comes back with its outcome: the payoff table and the Elo ratings
  (``apexrl.league.league``).
- **Evaluation against fixed players** (``eval_opponents``): the evaluation actor's rounds play
  ``main``'s latest greedy version against each named fixed player in both seats.

Torch-free and gymnasium-free, like every section: the servers and the launcher read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from apexrl.config.rules import check_fixed_player
from apexrl.league.ratings import WEIGHTINGS

MATCHMAKING = ("", "latest", "uniform", "pfsp")


@dataclass(frozen=True)
class LeagueConfig:
    # Pin every trained policy's published version on the parameter server as a snapshot every
    # this many versions (a frozen opponent, served like any weights); 0: none taken by count
    snapshot_every_versions: int = 0
    # Snapshots kept per policy; pinning one more evicts the oldest
    pool_size: int = 8
    # The policy that plays its past selves (matchmaking, snapshot_win_rate, eval_opponents);
    # "": the first trained policy
    main: str = ""
    # Who sits opposite main's latest version: "" (no matches: seats as the mapping says),
    # "latest" (itself), "uniform" (a snapshot, uniformly), "pfsp" (a snapshot, weighted by
    # pfsp_weighting of the latest's win rate against it)
    matchmaking: str = ""
    # hard: (1 - x)^2, the snapshots the latest still loses to; variance: x (1 - x); uniform
    pfsp_weighting: str = "hard"
    # Share of matches the latest plays against itself while the pool has snapshots
    latest_share: float = 0.0
    # Also pin main's version when the latest's win rate over its last win_rate_games games
    # against the pool passes this (draws half); 0: off. Needs matchmaking against the pool.
    snapshot_win_rate: float = 0.0
    win_rate_games: int = 200
    # Fixed players (random, a scripted module:Class, checkpoint:PATH[#POLICY]: another run's
    # policy) the evaluation actor plays main's latest greedy version against, each in both
    # seats, every round
    eval_opponents: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        """Whether the parameter server keeps a league (snapshots, matches)."""
        return (
            self.snapshot_every_versions > 0 or self.snapshot_win_rate > 0 or bool(self.matchmaking)
        )

    @property
    def plays_pool(self) -> bool:
        """Whether matches seat snapshots."""
        return self.matchmaking in ("uniform", "pfsp")

    def validate(self) -> None:
        if self.snapshot_every_versions < 0:
            raise ValueError(
                "league.snapshot_every_versions must be >= 0 (0: none by count), got "
                f"{self.snapshot_every_versions}"
            )
        if self.pool_size < 1:
            raise ValueError(f"league.pool_size must be >= 1, got {self.pool_size}")
        if self.main and not self.main.isidentifier():
            raise ValueError(f"league.main must be a policy name, got {self.main!r}")
        if self.matchmaking not in MATCHMAKING:
            raise ValueError(
                f"league.matchmaking must be '', latest, uniform or pfsp, got {self.matchmaking!r}"
            )
        if self.pfsp_weighting not in WEIGHTINGS:
            raise ValueError(
                f"league.pfsp_weighting must be one of {', '.join(WEIGHTINGS)}, got "
                f"{self.pfsp_weighting!r}"
            )
        if not 0.0 <= self.latest_share <= 1.0:
            raise ValueError(f"league.latest_share must be in [0, 1], got {self.latest_share}")
        if not 0.0 <= self.snapshot_win_rate < 1.0:
            raise ValueError(
                f"league.snapshot_win_rate must be in [0, 1) (0: off), got {self.snapshot_win_rate}"
            )
        if self.win_rate_games < 1:
            raise ValueError(f"league.win_rate_games must be >= 1, got {self.win_rate_games}")
        if self.snapshot_win_rate > 0 and not self.plays_pool:
            raise ValueError(
                "league.snapshot_win_rate reads the latest's win rate against its pool: set "
                "league.matchmaking to uniform or pfsp"
            )
        if self.plays_pool and self.snapshot_every_versions == 0 and self.snapshot_win_rate == 0:
            raise ValueError(
                f"league.matchmaking {self.matchmaking} draws snapshots: set "
                "league.snapshot_every_versions or league.snapshot_win_rate"
            )
        for name in self.eval_opponents:
            check_fixed_player("league.eval_opponents", name)


def main_policy(league: LeagueConfig, trained: tuple[str, ...]) -> str:
    """The league's main policy: ``league.main``, else the first trained policy."""
    return league.main or trained[0]

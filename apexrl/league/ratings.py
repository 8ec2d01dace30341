"""The league's math, pure and small: who is how strong, and whom to play next.

- **Elo** (``elo_expected``, ``elo_update``): the expected score of A against B is
  ``E_A = 1 / (1 + 10^((R_B - R_A) / 400))``; after a game with score ``S_A`` (1 a win, 1/2 a
  draw, 0 a loss) ``R_A += K (S_A - E_A)`` and ``R_B`` moves by as much the other way.
- **Prioritized fictitious self-play** (AlphaStar, Vinyals et al. 2019; ``pfsp_weights``): an
  opponent B is drawn with weight ``f(P[A beats B])``: ``hard``, ``(1 - x)^p``, favours the
  opponents A still loses to; ``variance``, ``x (1 - x)``, those it beats half the time;
  ``uniform`` is fictitious self-play over the whole pool.
- **Payoffs** (``PayoffTable``): wins, draws and losses of each ordered pair of players, and
  ``win_rate`` (a draw counts half; a pair that never met: 1/2, the prior PFSP starts from).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ELO_START = 1000.0  # a new player's rating
ELO_K = 32.0  # the step of one game
WEIGHTINGS = ("hard", "variance", "uniform")


def elo_expected(rating_a: float, rating_b: float) -> float:
    """A's expected score against B."""
    return 1.0 / (1.0 + 10.0 ** ((rating_b - rating_a) / 400.0))


def elo_update(
    rating_a: float, rating_b: float, score_a: float, k: float = ELO_K
) -> tuple[float, float]:
    """Both ratings after one game in which A scored ``score_a`` (1, 1/2 or 0)."""
    if not 0.0 <= score_a <= 1.0:
        raise ValueError(f"a game's score is in [0, 1], got {score_a}")
    step = k * (score_a - elo_expected(rating_a, rating_b))
    return rating_a + step, rating_b - step


def pfsp_weights(win_rates: Sequence[float], weighting: str = "hard", p: float = 2.0) -> np.ndarray:
    """The probability of drawing each opponent, from the learner's win rate against each: ``hard``
    ``(1 - x)^p``, ``variance`` ``x (1 - x)`` or ``uniform``, normalized; uniform where every
    weight is 0 (an opponent pool the learner always beats, under ``hard``)."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {', '.join(WEIGHTINGS)}, got {weighting!r}")
    x = np.asarray(win_rates, dtype=np.float64)
    if x.ndim != 1 or len(x) == 0:
        raise ValueError("pfsp_weights needs the win rates of at least one opponent")
    if np.any((x < 0) | (x > 1)) or not np.all(np.isfinite(x)):
        raise ValueError(f"win rates are in [0, 1], got {x.tolist()}")
    if weighting == "hard":
        weights = (1.0 - x) ** p
    elif weighting == "variance":
        weights = x * (1.0 - x)
    else:
        weights = np.ones_like(x)
    total = weights.sum()
    if total <= 0.0:
        return np.full(len(x), 1.0 / len(x))
    return weights / total


class PayoffTable:
    """Wins, draws and losses of each ordered pair of players (names: a policy's latest version,
    a snapshot, a fixed player). ``add`` records one game from both sides."""

    def __init__(self) -> None:
        self.games: dict[tuple[str, str], list[int]] = {}  # (a, b) -> [wins, draws, losses] of a

    def add(self, a: str, b: str, score_a: float) -> None:
        """One game of ``a`` against ``b`` that ``a`` won (1), drew (1/2) or lost (0)."""
        if a == b:
            raise ValueError(f"a player does not play itself in the payoff table: {a!r}")
        column = {1.0: 0, 0.5: 1, 0.0: 2}.get(float(score_a))
        if column is None:
            raise ValueError(f"a game's score is 1, 1/2 or 0, got {score_a}")
        self.games.setdefault((a, b), [0, 0, 0])[column] += 1
        self.games.setdefault((b, a), [0, 0, 0])[2 - column] += 1

    def record(self, a: str, b: str) -> tuple[int, int, int]:
        """(wins, draws, losses) of ``a`` against ``b``."""
        wins, draws, losses = self.games.get((a, b), (0, 0, 0))
        return wins, draws, losses

    def win_rate(self, a: str, b: str) -> float:
        """``a``'s score rate against ``b`` (draws half); 1/2 when they never met."""
        wins, draws, losses = self.record(a, b)
        played = wins + draws + losses
        return 0.5 if played == 0 else (wins + 0.5 * draws) / played

    def to_dict(self) -> dict[str, list[int]]:
        """As JSON-friendly data: ``{"a|b": [wins, draws, losses]}``."""
        return {f"{a}|{b}": list(counts) for (a, b), counts in self.games.items()}

    @classmethod
    def from_dict(cls, data: dict[str, list[int]]) -> PayoffTable:
        """``to_dict``'s data back; ``ValueError`` for anything else."""
        table = cls()
        for key, counts in data.items():
            a, sep, b = key.partition("|")
            if not sep or not a or not b or a == b:
                raise ValueError(f"payoff key must be 'a|b' of two players, got {key!r}")
            if len(counts) != 3 or any(not isinstance(n, int) or n < 0 for n in counts):
                raise ValueError(f"payoff {key!r} must be [wins, draws, losses], got {counts!r}")
            table.games[(a, b)] = list(counts)
        for (a, b), (wins, draws, losses) in table.games.items():
            if table.games.get((b, a)) != [losses, draws, wins]:
                raise ValueError(f"payoffs of {a!r} against {b!r} and back do not agree")
        return table

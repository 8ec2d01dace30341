"""Self-play and leagues: a policy's frozen past versions as its opponents (docs/self-play.md).

- ``config``: the ``league`` section (snapshots, matchmaking, evaluation opponents);
- ``ratings``: the league's pure math (Elo, prioritized fictitious self-play's opponent weights,
  a payoff table of wins, draws and losses per pair of players);
- ``snapshots``: the parameter server's pool of a policy's pinned versions, each served as the
  bytes it was published with (``ParamsRequest.snapshot``);
- ``league``: the parameter server's league of the main policy: matches drawn for the actors,
  their outcomes checked against what each match was and counted into payoffs and ratings,
  snapshots by win rate, its state;
- ``storage``: the pool and the league's state on disk, read back by a resumed run;
- ``seating``: a training actor's side: each episode's match, its snapshot players, the outcomes
  sent back (``MatchRequest`` / ``Matches``);
- ``evaluation``: the evaluation actor's rounds against fixed players in both seats;
- ``opponents``: a two-player game's policy against a named fixed player in both seats
  (``apexrl evaluate --opponent``, ``apexrl play``).
"""

"""Self-play and leagues: a policy's frozen past versions as its opponents.

So far:

- ``ratings``: the league's pure math (Elo, prioritized fictitious self-play's opponent weights,
  a payoff table of wins, draws and losses per pair of players);
- ``config``: the ``league`` section (how often a snapshot is taken, how many are kept);
- ``snapshots``: the parameter server's pool of a policy's pinned versions, each served as the
  bytes it was published with (``ParamsRequest.snapshot``);
- ``opponents``: a two-player game's policy against a named fixed player in both seats
  (``apexrl evaluate --opponent``).

Matchmaking (which snapshot fills a seat), ratings and payoffs in the run's records, and the
evaluation actor's rounds against fixed opponents are still to come.
"""

"""Self-play and leagues: a policy's frozen past versions as its opponents.

So far: ``ratings``, the league's pure math (Elo, prioritized fictitious self-play's opponent
weights, a payoff table of wins, draws and losses per pair of players).
"""

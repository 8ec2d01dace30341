"""Replay storage: the data structures behind the replay server.

- ``sum_tree.py``: a vectorized float64 sum tree for proportional prioritized sampling.
- ``tables.py``: ``PrioritizedTable`` (Ape-X, R2D2), ``FifoQueue`` (IMPALA, PPO) and
  ``RateLimiter`` (Reverb's samples-per-insert ratio), composed by ``replay_server.py``, which adds
  only the socket loop.
"""

"""Replay storage: the data structures behind the replay server.

- ``sum_tree.py``: a vectorized float64 sum tree for proportional prioritized sampling.
- ``tables.py``: ``PrioritizedTable`` (Ape-X, R2D2), ``FifoQueue`` (IMPALA, PPO) and
  ``RateLimiter`` (Reverb's samples-per-insert ratio), composed by ``replay_server.py``, which adds
  the message handling and the socket loop.
- ``admission.py``: the checks on what arrives (names, ids, bounds and item values) that need only
  the config and the item spec.
- ``actors.py``: each actor's progress as its reports tell it, for the ``actor/<name>/...``
  entries of ``Stats``.
- ``snapshot.py``: the replay snapshot's file on disk, written in a background thread.
"""

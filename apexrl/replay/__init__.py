"""Replay: the parts that ``replay_server.py`` composes (it adds the server loop).

- ``service.py``: ``ReplayService``, one table's message handling, the checks that need its
  state, and its snapshots, without a socket.
- ``sum_tree.py``: a vectorized float64 sum tree for proportional prioritized sampling.
- ``storage.py``: ``RingStorage``, the preallocated arrays of a table's items, allocated from the
  item spec, under keys ``0, 1, 2, ...``.
- ``tables.py``: ``PrioritizedTable`` (Ape-X, R2D2) and ``FifoQueue`` (IMPALA, PPO): which items
  a learner gets, and when they leave.
- ``rate_limiter.py``: ``RateLimiter``, Reverb's samples-per-insert ratio; it counts, the server
  decides what to hold back.
- ``admission.py``: the checks on what arrives (names, ids, bounds and item values) that need
  only the config and the item spec.
- ``bookkeeping.py``: the run's bookkeeping that actors' reports feed: env steps, episodes,
  training and evaluation returns, evaluation rounds, custom metrics.
- ``actors.py``: each actor's progress as its chunks and reports tell it, for the
  ``actor/<name>/...`` entries of ``Stats``, and the env steps it claims held to what it sent.
- ``versions.py``: the weights versions a chunk or report may name (those a learner announced),
  and the messages that wait for their announcement.
- ``state.py``: the server's state that outlives a restart, and what a snapshot holds of it.
- ``snapshot.py``: the replay snapshot's file on disk, written in a background thread.
- ``chunk_log.py``: the chunk log, every chunk stored since the last snapshot as it came off the
  wire, on disk before its ack (``replay.durable``), and the ledger of acknowledged items.
- ``held.py``: the chunks held back for the rate limiter or room, bounded in count and bytes.
- ``serving.py``: the server's socket, its replies, and one pass's reading of the ready messages.
- ``reporting.py``: the values of the server's ``Stats`` and the throughput written with them.
- ``persistence.py``: loading and writing snapshots and the chunk log around the server loop.
- ``accounting.py``: what became of every item replay was sent (``replay/items_*``) and the
  chunk numbers stored per actor, so a chunk sent again is not stored twice.

The rules a replay config must follow so that inserts and samples never wait for each other
forever are the config's (``apexrl/config/rules.py``: ``check_replay_config``).
"""

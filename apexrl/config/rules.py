"""Rules on a config's values that no field's type can state, one small function each, in the
config's own key names. Each raises ``ValueError`` naming the key to change; ``Config.validate``
(``apexrl/config/__init__.py``) runs them and turns the error into a ``ConfigError``.

They take plain values and import nothing of apexrl, so that every module may use them: the
config's sections and the algorithms' hyperparameters (``config/algos.py``) for their own
fields, and the replay server's parts, whose checks on a config live here once.

- one value: ``check_positive``, ``check_at_least_one``, ``check_in_unit_interval``;
- the replay, before anything starts: ``check_replay_config`` refuses a setup that can deadlock
  (its docstring gives the arithmetic), running ``check_replay_values``, ``check_table_holds``,
  ``check_fifo_reads``, ``check_rate_limiter`` and ``check_fifo_room`` in turn;
  ``check_rate_limiter_slack`` is the rate limiter's part of it
  (``replay/rate_limiter.check_no_deadlock``).
"""

from __future__ import annotations

import math


class ConfigError(ValueError):
    """A config file or override that cannot be turned into a valid ``Config``."""


REPLAY_KINDS = ("prioritized", "fifo")
CHUNK_KEYS = "actor.chunk_steps * env.num_envs"  # what the items of one chunk are made of


FIXED_RANDOM = "random"  # a fixed player: uniform over the legal actions
FIXED_CHECKPOINT = "checkpoint:"  # checkpoint:PATH[#POLICY]: another run's network policy, frozen


def check_fixed_player(key: str, value: str) -> None:
    """``ValueError`` naming ``key`` unless ``value`` names a fixed player of a multi-agent run:
    ``random``, a scripted ``module:Class`` or ``checkpoint:PATH[#POLICY]``
    (``apexrl.multiagent.fixed``)."""
    if value == FIXED_RANDOM:
        return
    if value.startswith(FIXED_CHECKPOINT):
        path, hash_sign, policy = value.removeprefix(FIXED_CHECKPOINT).partition("#")
        if not path or (hash_sign and not policy):
            raise ValueError(
                f"{key} must be checkpoint:PATH or checkpoint:PATH#POLICY, got {value!r}"
            )
        return
    try:
        check_import_name(key, value)
    except ValueError:
        raise ValueError(
            f"{key} names random, a scripted module:Class or checkpoint:PATH[#POLICY], got "
            f"{value!r}"
        ) from None


def check_import_name(key: str, name: str) -> None:
    """``ValueError`` naming ``key`` unless ``name`` is ``package.module:attr``."""
    module, colon, attr = name.partition(":")
    parts = [*module.split("."), *attr.split(".")]
    if not colon or not all(part.isidentifier() for part in parts):
        raise ValueError(f"{key} must be package.module:name, got {name!r}")


def check_positive(key: str, value: float) -> None:
    if value <= 0:
        raise ValueError(f"{key} must be positive, got {value}")


def check_seconds(key: str, value: float, zero: str = "") -> None:
    """A finite number of seconds, 0 included (``zero``: what 0 means, for the message)."""
    if not (math.isfinite(value) and value >= 0):
        meaning = f" ({zero})" if zero else ""
        raise ValueError(f"{key} must be >= 0{meaning}, got {value}")


def check_at_least_one(key: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{key} must be >= 1, got {value}")


def check_in_unit_interval(key: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{key} must be in [0, 1], got {value}")


def check_replay_config(
    kind: str,
    capacity: int,
    samples_per_insert: float,
    error_buffer: float,
    min_size_to_sample: int,
    max_insert_items: int,
    max_sample_items: int,
    max_times_sampled: int = 1,
    evict_unread: bool = False,
) -> None:
    """Raise ``ValueError`` naming the config keys to change if this replay setup can deadlock.

    Arithmetic only, to run before anything starts. The arguments are the config's values:
    ``replay.kind``, ``replay.capacity``, ``replay.samples_per_insert``, the rate limiter's slack
    in effect (``Config.rate_error_buffer``: ``replay.rate_error_buffer``, or the value it picks
    for 0), ``replay.min_size_to_sample``, the items of one chunk (``actor.chunk_steps *
    env.num_envs``; smaller chunks are covered too), the items of one sample request
    (``learner.batch_size``), ``replay.max_times_sampled`` and ``replay.evict_unread``.

    The replay server holds a chunk back while the rate limiter or a full FIFO queue refuses it,
    and a sample request while the limiter refuses it or the table holds fewer items than it asks
    for. It deadlocks when a held chunk and a held request wait for each other. With ``C``
    capacity, ``spi`` samples per insert, ``eb`` slack, ``m`` min size, ``I`` chunk items (chunks
    of 1 to ``I`` items are covered), ``B`` batch items (every request asks for ``B``, as the
    learners all ask for ``learner.batch_size``) and ``k`` max times sampled, this refuses:

    1. ``B > C`` or ``m > C``: the table never holds a batch, or the min size.
    2. FIFO, ``spi > k``: no item is delivered more than ``k`` times, so ``spi`` samples per insert
       can never be served: the limiter ends up refusing chunks while the queue runs dry.
    3. FIFO without eviction, ``0 < spi < k``: the limiter allows only ``spi`` of the ``k``
       deliveries that each item waits for, so the queue fills up, then refuses chunks while the
       limiter refuses samples.
    4. ``spi > 0`` and ``eb < max(I * spi, B)``: the limiter can refuse a chunk and a batch at
       once (``check_rate_limiter_slack``).
    5. ``spi > 0`` and ``floor(m + eb / spi) - I + 1 < B``: before the first sample the limiter
       may stop admitting chunks short of a batch. (A FIFO read ``k = spi`` times is back in that
       state whenever it runs low, so it needs the same.)
    6. FIFO, ``C < I + B - 1``: the queue can hold less than a batch (no sample) and still have no
       room for a chunk.
    7. FIFO without eviction, ``C - I + 1 - m < max(0, B - eb / k)``: nothing reads the queue
       before ``m`` items are in, and a full one refuses chunks, so it may stop filling at
       ``C - I + 1`` items, short of ``m``; and when it is full with a batch read fewer than ``k``
       times (``(k - 1) * B`` deliveries owed), the limiter can refuse samples while the queue
       refuses chunks.

    Each refusal is a reachable deadlock, except in three cases that are only sufficient
    conditions: 4, 6 for an evicting queue, and ``m > C`` for a table that keeps inserting (a
    prioritized or evicting one). Exhaustive searches of small configurations in
    ``tests/test_tables.py`` check both ways: random accepted configurations never deadlock, and
    an example of each refusal does.
    """
    spi, eb, k = samples_per_insert, error_buffer, max_times_sampled
    cap, m, chunk, batch = capacity, min_size_to_sample, max_insert_items, max_sample_items
    check_replay_values(kind, cap, spi, eb, m, chunk, batch, k)
    check_table_holds(cap, m, batch)
    if kind == "fifo":
        check_fifo_reads(spi, k, evict_unread)
    if spi > 0:
        check_rate_limiter(spi, eb, m, chunk, batch)
    if kind == "fifo":
        check_fifo_room(cap, spi, eb, m, chunk, batch, k, evict_unread)


def check_replay_values(
    kind: str, cap: int, spi: float, eb: float, m: int, chunk: int, batch: int, k: int
) -> None:
    """Each value on its own: counts positive, the kind known, the ratio and its slack finite,
    and ``replay.max_times_sampled`` 1 for a prioritized table."""
    check_positive("replay.capacity", cap)
    check_positive("replay.min_size_to_sample", m)
    check_positive("learner.batch_size", batch)
    check_at_least_one(f"the items per chunk ({CHUNK_KEYS})", chunk)
    check_at_least_one("replay.max_times_sampled", k)
    if kind not in REPLAY_KINDS:
        raise ValueError(f"replay.kind must be 'prioritized' or 'fifo', got {kind!r}")
    if not math.isfinite(spi):
        raise ValueError(f"replay.samples_per_insert must be finite, got {spi}")
    if not (math.isfinite(eb) and eb >= 0):
        raise ValueError(f"replay.rate_error_buffer must be finite and >= 0, got {eb}")
    if kind == "prioritized" and k != 1:
        raise ValueError(
            f"replay.max_times_sampled {k} applies to a FIFO only; a prioritized table samples "
            "with replacement: set replay.max_times_sampled = 1 or replay.kind = 'fifo'"
        )


def check_table_holds(cap: int, m: int, batch: int) -> None:
    """Rule 1: the table can hold the min size and a batch."""
    if m > cap:
        raise ValueError(f"replay.min_size_to_sample ({m}) exceeds replay.capacity ({cap})")
    if batch > cap:
        raise ValueError(f"learner.batch_size ({batch}) exceeds replay.capacity ({cap})")


def check_fifo_reads(spi: float, k: int, evict_unread: bool) -> None:
    """Rules 2 and 3: how often a FIFO item can be read against how often the limiter asks."""
    if spi > k:
        reads = "read once" if k == 1 else f"read at most {k} times"
        fixes = [f"replay.samples_per_insert {'<=' if evict_unread else '='} {k}"]
        if evict_unread or spi == int(spi):
            fixes.append(
                f"replay.max_times_sampled {'>=' if evict_unread else '='} {math.ceil(spi)}"
            )
        raise ValueError(
            f"replay.samples_per_insert {spi:g} > {k} for a FIFO whose items are {reads} "
            f"(replay.max_times_sampled {k}): the learner would wait forever for samples the "
            f"queue cannot give; set {' or '.join(fixes)}"
        )
    if not evict_unread and 0 < spi < k:
        raise ValueError(
            f"replay.samples_per_insert {spi:g} < replay.max_times_sampled {k} for a FIFO that "
            f"keeps each item until it has been read {k} times: the rate limiter allows only "
            f"{spi:g} reads per item, so the queue fills up and the actors wait forever; set "
            f"replay.samples_per_insert = {k}, or replay.evict_unread = true to drop (and count) "
            "what is not read"
        )


def check_rate_limiter(spi: float, eb: float, m: int, chunk: int, batch: int) -> None:
    """Rules 4 and 5 (``spi > 0``): the limiter never holds a chunk and a batch back at once,
    and admits a batch's worth of items before the first sample."""
    check_rate_limiter_slack(spi, eb, chunk, batch)
    admitted = math.floor(m + eb / spi) - chunk + 1
    if admitted < batch:
        raise ValueError(
            f"replay.min_size_to_sample {m} is too small for learner.batch_size {batch}: with "
            f"replay.samples_per_insert {spi:g} and replay.rate_error_buffer {eb:g} the rate "
            f"limiter may hold chunks of {chunk} items ({CHUNK_KEYS}) back from {admitted} "
            "items on, fewer than a batch, and no sample can lower it; set "
            f"replay.min_size_to_sample >= {batch} or raise replay.rate_error_buffer"
        )


def check_rate_limiter_slack(spi: float, eb: float, chunk: int, batch: int) -> None:
    """Rule 4 (``spi > 0``): ``eb >= max(I * spi, B)``. It covers both ways to stall: while
    filling, a chunk that would cross the min size must fit (needs ``eb >= (I - 1) * spi``);
    later, the insert-blocked and sample-blocked ranges of the limiter's ``diff`` must not overlap
    (needs ``2 * eb >= I * spi + B``)."""
    needed = max(chunk * spi, batch)
    if eb < needed:
        raise ValueError(
            f"replay.rate_error_buffer {eb:g} < max(chunk items {chunk} ({CHUNK_KEYS}) * "
            f"replay.samples_per_insert {spi:g}, learner.batch_size {batch}) = {needed:g}: the "
            "rate limiter could hold back a chunk and a batch at once, forever; set "
            f"replay.rate_error_buffer >= {needed:g} (or 0 for chunk items * "
            "samples_per_insert + batch_size)"
        )


def check_fifo_room(
    cap: int, spi: float, eb: float, m: int, chunk: int, batch: int, k: int, evict_unread: bool
) -> None:
    """Rules 6 and 7: a FIFO that refuses chunks when full has room for what it must hold."""
    if cap < chunk + batch - 1:
        raise ValueError(
            f"replay.capacity {cap} is too small for a FIFO with chunks of {chunk} items "
            f"({CHUNK_KEYS}) and batches of {batch} (learner.batch_size): it can hold less than "
            f"a batch and still have no room for a chunk; set replay.capacity >= "
            f"{chunk + batch - 1}"
        )
    if evict_unread:
        return
    owed = max(0.0, batch - eb / k) if spi > 0 else 0.0
    if cap - chunk + 1 - m >= owed:
        return
    if owed == 0:
        why = (
            f"no learner reads it before replay.min_size_to_sample {m} items are in, and a full "
            f"FIFO refuses chunks of up to {chunk} items ({CHUNK_KEYS}), so it may stop filling "
            f"at {cap - chunk + 1} items"
        )
    else:
        why = (
            f"when it is full and its oldest batch has been read fewer than {k} times "
            "(replay.max_times_sampled), the rate limiter "
            f"(replay.rate_error_buffer {eb:g}) may refuse samples while the queue refuses chunks"
        )
    raise ValueError(
        f"replay.capacity {cap} is too small for a FIFO: {why}; set replay.capacity >= "
        f"{math.ceil(m + chunk - 1 + owed)}, lower replay.min_size_to_sample, or set "
        "replay.evict_unread = true"
    )

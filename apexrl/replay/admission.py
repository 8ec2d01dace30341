"""Admission: the checks on what arrives at the replay server, before it touches any state.

A peer of this config (an actor, an evaluation actor, a learner) can only send certain messages;
these functions say which, from the config and the item spec alone. Each raises ``ValueError``
naming what is wrong, which ``ReplayService`` answers with ``Error``. The checks that depend on
the server's state (the table's room, the held inserts and sample requests) are made by
``ReplayService`` in ``replay_server.py``.

- ``env_spaces``: the observation and action spaces the item spec is made from, as the actors
  make them;
- ``item_value_checks`` and ``check_item_values``: the values of a chunk's (or a snapshot's)
  items: finite floats, bools that are 0 or 1, Discrete actions and the algorithm's integer
  fields in range;
- ``check_chunk_origin`` and ``check_chunk_size``: a chunk's table, actor id, items, env steps
  and priorities (``chunk_bounds``: the most an actor's chunk carries);
- ``check_table``, ``check_id``, ``check_sample_request``, ``check_priority_update``,
  ``check_report`` and ``check_restore_counters``: the names, ids and bounds of the other
  messages (``MAX_*``: what a peer may claim);
- ``check_pending_bytes``: at start, that the room for held chunks holds at least one;
- ``role_gates``: what a CURVE peer of each role may send to replay, checked before decoding
  (``transport/gate.py``); ``report_slack``: the env steps a report may count beyond its
  actor's chunks (``replay/actors.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import gymnasium as gym
import numpy as np

from apexrl.callbacks import MAX_ABS_METRIC
from apexrl.config import Config
from apexrl.config.algos import ItemSpec
from apexrl.envs.nested import HybridActions, PackedBox
from apexrl.envs.spaces import network_spaces
from apexrl.replay.tables import check_priorities
from apexrl.runtime.lifecycle import StartupError
from apexrl.transport import gate
from apexrl.transport.messages import (
    ActorReport,
    PriorityUpdate,
    PublishedVersion,
    RestoreCounters,
    SampleRequest,
    Shutdown,
    StatsRequest,
    TrajectoryChunk,
)

# What a peer may claim, far beyond any real run; the bounds also keep every counter exact in the
# float64 values of ``Stats``.
MAX_RUN_ENV_STEPS = 2**50  # env steps of a whole run (RestoreCounters, the evaluation total)
MAX_REPORT_ENV_STEPS = 2**32  # env steps of one actor between two reports
MAX_EPISODE_STEPS = 2**40  # steps of one episode
MAX_ABS_RETURN = 1e12  # |return| of one episode
NUM_EVAL_ACTOR_IDS = 16  # evaluation actors report as ids 0 .. 15 (``apexrl actor --eval --id``)
# What a replay server accepts, and the most bytes of a report or a learner's control message.
ACCEPTED = (
    TrajectoryChunk,
    SampleRequest,
    PriorityUpdate,
    ActorReport,
    StatsRequest,
    RestoreCounters,
    PublishedVersion,
    Shutdown,
)
REPORT_BYTES = 2**20


def env_spaces(cfg: Config) -> tuple[gym.Space, gym.Space]:
    """The observation and action spaces of one env of ``cfg``, made as the actors make theirs.

    Raises ``EnvError`` when the env cannot be made or the algorithm cannot act in it, as the
    actors would.
    """
    return network_spaces(cfg)


@dataclass(frozen=True)
class ValueCheck:
    """What the values of one item field must be; its dtype and shape are the item spec's.

    ``kind`` is ``"finite"`` (a float field), ``"bool"`` (every byte 0 or 1), ``"range"`` (an
    integer field the learner's math relies on: ``low..high``), ``"action"`` (a Discrete
    action: ``0..num_actions - 1``) or ``"unit"`` (a Box action of a policy that acts in
    [-1, 1]: every value inside it); for nested spaces (``nested_value_checks``) also
    ``"actions"`` (a MultiDiscrete action: part ``k`` in ``0..highs[k]``), ``"hybrid"`` (a packed
    Tuple or Dict action: its first ``len(highs)`` entries whole numbers in ``0..highs[k]``) and
    ``"packed_finite"`` (bytes ``low..high`` of packed observation rows, read as ``dtype``:
    finite).
    """

    name: str
    kind: str
    low: int = 0
    high: int = 0
    highs: tuple[int, ...] = ()
    dtype: str = ""


def item_value_checks(
    spec: ItemSpec,
    int_ranges: dict[str, tuple[int, int]],
    action_fields: tuple[str, ...],
    num_actions: int | None,
    unit_actions: bool = False,
) -> list[ValueCheck]:
    """The checks ``check_item_values`` runs on every chunk, worked out once from the item spec:
    floats finite, bools 0 or 1, ``int_ranges``, and actions: a Discrete one's index, and with
    ``unit_actions`` (``Config.unit_actions``) a Box one inside [-1, 1]."""
    checks = []
    for name, (dtype, _shape) in spec.items():
        kind = np.dtype(dtype).kind
        if kind == "f":
            checks.append(ValueCheck(name, "finite"))
        elif kind == "b":
            checks.append(ValueCheck(name, "bool"))
        if name in int_ranges:
            checks.append(ValueCheck(name, "range", *int_ranges[name]))
        if name in action_fields and num_actions is not None:
            checks.append(ValueCheck(name, "action", 0, num_actions - 1))
        if name in action_fields and unit_actions and kind == "f":
            checks.append(ValueCheck(name, "unit", -1, 1))
    return checks


def nested_value_checks(
    obs_space: gym.Space, action_space: gym.Space, spec: ItemSpec, action_fields: tuple[str, ...]
) -> list[ValueCheck]:
    """The checks of packed observation fields (their float parts finite: the row itself is
    bytes) and of MultiDiscrete or packed Tuple/Dict actions (``envs.nested``)."""
    checks = []
    if isinstance(obs_space, PackedBox):
        for name, (_dtype, shape) in spec.items():
            if name in ("obs", "next_obs") and shape[-1:] == obs_space.shape:
                for part in obs_space.layout.parts:
                    if part.dtype.kind == "f":
                        checks.append(
                            ValueCheck(
                                name, "packed_finite", part.offset, part.end, (), part.dtype.str
                            )
                        )
    highs: tuple[int, ...] = ()
    kind = ""
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        kind, highs = "actions", tuple(int(n) - 1 for n in np.asarray(action_space.nvec).ravel())
    elif isinstance(action_space, HybridActions):
        kind, highs = "hybrid", tuple(n - 1 for n in action_space.layout.nvec)
    if kind:
        checks += [ValueCheck(name, kind, 0, 0, highs) for name in action_fields if name in spec]
    return checks


def _check_nested_values(check: ValueCheck, array: np.ndarray) -> None:
    if check.kind == "packed_finite":
        part = np.ascontiguousarray(array[..., check.low : check.high]).view(np.dtype(check.dtype))
        if not np.isfinite(part).all():
            raise ValueError(f"field {check.name!r} holds non-finite values in a packed part")
        return
    k = len(check.highs)
    columns = array.reshape(-1, array.shape[-1])[:, :k]
    if check.kind == "hybrid" and not np.array_equal(columns, np.rint(columns)):
        raise ValueError(f"field {check.name!r} holds Discrete parts that are not whole numbers")
    low, high = columns.min(axis=0), columns.max(axis=0)
    if (low < 0).any() or (high > np.asarray(check.highs)).any():
        raise ValueError(
            f"field {check.name!r} holds actions outside the action space's parts 0..{check.highs}"
        )


def check_item_values(checks: list[ValueCheck], fields: dict[str, np.ndarray]) -> None:
    """Raise ``ValueError`` naming the field unless ``fields`` (which match the item spec) pass
    ``checks``. One or two reductions per field, whatever the number of items."""
    for check in checks:
        array = fields[check.name]
        if array.size == 0:
            continue
        if check.kind in ("packed_finite", "actions", "hybrid"):
            _check_nested_values(check, array)
        elif check.kind == "finite":
            # A sum is finite only if every term is (a NaN or an infinity never cancels out);
            # only a sum that overflows needs the exact test.
            total = np.add.reduce(array, axis=None, dtype=np.float64)
            if not math.isfinite(total) and not np.isfinite(array).all():
                raise ValueError(f"field {check.name!r} holds non-finite values")
        elif check.kind == "bool":
            if np.maximum.reduce(array.view(np.uint8), axis=None) > 1:
                raise ValueError(f"field {check.name!r} holds bytes other than 0 and 1: not bools")
        elif check.kind == "unit":
            low, high = np.minimum.reduce(array, axis=None), np.maximum.reduce(array, axis=None)
            if not (-1.0 <= low and high <= 1.0):
                raise ValueError(
                    f"field {check.name!r} holds actions in [{low:.6g}, {high:.6g}], outside "
                    "the policy's [-1, 1]"
                )
        else:
            low = int(np.minimum.reduce(array, axis=None))
            high = int(np.maximum.reduce(array, axis=None))
            if check.low <= low and high <= check.high:
                continue
            if check.kind == "action":
                raise ValueError(
                    f"field {check.name!r} holds actions in [{low}, {high}], outside the action "
                    f"space's 0..{check.high}"
                )
            raise ValueError(
                f"field {check.name!r} holds values in [{low}, {high}], outside "
                f"{check.low}..{check.high}"
            )


class ChunkBounds(NamedTuple):
    """The most one chunk of an actor of this config carries."""

    items: int  # cfg.chunk_items
    env_steps: int  # algo.max_env_steps_per_chunk: the steps its items may account for
    bytes: int  # its items and a float64 priority per item
    # The run's env steps it may bring: its items' steps, or in a multi-agent run, where a
    # chunk holds one policy's agent steps and brings the env steps taken since the actor's last
    # chunk, those times the agents of an env (each env step is at least one agent's).
    run_env_steps: int = 0


def chunk_bounds(cfg: Config, spec: ItemSpec, agents_per_env: int = 1) -> ChunkBounds:
    items = cfg.chunk_items
    env_steps = cfg.algo.max_env_steps_per_chunk(cfg.actor.chunk_steps, cfg.env.num_envs)
    item_bytes = sum(np.dtype(dtype).itemsize * math.prod(shape) for dtype, shape in spec.values())
    return ChunkBounds(items, env_steps, items * (item_bytes + 8), env_steps * agents_per_env)


def role_gates(cfg: Config, bounds: ChunkBounds) -> dict[str, gate.RoleGate]:
    """What each CURVE role may send to replay, and how large: an actor a chunk of ``bounds``
    (LZ4 may add up to 1 % on the wire) or a report; an evaluation actor a report; the learner
    priorities of a batch or a control message."""
    small = gate.SMALL_MESSAGE_BYTES
    chunk_bytes = bounds.bytes + bounds.bytes // 100
    priorities_bytes = 16 * cfg.learner.batch_size  # an int64 key and a float64 priority each
    max_bytes = {
        "actor": max(chunk_bytes, REPORT_BYTES) + small,
        "eval": REPORT_BYTES + small,
        "learner": max(priorities_bytes, REPORT_BYTES) + small,
    }
    return gate.role_gates(ACCEPTED, max_bytes)


def report_slack(cfg: Config, bounds: ChunkBounds) -> int:
    """The env steps a training actor's report may count that no chunk of it carried yet: the
    chunk on its way and the block being filled, and the steps it holds uncut."""
    return 2 * bounds.run_env_steps + cfg.algo.carried_steps(cfg.env.num_envs)


def check_pending_bytes(cfg: Config, bounds: ChunkBounds) -> None:
    """Raise ``StartupError`` unless ``replay.max_pending_insert_bytes`` holds one chunk."""
    if cfg.replay.max_pending_insert_bytes < bounds.bytes:
        raise StartupError(
            f"replay.max_pending_insert_bytes {cfg.replay.max_pending_insert_bytes} is less "
            f"than one chunk of {bounds.items} items ({bounds.bytes} bytes); raise it"
        )


def check_chunk_origin(chunk: TrajectoryChunk, cfg: Config) -> None:
    """The chunk is for this table, from a training actor of ``cfg``."""
    check_table(chunk.table, cfg)
    check_id("actor_id", chunk.actor_id, cfg.actor.num_actors, "actor.num_actors")


def check_chunk_size(chunk: TrajectoryChunk, cfg: Config, bounds: ChunkBounds) -> None:
    """1 to ``bounds.items`` items, at most ``bounds.env_steps`` env steps, valid priorities."""
    num_items = chunk.priorities.shape[0]
    if num_items < 1:
        raise ValueError("a chunk needs at least one item")
    if num_items > bounds.items:
        raise ValueError(
            f"a chunk of {num_items} items is more than an actor sends: at most {bounds.items} "
            f"{_chunk_source(cfg)}"
        )
    if chunk.claimed_steps > bounds.env_steps:
        name = "env_steps" if chunk.agent_steps < 0 else "agent_steps"
        raise ValueError(
            f"a chunk's {name} {chunk.claimed_steps} is more than an actor's chunk carries: "
            f"at most {bounds.env_steps} {_chunk_source(cfg)}"
        )
    if chunk.env_steps > bounds.run_env_steps:
        raise ValueError(
            f"a chunk's env_steps {chunk.env_steps} is more than an actor's chunk brings: at "
            f"most {bounds.run_env_steps} here"
        )
    if (chunk.agent_steps >= 0) != cfg.multiagent.enabled:
        raise ValueError(
            "a chunk of a multi-agent run carries its agent_steps, one of a single-agent run none"
        )
    check_priorities(chunk.priorities, num_items)


def _chunk_source(cfg: Config) -> str:
    return (
        f"({cfg.algorithm} with actor.chunk_steps {cfg.actor.chunk_steps} and env.num_envs "
        f"{cfg.env.num_envs})"
    )


def check_id(name: str, value: int, count: int, key: str) -> None:
    if not 0 <= value < count:
        raise ValueError(f"{name} {value} is outside 0..{count - 1} ({key} is {count} here)")


def check_table(table: str, cfg: Config) -> None:
    if table != cfg.replay.table:
        raise ValueError(f"unknown table {table!r}")


def check_sample_request(request: SampleRequest, cfg: Config) -> None:
    """A learner of ``cfg`` asks its table for at most ``learner.batch_size`` items."""
    check_table(request.table, cfg)
    if request.batch_size > cfg.replay.capacity:
        raise ValueError(f"batch_size {request.batch_size} exceeds the capacity")
    if request.batch_size > cfg.learner.batch_size:
        # The rate limiter's slack (cfg.rate_error_buffer) is only deadlock-free for batches
        # up to learner.batch_size.
        raise ValueError(
            f"batch_size {request.batch_size} exceeds learner.batch_size "
            f"{cfg.learner.batch_size}, the largest batch this replay serves"
        )


def check_priority_update(update: PriorityUpdate, cfg: Config) -> None:
    """A learner rank of ``cfg`` sends int64 keys of its table and valid priorities."""
    check_table(update.table, cfg)
    world_size = cfg.learner.world_size
    check_id("learner_rank", update.learner_rank, world_size, "learner.world_size")
    if update.keys.dtype != np.int64:
        raise ValueError(f"keys must be int64, got {update.keys.dtype}")
    check_priorities(update.priorities, update.keys.shape[0])


def check_report(report: ActorReport, cfg: Config, eval_env_steps: int) -> None:
    """An actor of ``cfg`` (or an evaluation actor) reports within the ``MAX_*`` bounds, with
    ``eval_env_steps`` the evaluation env steps counted so far."""
    if report.is_eval:
        check_id("evaluation actor_id", report.actor_id, NUM_EVAL_ACTOR_IDS, "the id range")
    else:
        num_actors = cfg.actor.num_actors
        check_id("actor_id", report.actor_id, num_actors, "actor.num_actors")
    if report.env_steps > MAX_REPORT_ENV_STEPS:
        raise ValueError(f"a report's env_steps {report.env_steps} exceeds {MAX_REPORT_ENV_STEPS}")
    if report.custom_metrics and report.is_eval:
        raise ValueError("an evaluation actor's report carries no custom metrics")
    if any(abs(value) > MAX_ABS_METRIC for value in report.custom_metrics.values()):
        raise ValueError(f"custom metrics must be within +-{MAX_ABS_METRIC:g}")
    if report.is_eval and eval_env_steps + report.env_steps > MAX_RUN_ENV_STEPS:
        raise ValueError(f"evaluation env steps would exceed {MAX_RUN_ENV_STEPS}")
    for name, group in report.group_returns.items():
        if group.size and (not np.isfinite(group).all() or np.abs(group).max() > MAX_ABS_RETURN):
            raise ValueError(f"returns of {name!r} must be finite and within +-{MAX_ABS_RETURN:g}")
    if report.group_returns and not cfg.multiagent.enabled:
        raise ValueError("a report of a single-agent run carries no group returns")
    returns, lengths = report.episode_returns, report.episode_lengths
    if returns.shape[0] > report.env_steps:  # each env step ends at most one episode
        raise ValueError(f"{returns.shape[0]} episodes cannot end in {report.env_steps} env steps")
    if returns.size == 0:
        return
    if not np.isfinite(returns).all() or np.abs(returns).max() > MAX_ABS_RETURN:
        raise ValueError(f"episode returns must be finite and within +-{MAX_ABS_RETURN:g}")
    if lengths.min() < 1 or lengths.max() > MAX_EPISODE_STEPS:
        raise ValueError(f"episode lengths must be in 1..{MAX_EPISODE_STEPS}")


def check_restore_counters(msg: RestoreCounters) -> None:
    if msg.env_steps > MAX_RUN_ENV_STEPS:
        raise ValueError(f"RestoreCounters env_steps {msg.env_steps} exceeds {MAX_RUN_ENV_STEPS}")

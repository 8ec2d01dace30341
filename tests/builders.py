"""Builders of what tests feed the system: configs and replay chunks, written once.

Configs:

- ``config_file(name)``: a shipped config, ``configs/<name>.yaml``;
- ``config(*overrides, path=..., small=...)``: a config file (the Ape-X CartPole one by default;
  None: the defaults) with overrides, on top of the small run's ``SMALL_OVERRIDES`` when ``small``;
- ``write_config(directory, content)``: a config (a ``Config``, written as the learner writes a
  run's, or YAML text) in a file of ``directory``, ``config.yaml`` unless named otherwise.

Replay chunks, for any algorithm and env, from the config alone:

- ``item_layout(cfg)``: what the replay server of ``cfg`` takes in one item, worked out as it
  works it out (the algorithm's ``item_spec`` of the actors' spaces, its action fields and
  integer ranges);
- ``items(cfg, keys)``: valid items, one per key, whose values carry the key (so that a sample
  can be checked by its content);
- ``random_items(layout, num_items, rng)``: valid items with random values (the fuzzer's);
- ``chunk(cfg, priorities)``: a valid ``TrajectoryChunk`` of such items.

A test that sends a malformed chunk builds the valid one and then breaks it (a field replaced or
removed here, or ``dataclasses.replace``), so that only the broken part is wrong.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
from conftest import CONFIG, REPO, SMALL_OVERRIDES

from apexrl.config import Config, dump_config, load_config
from apexrl.replay.admission import env_spaces
from apexrl.runtime import rundir
from apexrl.transport.messages import TrajectoryChunk

ItemSpec = dict[str, tuple[np.dtype, tuple[int, ...]]]  # field -> (dtype, shape of one item)
# Chunk numbers of the chunks built here: increasing, so replay stores each chunk a test builds
# (it stores one (actor, incarnation, sequence) once); pass ``sequence`` to send one again.
_SEQUENCES = itertools.count()


# --- configs --------------------------------------------------------------------------------------


def config_file(name: str) -> Path:
    """The shipped config ``configs/<name>.yaml`` (``name`` with or without ``.yaml``)."""
    return REPO / "configs" / (name if name.endswith(".yaml") else f"{name}.yaml")


def config(*overrides: str, path: str | Path | None = CONFIG, small: bool = False) -> Config:
    """The config file ``path`` (None: the defaults) with ``overrides``, applied after the small
    run's ``SMALL_OVERRIDES`` when ``small``."""
    base = SMALL_OVERRIDES if small else ()
    return load_config(path, [*base, *overrides])


def write_config(directory: Path, content: Config | str, name: str = rundir.CONFIG) -> Path:
    """Write ``content`` (a ``Config``, dumped as the learner writes a run's, or YAML text) to
    ``directory/name`` and return the file's path."""
    path = Path(directory) / name
    path.write_text(content if isinstance(content, str) else dump_config(content))
    return path


# --- replay items and chunks ----------------------------------------------------------------------


@dataclass(frozen=True)
class ItemLayout:
    """What the replay server of a config takes in one item (``ReplayService`` works out the
    same from the same config)."""

    spec: ItemSpec  # field -> (dtype, shape of one item)
    action_fields: tuple[str, ...]  # fields that hold actions
    num_actions: int | None  # a Discrete action space's size; None for Box actions
    int_ranges: dict[str, tuple[int, int]]  # other integer fields: inclusive ranges


def item_layout(cfg: Config) -> ItemLayout:
    """The item layout of ``cfg``'s algorithm in ``cfg``'s env, from the spaces the actors make."""
    obs_space, action_space = env_spaces(cfg)
    num_actions = None
    if isinstance(action_space, gym.spaces.Discrete):
        num_actions = int(action_space.n)
    return ItemLayout(
        spec=cfg.algo.item_spec(obs_space, action_space),
        action_fields=cfg.algo.ACTION_FIELDS,
        num_actions=num_actions,
        int_ranges=cfg.algo.item_int_ranges(),
    )


def _is_discrete_action(layout: ItemLayout, name: str) -> bool:
    return name in layout.action_fields and layout.num_actions is not None


def items(cfg: Config, keys: np.ndarray, **fields: np.ndarray | None) -> dict[str, np.ndarray]:
    """Valid items of ``cfg``, one per key in ``keys`` (``[N]`` int), whose values carry the key:
    a Discrete action is ``key % num_actions``, an integer field with a range its highest value
    (Ape-X's ``num_steps``: ``n_step``), a bool False, a step's ``weights_version`` 0 (the first
    published), and every other field (observations,
    rewards, Box actions, ...) holds the key in each of its elements. ``fields`` replace fields
    (None: removes one)."""
    layout = item_layout(cfg)
    keys = np.asarray(keys, dtype=np.int64)
    valid = {}
    for name, (dtype, shape) in layout.spec.items():
        if _is_discrete_action(layout, name):
            values = keys % layout.num_actions
        elif name in layout.int_ranges:
            values = np.full(len(keys), layout.int_ranges[name][1])
        elif np.dtype(dtype).kind == "b":
            values = np.zeros(len(keys), bool)
        elif name == "weights_version":
            values = np.zeros(len(keys), np.int64)
        else:
            values = keys
        per_item = values.reshape(-1, *(1,) * len(shape))
        valid[name] = np.broadcast_to(per_item, (len(keys), *shape)).astype(dtype)
    merged = {**valid, **fields}
    return {name: array for name, array in merged.items() if array is not None}


def random_items(
    layout: ItemLayout, num_items: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Valid items of ``layout`` with random values drawn from ``rng``, field by field in the
    spec's order: actions and ranged integers uniform in their range, bools True one time in ten,
    everything else normal with standard deviation 3."""
    fields = {}
    for name, (dtype, shape) in layout.spec.items():
        full = (num_items, *shape)
        if _is_discrete_action(layout, name):
            fields[name] = rng.integers(0, layout.num_actions, full).astype(dtype)
        elif name in layout.int_ranges:
            low, high = layout.int_ranges[name]
            fields[name] = rng.integers(low, high + 1, full).astype(dtype)
        elif np.dtype(dtype).kind == "b":
            fields[name] = rng.random(full) < 0.1
        else:
            fields[name] = rng.normal(0, 3, full).astype(dtype)
    return fields


def chunk(
    cfg: Config,
    priorities: np.ndarray | list[float],
    *,
    first_key: int = 0,
    env_steps: int | None = None,
    actor_id: int = 0,
    incarnation: int = 1,
    sequence: int | None = None,
    weights_version: int = 0,
    **fields: np.ndarray | None,
) -> TrajectoryChunk:
    """A valid chunk for ``cfg``'s table: one item per priority, the ``items`` of keys
    ``first_key, first_key + 1, ...`` (the keys a replay server gives them when ``first_key``
    items went in before), with ``fields`` replacing (None: removing) fields. Its ``sequence`` is
    the next of a count that only grows, unless given."""
    priorities = np.asarray(priorities, dtype=np.float64)
    keys = np.arange(first_key, first_key + len(priorities))
    fields = items(cfg, keys, **fields)
    if env_steps is None:  # the env steps its items account for, as an actor claims them
        env_steps = max(0, cfg.algo.steps_in_items(fields))
    return TrajectoryChunk(
        table=cfg.replay.table,
        actor_id=actor_id,
        incarnation=incarnation,
        sequence=next(_SEQUENCES) if sequence is None else sequence,
        weights_version=weights_version,
        env_steps=env_steps,
        priorities=priorities,
        fields=fields,
    )

"""A sweep's search space: each swept config key and the values it may take.

In a sweep spec (``params:``) each entry maps a config key (``algo.lr``) or ``seed`` to one of

    {grid: [v1, v2, ...]}        every value, in every combination with the other grid keys
    {choice: [v1, v2, ...]}      one value drawn per trial
    {uniform: [low, high]}       a float drawn uniformly per trial
    {loguniform: [low, high]}    a float drawn uniformly in log space (learning rates)
    {randint: [low, high]}       an int drawn per trial, both ends included
    anything else                that value for every trial (as ``--set``)

``seed`` is not a config key: it sets every seed of a run (``SEED_KEYS``). Grid keys are
expanded here (``grid_points``, plain ``itertools``); the drawn keys are asked of an Optuna trial
(``suggest``, ``draw_values``), so Optuna's sampler draws them and its pruner can stop a trial
early. Everything but those two is pure.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from apexrl.config import ConfigError

GRID, CHOICE, UNIFORM, LOGUNIFORM, RANDINT, VALUE = (
    "grid",
    "choice",
    "uniform",
    "loguniform",
    "randint",
    "value",
)
KINDS = (GRID, CHOICE, UNIFORM, LOGUNIFORM, RANDINT)  # the forms a spec may write
RANGES = (UNIFORM, LOGUNIFORM, RANDINT)
SEED = "seed"  # the one name that is not a config key
SEED_KEYS = ("env.seed", "learner.seed")  # what ``seed`` sets: the envs' and the network's
# YAML 1.1 (PyYAML) reads "3e-4" as a string; a range bound accepts that form as a float.
_FLOAT_TEXT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


@dataclass(frozen=True)
class Param:
    """One swept key: its kind (``KINDS`` or ``VALUE``), its values (grid, choice, value) or its
    bounds (the ranges)."""

    kind: str
    values: tuple[Any, ...] = ()
    low: float = 0.0
    high: float = 0.0

    @property
    def drawn(self) -> bool:
        """Whether each trial draws its own value (from the sampler)."""
        return self.kind in (CHOICE, *RANGES)

    def example(self) -> Any:
        """A value this key may take, to check the key against the config before any trial."""
        if self.kind == RANDINT:
            return int(self.low)
        if self.kind in RANGES:
            return float(self.low)
        return self.values[0]


def grid(values: list[Any] | tuple[Any, ...]) -> Param:
    """Every value, in every combination with the other grid keys (Tune's ``grid_search``)."""
    return parse_param("grid", {GRID: list(values)})


def choice(values: list[Any] | tuple[Any, ...]) -> Param:
    """One of ``values`` per trial."""
    return parse_param("choice", {CHOICE: list(values)})


def uniform(low: float, high: float) -> Param:
    """A float in ``[low, high]`` per trial."""
    return parse_param("uniform", {UNIFORM: [low, high]})


def loguniform(low: float, high: float) -> Param:
    """A float in ``[low, high]``, uniform in log space, per trial (``0 < low``)."""
    return parse_param("loguniform", {LOGUNIFORM: [low, high]})


def randint(low: int, high: int) -> Param:
    """An int in ``low..high`` (both included) per trial."""
    return parse_param("randint", {RANDINT: [low, high]})


def _number(key: str, value: Any) -> float:
    if isinstance(value, str) and _FLOAT_TEXT.match(value.strip()):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"sweep params.{key}: a bound must be a finite number, got {value!r}")
    return float(value)


def parse_param(key: str, raw: Any) -> Param:
    """One entry of ``params:`` (see the module's docstring); ``ConfigError`` names the key."""
    if isinstance(raw, Param):
        return raw
    if not (isinstance(raw, dict) and len(raw) == 1 and next(iter(raw)) in KINDS):
        if isinstance(raw, dict) and any(k in KINDS for k in raw):
            raise ConfigError(
                f"sweep params.{key}: write one of {', '.join(KINDS)} alone, got {raw!r}"
            )
        return Param(VALUE, (raw,))
    ((kind, arg),) = raw.items()
    if kind in (GRID, CHOICE):
        if not isinstance(arg, (list, tuple)) or not arg:
            raise ConfigError(f"sweep params.{key}: {kind} needs a non-empty list, got {arg!r}")
        return Param(kind, tuple(arg))
    if not isinstance(arg, (list, tuple)) or len(arg) != 2:
        raise ConfigError(f"sweep params.{key}: {kind} needs [low, high], got {arg!r}")
    low, high = (_number(key, v) for v in arg)
    if kind == RANDINT and not (low.is_integer() and high.is_integer()):
        raise ConfigError(f"sweep params.{key}: randint needs integer bounds, got {arg!r}")
    if kind == LOGUNIFORM and low <= 0:
        raise ConfigError(f"sweep params.{key}: loguniform needs 0 < low, got {arg!r}")
    if low > high:
        raise ConfigError(f"sweep params.{key}: {kind} needs low <= high, got {arg!r}")
    return Param(kind, (), low, high)


def parse_space(raw: Any) -> dict[str, Param]:
    """``params:`` of a spec: key -> ``Param``, in the spec's order."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"sweep params must be a mapping of config keys, got {raw!r}")
    space = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not key.strip():
            raise ConfigError(f"sweep params: a key must be a config key, got {key!r}")
        space[key] = parse_param(key, value)
    return space


def grid_points(space: dict[str, Param]) -> list[dict[str, Any]]:
    """Every combination of the grid keys' values (the first key varies slowest); one empty
    point when there is no grid key."""
    keys = [k for k, p in space.items() if p.kind == GRID]
    combos = itertools.product(*(space[k].values for k in keys))
    return [dict(zip(keys, combo, strict=True)) for combo in combos]


def fixed_values(space: dict[str, Param]) -> dict[str, Any]:
    """The keys every trial sets to the same value."""
    return {k: p.values[0] for k, p in space.items() if p.kind == VALUE}


def trial_points(space: dict[str, Param], num_samples: int) -> list[dict[str, Any]]:
    """The grid points of each trial in launch order: the whole grid ``num_samples`` times (as
    Tune repeats it); each trial draws its other keys when it starts."""
    points = grid_points(space)
    return [dict(point) for _ in range(num_samples) for point in points]


def suggest(trial: Any, key: str, param: Param) -> Any:
    """The value an Optuna ``trial`` draws for a drawn key. Choices go through JSON so that any
    plain value (a list of layer sizes) is one of Optuna's categories."""
    if param.kind == CHOICE:
        encoded = [json.dumps(v, sort_keys=True) for v in param.values]
        return json.loads(trial.suggest_categorical(key, encoded))
    if param.kind == RANDINT:
        return trial.suggest_int(key, int(param.low), int(param.high))
    return trial.suggest_float(key, param.low, param.high, log=param.kind == LOGUNIFORM)


def config_overrides(values: dict[str, Any]) -> list[str]:
    """``--set`` overrides of a trial's values, ``seed`` spread over ``SEED_KEYS``; each value
    written as JSON, which the config's YAML reading takes back unchanged."""
    overrides = []
    for key, value in values.items():
        for target in SEED_KEYS if key == SEED else (key,):
            overrides.append(f"{target}={json.dumps(value)}")
    return overrides


def example_overrides(space: dict[str, Param]) -> list[str]:
    """Overrides with one possible value of every key, to check the keys and their types."""
    return config_overrides({k: p.example() for k, p in space.items()})


def draw_values(trial: Any, space: dict[str, Param], point: dict[str, Any]) -> None:
    """Put the values an Optuna ``trial`` draws for each drawn key of ``space`` into ``point``
    (a trial's grid point)."""
    for key, param in space.items():
        if param.drawn:
            point[key] = suggest(trial, key, param)

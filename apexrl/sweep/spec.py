"""A sweep spec: the typed, frozen description of a sweep, read from YAML (``load_spec``) or made
in Python (``make_spec``). Command-line flags of ``apexrl sweep`` replace a few of its fields.

    config: configs/ppo_cartpole.yaml        # every trial's base config
    overrides: [env.num_envs=4]              # --set overrides of every trial
    params:                                  # the search space (apexrl.sweep.space)
      algo.lr: {grid: [0.001, 0.0003]}
      seed: {grid: [0, 1]}
    num_samples: 1                           # the grid this many times; drawn keys per trial
    stop: {env_steps: 20000, time_s: 120}    # a trial stops when any result.json key >= value
    metric: episode_return_mean              # what the final table sorts by
    mode: max
    actors: 1                                # each trial's processes
    max_concurrent: 2                        # trials at once (also bounded by the CPUs)
    cpus_per_trial: 1

An unknown key is an error that names the nearest valid one, as in a run's config.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from apexrl.config import ConfigError
from apexrl.sweep.space import Param, parse_space

SCHEDULERS = ("none", "asha", "median")
SEARCHES = ("random", "tpe")
MODES = ("max", "min")
# stop keys the learner itself judges (a clean stop: checkpoint, done: true); others the sweep
STOP_CONFIG_KEYS = {
    "env_steps": "run.stop_env_steps",
    "time_s": "run.stop_wall_s",
    "eval_return_mean": "run.stop_eval_return",
}


@dataclass(frozen=True)
class SchedulerSpec:
    """Early stopping of trials that fall behind (Optuna's pruners)."""

    # "none"; "asha": asynchronous successive halving, a trial goes on past each rung (grace,
    # grace x factor, grace x factor^2, ... env steps) only while its metric is in the top
    # 1/reduction_factor of the trials that reached that rung; "median": stopped when below the
    # median of the other trials at the same env steps
    kind: str = "none"
    grace_env_steps: int = 10_000  # env steps every trial runs before it can be stopped early
    reduction_factor: int = 3  # ASHA's eta


@dataclass(frozen=True)
class SweepSpec:
    """Everything a sweep needs; see the module's docstring for the YAML form."""

    config: str = ""  # base config file of every trial (a path from the current directory)
    overrides: tuple[str, ...] = ()  # "key=value" overrides of every trial, as --set
    params: dict[str, Param] = field(default_factory=dict)  # the search space
    num_samples: int = 1  # times the grid is run; each trial draws its own drawn keys
    stop: dict[str, float] = field(default_factory=dict)  # result.json key -> threshold (>=)
    metric: str = "episode_return_mean"  # result.json key the final table sorts by
    mode: str = "max"  # "max" or "min" of the metric is best
    actors: int = 1  # actor processes per trial
    learners: int = 1  # learner processes per trial
    evaluation: bool = True  # an evaluation actor per trial (eval_return_mean)
    max_concurrent: int = 0  # trials at once; 0: as many as the CPUs allow
    cpus: int = 0  # CPUs the sweep may use (the first of this process's); 0: all of them
    cpus_per_trial: int = 1  # CPUs each trial is pinned to
    gpus_per_trial: int = 0  # GPUs each trial gets (CUDA_VISIBLE_DEVICES); 0: left as is
    gpus: int = 0  # GPUs the sweep may use; 0: every visible one (when gpus_per_trial > 0)
    search: str = "random"  # Optuna sampler of the drawn keys: "random" or "tpe"
    seed: int = 0  # the sampler's seed
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    logdir: str = "runs/sweeps"  # parent of the sweep directory
    name: str = ""  # the sweep directory's name before its time; "": sweep-<algorithm>-<env>
    report_interval_s: float = 5.0  # seconds between live tables
    trial_timeout_s: float = 0.0  # wall seconds after which a trial is stopped; 0: no limit

    def validate(self) -> None:
        if not self.config:
            raise ConfigError("sweep config: the base config file is required")
        for key in ("num_samples", "actors", "learners", "cpus_per_trial"):
            if getattr(self, key) < 1:
                raise ConfigError(f"sweep {key} must be at least 1, got {getattr(self, key)}")
        for key in ("max_concurrent", "cpus", "gpus_per_trial", "gpus"):
            if getattr(self, key) < 0:
                raise ConfigError(f"sweep {key} must be >= 0, got {getattr(self, key)}")
        if self.mode not in MODES:
            raise ConfigError(f"sweep mode must be one of {MODES}, got {self.mode!r}")
        if self.search not in SEARCHES:
            raise ConfigError(f"sweep search must be one of {SEARCHES}, got {self.search!r}")
        if self.scheduler.kind not in SCHEDULERS:
            raise ConfigError(
                f"sweep scheduler.kind must be one of {SCHEDULERS}, got {self.scheduler.kind!r}"
            )
        if self.scheduler.grace_env_steps < 1 or self.scheduler.reduction_factor < 2:
            raise ConfigError(
                "sweep scheduler: grace_env_steps must be >= 1 and reduction_factor >= 2"
            )
        if self.scheduler.kind != "none" and not self.metric:
            raise ConfigError("sweep scheduler needs a metric to compare trials")
        for key, value in self.stop.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"sweep stop.{key} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ConfigError(f"sweep stop.{key} must be finite, got {value!r}")
        if self.report_interval_s <= 0 or self.trial_timeout_s < 0:
            raise ConfigError("sweep report_interval_s must be > 0 and trial_timeout_s >= 0")

    @property
    def drawn(self) -> bool:
        return any(p.drawn for p in self.params.values())


def _strict_build(cls: type, data: Any, where: str) -> dict[str, Any]:
    """``data``'s fields of dataclass ``cls`` with their types checked loosely (ints for floats,
    lists for tuples); an unknown key names the nearest valid one."""
    if not isinstance(data, dict):
        raise ConfigError(f"sweep {where or 'spec'} must be a mapping, got {data!r}")
    names = [f.name for f in dataclasses.fields(cls)]
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean '{where}{close[0]}'?" if close else ""
            raise ConfigError(f"unknown sweep key '{where}{key}'{hint}")
        kwargs[key] = _typed(value, hints[key], f"{where}{key}")
    return kwargs


def _typed(value: Any, hint: Any, path: str) -> Any:
    if hint is SchedulerSpec:
        return SchedulerSpec(**_strict_build(SchedulerSpec, value or {}, f"{path}."))
    if path == "params":
        return parse_space(value)
    origin = typing.get_origin(hint)
    if origin is tuple:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"sweep {path} must be a list of key=value strings, got {value!r}")
        return tuple(value)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"sweep {path} must be a mapping, got {value!r}")
        return {str(k): _number(v, f"{path}.{k}") for k, v in value.items()}
    if hint is float:
        return _number(value, path)
    expected = hint if isinstance(hint, type) else str
    if expected is int and isinstance(value, bool) or not isinstance(value, expected):
        raise ConfigError(f"sweep {path} must be {expected.__name__}, got {value!r}")
    return value


def _number(value: Any, path: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"sweep {path} must be a number, got {value!r}")
    return float(value)


def make_spec(data: dict[str, Any]) -> SweepSpec:
    """A validated spec from a mapping (a parsed YAML file, or Python values: ``params`` may
    hold ``apexrl.sweep.grid(...)`` and the like)."""
    spec = SweepSpec(**_strict_build(SweepSpec, data, ""))
    spec.validate()
    return spec


def load_spec(path: str | Path, changes: dict[str, Any] | None = None) -> SweepSpec:
    """The spec in a YAML file, with ``changes`` (field -> value, from flags) applied."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep spec {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return make_spec({**data, **(changes or {})})


def spec_to_dict(spec: SweepSpec) -> dict[str, Any]:
    """A plain mapping of ``spec`` that ``make_spec`` reads back (``sweep.yaml`` of a sweep)."""

    def param(p: Param) -> Any:
        if p.kind == "value":
            return p.values[0]
        if p.values:
            return {p.kind: list(p.values)}
        return {p.kind: [p.low, p.high]}

    data = dataclasses.asdict(spec)
    data["overrides"] = list(spec.overrides)
    data["params"] = {k: param(p) for k, p in spec.params.items()}
    return data

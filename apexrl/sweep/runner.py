"""``run_sweep``: a sweep's trials run side by side, each an ``apexrl local`` run, until each
meets its stop condition, is pruned, or fails.

The sweep directory (``<logdir>/<name>-<time>/``) holds ``sweep.yaml`` (the resolved spec), one
ordinary run directory per trial (``trial_000/`` ...), each trial launcher's console
(``logs/trial_000.log``), ``trials.json`` (every trial's values, state and last record, best
first; rewritten as the sweep goes) and, at the end, ``curves.png`` (the metric of every trial
against env steps).

Resources: the CPUs the sweep may use (``cpus``, of this process's) are cut into slots of
``cpus_per_trial``; a trial holds one slot (its processes are pinned to those CPUs) and, with
``gpus_per_trial``, one slot of GPUs (``CUDA_VISIBLE_DEVICES``). At most ``max_concurrent`` run at
once. Searching and pruning are Optuna's: one in-memory study, asked for a trial as each trial
starts (its drawn values) and told each trial's end; the metric of each new record is reported
at the trial's env steps, and the pruner (successive halving, or the median rule) decides
whether the trial goes on.

Every process is stopped when the sweep ends, however it ends: a stop event (the command's
Ctrl-C), ``KeyboardInterrupt`` or any exception stops every trial's launcher (SIGTERM, then
SIGKILL) before the final table is printed and the error goes on.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from apexrl import tracking
from apexrl.config import Config, ConfigError, load_config
from apexrl.runtime import lifecycle
from apexrl.sweep import report
from apexrl.sweep.loop import Sweep
from apexrl.sweep.space import (
    config_overrides,
    example_overrides,
    fixed_values,
    trial_points,
)
from apexrl.sweep.spec import STOP_CONFIG_KEYS, SweepSpec, load_spec, make_spec, spec_to_dict
from apexrl.sweep.trials import PRUNED, TERMINATED, Trial

log = logging.getLogger(__name__)

POLL_S = 0.5  # seconds between looks at the trials


@dataclass
class SweepResult:
    """What a sweep leaves: its directory, its trials (best first) and the best one."""

    sweep_dir: Path
    trials: list[Trial]
    best: Trial | None
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        """Every trial met its stop condition or was pruned."""
        return not self.interrupted and all(t.state in (TERMINATED, PRUNED) for t in self.trials)


@dataclass
class Slots:
    """The CPU (and GPU) sets trials run on; a free slot is ``None`` in ``holders``."""

    cpus: list[tuple[int, ...]]
    gpus: list[tuple[int, ...]]
    holders: list[Trial | None]

    def take(self, trial: Trial) -> int | None:
        for i, holder in enumerate(self.holders):
            if holder is None:
                self.holders[i] = trial
                return i
        return None

    def release(self, trial: Trial) -> None:
        self.holders = [None if h is trial else h for h in self.holders]


def split(ids: list[int], per_slot: int) -> list[tuple[int, ...]]:
    """``ids`` cut into slots of ``per_slot`` (what is left over is not used)."""
    return [tuple(ids[i : i + per_slot]) for i in range(0, len(ids) - per_slot + 1, per_slot)]


def plan_slots(spec: SweepSpec, available_cpus: list[int], num_gpus: int) -> Slots:
    """The slots of a sweep: CPU sets of ``cpus_per_trial`` (GPU sets of ``gpus_per_trial``), as
    many as fit and ``max_concurrent`` allows. ``ConfigError`` when not even one fits."""
    cpus = available_cpus[: spec.cpus] if spec.cpus else available_cpus
    if spec.cpus > len(available_cpus):
        raise ConfigError(f"sweep cpus {spec.cpus}: this process may use {len(available_cpus)}")
    cpu_slots = split(cpus, spec.cpus_per_trial)
    if not cpu_slots:
        raise ConfigError(
            f"sweep cpus_per_trial {spec.cpus_per_trial} > the {len(cpus)} CPUs of the sweep"
        )
    gpu_slots: list[tuple[int, ...]] = []
    if spec.gpus_per_trial:
        gpu_ids = list(range(spec.gpus or num_gpus))
        gpu_slots = split(gpu_ids, spec.gpus_per_trial)
        if not gpu_slots:
            raise ConfigError(
                f"sweep gpus_per_trial {spec.gpus_per_trial} > the {len(gpu_ids)} GPUs available"
            )
    count = len(cpu_slots) if not gpu_slots else min(len(cpu_slots), len(gpu_slots))
    if spec.max_concurrent:
        count = min(count, spec.max_concurrent)
    return Slots(cpu_slots[:count], gpu_slots[:count], [None] * count)


def stop_overrides(stop: dict[str, float]) -> list[str]:
    """The stop conditions the learner judges itself, as config overrides (a clean stop)."""
    overrides = []
    for key, value in stop.items():
        if key in STOP_CONFIG_KEYS:
            written = int(value) if key == "env_steps" else value
            overrides.append(f"{STOP_CONFIG_KEYS[key]}={written}")
    return overrides


def base_overrides(spec: SweepSpec, base: Config | None = None) -> list[str]:
    """Every trial's overrides before its own values: the spec's, the fixed keys, the stops."""
    overrides = [*spec.overrides, *config_overrides(fixed_values(spec.params))]
    if spec.gpus_per_trial and base is not None and base.learner.device == "cpu":
        overrides.append("learner.device=cuda")  # the GPUs a trial holds are used
    return overrides + stop_overrides(spec.stop)


def check_spec(spec: SweepSpec) -> Config:
    """Every grid point's config, and one with an example of each drawn key, loads and checks
    (an unknown key names the nearest one); the base config with the spec's overrides."""
    base = load_config(spec.config, base_overrides(spec))
    drawn_examples = example_overrides({k: p for k, p in spec.params.items() if p.drawn})
    for point in trial_points(spec.params, 1):
        load_config(spec.config, [*base_overrides(spec), *config_overrides(point), *drawn_examples])
    return base


def as_spec(spec: SweepSpec | str | Path | dict[str, Any]) -> SweepSpec:
    if isinstance(spec, SweepSpec):
        spec.validate()
        return spec
    if isinstance(spec, dict):
        return make_spec(spec)
    return load_spec(spec)


def make_study(spec: SweepSpec) -> Any:
    """An in-memory Optuna study: the spec's sampler (with its seed) and pruner."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep's table says it all
    if spec.search == "tpe":
        sampler = optuna.samplers.TPESampler(seed=spec.seed)
    else:
        sampler = optuna.samplers.RandomSampler(seed=spec.seed)
    sched = spec.scheduler
    if sched.kind == "asha":
        pruner = optuna.pruners.SuccessiveHalvingPruner(
            min_resource=sched.grace_env_steps, reduction_factor=sched.reduction_factor
        )
    elif sched.kind == "median":
        pruner = optuna.pruners.MedianPruner(
            n_startup_trials=1, n_warmup_steps=sched.grace_env_steps
        )
    else:
        pruner = optuna.pruners.NopPruner()
    direction = "maximize" if spec.mode == "max" else "minimize"
    return optuna.create_study(direction=direction, sampler=sampler, pruner=pruner)


def sweep_path(spec: SweepSpec, base: Config, sweep_dir: str | Path | None) -> Path:
    """The sweep's directory: as given, else ``<logdir>/<name>-<time>``."""
    if sweep_dir is not None:
        return Path(sweep_dir)
    name = spec.name or f"sweep-{base.run_name}"
    return Path(spec.logdir) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def make_sweep_dir(spec: SweepSpec, base: Config, sweep_dir: str | Path | None) -> Path:
    """The sweep's directory (made; an existing one must be empty) with ``sweep.yaml``."""
    path = sweep_path(spec, base, sweep_dir)
    if path.exists() and any(path.iterdir()):
        raise ConfigError(f"the sweep directory {path} is not empty")
    (path / "logs").mkdir(parents=True, exist_ok=True)
    (path / "sweep.yaml").write_text(yaml.safe_dump(spec_to_dict(spec), sort_keys=False))
    return path


def visible_gpus(spec: SweepSpec) -> int:
    if not spec.gpus_per_trial or spec.gpus:
        return spec.gpus
    import torch

    return torch.cuda.device_count()


def available_cpus() -> list[int]:
    """The CPUs this process may run on, in order."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def run_sweep(
    spec: SweepSpec | str | Path | dict[str, Any],
    *,
    sweep_dir: str | Path | None = None,
    stop: threading.Event | None = None,
    out: TextIO | None = None,
) -> SweepResult:
    """Run a sweep to its end and return its trials, best first.

    Args:
        spec: a ``SweepSpec``, the path of a YAML spec, or a mapping of its fields (``params``
            may hold ``apexrl.sweep.grid([...])``, ``loguniform(lo, hi)`` and the like).
        sweep_dir: the sweep's directory (default ``<logdir>/<name>-<time>``); must be empty.
        stop: an event that ends the sweep early when set (every trial is stopped).
        out: where the live and final tables go (default stdout; redrawn in place on a TTY).

    Raises ``ConfigError`` (nothing started) when the spec, the base config or a trial's keys
    are wrong. ``KeyboardInterrupt`` and any other exception stop every trial first.
    """
    spec = as_spec(spec)
    base = check_spec(spec)
    slots = plan_slots(spec, available_cpus(), visible_gpus(spec))
    study = make_study(spec)
    tracking.check_installed(base.run.trackers)
    path = make_sweep_dir(spec, base, sweep_dir)
    overrides = base_overrides(spec, base) + tracking.open_group(base.run, path.name)
    sweep = Sweep(spec, path, overrides, slots, study, out or sys.stdout)
    stop = stop or threading.Event()
    ending = "the sweep ended before the trial"
    try:
        while sweep.step():
            if lifecycle.wait_for_stop(stop, POLL_S):
                ending = "the sweep was stopped"
                break
    except BaseException as exc:
        ending = f"the sweep was stopped ({type(exc).__name__})"
        raise
    finally:
        sweep.close(ending)
        tracking.close_group(base.run, path.name)
    ranked = report.sort_trials(sweep.trials, spec.metric, spec.mode)
    best = ranked[0] if ranked and ranked[0].metric(spec.metric) is not None else None
    return SweepResult(path, ranked, best, interrupted=stop.is_set())

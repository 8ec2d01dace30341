"""Hyperparameter sweeps: many ordinary runs of one config with different values, side by side.

    apexrl sweep configs/sweeps/ppo_cartpole_lr.yaml [--max-concurrent 2] [--cpus-per-trial 1]

or from Python::

    from apexrl.sweep import grid, loguniform, run_sweep

    result = run_sweep({
        "config": "configs/ppo_cartpole.yaml",
        "params": {"algo.lr": grid([1e-3, 3e-4]), "seed": grid([0, 1])},
        "stop": {"env_steps": 20_000},
        "max_concurrent": 2,
    })
    print(result.best.values, result.best.run_dir)

Parts: ``spec`` (the typed spec, from YAML or a mapping), ``space`` (the search space: grid keys
expanded here, drawn keys asked of Optuna), ``trials`` (one trial: its ``apexrl local`` process,
its records, stopping it), ``loop`` (the watch over the trials: start, stop conditions, pruning,
the live table), ``report`` (tables, ``trials.json``, ``curves.png``), ``runner``
(``run_sweep``: resources, the study, the sweep directory), ``command`` (``apexrl sweep``).
"""

from __future__ import annotations

from apexrl.sweep.runner import SweepResult, run_sweep
from apexrl.sweep.space import Param, choice, grid, loguniform, randint, uniform
from apexrl.sweep.spec import SchedulerSpec, SweepSpec, load_spec, make_spec

__all__ = [
    "Param",
    "SchedulerSpec",
    "SweepResult",
    "SweepSpec",
    "choice",
    "grid",
    "load_spec",
    "loguniform",
    "make_spec",
    "randint",
    "run_sweep",
    "uniform",
]

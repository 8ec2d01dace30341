"""What the launchers that place a run on other nodes share (``apexrl slurm``, ``apexrl ray``):
the run directory, keys, evaluation and resume flags, the config a run starts from, its run and
keys directories on a filesystem every node shares, and the source tree to put on the nodes'
``PYTHONPATH`` when apexrl runs from a checkout."""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import apexrl
from apexrl import tracking
from apexrl.config import Config, add_overrides_argument, load_config
from apexrl.runtime import rundir


def add_config_and_role_flags(parser: argparse.ArgumentParser) -> None:
    """``--config``, ``--set``, ``--actors`` and ``--learners``."""
    parser.add_argument(
        "--config", help="YAML config file (with --resume: default the run's own config.yaml)"
    )
    add_overrides_argument(parser)
    parser.add_argument("--actors", type=int, default=4, help="number of actors (default 4)")
    parser.add_argument("--learners", type=int, default=1, help="number of learners (default 1)")


def add_run_flags(parser: argparse.ArgumentParser, resume_after: str) -> None:
    """``--run-dir``, ``--keys``, ``--no-eval`` and ``--resume`` (``resume_after``: when a run
    is resumed, e.g. "after a time limit or scancel")."""
    parser.add_argument(
        "--run-dir",
        help="run directory on a filesystem every node shares (default "
        "runs/<algorithm>-<env>-<time> under the current directory)",
    )
    parser.add_argument(
        "--keys", metavar="DIR", help="the run's CURVE keys (default: new keys in <run dir>/keys)"
    )
    parser.add_argument("--no-eval", action="store_true", help="no evaluation actor")
    tracking.add_track_flag(parser)
    parser.add_argument(
        "--resume",
        action="store_true",
        help=f"continue the run in --run-dir from its checkpoint ({resume_after}), with its "
        "keys and its own config.yaml unless --config is given",
    )


def check_at_least(counts: tuple[tuple[str, float, float], ...], error: type[Exception]) -> None:
    """Each ``(flag, value, least)``: ``error`` naming the first flag whose value is below its
    least."""
    for flag, value, least in counts:
        if value < least:
            raise error(f"{flag} must be at least {least}, got {value}")


def run_config(
    args: argparse.Namespace, overrides: list[str], error: type[Exception]
) -> tuple[Config, Path, Path]:
    """The run's config (``--config``, or a resumed run's own ``config.yaml``, with
    ``overrides`` then the user's ``--set``), its absolute run directory (``--run-dir``,
    ``run.dir`` or ``runs/<algorithm>-<env>-<time>``) and keys directory (``--keys`` or
    ``<run dir>/keys``), both set in the config; with ``--gpus-per-learner``, a ``cpu`` learner
    device becomes ``cuda``. Raises ``error`` with one line, or ``ConfigError``."""
    config_path = args.config
    if args.resume:
        if not args.run_dir:
            raise error("--resume needs --run-dir, the directory of the run to continue")
        config_path = config_path or str(rundir.config_path(args.run_dir))
    elif not config_path:
        raise error("--config is required (or --resume --run-dir DIR to continue a run)")
    cfg = load_config(config_path, [*overrides, *args.overrides])
    cfg = tracking.with_trackers(cfg, getattr(args, "track", []))
    if args.run_dir:
        run_dir = Path(args.run_dir)
    elif cfg.run.dir:
        run_dir = Path(cfg.run.dir)
    else:
        run_dir = Path("runs") / f"{cfg.run_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = run_dir.absolute()
    keys_dir = Path(args.keys).absolute() if args.keys else rundir.keys_dir(run_dir)
    learner = cfg.learner
    if args.gpus_per_learner and learner.device == "cpu":  # the GPUs asked for are used
        learner = dataclasses.replace(learner, device="cuda")
    cfg = dataclasses.replace(
        cfg,
        learner=learner,
        run=dataclasses.replace(cfg.run, dir=str(run_dir)),
        net=dataclasses.replace(cfg.net, keys_dir=str(keys_dir)),
    )
    return cfg, run_dir, keys_dir


def source_root() -> str:
    """The directory to put on the nodes' PYTHONPATH when apexrl runs from a checkout (as with
    ``pip install -e``); empty when it is installed into site-packages."""
    package = Path(apexrl.__file__).resolve().parent
    root = package.parent
    return str(root) if (root / "pyproject.toml").is_file() else ""

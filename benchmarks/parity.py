"""What the per-env-step comparisons with stable-baselines3 share (``pong_parity.py``,
``sac_parity.py``): an apexrl run to a list of env-step marks with the first checkpoint at or
past each kept, a stable-baselines3 script run in its own process, each system's rows saved per
seed, and a report of each mark's greedy score over the seeds a workdir holds."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pong_hour
import pong_runs

SAFETY_S = 6 * 3600.0  # run.stop_wall_s of a run that its env steps end

# stable-baselines3's callback that saves the model as it passes each of ``marks`` (env steps)
# as ``<workdir>/sb3_mark<i>_seed<seed>.zip`` and ends training after the last, in the child
# scripts; they define ``marks``, ``workdir`` and ``seed`` before it
SB3_ENV_STEP_MARKS = textwrap.dedent(
    """
    from stable_baselines3.common.callbacks import BaseCallback

    class Marks(BaseCallback):
        def _on_training_start(self):
            self.saved = []
        def _on_step(self):
            while len(self.saved) < len(marks) and self.num_timesteps >= marks[len(self.saved)]:
                path = f"{workdir}/sb3_mark{len(self.saved)}_seed{seed}.zip"
                self.model.save(path)
                self.saved.append((self.num_timesteps, path))
            return len(self.saved) < len(marks)
    """
)


def parser(description: str, marks: list[float], episodes: str) -> argparse.ArgumentParser:
    """The options both comparisons take; ``episodes`` names the greedy episodes' option."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--marks", type=float, nargs="+", default=marks)
    parser.add_argument(
        "--systems", nargs="+", choices=["apexrl", "sb3"], default=["apexrl", "sb3"]
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(f"--{episodes}", type=int, default=10, dest="episodes")
    parser.add_argument(
        "--sb3-python", default=sys.executable, help="a Python with stable-baselines3"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="kept (default: a new temp dir)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override of apexrl's config (repeatable)",
    )
    parser.add_argument("--report", action="store_true", help="only print what --workdir holds")
    return parser


def run_systems(
    args: argparse.Namespace,
    marks: list[int],
    workdir: Path,
    what: str,
    run_system: Callable[[str], list[dict]],
) -> None:
    """``run_system(system)`` for each of ``--systems`` in turn, its rows saved as it ends."""
    for system in args.systems:
        print(
            f"{time.strftime('%H:%M:%S')} {system} seed {args.seed}: {what} to {marks[-1]:,} "
            f"env steps in {workdir}, load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        started = time.monotonic()
        rows = run_system(system)
        save_rows(workdir, system, args.seed, marks, rows, time.monotonic() - started)
    print(f"{time.strftime('%H:%M:%S')} done, load average {os.getloadavg()[0]:.1f}")


def run_apexrl_to_marks(
    config: str,
    marks: list[int],
    seed: int,
    workdir: Path,
    overrides: list[str],
    episodes: int,
) -> list[dict]:
    """``scripts/launch_local.sh --actors 2 --learners 1 --no-eval --config
    configs/<config>.yaml`` with ``overrides`` (which end the run at the last mark and set how
    often it checkpoints) in ``workdir/apexrl_seed<seed>``: the first checkpoint at or past each
    of ``marks`` (env steps) is copied as it appears, the one written as the run ended is the
    last mark's, and after the run each plays ``episodes`` greedy episodes (``apexrl
    evaluate``). A row per mark: env_steps (trained on), wall_s, returns."""
    saved: list[tuple[int, float, Path]] = []
    seen = {"mtime": 0.0}
    start = time.monotonic()

    def keep_checkpoint_past_mark(run_dir: Path, last: bool = False) -> None:
        checkpoint = run_dir / "checkpoint.pt"
        if len(saved) >= len(marks) or not checkpoint.exists():
            return
        mtime = checkpoint.stat().st_mtime
        if mtime == seen["mtime"]:
            return
        seen["mtime"] = mtime
        copy = workdir / f"apexrl_mark{len(saved)}_seed{seed}.pt"
        shutil.copyfile(checkpoint, copy)  # the learner replaces the file whole: a copy is one
        steps = pong_hour.checkpoint_env_steps(copy)
        if steps >= marks[len(saved)] or last:
            saved.append((steps, time.monotonic() - start, copy))

    name = f"apexrl_seed{seed}"
    code, run_dir, _ = pong_runs.launch(
        config,
        2,
        SAFETY_S,
        workdir,
        tuple(overrides),
        name=name,
        flags=("--no-eval",),
        watch=keep_checkpoint_past_mark,
    )
    if code != 0:
        raise RuntimeError(f"the launcher failed (exit {code}): see {workdir / (name + '.log')}")
    # The checkpoint written as the run ended is the last mark's: the run stopped there
    # (run.stop_env_steps counts the actors' steps; the checkpoint, those trained on)
    if len(saved) == len(marks) - 1:
        seen["mtime"] = 0.0
        keep_checkpoint_past_mark(run_dir, last=True)
    if len(saved) < len(marks):
        raise RuntimeError(f"the run ended before {marks[len(saved)]:,} env steps: see {run_dir}")
    return [
        {
            "env_steps": steps,
            "wall_s": wall,
            "returns": pong_hour.play_checkpoint(path, run_dir, episodes),
        }
        for steps, wall, path in saved
    ]


def run_sb3_script(
    python: str, script: str, args: list[str], workdir: Path, name: str
) -> list[dict]:
    """``script`` (its source) run by ``python`` with ``args``; its last line of output is
    ``{"rows": [...]}``; its stderr goes to ``workdir/<name>.log``."""
    path = workdir / f"{name}.py"
    path.write_text(script)
    with open(workdir / f"{name}.log", "w") as log:
        out = subprocess.run(
            [python, str(path), *args],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            timeout=SAFETY_S,
            check=False,
        )
    if out.returncode != 0:
        raise RuntimeError(f"stable-baselines3 failed (exit {out.returncode}): see {log.name}")
    return json.loads(out.stdout.strip().splitlines()[-1])["rows"]


def save_rows(workdir: Path, system: str, seed: int, marks: list[int], rows, wall_s) -> None:
    result = {"marks": marks, "rows": rows, "wall_s": wall_s}
    (workdir / f"{system}_seed{seed}.json").write_text(json.dumps(result))


def report(workdir: Path, names: dict[str, str], fmt: str = "+.1f") -> None:
    """Each mark's greedy return per system (``names``: system -> label): the mean over the
    seeds ``workdir`` holds, then each seed's env steps and mean ± std."""
    import numpy as np

    header = f"{'system':<30} {'mark':>9} {'seeds':>5} {'mean':>8}"
    print(f"{header}  per seed (env steps: mean ± std)")
    for system, name in names.items():
        files = sorted(workdir.glob(f"{system}_seed*.json"))
        if not files:
            continue
        runs = {int(p.stem.rsplit("seed", 1)[1]): json.loads(p.read_text()) for p in files}
        marks = next(iter(runs.values()))["marks"]
        for i, mark in enumerate(marks):
            cells, means = [], []
            for seed, run in sorted(runs.items()):
                if i < len(run["rows"]):
                    row = run["rows"][i]
                    r = np.asarray(row["returns"])
                    means.append(r.mean())
                    cells.append(
                        f"seed {seed} ({row['env_steps']:,}: {r.mean():{fmt}} ± {r.std():.1f})"
                    )
            mean = format(float(np.mean(means)), fmt)
            print(f"{name:<30} {mark:9,d} {len(means):5d} {mean:>8}  " + ", ".join(cells))

"""Each family's Pong config, started with the launcher a user runs, streaming and training for
``--seconds`` (5 minutes by default); prints its env frames/s beside the raw env's rate measured in
the same run.

For each config, first the raw rate: the envs its actors step (``apexrl.envs.make_vector_env``:
ale-py's vector env, the config's ``env.num_envs`` per actor, ``--actors`` of them stepped one after
the other in this process) with random actions and no inference, for ``--raw-seconds``. Then
``scripts/launch_local.sh --actors N --learners 1 --config configs/<family>_pong.yaml`` with
``run.stop_wall_s`` set to ``--seconds``: the run must end by itself (exit 0, its stop condition
met) and its ``result.json`` gives the frames (4 per env step), learner updates and the training
return (raw game score) at its end. frames/s is taken over the run's last half, after start-up and
the replay's warm-up, and so is ``wait``, the learner's data wait fraction (the share of its time
spent waiting for batches).

    python benchmarks/pong_runs.py [--configs ppo_pong impala_pong apex_dqn_pong r2d2_pong]
        [--seconds 300] [--actors 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from apexrl.config import load_config  # noqa: E402
from apexrl.envs import make_vector_env, step_vector  # noqa: E402
from apexrl.envs.atari import frames_per_step  # noqa: E402

CONFIGS = ["ppo_pong", "impala_pong", "apex_dqn_pong", "r2d2_pong"]


def raw_frames_per_s(config: str, actors: int, seconds: float) -> float:
    """Frames/s of ``actors`` vector envs of the config, stepped in turn with random actions."""
    cfg = load_config(REPO / "configs" / f"{config}.yaml")
    envs = [make_vector_env(cfg.env, cfg.env.num_envs) for _ in range(actors)]
    rng = np.random.default_rng(0)
    for i, e in enumerate(envs):
        e.reset(seed=i)
    n, steps = int(envs[0].single_action_space.n), 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        for e in envs:
            step_vector(e, rng.integers(0, n, cfg.env.num_envs))
            steps += cfg.env.num_envs
    rate = steps * frames_per_step(cfg.env) / (time.monotonic() - start)
    for e in envs:
        e.close()
    return rate


def launch(
    config: str,
    actors: int,
    seconds: float,
    workdir: Path,
    overrides: tuple[str, ...] = (),
    name: str | None = None,
    flags: tuple[str, ...] = (),
    watch=None,
) -> tuple[int, Path, float]:
    """The launcher to its end, with ``--set`` ``overrides`` and launcher ``flags``, in
    ``workdir/<name>`` (the config's name by default), calling ``watch(run_dir)`` every second
    meanwhile where given; (exit code, run directory, wall seconds)."""
    name = name or config
    run_dir = workdir / name
    # SIGTERM to the benchmark unwinds through the finally below, which stops the launcher.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.monotonic()
    extra = [arg for override in overrides for arg in ("--set", override)]
    with open(workdir / f"{name}.log", "wb") as log:
        proc = subprocess.Popen(
            [
                "bash",
                str(REPO / "scripts" / "launch_local.sh"),
                "--actors",
                str(actors),
                "--learners",
                "1",
                "--config",
                str(REPO / "configs" / f"{config}.yaml"),
                "--run-dir",
                str(run_dir),
                "--set",
                f"run.stop_wall_s={seconds}",
                *extra,
                *flags,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHON": sys.executable},
        )
        try:
            deadline = time.monotonic() + seconds + 300
            while proc.poll() is None and watch is not None and time.monotonic() < deadline:
                watch(run_dir)
                time.sleep(1.0)
            code = proc.wait(timeout=max(deadline - time.monotonic(), 1.0))
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait()
    return code, run_dir, time.monotonic() - started


def second_half(run_dir: Path) -> tuple[list[dict], float]:
    """The ``result.json`` records of the run's second half (by learner time) and their span in
    seconds."""
    records = [json.loads(line) for line in (run_dir / "result.json").read_text().splitlines()]
    last = records[-1]
    half = [r for r in records if r["time_s"] >= last["time_s"] / 2] or records
    return half, max(last["time_s"] - half[0]["time_s"], 1e-9)


def summary(run_dir: Path) -> dict:
    half, span = second_half(run_dir)
    first, last = half[0], half[-1]
    return {
        "frames": last["frames"],
        "frames_per_s": (last["frames"] - first["frames"]) / span,
        "updates": last["learner_updates"],
        "return": last["episode_return_mean"],
        "done": last["done"],
        # the learner's share of time spent waiting for batches, mean over the last half
        "data_wait": float(np.mean([r["data_wait_fraction"] for r in half])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=CONFIGS)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--raw-seconds", type=float, default=10.0)
    parser.add_argument("--actors", type=int, default=2)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="pong_runs_") as tmp:
        for config in args.configs:
            raw = raw_frames_per_s(config, args.actors, args.raw_seconds)
            code, run_dir, wall = launch(config, args.actors, args.seconds, Path(tmp))
            result = summary(run_dir) if (run_dir / "result.json").exists() else None
            rows.append((config, raw, code, wall, result))
            if code != 0 or result is None or not result["done"]:
                print((Path(tmp) / f"{config}.log").read_text()[-3000:])
    print(
        f"\n{args.actors} actors, 1 learner, {args.seconds:.0f} s per run; frames = 4 x env steps"
    )
    print(
        f"{'config':<15} {'raw frames/s':>12} {'run frames/s':>12} {'ratio':>6} "
        f"{'frames':>9} {'updates':>8} {'wait':>5} {'return':>7} {'exit':>4}"
    )
    for config, raw, code, _wall, r in rows:
        if r is None:
            print(f"{config:<15} {raw:12.0f} {'no result.json':>12} exit {code}")
            continue
        ret = "n/a" if r["return"] is None else f"{r['return']:.1f}"
        print(
            f"{config:<15} {raw:12.0f} {r['frames_per_s']:12.0f} {r['frames_per_s'] / raw:6.2f} "
            f"{r['frames']:9d} {r['updates']:8d} {r['data_wait']:5.2f} {ret:>7} {code:4d}"
        )


if __name__ == "__main__":
    main()

"""SAC on a MuJoCo env: apexrl against stable-baselines3 for the same wall time on this machine.

Each system trains from a clean start for ``--minutes`` (30) of wall time, one after the other,
nothing else running, on gymnasium's ``HalfCheetah-v5`` (``--env``). Every ``--every`` minutes
(3) a system's weights are saved; after its run each saved policy plays ``--episodes`` (5) whole
episodes greedily (the policy's mean action) and the returns are printed with the wall time and
the env steps it had trained on, as two curves: return against wall time, return against env
steps.

- apexrl: ``scripts/launch_local.sh --actors 2 --learners 1 --config configs/sac_halfcheetah.yaml``
  with ``run.stop_wall_s`` set to the time; at each mark the learner's last ``checkpoint.pt`` is
  copied and played by ``apexrl evaluate``.
- stable-baselines3 SAC with the rl-baselines3-zoo's HalfCheetah settings (``MlpPolicy``,
  ``learning_starts`` 10,000, otherwise SB3's defaults, the paper's: lr 3e-4, batch 256, one
  gradient step per env step, buffer 1 M, tau 0.005, the temperature learned), one env, in its
  own process (``--sb3-python``; ``pip install -e ".[bench]"``); at each mark ``model.save``, each
  saved model plays with ``deterministic=True``.

Each system's rows go to ``<workdir>/<system>.json`` when it is done; ``--report`` prints and
plots what a workdir holds.

    python benchmarks/mujoco_vs_sb3.py [--minutes 30] [--every 3] [--env HalfCheetah-v5]
        [--systems apexrl sb3] [--workdir DIR] [--plot FILE] [--report]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from pong_hour import checkpoint_env_steps, play_checkpoint, run_with_marks

CONFIGS = {"HalfCheetah-v5": "sac_halfcheetah", "Hopper-v5": "sac_hopper"}

SB3_RUN = textwrap.dedent(
    """
    import json, sys, time
    import gymnasium as gym
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.logger import Logger

    env_id, seconds, every, episodes, workdir = sys.argv[1:6]
    seconds, every, episodes = float(seconds), float(every), int(episodes)
    marks = [every * (i + 1) for i in range(int(seconds // every))]
    model = SAC("MlpPolicy", gym.make(env_id), learning_starts=10_000, seed=0)
    # A logger that writes nowhere: SB3's default makes a /tmp/SB3-<time> folder per learn().
    model.set_logger(Logger(folder=None, output_formats=[]))

    class Marks(BaseCallback):
        def _on_training_start(self):
            self.start, self.saved = time.monotonic(), []
        def _on_step(self):
            now = time.monotonic() - self.start
            while len(self.saved) < len(marks) and now >= marks[len(self.saved)]:
                path = f"{workdir}/sb3_{len(self.saved)}.zip"
                self.model.save(path)
                self.saved.append((now, self.num_timesteps, path))
            return len(self.saved) < len(marks)

    clock = Marks()
    model.learn(total_timesteps=10_000_000, callback=clock)
    rows = []
    for wall, steps, path in clock.saved:
        returns, _ = evaluate_policy(SAC.load(path), gym.make(env_id), n_eval_episodes=episodes,
                                     deterministic=True, return_episode_rewards=True)
        rows.append({"wall_s": wall, "env_steps": steps, "returns": [float(r) for r in returns]})
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"rows": rows}))
    """
)


def run_sb3(
    python: str, env_id: str, seconds: float, every: float, episodes: int, workdir: Path
) -> list[dict]:
    script = workdir / "sb3_sac.py"
    script.write_text(SB3_RUN)
    args = [env_id, str(seconds), str(every), str(episodes), str(workdir)]
    with open(workdir / "sb3.log", "w") as log:
        out = subprocess.run(
            [python, str(script), *args],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            timeout=seconds + 3600,
            check=False,
        )
    if out.returncode != 0:
        raise RuntimeError(f"stable-baselines3 failed (exit {out.returncode}): see {log.name}")
    return json.loads(out.stdout.strip().splitlines()[-1])["rows"]


def run_apexrl(
    config: str, seconds: float, every: float, episodes: int, workdir: Path, overrides: list[str]
) -> list[dict]:
    marks = [every * (i + 1) for i in range(int(seconds // every))]
    saved, run_dir = run_with_marks(config, seconds, marks, workdir, overrides)
    return [
        {
            "wall_s": at,
            "env_steps": checkpoint_env_steps(path),
            "returns": play_checkpoint(path, run_dir, episodes),
        }
        for at, path in saved
    ]


def report(workdir: Path, plot: Path | None, env_id: str) -> None:
    import numpy as np

    results = {}
    for system in ("apexrl", "sb3"):
        if (workdir / f"{system}.json").exists():
            saved = json.loads((workdir / f"{system}.json").read_text())
            results[saved["name"]] = saved["rows"]
    print(f"{'system':<28} {'minute':>6} {'env steps':>10} {'greedy return, mean ± std':>26}")
    for name, rows in results.items():
        for row in rows:
            r = np.asarray(row["returns"])
            print(
                f"{name:<28} {row['wall_s'] / 60:6.1f} {row['env_steps']:10d} "
                f"{r.mean():17.0f} ± {r.std():6.0f}"
            )
    if plot is None or not results:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for name, rows in results.items():
        means = [float(np.mean(r["returns"])) for r in rows]
        axes[0].plot([r["wall_s"] / 60 for r in rows], means, marker="o", label=name)
        axes[1].plot([r["env_steps"] for r in rows], means, marker="o", label=name)
    axes[0].set_xlabel("wall time, minutes (learner included)")
    axes[1].set_xlabel("env steps")
    axes[0].set_ylabel("greedy return of whole episodes, mean")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"SAC on {env_id}, 2 CPU cores")
    fig.tight_layout()
    fig.savefig(plot, dpi=80)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=3.0, help="minutes between saved policies")
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--env", default="HalfCheetah-v5", choices=sorted(CONFIGS))
    parser.add_argument(
        "--systems", nargs="+", choices=["apexrl", "sb3"], default=["apexrl", "sb3"]
    )
    parser.add_argument("--sb3-python", default=sys.executable)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="mujoco_vs_sb3_"))
    workdir.mkdir(parents=True, exist_ok=True)
    if not args.report:
        seconds, every = args.minutes * 60, args.every * 60
        for system in args.systems:
            print(
                f"{time.strftime('%H:%M:%S')} {system}: {args.minutes:g} min of {args.env} in "
                f"{workdir}, load average {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            if system == "apexrl":
                config = CONFIGS[args.env]
                rows = run_apexrl(config, seconds, every, args.episodes, workdir, args.set)
                name = f"apexrl {config}"
            else:
                rows = run_sb3(args.sb3_python, args.env, seconds, every, args.episodes, workdir)
                name = "stable-baselines3 SAC (zoo)"
            (workdir / f"{system}.json").write_text(json.dumps({"name": name, "rows": rows}))
    report(workdir, args.plot, args.env)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""An hour of Pong on this machine: apexrl's Pong CPU config against stable-baselines3 PPO.

Each system trains from a clean start for ``--minutes`` (60) of wall time, learner included,
one after the other, nothing else running, on one protocol: ``ALE/Pong-v5`` with ale-py v5's
sticky actions (0.25), frame skip 4 with max-pooling, up to 30 no-op starts, FIRE reset, grey
frames, a stack of 4, training rewards clipped, games cut at 108,000 frames. At each quarter of
its time (15, 30, 45 and 60 minutes) a system's weights are saved; after both runs each saved
policy plays ``--games`` (10) whole games greedily and the raw game scores are printed, with the
env steps it had trained on (1 env step = 4 frames).

- apexrl: ``scripts/launch_local.sh --actors 2 --learners 1 --config``
  ``configs/ppo_pong_cpu.yaml`` (``--config`` picks another)
  with ``run.stop_wall_s`` set to the time; at each mark the learner's last ``checkpoint.pt``
  (written every ``learner.checkpoint_period`` gradient steps, about a minute apart) is copied,
  and it is played by ``apexrl evaluate CHECKPOINT --episodes N --envs N``.
- stable-baselines3 PPO with the rl-baselines3-zoo's Atari settings (8 envs, ``AtariWrapper``,
  ``VecFrameStack`` of 4, ``CnnPolicy``, n_steps 128, 4 epochs, batch 256, lr 2.5e-4 and clip
  0.1 both linear over the zoo's 10 M steps, entropy 0.01, value 0.5), in its own process
  (``--sb3-python``; ``pip install -e ".[bench]"`` installs it); at each mark ``model.save``;
  each saved model plays greedily (``deterministic=True``) on the same env with rewards unclipped.

Each system's results go to ``<workdir>/<system>.json`` as soon as it is done, so ``--systems``
can run them in separate calls and ``--report`` prints and plots what a workdir holds.

    python benchmarks/pong_hour.py [--minutes 60] [--systems apexrl sb3] [--workdir DIR]
        [--plot benchmarks/pong_hour.png] [--report]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pong_runs

REPO = Path(__file__).resolve().parents[1]
CONFIG = "ppo_pong_cpu"  # configs/<name>.yaml
QUARTERS = (0.25, 0.5, 0.75, 1.0)

# The protocol's env for stable-baselines3 (``atari``) and its linear schedules (``linear``), in
# the child scripts of this benchmark and of pong_parity.py
SB3_ATARI = textwrap.dedent(
    """
    import ale_py, gymnasium as gym
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    # v5 with sticky actions 0.25; the wrapper skips frames, so the env itself must not
    protocol = dict(frameskip=1, repeat_action_probability=0.25)

    def atari(n_envs, seed, clip_reward=True):
        env = make_atari_env("ALE/Pong-v5", n_envs=n_envs, seed=seed, env_kwargs=protocol,
                             wrapper_kwargs=dict(clip_reward=clip_reward))
        return VecFrameStack(env, n_stack=4)

    def linear(start):
        return lambda remaining: remaining * start
    """
)

SB3_RUN = SB3_ATARI + textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.logger import Logger

    seconds, games, workdir = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    marks = [q * seconds for q in (0.25, 0.5, 0.75, 1.0)]
    model = PPO("CnnPolicy", atari(8, 0), n_steps=128, n_epochs=4, batch_size=256,
                learning_rate=linear(2.5e-4), clip_range=linear(0.1), ent_coef=0.01,
                vf_coef=0.5, seed=0)
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
    model.learn(total_timesteps=10_000_000, callback=clock)  # the zoo's schedule length
    rows = []
    for wall, steps, path in clock.saved:
        player = PPO.load(path)
        scores, _ = evaluate_policy(player, atari(games, 10_000, clip_reward=False),
                                    n_eval_episodes=games, deterministic=True,
                                    return_episode_rewards=True)
        rows.append({"wall_s": wall, "env_steps": steps, "scores": [float(s) for s in scores]})
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"rows": rows}))
    """
)


def run_sb3(python: str, seconds: float, games: int, workdir: Path) -> list[dict]:
    """stable-baselines3 PPO for ``seconds``; a row per mark: wall_s, env_steps, scores."""
    script = workdir / "sb3_pong.py"
    script.write_text(SB3_RUN)
    with open(workdir / "sb3.log", "w") as log:
        out = subprocess.run(
            [python, str(script), str(seconds), str(games), str(workdir)],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            timeout=seconds + 3600,
            check=False,
        )
    if out.returncode != 0:
        raise RuntimeError(f"stable-baselines3 failed (exit {out.returncode}): see {log.name}")
    return json.loads(out.stdout.strip().splitlines()[-1])["rows"]


def run_with_marks(
    config: str, seconds: float, marks: list[float], workdir: Path, overrides: list[str]
) -> tuple[list[tuple[float, Path]], Path]:
    """apexrl's ``config`` for ``seconds`` with 2 actors, the learner's ``checkpoint.pt`` copied
    at each of ``marks`` (seconds; the last one is the checkpoint written as the run ended);
    the (wall seconds, copy) pairs and the run directory."""
    saved: list[tuple[float, Path]] = []
    start = time.monotonic()

    def copy_due_checkpoint(run_dir: Path) -> None:
        now = time.monotonic() - start
        due = len(saved) < len(marks) - 1 and now >= marks[len(saved)]
        if due and (run_dir / "checkpoint.pt").exists():  # none yet: the first one
            copy = workdir / f"apexrl_{len(saved)}.pt"
            shutil.copyfile(run_dir / "checkpoint.pt", copy)
            saved.append((now, copy))

    code, run_dir, wall = pong_runs.launch(
        config, 2, seconds, workdir, tuple(overrides), name="apexrl", watch=copy_due_checkpoint
    )
    if code != 0:
        raise RuntimeError(f"the launcher failed (exit {code}): see {workdir / 'apexrl.log'}")
    last = workdir / f"apexrl_{len(saved)}.pt"  # the checkpoint written as the run ended
    shutil.copyfile(run_dir / "checkpoint.pt", last)
    saved.append((wall, last))
    return saved, run_dir


def run_apexrl(
    config: str, seconds: float, games: int, workdir: Path, overrides: list[str]
) -> list[dict]:
    """apexrl's Pong CPU config for ``seconds``; a row per mark: wall_s, env_steps, scores."""
    marks = [q * seconds for q in QUARTERS]
    saved, run_dir = run_with_marks(config, seconds, marks, workdir, overrides)
    return [
        {
            "wall_s": wall,
            "env_steps": checkpoint_env_steps(path),
            "scores": play_checkpoint(path, run_dir, games),
        }
        for wall, path in saved
    ]


def checkpoint_env_steps(checkpoint: Path) -> int:
    """The env steps the run had trained on when ``checkpoint`` was written."""
    import torch

    counters = torch.load(checkpoint, map_location="cpu", weights_only=True)["counters"]
    return int(counters.get("env_steps", -1))


def play_checkpoint(checkpoint: Path, run_dir: Path, games: int) -> list[float]:
    """The raw returns of ``games`` greedy episodes of ``checkpoint`` (``apexrl evaluate``)."""
    out = checkpoint.with_suffix(".json")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl",
            "evaluate",
            str(checkpoint),
            "--config",
            str(run_dir / "config.yaml"),
            "--episodes",
            str(games),
            "--envs",
            str(games),
            "--out",
            str(out),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return [float(r) for r in json.loads(out.read_text())["returns"]]


def report(workdir: Path, plot: Path | None) -> None:
    import numpy as np

    results, names = {}, {}
    for system in ("apexrl", "sb3"):
        if (workdir / f"{system}.json").exists():
            saved = json.loads((workdir / f"{system}.json").read_text())
            names[system], results[system] = saved["name"], saved["rows"]
    print(
        f"{'system':<30} {'minute':>6} {'env steps':>10} {'greedy score, mean ± std':>24} "
        f"{'min':>5} {'max':>5}"
    )
    for system, rows in results.items():
        for row in rows:
            s = np.asarray(row["scores"])
            print(
                f"{names[system]:<30} {row['wall_s'] / 60:6.1f} {row['env_steps']:10d} "
                f"{s.mean():16.1f} ± {s.std():5.1f} {s.min():5.0f} {s.max():5.0f}"
            )
    if plot is not None and results:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for system, rows in results.items():
            minutes = [r["wall_s"] / 60 for r in rows]
            means = [float(np.mean(r["scores"])) for r in rows]
            stds = [float(np.std(r["scores"])) for r in rows]
            ax.errorbar(minutes, means, yerr=stds, marker="o", capsize=3, label=names[system])
        ax.set_xlabel("wall time, minutes (learner included)")
        ax.set_ylabel("greedy score of whole games, mean ± std")
        ax.set_ylim(-21.5, 21.5)
        ax.grid(alpha=0.3)
        ax.legend()
        ax.set_title("Pong (v5, sticky actions 0.25) on 2 CPU cores")
        fig.tight_layout()
        fig.savefig(plot, dpi=80)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--config", default=CONFIG, help=f"apexrl's config (default {CONFIG})")
    parser.add_argument("--games", type=int, default=10)
    parser.add_argument(
        "--systems", nargs="+", choices=["apexrl", "sb3"], default=["apexrl", "sb3"]
    )
    parser.add_argument(
        "--sb3-python", default=sys.executable, help="a Python with stable-baselines3"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="kept (default: a new temp dir)")
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override of apexrl's config (repeatable)",
    )
    parser.add_argument("--report", action="store_true", help="only print what --workdir holds")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pong_hour_"))
    workdir.mkdir(parents=True, exist_ok=True)
    if not args.report:
        seconds = args.minutes * 60
        for system in args.systems:
            print(
                f"{time.strftime('%H:%M:%S')} {system}: {args.minutes:g} min in {workdir}, "
                f"load average {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            rows = (
                run_apexrl(args.config, seconds, args.games, workdir, args.set)
                if system == "apexrl"
                else run_sb3(args.sb3_python, seconds, args.games, workdir)
            )
            name = f"apexrl {args.config}" if system == "apexrl" else "stable-baselines3 PPO (zoo)"
            (workdir / f"{system}.json").write_text(json.dumps({"name": name, "rows": rows}))
        print(f"{time.strftime('%H:%M:%S')} done, load average {os.getloadavg()[0]:.1f}")
    report(workdir, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())

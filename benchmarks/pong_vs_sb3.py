"""A whole IMPALA Pong run against stable-baselines3's PPO on Pong, on this machine, in one run.

Both train, learner included, for ``--seconds`` each, one after the other, nothing else running:

- stable-baselines3 PPO with the rl-baselines3-zoo's Atari settings (``PongNoFrameskip-v4`` in
  ``make_atari_env``'s ``AtariWrapper``: no-op starts, frame skip 4 with max-pooling, lost life
  as episode end, FIRE reset, 84x84 grey, clipped rewards; ``VecFrameStack`` of 4; 8 envs in a
  ``DummyVecEnv``; ``CnnPolicy``, n_steps 128, 4 epochs, batch 256, lr 2.5e-4, clip 0.1,
  entropy 0.01, value 0.5), in its own process (``--sb3-python``: a Python with
  ``stable-baselines3``, this one by default: ``pip install -e ".[bench]"`` installs it);
- ``scripts/launch_local.sh --actors 2 --learners 1 --config configs/impala_pong.yaml``
  (``benchmarks/pong_runs.py``'s launch), ending by itself after ``--seconds``.

Each prints env frames per second over the second half of its run (after start-up), 4 frames
per env step for both (frame skip 4), and the ratio.

    python benchmarks/pong_vs_sb3.py [--seconds 180] [--sb3-python /path/to/python]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pong_runs

SB3_RUN = textwrap.dedent(
    """
    import json, sys, time
    import ale_py, gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    seconds = float(sys.argv[1])
    env = VecFrameStack(make_atari_env("PongNoFrameskip-v4", n_envs=8, seed=0), n_stack=4)
    model = PPO("CnnPolicy", env, n_steps=128, n_epochs=4, batch_size=256,
                learning_rate=2.5e-4, clip_range=0.1, ent_coef=0.01, vf_coef=0.5, seed=0)
    # A logger that writes nowhere: SB3's default makes a /tmp/SB3-<time> folder per learn().
    model.set_logger(Logger(folder=None, output_formats=[]))

    class Clock(BaseCallback):
        def _on_training_start(self):
            self.start = time.monotonic()
            self.marks = []
        def _on_step(self):
            now = time.monotonic() - self.start
            self.marks.append((now, self.num_timesteps))
            return now < seconds

    clock = Clock()
    model.learn(total_timesteps=10**9, callback=clock)
    end_t, end_steps = clock.marks[-1]
    half = [m for m in clock.marks if m[0] >= end_t / 2]
    t0, s0 = half[0]
    print(json.dumps({"env_steps": end_steps, "steps_per_s": (end_steps - s0) / (end_t - t0)}))
    """
)


def sb3_frames_per_s(python: str, seconds: float, workdir: Path) -> tuple[float, int]:
    """(frames/s over the second half, env steps) of stable-baselines3 PPO on Pong."""
    script = workdir / "sb3_pong.py"
    script.write_text(SB3_RUN)
    out = subprocess.run(
        [python, str(script), str(seconds)],
        capture_output=True,
        text=True,
        timeout=seconds + 600,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"stable-baselines3 failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return 4 * result["steps_per_s"], result["env_steps"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sb3-python", default=sys.executable, help="a Python with stable-baselines3"
    )
    parser.add_argument("--seconds", type=float, default=180.0)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} at start", flush=True)
    with tempfile.TemporaryDirectory(prefix="pong_vs_sb3_") as tmp:
        workdir = Path(tmp)
        sb3, sb3_steps = sb3_frames_per_s(args.sb3_python, args.seconds, workdir)
        print(f"stable-baselines3 PPO: {sb3:.0f} frames/s ({sb3_steps} env steps)", flush=True)
        code, run_dir, _ = pong_runs.launch("impala_pong", 2, args.seconds, workdir)
        if code != 0 or not (run_dir / "result.json").exists():
            print((workdir / "impala_pong.log").read_text()[-3000:])
            return 1
        ours = pong_runs.summary(run_dir)
    print(
        f"apexrl IMPALA (--actors 2 --learners 1): {ours['frames_per_s']:.0f} frames/s "
        f"({ours['frames']} frames, {ours['updates']} learner updates)"
    )
    print(f"ratio: {ours['frames_per_s'] / sb3:.2f} x stable-baselines3's frames/s")
    print(f"load average {os.getloadavg()[0]:.1f} at the end; {args.seconds:.0f} s each")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How fast Atari games step here, three ways, with the same preprocessing (frame skip 4 with
max-pooling, 84x84 grey, a stack of 4, sticky actions 0.25, no-op starts) and random actions:

- ``ale_vector``: ale-py's ``AtariVectorEnv`` (C++ threads; ``--threads``, default the cores),
  autoresetting in ``SAME_STEP`` mode: what apexrl's actors step;
- ``gym_sync``: a ``SyncVectorEnv`` of gymnasium's ``AtariPreprocessing`` +
  ``FrameStackObservation`` over ``gym.make(id, frameskip=1)`` (the reference stack,
  ``apexrl.envs.atari.make_env``);
- ``envpool``: EnvPool's Atari (``envpool.make(<Game>-v5, env_type="gymnasium")``), when the
  ``envpool`` package imports (it is not a dependency of apexrl: install it to measure it).

Each rate is env steps/s and frames/s (4 frames a step) over the best of several windows within
``--seconds`` (on a shared machine the best window is the least disturbed one), per number of envs,
with the ratio to ``gym_sync`` measured in the same run.

    python benchmarks/atari_envs.py [--game Pong] [--envs 1 4 16] [--seconds 6] [--threads 0]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from apexrl.config import load_config  # noqa: E402
from apexrl.envs import make_env, make_vector_env, step_vector  # noqa: E402

FRAME_SKIP = 4


def best_rate(step, num_envs: int, seconds: float, window_s: float = 1.0) -> float:
    """Best env steps/s over windows of ``window_s`` within ``seconds`` of stepping."""
    best, end = 0.0, time.monotonic() + seconds
    while time.monotonic() < end:
        start, steps = time.monotonic(), 0
        while time.monotonic() - start < window_s:
            step()
            steps += num_envs
        best = max(best, steps / (time.monotonic() - start))
    return best


def ale_vector(cfg, num_envs: int, threads: int):
    import ale_py  # noqa: F401  (registers nothing; apexrl.envs.atari makes the env)

    from apexrl.envs import atari

    return atari.make_vector_env(cfg.env, num_envs, threads)


def gym_sync(cfg, num_envs: int, threads: int):
    return gym.vector.SyncVectorEnv(
        [lambda: make_env(cfg.env)] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )


def envpool_env(cfg, num_envs: int, threads: int):
    import envpool

    game = cfg.env.id.removeprefix("ALE/")
    return envpool.make(
        game,
        env_type="gymnasium",
        num_envs=num_envs,
        num_threads=threads or min(num_envs, os.cpu_count() or 1),
        seed=0,
        repeat_action_probability=cfg.env.atari.sticky_actions,
        noop_max=cfg.env.atari.noop_max,
        episodic_life=False,
        reward_clip=False,
        img_height=84,
        img_width=84,
        stack_num=4,
        max_episode_steps=cfg.env.atari.max_episode_frames // FRAME_SKIP,
    )


def measure(make, cfg, num_envs: int, threads: int, seconds: float) -> float | None:
    try:
        envs = make(cfg, num_envs, threads)
    except ImportError:
        return None
    rng = np.random.default_rng(0)
    n = int(envs.single_action_space.n) if hasattr(envs, "single_action_space") else 6
    envs.reset() if make is envpool_env else envs.reset(seed=0)  # EnvPool seeds at make
    actions = rng.integers(0, n, (64, num_envs))
    count = [0]

    def step() -> None:
        if make is envpool_env:
            envs.step(actions[count[0] % 64])
        else:
            step_vector(envs, actions[count[0] % 64])
        count[0] += 1

    rate = best_rate(step, num_envs, seconds)
    envs.close()
    return rate


def _cell(rate: float | None, base: float) -> str:
    if rate is None:
        return f"{'n/a':>10} {'':>6}"
    return f"{rate:10.0f} {rate / base:5.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--game", default="Pong")
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--threads", type=int, default=0, help="C++ threads; 0: the cores")
    args = parser.parse_args()
    cfg = load_config(None, [f"env.id=ALE/{args.game}-v5"])
    make_vector_env(cfg.env, 1).close()  # registers the ids, loads the ROM once
    print(f"{args.game}: env steps/s (frames/s = {FRAME_SKIP} x), best {args.seconds:.0f}-s window")
    print(f"{'envs':>5} {'gym_sync':>10} {'ale_vector':>11} {'x':>6} {'envpool':>10} {'x':>6}")
    for num_envs in args.envs:
        rates = {
            name: measure(make, cfg, num_envs, args.threads, args.seconds)
            for name, make in (
                ("gym_sync", gym_sync),
                ("ale_vector", ale_vector),
                ("envpool", envpool_env),
            )
        }
        base = rates["gym_sync"]
        cells = [_cell(rates[name], base) for name in ("ale_vector", "envpool")]
        print(f"{num_envs:5d} {base:10.0f} {' '.join(cells)}")


if __name__ == "__main__":
    main()

"""SAC on HalfCheetah-v5 per env step: apexrl against stable-baselines3's SAC, greedy returns at
the same env steps.

Both train from a clean start on gymnasium's ``HalfCheetah-v5`` (``--env``), one after the
other, nothing else running, with the paper's settings (both systems' defaults): twin critics
and a tanh-squashed Gaussian policy of 256 x 256, Adam 3e-4 for each, batch 256, one update per
env step, uniform replay of 1 M transitions, tau 0.005, gamma 0.99, the temperature learned
toward -|A| from 1, 10,000 random steps first. Each system's weights are saved as it passes each
of ``--marks`` (thousands of env steps) and the run ends at the last; then each saved policy
plays ``--episodes`` (10) whole episodes greedily (the policy's mean action).

- apexrl: ``scripts/launch_local.sh --actors 2 --learners 1 --no-eval --config
  configs/sac_halfcheetah.yaml`` (2 actors x 4 envs) with ``run.stop_env_steps`` the last mark
  and a checkpoint every 1,000 updates (about 1,000 env steps): the first checkpoint at or past a
  mark is that mark's; it plays by ``apexrl evaluate``.
- stable-baselines3 SAC (``MlpPolicy``, ``learning_starts`` 10,000 as the zoo's HalfCheetah
  recipe, its other defaults), one env, in its own process (``--sb3-python``; ``pip install -e
  ".[bench]"``); its models play with ``deterministic=True``.

``--seed`` seeds both; each system's rows go to ``<workdir>/<system>_seed<seed>.json``, so
systems and seeds can run in separate calls into one workdir, and ``--report`` prints each
mark's mean over the seeds that workdir holds, with every seed's.

    python benchmarks/sac_parity.py [--marks 50 100 150] [--systems apexrl sb3] [--seed 0]
        [--episodes 10] [--env HalfCheetah-v5] [--workdir DIR] [--report] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import json
import sys
import tempfile
import textwrap
from pathlib import Path

import parity
from mujoco_vs_sb3 import CONFIGS

CHECKPOINT_UPDATES = 1000
NAMES = {"apexrl": "apexrl SAC", "sb3": "stable-baselines3 SAC (zoo)"}

SB3_RUN = (
    textwrap.dedent(
        """
    import json, sys
    import gymnasium as gym
    from stable_baselines3 import SAC
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.logger import Logger

    env_id, marks, episodes, seed, workdir = sys.argv[1:6]
    marks, episodes, seed = json.loads(marks), int(episodes), int(seed)
    """
    )
    + parity.SB3_ENV_STEP_MARKS
    + textwrap.dedent(
        """
    model = SAC("MlpPolicy", gym.make(env_id), learning_starts=10_000, seed=seed)
    # A logger that writes nowhere: SB3's default makes a /tmp/SB3-<time> folder per learn().
    model.set_logger(Logger(folder=None, output_formats=[]))

    clock = Marks()
    model.learn(total_timesteps=10_000_000, callback=clock)
    rows = []
    for steps, path in clock.saved:
        env = gym.make(env_id)
        env.reset(seed=10_000 + seed)
        returns, _ = evaluate_policy(SAC.load(path), env, n_eval_episodes=episodes,
                                     deterministic=True, return_episode_rewards=True)
        rows.append({"env_steps": steps, "returns": [float(r) for r in returns]})
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"rows": rows}))
    """
    )
)


def main() -> int:
    parser = parity.parser(__doc__.splitlines()[0], [50, 100, 150], "episodes")
    parser.add_argument("--env", default="HalfCheetah-v5", choices=sorted(CONFIGS))
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="sac_parity_"))
    workdir.mkdir(parents=True, exist_ok=True)
    marks = [int(round(m * 1e3)) for m in sorted(args.marks)]

    def run_system(system: str) -> list[dict]:
        if system == "apexrl":
            overrides = [
                f"learner.seed={args.seed}",
                f"learner.checkpoint_period={CHECKPOINT_UPDATES}",
                f"run.stop_env_steps={marks[-1]}",
                *args.set,
            ]
            return parity.run_apexrl_to_marks(
                CONFIGS[args.env], marks, args.seed, workdir, overrides, args.episodes
            )
        sb3_args = [args.env, json.dumps(marks), str(args.episodes), str(args.seed), str(workdir)]
        name = f"sb3_seed{args.seed}"
        return parity.run_sb3_script(args.sb3_python, SB3_RUN, sb3_args, workdir, name)

    if not args.report:
        parity.run_systems(args, marks, workdir, args.env, run_system)
    parity.report(workdir, NAMES, fmt=".0f")
    return 0


if __name__ == "__main__":
    sys.exit(main())

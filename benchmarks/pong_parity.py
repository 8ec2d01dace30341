"""PPO on Pong per env step: apexrl with the rl-baselines3-zoo's Atari settings against
stable-baselines3 PPO with the same settings, greedy scores at the same env steps.

Both train from a clean start on one protocol, one after the other, nothing else running:
``ALE/Pong-v5`` with ale-py v5's sticky actions (0.25), frame skip 4 with max-pooling, up to 30
no-op starts, FIRE reset, 84x84 grey frames, a stack of 4, a lost life ending the training
episode, training rewards clipped, games cut at 108,000 frames; the zoo's PPO: 8 envs x 128 steps a
rollout, 4 epochs of minibatches of 256, lr 2.5e-4 and clip range 0.1 both annealed linearly to 0
over the zoo's 10 M env steps, entropy 0.01, value 0.5, gradient norm 0.5, the Nature CNN shared
by policy and value, fp32. Each system's weights are saved as it passes each of ``--marks``
(millions of env steps; 1 env step = 4 frames) and the run ends at the last; then each saved
policy plays ``--games`` (10) whole games greedily, raw scores.

- apexrl: ``scripts/launch_local.sh --actors 2 --learners 1 --no-eval --config
  configs/ppo_pong.yaml`` (2 actors x 4 envs) with ``algo.anneal_lr``, ``algo.anneal_clip``,
  ``algo.anneal_env_steps=10000000``, ``algo.value_cost=1.0`` (stable-baselines3's value loss
  is 0.5 x the mean squared error, apexrl's ``value_cost`` x half of it), fp32 learner and
  actors, ``run.stop_env_steps`` the last mark and a checkpoint every 10 rollouts (10,240 env
  steps): the first checkpoint at or past a mark is that mark's; it plays by ``apexrl
  evaluate`` (``benchmarks/pong_hour.py``).
- stable-baselines3 PPO (``make_atari_env`` on the same env, ``VecFrameStack`` of 4,
  ``CnnPolicy``) in its own process (``--sb3-python``; ``pip install -e ".[bench]"`` installs
  it), ``model.learn(10_000_000)`` stopped after the last mark; its models play with
  ``deterministic=True`` on the same env, rewards unclipped.

``--seed`` seeds both (apexrl's network initialisation, stable-baselines3's everything); each
system's rows go to ``<workdir>/<system>_seed<seed>.json`` as it finishes, so systems and seeds
can run in separate calls into one workdir, and ``--report`` prints each mark's mean over the
seeds that workdir holds, with every seed's score.

    python benchmarks/pong_parity.py [--marks 0.5 1 1.5 2] [--systems apexrl sb3] [--seed 0]
        [--games 10] [--workdir DIR] [--report] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import json
import sys
import tempfile
import textwrap
from pathlib import Path

import parity
import pong_hour

CONFIG = "ppo_pong"  # configs/<name>.yaml
ANNEAL_ENV_STEPS = 10_000_000  # the zoo's n_timesteps, over which lr and clip anneal
CHECKPOINT_ROLLOUTS = 10
NAMES = {"apexrl": "apexrl PPO (zoo settings)", "sb3": "stable-baselines3 PPO (zoo)"}

SB3_RUN = (
    pong_hour.SB3_ATARI
    + textwrap.dedent(
        """
    import json, sys
    from stable_baselines3 import PPO
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.logger import Logger

    marks, games, seed = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    workdir = sys.argv[4]
    """
    )
    + parity.SB3_ENV_STEP_MARKS
    + textwrap.dedent(
        """
    model = PPO("CnnPolicy", atari(8, seed), n_steps=128, n_epochs=4, batch_size=256,
                learning_rate=linear(2.5e-4), clip_range=linear(0.1), ent_coef=0.01,
                vf_coef=0.5, seed=seed)
    # A logger that writes nowhere: SB3's default makes a /tmp/SB3-<time> folder per learn().
    model.set_logger(Logger(folder=None, output_formats=[]))

    clock = Marks()
    model.learn(total_timesteps=10_000_000, callback=clock)  # the zoo's schedule length
    rows = []
    for steps, path in clock.saved:
        player = PPO.load(path)
        scores, _ = evaluate_policy(player, atari(games, 10_000 + seed, clip_reward=False),
                                    n_eval_episodes=games, deterministic=True,
                                    return_episode_rewards=True)
        rows.append({"env_steps": steps, "returns": [float(s) for s in scores]})
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"rows": rows}))
    """
    )
)


def apexrl_overrides(marks: list[int], seed: int) -> list[str]:
    """The zoo's settings that ``configs/ppo_pong.yaml`` does not set itself, and the run's end."""
    return [
        "algo.anneal_lr=true",
        "algo.anneal_clip=true",
        f"algo.anneal_env_steps={ANNEAL_ENV_STEPS}",
        # stable-baselines3's value loss is vf_coef 0.5 times the mean squared error; apexrl's
        # is algo.value_cost times half of it (cleanRL's): 1.0 gives stable-baselines3's weight
        "algo.value_cost=1.0",
        "learner.precision=fp32",
        "actor.precision=fp32",
        f"learner.seed={seed}",
        f"learner.checkpoint_period={CHECKPOINT_ROLLOUTS}",  # PPO's versions are rollouts
        f"run.stop_env_steps={marks[-1]}",
    ]


def main() -> int:
    args = parity.parser(__doc__.splitlines()[0], [0.5, 1.0, 1.5, 2.0], "games").parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pong_parity_"))
    workdir.mkdir(parents=True, exist_ok=True)
    marks = [int(round(m * 1e6)) for m in sorted(args.marks)]

    def run_system(system: str) -> list[dict]:
        if system == "apexrl":
            overrides = [*apexrl_overrides(marks, args.seed), *args.set]
            return parity.run_apexrl_to_marks(
                CONFIG, marks, args.seed, workdir, overrides, args.episodes
            )
        sb3_args = [json.dumps(marks), str(args.episodes), str(args.seed), str(workdir)]
        name = f"sb3_seed{args.seed}"
        return parity.run_sb3_script(args.sb3_python, SB3_RUN, sb3_args, workdir, name)

    if not args.report:
        parity.run_systems(args, marks, workdir, "Pong", run_system)
    parity.report(workdir, NAMES)
    return 0


if __name__ == "__main__":
    sys.exit(main())

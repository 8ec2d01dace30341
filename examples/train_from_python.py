"""Train PPO on CartPole from Python with ``apexrl.Trainer``, then play the trained policy.

Run it from the repository root (about 20 s on two cores):

    python3 examples/train_from_python.py

``Trainer`` starts the same processes ``apexrl local`` starts (a replay server, a parameter
server, a learner and the actors) and reads the run directory they write. ``train()`` waits for
the learner's next ``result.json`` record and returns it as a dict.
"""

from pathlib import Path

from apexrl import Trainer

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "ppo_cartpole.yaml"  # PPO's CartPole settings

# Overrides of the config, as `--set section.key=value` would give them on the command line.
OVERRIDES = {
    "run.stop_env_steps": 15_000,  # a short run: the learner stops after 15,000 env steps
    "run.stop_eval_return": None,  # no return threshold (the config stops at 475)
    "learner.report_interval_s": 2,  # a result.json record every 2 seconds
}


def main() -> None:
    # Two actor processes and no evaluation actor keep the run small. Leaving the `with` block
    # stops every process of the run, also on an exception or Ctrl-C.
    with Trainer(
        CONFIG, OVERRIDES, num_actors=2, evaluation=False, logdir="runs/examples"
    ) as trainer:
        print(f"run directory: {trainer.run_dir}")
        while True:
            result = trainer.train()  # the next record: env steps, returns, updates, ...
            print(
                f"env steps {result['env_steps']:>6}  "
                f"training return {result['episode_return_mean'] or 0:6.1f}  "
                f"updates {result['learner_updates']}"
            )
            if result["done"]:  # the learner met its stop condition (run.stop_env_steps)
                break
        # Play 10 greedy episodes with the run's last weights, here in this process.
        evaluation = trainer.evaluate(episodes=10, num_envs=5, seed=0)
    returns = evaluation["return"]
    print(f"trained for {result['env_steps']} env steps")
    print(f"evaluation return over 10 episodes: {returns['mean']:.1f} +- {returns['std']:.1f}")


if __name__ == "__main__":
    main()

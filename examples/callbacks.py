"""Custom metrics through callbacks: a class whose methods the actors and the learner call.

Run it from the repository root (about 20 s on two cores):

    python3 examples/callbacks.py

The config's ``callbacks`` key names the class (``examples.callbacks:EpisodeStats``); every
training actor and the learner make one with no arguments and call the methods it defines. What
``on_episode_end`` returns is averaged by the actors and served by replay; the learner puts those
means, and what ``on_train_result`` returns, in each ``result.json`` record as
``custom_metrics`` (and in TensorBoard as ``custom/<name>``).
"""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class EpisodeStats:
    """Metrics of each CartPole episode and of each learner record."""

    def on_episode_end(self, env_index, episode_return, episode_length):
        """Called by an actor when one of its envs ends an episode; returns metrics (or None)."""
        return {
            "episode_length": episode_length,
            "balanced_200": 1.0 if episode_length >= 200 else 0.0,  # share of long episodes
        }

    def on_train_result(self, result):
        """Called by the learner with each result.json record before it is written."""
        return {"env_steps_per_update": result["env_steps"] / max(result["learner_updates"], 1)}


def main() -> None:
    from apexrl import Trainer

    # The actors and the learner import this module by name, from the repository root.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.getenv("PYTHONPATH")]))
    overrides = {
        "callbacks": "examples.callbacks:EpisodeStats",  # module:Class
        "run.stop_env_steps": 15_000,
        "run.stop_eval_return": None,
        "learner.report_interval_s": 2,
        "actor.report_interval_s": 0.5,
    }
    config = REPO / "configs" / "ppo_cartpole.yaml"
    with Trainer(
        config, overrides, num_actors=2, evaluation=False, logdir="runs/examples"
    ) as trainer:
        while True:
            result = trainer.train()
            custom = result["custom_metrics"]  # {name: value}; actors' metrics once they report
            shown = ", ".join(f"{name} {value:.2f}" for name, value in sorted(custom.items()))
            print(f"env steps {result['env_steps']:>6}  {shown}")
            if result["done"]:
                break
    print(f"trained for {result['env_steps']} env steps")
    print(f"mean episode length: {custom.get('episode_length', float('nan')):.1f}")


if __name__ == "__main__":
    main()

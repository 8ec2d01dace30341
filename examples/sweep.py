"""A tiny hyperparameter sweep from Python: two learning rates of PPO on CartPole, side by side.

Run it from the repository root (about 20 s on two cores):

    python3 examples/sweep.py

Each trial is an ordinary run (its own ``apexrl local`` launcher and run directory) with its own
values; the sweep prints a live table, stops each trial at its condition and returns the trials,
best first. The same sweep as a YAML spec runs with ``apexrl sweep SPEC`` (docs/sweeps.md).
"""

from pathlib import Path

from apexrl.sweep import grid, run_sweep

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    result = run_sweep(
        {
            "config": str(REPO / "configs" / "ppo_cartpole.yaml"),  # every trial's base config
            "overrides": ["learner.report_interval_s=2", "actor.report_interval_s=0.5"],
            "params": {"algo.lr": grid([1e-3, 3e-4])},  # one trial per value: two trials
            "stop": {"env_steps": 10_000},  # each trial stops after 10,000 env steps
            "metric": "episode_return_mean",  # the final table is sorted by it, best first
            "actors": 1,  # each trial: one actor, one learner, no evaluation actor
            "evaluation": False,
            "max_concurrent": 2,  # both trials at once, each pinned to one CPU
            "cpus_per_trial": 1,
            "report_interval_s": 5,  # seconds between live tables
            "logdir": "runs/examples/sweeps",
        }
    )
    for trial in result.trials:  # best first
        steps = trial.last.get("env_steps")
        print(
            f"{trial.name}: {trial.values} {trial.state}, {steps} env steps, "
            f"return {trial.metric('episode_return_mean')}"
        )
    print(f"best: {result.best.values} in {result.best.run_dir}")
    if not result.ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

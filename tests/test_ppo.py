"""Synchronous PPO through the launcher a user runs: a short run ends by itself having trained
only on data of the version it published, a stopped actor does not stall the run (the learner
trains on what arrived after its timeout), and two learners keep identical weights."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from conftest import REPO, wait_until
from test_launch_local import Launch, launch, wait_for_roles  # noqa: F401 - the fixture
from test_learner_group import launched_digests

CONFIG = REPO / "configs" / "ppo_cartpole.yaml"
PPO_SMALL = (
    "algo.hidden_sizes=[32]",
    "algo.unroll_length=16",
    "algo.epochs=2",
    "algo.num_minibatches=2",
    "env.num_envs=2",
    "replay.capacity=64",
    "replay.min_size_to_sample=2",
    "learner.batch_size=2",
    "learner.publish_period=1",  # the fixture's small overrides publish every 5 updates
)


def test_ppo_short_run_trains_only_on_its_own_versions(
    launch: Callable[..., Launch],  # noqa: F811
) -> None:
    launched = launch(
        "--actors",
        "2",
        "--learners",
        "1",
        "--config",
        str(CONFIG),
        overrides=(*PPO_SMALL, "run.stop_env_steps=3000"),
    )
    code = launched.wait(120.0)
    assert code == 0, f"launcher exit code {code}\n{launched.tails()}"
    last = launched.results()[-1]
    assert last["done"] is True and last["env_steps"] >= 3000, last
    # 2 actors x 2 envs x 16 steps = 64 env steps per rollout: dozens of versions.
    assert last["learner_updates"] >= 20, last
    assert last["stale_items_dropped"] == 0 and last["incomplete_rollouts"] == 0, last
    assert last["policy_lag"] == 0, last


def test_a_stopped_actor_does_not_stall_a_ppo_run(
    launch: Callable[..., Launch],  # noqa: F811
) -> None:
    launched = launch(
        "--actors",
        "2",
        "--learners",
        "1",
        "--no-eval",
        "--config",
        str(CONFIG),
        overrides=(*PPO_SMALL, "algo.rollout_timeout_s=1"),
    )
    pids = wait_for_roles(launched, {"learner", "actor_0", "actor_1"})
    assert wait_until(lambda: [r for r in launched.results() if r["learner_updates"] >= 5], 60)
    os.kill(pids["actor_1"], signal.SIGSTOP)  # alive but silent: the launcher cannot restart it
    try:
        stalled_at = launched.results()[-1]["learner_updates"]
        went_on = wait_until(
            lambda: [
                r
                for r in launched.results()
                if r["learner_updates"] >= stalled_at + 3 and r["incomplete_rollouts"] >= 3
            ],
            60,
        )
        assert went_on, f"{launched.results()[-3:]}\n{launched.tails()}"
        learner_log = (launched.run_dir() / "logs" / "learner.log").read_text()
        assert "unrolls after" in learner_log and "algo.rollout_timeout_s" in learner_log
    finally:
        os.kill(pids["actor_1"], signal.SIGCONT)


def test_ppo_with_two_learners_keeps_identical_weights(
    launch: Callable[..., Launch],  # noqa: F811
) -> None:
    launched = launch(
        "--actors",
        "2",
        "--learners",
        "2",
        "--no-eval",
        "--config",
        str(CONFIG),
        overrides=(*PPO_SMALL, "algo.normalize_obs=true", "run.stop_env_steps=2000"),
    )
    code = launched.wait(180.0)
    assert code == 0, f"launcher exit code {code}\n{launched.tails()}"
    last = launched.results()[-1]
    assert last["learner_updates"] >= 5 and last["stale_items_dropped"] == 0, last
    digests = launched_digests(launched.run_dir() / "logs", 2)
    # Same number of versions and the same weights, observation statistics included.
    assert digests[0] == digests[1], digests

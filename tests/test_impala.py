"""IMPALA through the launcher a user runs: a short run ends by itself with the policy lag in
``result.json``, and two learners keep identical weights."""

from __future__ import annotations

from collections.abc import Callable

from conftest import REPO
from test_launch_local import Launch, launch  # noqa: F401 - the launcher fixture
from test_learner_group import launched_digests

CONFIG = REPO / "configs" / "impala_cartpole.yaml"
# A run small enough for two cores; the SMALL_OVERRIDES of the fixture are Ape-X-shaped (batch 32
# items, min size 200), which the IMPALA config reads as unrolls.
IMPALA_SMALL = (
    "algo.hidden_sizes=[32]",
    "algo.unroll_length=8",
    "replay.capacity=256",
    "replay.min_size_to_sample=8",
    "learner.batch_size=8",
    "learner.publish_period=1",
)


def test_impala_short_run_ends_by_itself_with_its_policy_lag(
    launch: Callable[..., Launch],  # noqa: F811
) -> None:
    launched = launch(
        "--actors",
        "2",
        "--learners",
        "1",
        "--config",
        str(CONFIG),
        overrides=(*IMPALA_SMALL, "run.stop_env_steps=6000"),
    )
    code = launched.wait(120.0)
    assert code == 0, f"launcher exit code {code}\n{launched.tails()}"
    results = launched.results()
    last = results[-1]
    assert last["done"] is True and last["env_steps"] >= 6000, last
    assert last["learner_updates"] > 0 and "policy_lag" in last, last
    # Actors poll for weights every few steps and the queue holds at most a few unrolls: the
    # data the learner trains on is a few versions old, never hundreds.
    assert 0 <= last["policy_lag"] < 50, last
    assert launched.run_dir().name.startswith("impala-CartPole-v1-")


def test_impala_with_two_learners_keeps_identical_weights(
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
        overrides=(*IMPALA_SMALL, "run.stop_env_steps=6000"),
    )
    code = launched.wait(180.0)
    assert code == 0, f"launcher exit code {code}\n{launched.tails()}"
    digests = launched_digests(launched.run_dir() / "logs", 2)
    assert int(digests[0][0]) > 0
    assert digests[0] == digests[1], digests  # same number of updates, same weights

"""Env tasks (``Trainer.set_env_task``, ``env_task_fn``): a task set from the user's Python
reaches every training env through the learner and the weights it publishes, shows in the envs'
rewards and in ``result.json``; tasks that cannot work are refused with a clear error, on the
wire too."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import REPO

from apexrl import Trainer
from apexrl.transport.messages import MAX_ENV_TASK_CHARS, Params, PublishParams

TASK_ENV = "tests.envs_for_tests:TaskReward"  # 10 steps, reward = the task's "reward"
PPO = REPO / "configs" / "ppo_cartpole.yaml"
SETTINGS = [f"env.id={TASK_ENV}", "run.stop_eval_return=null", "run.stop_wall_s=120"]


def returns_until(trainer: Trainer, wanted: float, timeout_s: float) -> dict:
    """Records until the training return is ``wanted`` (episodes of 10 steps of that reward)."""
    deadline = time.monotonic() + timeout_s
    while True:
        record = trainer.train(timeout_s=30.0)
        if record["episode_return_mean"] == pytest.approx(wanted):
            return record
        assert time.monotonic() < deadline, record


def test_a_task_set_from_python_reaches_the_envs_rewards(tmp_path: Path) -> None:
    with Trainer(PPO, SETTINGS, num_actors=2, logdir=tmp_path, evaluation=False) as trainer:
        first = returns_until(trainer, 10.0, 60.0)
        assert first["env_task"] is None
        set_at = time.monotonic()
        trainer.set_env_task({"reward": 5.0})
        record = returns_until(trainer, 50.0, 60.0)
        print(f"\nreward 5 in the envs' returns {time.monotonic() - set_at:.1f} s after the call")
        assert record["env_task"] == {"reward": 5.0}
        assert (trainer.run_dir / "env_task.json").read_text().strip() == '{"reward":5.0}'
        for i in range(2):
            log = (trainer.run_dir / "logs" / f"actor_{i}.log").read_text()
            assert 'env task {"reward":5.0} set on' in log


def test_env_task_fn_sets_a_curriculum_from_the_records(tmp_path: Path) -> None:
    def curriculum(record: dict) -> dict | None:
        solved = (record["episode_return_mean"] or 0.0) >= 10.0  # null before the first episode
        return {"reward": 2.0} if solved else None

    with Trainer(
        PPO, SETTINGS, num_actors=1, logdir=tmp_path, evaluation=False, env_task_fn=curriculum
    ) as trainer:
        record = returns_until(trainer, 20.0, 90.0)
        assert record["env_task"] == {"reward": 2.0} and trainer.env_task == {"reward": 2.0}


def test_tasks_that_cannot_work_are_refused_before_anything_starts(tmp_path: Path) -> None:
    corridor = Trainer(PPO, ["env.id=tests.envs_for_tests:make_corridor"], logdir=tmp_path)
    with pytest.raises(ValueError, match="has no set_task\\(task\\) method"):
        corridor.set_env_task({"reward": 1})
    tasks = Trainer(PPO, SETTINGS, logdir=tmp_path)
    with pytest.raises(ValueError, match="must be JSON"):
        tasks.set_env_task({"reward": object()})
    with pytest.raises(ValueError, match="over 4096"):
        tasks.set_env_task("x" * MAX_ENV_TASK_CHARS)
    assert corridor._launcher is None and tasks._launcher is None  # nothing was started


def test_the_wire_takes_json_tasks_of_bounded_size_only() -> None:
    assert Params(3, env_task='{"phase":2}').env_task == '{"phase":2}'
    with pytest.raises(ValueError, match="env_task is not JSON"):
        Params(3, env_task="{phase")
    with pytest.raises(ValueError, match="over 4096"):
        PublishParams(1, 0, {"w": __import__("numpy").zeros(1)}, '"' + "x" * 4096 + '"')

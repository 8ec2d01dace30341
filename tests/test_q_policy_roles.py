"""SAC, TD3 and DDPG through the ways in the other families have, for real (launched processes,
real sockets, Pendulum-v1): an ``apexrl.Trainer`` handle trains, saves, is restored and takes the
user's weights; ``--serial`` runs every role in one process; a sweep runs trials of the family."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, log_tail, wait_until
from test_api import assert_nothing_left, replay_stats, train_until

from apexrl import Policy, Trainer
from apexrl.config import load_config
from apexrl.sweep import SweepSpec, grid, run_sweep
from apexrl.sweep.trials import TERMINATED

PENDULUM = {name: REPO / "configs" / f"{name}_pendulum.yaml" for name in ("sac", "td3", "ddpg")}
# No return threshold (these tests stop the runs themselves), records every second, a first
# update after 500 random transitions.
SHORT = (
    "run.stop_eval_return=null",
    "learner.report_interval_s=1",
    "actor.report_interval_s=1",
    "replay.min_size_to_sample=500",
)
FROZEN = ("algo.policy_lr=1e-10", "algo.critic_lr=1e-10")


def test_a_trainer_trains_td3_saves_restores_and_takes_the_users_weights(tmp_path: Path) -> None:
    with Trainer(PENDULUM["td3"], SHORT, num_actors=1, logdir=tmp_path / "one") as first:
        trained = train_until(first, 200, timeout_s=120.0)
        path = first.save()
        first_dir = first.run_dir
    assert_nothing_left(first_dir)
    saved = torch.load(path, weights_only=True)
    saved_updates = saved["algo"]["num_updates"]
    assert saved_updates >= trained["learner_updates"] >= 200
    saved_policy = Policy.from_checkpoint(path, first_dir / "config.yaml")
    actions, _ = saved_policy.compute_actions(np.zeros((4, 3), np.float32))
    assert actions.shape == (4, 1) and np.all(np.abs(actions) <= 2.0)

    # Restored with learning rates that keep the weights within 1e-6, the run goes on from the
    # saved counters, its actors past the random start at once (the learner has updated).
    second = Trainer(PENDULUM["td3"], [*SHORT, *FROZEN], num_actors=1, logdir=tmp_path / "two")
    with second:
        second.restore(path)
        result = second.train(timeout_s=60.0)
        weights = second.get_weights()
        for name, array in saved_policy.get_weights().items():
            if name == "learner_updates":  # the update counter the actors read: it counts on
                assert weights[name][0] >= array[0]
                continue
            np.testing.assert_allclose(weights[name], array, rtol=0, atol=1e-6, err_msg=name)
        assert result["learner_updates"] >= saved_updates
        assert result["env_steps"] >= saved["counters"]["env_steps"]

        mine = {name: (a * 0.5 if a.dtype.kind == "f" else a) for name, a in weights.items()}
        version = second.set_weights(mine)

        def actor_plays_it() -> bool:
            return replay_stats(second).get("actor/0/weights_version", -1) >= version

        assert wait_until(actor_plays_it, 30.0), (version, replay_stats(second))
        later = train_until(second, result["learner_updates"] + 50, timeout_s=120.0)
        assert later["env_steps"] > result["env_steps"]
        run_dir = second.run_dir
    assert_nothing_left(run_dir)
    log = (run_dir / "logs" / "learner.log").read_text()
    assert f"resumed from {run_dir} at update {saved_updates}" in log, log_tail(
        run_dir / "logs" / "learner.log"
    )
    assert f"took the user's weights as version {version}" in log


def test_a_serial_sac_run_trains_and_evaluates_in_one_process(tmp_path: Path) -> None:
    """``--serial``: replay, parameter server, learner, 2 actors and the evaluation actor in
    threads of one process over ``inproc://``, 20 s of SAC."""
    env = {**os.environ, "PYTHON": sys.executable}
    args = ["--serial", "--actors", "2", "--learners", "1", "--config", str(PENDULUM["sac"])]
    args += ["--logdir", str(tmp_path), "--set", "run.stop_wall_s=20"]
    for override in SHORT:
        args += ["--set", override]
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "launch_local.sh"), *args],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    records = [json.loads(line) for line in (run_dir / "result.json").read_text().splitlines()]
    last = records[-1]
    print(
        f"\nserial SAC 20 s: {last['env_steps']} env steps, {last['learner_updates']} updates, "
        f"eval {last['eval_return_mean']}"
    )
    assert last["done"] is True and last["learner_updates"] > 50 and last["env_steps"] > 500
    assert any(r["eval_return_mean"] is not None for r in records)
    roles = json.loads((run_dir / "roles.json").read_text())["roles"]
    assert {r["pid"] for r in roles} == {roles[0]["pid"]} and len(roles) == 6
    assert "serial run ended with exit code 0" in done.stdout + done.stderr


@pytest.mark.slow  # about 90 s: two trials of 40 updates, one after the other
def test_a_sweep_of_two_policy_learning_rates_of_ddpg(tmp_path: Path) -> None:
    out = io.StringIO()
    spec = SweepSpec(
        config=str(PENDULUM["ddpg"]),
        overrides=(*SHORT, "run.stop_wall_s=0"),
        params={"algo.policy_lr": grid([0.001, 0.0001])},
        stop={"learner_updates": 40.0, "env_steps": 100_000.0},
        metric="episode_return_mean",
        actors=1,
        evaluation=False,
        max_concurrent=1,
        cpus_per_trial=2,
        report_interval_s=2.0,
        trial_timeout_s=150.0,
    )
    started = time.monotonic()
    result = run_sweep(spec, sweep_dir=tmp_path / "sweep", out=out)
    tails = "\n".join(log_tail(t.log_path, 15) for t in result.trials)
    assert result.ok, f"{[(t.name, t.state, t.reason) for t in result.trials]}\n{tails}"
    assert len(result.trials) == 2
    for trial in result.trials:
        assert trial.state == TERMINATED and trial.reason.startswith("learner_updates")
        assert max(r["learner_updates"] for r in trial.records) >= 40
        cfg = load_config(trial.run_dir / "config.yaml")
        assert cfg.algorithm == "ddpg" and cfg.algo.policy_lr == trial.values["algo.policy_lr"]
    assert {t.values["algo.policy_lr"] for t in result.trials} == {0.001, 0.0001}
    print(f"sweep of 2 DDPG trials took {time.monotonic() - started:.0f} s")

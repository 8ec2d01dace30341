"""``apexrl.Trainer`` for real: each handle starts the launcher and every role as processes, on
real envs, and these tests drive them only through the handle: PPO learns CartPole through
``train()`` calls alone, the two-phase workflow (train, save, stop, change the learning rate,
restore, train on) keeps the counters and the weights, ``set_weights`` reaches the actors, and an
exception or a Ctrl-C in the user's code leaves no process of the run (found by the run
directory on their command lines). Several handles run one after another in this one process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CONFIG, REPO, SMALL_OVERRIDES, log_tail, wait_until
from test_launch_local import run_processes

from apexrl import Policy, RunEnded, Trainer
from apexrl.runtime import rundir
from apexrl.tools.server_stats import server_stats
from apexrl.transport import auth, sockets

SMALL = (*SMALL_OVERRIDES, "learner.checkpoint_period=100000")


def small_trainer(logdir: Path, *extra: str, num_actors: int = 1) -> Trainer:
    """Ape-X on CartPole, sized for two cores, without the evaluation actor."""
    return Trainer(CONFIG, [*SMALL, *extra], num_actors=num_actors, logdir=logdir, evaluation=False)


def assert_nothing_left(run_dir: Path) -> None:
    gone = wait_until(lambda: not run_processes(str(run_dir)), 5.0)
    assert gone, f"processes of the run remain: {run_processes(str(run_dir))}"


def train_until(trainer: Trainer, updates: int, timeout_s: float = 90.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        result = trainer.train(timeout_s=30.0)
        if result["learner_updates"] >= updates:
            return result
        assert time.monotonic() < deadline, result


@pytest.mark.slow
def test_a_handle_trains_ppo_on_cartpole_to_475_through_train_calls(tmp_path: Path) -> None:
    started = time.monotonic()
    with Trainer(REPO / "configs" / "ppo_cartpole.yaml", num_actors=4, logdir=tmp_path) as trainer:
        run_dir = trainer.run_dir
        while True:
            result = trainer.train(timeout_s=60.0)
            solved = (result["eval_return_mean"] or 0.0) >= 475.0
            if solved and result["eval_episodes_in_window"] >= 100:
                break
            assert not result["done"], result  # stopped on another condition
            assert time.monotonic() - started < 300.0, result
        lines = rundir.result_path(run_dir).read_text().splitlines()
        assert set(result) == set(json.loads(lines[-1])), "a record has result.json's keys"
    assert_nothing_left(run_dir)
    print(f"solved in {time.monotonic() - started:.0f} s at {result['env_steps']} env steps")


def test_the_two_phase_workflow_keeps_counters_and_weights(tmp_path: Path) -> None:
    with small_trainer(tmp_path / "one") as first:
        trained = train_until(first, 30)
        path = first.save()
        first_dir = first.run_dir
    assert_nothing_left(first_dir)
    saved = torch.load(path, weights_only=True)
    saved_updates, saved_counters = saved["algo"]["num_updates"], saved["counters"]
    assert saved_updates >= trained["learner_updates"] >= 30
    assert saved_counters["weights_version"] == saved_updates
    saved_weights = Policy.from_checkpoint(path, first_dir / "config.yaml").get_weights()

    # A tiny learning rate keeps the restored weights within 1e-6 while the run trains on.
    second = small_trainer(tmp_path / "two", "algo.lr=1e-10")
    with second:
        second.restore(path)
        result = second.train(timeout_s=30.0)
        assert second.running
        weights = second.get_weights()  # the parameter server's: what the actors play
        for name, array in saved_weights.items():
            np.testing.assert_allclose(weights[name], array, rtol=0, atol=1e-6, err_msg=name)
        assert result["learner_updates"] >= saved_updates, (result, saved_updates)
        assert result["env_steps"] >= saved_counters["env_steps"], (result, saved_counters)
        later = train_until(second, saved_updates + 20)
        assert later["env_steps"] > result["env_steps"] or later["env_steps"] > 0
        assert second.config.algo.lr == 1e-10
    assert_nothing_left(second.run_dir)
    log = (second.run_dir / "logs" / "learner.log").read_text()
    assert f"resumed from {second.run_dir} at update {saved_updates}" in log, log_tail(
        second.run_dir / "logs" / "learner.log"
    )


def replay_stats(trainer: Trainer) -> dict[str, float]:
    ctx = sockets.make_context()
    keys = auth.client_keys(trainer.config.net, "eval", "replay")
    with sockets.closing(ctx):
        return server_stats(ctx, trainer.config.net.replay_addr, timeout_ms=1000, curve=keys) or {}


def test_set_weights_reaches_every_actor_as_a_new_version(tmp_path: Path) -> None:
    with small_trainer(tmp_path, "algo.lr=1e-10", num_actors=2) as trainer:
        train_until(trainer, 1)
        weights = trainer.get_weights()
        mine = {name: (a * 0.5 if a.dtype.kind == "f" else a) for name, a in weights.items()}
        version = trainer.set_weights(mine)

        def published_mine() -> bool:
            published = trainer.get_weights()
            return all(np.allclose(published[k], a, rtol=0, atol=1e-6) for k, a in mine.items())

        assert wait_until(published_mine, 10.0), "the parameter server never held the weights"

        def actors_play_it() -> bool:
            stats = replay_stats(trainer)
            return all(stats.get(f"actor/{i}/weights_version", -1) >= version for i in (0, 1))

        assert wait_until(actors_play_it, 30.0), (version, replay_stats(trainer))
        with pytest.raises(ValueError, match="missing array"):
            trainer.set_weights({"nothing": np.zeros(3, dtype=np.float32)})
        assert trainer.set_weights(mine) > version  # the run goes on after a refusal
        run_dir = trainer.run_dir
    log = (run_dir / "logs" / "learner.log").read_text()
    assert f"took the user's weights as version {version}" in log
    assert_nothing_left(run_dir)


def test_an_exception_in_the_users_code_leaves_no_process(tmp_path: Path) -> None:
    with pytest.raises(ZeroDivisionError), small_trainer(tmp_path) as trainer:
        run_dir = trainer.run_dir
        trainer.train(timeout_s=60.0)
        assert run_processes(str(run_dir))
        1 / 0  # noqa: B018 - the user's bug
    assert_nothing_left(run_dir)
    assert (run_dir / "checkpoint.pt").is_file(), "the learner stopped without its checkpoint"
    with pytest.raises(RunEnded, match="nothing to save"):
        Trainer(CONFIG, SMALL, logdir=tmp_path / "never").save()


def test_ctrl_c_in_the_users_loop_leaves_no_process(tmp_path: Path) -> None:
    logdir, out = tmp_path / "runs", tmp_path / "script.log"
    script = (
        "from apexrl import Trainer\n"
        f"with Trainer({str(CONFIG)!r}, {list(SMALL)!r}, num_actors=1, evaluation=False,\n"
        f"             logdir={str(logdir)!r}) as trainer:\n"
        "    while True:\n"
        "        print('record', trainer.train()['env_steps'], flush=True)\n"
    )
    with open(out, "wb") as log_file:
        user = subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as a terminal's foreground job
            # and SIGINT handled as in a terminal, also where this suite runs in a background
            # job of a non-interactive shell (`... &`), which leaves it ignored for its children
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    try:
        trained = wait_until(lambda: "record" in out.read_text(), 90.0)
        assert trained, out.read_text()
        assert run_processes(str(logdir))
        os.killpg(user.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        code = user.wait(timeout=60.0)
    finally:
        if user.poll() is None:
            user.kill()
            user.wait()
    assert code != 0 and "KeyboardInterrupt" in out.read_text(), out.read_text()
    assert_nothing_left(logdir)


# PPO on CartPole stops within seconds on its evaluation condition: 10 greedy episodes of one
# weights version with a mean return >= 40 (a few rollouts in).
QUICK_EVAL_STOP = {
    "run.stop_eval_return": 40,
    "run.stop_eval_episodes": 10,
    "actor.eval_num_envs": 10,
    "learner.report_interval_s": 1,
}


def read_final(trainer: Trainer, how: str) -> tuple[int, dict[str, np.ndarray] | None]:
    """The weights version (and the weights, where the call gives them) that ``how`` reads."""
    if how == "get_weights":
        return -1, trainer.get_weights()
    if how == "evaluate":
        return trainer.evaluate(episodes=2)["weights_version"], None
    if how == "get_policy":
        policy = trainer.get_policy()
        return policy.weights_version, policy.get_weights()
    policy = Policy.from_checkpoint(trainer.run_dir)
    return policy.weights_version, policy.get_weights()


READS = ("get_weights", "evaluate", "get_policy", "from_checkpoint")


@pytest.mark.parametrize(
    "first",
    [
        "get_weights",
        *(pytest.param(how, marks=pytest.mark.slow) for how in READS[1:]),
    ],
)
def test_a_run_that_ends_by_itself_is_read_from_its_judged_checkpoint(
    tmp_path: Path, first: str
) -> None:
    """The end of ``while not trainer.train()["done"]``: read at once, while the launcher is
    still stopping the roles, and again after it has gone, every read gives the last
    checkpoint's weights, which are the version the evaluation condition judged."""
    config = REPO / "configs" / "ppo_cartpole.yaml"
    with Trainer(config, QUICK_EVAL_STOP, num_actors=1, logdir=tmp_path) as trainer:
        while not (result := trainer.train(timeout_s=60.0))["done"]:
            pass
        judged = result["eval_weights_version"]
        assert judged >= 0, result
        version, weights = read_final(trainer, first)  # at once
        assert not trainer.running
        assert_nothing_left(trainer.run_dir)
        last = Policy.from_checkpoint(trainer.run_dir)
        assert last.weights_version == judged, (last.weights_version, result)
        for how in (first, *READS):  # and once the launcher has gone
            if version != -1:
                assert version == judged, (how, version, judged)
            for name, array in (weights or {}).items():
                np.testing.assert_array_equal(array, last.get_weights()[name], err_msg=name)
            version, weights = read_final(trainer, how)
        with pytest.raises(RunEnded):
            trainer.train(timeout_s=10.0)

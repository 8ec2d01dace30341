"""Evaluation rounds: each round plays exactly the window's episodes with one frozen weights
version, replay tells which version its window holds, the stop condition needs one version, and the
learner keeps the judged version's weights for its checkpoints."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import CONFIG, REPO, run_launcher

from apexrl.acting.round_reports import RoundLines
from apexrl.acting.rounds import REST_POLL_S, Round, play_round, rest_after_round, round_quotas
from apexrl.config import ConfigError, load_config
from apexrl.envs import make_vector_env
from apexrl.learning.judged import JudgedWeights
from apexrl.learning.reporting import eval_condition_version, stop_reason
from apexrl.models import params_to_arrays
from apexrl.replay.service import ReplayService
from apexrl.transport.messages import ActorReport, PublishedVersion


def test_round_quotas_split_the_episodes_evenly() -> None:
    assert round_quotas(100, 100).tolist() == [1] * 100
    assert round_quotas(10, 4).tolist() == [3, 3, 2, 2]
    assert round_quotas(3, 3).sum() == 3
    with pytest.raises(ValueError):
        round_quotas(0, 4)


class ConstantCore:
    """Always pushes the cart left; counts the steps it saw."""

    def __init__(self) -> None:
        self.steps = 0

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, dict]:
        return np.zeros(len(obs), dtype=np.int64), {}

    def observe(self, action: np.ndarray, step) -> None:
        self.steps += 1


def single_env_episode_lengths(seed: int, episodes: int) -> list[int]:
    """Lengths of an env's first ``episodes`` episodes, always pushing left, played alone."""
    env = gym.make("CartPole-v1")
    lengths = []
    env.reset(seed=seed)
    for _ in range(episodes):
        length, done = 0, False
        while not done:
            _, _, terminated, truncated, _ = env.step(0)
            length += 1
            done = terminated or truncated
        lengths.append(length)
        env.reset()
    env.close()
    return lengths


def test_a_round_counts_each_envs_share_of_episodes_from_a_fresh_reset() -> None:
    cfg = load_config(CONFIG)
    envs = make_vector_env(cfg.env, 3)
    try:
        quotas = round_quotas(5, 3)  # [2, 2, 1]
        result = play_round(envs, ConstantCore(), quotas, seed=7)
        again = play_round(envs, ConstantCore(), quotas, seed=7)  # resets: the same round
    finally:
        envs.close()
    assert result is not None and again is not None
    assert len(result.returns) == 5 == len(result.lengths)
    expected = sorted(
        length
        for i, quota in enumerate(quotas)
        for length in single_env_episode_lengths(7 + i, int(quota))
    )
    # CartPole pays 1 per step: each counted return is its episode's length.
    assert sorted(result.lengths.tolist()) == expected
    assert np.array_equal(result.returns, result.lengths.astype(np.float64))
    assert sorted(again.lengths.tolist()) == expected
    # Every env stepped until the last counted episode ended.
    assert result.env_steps >= sum(expected) and result.env_steps % 3 == 0


def test_a_round_stops_when_asked() -> None:
    cfg = load_config(CONFIG)
    envs = make_vector_env(cfg.env, 2)
    try:
        assert play_round(envs, ConstantCore(), round_quotas(1000, 2), 0, lambda: False) is None
    finally:
        envs.close()


def eval_report(version: int, returns: list[float]) -> ActorReport:
    return ActorReport(
        actor_id=0,
        incarnation=1,
        is_eval=True,
        env_steps=1000,
        weights_version=version,
        episode_returns=np.asarray(returns, dtype=np.float64),
        episode_lengths=np.full(len(returns), 10, dtype=np.int64),
    )


def test_replay_says_which_version_fills_the_evaluation_window() -> None:
    cfg = load_config(CONFIG, overrides=["run.stop_eval_episodes=3"])
    service = ReplayService(cfg)
    assert service.stats()["eval/version"] == -1 and service.stats()["eval/rounds"] == 0
    service.handle(b"learner", PublishedVersion(9))  # replay takes only published versions
    service.handle(b"eval", eval_report(7, [1.0, 2.0, 3.0]))
    stats = service.stats()
    assert stats["eval/version"] == 7 and stats["eval/rounds"] == 1
    assert stats["eval/return_mean"] == 2.0
    service.handle(b"eval", eval_report(9, [5.0]))  # the window now mixes versions 7 and 9
    assert service.stats()["eval/version"] == -1
    service.handle(b"eval", eval_report(9, [5.0, 5.0]))
    assert service.stats()["eval/version"] == 9 and service.stats()["eval/rounds"] == 3


def test_the_stop_condition_judges_one_version_only() -> None:
    run = load_config(CONFIG).run  # >= 475 over 100 episodes
    assert stop_reason(run, 0, 0.0, 480.0, 100, eval_version=-1) is None  # mixed versions
    reason = stop_reason(run, 0, 0.0, 480.0, 100, eval_version=12)
    assert reason is not None and "weights version 12" in reason
    assert stop_reason(run, 0, 0.0, 480.0, 99, eval_version=12) is None  # window not full
    stats = {"eval/version": 12.0, "eval/return_mean": 480.0, "eval/episodes_in_window": 100.0}
    assert eval_condition_version(run, stats) == 12
    assert eval_condition_version(run, {**stats, "eval/return_mean": 474.0}) is None


def test_judged_weights_keep_recent_versions_and_load_them_for_a_moment() -> None:
    net = torch.nn.Linear(4, 2)
    arrays = {
        v: {k: np.full_like(a, v) for k, a in params_to_arrays(net).items()} for v in range(5)
    }
    size = sum(a.nbytes for a in arrays[0].values())
    judged = JudgedWeights(max_bytes=3 * size)
    for version in range(5):
        judged.remember(version, arrays[version])
    assert list(judged.versions) == [2, 3, 4]  # the oldest dropped past 3 versions' bytes
    own = params_to_arrays(net)
    with judged.loaded(net, 3) as kept:
        assert kept and torch.all(net.weight == 3.0)
    assert np.array_equal(params_to_arrays(net)["weight"], own["weight"])  # its own again
    with judged.loaded(net, 0) as kept:  # no longer kept: the network's own weights
        assert not kept and np.array_equal(params_to_arrays(net)["weight"], own["weight"])


def test_judged_weights_see_each_round_once_and_track_the_best() -> None:
    judged = JudgedWeights()
    stats = {
        "eval/rounds": 1.0,
        "eval/version": 5.0,
        "eval/return_mean": 100.0,
        "eval/episodes_in_window": 100.0,
    }
    assert judged.new_round(stats, window=100) == (5, 100.0)
    assert judged.new_round(stats, window=100) is None  # the same round again
    assert judged.new_round({**stats, "eval/rounds": 2.0, "eval/version": -1.0}, 100) is None
    partial = {**stats, "eval/rounds": 3.0, "eval/episodes_in_window": 50.0}
    assert judged.new_round(partial, 100) is None
    nan = {**stats, "eval/rounds": 4.0, "eval/return_mean": math.nan}
    assert judged.new_round(nan, 100) is None
    assert judged.is_best(100.0, 5) and not judged.is_best(90.0, 6) and judged.is_best(101.0, 7)
    assert judged.best_version == 7


def test_round_lines_log_at_most_one_round_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    result = Round(np.array([10.0, 30.0]), np.array([10, 30]), 40, 0.5)
    caplog.set_level(logging.INFO, logger="apexrl.actor")
    every = RoundLines(interval_s=0.0)
    for version in (1, 2):
        every.add(version, result)
    assert [r.getMessage() for r in caplog.records] == [
        f"eval: weights version {v}: mean return 20.0 (min 10.0, max 30.0) over 2 episodes, "
        "40 env steps in 0.50 s"
        for v in (1, 2)
    ]
    caplog.clear()
    seldom = RoundLines(interval_s=3600.0)
    for version in (1, 2, 3):
        seldom.add(version, result)
    assert len(caplog.records) == 1 and "version 1:" in caplog.records[0].getMessage()
    seldom.last_line -= 3600.0  # an hour later: the next round has a line, counting all since
    seldom.add(4, result)
    assert caplog.records[-1].getMessage().endswith("(3 rounds since the last line)")


class FakeClock:
    """A clock that only moves when slept on."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_the_rest_after_a_round_lasts_the_interval_from_the_rounds_start() -> None:
    clock, looks = FakeClock(), []
    rested = rest_after_round(5.0, 1.0, lambda: looks.append(clock()) or True, clock, clock.sleep)
    assert rested and clock.now == pytest.approx(104.0)  # 5 s after it began, 1 s ago
    assert len(looks) == round(4.0 / REST_POLL_S)  # replay polled all along
    for interval, seconds in ((0.0, 1.0), (2.0, 3.0)):  # no interval; a round longer than it
        assert rest_after_round(
            interval, seconds, lambda: pytest.fail("polled"), clock, clock.sleep
        )
    assert clock.now == pytest.approx(104.0)


def test_a_stop_ends_the_rest_at_the_next_look() -> None:
    clock = FakeClock()
    assert not rest_after_round(60.0, 0.0, lambda: False, clock, clock.sleep)
    assert clock.now == pytest.approx(100.0 + REST_POLL_S)


def test_a_launched_evaluation_actor_starts_a_round_at_most_every_interval(
    tmp_path: Path,
) -> None:
    interval, wall = 4.0, 14.0
    code, output = run_launcher(
        ["--actors", "1", "--learners", "1",
         "--config", str(REPO / "configs" / "ppo_cartpole.yaml"),
         "--logdir", str(tmp_path), "--set", f"actor.eval_interval_s={interval}",
         "--set", "run.stop_eval_episodes=10", "--set", "actor.eval_num_envs=10",
         "--set", "env.max_episode_steps=60", "--set", f"run.stop_wall_s={wall}"],
        180,
    )  # fmt: skip
    assert code == 0, output[-3000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    eval_log = (run_dir / "logs" / "eval.log").read_text()
    (line,) = [line for line in eval_log.splitlines() if "eval stopped after" in line]
    rounds = int(line.split("eval stopped after ")[1].split()[0])
    # Unpaced, a round of 10 short episodes follows each of the learner's many versions.
    assert 2 <= rounds <= math.ceil(wall / interval), eval_log[-2000:]


def test_a_negative_or_endless_evaluation_interval_is_refused() -> None:
    for value in ("-1", ".inf"):
        with pytest.raises(ConfigError, match="eval_interval_s must be >= 0"):
            load_config(CONFIG, [f"actor.eval_interval_s={value}"])

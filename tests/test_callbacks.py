"""Callbacks and custom metrics (``apexrl.callbacks``): loading and its one-line errors, the checks
of what a callback returns, the means over an actor's interval and over replay's window, the
wire field and replay's refusals, the learner's ``result.json`` and TensorBoard, and a real run
whose callbacks' metrics reach ``result.json`` and TensorBoard."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path

import msgpack
import numpy as np
import pytest
from conftest import CONFIG
from test_hostile_replay import ACTOR, make_config, make_report
from test_launch_local import Launch, launch  # noqa: F401 (the fixture)

from apexrl.acting.episodes import EpisodeMetrics
from apexrl.callbacks import (
    CUSTOM_METRIC_WINDOW,
    MAX_ABS_METRIC,
    CallbacksError,
    EpisodeCallbacks,
    Guarded,
    MeanMetrics,
    MetricCleaner,
    TrainResultCallback,
    custom_stats,
    make_callbacks,
    make_episode_callbacks,
    make_train_result_callback,
)
from apexrl.config import ConfigError, load_config
from apexrl.envs import make_vector_env, step_vector
from apexrl.launch.preflight import LaunchError, check_before_start
from apexrl.learning.reporting import Reporter
from apexrl.replay.service import ReplayService
from apexrl.runtime.metrics import MetricsWriter
from apexrl.transport.codec import DecodeError, decode, encode
from apexrl.transport.messages import MAX_CUSTOM_METRICS, ActorReport, Error

SPEC = "tests.callbacks_for_tests:EpisodeLength"


# --- loading --------------------------------------------------------------------------------------


def test_an_empty_entry_means_no_callbacks_and_a_class_is_made() -> None:
    assert make_callbacks("") is None
    assert type(make_callbacks(SPEC)).__name__ == "EpisodeLength"
    assert make_episode_callbacks("") is None and make_train_result_callback("") is None


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("tests.no_such_module:A", "cannot import 'tests.no_such_module' (ModuleNotFoundError"),
        ("tests.callbacks_for_tests:Missing", "'tests.callbacks_for_tests' has no 'Missing'"),
        ("tests.callbacks_for_tests:NOT_A_CLASS", "is a int, not a class"),
        ("tests.callbacks_for_tests:RaisesInInit", "RaisesInInit() raised RuntimeError: no lic"),
    ],
)
def test_callbacks_that_cannot_be_made_are_one_line_before_anything_starts(
    spec: str, expected: str, tmp_path: Path
) -> None:
    with pytest.raises(CallbacksError, match="callbacks") as raised:
        make_callbacks(spec)
    assert expected in str(raised.value) and "\n" not in str(raised.value)
    cfg = load_config(CONFIG, [f"callbacks={spec}", f"run.dir={tmp_path / 'run'}"])
    with pytest.raises(LaunchError) as refused:
        check_before_start(cfg)
    assert str(refused.value) == str(raised.value)


@pytest.mark.parametrize("spec", ["no_colon", "mod:.Class", ":Class", "a b:C", "mod:Class()"])
def test_the_config_refuses_a_callbacks_entry_that_is_not_module_colon_class(spec: str) -> None:
    with pytest.raises(ConfigError, match="callbacks must be package.module:Class or empty"):
        load_config(CONFIG, [f"callbacks={spec}"])


def test_a_launch_with_callbacks_that_raise_in_init_exits_2_with_one_line(
    launch: Callable[..., Launch],  # noqa: F811
) -> None:
    launched = launch(
        "--actors", "1", "--learners", "1",
        overrides=("callbacks=tests.callbacks_for_tests:RaisesInInit",),
    )  # fmt: skip
    code = launched.wait(30.0)
    assert code == 2, launched.log()
    lines = launched.log().strip().splitlines()
    assert len(lines) == 1 and "RaisesInInit() raised RuntimeError" in lines[0], lines
    assert not launched.logdir.exists()


# --- what callbacks return, and their means -------------------------------------------------------


def test_the_cleaner_keeps_finite_numbers_of_valid_names_and_warns_once_per_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clean = MetricCleaner("Cb.on_episode_end")
    returned = {
        "ok": 1,
        "np_ok/x.y-z": np.float32(2.5),
        "nan": float("nan"),
        "big": 2 * MAX_ABS_METRIC,
        "text": "3",
        "flag": True,
        "bad name": 1.0,
        "": 1.0,
        "x" * 65: 1.0,
        7: 1.0,
    }
    with caplog.at_level(logging.WARNING, "apexrl.callbacks"):
        assert clean(returned) == {"ok": 1.0, "np_ok/x.y-z": 2.5}
        assert clean(returned) == {"ok": 1.0, "np_ok/x.y-z": 2.5}
        assert clean(None) == {}
        assert clean([1.0]) == {}
    assert len(caplog.records) == 8 + 1  # one per dropped name, and one for the list


def test_mean_metrics_average_each_name_over_its_own_episodes() -> None:
    means = MeanMetrics(max_names=2)
    means.add({"a": 1.0})
    means.add({"a": 3.0, "b": 2.0, "c": 9.0})  # c: a third name, dropped
    assert means.means() == {"a": (1.0 + 3.0) / 2, "b": 2.0}
    means.clear()
    means.add({"c": 5.0, "b": 4.0})
    assert means.means() == {"b": 4.0}  # the names taken stay the first two


def test_a_raising_callback_logs_its_traceback_once_and_the_call_returns_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(x: int) -> dict[str, float]:
        raise KeyError(x)

    guarded = Guarded(broken, "Cb.on_episode_end")
    with caplog.at_level(logging.ERROR, "apexrl.callbacks"):
        assert [guarded(i) for i in range(5)] == [None] * 5
    assert guarded.num_errors == 5
    assert len(caplog.records) == 1 and caplog.records[0].exc_info is not None
    assert "Cb.on_episode_end raised; the role goes on" in caplog.text


class Recorder:
    """Per-env callbacks that record every call."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_episode_start(self, env_index: int, obs: np.ndarray) -> None:
        self.calls.append(("start", env_index))

    def on_episode_step(self, env_index, obs, action, reward, terminated, truncated) -> None:
        self.calls.append(("step", env_index, reward, terminated or truncated))

    def on_episode_end(self, env_index: int, episode_return: float, length: int) -> dict:
        self.calls.append(("end", env_index, episode_return, length))
        if env_index == 1:
            raise RuntimeError("env 1's metric is broken")
        return {"ret": episode_return, "len": length}


def play(cfg_callbacks: EpisodeCallbacks, tmp_path: Path, num_steps: int) -> EpisodeMetrics:
    """CartPole on 2 envs with random actions, through an actor's ``EpisodeMetrics``."""
    envs = make_vector_env(load_config(CONFIG).env, 2)
    writer = MetricsWriter(tmp_path / "tb")
    metrics = EpisodeMetrics(writer, 2, 0, 1, False, 60.0, cfg_callbacks)
    rng = np.random.default_rng(0)
    obs, _ = envs.reset(seed=0)
    cfg_callbacks.reset(obs)
    for _ in range(num_steps):
        action = rng.integers(0, 2, size=2)
        step = step_vector(envs, action)
        metrics.add_step(step.reward, step.terminated | step.truncated, action, step)
    envs.close()
    writer.close()
    return metrics


def test_an_actors_episode_callbacks_see_every_step_and_episode_of_each_env(
    tmp_path: Path,
) -> None:
    user = Recorder()
    callbacks = EpisodeCallbacks(user)
    metrics = play(callbacks, tmp_path, 300)
    ends = [call for call in user.calls if call[0] == "end"]
    assert len(ends) == len(metrics.finished_lengths) > 4
    # CartPole pays 1 per step: an episode's return is its length, and its steps are its length.
    for env in (0, 1):
        env_calls = [call for call in user.calls if call[1] == env]
        assert env_calls[0] == ("start", env)
        episode_steps = 0
        for call in env_calls[1:]:
            if call[0] == "step":
                episode_steps += 1
            elif call[0] == "end":
                assert call[2:] == (float(episode_steps), episode_steps)
                episode_steps = 0
        assert sum(call[0] == "step" for call in env_calls) == 300
        num_ends = sum(call[0] == "end" for call in env_calls)
        assert sum(call[0] == "start" for call in env_calls) == 1 + num_ends
    # Env 1's on_episode_end raises: only env 0's episodes make the means, and the actor goes on.
    env0 = [call[3] for call in ends if call[1] == 0]
    assert callbacks.metrics.means() == pytest.approx({"ret": np.mean(env0), "len": np.mean(env0)})


def test_the_vectorised_and_per_episode_callbacks_agree_with_the_actors_own_counts(
    tmp_path: Path,
) -> None:
    callbacks = make_episode_callbacks(SPEC)
    assert callbacks is not None and callbacks.on_episode_step is None
    metrics = play(callbacks, tmp_path, 300)
    means = callbacks.metrics.means()
    assert means["episode_len_x2"] == pytest.approx(2 * np.mean(metrics.finished_lengths))
    assert means["steps_seen_minus_length"] == 0.0


# --- the wire and replay --------------------------------------------------------------------------


def report(custom: dict[str, float], actor_id: int = 0, is_eval: bool = False) -> ActorReport:
    """A report of one episode (one env step: within what an actor may count before its first
    chunk arrives) from ``actor_id`` with ``custom`` metrics."""
    base = make_report([10.0], actor_id=actor_id, is_eval=is_eval, env_steps=1)
    return dataclasses.replace(base, custom_metrics=custom)


def test_an_actor_report_carries_custom_metrics_over_the_wire() -> None:
    msg = report({"episode_len_x2": 40.0, "a/b.c-d_1": -3.5})
    again = decode(encode(msg))
    assert again.custom_metrics == {"episode_len_x2": 40.0, "a/b.c-d_1": -3.5}


@pytest.mark.parametrize(
    ("custom", "reason"),
    [
        ({f"m{i}": 1.0 for i in range(MAX_CUSTOM_METRICS + 1)}, "over the limit of 64"),
        ({"x" * 65: 1.0}, "at most 64 characters"),
        ({"new\nline": 1.0}, "may hold only"),
        ({"/lead": 1.0}, "may hold only"),
        ({"nan": float("nan")}, "not finite"),
        ({"inf": float("-inf")}, "not finite"),
    ],
)
def test_a_report_with_bad_custom_metrics_does_not_decode(custom: dict, reason: str) -> None:
    frames = encode(report({"fine": 1.0}))
    header = msgpack.unpackb(frames[0])
    header["scalars"]["custom_metrics"] = custom
    with pytest.raises(DecodeError, match=reason):
        decode([msgpack.packb(header, use_bin_type=True), *frames[1:]])


def test_replay_serves_the_mean_of_the_last_interval_means_per_name() -> None:
    service = ReplayService(make_config())
    service.handle(ACTOR, report({"len": 20.0, "only0": 1.0}, actor_id=0))
    service.handle(b"actor1", report({"len": 30.0}, actor_id=1))
    service.handle(ACTOR, report({}, actor_id=0))  # an interval without custom metrics
    stats = service.stats()
    assert custom_stats(stats) == {"len": (20.0 + 30.0) / 2, "only0": 1.0}
    assert stats["custom/len"] == 25.0
    for i in range(CUSTOM_METRIC_WINDOW):
        service.handle(ACTOR, report({"len": float(i)}))
    assert service.stats()["custom/len"] == np.mean(range(CUSTOM_METRIC_WINDOW))


def test_replay_refuses_hostile_custom_metrics_and_bounds_their_names() -> None:
    service = ReplayService(make_config())
    for hostile in (
        report({"len": 2 * MAX_ABS_METRIC}),
        report({"len": 1.0}, is_eval=True),
    ):
        (reply,) = service.handle(ACTOR, hostile)
        assert isinstance(reply.message, Error)
    assert service.rejected_messages == 2
    assert custom_stats(service.stats()) == {}
    # An actor may bring at most 64 names of its own: a report that would bring more is refused,
    # and the names of another actor still show.
    names = {f"m{i}": 1.0 for i in range(MAX_CUSTOM_METRICS)}
    assert service.handle(ACTOR, report(names)) == []
    more = {f"m{MAX_CUSTOM_METRICS + i}": 1.0 for i in range(MAX_CUSTOM_METRICS)}
    (reply,) = service.handle(ACTOR, report(more))
    assert "would bring 128 custom metric names, over the 64 one actor may" in reply.message.reason
    assert service.handle(ACTOR, report({"m0": 2.0})) == []  # a name it brought: still its own
    assert service.handle(b"actor1", report({"m1": 3.0, "other": 4.0}, actor_id=1)) == []
    shown = custom_stats(service.stats())
    assert len(shown) == MAX_CUSTOM_METRICS + 1 and "m64" not in shown
    assert (shown["m0"], shown["m1"], shown["other"]) == (1.5, 2.0, 4.0)
    assert service.rejected_messages == 3
    assert service.run.train_episodes == 3  # the reports themselves count


# --- the learner ----------------------------------------------------------------------------------


def test_the_learner_writes_custom_metrics_to_result_json_and_tensorboard(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = load_config(CONFIG, [f"run.dir={tmp_path}", f"callbacks={SPEC}"])
    writer = MetricsWriter(tmp_path / "tb" / "learner")
    callback = make_train_result_callback(cfg.callbacks)
    assert isinstance(callback, TrainResultCallback)
    reporter = Reporter(cfg, writer, 0.0, 0, callback)
    stats = {"replay/env_steps": 1000.0, "custom/episode_len_x2": 40.0, "custom/nan": np.nan}
    reporter.report(stats, num_updates=7, num_samples=0)
    writer.close()
    (line,) = (tmp_path / "result.json").read_text().splitlines()
    record = json.loads(line)
    assert record["custom_metrics"] == {"episode_len_x2": 40.0, "learner_updates_x3": 21.0}
    events = EventAccumulator(str(tmp_path / "tb" / "learner"))
    events.Reload()
    for tag, value in (("custom/episode_len_x2", 40.0), ("custom/learner_updates_x3", 21.0)):
        (scalar,) = events.Scalars(tag)
        assert (scalar.step, scalar.value) == (1000, value)


# --- a real run -----------------------------------------------------------------------------------


def tensorboard_tags(tb_dir: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tb_dir))
    events.Reload()
    return {tag: [s.value for s in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_a_runs_callbacks_metrics_reach_result_json_and_tensorboard(
    launch: Callable[..., Launch],  # noqa: F811
) -> None:
    launched = launch(
        "--actors", "1", "--learners", "1", "--no-eval",
        overrides=(f"callbacks={SPEC}", "run.stop_env_steps=4000"),
    )  # fmt: skip
    code = launched.wait(120.0)
    assert code == 0, f"exit code {code}\n{launched.tails()}"
    results = launched.results()
    with_actor_metrics = [r for r in results if "episode_len_x2" in r["custom_metrics"]]
    assert with_actor_metrics, results[-3:]
    for record in with_actor_metrics:
        custom = record["custom_metrics"]
        # CartPole's episodes last 8 to 500 steps; on_step saw exactly each episode's steps.
        assert 2 * 8 <= custom["episode_len_x2"] <= 2 * 500
        assert custom["steps_seen_minus_length"] == 0.0
    for record in results:
        assert record["custom_metrics"]["learner_updates_x3"] == 3 * record["learner_updates"]
    tb = launched.run_dir() / "tb"
    learner = tensorboard_tags(tb / "learner")
    written = [r["custom_metrics"]["episode_len_x2"] for r in with_actor_metrics]
    assert learner["custom/episode_len_x2"] == pytest.approx(written, rel=1e-6)
    assert learner["custom/learner_updates_x3"][-1] == 3 * results[-1]["learner_updates"]
    assert "custom/episode_len_x2" in tensorboard_tags(tb / "replay")
    assert "actor/custom/episode_len_x2" in tensorboard_tags(tb / "actor_0")
    assert "Traceback" not in (launched.run_dir() / "logs" / "actor_0.log").read_text()

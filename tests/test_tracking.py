"""Experiment trackers (``apexrl.tracking``) with their real clients and no network: W&B in
offline mode, read back from its run file with W&B's own record types, and MLflow with a local
file store, read back with ``mlflow.search_runs``. The learner's feed sends every record's numbers
at the run's env steps, the config as parameters, the videos and the checkpoint; a resumed run
logs on into the same tracker run; a slow or broken tracker never blocks the learner and is said
once; ``apexrl track`` sends a finished run and a sweep (its trials grouped) after the fact; a
tracker that is not installed stops a launch before anything starts, naming the pip command.
The launched runs (a PPO CartPole run and a 2-trial sweep with ``--track``) are in
``tests/test_tracking_runs.py`` (slow)."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from tracker_runs import mlflow_artifacts, mlflow_metric_steps, mlflow_runs, read_wandb_run

from apexrl import cli, tracking
from apexrl.config import ConfigError, dump_config, load_config
from apexrl.runtime import rundir
from apexrl.tracking.backends import MlflowTracker, WandbTracker
from apexrl.tracking.feed import TrackerFeed
from apexrl.tracking.records import flatten, metrics_of, run_info

CONFIG = REPO / "configs" / "ppo_cartpole.yaml"
RECORDS = [
    {
        "time_s": 0.5, "env_steps": 100, "episode_return_mean": 9.5, "eval_return_mean": None,
        "done": False, "replay_items": {"stored": 100, "lost": 0}, "custom_metrics": {},
        "env_task": None,
    },
    {
        "time_s": 1.1, "env_steps": 300, "episode_return_mean": 31.0, "eval_return_mean": 40.0,
        "done": False, "replay_items": {"stored": 300, "lost": 0},
        "custom_metrics": {"score": 2.5}, "env_task": None,
    },
    {
        "time_s": 2.0, "env_steps": 700, "episode_return_mean": 120.0, "eval_return_mean": 500.0,
        "done": True, "replay_items": {"stored": 700, "lost": 0},
        "custom_metrics": {"score": 3.0}, "env_task": None,
    },
]  # fmt: skip


@pytest.fixture
def stores(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """W&B offline with its own folders here; MLflow's file store here: its URI."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb_home" / name.lower()))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks to opt in to it
    return f"file://{tmp_path / 'mlruns'}"


def finished_run(tmp_path: Path, uri: str, name: str = "ppo-cartpole-run", **sets: str) -> Path:
    """A run directory as a finished run leaves it: config.yaml, result.json, a video and the
    checkpoint (their bytes are not looked at by the trackers)."""
    overrides = [f"run.mlflow_tracking_uri={uri}", *(f"{k}={v}" for k, v in sets.items())]
    cfg = load_config(CONFIG, overrides)
    run_dir = tmp_path / name
    rundir.videos_dir(run_dir).mkdir(parents=True)
    rundir.config_path(run_dir).write_text(dump_config(cfg))
    rundir.result_path(run_dir).write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    (rundir.videos_dir(run_dir) / "eval-v3-episode-0.mp4").write_bytes(b"\0\0\0\x18ftypmp42")
    # one being written (renamed when whole): never sent
    (rundir.videos_dir(run_dir) / "eval-v4-episode-0.mp4.partial.mp4").write_bytes(b"\0")
    rundir.checkpoint_path(run_dir).write_bytes(b"checkpoint")
    return run_dir


def info_of(run_dir: Path):
    text = rundir.config_path(run_dir).read_text()
    return run_info(yaml.safe_load(text), run_dir)


# --- what a tracker is given (pure) --------------------------------------------------------------


def test_a_records_numbers_become_metrics_and_the_config_flat_parameters() -> None:
    assert metrics_of(RECORDS[1]) == {
        "time_s": 1.1,
        "env_steps": 300.0,
        "episode_return_mean": 31.0,
        "eval_return_mean": 40.0,
        "replay_items/stored": 300.0,
        "replay_items/lost": 0.0,
        "custom_metrics/score": 2.5,
    }  # booleans, nulls and strings left out
    assert "eval_return_mean" not in metrics_of(RECORDS[0])
    assert metrics_of({"x": float("nan"), "league": {"elo": {"latest": 1200.0}}}) == {
        "league/elo/latest": 1200.0
    }
    assert flatten({"algo": {"lr": 0.1, "hidden": [64, 64]}, "env": {}}) == {
        "algo.lr": 0.1,
        "algo.hidden": [64, 64],
        "env": {},
    }
    info = run_info({"algorithm": "ppo", "env": {"id": "CartPole-v1"}, "run": {}}, Path("a/b"))
    assert (info.name, info.project, info.group) == ("b", "apexrl", "")
    assert info.tags == {"algorithm": "ppo", "env": "CartPole-v1"}
    grouped = run_info(
        {"algorithm": "ppo", "env": {"id": "X"}, "run": {"tracker_group": "sw"}}, Path("a/t0")
    )
    assert grouped.group == "sw" and grouped.tags["sweep"] == "sw"


def test_trackers_in_the_config_and_on_the_command_line() -> None:
    cfg = load_config(CONFIG)
    assert cfg.run.trackers == ("tensorboard",)
    assert tracking.with_trackers(cfg, ["mlflow", "wandb", "mlflow"]).run.trackers == (
        "tensorboard",
        "mlflow",
        "wandb",
    )
    for bad in ("[comet]", "[wandb, wandb]"):
        with pytest.raises(ConfigError, match="run.trackers takes each of"):
            load_config(CONFIG, [f"run.trackers={bad}"])


def test_a_tracker_that_is_not_installed_stops_the_launch_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    from apexrl.launch import local

    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else found(name, *a)
    )
    with pytest.raises(tracking.TrackerMissing, match=r"pip install 'apexrl\[wandb\]'"):
        tracking.check_installed(["tensorboard", "wandb"])
    args = cli.build_parser().parse_args(
        ["local", "--config", str(CONFIG), "--track", "wandb", "--run-dir", str(tmp_path / "r")]
    )
    assert local.checked_config(args) is None
    err = capsys.readouterr().err
    assert "pip install 'apexrl[wandb]'" in err and "Traceback" not in err, err
    assert not (tmp_path / "r").exists(), "nothing written, nothing started"


def test_reports_come_often_at_a_runs_start_then_every_report_interval(tmp_path: Path) -> None:
    from apexrl.learning.reporting import Reporter
    from apexrl.runtime.metrics import MetricsWriter, early_interval

    assert early_interval(5.0, 0.0) == pytest.approx(0.1)
    assert early_interval(5.0, 20.0) == pytest.approx(1.1)
    assert early_interval(5.0, 60.0) == pytest.approx(3.1)
    assert early_interval(5.0, 600.0) == 5.0 and early_interval(0.5, 20.0) == 0.5
    cfg = load_config(CONFIG, ["learner.report_interval_s=5"])
    reporter = Reporter(cfg, MetricsWriter(str(tmp_path / "tb")), 0.0, 0)
    now = time.monotonic()
    reporter.started, reporter.last_report = now, now - 0.15
    assert reporter.due(), "a tenth of a second at the start"
    reporter.last_report = now - 0.05
    assert not reporter.due()
    reporter.started = now - 20.0  # 20 s in: every 1.1 s
    reporter.last_report = now - 0.9
    assert not reporter.due()
    reporter.last_report = now - 1.2
    assert reporter.due()
    reporter.started, reporter.last_report = now - 600.0, now - 4.9  # later: the interval
    assert not reporter.due()


# --- the learner's feed with the real clients ----------------------------------------------------


def test_the_feed_sends_records_videos_and_checkpoint_to_wandb_and_mlflow(
    stores: str, tmp_path: Path
) -> None:
    run_dir = finished_run(tmp_path, stores)
    info = info_of(run_dir)
    feed = TrackerFeed([WandbTracker(), MlflowTracker()], info)
    for record in RECORDS:
        feed.record(record)
    feed.close(rundir.checkpoint_path(run_dir), ok=True, timeout_s=120)
    assert not feed.thread.is_alive() and not feed.failures and not feed.dropped
    ids = json.loads(rundir.tracking_path(run_dir).read_text())
    assert set(ids) == {"wandb", "mlflow"}

    (wandb_run,) = read_wandb_run(run_dir)
    assert wandb_run.name == run_dir.name and wandb_run.exit_code == 0
    assert {"ppo", "CartPole-v1"} <= set(wandb_run.tags)
    lr = load_config(CONFIG).algo.lr
    assert float(json.loads(wandb_run.config["algo.lr"])) == lr
    assert [int(row["env_steps"]) for row in wandb_run.history] == [100, 300, 700]
    returns = [float(row["episode_return_mean"]) for row in wandb_run.history]
    assert returns == [9.5, 31.0, 120.0]
    assert [row.get("eval_return_mean") for row in wandb_run.history] == [None, "40", "500"]
    assert float(wandb_run.history[1]["custom_metrics/score"]) == 2.5
    kinds = {kind: files for _name, kind, files in wandb_run.artifacts}
    assert kinds == {"video": ["eval-v3-episode-0.mp4"], "model": ["checkpoint.pt"]}

    (run,) = mlflow_runs(stores)
    assert run.info.run_id == ids["mlflow"] and run.info.status == "FINISHED"
    assert run.data.tags["mlflow.runName"] == run_dir.name
    assert run.data.tags["algorithm"] == "ppo" and run.data.tags["env"] == "CartPole-v1"
    assert float(run.data.params["algo.lr"]) == lr
    assert run.data.params["env.id"] == "CartPole-v1"
    for key in ("episode_return_mean", "replay_items/stored", "time_s"):
        expected = [(r["env_steps"], float(metrics_of(r)[key])) for r in RECORDS]
        assert mlflow_metric_steps(stores, run.info.run_id, key) == expected, key
    assert mlflow_metric_steps(stores, run.info.run_id, "eval_return_mean") == [
        (300, 40.0),
        (700, 500.0),
    ]
    assert mlflow_artifacts(stores, run.info.run_id, "videos") == ["eval-v3-episode-0.mp4"]
    assert mlflow_artifacts(stores, run.info.run_id, "checkpoint") == ["checkpoint.pt"]

    # A resumed run (the learner restarted) logs on into the same MLflow run.
    again = TrackerFeed([MlflowTracker()], info)
    again.record({**RECORDS[-1], "env_steps": 900, "episode_return_mean": 200.0})
    again.close(None, ok=True, timeout_s=60)
    (run,) = mlflow_runs(stores)
    assert run.info.run_id == ids["mlflow"]
    steps = mlflow_metric_steps(stores, run.info.run_id, "episode_return_mean")
    assert steps[-1] == (900, 200.0)


class StuckTracker:
    """A tracker whose calls wait until released: an unreachable server."""

    name = "stuck"

    def __init__(self) -> None:
        self.release, self.logged = threading.Event(), 0

    def start(self, info, run_id):
        return "stuck-1"

    def log(self, metrics, step):
        self.release.wait()
        self.logged += 1

    def artifact(self, path, kind):
        pass

    def finish(self, ok):
        pass


class BrokenTracker(StuckTracker):
    name = "broken"

    def log(self, metrics, step):
        raise ConnectionError("no route to the tracker")


def test_a_stuck_or_broken_tracker_never_blocks_the_learner_and_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    info = run_info({"algorithm": "ppo", "env": {"id": "CartPole-v1"}, "run": {}}, run_dir)
    stuck, broken = StuckTracker(), BrokenTracker()
    with caplog.at_level(logging.WARNING, logger="apexrl.tracking"):
        feed = TrackerFeed([stuck, broken], info, capacity=3)
        started = time.monotonic()
        for step in range(50):
            feed.record({"env_steps": step, "time_s": 0.1 * step})
        took = time.monotonic() - started
        assert feed.dropped >= 45, "the queue holds 3 (and the one being sent)"
        stuck.release.set()
        feed.close(None, ok=True, timeout_s=30)
    assert took < 1.0, f"record() blocked for {took:.1f} s"  # 50 non-blocking puts, generous
    assert stuck.logged == 50 - feed.dropped
    assert feed.failures == {"broken": 50 - feed.dropped}
    text = caplog.text
    assert text.count("the trackers are behind") == 1, text
    assert text.count("no route to the tracker") == 1, text
    assert f"{feed.dropped} records were not sent to the trackers" in text


def test_a_stopping_learner_waits_for_a_stuck_tracker_only_until_it_is_asked_to_stop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    info = run_info({"algorithm": "ppo", "env": {"id": "X"}, "run": {}}, tmp_path)
    stuck = StuckTracker()
    stop = threading.Event()
    with caplog.at_level(logging.WARNING, logger="apexrl.tracking"):
        feed = TrackerFeed([stuck], info)
        feed.record({"env_steps": 1})
        threading.Timer(0.5, stop.set).start()  # SIGTERM from the launcher
        started = time.monotonic()
        feed.close(None, ok=True, timeout_s=30, stop=stop)
        waited = time.monotonic() - started
    assert waited < 5.0, f"waited {waited:.1f} s for a stuck tracker after the stop"
    assert "the trackers did not finish" in caplog.text
    stuck.release.set()


def test_a_tracker_that_cannot_start_leaves_the_run_to_result_json(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Unreachable(StuckTracker):
        name = "unreachable"

        def start(self, info, run_id):
            raise TimeoutError("tracker server did not answer")

    info = run_info({"algorithm": "ppo", "env": {"id": "X"}, "run": {}}, tmp_path)
    with caplog.at_level(logging.WARNING, logger="apexrl.tracking"):
        feed = TrackerFeed([Unreachable()], info)
        feed.record({"env_steps": 1})
        feed.close(None, ok=True, timeout_s=30)
    assert "unreachable could not start" in caplog.text
    assert "apexrl track RUN_DIR --to unreachable" in caplog.text
    assert not rundir.tracking_path(tmp_path).exists()


# --- apexrl track: after the fact ----------------------------------------------------------------


def test_apexrl_track_sends_a_finished_run_and_a_sweeps_trials_as_one_group(
    stores: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = finished_run(tmp_path, stores)
    assert cli.main(["track", str(run_dir), "--to", "mlflow"]) == 0
    (run,) = mlflow_runs(stores)
    assert run.data.tags["mlflow.runName"] == run_dir.name
    assert [s for s, _ in mlflow_metric_steps(stores, run.info.run_id, "time_s")] == [
        100,
        300,
        700,
    ]
    assert mlflow_artifacts(stores, run.info.run_id, "checkpoint") == ["checkpoint.pt"]

    sweep = tmp_path / "sweep-cartpole"
    sweep.mkdir()
    (sweep / "sweep.yaml").write_text("name: sweep-cartpole\n")
    for i in range(2):
        finished_run(sweep, stores, name=f"trial_{i:03d}", **{"algo.lr": str(0.001 * (i + 1))})
    for to in ("mlflow", "wandb"):
        assert cli.main(["track", str(sweep), "--to", to]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.count("trial_00") == 4, out
    runs = {r.data.tags["mlflow.runName"]: r for r in mlflow_runs(stores)}
    parent = runs["sweep-cartpole"]
    for i in range(2):
        child = runs[f"trial_{i:03d}"]
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.tags["sweep"] == "sweep-cartpole"
        assert float(child.data.params["algo.lr"]) == pytest.approx(0.001 * (i + 1))
    assert parent.info.status == "FINISHED"
    for i in range(2):
        (trial,) = read_wandb_run(sweep / f"trial_{i:03d}")
        assert trial.group == "sweep-cartpole" and trial.name == f"trial_{i:03d}"
        assert len(trial.history) == len(RECORDS)
    # Not a run: one line, exit 2.
    assert cli.main(["track", str(tmp_path / "nothing"), "--to", "mlflow"]) == 2
    assert "is not a run directory" in capsys.readouterr().err

"""Launched runs with trackers (slow): the README's PPO CartPole run started with the launcher and
``--track wandb --track mlflow`` (W&B offline, MLflow's file store), and a 2-trial sweep with
``apexrl sweep --track``. What each tracker holds is read back with its own library: the resolved
config, every number of every ``result.json`` record at its env steps, an evaluation video and
the final checkpoint; the sweep's trials as one W&B group and as children of one MLflow run. The
CartPole run, solved in seconds, leaves a curve: several records, not one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_launcher
from tracker_runs import mlflow_artifacts, mlflow_metric_steps, mlflow_runs, read_wandb_run

from apexrl.runtime import rundir
from apexrl.tools.plot import TRAIN_LABEL, read_results, return_figure, throughput_figure
from apexrl.tracking.records import metrics_of

PPO = str(REPO / "configs" / "ppo_cartpole.yaml")
BUDGET_S = 120  # the run's stop_wall_s; CartPole's PPO config solves it in seconds


@pytest.fixture
def stores(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """W&B offline with its folders here; MLflow's file store here (the roles inherit these)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb_home" / name.lower()))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return f"file://{tmp_path / 'mlruns'}"


def records_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "result.json").read_text().splitlines()]


@pytest.mark.slow
def test_a_launched_ppo_run_is_in_wandb_and_mlflow_with_every_record(
    stores: str, tmp_path: Path
) -> None:
    run_dir = tmp_path / "ppo-cartpole"
    args = ["--actors", "2", "--config", PPO, "--run-dir", str(run_dir)]
    args += ["--track", "wandb", "--track", "mlflow", "--set", f"run.mlflow_tracking_uri={stores}"]
    args += ["--set", "actor.eval_video_interval_s=0.01", "--set", f"run.stop_wall_s={BUDGET_S}"]
    code, output = run_launcher(args, BUDGET_S + 180)
    assert code == 0, output[-4000:]
    records = records_of(run_dir)
    assert records[-1]["done"], records[-1]
    print(f"\nPPO CartPole: {len(records)} records in {records[-1]['time_s']} s")
    assert len(records) >= 4, f"a curve, not a dot: {len(records)} records"
    assert "could not start" not in output and "calls failed" not in output, output[-3000:]

    (wandb_run,) = read_wandb_run(run_dir)
    assert wandb_run.name == run_dir.name and wandb_run.exit_code == 0
    assert json.loads(wandb_run.config["env.id"]) == "CartPole-v1"
    # A row per record (W&B's _step counts them), each at its env steps.
    assert [int(row["env_steps"]) for row in wandb_run.history] == [r["env_steps"] for r in records]
    for row, record in zip(wandb_run.history, records, strict=True):
        for key, value in metrics_of(record).items():
            assert float(row[key]) == pytest.approx(value), (key, row, record)
    kinds = [kind for _name, kind, _files in wandb_run.artifacts]
    assert "video" in kinds and kinds[-1] == "model", wandb_run.artifacts

    (run,) = mlflow_runs(stores)
    assert run.data.tags["mlflow.runName"] == run_dir.name and run.info.status == "FINISHED"
    assert run.data.params["algorithm"] == "ppo"
    for key in ("episode_return_mean", "learner_updates", "replay_items/stored"):
        numbers = [(r["env_steps"], metrics_of(r)) for r in records]
        expected = sorted((steps, m[key]) for steps, m in numbers if key in m)
        assert mlflow_metric_steps(stores, run.info.run_id, key) == expected, key
    videos = mlflow_artifacts(stores, run.info.run_id, "videos")
    assert videos and all(v.endswith(".mp4") for v in videos), videos
    assert mlflow_artifacts(stores, run.info.run_id, "checkpoint") == ["checkpoint.pt"]


@pytest.mark.slow
def test_a_tracked_sweeps_trials_are_one_group(stores: str, tmp_path: Path) -> None:
    spec_path = tmp_path / "spec.yaml"
    small = [
        "algo.hidden_sizes=[32]",
        "learner.report_interval_s=1",
        "run.stop_eval_return=null",
        f"run.mlflow_tracking_uri={stores}",
    ]
    spec_path.write_text(
        f"config: {PPO}\n"
        f"overrides: {json.dumps(small)}\n"
        "params: {algo.lr: {grid: [0.001, 0.0003]}}\n"
        "stop: {env_steps: 20000}\n"
        "actors: 1\nevaluation: false\nmax_concurrent: 2\nreport_interval_s: 1\n"
    )
    sweep_dir = tmp_path / "sweep"
    command = [sys.executable, "-m", "apexrl", "sweep", str(spec_path), "--sweep-dir"]
    command += [str(sweep_dir), "--track", "mlflow", "--track", "wandb"]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=600, cwd=REPO, env=dict(os.environ)
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    runs = {r.data.tags["mlflow.runName"]: r for r in mlflow_runs(stores)}
    parent = runs.pop(sweep_dir.name)
    assert sorted(runs) == ["trial_000", "trial_001"], sorted(runs)
    assert parent.info.status == "FINISHED"
    for name, child in runs.items():
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.tags["sweep"] == sweep_dir.name
        records = records_of(sweep_dir / name)
        steps = mlflow_metric_steps(stores, child.info.run_id, "env_steps")
        assert [s for s, _ in steps] == [r["env_steps"] for r in records], name
        (wandb_run,) = read_wandb_run(sweep_dir / name)
        assert wandb_run.group == sweep_dir.name and wandb_run.name == name
        assert len(wandb_run.history) == len(records)
    lrs = sorted(float(r.data.params["algo.lr"]) for r in runs.values())
    assert lrs == [0.0003, 0.001]


@pytest.mark.slow
def test_the_readme_run_leaves_a_curve_in_its_plots(tmp_path: Path) -> None:
    """The README's train command (its run directory given), from a clean start: solved in
    seconds, it still leaves a return curve (6 points or more over 4 env-step counts or more)
    and a line in every throughput panel, read from the figures its PNGs are drawn from."""
    run_dir = tmp_path / "readme-run"
    args = ["--actors", "4", "--learners", "1", "--config", PPO, "--run-dir", str(run_dir)]
    code, output = run_launcher(args, 600)
    assert code == 0, output[-3000:]
    records = read_results(rundir.result_path(run_dir))
    assert records[-1]["done"], records[-1]
    figure = return_figure(records, "env_steps", "env steps")
    (train,) = [line for line in figure.axes[0].get_lines() if line.get_label() == TRAIN_LABEL]
    steps = list(train.get_xdata())
    print(
        f"\nREADME run: {len(records)} records in {records[-1]['time_s']} s of training, "
        f"a return curve of {len(steps)} points over {len(set(steps))} env-step counts"
    )
    # A record every 0.1-0.2 s at the start, about one per PPO rollout: points may share an
    # env-step count, and how many there are depends on how soon the run is solved (9 points
    # in 1.8 s on CI's machine, 16 over 12 counts in 3.3 s here); the curve spans several.
    assert len(steps) >= 6 and len(set(steps)) >= 4, steps
    for ax in throughput_figure(records).axes:
        (line,) = ax.get_lines()
        assert len(line.get_xdata()) >= 2, f"{ax.get_ylabel()}: no line"
    plots = rundir.plots_dir(run_dir)
    assert all((plots / name).stat().st_size > 0 for name in rundir.RETURN_PLOTS.values())

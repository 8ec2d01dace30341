"""Sweeps (``apexrl.sweep``): the search space parsed and expanded by hand, drawn values from
Optuna's sampler, the spec, stop conditions, slots, tables and the pruner's decisions; then real
sweeps: a trial whose launcher fails, 2 learning rates x 2 seeds of PPO on CartPole two at a time
with the live and final tables, and Ctrl-C. No sweep leaves a process behind."""

from __future__ import annotations

import io
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, log_tail, wait_until

from apexrl.config import ConfigError, load_config
from apexrl.sweep import (
    SweepSpec,
    choice,
    grid,
    load_spec,
    loguniform,
    make_spec,
    randint,
    report,
    run_sweep,
    uniform,
)
from apexrl.sweep.loop import Sweep
from apexrl.sweep.runner import Slots, make_study, plan_slots, stop_overrides
from apexrl.sweep.space import (
    Param,
    config_overrides,
    grid_points,
    parse_param,
    parse_space,
    suggest,
    trial_points,
)
from apexrl.sweep.spec import spec_to_dict
from apexrl.sweep.trials import (
    PRUNED,
    RUNNING,
    TERMINATED,
    Trial,
    met_conditions,
    read_new,
    start,
)

PPO = str(REPO / "configs" / "ppo_cartpole.yaml")
# A PPO trial small enough for one core shared with another trial.
SMALL_PPO = [
    "algo.hidden_sizes=[32]",
    "learner.report_interval_s=1",
    "actor.report_interval_s=1",
    "replay.report_interval_s=1",
    "algo.epochs=4",
]


def processes_mentioning(marker: str) -> dict[int, str]:
    """Live processes (not zombies) whose command line mentions ``marker``: pid -> command."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        command = " ".join(a.decode(errors="replace") for a in argv if a)
        if marker in command and state != "Z":
            found[int(entry.name)] = command
    return found


# -- the search space ------------------------------------------------------------------------------


def test_each_form_of_a_param_parses():
    assert parse_param("a", {"grid": [1, 2]}) == Param("grid", (1, 2))
    assert parse_param("a", {"choice": [[32], [64, 64]]}) == Param("choice", ([32], [64, 64]))
    assert parse_param("a", {"uniform": [0, 0.5]}) == Param("uniform", (), 0.0, 0.5)
    # PyYAML reads 1e-5 as a string; a bound takes that form as a float
    assert parse_param("a", {"loguniform": ["1e-5", 0.01]}) == Param("loguniform", (), 1e-5, 0.01)
    assert parse_param("a", {"randint": [0, 9]}) == Param("randint", (), 0.0, 9.0)
    assert parse_param("a", 0.5) == Param("value", (0.5,))
    assert parse_param("a", [64, 64]) == Param("value", ([64, 64],))  # a list is a plain value
    assert grid([1, 2]) == Param("grid", (1, 2)) and choice(["x"]) == Param("choice", ("x",))
    assert uniform(0, 1).drawn and loguniform(1e-4, 1e-2).drawn and randint(1, 3).drawn
    assert not grid([1]).drawn


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"grid": []}, "non-empty list"),
        ({"grid": 3}, "non-empty list"),
        ({"uniform": [1]}, "[low, high]"),
        ({"uniform": [2, 1]}, "low <= high"),
        ({"loguniform": [0, 1]}, "0 < low"),
        ({"randint": [0, 2.5]}, "integer bounds"),
        ({"uniform": ["a", 1]}, "finite number"),
        ({"grid": [1], "choice": [2]}, "alone"),
    ],
)
def test_a_malformed_param_is_refused_with_its_key(raw, words):
    with pytest.raises(ConfigError) as err:
        parse_param("algo.lr", raw)
    assert "params.algo.lr" in str(err.value) and words in str(err.value)


def test_grid_points_are_every_combination_first_key_slowest():
    space = parse_space(
        {
            "algo.lr": {"grid": [0.1, 0.2]},
            "algo.clip": {"uniform": [0.1, 0.3]},  # drawn: not part of the grid
            "seed": {"grid": [0, 1, 2]},
            "env.num_envs": 4,  # fixed: not part of the grid
        }
    )
    assert grid_points(space) == [
        {"algo.lr": 0.1, "seed": 0},
        {"algo.lr": 0.1, "seed": 1},
        {"algo.lr": 0.1, "seed": 2},
        {"algo.lr": 0.2, "seed": 0},
        {"algo.lr": 0.2, "seed": 1},
        {"algo.lr": 0.2, "seed": 2},
    ]
    # the grid num_samples times, as Tune repeats it
    points = trial_points(space, 2)
    assert len(points) == 12 and points[:6] == points[6:] == grid_points(space)
    points[0]["algo.lr"] = 9  # each trial owns its point
    assert points[6]["algo.lr"] == 0.1
    assert grid_points({}) == [{}] and trial_points({"a": uniform(0, 1)}, 3) == [{}, {}, {}]


def test_values_become_overrides_the_config_reads_back():
    overrides = config_overrides(
        {"algo.lr": 1e-5, "seed": 3, "algo.hidden_sizes": [32, 32], "algo.activation": "relu"}
    )
    assert overrides == [
        "algo.lr=1e-05",
        "env.seed=3",
        "learner.seed=3",
        "algo.hidden_sizes=[32, 32]",
        'algo.activation="relu"',
    ]
    cfg = load_config(PPO, overrides)
    assert cfg.algo.lr == 1e-5 and cfg.env.seed == 3 and cfg.learner.seed == 3
    assert cfg.algo.hidden_sizes == (32, 32) and cfg.algo.activation == "relu"


def draws(param: Param, count: int, seed: int = 0) -> list:
    study = make_study(make_spec({"config": PPO, "seed": seed}))
    values = []
    for _ in range(count):
        trial = study.ask()
        values.append(suggest(trial, "key", param))
        study.tell(trial, 0.0)
    return values


def test_drawn_values_stay_in_their_ranges_and_repeat_with_the_seed():
    lr = draws(loguniform(1e-5, 1e-1), 400)
    assert all(1e-5 <= v <= 1e-1 for v in lr)
    decades = [sum(1 for v in lr if 10**e <= v < 10 ** (e + 1)) for e in range(-5, -1)]
    assert all(60 <= n <= 140 for n in decades), decades  # uniform in log space: ~100 each
    assert abs(sum(math.log10(v) for v in lr) / len(lr) + 3) < 0.2
    flat = draws(uniform(2.0, 4.0), 400)
    assert all(2.0 <= v <= 4.0 for v in flat) and abs(sum(flat) / len(flat) - 3.0) < 0.15
    ints = draws(randint(1, 3), 200)
    assert set(ints) == {1, 2, 3} and all(isinstance(v, int) for v in ints)
    picked = draws(choice([[32], [64, 64], "x"]), 200)
    assert {json.dumps(v) for v in picked} == {"[32]", "[64, 64]", '"x"'}
    assert draws(loguniform(1e-5, 1e-1), 20, seed=7) == draws(loguniform(1e-5, 1e-1), 20, seed=7)
    assert draws(loguniform(1e-5, 1e-1), 20, seed=7) != draws(loguniform(1e-5, 1e-1), 20, seed=8)


# -- the spec --------------------------------------------------------------------------------------


def test_a_spec_file_loads_with_flags_and_round_trips(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(
        f"config: {PPO}\n"
        "params:\n  algo.lr: {loguniform: [1e-4, 1e-2]}\n  seed: {grid: [0, 1]}\n"
        "stop: {env_steps: 5000, episode_return_mean: 400}\n"
        "scheduler: {kind: asha, grace_env_steps: 1000}\n"
    )
    spec = load_spec(path, {"max_concurrent": 3})
    assert spec.params == {"algo.lr": loguniform(1e-4, 1e-2), "seed": grid([0, 1])}
    assert spec.stop == {"env_steps": 5000.0, "episode_return_mean": 400.0}
    assert spec.scheduler.kind == "asha" and spec.scheduler.grace_env_steps == 1000
    assert spec.max_concurrent == 3 and spec.cpus_per_trial == 1 and spec.metric
    assert make_spec(spec_to_dict(spec)) == spec


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"max_concurent": 2}, "unknown sweep key 'max_concurent'; did you mean 'max_concurrent'"),
        ({"scheduler": {"knd": "asha"}}, "did you mean 'scheduler.kind'"),
        ({"scheduler": {"kind": "pbt"}}, "scheduler.kind must be one of"),
        ({"mode": "best"}, "mode must be one of"),
        ({"stop": {"env_steps": "many"}}, "stop.env_steps must be a number"),
        ({"actors": 0}, "actors must be at least 1"),
        ({"overrides": [3]}, "list of key=value strings"),
        ({"config": ""}, "base config file is required"),
    ],
)
def test_a_wrong_spec_is_refused_with_one_line(data, words):
    with pytest.raises(ConfigError) as err:
        make_spec({"config": PPO, **data})
    assert words in str(err.value)


def test_stop_conditions_by_hand():
    stop = {"env_steps": 1000.0, "episode_return_mean": 200.0}
    assert met_conditions({"env_steps": 999, "episode_return_mean": None}, stop) == []
    assert met_conditions({"env_steps": 1000, "episode_return_mean": 150.0}, stop) == ["env_steps"]
    both = {"env_steps": 4000, "episode_return_mean": 201.5}
    assert met_conditions(both, stop) == ["env_steps", "episode_return_mean"]
    assert met_conditions({"env_steps": float("nan"), "episode_return_mean": True}, stop) == []
    # the learner judges these itself (a clean stop); the sweep judges every other key
    assert stop_overrides({"env_steps": 3000.0, "time_s": 60.0, "episode_return_mean": 1.0}) == [
        "run.stop_env_steps=3000",
        "run.stop_wall_s=60.0",
    ]


def test_slots_cut_the_cpus_and_gpus():
    spec = make_spec({"config": PPO, "cpus_per_trial": 2})
    assert plan_slots(spec, [0, 1, 2, 3, 4], 0).cpus == [(0, 1), (2, 3)]
    one = make_spec({"config": PPO, "cpus_per_trial": 2, "max_concurrent": 1})
    assert plan_slots(one, [0, 1, 2, 3], 0).cpus == [(0, 1)]
    few = make_spec({"config": PPO, "cpus": 2})
    assert plan_slots(few, [4, 5, 6, 7], 0).cpus == [(4,), (5,)]
    gpu = make_spec({"config": PPO, "gpus_per_trial": 1})
    slots = plan_slots(gpu, [0, 1, 2, 3], 3)
    assert slots.cpus == [(0,), (1,), (2,)] and slots.gpus == [(0,), (1,), (2,)]
    with pytest.raises(ConfigError, match="cpus_per_trial 3"):
        plan_slots(make_spec({"config": PPO, "cpus_per_trial": 3}), [0, 1], 0)
    with pytest.raises(ConfigError, match="gpus_per_trial 1"):
        plan_slots(gpu, [0, 1], 0)


def test_a_trial_is_pinned_to_its_cpus(tmp_path):
    cpus = tuple(sorted(os.sched_getaffinity(0)))[:1]
    trial = Trial(0, {}, tmp_path / "run", tmp_path / "trial.log")
    code = "import os; print(sorted(os.sched_getaffinity(0)), os.environ['CUDA_VISIBLE_DEVICES'])"
    start(trial, [sys.executable, "-c", code], cpus, (1,))
    assert trial.process.wait(timeout=30) == 0 and trial.state == RUNNING
    assert trial.log_path.read_text().split() == [f"[{cpus[0]}]", "1"]


def test_records_are_read_as_whole_lines_with_their_iteration(tmp_path):
    trial = Trial(0, {}, tmp_path, tmp_path / "log")
    result = tmp_path / "result.json"
    assert read_new(trial) == []
    result.write_text('{"env_steps": 10}\n{"env_steps": 20}\n{"env_st')
    assert [r["training_iteration"] for r in read_new(trial)] == [1, 2]
    with open(result, "a") as f:
        f.write('eps": 30}\n')
    assert read_new(trial) == [{"env_steps": 30, "training_iteration": 3}]
    assert trial.metric("env_steps") == 30.0 and trial.last["training_iteration"] == 3


# -- tables and the pruner -------------------------------------------------------------------------


def finished_trial(index: int, values: dict, returns: list[float | None]) -> Trial:
    trial = Trial(index, values, Path(f"/runs/t{index}"), Path(f"/logs/t{index}"), TERMINATED)
    trial.started, trial.ended = 0.0, 12.5
    for i, value in enumerate(returns):
        record = {"env_steps": 1000 * (i + 1), "episode_return_mean": value}
        trial.records.append({**record, "training_iteration": i + 1, "time_s": i})
    return trial


def test_the_final_table_is_sorted_by_the_metric():
    trials = [
        finished_trial(0, {"algo.lr": 0.001, "seed": 0}, [10.0, 30.0]),
        finished_trial(1, {"algo.lr": 0.0003, "seed": 0}, [None]),
        finished_trial(2, {"algo.lr": 0.001, "seed": 1}, [50.0, 40.0]),  # last value counts
        finished_trial(3, {"algo.lr": 0.0003, "seed": 1}, [12.0, None]),  # last finite one
    ]
    assert [t.index for t in report.sort_trials(trials, "episode_return_mean", "max")] == [
        2,
        0,
        3,
        1,
    ]
    assert [t.index for t in report.sort_trials(trials, "episode_return_mean", "min")] == [
        3,
        0,
        2,
        1,
    ]
    text = report.render(trials[:1], ["algo.lr", "seed"], "episode_return_mean", 20.0, ["title"])
    assert text.splitlines() == [
        "title",
        "+-----------+------------+-------+------+------+------+-----------+--------+",
        "| trial     | state      | lr    | seed | iter | time | env steps | return |",
        "|-----------+------------+-------+------+------+------+-----------+--------|",
        "| trial_000 | TERMINATED | 0.001 | 0    |    2 |  12s |     2,000 |   30.0 |",
        "+-----------+------------+-------+------+------+------+-----------+--------+",
    ]
    assert report.column_names(["algo.lr", "optim.lr", "seed"]) == ["algo.lr", "optim.lr", "seed"]
    line = report.best_line(trials, ["algo.lr", "seed"], "episode_return_mean", "max")
    assert line.startswith("best trial: trial_002 (algo.lr=0.001, seed=1): episode_return_mean 40")


def test_successive_halving_stops_a_trial_that_falls_behind_at_a_rung(tmp_path):
    spec = make_spec(
        {
            "config": PPO,
            "scheduler": {"kind": "asha", "grace_env_steps": 1000, "reduction_factor": 2},
            "stop": {"env_steps": 3000},
        }
    )
    sweep = Sweep(spec, tmp_path, [], Slots([(0,)], [], [None]), make_study(spec), io.StringIO())
    trials = []
    for index in range(4):
        trial = Trial(index, {}, tmp_path / f"t{index}", tmp_path / f"t{index}.log", RUNNING)
        trial.optuna_trial = sweep.study.ask()
        trials.append(trial)

    def report_at(trial: Trial, steps: int, value: float) -> str:
        sweep.prune(trial, {"env_steps": steps, "episode_return_mean": value})
        return trial.state

    assert report_at(trials[0], 500, 1.0) == RUNNING  # before the first rung: never stopped
    assert report_at(trials[0], 1000, 10.0) == RUNNING  # alone at the rung
    assert report_at(trials[1], 1000, 5.0) == PRUNED  # below the top half of [5, 10]
    assert "pruned at 1,000 env steps" in trials[1].reason
    assert report_at(trials[2], 1000, 20.0) == RUNNING
    assert report_at(trials[0], 2000, 11.0) == RUNNING  # alone at the second rung
    # a record that meets the stop condition is the trial's end, not a rung to be judged at
    trials[3].run_dir.mkdir()
    record = {"env_steps": 3000, "episode_return_mean": 0.0}
    (trials[3].run_dir / "result.json").write_text(json.dumps(record) + "\n")
    sweep.watch(trials[3], time.monotonic())
    assert trials[3].state == RUNNING and trials[3].reason == "env_steps 3000 >= 3000"


# -- real sweeps -----------------------------------------------------------------------------------


def test_a_trial_whose_launcher_fails_is_an_error_and_the_sweep_goes_on(tmp_path):
    out = io.StringIO()
    spec = {
        "config": PPO,
        "overrides": ["env.id=NoSuchEnv-v9"],  # the launcher's preflight refuses it
        "params": {"seed": grid([0, 1])},
        "max_concurrent": 2,
        "report_interval_s": 1.0,
    }
    result = run_sweep(spec, sweep_dir=tmp_path / "sweep", out=out)
    assert [t.state for t in result.trials] == ["ERROR", "ERROR"] and not result.ok
    assert all(t.exit_code == 2 for t in result.trials)
    assert "NoSuchEnv-v9" in result.trials[0].log_path.read_text()
    assert "its launcher exited with 2" in out.getvalue()
    # the final summary shows why: the last lines of each failed trial's log
    summary = out.getvalue().rsplit("== Sweep finished", 1)[1]
    assert summary.count("NoSuchEnv-v9") >= 2, summary
    assert processes_mentioning(str(tmp_path)) == {}


class FailingOut(io.StringIO):
    """A console that raises once every role of the sweep's first trial runs."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker

    def write(self, text: str) -> int:
        if len(processes_mentioning(self.marker)) >= 6:  # launcher, fork server, 4 roles
            raise RuntimeError("the user's console broke")
        return super().write(text)


def test_an_exception_in_a_sweep_stops_every_process(tmp_path):
    sweep_dir = tmp_path / "sweep"
    spec = {
        "config": PPO,
        "overrides": SMALL_PPO,
        "actors": 1,
        "evaluation": False,
        "max_concurrent": 1,
        "report_interval_s": 0.5,
        "stop": {"env_steps": 10_000_000},
    }
    with pytest.raises(RuntimeError, match="console broke"):
        run_sweep(spec, sweep_dir=sweep_dir, out=FailingOut(str(sweep_dir)))
    assert processes_mentioning(str(sweep_dir)) == {}
    (kept,) = json.loads((sweep_dir / "trials.json").read_text())
    assert kept["state"] == "STOPPED" and "RuntimeError" in kept["reason"]


def test_an_unknown_key_stops_the_sweep_before_any_trial(tmp_path):
    spec = {"config": PPO, "params": {"algo.lrr": grid([0.1, 0.2])}}
    with pytest.raises(ConfigError, match="did you mean 'algo.lr'"):
        run_sweep(spec, sweep_dir=tmp_path / "sweep")
    assert not (tmp_path / "sweep").exists()


@pytest.mark.slow
def test_a_sweep_of_two_learning_rates_and_two_seeds_on_cartpole(tmp_path):
    """2 x 2 trials of PPO, 2 at a time on one CPU each, 1 actor each; each trial stopped by the
    sweep at 1,000 learner updates (a key the learner does not judge; enough that the actors'
    returns are in the records by then): the live table shows two trials running side by side,
    the final table is sorted by the metric, nothing is left."""
    out = io.StringIO()
    spec = SweepSpec(
        config=PPO,
        overrides=(*SMALL_PPO, "run.stop_wall_s=0", "run.stop_eval_return=null"),
        params={"algo.lr": grid([0.001, 0.0003]), "seed": grid([0, 1])},
        stop={"learner_updates": 1000.0, "env_steps": 2_000_000.0},
        metric="episode_return_mean",
        actors=1,
        evaluation=False,
        max_concurrent=2,
        cpus_per_trial=1,
        report_interval_s=2.0,
        trial_timeout_s=150.0,
    )
    started = time.monotonic()
    result = run_sweep(spec, sweep_dir=tmp_path / "sweep", out=out)
    took = time.monotonic() - started
    text = out.getvalue()
    tails = "\n".join(log_tail(t.log_path, 15) for t in result.trials)
    assert result.ok, f"{[(t.name, t.state, t.reason) for t in result.trials]}\n{text}\n{tails}"
    assert len(result.trials) == 4
    for trial in result.trials:
        assert trial.state == TERMINATED and trial.reason.startswith("learner_updates")
        updates = [r["learner_updates"] for r in trial.records]
        met = [i for i, n in enumerate(updates) if n >= 1000]
        # stopped at the first record that met it: at most the record of its stop came after
        assert met and met[0] >= len(updates) - 2, updates
        assert (trial.run_dir / "config.yaml").is_file() and (
            trial.run_dir / "result.json"
        ).is_file()
        cfg = load_config(trial.run_dir / "config.yaml")
        assert cfg.algo.lr == trial.values["algo.lr"] and cfg.env.seed == trial.values["seed"]
    assert {(t.values["algo.lr"], t.values["seed"]) for t in result.trials} == {
        (0.001, 0),
        (0.001, 1),
        (0.0003, 0),
        (0.0003, 1),
    }
    # side by side: two trials were running at once, and their run times overlap
    assert "4 trials: 2 RUNNING, 2 PENDING" in text
    first, second = sorted(result.trials, key=lambda t: t.index)[:2]
    assert first.started < second.ended and second.started < first.ended
    # the live table, then the final one sorted by the metric
    assert text.count("== Sweep · ") >= 2 and "| trial " in text and "| lr " in text
    final = text.split("== Sweep finished")[-1]
    ranked = [line.split()[1] for line in final.splitlines() if line.startswith("| trial_")]
    assert ranked == [t.name for t in result.trials]
    values = [t.metric("episode_return_mean") for t in result.trials]
    assert values == sorted(values, reverse=True)
    assert "best trial: " in final and (result.sweep_dir / "curves.png").stat().st_size > 10_000
    kept = json.loads((result.sweep_dir / "trials.json").read_text())
    assert [t["trial"] for t in kept] == ranked
    assert processes_mentioning(str(tmp_path)) == {}
    print(f"sweep of 4 trials took {took:.0f} s\n{final}")


@pytest.mark.slow
def test_ctrl_c_stops_every_trial_of_a_sweep(tmp_path):
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(
        f"config: {PPO}\n"
        f"overrides: {json.dumps(SMALL_PPO)}\n"
        "params: {seed: {grid: [0, 1]}}\n"
        "stop: {env_steps: 10000000}\n"
        "actors: 1\nevaluation: false\nmax_concurrent: 2\nreport_interval_s: 1\n"
    )
    sweep_dir = tmp_path / "sweep"
    log_path = tmp_path / "sweep.log"
    with open(log_path, "wb") as log_file:
        sweep = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "apexrl",
                "sweep",
                str(spec_path),
                "--sweep-dir",
                str(sweep_dir),
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        results = [sweep_dir / f"trial_00{i}" / "result.json" for i in range(2)]
        assert wait_until(lambda: all(p.is_file() for p in results), 120), log_tail(log_path)
        assert len(processes_mentioning(str(sweep_dir))) >= 2 * 5  # launcher, servers, roles
        sweep.send_signal(signal.SIGINT)
        assert sweep.wait(timeout=60) == 130, log_tail(log_path)
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
            sweep.wait()
        left = processes_mentioning(str(sweep_dir))
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert left == {}
    text = log_path.read_text()
    assert "== Sweep finished" in text and "2 STOPPED" in text


# -- SLURM: one job per trial ----------------------------------------------------------------------


def test_each_trial_becomes_its_own_slurm_job(tmp_path, capsys):
    from apexrl.launch.slurm import make_plan
    from apexrl.sweep.slurm import parse_slurm_args, slurm_argv, submit_trials

    spec = make_spec(
        {
            "config": PPO,
            "params": {"algo.lr": grid([0.001, 0.0003]), "seed": grid([0, 1])},
            "stop": {"env_steps": 5000},
            "actors": 2,
            "cpus_per_trial": 4,
            "evaluation": False,
        }
    )
    assert submit_trials(spec, tmp_path, [], ["--partition=gpu"], dry_run=True) == 0
    scripts = capsys.readouterr().out
    assert [line for line in scripts.splitlines() if line.startswith("RUN_DIR=")] == [
        f"RUN_DIR={tmp_path}/trial_00{i}" for i in range(4)
    ]
    assert scripts.count("#SBATCH --partition=gpu") == 4 and not any(tmp_path.iterdir())
    argv = slurm_argv(spec, config_overrides({"algo.lr": 0.0003, "seed": 1}), tmp_path, [], False)
    plan = make_plan(parse_slurm_args(argv))
    assert plan.cfg.algo.lr == 0.0003 and plan.cfg.env.seed == 1 and plan.num_actors == 2
    assert plan.cpus_per_node == 4 and not plan.evaluate


def test_a_slurm_sweep_refuses_what_only_a_watching_sweep_can_do(tmp_path):
    from apexrl.sweep.slurm import submit_trials

    watched = make_spec({"config": PPO, "stop": {"episode_return_mean": 400}})
    with pytest.raises(ConfigError, match="need the sweep to watch"):
        submit_trials(watched, tmp_path, [], [], dry_run=True)
    pruned = make_spec({"config": PPO, "scheduler": {"kind": "asha"}})
    with pytest.raises(ConfigError, match="a scheduler needs"):
        submit_trials(pruned, tmp_path, [], [], dry_run=True)

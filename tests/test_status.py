"""``apexrl status``: its rows from hand-made readings, then for real: the table of a live run
started by the launcher (two actors), the same run once stopped, a serial run (every role a
thread of one process) and a dead address."""

from __future__ import annotations

import collections
import json
import math
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from conftest import REPO, free_addr, wait_until
from test_launch_local import Launch, assert_nothing_left, launch, wait_for_roles  # noqa: F401
from test_serial import run_dir_of, serial_run, start  # noqa: F401

from apexrl.launch.run_state import result_size, run_finished
from apexrl.replay.actors import ActorProgress, actor_stats, env_steps_per_s
from apexrl.tools.status import Reading, build_rows, render

STATUS_TIMEOUT_S = 60.0  # a hang guard for one `apexrl status --once`


def status(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "apexrl", "status", "--once", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=STATUS_TIMEOUT_S,
    )


def table(text: str) -> dict[str, dict[str, str]]:
    """The rows of a printed table: role -> column -> cell."""
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[1:]:
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
        rows[cells["role"]] = cells
    return rows


# -- by hand ---------------------------------------------------------------------------------------


def test_actor_rate_is_measured_over_its_chunks() -> None:
    # Chunks at t = 10, 11, 12 s, its env steps so far 100, 250, 400: 300 steps in 2 s.
    marks = collections.deque([(10.0, 100), (11.0, 250), (12.0, 400)])
    assert env_steps_per_s(marks) == (400 - 100) / (12 - 10)
    assert math.isnan(env_steps_per_s(collections.deque([(10.0, 100)])))
    progress = ActorProgress(env_steps=400, weights_version=7, last_heard=12.0, marks=marks)
    assert actor_stats("3", progress, now=15.5) == {
        "actor/3/env_steps": 400.0,
        "actor/3/env_steps_per_s": 150.0,
        "actor/3/weights_version": 7.0,
        "actor/3/last_heard_s": 15.5 - 12.0,
    }


def test_rows_from_two_readings() -> None:
    replay = {
        "replay/size": 600.0,
        "replay/num_inserted": 1000.0,
        "replay/num_sampled": 500.0,
        "replay/env_steps": 5000.0,
        "actor/0/env_steps_per_s": 150.0,
        "actor/0/weights_version": 10.0,
        "actor/0/last_heard_s": 0.5,
        "actor/0/env_steps": 2500.0,
        "actor/1/weights_version": 12.0,
        "actor/1/last_heard_s": 45.0,  # silent
        "actor/eval_0/weights_version": 9.0,
        "actor/eval_0/last_heard_s": 1.0,
    }
    before = Reading(100.0, {**replay, "replay/num_inserted": 400.0}, {"params/num_served": 8.0})
    now = Reading(
        102.0,  # 2 s later: (1000 - 400) / 2 = 300 inserts/s; (20 - 8) / 2 = 6 served/s
        replay,
        {"params/version": 12.0, "params/num_served": 20.0},
        learner={"updates_per_s": 45.25, "samples_per_s": 1448.0, "data_wait_fraction": 0.25},
        learner_age_s=1.5,
        roles=[
            {"name": "learner", "pid": 42, "restarts": 0, "state": "running"},
            {"name": "actor_1", "pid": 44, "restarts": 2, "state": "running"},
            {"name": "actor_2", "pid": 45, "restarts": 1, "state": "restarting"},
        ],
        launcher_alive=True,
    )
    rows = {row.role: row for row in build_rows(now, before)}
    assert list(rows) == ["replay", "params", "learner", "actor_0", "actor_1", "actor_2", "eval"]
    assert rows["replay"].throughput == "in 300/s out 0.0/s"
    assert rows["replay"].details.startswith("size 600 · env steps 5,000")
    assert (rows["params"].throughput, rows["params"].version) == ("served 6.0/s", "12")
    assert rows["learner"].throughput == "45.2/s upd 1,448/s smp"
    assert "data wait 25%" in rows["learner"].details
    assert (rows["learner"].pid, rows["learner"].heard) == ("42", "1.5s")
    actor_0 = rows["actor_0"]
    assert (actor_0.throughput, actor_0.version, actor_0.lag) == ("150 steps/s", "10", "2")
    assert (actor_0.state, actor_0.restarts) == ("ok", "-")  # not in roles.json
    assert (rows["actor_1"].state, rows["actor_1"].restarts, rows["actor_1"].lag) == (
        "silent",
        "2",
        "0",
    )
    assert (rows["actor_2"].state, rows["actor_2"].version) == ("restarting", "-")
    assert (rows["eval"].version, rows["eval"].lag, rows["eval"].heard) == ("9", "3", "1.0s")
    text = render(list(rows.values()), "run", ("a line",))
    assert table(text)["actor_0"]["lag"] == "2"


def test_no_answer_from_a_dead_address() -> None:
    result = status("--replay", free_addr(), "--params", free_addr(), "--timeout", "0.5")
    assert result.returncode == 1, result.stderr  # printed, but a server did not answer
    rows = table(result.stdout)
    assert rows["replay"]["state"] == rows["params"]["state"] == "no answer", result.stdout


def test_run_finished_reads_only_the_tail_of_this_sessions_lines(tmp_path: Path) -> None:
    """The launchers' look for the stop condition (five a second) reads the file's last line
    however long the file has grown, and never a line written before the session's offset."""
    path = tmp_path / "result.json"
    line = json.dumps({"learner_updates": 1, "done": False, "pad": "x" * 500}) + "\n"
    path.write_text(line * 2000)  # 1 MB, far past the tail that is read
    offset = result_size(tmp_path)
    assert not run_finished(tmp_path, 0)
    with open(path, "a") as f:
        f.write(json.dumps({"learner_updates": 2, "done": True}) + "\n")
    assert run_finished(tmp_path, 0) and run_finished(tmp_path, offset)
    assert not run_finished(tmp_path, result_size(tmp_path))  # a later session's: none yet


def test_usage_errors_exit_2(tmp_path) -> None:
    assert status(str(tmp_path)).returncode == 2  # no config.yaml there
    assert status("--replay", free_addr()).returncode == 2  # no --params


# -- a live run ------------------------------------------------------------------------------------


def test_status_of_a_live_run(launch: Callable[..., Launch]) -> None:  # noqa: F811
    launched = launch(
        "--actors", "2", "--learners", "1", overrides=("run.stop_env_steps=100000000",)
    )
    roles = {"local", "replay", "params", "learner", "actor_0", "actor_1", "eval"}
    pids = wait_for_roles(launched, roles)
    wanted = ("replay", "params", "learner", "actor_0", "actor_1", "eval")

    def complete() -> tuple[subprocess.CompletedProcess, dict] | None:
        if not [r for r in launched.results() if r["learner_updates"] > 0]:
            return None
        result = status(str(launched.run_dir()))
        rows = table(result.stdout) if result.returncode == 0 else {}
        ready = all(rows.get(name, {}).get("version", "-") != "-" for name in wanted[2:])
        return (result, rows) if ready else None

    found = wait_until(complete, 120.0, interval_s=1.0)
    assert found, f"no complete status table\n{status(str(launched.run_dir())).stdout}"
    result, rows = found
    print(result.stdout)  # the table of a real run, for the record (-s)
    assert set(wanted) <= set(rows), result.stdout
    assert all(rows[name]["state"] == "ok" for name in wanted), result.stdout
    assert int(rows["replay"]["details"].split(" · ")[0].removeprefix("size ").replace(",", "")) > 0
    params_version = int(rows["params"]["version"].replace(",", ""))  # "1,000": thousands
    assert params_version >= 0
    for name in ("actor_0", "actor_1", "eval"):
        row = rows[name]
        assert 0 <= int(row["version"].replace(",", "")) <= params_version, result.stdout
        lag = int(row["lag"].replace(",", ""))  # thousands separators, as the versions
        assert lag == params_version - int(row["version"].replace(",", "")), result.stdout
        assert row["pid"] == str(pids[name]) and row["restarts"] == "0", result.stdout
    assert rows["actor_0"]["throughput"].endswith("steps/s")
    assert "upd" in rows["learner"]["throughput"] and rows["learner"]["pid"] == str(pids["learner"])
    roles_file = json.loads((launched.run_dir() / "roles.json").read_text())
    assert {r["name"] for r in roles_file["roles"]} == set(wanted)

    # Stopped: both servers are silent, and the launcher's last roles.json says every role exited.
    launched.popen.terminate()
    assert launched.wait(30.0) is not None, launched.tails()
    after = status(str(launched.run_dir()), "--timeout", "0.5")
    assert after.returncode == 1, after.stdout + after.stderr
    rows = table(after.stdout)
    assert rows["replay"]["state"].startswith("exited"), after.stdout
    roles_file = json.loads((launched.run_dir() / "roles.json").read_text())
    states = {r["name"]: r["state"] for r in roles_file["roles"]}
    assert set(states.values()) == {"exited"}, states
    assert_nothing_left(launched, pids)


def test_status_of_a_serial_run(tmp_path: Path, serial_run: list[subprocess.Popen]) -> None:  # noqa: F811
    """A serial run's servers are in-process: status reaches them through the Stats relay that
    roles.json names, and shows every role of the one process."""
    popen = start(tmp_path, "--actors", "1", "--set", "run.stop_eval_return=null")
    serial_run.append(popen)
    wanted = ("replay", "params", "learner", "actor_0", "eval")

    def complete() -> tuple[subprocess.CompletedProcess, dict] | None:
        assert popen.poll() is None, (tmp_path / "console.log").read_text()[-3000:]
        run_dirs = [p for p in tmp_path.iterdir() if (p / "roles.json").is_file()]
        if not run_dirs:
            return None
        result = status(str(run_dirs[0]))
        rows = table(result.stdout) if result.returncode == 0 else {}
        ready = all(rows.get(name, {}).get("state") == "ok" for name in wanted)
        return (result, rows) if ready else None

    found = wait_until(complete, 120.0, interval_s=1.0)
    assert found, (tmp_path / "console.log").read_text()[-3000:]
    result, rows = found
    print(result.stdout)  # the table of a serial run, for the record (-s)
    run_dir = run_dir_of(tmp_path)
    config = (run_dir / "config.yaml").read_text()
    assert "inproc://" in config and "tcp://127.0.0.1:" in result.stdout  # asked the relay
    for name in wanted:  # all of them threads of the one process
        assert rows[name]["pid"] == str(popen.pid) and rows[name]["restarts"] == "0", result.stdout
    params_version = int(rows["params"]["version"])
    assert 0 <= int(rows["actor_0"]["version"]) <= params_version, result.stdout
    assert "upd" in rows["learner"]["throughput"], result.stdout

    # Stopped: the relay is gone with the run, and roles.json says every role exited.
    popen.send_signal(signal.SIGINT)
    assert popen.wait(timeout=60) == 130, (tmp_path / "console.log").read_text()[-3000:]
    after = status(str(run_dir), "--timeout", "0.5")
    assert after.returncode == 1, after.stdout + after.stderr
    rows = table(after.stdout)
    assert all(rows[name]["state"] == "exited 0" for name in wanted), after.stdout

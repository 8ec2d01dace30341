"""Every script in examples/ runs as a newcomer runs it (``python3 examples/X.py`` from the
repository root): it exits 0 by itself, prints what proves it trained (the env steps of its run,
a return), and leaves no process of its runs behind. The runs go to ``runs/examples/``; the test
removes the ones it made.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, log_tail, wait_until
from test_launch_local import run_processes

EXAMPLES_RUNS = REPO / "runs" / "examples"
TIMEOUT_S = 240.0  # each takes 10 to 25 s alone on two cores; a busy machine is slower
NUMBER = r"(-?\d+(?:\.\d+)?)"


def example_runs() -> set[Path]:
    """The run directories and sweep directories under runs/examples/ now."""
    if not EXAMPLES_RUNS.is_dir():
        return set()
    found = {p for p in EXAMPLES_RUNS.iterdir() if p.is_dir() and p.name != "sweeps"}
    sweeps = EXAMPLES_RUNS / "sweeps"
    return found | ({p for p in sweeps.iterdir() if p.is_dir()} if sweeps.is_dir() else set())


def apexrl_alive(pid: int) -> bool:
    """Whether ``pid`` is a live apexrl process (not a zombie; its command line says apexrl)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return False
    return state != "Z" and b"apexrl" in cmdline


def left_behind(run: Path) -> list[int]:
    """PIDs of a run's processes still alive: every launcher and role its roles.json files name
    (a sweep's trials each have one), and any process whose command line names the run."""
    pids = set(run_processes(run.name))
    for roles in run.rglob("roles.json"):
        try:
            table = json.loads(roles.read_text())
        except ValueError:
            continue
        pids.add(table.get("launcher_pid"))
        pids |= {role.get("pid") for role in table.get("roles", [])}
    return sorted(pid for pid in pids if isinstance(pid, int) and apexrl_alive(pid))


def run_example(name: str, log: Path) -> tuple[int, str, list[Path]]:
    """``python3 examples/<name>`` from the repository root in its own session: (exit status,
    output, the run directories it made). Fails when it runs past TIMEOUT_S or leaves a process
    of its runs; whatever is left is killed and its runs are removed."""
    before = example_runs()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, f"examples/{name}"],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    made: list[Path] = []
    try:
        try:
            code = proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} still ran after {TIMEOUT_S:.0f} s:\n{log_tail(log, 40)}")
        made = sorted(example_runs() - before)
        left = {run.name: wait_until(lambda r=run: not left_behind(r), 10.0) for run in made}
        assert all(left.values()), (
            f"{name} left processes: {[r.name for r in made if left_behind(r)]}"
        )
        return code, log.read_text(errors="replace"), made
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the script's session, whatever is left of it
        proc.wait()
        for run in made or sorted(example_runs() - before):
            for pid in left_behind(run):  # the launchers' own sessions
                kill_quietly(pid)
            shutil.rmtree(run, ignore_errors=True)
        for folder in (EXAMPLES_RUNS / "sweeps", EXAMPLES_RUNS):  # when nothing else is there
            with contextlib.suppress(OSError):
                folder.rmdir()


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def number(pattern: str, output: str) -> float:
    match = re.search(pattern, output)
    assert match, f"no line matching {pattern!r} in:\n{output[-3000:]}"
    return float(match.group(1))


def test_train_from_python(tmp_path: Path) -> None:
    started = time.monotonic()
    code, output, made = run_example("train_from_python.py", tmp_path / "out.log")
    assert code == 0, output[-3000:]
    assert len(made) == 1 and (made[0].name.startswith("ppo-CartPole-v1-")), made
    assert number(rf"trained for {NUMBER} env steps", output) >= 15_000
    mean = number(rf"evaluation return over 10 episodes: {NUMBER}", output)
    assert 1 <= mean <= 500  # CartPole's returns: one per step, at most 500
    print(f"train_from_python.py: {time.monotonic() - started:.0f} s, evaluation return {mean}")


def test_custom_env(tmp_path: Path) -> None:
    code, output, made = run_example("custom_env.py", tmp_path / "out.log")
    assert code == 0, output[-3000:]
    assert [run.name.rsplit("-", 2)[0] for run in made] == ["ppo-examples.custom_env.Corridor-v0"]
    assert number(rf"trained for {NUMBER} env steps", output) >= 10_000
    # Corridor's returns lie between 50 steps of -0.1 and the best, 0.4.
    assert -5.0 <= number(rf"evaluation return: {NUMBER}", output) <= 0.4 + 1e-6


def test_callbacks(tmp_path: Path) -> None:
    code, output, made = run_example("callbacks.py", tmp_path / "out.log")
    assert code == 0, output[-3000:]
    assert len(made) == 1, made
    assert number(rf"trained for {NUMBER} env steps", output) >= 15_000
    # The learner's metric (on_train_result) and the actors' (on_episode_end) reached the records.
    assert number(rf"env_steps_per_update {NUMBER}", output) > 0
    assert number(rf"mean episode length: {NUMBER}", output) >= 8  # CartPole ends no sooner


def test_sweep(tmp_path: Path) -> None:
    code, output, made = run_example("sweep.py", tmp_path / "out.log")
    assert code == 0, output[-6000:]  # with the last lines of a failed trial's log
    assert len(made) == 1 and made[0].name.startswith("sweep-ppo-CartPole-v1-"), made
    trials = re.findall(
        rf"(trial_\d+): \{{'algo.lr': {NUMBER}\}} TERMINATED, (\d+) env steps", output
    )
    assert sorted(float(lr) for _, lr, _ in trials) == [3e-4, 1e-3], output[-3000:]
    assert all(int(steps) >= 10_000 for _, _, steps in trials), trials
    assert "best: {'algo.lr': " in output


def test_external_env_client(tmp_path: Path) -> None:
    """A CartPole stepped by the example's own process trains the run it starts to 475."""
    code, output, made = run_example("external_env_client.py", tmp_path / "out.log")
    assert code == 0, output[-3000:]
    assert len(made) == 1 and made[0].name.startswith("external-"), made
    assert number(r"played (\d+) episodes", output) >= 10
    assert number(rf"evaluation {NUMBER} after", output) >= 475

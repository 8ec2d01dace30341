"""A sweep's trials: each one an ordinary run, started as ``apexrl local`` in a process of its own.

A trial's launcher runs in its own session, pinned to its own CPUs (and given its own GPUs), with
its console in ``<sweep dir>/logs/<trial>.log`` and its run directory ``<sweep dir>/<trial>/``.
The sweep reads the records the learner appends to the run's ``result.json`` (``read_new``) and
stops a trial by SIGTERM to its launcher, which stops every role of the run as on Ctrl-C (the
learner writes its checkpoint); whatever is left after ``STOP_TIMEOUT_S`` gets SIGKILL, and the
roles follow their launcher (they get SIGTERM when it dies).

``met_conditions`` (which stop conditions a record meets) is pure; the rest touches processes
and files.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apexrl.runtime import rundir

PENDING, RUNNING, TERMINATED, PRUNED, ERROR, STOPPED = (
    "PENDING",
    "RUNNING",
    "TERMINATED",  # met its stop condition (or its config's own)
    "PRUNED",  # stopped early by the scheduler
    "ERROR",  # its launcher exited with an error
    "STOPPED",  # the sweep ended before the trial did (Ctrl-C, an error, the time limit)
)
STOP_TIMEOUT_S = 20.0  # seconds a launcher has to stop its roles after SIGTERM (it needs <= 10)
# Seconds the learner has to stop by itself once a stop condition it judges (run.stop_*) shows in
# result.json, before the sweep stops the trial itself.
SELF_STOP_GRACE_S = 30.0


@dataclass
class Trial:
    """One trial: its values, its run, its process and what it reported."""

    index: int
    values: dict[str, Any]  # swept key -> value (grid and drawn keys)
    run_dir: Path
    log_path: Path
    state: str = PENDING
    process: subprocess.Popen | None = None
    started: float | None = None  # time.monotonic() at the start
    ended: float | None = None
    records: list[dict[str, Any]] = field(default_factory=list)  # result.json, in order
    offset: int = 0  # bytes of result.json read so far
    exit_code: int | None = None
    reason: str = ""  # why it ended
    stop_seen: float | None = None  # when a stop condition first showed
    optuna_trial: Any = None  # the study's trial (drawn values, intermediate metric values)

    @property
    def name(self) -> str:
        return f"trial_{self.index:03d}"

    @property
    def last(self) -> dict[str, Any]:
        return self.records[-1] if self.records else {}

    def elapsed_s(self, now: float) -> float | None:
        if self.started is None:
            return None
        return (self.ended if self.ended is not None else now) - self.started

    def metric(self, key: str) -> float | None:
        """The last finite value of ``key`` in the trial's records."""
        for record in reversed(self.records):
            value = finite(record.get(key))
            if value is not None:
                return value
        return None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def met_conditions(record: dict[str, Any], stop: dict[str, float]) -> list[str]:
    """The keys of the stop conditions a result.json record meets (``key >= threshold``)."""
    values = {k: finite(record.get(k)) for k in stop}
    return [k for k, threshold in stop.items() if values[k] is not None and values[k] >= threshold]


def trial_command(
    config: str, overrides: list[str], run_dir: Path, actors: int, learners: int, evaluation: bool
) -> list[str]:
    """The trial's ``apexrl local`` command line, as a user would type it."""
    command = [sys.executable, "-m", "apexrl", "local", "--actors", str(actors)]
    command += ["--learners", str(learners), "--config", config, "--run-dir", str(run_dir)]
    if not evaluation:
        command.append("--no-eval")
    for override in overrides:
        command += ["--set", override]
    return command


def start(trial: Trial, command: list[str], cpus: tuple[int, ...], gpus: tuple[int, ...]) -> None:
    """Start the trial's launcher in its own session, pinned to ``cpus``; ``gpus`` become its
    ``CUDA_VISIBLE_DEVICES`` (none given: the variable is left as it is)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(max(len(cpus), 1))}
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))

    def pin() -> None:  # in the child before exec: every role it starts inherits the CPUs
        if cpus:
            os.sched_setaffinity(0, cpus)

    trial.log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(trial.log_path, "ab") as log_file:
        trial.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=pin if cpus and hasattr(os, "sched_setaffinity") else None,
        )
    trial.state = RUNNING
    trial.started = time.monotonic()


def read_new(trial: Trial) -> list[dict[str, Any]]:
    """The records the learner appended to the trial's ``result.json`` since the last call (whole
    lines only), each given ``training_iteration`` (its place in the file, from 1)."""
    try:
        with open(rundir.result_path(trial.run_dir), "rb") as f:
            f.seek(trial.offset)
            data = f.read()
    except OSError:
        return []
    end = data.rfind(b"\n") + 1
    trial.offset += end
    new = []
    for line in data[:end].decode(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            record["training_iteration"] = len(trial.records) + len(new) + 1
            new.append(record)
    trial.records += new
    return new


def request_stop(trial: Trial, state: str, reason: str) -> None:
    """SIGTERM to the trial's launcher (it stops every role of the run); the trial ends as
    ``state`` once its process is gone (``reap``)."""
    if trial.alive() and trial.state == RUNNING:
        trial.process.send_signal(signal.SIGTERM)
    trial.state, trial.reason = state, reason
    trial.stop_seen = trial.stop_seen or time.monotonic()


def reap(trial: Trial) -> bool:
    """Whether the trial's process has ended (then its exit code and end time are recorded); a
    launcher that outlives ``STOP_TIMEOUT_S`` after a stop request gets SIGKILL."""
    if trial.process is None:
        return False
    code = trial.process.poll()
    if code is None:
        asked = trial.state != RUNNING and trial.stop_seen is not None
        if asked and time.monotonic() - trial.stop_seen > STOP_TIMEOUT_S:
            kill_group(trial.process)
        return False
    trial.exit_code = code
    trial.ended = trial.ended or time.monotonic()
    return True


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL to a launcher's session (it leads its own): the launcher and whatever it started
    in its session; roles in sessions of their own get SIGTERM as their launcher dies."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop_all(trials: list[Trial], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stop every trial that still runs: SIGTERM to each launcher not yet asked (a second signal
    would cut its own stop short), then SIGKILL to those still there ``timeout_s`` after they
    were asked; waits until each is gone."""
    now = time.monotonic()
    for trial in trials:
        if trial.alive() and trial.stop_seen is None:
            trial.process.send_signal(signal.SIGTERM)
            trial.stop_seen = now
    for trial in trials:
        if not trial.alive():
            continue
        try:
            trial.process.wait(timeout=max(trial.stop_seen + timeout_s - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            kill_group(trial.process)
            trial.process.wait()
    for trial in trials:
        reap(trial)

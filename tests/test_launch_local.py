"""``scripts/launch_local.sh`` for real: a short run that ends by itself, Ctrl-C, a killed actor, a
killed replay server, and a refused ``--learners 0``. Every test uses its own log directory, so the
processes of its run are the ones whose command line contains that path (read from /proc)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import REPO, SMALL_OVERRIDES, log_tail, set_args, wait_until

from apexrl.runtime.metrics import early_interval

SCRIPT = REPO / "scripts" / "launch_local.sh"
EXIT_BOUND_S = 15.0  # the launcher's own stop: SIGTERM to children, SIGKILL after 10 s


def run_processes(marker: str) -> dict[int, list[str]]:
    """Live processes (not zombies) whose command line mentions ``marker``: pid -> argv."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # it exited while we looked
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        if any(marker in a for a in args):
            found[int(entry.name)] = args
    return found


def role_of(argv: list[str]) -> str:
    """``replay``, ``params``, ``learner``, ``actor_<i>``, ``eval``, ``local`` or ``script``."""
    if "apexrl" not in argv:
        return "script"  # launch_local.sh before it execs the launcher
    role = argv[argv.index("apexrl") + 1]
    if role != "actor":
        return role
    return "eval" if "--eval" in argv else f"actor_{argv[argv.index('--id') + 1]}"


def pids_by_role(marker: str) -> dict[str, int]:
    return {role_of(argv): pid for pid, argv in run_processes(marker).items()}


@dataclass
class Launch:
    """One launcher started by a test, in its own session (so its process group is its run)."""

    popen: subprocess.Popen
    logdir: Path
    log_path: Path

    @property
    def marker(self) -> str:
        return str(self.logdir)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def run_dir(self) -> Path:
        """The one run directory the launcher made under ``logdir``."""
        (run_dir,) = [p for p in self.logdir.iterdir() if p.is_dir()]
        return run_dir

    def tails(self) -> str:
        text = f"--- launcher {self.log_path}:\n{log_tail(self.log_path)}"
        for path in sorted(self.logdir.glob("*/logs/*.log")):
            text += f"\n--- {path.name}:\n{log_tail(path, 10)}"
        return text

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def results(self) -> list[dict]:
        try:
            path = self.run_dir() / "result.json"
        except (OSError, ValueError):  # not made yet
            return []
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def stop_launch(launch: Launch) -> None:
    """Teardown: SIGTERM the launcher (which stops its children), SIGKILL its process group if it
    is still there after its own stop bound, then SIGKILL any process of the run that escaped the
    group (by its PID)."""
    if launch.popen.poll() is None:
        launch.popen.send_signal(signal.SIGTERM)
    if launch.wait(EXIT_BOUND_S) is None:
        try:
            os.killpg(launch.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        launch.popen.wait()
    for pid in run_processes(launch.marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Launch]]:
    started: list[Launch] = []

    def start(*args: str, overrides: tuple[str, ...] = ()) -> Launch:
        logdir = tmp_path / f"runs{len(started)}"
        log_path = tmp_path / f"launcher{len(started)}.log"
        with open(log_path, "ab") as log_file:
            popen = subprocess.Popen(
                [
                    str(SCRIPT),
                    *args,
                    "--logdir",
                    str(logdir),
                    *set_args(SMALL_OVERRIDES + overrides),
                ],
                cwd=tmp_path,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started.append(Launch(popen, logdir, log_path))
        return started[-1]

    try:
        yield start
    finally:
        for launched in started:
            stop_launch(launched)


def wait_for_roles(launched: Launch, roles: set[str], timeout_s: float = 60.0) -> dict[str, int]:
    """Wait until a process of each role runs; returns role -> pid."""

    def found() -> dict[str, int] | None:
        pids = pids_by_role(launched.marker)
        return pids if roles <= set(pids) else None

    pids = wait_until(found, timeout_s)
    assert pids, f"roles {roles}, found {pids_by_role(launched.marker)}\n{launched.tails()}"
    return pids


def assert_nothing_left(launched: Launch, pids: dict[str, int]) -> None:
    left = wait_until(lambda: not run_processes(launched.marker), 5.0)
    assert left, f"processes of the run remain: {run_processes(launched.marker)}"
    for role, pid in pids.items():
        assert not Path(f"/proc/{pid}").exists() or launched.marker not in Path(
            f"/proc/{pid}/cmdline"
        ).read_text(errors="replace"), f"{role} (pid {pid}) is still there"


def wait_for_updates(launched: Launch, timeout_s: float = 60.0) -> None:
    running = wait_until(
        lambda: [r for r in launched.results() if r["learner_updates"] > 0], timeout_s
    )
    assert running, f"the learner never reported updates\n{launched.tails()}"


def test_short_run_ends_by_itself_and_leaves_nothing(launch: Callable[..., Launch]) -> None:
    launched = launch(
        "--actors",
        "2",
        "--learners",
        "1",
        overrides=("run.stop_env_steps=4000", "run.stop_eval_return=null"),
    )
    roles = {"local", "replay", "params", "learner", "actor_0", "actor_1", "eval"}
    pids = wait_for_roles(launched, roles)
    code = launched.wait(120.0)
    assert code == 0, f"launcher exit code {code}\n{launched.tails()}"
    results = launched.results()
    assert results and results[-1]["done"] is True, results[-3:]
    assert results[-1]["env_steps"] >= 4000
    tb = launched.run_dir() / "tb"
    for role in ("actor_0", "actor_1", "eval", "learner", "replay", "params"):
        assert list((tb / role).glob("events.out.tfevents.*")), f"no event file in {tb / role}"
    assert (launched.run_dir() / "config.yaml").is_file()
    assert "the run is complete" in launched.log()
    assert_nothing_left(launched, pids)


def clean_stop_problems(launched: Launch) -> list[str]:
    """What shows that a role did not stop cleanly on the launcher's one SIGTERM."""
    problems = []
    for path in sorted(launched.run_dir().glob("logs/*.log")):
        text = path.read_text(errors="replace")
        if "Traceback" in text:
            problems.append(f"{path.name}: traceback\n{log_tail(path, 12)}")
        if "received SIGINT" in text:
            problems.append(f"{path.name}: got the terminal's SIGINT as well as the launcher's")
    if not (launched.run_dir() / "checkpoint.pt").is_file():
        problems.append("the learner wrote no final checkpoint")
    return problems


def test_sigint_to_the_launcher_stops_the_whole_run(launch: Callable[..., Launch]) -> None:
    launched = launch("--actors", "1", "--learners", "1", "--no-eval")
    pids = wait_for_roles(launched, {"local", "replay", "params", "learner", "actor_0"})
    wait_for_updates(launched)
    started = time.monotonic()
    os.kill(launched.popen.pid, signal.SIGINT)
    code = launched.wait(EXIT_BOUND_S)
    took_s = time.monotonic() - started
    assert code == 130, f"exit code {code} after {took_s:.1f} s\n{launched.tails()}"
    assert_nothing_left(launched, pids)
    assert "did not stop within" not in launched.log(), launched.tails()
    assert not clean_stop_problems(launched), "\n".join(clean_stop_problems(launched))


def test_ctrl_c_stops_every_role_cleanly(launch: Callable[..., Launch]) -> None:
    launched = launch("--actors", "1", "--learners", "1", "--no-eval")
    pids = wait_for_roles(launched, {"local", "replay", "params", "learner", "actor_0"})
    wait_for_updates(launched)
    os.killpg(launched.popen.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    code = launched.wait(EXIT_BOUND_S)
    assert code is not None, f"launcher still running after {EXIT_BOUND_S} s\n{launched.tails()}"
    assert_nothing_left(launched, pids)
    assert code == 130, launched.tails()
    assert not clean_stop_problems(launched), "\n".join(clean_stop_problems(launched))


def test_a_killed_actor_is_restarted(launch: Callable[..., Launch]) -> None:
    launched = launch("--actors", "1", "--learners", "1", "--no-eval")
    pids = wait_for_roles(launched, {"replay", "params", "learner", "actor_0"})
    stepping = wait_until(lambda: "all 1 actors are stepping" in launched.log(), 60.0)
    assert stepping, launched.tails()
    os.kill(pids["actor_0"], signal.SIGKILL)
    restarted = wait_until(
        lambda: pids_by_role(launched.marker).get("actor_0", pids["actor_0"]) != pids["actor_0"],
        30.0,
    )
    assert restarted, f"no new actor_0 process\n{launched.tails()}"
    assert "actor_0 exited with code -9; restarting it" in launched.log(), launched.tails()
    actor_log = launched.run_dir() / "logs" / "actor_0.log"
    # The new actor appends to the same log; its start line shows it made its envs again.
    started_again = wait_until(lambda: actor_log.read_text().count("2 envs of CartPole") == 2, 30)
    assert started_again, launched.tails()
    new_pids = pids_by_role(launched.marker)
    for role in ("local", "replay", "params", "learner"):
        assert new_pids[role] == pids[role], f"{role} changed: {pids} -> {new_pids}"


def test_a_killed_replay_server_that_cannot_start_again_stops_the_run(
    launch: Callable[..., Launch],
) -> None:
    """The launcher restarts a dead server (tests/test_faults.py); one whose restart fails with a
    configuration error stops the run, named in the log, and nothing is left."""
    launched = launch("--actors", "1", "--learners", "1", "--no-eval")
    pids = wait_for_roles(launched, {"local", "replay", "params", "learner", "actor_0"})
    wait_for_updates(launched)  # the learner has written the run's config.yaml
    config = launched.run_dir() / "config.yaml"
    config.rename(config.with_suffix(".moved"))  # a new start of any role now exits 2
    os.kill(pids["replay"], signal.SIGKILL)
    code = launched.wait(EXIT_BOUND_S + 30.0)
    assert code == 2, f"launcher exit code {code}\n{launched.tails()}"
    log = launched.log()
    assert "replay exited with code -9" in log, launched.tails()
    assert "replay exited with status 2: its configuration cannot work" in log, launched.tails()
    assert_nothing_left(launched, pids)


def test_zero_learners_are_refused_and_nothing_starts(
    launch: Callable[..., Launch], tmp_path: Path
) -> None:
    launched = launch("--actors", "1", "--learners", "0")
    code = launched.wait(30.0)
    assert code == 2, f"exit code {code}\n{launched.tails()}"
    assert "--learners must be at least 1" in launched.log(), launched.tails()
    assert not launched.logdir.exists()
    assert not run_processes(launched.marker)


def parent_pid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_forked_actors_log_alone_and_die_with_a_killed_launcher(
    launch: Callable[..., Launch],
) -> None:
    launched = launch("--actors", "2", "--learners", "1")
    roles = {"local", "replay", "params", "learner", "actor_0", "actor_1", "eval"}
    pids = wait_for_roles(launched, roles)
    servers = [
        pid
        for pid, argv in run_processes(launched.marker).items()
        if "apexrl.launch.forkserver" in argv
    ]
    assert len(servers) == 1, f"fork servers: {servers}\n{launched.tails()}"
    for role in ("actor_0", "actor_1", "eval"):
        assert parent_pid(pids[role]) == servers[0], f"{role} was not forked by the fork server"
        assert os.getsid(pids[role]) == pids[role], f"{role} is not in its own session"
    stepping = wait_until(lambda: "all 3 actors are stepping" in launched.log(), 60.0)
    assert stepping, launched.tails()
    logs, tb = launched.run_dir() / "logs", launched.run_dir() / "tb"
    for role in ("actor_0", "actor_1", "eval"):
        text = (logs / f"{role}.log").read_text()
        assert f"{role}: 2 envs of CartPole-v1" in text, text
        others = {"actor_0", "actor_1", "eval", "forkserver"} - {role}
        assert not [line for line in text.splitlines() if set(line.split(" ")[1:2]) & others]
        assert wait_until(lambda r=role: list((tb / r).glob("events.out.tfevents.*")), 10.0)
    os.kill(pids["local"], signal.SIGKILL)  # no clean-up by the launcher: PDEATHSIG alone
    launched.wait(EXIT_BOUND_S)
    # The fork server gets SIGTERM, stops its actors (SIGKILL after 10 s) and exits.
    gone = wait_until(lambda: not run_processes(launched.marker), EXIT_BOUND_S + 5.0)
    assert gone, f"processes of the run remain: {run_processes(launched.marker)}"


# --- a new user's first hour ---------------------------------------------------------------------


def read_results(run_dir: Path) -> list[dict]:
    path = run_dir / "result.json"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_negative_return_threshold_stops_an_acrobot_run(launch: Callable[..., Launch]) -> None:
    # Acrobot's returns lie in [-500, 0]: a threshold of -500 is met by any full window, and a
    # threshold that was ignored would leave the run going until the test's timeout.
    launched = launch(
        "--actors",
        "1",
        "--learners",
        "1",
        overrides=(
            "env.id=Acrobot-v1",
            "run.stop_eval_return=-500",
            "run.stop_eval_episodes=4",
            "actor.eval_num_envs=4",
        ),
    )
    code = launched.wait(120.0)
    assert code == 0, f"launcher exit code {code}\n{launched.tails()}"
    last = launched.results()[-1]
    assert last["done"] is True and last["eval_episodes_in_window"] >= 4, last
    assert -500 <= last["eval_return_mean"] <= 0, last
    assert "mean evaluation return" in (launched.run_dir() / "logs" / "learner.log").read_text()
    # One weights version played the judged window, and the checkpoint kept is that version's.
    judged = last["eval_weights_version"]
    assert judged >= 0, last
    checkpoint = torch.load(launched.run_dir() / "checkpoint.pt", weights_only=True)
    assert checkpoint["counters"]["weights_version"] == judged
    best = torch.load(launched.run_dir() / "checkpoint_best.pt", weights_only=True)
    assert best["counters"]["weights_version"] == judged  # the first full round is the best yet
    # Named after the algorithm and the env it ran, not after the CartPole config file.
    assert launched.run_dir().name.startswith("apex_dqn-Acrobot-v1-"), launched.run_dir()


def test_evaluation_rounds_are_judged_at_once_and_reported_at_the_report_interval(
    launch: Callable[..., Launch],
) -> None:
    # Rounds of two short CartPole episodes come several a second; the learner judges each one
    # as it comes, but writes a result.json record only at the report interval in force (shorter
    # in a run's first minute: metrics.early_interval), and a log line every report interval.
    launched = launch(
        "--actors",
        "1",
        "--learners",
        "1",
        overrides=(
            "run.stop_eval_episodes=2",
            "learner.report_interval_s=2",
            "run.stop_wall_s=14",
        ),
    )
    code = launched.wait(120.0)
    assert code == 0, f"launcher exit code {code}\n{launched.tails()}"
    records = launched.results()
    assert records[-1]["done"] is True and len(records) >= 3, records
    pairs = list(zip(records[:-2], records[1:-1], strict=True))
    short = [(a["time_s"], b["time_s"]) for a, b in pairs
             if b["time_s"] - a["time_s"] < 0.95 * early_interval(2.0, a["time_s"])]  # fmt: skip
    assert pairs and not short, short  # the last record may come early: it stops the run
    learner_log = (launched.run_dir() / "logs" / "learner.log").read_text()
    lines = re.findall(r"learner INFO +\d+s \| env steps", learner_log)
    assert len(lines) <= 14 / 2 + 3 < len(records), (len(lines), len(records))  # 2 s apart
    eval_log = (launched.run_dir() / "logs" / "eval.log").read_text()
    rounds = re.search(r"eval stopped after (\d+) rounds", eval_log)
    assert rounds and int(rounds[1]) > 2 * len(records), (eval_log[-2000:], len(records))
    # The evaluation actor's log has a round's line every actor.report_interval_s (0.5 s) at most.
    lines = re.findall(r"eval: weights version \d+: mean return", eval_log)
    assert 1 <= len(lines) < int(rounds[1]), (len(lines), rounds[1])


def test_resuming_a_finished_run_keeps_training(launch: Callable[..., Launch]) -> None:
    first = launch(
        "--actors", "1", "--learners", "1", "--no-eval", overrides=("run.stop_env_steps=3000",)
    )
    assert first.wait(120.0) == 0, first.tails()
    run_dir = first.run_dir()
    done = read_results(run_dir)
    assert done[-1]["done"] is True, done[-1]

    second = launch(
        "--actors",
        "1",
        "--learners",
        "1",
        "--no-eval",
        "--resume",
        "--run-dir",
        str(run_dir),
        overrides=("run.stop_env_steps=8000",),
    )
    code = second.wait(120.0)
    assert code == 0, f"exit code {code}\n{second.log()}"
    new = read_results(run_dir)[len(done) :]
    assert new and new[-1]["done"] is True and new[-1]["env_steps"] >= 8000, new[-3:]
    assert all(r["env_steps"] >= done[-1]["env_steps"] for r in new), (done[-1], new[:2])
    assert all(r["learner_updates"] >= done[-1]["learner_updates"] for r in new), new[:2]
    assert new[-1]["learner_updates"] > done[-1]["learner_updates"]
    assert "resuming the run directory" in second.log(), second.log()
    assert "the run is complete" in second.log()


def test_a_run_directory_with_a_run_is_not_overwritten(launch: Callable[..., Launch]) -> None:
    first = launch(
        "--actors", "1", "--learners", "1", "--no-eval", overrides=("run.stop_env_steps=1000",)
    )
    assert first.wait(120.0) == 0, first.tails()
    again = launch("--actors", "1", "--learners", "1", "--run-dir", str(first.run_dir()))
    assert again.wait(30.0) == 2, again.log()
    assert "already holds a run; continue it with --resume" in again.log()


@pytest.mark.parametrize(
    "override, expected",
    [
        ("env.id=CartPol-v1", "cannot make environment 'CartPol-v1'"),
        ("env.id=Pendulum-v1", "apex_dqn needs a Discrete action space"),
        ("learner.device=cuda", "CUDA is not available"),
    ],
)
def test_a_role_that_cannot_work_fails_before_anything_starts(
    launch: Callable[..., Launch], override: str, expected: str
) -> None:
    launched = launch("--actors", "1", "--learners", "1", overrides=(override,))
    code = launched.wait(30.0)
    assert code == 2, f"exit code {code}\n{launched.log()}"
    lines = launched.log().strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], lines
    assert not launched.logdir.exists(), "a failed launch left a run directory"
    assert not run_processes(launched.marker)


def test_a_port_in_use_fails_before_anything_starts(launch: Callable[..., Launch]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        launched = launch(
            "--actors",
            "1",
            "--learners",
            "1",
            overrides=(f"net.params_addr=tcp://127.0.0.1:{port}",),
        )
        code = launched.wait(30.0)
    assert code == 2, launched.log()
    assert (
        f"net.params_addr tcp://127.0.0.1:{port}: port {port} is already in use" in launched.log()
    )
    assert not launched.logdir.exists()


def test_a_role_with_a_config_error_stops_the_run_and_is_not_restarted(
    launch: Callable[..., Launch],
) -> None:
    launched = launch("--actors", "1", "--learners", "1", "--no-eval", "--actor-start", "exec")
    pids = wait_for_roles(launched, {"replay", "params", "learner", "actor_0"})
    # The learner writes the run's config.yaml when it starts: move it only after that.
    wait_for_updates(launched)
    config = launched.run_dir() / "config.yaml"
    config.rename(config.with_suffix(".moved"))  # every new start of a role now fails: exit 2
    os.kill(pids["actor_0"], signal.SIGKILL)
    code = launched.wait(60.0)
    assert code == 2, f"exit code {code}\n{launched.tails()}"
    log = launched.log()
    assert "actor_0 exited with status 2: its configuration cannot work" in log, log
    assert log.count("restarting it") == 1, log  # the SIGKILL's restart, and no other
    assert "does not exist" in (launched.run_dir() / "logs" / "actor_0.log").read_text()
    assert_nothing_left(launched, pids)


def scalar_events(tb_dir: Path) -> list[tuple[int, str, float]]:
    """The (step, tag, value) of every scalar a role wrote (all its event files)."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event

    events = []
    for path in sorted(tb_dir.glob("events.out.tfevents.*")):
        for record in RawEventFileLoader(str(path)).Load():
            event = Event.FromString(record)
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    events.append((event.step, value.tag, value.simple_value))
    return events


def scalar_steps(tb_dir: Path) -> list[int]:
    """The steps of every scalar a role wrote, one per write."""
    steps: list[int] = []
    for step, _, _ in scalar_events(tb_dir):
        if not steps or steps[-1] != step:
            steps.append(step)
    return steps


def test_every_role_writes_tensorboard_at_the_runs_env_steps(
    launch: Callable[..., Launch],
) -> None:
    launched = launch("--actors", "2", "--learners", "1", overrides=("run.stop_env_steps=12000",))
    assert launched.wait(120.0) == 0, launched.tails()
    tb = launched.run_dir() / "tb"
    # Replay counts the run's env steps; its last write is at the count it stopped with (a
    # little past the learner's last report: actors insert until the Shutdown reaches them).
    final = max(scalar_steps(tb / "replay"))
    assert final >= launched.results()[-1]["env_steps"] >= 12000
    for role in ("actor_0", "actor_1", "eval", "learner", "params"):
        steps = scalar_steps(tb / role)
        assert steps, f"{role} wrote no scalars"
        assert steps == sorted(steps), role
        assert max(steps) <= final, (role, max(steps), final)
    # One x-axis: the run's env steps, not a role's own counter. Each training actor's own env
    # steps (its env_steps scalar) are about half the run's by the end, with two actors; the
    # step its last ones were written at is the run's count, which holds the other actor's too.
    for role in ("actor_0", "actor_1"):
        own = [(step, v) for step, tag, v in scalar_events(tb / role) if tag.endswith("/env_steps")]
        assert own, role
        last_step, last_own = own[-1]
        assert last_step >= 1.2 * last_own, (role, own)  # not its own counter
    learner = scalar_events(tb / "learner")
    updates = [(s, v) for s, tag, v in learner if tag.endswith("/updates")]
    assert updates and all(step > value for step, value in updates), updates[-3:]

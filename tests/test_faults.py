"""Every role survives its peers going away and coming back, with real processes: the launcher
restarts a SIGKILLed replay server, parameter server or learner and training goes on; roles
started by hand ride out a replay server that stops and starts again on the same address.

Each test prints how long the role took to come back (``pytest -s`` shows it): seconds from the
kill until the role serves again, and until learner updates advance again.

Marked ``slow`` (about a minute of real runs, each killed and restarted): CI runs it with
``python3 -m pytest -m slow -s``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Processes, wait_for_server, wait_until
from test_launch_local import (  # noqa: F401 - the launcher fixture
    Launch,
    assert_nothing_left,
    launch,
    pids_by_role,
    wait_for_roles,
    wait_for_updates,
)
from test_roles import Run, start_servers

from apexrl.config import Config, load_config
from apexrl.tools.server_stats import server_stats
from apexrl.transport import auth, sockets

pytestmark = pytest.mark.slow

ROLES = {"local", "replay", "params", "learner", "actor_0"}
COME_BACK_S = 45.0  # bound for a restarted role to serve again or for updates to advance
STOP_S = 30.0  # bound for a run to end after `apexrl stop`


def run_config(launched: Launch) -> Config:
    return load_config(launched.run_dir() / "config.yaml")


def stats(cfg: Config, server: str) -> dict[str, float] | None:
    """A server's ``Stats``, asked with the run's CURVE keys as the launcher asks; None: silent."""
    addr = cfg.net.replay_addr if server == "replay" else cfg.net.params_addr
    ctx = sockets.make_context()
    with sockets.closing(ctx):
        keys = auth.client_keys(cfg.net, "eval", server)
        return server_stats(ctx, addr, timeout_ms=500, curve=keys)


def updates(launched: Launch) -> int:
    return max((r["learner_updates"] for r in launched.results()), default=0)


def kill_and_wait_for_new_pid(launched: Launch, role: str, pids: dict[str, int]) -> float:
    """SIGKILL ``role``, wait until the launcher started another process of it; returns the
    time of the kill."""
    killed_at = time.monotonic()
    os.kill(pids[role], signal.SIGKILL)
    new_pid = wait_until(
        lambda: pids_by_role(launched.marker).get(role, pids[role]) != pids[role], COME_BACK_S
    )
    assert new_pid, f"no new {role} process\n{launched.tails()}"
    assert f"{role} exited with code -9; restarting it" in launched.log(), launched.tails()
    return killed_at


def stop_run(launched: Launch, pids: dict[str, int]) -> None:
    """``apexrl stop`` with the run's config; the launcher must exit 0 and leave nothing."""
    config = launched.run_dir() / "config.yaml"
    subprocess.run(
        [sys.executable, "-m", "apexrl", "stop", "--config", str(config)],
        timeout=STOP_S,
        capture_output=True,
        check=False,
    )
    code = launched.wait(STOP_S)
    assert code == 0, f"launcher exit code {code}\n{launched.tails()}"
    assert_nothing_left(launched, pids)


def test_a_killed_replay_server_is_restarted_and_training_goes_on(
    launch: Callable[..., Launch],  # noqa: F811
) -> None:
    launched = launch("--actors", "1", "--learners", "1", "--no-eval")
    pids = wait_for_roles(launched, ROLES)
    wait_for_updates(launched)
    cfg = run_config(launched)
    killed_at = kill_and_wait_for_new_pid(launched, "replay", pids)
    assert wait_until(lambda: stats(cfg, "replay"), COME_BACK_S), launched.tails()
    serves_s = time.monotonic() - killed_at
    time.sleep(cfg.learner.report_interval_s * 1.5)  # a result line written after the restart
    at_restart = updates(launched)

    def sampled_from_new_server() -> bool:
        values = stats(cfg, "replay")
        return bool(values) and values["replay/size"] > 0 and values["replay/num_sampled"] > 0

    assert wait_until(sampled_from_new_server, COME_BACK_S), launched.tails()
    assert wait_until(lambda: updates(launched) > at_restart + 10, COME_BACK_S), launched.tails()
    advance_s = time.monotonic() - killed_at
    print(
        f"\nreplay: serves {serves_s:.1f} s after SIGKILL, updates advance after {advance_s:.1f} s"
    )
    logs = launched.run_dir() / "logs"
    for role in ("learner", "actor_0"):
        text = (logs / f"{role}.log").read_text()
        assert f"the replay server at {cfg.net.replay_addr} is not answering" in text, role
        assert f"the replay server at {cfg.net.replay_addr} answers again" in text, role
    stop_run(launched, pids)
    assert "restarts in this session: replay 1" in launched.log(), launched.log()


def test_a_killed_parameter_server_is_restarted_and_actors_get_new_weights(
    launch: Callable[..., Launch],  # noqa: F811
) -> None:
    launched = launch("--actors", "1", "--learners", "1", "--no-eval")
    pids = wait_for_roles(launched, ROLES)
    wait_for_updates(launched)
    cfg = run_config(launched)
    env_steps_before = stats(cfg, "replay")["replay/env_steps"]
    killed_at = kill_and_wait_for_new_pid(launched, "params", pids)
    assert wait_until(lambda: stats(cfg, "params"), COME_BACK_S), launched.tails()
    serves_s = time.monotonic() - killed_at
    # The restarted server holds no weights until the learner publishes to it again.
    first = wait_until(
        lambda: (s := stats(cfg, "params")) and s["params/version"] >= 0 and s, COME_BACK_S
    )
    assert first, launched.tails()
    republished_s = time.monotonic() - killed_at

    def actors_fetch_newer() -> bool:
        values = stats(cfg, "params")
        return bool(values) and (
            values["params/version"] > first["params/version"]
            and values["params/num_served"] > first["params/num_served"]
        )

    assert wait_until(actors_fetch_newer, COME_BACK_S), launched.tails()
    served_s = time.monotonic() - killed_at
    print(
        f"\nparams: serves {serves_s:.1f} s after SIGKILL, holds the learner's weights after "
        f"{republished_s:.1f} s, actors fetch a newer version after {served_s:.1f} s"
    )
    # The actor played on with the weights it had: it was not restarted and replay kept filling.
    assert pids_by_role(launched.marker)["actor_0"] == pids["actor_0"]
    assert stats(cfg, "replay")["replay/env_steps"] > env_steps_before
    actor_log = (launched.run_dir() / "logs" / "actor_0.log").read_text()
    assert f"the parameter server at {cfg.net.params_addr} answers again" in actor_log
    stop_run(launched, pids)
    assert "restarts in this session: params 1" in launched.log(), launched.log()


def test_a_killed_learner_resumes_from_its_checkpoint(
    launch: Callable[..., Launch],  # noqa: F811
) -> None:
    launched = launch(
        "--actors", "1", "--learners", "1", "--no-eval", overrides=("learner.checkpoint_period=20",)
    )
    pids = wait_for_roles(launched, ROLES)
    checkpoint = wait_until(lambda: (launched.run_dir() / "checkpoint.pt").is_file(), 60.0)
    assert checkpoint, launched.tails()
    num_lines = len(launched.results())
    killed_at = kill_and_wait_for_new_pid(launched, "learner", pids)
    learner_log = launched.run_dir() / "logs" / "learner.log"
    resumed = wait_until(
        lambda: re.search(r"resumed from \S+ at update (\d+)", learner_log.read_text()),
        COME_BACK_S,
    )
    assert resumed, launched.tails()
    resumed_s = time.monotonic() - killed_at
    from_update = int(resumed.group(1))
    assert from_update >= 20

    def new_lines() -> list[dict]:
        return launched.results()[num_lines:]

    advanced = wait_until(
        lambda: any(r["learner_updates"] > from_update + 10 for r in new_lines()), COME_BACK_S
    )
    assert advanced, launched.tails()
    advance_s = time.monotonic() - killed_at
    print(
        f"\nlearner: resumed from update {from_update} {resumed_s:.1f} s after SIGKILL, "
        f"updates advance after {advance_s:.1f} s"
    )
    assert all(r["learner_updates"] >= from_update for r in new_lines()), new_lines()[:3]
    assert "learner restarted with --resume" in launched.log(), launched.log()
    stop_run(launched, pids)
    assert "restarts in this session: learner 1" in launched.log(), launched.log()


def test_hand_started_roles_ride_out_a_replay_server_that_stops_and_starts_again(
    procs: Processes, tmp_path: Path
) -> None:
    run = Run(tmp_path)
    servers = start_servers(procs, run)
    learner = procs.start("learner", *run.args("learner"))
    actor = procs.start("actor", *run.args("actor", "--id", "0"))
    running = wait_until(lambda: [r for r in run.results() if r["learner_updates"] > 0], 60.0)
    assert running, procs.tails()
    code, _ = servers["replay"].stop(10.0)
    assert code == 0, procs.tails()
    stopped_at = time.monotonic()
    time.sleep(3.0)
    again = procs.start("replay_again", *run.args("replay"))
    wait_for_server(again, run.replay_addr)
    serves_s = time.monotonic() - stopped_at
    time.sleep(1.5)  # a result line written after the restart
    at_restart = max(r["learner_updates"] for r in run.results())
    advanced = wait_until(
        lambda: max(r["learner_updates"] for r in run.results()) > at_restart + 10, COME_BACK_S
    )
    assert advanced, procs.tails()
    advance_s = time.monotonic() - stopped_at
    print(
        f"\nreplay by hand: serves {serves_s:.1f} s after it stopped (3 s of it down), "
        f"updates advance after {advance_s:.1f} s"
    )
    for proc in (learner, actor):
        text = proc.log()
        assert f"the replay server at {run.replay_addr} is not answering" in text, proc.tail()
        assert f"the replay server at {run.replay_addr} answers again" in text, proc.tail()
        assert proc.alive(), proc.tail()

"""Two real learner processes that train one model over gloo: identical weights on every rank,
priority updates from both ranks at the replay server, a coordinated stop, a missing rank named
within the timeout, and a resume with a different number of learners."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
from conftest import REPO, Processes, RoleProcess, free_addr, server_stats, wait_until
from test_launch_local import launch  # noqa: F401, F811 - the launcher fixture
from test_roles import Run, start_servers

DIGEST = re.compile(
    r"learner rank (\d+) stopped after (\d+) updates, weights sha256 ([0-9a-f]{64})"
)


def two_learners() -> tuple[str, ...]:
    """Overrides for every role of a run with two learners: replay accepts priority updates from
    ranks 0..world_size - 1 only (each learner gets its own --rendezvous below)."""
    return ("learner.world_size=2", f"learner.rendezvous={free_addr()}")


def start_learners(procs: Processes, run: Run, world_size: int, *extra: str) -> list[RoleProcess]:
    rendezvous = free_addr()
    return [
        procs.start(
            f"learner_{rank}",
            *run.args(
                "learner",
                "--rank",
                str(rank),
                "--world-size",
                str(world_size),
                "--rendezvous",
                rendezvous,
                *extra,
            ),
        )
        for rank in range(world_size)
    ]


def launched_digests(logs: Path, world_size: int) -> list[tuple[str, str]]:
    """(updates, weights digest) each rank of a launched run logged when it stopped."""
    digests = []
    for rank in range(world_size):
        text = (logs / f"learner_{rank}.log").read_text()
        match = DIGEST.search(text)
        assert match, text[-2000:]
        digests.append(match.group(2, 3))
    return digests


def final_digest(proc: RoleProcess) -> tuple[int, int, str]:
    match = DIGEST.search(proc.log())
    assert match, proc.tail()
    rank, updates, digest = match.groups()
    return int(rank), int(updates), digest


@pytest.mark.parametrize("config", [None, "sac_pendulum.yaml"], ids=["apex_dqn", "sac"])
def test_two_learners_keep_identical_weights_and_both_send_priorities(
    procs: Processes, tmp_path: Path, config: str | None
) -> None:
    """Ape-X, and SAC, whose every update averages the critics', the policy's and the
    temperature's gradients in one all-reduce."""
    where = {} if config is None else {"config": REPO / "configs" / config}
    run = Run(tmp_path, overrides=("learner.collective_timeout_s=30", *two_learners()), **where)
    start_servers(procs, run)
    learners = start_learners(procs, run, 2)
    procs.start("actor_0", *run.args("actor", "--id", "0", "--num-actors", "1"))

    def both_ranks_updated() -> bool:
        stats = server_stats(run.replay_addr) or {}
        return all(stats.get(f"replay/priority_updates_rank_{r}", 0) >= 30 for r in (0, 1))

    assert wait_until(both_ranks_updated, 120), procs.tails()
    # SIGTERM to rank 1 alone: its stop vote reaches rank 0 in the next all-reduce, and both stop
    # after the same update.
    learners[1].popen.send_signal(signal.SIGTERM)
    for proc in learners:
        assert proc.wait(30) == 0, procs.tails()
    (r0, updates0, digest0), (r1, updates1, digest1) = map(final_digest, learners)
    assert (r0, r1) == (0, 1)
    assert updates0 == updates1 >= 30
    assert digest0 == digest1, "the ranks' weights differ"
    assert (run.run_dir / "tb" / "learner_0").is_dir() and (
        run.run_dir / "tb" / "learner_1"
    ).is_dir()
    assert (run.run_dir / "checkpoint.pt").is_file()  # written by rank 0


def test_a_killed_learner_is_named_by_the_other_within_the_timeout(
    procs: Processes, tmp_path: Path
) -> None:
    run = Run(tmp_path, overrides=("learner.collective_timeout_s=20", *two_learners()))
    start_servers(procs, run)
    learners = start_learners(procs, run, 2)
    procs.start("actor_0", *run.args("actor", "--id", "0", "--num-actors", "1"))
    assert wait_until(
        lambda: (server_stats(run.replay_addr) or {}).get("replay/priority_updates_rank_1", 0) > 5,
        120,
    ), procs.tails()
    learners[1].popen.send_signal(signal.SIGKILL)
    started = time.monotonic()
    code = learners[0].wait(40)
    took_s = time.monotonic() - started
    assert code == 3, f"exit code {code}\n{learners[0].tail()}"
    assert took_s < 30, took_s
    assert "learner rank(s) [1] stopped answering" in learners[0].log(), learners[0].tail()


def test_a_rank_that_never_arrives_is_named(procs: Processes, tmp_path: Path) -> None:
    run = Run(tmp_path, overrides=("learner.join_timeout_s=5",))
    start_servers(procs, run)
    rendezvous = free_addr()
    lonely = procs.start(
        "learner_0",
        *run.args("learner", "--rank", "0", "--world-size", "2", "--rendezvous", rendezvous),
    )
    assert lonely.wait(60) == 3, lonely.tail()
    assert "learner rank(s) [1] did not join within 5 s" in lonely.log(), lonely.tail()


def test_resume_with_a_different_number_of_learners(procs: Processes, tmp_path: Path) -> None:
    run = Run(tmp_path, overrides=("learner.checkpoint_period=10",))
    start_servers(procs, run)
    procs.start("actor_0", *run.args("actor", "--id", "0", "--num-actors", "1"))
    first = procs.start("learner", *run.args("learner"))
    assert wait_until(lambda: (run.run_dir / "checkpoint.pt").is_file(), 90), procs.tails()
    first.popen.send_signal(signal.SIGTERM)
    assert first.wait(20) == 0, first.tail()
    _, saved_updates, _ = final_digest(first)
    learners = start_learners(procs, run, 2, "--resume")
    assert wait_until(lambda: "resumed from" in learners[0].log(), 60), learners[0].tail()
    learners[0].popen.send_signal(signal.SIGTERM)
    for proc in learners:
        assert proc.wait(30) == 0, procs.tails()
    (_, updates0, digest0), (_, updates1, digest1) = map(final_digest, learners)
    assert f"at update {saved_updates}" in learners[0].log(), learners[0].tail()
    assert updates0 == updates1 >= saved_updates
    assert digest0 == digest1


def test_launcher_with_two_learners_reports_a_killed_rank(launch, tmp_path: Path) -> None:  # noqa: F811
    """``launch_local.sh --learners 2``: both ranks train; SIGKILL of rank 1 stops the run with a
    non-zero exit that names ``learner_1``, and no process of the run is left."""
    from test_launch_local import EXIT_BOUND_S, run_processes

    launched = launch("--actors", "1", "--learners", "2", "--no-eval")
    assert wait_until(lambda: [r for r in launched.results() if r["learner_updates"] > 0], 120), (
        launched.tails()
    )

    def rank_1_pid() -> int | None:
        for pid, argv in run_processes(launched.marker).items():
            if "learner" in argv and "--rank" in argv and argv[argv.index("--rank") + 1] == "1":
                return pid
        return None

    pid = rank_1_pid()
    assert pid is not None, launched.tails()
    os.kill(pid, signal.SIGKILL)
    code = launched.wait(30 + EXIT_BOUND_S)
    assert code not in (None, 0), f"launcher exit code {code}\n{launched.tails()}"
    assert "learner_1 exited with code -9" in launched.log(), launched.tails()
    assert wait_until(lambda: not run_processes(launched.marker), EXIT_BOUND_S), run_processes(
        launched.marker
    )

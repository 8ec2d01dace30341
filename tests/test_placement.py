"""Where the launcher's roles run: the layouts of ``--placement`` worked by hand, the threads a
pinned process starts, and a launched run whose learner has a core of its own, as the kernel and
``apexrl status`` report it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO, wait_until
from test_launch_local import Launch, assert_nothing_left, launch, wait_for_roles  # noqa: F401
from test_status import status, table

from apexrl.config import IDLE_EVAL_NICE
from apexrl.launch.placement import PlacementError, cores_of, describe_cores, plan

MULTI_CORE = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs 2 cores and CPU affinity",
)


def test_split_gives_each_learner_rank_its_own_last_cores() -> None:
    layout = plan("split", [0, 1], world_size=1, learner_threads=1)
    assert layout == {"others": (0,), "eval": None, "learner_0": (1,)}
    assert cores_of(layout, "learner", 0) == (1,)
    assert cores_of(layout, "actor", 3) == cores_of(layout, "replay", 0) == (0,)
    assert cores_of(layout, "eval", 0) is None  # anywhere, at its niceness
    eight = plan("split", range(8), world_size=2, learner_threads=2)
    assert eight["learner_0"] == (4, 5) and eight["learner_1"] == (6, 7)
    assert eight["others"] == (0, 1, 2, 3)


def test_shared_and_auto_where_a_split_does_not_fit_pin_nothing() -> None:
    every = {"others": None, "eval": None}
    assert plan("shared", [0, 1, 2, 3], 1, 1) == every
    assert plan("auto", [0], 1, 1) == every  # one core: nothing left for the others
    assert plan("auto", [0, 1], 2, 1) == every
    assert cores_of(every, "learner", 0) is None


def test_a_split_that_does_not_fit_is_refused() -> None:
    with pytest.raises(PlacementError, match="needs one more"):
        plan("split", [0, 1], world_size=2, learner_threads=1)
    with pytest.raises(PlacementError, match="needs one more"):
        plan("split", [0, 1, 2, 3], world_size=1, learner_threads=4)
    with pytest.raises(PlacementError, match="must be one of"):
        plan("spread", [0, 1], 1, 1)


def test_cores_are_described_as_spans() -> None:
    assert describe_cores([3]) == "3"
    assert describe_cores([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert describe_cores(None) == "all"


def scheduled_by_session() -> bool:
    """Whether the kernel groups this process by session: the file reads empty where autogroups are
    compiled in but the process is scheduled by another group (a container's cgroup, say)."""
    try:
        return bool(Path("/proc/self/autogroup").read_text().strip())
    except OSError:
        return False


AUTOGROUPS = scheduled_by_session()

BUSY = """
import os, sys, time
from apexrl.runtime.cores import lower_priority
os.sched_setaffinity(0, {int(sys.argv[1])})
lower_priority(int(sys.argv[2]))
end = time.monotonic() + 3.0
while time.monotonic() < end:
    pass
print(time.process_time())
"""


def autogroup_nice(pid: int | str) -> int:
    """The niceness of a process's scheduling group (``/autogroup-7159 nice 10``)."""
    return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])


def test_a_niced_process_in_its_own_session_yields_the_core() -> None:
    """Two busy processes on one core, each in its own session as the launcher starts roles, one
    lowered by 10: the lowered one gets a small share of the core (about 1/10 by the kernel's
    weights), where with autogroups a niceness alone would leave it half."""
    core = str(sorted(os.sched_getaffinity(0))[0])
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BUSY, core, by],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for by in ("0", "10")
    ]
    try:
        normal, lowered = (float(p.communicate(timeout=60)[0]) for p in procs)
    finally:
        for p in procs:
            p.kill()
    assert lowered < 0.4 * normal, (normal, lowered)


@pytest.mark.skipif(not AUTOGROUPS, reason="this process is not scheduled by session")
def test_a_process_in_its_callers_session_leaves_the_sessions_group_alone() -> None:
    before = autogroup_nice("self")
    code = (
        "import os; from apexrl.runtime.cores import lower_priority as lp; lp(5); print(os.nice(0))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert int(out.stdout) == os.nice(0) + 5  # the process itself is lowered
    assert autogroup_nice("self") == before  # the session's group (this test's) is not


THREADS = """
import os, sys
from apexrl.config import load_config
from apexrl.envs import atari
os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(",")})
cfg = load_config("configs/impala_pong_cpu.yaml").env
before = len(os.listdir("/proc/self/task"))
envs = atari.make_vector_env(cfg, 8)
envs.reset(seed=0)
print(len(os.listdir("/proc/self/task")) - before)
"""


@MULTI_CORE
def test_a_pinned_process_starts_one_env_thread_per_core_it_has() -> None:
    def threads(cores: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", THREADS, cores],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return int(out.stdout.split()[-1])

    one, two = threads("0"), threads("0,1")
    assert one >= 1 and two == one + 1, (one, two)  # ale-py's pool: a thread per usable core


@MULTI_CORE
def test_a_split_run_pins_the_learner_and_shows_it(launch: Callable[..., Launch]) -> None:  # noqa: F811
    launched = launch(
        "--actors",
        "2",
        "--learners",
        "1",
        "--placement",
        "split",
        # no evaluation stop: the evaluation actor plays at the idle niceness (actor.eval_nice auto)
        overrides=("run.stop_env_steps=100000000", "run.stop_eval_return=null"),
    )
    roles = {"replay", "params", "learner", "actor_0", "actor_1", "eval"}
    pids = wait_for_roles(launched, roles)
    cores = sorted(os.sched_getaffinity(0))
    learner, rest = {cores[-1]}, set(cores[:-1])
    assert os.sched_getaffinity(pids["learner"]) == learner, launched.tails()
    for name in ("replay", "params", "actor_0", "actor_1"):
        assert os.sched_getaffinity(pids[name]) == rest, name
    assert os.sched_getaffinity(pids["eval"]) == set(cores)
    assert os.getpriority(os.PRIO_PROCESS, pids["eval"]) == IDLE_EVAL_NICE
    if AUTOGROUPS:  # and its session's scheduling group, which the kernel ranks by
        assert autogroup_nice(pids["eval"]) == os.getpriority(os.PRIO_PROCESS, pids["eval"])
        assert autogroup_nice(pids["learner"]) == 0

    def shown() -> dict | None:
        result = status(str(launched.run_dir()))
        rows = table(result.stdout) if result.returncode == 0 else {}
        return rows if roles <= set(rows) else None

    rows = wait_until(shown, 60.0, interval_s=1.0)
    assert rows, status(str(launched.run_dir())).stdout
    assert rows["learner"]["cores"] == describe_cores(learner)
    assert rows["actor_0"]["cores"] == describe_cores(rest)
    assert rows["eval"]["cores"].startswith(f"{describe_cores(cores)} nice ")
    launched.popen.terminate()
    assert launched.wait(30.0) is not None, launched.tails()
    assert_nothing_left(launched, pids)

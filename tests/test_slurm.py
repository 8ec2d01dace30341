"""``apexrl slurm``: the batch script it writes, and real jobs on SLURM test clusters.

The fast tests read the batch script of ``--dry-run`` (placement, resources, bash syntax) and the
command's errors. The slow tests install SLURM from the system's packages and start a cluster on
this machine with ``scripts/slurm_test_cluster.sh`` (munge, slurmctld and slurmd as root, every
file under the test's directory), then submit short CartPole runs with ``apexrl slurm`` as a user
would:

- one node (this host at 127.0.0.1), 2 actors: training progresses, a killed actor is restarted
  by the job, ``scancel`` leaves no process behind; the learner's stop condition ends the job with
  status 0; a dead server ends it with status 1, naming the role;
- three nodes (network namespaces at 10.77.0.1-3, each with its own slurmd): the heterogeneous
  job puts the servers and two learners on node1 and the actors on node2 and node3, and
  ``apexrl stop --run-dir`` ends it with status 0.

They are skipped, with the reason, where root or the packages are not available.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, log_tail, run_apexrl, wait_until

SCRIPT = REPO / "scripts" / "slurm_test_cluster.sh"
PPO = REPO / "configs" / "ppo_cartpole.yaml"


def apexrl(*args: str, env: dict | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return run_apexrl(*args, env=env, cwd=cwd)


def dry_run(tmp_path: Path, *args: str) -> str:
    done = apexrl(
        "slurm", "--config", str(PPO), "--run-dir", str(tmp_path / "run"), "--dry-run", *args
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def sbatch_options(script: str) -> list[str]:
    return [
        line.removeprefix("#SBATCH ").strip()
        for line in script.splitlines()
        if line.startswith("#SBATCH")
    ]


# --- the batch script ----------------------------------------------------------------------------


def test_dry_run_prints_a_one_node_job_and_writes_nothing(tmp_path: Path) -> None:
    script = dry_run(tmp_path, "--actors", "3", "--partition", "debug", "--time", "00:30:00")
    assert script.startswith("#!/bin/bash\n")
    options = sbatch_options(script)
    assert "--nodes=1" in options and "hetjob" not in options
    assert "--partition=debug" in options and "--time=00:30:00" in options
    assert "--exclusive" in options
    assert f"--output={tmp_path / 'run'}/logs/slurm-%j.out" in options
    assert not any(o.startswith("--gpus") for o in options)
    assert "NUM_ACTORS=3\n" in script and "HET=0\n" in script
    assert f"CONFIG={tmp_path / 'run' / 'config.yaml'}\n" in script
    assert not (tmp_path / "run").exists(), "--dry-run must not write the run directory"
    syntax = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert syntax.returncode == 0, syntax.stderr


def test_several_nodes_make_a_heterogeneous_job_with_gpus_only_on_the_head(tmp_path: Path) -> None:
    script = dry_run(
        tmp_path,
        "--actors", "32", "--learners", "2", "--nodes", "5", "--gpus-per-learner", "2",
        "--partition", "gpu", "--cpus-per-node", "16", "--sbatch-arg=--account=rl",
    )  # fmt: skip
    options = sbatch_options(script)
    split = options.index("hetjob")
    head, actors = options[:split], options[split + 1 :]
    assert "--nodes=1" in head and "--gpus-per-node=4" in head  # 2 learners x 2 GPUs
    assert "--account=rl" in head and "--cpus-per-task=16" in head
    assert "--nodes=4" in actors and "--partition=gpu" in actors
    assert not any("gpu" in o and o.startswith("--gpus") for o in actors), actors
    assert "HET=1\n" in script and "NUM_LEARNERS=2\n" in script and "GPUS_PER_LEARNER=2\n" in script
    # Component 0's nodes hold the servers and learners, component 1's the actors.
    assert "SLURM_JOB_NODELIST_HET_GROUP_0" in script and "SLURM_JOB_NODELIST_HET_GROUP_1" in script
    assert "--gpus-per-task=" in script
    syntax = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert syntax.returncode == 0, syntax.stderr


def test_launch_slurm_script_takes_the_same_flags(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "launch_slurm.sh"), "--actors", "3", "--dry-run",
         "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "NUM_ACTORS=3\n" in done.stdout  # its default config: Ape-X DQN on CartPole
    assert "#SBATCH --job-name=apexrl-apex_dqn-CartPole-v1" in done.stdout


def test_gpus_per_learner_put_the_learners_on_cuda(tmp_path: Path) -> None:
    from apexrl import cli
    from apexrl.launch import slurm

    def plan(*flags: str) -> slurm.JobPlan:
        args = cli.build_parser().parse_args(
            ["slurm", "--config", str(PPO), "--run-dir", str(tmp_path / "run"), *flags]
        )
        return slurm.make_plan(args)

    assert plan("--gpus-per-learner", "1").cfg.learner.device == "cuda"
    assert plan().cfg.learner.device == "cpu"
    assert (
        plan("--gpus-per-learner", "1", "--set", "learner.device=auto").cfg.learner.device == "auto"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--actors", "0"), "--actors must be at least 1"),
        (("--time", "soon"), "is not a SLURM time"),
        (("--set", "algo.no_such_key=1"), "no_such_key"),
        (("--sbatch-arg", "account=rl"), "must be one sbatch option"),
        (("--set", "env.id=CartPol-v1"), "did you mean CartPole-v1"),
        (("--run-dir", "my runs/a"), "must not contain whitespace"),
    ],
)
def test_bad_requests_exit_2_with_one_line(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    done = apexrl(
        "slurm", "--config", str(PPO), "--run-dir", str(tmp_path / "run"), "--dry-run", *args
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stdout == ""


def test_resume_needs_the_runs_directory_config_and_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"

    def resume(*flags: str) -> subprocess.CompletedProcess:
        return apexrl("slurm", "--resume", "--dry-run", *flags)

    assert "--resume needs --run-dir" in resume().stderr
    assert "config.yaml' does not exist" in resume("--run-dir", str(run_dir)).stderr
    run_dir.mkdir()
    shutil.copy(PPO, run_dir / "config.yaml")
    no_checkpoint = resume("--run-dir", str(run_dir))
    assert no_checkpoint.returncode == 2 and "checkpoint.pt does not exist" in no_checkpoint.stderr
    (run_dir / "checkpoint.pt").write_bytes(b"")  # only its presence is checked before submitting
    script = resume("--run-dir", str(run_dir))
    assert script.returncode == 0, script.stderr
    assert "RESUME=1\n" in script.stdout and f"CONFIG={run_dir / 'config.yaml'}" in script.stdout
    assert "RESUME=0\n" in dry_run(tmp_path / "fresh")
    # A new run refuses a directory that holds one.
    held = apexrl("slurm", "--config", str(PPO), "--run-dir", str(run_dir), "--dry-run")
    assert held.returncode == 2 and "already holds a run" in held.stderr


def test_each_role_is_given_only_its_bundle_of_the_keys(tmp_path: Path) -> None:
    script = dry_run(tmp_path, "--nodes", "3")
    assert '--keys "$KEYS"' not in script, "no step gets the whole keys directory"
    steps = {"replay": "servers", "params": "servers", "learner": "learner"}
    for role, bundle in steps.items():
        assert re.search(rf'-- {role} "\$\{{COMMON\[@\]\}}".*\n?.*--keys "\$KEYS/{bundle}"', script)
    # Each actor its own key; where the keys were made without --actors, the shared one.
    assert 'bundle="$KEYS/actor_$i"' in script and '|| bundle="$KEYS/actors"' in script
    assert 'actor_loop "actor_$i" "$node" --keys "$bundle" --id "$i"' in script
    assert 'actor_loop eval "${ACTOR_NODES[0]}" --keys "$KEYS/eval"' in script


def no_sbatch_env(tmp_path: Path) -> dict[str, str]:
    """A PATH with python3 and no sbatch: the run directory is written, nothing is submitted."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "python3").exists():
        (bin_dir / "python3").symlink_to(sys.executable)
    return {**os.environ, "PATH": str(bin_dir)}


def test_the_run_gets_a_bundle_per_kind_of_host_and_flat_keys_are_refused(tmp_path: Path) -> None:
    from apexrl.transport import auth

    run_dir = tmp_path / "run"
    done = apexrl(
        "slurm", "--config", str(PPO), "--run-dir", str(run_dir), env=no_sbatch_env(tmp_path)
    )
    assert "sbatch is not on PATH" in done.stderr, done.stderr
    assert auth.has_bundles(run_dir / "keys")
    flat = tmp_path / "flat"
    flat.mkdir()
    for path in (run_dir / "keys").glob("*/*"):
        (flat / path.name).write_bytes(path.read_bytes())
    refused = apexrl(
        "slurm", "--config", str(PPO), "--run-dir", str(tmp_path / "run2"), "--keys", str(flat),
        env=no_sbatch_env(tmp_path),
    )  # fmt: skip
    assert refused.returncode == 2
    assert "flat layout of earlier versions" in refused.stderr, refused.stderr
    assert "apexrl keys DIR" in refused.stderr


def test_without_sbatch_on_path_it_says_so_and_submits_nothing(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {**os.environ, "PATH": str(bin_dir)}
    done = apexrl("slurm", "--config", str(PPO), "--run-dir", str(tmp_path / "run"), env=env)
    assert done.returncode == 2
    assert "sbatch is not on PATH" in done.stderr, done.stderr


# --- real jobs on a one-node cluster --------------------------------------------------------------


@dataclass
class Cluster:
    dir: Path
    nodes: int

    def run(self, *command: str) -> subprocess.CompletedProcess:
        """A client command where the cluster is reachable (``slurm_test_cluster.sh exec``)."""
        return subprocess.run(
            ["bash", str(SCRIPT), "exec", str(self.dir), *command],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            cwd=REPO,
            timeout=120,
        )

    def submit(self, run_dir: Path, *args: str) -> str:
        done = self.run(
            sys.executable, "-m", "apexrl", "slurm", "--config", str(PPO), "--actors", "2",
            "--run-dir", str(run_dir), *args,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        print(done.stdout.strip())
        match = re.search(r"submitted batch job (\d+)", done.stdout)
        assert match, done.stdout
        return match.group(1)

    def job_state(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (of the first component); {} once SLURM forgot it."""
        shown = self.run("scontrol", "show", "job", "--oneliner", job_id)
        if shown.returncode != 0 or not shown.stdout.strip():
            return {}
        first = shown.stdout.strip().splitlines()[0]
        return dict(f.split("=", 1) for f in first.split() if "=" in f)

    def in_queue(self, job_id: str) -> bool:
        listed = self.run("squeue", "--noheader", "--jobs", job_id, "--format=%i")
        return any(line.split("+")[0] == job_id for line in listed.stdout.split())

    def node_of(self, pid: int) -> str:
        """The test node a process runs on: ``node<i>``, from its network namespace."""
        prefix = (self.dir / "netns_prefix").read_text().strip()
        named = subprocess.run(
            ["ip", "netns", "identify", str(pid)], capture_output=True, text=True
        )
        name = named.stdout.strip()
        return f"node{name.removeprefix(prefix + '-')}" if name.startswith(prefix) else name


def start_cluster(directory: Path, nodes: int) -> Cluster:
    if os.geteuid() != 0:
        pytest.skip("a SLURM test cluster needs root (munged, slurmctld and slurmd)")
    installed = subprocess.run(
        ["bash", str(SCRIPT), "install"], capture_output=True, text=True, timeout=900
    )
    if installed.returncode != 0:
        pytest.skip(f"cannot install SLURM from the system's packages: {installed.stderr.strip()}")
    up = subprocess.run(
        ["bash", str(SCRIPT), "up", str(directory), str(nodes)], capture_output=True, text=True
    )
    if up.returncode != 0:
        stop_cluster(directory)
        if nodes > 1 and ("network namespaces" in up.stderr or "nsenter" in up.stderr):
            pytest.skip(f"cannot make the test nodes' network namespaces: {up.stderr.strip()}")
        pytest.fail(f"the test cluster did not come up: {up.stdout}{up.stderr}")
    print(up.stdout.strip())
    return Cluster(directory, nodes)


def stop_cluster(directory: Path) -> None:
    subprocess.run(["bash", str(SCRIPT), "down", str(directory)], check=False)
    left = processes_naming(str(directory))
    assert not left, f"processes of the test cluster left after `down`: {left}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A one-node cluster: this host at 127.0.0.1."""
    directory = tmp_path_factory.mktemp("slurm")
    made = start_cluster(directory, 1)
    try:
        yield made
    finally:
        stop_cluster(directory)


def processes_naming(*texts: str) -> dict[int, list[str]]:
    """The processes (but this one) whose command line contains one of ``texts``: argv."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        line = " ".join(argv)
        if any(text in line for text in texts):
            found[int(entry.name)] = [a for a in argv if a]
    return found


def processes_of(run_dir: Path, job_id: str) -> dict[int, list[str]]:
    """Every process of the job: those whose command line names the run directory (the roles
    and their srun), and the job's step daemons (``slurmstepd: [<job id>.<step>]``)."""
    return processes_naming(str(run_dir), f"[{job_id}.")


def role_pid(run_dir: Path, job_id: str, role: str, *flags: str) -> int | None:
    """The PID of the role process itself (``python -m apexrl <role> ...``), not its srun."""
    for pid, argv in processes_of(run_dir, job_id).items():
        if "srun" in Path(argv[0]).name or "apexrl" not in argv:
            continue
        at = argv.index("apexrl")
        if argv[at + 1 : at + 2] == [role] and all(f in " ".join(argv) for f in flags):
            return pid
    return None


def results(run_dir: Path) -> list[dict]:
    path = run_dir / "result.json"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def job_log(run_dir: Path, job_id: str) -> str:
    path = run_dir / "logs" / f"slurm-{job_id}.out"
    return path.read_text(errors="replace") if path.is_file() else ""


def tails(run_dir: Path, job_id: str) -> str:
    logs = sorted((run_dir / "logs").glob("*.log")) if (run_dir / "logs").is_dir() else []
    parts = [f"--- slurm-{job_id}.out:\n{job_log(run_dir, job_id)}"]
    parts += [f"--- {p.name}:\n{log_tail(p, 15)}" for p in logs]
    return "\n".join(parts)


@pytest.fixture
def job(cluster: Cluster) -> Iterator[list[str]]:
    """Job ids a test submitted; cancelled at the end whatever happened."""
    submitted: list[str] = []
    yield submitted
    for job_id in submitted:
        cluster.run("scancel", "--full", job_id)


def status_table(text: str) -> dict[str, dict[str, str]]:
    from test_status import table

    return table(text)


def actor_versions(run_dir: Path, role: str) -> list[float]:
    from test_roles import actor_weights_versions

    try:
        return actor_weights_versions(run_dir, role)
    except Exception:  # an event file being written  # noqa: BLE001
        return []


@pytest.mark.slow
def test_a_job_trains_restarts_a_dead_actor_and_scancel_leaves_nothing(
    cluster: Cluster, job: list[str], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    # No stop condition: the run goes on until scancel.
    job_id = cluster.submit(run_dir, "--set", "run.stop_eval_return=null")
    job.append(job_id)
    assert wait_until(lambda: cluster.job_state(job_id).get("JobState") == "RUNNING", 60, 0.5), (
        cluster.job_state(job_id)
    )
    placed = wait_until(lambda: "started replay, params" in job_log(run_dir, job_id), 60, 0.5)
    assert placed, tails(run_dir, job_id)
    node = cluster.job_state(job_id)["NodeList"]

    # Training progresses: the learner's updates and both actors' weights versions advance.
    updated = wait_until(lambda: [r for r in results(run_dir) if r["learner_updates"] > 0], 90, 1)
    assert updated, tails(run_dir, job_id)
    at_first = updated[0]["learner_updates"]
    more = wait_until(
        lambda: [r for r in results(run_dir) if r["learner_updates"] >= at_first + 5], 90, 1
    )
    assert more, tails(run_dir, job_id)
    for role in ("actor_0", "actor_1"):
        assert wait_until(lambda r=role: max(actor_versions(run_dir, r), default=0) > 0, 60, 1), (
            f"{role} never played weights newer than version 0\n{tails(run_dir, job_id)}"
        )

    # From the login node, `apexrl status RUN_DIR` finds the job's servers through config.yaml
    # (the learner wrote the head node's addresses into it).
    shown = cluster.run(sys.executable, "-m", "apexrl", "status", str(run_dir), "--once")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    rows = status_table(shown.stdout)
    assert all(rows[r]["state"] == "ok" for r in ("replay", "params", "actor_0")), shown.stdout

    # A dead actor is started again by the job, and plays newer weights.
    victim = role_pid(run_dir, job_id, "actor", "--id 0")
    assert victim is not None, processes_of(run_dir, job_id)
    before = max(actor_versions(run_dir, "actor_0"))
    os.kill(victim, signal.SIGKILL)
    restarted = wait_until(
        lambda: (
            "actor_0 ended with exit code" in job_log(run_dir, job_id)
            and role_pid(run_dir, job_id, "actor", "--id 0") not in (None, victim)
        ),
        60,
        0.5,
    )
    assert restarted, tails(run_dir, job_id)
    newer = wait_until(lambda: max(actor_versions(run_dir, "actor_0")) > before, 90, 1)
    assert newer, f"the restarted actor_0 plays no newer weights\n{tails(run_dir, job_id)}"
    updates = results(run_dir)[-1]["learner_updates"]
    versions = {r: max(actor_versions(run_dir, r)) for r in ("actor_0", "actor_1")}
    roles = sorted(
        {" ".join(argv[argv.index("apexrl") + 1 : argv.index("apexrl") + 2])
         for argv in processes_of(run_dir, job_id).values()
         if "apexrl" in argv and "srun" not in Path(argv[0]).name}
    )  # fmt: skip

    # scancel: every role and step daemon of the job is gone, and the job leaves the queue.
    cancelled = time.monotonic()
    assert cluster.run("scancel", job_id).returncode == 0
    gone = wait_until(
        lambda: not processes_of(run_dir, job_id) and not cluster.in_queue(job_id), 60, 0.2
    )
    stop_s = time.monotonic() - cancelled
    assert gone, f"left after scancel: {processes_of(run_dir, job_id)}\n{tails(run_dir, job_id)}"
    print(
        f"\njob {job_id} on node {node}: processes {roles}; learner updates {updates}; "
        f"actor weights versions {versions} (actor_0 restarted after SIGKILL, then played "
        f"versions above {before:.0f}); scancel to no process left: {stop_s:.1f} s"
    )
    print(job_log(run_dir, job_id))


@pytest.mark.slow
def test_the_learners_stop_condition_ends_the_job_with_status_0(
    cluster: Cluster, job: list[str], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    submitted = time.monotonic()
    job_id = cluster.submit(run_dir)
    job.append(job_id)
    ended = wait_until(lambda: not cluster.in_queue(job_id), 240, 0.5)
    took = time.monotonic() - submitted
    assert ended, f"job {job_id} still queued or running\n{tails(run_dir, job_id)}"
    last = results(run_dir)[-1]
    assert last["done"] is True and last["eval_return_mean"] >= 475, last
    assert "job exits with status 0" in job_log(run_dir, job_id), tails(run_dir, job_id)
    state = cluster.job_state(job_id)
    if state:  # kept for MinJobAge seconds after the end
        assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", state
    assert not processes_of(run_dir, job_id)
    assert (run_dir / "checkpoint.pt").is_file()
    print(
        f"\njob {job_id}: solved (mean evaluation return {last['eval_return_mean']:.1f} over "
        f"{last['eval_episodes_in_window']} episodes) after {last['env_steps']} env steps and "
        f"{last['learner_updates']} updates; submit to job end {took:.1f} s"
    )


@pytest.mark.slow
def test_a_cancelled_run_resumes_from_its_checkpoint_in_a_new_job(
    cluster: Cluster, job: list[str], tmp_path: Path
) -> None:
    """A job stopped by scancel (as by its time limit) and submitted again with --resume: the
    learner continues from its checkpoint, and the run then ends on its stop condition."""
    run_dir = tmp_path / "run"
    first = cluster.submit(run_dir, "--set", "run.stop_eval_return=null")
    job.append(first)
    started = wait_until(lambda: [r for r in results(run_dir) if r["learner_updates"] >= 5], 120, 1)
    assert started, tails(run_dir, first)
    assert cluster.run("scancel", first).returncode == 0
    assert wait_until(lambda: not cluster.in_queue(first), 60, 0.5), tails(run_dir, first)
    assert (run_dir / "checkpoint.pt").is_file(), tails(run_dir, first)
    before = results(run_dir)[-1]["learner_updates"]

    # Again, without --config: the run's own config.yaml, with the stop condition put back.
    done = cluster.run(
        sys.executable, "-m", "apexrl", "slurm", "--resume", "--run-dir", str(run_dir),
        "--actors", "2", "--set", "run.stop_eval_return=475",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    second = re.search(r"submitted batch job (\d+)", done.stdout).group(1)
    job.append(second)
    ended = wait_until(lambda: not cluster.in_queue(second), 240, 0.5)
    assert ended, tails(run_dir, second)
    learner_log = (run_dir / "logs" / "learner.log").read_text(errors="replace")
    resumed = re.search(r"resumed from \S+ at update (\d+)", learner_log)
    assert resumed and int(resumed.group(1)) > 0, learner_log[-3000:]
    last = results(run_dir)[-1]
    assert last["done"] is True and last["learner_updates"] > before, last
    assert "job exits with status 0" in job_log(run_dir, second), tails(run_dir, second)
    print(
        f"\njob {first} cancelled at {before} updates; job {second} (--resume) continued from "
        f"update {resumed.group(1)} and solved at {last['learner_updates']} updates, "
        f"mean evaluation return {last['eval_return_mean']:.1f}"
    )


@pytest.mark.slow
def test_a_dead_server_ends_the_job_naming_the_role(
    cluster: Cluster, job: list[str], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    job_id = cluster.submit(run_dir, "--set", "run.stop_eval_return=null")
    job.append(job_id)
    replay = wait_until(lambda: role_pid(run_dir, job_id, "replay"), 90, 0.5)
    assert replay, tails(run_dir, job_id)
    assert wait_until(lambda: [r for r in results(run_dir) if r["learner_updates"] > 0], 90, 1)
    killed = time.monotonic()
    os.kill(replay, signal.SIGKILL)
    ended = wait_until(
        lambda: not cluster.in_queue(job_id) and not processes_of(run_dir, job_id), 120, 0.5
    )
    took = time.monotonic() - killed
    log = job_log(run_dir, job_id)
    assert ended, f"the job went on without its replay server\n{tails(run_dir, job_id)}"
    assert "the replay step ended with exit code" in log and "ending the job" in log, log
    assert "job exits with status 1" in log, log
    state = cluster.job_state(job_id)
    if state:
        assert state["JobState"] == "FAILED", state
    print(f"\njob {job_id}: replay killed; job over, nothing left, {took:.1f} s later\n{log}")


@pytest.mark.slow
def test_a_job_over_three_nodes_puts_servers_and_learners_on_the_head_and_actors_elsewhere(
    tmp_path: Path,
) -> None:
    """Three test nodes (network namespaces at 10.77.0.1-3): a heterogeneous job whose first
    component (node1) runs replay, params and a group of two learners, and whose second (node2,
    node3) runs the actors, actor i on node 2 + i mod 2; addresses from SLURM's node list."""
    three = start_cluster(tmp_path / "cluster", 3)
    job_id = ""
    try:
        run_dir = tmp_path / "run"
        job_id = three.submit(
            run_dir, "--nodes", "3", "--actors", "4", "--learners", "2",
            "--set", "run.stop_eval_return=null",
        )  # fmt: skip
        expected = {("replay",): "node1", ("params",): "node1"}
        expected |= {("learner", f"--rank {r}"): "node1" for r in range(2)}
        expected |= {("actor", f"--id {i}"): f"node{2 + i % 2}" for i in range(4)}
        expected[("actor", "--eval")] = "node2"

        def placement() -> dict[tuple[str, ...], str] | None:
            pids = {key: role_pid(run_dir, job_id, *key) for key in expected}
            if None in pids.values():
                return None
            return {key: three.node_of(pid) for key, pid in pids.items()}

        placed = wait_until(placement, 120, 0.5)
        assert placed == expected, f"{placed}\n{tails(run_dir, job_id)}"
        # Each role was given only its own bundle of the run's keys (each actor its own key).
        argvs = processes_of(run_dir, job_id)
        for key in expected:
            argv = argvs[role_pid(run_dir, job_id, *key)]
            own = f"actor_{key[1].split()[1]}" if key[1:] and key[1].startswith("--id") else ""
            bundle = {"replay": "servers", "params": "servers", "learner": "learner"}.get(
                key[0], "eval" if "--eval" in key else own
            )
            given = argv[argv.index("--keys") + 1]
            assert given == str(run_dir / "keys" / bundle), f"{key}: --keys {given}"
        assert "head node node1 (10.77.0.1): replay tcp://10.77.0.1:" in job_log(run_dir, job_id)
        assert "actor nodes: node2 node3" in job_log(run_dir, job_id)

        # Training goes on across the nodes: updates, and every actor plays published weights.
        updated = wait_until(
            lambda: [r for r in results(run_dir) if r["learner_updates"] >= 5], 120, 1
        )
        assert updated, tails(run_dir, job_id)
        for i in range(4):
            role = f"actor_{i}"
            played = wait_until(
                lambda r=role: max(actor_versions(run_dir, r), default=0) > 0, 90, 1
            )
            assert played, f"{role} never played published weights\n{tails(run_dir, job_id)}"
        updates = results(run_dir)[-1]["learner_updates"]

        # `apexrl stop --run-dir` from node1 (the login side here) ends the whole job, cleanly:
        # the servers' addresses come from the config.yaml the learner wrote.
        asked = time.monotonic()
        stopped = three.run(sys.executable, "-m", "apexrl", "stop", "--run-dir", str(run_dir))
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        gone = wait_until(
            lambda: not processes_of(run_dir, job_id) and not three.in_queue(job_id), 90, 0.2
        )
        stop_s = time.monotonic() - asked
        assert gone, f"left after apexrl stop: {processes_of(run_dir, job_id)}"
        assert "job exits with status 0" in job_log(run_dir, job_id), tails(run_dir, job_id)
        by_node: dict[str, list[str]] = {}
        for key, node in placed.items():
            by_node.setdefault(node, []).append(" ".join(key))
        print(
            f"\njob {job_id} over 3 nodes: {by_node}; learner updates {updates}; "
            f"apexrl stop to job over, no process left: {stop_s:.1f} s"
        )
    finally:
        if job_id:
            three.run("scancel", "--full", job_id)
        stop_cluster(tmp_path / "cluster")


def test_the_cluster_script_refuses_without_a_directory() -> None:
    done = subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True)
    assert done.returncode != 0 and "usage" in done.stderr

"""``apexrl ray``'s plan, without a cluster: the placement groups and bundles of ``--dry-run``,
each role's command line (its own ``apexrl <role>`` with the run's config and its host's bundle
of the run's keys), the resources asked of Ray, and the flags it refuses with one line (exit 2)
before it connects to anything. The runs on a Ray cluster are in ``test_ray_cluster.py``."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest
from conftest import CONFIG, run_apexrl

from apexrl.cli import build_parser
from apexrl.launch.ray_cluster.plan import ACTORS, HEAD, LEARNERS, make_plan


def parse(*args: str) -> argparse.Namespace:
    return build_parser().parse_args(["ray", *args])


def apexrl_ray(*args: str) -> subprocess.CompletedProcess:
    return run_apexrl("ray", *args)


def test_the_plan_puts_servers_and_learners_on_the_head_and_spreads_the_actors(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    plan = make_plan(
        parse("--config", str(CONFIG), "--actors", "3", "--learners", "2", "--run-dir", str(run))
    )
    by_name = {spec.name: spec for spec in plan.roles}
    assert list(by_name) == [
        "replay", "params", "learner_0", "learner_1", "actor_0", "actor_1", "actor_2", "eval"
    ]  # fmt: skip
    assert [by_name[n].group for n in ("replay", "params", "learner_0", "learner_1")] == [HEAD] * 4
    assert [by_name[n].bundle for n in ("replay", "params", "learner_0", "learner_1")] == [
        0, 1, 2, 3
    ]  # fmt: skip
    assert [(s.group, s.bundle) for s in plan.roles[4:]] == [(ACTORS, i) for i in range(4)]
    assert plan.groups == [HEAD, ACTORS]
    assert plan.bundles(ACTORS) == [{"CPU": 1.0}] * 4
    keys = run / "keys"
    config = str(run / "config.yaml")
    assert by_name["replay"].args == ("replay", "--config", config, "--keys", str(keys / "servers"))
    assert by_name["learner_1"].args == (
        "learner", "--rank", "1", "--config", config, "--keys", str(keys / "learner")
    )  # fmt: skip
    assert by_name["actor_2"].args == (
        "actor",
        "--id",
        "2",
        "--config",
        config,
        "--keys",
        str(keys / "actor_2"),
    )  # fmt: skip  (its own key: the keys the run makes have one per actor)
    assert by_name["eval"].args == (
        "actor", "--eval", "--config", config, "--keys", str(keys / "eval")
    )  # fmt: skip
    assert [s.name for s in plan.roles if s.restartable] == [
        "actor_0", "actor_1", "actor_2", "eval"
    ]  # fmt: skip
    assert plan.cfg.actor.num_actors == 3 and plan.cfg.learner.world_size == 2
    assert plan.cfg.run_dir == run and plan.keys_dir == keys


def test_learners_with_gpus_get_their_own_group_and_cuda(tmp_path: Path) -> None:
    plan = make_plan(
        parse(
            "--config", str(CONFIG), "--run-dir", str(tmp_path / "r"), "--gpus-per-learner", "2",
            "--cpus-per-learner", "4", "--cpus-per-actor", "0.5", "--no-eval",
        )
    )  # fmt: skip
    assert plan.groups == [HEAD, LEARNERS, ACTORS]
    assert plan.bundles(HEAD) == [{"CPU": 1.0}, {"CPU": 1.0}]
    assert plan.bundles(LEARNERS) == [{"CPU": 4.0, "GPU": 2.0}]
    assert plan.bundles(ACTORS) == [{"CPU": 0.5}] * 4
    assert plan.cfg.learner.device == "cuda"
    assert not any(spec.name == "eval" for spec in plan.roles)


def test_dry_run_prints_the_groups_and_every_command_and_writes_nothing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = apexrl_ray("--config", str(CONFIG), "--actors", "2", "--run-dir", str(run), "--dry-run")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert 'placement group head (STRICT_PACK, on the head node): 3 bundles, {"CPU": 3.0}' in out
    assert 'placement group actors (SPREAD, over the nodes): 3 bundles, {"CPU": 3.0}' in out
    lines = [line.split() for line in out.splitlines() if line.startswith("  bundle")]
    names = ["replay", "params", "learner", "actor_0", "actor_1", "eval"]
    assert [line[4] for line in lines] == names
    assert lines[3][6:] == [
        "-m", "apexrl", "actor", "--id", "0", "--config", str(run / "config.yaml"),
        "--keys", str(run / "keys" / "actor_0"),
    ]  # fmt: skip
    assert "cluster auto" in out
    assert not run.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--actors", "0"], "--actors must be at least 1, got 0"),
        (["--learners", "0"], "--learners must be at least 1, got 0"),
        (["--gpus-per-learner", "-1"], "--gpus-per-learner must be at least 0, got -1"),
        (["--cpus-per-actor", "0"], "--cpus-per-actor must be more than 0, got 0.0"),
        (["--max-actor-restarts", "-2"], "--max-actor-restarts must be at least 0, got -2"),
        (["--address", ""], "--address '' must be auto or HOST:PORT"),
        (["--set", "algo.lr=fast"], "config error"),
        (["--set", "env.id=NoSuchEnv-v0"], "NoSuchEnv-v0"),
    ],
)
def test_bad_flags_are_refused_in_one_line_before_connecting(
    tmp_path: Path, args: list[str], message: str
) -> None:
    run = tmp_path / "run"
    done = apexrl_ray("--config", str(CONFIG), "--run-dir", str(run), "--dry-run", *args)
    assert done.returncode == 2, done.stdout
    assert message in done.stderr and done.stderr.startswith("apexrl ray: ")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not run.exists()


def test_resume_needs_a_run_and_keys_must_be_a_runs(tmp_path: Path) -> None:
    done = apexrl_ray("--resume", "--dry-run")
    assert done.returncode == 2 and "--resume needs --run-dir" in done.stderr
    done = apexrl_ray("--dry-run")
    assert done.returncode == 2 and "--config is required" in done.stderr
    done = apexrl_ray("--config", str(CONFIG), "--resume", "--run-dir", str(tmp_path), "--dry-run")
    assert done.returncode == 2 and "does not exist" in done.stderr, done.stderr
    empty = tmp_path / "nokeys"
    empty.mkdir()
    done = apexrl_ray("--config", str(CONFIG), "--keys", str(empty), "--dry-run")
    assert done.returncode == 2 and "does not hold a run's CURVE keys" in done.stderr

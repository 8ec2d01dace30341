"""The README's set-up where the system Python refuses ``pip install`` (PEP 668):
``scripts/install.sh`` makes the project's virtual environment ``.venv`` and installs there, and
the scripts then run it.

The externally managed Python is real: a copy of this interpreter in a prefix of its own, whose
stdlib directory (symbolic links to this one's files) holds an ``EXTERNALLY-MANAGED`` marker, so
that pip itself refuses to install into it. It runs on a copy of the repository, never on this one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import REPO

INSTALL_TIMEOUT_S = 600.0  # a hang guard: venv, then pip with build isolation


def copy_repo(dest: Path) -> Path:
    """What ``pip install -e`` and the scripts need of the repository."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    for name in ("scripts", "apexrl", "configs"):
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def externally_managed_python(prefix: Path) -> Path:
    """A copy of this interpreter under ``prefix`` whose stdlib directory holds the PEP 668 marker
    (the rest of it and of ``lib/`` are links to this interpreter's files, site-packages too)."""
    base = Path(sys.base_prefix)
    stdlib = Path(sysconfig.get_paths(vars={"base": base, "installed_base": base})["stdlib"])
    rel = stdlib.relative_to(base)
    (prefix / "bin").mkdir(parents=True)
    (prefix / rel).mkdir(parents=True)
    python = prefix / "bin" / "python3"
    shutil.copy2(os.path.realpath(sys._base_executable), python)
    for entry in (base / rel.parent).iterdir():
        if entry.name != rel.name:
            (prefix / rel.parent / entry.name).symlink_to(entry)
    for entry in stdlib.iterdir():
        (prefix / rel / entry.name).symlink_to(entry)
    (prefix / rel / "EXTERNALLY-MANAGED").write_text(
        "[externally-managed]\nError=this Python is managed by the system (apexrl's test)\n"
    )
    return python


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "VIRTUAL_ENV", "PYTHONPATH")}
    return {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


def run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
    )


def test_scripts_pick_python_by_rule(tmp_path: Path) -> None:
    """$PYTHON, else the active virtual environment's python3, else .venv, else python3."""
    repo = copy_repo(tmp_path)
    pick = ["bash", str(repo / "scripts" / "project_python.sh")]
    env = clean_env()
    assert run(pick, tmp_path, env).stdout.strip() == "python3"
    venv_python = repo / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("#!/bin/sh\n")
    venv_python.chmod(0o755)
    assert run(pick, tmp_path, env).stdout.strip() == str(venv_python)
    assert run(pick, tmp_path, {**env, "VIRTUAL_ENV": "/x"}).stdout.strip() == "python3"
    assert run(pick, tmp_path, {**env, "PYTHON": "/opt/py"}).stdout.strip() == "/opt/py"


@pytest.mark.slow
def test_install_makes_and_uses_a_venv_where_python_is_externally_managed(tmp_path: Path) -> None:
    system = externally_managed_python(tmp_path / "system")
    probe = [
        str(system),
        "-c",
        "import sys, sysconfig; print(sys.prefix, sysconfig.get_path('stdlib'))",
    ]
    prefix, stdlib = run(probe, tmp_path, clean_env()).stdout.split()
    if Path(prefix) != tmp_path / "system":
        pytest.skip(f"a copy of this interpreter does not take its own prefix ({prefix})")
    assert (Path(stdlib) / "EXTERNALLY-MANAGED").is_file()
    if run([str(system), "-c", "import torch, pytest"], tmp_path, clean_env()).returncode != 0:
        # Tests run in a virtual environment: the base interpreter's packages lack torch, which
        # the project's environment would then download.
        pytest.skip("this interpreter's base installation has no torch and pytest to reuse")
    refused = run([str(system), "-m", "pip", "install", "--no-index", "six"], tmp_path, clean_env())
    assert refused.returncode != 0 and "externally-managed-environment" in refused.stderr
    # The editable install builds in isolation, with setuptools from the configured index.
    wheels = run(
        [
            str(system),
            "-m",
            "pip",
            "download",
            "--no-deps",
            "-d",
            str(tmp_path / "w"),
            "setuptools>=68",
        ],
        tmp_path,
        clean_env(),
    )
    if wheels.returncode != 0:
        pytest.skip(
            f"no package index answers, and pip install -e needs one: {wheels.stderr[-300:]}"
        )

    repo = copy_repo(tmp_path / "repo")
    env = clean_env(PATH=f"{system.parent}{os.pathsep}{os.environ['PATH']}")  # python3 is it
    installed = run(["bash", "scripts/install.sh"], repo, env)
    output = installed.stdout + installed.stderr
    assert installed.returncode == 0, output
    venv = repo / ".venv"
    assert f"externally managed (PEP 668): using the project's virtual environment {venv}" in output
    assert f"installed into {venv}" in output

    # The project's environment has apexrl (the copy, editable) and sees the system's torch.
    where = run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import apexrl, sys, torch; print(apexrl.__file__, sys.prefix)",
        ],
        tmp_path,
        env,
    )
    assert where.stdout.split() == [str(repo / "apexrl" / "__init__.py"), str(venv)], where.stderr
    # The scripts run it: the tests' runner and the launcher (which refuses 0 actors by itself).
    assert run(["bash", "scripts/project_python.sh"], repo, env).stdout.strip() == str(
        venv / "bin" / "python"
    )
    (repo / "tests").mkdir()
    (repo / "tests" / "test_probe.py").write_text(
        "import sys\n\ndef test_probe():\n    print('PREFIX', sys.prefix)\n"
    )
    tests = run(["scripts/run_tests.sh", "-q", "-s", "-p", "no:cacheprovider", "tests"], repo, env)
    assert tests.returncode == 0 and f"PREFIX {venv}" in tests.stdout, tests.stdout + tests.stderr
    launched = run(["scripts/launch_local.sh", "--actors", "0"], repo, env)
    assert launched.returncode == 2 and "--actors must be at least 1" in launched.stderr
    # A second install finds the environment and installs into it again.
    again = run(["bash", "scripts/install.sh"], repo, env)
    assert again.returncode == 0 and f"installed into {venv}" in again.stdout, again.stderr


def test_a_wheel_ships_the_slurm_batch_script(tmp_path: Path) -> None:
    """A non-editable install has the package data too: ``apexrl slurm --dry-run`` renders the
    batch script from the installed ``slurm_job.sh``."""
    repo = copy_repo(tmp_path / "repo")
    dist = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip"]
    built = run(
        [
            *pip,
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(dist),
            str(repo),
        ],
        tmp_path,
        clean_env(),
    )
    if built.returncode != 0:
        pytest.skip(f"cannot build a wheel here without a package index: {built.stderr[-300:]}")
    (wheel,) = dist.glob("apexrl-*.whl")
    site = tmp_path / "site"
    installed = run(
        [*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
        tmp_path,
        clean_env(),
    )
    assert installed.returncode == 0, installed.stderr
    assert (site / "apexrl" / "launch" / "slurm_job.sh").is_file()
    config = REPO / "configs" / "apex_dqn_cartpole.yaml"
    dry = run(
        [sys.executable, "-m", "apexrl", "slurm", "--dry-run", "--config", str(config)]
        + ["--run-dir", str(tmp_path / "run")],
        tmp_path,  # no apexrl here: the installed one runs
        clean_env(PYTHONPATH=str(site)),
    )
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("#!/bin/bash\n#SBATCH --job-name=apexrl-"), dry.stdout[:300]
    assert "every step has ended; the job exits with status $status" in dry.stdout
    assert "export PYTHONPATH" not in dry.stdout  # installed: the nodes need no checkout
    assert not (tmp_path / "run").exists()  # a dry run writes nothing

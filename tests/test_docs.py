"""The doc test: every ``python`` and ``bash`` block of the README and of ``docs/*.md`` runs as
written, from the repository root, as a reader would copy it (``tests/doc_blocks.py`` says how a
block's directive changes that). Each runs in its own session; what it started is found by the
run directories it made under ``runs/`` and must be gone when it ends; those directories are
removed afterwards.

The fast test reads every block: its directive is known, a python block compiles, a bash block
parses, and every file a command names exists. The slow tests run the blocks, one test each.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, log_tail, wait_until
from doc_blocks import Block, doc_pages, page_blocks
from test_launch_local import run_processes

RUN_TIMEOUT_S = 900.0  # the longest a block may run that ends by itself
INTERRUPT_TIMEOUT_S = 60.0  # after Ctrl-C, the longest a command may take to stop everything
CLEAN_EXITS = (0, 130, -signal.SIGINT)  # after Ctrl-C: done, or interrupted as it should be
RUNS = REPO / "runs"

BLOCKS = [block for page in doc_pages(REPO) for block in page_blocks(page)]


def test_every_block_is_run_or_says_why_not() -> None:
    runnable = [b for b in BLOCKS if b.language in ("python", "bash")]
    assert any(b.runs for b in runnable), "no block of the docs runs"
    for block in runnable:
        if block.skip is not None:
            continue
        if block.language == "python":
            compile(block.text, block.name, "exec")
            continue
        parsed = subprocess.run(["bash", "-n"], input=block.text, text=True, capture_output=True)
        assert parsed.returncode == 0, f"{block.name}: {parsed.stderr}"
        for command in block.commands():
            for word in command.split():
                if word.startswith(("configs/", "scripts/", "benchmarks/")):
                    assert (REPO / word).exists(), f"{block.name}: {word} does not exist"


def run_dirs() -> set[Path]:
    """The run and sweep directories under ``runs/`` now."""
    if not RUNS.is_dir():
        return set()
    return {p for p in RUNS.iterdir() if p.is_dir()} | set((RUNS / "sweeps").glob("*"))


def block_env(files_dir: Path) -> dict[str, str]:
    """This Python first on PATH (``apexrl``, ``python3``), the page's files importable."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(files_dir), env.get("PYTHONPATH")) if p)
    return env


def run_one(args: list[str], stdin: str | None, block: Block, env: dict, log: Path) -> str | None:
    """Run one command (or script) from the repository root in its own session; what went
    wrong, or None."""
    before = run_dirs()
    with open(log, "ab") as out:
        out.write(f"\n$ {' '.join(args)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            args,
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    problem = None
    try:
        if stdin is not None:
            proc.stdin.write(stdin.encode())
            proc.stdin.close()
        limit = block.bounded_s or RUN_TIMEOUT_S
        try:
            code = proc.wait(timeout=limit)
            if code != 0:
                problem = f"exited with status {code}"
        except subprocess.TimeoutExpired:
            if block.bounded_s is None:
                problem = f"still running after {RUN_TIMEOUT_S:.0f} s"
            else:  # a run of hours, shown as the reader starts it: Ctrl-C
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    code = proc.wait(timeout=INTERRUPT_TIMEOUT_S)
                    if code not in CLEAN_EXITS:
                        problem = f"exited with status {code} after Ctrl-C"
                except subprocess.TimeoutExpired:
                    problem = f"did not stop within {INTERRUPT_TIMEOUT_S:.0f} s of Ctrl-C"
    finally:
        left_behind = []
        for run_dir in run_dirs() - before:
            if not wait_until(lambda d=run_dir: not run_processes(d.name), 15.0):
                left_behind.append(run_dir.name)
                for pid in run_processes(run_dir.name):
                    kill_quietly(pid)
            shutil.rmtree(run_dir, ignore_errors=True)
        kill_quietly(-proc.pid)  # the session's group, whatever is left of it
        proc.wait()
    if problem is None and left_behind:
        problem = f"left processes of {left_behind}"
    return problem


def kill_quietly(pid: int) -> None:
    """SIGKILL a process (``pid`` > 0) or a process group (``pid`` < 0), if any."""
    try:
        if pid < 0:
            os.killpg(-pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def write_page_files(block: Block, files_dir: Path) -> None:
    """The page's ``file`` blocks, where its other blocks import them."""
    for other in BLOCKS:
        if other.page == block.page and other.file is not None:
            target = files_dir / other.file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(other.text)
            for parent in target.parents:
                if parent == files_dir:
                    break
                (parent / "__init__.py").touch()


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in BLOCKS if b.runs], ids=lambda b: b.name)
def test_a_doc_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    files_dir, log = tmp_path / "files", tmp_path / "block.log"
    files_dir.mkdir()
    write_page_files(block, files_dir)
    env = block_env(files_dir)
    started = time.monotonic()
    if block.language == "python":
        steps = [([sys.executable, "-"], block.text)]
    else:
        steps = [(["bash", "-c", f"set -euo pipefail\n{c}"], None) for c in block.commands()]
    for args, stdin in steps:
        problem = run_one(args, stdin, block, env, log)
        shown = args[-1].splitlines()[-1] if stdin is None else f"the {block.language} block"
        assert problem is None, f"{block.name}: {shown} {problem}:\n{log_tail(log, 60)}"
    print(f"{block.name}: {len(steps)} step(s) in {time.monotonic() - started:.0f} s")

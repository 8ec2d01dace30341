"""Running a benchmark the way a user does, in its own process, for the benchmarks' smoke tests:
it must exit 0, and no process it started (each inherits ``TAG``) may outlive it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TAG = "APEXRL_BENCH_SMOKE_TAG"  # inherited by every process a benchmark starts


def processes_with_tag(value: str) -> list[str]:
    """Command lines of live processes whose environment holds ``TAG=value``."""
    found = []
    needle = f"{TAG}={value}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


@contextlib.contextmanager
def scratch_env() -> Iterator[dict[str, str]]:
    """The environment for a benchmark's process, with a TMPDIR of its own that goes afterwards:
    a benchmark keeps its work folder for its user to read; its smoke test does not."""
    with tempfile.TemporaryDirectory(prefix="apexrl-bench-smoke-") as scratch:
        yield {**os.environ, "TMPDIR": scratch}


def run_tagged(script: str, *args: str, timeout_s: float = 240) -> str:
    """Run ``benchmarks/<script>`` with ``args``; its standard output, once it has exited 0 and
    left no process behind."""
    tag = uuid.uuid4().hex
    with scratch_env() as env:
        result = subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / script), *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**env, TAG: tag},
            cwd=REPO,
        )
    assert result.returncode == 0, result.stdout + result.stderr
    assert processes_with_tag(tag) == []
    return result.stdout

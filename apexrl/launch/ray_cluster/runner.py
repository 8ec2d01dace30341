"""``RoleRunner``: the Ray actor that holds one role's process on the node where Ray placed it.

The role runs as ``python -m apexrl <args>``, the command a user would type on that node, in its
own session (so that a signal reaches its whole process group), with its output in the role's
log file in the run directory, as under the local launcher. The kernel sends it SIGTERM when the
runner's process dies (``PR_SET_PDEATHSIG``: Ray killing the actor, its node or its driver going
away), so that no role outlives its runner. A thread copies the lines the role writes to its log
to the runner's standard output, which Ray forwards to the driver prefixed with the runner's
``repr`` (the role's name) and its node's address.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from apexrl.launch.forkserver import die_with_parent

FOLLOW_PERIOD_S = 0.5  # between two reads of the role's log


class RoleRunner:
    """One role's process on this node (a Ray actor: ``ray.remote(RoleRunner)``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.process: subprocess.Popen | None = None

    def __repr__(self) -> str:  # Ray's prefix of the lines this actor prints
        return self.name

    def where(self) -> dict[str, str]:
        """This node: its address (``ip``), Ray's id of it (``node_id``) and its ``host`` name."""
        import ray

        return {
            "ip": ray.util.get_node_ip_address(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "host": socket.gethostname(),
        }

    def free_port(self, ip: str) -> int:
        """A TCP port free now on ``ip``, this node's address, for a server to bind."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((ip, 0))
            return probe.getsockname()[1]

    def start(self, args: list[str], log_path: str, pythonpath: str = "") -> int:
        """Start ``apexrl <args>`` (after the last one has ended); its PID."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"{self.name} is still running (PID {self.process.pid})")
        env = dict(os.environ)
        if pythonpath:  # apexrl from a checkout: the driver's source tree (a shared filesystem)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, (pythonpath, env.get("PYTHONPATH"))))
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log_file:
            offset = log_file.tell()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "apexrl", *args],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=die_with_parent,
                close_fds=True,
                start_new_session=True,
            )
        threading.Thread(
            target=follow, args=(Path(log_path), offset, self.process), daemon=True
        ).start()
        return self.process.pid

    def poll(self) -> int | None:
        """The role's exit status; None while it runs (or before it started)."""
        return None if self.process is None else self.process.poll()

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the role's process group (which may outlive the role itself)."""
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass


def follow(path: Path, offset: int, process: subprocess.Popen) -> None:
    """Print what is appended to ``path`` after ``offset``, line by line, until ``process`` has
    exited and its last lines are out."""
    with open(path, "rb") as f:
        f.seek(offset)
        pending = b""
        while True:
            exited = process.poll() is not None
            data = f.read()
            if data:
                pending += data
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    print(line.decode(errors="replace"), flush=True)
            elif exited:
                if pending:
                    print(pending.decode(errors="replace"), flush=True)
                return
            else:
                time.sleep(FOLLOW_PERIOD_S)

"""The local launcher's child processes: how one role's process is started (forked by the fork
server, or exec'd), followed on the console, stopped, and how a run's children are made from the
table of roles (``apexrl.roles.processes``).

A child runs ``apexrl <role> --config <run dir>/config.yaml ...`` in its own session (a
terminal's Ctrl-C reaches the launcher alone), with its output in ``<run dir>/logs/<name>.log``,
and gets SIGTERM from the kernel if the launcher dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from apexrl import roles
from apexrl.config import Config
from apexrl.launch import run_state
from apexrl.launch.forkserver import ForkedProcess, ForkServer, die_with_parent
from apexrl.launch.placement import cores_of, pin
from apexrl.runtime import rundir
from apexrl.runtime.cores import lower_priority

log = logging.getLogger("apexrl.launch.local")

STOP_TIMEOUT_S = 10.0  # seconds between SIGTERM and SIGKILL


@dataclass
class Child:
    """One supervised process and how to start it again."""

    name: str
    args: list[str]  # apexrl <args>
    log_path: Path
    restartable: bool  # an actor: restarted whatever its exit, started once the servers answer
    echo: bool = False  # copy its log to the console as it grows
    niceness: int = 0
    cores: tuple[int, ...] | None = None  # CPU affinity (``apexrl.launch.placement``); None: all
    forkserver: ForkServer | None = None  # fork from it rather than exec
    addr: str = ""  # where it binds for peers outside the run (a policy server); "": nowhere
    host: str = ""  # the address of the node it runs on, placed by a cluster; "": this one
    max_restarts: int | None = None  # restarts before the run ends (an actor on Ray); None: any
    process: subprocess.Popen | ForkedProcess | None = None
    restarts: list[float] = field(default_factory=list)  # times of the last minute's restarts
    num_restarts: int = 0  # in this session
    restart_at: float | None = None  # when a scheduled restart is due (time.monotonic)

    @property
    def argv(self) -> list[str]:
        return [sys.executable, "-m", "apexrl", *self.args]

    def start(self, extra_args: tuple[str, ...] = ()) -> None:
        args = [*self.args, *extra_args]
        with open(self.log_path, "ab") as log_file:  # there for _follow before the role writes
            offset = log_file.tell()
        self.process = None
        if self.forkserver is not None:
            try:
                self.process = self.forkserver.start(self.name, args, self.niceness, self.cores)
            except RuntimeError as exc:
                log.warning("%s; starting it with exec", exc)
        if self.process is None:
            self._exec(args)
        if self.echo:
            # Its output goes to its log file like every child's (so the role can tell that its
            # log is already written there); the console gets the lines as they are written.
            threading.Thread(
                target=_follow,
                args=(self.log_path, offset, self.process),
                daemon=True,
                name=f"follow-{self.name}",
            ).start()

    def _exec(self, args: list[str]) -> None:
        log_file = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.process = subprocess.Popen(
            [sys.executable, "-m", "apexrl", *args],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            preexec_fn=self._prepare_exec,
            close_fds=True,
            # Its own session: a terminal's Ctrl-C reaches the launcher alone, which then stops
            # every child exactly once (a second signal would interrupt a child's clean exit).
            start_new_session=True,
        )
        log_file.close()

    def _prepare_exec(self) -> None:
        die_with_parent()
        lower_priority(self.niceness)
        pin(self.cores)

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def log_tail(self, num_lines: int = 15) -> str:
        return run_state.log_tail(self.log_path, num_lines)


def _follow(path: Path, offset: int, process: subprocess.Popen | ForkedProcess) -> None:
    """Copy what is appended to ``path`` after ``offset`` to the console until ``process``
    exits (and what it wrote last)."""
    with open(path, "rb") as f:
        f.seek(offset)
        while True:
            exited = process.poll() is not None
            data = f.read()
            if data:
                sys.stdout.write(data.decode(errors="replace"))
                sys.stdout.flush()
            elif exited:
                return
            else:
                time.sleep(0.2)


def build_children(
    cfg: Config,
    config_path: Path,
    num_actors: int,
    evaluate: bool,
    forkserver: ForkServer | None = None,
    actor_niceness: int = 0,
    layout: dict[str, tuple[int, ...] | None] | None = None,
    external_addrs: tuple[str, ...] = (),
) -> list[Child]:
    """The run's processes (``roles.processes``) as children, in start order; the first
    learner's log is echoed to the console, the actors get ``actor_niceness`` (the evaluation
    actor ``Config.eval_niceness`` more), every role its cores in ``layout`` (``placement.plan``;
    None: every core) and policy server ``i`` binds ``external_addrs[i]``."""
    logs = rundir.logs_dir(cfg.run_dir)
    logs.mkdir(parents=True, exist_ok=True)
    children = []
    num_external = len(external_addrs)
    dataset = bool(cfg.run.input_dataset)
    for p in roles.processes(cfg.learner.world_size, num_actors, evaluate, num_external, dataset):
        actor = p.role.group == "actor"
        niceness = actor_niceness if actor else 0
        if p.role.name == "eval":  # in force from its first instruction, not from its main
            niceness = min(niceness + cfg.eval_niceness, 19)
        addr = external_addrs[p.index] if p.role.name == "external" else ""
        children.append(
            Child(
                p.name,
                [*p.args, "--config", str(config_path), *(["--bind", addr] if addr else [])],
                rundir.log_path(cfg.run_dir, p.name),
                restartable=actor,
                echo=p.role.group == "learner" and p.index == 0,
                niceness=niceness,
                cores=cores_of(layout, p.role.name, p.index) if layout else None,
                forkserver=forkserver,
                addr=addr,
            )
        )
    return children


def stop_all(children: list[Child]) -> None:
    """SIGTERM to every live child, wait, then SIGKILL the survivors. Only our own PIDs."""
    alive = [c for c in children if c.exit_code() is None and c.process is not None]
    for c in alive:
        c.process.send_signal(signal.SIGTERM)
    started = time.monotonic()
    deadline = started + STOP_TIMEOUT_S
    for c in alive:
        try:
            c.process.wait(timeout=max(deadline - time.monotonic(), 0.01))
            log.debug("%s stopped after %.2f s", c.name, time.monotonic() - started)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0f s; killing it", c.name, STOP_TIMEOUT_S)
            c.process.kill()
            c.process.wait()


def wait_for(children: list[Child], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Give ``children`` (the learners, writing their last checkpoint after the servers
    stopped) up to ``timeout_s`` together to exit."""
    deadline = time.monotonic() + timeout_s
    for c in children:
        try:
            c.process.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            pass


def role_states(children: list[Child]) -> list[dict]:
    """Each role's name, PID, restarts in this session and state (``running``, ``restarting``,
    ``exited``, with its exit code, or ``not started``): ``roles.json``'s roles."""
    states = []
    for c in children:
        code = c.exit_code()
        if c.process is None:
            state = "not started"
        elif c.restart_at is not None:
            state = "restarting"
        else:
            state = "running" if code is None else "exited"
        states.append(
            {
                "name": c.name,
                "pid": None if c.process is None else c.process.pid,
                "restarts": c.num_restarts,
                "state": state,
                "exit_code": code,
                "cores": None if c.cores is None else list(c.cores),
                **({"addr": c.addr} if c.addr else {}),
                **({"host": c.host} if c.host else {}),
            }
        )
    return states

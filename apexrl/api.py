"""A training handle for Python: ``Trainer`` drives a run of explicit role processes, the same ones
``apexrl local`` (``scripts/launch_local.sh``) starts, from the user's code.

The roles stay processes and train on their own between two calls: ``Trainer`` starts the local
launcher (``python -m apexrl local``, ``apexrl.launch.local``: its checks before a start, its
fork server, supervision and restarts) as a child in its own session, and reads and writes the
run directory:

- ``train()`` waits for the learner's next ``result.json`` record (one every
  ``learner.report_interval_s``) and returns it as a dict (RLlib's ``trainer.train()``);
- ``save()`` asks the learner for a checkpoint of now and ``set_weights()`` hands it weights to
  publish as a new version, both through ``<run dir>/requests/`` (``apexrl.learning.user_requests``:
  the learner owns the weights versions); ``restore(path)`` puts a checkpoint in the run directory
  and (re)starts the run from it (``--resume``);
- ``get_weights()`` asks the parameter server for its newest weights (as the evaluation role,
  with the run's keys) while the run runs; once it has ended or is ending (a record with
  ``done``, the servers' ``Shutdown``, the launcher gone) it waits for the launcher to stop every
  role and reads the run's last checkpoint, which the learner writes as it stops (the judged
  version's weights when the run met its evaluation condition). ``evaluate()`` and
  ``get_policy()`` play those weights in this process (``apexrl.policy.Policy``);
- ``stop()`` stops the launcher, which stops every role (SIGTERM, then SIGKILL after 10 s); then
  any process of the run that ``roles.json`` still names is killed by its PID.

Nothing is left behind: a ``with`` block stops the run however it ends (an exception, Ctrl-C's
``KeyboardInterrupt``), the interpreter's exit stops every handle still running, and the launcher
gets SIGTERM from the kernel if this process dies (``PR_SET_PDEATHSIG``; create the handle in a
thread that outlives it, as the main thread does). The launcher runs in its own session, so a
terminal's Ctrl-C reaches this process alone, which then stops the run once.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from apexrl.config import Config, load_config
from apexrl.launch.forkserver import die_with_parent
from apexrl.launch.run_state import log_tail, run_finished
from apexrl.runtime import rundir

START_TIMEOUT_S = 120.0  # seconds the launcher may take to start every role
STOP_TIMEOUT_S = 30.0  # the launcher's own bound (SIGTERM, SIGKILL after 10 s) and its plots
REQUEST_TIMEOUT_S = 60.0  # seconds the learner may take to serve a request
WEIGHTS_TIMEOUT_S = 60.0  # seconds the parameter server may take to hold a first version
POLL_S = 0.05
LAUNCHER_LOG = "local"  # logs/local.log: the launcher's output

_running: weakref.WeakSet[Trainer] = weakref.WeakSet()  # stopped at the interpreter's exit


class RunEnded(RuntimeError):
    """The run is over (its stop condition, ``apexrl stop``, a failure) and no record is left to
    return; the message says how it ended."""


class Trainer:
    """A run of apexrl's roles on this machine, driven from Python.

    Args:
        config: a YAML config file (None: the defaults, Ape-X DQN on CartPole).
        overrides: ``{"algo.lr": 3e-4, "env.num_envs": 8}`` (values as YAML would read them), or
            ``["algo.lr=3e-4"]`` as ``--set`` takes them.
        num_actors: actor processes (``--actors``).
        num_learners: learner processes (``--learners``).
        logdir: parent of a new run directory ``<algorithm>-<env>-<time>``.
        run_dir: the run directory; one that holds a checkpoint is continued from it.
        evaluation: start the evaluation actor (its rounds give ``eval_return_mean``).
        curve: CURVE keys for the run (``--no-curve`` when False).
        env_task_fn: called with every record ``train()`` returns; a value other than None that
            differs from the task in force is set as the new env task (``set_env_task``), as
            RLlib's curriculum ``env_task_fn`` does.

    Raises ``apexrl.config.ConfigError`` at once for a config that cannot work. Processes start at
    the first call that needs them (``start()``, ``train()``, ``set_weights()``, ...)::

        with Trainer("configs/ppo_cartpole.yaml", {"algo.lr": 1e-3}, num_actors=4) as trainer:
            while not (result := trainer.train())["done"]:
                print(result["env_steps"], result["eval_return_mean"])
    """

    def __init__(
        self,
        config: str | Path | None = None,
        overrides: Mapping[str, object] | Sequence[str] = (),
        *,
        num_actors: int = 4,
        num_learners: int = 1,
        logdir: str | Path = "runs",
        run_dir: str | Path | None = None,
        evaluation: bool = True,
        curve: bool = True,
        env_task_fn: Callable[[dict], object] | None = None,
    ) -> None:
        if num_actors < 1 or num_learners < 1:
            raise ValueError(f"need actors and learners >= 1, got {num_actors}, {num_learners}")
        self.config_path = None if config is None else Path(config)
        self.overrides = override_args(overrides)
        self.config: Config = load_config(self.config_path, self.overrides)
        self.num_actors, self.num_learners = num_actors, num_learners
        self.evaluation, self.curve = evaluation, curve
        self.run_dir = Path(run_dir) if run_dir else new_run_dir(Path(logdir), self.config)
        self._launcher: subprocess.Popen | None = None
        self._result_offset = 0  # bytes of result.json read
        self._session_offset = 0  # bytes result.json had when this handle's launcher started
        self._last_request = 0
        self._ending = False  # the run ended or is ending: its weights are its last checkpoint
        self.env_task_fn = env_task_fn
        self.env_task: object = None  # the task set last (set_env_task); None: none

    # --- life cycle -------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether the run's launcher is running."""
        return self._launcher is not None and self._launcher.poll() is None

    def start(self) -> None:
        """Start the run (nothing when it runs): a new one, or, when the run directory holds a
        checkpoint (``restore``, an earlier ``stop``), continued from it. Returns once every role
        has started; ``RunEnded`` with the launcher's reason when it could not start them."""
        if self.running:
            return
        created = not self.run_dir.exists()
        logs = rundir.logs_dir(self.run_dir)
        logs.mkdir(parents=True, exist_ok=True)
        resume = any(
            path(self.run_dir).is_file()
            for path in (rundir.checkpoint_path, rundir.previous_checkpoint_path)
        )
        self._result_offset = self._session_offset = result_bytes(self.run_dir)
        self._ending = False
        log_path = rundir.log_path(self.run_dir, LAUNCHER_LOG)
        with open(log_path, "ab") as log_file:
            self._launcher = subprocess.Popen(
                self._launcher_args(resume),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        _running.add(self)
        try:
            self._wait_until_started()
        except BaseException:
            self.stop()
            if created and not rundir.config_path(self.run_dir).exists():
                shutil.rmtree(self.run_dir, ignore_errors=True)  # nothing of a run was made
            raise
        self.config = load_config(rundir.config_path(self.run_dir))  # addresses, keys

    def stop(self) -> None:
        """Stop every process of the run and wait for them (the learner writes its last
        checkpoint). Safe to call again, and from ``finally``."""
        launcher, self._launcher = self._launcher, None
        if launcher is None:
            return
        _running.discard(self)
        try:
            if launcher.poll() is None:
                launcher.send_signal(signal.SIGTERM)
            launcher.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait()
        except BaseException:  # interrupted while waiting: end it now, children follow
            launcher.kill()
            launcher.wait()
            kill_leftovers(self.run_dir)
            raise
        kill_leftovers(self.run_dir)

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- training ---------------------------------------------------------------------------

    def train(self, timeout_s: float | None = None) -> dict:
        """The learner's next ``result.json`` record (``env_steps``, ``episode_return_mean``,
        ``eval_return_mean``, ``learner_updates``, ``done``, ...), waiting for it; the records
        come in order, none skipped. Starts the run if needed. Raises ``RunEnded`` when the run
        is over and every record was returned, ``TimeoutError`` after ``timeout_s``."""
        if self._launcher is None:
            self.start()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            record = self._next_record()
            if record is not None:
                self._ending = self._ending or record.get("done") is True
                self._next_env_task(record)
                return record
            if not self.running:
                record = self._next_record()  # written as the run ended
                if record is not None:
                    return record
                raise RunEnded(self._end_message())
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"no result.json record within {timeout_s} s")
            time.sleep(POLL_S * 2)

    def set_env_task(self, task: object) -> None:
        """Have every training actor call ``set_task(task)`` on each of its envs (RLlib's
        ``TaskSettableEnv``): ``task`` goes, as JSON, with every weights version from the next
        on (``apexrl.learning.user_requests``), and each ``result.json`` record names the task in
        force (``env_task``). Starts the run if needed. ``ValueError`` when ``task`` is not JSON
        (or over ``MAX_ENV_TASK_CHARS``) or the config's env has no ``set_task`` method."""
        text = env_task_text(task)
        check_task_settable(self.config)
        if self._launcher is None:
            self.start()
        self._request("env_task.json", None, text.encode())
        self.env_task = json.loads(text)

    def _next_env_task(self, record: dict) -> None:
        """Ask ``env_task_fn`` for the task after ``record`` and set it when it is new."""
        if self.env_task_fn is None or record.get("done") is True:
            return
        task = self.env_task_fn(record)
        if task is not None and task != self.env_task:
            self.set_env_task(task)

    def save(self) -> str:
        """A checkpoint of the run now (``<run dir>/checkpoints/checkpoint-<version>.pt``),
        written by the learner; the run's last checkpoint once it has ended or is ending, or
        when nothing runs. Its path."""
        if self.running and not self._is_ending():
            reply = self._request("checkpoint", None)
            return str(self.run_dir / reply["checkpoint"])
        self._wait_for_end()
        source = rundir.checkpoint_path(self.run_dir)
        if not source.is_file():
            raise RunEnded(f"nothing to save: {source} does not exist (the run never started)")
        import torch

        version = int(torch.load(source, weights_only=True)["counters"].get("weights_version", 0))
        target = rundir.saved_checkpoint_path(self.run_dir, version)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        return str(target)

    def restore(self, path: str | Path) -> None:
        """Continue from a checkpoint (a ``.pt`` file, or a run directory's ``checkpoint.pt``):
        its weights, optimizer state and counters (env steps, updates, versions) with this
        handle's config. A running run is stopped and started again from it."""
        source = Path(path)
        if source.is_dir():
            source = rundir.checkpoint_path(source)
        if not source.is_file():
            raise FileNotFoundError(f"no checkpoint at {path}")
        was_running = self.running
        self.stop()
        target = rundir.checkpoint_path(self.run_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.resolve() != target.resolve():
            tmp = target.with_name(target.name + ".restoring")
            shutil.copyfile(source, tmp)
            os.replace(tmp, target)
        if was_running:
            self.start()

    # --- weights ----------------------------------------------------------------------------

    def get_weights(self, policy: str | None = None) -> dict[str, np.ndarray]:
        """The newest weights by parameter name: the parameter server's while the run runs;
        once the run has ended or is ending (its stop condition, ``apexrl stop``, a failure),
        its last checkpoint's, after the launcher has stopped every role (a run never started is
        started). A multi-agent run's are those of its network policy ``policy`` (None: its only
        one)."""
        return self._weights(policy)[0]

    def get_policy(self, device: str = "cpu", seed: int | None = None, policy: str | None = None):
        """An ``apexrl.Policy`` of the weights ``get_weights`` returns, to act in this process
        (a multi-agent run's network policy ``policy``; None: its only one)."""
        from apexrl.policy import Policy

        weights, version = self._weights(policy)
        cfg = self.config
        if cfg.multiagent.enabled:
            from apexrl.multiagent.policies import policy_config, policy_name, policy_spaces

            policy = policy_name(cfg, policy)
            cfg = policy_config(cfg, policy, policy_spaces(cfg)[policy])
        return Policy(cfg, weights, device=device, seed=seed, weights_version=version)

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> int:
        """Hand ``weights`` (``get_weights``'s names, shapes and dtypes) to the learner, which
        loads them and publishes them to every actor as a new weights version; returns that
        version (actors play it, or a later one the learner trained from it). ``ValueError``
        with the learner's reason when they do not fit. Needs a single learner."""
        arrays = {}
        for name, value in weights.items():
            array = np.ascontiguousarray(value)
            if array.dtype.hasobject:
                raise ValueError(f"array {name!r} holds Python objects")
            arrays[name] = array
        self.start()
        return int(self._request("weights.npz", arrays)["version"])

    def evaluate(self, episodes: int = 10, num_envs: int = 1, seed: int | None = None) -> dict:
        """Play the newest weights (``get_weights``'s) without exploration in this process, as
        ``apexrl evaluate`` plays a checkpoint (``Policy.evaluate``): returns, lengths and their
        statistics."""
        return self.get_policy(seed=seed).evaluate(episodes, num_envs)

    # --- the parts --------------------------------------------------------------------------

    def _launcher_args(self, resume: bool) -> list[str]:
        args = [sys.executable, "-m", "apexrl", "local", "--actors", str(self.num_actors)]
        args += ["--learners", str(self.num_learners), "--run-dir", str(self.run_dir)]
        if self.config_path is not None:
            args += ["--config", str(self.config_path)]
        if resume:
            args.append("--resume")
        if not self.evaluation:
            args.append("--no-eval")
        if not self.curve:
            args.append("--no-curve")
        return args + [arg for override in self.overrides for arg in ("--set", override)]

    def _wait_until_started(self) -> None:
        """Until the launcher's supervisor writes ``roles.json`` (every role started)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while launcher_pid(self.run_dir) != self._launcher.pid:
            if self._launcher.poll() is not None:
                raise RunEnded(self._end_message())
            if time.monotonic() > deadline:
                raise TimeoutError(f"the run did not start within {START_TIMEOUT_S:.0f} s")
            time.sleep(POLL_S)
        if self._launcher.poll() is not None:  # it wrote roles.json as it gave up
            raise RunEnded(self._end_message())

    def _next_record(self) -> dict | None:
        """The next whole line of ``result.json`` after what was read."""
        try:
            with open(rundir.result_path(self.run_dir), "rb") as f:
                f.seek(self._result_offset)
                line = f.readline()
        except OSError:
            return None
        if not line.endswith(b"\n"):
            return None  # none yet, or being written
        self._result_offset += len(line)
        return json.loads(line)

    def _end_message(self) -> str:
        code = None if self._launcher is None else self._launcher.poll()
        tail = log_tail(rundir.log_path(self.run_dir, LAUNCHER_LOG), 12, "    (no log)")
        return f"the run in {self.run_dir} has ended (launcher exit status {code}):\n{tail}"

    def _request(
        self, kind: str, arrays: dict[str, np.ndarray] | None, payload: bytes = b""
    ) -> dict:
        """Hand the learner a request (``apexrl.learning.user_requests``) and wait for its
        reply; ``ValueError`` with its reason when it refused."""
        directory = rundir.requests_dir(self.run_dir)
        directory.mkdir(parents=True, exist_ok=True)
        self._last_request = number = max(time.time_ns() // 1000, self._last_request + 1)
        request = directory / f"{number}.{kind}"
        tmp = directory / f".{request.name}"
        with open(tmp, "wb") as f:
            if arrays is not None:
                np.savez(f, **arrays)
            f.write(payload)
        os.replace(tmp, request)
        reply_path = directory / f"{number}.reply.json"
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        while not reply_path.is_file():
            if not self.running:
                request.unlink(missing_ok=True)
                raise RunEnded(self._end_message())
            if time.monotonic() > deadline:
                request.unlink(missing_ok=True)
                raise TimeoutError(f"the learner did not answer within {REQUEST_TIMEOUT_S:.0f} s")
            time.sleep(POLL_S)
        reply = json.loads(reply_path.read_text())
        reply_path.unlink(missing_ok=True)
        if "error" in reply:
            raise ValueError(reply["error"])
        return reply

    def _weights(self, policy: str | None = None) -> tuple[dict[str, np.ndarray], int]:
        """The newest weights and their version (``get_weights``): the parameter server's while
        the run runs, the last checkpoint's once it has ended or is ending."""
        if self.config.multiagent.enabled:
            from apexrl.multiagent.policies import policy_name

            policy = policy_name(self.config, policy)
        elif policy is not None:
            raise ValueError("a single-agent run has no named policies")
        if self._launcher is None and not rundir.checkpoint_path(self.run_dir).is_file():
            self.start()  # a run never started
        deadline = time.monotonic() + WEIGHTS_TIMEOUT_S
        while self._runs_on():
            try:
                return fetch_weights(self.config, WEIGHTS_TIMEOUT_S, self._runs_on, policy or "")
            except RunEnded:
                # The parameter server shuts down: the run ends (its launcher goes, or its
                # record says done) or the server alone restarts (asked again).
                if time.monotonic() > deadline:
                    raise
                time.sleep(POLL_S)
        return self._last_checkpoint_weights(policy)

    def _runs_on(self) -> bool:
        """The launcher runs and the run is not ending: the parameter server has its weights."""
        return self.running and not self._is_ending()

    def _is_ending(self) -> bool:
        """Whether the run met its stop condition in this session (a record returned or not
        yet read says ``done``): the launcher is stopping its roles."""
        if not self._ending and run_finished(self.run_dir, self._session_offset):
            self._ending = True
        return self._ending

    def _wait_for_end(self) -> None:
        """Wait for an ending run's launcher to stop every role (``stop()`` after
        ``STOP_TIMEOUT_S``): the learner has then written its last checkpoint. The handle keeps
        the ended launcher, so ``train()`` then raises ``RunEnded`` with its last lines."""
        if self._launcher is None:
            return
        try:
            self._launcher.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.stop()
            return
        _running.discard(self)
        kill_leftovers(self.run_dir)

    def _last_checkpoint_weights(
        self, policy: str | None = None
    ) -> tuple[dict[str, np.ndarray], int]:
        """The run's last checkpoint, once the launcher has stopped every role (the learner
        writes it as it stops)."""
        from apexrl.policy import checkpoint_weights

        self._wait_for_end()
        checkpoint = rundir.checkpoint_path(self.run_dir)
        if not checkpoint.is_file():
            raise RunEnded(f"the run in {self.run_dir} ended without a checkpoint")
        if self.config.multiagent.enabled:
            from apexrl.multiagent.api import policy_checkpoint

            _, weights, version = policy_checkpoint(self.config, checkpoint, policy)
            return weights, version
        return checkpoint_weights(self.config, checkpoint)


def env_task_text(task: object) -> str:
    """``task`` as the compact JSON the wire carries; ``ValueError`` when it is not JSON or too
    long (``messages.check_env_task``, the check the wire makes)."""
    from apexrl.transport.messages import check_env_task

    try:
        text = json.dumps(task, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"an env task must be JSON (numbers, strings, lists, dicts): {exc}"
        ) from exc
    check_env_task(text)
    return text


def check_task_settable(cfg: Config) -> None:
    """``ValueError`` unless the config's env (through its wrappers) has ``set_task``."""
    from apexrl.envs import make_env

    env = make_env(cfg.env)
    try:
        settable = env.has_wrapper_attr("set_task")
    finally:
        env.close()
    if not settable:
        raise ValueError(
            f"env {cfg.env.id!r} has no set_task(task) method: an env takes tasks with one "
            "(RLlib's TaskSettableEnv convention)"
        )


def override_args(overrides: Mapping[str, object] | Sequence[str]) -> list[str]:
    """``{"algo.lr": 3e-4}`` -> ``["algo.lr=0.0003"]`` (each value as JSON, which YAML reads);
    ``--set`` strings as they are."""
    if isinstance(overrides, Mapping):
        return [f"{key}={json.dumps(value)}" for key, value in overrides.items()]
    if isinstance(overrides, str):
        raise TypeError("overrides must be a mapping or a list of key=value strings")
    return [str(o) for o in overrides]


def new_run_dir(logdir: Path, cfg: Config) -> Path:
    """``<logdir>/<algorithm>-<env>-<time>``, made unique with ``-2``, ``-3``, ... (several
    handles may start within a second)."""
    base = logdir / f"{cfg.run_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def result_bytes(run_dir: Path) -> int:
    try:
        return rundir.result_path(run_dir).stat().st_size
    except OSError:
        return 0


def launcher_pid(run_dir: Path) -> int | None:
    """The PID of the launcher that last wrote ``roles.json``."""
    try:
        return json.loads(rundir.roles_path(run_dir).read_text()).get("launcher_pid")
    except (OSError, ValueError, AttributeError):
        return None


def kill_leftovers(run_dir: Path) -> None:
    """SIGKILL any process that ``roles.json`` names and whose command line still names the run
    directory (a role the launcher could not stop); by PID, nothing else."""
    try:
        roles = json.loads(rundir.roles_path(run_dir).read_text()).get("roles", [])
    except (OSError, ValueError, AttributeError):
        return
    marker = str(run_dir).encode()
    for role in roles:
        pid = role.get("pid") if isinstance(role, dict) else None
        if not isinstance(pid, int) or pid <= 1:
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def fetch_weights(
    cfg: Config, timeout_s: float, alive: Callable[[], bool] = lambda: True, policy: str = ""
) -> tuple[dict[str, np.ndarray], int]:
    """The parameter server's weights and version (of a multi-agent run's ``policy``), asked as
    the evaluation role (with the run's keys); waits for the learner's first publish.
    ``RunEnded`` when the server says it shuts down or ``alive()`` turns false (the run's
    launcher has gone)."""
    import zmq

    from apexrl.transport import auth, sockets
    from apexrl.transport.messages import Params, ParamsRequest, Shutdown

    ctx = sockets.make_context()
    keys = auth.client_keys(cfg.net, "eval", "params")
    sock = sockets.connect(ctx, zmq.DEALER, cfg.net.params_addr, curve=keys)
    deadline = time.monotonic() + timeout_s
    with sockets.closing(sock, ctx):
        while time.monotonic() < deadline:
            if not alive():
                raise RunEnded("the run has ended")
            sockets.send(sock, ParamsRequest(-1, policy=policy))
            msg = sockets.recv(sock, timeout_ms=1000)
            if isinstance(msg, Params) and msg.arrays:
                return {name: np.array(a) for name, a in msg.arrays.items()}, msg.version
            if isinstance(msg, Shutdown):
                raise RunEnded(f"the parameter server is shutting down: {msg.reason}")
            time.sleep(0.2)
    raise TimeoutError(f"the parameter server held no weights within {timeout_s:.0f} s")


@atexit.register
def _stop_all() -> None:
    """At the interpreter's exit: stop every handle still running."""
    for trainer in list(_running):
        trainer.stop()

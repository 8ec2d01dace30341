"""Wall time to solve CartPole-v1: apexrl's default config next to stable-baselines3 PPO and DQN.

Solved means a mean return >= 475 over the last 100 episodes of a greedy (deterministic)
evaluation, counted from the start of the command that trains. Every run is its own command,
started and timed by this script with its own clock, so process start-up and imports count:

- ``apexrl``: ``scripts/launch_local.sh --actors 4 --learners 1`` with the default config, which
  stops by itself when its evaluation actor's last-100-episode mean reaches 475; env steps are
  the last ``result.json`` line's ``env_steps`` (training actors only).
- ``ppo`` and ``dqn``: stable-baselines3 with the rl-baselines3-zoo hyperparameters for
  CartPole-v1 (``ZOO`` below), in a process of this script (``--worker``), one torch thread. A
  callback runs ``EVAL_EPISODES`` greedy episodes in separate envs every ``EVAL_EVERY_STEPS``
  training env steps and stops training when the mean over the last 100 evaluation episodes reaches
  475; env steps are the model's ``num_timesteps`` (training steps only, as for apexrl). PPO's
  budget is the zoo's n_timesteps (its schedules end there); DQN may go on past it (see
  ``sb3_worker``).

A run that has not solved after ``--cap-s`` seconds is stopped and counts as not solved. The
systems run alternately (apexrl, ppo, dqn, apexrl, ...) so that a change in the machine's load
falls on all of them. Needs ``pip install -e .[bench]`` for the stable-baselines3 rows.

    python benchmarks/end_to_end.py [--runs 3] [--cap-s 600] [--systems apexrl ppo dqn]
    python benchmarks/end_to_end.py --smoke     # each system once for a few seconds
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = REPO / "scripts" / "launch_local.sh"
SOLVED_RETURN = 475.0
WINDOW_EPISODES = 100  # evaluation episodes the mean is taken over
EVAL_EPISODES = 10  # greedy episodes per SB3 evaluation, one per eval env
EVAL_EVERY_STEPS = 2000  # training env steps between SB3 evaluations
STOP_GRACE_S = 30.0  # seconds a stopped run may take to exit before SIGKILL
SMOKE_CAP_S = {"apexrl": 25.0, "ppo": 12.0, "dqn": 12.0}
DQN_BUDGET_FACTOR = 10  # DQN may train this many times the zoo's n_timesteps (see sb3_worker)

# rl-baselines3-zoo, hyperparams/ppo.yml and hyperparams/dqn.yml, entry CartPole-v1
# (https://github.com/DLR-RM/rl-baselines3-zoo). "lin_X" is the zoo's linear schedule from X to 0
# over n_timesteps; n_envs defaults to 1; the policy is MlpPolicy (SB3's default network).
ZOO = {
    "ppo": {
        "n_envs": 8,
        "n_timesteps": 100_000,
        "n_steps": 32,
        "batch_size": 256,
        "gae_lambda": 0.8,
        "gamma": 0.98,
        "n_epochs": 20,
        "ent_coef": 0.0,
        "learning_rate": "lin_0.001",
        "clip_range": "lin_0.2",
    },
    "dqn": {  # marked "Almost Tuned" in the zoo
        "n_envs": 1,
        "n_timesteps": 200_000,
        "learning_rate": 2.5e-4,
        "batch_size": 512,
        "buffer_size": 100_000,
        "learning_starts": 0,
        "gamma": 0.99,
        "target_update_interval": 5000,
        "train_freq": 16,
        "gradient_steps": 4,
        "exploration_fraction": 0.06,
        "exploration_final_eps": 0.11,
    },
}


@dataclass(frozen=True)
class Run:
    """One timed command: how long it took, whether it solved, and its env steps at the end."""

    system: str
    index: int
    wall_s: float
    solved: bool
    env_steps: int | None
    eval_return_mean: float | None
    exit_code: int | None
    ending: str  # solved, cap (stopped at --cap-s), budget (env steps spent), error
    load_1m: float  # the machine's 1-minute load average when the run started
    log: str


def ending(solved: bool, exit_code: int | None) -> str:
    if solved:
        return "solved"
    return {None: "cap", 0: "budget"}.get(exit_code, "error")


def die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when this script dies (Linux), so that a run
    cannot outlive the benchmark even if the benchmark is killed."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def start(argv: list[str], log_path: Path) -> subprocess.Popen:
    with log_path.open("wb") as log_file:
        return subprocess.Popen(
            argv,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,  # a terminal's Ctrl-C reaches this script alone
            preexec_fn=die_with_parent,
        )


def stop(proc: subprocess.Popen) -> int:
    """SIGTERM to our own child (the launcher stops its own children), SIGKILL after a bound."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def timed(proc: subprocess.Popen, started: float, cap_s: float) -> tuple[float, int | None]:
    """Wait for ``proc`` up to ``cap_s`` from ``started``; stop it then. Returns (wall seconds
    from ``started`` to its exit, its exit code or None when it had to be stopped)."""
    try:
        code = proc.wait(timeout=max(cap_s - (time.monotonic() - started), 0.0))
    except subprocess.TimeoutExpired:
        stop(proc)
        code = None
    return time.monotonic() - started, code


def run_apexrl(index: int, workdir: Path, cap_s: float, smoke: bool, extra_args: list[str]) -> Run:
    """``extra_args`` go to the launcher after the default command's (``--set k=v``, ...): for
    experiments; the benchmark's figures are the default command's, without them."""
    run_dir = workdir / f"apexrl_{index}"
    argv = ["bash", str(LAUNCHER), "--actors", "4", "--learners", "1", "--run-dir", str(run_dir)]
    # The learner's own safety net lies beyond our cap: our clock decides.
    argv += ["--set", f"run.stop_wall_s={cap_s + 60:g}"]
    if smoke:
        argv += ["--set", "learner.report_interval_s=1"]  # a result.json line within seconds
    argv += extra_args
    log_path = workdir / f"apexrl_{index}.log"
    load_1m = os.getloadavg()[0]
    started = time.monotonic()
    proc = start(argv, log_path)
    try:
        wall_s, code = timed(proc, started, cap_s)
    finally:
        stop(proc)
    try:
        last = json.loads((run_dir / "result.json").read_text().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        last = {}
    solved = (
        code == 0
        and last.get("eval_episodes_in_window", 0) >= WINDOW_EPISODES
        and (last.get("eval_return_mean") or 0.0) >= SOLVED_RETURN
    )
    return Run(
        "apexrl",
        index,
        wall_s,
        solved,
        last.get("env_steps"),
        last.get("eval_return_mean"),
        code,
        ending(solved, code),
        load_1m,
        str(log_path),
    )


def run_sb3(algo: str, index: int, workdir: Path, cap_s: float) -> Run:
    result_path = workdir / f"{algo}_{index}.json"
    log_path = workdir / f"{algo}_{index}.log"
    load_1m = os.getloadavg()[0]
    started = time.monotonic()
    deadline = time.time() + cap_s  # wall-clock epoch: the worker stops training by then
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        algo,
        "--seed",
        str(index),
        "--deadline",
        f"{deadline:.3f}",
        "--result",
        str(result_path),
    ]
    proc = start(argv, log_path)
    try:
        wall_s, code = timed(proc, started, cap_s + STOP_GRACE_S)
    finally:
        stop(proc)
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        result = {}
    solved = code == 0 and bool(result.get("solved"))
    if code == 0 and result.get("timed_out"):
        code = None  # it stopped itself at our cap
    return Run(
        algo,
        index,
        wall_s,
        solved,
        result.get("env_steps"),
        result.get("eval_return_mean"),
        code,
        ending(solved, code),
        load_1m,
        str(log_path),
    )


def linear(initial: float):
    """The zoo's ``lin_X``: X times SB3's progress_remaining (1 at the start, 0 at the end)."""
    return lambda progress_remaining: progress_remaining * initial


def zoo_kwargs(algo: str) -> dict:
    """The zoo's values as SB3 constructor arguments (schedules made callables)."""
    params = {k: v for k, v in ZOO[algo].items() if k not in ("n_envs", "n_timesteps")}
    for key, value in params.items():
        if isinstance(value, str) and value.startswith("lin_"):
            params[key] = linear(float(value[len("lin_") :]))
    return params


def sb3_worker(algo: str, seed: int, deadline: float, result_path: Path) -> int:
    """One SB3 training run until solved, out of zoo budget, or past ``deadline`` (epoch s)."""
    import torch
    from stable_baselines3 import DQN, PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(1)  # small MLPs: as apexrl's processes; a thread pool only adds waits
    env = make_vec_env("CartPole-v1", n_envs=ZOO[algo]["n_envs"], seed=seed)
    eval_env = make_vec_env("CartPole-v1", n_envs=EVAL_EPISODES, seed=10_000 + seed)
    kwargs, total_timesteps = zoo_kwargs(algo), ZOO[algo]["n_timesteps"]
    if algo == "dqn":
        # DQN's schedules depend on exploration_fraction * n_timesteps alone (its lr is constant),
        # so this trains step for step as the zoo does and goes on past n_timesteps until solved
        # or capped. PPO's linear schedules reach 0 at n_timesteps, which stays its budget.
        kwargs["exploration_fraction"] /= DQN_BUDGET_FACTOR
        total_timesteps *= DQN_BUDGET_FACTOR
    model = {"ppo": PPO, "dqn": DQN}[algo]("MlpPolicy", env, seed=seed, **kwargs)
    returns: deque[float] = deque(maxlen=WINDOW_EPISODES)
    state = {"next_eval": EVAL_EVERY_STEPS, "solved": False, "timed_out": False}

    def on_step(_locals: dict, _globals: dict) -> bool:
        """SB3 calls this after every vector step; False stops training."""
        if time.time() >= deadline:
            state["timed_out"] = True
            return False
        if model.num_timesteps < state["next_eval"]:
            return True
        state["next_eval"] += EVAL_EVERY_STEPS
        episode_returns, _ = evaluate_policy(
            model,
            eval_env,
            n_eval_episodes=EVAL_EPISODES,
            deterministic=True,
            return_episode_rewards=True,
        )
        returns.extend(episode_returns)
        mean = sum(returns) / len(returns)
        state["solved"] = len(returns) == WINDOW_EPISODES and mean >= SOLVED_RETURN
        print(
            f"env steps {model.num_timesteps}: eval mean {mean:.1f} over {len(returns)}", flush=True
        )
        return not state["solved"]

    model.learn(total_timesteps=total_timesteps, callback=on_step)
    result = {
        "solved": state["solved"],
        "timed_out": state["timed_out"],
        "env_steps": int(model.num_timesteps),
        "eval_return_mean": sum(returns) / len(returns) if returns else None,
        "eval_episodes_in_window": len(returns),
    }
    result_path.write_text(json.dumps(result))
    print(json.dumps(result))
    return 0


def median_s(runs: list[Run]) -> float:
    """Median wall time with an unsolved run counted as never solving (infinite)."""
    return statistics.median(r.wall_s if r.solved else math.inf for r in runs)


def fmt_time(run: Run) -> str:
    return f"{run.wall_s:.1f}" if run.solved else f">{run.wall_s:.1f}"


def print_table(runs: list[Run], systems: list[str]) -> None:
    print(
        f"\nTime to solve CartPole-v1 (greedy eval mean >= {SOLVED_RETURN:g} over "
        f"{WINDOW_EPISODES} episodes), wall seconds from the command's start; "
        "'>' marks a run stopped unsolved"
    )
    print(f"{'system':<8} {'solved':>6} {'median s':>9}  {'runs s':<24} {'env steps at stop':<26}")
    for system in systems:
        mine = [r for r in runs if r.system == system]
        median = median_s(mine)
        median_text = f"{median:.1f}" if math.isfinite(median) else "unsolved"
        times = ", ".join(fmt_time(r) for r in mine)
        steps = ", ".join("-" if r.env_steps is None else str(r.env_steps) for r in mine)
        solved = sum(r.solved for r in mine)
        print(f"{system:<8} {f'{solved}/{len(mine)}':>6} {median_text:>9}  {times:<24} {steps:<26}")
    for r in runs:
        if not r.solved:
            why = {
                "cap": "stopped at the wall-time cap",
                "budget": "step budget spent",
                "error": f"exit code {r.exit_code}",
            }[r.ending]
            print(f"  {r.system} run {r.index} unsolved: {why} (eval mean {r.eval_return_mean})")
    loads = [r.load_1m for r in runs]
    print(
        f"load average (1 min) at the runs' starts: {min(loads):.1f} to {max(loads):.1f} "
        f"on {os.cpu_count()} CPUs"
    )
    if "apexrl" in systems and len(systems) > 1:
        apex = median_s([r for r in runs if r.system == "apexrl"])
        for peer in (s for s in systems if s != "apexrl"):
            other = median_s([r for r in runs if r.system == peer])
            if math.isfinite(apex) and math.isfinite(other):
                verdict = "faster" if apex < other else "slower"
                print(
                    f"apexrl vs {peer}: median {apex:.1f} s vs {other:.1f} s, "
                    f"{other / apex:.2f}x ({verdict})"
                )
            else:
                print(f"apexrl vs {peer}: no ratio (a median run did not solve)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per system")
    parser.add_argument("--cap-s", type=float, default=600.0, help="wall-time cap per run")
    parser.add_argument(
        "--systems", nargs="+", default=["apexrl", "ppo", "dqn"], choices=["apexrl", "ppo", "dqn"]
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="one short capped run per system: checks the harness, not the speed",
    )
    parser.add_argument("--workdir", type=Path, help="logs and run dirs (default: a temp dir)")
    parser.add_argument(
        "--apexrl-arg",
        action="append",
        default=[],
        help="extra launcher argument for experiments, e.g. --apexrl-arg=--set "
        "--apexrl-arg=algo.lr=1e-3 (a later --actors wins); not the benchmark's figures",
    )
    parser.add_argument("--worker", choices=["ppo", "dqn"], help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return sb3_worker(args.worker, args.seed, args.deadline, args.result)

    # SIGTERM unwinds like Ctrl-C, so the ``finally`` blocks stop the run in progress.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs_per_system = 1 if args.smoke else args.runs
    cap_s = {s: SMOKE_CAP_S[s] if args.smoke else args.cap_s for s in args.systems}
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="apexrl-e2e-"))
    workdir.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    for index in range(runs_per_system):
        for system in args.systems:
            if system == "apexrl":
                run = run_apexrl(index, workdir, cap_s[system], args.smoke, args.apexrl_arg)
            else:
                run = run_sb3(system, index, workdir, cap_s[system])
            runs.append(run)
            print(
                f"{system} run {index}: {fmt_time(run)} s, {run.ending}, env steps "
                f"{run.env_steps}, eval mean {run.eval_return_mean}, load {run.load_1m:.1f}",
                flush=True,
            )
    (workdir / "runs.json").write_text(json.dumps([asdict(r) for r in runs], indent=1))
    print_table(runs, args.systems)
    print(f"(logs in {workdir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

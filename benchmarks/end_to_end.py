"""Wall time to solve CartPole-v1: apexrl's default config next to stable-baselines3 PPO and DQN.

Every run is its own command, started and timed by this script with its own clock from the
command's start, so process start-up and imports count. A run that is still going after
``--cap-s`` seconds is stopped; a criterion it has not met by then counts as never met.

- ``apexrl``: the README's command, ``scripts/launch_local.sh --actors 4 --learners 1 --config
  configs/ppo_cartpole.yaml`` (synchronous PPO, apexrl's fastest family on CartPole), which stops
  by itself when a round of 100 greedy evaluation episodes of one weights version has a mean return
  of 475. Its time is from the command's start to its exit; it counts as solved when it exits
  0 with the stop condition met (the last ``result.json`` line says ``done`` and its
  ``eval_return_mean`` is >= 475); env steps are that line's ``env_steps`` (training actors only).
- ``ppo`` and ``dqn``: stable-baselines3 with the rl-baselines3-zoo hyperparameters for
  CartPole-v1 (``ZOO`` below), in a process of this script (``--worker``), one torch thread. One run
  times three criteria (``CRITERIA``), each from the command's start to the moment it is met, and
  trains on until all three are met, its step budget is spent or the cap:

  - ``train100``: the mean return of the last 100 training episodes (the Monitor's, as SB3's
    ``rollout/ep_rew_mean``) >= 475. No evaluation is needed for it, so the seconds spent
    evaluating are left out of its time: it is the time of a run that only trains.
  - ``eval5``: the zoo's EvalCallback criterion: 5 greedy (deterministic) episodes, in 5 separate
    envs, every ``EVAL_EVERY_STEPS`` training env steps (the zoo evaluates every 25,000; finer here
    to time it), mean >= 475. The seconds of the eval100 rounds are left out of its time.
  - ``eval100``: apexrl's criterion: 100 greedy episodes of one frozen model, in 10 separate envs,
    mean >= 475. A round runs each time an eval5 evaluation passes; its time counts everything.

  Env steps are the model's ``num_timesteps`` when a criterion is met (training steps only, as for
  apexrl). PPO's budget is the zoo's n_timesteps (its linear schedules end there). DQN may train on
  past the zoo's n_timesteps, up to ``DQN_BUDGET_FACTOR`` times it, until the cap: the behaviour
  this benchmark already had with the zoo's earlier DQN entry, kept (its exploration schedule stays
  step for step the zoo's); the table shows its env steps, to compare with the zoo's 50,000.

The systems run alternately (apexrl, ppo, dqn, apexrl, ...) so that a change in the machine's load
falls on all of them; the table prints each run's 1-minute load average at its start, the medians
and the ratio apexrl median / PPO train100 median. Needs ``pip install -e .[bench]`` for the
stable-baselines3 rows.

    python benchmarks/end_to_end.py [--runs 5] [--cap-s 600] [--systems apexrl ppo dqn]
    python benchmarks/end_to_end.py --systems ppo dqn --runs 1 --cap-s 120   # baselines only
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
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = REPO / "scripts" / "launch_local.sh"
# The README's train command (its arguments after the launcher).
README_TRAIN_ARGS = ["--actors", "4", "--learners", "1", "--config", "configs/ppo_cartpole.yaml"]
SYSTEMS = ("apexrl", "ppo", "dqn")
SOLVED_RETURN = 475.0
TRAIN_WINDOW = 100  # training episodes in the rolling mean (SB3's stats_window_size)
ZOO_EVAL_EPISODES = 5  # the zoo's EvalCallback n_eval_episodes
ROUND_EPISODES = 100  # greedy episodes of one frozen model in an eval100 round
ROUND_ENVS = 10  # envs an eval100 round runs in
EVAL_EVERY_STEPS = 2000  # training env steps between SB3 eval5 evaluations
STOP_GRACE_S = 30.0  # seconds a stopped run may take to exit before SIGKILL
SMOKE_CAP_S = {"apexrl": 25.0, "ppo": 12.0, "dqn": 12.0}
DQN_BUDGET_FACTOR = 10  # DQN may train this many times the zoo's n_timesteps (see sb3_worker)

# What each criterion means; the table's legend. apexrl has its own stop condition only.
CRITERIA = {
    "train100": f"mean return of the last {TRAIN_WINDOW} training episodes >= {SOLVED_RETURN:g} "
    "(SB3's rollout/ep_rew_mean), evaluation time left out",
    "eval5": f"mean of {ZOO_EVAL_EPISODES} greedy evaluation episodes >= {SOLVED_RETURN:g} (the "
    f"zoo's EvalCallback), one evaluation every {EVAL_EVERY_STEPS} training env steps",
    "eval100": f"mean of {ROUND_EPISODES} greedy evaluation episodes of one frozen model >= "
    f"{SOLVED_RETURN:g}; apexrl: its own stop condition, timed to the command's exit",
}
SYSTEM_CRITERIA = {"apexrl": ("eval100",), "ppo": tuple(CRITERIA), "dqn": tuple(CRITERIA)}

# rl-baselines3-zoo (https://github.com/DLR-RM/rl-baselines3-zoo), entry CartPole-v1 of
# hyperparams/ppo.yml ("Tuned") and hyperparams/dqn.yml ("Almost Tuned"), as of its master
# branch. "lin_X" is the zoo's linear schedule from X to 0 over n_timesteps; n_envs defaults to 1;
# the policy is MlpPolicy (SB3's default network unless policy_kwargs say otherwise).
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
    "dqn": {
        "n_envs": 1,
        "n_timesteps": 50_000,
        "learning_rate": 2.3e-3,
        "batch_size": 64,
        "buffer_size": 100_000,
        "learning_starts": 1000,
        "gamma": 0.99,
        "target_update_interval": 10,
        "train_freq": 256,
        "gradient_steps": 128,
        "exploration_fraction": 0.16,
        "exploration_final_eps": 0.04,
        "policy_kwargs": {"net_arch": [256, 256]},
    },
}


@dataclass(frozen=True)
class Milestone:
    """When a run met a criterion: seconds from the command's start (less the evaluation time the
    criterion does not need, see the module doc) and the training env steps then."""

    seconds: float
    env_steps: int | None


@dataclass(frozen=True)
class Run:
    """One timed command: when it met each criterion, how long it ran and how it ended."""

    system: str
    index: int
    wall_s: float  # from the command's start to its exit
    met: dict[str, Milestone]  # criterion -> when it was met; absent: never met
    env_steps: int | None  # at the end
    eval_return_mean: float | None  # at the end: apexrl's last report, SB3's last eval5
    train_return_mean: float | None  # at the end: recent training episodes (SB3: the last 100)
    exit_code: int | None
    ending: str  # done (every criterion met), cap (stopped at --cap-s), budget, error
    load_1m: float  # the machine's 1-minute load average when the run started
    log: str


def ending(all_met: bool, exit_code: int | None) -> str:
    if all_met and exit_code == 0:
        return "done"
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


def last_result_line(run_dir: Path) -> dict:
    """The learner's last ``result.json`` line, or {} when there is none yet."""
    try:
        return json.loads((run_dir / "result.json").read_text().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return {}


def apexrl_solved(exit_code: int | None, last: dict) -> bool:
    """The command exited 0 after its stop condition was met with an evaluation mean at the
    threshold over a full window of 100 episodes of one weights version. Other stop conditions
    cannot be met first: our cap lies below ``run.stop_wall_s`` and the config has no env-step
    limit."""
    mean = last.get("eval_return_mean")
    return (
        exit_code == 0
        and last.get("done") is True
        and mean is not None
        and mean >= SOLVED_RETURN
        and last.get("eval_episodes_in_window", 0) >= ROUND_EPISODES
        and last.get("eval_weights_version", -1) >= 0
    )


def run_apexrl(index: int, workdir: Path, cap_s: float, smoke: bool, extra_args: list[str]) -> Run:
    """``extra_args`` go to the launcher after the default command's (``--set k=v``, ...): for
    experiments; the benchmark's figures are the default command's, without them."""
    run_dir = workdir / f"apexrl_{index}"
    config = ["--config", str(REPO / README_TRAIN_ARGS[-1])]
    argv = ["bash", str(LAUNCHER), *README_TRAIN_ARGS[:-2], *config, "--run-dir", str(run_dir)]
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
    last = last_result_line(run_dir)
    solved = apexrl_solved(code, last)
    env_steps = last.get("env_steps")
    return Run(
        system="apexrl",
        index=index,
        wall_s=wall_s,
        met={"eval100": Milestone(wall_s, env_steps)} if solved else {},
        env_steps=env_steps,
        eval_return_mean=last.get("eval_return_mean"),
        train_return_mean=last.get("episode_return_mean"),
        exit_code=code,
        ending=ending(solved, code),
        load_1m=load_1m,
        log=str(log_path),
    )


def run_sb3(algo: str, index: int, workdir: Path, cap_s: float) -> Run:
    result_path = workdir / f"{algo}_{index}.json"
    log_path = workdir / f"{algo}_{index}.log"
    load_1m = os.getloadavg()[0]
    started_epoch = time.time()  # the worker's criteria are timed from here (same machine clock)
    started = time.monotonic()
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", algo, "--seed", str(index)]
    argv += ["--started", f"{started_epoch:.6f}", "--cap-s", f"{cap_s:g}"]
    argv += ["--result", str(result_path)]
    proc = start(argv, log_path)
    try:
        wall_s, code = timed(proc, started, cap_s + STOP_GRACE_S)
    finally:
        stop(proc)
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        result = {}
    met = {name: Milestone(**m) for name, m in result.get("met", {}).items()}
    if code == 0 and result.get("timed_out"):
        code = None  # it stopped itself at our cap
    return Run(
        system=algo,
        index=index,
        wall_s=wall_s,
        met=met,
        env_steps=result.get("env_steps"),
        eval_return_mean=result.get("eval5_mean"),
        train_return_mean=result.get("train100_mean"),
        exit_code=code,
        ending=ending(set(met) == set(SYSTEM_CRITERIA[algo]), code),
        load_1m=load_1m,
        log=str(log_path),
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


def mean_at_least(returns: list[float], count: int, threshold: float) -> bool:
    """Whether there are ``count`` returns and their mean is >= ``threshold``."""
    return len(returns) >= count and sum(returns) / len(returns) >= threshold


def sb3_worker(algo: str, seed: int, started: float, cap_s: float, result_path: Path) -> int:
    """One SB3 training run until every criterion is met, its budget is spent or ``cap_s`` has
    passed since ``started`` (epoch seconds, the command's start as the benchmark saw it)."""
    import torch
    from stable_baselines3 import DQN, PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.logger import Logger

    torch.set_num_threads(1)  # small MLPs: as apexrl's processes; a thread pool only adds waits
    env = make_vec_env("CartPole-v1", n_envs=ZOO[algo]["n_envs"], seed=seed)
    eval5_env = make_vec_env("CartPole-v1", n_envs=ZOO_EVAL_EPISODES, seed=10_000 + seed)
    round_env = make_vec_env("CartPole-v1", n_envs=ROUND_ENVS, seed=20_000 + seed)
    kwargs, budget = zoo_kwargs(algo), ZOO[algo]["n_timesteps"]
    if algo == "dqn":
        # DQN's schedules depend on exploration_fraction * n_timesteps alone (its lr is constant),
        # so this trains step for step as the zoo does and goes on past n_timesteps until every
        # criterion is met or the cap. PPO's linear schedules reach 0 at n_timesteps, which stays
        # its budget.
        kwargs["exploration_fraction"] /= DQN_BUDGET_FACTOR
        budget *= DQN_BUDGET_FACTOR
    model = {"ppo": PPO, "dqn": DQN}[algo]("MlpPolicy", env, seed=seed, **kwargs)
    # A logger that writes nowhere: SB3's default makes a /tmp/SB3-<time> folder per learn().
    model.set_logger(Logger(folder=None, output_formats=[]))
    met: dict[str, dict] = {}
    state = {"next_eval": EVAL_EVERY_STEPS, "eval5_s": 0.0, "round_s": 0.0}
    state.update(timed_out=False, eval5_mean=None)

    def greedy_returns(eval_env, episodes: int) -> list[float]:
        returns, _ = evaluate_policy(
            model,
            eval_env,
            n_eval_episodes=episodes,
            deterministic=True,
            return_episode_rewards=True,
        )
        return [float(r) for r in returns]

    def mark(name: str, excluded_s: float) -> None:
        seconds = time.time() - started - excluded_s
        met[name] = {"seconds": round(seconds, 2), "env_steps": int(model.num_timesteps)}
        print(f"{name} met at {seconds:.1f} s, env steps {model.num_timesteps}", flush=True)

    def on_step(_locals: dict, _globals: dict) -> bool:
        """SB3 calls this after every vector step; False stops training."""
        if time.time() - started >= cap_s:
            state["timed_out"] = True
            return False
        train_returns = [info["r"] for info in model.ep_info_buffer]
        if "train100" not in met and mean_at_least(train_returns, TRAIN_WINDOW, SOLVED_RETURN):
            mark("train100", state["eval5_s"] + state["round_s"])
        if model.num_timesteps < state["next_eval"]:
            return set(met) != set(CRITERIA)
        state["next_eval"] += EVAL_EVERY_STEPS
        line = f"env steps {model.num_timesteps}"
        if train_returns:
            line += f": train100 mean {sum(train_returns) / len(train_returns):.1f}"
        if not {"eval5", "eval100"} <= set(met):
            began = time.time()
            returns = greedy_returns(eval5_env, ZOO_EVAL_EPISODES)
            state["eval5_s"] += time.time() - began
            state["eval5_mean"] = sum(returns) / len(returns)
            passed = mean_at_least(returns, ZOO_EVAL_EPISODES, SOLVED_RETURN)
            line += f", eval5 mean {state['eval5_mean']:.1f}"
            if passed and "eval5" not in met:
                mark("eval5", state["round_s"])
            if passed and "eval100" not in met:
                began = time.time()
                round_returns = greedy_returns(round_env, ROUND_EPISODES)
                state["round_s"] += time.time() - began
                line += f", eval100 round mean {sum(round_returns) / ROUND_EPISODES:.1f}"
                if mean_at_least(round_returns, ROUND_EPISODES, SOLVED_RETURN):
                    mark("eval100", 0.0)
        print(line, flush=True)
        return set(met) != set(CRITERIA)

    model.learn(total_timesteps=budget, callback=on_step)
    train_returns = [info["r"] for info in model.ep_info_buffer]
    result = {
        "met": met,
        "timed_out": state["timed_out"],
        "env_steps": int(model.num_timesteps),
        "budget_steps": budget,
        "eval5_mean": state["eval5_mean"],
        "train100_mean": sum(train_returns) / len(train_returns) if train_returns else None,
        "eval5_s": round(state["eval5_s"], 2),
        "eval100_round_s": round(state["round_s"], 2),
    }
    result_path.write_text(json.dumps(result))
    print(json.dumps(result))
    return 0


def median_s(runs: list[Run], criterion: str) -> float:
    """Median time to ``criterion`` with a run that never met it counted as infinite."""
    return statistics.median(
        r.met[criterion].seconds if criterion in r.met else math.inf for r in runs
    )


def fmt_time(run: Run, criterion: str) -> str:
    """Seconds to the criterion; '>' and the run's wall time when it never met it."""
    return f"{run.met[criterion].seconds:.1f}" if criterion in run.met else f">{run.wall_s:.1f}"


def fmt_steps(run: Run, criterion: str) -> str:
    """Env steps at the criterion; '>' and the steps at the end when it never met it."""
    steps = run.met[criterion].env_steps if criterion in run.met else run.env_steps
    text = "-" if steps is None else str(steps)
    return text if criterion in run.met else f">{text}"


def fmt_mean(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def fmt_median(seconds: float) -> str:
    return f"{seconds:.1f}" if math.isfinite(seconds) else "unsolved"


def print_table(runs: list[Run], systems: list[str]) -> None:
    print(
        "\nTime to solve CartPole-v1, wall seconds from the command's start to the criterion "
        "(apexrl: to its exit); '>' marks a run that never met it (its time or steps at the end)"
    )
    for name, meaning in CRITERIA.items():
        print(f"  {name}: {meaning}")
    print(f"{'system':<7} {'criterion':<9} {'met':>5} {'median s':>9}  {'runs s':<34} env steps")
    for system in systems:
        mine = [r for r in runs if r.system == system]
        for criterion in SYSTEM_CRITERIA[system]:
            met = sum(criterion in r.met for r in mine)
            times = ", ".join(fmt_time(r, criterion) for r in mine)
            steps = ", ".join(fmt_steps(r, criterion) for r in mine)
            print(
                f"{system:<7} {criterion:<9} {f'{met}/{len(mine)}':>5} "
                f"{fmt_median(median_s(mine, criterion)):>9}  {times:<34} {steps}"
            )
    for r in runs:
        if r.ending != "done":
            why = {
                "cap": "stopped at the wall-time cap",
                "budget": "step budget spent",
                "error": f"exit code {r.exit_code}",
            }[r.ending]
            missing = [c for c in SYSTEM_CRITERIA[r.system] if c not in r.met]
            print(
                f"  {r.system} run {r.index}: {why}, not met: {', '.join(missing) or 'none'} "
                f"(at the end: evaluation mean {fmt_mean(r.eval_return_mean)}, training mean "
                f"{fmt_mean(r.train_return_mean)})"
            )
    for system in systems:
        if system in ZOO:
            print(f"  {system}: the zoo's n_timesteps is {ZOO[system]['n_timesteps']}")
    print(f"load average (1 min) at each run's start, on {os.cpu_count()} CPUs:")
    for system in systems:
        loads = ", ".join(f"{r.load_1m:.1f}" for r in runs if r.system == system)
        print(f"  {system:<7} {loads}")
    if "apexrl" in systems and "ppo" in systems:
        apex = median_s([r for r in runs if r.system == "apexrl"], "eval100")
        ppo = median_s([r for r in runs if r.system == "ppo"], "train100")
        if math.isfinite(apex) and math.isfinite(ppo):
            print(
                f"apexrl median / PPO rolling-100 (train100) median: {apex:.1f} s / {ppo:.1f} s "
                f"= {apex / ppo:.2f} (below 1: apexrl is faster)"
            )
        else:
            print(
                "apexrl median / PPO rolling-100 (train100) median: no ratio (a median is unsolved)"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per system")
    parser.add_argument("--cap-s", type=float, default=600.0, help="wall-time cap per run")
    parser.add_argument(
        "--systems",
        nargs="+",
        default=list(SYSTEMS),
        choices=SYSTEMS,
        help="systems to run, in this order within each round (default: all three)",
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
    parser.add_argument("--started", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return sb3_worker(args.worker, args.seed, args.started, args.cap_s, args.result)

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
            criteria = ", ".join(f"{c} {fmt_time(run, c)} s" for c in SYSTEM_CRITERIA[system])
            print(
                f"{system} run {index}: {criteria}; exit after {run.wall_s:.1f} s, {run.ending}, "
                f"env steps {run.env_steps}, eval mean {fmt_mean(run.eval_return_mean)}, "
                f"training mean {fmt_mean(run.train_return_mean)}, load {run.load_1m:.1f}",
                flush=True,
            )
    (workdir / "runs.json").write_text(json.dumps([asdict(r) for r in runs], indent=1))
    print_table(runs, args.systems)
    print(f"(logs in {workdir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

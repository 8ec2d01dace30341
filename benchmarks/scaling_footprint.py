"""Scaling and footprint of a whole run: the real launcher with 1 .. 32 actors on this machine.

Each point starts ``scripts/launch_local.sh --actors N --learners 1`` with the default config (only
the stop conditions are switched off), and measures

- start: seconds from starting the launcher to every actor (and the evaluation actor) stepping,
  i.e. counted by the replay server's ``replay/active_actors`` (polled every 0.1 s);
- env steps/s and learner updates/s over a fixed window after that (from the replay server's
  ``replay/env_steps`` and ``replay/num_sampled`` / batch size, read at both ends of the window);
- memory per actor process at the end of the window, from ``/proc/PID/smaps_rollup``: unique set
  size (USS = Private_Clean + Private_Dirty) and proportional set size (PSS), in MB (10^6 bytes);

then stops the launcher with SIGINT and checks that no process of the run is left. Each row also
gives its throughput as a ratio to the best row, measured in this same run; a last row (unless
``--baseline-actors 0``) repeats the largest point with actors started by ``exec``
(``--actor-start exec``), the way the launcher started them before the fork server. The
launcher gives each actor its own CURVE key (``keys`` column ``own``); ``--shared-keys-actors N``
repeats the N-actor point with one key shared by the actors, made by ``apexrl keys DIR`` and
given as ``net.keys_dir`` (``shared``): what per-actor keys cost at start.

    python benchmarks/scaling_footprint.py [--actors 1 2 4 8 16 32] [--window-s 30]
                                           [--baseline-actors 32] [--nice 0] [--learners 1]
                                           [--shared-keys-actors 32]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from chaos_run import kill_left, run_processes  # noqa: E402  (benchmarks/, next to this script)

from apexrl.config import NetConfig  # noqa: E402
from apexrl.tools.server_stats import server_stats  # noqa: E402
from apexrl.transport import auth, sockets  # noqa: E402

SCRIPT = REPO / "scripts" / "launch_local.sh"
START_LIMIT_S = 120.0  # a point whose actors are not all stepping by then fails
STOP_LIMIT_S = 30.0  # the launcher's own bound is 10 s per stage


@dataclass
class Point:
    actors: int
    mode: str  # "fork" or "exec"
    nice: int
    start_s: float
    start_cpu_s: float  # mean CPU seconds an actor had used when all were stepping
    env_steps_per_s: float
    updates_per_s: float
    uss_mb: float  # mean over the actor processes (not the evaluation actor)
    pss_mb: float
    uss_max_mb: float
    run_pss_mb: float  # every process of the run together
    left: int  # processes of the run still there after the launcher exited
    keys: str = "own"  # each actor its own CURVE key, or "shared" by the actors


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # fields 14 and 15


def actor_cpu_s(marker: str) -> float:
    used = []
    for pid, argv in run_processes(marker).items():
        try:
            if is_actor(argv):
                used.append(cpu_s(pid))
        except OSError:
            pass
    return sum(used) / max(len(used), 1)


def memory_mb(pid: int) -> tuple[float, float]:
    """(USS, PSS) of one process in MB, from smaps_rollup."""
    kb = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == "kB":
            kb[parts[0].rstrip(":")] = int(parts[1])
    uss = kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0)
    return uss * 1024 / 1e6, kb.get("Pss", 0) * 1024 / 1e6


def is_actor(argv: list[str]) -> bool:
    return (
        "apexrl" in argv
        and argv[argv.index("apexrl") + 1 :][:1] == ["actor"]
        and ("--eval" not in argv)
    )


def run_config(logdir: Path, deadline: float) -> dict:
    """The resolved config of the one run under ``logdir``, once the launcher has written it."""
    while time.monotonic() < deadline:
        for path in logdir.glob("*/config.yaml"):
            cfg = yaml.safe_load(path.read_text())
            if isinstance(cfg, dict) and "net" in cfg and "learner" in cfg:
                return cfg
        time.sleep(0.05)
    raise RuntimeError(f"no run config under {logdir}")


def stop_launcher(popen: subprocess.Popen, marker: str) -> int:
    """SIGINT (what Ctrl-C does), then SIGKILL to its group if it overruns; returns how many
    processes of the run were left (and kills them)."""
    if popen.poll() is None:
        popen.send_signal(signal.SIGINT)
    try:
        popen.wait(timeout=STOP_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(popen.pid, signal.SIGKILL)
        popen.wait()
    return len(kill_left(marker))


def measure(
    num_actors: int,
    mode: str,
    nice: int,
    window_s: float,
    workdir: Path,
    ctx,
    learners: int = 1,
    keys: str = "own",
) -> Point:
    logdir = workdir / f"{mode}_{num_actors}_nice{nice}_{keys}"
    env = dict(os.environ)
    argv = [str(SCRIPT), "--actors", str(num_actors), "--learners", str(learners)]
    argv += ["--logdir", str(logdir), "--actor-start", mode, "--actor-nice", str(nice)]
    argv += ["--set", "run.stop_wall_s=0", "--set", "run.stop_eval_return=null"]
    if keys == "shared":  # one key for every actor, as `apexrl keys DIR` makes by default
        shared = workdir / f"shared_keys_{num_actors}_{nice}"
        auth.make_keys(shared)
        argv += ["--set", f"net.keys_dir={shared}"]
    started = time.monotonic()
    with open(workdir / f"{logdir.name}.log", "wb") as log_file:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    marker = str(logdir)
    try:
        deadline = started + START_LIMIT_S
        cfg = run_config(logdir, deadline)
        addr, batch = cfg["net"]["replay_addr"], cfg["learner"]["batch_size"]
        # The launcher runs with per-run CURVE keys: ask with the evaluation actor's.
        curve = auth.client_keys(NetConfig(**cfg["net"]), "eval", "replay")
        expected = num_actors + 1  # and the evaluation actor
        while True:
            if popen.poll() is not None:
                raise RuntimeError(f"the launcher exited with {popen.returncode}")
            stats = server_stats(ctx, addr, timeout_ms=100, curve=curve)
            if stats and stats["replay/active_actors"] >= expected:
                start_s = time.monotonic() - started
                start_cpu_s = actor_cpu_s(marker)
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"not all {expected} actors stepping after {START_LIMIT_S} s")
            time.sleep(0.1)
        first, t_first = stats, time.monotonic()
        time.sleep(window_s)
        last = None
        while last is None:
            last = server_stats(ctx, addr, timeout_ms=1000, curve=curve)
        t_last = time.monotonic()
        uss, pss, run_pss = [], [], 0.0
        for pid, argv_ in run_processes(marker).items():
            try:
                u, p = memory_mb(pid)
            except OSError:
                continue
            run_pss += p
            if is_actor(argv_):
                uss.append(u)
                pss.append(p)
    finally:
        left = stop_launcher(popen, marker)
    span = t_last - t_first
    return Point(
        actors=num_actors,
        mode=mode,
        nice=nice,
        start_s=start_s,
        start_cpu_s=start_cpu_s,
        env_steps_per_s=(last["replay/env_steps"] - first["replay/env_steps"]) / span,
        updates_per_s=(last["replay/num_sampled"] - first["replay/num_sampled"]) / batch / span,
        uss_mb=sum(uss) / max(len(uss), 1),
        pss_mb=sum(pss) / max(len(pss), 1),
        uss_max_mb=max(uss, default=0.0),
        run_pss_mb=run_pss,
        left=left,
        keys=keys,
    )


def print_table(points: list[Point], window_s: float) -> None:
    best = max(p.env_steps_per_s for p in points if p.mode == points[0].mode)
    print(
        f"\nScaling and footprint: scripts/launch_local.sh, default config, learners + eval "
        f"actor, {os.cpu_count()} CPUs, {window_s:g} s window per point"
    )
    print(
        f"{'actors':>6} {'start':>5} {'nice':>4} {'start_s':>7} {'cpu_s':>5} {'env_steps/s':>11} "
        f"{'vs_best':>7} {'updates/s':>9} {'USS_MB':>7} {'USS_max':>7} {'PSS_MB':>7} "
        f"{'run_PSS':>8} {'left':>4} {'keys':>6}"
    )
    for p in points:
        print(
            f"{p.actors:>6} {p.mode:>5} {p.nice:>4} {p.start_s:>7.1f} {p.start_cpu_s:>5.2f} "
            f"{p.env_steps_per_s:>11.0f} "
            f"{p.env_steps_per_s / best:>7.2f} {p.updates_per_s:>9.1f} {p.uss_mb:>7.1f} "
            f"{p.uss_max_mb:>7.1f} {p.pss_mb:>7.1f} {p.run_pss_mb:>8.0f} {p.left:>4} {p.keys:>6}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--window-s", type=float, default=30.0, help="measurement window")
    parser.add_argument(
        "--baseline-actors",
        type=int,
        default=None,
        help="repeat this point with exec-started actors (default: the largest; 0: none)",
    )
    parser.add_argument(
        "--nice",
        type=int,
        nargs="+",
        default=[0],
        help="actor niceness; several values repeat the largest point",
    )
    parser.add_argument("--learners", type=int, default=1)
    parser.add_argument(
        "--shared-keys-actors",
        type=int,
        default=0,
        help="repeat this point with one CURVE key shared by the actors (0: none)",
    )
    args = parser.parse_args()
    baseline = max(args.actors) if args.baseline_actors is None else args.baseline_actors
    workdir = Path(tempfile.mkdtemp(prefix="apexrl-scaling-"))
    ctx = sockets.make_context()
    points: list[Point] = []
    try:
        plan = [(n, "fork", args.nice[0], "own") for n in args.actors]
        plan += [(max(args.actors), "fork", nice, "own") for nice in args.nice[1:]]
        if args.shared_keys_actors:
            plan.append((args.shared_keys_actors, "fork", args.nice[0], "shared"))
        if baseline:
            plan.append((baseline, "exec", args.nice[0], "own"))
        for num_actors, mode, nice, keys in plan:
            point = measure(
                num_actors, mode, nice, args.window_s, workdir, ctx, args.learners, keys
            )
            print(
                f"  {mode} {num_actors} actors nice {nice}, {keys} keys: all stepping after "
                f"{point.start_s:.1f} s, {point.env_steps_per_s:.0f} env steps/s",
                flush=True,
            )
            points.append(point)
    finally:
        ctx.term()
    print_table(points, args.window_s)
    print(f"(logs in {workdir})")
    if any(p.left for p in points):
        print("ERROR: processes of a run were left behind", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

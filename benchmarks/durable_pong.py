"""A durable Ape-X Pong run: env steps/s against ``replay.durable: false``, the chunk log's disk,
and a replay server SIGKILLed mid-run that comes back with every acknowledged transition.

``scripts/launch_local.sh --actors N --learners 1 --config configs/apex_dqn_pong_cpu.yaml`` runs
twice from a clean start, one after the other, each for ``--seconds`` of training (counted from
the learner's first published weights; ``run.stop_wall_s`` ends it):

- ``off``: ``--set replay.durable=false --set replay.snapshot_interval_s=0``, the Atari configs'
  setting before snapshots left the frames in the chunk log;
- ``on``: the config as it is (durable, a snapshot every ``replay.snapshot_interval_s``); at
  ``--kill-at`` seconds the replay server is SIGKILLed by its PID and the launcher restarts it
  (snapshot, its items read back from the log's segments, then the log after it).

Every ``--poll`` seconds the benchmark reads replay's ``Stats`` (as the evaluation actor, the
least privileged key) and the bytes under ``<run dir>/replay_snapshot/``. Printed per run: env
steps/s over the training window after ``--warmup`` seconds (the kill and the restart included:
they are part of what durability costs), the disk of the snapshot and chunk log (largest and at
the end), the snapshots written (from replay's log lines: items, MB, seconds, seconds of copying
in the server loop); for the kill: the items replay had stored at its last reading before the kill
against those of the restarted server at its first (a negative difference is acknowledged items
lost), ``replay/items_lost`` at the end, the seconds until replay answered again and until it had
read everything back. Exit status 1 when an acknowledged item was lost, the launcher did not exit
0, or a process of a run was left.

    python benchmarks/durable_pong.py [--seconds 300] [--kill-at 200] [--actors 2]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chaos_run import (  # noqa: E402
    START_LIMIT_S,
    LaunchedRun,
    StatsReader,
    kill_left,
    launch,
    pids_by_role,
    wait_until_training,
)

CONFIG = "configs/apex_dqn_pong_cpu.yaml"
SNAPSHOT_LINE = re.compile(
    r"replay snapshot: (\d+) items, ([\d.]+) MB in ([\d.]+) s \(([\d.]+) s of it copying"
)


@dataclass
class Reading:
    at_s: float  # seconds since training began
    env_steps: float
    stored: float
    lost: float
    disk_bytes: int


@dataclass
class RunResult:
    name: str
    readings: list[Reading] = field(default_factory=list)
    kill_at_s: float | None = None
    stored_before_kill: float | None = None
    stored_after_restart: float | None = None
    back_s: float | None = None
    launcher_code: int | None = None
    left: list[str] = field(default_factory=list)
    snapshots: list[tuple[int, float, float, float]] = field(default_factory=list)
    read_back: list[str] = field(default_factory=list)


def disk_bytes(directory: Path) -> int:
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def reading(reader: StatsReader, run: LaunchedRun, start: float) -> Reading | None:
    stats = reader.read("replay")
    if not stats:
        return None
    return Reading(
        time.monotonic() - start,
        stats.get("replay/env_steps", 0.0),
        stats.get("replay/items_stored", 0.0),
        stats.get("replay/items_lost", 0.0),
        disk_bytes(run.run_dir / "replay_snapshot"),
    )


def run_once(name: str, overrides: list[str], args: argparse.Namespace, base: Path) -> RunResult:
    run_dir = base / name
    launcher_args = ["--actors", str(args.actors), "--learners", "1", "--config", CONFIG]
    for override in ("run.stop_eval_return=null", "run.stop_wall_s=0", *overrides):
        launcher_args += ["--set", override]
    print(f"{name}: scripts/launch_local.sh {' '.join(launcher_args)}", flush=True)
    run = launch(launcher_args, run_dir, base / f"{name}.log")
    result, reader = RunResult(name), None
    try:
        reader = StatsReader(run.config(time.monotonic() + START_LIMIT_S))
        roles = {"replay", "params", "learner", "eval", *(f"actor_{i}" for i in range(args.actors))}
        wait_until_training(run, reader, roles)
        start = time.monotonic()
        kill_at = args.kill_at if name == "on" else None
        killed_at = None
        while time.monotonic() - start < args.seconds:
            now = reading(reader, run, start)
            if now is not None:
                result.readings.append(now)
                if killed_at is not None and result.stored_after_restart is None:
                    result.stored_after_restart = now.stored
                    result.back_s = time.monotonic() - killed_at
            if kill_at is not None and killed_at is None and time.monotonic() - start >= kill_at:
                result.stored_before_kill = result.readings[-1].stored
                os.kill(pids_by_role(run.marker)["replay"], signal.SIGKILL)
                killed_at = time.monotonic()
                result.kill_at_s = killed_at - start
                print(f"  replay SIGKILLed at {result.kill_at_s:.0f} s", flush=True)
            time.sleep(args.poll)
    finally:
        if reader is not None:
            reader.close()
        result.launcher_code = run.stop()
        result.left = kill_left(run.marker)
    replay_log = (run_dir / "logs" / "replay.log").read_text(errors="replace")
    result.snapshots = [
        (int(m[1]), float(m[2]), float(m[3]), float(m[4]))
        for m in SNAPSHOT_LINE.finditer(replay_log)
    ]
    result.read_back = [
        line.split(" INFO ", 1)[-1]
        for line in replay_log.splitlines()
        if "loaded the replay snapshot" in line or "read back from the chunk log" in line
    ]
    return result


def steps_per_s(result: RunResult, warmup_s: float, until_s: float = float("inf")) -> float:
    window = [r for r in result.readings if warmup_s <= r.at_s <= until_s]
    if len(window) < 2:
        return float("nan")
    first, last = window[0], window[-1]
    return (last.env_steps - first.env_steps) / (last.at_s - first.at_s)


def report(results: list[RunResult], warmup_s: float) -> list[str]:
    problems = []
    rates = {r.name: steps_per_s(r, warmup_s) for r in results}
    print(f"\nenv steps/s after {warmup_s:g} s of training (agent steps; 1 step = 4 frames):")
    for r in results:
        disk = [x.disk_bytes / 1e6 for x in r.readings] or [0.0]
        print(
            f"  {r.name:<4} {rates[r.name]:>9,.0f}   replay_snapshot/ largest "
            f"{max(disk):,.1f} MB, at the end {disk[-1]:,.1f} MB"
        )
    if "on" in rates and "off" in rates:
        print(f"  on / off: {rates['on'] / rates['off']:.3f}")
    kill_at = next((r.kill_at_s for r in results if r.kill_at_s is not None), None)
    if kill_at is not None:  # the same window for every run: the cost without the kill
        print(f"env steps/s from {warmup_s:g} s to the kill at {kill_at:.0f} s:")
        before = {r.name: steps_per_s(r, warmup_s, kill_at) for r in results}
        for name, rate in before.items():
            print(f"  {name:<4} {rate:>9,.0f}")
        if "on" in before and "off" in before:
            print(f"  on / off: {before['on'] / before['off']:.3f}")
    for r in results:
        if r.snapshots:
            print(f"\n{r.name}: snapshots (items, MB, seconds, seconds copying in the loop):")
            for items, mb, total_s, copy_s in r.snapshots:
                print(f"  {items:>9,} {mb:>9.1f} {total_s:>8.3f} {copy_s:>8.3f}")
        if r.kill_at_s is not None:
            lost = r.readings[-1].lost if r.readings else float("nan")
            diff = (r.stored_after_restart or 0) - (r.stored_before_kill or 0)
            print(
                f"\n{r.name}: replay killed at {r.kill_at_s:.0f} s; stored at the last reading "
                f"before {r.stored_before_kill:,.0f}, at the restarted server's first "
                f"{r.stored_after_restart or 0:,.0f} (difference {diff:+,.0f}); back in "
                f"{r.back_s or float('nan'):.1f} s; replay/items_lost at the end {lost:,.0f}"
            )
            for line in r.read_back:
                print(f"  {line}")
            if r.stored_after_restart is None or diff < 0 or lost > 0:
                problems.append(f"{r.name}: acknowledged items lost (or replay not back)")
        if r.launcher_code != 0:
            problems.append(f"{r.name}: the launcher exited with {r.launcher_code}")
        if r.left:
            problems.append(f"{r.name}: processes left: {', '.join(r.left)}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0, help="training seconds per run")
    parser.add_argument("--kill-at", type=float, default=200.0, help="replay's SIGKILL, run on")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds left out of the rate")
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--poll", type=float, default=2.0)
    parser.add_argument("--which", default="off,on", help="the runs, in order")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    base = Path(tempfile.mkdtemp(prefix="apexrl-durable-pong-"))
    modes = {
        "off": ["replay.durable=false", "replay.snapshot_interval_s=0"],
        "on": [],
    }
    load = os.getloadavg()
    results = [
        run_once(name, [*modes[name], *args.overrides], args, base)
        for name in args.which.split(",")
    ]
    problems = report(results, args.warmup)
    print(f"\nload average before: {load[0]:.2f}; after: {os.getloadavg()[0]:.2f}; runs in {base}")
    for problem in problems:
        print(f"PROBLEM: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

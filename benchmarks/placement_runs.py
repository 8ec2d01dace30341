"""A config run with each ``--placement`` of the launcher, one after another: throughput and how
crowded the cores were.

Each run is ``scripts/launch_local.sh --actors N --learners 1 --config CONFIG --placement P``
with ``run.stop_wall_s`` set to ``--seconds``; it must end by itself. Over the run's second half
(after start-up and the replay's warm-up) it prints, from ``result.json``, the env steps/s, the
learner's gradient steps/s and samples/s and its data wait, and from the kernel, sampled every
second: the runnable threads per core (``procs_running`` of ``/proc/stat`` over the cores, 1.0
is a full machine with no queue), each role's share of a core (its processes' CPU time over the
span) and the learner's involuntary context switches a second (the times the kernel took its
core away while it had work). Ratios are against the first placement's run.

    python benchmarks/placement_runs.py [--config impala_pong_cpu] [--seconds 150] [--actors 2]
        [--placements shared split] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pong_runs import launch, second_half  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float | None:
    """User plus system CPU seconds of a process (its threads included)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS


def _switches(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("nonvoluntary_ctxt_switches"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _running() -> int:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("procs_running"):
            return int(line.split()[1]) - 1  # this sampler
    return 0


class Sampler:
    """Samples the kernel's view of a run every second (``watch`` of ``pong_runs.launch``)."""

    def __init__(self) -> None:
        self.samples: list[dict] = []

    def __call__(self, run_dir: Path) -> None:
        try:
            roles = json.loads((run_dir / "roles.json").read_text())["roles"]
        except (OSError, ValueError, KeyError):
            return
        pids = {r["name"]: r["pid"] for r in roles if r.get("pid")}
        self.samples.append(
            {
                "t": time.monotonic(),
                "running": _running(),
                "cpu": {name: _cpu_s(pid) for name, pid in pids.items()},
                "switches": _switches(pids.get("learner", -1)),
            }
        )

    def summary(self) -> dict:
        """Over the samples' second half: runnable threads per core, each role group's cores
        used, the learner's involuntary switches a second."""
        half = self.samples[len(self.samples) // 2 :]
        first, last = half[0], half[-1]
        span = max(last["t"] - first["t"], 1e-9)
        groups: dict[str, float] = {}
        for name, end in last["cpu"].items():
            start = first["cpu"].get(name)
            if end is not None and start is not None:
                group = name.split("_")[0]
                groups[group] = groups.get(group, 0.0) + (end - start) / span
        switches = None
        if last["switches"] is not None and first["switches"] is not None:
            switches = (last["switches"] - first["switches"]) / span
        return {
            "runnable_per_core": float(np.mean([s["running"] for s in half])) / os.cpu_count(),
            "cores_used": groups,
            "learner_switches_per_s": switches,
        }


def run_summary(run_dir: Path) -> dict:
    half, span = second_half(run_dir)
    first, last = half[0], half[-1]
    return {
        "env_steps_per_s": (last["env_steps"] - first["env_steps"]) / span,
        "updates_per_s": (last["learner_updates"] - first["learner_updates"]) / span,
        "samples_per_s": float(np.mean([r["samples_per_s"] for r in half])),
        "data_wait": float(np.mean([r["data_wait_fraction"] for r in half])),
        "done": last["done"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="impala_pong_cpu")
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--placements", nargs="+", default=["shared", "split"])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} at start, {os.cpu_count()} cores", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="placement_runs_") as tmp:
        for placement in args.placements:
            sampler = Sampler()
            code, run_dir, _ = launch(
                args.config,
                args.actors,
                args.seconds,
                Path(tmp),
                tuple(args.set),
                name=placement,
                flags=("--placement", placement),
                watch=sampler,
            )
            if code != 0 or not (run_dir / "result.json").exists():
                print((Path(tmp) / f"{placement}.log").read_text()[-3000:])
                raise SystemExit(f"the {placement} run failed (exit {code})")
            rows.append((placement, run_summary(run_dir), sampler.summary()))
            print(f"{placement}: done", flush=True)
    base = rows[0][1]
    print(f"\n{args.config}, {args.actors} actors, 1 learner, {args.seconds:.0f} s a run")
    print(
        f"{'placement':<10} {'env steps/s':>11} {'x':>5} {'grad steps/s':>12} {'x':>5} "
        f"{'samples/s':>9} {'wait':>5} {'runnable/core':>13} {'learner sw/s':>12}  cores used"
    )
    for placement, r, k in rows:
        used = " ".join(f"{g} {v:.2f}" for g, v in sorted(k["cores_used"].items()))
        sw = k["learner_switches_per_s"]
        print(
            f"{placement:<10} {r['env_steps_per_s']:11.0f} "
            f"{r['env_steps_per_s'] / base['env_steps_per_s']:5.2f} {r['updates_per_s']:12.2f} "
            f"{r['updates_per_s'] / base['updates_per_s']:5.2f} {r['samples_per_s']:9.1f} "
            f"{r['data_wait']:5.2f} {k['runnable_per_core']:13.2f} "
            f"{'-' if sw is None else f'{sw:.0f}':>12}  {used}"
        )
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()

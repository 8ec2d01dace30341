"""Soak run: a long launched run, 16 actors and CURVE on; its memory, descriptors and disk sampled.

``scripts/launch_local.sh --actors 16 --learners 1 --config CONFIG`` (CURVE keys on, as the
launcher makes them unless ``--no-curve``; with its evaluation actor) runs for ``--minutes`` (30)
in a temporary run directory (or ``--run-dir``), with its stop condition held back
(``run.stop_eval_return=null``, ``run.stop_wall_s=0``) so that it trains the whole time. Every
``--interval`` seconds (30) the script samples:

- memory: RSS and PSS (``/proc/PID/smaps_rollup``) of every process whose command line names the
  run directory, summed over the run and per role (replay, params, learner, the training actors
  together, eval, the launcher, the fork server);
- open file descriptors per process (entries of ``/proc/PID/fd``): the run's sum and the most any
  one process holds, and per role;
- the run directory's disk use per part: ``logs``, ``tb`` (TensorBoard), ``replay_snapshot``,
  ``replay_chunk_log`` (replay's chunk log, ``replay_snapshot/chunk_log``), ``checkpoints``
  (``checkpoint*.pt``), any other directory under its own name (``keys``), and the other files
  (``result.json``, ``roles.json``, ``config.yaml``);
- replay's size and the learner's weights version (its updates), from the servers' ``Stats``.

Then it stops the run as a user does (``apexrl stop``) and checks that no process of the run is
left. It prints the samples as two tables and the summary: memory growth from the first sample at
or after ``--baseline-minutes`` (5) to the last, in % (target: at most 2 %), per role too; the
descriptors of the first sample against the last; each disk part at the first and last sample,
with its growth per hour from the baseline on. Exit status 1 when the launcher did not run to the
end or exit 0 after the stop, or a process of the run was left; the memory target is reported,
not enforced.

    python benchmarks/soak_run.py [--minutes 30] [--interval 30] [--actors 16]
    python benchmarks/soak_run.py --minutes 1 --interval 10 --actors 4 --baseline-minutes 0.3
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from chaos_run import (
    START_LIMIT_S,
    StatsReader,
    kill_left,
    launch,
    role_of,
    run_processes,
    verdict,
    wait_until_training,
)

from apexrl.runtime.rundir import REPLAY_SNAPSHOT

DEFAULT_CONFIG = "configs/apex_dqn_cartpole.yaml"
GROWTH_TARGET_PCT = 2.0
MB = 1e6
GROUPS = ("replay", "params", "learner", "actors", "eval", "local", "forkserver", "other")


def group_of(role: str) -> str:
    if role.startswith("actor"):
        return "actors"
    return role if role in GROUPS else "other"


def memory_kb(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process in kB, from ``smaps_rollup``."""
    kb = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == "kB":
            kb[parts[0].rstrip(":")] = int(parts[1])
    return kb.get("Rss", 0), kb.get("Pss", 0)


def num_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def disk_parts(run_dir: Path) -> dict[str, int]:
    """Bytes on disk (allocated blocks) of each part of the run directory."""
    parts: dict[str, int] = {}
    for entry in sorted(run_dir.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            part = entry.name
            files = [p for p in entry.rglob("*") if p.is_file()]
            if entry.name == REPLAY_SNAPSHOT:  # its subdirectories (the chunk log) on their own
                for sub in entry.iterdir():
                    if sub.is_dir():
                        inside = {p for p in files if sub in p.parents}
                        parts[f"replay_{sub.name}"] = sum(allocated(p) for p in inside)
                        files = [p for p in files if p not in inside]
            size = sum(allocated(p) for p in files)
        else:
            part = "checkpoints" if entry.name.startswith("checkpoint") else "files"
            size = allocated(entry)
        parts[part] = parts.get(part, 0) + size
    return parts


def allocated(path: Path) -> int:
    try:
        return path.stat().st_blocks * 512
    except OSError:  # replaced while we looked (snapshots and checkpoints are written atomically)
        return 0


@dataclass
class Sample:
    minute: float
    rss_kb: dict[str, int] = field(default_factory=dict)  # group -> sum
    pss_kb: dict[str, int] = field(default_factory=dict)
    fds: dict[str, int] = field(default_factory=dict)  # group -> sum
    max_fds: int = 0
    num_procs: int = 0
    disk: dict[str, int] = field(default_factory=dict)
    replay_size: float | None = None
    version: float | None = None

    @property
    def rss_total(self) -> int:
        return sum(self.rss_kb.values())

    @property
    def pss_total(self) -> int:
        return sum(self.pss_kb.values())


def take_sample(minute: float, marker: str, run_dir: Path, reader: StatsReader) -> Sample:
    sample = Sample(minute)
    for pid, argv in run_processes(marker).items():
        group = group_of(role_of(argv))
        try:
            rss, pss = memory_kb(pid)
            fds = num_fds(pid)
        except OSError:  # it exited while we looked
            continue
        sample.rss_kb[group] = sample.rss_kb.get(group, 0) + rss
        sample.pss_kb[group] = sample.pss_kb.get(group, 0) + pss
        sample.fds[group] = sample.fds.get(group, 0) + fds
        sample.max_fds = max(sample.max_fds, fds)
        sample.num_procs += 1
    sample.disk = disk_parts(run_dir)
    replay, params = reader.read("replay", 1000), reader.read("params", 1000)
    sample.replay_size = (replay or {}).get("replay/size")
    sample.version = (params or {}).get("params/version")
    return sample


# -- the report ------------------------------------------------------------------------------------


def mb(kb: int) -> str:
    return f"{kb * 1024 / MB:.0f}"


def growth_pct(first: float, last: float) -> float:
    return 100.0 * (last - first) / first if first else float("nan")


def print_samples(samples: list[Sample]) -> list[str]:
    groups = [g for g in GROUPS if any(g in s.rss_kb for s in samples)]
    parts = sorted({p for s in samples for p in s.disk})
    print(
        "\nMemory (MB = 10^6 bytes; RSS per role, the run's RSS and PSS summed over its processes)"
    )
    header = f"{'min':>5} {'procs':>5} {'RSS':>6} {'PSS':>6} " + " ".join(
        f"{g:>10}" for g in groups
    )
    print(header + f" {'replay size':>11} {'version':>8}")
    for s in samples:
        cells = " ".join(f"{mb(s.rss_kb.get(g, 0)):>10}" for g in groups)
        size = "-" if s.replay_size is None else f"{s.replay_size:,.0f}"
        version = "-" if s.version is None else f"{s.version:,.0f}"
        print(
            f"{s.minute:>5.1f} {s.num_procs:>5} {mb(s.rss_total):>6} {mb(s.pss_total):>6} "
            f"{cells} {size:>11} {version:>8}"
        )
    print("\nDescriptors (the run's sum, the most in one process) and disk per part (MB)")
    print(f"{'min':>5} {'fds':>5} {'max':>4} " + " ".join(f"{p:>{max(len(p), 8)}}" for p in parts))
    for s in samples:
        disk = " ".join(f"{s.disk.get(p, 0) / MB:>{max(len(p), 8)}.2f}" for p in parts)
        print(f"{s.minute:>5.1f} {sum(s.fds.values()):>5} {s.max_fds:>4} {disk}")
    return groups


def summarize(samples: list[Sample], baseline_min: float, groups: list[str], capacity: int) -> None:
    base = next((s for s in samples if s.minute >= baseline_min), samples[0])
    first, last = samples[0], samples[-1]
    hours = max(last.minute - base.minute, 1e-9) / 60
    print(f"\nSummary: minute {base.minute:.1f} (baseline) to minute {last.minute:.1f}")
    full = next((s.minute for s in samples if (s.replay_size or 0) >= capacity), None)
    print(
        f"  replay full ({capacity:,} items) from minute "
        f"{'-' if full is None else f'{full:.1f}'}; weights version (learner updates) "
        f"{base.version or 0:,.0f} -> {last.version or 0:,.0f}"
    )
    for name, a, b in (
        ("run RSS", base.rss_total, last.rss_total),
        ("run PSS", base.pss_total, last.pss_total),
    ):
        pct = growth_pct(a, b)
        verdict = "met" if pct <= GROWTH_TARGET_PCT else "missed"
        print(
            f"  {name}: {mb(a)} -> {mb(b)} MB, {pct:+.2f} % "
            f"(target <= {GROWTH_TARGET_PCT:g} %: {verdict})"
        )
    for g in groups:
        a, b = base.rss_kb.get(g, 0), last.rss_kb.get(g, 0)
        print(f"    {g:<10} RSS {mb(a):>6} -> {mb(b):>6} MB, {growth_pct(a, b):+.2f} %")
    print(
        f"  descriptors: {sum(first.fds.values())} -> {sum(last.fds.values())} "
        f"(most in one process {first.max_fds} -> {last.max_fds})"
    )
    for g in groups:
        print(f"    {g:<10} {first.fds.get(g, 0):>5} -> {last.fds.get(g, 0):>5}")
    print("  disk (MB): first -> last, the most in a sample, growth per hour from the baseline")
    for p in sorted({p for s in samples for p in s.disk}):
        a, b = first.disk.get(p, 0), last.disk.get(p, 0)
        most = max(s.disk.get(p, 0) for s in samples)
        per_hour = (b - base.disk.get(p, 0)) / MB / hours
        print(
            f"    {p:<20} {a / MB:>10.2f} -> {b / MB:>10.2f}  max {most / MB:>10.2f}  "
            f"{per_hour:>+10.2f} MB/h"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--baseline-minutes", type=float, default=5.0)
    parser.add_argument("--actors", type=int, default=16)
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    parser.add_argument("--run-dir", type=Path, help="default: a new temporary directory")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="launcher --set k=v"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the finally stops the run
    base = Path(tempfile.mkdtemp(prefix="apexrl-soak-"))
    run_dir = args.run_dir or base / "run"
    launcher_args = ["--actors", str(args.actors), "--learners", "1", "--config", args.config]
    for override in ("run.stop_eval_return=null", "run.stop_wall_s=0", *args.overrides):
        launcher_args += ["--set", override]
    print(f"soak run: {' '.join(launcher_args)}; run dir {run_dir}", flush=True)
    load_before = os.getloadavg()
    run = launch(launcher_args, run_dir, base / "launcher.log")
    samples: list[Sample] = []
    reader, ran_to_end, code, left, capacity = None, False, None, [], 0
    try:
        cfg = run.config(time.monotonic() + START_LIMIT_S)
        if not cfg.net.keys_dir:
            raise RuntimeError("the run has no CURVE keys")
        reader, capacity = StatsReader(cfg), cfg.replay.capacity
        roles = {"replay", "params", "learner", "eval", *(f"actor_{i}" for i in range(args.actors))}
        wait_until_training(run, reader, roles)
        started = time.monotonic()
        print(f"training, CURVE keys in {cfg.net.keys_dir}; sampling", flush=True)
        while True:
            now = time.monotonic()
            if run.popen.poll() is not None:
                print(f"the launcher exited with {run.popen.returncode}", flush=True)
                break
            sample = take_sample((now - started) / 60, run.marker, run_dir, reader)
            samples.append(sample)
            print(
                f"  {sample.minute:5.1f} min: RSS {mb(sample.rss_total)} MB, PSS "
                f"{mb(sample.pss_total)} MB, {sum(sample.fds.values())} fds, "
                f"{sum(sample.disk.values()) / MB:.1f} MB on disk",
                flush=True,
            )
            if now - started >= args.minutes * 60:
                ran_to_end = True
                break
            next_at = started + len(samples) * args.interval
            time.sleep(max(min(next_at, started + args.minutes * 60) - time.monotonic(), 0.0))
    finally:
        if reader is not None:
            reader.close()
        code = run.stop()
        left = kill_left(run.marker)
    print(f"\nsoak run: {' '.join(launcher_args)}, {os.cpu_count()} CPUs")
    if samples:
        groups = print_samples(samples)
        summarize(samples, args.baseline_minutes, groups, capacity)
    load_after = os.getloadavg()
    print(f"\nlauncher exit status after `apexrl stop`: {code}")
    print(f"processes of the run left: {', '.join(left) if left else 'none'}")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    print(f"(logs in {run_dir / 'logs'}, launcher log {run.log_path})")
    problems = []
    if not ran_to_end:
        problems.append("the run ended early")
    return verdict(problems, code, left)


if __name__ == "__main__":
    sys.exit(main())

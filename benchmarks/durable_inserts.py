"""What replay's durability costs: inserted transitions/s with the chunk log off, on, and on with
fsync, in one run.

Real processes on loopback, as ``replay_throughput.py`` measures them (its ``measure_replay``):
one replay server process (prioritized table, no rate limit) and ``--clients`` insert processes,
each keeping ``--window`` chunks in flight and sending the next one per ``InsertAck``; every send
carries its own chunk number, so each one is stored. For every workload the three servers run one
after the other with the same clients and chunks:

- off: ``replay.durable: false``;
- on: ``replay.durable: true`` (the default): each pass of the server loop writes the chunks it
  stored to the chunk log (one ``writev`` into the page cache) before their acks go out;
- on + fsync: also ``replay.log_fsync: true`` (an ``fdatasync`` per pass).

Snapshots are on in all three (``replay.snapshot_interval_s`` 3600: none falls inside a window),
so only the log differs; each figure is the median of ``--rounds`` rounds of the three modes in
turn. ``--sampling`` adds a workload where one learner-like process also samples batches of 512
and answers each with a ``PriorityUpdate`` (``replay_throughput.py``'s sampler): the log off, on
with the learners' priorities written every second (``replay.priority_log_period_s`` 1, the
default), and on with them written at every pass (0); its rows also give the sampled batches/s.
Workloads: CartPole n-step transitions in chunks of ``--chunks`` items
(64 is the actors' default), and Ape-X Pong chunks as ``configs/apex_dqn_pong.yaml``'s actors
send them (16 envs x 64 steps, stacked frames sent and stored once; cut by the actor's code, as
in ``pixel_replay.py``; ``--pong-clients`` 2 with ``--pong-window`` 2 in flight, a table of
``--pong-capacity`` items). Each row gives the inserted transitions/s, the ratio to off, the
share of one core the replay server used, and the chunk log's MB/s written.

    python benchmarks/durable_inserts.py [--seconds 10] [--rounds 3] [--chunks 64] [--clients 4]
        [--no-pong] [--sampling]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent))
import replay_throughput as rt  # noqa: E402
from harness import as_actor  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SNAPSHOTS = "replay.snapshot_interval_s=3600"  # none inside a measuring window
MODES = {
    "off": (SNAPSHOTS, "replay.durable=false"),
    "on": (SNAPSHOTS, "replay.durable=true"),
    "on + fsync": (SNAPSHOTS, "replay.durable=true", "replay.log_fsync=true"),
}
SAMPLING_MODES = {  # with a learner sending priority updates: how often they reach the log
    "off": (SNAPSHOTS, "replay.durable=false"),
    "on, prio 1s": (SNAPSHOTS, "replay.durable=true", "replay.priority_log_period_s=1"),
    "on, prio 0": (SNAPSHOTS, "replay.durable=true", "replay.priority_log_period_s=0"),
}


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def measure_modes(
    procs: rt.Processes,
    args: argparse.Namespace,
    label: str,
    num_items: int,
    modes: dict[str, tuple[str, ...]] = MODES,
    sample: bool = False,
    **workload,
) -> None:
    """One row per mode for a workload (``measure_replay``'s keywords: config, num_envs and
    chunk paths; ``sample``: a learner-like sampler with priority updates too): the median of
    ``--rounds`` rounds, each measuring the modes in turn, so that a drift of the machine's speed
    touches every mode alike."""
    figures: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    for round_ in range(args.rounds):
        for mode, overrides in modes.items():
            slug = "".join(c if c.isalnum() else "_" for c in mode)
            name = f"_{label.replace(' ', '_')}_{slug}_{round_}"
            figures[mode].append(
                rt.measure_replay(
                    procs, args, num_items, sample, overrides=overrides, name=name, **workload
                )
            )
    off = median(figures["off"], "inserts_per_s")
    for mode, runs in figures.items():
        rate = median(runs, "inserts_per_s")
        batches = f" {median(runs, 'batches_per_s'):>9.1f}" if sample else ""
        print(
            f"{label:<10} {num_items:>6} {mode:<11} {rate:>10.0f} {rate / off:>6.2f} "
            f"{min(r['inserts_per_s'] for r in runs):>10.0f} "
            f"{max(r['inserts_per_s'] for r in runs):>10.0f} {median(runs, 'cpu'):>5.2f} "
            f"{median(runs, 'log_bytes_per_s') / 1e6:>8.1f} {os.getloadavg()[0]:>5.1f}{batches}",
            flush=True,
        )


def median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def pong_paths(workdir: Path, args: argparse.Namespace) -> list[Path]:
    """Files with the frames of Pong chunks (frames stored once), one per client."""
    import pixel_replay  # Atari envs and torch: only when Pong is measured

    encoded, _ = pixel_replay.pong_chunks(args.clients, args.warmup_steps)
    paths = []
    for i in range(args.clients):
        path = workdir / f"pong_chunk_{i}.msgpack"
        path.write_bytes(msgpack.packb(as_actor(encoded["frames once"][i], i)))
        paths.append(path)
    return paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measuring window per figure")
    parser.add_argument("--chunks", type=int, nargs="+", default=[64], help="CartPole chunk items")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three modes")
    parser.add_argument("--clients", type=int, default=4, help="concurrent insert processes")
    parser.add_argument("--window", type=int, default=8, help="chunks in flight per client")
    parser.add_argument("--capacity", type=int, default=2_000_000, help="replay capacity, items")
    parser.add_argument("--batch-size", type=int, default=512, help=argparse.SUPPRESS)
    parser.add_argument("--prefetch", type=int, default=4, help=argparse.SUPPRESS)
    parser.add_argument("--warmup-steps", type=int, default=300, help="Pong steps before chunks")
    parser.add_argument("--no-pong", action="store_true", help="CartPole only")
    parser.add_argument(
        "--sampling",
        action="store_true",
        help="also CartPole with a sampler sending priority updates (their logging's cost)",
    )
    parser.add_argument("--pong-clients", type=int, default=2, help="Pong insert processes")
    parser.add_argument("--pong-window", type=int, default=2, help="Pong chunks in flight each")
    parser.add_argument("--pong-capacity", type=int, default=200_000, help="Pong replay, items")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="apexrl-bench-durable-"))
    procs = rt.Processes(workdir)
    print(
        f"Replay inserts with the chunk log off / on / on + fsync: {args.clients} client "
        f"processes ({args.window} chunks in flight each), {args.seconds:g} s per figure, "
        f"commit {commit()}, load average {os.getloadavg()[0]:.1f} at start (logs in {workdir})"
    )
    print(
        f"{'workload':<10} {'chunk':>6} {'log':<11} {'inserts/s':>10} {'ratio':>6} "
        f"{'min':>10} {'max':>10} {'cpu':>5} {'log MB/s':>8} {'load':>5}"
        + (f" {'batches/s':>9}" if args.sampling else ""),
        flush=True,
    )
    try:
        for num_items in args.chunks:
            measure_modes(procs, args, "CartPole", num_items)
            if args.sampling:
                measure_modes(procs, args, "CP+sample", num_items, SAMPLING_MODES, sample=True)
        if not args.no_pong:
            import pixel_replay

            items = pixel_replay.NUM_ENVS * pixel_replay.CHUNK_STEPS
            pong = argparse.Namespace(**vars(args))
            pong.clients, pong.window = args.pong_clients, args.pong_window
            pong.capacity = args.pong_capacity
            measure_modes(
                procs,
                pong,
                "Pong",
                items,
                config=pixel_replay.CONFIG,
                num_envs=pixel_replay.NUM_ENVS,
                chunk_paths=pong_paths(workdir, pong),
            )
    finally:
        procs.stop()
    print(
        f"(inserts/s: the median of {args.rounds} rounds, min and max beside it; ratio: against "
        "the log off, same workload; cpu: cores the replay server used; log MB/s: chunk log "
        f"bytes written, 10^6; load average {os.getloadavg()[0]:.1f} at the end)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

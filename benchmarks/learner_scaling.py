"""Learner samples/s with 1 and with 2 learners (a torch.distributed group), side by side.

Real processes on loopback: one replay server filled with CartPole-shaped n-step transitions and
no rate limit (samples_per_insert = 0), one parameter server, and then 1, then 2 learner processes
of the default config that train for ``--seconds`` each. The figures are read from the learners'
``result.json`` (rank 0 reports the total samples/s over all ranks) and printed as a table with the
ratio to the single learner, measured in this same run.

The servers refuse what the config's actors and learners could not send, so they are configured
to describe this benchmark: chunks of ``CHUNK`` items from one actor of ``CHUNK_ENVS`` envs, batches
of ``--batch-size`` and as many learner ranks as the largest count in ``--learners``.

    python benchmarks/learner_scaling.py [--seconds 20] [--batch-size 128] [--learners 1 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq
from harness import free_addr, start, stop

from apexrl.transport import sockets
from apexrl.transport.messages import InsertAck, Stats, StatsRequest, TrajectoryChunk

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "apex_dqn_cartpole.yaml"
ITEMS = 50_000  # transitions put in replay before the learners start
CHUNK, CHUNK_ENVS = 1000, 8  # items per inserted chunk: one actor's 8 envs x 125 vector steps


def fill_replay(addr: str, num_items: int, table: str, chunk: int = CHUNK) -> None:
    """Insert ``num_items`` random CartPole-shaped transitions and wait for each ack."""
    rng = np.random.default_rng(0)
    ctx = sockets.make_context()
    sock = sockets.connect(ctx, zmq.DEALER, addr)
    try:
        for sequence in range(num_items // chunk):
            fields = {
                "obs": rng.standard_normal((chunk, 4)).astype(np.float32),
                "action": rng.integers(0, 2, chunk),
                "reward": np.ones(chunk, np.float32),
                "num_steps": np.full(chunk, 3, np.int64),
                "terminated": rng.random(chunk) < 0.05,
                "truncated": np.zeros(chunk, bool),
                "next_obs": rng.standard_normal((chunk, 4)).astype(np.float32),
            }
            sockets.send(
                sock,
                TrajectoryChunk(table, 0, 1, sequence, 0, chunk, rng.random(chunk) + 0.1, fields),
            )
            reply = sockets.recv(sock, timeout_ms=30_000)
            if not isinstance(reply, InsertAck):
                raise RuntimeError(f"replay did not acknowledge an insert: {reply!r}")
        sockets.send(sock, StatsRequest())
        stats = sockets.recv(sock, timeout_ms=5000)
        assert isinstance(stats, Stats) and stats.values["replay/size"] >= num_items
    finally:
        sock.close(linger=0)
        ctx.term()


def measure(world_size: int, seconds: float, common: list[str], workdir: Path) -> dict:
    run_dir = workdir / f"learners_{world_size}"
    rendezvous = free_addr()
    learners = [
        start(
            [
                "learner",
                *common,
                "--run-dir",
                str(run_dir),
                "--rank",
                str(rank),
                "--world-size",
                str(world_size),
                "--rendezvous",
                rendezvous,
            ],
            workdir / f"learner_{world_size}_{rank}.log",
        )
        for rank in range(world_size)
    ]
    result = run_dir / "result.json"
    try:
        deadline = time.monotonic() + 120
        while not result.is_file() and time.monotonic() < deadline:  # joined and training
            time.sleep(0.2)
        time.sleep(seconds)
        lines = [json.loads(line) for line in result.read_text().splitlines()]
    finally:
        stop(learners)
    steady = lines[1:] or lines  # the first report includes start-up
    return {
        "learners": world_size,
        "updates_per_s": float(np.mean([r["updates_per_s"] for r in steady])),
        "samples_per_s": float(np.mean([r["samples_per_s"] for r in steady])),
        "data_wait": float(np.mean([r["data_wait_fraction"] for r in steady])),
        "reports": len(steady),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--learners", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="apexrl-bench-"))
    replay_addr, params_addr = free_addr(), free_addr()
    common = [
        "--config",
        str(CONFIG),
        "--replay",
        replay_addr,
        "--params",
        params_addr,
        "--set",
        "replay.samples_per_insert=0",
        "--set",
        "replay.min_size_to_sample=1000",
        "--set",
        f"learner.batch_size={args.batch_size}",
        "--set",
        "learner.report_interval_s=2",
        "--set",
        "run.stop_eval_return=null",
        "--set",
        "run.stop_wall_s=0",
    ]
    server_args = [a for a in common if a not in ("--replay", replay_addr, "--params", params_addr)]
    # The servers take chunks of the size the config's actors send and priority updates from the
    # config's learner ranks: describe the filler below and the largest learner group.
    server_args += [
        "--set",
        f"env.num_envs={CHUNK_ENVS}",
        "--set",
        f"actor.chunk_steps={CHUNK // CHUNK_ENVS}",
        "--set",
        "actor.num_actors=1",
        "--set",
        f"learner.world_size={max(args.learners)}",
        "--set",
        f"learner.rendezvous={free_addr()}",  # the servers never join it; each group has its own
    ]
    servers = [
        start(
            ["replay", *server_args, "--bind", replay_addr, "--run-dir", str(workdir / "replay")],
            workdir / "replay.log",
        ),
        start(
            ["params", *server_args, "--bind", params_addr, "--run-dir", str(workdir / "params")],
            workdir / "params.log",
        ),
    ]
    try:
        fill_replay(replay_addr, ITEMS, "apex_dqn")
        rows = [measure(w, args.seconds, common, workdir) for w in args.learners]
    finally:
        stop(servers)
    base = rows[0]["samples_per_s"]
    print(
        f"\nLearner throughput, CPU, batch {args.batch_size} per rank, {args.seconds:g} s each "
        f"(logs in {workdir})"
    )
    print(f"{'learners':>8} {'updates/s':>10} {'samples/s':>10} {'vs 1':>6} {'data wait':>10}")
    for r in rows:
        print(
            f"{r['learners']:>8} {r['updates_per_s']:>10.1f} {r['samples_per_s']:>10.0f} "
            f"{r['samples_per_s'] / base:>6.2f} {r['data_wait']:>10.1%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

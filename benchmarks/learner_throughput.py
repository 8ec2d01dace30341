"""Learner updates/s, samples/s and data-wait share for the CartPole MLP and the Nature CNN.

Real processes on loopback: one replay server filled with synthetic n-step transitions of the
right shapes (CartPole: float32 [4]; Atari: uint8 [4, 84, 84] frame stacks whose next_obs shares
three frames with obs, drawn as a dark background with a few bright blocks so that LZ4 compresses
them about as well as real frames) and no rate limit (``samples_per_insert = 0``), one parameter
server, then one learner process per model that trains for ``--seconds``. The figures come from
the learner's ``result.json`` (``updates_per_s``, ``samples_per_s``, ``data_wait_fraction``; the
first report, which includes start-up, is dropped).

There is no Atari env here (no ``ale-py``), so the CNN runs with a stand-in gymnasium env,
``BenchAtari-v0`` (obs uint8 [4, 84, 84], 6 actions), registered in each server and learner
process before ``apexrl.cli.main`` starts the role (``start_role``); no role steps it, they only
read its spaces: the replay server allocates its table and checks items from them, the parameter
server and the learner build the Nature CNN from them.

The servers refuse what the config's actors and learners could not send, so they are configured
to describe this benchmark: chunks of ``CHUNK`` items from one actor of ``CHUNK_ENVS`` envs and
batches of ``--batch-size``.

The baseline each row is divided by is ``update only``: the same learner code path
(``QLearner.update`` on a batch already in memory, ``--device`` and threads alike) timed in this
process, so ``vs update only`` is the share of the bare update speed the whole learner reaches.

Start-up, from the learner's log (replay already holds its items): seconds from starting the
learner process to its first publish (``published version 0``) and to its first update (``first
update done``). Their same-run floors, each timed in a fresh process: ``import apexrl.learner``
alone, and that import plus one ``torch.optim.Adam`` (which imports torch's compiler; the learners
use ``apexrl.learning.optim.Adam``, which does not).

    python benchmarks/learner_throughput.py [--seconds 30] [--cnn-seconds 15] [--batch-size 512]
                                            [--models mlp cnn] [--torch-threads 1]
                                            [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import zmq
from harness import free_addr, stop

from apexrl.algos import SampledBatch
from apexrl.algos.apex_dqn import apex_dqn_learner
from apexrl.config import load_config
from apexrl.transport import sockets
from apexrl.transport.messages import InsertAck, Stats, StatsRequest, TrajectoryChunk

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "apex_dqn_cartpole.yaml"
ATARI_OBS, ATARI_ACTIONS = (4, 84, 84), 6
MODELS = {"mlp": ((4,), np.float32, 2), "cnn": (ATARI_OBS, np.uint8, ATARI_ACTIONS)}
ENV_IDS = {"mlp": "CartPole-v1", "cnn": "BenchAtari-v0"}
CHUNK, CHUNK_ENVS = 500, 4  # items per inserted chunk: one actor's 4 envs x 125 vector steps
# Runs an apexrl role with the stand-in Atari env registered (argv: the apexrl arguments).
ROLE_ENTRY = (
    "import sys; sys.path.insert(0, {bench!r}); import gymnasium as gym; "
    "gym.register('BenchAtari-v0', entry_point='learner_throughput:BenchAtariEnv'); "
    "from apexrl.cli import main; sys.exit(main(sys.argv[1:]))"
)


class BenchAtariEnv(gym.Env):
    """Spaces of a 4-frame-stacked 84x84 Atari env; ``step`` shows blank frames (never used)."""

    observation_space = gym.spaces.Box(0, 255, ATARI_OBS, np.uint8)
    action_space = gym.spaces.Discrete(ATARI_ACTIONS)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(ATARI_OBS, np.uint8), {}

    def step(self, action):
        return np.zeros(ATARI_OBS, np.uint8), 0.0, False, False, {}


def start_role(args: list[str], log: Path) -> subprocess.Popen:
    """``apexrl <args>`` in its own process with ``BenchAtari-v0`` registered, output to ``log``."""
    entry = ROLE_ENTRY.format(bench=str(Path(__file__).resolve().parent))
    return subprocess.Popen(
        [sys.executable, "-c", entry, *args], stdout=log.open("wb"), stderr=subprocess.STDOUT
    )


def synthetic_frames(rng: np.random.Generator, num: int) -> np.ndarray:
    """``num`` 84x84 uint8 frames: a dark background and four bright blocks at random places."""
    frames = np.full((num, 84, 84), 16, np.uint8)
    for frame in frames:
        for y, x in rng.integers(0, 76, (4, 2)):
            frame[y : y + 8, x : x + 4] = rng.integers(64, 256)
    return frames


def synthetic_items(model: str, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    obs_shape, dtype, num_actions = MODELS[model]
    if model == "cnn":
        frames = synthetic_frames(rng, n + 8)
        start_at = rng.integers(0, 4, n)  # obs = frames[i:i+4], next_obs one frame later
        obs = np.stack([frames[i + s : i + s + 4] for i, s in enumerate(start_at)])
        next_obs = np.stack([frames[i + s + 1 : i + s + 5] for i, s in enumerate(start_at)])
    else:
        obs = rng.standard_normal((n, *obs_shape)).astype(dtype)
        next_obs = rng.standard_normal((n, *obs_shape)).astype(dtype)
    return {
        "obs": obs,
        "action": rng.integers(0, num_actions, n),
        "reward": np.ones(n, np.float32),
        "num_steps": np.full(n, 3, np.int64),
        "terminated": rng.random(n) < 0.05,
        "truncated": np.zeros(n, bool),
        "next_obs": next_obs,
    }


def fill_replay(addr: str, model: str, num_items: int, table: str, chunk: int = CHUNK) -> None:
    """Insert ``num_items`` synthetic transitions and wait for each ack."""
    rng = np.random.default_rng(0)
    ctx = sockets.make_context()
    sock = sockets.connect(ctx, zmq.DEALER, addr)
    try:
        for sequence in range(max(num_items // chunk, 1)):
            fields = synthetic_items(model, rng, chunk)
            sockets.send(
                sock,
                TrajectoryChunk(table, 0, 1, sequence, 0, chunk, rng.random(chunk) + 0.1, fields),
            )
            reply = sockets.recv(sock, timeout_ms=60_000)
            if not isinstance(reply, InsertAck):
                raise RuntimeError(f"replay did not acknowledge an insert: {reply!r}")
        sockets.send(sock, StatsRequest())
        stats = sockets.recv(sock, timeout_ms=10_000)
        assert isinstance(stats, Stats) and stats.values["replay/size"] >= min(num_items, chunk)
    finally:
        sock.close(linger=0)
        ctx.term()


def update_only(model: str, batch_size: int, device: str, threads: int, seconds: float) -> float:
    """Updates/s of ``QLearner.update`` on one batch already on the device (no sockets)."""
    cfg = load_config(CONFIG)
    torch.set_num_threads(threads)
    obs_shape, _, num_actions = MODELS[model]
    algo = apex_dqn_learner(obs_shape, num_actions, cfg.algo, device)
    items = synthetic_items(model, np.random.default_rng(1), batch_size)
    fields = {k: torch.from_numpy(v).to(device) for k, v in items.items()}
    keys = np.arange(batch_size, dtype=np.int64)
    batch = SampledBatch(keys, fields, np.full(batch_size, 1e-4), 10_000)
    algo.update(batch)  # warm-up
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds or done < 3:
        algo.update(batch)
        done += 1
    return done / (time.perf_counter() - started)


def log_time(log: Path, text: str, after: float) -> float | None:
    """Wall-clock time (``time.time()``) of the first line of ``log`` holding ``text``; the log's
    ``HH:MM:SS.mmm`` stamps are local times on the day of ``after`` (or the next day)."""
    day = datetime.datetime.fromtimestamp(after).date()
    for line in log.read_text(errors="replace").splitlines():
        if text in line:
            clock = datetime.datetime.strptime(line.split(" ", 1)[0], "%H:%M:%S.%f").time()
            stamp = datetime.datetime.combine(day, clock).timestamp()
            return stamp if stamp >= after - 1.0 else stamp + 86_400.0
    return None


# Timed in a fresh process: the floor of a learner's start, and that floor plus torch.optim.Adam.
IMPORT_ONLY = "import apexrl.learner"
IMPORT_AND_TORCH_ADAM = (
    "import apexrl.learner, torch; torch.optim.Adam(torch.nn.Linear(4, 2).parameters(), lr=1e-3)"
)


def process_seconds(code: str) -> float:
    """Wall seconds of ``python -c code`` from start to exit."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - started


def measure(model: str, args: argparse.Namespace, workdir: Path) -> dict:
    replay_addr, params_addr = free_addr(), free_addr()
    common = [
        "--config",
        str(CONFIG),
        "--set",
        f"env.id={ENV_IDS[model]}",
        # The replay server takes chunks of the size the config's actors send: describe the
        # filler below (one actor).
        "--set",
        f"env.num_envs={CHUNK_ENVS}",
        "--set",
        f"actor.chunk_steps={CHUNK // CHUNK_ENVS}",
        "--set",
        "actor.num_actors=1",
        "--set",
        "replay.samples_per_insert=0",
        "--set",
        f"replay.min_size_to_sample={min(args.items[model], 1000)}",
        "--set",
        f"replay.capacity={max(args.items[model], 1000)}",
        "--set",
        f"learner.batch_size={args.batch_size}",
        "--set",
        f"learner.report_interval_s={args.report_interval_s}",
        "--set",
        f"learner.torch_threads={args.torch_threads}",
        "--set",
        f"learner.device={args.device}",
        "--set",
        "run.stop_eval_return=null",
        "--set",
        "run.stop_wall_s=0",
    ]
    run_dir = workdir / model
    procs = [
        start_role(
            ["replay", *common, "--bind", replay_addr, "--run-dir", str(run_dir)],
            workdir / f"replay_{model}.log",
        ),
        start_role(
            ["params", *common, "--bind", params_addr, "--run-dir", str(run_dir)],
            workdir / f"params_{model}.log",
        ),
    ]
    result = run_dir / "result.json"
    try:
        fill_replay(replay_addr, model, args.items[model], "apex_dqn")
        learner_args = [
            "learner",
            *common,
            "--replay",
            replay_addr,
            "--params",
            params_addr,
            "--run-dir",
            str(run_dir),
        ]
        learner_log = workdir / f"learner_{model}.log"
        learner_started = time.time()
        learner = start_role(learner_args, learner_log)
        procs.append(learner)
        deadline = time.monotonic() + 120
        while not result.is_file() and time.monotonic() < deadline:
            if learner.poll() is not None:
                raise RuntimeError(f"learner exited; see {workdir / f'learner_{model}.log'}")
            time.sleep(0.2)
        seconds = args.cnn_seconds if model == "cnn" else args.seconds
        if args.profile:
            profile(learner.pid, workdir / f"profile_{model}.txt", seconds)
        else:
            time.sleep(seconds)
        lines = [json.loads(line) for line in result.read_text().splitlines()]
    finally:
        stop(procs)
    steady = lines[1:] or lines
    first_publish = log_time(learner_log, "published version 0", learner_started)
    first_update = log_time(learner_log, "first update done", learner_started)
    return {
        "model": model,
        "first_publish_s": first_publish - learner_started if first_publish else math.nan,
        "first_update_s": first_update - learner_started if first_update else math.nan,
        "updates_per_s": float(np.mean([r["updates_per_s"] for r in steady])),
        "samples_per_s": float(np.mean([r["samples_per_s"] for r in steady])),
        "data_wait": float(np.mean([r["data_wait_fraction"] for r in steady])),
        "reports": len(steady),
    }


def profile(pid: int, out: Path, seconds: float) -> None:
    """Sample the learner with py-spy for ``seconds``; the top functions (own time) to ``out``."""
    raw = out.with_suffix(".raw")
    subprocess.run(
        [
            "py-spy",
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(int(seconds)),
            "--format",
            "raw",
            "--output",
            str(raw),
            "--nonblocking",
        ],
        check=False,
        capture_output=True,
        timeout=seconds + 60,
    )
    own: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines() if raw.exists() else []:
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        total += int(count)
        leaf = frames[-1]
        own[leaf] = own.get(leaf, 0) + int(count)
        for frame in set(frames):
            own["  incl " + frame] = own.get("  incl " + frame, 0) + int(count)
    rows = sorted(own.items(), key=lambda kv: -kv[1])[:60]
    out.write_text("\n".join(f"{c / max(total, 1):6.1%} {name}" for name, c in rows))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument(
        "--cnn-seconds", type=float, default=15.0, help="the CNN's window (1-3 updates/s)"
    )
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"], choices=list(MODELS))
    parser.add_argument(
        "--items",
        type=int,
        nargs=2,
        default=[50_000, 8_000],
        metavar=("MLP", "CNN"),
        help="items put in replay for each model",
    )
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--report-interval-s", type=float, default=5.0)
    parser.add_argument("--profile", action="store_true", help="py-spy the learner meanwhile")
    args = parser.parse_args()
    args.items = dict(zip(("mlp", "cnn"), args.items, strict=True))
    workdir = Path(tempfile.mkdtemp(prefix="apexrl-bench-learner-"))
    rows = []
    for model in args.models:
        row = measure(model, args, workdir)
        row["update_only"] = update_only(
            model, args.batch_size, args.device, args.torch_threads, min(args.seconds, 10.0)
        )
        rows.append(row)
    import_s = process_seconds(IMPORT_ONLY)
    torch_adam_s = process_seconds(IMPORT_AND_TORCH_ADAM)
    print(
        f"\nLearner throughput, {args.device}, batch {args.batch_size}, "
        f"{args.torch_threads} torch thread(s), {args.seconds:g} s (CNN {args.cnn_seconds:g} s) "
        f"(logs in {workdir})"
    )
    print(
        f"{'model':>5} {'updates/s':>10} {'samples/s':>10} {'data wait':>10} "
        f"{'update only/s':>14} {'vs update only':>15} {'reports':>8}"
    )
    for r in rows:
        print(
            f"{r['model']:>5} {r['updates_per_s']:>10.2f} {r['samples_per_s']:>10.0f} "
            f"{r['data_wait']:>10.1%} {r['update_only']:>14.2f} "
            f"{r['updates_per_s'] / r['update_only']:>15.2f} {r['reports']:>8}"
        )
    print("\nLearner start-up, seconds from starting the process (replay already full)")
    print(f"{'model':>5} {'first publish':>14} {'first update':>13}")
    for r in rows:
        print(f"{r['model']:>5} {r['first_publish_s']:>14.2f} {r['first_update_s']:>13.2f}")
    print(
        f"floors, fresh process: import apexrl.learner {import_s:.2f} s; "
        f"+ one torch.optim.Adam {torch_adam_s:.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

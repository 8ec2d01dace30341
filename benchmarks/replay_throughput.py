"""Replay server inserts and prioritized sampling against plain ZeroMQ PUSH/PULL of the same bytes.

Real processes on loopback. ``--clients`` insert processes send ``TrajectoryChunk``s of real
CartPole n-step transitions (made once per client by the actor's own code: a vector env stepped
with random actions, ``StepBlock`` and Ape-X's ``build_transitions``; encoded once and then resent
as the same frames, so the clients' encoding cost is not what is measured). Each keeps ``--window``
chunks in flight and sends the next one per ``InsertAck``. One replay server process
(``apexrl replay``, prioritized table, no rate limit) stores them; its ``Stats`` give the inserted
transitions over the measuring window.

- baseline: the same frames from the same number of PUSH clients to one PULL process that only
  receives them: the ceiling of the transport on this machine;
- inserts: the replay server, inserts only;
- sampling: inserts continue while one learner-like process asks for batches of ``--batch-size``
  (``--prefetch`` requests in flight) and answers each with a ``PriorityUpdate`` of new priorities
  for its keys; sampled batches/s from the server's ``replay/num_sampled``.

Chunk sizes: 64 transitions is the actors' default (``chunk_steps x num_envs`` = 8 x 8); 256 and
512 are larger actors (64 envs x 4 and 8 steps); 4096 is a large actor (64 envs x 64 steps).

Each replay server gets a fresh run directory and no snapshots, so none starts by loading the
previous one's table. Besides the rates, each row gives the share of one core the replay server
process used over the window (``cpu``, from ``/proc``) and its inserted items per CPU-second: on a
machine shared with other work the rates follow the load, the cost per item much less.

``--curve`` runs every figure with CURVE authentication and encryption, as a launched run does: the
replay server (and the PULL process) with the replay key and the allow-list, the insert and PUSH
clients with the actor key, the sampler with the learner key.

    python benchmarks/replay_throughput.py [--seconds 10] [--chunks 64 256 512 4096] [--clients 4]
        [--curve]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
import zmq
from harness import free_addr, renumbered

from apexrl.config import NetConfig
from apexrl.transport import auth, sockets
from apexrl.transport.codec import decode, encode
from apexrl.transport.messages import (
    InsertAck,
    PriorityUpdate,
    SampleBatch,
    SampleRequest,
    Stats,
    StatsRequest,
    TrajectoryChunk,
)

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "apex_dqn_cartpole.yaml"
TABLE = "apex_dqn"
N_STEP, GAMMA = 3, 0.99
ENVS_PER_CHUNK = {64: 8}  # chunk size -> envs of the actor that makes it; otherwise 64 envs


# --- the client processes -----------------------------------------------------------------------


def num_envs_of(num_items: int) -> int:
    return ENVS_PER_CHUNK.get(num_items, min(64, num_items))


def cartpole_chunk_frames(num_items: int, seed: int) -> list[bytes]:
    """The encoded frames of one ``TrajectoryChunk`` of ``num_items`` real CartPole transitions."""
    # Imported here: the client processes only read the frames, and start faster without torch.
    from apexrl.acting.step_block import StepBlock
    from apexrl.algos.apex_dqn import build_transitions
    from apexrl.config import EnvConfig
    from apexrl.envs import make_vector_env, step_vector
    from apexrl.models import build_q_network

    num_envs = num_envs_of(num_items)
    if num_items % num_envs:
        raise ValueError(f"chunk size {num_items} is not a multiple of {num_envs} envs")
    envs = make_vector_env(EnvConfig(), num_envs)
    net = build_q_network((4,), 2, (128, 128), True)
    rng = np.random.default_rng(seed)
    block = StepBlock(num_items // num_envs + N_STEP - 1, N_STEP - 1)
    obs, _ = envs.reset(seed=seed)
    while not block.full:
        action = rng.integers(0, 2, num_envs)
        step = step_vector(envs, action)
        block.add(obs, action, step, {"q_taken": np.zeros(num_envs, np.float32)})
        obs = step.obs
    envs.close()
    fields, priorities = build_transitions(block, net, GAMMA, N_STEP, "cpu")
    chunk = TrajectoryChunk(
        TABLE, seed, 1, 0, 0, num_items, priorities.astype(np.float64), fields
    )  # env steps: one a transition
    return [bytes(frame) for frame in encode(chunk)]


def read_frames(path: Path) -> list[bytes]:
    return msgpack.unpackb(path.read_bytes())


def client_keys(keys_dir: str, role: str) -> auth.ClientKeys | None:
    """The ``role`` client's keys for the replay server (None without ``--curve``)."""
    return auth.client_keys(NetConfig(keys_dir=keys_dir), role, "replay")


def run_inserter(addr: str, frames_path: Path, window: int, keys_dir: str) -> None:
    """Send one chunk's frames again and again, ``window`` in flight, until SIGTERM."""
    frames = read_frames(frames_path)
    ctx = sockets.make_context()
    sock = sockets.connect(ctx, zmq.DEALER, addr, curve=client_keys(keys_dir, "actor"))
    numbers = itertools.count()
    try:
        for _ in range(window):
            sock.send_multipart(renumbered(frames, next(numbers)))
        for num_acks in itertools.count():
            if not sock.poll(10_000):
                raise RuntimeError("no reply from replay for 10 s")
            reply = sock.recv_multipart(copy=False)
            if num_acks % 256 == 0:  # decode a sample of the replies: the client must stay cheap
                ack = decode(reply)
                if not isinstance(ack, InsertAck):
                    raise RuntimeError(f"replay answered a chunk with {ack!r}")
            sock.send_multipart(renumbered(frames, next(numbers)))
    finally:
        ctx.destroy(linger=0)


def run_pusher(addr: str, frames_path: Path, keys_dir: str) -> None:
    """Send one chunk's frames over PUSH as fast as the socket takes them, until SIGTERM."""
    frames = read_frames(frames_path)
    ctx = sockets.make_context()
    sock = sockets.connect(ctx, zmq.PUSH, addr, curve=client_keys(keys_dir, "actor"))
    try:
        while True:
            sock.send_multipart(frames)
    finally:
        ctx.destroy(linger=0)


def run_puller(addr: str, warmup_s: float, seconds: float, out: Path, keys_dir: str) -> None:
    """Receive multipart messages on PULL; write the messages/s over the window to ``out``."""
    ctx = sockets.make_context()
    curve = auth.server_keys(NetConfig(replay_addr=addr, keys_dir=keys_dir), "replay")
    sock = sockets.bind(ctx, zmq.PULL, addr, curve=curve)
    try:
        count, started, t0 = 0, None, 0.0
        count0 = 0
        while True:
            if not sock.poll(20_000):
                raise RuntimeError("no message from the pushers for 20 s")
            sock.recv_multipart(copy=False)
            count += 1
            now = time.perf_counter()
            if started is None:
                started = now
            elif t0 == 0.0 and now - started >= warmup_s:
                t0, count0 = now, count
            elif t0 and now - t0 >= seconds:
                out.write_text(json.dumps({"messages_per_s": (count - count0) / (now - t0)}))
                return
    finally:
        ctx.destroy(linger=0)


def run_sampler(addr: str, batch_size: int, prefetch: int, keys_dir: str) -> None:
    """Ask for batches (``prefetch`` in flight) and send a ``PriorityUpdate`` for each."""
    rng = np.random.default_rng(0)
    ctx = sockets.make_context()
    sock = sockets.connect(ctx, zmq.DEALER, addr, curve=client_keys(keys_dir, "learner"))
    try:
        for _ in range(prefetch):
            sockets.send(sock, SampleRequest(TABLE, batch_size))
        while True:
            batch = sockets.recv(sock, timeout_ms=30_000)
            if not isinstance(batch, SampleBatch):
                raise RuntimeError(f"replay answered a SampleRequest with {batch!r}")
            sockets.send(sock, SampleRequest(TABLE, batch_size))
            priorities = rng.random(batch.keys.shape[0]) + 0.01
            sockets.send(sock, PriorityUpdate(TABLE, 0, batch.keys, priorities))
    finally:
        ctx.destroy(linger=0)


# --- the benchmark ------------------------------------------------------------------------------


class Processes:
    """Processes this benchmark started; ``stop`` ends every one of them (TERM, then KILL)."""

    def __init__(self, workdir: Path, keys_dir: str = "") -> None:
        self.workdir, self.procs = workdir, []
        self.keys_dir = keys_dir  # the run's CURVE keys with --curve, else ""

    def start(self, args: list[str], log_name: str) -> subprocess.Popen:
        log = (self.workdir / log_name).open("wb")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def client(self, *args: str, log_name: str) -> subprocess.Popen:
        keys = ["--keys", self.keys_dir] if self.keys_dir else []
        return self.start([sys.executable, __file__, *keys, "--role", *args], log_name)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


def frames_path(procs: Processes, num_items: int, client: int) -> Path:
    """A file with the frames of client ``client``'s chunk (made on first use; one seed each)."""
    path = procs.workdir / f"chunk_{num_items}_{client}.msgpack"
    if not path.exists():
        path.write_bytes(msgpack.packb(cartpole_chunk_frames(num_items, client)))
    return path


def stats(sock: zmq.Socket, timeout_ms: int = 10_000) -> tuple[dict[str, float], float]:
    sockets.send(sock, StatsRequest())
    reply = sockets.recv(sock, timeout_ms=timeout_ms)
    if not isinstance(reply, Stats):
        raise RuntimeError(f"replay answered StatsRequest with {reply!r}")
    return reply.values, time.perf_counter()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds that process ``pid`` has used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_replay(
    procs: Processes,
    args: argparse.Namespace,
    num_items: int,
    sample: bool,
    config: Path = CONFIG,
    num_envs: int | None = None,
    chunk_paths: list[Path] | None = None,
    overrides: tuple[str, ...] = (),
    name: str = "",
) -> dict[str, float]:
    """Inserted transitions/s (and sampled batches/s) of a fresh replay server process of
    ``config``, its clients sending chunks of ``num_items`` items from ``num_envs`` envs
    (``chunk_paths``: client i sends the chunk in file i; default: CartPole chunks). The server
    keeps no snapshots and no chunk log unless ``overrides`` (``key=value``, applied last) say
    otherwise; ``name`` tells its run directory and logs apart."""
    addr = free_addr()
    run_dir = procs.workdir / f"replay_{num_items}_{int(sample)}{name}"
    num_envs = num_envs or num_envs_of(num_items)
    server = procs.start(
        [sys.executable, "-m", "apexrl", "replay", "--config", str(config), "--bind", addr,
         "--run-dir", str(run_dir), "--set", "replay.samples_per_insert=0",
         "--set", "replay.snapshot_interval_s=0", "--set", "replay.durable=false",
         "--set", f"replay.capacity={args.capacity}",
         "--set", f"replay.min_size_to_sample={args.batch_size}",
         # The server takes chunks of the size the config's actors send, and batches of its
         # learners' size: describe the clients below.
         "--set", f"env.num_envs={num_envs}",
         "--set", f"actor.chunk_steps={num_items // num_envs}",
         "--set", f"actor.num_actors={max(args.clients, 1)}",
         "--set", f"learner.batch_size={args.batch_size}",
         *[a for o in overrides for a in ("--set", o)],
         *(["--keys", procs.keys_dir] if procs.keys_dir else [])],
        f"replay_{num_items}_{int(sample)}{name}.log",
    )  # fmt: skip
    if chunk_paths is None:
        chunk_paths = [frames_path(procs, num_items, i) for i in range(args.clients)]
    ctx = sockets.make_context()
    try:
        sock = sockets.connect(ctx, zmq.DEALER, addr, curve=client_keys(procs.keys_dir, "learner"))
        stats(sock, timeout_ms=120_000)  # the server answers (its start may be slow under load)
        for i in range(args.clients):
            procs.client("insert", addr, str(chunk_paths[i]), str(args.window),
                         log_name=f"insert_{num_items}_{i}{name}.log")  # fmt: skip
        deadline = time.monotonic() + 60
        while stats(sock)[0]["replay/num_inserted"] < args.batch_size:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no inserts within 60 s; logs in {procs.workdir}")
            time.sleep(0.1)
        if sample:
            procs.client("sample", addr, str(args.batch_size), str(args.prefetch),
                         log_name=f"sample_{num_items}.log")  # fmt: skip
            while stats(sock)[0]["replay/num_sampled"] == 0:
                if time.monotonic() > deadline + 60:
                    raise RuntimeError(f"no batches within 60 s; logs in {procs.workdir}")
                time.sleep(0.1)
        time.sleep(min(2.0, args.seconds / 2))  # warm-up
        v0, t0 = stats(sock)
        cpu0 = cpu_seconds(server.pid)
        time.sleep(args.seconds)
        v1, t1 = stats(sock)
        cpu1 = cpu_seconds(server.pid)
        if any(p.poll() is not None for p in procs.procs):
            raise RuntimeError(f"a process exited while being measured; logs in {procs.workdir}")
    finally:
        ctx.destroy(linger=0)
        procs.stop()
    elapsed = t1 - t0
    inserted = v1["replay/num_inserted"] - v0["replay/num_inserted"]
    return {
        "inserts_per_s": inserted / elapsed,
        "cpu": (cpu1 - cpu0) / elapsed,
        "inserts_per_cpu_s": inserted / max(cpu1 - cpu0, 1e-9),
        "batches_per_s": (v1["replay/num_sampled"] - v0["replay/num_sampled"])
        / args.batch_size
        / elapsed,
        "rejected": v1["replay/rejected_messages"],
        "log_bytes_per_s": (v1.get("replay/log_bytes", 0) - v0.get("replay/log_bytes", 0))
        / elapsed,
    }


def measure_push_pull(procs: Processes, args: argparse.Namespace, num_items: int) -> float:
    """Messages/s that one PULL process receives from ``--clients`` PUSH processes."""
    addr, out = free_addr(), procs.workdir / f"pull_{num_items}.json"
    try:
        puller = procs.client("pull", addr, str(min(2.0, args.seconds / 2)), str(args.seconds),
                              str(out), log_name=f"pull_{num_items}.log")  # fmt: skip
        for i in range(args.clients):
            procs.client("push", addr, str(frames_path(procs, num_items, i)),
                         log_name=f"push_{num_items}_{i}.log")  # fmt: skip
        puller.wait(timeout=args.seconds + 120)
        if puller.returncode != 0:
            raise RuntimeError(f"the PULL process failed; see {procs.workdir}")
    finally:
        procs.stop()
    return json.loads(out.read_text())["messages_per_s"]


def run_client(role: list[str], keys_dir: str) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    kind, addr, *rest = role
    if kind == "insert":
        run_inserter(addr, Path(rest[0]), int(rest[1]), keys_dir)
    elif kind == "push":
        run_pusher(addr, Path(rest[0]), keys_dir)
    elif kind == "pull":
        run_puller(addr, float(rest[0]), float(rest[1]), Path(rest[2]), keys_dir)
    elif kind == "sample":
        run_sampler(addr, int(rest[0]), int(rest[1]), keys_dir)
    else:
        raise SystemExit(f"unknown client role {kind!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measuring window per figure")
    parser.add_argument(
        "--chunks", type=int, nargs="+", default=[64, 256, 512, 4096], help="items a chunk"
    )
    parser.add_argument("--clients", type=int, default=4, help="concurrent insert processes")
    parser.add_argument("--window", type=int, default=8, help="chunks in flight per client")
    parser.add_argument("--batch-size", type=int, default=512, help="items per sampled batch")
    parser.add_argument("--prefetch", type=int, default=4, help="sample requests in flight")
    parser.add_argument("--capacity", type=int, default=2_000_000, help="replay capacity, items")
    parser.add_argument(
        "--curve", action="store_true", help="CURVE authentication and encryption on every link"
    )
    parser.add_argument("--keys", default="", help=argparse.SUPPRESS)
    parser.add_argument("--role", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        run_client(args.role, args.keys)
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="apexrl-bench-replay-"))
    keys_dir = ""
    if args.curve:
        keys_dir = str(workdir / "keys")
        auth.make_keys(Path(keys_dir))
    procs = Processes(workdir, keys_dir)
    print(
        f"Replay server throughput, CartPole n-step transitions, {args.clients} client processes "
        f"({args.window} chunks in flight each), {args.seconds:g} s per figure, CURVE "
        f"{'on' if args.curve else 'off'}, load average {os.getloadavg()[0]:.1f} at start "
        f"(logs in {workdir})"
    )
    print(
        f"{'chunk':>6} {'B/item':>6} {'push/pull items/s':>18} {'MB/s':>6} "
        f"{'replay items/s':>15} {'MB/s':>6} {'ratio':>6} {'cpu':>5} {'items/cpu-s':>12} "
        f"{'items/s w/ sampling':>20} {'batches/s':>10} {'cpu':>5}",
        flush=True,
    )
    try:
        for num_items in args.chunks:
            wire_bytes = sum(len(f) for f in read_frames(frames_path(procs, num_items, 0)))
            item_bytes = wire_bytes / num_items
            baseline = measure_push_pull(procs, args, num_items) * num_items
            inserts = measure_replay(procs, args, num_items, sample=False)
            sampling = measure_replay(procs, args, num_items, sample=True)
            rate = inserts["inserts_per_s"]
            print(
                f"{num_items:>6} {item_bytes:>6.1f} "
                f"{baseline:>18.0f} {baseline * item_bytes / 1e6:>6.1f} "
                f"{rate:>15.0f} {rate * item_bytes / 1e6:>6.1f} {rate / baseline:>6.2f} "
                f"{inserts['cpu']:>5.2f} {inserts['inserts_per_cpu_s']:>12.0f} "
                f"{sampling['inserts_per_s']:>20.0f} {sampling['batches_per_s']:>10.1f} "
                f"{sampling['cpu']:>5.2f}",
                flush=True,
            )
    finally:
        procs.stop()
    print(
        f"(sampled batches of {args.batch_size}, {args.prefetch} requests in flight, each "
        "answered with a PriorityUpdate; MB = 10^6 bytes on the wire; cpu = cores the replay "
        f"server used; load average {os.getloadavg()[0]:.1f} at the end)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

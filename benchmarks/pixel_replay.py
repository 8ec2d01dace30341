"""Replay at pixel rates: Pong transitions on the wire, in replay's memory, and through one replay
server, stacked frames sent and stored once against whole stacks (``replay.store_frames_once:
false``), both measured in the same run.

Chunks are real: ``configs/apex_dqn_pong.yaml``'s actor (16 envs of ale-py's vector env, the
Ape-X actor core with its Nature CNN, ``acting.chunks.make_chunk``), 64 steps of every env a
chunk (1,024 n-step transitions), after ``--warmup-steps`` random steps so the frames are those
of games under way. Each chunk is encoded both ways (LZ4 on, as actors send it).

1. wire: bytes per transition as sent, and the actor's CPU to pack a chunk's frames;
2. memory: one ``apexrl replay`` process of the Pong config (its capacity just above ``--fill``:
   whole stacks of the config's 1 M transitions would need 56 GB) filled to ``--fill`` transitions
   (the chunks sent in turn, each insert acknowledged): the growth of its resident memory per
   stored transition (``/proc/<pid>/status`` VmRSS, full minus empty);
3. throughput: ``--clients`` insert processes (``--window`` chunks in flight each) and one
   sampler (batches of ``--batch-size``, ``--prefetch`` in flight, each answered with a
   ``PriorityUpdate``) against one replay server process, which runs on one core; its inserted
   transitions/s, batches/s and the share of a core it used (``replay_throughput.py``'s
   harness).

    python benchmarks/pixel_replay.py [--fill 100000] [--seconds 10] [--clients 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
import torch
import zmq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import replay_throughput as rt  # noqa: E402
from harness import as_actor, free_addr, renumbered, start, stop  # noqa: E402

from apexrl.acting.chunks import make_chunk  # noqa: E402
from apexrl.acting.startup import make_envs_and_network  # noqa: E402
from apexrl.acting.step_block import StepBlock  # noqa: E402
from apexrl.config import load_config  # noqa: E402
from apexrl.envs import step_vector  # noqa: E402
from apexrl.transport import sockets  # noqa: E402
from apexrl.transport.codec import encode  # noqa: E402
from apexrl.transport.frames import config_frame_layout, pack_frames  # noqa: E402
from apexrl.transport.messages import InsertAck, StatsRequest  # noqa: E402

CONFIG = REPO / "configs" / "apex_dqn_pong.yaml"
NUM_ENVS, CHUNK_STEPS = 16, 64
SHAPE = [f"env.num_envs={NUM_ENVS}", f"actor.chunk_steps={CHUNK_STEPS}", "actor.num_actors=1"]
MODES = {"stacks": "replay.store_frames_once=false", "frames once": "replay.store_frames_once=true"}


def pong_chunks(num_chunks: int, warmup_steps: int, seed: int = 0):
    """``num_chunks`` Ape-X chunks of Pong cut by the actor's code: per mode, the encoded chunks;
    and the actor's milliseconds to pack one chunk's frames."""
    cfg = load_config(CONFIG, SHAPE)
    torch.set_num_threads(1)
    envs, algorithm, net = make_envs_and_network(cfg, NUM_ENVS, "cpu")
    core = algorithm.actor_core(net, cfg, 0, False, "cpu", np.random.default_rng(seed))
    block = StepBlock(core.block_steps, core.block_overlap)
    rng = np.random.default_rng(seed)
    obs, _ = envs.reset(seed=seed)
    for _ in range(warmup_steps):
        obs = step_vector(envs, rng.integers(0, envs.single_action_space.n, NUM_ENVS)).obs
    items = []
    while len(items) < num_chunks:
        action, extras = core.act(obs)
        step = step_vector(envs, action)
        core.observe(action, step)
        block.add(obs, action, step, {**extras, "weights_version": np.zeros(NUM_ENVS, np.int64)})
        if block.full:
            items.append(core.items(block))
            block.keep_overlap()
        obs = step.obs
    envs.close()
    encoded = {}
    for mode, override in MODES.items():
        mode_cfg = load_config(CONFIG, [*SHAPE, override])
        encoded[mode] = [
            [bytes(f) for f in encode(make_chunk(mode_cfg, 0, 1, n, 0, NUM_ENVS * CHUNK_STEPS, *i))]
            for n, i in enumerate(items)
        ]
    layout = config_frame_layout(cfg, {k: (a.dtype, a.shape[1:]) for k, a in items[0][0].items()})
    started = time.process_time()
    for fields, _ in items:
        pack_frames(fields, layout)
    pack_ms = (time.process_time() - started) / len(items) * 1e3
    return encoded, pack_ms


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def fill_memory(workdir: Path, mode: str, chunks: list[list[bytes]], fill: int) -> dict:
    """Resident bytes per stored transition of a replay server filled to ``fill`` transitions."""
    addr = free_addr()
    server = start(
        ["replay", "--config", str(CONFIG), "--bind", addr, "--run-dir", str(workdir / mode),
         "--set", MODES[mode], "--set", "replay.snapshot_interval_s=0",
         "--set", "replay.durable=false",
         "--set", f"replay.capacity={fill + 2 * NUM_ENVS * CHUNK_STEPS}",
         "--set", "replay.samples_per_insert=0",  # no learner: nothing holds inserts back
         *[a for s in SHAPE for a in ("--set", s)]],
        workdir / f"fill_{mode.replace(' ', '_')}.log",
    )  # fmt: skip
    ctx = sockets.make_context()
    try:
        sock = sockets.connect(ctx, zmq.DEALER, addr)
        sockets.send(sock, StatsRequest())
        if sockets.recv(sock, timeout_ms=120_000) is None:
            raise RuntimeError(f"replay did not answer; see {workdir}")
        time.sleep(1.0)
        empty = rss_bytes(server.pid)
        inserted, size = 0, 0
        while size < fill:
            sock.send_multipart(renumbered(chunks[inserted % len(chunks)], inserted))
            ack = sockets.recv(sock, timeout_ms=60_000)
            if not isinstance(ack, InsertAck):
                raise RuntimeError(f"replay answered a chunk with {ack!r}")
            inserted, size = inserted + 1, ack.table_size
        full = rss_bytes(server.pid)
    finally:
        ctx.destroy(linger=0)
        stop([server])
    return {"size": size, "empty": empty, "full": full, "per_item": (full - empty) / size}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=4, help="distinct chunks to send in turn")
    parser.add_argument("--warmup-steps", type=int, default=300)
    parser.add_argument("--fill", type=int, default=100_000, help="transitions, memory figure")
    parser.add_argument("--seconds", type=float, default=10.0, help="measuring window")
    parser.add_argument("--clients", type=int, default=2, help="insert processes")
    parser.add_argument("--window", type=int, default=2, help="chunks in flight per client")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument("--capacity", type=int, default=200_000, help="throughput runs' capacity")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="apexrl-bench-pixel-replay-"))
    print(
        f"Pong transitions through replay ({NUM_ENVS} envs x {CHUNK_STEPS} steps a chunk = "
        f"{NUM_ENVS * CHUNK_STEPS} transitions), load average {os.getloadavg()[0]:.1f} at start "
        f"(logs in {workdir})",
        flush=True,
    )
    encoded, pack_ms = pong_chunks(args.chunks, args.warmup_steps)
    items = NUM_ENVS * CHUNK_STEPS
    print(
        f"\n1. wire (LZ4 on), mean of {args.chunks} chunks; packing a chunk's frames: "
        f"{pack_ms:.1f} ms of actor CPU"
    )
    wire = {m: np.mean([sum(map(len, c)) for c in chunks]) / items for m, chunks in encoded.items()}
    for mode, per_item in wire.items():
        print(f"  {mode:<12} {per_item:>9.0f} bytes/transition")
    print(f"  ratio        {wire['stacks'] / wire['frames once']:>9.1f} x fewer bytes")
    print(f"\n2. replay memory, filled to {args.fill} transitions (resident, full minus empty)")
    memory = {m: fill_memory(workdir, m, encoded[m], args.fill) for m in MODES}
    for mode, m in memory.items():
        print(
            f"  {mode:<12} {m['per_item']:>9.0f} bytes/transition ({m['size']} stored, "
            f"{m['empty'] / 2**20:.0f} -> {m['full'] / 2**20:.0f} MiB); 1 M transitions: "
            f"{m['per_item'] * 1e6 / 2**30:.1f} GiB"
        )
    print(f"\n3. throughput, {args.clients} insert processes, batches of {args.batch_size}")
    procs = rt.Processes(workdir)
    paths = []
    for mode, chunks in encoded.items():
        for i in range(args.clients):
            path = workdir / f"chunk_{mode.replace(' ', '_')}_{i}.msgpack"
            path.write_bytes(msgpack.packb(as_actor(chunks[i % len(chunks)], i)))
            paths.append(path)
    try:
        for k, mode in enumerate(MODES):
            mode_paths = paths[k * args.clients : (k + 1) * args.clients]
            rates = {}
            for sample in (False, True):
                config = workdir / f"pong_{k}.yaml"
                config.write_text(CONFIG.read_text())
                rates[sample] = rt.measure_replay(
                    procs, args, items, sample, config=_with(config, MODES[mode]),
                    num_envs=NUM_ENVS, chunk_paths=mode_paths,
                )  # fmt: skip
            alone, sampled = rates[False], rates[True]
            print(
                f"  {mode:<12} inserts only {alone['inserts_per_s']:>8.0f}/s "
                f"(cpu {alone['cpu']:.2f}); with sampling {sampled['inserts_per_s']:>8.0f}/s "
                f"and {sampled['batches_per_s']:5.1f} batches/s (cpu {sampled['cpu']:.2f})",
                flush=True,
            )
    finally:
        procs.stop()
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    return 0


def _with(config: Path, override: str) -> Path:
    """``config`` rewritten with ``override`` (``replay.key=value``) set in its replay section."""
    key, value = override.split("=")
    name = key.split(".")[1]
    lines = [
        f"  {name}: {value}" if line.startswith(f"  {name}:") else line
        for line in config.read_text().splitlines()
    ]
    config.write_text("\n".join(lines) + "\n")
    return config


if __name__ == "__main__":
    sys.exit(main())

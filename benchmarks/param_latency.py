"""Weight-publish latency: from the learner's publish to the last of 32 actors holding the version.

Real processes on loopback: one parameter server (``apexrl params``) per measurement, a publisher
in this process that sends ``PublishParams`` exactly as the learner does (``params_to_arrays`` of
the network, no compression), and ``--clients`` actor stand-ins spread over ``--procs`` client
processes (each process holds ``clients / procs`` DEALER sockets, each with its own network and an
``apexrl.clients.params.ParamsClient``). A client counts as holding a version once
``ParamsClient.poll`` has decoded the weights and loaded them into its network.

Two transports, measured one after the other in the same run:

* ``tcp``: every client gets the weights over its socket (``ParamsClient(shm_dir=None)``), as an
  actor on another host does.
* ``shm``: the clients offer to read shared memory (the actor's default); the server answers with
  the name of the file it wrote once at publish, and each client maps and decodes that file. The
  ``shm %`` column is the share of loads that came from shared memory.

Three polling variants per model:

* ``actor``: the actor's schedule. ``ParamsClient.request`` every ``actor.params_poll_steps`` env
  steps of the model's config, the time between requests taken from the step rate of one actor's
  loop measured here first (the config's vector env, batched inference, epsilon-greedy, env
  step), each client at a random phase, reading a reply as soon as it comes.
* ``block``: the actor's schedule as above, and each client reads its socket only at its block
  ends, every ``actor.chunk_steps`` vector steps, as actors did before they read the parameter
  server's socket every step (``apexrl/actor.py`` now does, so ``actor`` is the row of today's
  actors); the ``read ms`` column is that period.
* ``fast``: a new request as soon as the previous reply is handled, which isolates the server's
  and the wire's latency. ``fast x1`` over TCP (one client) is the baseline the other rows are
  divided by.

Each model is its config's network, and its parameter server runs that config (the server
refuses a publish that is not exactly the network its config builds): ``mlp`` is
``configs/apex_dqn_cartpole.yaml`` (CartPole MLP), ``cnn`` is ``configs/apex_dqn_pong.yaml``
(the dueling Nature CNN of ``ALE/Pong-v5`` with ale-py's preprocessing, obs uint8 [4, 84, 84], 6
actions).

The ``load`` column is the host's 1-minute load average at the end of each row: on a shared
machine it says what else ran meanwhile (this benchmark itself adds about ``--procs`` + 2).
``srv usr`` and ``srv sys`` are the parameter server's user and system CPU milliseconds per
publish while the clients got that row's versions (its ZeroMQ I/O thread included): a server
that copied the weights once per actor would show it in ``srv usr``, whereas the kernel's copy
into each TCP connection shows in ``srv sys``.

Every latency is ``time.time()`` at the client minus ``time.time()`` at the publisher just before
``params_to_arrays`` (one machine, one clock). A client that skips a version (it was slow and got
a newer one) counts as holding the older version at that moment.

    python benchmarks/param_latency.py [--publishes 60] [--publish-interval-s 0.5] [--clients 32]
                                       [--procs 4] [--models mlp cnn] [--variants fast actor block]

The script uses only ``apexrl``'s public client and server, so it also measures an older
checkout: run it with that checkout first on ``PYTHONPATH`` and as the working directory.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import zmq
from harness import free_addr, start, stop

from apexrl.algos import load_algorithm
from apexrl.clients.params import ParamsClient
from apexrl.config import Config, load_config
from apexrl.envs import make_vector_env, step_vector
from apexrl.math import targets
from apexrl.models import params_to_arrays
from apexrl.transport import shm, sockets
from apexrl.transport.messages import PublishAck, PublishParams

REPO = Path(__file__).resolve().parents[1]
CONFIGS = {
    "mlp": REPO / "configs" / "apex_dqn_cartpole.yaml",
    "cnn": REPO / "configs" / "apex_dqn_pong.yaml",
}
NO_COMPRESSION = 1 << 62  # as the learner publishes: float weights are sent raw


def model_spaces(cfg: Config) -> tuple:
    """The observation and action spaces of one env of ``cfg``."""
    envs = make_vector_env(cfg.env, 1, cfg.unit_actions)
    spaces = envs.single_observation_space, envs.single_action_space
    envs.close()
    return spaces


def build_net(cfg: Config, spaces: tuple) -> torch.nn.Module:
    """The network an actor of ``cfg`` builds (the Pong config: the dueling Nature CNN)."""
    return load_algorithm(cfg.algorithm).make_network(*spaces, cfg).eval()


def actor_steps_per_s(cfg: Config, seconds: float = 2.0) -> float:
    """Env steps/s of one actor's loop (the config's vector env, batched inference,
    epsilon-greedy, env step) on this machine."""
    torch.set_num_threads(cfg.actor.torch_threads)
    num_envs, rng = cfg.env.num_envs, np.random.default_rng(0)
    envs = make_vector_env(cfg.env, num_envs, cfg.unit_actions)
    net = build_net(cfg, (envs.single_observation_space, envs.single_action_space))
    obs = envs.reset(seed=0)[0]
    steps, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        with torch.inference_mode():
            q = net(torch.as_tensor(obs)).q.numpy()
        obs = step_vector(envs, targets.epsilon_greedy(q, 0.1, rng)).obs
        steps += num_envs
    envs.close()
    return steps / (time.perf_counter() - started)


# ---------------------------------------------------------------- client process


def due(times: list[float], interval_s: float, now: float) -> list[int]:
    """The indices of ``times`` that have come, each moved on to its next multiple of
    ``interval_s``."""
    come = [i for i, t in enumerate(times) if now >= t]
    for i in come:
        times[i] += interval_s * max(1, int((now - times[i]) / interval_s))
    return come


def run_clients(args: argparse.Namespace) -> int:
    """One client process: ``args.num_sockets`` ParamsClients until each holds ``args.last``.

    With ``args.read_interval_s`` each client reads its socket only at its own block ends, as
    an actor does; without, a client reads a reply as soon as it comes."""
    torch.set_num_threads(1)
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
    rng = np.random.default_rng(os.getpid())
    cfg = load_config(CONFIGS[args.model])
    spaces = model_spaces(cfg)
    ctx = sockets.make_context()
    socks = [sockets.connect(ctx, zmq.DEALER, args.addr) for _ in range(args.num_sockets)]
    shm_dir = shm.SHM_DIR if args.transport == "shm" else None
    clients = [
        ParamsClient(s, build_net(cfg, spaces), timeout_s=30.0, shm_dir=shm_dir) for s in socks
    ]
    held: list[list[tuple[int, float]]] = [[] for _ in clients]  # (version, time.time())

    def note(i: int) -> None:
        """Record client ``i``'s version when it loaded a new one (in ``poll`` or ``request``)."""
        version = clients[i].version
        if version >= 0 and (not held[i] or held[i][-1][0] != version):
            held[i].append((version, time.time()))

    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    interval, read_interval = args.poll_interval_s, args.read_interval_s
    next_request = [time.monotonic() + rng.uniform(0, interval) for _ in clients]
    next_read = [time.monotonic() + rng.uniform(0, read_interval) for _ in clients]
    for c in clients:
        c.request()
    deadline = time.monotonic() + args.deadline_s
    ready_written = False
    try:
        while not stopped and time.monotonic() < deadline:
            if all(c.version == args.last for c in clients):
                break
            now = time.monotonic()
            for i in due(next_request, interval, now) if interval > 0 else []:
                clients[i].request()  # reads a waiting answer first
                note(i)
            if read_interval > 0:
                readable = due(next_read, read_interval, now)
            else:
                wait_s = min(next_request) - time.monotonic() if interval > 0 else 0.1
                ready = dict(poller.poll(int(min(max(wait_s, 0.0), 0.1) * 1000)))
                readable = [i for i, s in enumerate(socks) if s in ready]
            for i in readable:
                clients[i].poll()
                note(i)
                if interval == 0:
                    clients[i].request()
                    note(i)
            if read_interval > 0:  # asleep until the next request or block end
                wait_s = min(*next_request, *next_read) - time.monotonic()
                time.sleep(min(max(wait_s, 0.0), 0.1))
            if not ready_written and all(c.version >= 0 for c in clients):
                Path(args.out + ".ready").touch()
                ready_written = True
    finally:
        result = {
            "held": held,
            "loads": sum(len(h) for h in held),
            "shm_loads": sum(c.num_loaded_shm for c in clients),
            "shm_fallbacks": sum(c.num_shm_fallbacks for c in clients),
        }
        Path(args.out).write_text(json.dumps(result))
        for s in socks:
            s.close(linger=0)
        ctx.term()
    return 0


# ---------------------------------------------------------------- publisher and measurement

VARIANTS = ("fast", "actor", "block")


class Schedule(NamedTuple):
    """When a client asks (``poll_interval_s``; 0: again at once) and reads its socket
    (``read_interval_s``; 0: as soon as a reply comes)."""

    variant: str
    poll_interval_s: float
    read_interval_s: float


def schedule(cfg: Config, variant: str, steps_per_s: float) -> Schedule:
    """A variant's schedule for an actor of ``cfg`` that runs ``steps_per_s`` env steps/s."""
    if variant == "fast":
        return Schedule(variant, 0.0, 0.0)
    poll_s = cfg.actor.params_poll_steps / steps_per_s
    block_s = cfg.actor.chunk_steps * cfg.env.num_envs / steps_per_s
    return Schedule(variant, poll_s, block_s if variant == "block" else 0.0)


def cpu_s(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


def publish(sock: zmq.Socket, net: torch.nn.Module, version: int) -> float:
    """Send one version as the learner does; the publish time and wait for the server's ack."""
    t_publish = time.time()
    sockets.send(
        sock, PublishParams(version, 0, params_to_arrays(net)), compress_min_bytes=NO_COMPRESSION
    )
    reply = sockets.recv(sock, timeout_ms=30_000)
    if not isinstance(reply, PublishAck):
        raise RuntimeError(f"parameter server did not acknowledge version {version}: {reply!r}")
    return t_publish


def measure(
    model: str,
    num_clients: int,
    procs: int,
    schedule: Schedule,
    transport: str,
    args: argparse.Namespace,
    workdir: Path,
    tag: str,
) -> dict:
    addr = free_addr()
    config = CONFIGS[model]
    server = start(
        ["params", "--config", str(config), "--bind", addr, "--run-dir", str(workdir / tag)],
        workdir / f"params_{tag}.log",
    )
    procs = min(procs, num_clients)
    per_proc = [num_clients // procs + (i < num_clients % procs) for i in range(procs)]
    last = args.publishes
    outs = [workdir / f"client_{tag}_{i}.json" for i in range(procs)]
    clients: list[subprocess.Popen] = []
    ctx = sockets.make_context()
    sock = sockets.connect(ctx, zmq.DEALER, addr)
    cfg = load_config(config)
    net = build_net(cfg, model_spaces(cfg))
    rng = np.random.default_rng(1)
    published: dict[int, float] = {}
    try:
        publish(sock, net, 0)
        deadline_s = 120 + args.publishes * args.publish_interval_s * 3
        for i, n in enumerate(per_proc):
            clients.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--client",
                        "--addr",
                        addr,
                        "--model",
                        model,
                        "--num-sockets",
                        str(n),
                        "--poll-interval-s",
                        str(schedule.poll_interval_s),
                        "--read-interval-s",
                        str(schedule.read_interval_s),
                        "--last",
                        str(last),
                        "--out",
                        str(outs[i]),
                        "--deadline-s",
                        str(deadline_s),
                        "--transport",
                        transport,
                    ],
                    stdout=(workdir / f"client_{tag}_{i}.log").open("wb"),
                    stderr=subprocess.STDOUT,
                )
            )
        wait_until = time.monotonic() + 120
        while not all(Path(str(o) + ".ready").exists() for o in outs):
            if time.monotonic() > wait_until or any(c.poll() is not None for c in clients):
                raise RuntimeError(f"clients did not start; see {workdir}")
            time.sleep(0.1)
        cpu_before = cpu_s(server.pid)
        for version in range(1, last + 1):
            time.sleep(args.publish_interval_s * rng.uniform(0.5, 1.5))
            with torch.no_grad():  # new weights, as after an update
                next(net.parameters()).add_(1e-3)
            published[version] = publish(sock, net, version)
        for c in clients:
            c.wait(timeout=60 + 3 * schedule.poll_interval_s)
        cpu_after = cpu_s(server.pid)
        server_cpu = [(a - b) / last * 1000 for a, b in zip(cpu_after, cpu_before, strict=True)]
    finally:
        sock.close(linger=0)
        ctx.term()
        stop([*clients, server])
    results = [json.loads(o.read_text()) for o in outs]
    held = [h for r in results for h in r["held"]]
    num_loads = sum(r["loads"] for r in results)
    per_client = []  # [num_clients, publishes]: first time each client held >= v, minus publish
    for records in held:
        versions = np.array([v for v, _ in records])
        times = np.array([t for _, t in records])
        row = []
        for version, t_pub in published.items():
            later = np.flatnonzero(versions >= version)
            row.append(times[later[0]] - t_pub if later.size else np.nan)
        per_client.append(row)
    lat = np.array(per_client) * 1000.0  # ms
    last_ms = lat.max(axis=0)
    return {
        "model": model,
        "transport": transport,
        "shm_share": sum(r["shm_loads"] for r in results) / max(num_loads, 1),
        "shm_fallbacks": sum(r["shm_fallbacks"] for r in results),
        "variant": schedule.variant,
        "clients": num_clients,
        "interval_ms": schedule.poll_interval_s * 1000,
        "read_ms": schedule.read_interval_s * 1000,
        "publishes": len(published),
        "missing": int(np.isnan(lat).sum()),
        "p50_last": float(np.nanpercentile(last_ms, 50)),
        "p99_last": float(np.nanpercentile(last_ms, 99)),
        "p50_each": float(np.nanpercentile(lat, 50)),
        "load": os.getloadavg()[0],
        "server_user_ms": server_cpu[0],
        "server_sys_ms": server_cpu[1],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publishes", type=int, default=60)
    parser.add_argument("--publish-interval-s", type=float, default=0.5)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"], choices=["mlp", "cnn"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--addr", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--num-sockets", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--poll-interval-s", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--read-interval-s", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--last", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--deadline-s", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--transport", choices=["tcp", "shm"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        return run_clients(args)
    workdir = Path(tempfile.mkdtemp(prefix="apexrl-bench-params-"))
    load_before = os.getloadavg()[0]
    rows, rates, cfgs = [], {}, {m: load_config(CONFIGS[m]) for m in args.models}
    for model in args.models:
        cfg = cfgs[model]
        rates[model] = actor_steps_per_s(cfg)
        runs = [(1, schedule(cfg, "fast", rates[model]), "tcp")]
        for variant in args.variants:
            each = schedule(cfg, variant, rates[model])
            runs += [(args.clients, each, "tcp"), (args.clients, each, "shm")]
        for num_clients, each, transport in runs:
            tag = f"{model}_{num_clients}_{each.variant}_{transport}"
            rows.append(
                measure(model, num_clients, args.procs, each, transport, args, workdir, tag)
            )
    print(
        f"\nParameter publish -> last of N actors holding it (ms), {args.publishes} publishes "
        f"each, {args.procs} client processes, poll every actor.params_poll_steps env steps at "
        f"the measured actor rate; apexrl from {Path(sys.modules['apexrl'].__file__).parent}; "
        f"load average {load_before:.1f} before (logs in {workdir})"
    )
    for m in args.models:
        cfg = cfgs[m]
        size = sum(a.nbytes for a in params_to_arrays(build_net(cfg, model_spaces(cfg))).values())
        print(
            f"  {m}: {cfg.env.id}, {size / 4:,.0f} parameters, {size / 2**20:.2f} MiB, actor "
            f"{rates[m]:,.0f} env steps/s ({cfg.env.num_envs} envs), poll every "
            f"{cfg.actor.params_poll_steps} env steps"
        )
    print(
        f"{'model':>5} {'variant':>7} {'clients':>7} {'transport':>9} {'poll ms':>8} "
        f"{'read ms':>7} {'p50 last':>9} {'p99 last':>9} {'p50 each':>9} {'vs fast x1':>10} "
        f"{'shm %':>6} {'fallbk':>6} {'missed':>6} {'load':>5} {'srv usr':>7} {'srv sys':>7}"
    )
    for r in rows:
        base = next(b for b in rows if b["model"] == r["model"] and b["clients"] == 1)
        print(
            f"{r['model']:>5} {r['variant']:>7} {r['clients']:>7} {r['transport']:>9} "
            f"{r['interval_ms']:>8.1f} {r['read_ms']:>7.1f} {r['p50_last']:>9.2f} "
            f"{r['p99_last']:>9.2f} {r['p50_each']:>9.2f} "
            f"{r['p50_last'] / base['p50_last']:>10.2f} {100 * r['shm_share']:>6.0f} "
            f"{r['shm_fallbacks']:>6} {r['missing']:>6} "
            f"{r['load']:>5.1f} {r['server_user_ms']:>7.1f} {r['server_sys_ms']:>7.1f}"
        )
    print("p99 last, shm vs tcp (same run):")
    for r in rows:
        if r["transport"] == "shm":
            tcp = next(
                t
                for t in rows
                if (t["model"], t["variant"], t["clients"], t["transport"])
                == (r["model"], r["variant"], r["clients"], "tcp")
            )
            print(
                f"  {r['model']} {r['variant']} x{r['clients']}: tcp {tcp['p99_last']:.1f} ms, "
                f"shm {r['p99_last']:.1f} ms ({tcp['p99_last'] / r['p99_last']:.2f}x faster)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

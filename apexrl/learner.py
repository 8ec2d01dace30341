"""Learner: pulls prioritized batches from replay, updates the Q-network, sends new priorities back
and publishes weights to the parameter server.

Connects:  DEALER cfg.net.replay_addr (prefetch thread)  out: SampleRequest   in: SampleBatch
           DEALER cfg.net.replay_addr (main thread)      out: PriorityUpdate, StatsRequest, Shutdown
                                                         in: Stats
           DEALER cfg.net.params_addr                    out: PublishParams, Shutdown
                                                         in: PublishAck

A background thread keeps ``learner.prefetch_batches`` sample requests in flight and turns replies
into tensors, so an update does not wait on the network when replay holds data. The learner
decides when the run is over (``run.stop_*``): it then writes a last ``result.json`` line, asks the
servers to shut down (which tells the actors) and exits 0.

Files in the run directory: ``config.yaml`` (resolved config), ``result.json`` (one JSON object per
report), ``checkpoint.pt`` (tensors and numbers only, loaded with ``torch.load(weights_only=True)``)
and ``tb/learner`` (TensorBoard).
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import zmq

from apexrl import lifecycle, targets
from apexrl.algos.apex_dqn import ApexDQN
from apexrl.config import Config, RunConfig, dump_config
from apexrl.envs import make_vector_env
from apexrl.metrics import MetricsWriter, RateMeter, append_result
from apexrl.models import params_to_arrays
from apexrl.transport import sockets
from apexrl.transport.codec import DecodeError
from apexrl.transport.messages import (
    Error,
    PriorityUpdate,
    PublishAck,
    PublishParams,
    SampleBatch,
    SampleRequest,
    Shutdown,
    Stats,
    StatsRequest,
)

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.pt"


class DeviceBatch(NamedTuple):
    keys: np.ndarray  # [B] int64, for the priority update
    fields: dict[str, torch.Tensor]  # item fields on the learner's device
    weights: torch.Tensor  # [B] importance-sampling weights


class BatchPrefetcher:
    """A thread with its own socket that keeps ``depth`` sample requests in flight and queues the
    batches as device tensors. ``peer_shutdown`` is set when replay says the run is over."""

    def __init__(self, ctx: zmq.Context, cfg: Config, device: torch.device) -> None:
        self.ctx, self.cfg, self.device = ctx, cfg, device
        self.batches: queue.Queue[DeviceBatch] = queue.Queue(maxsize=cfg.learner.prefetch_batches)
        self.halt = threading.Event()
        self.peer_shutdown = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="prefetch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.halt.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def _to_device(self, batch: SampleBatch) -> DeviceBatch:
        pin = self.device.type == "cuda"

        def tensor(array: np.ndarray) -> torch.Tensor:
            t = torch.from_numpy(np.array(array))  # decoded arrays are read-only views
            return t.pin_memory().to(self.device, non_blocking=True) if pin else t

        weights = targets.importance_weights(
            np.array(batch.probabilities), batch.table_size, self.cfg.algo.importance_exponent
        )
        return DeviceBatch(
            batch.keys.copy(),
            {k: tensor(v) for k, v in batch.fields.items()},
            weights.to(self.device),
        )

    def _run(self) -> None:
        sock = sockets.connect(self.ctx, zmq.DEALER, self.cfg.net.replay_addr)
        request = SampleRequest(self.cfg.replay.table, self.cfg.learner.batch_size)
        in_flight = 0
        try:
            while not self.halt.is_set():
                while in_flight + self.batches.qsize() < self.batches.maxsize:
                    sockets.send(sock, request)
                    in_flight += 1
                try:
                    msg = sockets.recv(sock, timeout_ms=100)
                except DecodeError as exc:
                    log.warning("bad message from replay: %s", exc)
                    continue
                if isinstance(msg, SampleBatch):
                    in_flight -= 1
                    batch = self._to_device(msg)
                    while not self.halt.is_set():
                        try:
                            self.batches.put(batch, timeout=0.1)
                            break
                        except queue.Full:
                            continue
                elif isinstance(msg, Error):
                    in_flight -= 1
                    log.warning("replay refused a sample request: %s", msg.reason)
                elif isinstance(msg, Shutdown):
                    self.peer_shutdown.set()
                    return
        except BaseException as exc:  # surfaced to the main thread, which stops the learner
            self.error = exc
            raise
        finally:
            sock.close(linger=0)


def stop_reason(
    run: RunConfig,
    env_steps: int,
    elapsed_s: float,
    eval_return_mean: float,
    eval_episodes_in_window: int,
) -> str | None:
    """Why the run should stop now, or None. The evaluation condition needs a full window."""
    if run.stop_eval_return > 0 and eval_episodes_in_window >= run.stop_eval_episodes:
        if eval_return_mean >= run.stop_eval_return:
            return (
                f"mean evaluation return {eval_return_mean:.1f} over the last "
                f"{eval_episodes_in_window} episodes >= {run.stop_eval_return:g}"
            )
    if run.stop_env_steps > 0 and env_steps >= run.stop_env_steps:
        return f"{env_steps} env steps >= {run.stop_env_steps}"
    if run.stop_wall_s > 0 and elapsed_s >= run.stop_wall_s:
        return f"{elapsed_s:.0f} s >= {run.stop_wall_s:g} s"
    return None


def save_checkpoint(path: Path, algo: ApexDQN, counters: dict[str, int]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"algo": algo.state_dict(), "counters": counters}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path, algo: ApexDQN, device: torch.device) -> dict[str, int]:
    """Load a checkpoint written by ``save_checkpoint``; ``weights_only`` refuses anything but
    tensors and plain containers, so a tampered file cannot run code."""
    state = torch.load(path, map_location=device, weights_only=True)
    algo.load_state_dict(state["algo"])
    return {k: int(v) for k, v in state["counters"].items()}


def publish(sock: zmq.Socket, algo: ApexDQN) -> None:
    sockets.send(
        sock,
        PublishParams(algo.num_updates, params_to_arrays(algo.online)),
        compress_min_bytes=1 << 62,
    )


def wait_for_ack(sock: zmq.Socket, stop: threading.Event, addr: str) -> bool:
    started = last_log = time.monotonic()
    while not stop.is_set():
        try:
            msg = sockets.recv(sock, timeout_ms=200)
        except DecodeError as exc:
            log.warning("bad message from the parameter server: %s", exc)
            continue
        if isinstance(msg, PublishAck):
            return True
        if time.monotonic() - last_log > 10.0:
            last_log = time.monotonic()
            log.info("waiting for the parameter server at %s (%.0f s)", addr, last_log - started)
    return False


def main(cfg: Config) -> int:
    """Run the learner until a stop condition, SIGINT/SIGTERM or the servers' ``Shutdown``."""
    stop = lifecycle.install_stop_handlers()
    torch.set_num_threads(cfg.learner.torch_threads)
    torch.manual_seed(cfg.learner.seed)
    device = torch.device(lifecycle.resolve_device(cfg.learner.device))
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    probe = make_vector_env(cfg.env, 1)
    obs_shape = probe.single_observation_space.shape
    num_actions = int(probe.single_action_space.n)
    probe.close()
    algo = ApexDQN(obs_shape, num_actions, cfg.algo, str(device))
    checkpoint_path = run_dir / CHECKPOINT_NAME
    counters = {"num_samples": 0, "elapsed_ms": 0}
    if cfg.run.resume:
        if not checkpoint_path.is_file():
            raise FileNotFoundError(f"run.resume is set but {checkpoint_path} does not exist")
        counters.update(load_checkpoint(checkpoint_path, algo, device))
        log.info("resumed from %s at update %d", checkpoint_path, algo.num_updates)
    writer = MetricsWriter(run_dir / "tb" / "learner")
    writer.text("config", "```\n" + dump_config(cfg) + "\n```")
    ctx = sockets.make_context()
    replay_sock = sockets.connect(ctx, zmq.DEALER, cfg.net.replay_addr)
    params_sock = sockets.connect(ctx, zmq.DEALER, cfg.net.params_addr)
    prefetcher = BatchPrefetcher(ctx, cfg, device)
    updates, samples = RateMeter(), RateMeter()
    started = time.monotonic() - counters["elapsed_ms"] / 1000.0
    last_report = last_stats_request = time.monotonic()
    wait_s = wait_at_report = 0.0
    replay_stats: dict[str, float] = {}
    prev_env_steps, prev_env_time = 0.0, time.monotonic()
    reason: str | None = None
    peers_stopped = False
    linger_ms = 0
    last_metrics: dict[str, float] = {}
    try:
        publish(params_sock, algo)
        if not wait_for_ack(params_sock, stop, cfg.net.params_addr):
            return 0
        log.info("learner on %s: published version %d; waiting for data", device, algo.num_updates)
        prefetcher.start()
        while not stop.is_set() and reason is None:
            if prefetcher.peer_shutdown.is_set():
                peers_stopped = True
                log.info("replay is shutting down; stopping")
                break
            if prefetcher.error is not None:
                raise RuntimeError("the prefetch thread failed") from prefetcher.error
            waited = time.monotonic()
            try:
                batch = prefetcher.batches.get(timeout=0.05)
            except queue.Empty:
                batch = None
            wait_s += time.monotonic() - waited
            if batch is not None:
                result = algo.update(batch.fields, batch.weights)
                last_metrics = result.metrics
                sockets.send(
                    replay_sock, PriorityUpdate(cfg.replay.table, batch.keys, result.priorities)
                )
                updates.add(1)
                samples.add(len(batch.keys))
                counters["num_samples"] += len(batch.keys)
                if algo.num_updates % cfg.learner.publish_period == 0:
                    publish(params_sock, algo)
                if algo.num_updates % cfg.learner.checkpoint_period == 0:
                    save_checkpoint(checkpoint_path, algo, counters)
            # Drain replies without blocking: publish acks and replay stats.
            while drain_one(params_sock) is not None:
                pass
            msg = drain_one(replay_sock)
            if isinstance(msg, Stats):
                replay_stats = msg.values
            elif isinstance(msg, Shutdown):
                peers_stopped = True
                break
            now = time.monotonic()
            if now - last_stats_request >= cfg.learner.report_interval_s / 2:
                last_stats_request = now
                sockets.send(replay_sock, StatsRequest())
            if now - last_report < cfg.learner.report_interval_s or not replay_stats:
                continue
            interval = now - last_report
            last_report = now
            elapsed = now - started
            counters["elapsed_ms"] = int(elapsed * 1000)
            env_steps = replay_stats.get("replay/env_steps", 0.0)
            env_rate = (env_steps - prev_env_steps) / max(now - prev_env_time, 1e-9)
            prev_env_steps, prev_env_time = env_steps, now
            eval_mean = replay_stats.get("eval/return_mean", math.nan)
            eval_window = int(replay_stats.get("eval/return_window", 0))
            reason = stop_reason(cfg.run, int(env_steps), elapsed, eval_mean, eval_window)
            values = {
                "learner/updates_per_s": updates.rate(),
                "learner/samples_per_s": samples.rate(),
                "learner/data_wait_fraction": (wait_s - wait_at_report) / interval,
                **last_metrics,
            }
            wait_at_report = wait_s
            writer.scalars(values, step=algo.num_updates)
            record = {
                "time_s": round(elapsed, 2),
                "env_steps": int(env_steps),
                "learner_updates": algo.num_updates,
                "learner_samples": counters["num_samples"],
                "episode_return_mean": _finite(replay_stats.get("replay/train_return_mean")),
                "eval_return_mean": _finite(eval_mean),
                "eval_episodes_in_window": eval_window,
                "env_steps_per_s": round(env_rate, 1),
                "updates_per_s": round(values["learner/updates_per_s"], 2),
                "samples_per_s": round(values["learner/samples_per_s"], 1),
                "replay_size": int(replay_stats.get("replay/size", 0)),
                "done": reason is not None,
            }
            append_result(run_dir / "result.json", record)
            log.info(
                "%6.0fs | env steps %9d (%6.0f/s) | updates %7d (%5.1f/s) | replay %8d | "
                "return %6.1f | eval %6.1f (%d ep)",
                elapsed,
                env_steps,
                env_rate,
                algo.num_updates,
                values["learner/updates_per_s"],
                record["replay_size"],
                replay_stats.get("replay/train_return_mean", math.nan),
                eval_mean,
                eval_window,
            )
        if reason is not None:
            log.info("stop condition met: %s", reason)
    finally:
        prefetcher.stop()
        counters["elapsed_ms"] = int((time.monotonic() - started) * 1000)
        save_checkpoint(checkpoint_path, algo, counters)
        if reason is not None and not peers_stopped:
            sockets.send(replay_sock, Shutdown(f"learner: {reason}"))
            sockets.send(params_sock, Shutdown(f"learner: {reason}"))
            linger_ms = 1000  # let the two messages leave before the sockets close
        writer.close()
        replay_sock.close(linger=linger_ms)
        params_sock.close(linger=linger_ms)
        ctx.term()
    log.info("learner stopped after %d updates", algo.num_updates)
    return 0


def drain_one(sock: zmq.Socket) -> object | None:
    """One waiting reply, or None; a malformed one is logged and skipped."""
    try:
        return sockets.recv(sock, timeout_ms=0)
    except DecodeError as exc:
        log.warning("bad message: %s", exc)
        return Error(str(exc))


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 2)

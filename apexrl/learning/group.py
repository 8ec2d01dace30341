"""Several learners that train one model: a ``torch.distributed`` process group (gloo on CPU, NCCL
when the learners use CUDA) that averages gradients every update.

Each rank samples its own batches and sends its own priority updates; after the backward pass the
ranks all-reduce one flat buffer that holds their gradients plus two counters:

    [ grad_1 ... grad_P | has_batch | wants_stop ]

so that a rank without a batch this round contributes zeros and is not counted in the mean, and a
rank that must stop (a signal, the servers' ``Shutdown``, the stop condition on rank 0) tells the
others in the same collective. Every rank applies the same averaged gradient, so weights and
optimizer state stay identical; rank 0's state is broadcast once at start (fresh or resumed).

Rendezvous: rank 0 hosts a ``TCPStore`` at ``learner.rendezvous``; every rank writes
``joined/<rank>`` and then ``heartbeat/<rank>`` about once a second. A rank that never arrives, or
one whose collective breaks (a dead or hung peer), is named from those keys in ``GroupError``.
"""

from __future__ import annotations

import datetime
import io
import logging
import socket
import time
from collections.abc import Iterable
from urllib.parse import urlparse

import torch
import torch.distributed as dist

log = logging.getLogger("apexrl.learner")  # the learner's log lines, whichever part writes them

HEARTBEAT_PERIOD_S = 1.0


class GroupError(RuntimeError):
    """The learner group cannot go on: a rank did not join, died or stopped answering."""


def parse_rendezvous(address: str) -> tuple[str, int]:
    """``tcp://HOST:PORT`` -> ``(HOST, PORT)``."""
    parsed = urlparse(address)
    if parsed.scheme != "tcp" or not parsed.hostname or not parsed.port:
        raise ValueError(f"rendezvous address must look like tcp://HOST:PORT, got {address!r}")
    return parsed.hostname, parsed.port


def listen_fd(host: str, port: int) -> int:
    """The file descriptor of a TCP socket listening on ``host`` alone, for rank 0's store to take
    over: given only a port, torch's ``TCPStore`` listens on every interface."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    return socket.create_server((host, port), family=family).detach()


class LearnerGroup:
    """This process's membership in the learner group (one rank of ``world_size``)."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        rendezvous: str,
        join_timeout_s: float,
        collective_timeout_s: float,
        device: torch.device,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        self.rank, self.world_size = rank, world_size
        host, port = parse_rendezvous(rendezvous)
        self._last_heartbeat = 0.0
        try:
            self.store = dist.TCPStore(
                host,
                port,
                world_size,
                is_master=rank == 0,
                timeout=datetime.timedelta(seconds=join_timeout_s),
                wait_for_workers=False,
                master_listen_fd=listen_fd(host, port) if rank == 0 else None,
            )
        except (OSError, RuntimeError, dist.DistError) as exc:
            raise GroupError(
                f"rank {rank}: cannot reach the rendezvous of rank 0 at {rendezvous} within "
                f"{join_timeout_s:g} s: {exc}"
            ) from exc
        self.store.set(f"joined/{rank}", "1")
        self.heartbeat(force=True)
        joined = [f"joined/{r}" for r in range(world_size)]
        try:
            self.store.wait(joined, datetime.timedelta(seconds=join_timeout_s))
        except (RuntimeError, dist.DistError) as exc:
            missing = [r for r in range(world_size) if not self._check(f"joined/{r}")]
            raise GroupError(
                f"learner rank(s) {missing} did not join within {join_timeout_s:g} s"
            ) from exc
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            store=self.store,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=collective_timeout_s),
        )
        self.device = device
        log.info("learner rank %d of %d joined (%s)", rank, world_size, backend)

    def _check(self, key: str) -> bool:
        try:
            return self.store.check([key])
        except (RuntimeError, dist.DistError):
            return False

    def heartbeat(self, force: bool = False) -> None:
        now = time.time()
        if force or now - self._last_heartbeat >= HEARTBEAT_PERIOD_S:
            self._last_heartbeat = now
            try:
                self.store.set(f"heartbeat/{self.rank}", repr(now))
            except (RuntimeError, dist.DistError) as exc:
                # Rank 0 (the store's host) may have exited after the group's last update; a
                # real loss shows in the next collective, which names the rank.
                log.debug("heartbeat not stored: %s", exc)

    def silent_ranks(self) -> list[int]:
        """Ranks whose heartbeat is older than a few periods (rank 0 too when its store is gone)."""
        time.sleep(3 * HEARTBEAT_PERIOD_S)  # let a dead rank's last heartbeat age
        now, silent = time.time(), []
        for r in range(self.world_size):
            if r == self.rank:
                continue
            try:
                self.store.set_timeout(datetime.timedelta(seconds=2))
                last = float(self.store.get(f"heartbeat/{r}").decode())
            except (RuntimeError, dist.DistError, ValueError):
                return [0] if self.rank != 0 else [r]  # the store lives in rank 0
            if now - last > 2.5 * HEARTBEAT_PERIOD_S:
                silent.append(r)
        return silent

    def broadcast_state(self, state: dict[str, object]) -> dict[str, object]:
        """Rank 0's state (weights, optimizer, counters) on every rank. The bytes are
        ``torch.save`` output read back with ``weights_only=True``: tensors and plain values."""
        if self.rank == 0:
            buffer = io.BytesIO()
            torch.save(state, buffer)
            payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
            size = torch.tensor([payload.numel()], dtype=torch.int64)
        else:
            size = torch.zeros(1, dtype=torch.int64)
        size = size.to(self.device)  # NCCL moves device tensors only
        self._collective(dist.broadcast, size, src=0)
        if self.rank != 0:
            payload = torch.empty(int(size.item()), dtype=torch.uint8)
        payload = payload.to(self.device)
        self._collective(dist.broadcast, payload, src=0)
        if self.rank == 0:
            return state
        data = payload.cpu().numpy().tobytes()
        return torch.load(io.BytesIO(data), map_location=self.device, weights_only=True)

    def average_gradients(
        self, parameters: Iterable[torch.nn.Parameter], has_batch: bool, wants_stop: bool
    ) -> tuple[int, bool]:
        """Replace each ``.grad`` by the mean over the ranks that had a batch; returns how many
        had one and whether any rank wants to stop."""
        params = list(parameters)
        grads = [
            p.grad.reshape(-1)
            if has_batch and p.grad is not None
            else torch.zeros(p.numel(), device=p.device)
            for p in params
        ]
        flags = torch.tensor([float(has_batch), float(wants_stop)], device=params[0].device)
        buffer = torch.cat([*grads, flags])
        self._collective(dist.all_reduce, buffer)
        num_batches, stop_votes = int(buffer[-2].item()), buffer[-1].item() > 0
        if num_batches > 0:
            offset = 0
            for p in params:
                n = p.numel()
                p.grad = (buffer[offset : offset + n] / num_batches).view_as(p).clone()
                offset += n
        self.heartbeat()
        return num_batches, stop_votes

    def sum(self, values: list[float]) -> list[float]:
        """The sum of each value over the ranks (every rank must call it, in the same order)."""
        buffer = torch.tensor(values, dtype=torch.float32, device=self.device)
        self._collective(dist.all_reduce, buffer)
        return buffer.tolist()

    def _collective(self, op, tensor: torch.Tensor, **kwargs) -> None:
        try:
            op(tensor, **kwargs)
        except (RuntimeError, dist.DistError) as exc:
            silent = self.silent_ranks()
            who = f"learner rank(s) {silent}" if silent else "another learner rank"
            raise GroupError(f"{who} stopped answering ({str(exc).splitlines()[0][:200]})") from exc

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

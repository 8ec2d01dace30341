"""The replay server's socket: its ROUTER bound on ``net.replay_addr``, the replies it sends
(``Reply``), and one pass's reading of the messages that are ready (``handle_ready_messages``),
each refused or handed to the service."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import zmq

from apexrl.config import Config
from apexrl.replay.chunk_log import Buffer
from apexrl.transport import auth, gate, sockets
from apexrl.transport.messages import Message

log = logging.getLogger("apexrl.replay_server")  # the replay server's log lines

MAX_MESSAGES_PER_PASS = 64  # messages handled before held inserts and samples are served


@dataclass(frozen=True)
class Reply:
    """A message to send to the peer of ``identity``."""

    identity: bytes
    message: Message


class ReplayService(Protocol):
    """What of the replay server's service (``replay.service.ReplayService``) this module uses."""

    cfg: Config
    gates: Mapping[str, gate.RoleGate]

    def holds_full(self) -> bool: ...
    def reject(self, identity: bytes, reason: str) -> list[Reply]: ...
    def handle(
        self, identity: bytes, msg: Message, frames: Sequence[Buffer] | None = None
    ) -> list[Reply]: ...
    def release_waiting(self) -> list[Reply]: ...


def bind_socket(ctx: zmq.Context, cfg: Config) -> zmq.Socket:
    sock = sockets.bind(
        ctx, zmq.ROUTER, cfg.net.replay_addr, curve=auth.server_keys(cfg.net, "replay")
    )
    log.info(
        "replay server on %s (%s, capacity %d)",
        sockets.bound_address(sock),
        cfg.replay.kind,
        cfg.replay.capacity,
    )
    return sock


def handle_ready_messages(sock: zmq.Socket, service: ReplayService) -> list[Reply]:
    """Handle every message that is ready (up to a bound) before the table work of ``drain``: one
    message per pass would run ``drain`` and the clock checks once per message."""
    replies: list[Reply] = []
    received = sockets.recv_from(sock, timeout_ms=50, gates=service.gates)
    num_handled = 0
    while received is not None:
        refused = received.error or auth.refusal(received.role, received.message, received.bound_id)
        if refused is not None:
            replies += service.reject(received.identity, str(refused))
        else:
            frames = received.frames or None  # as they came off the wire: for the chunk log
            replies += service.handle(received.identity, received.message, frames)
        num_handled += 1
        if num_handled >= MAX_MESSAGES_PER_PASS or service.holds_full():
            break  # serve what is held before reading on, so no chunk is refused for it
        received = sockets.recv_from(sock, timeout_ms=0, gates=service.gates)
    return replies + service.release_waiting()  # those that waited too long

"""What a CURVE server takes from a peer of each role, checked before a message is decoded.

A server's key decides a peer's role (``auth``); the gate of that role names the message kinds it
may send to this server and the ``Limits`` its messages are decoded under. ``sockets.recv_from``
applies it: a message over the role's size is refused from its frames' lengths, one of a kind the
role may not send from its header, so a peer holding a valid key makes a server spend no more than
the largest message its role really sends. Without CURVE (a trusted loopback) there is no role
and no gate.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from apexrl.transport import auth
from apexrl.transport.codec import DEFAULT_LIMITS, Limits

SMALL_MESSAGE_BYTES = 64 * 2**10  # requests, counters, a report: what a header-sized message holds


@dataclass(frozen=True)
class RoleGate:
    """The message kinds (class names) a role may send to one server, and the limits its
    messages are decoded under."""

    kinds: frozenset[str]
    limits: Limits


def role_gate(role: str, accepted: tuple[type, ...], max_message_bytes: int) -> RoleGate:
    """The gate of ``role`` at a server that accepts ``accepted``: what the role may send of
    them (``auth.PERMISSIONS``), each message at most ``max_message_bytes`` on the wire and
    decompressed, its header at most ``SMALL_MESSAGE_BYTES``."""
    max_message_bytes = min(max_message_bytes, DEFAULT_LIMITS.max_message_bytes)
    limits = dataclasses.replace(
        DEFAULT_LIMITS,
        max_message_bytes=max_message_bytes,
        max_array_bytes=min(max_message_bytes, DEFAULT_LIMITS.max_array_bytes),
        max_header_bytes=min(SMALL_MESSAGE_BYTES, DEFAULT_LIMITS.max_header_bytes),
    )
    return RoleGate(auth.permitted_kinds(role, accepted), limits)


def role_gates(accepted: tuple[type, ...], max_bytes: dict[str, int]) -> dict[str, RoleGate]:
    """One gate per client role in ``max_bytes`` (role -> its largest message in bytes)."""
    return {role: role_gate(role, accepted, num_bytes) for role, num_bytes in max_bytes.items()}

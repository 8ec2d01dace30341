"""Params client: an acting role's side of the parameter server; loads newer weights into its
network. ``wait_for_weights`` and ``wait_for_newer_weights`` are the waits of an actor that cannot
act before the learner has published (an evaluation actor, a resumed run, a synchronous actor).

Connects:  DEALER cfg.net.params_addr   out: ParamsRequest   in: Params, ParamsNotModified,
                                                                 Error, Shutdown

An actor on the parameter server's host reads the weights from the server's shared-memory file
(``apexrl.transport.shm``) instead of receiving them over TCP: its requests carry its host
identity, a server with the same one answers with a ``Params`` naming the file, and the client
maps the file read-only and decodes it with ``codec.decode`` exactly as a socket payload. When
the file is gone, foreign, or not the one the reply names, the client asks again for the weights
over the socket; after ``MAX_SHM_FAILURES`` such failures in a row it stops asking for shared
memory. An actor on another host gets the weights over TCP.

The server holds a request of an actor that already has its current version until the next
publish (``param_server.HOLD_S`` at most): a client whose request was held that long asks again at
once, so it is always waiting when a version comes out, instead of waiting for its next poll.

Weights are loaded into the network's own tensors in place with one copy, all or nothing:
names, shapes, dtypes and finiteness are checked before anything is written.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch
import zmq

from apexrl.clients.peers import Link, Peer, PeerShutdown
from apexrl.config import NetConfig
from apexrl.models import arrays_to_params
from apexrl.transport import auth, shm, sockets
from apexrl.transport.codec import DEFAULT_LIMITS, DecodeError, Limits, decode
from apexrl.transport.messages import Error, Params, ParamsNotModified, ParamsRequest, Shutdown
from apexrl.transport.weights import ArraySpec, layout_mismatch, non_finite_arrays

log = logging.getLogger(__name__)

MAX_SHM_FAILURES = 3  # failed shared-memory reads in a row before a client asks only over TCP
# A ParamsNotModified this long after the request: the server held it (param_server.HOLD_S, 1 s)
# and will hold the next one too, so asking again at once costs one small message a second.
HELD_AGAIN_AFTER_S = 0.5


class ParamsClient:
    """Keeps at most one ``ParamsRequest`` in flight and loads newer weights into ``net``.

    Weights that do not fit ``net`` (names, shapes, dtypes) or hold a NaN or an infinity are
    refused: ``net`` keeps its weights and version, the refusal is counted (``num_rejected``) and
    logged once per version, and later requests name the refused version, so the server answers
    ``ParamsNotModified`` until it holds another one instead of sending the same bytes again.

    A request that gets no answer within ``timeout_s``, or whose connection dropped (the server
    stopped or restarted), is sent again on a fresh socket. Meanwhile the actor keeps acting with
    the weights it has; a restarted server answers ``ParamsNotModified`` until the learner
    publishes to it again.

    ``shm_dir`` is the shared-memory directory to read weights from (None: TCP only);
    ``policy`` the multi-agent run's policy whose weights these are ("": the run's single one);
    ``snapshot`` >= 0 one of its pinned versions (a league's snapshot, over TCP), -1 the latest.
    """

    def __init__(
        self,
        link: Link | zmq.Socket,
        net: torch.nn.Module,
        timeout_s: float,
        shm_dir: Path | None = shm.SHM_DIR,
        limits: Limits = DEFAULT_LIMITS,
        policy: str = "",
        snapshot: int = -1,
    ) -> None:
        self.link = link if isinstance(link, Link) else Link.around(link)
        self.policy, self.snapshot = policy, snapshot
        self.net, self.timeout_s, self.limits = net, timeout_s, limits
        self.version = -1  # version of the weights in ``net``
        self.env_task = ""  # the env task (JSON text) that came with them; "": none
        self.server_version: int | None = None  # the server's version when it last answered
        self.version_lag = 0  # server version - ours, when we last asked
        self.rejected_version: int | None = None  # the server's version, refused; None: none
        self.num_rejected = 0  # weights refused
        self.shm_dir = shm_dir
        self.shm_host = shm.host_identity(shm_dir) if shm_dir is not None else ""
        self.num_loaded_shm = 0  # versions loaded from shared memory
        self.num_shm_fallbacks = 0  # shared-memory reads that failed (then asked over TCP)
        self._shm_failures_in_row = 0
        self._asked_shm = False  # the request in flight offered to read shared memory
        self._tcp_next = False  # the next request asks for the weights over TCP
        self._sent_at: float | None = None

    def request(self) -> None:
        """Have one request in flight. The answer to the last one, when it is there, is read
        first (its weights are loaded): an actor that reads its sockets only now and then still
        gets a version at its next request. A request unanswered for ``timeout_s``, or whose
        connection dropped, is sent again on a fresh socket."""
        if self._sent_at is not None and self.link.sock.poll(0, zmq.POLLIN):
            self.poll()  # after a held ParamsNotModified it has asked again itself
        now = time.monotonic()
        if self._sent_at is not None:
            if now - self._sent_at < self.timeout_s and not self.link.dropped():
                return  # one in flight
            self._lose(f"no answer for {now - self._sent_at:.0f} s")
        elif self.link.dropped():
            self._lose("the connection dropped")
        self._send()

    def _send(self) -> None:
        have = self.version if self.rejected_version is None else self.rejected_version
        host = "" if self._tcp_next or self.snapshot >= 0 else self.shm_host
        sockets.send(self.link.sock, ParamsRequest(have, host, self.policy, self.snapshot))
        self._asked_shm, self._tcp_next = bool(host), False
        self._sent_at = time.monotonic()

    def _lose(self, why: str) -> None:
        self.link.peer.lost(why)
        self.link.reset()
        self._sent_at = None

    def poll(self, timeout_ms: int = 0) -> bool:
        """Handle a reply if one is there; True when new weights were loaded."""
        if timeout_ms == 0 and self._sent_at is None:
            return False  # nothing asked, nothing to read (saves a socket poll every step)
        try:
            msg = sockets.recv(self.link.sock, timeout_ms, self.limits)
        except DecodeError as exc:
            log.warning("bad message from the parameter server: %s", exc)
            return False
        if msg is None:
            if self._sent_at is not None and self.link.dropped():  # lost: ask again at once
                self._lose("the connection dropped")
                self.request()
            return False
        self.link.peer.heard()
        waited_s = time.monotonic() - self._sent_at if self._sent_at is not None else 0.0
        self._sent_at = None
        if isinstance(msg, Params):
            self.version_lag = max(msg.version - self.version, 0) if self.version >= 0 else 0
            self.server_version = msg.version
            return self._load_shm(msg) if msg.shm_file else self._load(msg)
        if isinstance(msg, ParamsNotModified):
            self.version_lag = 0
            self.server_version = msg.version
            if waited_s >= HELD_AGAIN_AFTER_S and msg.version >= 0:
                self._send()  # held and not modified: wait for the next publish at once
        elif isinstance(msg, Shutdown):
            raise PeerShutdown(msg.reason)
        elif isinstance(msg, Error):
            log.warning("parameter server refused a request: %s", msg.reason)
        return False

    def _load_shm(self, reply: Params) -> bool:
        """Load the weights of a reply that names a shared-memory file; when the file cannot be
        used, or its weights cannot be loaded (the server checked them at publish, so the file is
        not what it wrote), ask for them again over TCP."""
        try:
            # The mapping goes when this call returns: the weights are copied out of it.
            load_weights(self.net, self._read_shm(reply).arrays)
        except (shm.ShmError, DecodeError, ValueError) as exc:
            self._shm_failed(reply.version, str(exc))
            return False
        self._shm_failures_in_row = 0
        self.num_loaded_shm += 1
        self.version, self.rejected_version = reply.version, None
        self.env_task = reply.env_task
        return True

    def _read_shm(self, reply: Params) -> Params:
        """The ``Params`` in the file a reply names, decoded as a socket payload is (its arrays
        are views of a read-only mapping of the file); raises ``ShmError`` or ``DecodeError``."""
        if not self._asked_shm or self.shm_dir is None:
            raise shm.ShmError("the reply names a file this client did not ask for")
        ref = shm.ShmRef(reply.shm_file, reply.shm_nbytes, reply.shm_token)
        _, frames = shm.map_frames(self.shm_dir, ref, reply.version, self.limits)
        msg = decode(frames, self.limits)
        if not isinstance(msg, Params) or msg.shm_file or msg.version != reply.version:
            raise DecodeError(f"the file holds a {type(msg).__name__}, not those weights")
        return msg

    def _shm_failed(self, version: int, reason: str) -> None:
        self.num_shm_fallbacks += 1
        self._shm_failures_in_row += 1
        if self._shm_failures_in_row >= MAX_SHM_FAILURES and self.shm_host:
            self.shm_host = ""
            log.warning(
                "weights version %d from shared memory failed (%s); %d failures in a row, "
                "reading weights over TCP from now on",
                version,
                reason,
                self._shm_failures_in_row,
            )
        elif self._shm_failures_in_row == 1:
            log.warning(
                "weights version %d from shared memory failed (%s); asking over TCP",
                version,
                reason,
            )
        self._tcp_next = True
        self._send()

    def _load(self, msg: Params) -> bool:
        try:
            load_weights(self.net, msg.arrays)
        except ValueError as exc:
            self._reject(msg.version, str(exc))
            return False
        self.version, self.rejected_version = msg.version, None
        self.env_task = msg.env_task
        return True

    def _reject(self, version: int, reason: str) -> None:
        self.num_rejected += 1
        if version != self.rejected_version:
            log.warning(
                "refused weights version %d, keeping version %d: %s", version, self.version, reason
            )
        self.rejected_version = version


def params_link(ctx: zmq.Context, net: NetConfig, key_role: str) -> Link:
    """A link to the run's parameter server for a client that holds ``key_role``'s CURVE key."""
    peer = Peer("parameter server", net.params_addr)
    return Link(ctx, peer, auth.client_keys(net, key_role, "params"))


def wait_for_newer_weights(params: ParamsClient, stop, than_version: int, timeout_s: float) -> None:
    """A synchronous actor (PPO) after its share of rollout ``than_version``: wait until the
    learner has trained on the rollout and published the next version."""
    started = last_log = time.monotonic()
    while not stop.is_set() and params.version == than_version:
        params.request()
        params.poll(timeout_ms=100)
        if time.monotonic() - last_log > timeout_s:
            last_log = time.monotonic()
            log.info(
                "waiting for weights newer than version %d (%.0f s)",
                than_version,
                last_log - started,
            )


def wait_for_weights(params: ParamsClient, stop, need_version: bool, timeout_s: float) -> None:
    """Wait for the parameter server's first answer, and load its weights when it has some. With
    ``need_version``, wait until the learner has published (evaluation, resumed runs)."""
    started = last_log = time.monotonic()
    while not stop.is_set():
        params.request()
        params.poll(timeout_ms=200)
        if params.version >= 0:
            return
        if params.server_version is not None and not need_version:
            return  # a fresh run whose learner has not published yet: act with our own network
        if time.monotonic() - last_log > timeout_s / 3:
            last_log = time.monotonic()
            log.info("waiting for the learner's weights (%.0f s)", last_log - started)
        if params.server_version is not None:
            time.sleep(0.2)  # it answered "none yet": ask again shortly


def check_finite(arrays: dict[str, np.ndarray]) -> None:
    """Raise ``ValueError`` naming the first float array that holds a NaN or an infinity."""
    bad = non_finite_arrays(arrays)
    if bad:
        raise ValueError(f"array {bad[0]!r} holds NaN or infinite values")


def cpu_views(net: torch.nn.Module) -> dict[str, np.ndarray] | None:
    """Writable numpy views of ``net``'s parameters and buffers (``state_dict`` names), or None
    when one of them has no numpy view (another device, a dtype numpy lacks)."""
    views = {}
    for name, tensor in net.state_dict().items():
        if tensor.device.type != "cpu":
            return None
        try:
            views[name] = tensor.numpy()
        except (TypeError, RuntimeError):
            return None
    return views


def load_weights(net: torch.nn.Module, arrays: dict[str, np.ndarray]) -> None:
    """Copy ``arrays`` into ``net``'s own tensors, all or nothing: ``ValueError`` (naming the
    first problem) when a float array is not finite or the arrays are not exactly ``net``'s
    ``state_dict`` (names, shapes, dtypes), and then ``net`` is unchanged. On the CPU each array is
    copied once, straight from the decoded frames into the tensor's memory."""
    check_finite(arrays)
    views = cpu_views(net)
    if views is None:
        arrays_to_params(net, arrays)  # its own checks; copies through a host tensor
        return
    layout = {name: ArraySpec(view.shape, view.dtype) for name, view in views.items()}
    mismatch = layout_mismatch(arrays, layout)
    if mismatch is not None:
        raise ValueError(mismatch)
    for name, view in views.items():
        np.copyto(view, arrays[name], casting="no")

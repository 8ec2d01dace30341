"""Who may talk to a run's servers: CURVE keys per role, the servers' allow-list, role permissions.

``apexrl keys DIR`` makes a run's keys as one *bundle* per kind of host, each holding only the
secret keys that host needs, so that a host that is taken over can act as its own roles only::

    DIR/servers/  replay.key  replay.key_secret  params.key  params.key_secret  allow_list.json
    DIR/learner/  learner.key learner.key_secret replay.key  params.key
    DIR/actors/   actor.key   actor.key_secret   replay.key  params.key
    DIR/eval/     eval.key    eval.key_secret    replay.key  params.key

Key pairs are written by pyzmq's certificate helpers (``zmq.auth.create_certificates``); secret
files are mode 0600 in 0700 directories. ``allow_list.json`` maps each client public key (Z85) to
its role. ``net.keys_dir`` names either one bundle (what a host of several machines holds) or the
whole DIR (a host that runs every role, as the local launcher does with ``<run dir>/keys``): a
role reads its keys from its bundle's subdirectory when there is one, else from ``keys_dir``
itself. A role started with a bundle that lacks its secret key stops at start with the bundle it
needs. A directory in the flat layout of earlier versions (every pair and the allow-list in one
directory) still works, with a warning: every host that holds it holds every secret.

With ``net.keys_dir`` set, the replay and parameter servers are CURVE servers (encrypted links);
a ZAP handler in the server process admits only clients whose public key is in the allow-list
and names the peer's role as the connection's ZeroMQ ``User-Id``. ``sockets.recv_from`` returns
that role with each message, and the servers refuse what ``allowed(role, message)`` forbids, so a
permission follows from the key that authenticated the peer, never from a message's content. A
client that is not admitted gets no reply at all: its handshake fails before any message of it
reaches the server.

Without keys every message is allowed, as on a trusted loopback; a server then refuses to bind an
address other than loopback unless ``net.insecure`` says the network is trusted.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import zmq
import zmq.auth
from zmq.utils import z85

from apexrl.lifecycle import StartupError
from apexrl.transport.external_messages import CLIENT_CALLS
from apexrl.transport.messages import (
    ActorReport,
    MatchRequest,
    Message,
    ParamsRequest,
    PriorityUpdate,
    PublishedVersion,
    PublishParams,
    RestoreCounters,
    SampleRequest,
    Shutdown,
    StatsRequest,
    TrajectoryChunk,
)

if TYPE_CHECKING:
    from apexrl.config import NetConfig

log = logging.getLogger(__name__)

SERVER_ROLES = ("replay", "params")
CLIENT_ROLES = ("learner", "actor", "eval")
ROLES = SERVER_ROLES + CLIENT_ROLES
ALLOW_LIST = "allow_list.json"
SERVERS_BUNDLE = "servers"
# One bundle per kind of host: the roles whose secret keys it holds (``make_keys``).
BUNDLES: dict[str, tuple[str, ...]] = {
    SERVERS_BUNDLE: SERVER_ROLES,
    "learner": ("learner",),
    "actors": ("actor",),
    "eval": ("eval",),
}
BUNDLE_OF = {role: bundle for bundle, roles in BUNDLES.items() for role in roles}
ROLE_NAMES = {
    "replay": "the replay server",
    "params": "the parameter server",
    "learner": "the learner",
    "actor": "an actor",
    "eval": "the evaluation actor",
}
ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq asks a context's ZAP handler (RFC 27)

# What each client role may send to a server. ``ActorReport`` is checked further in ``allowed``:
# only the eval role's reports are evaluation reports.
PERMISSIONS: dict[str, tuple[type, ...]] = {
    "learner": (
        SampleRequest,
        PriorityUpdate,
        RestoreCounters,
        PublishedVersion,
        PublishParams,
        Shutdown,
        StatsRequest,
        ParamsRequest,
    ),
    # An external environment's client holds the actors' bundle: a policy server admits it.
    # Only a training actor plays a league's matches: an evaluation actor's games are its own.
    "actor": (
        TrajectoryChunk,
        ActorReport,
        StatsRequest,
        ParamsRequest,
        MatchRequest,
        *CLIENT_CALLS,
    ),
    "eval": (ActorReport, StatsRequest, ParamsRequest),
}


def permitted_kinds(role: str, accepted: tuple[type, ...]) -> frozenset[str]:
    """The names of the message kinds a ``role`` peer may send to a server that accepts
    ``accepted``: what a server checks from a message's header before it decodes the rest."""
    return frozenset(cls.__name__ for cls in PERMISSIONS.get(role, ()) if cls in accepted)


def allowed(role: str | None, msg: Message) -> bool:
    """Whether a peer authenticated as ``role`` may send ``msg``; ``None`` (no CURVE): always."""
    if role is None:
        return True
    if not isinstance(msg, PERMISSIONS.get(role, ())):
        return False
    if isinstance(msg, ActorReport):
        return msg.is_eval == (role == "eval")
    return True


def refusal(role: str | None, msg: Message) -> str | None:
    """Why ``msg`` from ``role`` is refused (the ``Error`` text), or None when it is allowed."""
    if allowed(role, msg):
        return None
    what = type(msg).__name__
    if isinstance(msg, ActorReport) and role in PERMISSIONS:
        what = "an evaluation report" if msg.is_eval else "a training report"
    return f"role {role!r} may not send {what}"


@dataclass(frozen=True)
class ServerKeys:
    """A CURVE server's key pair (Z85) and the clients it admits (Z85 public key -> role)."""

    public_key: bytes
    secret_key: bytes
    client_roles: dict[bytes, str]


@dataclass(frozen=True)
class ClientKeys:
    """A CURVE client's key pair and the public key of the server it connects to (all Z85)."""

    public_key: bytes
    secret_key: bytes
    server_key: bytes


def bundle_files(bundle: str) -> list[str]:
    """The files of one bundle: the pairs of the roles it serves, then the allow-list (servers)
    or the servers' public keys (a client bundle)."""
    files = [f"{role}.{ext}" for role in BUNDLES[bundle] for ext in ("key", "key_secret")]
    if bundle == SERVERS_BUNDLE:
        return [*files, ALLOW_LIST]
    return [*files, *(f"{server}.key" for server in SERVER_ROLES)]


def make_keys(keys_dir: Path) -> None:
    """Write a run's keys to ``keys_dir``: one bundle per kind of host (``BUNDLES``).

    Refuses (``FileExistsError``) to overwrite keys already there: a running run may use them.
    """
    keys_dir = Path(keys_dir)
    existing = [p for p in _flat_files(keys_dir) + [keys_dir / b for b in BUNDLES] if p.exists()]
    if existing:
        raise FileExistsError(
            f"{keys_dir} already holds CURVE keys ({existing[0].name}, ...): a run may use "
            "them; choose another directory"
        )
    _private_dir(keys_dir)
    public_files = {}
    for bundle, bundle_roles in BUNDLES.items():
        _private_dir(keys_dir / bundle)
        for role in bundle_roles:
            public_files[role], secret_file = zmq.auth.create_certificates(keys_dir / bundle, role)
            os.chmod(secret_file, 0o600)
    for bundle in BUNDLES:
        if bundle != SERVERS_BUNDLE:
            for server in SERVER_ROLES:
                shutil.copyfile(public_files[server], keys_dir / bundle / f"{server}.key")
    allow_list = {zmq.auth.load_certificate(public_files[r])[0].decode(): r for r in CLIENT_ROLES}
    allow_list_file = keys_dir / SERVERS_BUNDLE / ALLOW_LIST
    allow_list_file.write_text(json.dumps(allow_list, indent=1) + "\n")


def _private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)


def has_keys(keys_dir: Path) -> bool:
    """Whether ``keys_dir`` holds a whole run's keys: every bundle of ``make_keys``, or every
    file of the flat layout of earlier versions."""
    return has_bundles(keys_dir) or all(p.exists() for p in _flat_files(Path(keys_dir)))


def has_bundles(keys_dir: Path) -> bool:
    """Whether ``keys_dir`` holds every bundle ``make_keys`` writes, complete."""
    keys_dir = Path(keys_dir)
    return all((keys_dir / b / f).exists() for b in BUNDLES for f in bundle_files(b))


def _flat_files(keys_dir: Path) -> list[Path]:
    files = [keys_dir / ALLOW_LIST]
    for role in ROLES:
        files += [keys_dir / f"{role}.key", keys_dir / f"{role}.key_secret"]
    return files


def bundle_dir(keys_dir: Path, role: str) -> Path:
    """Where ``role`` reads its keys: its bundle in a whole run's keys, else ``keys_dir``."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles with keys: {', '.join(ROLES)}")
    inside = Path(keys_dir) / BUNDLE_OF[role]
    return inside if inside.is_dir() else Path(keys_dir)


def _load(path: Path, secret: bool) -> tuple[bytes, bytes]:
    """A certificate's public and secret key (``b""`` for a public certificate)."""
    try:
        public_key, secret_key = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise StartupError(
            f"CURVE key file {path} cannot be read ({exc}); make a run's keys with "
            "`apexrl keys DIR`"
        ) from exc
    if secret and secret_key is None:
        raise StartupError(f"CURVE key file {path} holds no secret key")
    return public_key, secret_key or b""


def _role_keys(keys_dir: Path, role: str) -> tuple[Path, bytes, bytes]:
    """The directory ``role`` reads its keys from, and its key pair; ``StartupError`` naming the
    bundle it needs when that directory holds no secret key of ``role``."""
    if not keys_dir.is_dir():
        raise StartupError(
            f"net.keys_dir {keys_dir} is not a directory: make a run's keys with `apexrl keys "
            "DIR` and give this host its bundle"
        )
    where = bundle_dir(keys_dir, role)
    secret_file = where / f"{role}.key_secret"
    if not secret_file.exists():
        bundle = BUNDLE_OF[role]
        made = keys_dir.parent if keys_dir.name in BUNDLES else Path("DIR")
        raise StartupError(
            f"this keys directory ({keys_dir}) holds no {role} secret key: "
            f"{ROLE_NAMES[role]} needs the {bundle} bundle ({made / bundle}) of `apexrl keys DIR`"
        )
    if where == keys_dir and all(p.exists() for p in _flat_files(keys_dir)):
        _warn_flat(keys_dir)
    return (where, *_load(secret_file, secret=True))


def _warn_flat(keys_dir: Path) -> None:
    log.warning(
        "%s holds every role's secret key in one directory (the layout of earlier versions): "
        "a host that holds it can act as any role; give each host only its bundle, made by "
        "`apexrl keys DIR`",
        keys_dir,
    )


def load_allow_list(path: Path) -> dict[bytes, str]:
    """The allow-list file: client public key (Z85) -> role, each role one of ``CLIENT_ROLES``."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise StartupError(f"CURVE allow-list {path} cannot be read: {exc}") from exc
    if not isinstance(data, dict):
        raise StartupError(f"CURVE allow-list {path} must map public keys to roles")
    client_roles = {}
    for key, role in data.items():
        if role not in CLIENT_ROLES or len(key) != 40:
            raise StartupError(
                f"CURVE allow-list {path}: {key!r} -> {role!r} is not a 40-character Z85 public "
                f"key and one of the roles {', '.join(CLIENT_ROLES)}"
            )
        client_roles[key.encode()] = role
    return client_roles


def is_loopback(addr: str) -> bool:
    """Whether a ZeroMQ endpoint is reachable from this machine only (loopback, ipc, inproc)."""
    parsed = urlparse(addr)
    if parsed.scheme in ("ipc", "inproc"):
        return True
    host = parsed.hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # "*", an interface or host name: may face the network
        return False


def check_bind_without_keys(net: NetConfig, addr: str, server: str, risk: str) -> None:
    """A server without keys binds loopback only, unless ``net.insecure``: ``StartupError``
    saying what anyone who reached it could do (``risk``)."""
    if not is_loopback(addr) and not net.insecure:
        raise StartupError(
            f"{server}: refusing to bind {addr} without CURVE keys: anyone who reaches it could "
            f"{risk}; give it a run's keys (--keys DIR, made by `apexrl keys DIR`), bind a "
            "loopback address, or pass --insecure on a trusted network"
        )


def server_keys(net: NetConfig, role: str) -> ServerKeys | None:
    """The keys the ``role`` server (``replay`` or ``params``) binds with; None without keys.

    Raises ``StartupError`` when there are no keys and the server's address is not loopback,
    unless ``net.insecure``.
    """
    addr = {"replay": net.replay_addr, "params": net.params_addr}[role]
    if not net.keys_dir:
        check_bind_without_keys(net, addr, f"{role} server", "control the run")
        return None
    where, public_key, secret_key = _role_keys(Path(net.keys_dir), role)
    return ServerKeys(public_key, secret_key, load_allow_list(where / ALLOW_LIST))


def client_keys(net: NetConfig, role: str, server: str) -> ClientKeys | None:
    """The keys a ``role`` client connects to the ``server`` with; None without keys."""
    if not net.keys_dir:
        return None
    if server not in SERVER_ROLES:
        raise ValueError(f"unknown server {server!r}; servers: {', '.join(SERVER_ROLES)}")
    where, public_key, secret_key = _role_keys(Path(net.keys_dir), role)
    server_key, _ = _load(where / f"{server}.key", secret=False)
    return ClientKeys(public_key, secret_key, server_key)


def external_server_keys(net: NetConfig, addr: str) -> ServerKeys | None:
    """The keys a policy server (``apexrl external``) binds ``addr`` with: the actors' own pair,
    admitting the actor key only, so that a client needs exactly what an actor holds (the
    actors' bundle); None without keys (``StartupError`` off loopback, unless
    ``net.insecure``)."""
    if not net.keys_dir:
        check_bind_without_keys(net, addr, "policy server", "feed the run")
        return None
    _, public_key, secret_key = _role_keys(Path(net.keys_dir), "actor")
    return ServerKeys(public_key, secret_key, {public_key: "actor"})


def external_client_keys(keys_dir: str) -> ClientKeys | None:
    """The keys a ``PolicyClient`` connects to a policy server with: the actors' pair, the
    server's public key being the actor key; None without keys."""
    if not keys_dir:
        return None
    _, public_key, secret_key = _role_keys(Path(keys_dir), "actor")
    return ClientKeys(public_key, secret_key, public_key)


def zap_reply(request: list[bytes], client_roles: dict[bytes, str]) -> list[bytes]:
    """The ZAP reply (RFC 27) to one request: 200 with the role as User-Id for a CURVE client in
    the allow-list, 400 for anyone else."""
    version, request_id, mechanism = request[0], request[1], request[5]
    credentials = request[6:]
    if version != b"1.0":
        return [b"1.0", request_id, b"500", b"unsupported ZAP version", b"", b""]
    if mechanism == b"CURVE" and len(credentials) == 1 and len(credentials[0]) == 32:
        role = client_roles.get(z85.encode(credentials[0]))
        if role is not None:
            return [b"1.0", request_id, b"200", b"OK", role.encode(), b""]
    log.warning("refused a %s client from %s", mechanism.decode(errors="replace"), request[3])
    return [b"1.0", request_id, b"400", b"not in the allow-list", b"", b""]


def start_zap_handler(ctx: zmq.Context, client_roles: dict[bytes, str]) -> threading.Thread:
    """Answer ``ctx``'s authentication requests in a thread until the context is terminated.

    Its lifetime is the context's: the thread closes its socket when ``ctx.term()`` interrupts
    it, so the owner's usual ``close, then term`` needs no extra step. One per context (libzmq
    asks one endpoint); bind CURVE server sockets only after it runs, since libzmq admits every
    client of a context that has no handler.
    """
    # Made outside ``ctx.socket`` so that ``ctx.destroy()`` does not close it under the thread's
    # blocking receive: the termination that follows interrupts that receive instead.
    zap = zmq.Socket(ctx, zmq.REP)
    zap.setsockopt(zmq.LINGER, 0)
    try:
        zap.bind(ZAP_ENDPOINT)
    except zmq.ZMQError as exc:
        zap.close(linger=0)
        raise RuntimeError(
            f"this ZeroMQ context already has a ZAP handler ({exc}): one CURVE server per context"
        ) from exc
    thread = threading.Thread(target=_serve_zap, args=(zap, client_roles), daemon=True, name="zap")
    thread.start()
    return thread


def _serve_zap(zap: zmq.Socket, client_roles: dict[bytes, str]) -> None:
    try:
        while True:
            zap.send_multipart(zap_reply(zap.recv_multipart(), client_roles))
    except zmq.ZMQError:  # the context is terminating (or destroyed): stop answering
        pass
    finally:
        zap.close(linger=0)

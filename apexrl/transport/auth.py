"""Who may talk to a run's servers: CURVE keys per role, the servers' allow-list, role permissions.

``apexrl keys DIR`` makes a run's keys as one *bundle* per kind of host, each holding only the
secret keys that host needs, so that a host that is taken over can act as its own roles only::

    DIR/servers/  replay.key  replay.key_secret  params.key  params.key_secret  allow_list.json
    DIR/learner/  learner.key learner.key_secret replay.key  params.key
    DIR/actors/   actor.key   actor.key_secret   replay.key  params.key
    DIR/eval/     eval.key    eval.key_secret    replay.key  params.key

``apexrl keys DIR --actors N`` gives each actor its own pair instead of the shared ``actors/``
bundle: ``DIR/actor_0/ .. DIR/actor_<N-1>/``, the same files, each key bound to its actor id in
the allow-list (``actor:<i>``), so that an actor's key speaks as that actor only; ``apexrl keys
DIR --add-actors K`` adds K more to a running run, whose servers read the allow-list again when
a key they do not know connects. A key of the shared bundle may speak as any actor id (the
servers warn of it at start).

Key pairs are written by pyzmq's certificate helpers (``zmq.auth.create_certificates``); secret
files are mode 0600 in 0700 directories. ``allow_list.json`` maps each client public key (Z85) to
its identity: its role, or ``actor:<i>`` for an actor's own key. ``net.keys_dir`` names either
one bundle (what a host of several machines holds) or the whole DIR (a host that runs every role,
as the local launcher does with ``<run dir>/keys``): a role reads its keys from its bundle's
subdirectory when there is one (an actor: its own, else the shared one), else from ``keys_dir``
itself. A role started with a bundle that lacks its secret key stops at start with the bundle it
needs. A directory in the flat layout of earlier versions (every pair and the allow-list in one
directory) still works, with a warning: every host that holds it holds every secret.

With ``net.keys_dir`` set, the replay and parameter servers are CURVE servers (encrypted links);
a ZAP handler in the server process admits only clients whose public key is in the allow-list
and names the peer's identity and key as the connection's ZeroMQ ``User-Id``
(``<identity>@<key>``). ``sockets.recv_from`` drops a message whose key has left the allow-list
since, and returns the role, and the actor id its key is bound to, with each other, and the servers
refuse what ``allowed(role, message, bound_id)`` forbids, so a permission follows from the key
that authenticated the peer, never from a message's content. A client that is not admitted gets
no reply at all: its handshake fails before any message of it reaches the server.

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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import zmq
import zmq.auth
from zmq.utils import z85

from apexrl.runtime.lifecycle import StartupError
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
ACTORS_BUNDLE = "actors"  # the shared bundle of the actors: a key that may speak as any actor id
OWN_ACTOR_BUNDLE = "actor_{}"  # actor i's own bundle (``apexrl keys DIR --actors N``)
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


def actor_identity(actor_id: int) -> str:
    """The identity an actor's own key has in the allow-list (and the one its clients ask
    their keys for): ``actor:<id>``."""
    return f"actor:{actor_id}"


def split_identity(identity: str) -> tuple[str, int | None]:
    """``"actor:3"`` -> ``("actor", 3)``; a role alone -> ``(role, None)``: a key not bound to
    one actor id. Anything else comes back whole, as a role that may send nothing."""
    identity = identity.partition("@")[0]  # a connection's User-Id: <identity>@<its key>
    role, sep, actor_id = identity.partition(":")
    if sep and actor_id.isdigit() and role == "actor":
        return role, int(actor_id)
    return identity, None


def allowed(role: str | None, msg: Message, bound_id: int | None = None) -> bool:
    """Whether a peer authenticated as ``role`` may send ``msg``; ``None`` (no CURVE): always.
    ``bound_id``: the actor id the peer's key is bound to, which a message's ``actor_id`` must
    name (None: a shared key, any actor id)."""
    if role is None:
        return True
    if not isinstance(msg, PERMISSIONS.get(role, ())):
        return False
    if bound_id is not None and getattr(msg, "actor_id", bound_id) != bound_id:
        return False
    if isinstance(msg, ActorReport):
        return msg.is_eval == (role == "eval")
    return True


def refusal(role: str | None, msg: Message, bound_id: int | None = None) -> str | None:
    """Why ``msg`` from ``role`` is refused (the ``Error`` text), or None when it is allowed."""
    if allowed(role, msg, bound_id):
        return None
    what = type(msg).__name__
    if bound_id is not None and getattr(msg, "actor_id", bound_id) != bound_id:
        return f"the key of actor {bound_id} may not send {what} as actor {msg.actor_id}"
    if isinstance(msg, ActorReport) and role in PERMISSIONS:
        what = "an evaluation report" if msg.is_eval else "a training report"
    return f"role {role!r} may not send {what}"


@dataclass(frozen=True)
class ServerKeys:
    """A CURVE server's key pair (Z85) and the clients it admits (Z85 public key -> identity:
    a role, or ``actor:<i>``); ``allow_list``: the file they came from, read again when a key
    not among them connects (None: a fixed set)."""

    public_key: bytes
    secret_key: bytes
    client_roles: dict[bytes, str]
    allow_list: Path | None = None


@dataclass(frozen=True)
class ClientKeys:
    """A CURVE client's key pair and the public key of the server it connects to (all Z85)."""

    public_key: bytes
    secret_key: bytes
    server_key: bytes


def bundle_files(bundle: str) -> list[str]:
    """The files of one bundle: the pairs of the roles it serves, then the allow-list (servers)
    or the servers' public keys (a client bundle; an actor's own bundle is the actors')."""
    roles = BUNDLES.get(bundle, BUNDLES[ACTORS_BUNDLE])
    files = [f"{role}.{ext}" for role in roles for ext in ("key", "key_secret")]
    if bundle == SERVERS_BUNDLE:
        return [*files, ALLOW_LIST]
    return [*files, *(f"{server}.key" for server in SERVER_ROLES)]


def make_keys(keys_dir: Path, actors: int = 0) -> None:
    """Write a run's keys to ``keys_dir``: one bundle per kind of host (``BUNDLES``); with
    ``actors`` N > 0, actors 0..N-1 each their own bundle instead of the shared one.

    Refuses (``FileExistsError``) to overwrite keys already there: a running run may use them.
    """
    keys_dir = Path(keys_dir)
    existing = [p for p in _flat_files(keys_dir) + [keys_dir / b for b in BUNDLES] if p.exists()]
    if existing:
        raise FileExistsError(
            f"{keys_dir} already holds CURVE keys ({existing[0].name}, ...): a run may use "
            "them; choose another directory, or add actors with --add-actors"
        )
    _private_dir(keys_dir)
    public_files = {}
    for bundle, bundle_roles in BUNDLES.items():
        if bundle == ACTORS_BUNDLE and actors > 0:
            continue
        _private_dir(keys_dir / bundle)
        for role in bundle_roles:
            public_files[role] = _new_pair(keys_dir / bundle, role)
    for bundle in BUNDLES:
        if bundle != SERVERS_BUNDLE and (bundle != ACTORS_BUNDLE or actors == 0):
            _copy_server_keys(keys_dir, keys_dir / bundle)
    allow_list = {_z85(public_files[r]): r for r in CLIENT_ROLES if r in public_files}
    allow_list |= _new_actor_bundles(keys_dir, range(actors))
    _write_allow_list(keys_dir / SERVERS_BUNDLE / ALLOW_LIST, allow_list)


def add_actor_keys(keys_dir: Path, count: int) -> list[int]:
    """Give ``count`` more actors their own bundles in a run's keys ``keys_dir`` and admit their
    keys in its allow-list (written whole, then renamed over the old one, so that a server
    reading it sees the old list or the new); the new actor ids, after the highest there."""
    keys_dir = Path(keys_dir)
    if count < 1:
        raise ValueError(f"--add-actors takes a count of at least 1, got {count}")
    if not has_bundles(keys_dir):
        raise FileNotFoundError(
            f"{keys_dir} holds no run's keys in bundles: make them with `apexrl keys DIR`"
        )
    allow_list_file = keys_dir / SERVERS_BUNDLE / ALLOW_LIST
    if not own_actor_ids(keys_dir):  # its actors' ids are not in DIR: new ones could collide
        raise FileNotFoundError(
            f"{keys_dir} gives its actors one shared key (made without --actors): grow a run by "
            "keys that give each actor its own (`apexrl keys DIR --actors N`)"
        )
    allow_list = {k.decode(): v for k, v in load_allow_list(allow_list_file).items()}
    first = max(own_actor_ids(keys_dir), default=-1) + 1
    ids = range(first, first + count)
    allow_list |= _new_actor_bundles(keys_dir, ids)
    _write_allow_list(allow_list_file, allow_list)
    return list(ids)


def revoke_actor_key(keys_dir: Path, actor_id: int) -> Path:
    """Take actor ``actor_id``'s own key out of the allow-list of a run's keys ``keys_dir`` (the
    running servers refuse it from then on, its open connections too) and set its bundle aside
    as ``revoked_actor_<id>``; that path. ``--add-actors`` may give the id a new key."""
    keys_dir = Path(keys_dir)
    bundle = keys_dir / OWN_ACTOR_BUNDLE.format(actor_id)
    allow_list_file = keys_dir / SERVERS_BUNDLE / ALLOW_LIST
    allow_list = {k.decode(): v for k, v in load_allow_list(allow_list_file).items()}
    identity = actor_identity(actor_id)
    if identity not in allow_list.values() or not bundle.is_dir():
        raise FileNotFoundError(f"{keys_dir} holds no key of actor {actor_id} to revoke")
    _write_allow_list(allow_list_file, {k: v for k, v in allow_list.items() if v != identity})
    revoked = keys_dir / f"revoked_{bundle.name}"
    shutil.rmtree(revoked, ignore_errors=True)
    bundle.rename(revoked)
    return revoked


def own_actor_ids(keys_dir: Path) -> list[int]:
    """The actor ids that have their own bundle in a run's keys ``keys_dir``, ascending."""
    owners = (_own_bundle_owner(p) for p in Path(keys_dir).glob(OWN_ACTOR_BUNDLE.format("*")))
    return sorted(owner for owner in owners if owner is not None)


def _own_bundle_owner(bundle: Path) -> int | None:
    """The actor whose own bundle ``bundle`` is, by its name; None for any other directory."""
    prefix = OWN_ACTOR_BUNDLE.format("")
    number = bundle.name[len(prefix) :]
    return int(number) if bundle.name.startswith(prefix) and number.isdigit() else None


def _new_actor_bundles(keys_dir: Path, actor_ids: range) -> dict[str, str]:
    """Each actor of ``actor_ids`` its own bundle; their allow-list entries (Z85 -> identity)."""
    entries = {}
    for actor_id in actor_ids:
        bundle = keys_dir / OWN_ACTOR_BUNDLE.format(actor_id)
        if bundle.exists():
            raise FileExistsError(f"{bundle} already exists: a run may use its key")
        _private_dir(bundle)
        entries[_z85(_new_pair(bundle, "actor"))] = actor_identity(actor_id)
        _copy_server_keys(keys_dir, bundle)
    return entries


def _new_pair(where: Path, role: str) -> Path:
    """A new key pair of ``role`` in ``where``, its secret file mode 0600; the public file."""
    public_file, secret_file = zmq.auth.create_certificates(where, role)
    os.chmod(secret_file, 0o600)
    return Path(public_file)


def _copy_server_keys(keys_dir: Path, bundle: Path) -> None:
    for server in SERVER_ROLES:
        shutil.copyfile(keys_dir / SERVERS_BUNDLE / f"{server}.key", bundle / f"{server}.key")


def _z85(public_file: Path) -> str:
    return zmq.auth.load_certificate(public_file)[0].decode()


def _write_allow_list(path: Path, allow_list: dict[str, str]) -> None:
    written = path.with_name(path.name + ".new")
    written.write_text(json.dumps(allow_list, indent=1) + "\n")
    os.replace(written, path)


def _private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)


def has_keys(keys_dir: Path) -> bool:
    """Whether ``keys_dir`` holds a whole run's keys: every bundle of ``make_keys``, or every
    file of the flat layout of earlier versions."""
    return has_bundles(keys_dir) or all(p.exists() for p in _flat_files(Path(keys_dir)))


def has_bundles(keys_dir: Path) -> bool:
    """Whether ``keys_dir`` holds every bundle ``make_keys`` writes, complete: the actors'
    shared one, or at least one actor's own."""
    keys_dir = Path(keys_dir)

    def whole(bundle: str) -> bool:
        return all((keys_dir / bundle / f).exists() for f in bundle_files(bundle))

    actors = [ACTORS_BUNDLE] + [OWN_ACTOR_BUNDLE.format(i) for i in own_actor_ids(keys_dir)]
    return all(whole(b) for b in BUNDLES if b != ACTORS_BUNDLE) and any(map(whole, actors))


def _flat_files(keys_dir: Path) -> list[Path]:
    files = [keys_dir / ALLOW_LIST]
    for role in ROLES:
        files += [keys_dir / f"{role}.key", keys_dir / f"{role}.key_secret"]
    return files


def bundle_dir(keys_dir: Path, identity: str) -> Path:
    """Where a client of ``identity`` (a role, or ``actor:<i>``) reads its keys: in a whole
    run's keys its bundle (an actor's own before the shared one), else ``keys_dir``."""
    role, actor_id = split_identity(identity)
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles with keys: {', '.join(ROLES)}")
    if (
        actor_id is not None
        and (own := Path(keys_dir) / OWN_ACTOR_BUNDLE.format(actor_id)).is_dir()
    ):
        return own
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


def actor_bundle(keys_dir: Path, actor_id: int) -> Path:
    """The bundle a launcher hands actor ``actor_id`` of a run's keys ``keys_dir``: its own, or
    the actors' shared one where only that is there (keys made without ``--actors``); its own
    where neither is there yet (the launchers make keys with one per actor)."""
    own = Path(keys_dir) / OWN_ACTOR_BUNDLE.format(actor_id)
    shared = Path(keys_dir) / ACTORS_BUNDLE
    return shared if shared.is_dir() and not own.is_dir() else own


def _role_keys(keys_dir: Path, identity: str) -> tuple[Path, bytes, bytes]:
    """The directory a client of ``identity`` reads its keys from, and its key pair;
    ``StartupError`` naming the bundle it needs when that directory holds no secret key of its
    role, or is another actor's own."""
    if not keys_dir.is_dir():
        raise StartupError(
            f"net.keys_dir {keys_dir} is not a directory: make a run's keys with `apexrl keys "
            "DIR` and give this host its bundle"
        )
    role, actor_id = split_identity(identity)
    where = bundle_dir(keys_dir, identity)
    owner = _own_bundle_owner(where)
    if owner is not None and actor_id is not None and owner != actor_id:
        raise StartupError(
            f"{where} is the bundle of actor {owner}: actor {actor_id} needs its own, "
            f"{OWN_ACTOR_BUNDLE.format(actor_id)} (`apexrl keys DIR --actors N` or --add-actors)"
        )
    secret_file = where / f"{role}.key_secret"
    if not secret_file.exists():
        bundle = BUNDLE_OF[role]
        made = keys_dir.parent if keys_dir.name in BUNDLES else Path("DIR")
        if actor_id is not None and own_actor_ids(keys_dir):
            raise StartupError(
                f"this keys directory ({keys_dir}) holds no key of actor {actor_id}: give it "
                f"one with `apexrl keys {keys_dir} --add-actors 1` (the new ids follow the "
                "highest there)"
            )
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
    """The allow-list file: client public key (Z85) -> identity, each one of ``CLIENT_ROLES`` or
    ``actor:<i>``."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise StartupError(f"CURVE allow-list {path} cannot be read: {exc}") from exc
    if not isinstance(data, dict):
        raise StartupError(f"CURVE allow-list {path} must map public keys to roles")
    client_roles = {}
    for key, identity in data.items():
        if (
            not isinstance(identity, str)
            or split_identity(identity)[0] not in CLIENT_ROLES
            or len(key) != 40
        ):
            raise StartupError(
                f"CURVE allow-list {path}: {key!r} -> {identity!r} is not a 40-character Z85 "
                f"public key and one of the roles {', '.join(CLIENT_ROLES)} (or actor:<id>)"
            )
        client_roles[key.encode()] = identity
    return client_roles


class AllowList:
    """The clients a CURVE server admits: public key (Z85) -> identity, for its ZAP handler at
    each handshake, and ``admits`` for each message of a connection made before (a key revoked
    since gets nothing). Its file is read again when it has changed: at the handshake of a key not
    among them (a run that ``apexrl keys DIR --add-actors`` grew) and at most every
    ``RELOAD_S`` for ``admits`` (``--revoke-actor``); a file that cannot be read leaves the list as
    it was, with a warning."""

    RELOAD_S = 1.0

    def __init__(self, client_roles: dict[bytes, str], path: Path | None = None) -> None:
        self.path, self.client_roles = path, dict(client_roles)
        self.stamp = self._stamp()
        self.checked = time.monotonic()

    def identity(self, public_key: bytes) -> str | None:
        found = self.client_roles.get(public_key)
        if found is None and self._reload():
            found = self.client_roles.get(public_key)
        return found

    def admits(self, user_id: str) -> bool:
        """Whether a connection whose handshake gave it ``user_id`` (``zap_reply``:
        ``<identity>@<its public key>``) may still send: its key is still listed, as that."""
        if time.monotonic() - self.checked >= self.RELOAD_S:
            self._reload()
        identity, _, public_key = user_id.partition("@")
        return self.client_roles.get(public_key.encode()) == identity

    def _reload(self) -> bool:
        """Read the file again when it changed; whether it did."""
        self.checked = time.monotonic()
        stamp = self._stamp()
        if self.path is None or stamp == self.stamp:
            return False
        self.stamp = stamp
        try:
            self.client_roles = load_allow_list(self.path)
        except StartupError as exc:
            log.warning("kept the allow-list as it was: %s", exc)
        return True

    def _stamp(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            stat = self.path.stat()
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size, stat.st_ino


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
    unless ``net.insecure``. Warns when the allow-list admits a key shared by the actors: any of
    them may speak as any other.
    """
    addr = {"replay": net.replay_addr, "params": net.params_addr}[role]
    if not net.keys_dir:
        check_bind_without_keys(net, addr, f"{role} server", "control the run")
        return None
    where, public_key, secret_key = _role_keys(Path(net.keys_dir), role)
    client_roles = load_allow_list(where / ALLOW_LIST)
    if "actor" in client_roles.values():
        log.warning(
            "%s server: the actors share one key, so any of them can send chunks, reports and "
            "league results as any other actor id; give each its own with `apexrl keys DIR "
            "--actors N`",
            role,
        )
    return ServerKeys(public_key, secret_key, client_roles, where / ALLOW_LIST)


def client_keys(net: NetConfig, identity: str, server: str) -> ClientKeys | None:
    """The keys a client of ``identity`` (a role, or ``actor:<i>``: an actor's own key where it
    has one) connects to the ``server`` with; None without keys."""
    if not net.keys_dir:
        return None
    if server not in SERVER_ROLES:
        raise ValueError(f"unknown server {server!r}; servers: {', '.join(SERVER_ROLES)}")
    where, public_key, secret_key = _role_keys(Path(net.keys_dir), identity)
    server_key, _ = _load(where / f"{server}.key", secret=False)
    return ClientKeys(public_key, secret_key, server_key)


def external_server_keys(net: NetConfig, addr: str, actor_id: int) -> ServerKeys | None:
    """The keys a policy server (``apexrl external``, actor ``actor_id``) binds ``addr`` with:
    that actor's own pair (else the actors' shared one), admitting that key only, so that a
    client needs exactly what the actor holds (its bundle); None without keys (``StartupError``
    off loopback, unless ``net.insecure``)."""
    if not net.keys_dir:
        check_bind_without_keys(net, addr, "policy server", "feed the run")
        return None
    _, public_key, secret_key = _role_keys(Path(net.keys_dir), actor_identity(actor_id))
    return ServerKeys(public_key, secret_key, {public_key: "actor"})


def external_client_keys(keys_dir: str) -> ClientKeys | None:
    """The keys a ``PolicyClient`` connects to a policy server with: the actor's bundle (its
    own, or the shared one) that the server holds, the server's public key being that actor
    key; None without keys."""
    if not keys_dir:
        return None
    _, public_key, secret_key = _role_keys(Path(keys_dir), "actor")
    return ClientKeys(public_key, secret_key, public_key)


def zap_reply(request: list[bytes], allow_list: AllowList) -> list[bytes]:
    """The ZAP reply (RFC 27) to one request: 200 with the User-Id ``<identity>@<public key>``
    for a CURVE client in the allow-list, 400 for anyone else."""
    version, request_id, mechanism = request[0], request[1], request[5]
    credentials = request[6:]
    if version != b"1.0":
        return [b"1.0", request_id, b"500", b"unsupported ZAP version", b"", b""]
    if mechanism == b"CURVE" and len(credentials) == 1 and len(credentials[0]) == 32:
        public_key = z85.encode(credentials[0])
        identity = allow_list.identity(public_key)
        if identity is not None:  # the key in the User-Id too: a revoked key is told apart
            user_id = identity.encode() + b"@" + public_key
            return [b"1.0", request_id, b"200", b"OK", user_id, b""]
    log.warning("refused a %s client from %s", mechanism.decode(errors="replace"), request[3])
    return [b"1.0", request_id, b"400", b"not in the allow-list", b"", b""]


def start_zap_handler(ctx: zmq.Context, allow_list: AllowList) -> threading.Thread:
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
    thread = threading.Thread(target=_serve_zap, args=(zap, allow_list), daemon=True, name="zap")
    thread.start()
    return thread


def _serve_zap(zap: zmq.Socket, allow_list: AllowList) -> None:
    try:
        while True:
            zap.send_multipart(zap_reply(zap.recv_multipart(), allow_list))
    except zmq.ZMQError:  # the context is terminating (or destroyed): stop answering
        pass
    finally:
        zap.close(linger=0)

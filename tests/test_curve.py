"""CURVE keys and role permissions: ``apexrl keys`` and its bundles (a host holds only its own
roles' secrets: the learner does not start with the actors' bundle), the permission table, the ZAP
answers, servers started by hand with keys (strangers get no reply, an actor's key cannot send
what only the learner may), the refusal to bind a public address without keys, and a launched run
that trains with CURVE on."""

from __future__ import annotations

import dataclasses
import json
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import builders
import numpy as np
import pytest
import zmq
from conftest import (
    CONFIG,
    REPO,
    SMALL_OVERRIDES,
    Processes,
    free_port,
    request,
    set_args,
    wait_until,
)
from test_launch_local import Launch, launch  # noqa: F401 - the launcher fixture
from zmq.utils import z85

from apexrl.config import NetConfig, load_config
from apexrl.runtime.lifecycle import StartupError
from apexrl.transport import auth, sockets
from apexrl.transport.messages import (
    ActorReport,
    Error,
    InsertAck,
    Message,
    ParamsNotModified,
    ParamsRequest,
    PriorityUpdate,
    PublishedVersion,
    PublishParams,
    RestoreCounters,
    SampleRequest,
    Shutdown,
    Stats,
    StatsRequest,
    TrajectoryChunk,
)

NO_REPLY_S = 1.5  # how long a refused peer waits for the reply that must not come


def report(is_eval: bool) -> ActorReport:
    return ActorReport(0, 1, is_eval, 10, 0, np.array([9.0]), np.array([10]))


def chunk(num_items: int = 8) -> TrajectoryChunk:
    """A valid chunk of Ape-X CartPole transitions."""
    return builders.chunk(builders.config(), np.ones(num_items))


MESSAGES: dict[str, Message] = {
    "chunk": chunk(),
    "train_report": report(is_eval=False),
    "eval_report": report(is_eval=True),
    "stats": StatsRequest(),
    "params": ParamsRequest(-1),
    "sample": SampleRequest("apex_dqn", 32),
    "priorities": PriorityUpdate("apex_dqn", 0, np.array([1]), np.array([0.5])),
    "restore": RestoreCounters(100),
    "published": PublishedVersion(3),
    "publish": PublishParams(1, 0, {"w": np.ones(2, np.float32)}),
    "shutdown": Shutdown("test"),
}
# The permission table written out: what each role may send, everything else is refused.
MAY_SEND = {
    "learner": {
        "stats",
        "params",
        "sample",
        "priorities",
        "restore",
        "published",
        "publish",
        "shutdown",
    },
    "actor": {"chunk", "train_report", "stats", "params"},
    "eval": {"eval_report", "stats", "params"},
    "replay": set(),
    "params": set(),
    "stranger": set(),
}


# --- the permission table, ZAP answers, addresses (pure) ----------------------------------------


@pytest.mark.parametrize("role", sorted(MAY_SEND))
def test_each_role_may_send_exactly_its_messages(role: str) -> None:
    allowed = {name for name, msg in MESSAGES.items() if auth.allowed(role, msg)}
    assert allowed == MAY_SEND[role]


def test_without_curve_every_message_is_allowed() -> None:
    assert all(auth.allowed(None, msg) for msg in MESSAGES.values())


def test_refusals_name_the_role_and_what_it_sent() -> None:
    assert auth.refusal("actor", MESSAGES["publish"]) == "role 'actor' may not send PublishParams"
    assert auth.refusal("actor", MESSAGES["eval_report"]) == (
        "role 'actor' may not send an evaluation report"
    )
    assert auth.refusal("eval", MESSAGES["train_report"]) == (
        "role 'eval' may not send a training report"
    )
    assert auth.refusal("learner", MESSAGES["shutdown"]) is None


def zap_request(mechanism: bytes, *credentials: bytes) -> list[bytes]:
    return [b"1.0", b"7", b"", b"127.0.0.1", b"", mechanism, *credentials]


def test_zap_admits_listed_curve_keys_with_their_role_and_key_as_user_id() -> None:
    listed_public, _ = zmq.curve_keypair()
    other_public, _ = zmq.curve_keypair()
    client_roles = {listed_public: "actor"}
    listed = auth.zap_reply(
        zap_request(b"CURVE", z85.decode(listed_public)), auth.AllowList(client_roles)
    )
    assert listed == [b"1.0", b"7", b"200", b"OK", b"actor@" + listed_public, b""]
    assert auth.split_identity((b"actor@" + listed_public).decode()) == ("actor", None)
    other = auth.zap_reply(
        zap_request(b"CURVE", z85.decode(other_public)), auth.AllowList(client_roles)
    )
    assert other[:3] == [b"1.0", b"7", b"400"] and other[4] == b""
    assert auth.zap_reply(zap_request(b"NULL"), auth.AllowList(client_roles))[2] == b"400"


@pytest.mark.parametrize(
    ("addr", "loopback"),
    [
        ("tcp://127.0.0.1:6000", True),
        ("tcp://127.0.0.2:6000", True),
        ("tcp://localhost:6000", True),
        ("tcp://[::1]:6000", True),
        ("ipc:///tmp/replay", True),
        ("tcp://0.0.0.0:6000", False),
        ("tcp://*:6000", False),
        ("tcp://10.0.0.5:6000", False),
        ("tcp://eth0:6000", False),
    ],
)
def test_loopback_addresses(addr: str, loopback: bool) -> None:
    assert auth.is_loopback(addr) is loopback


def test_a_server_without_keys_binds_loopback_or_insecure_only() -> None:
    public = NetConfig(replay_addr="tcp://0.0.0.0:6000", params_addr="tcp://*:6001")
    for server in ("replay", "params"):
        with pytest.raises(StartupError, match="without CURVE keys"):
            auth.server_keys(public, server)
        assert auth.server_keys(NetConfig(), server) is None
        assert (
            auth.server_keys(NetConfig(replay_addr="tcp://0.0.0.0:6000", insecure=True), server)
            is None
        )


# --- keys on disk -------------------------------------------------------------------------------


def test_keys_command_writes_a_bundle_per_kind_of_host_with_only_its_secrets(
    tmp_path: Path,
) -> None:
    keys_dir = tmp_path / "keys"
    done = subprocess.run(
        [sys.executable, "-m", "apexrl", "keys", str(keys_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"{keys_dir / 'actors'}   the actors' hosts\n" in done.stdout, done.stdout
    assert stat.S_IMODE(keys_dir.stat().st_mode) == 0o700
    # Written out: which secret keys each bundle holds, and which public keys beside them.
    secrets = {"servers": {"replay", "params"}, "learner": {"learner"}, "actors": {"actor"}}
    secrets["eval"] = {"eval"}
    assert {p.name for p in keys_dir.iterdir()} == set(secrets)
    publics = {}
    for bundle, roles in secrets.items():
        bundle_dir = keys_dir / bundle
        assert stat.S_IMODE(bundle_dir.stat().st_mode) == 0o700
        held = {p.name.removesuffix(".key_secret") for p in bundle_dir.glob("*.key_secret")}
        assert held == roles, f"{bundle} holds the secret keys of {held}"
        for role in roles:
            public, secret = zmq.auth.load_certificate(bundle_dir / f"{role}.key_secret")
            assert zmq.auth.load_certificate(bundle_dir / f"{role}.key") == (public, None)
            assert len(public) == len(secret) == 40
            assert stat.S_IMODE((bundle_dir / f"{role}.key_secret").stat().st_mode) == 0o600
            publics[role] = public.decode()
    assert len(set(publics.values())) == 5, "every role has its own pair"
    for bundle in ("learner", "actors", "eval"):  # a client holds the servers' public keys
        for server in ("replay", "params"):
            public, secret = zmq.auth.load_certificate(keys_dir / bundle / f"{server}.key")
            assert (public.decode(), secret) == (publics[server], None)
        assert not (keys_dir / bundle / "allow_list.json").exists()
    allow_list = json.loads((keys_dir / "servers" / "allow_list.json").read_text())
    assert allow_list == {publics[r]: r for r in ("learner", "actor", "eval")}
    assert auth.has_keys(keys_dir) and auth.has_bundles(keys_dir)

    again = subprocess.run(
        [sys.executable, "-m", "apexrl", "keys", str(keys_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 2
    assert again.stderr.count("\n") == 1 and "already holds CURVE keys" in again.stderr
    assert json.loads((keys_dir / "servers" / "allow_list.json").read_text()) == allow_list


def test_a_role_reads_its_bundle_or_the_whole_directory_and_no_other_bundle(
    tmp_path: Path,
) -> None:
    keys_dir = tmp_path / "keys"
    auth.make_keys(keys_dir)

    def keys_of(where: Path, role: str) -> bytes:
        net = NetConfig(keys_dir=str(where))
        if role in auth.SERVER_ROLES:
            return auth.server_keys(net, role).public_key
        return auth.client_keys(net, role, "replay").public_key

    for bundle, roles in auth.BUNDLES.items():
        for role in auth.ROLES:
            if role in roles:
                assert keys_of(keys_dir / bundle, role) == keys_of(keys_dir, role)
                continue
            needed = auth.BUNDLE_OF[role]
            with pytest.raises(StartupError) as refused:
                keys_of(keys_dir / bundle, role)
            assert str(refused.value) == (
                f"this keys directory ({keys_dir / bundle}) holds no {role} secret key: "
                f"{auth.ROLE_NAMES[role]} needs the {needed} bundle ({keys_dir / needed}) of "
                "`apexrl keys DIR`"
            )
    with pytest.raises(StartupError, match="is not a directory"):
        keys_of(tmp_path / "nothing", "actor")


def test_keys_in_the_flat_layout_of_earlier_versions_still_work_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every pair and the allow-list in one directory, as ``apexrl keys`` wrote them before."""
    made, flat = tmp_path / "made", tmp_path / "flat"
    auth.make_keys(made)
    flat.mkdir(mode=0o700)
    for path in made.glob("*/*"):
        (flat / path.name).write_bytes(path.read_bytes())
    assert auth.has_keys(flat) and not auth.has_bundles(flat)
    net = NetConfig(keys_dir=str(flat))
    with caplog.at_level("WARNING", logger="apexrl.transport.auth"):
        server = auth.server_keys(net, "replay")
        client = auth.client_keys(net, "actor", "replay")
    assert server.client_roles[client.public_key] == "actor"
    assert client.server_key == server.public_key
    assert "holds every role's secret key" in caplog.text
    caplog.clear()
    auth.client_keys(NetConfig(keys_dir=str(made)), "actor", "replay")
    assert caplog.text == "", "the whole directory of bundles is no flat layout"


def test_the_learner_does_not_start_with_the_actors_bundle(
    procs: Processes, tmp_path: Path
) -> None:
    """A host that holds only the actors' bundle cannot act as the learner."""
    keys_dir = tmp_path / "keys"
    auth.make_keys(keys_dir)
    learner = procs.start(
        "learner", "learner", "--config", str(CONFIG), "--run-dir", str(tmp_path / "run"),
        "--replay", f"tcp://127.0.0.1:{free_port()}", "--params", f"tcp://127.0.0.1:{free_port()}",
        "--keys", str(keys_dir / "actors"), *set_args(SMALL_OVERRIDES),
    )  # fmt: skip
    code = learner.wait(60.0)
    assert code == 2, f"exit code {code}\n{learner.tail()}"
    text = learner.log()
    errors = [line for line in text.splitlines() if line.startswith("apexrl learner: error:")]
    assert errors == [
        f"apexrl learner: error: this keys directory ({keys_dir / 'actors'}) holds no learner "
        f"secret key: the learner needs the learner bundle ({keys_dir / 'learner'}) of "
        "`apexrl keys DIR`"
    ], learner.tail()
    assert "Traceback" not in text, learner.tail()


# --- servers started by hand with keys -----------------------------------------------------------


def curve_request(
    addr: str, msg: Message, curve: auth.ClientKeys | None, timeout_s: float = 5.0
) -> Message | None:
    """Send ``msg`` from a fresh DEALER (a CURVE client with ``curve``); its reply or None."""
    ctx = sockets.make_context()
    with sockets.closing(ctx):
        sock = sockets.connect(ctx, zmq.DEALER, addr, curve=curve)
        sockets.send(sock, msg)
        return sockets.recv(sock, timeout_ms=int(timeout_s * 1000))


def replies_within(
    addr: str, sends: list[tuple[Message, auth.ClientKeys | None]], timeout_s: float
) -> list[Message | None]:
    """Send each message from its own fresh DEALER (a CURVE client where keys are given) all at
    once, then wait ``timeout_s`` once for them all: each one's reply, or None. A stranger's
    socket may have no connection left to send on (the server refused its handshake before the
    send): its message goes nowhere, and it gets None."""
    ctx = sockets.make_context()
    with sockets.closing(ctx):
        socks = [
            sockets.connect(ctx, zmq.DEALER, addr, curve=curve, send_timeout_ms=1000)
            for _msg, curve in sends
        ]
        poller = zmq.Poller()
        for sock, (msg, _curve) in zip(socks, sends, strict=True):
            try:
                sockets.send(sock, msg)
            except zmq.Again:
                continue
            poller.register(sock, zmq.POLLIN)
        replies: list[Message | None] = [None] * len(socks)
        deadline = time.monotonic() + timeout_s
        while poller.sockets and (left_ms := int((deadline - time.monotonic()) * 1000)) > 0:
            for sock, _event in poller.poll(left_ms):
                replies[socks.index(sock)] = sockets.recv(sock, timeout_ms=0)
                poller.unregister(sock)
        return replies


def stats_as(net: NetConfig, server: str, role: str = "learner") -> dict[str, float]:
    addr = net.replay_addr if server == "replay" else net.params_addr
    reply = curve_request(addr, StatsRequest(), auth.client_keys(net, role, server))
    assert isinstance(reply, Stats), f"{server} answered {reply!r}"
    return reply.values


def test_servers_with_keys_admit_only_the_allow_list_and_each_role_to_its_messages(
    procs: Processes, tmp_path: Path
) -> None:
    keys_dir = tmp_path / "keys"
    auth.make_keys(keys_dir)
    replay_port, params_port = free_port(), free_port()
    # With keys a server may bind every interface; peers reach it on loopback here.
    net = NetConfig(
        replay_addr=f"tcp://127.0.0.1:{replay_port}",
        params_addr=f"tcp://127.0.0.1:{params_port}",
        keys_dir=str(keys_dir),
    )
    servers_bundle = ["--keys", str(keys_dir / "servers")]  # the servers' host holds only it
    common = ["--config", str(CONFIG), "--run-dir", str(tmp_path / "run"), *servers_bundle]
    small = set_args(SMALL_OVERRIDES)
    servers = {
        "replay": procs.start(
            "replay", "replay", *common, "--bind", f"tcp://0.0.0.0:{replay_port}", *small
        ),
        "params": procs.start(
            "params", "params", *common, "--bind", f"tcp://0.0.0.0:{params_port}", *small
        ),
    }
    for name in servers:
        up = wait_until(lambda name=name: _answers(net, name), 60.0)
        assert up, f"{name} did not answer the learner's key\n{procs.tails()}"

    # Strangers: no key at all, and a key pair that is not in the allow-list. Neither gets any
    # reply, whatever it sends, and nothing changes.
    own_public, own_secret = zmq.curve_keypair()
    for server, addr in (("replay", net.replay_addr), ("params", net.params_addr)):
        unlisted = auth.ClientKeys(
            own_public, own_secret, auth.client_keys(net, "learner", server).server_key
        )
        messages = (StatsRequest(), chunk(), MESSAGES["publish"], Shutdown("stranger"))
        sends = [(msg, curve) for msg in messages for curve in (None, unlisted)]
        replies = replies_within(addr, sends, NO_REPLY_S)
        assert replies == [None] * len(sends), f"{server} answered a stranger: {replies}"
        # The same wait hears a reply that does come: the learner's own key is answered.
        learner_keys = auth.client_keys(net, "learner", server)
        (answer,) = replies_within(addr, [(StatsRequest(), learner_keys)], 10.0)
        assert isinstance(answer, Stats), answer
    replay_stats, params_stats = stats_as(net, "replay"), stats_as(net, "params")
    assert replay_stats["replay/size"] == 0
    assert replay_stats["replay/rejected_messages"] == 0, "no stranger's message got in"
    assert params_stats["params/version"] == -1
    assert params_stats["params/rejected_messages"] == 0

    # An actor host's bundle: it may insert and ask for weights; whatever only the learner may
    # send (sample, update priorities, publish, restore, stop) is refused.
    actors_bundle = dataclasses.replace(net, keys_dir=str(keys_dir / "actors"))
    actor_replay = auth.client_keys(actors_bundle, "actor", "replay")
    actor_params = auth.client_keys(actors_bundle, "actor", "params")
    assert isinstance(curve_request(net.replay_addr, chunk(), actor_replay), InsertAck)
    refused = {
        "publish": curve_request(net.params_addr, MESSAGES["publish"], actor_params),
        "params shutdown": curve_request(net.params_addr, Shutdown("actor"), actor_params),
        "replay shutdown": curve_request(net.replay_addr, Shutdown("actor"), actor_replay),
        "restore": curve_request(net.replay_addr, RestoreCounters(10**6), actor_replay),
        "sample": curve_request(net.replay_addr, SampleRequest("apex_dqn", 4), actor_replay),
        "priorities": curve_request(net.replay_addr, MESSAGES["priorities"], actor_replay),
        "eval report": curve_request(net.replay_addr, report(is_eval=True), actor_replay),
    }
    for what, reply in refused.items():
        assert isinstance(reply, Error) and "role 'actor' may not send" in reply.reason, (
            f"{what}: {reply!r}"
        )
    eval_params = auth.client_keys(net, "eval", "params")
    reply = curve_request(net.params_addr, ParamsRequest(-1), eval_params)
    assert isinstance(reply, ParamsNotModified), f"no weights yet, got {reply!r}"
    assert all(p.alive() for p in servers.values()), procs.tails()
    replay_stats, params_stats = stats_as(net, "replay", "eval"), stats_as(net, "params", "actor")
    assert replay_stats["replay/size"] == 8, "the actor's chunk, and only it"
    assert replay_stats["replay/priority_updates"] == 0
    assert replay_stats["replay/rejected_messages"] == 5
    assert params_stats["params/version"] == -1
    assert params_stats["params/rejected_messages"] == 2

    # `apexrl stop` speaks as the learner: with the learner's bundle, the servers stop.
    stopper = procs.start(
        "stop", "stop", "--replay", net.replay_addr, "--params", net.params_addr,
        "--keys", str(keys_dir / "learner"),
    )  # fmt: skip
    assert stopper.wait(30.0) == 0, procs.tails()
    for name, proc in servers.items():
        assert proc.wait(30.0) == 0, f"{name} did not stop on the learner's Shutdown\n{proc.tail()}"


def _answers(net: NetConfig, server: str) -> bool:
    addr = net.replay_addr if server == "replay" else net.params_addr
    reply = curve_request(addr, StatsRequest(), auth.client_keys(net, "learner", server), 0.5)
    return isinstance(reply, Stats)


@pytest.mark.parametrize("server", ["replay", "params"])
def test_a_server_refuses_a_public_address_without_keys(
    server: str, procs: Processes, tmp_path: Path
) -> None:
    proc = procs.start(
        server, server, "--config", str(CONFIG), "--run-dir", str(tmp_path / "run"),
        "--bind", f"tcp://0.0.0.0:{free_port()}",
    )  # fmt: skip
    code = proc.wait(60.0)
    assert code == 2, f"exit code {code}\n{proc.tail()}"
    text = proc.log()
    errors = [line for line in text.splitlines() if line.startswith(f"apexrl {server}: error:")]
    assert len(errors) == 1 and "without CURVE keys" in errors[0], proc.tail()
    assert "--insecure" in errors[0]
    assert "Traceback" not in text, proc.tail()


def test_a_server_binds_a_public_address_with_insecure(procs: Processes, tmp_path: Path) -> None:
    port = free_port()
    proc = procs.start(
        "replay", "replay", "--config", str(CONFIG), "--run-dir", str(tmp_path / "run"),
        "--bind", f"tcp://0.0.0.0:{port}", "--insecure",
    )  # fmt: skip
    reply = wait_until(
        lambda: request(f"tcp://127.0.0.1:{port}", StatsRequest(), 0.5) if proc.alive() else "dead",
        60.0,
    )
    assert isinstance(reply, Stats), f"{reply!r}\n{proc.tail()}"
    code, _ = proc.stop(10.0)
    assert code == 0, proc.tail()


# --- the learner group's rendezvous -------------------------------------------------------------


def listening_addresses(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp* writes them) of the sockets listening on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, _remote, state = line.split()[1:4]
            address, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                found.append(address)
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs /proc/net/tcp")
def test_rendezvous_store_listens_on_its_host_only() -> None:
    import torch

    from apexrl.learning.group import LearnerGroup

    port = free_port()
    group = LearnerGroup(0, 1, f"tcp://127.0.0.1:{port}", 30.0, 30.0, torch.device("cpu"))
    try:
        assert listening_addresses(port) == ["0100007F"], "127.0.0.1 only, not every interface"
    finally:
        group.close()


# --- a launched run ------------------------------------------------------------------------------


def test_launched_run_trains_with_curve_and_ignores_strangers(
    launch: Callable[..., Launch],  # noqa: F811
) -> None:
    # No stop condition (the small overrides): the run goes on until `apexrl stop`.
    launched = launch("--actors", "2", "--learners", "1")
    first = wait_until(lambda: [r for r in launched.results() if r["learner_updates"] > 0], 90.0)
    assert first, f"the learner never reported updates\n{launched.tails()}"
    run_dir = launched.run_dir()
    cfg = load_config(run_dir / "config.yaml")
    assert Path(cfg.net.keys_dir) == run_dir / "keys" and auth.has_keys(run_dir / "keys")
    assert auth.own_actor_ids(run_dir / "keys") == [0, 1], "each actor its own key"
    assert not (run_dir / "keys" / "actors").exists()
    net = cfg.net
    updates_before = first[-1]["learner_updates"]
    size_before = stats_as(net, "replay")["replay/size"]

    own_public, own_secret = zmq.curve_keypair()
    for server, addr in (("replay", net.replay_addr), ("params", net.params_addr)):
        unlisted = auth.ClientKeys(
            own_public, own_secret, auth.client_keys(net, "learner", server).server_key
        )
        assert request(addr, Shutdown("no key"), timeout_s=NO_REPLY_S) is None
        assert curve_request(addr, Shutdown("unlisted"), unlisted, NO_REPLY_S) is None
        actor_key = auth.client_keys(net, auth.actor_identity(0), server)
        actor = curve_request(addr, Shutdown("actor"), actor_key)
        assert isinstance(actor, Error), f"{server} answered the actor's Shutdown with {actor!r}"
    actor_params = auth.client_keys(net, auth.actor_identity(0), "params")
    publish = curve_request(net.params_addr, MESSAGES["publish"], actor_params)
    assert isinstance(publish, Error) and "may not send PublishParams" in publish.reason
    # Actor 0's key cannot report as actor 1 (its episodes, its custom metrics' quota).
    actor_replay = auth.client_keys(net, auth.actor_identity(0), "replay")
    as_other = dataclasses.replace(report(is_eval=False), actor_id=1)
    refused = curve_request(net.replay_addr, as_other, actor_replay)
    assert isinstance(refused, Error) and "key of actor 0" in refused.reason, refused

    later = wait_until(
        lambda: [r for r in launched.results() if r["learner_updates"] > updates_before + 5],
        90.0,
    )
    assert later, f"the learner stopped updating\n{launched.tails()}"
    assert max(r["replay_size"] for r in launched.results()) > size_before
    assert launched.popen.poll() is None, f"the run stopped\n{launched.tails()}"

    # `apexrl stop` reads the run's config.yaml and so its keys: the learner's key stops it.
    stopper = subprocess.run(
        [sys.executable, "-m", "apexrl", "stop", "--run-dir", str(run_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert stopper.returncode == 0, stopper.stderr
    code = launched.wait(60.0)
    assert code == 0, f"launcher exit code {code}\n{launched.tails()}"
    assert "stopped on request" in launched.log(), launched.tails()

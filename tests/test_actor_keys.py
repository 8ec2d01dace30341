"""Each actor its own CURVE key, bound to its actor id: ``apexrl keys DIR --actors N`` and
``--add-actors K``, the bound id checked against what a message says it is from (chunks,
reports with their custom metrics, league results), servers started by hand that refuse an
actor's key speaking as another actor and admit keys added while they run, and the shared key of
earlier runs still working, with a warning."""

from __future__ import annotations

import dataclasses
import json
import logging
import stat
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
from conftest import (
    CONFIG,
    SMALL_OVERRIDES,
    Processes,
    free_port,
    run_apexrl,
    set_args,
    wait_until,
)
from test_curve import NO_REPLY_S, chunk, curve_request, stats_as

from apexrl.config import NetConfig
from apexrl.runtime.lifecycle import StartupError
from apexrl.transport import auth, sockets
from apexrl.transport.messages import (
    ActorReport,
    Error,
    InsertAck,
    MatchRequest,
    Message,
    Stats,
    StatsRequest,
)


def keys_command(*args: str) -> subprocess.CompletedProcess:
    return run_apexrl("keys", *args, timeout_s=60)


def report_as(actor_id: int, **metrics: float) -> ActorReport:
    return ActorReport(
        actor_id, 1, False, 10, 0, np.array([9.0]), np.array([10]), custom_metrics=metrics
    )


def as_actor(actor_id: int) -> dict[str, Message]:
    """What an actor sends the servers, each naming ``actor_id`` as its sender."""
    return {
        "chunk": dataclasses.replace(chunk(), actor_id=actor_id),
        "report": report_as(actor_id),
        "custom metrics": report_as(actor_id, **{"custom/score": 1.0}),
        "league results": MatchRequest(actor_id, 1),
    }


def allow_list(keys_dir: Path) -> dict[str, str]:
    return json.loads((keys_dir / "servers" / "allow_list.json").read_text())


def server_allow_list(tmp_path: Path, actors: int) -> tuple[Path, auth.AllowList]:
    """A run's keys with ``actors`` own actor keys, and its allow-list as a server holds it."""
    keys_dir = tmp_path / "keys"
    auth.make_keys(keys_dir, actors=actors)
    path = keys_dir / "servers" / "allow_list.json"
    return keys_dir, auth.AllowList(auth.load_allow_list(path), path)


# --- the keys and the rule (pure) ----------------------------------------------------------------


def test_keys_with_actors_give_each_actor_its_own_key_bound_to_its_id(tmp_path: Path) -> None:
    keys_dir = tmp_path / "keys"
    made = keys_command(str(keys_dir), "--actors", "3")
    assert made.returncode == 0, made.stderr
    for i in range(3):
        assert f"{keys_dir / f'actor_{i}'}  actor {i}'s host" in made.stdout, made.stdout
    assert not (keys_dir / "actors").exists(), "no key shared by the actors"
    assert auth.has_bundles(keys_dir) and auth.own_actor_ids(keys_dir) == [0, 1, 2]
    publics = {}
    for i in range(3):
        bundle = keys_dir / f"actor_{i}"
        files = {"actor.key", "actor.key_secret", "replay.key", "params.key"}
        assert {p.name for p in bundle.iterdir()} == files, "its own secret and nothing else"
        assert stat.S_IMODE((bundle / "actor.key_secret").stat().st_mode) == 0o600
        assert stat.S_IMODE(bundle.stat().st_mode) == 0o700
        publics[i] = (bundle / "actor.key").read_text()
    assert len(set(publics.values())) == 3, "three different key pairs"
    identities = sorted(allow_list(keys_dir).values())
    assert identities == ["actor:0", "actor:1", "actor:2", "eval", "learner"]

    # An actor finds its own key in the whole directory; a host given actor 1's bundle holds no
    # key of any other actor, and an actor started with another's bundle stops at start.
    whole = NetConfig(keys_dir=str(keys_dir))
    own = auth.client_keys(whole, auth.actor_identity(1), "replay")
    assert own.public_key.decode() in publics[1]
    given_one = NetConfig(keys_dir=str(keys_dir / "actor_1"))
    assert auth.client_keys(given_one, auth.actor_identity(1), "params").public_key == (
        own.public_key
    )
    with pytest.raises(StartupError, match=r"bundle of actor 1: actor 2 needs its own, actor_2"):
        auth.client_keys(given_one, auth.actor_identity(2), "replay")
    with pytest.raises(StartupError, match=r"no key of actor 7.*--add-actors 1"):
        auth.client_keys(whole, auth.actor_identity(7), "replay")


def test_add_actors_gives_new_ids_their_keys_and_keeps_the_others(tmp_path: Path) -> None:
    keys_dir = tmp_path / "keys"
    auth.make_keys(keys_dir, actors=2)
    before = allow_list(keys_dir)
    added = keys_command(str(keys_dir), "--add-actors", "2")
    assert added.returncode == 0, added.stderr
    assert "actors 2..3" in added.stdout and str(keys_dir / "actor_3") in added.stdout
    after = allow_list(keys_dir)
    assert before.items() <= after.items(), "the keys already there are unchanged"
    assert sorted(set(after.values()) - set(before.values())) == ["actor:2", "actor:3"]
    assert auth.own_actor_ids(keys_dir) == [0, 1, 2, 3]
    # Nothing to add to, a count that adds nothing, and --actors on keys already there: one line,
    # exit 2, nothing written.
    for args, reason in (
        ((str(tmp_path / "none"), "--add-actors", "1"), "holds no run's keys"),
        ((str(keys_dir), "--add-actors", "0"), None),
        ((str(keys_dir), "--actors", "2"), "already holds CURVE keys"),
    ):
        refused = keys_command(*args)
        assert refused.returncode == 2, refused
        if reason is not None:
            assert reason in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    assert not (tmp_path / "none").exists()
    assert allow_list(keys_dir) == after
    # Keys with one shared actor key do not know their actors' ids: new ones could collide.
    shared = tmp_path / "shared"
    auth.make_keys(shared)
    refused = keys_command(str(shared), "--add-actors", "1")
    assert refused.returncode == 2 and "one shared key" in refused.stderr, refused.stderr
    assert not (shared / "actor_0").exists()


def test_a_bound_key_may_send_only_as_its_own_actor_id() -> None:
    for what, msg in as_actor(1).items():
        assert auth.allowed("actor", msg, bound_id=1), what
        assert auth.allowed("actor", msg, bound_id=None), f"{what}: a shared key, any actor id"
        assert not auth.allowed("actor", msg, bound_id=0), what
        reason = auth.refusal("actor", msg, bound_id=0)
        assert reason == f"the key of actor 0 may not send {type(msg).__name__} as actor 1"
    # The role's own rules still hold for a bound key: an actor's key sends no evaluation report.
    eval_report = dataclasses.replace(report_as(0), is_eval=True)
    assert not auth.allowed("actor", eval_report, bound_id=0)
    assert auth.split_identity("actor:12") == ("actor", 12)
    assert auth.split_identity("learner") == ("learner", None)
    assert auth.split_identity("learner:3") == ("learner:3", None), "only actors are numbered"
    assert auth.split_identity("actor:x") == ("actor:x", None), "a role that may send nothing"


def test_the_allow_list_is_read_again_when_an_unknown_key_comes_after_a_change(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keys_dir, admitted = server_allow_list(tmp_path, actors=1)
    path = keys_dir / "servers" / "allow_list.json"
    (new_id,) = auth.add_actor_keys(keys_dir, 1)
    new_key = (keys_dir / f"actor_{new_id}" / "actor.key").read_text()
    z85_key = next(k for k, v in allow_list(keys_dir).items() if v == f"actor:{new_id}")
    assert z85_key in new_key
    assert admitted.identity(z85_key.encode()) == "actor:1"
    # A file that cannot be read leaves the list as it was, with a warning.
    path.write_text("{not json")
    assert admitted.identity(b"x" * 40) is None
    assert admitted.identity(z85_key.encode()) == "actor:1"
    assert "kept the allow-list as it was" in caplog.text


def test_a_revoked_key_is_no_longer_admitted_within_the_reload_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys_dir, admitted = server_allow_list(tmp_path, actors=2)
    monkeypatch.setattr(auth.AllowList, "RELOAD_S", 0.0)

    def user_id(identity: str) -> str:  # as the handshake names a connection: identity@key
        key = next(k for k, v in allow_list(keys_dir).items() if v == identity)
        return f"{identity}@{key}"

    old_actor_1, learner = user_id("actor:1"), user_id("learner")
    assert admitted.admits(old_actor_1) and admitted.admits(learner)
    assert not admitted.admits(old_actor_1.replace("actor:1", "actor:0")), "bound to its id"
    revoked = keys_command(str(keys_dir), "--revoke-actor", "1")
    assert revoked.returncode == 0, revoked.stderr
    assert not admitted.admits(old_actor_1) and admitted.admits(user_id("actor:0"))
    assert (keys_dir / "revoked_actor_1").is_dir() and not (keys_dir / "actor_1").exists()
    assert "actor:1" not in allow_list(keys_dir).values()
    again = keys_command(str(keys_dir), "--revoke-actor", "1")
    assert again.returncode == 2 and "holds no key of actor 1" in again.stderr
    # The id can get a new key; the revoked one stays out, its open connections too.
    (new_id,) = auth.add_actor_keys(keys_dir, 1)
    assert new_id == 1 and admitted.admits(user_id("actor:1"))
    assert not admitted.admits(old_actor_1)


def test_a_shared_actor_key_still_works_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keys_dir = tmp_path / "keys"
    auth.make_keys(keys_dir)  # the shared actors' bundle
    net = NetConfig(keys_dir=str(keys_dir))
    with caplog.at_level(logging.WARNING):
        keys = auth.server_keys(net, "replay")
    assert "actor" in keys.client_roles.values()
    assert "any of them can send chunks, reports and league results as any other" in caplog.text
    assert auth.client_keys(net, auth.actor_identity(5), "replay").public_key == (
        auth.client_keys(net, "actor", "replay").public_key
    ), "every actor id reads the shared key"
    assert auth.actor_bundle(keys_dir, 5) == keys_dir / "actors"
    own = tmp_path / "own"
    auth.make_keys(own, actors=2)
    assert auth.actor_bundle(own, 1) == own / "actor_1"
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        auth.server_keys(NetConfig(keys_dir=str(own)), "params")
    assert "share one key" not in caplog.text


# --- servers started by hand ---------------------------------------------------------------------


def test_servers_refuse_an_actor_key_speaking_as_another_and_admit_added_keys(
    procs: Processes, tmp_path: Path
) -> None:
    keys_dir = tmp_path / "keys"
    assert keys_command(str(keys_dir), "--actors", "2").returncode == 0
    replay_port, params_port = free_port(), free_port()
    net = NetConfig(
        replay_addr=f"tcp://127.0.0.1:{replay_port}",
        params_addr=f"tcp://127.0.0.1:{params_port}",
        keys_dir=str(keys_dir),
    )
    # Room for actors added later: the servers take actor ids below actor.num_actors.
    small = set_args([*SMALL_OVERRIDES, "actor.num_actors=4"])
    common = ["--config", str(CONFIG), "--run-dir", str(tmp_path / "run"), *small]
    common += ["--keys", str(keys_dir / "servers")]
    servers = [
        procs.start("replay", "replay", *common, "--bind", net.replay_addr),
        procs.start("params", "params", *common, "--bind", net.params_addr),
    ]
    for server in ("replay", "params"):
        up = wait_until(lambda s=server: _answers(net, s), 60.0)
        assert up, f"{server} did not answer\n{procs.tails()}"

    def key_of(actor_id: int, server: str) -> auth.ClientKeys:
        """Actor ``actor_id``'s key, as the host that holds only its bundle reads it."""
        bundle = dataclasses.replace(net, keys_dir=str(keys_dir / f"actor_{actor_id}"))
        return auth.client_keys(bundle, auth.actor_identity(actor_id), server)

    def send(msg: Message, key_owner: int) -> Message | None:
        server = "params" if isinstance(msg, MatchRequest) else "replay"
        addr = net.params_addr if server == "params" else net.replay_addr
        return curve_request(addr, msg, key_of(key_owner, server))

    # Actor 0's key speaking as actor 1: every kind of message refused, with the reason.
    for what, msg in as_actor(1).items():
        reply = send(msg, key_owner=0)
        expected = f"the key of actor 0 may not send {type(msg).__name__} as actor 1"
        assert isinstance(reply, Error) and reply.reason == expected, f"{what}: {reply!r}"
    # Each key as its own actor: stored.
    assert isinstance(send(as_actor(0)["chunk"], key_owner=0), InsertAck)
    assert isinstance(send(as_actor(1)["chunk"], key_owner=1), InsertAck)
    replay_stats = stats_as(net, "replay")
    assert replay_stats["replay/size"] == 16, "the two chunks sent as their own actors"
    assert replay_stats["replay/rejected_messages"] == 3
    assert stats_as(net, "params")["params/rejected_messages"] == 1

    # A third actor joins the running run: its key, added now, is admitted by the same servers.
    added = keys_command(str(keys_dir), "--add-actors", "1")
    assert added.returncode == 0, added.stderr
    assert isinstance(send(as_actor(2)["chunk"], key_owner=2), InsertAck)
    refused = send(as_actor(3)["chunk"], key_owner=2)
    assert isinstance(refused, Error) and "key of actor 2" in refused.reason, refused
    assert stats_as(net, "replay")["replay/size"] == 24
    # Actor 2's key revoked while its connection is open: that connection gets nothing from
    # then on, and neither does a new one; the other actors go on.
    bundle = dataclasses.replace(net, keys_dir=str(keys_dir / "actor_2"))
    ctx = sockets.make_context()
    with sockets.closing(ctx):
        open_link = sockets.connect(
            ctx, zmq.DEALER, net.replay_addr,
            curve=auth.client_keys(bundle, auth.actor_identity(2), "replay"),
        )  # fmt: skip
        sockets.send(open_link, StatsRequest())
        assert isinstance(sockets.recv(open_link, timeout_ms=5000), Stats)
        revoked = keys_command(str(keys_dir), "--revoke-actor", "2")
        assert revoked.returncode == 0, revoked.stderr
        time.sleep(auth.AllowList.RELOAD_S + 0.2)
        sockets.send(open_link, dataclasses.replace(as_actor(2)["chunk"], sequence=1))
        assert sockets.recv(open_link, timeout_ms=int(NO_REPLY_S * 1000)) is None
    new_link = curve_request(
        net.replay_addr, StatsRequest(), key_of_bundle(keys_dir, 2), NO_REPLY_S
    )
    assert new_link is None, "a revoked key's new connection is not admitted"
    assert stats_as(net, "replay")["replay/size"] == 24, "nothing of actor 2's after revoking"
    assert isinstance(send(dataclasses.replace(as_actor(0)["chunk"], sequence=1), 0), InsertAck)
    assert all(p.alive() for p in servers), "the same processes, never restarted"
    logs = "".join(p.log() for p in servers)
    assert "share one key" not in logs and "Traceback" not in logs, logs


def key_of_bundle(keys_dir: Path, actor_id: int) -> auth.ClientKeys:
    """Replay's client keys from a bundle set aside by --revoke-actor (the key its holder keeps)."""
    bundle = NetConfig(keys_dir=str(keys_dir / f"revoked_actor_{actor_id}"))
    return auth.client_keys(bundle, "actor", "replay")


def _answers(net: NetConfig, server: str) -> bool:
    addr = net.replay_addr if server == "replay" else net.params_addr
    keys = auth.client_keys(net, "learner", server)
    return curve_request(addr, StatsRequest(), keys, 0.5) is not None

"""A peer holding a valid key cannot do more than its role does: each message below decodes
cleanly (the current schema, well formed) and is sent with the actor hosts' keys (the actors
bundle of ``apexrl keys``) to real servers, as a compromised actor host would send it. Each is
refused with a clear reason, counted in ``rejected_messages``, and changes nothing that
``Stats`` shows.

The pure parts are checked too: the env steps each family's items account for, worked by hand,
and a message naming a version no learner announced, held until the announcement or refused
after the wait.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import builders
import numpy as np
import pytest
import zmq
from conftest import CONFIG, SMALL_OVERRIDES, Processes, free_port, set_args, wait_until

from apexrl.config import NetConfig
from apexrl.replay.service import ReplayService
from apexrl.transport import auth, sockets
from apexrl.transport.messages import (
    ActorReport,
    Error,
    InsertAck,
    Message,
    PublishedVersion,
    PublishParams,
    SampleRequest,
    Stats,
    StatsRequest,
)

PUBLISHED = 5  # the version the test's learner announces
INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)


def cfg(name: str = "apex_dqn_cartpole"):
    """A small run's config: 2 envs, chunks of 8 steps."""
    return builders.config(path=builders.config_file(name), small=True)


def chunk(num_items: int = 4, **changes) -> object:
    """A valid chunk of Ape-X transitions (its env steps those its items account for)."""
    return dataclasses.replace(builders.chunk(cfg(), np.ones(num_items)), **changes)


def report(actor_id: int = 0, env_steps: int = 10, **changes) -> ActorReport:
    valid = ActorReport(actor_id, 1, False, env_steps, 0, np.array([9.0]), np.array([10]))
    return dataclasses.replace(valid, **changes)


def junk_metrics(prefix: str) -> dict[str, float]:
    return {f"{prefix}_{i}": 1.0 for i in range(64)}


# --- real servers, the actors bundle --------------------------------------------------------------


def call(
    addr: str, curve: auth.ClientKeys, *msgs: Message, replies: int = 0, timeout_s: float = 5.0
) -> list:
    """Send ``msgs`` in order from one fresh DEALER, wait for ``replies`` answers (a chunk's ack,
    a refusal; a report that is taken is not answered), then ask for ``Stats``: the answers and
    the ``Stats`` values last."""
    ctx = sockets.make_context()
    with sockets.closing(ctx):
        sock = sockets.connect(ctx, zmq.DEALER, addr, curve=curve)
        for msg in msgs:
            sockets.send(sock, msg)
        answers: list = []
        deadline = time.monotonic() + timeout_s
        while len(answers) < replies and time.monotonic() < deadline:
            reply = sockets.recv(sock, timeout_ms=100)
            if reply is not None:
                answers.append(reply)
        sockets.send(sock, StatsRequest())
        while time.monotonic() < deadline:
            reply = sockets.recv(sock, timeout_ms=100)
            if isinstance(reply, Stats):
                return [*answers, reply.values]
            if reply is not None:
                answers.append(reply)
        raise AssertionError(f"no Stats from {addr} within {timeout_s} s; got {answers}")


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM for {pid}")


def a_two_megabyte_bomb() -> PublishParams:
    """A publish of 256 MiB of zeros: about 1 MB on the wire once LZ4 compressed."""
    return PublishParams(1, 0, {"w": np.zeros(2**26, np.float32)})


def test_an_actor_key_cannot_steer_the_run(procs: Processes, tmp_path: Path) -> None:
    keys_dir = tmp_path / "keys"
    auth.make_keys(keys_dir)
    replay_port, params_port = free_port(), free_port()
    net = NetConfig(
        replay_addr=f"tcp://127.0.0.1:{replay_port}",
        params_addr=f"tcp://127.0.0.1:{params_port}",
        keys_dir=str(keys_dir / "servers"),
    )
    common = ["--config", str(CONFIG), "--run-dir", str(tmp_path / "run")]
    common += ["--keys", str(keys_dir / "servers"), *set_args(SMALL_OVERRIDES)]
    replay = procs.start("replay", "replay", *common, "--bind", net.replay_addr)
    params = procs.start("params", "params", *common, "--bind", net.params_addr)
    learner_net = dataclasses.replace(net, keys_dir=str(keys_dir / "learner"))
    actor_net = dataclasses.replace(net, keys_dir=str(keys_dir / "actors"))
    learner = auth.client_keys(learner_net, "learner", "replay")
    actor = auth.client_keys(actor_net, "actor", "replay")
    actor_params = auth.client_keys(actor_net, "actor", "params")

    def answers(addr: str, curve: auth.ClientKeys) -> bool:
        try:
            return bool(call(addr, curve, timeout_s=1.0))
        except AssertionError:
            return False

    assert wait_until(lambda: answers(net.replay_addr, learner), 60.0), procs.tails()
    # The learner announces the version it publishes; an actor inserts a chunk and reports.
    call(net.replay_addr, learner, PublishedVersion(PUBLISHED))
    first = chunk(weights_version=PUBLISHED)
    junk = report(custom_metrics=junk_metrics("a"))
    *acks, before = call(net.replay_addr, actor, first, junk, replies=1)
    assert [type(a) for a in acks] == [InsertAck], acks
    assert before["replay/size"] == 4 and before["replay/env_steps"] == first.env_steps
    assert sum(name.startswith("custom/a_") for name in before) == 64, "its first 64 names show"

    carried = cfg().algo.carried_steps(cfg().env.num_envs)
    insider: dict[str, tuple[Message, str]] = {
        "chunk naming the largest int64 version": (
            chunk(weights_version=INT64_MAX),
            f"weights_version {INT64_MAX} was never published",
        ),
        "chunk naming the smallest int64 version": (
            chunk(weights_version=INT64_MIN),
            f"weights_version {INT64_MIN} is below -1",
        ),
        "1-item chunk claiming more env steps than its items": (
            chunk(1, env_steps=carried + 2),
            f"claims {carried + 2}",
        ),
        "16-item chunk claiming 0 env steps": (chunk(16, env_steps=0), "claims 0"),
        "report of 2e9 env steps": (
            report(env_steps=2_000_000_000),
            "reports 2000000000 env steps",
        ),
        "report naming version 4.6e18": (
            report(weights_version=4_600_000_000_000_000_000),
            "was never published",
        ),
        "second report of 64 junk metric names": (
            report(custom_metrics=junk_metrics("b")),
            "custom metric names, over the 64 one actor may",
        ),
        "learner's message": (SampleRequest("apex_dqn", 4), "role 'actor' may not send"),
        "report of 2 MB": (
            report(
                env_steps=2**17,
                episode_returns=np.random.default_rng(0).normal(size=2**17),
                episode_lengths=np.ones(2**17, np.int64),
            ),
            "from role 'actor': arrays total 2097152 bytes decompressed, over",
        ),
    }
    for name, (msg, reason) in insider.items():
        *replies, after = call(net.replay_addr, actor, msg, replies=1)
        assert len(replies) == 1 and isinstance(replies[0], Error), f"{name}: {replies}"
        assert reason in replies[0].reason, f"{name}: {replies[0].reason}"
    counted = ("replay/rejected_messages", "replay/items_received", "replay/items_refused")
    refused_items = 4 + 4 + 1 + 16  # the four chunks'
    assert [after[k] - before[k] for k in counted] == [len(insider), refused_items, refused_items]
    changed = {k for k in before if k not in counted and after[k] != before[k]}
    changed = {k for k in changed if not k.endswith(("last_heard_s", "_per_s", "return_mean"))}
    assert changed == set(), {k: (before[k], after[k]) for k in changed}
    assert after["actor/0/env_steps"] == first.env_steps
    assert after["actor/0/weights_version"] == 0  # its report's, after its chunk's 5

    # Another actor's metric still shows: one actor cannot crowd the others out.
    (values,) = call(net.replay_addr, actor, report(actor_id=1, custom_metrics={"score": 3.0}))
    assert values["custom/score"] == 3.0

    # The parameter server refuses an actor's 1 MB message that would decompress to 256 MiB
    # from its length, before reading its header: its peak memory does not move.
    assert wait_until(lambda: params.alive() and peak_rss_kib(params.pid) > 0, 30.0)
    call_params = auth.client_keys(learner_net, "learner", "params")
    assert wait_until(lambda: answers(net.params_addr, call_params), 60.0), procs.tails()
    peak = peak_rss_kib(params.pid)
    started = time.monotonic()
    *replies, values = call(net.params_addr, actor_params, a_two_megabyte_bomb(), replies=1)
    refused_s = time.monotonic() - started
    assert len(replies) == 1 and "from role 'actor'" in replies[0].reason, replies
    assert "over the limit of 65536" in replies[0].reason, replies[0].reason
    assert values["params/version"] == -1 and values["params/rejected_messages"] == 1
    grown_mib = (peak_rss_kib(params.pid) - peak) / 1024
    print(
        f"\nthe 1 MB bomb: refused in {refused_s:.3f} s, parameter server peak +{grown_mib:.1f} MiB"
    )
    assert grown_mib < 32, f"the parameter server's peak memory grew by {grown_mib:.0f} MiB"
    assert replay.alive() and params.alive(), procs.tails()


# --- the checks themselves ------------------------------------------------------------------------


def test_env_steps_each_familys_items_account_for() -> None:
    apex = cfg().algo
    assert apex.steps_in_items({"num_steps": np.array([3, 3, 2, 1])}) == 4  # one per step
    assert apex.carried_steps(num_envs=2) == (3 - 1) * 2  # the n - 1 steps windows reach into
    r2d2 = cfg("r2d2_cartpole").algo
    length, overlap = r2d2.sequence_length, r2d2.sequence_overlap
    mask = np.zeros((3, length), bool)
    mask[0, :length] = True  # a first sequence of an episode: all new
    mask[1, :length] = True  # the next one repeats the overlap of the first
    mask[2, : overlap + 3] = True  # an episode's end after 3 new steps
    starts = np.array([True, False, False])
    fields = {"mask": mask, "starts_episode": starts}
    assert r2d2.steps_in_items(fields) == length + (length - overlap) + 3
    impala = cfg("impala_cartpole").algo
    assert impala.steps_in_items({"action": np.zeros((2, impala.unroll_length))}) == (
        2 * impala.unroll_length
    )
    assert impala.carried_steps(num_envs=8) == 0


def service() -> ReplayService:
    return ReplayService(cfg())


def test_a_chunk_naming_an_unannounced_version_waits_for_its_announcement() -> None:
    replay = service()
    waiting = chunk(weights_version=7)
    assert replay.handle(b"actor", waiting) + replay.drain() == []
    assert replay.table.size == 0 and len(replay.version_wait) == 1
    replies = replay.handle(b"learner", PublishedVersion(7)) + replay.drain()
    assert [(r.identity, type(r.message)) for r in replies] == [(b"actor", InsertAck)]
    assert replay.table.size == 4


def test_one_never_announced_is_refused_after_the_wait() -> None:
    replay = service()
    replay.version_wait.wait_s = 0.0
    assert replay.handle(b"actor", chunk(weights_version=7)) == []
    time.sleep(0.01)
    replies = replay.release_waiting()
    assert len(replies) == 1 and isinstance(replies[0].message, Error)
    assert "weights_version 7 was never published" in replies[0].message.reason
    assert replay.rejected_messages == 1 and replay.table.size == 0


def test_a_step_naming_an_unpublished_version_is_refused_too() -> None:
    impala = cfg("impala_cartpole")
    replay = ReplayService(impala)
    valid = builders.chunk(impala, np.ones(2))
    steps = valid.fields["weights_version"].copy()
    steps[1, 3] = INT64_MAX
    bad = dataclasses.replace(valid, fields={**valid.fields, "weights_version": steps})
    replies = replay.handle(b"actor", bad) + replay.drain()
    assert isinstance(replies[0].message, Error), replies
    assert f"weights_version {INT64_MAX} was never published" in replies[0].message.reason
    replies = replay.handle(b"actor", valid) + replay.drain()
    assert isinstance(replies[0].message, InsertAck), replies


@pytest.mark.parametrize("first_claims_carried", [True, False])
def test_an_actors_claims_may_run_ahead_of_its_items_by_the_carried_steps(
    first_claims_carried: bool,
) -> None:
    """Ape-X's first chunk claims the n - 1 steps of each env its last windows reach into; from
    then on claims and items go in step, and a claim beyond is refused."""
    replay = service()
    carried = replay.actors.carried
    extra = carried if first_claims_carried else 0
    ok = replay.handle(b"a", chunk(8, env_steps=8 + extra)) + replay.drain()
    assert isinstance(ok[0].message, InsertAck)
    ok = replay.handle(b"a", chunk(8, env_steps=8)) + replay.drain()
    assert isinstance(ok[0].message, InsertAck)
    refused = replay.handle(b"a", chunk(8, env_steps=8 + carried - extra + 1)) + replay.drain()
    assert isinstance(refused[0].message, Error) and "claims" in refused[0].message.reason
    assert replay.run.env_steps == 16 + extra

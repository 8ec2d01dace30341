"""Hostile or broken weights and data: the parameter server refuses publishes that are not the
run's network (names, shapes, dtypes), hold NaN or infinities or would exceed the codec's limits,
and keeps serving the last good version; a request's shared-memory field never makes the server
open anything, and a reply naming a path is refused by the decoder; an actor refuses weights it
cannot load and keeps acting with its own; a learner skips non-finite batches and gradient steps
and never checkpoints non-finite weights, and resumes from the previous checkpoint when the latest
cannot be read.

``ParamStore``, the learner's checkpoints and its update step are driven directly; the parameter
server and the actor run as real processes on loopback, the actor against a ROUTER socket of the
test posing as the parameter server.
"""

from __future__ import annotations

import builtins
import logging
import os
import time
from pathlib import Path

import builders
import msgpack
import numpy as np
import pytest
import torch
import zmq
from conftest import (
    CONFIG,
    SMALL_OVERRIDES,
    Processes,
    free_addr,
    request,
    send_frames,
    server_stats,
    set_args,
    wait_for_server,
)

from apexrl.acting.step_block import StepBlock
from apexrl.algos import SampledBatch, load_algorithm
from apexrl.config import load_config
from apexrl.envs import make_vector_env, step_vector
from apexrl.learning.checkpoint import resume_checkpoint, save_checkpoint
from apexrl.learning.replay_link import BatchStream
from apexrl.learning.update import UpdateStep
from apexrl.models import params_to_arrays
from apexrl.param_server import ArraySpec, ParamStore, ParamStores, answer, network_layout
from apexrl.runtime import rundir
from apexrl.transport import shm, sockets
from apexrl.transport.codec import DecodeError, Limits, decode
from apexrl.transport.messages import (
    SCHEMA_VERSION,
    Error,
    Params,
    ParamsNotModified,
    ParamsRequest,
    PublishAck,
    PublishParams,
    SampleBatch,
    SampleRequest,
    StatsRequest,
)

REPO = Path(__file__).resolve().parents[1]
F32 = np.dtype(np.float32)
LAYOUT = {"w": ArraySpec((2, 3), F32), "b": ArraySpec((3,), F32)}
GOOD = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float32)}


def with_array(name: str, value: np.ndarray | None) -> dict[str, np.ndarray]:
    """``GOOD`` with one array replaced, added (a new name) or removed (None)."""
    arrays = {k: v.copy() for k, v in GOOD.items()}
    if value is None:
        del arrays[name]
    else:
        arrays[name] = value
    return arrays


def nan_at(name: str, index: tuple[int, ...], value: float = np.nan) -> dict[str, np.ndarray]:
    array = GOOD[name].copy()
    array[index] = value
    return with_array(name, array)


HOSTILE = {
    "wrong name": ({"w": GOOD["w"], "bias": GOOD["b"]}, "missing array 'b'"),
    "wrong shape": (with_array("w", np.zeros((3, 2), np.float32)), "has shape (3, 2)"),
    "wrong dtype": (with_array("b", np.ones(3, np.float64)), "has dtype float64"),
    "extra array": (with_array("extra", np.zeros(1, np.float32)), "unexpected array 'extra'"),
    "missing array": (with_array("w", None), "missing array 'w'"),
    "NaN": (nan_at("w", (1, 2)), "'w' holds NaN or infinite values"),
    "infinity": (nan_at("b", (0,), -np.inf), "'b' holds NaN or infinite values"),
}


# --- ParamStore -----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_param_store_refuses_a_hostile_publish_and_keeps_its_version(case: str) -> None:
    arrays, expected_reason = HOSTILE[case]
    store = ParamStore(LAYOUT)
    assert store.handle(PublishParams(4, 100, GOOD)) == PublishAck(4)
    frames_before = list(store.params_frames)

    reply = store.handle(PublishParams(5, 200, arrays))

    assert isinstance(reply, Error), reply
    assert "version 5 refused" in reply.reason and expected_reason in reply.reason, reply.reason
    assert store.stats()["params/rejected_messages"] == 1.0
    assert (store.version, store.env_steps) == (4, 100)
    assert store.params_frames == frames_before
    served = store.handle(ParamsRequest(-1))
    assert isinstance(served, Params) and served.version == 4
    assert served.arrays.keys() == GOOD.keys()
    for name, array in GOOD.items():
        np.testing.assert_array_equal(served.arrays[name], array)
    assert store.handle(PublishParams(6, 300, GOOD)) == PublishAck(6)  # a good one still goes in


def test_param_store_refuses_weights_over_the_codec_limits() -> None:
    store = ParamStore(LAYOUT, limits=Limits(max_array_bytes=16))  # "w" is 24 bytes
    reply = store.handle(PublishParams(0, 0, GOOD))
    assert isinstance(reply, Error) and "exceed the codec's limits" in reply.reason, reply
    assert "over the limit of 16 per array" in reply.reason
    assert store.version == -1 and store.handle(ParamsRequest(-1)) == ParamsNotModified(-1)
    assert store.stats()["params/rejected_messages"] == 1.0


def test_param_store_without_a_layout_refuses_more_arrays_than_a_message_carries() -> None:
    store = ParamStore()
    assert store.handle(PublishParams(0, 0, GOOD)) == PublishAck(0)
    many = {f"a{i}": np.zeros(1, np.float32) for i in range(1100)}  # Limits.max_frames is 1024
    reply = store.handle(PublishParams(1, 0, many))
    assert isinstance(reply, Error) and "1101 frames, over the limit of 1024" in reply.reason
    assert store.version == 0 and set(store.handle(ParamsRequest(-1)).arrays) == {"w", "b"}


def test_an_exception_while_handling_is_answered_with_error_and_counted() -> None:
    store = ParamStore(LAYOUT)
    store.handle(PublishParams(0, 0, GOOD))
    stores = ParamStores({"": store})

    def broken(msg):
        raise RuntimeError("boom")

    stores.handle = broken
    reply = decode(answer(stores, sockets.Received(b"peer", StatsRequest(), None)))
    assert isinstance(reply, Error)
    assert reply.reason == "parameter server failed to handle StatsRequest: boom"
    assert stores.stats()["params/rejected_messages"] == 1 and store.version == 0


HOSTILE_SHM_HOSTS = [
    "/etc/passwd",
    "../../etc/shadow",
    "/dev/shm/apexrl-params-0000000000000000-0.bin",
    "apexrl-params-0000000000000000-0.bin",
    "x" * 512,
    "\x00/proc/self/mem",
]


def test_a_hostile_shm_host_is_only_compared_never_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = shm.ShmWriter(tmp_path, shm.host_identity(tmp_path))
    store = ParamStore(LAYOUT, shm_writer=writer, shm_min_bytes=0)
    assert store.handle(PublishParams(4, 100, GOOD)) == PublishAck(4)
    opened: list[object] = []

    def refuse_open(path, *args, **kwargs):
        opened.append(path)
        raise AssertionError(f"the server opened {path!r}")

    monkeypatch.setattr(os, "open", refuse_open)
    monkeypatch.setattr(builtins, "open", refuse_open)
    try:
        for host in HOSTILE_SHM_HOSTS:
            received = sockets.Received(b"peer", ParamsRequest(-1, host), None)
            reply = decode(answer(ParamStores({"": store}), received))
            assert isinstance(reply, Params) and not reply.shm_file, (host, reply)
            np.testing.assert_array_equal(reply.arrays["w"], GOOD["w"])
        # Only this host's identity gets the file's name, and the server opens nothing for it.
        reply = store.handle(ParamsRequest(-1, writer.host))
        assert reply.shm_file == store.shm_ref.name and not reply.arrays
    finally:
        monkeypatch.undo()
        writer.close()
    assert opened == []
    assert store.rejected_messages == 0


def params_frames(
    shm_file: str, nbytes: int = 64, token: str = "0" * 32, env_task: str = ""
) -> list[bytes]:
    """A ``Params`` header as a hostile server would send it, field by field."""
    scalars = {"version": 1, "shm_file": shm_file, "shm_nbytes": nbytes, "shm_token": token}
    scalars["env_task"] = env_task
    header = {"v": SCHEMA_VERSION, "kind": "Params", "scalars": scalars, "arrays": []}
    return [msgpack.packb(header, use_bin_type=True)]


@pytest.mark.parametrize(
    "fields",
    [
        {"shm_file": "/etc/passwd"},
        {"shm_file": "../apexrl-params-0000000000000000-0.bin"},
        {"shm_file": ".."},
        {"shm_file": "a\x00b"},
        {"shm_file": "x" * 300},
        {"shm_file": "apexrl-params-0000000000000000-0.bin", "nbytes": -1},
        {"shm_file": "apexrl-params-0000000000000000-0.bin", "token": "../x"},
        {"shm_file": "", "nbytes": 64},
        {"shm_file": "apexrl-params-0000000000000000-0.bin", "env_task": "{not json"},
        {"shm_file": "apexrl-params-0000000000000000-0.bin", "env_task": "[" * 5000},
    ],
)
def test_a_params_reply_naming_a_path_does_not_decode(fields: dict) -> None:
    with pytest.raises(DecodeError, match="invalid Params"):
        decode(params_frames(**fields))


@pytest.mark.parametrize(
    "config", ["apex_dqn_cartpole.yaml", "r2d2_cartpole.yaml", "ppo_pendulum.yaml"]
)
def test_network_layout_is_what_the_learner_publishes(config: str) -> None:
    overrides = ["algo.normalize_obs=true"] if config.startswith("ppo") else []
    cfg = load_config(REPO / "configs" / config, overrides)
    layout = network_layout(cfg)
    envs = make_vector_env(cfg.env, 1, cfg.unit_actions)
    spaces = envs.single_observation_space, envs.single_action_space
    envs.close()
    core = load_algorithm(cfg.algorithm).learner_core(*spaces, cfg, torch.device("cpu"))
    published = params_to_arrays(core.network)
    assert {n: (a.shape, a.dtype) for n, a in published.items()} == {
        n: (spec.shape, spec.dtype) for n, spec in layout.items()
    }
    store = ParamStore(layout)
    assert store.handle(PublishParams(0, 0, published)) == PublishAck(0)


# --- a parameter server process -------------------------------------------------------------------


def small_config():
    return builders.config(small=True)


def run_weights(seed: int) -> dict[str, np.ndarray]:
    """Weights of the network the small CartPole config runs (as the learner publishes them)."""
    cfg = small_config()
    torch.manual_seed(seed)
    envs = make_vector_env(cfg.env, 1)
    spaces = envs.single_observation_space, envs.single_action_space
    envs.close()
    return params_to_arrays(load_algorithm(cfg.algorithm).make_network(*spaces, cfg))


def role_args(role: str, run_dir: Path, *extra: str) -> list[str]:
    return [
        role,
        "--config",
        str(CONFIG),
        "--run-dir",
        str(run_dir),
        *extra,
        *set_args(SMALL_OVERRIDES),
    ]


def test_parameter_server_process_serves_the_last_valid_version(
    procs: Processes, tmp_path: Path
) -> None:
    addr = free_addr()
    server = procs.start("params", *role_args("params", tmp_path / "run", "--bind", addr))
    wait_for_server(server, addr, timeout_s=60)
    good = run_weights(seed=0)
    assert request(addr, PublishParams(7, 10, good)) == PublishAck(7)

    name = next(iter(good))
    first_float = next(n for n, a in good.items() if a.dtype.kind == "f" and a.size > 1)
    hostile = {
        "renamed": {("x" + k if k == name else k): v for k, v in good.items()},
        "reshaped": {**good, name: np.zeros((*good[name].shape, 2), good[name].dtype)},
        "float64": {k: v.astype(np.float64) for k, v in good.items()},
        "extra": {**good, "extra": np.zeros(1, np.float32)},
        "NaN": {**good, first_float: np.full_like(good[first_float], np.nan)},
    }
    for case, arrays in hostile.items():
        reply = request(addr, PublishParams(8, 20, arrays))
        assert isinstance(reply, Error), f"{case}: {reply!r}\n{server.tail()}"
        assert "version 8 refused" in reply.reason, reply.reason

    assert server.alive(), server.tail()
    served = request(addr, ParamsRequest(-1))
    assert isinstance(served, Params) and served.version == 7, served
    for k, v in good.items():
        np.testing.assert_array_equal(served.arrays[k], v)
    stats = server_stats(addr)
    assert stats["params/version"] == 7.0
    assert stats["params/rejected_messages"] == len(hostile)
    assert "rejected a message: publish of version 8 refused" in server.log()

    for host in HOSTILE_SHM_HOSTS:  # answered with the bytes, as any foreign host is
        reply = request(addr, ParamsRequest(-1, host))
        assert isinstance(reply, Params) and reply.version == 7 and not reply.shm_file, reply
    too_long = msgpack.packb(
        {"v": SCHEMA_VERSION, "kind": "ParamsRequest", "arrays": [],
         "scalars": {"have_version": -1, "shm_host": "/" * 600, "policy": "", "snapshot": -1}},
        use_bin_type=True,
    )  # fmt: skip
    reply = send_frames(addr, [too_long])
    assert isinstance(reply, Error) and "shm_host is 600 characters" in reply.reason, reply
    bad_snapshot = msgpack.packb(
        {"v": SCHEMA_VERSION, "kind": "ParamsRequest", "arrays": [],
         "scalars": {"have_version": -1, "shm_host": "", "policy": "", "snapshot": -7}},
        use_bin_type=True,
    )  # fmt: skip
    reply = send_frames(addr, [bad_snapshot])
    assert isinstance(reply, Error) and "snapshot must be a version" in reply.reason, reply
    assert server.alive(), server.tail()
    code, _ = server.stop(10.0)
    assert code == 0, server.tail()


# --- an actor process against a test-controlled parameter server --------------------------------


class FakeParamServer:
    """A ROUTER that answers each ``ParamsRequest`` as the test says and records what it got."""

    def __init__(self, addr: str) -> None:
        self.ctx = sockets.make_context()
        self.sock = sockets.bind(self.ctx, zmq.ROUTER, addr)
        self.have_versions: list[int] = []

    def answer_next(self, reply_for, timeout_s: float) -> int | None:
        """Wait for one ``ParamsRequest``; answer ``reply_for(have_version)``; its version."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            received = sockets.recv_from(self.sock, timeout_ms=100)
            if received is None or not isinstance(received.message, ParamsRequest):
                continue
            have = received.message.have_version
            self.have_versions.append(have)
            sockets.send_to(self.sock, received.identity, reply_for(have))
            return have
        return None

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


def test_actor_refuses_weights_it_cannot_load_and_keeps_acting(
    procs: Processes, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    replay_addr, params_addr = free_addr(), free_addr()
    replay = procs.start("replay", *role_args("replay", run_dir, "--bind", replay_addr))
    wait_for_server(replay, replay_addr, timeout_s=60)
    fake = FakeParamServer(params_addr)
    try:
        actor = procs.start(
            "actor_0",
            *role_args(
                "actor",
                run_dir,
                "--replay",
                replay_addr,
                "--params",
                params_addr,
                "--id",
                "0",
                "--num-actors",
                "1",
            ),
        )
        good, later = run_weights(seed=0), run_weights(seed=1)
        name = next(n for n, a in good.items() if a.ndim == 2)
        reshaped = {**good, name: np.zeros(good[name].shape[::-1], good[name].dtype)}
        with_nan = {**later, name: np.full_like(later[name], np.nan)}

        def step(reply_for, what: str) -> int:
            have = fake.answer_next(reply_for, timeout_s=60)
            assert have is not None, f"no ParamsRequest ({what})\n{procs.tails()}"
            return have

        assert step(lambda have: Params(0, good), "first") == -1
        assert step(lambda have: Params(1, reshaped), "after version 0") == 0
        # It names the refused version, so the server has nothing to send until a newer one.
        assert step(lambda have: ParamsNotModified(1), "after refusing version 1") == 1
        assert step(lambda have: Params(2, with_nan), "asking again") == 1
        assert step(lambda have: ParamsNotModified(2), "after refusing version 2") == 2
        assert step(lambda have: Params(3, later), "asking again") == 2
        assert step(lambda have: ParamsNotModified(3), "after loading version 3") == 3

        assert actor.alive(), actor.tail()
        text = actor.log()
        assert "refused weights version 1, keeping version 0: array" in text, actor.tail()
        assert f"{name!r} has shape" in text
        assert "refused weights version 2, keeping version 0: array" in text
        assert "holds NaN or infinite values" in text
        assert text.count("refused weights version") == 2  # once per version
        stats = server_stats(replay_addr)
        assert stats is not None and stats["replay/env_steps"] > 0, procs.tails()
        time.sleep(1.0)  # one more report (actor.report_interval_s is 0.5 s)
        code, _ = actor.stop(10.0)
        assert code == 0, actor.tail()
    finally:
        fake.close()
    scalars = actor_scalars(run_dir / "tb" / "actor_0")
    assert max(scalars["actor/rejected_weights"]) == 2.0
    assert set(scalars["actor/weights_version"]) <= {0.0, 3.0}, scalars["actor/weights_version"]


def actor_scalars(logdir: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


# --- the learner ----------------------------------------------------------------------------------


def apex_setup(num_items: int = 64):
    """A small Ape-X learner core on CartPole and a batch of real items for it."""
    cfg = small_config()
    torch.manual_seed(0)
    envs = make_vector_env(cfg.env, 2)
    algorithm = load_algorithm(cfg.algorithm)
    spaces = envs.single_observation_space, envs.single_action_space
    net = algorithm.make_network(*spaces, cfg)
    core = algorithm.actor_core(net, cfg, 0, False, "cpu", np.random.default_rng(0))
    block = StepBlock(core.block_steps, core.block_overlap)
    obs, _ = envs.reset(seed=0)
    items: list[dict[str, np.ndarray]] = []
    while sum(len(next(iter(i.values()))) for i in items) < num_items:
        action, extras = core.act(obs)
        step = step_vector(envs, action)
        core.observe(action, step)
        block.add(obs, action, step, {**extras, "weights_version": np.zeros(2, np.int64)})
        if block.full:
            items.append(core.items(block)[0])
            block.keep_overlap()
        obs = step.obs
    envs.close()
    fields = {k: np.concatenate([i[k] for i in items])[:num_items] for k in items[0]}
    algo = algorithm.learner_core(*spaces, cfg, torch.device("cpu"))
    return cfg, algo, fields


def as_sampled(fields: dict[str, np.ndarray]) -> SampledBatch:
    n = len(next(iter(fields.values())))
    tensors = {k: torch.from_numpy(v.copy()) for k, v in fields.items()}
    return SampledBatch(np.arange(n), tensors, np.full(n, 1.0 / n), n)


def test_batch_stream_skips_a_batch_with_non_finite_values() -> None:
    cfg, _, fields = apex_setup(num_items=32)
    float_name = next(k for k, v in fields.items() if v.dtype.kind == "f" and k != "reward")
    bad = {**fields, float_name: fields[float_name].copy()}
    bad[float_name].flat[3] = np.inf
    ctx = sockets.make_context()
    replay = sockets.bind(ctx, zmq.ROUTER, "tcp://127.0.0.1:0")
    client = sockets.connect(ctx, zmq.DEALER, sockets.bound_address(replay))
    with sockets.closing(client, replay, ctx):
        stream = BatchStream(client, cfg, torch.device("cpu"))
        keys = np.arange(32, dtype=np.int64)
        replies = [
            SampleBatch(cfg.replay.table, 100, keys, np.full(32, 0.01), bad),
            SampleBatch(cfg.replay.table, 100, keys, np.full(32, np.nan), fields),
            SampleBatch(cfg.replay.table, 100, keys, np.full(32, 0.01), fields),
        ]
        got = []
        for reply in replies:
            assert stream.next(timeout_ms=0) is None  # sends the requests
            received = sockets.recv_from(replay, timeout_ms=5000)
            assert isinstance(received.message, SampleRequest)
            sockets.send_to(replay, received.identity, reply)
            got.append(stream.next(timeout_ms=5000))
    assert got[0] is None and got[1] is None
    assert stream.num_skipped == 2
    assert isinstance(got[2], SampledBatch)
    np.testing.assert_array_equal(got[2].fields[float_name].numpy(), fields[float_name])


def test_a_non_finite_loss_leaves_the_weights_and_sends_no_priorities() -> None:
    _, algo, fields = apex_setup()
    step = UpdateStep(algo, None)
    before = {k: v.clone() for k, v in algo.network.state_dict().items()}
    bad = {**fields, "reward": fields["reward"].copy()}
    bad["reward"][5] = np.inf

    result, num_batches, _ = step.run(as_sampled(bad), wants_stop=False)

    assert num_batches == 1 and step.num_skipped == 1
    assert not np.isfinite(result.metrics["learner/loss"])
    assert result.priorities is None  # no priority update from this batch
    for k, v in algo.network.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)

    result, _, _ = step.run(as_sampled(fields), wants_stop=False)  # a good batch still trains
    assert step.num_skipped == 1 and np.isfinite(result.priorities).all()
    changed = any(not torch.equal(v, before[k]) for k, v in algo.network.state_dict().items())
    assert changed


def test_non_finite_weights_are_not_checkpointed_and_resume_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, algo, fields = apex_setup()
    path = tmp_path / rundir.CHECKPOINT
    previous = tmp_path / rundir.PREVIOUS_CHECKPOINT
    assert save_checkpoint(path, algo, {"env_steps": 1})
    UpdateStep(algo, None).run(as_sampled(fields), wants_stop=False)
    assert save_checkpoint(path, algo, {"env_steps": 2})
    assert previous.is_file()
    good_weights = {k: v.clone() for k, v in algo.network.state_dict().items()}
    latest_bytes, previous_bytes = path.read_bytes(), previous.read_bytes()

    with torch.no_grad():
        next(algo.network.parameters()).view(-1)[0] = float("nan")
    with caplog.at_level(logging.ERROR, logger="apexrl.learner"):
        assert not save_checkpoint(path, algo, {"env_steps": 3})
    assert "checkpoint not written" in caplog.text and "NaN or infinite" in caplog.text
    assert path.read_bytes() == latest_bytes and previous.read_bytes() == previous_bytes

    # The latest is intact: a resume loads it (weights after the update, env steps 2).
    counters = resume_checkpoint(tmp_path, algo, torch.device("cpu"))
    assert counters == {"env_steps": 2}
    for k, v in algo.network.state_dict().items():
        torch.testing.assert_close(v, good_weights[k], rtol=0, atol=0)

    # A truncated latest: the previous one is loaded, and the log says so.
    path.write_bytes(latest_bytes[: len(latest_bytes) // 2])
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="apexrl.learner"):
        counters = resume_checkpoint(tmp_path, algo, torch.device("cpu"))
    assert counters == {"env_steps": 1}
    assert f"cannot read {path}" in caplog.text
    assert f"loading the previous checkpoint {previous}" in caplog.text

    previous.write_bytes(b"not a checkpoint")
    with pytest.raises(FileNotFoundError, match="cannot read .* nor .*checkpoint.prev.pt"):
        resume_checkpoint(tmp_path, algo, torch.device("cpu"))

"""A league's snapshots (``apexrl.league.snapshots``, the parameter server's pinned versions).

- ``SnapshotPool``: pinned frames, the cap evicting the oldest;
- ``ParamStore``: every ``every``-th version pinned at publish; a request for a snapshot
  answered with its frames exactly as published however many versions came after, never held,
  ``ParamsNotModified`` to an asker that holds it, ``Error`` naming the pinned ones otherwise;
- a real parameter server of a multi-agent run (``league`` section) and ``ParamsClient``s: a
  snapshot loaded over its socket is bit-identical to the weights the learner published then;
- the config rules of the ``league`` section, and the wire's checks of ``ParamsRequest.snapshot``.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
import zmq
from conftest import REPO, Processes, free_addr, request, set_args, wait_for_server

from apexrl.algos import load_algorithm
from apexrl.clients.params import ParamsClient
from apexrl.config import ConfigError, config_from_dict, load_config
from apexrl.envs.spaces import network_spaces
from apexrl.league.snapshots import SnapshotPool
from apexrl.models import params_to_arrays
from apexrl.multiagent.policies import policy_configs
from apexrl.param_server import ParamStore
from apexrl.transport import sockets
from apexrl.transport.codec import decode
from apexrl.transport.messages import (
    Error,
    Params,
    ParamsNotModified,
    ParamsRequest,
    PublishAck,
    PublishParams,
    Shutdown,
)

CONFIG = REPO / "configs" / "impala_come_and_go.yaml"
LEAGUE = ("league.snapshot_every_versions=2", "league.pool_size=2")


def weights(version: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(version)
    return {"w": rng.normal(size=(4, 3)).astype(np.float32), "b": np.full(3, version, np.float32)}


def test_the_pool_keeps_its_cap_and_evicts_the_oldest() -> None:
    pool = SnapshotPool(cap=2)
    assert pool.pin(2, [b"two"]) is None and pool.pin(4, [b"four"]) is None
    assert pool.pin(6, [b"six"]) == 2
    assert pool.versions == [4, 6] and pool.get(2) is None and pool.get(4) == (b"four",)
    assert pool.pin(4, [b"four again"]) is None  # a restarted learner's version 4 replaces it
    assert pool.versions == [6, 4] and pool.get(4) == (b"four again",)
    with pytest.raises(TypeError, match="immutable bytes"):
        pool.pin(8, [bytearray(b"eight")])
    with pytest.raises(ValueError, match="at least one"):
        SnapshotPool(0)


def test_a_store_pins_every_nth_version_and_serves_it_as_published() -> None:
    store = ParamStore(policy="main", snapshots=SnapshotPool(3, every=2))
    published = {}
    for version in range(9):
        assert store.handle(PublishParams(version, 10 * version, weights(version), policy="main"))
        published[version] = list(store.params_frames)
    assert store.snapshots.versions == [4, 6, 8]  # 2 evicted, 0 never pinned
    frames = store.snapshot_frames(ParamsRequest(-1, "", "main", snapshot=4))
    assert frames == published[4]  # the very bytes encoded at version 4's publish
    reply = decode(frames)
    assert isinstance(reply, Params) and reply.version == 4
    for name, array in weights(4).items():
        assert reply.arrays[name].tobytes() == array.tobytes()
    assert decode(store.snapshot_frames(ParamsRequest(4, "", "main", 4))) == ParamsNotModified(4)
    refused = decode(store.snapshot_frames(ParamsRequest(-1, "", "main", snapshot=2)))
    assert isinstance(refused, Error)
    assert refused.reason == "policy 'main' has no snapshot 2 (pinned: 4, 6, 8)"
    # A snapshot request is never held, even from an actor holding the latest version.
    assert not store.hold(b"actor", ParamsRequest(8, "", "main", snapshot=8), 0.0)
    assert store.hold(b"actor", ParamsRequest(8, "", "main"), 0.0)
    stats = store.stats()
    assert stats["params/snapshots"] == 3 and stats["params/num_served_snapshots"] == 1
    # A stopping server answers a snapshot request as it answers any other: Shutdown
    store.handle(Shutdown("test"))
    reply = decode(store.snapshot_frames(ParamsRequest(-1, "", "main", snapshot=4)))
    assert isinstance(reply, Shutdown)


def test_a_store_without_a_league_has_no_snapshots() -> None:
    store = ParamStore(policy="main")
    store.handle(PublishParams(2, 0, weights(2), policy="main"))
    refused = decode(store.snapshot_frames(ParamsRequest(-1, "", "main", snapshot=2)))
    assert refused == Error("policy 'main' has no snapshot 2 (pinned: none)")
    assert "params/snapshots" not in store.stats()


def test_a_snapshot_from_a_real_server_is_bit_identical_after_training_went_on(
    procs: Processes, tmp_path: Path
) -> None:
    cfg = load_config(CONFIG)
    walkers_cfg = policy_configs(cfg)["walkers"]
    spaces = network_spaces(walkers_cfg)
    nets = []
    for seed in range(8):
        torch.manual_seed(seed)
        nets.append(load_algorithm(walkers_cfg.algorithm).make_network(*spaces, walkers_cfg))
    addr = free_addr()
    args = ["params", "--config", str(CONFIG), "--run-dir", str(tmp_path / "run"), "--bind", addr]
    server = procs.start("params", *args, *set_args(LEAGUE))
    wait_for_server(server, addr, timeout_s=60)
    for version, net in enumerate(nets):  # versions 0..7: 2, 4 and 6 pinned, 2 then evicted
        reply = request(
            addr, PublishParams(version, version, params_to_arrays(net), policy="walkers")
        )
        assert reply == PublishAck(version, "walkers"), server.tail()
    ctx = sockets.make_context()
    try:
        torch.manual_seed(99)
        mine = load_algorithm(walkers_cfg.algorithm).make_network(*spaces, walkers_cfg)
        sock = sockets.connect(ctx, zmq.DEALER, addr)
        client = ParamsClient(sock, mine, timeout_s=30.0, policy="walkers", snapshot=4)
        for _ in range(50):
            client.request()
            if client.poll(timeout_ms=100):
                break
        assert client.version == 4, server.tail()
        for name, array in params_to_arrays(mine).items():
            assert array.tobytes() == params_to_arrays(nets[4])[name].tobytes(), name
        sock.close(linger=0)
    finally:
        ctx.term()
    assert isinstance(request(addr, ParamsRequest(-1, "", "walkers", snapshot=2)), Error)
    # Each policy has its own pool: the guide published nothing
    reply = request(addr, ParamsRequest(-1, "", "guide", snapshot=4))
    assert reply == Error("policy 'guide' has no snapshot 4 (pinned: none)")
    code, _ = server.stop(10.0)
    assert code == 0, server.tail()


def test_league_config_rules() -> None:
    cfg = load_config(CONFIG)
    assert not cfg.league.enabled
    with pytest.raises(ConfigError, match="league.pool_size must be >= 1"):
        config_from_dict({"league": {"snapshot_every_versions": 2, "pool_size": 0}})
    with pytest.raises(ConfigError, match="league.snapshot_every_versions must be >= 0"):
        config_from_dict({"league": {"snapshot_every_versions": -1}})
    with pytest.raises(ConfigError, match="plays a multi-agent run's policies"):
        config_from_dict({"league": {"snapshot_every_versions": 2}})
    ma = {"policies": [{"name": "main"}], "mapping": [{"policy": "main"}]}
    for league, message in [
        ({"main": "other"}, "league.main 'other' is not a policy the run trains"),
        ({"matchmaking": "best"}, "league.matchmaking must be '', latest, uniform or pfsp"),
        ({"matchmaking": "pfsp"}, "draws snapshots: set league.snapshot_every_versions"),
        ({"matchmaking": "latest", "snapshot_win_rate": 0.6}, "set league.matchmaking to"),
        ({"matchmaking": "pfsp", "snapshot_every_versions": 5, "latest_share": 2}, "[0, 1]"),
        ({"matchmaking": "pfsp", "snapshot_every_versions": 5, "pfsp_weighting": "x"}, "hard"),
        ({"eval_opponents": ["nobody"]}, "random, a scripted module:Class or checkpoint:"),
        ({"eval_opponents": ["checkpoint:"]}, "must be checkpoint:PATH or checkpoint:PATH#"),
        ({"eval_opponents": ["checkpoint:run#"]}, "must be checkpoint:PATH or checkpoint:PATH#"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            config_from_dict({"multiagent": ma, "league": league})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"snapshot": -2}, "snapshot must be a version >= 0 or -1"),
        ({"snapshot": 3, "shm_host": "host"}, "over the socket, of a named policy"),
        ({"snapshot": 3, "policy": ""}, "over the socket, of a named policy"),
    ],
)
def test_the_wire_checks_a_snapshot_request(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ParamsRequest(**{"have_version": -1, "policy": "main", **fields})

"""A league's matches, outcomes, ratings and state (``apexrl.league.league``, ``.storage``, the
parameter server's ``MatchRequest``).

- matches: the latest in seat ``ticket % 2``, opposite itself while the pool is empty, then a
  snapshot drawn uniformly or by prioritized fictitious self-play, ``latest_share`` self-play;
- outcomes: the payoff table and the Elo ratings against numbers worked by hand; one that claims
  what its match was not (never given, another actor's, a snapshot seat played by another
  version, a latest version never published, twice in a message) refuses the whole message and
  changes nothing; one counted before or of an evicted snapshot is dropped and counted;
- snapshots by win rate; the state to disk and back, refusing what is not a league's;
- a real parameter server: matches and outcomes over its socket, refused ones answered ``Error``;
  stopped and started again, it has its pool (bit-identical), payoffs and ratings.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, Processes, free_addr, request, server_stats, set_args, wait_for_server

from apexrl.league import storage
from apexrl.league.config import LeagueConfig
from apexrl.league.league import LATEST, TICKETS_SKIPPED_ON_RESTORE, League, Refused
from apexrl.league.snapshots import SnapshotPool
from apexrl.param_server import ParamStore, ParamStores
from apexrl.transport.messages import (
    Error,
    Matches,
    MatchRequest,
    Params,
    ParamsRequest,
    PublishAck,
    PublishParams,
)

CONFIG = REPO / "configs" / "impala_come_and_go.yaml"


def league(**fields) -> League:
    cfg = LeagueConfig(**{"snapshot_every_versions": 2, "matchmaking": "pfsp", **fields})
    return League(cfg, "main", np.random.default_rng(0))


def outcome(tickets, versions, returns) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.asarray(tickets, dtype=np.int64),
        np.asarray(versions, dtype=np.int64).reshape(len(tickets), 2),
        np.asarray(returns, dtype=np.float64).reshape(len(tickets), 2),
    )


def test_matches_seat_the_latest_in_turn_and_draw_its_opponent_from_the_pool() -> None:
    lg = league()
    tickets, versions = lg.matches(actor_id=0, count=4)
    assert tickets.tolist() == [1, 2, 3, 4] and (versions == LATEST).all()  # no pool yet
    lg.pinned(10)
    lg.pinned(20)
    tickets, versions = lg.matches(0, 400)
    latest_seat = tickets % 2
    assert (versions[np.arange(400), latest_seat] == LATEST).all()
    opponents = versions[np.arange(400), 1 - latest_seat]
    assert set(opponents.tolist()) == {10, 20}  # pfsp with no games: uniform
    # The latest beat snapshot 10 in every game and lost every game to 20: "hard" draws 20 only
    for _ in range(5):
        lg.payoffs.add("main", "main@10", 1.0)
        lg.payoffs.add("main", "main@20", 0.0)
    _, versions = lg.matches(0, 200)
    assert set(versions.ravel().tolist()) == {LATEST, 20}
    shared = league(latest_share=0.5)
    shared.pinned(10)
    _, versions = shared.matches(0, 2000)
    self_play = (versions == LATEST).all(axis=1).mean()
    assert 0.45 < self_play < 0.55
    assert (league(matchmaking="latest").matches(0, 10)[1] == LATEST).all()


def test_outcomes_fill_the_payoffs_and_move_the_elo_ratings_by_hand() -> None:
    lg = league()
    lg.pinned(10)
    tickets, versions = lg.matches(0, 2)  # ticket 1: latest in seat 1; ticket 2: in seat 0
    assert versions.tolist() == [[10, LATEST], [LATEST, 10]]
    # Game 1: the latest (version 12 by then) wins from seat 1; game 2: a draw
    lg.results(0, *outcome(tickets, [[10, 12], [12, 10]], [[-1, 1], [0, 0]]), latest_version=12)
    assert lg.payoffs.record("main", "main@10") == (1, 1, 0)
    # 1000 vs 1000, a win: +16 (K 32, expected 1/2); then a draw at 1016 vs 984: the expected
    # score of the latest is 1 / (1 + 10^(-32/400)) = 0.545920, so it gives back 32 * 0.045920
    assert lg.ratings["main"] == pytest.approx(1016 - 1.46945, abs=1e-4)
    assert lg.ratings["main@10"] == pytest.approx(984 + 1.46945, abs=1e-4)
    assert lg.games == 2 and lg.win_rate_vs_pool() == 0.75
    stats = lg.stats()
    assert stats["league/payoff/v10/wins"] == 1 and stats["league/payoff/v10/draws"] == 1
    assert stats["league/elo/v10"] == lg.ratings["main@10"]
    # Self-play counts as played and rates no one
    plain = league(matchmaking="latest")
    tickets, _ = plain.matches(0, 1)
    plain.results(0, *outcome(tickets, [[3, 3]], [[1, -1]]), latest_version=3)
    assert plain.games == plain.self_play_games == 1 and plain.ratings == {"main": 1000.0}


@pytest.mark.parametrize(
    ("actor", "ticket", "versions", "reason"),
    [
        (0, 99, [10, 12], "match 99 was never given"),
        (1, 1, [10, 12], "was given to actor 0, not 1"),
        (0, 1, [11, 12], "seat 0: snapshot main@10 played it, not version 11"),
        (0, 1, [10, 13], "seat 1: the latest main played it, whose newest version is 12, not 13"),
    ],
)
def test_an_outcome_that_claims_what_its_match_was_not_refuses_the_message_and_counts_nothing(
    actor: int, ticket: int, versions: list[int], reason: str
) -> None:
    lg = league()
    lg.pinned(10)
    lg.matches(0, 2)  # ticket 1: snapshot 10 in seat 0, the latest in seat 1
    good = [2, [12, 10], [1, -1]]  # an honest outcome in the same message
    tickets, seats, returns = outcome([good[0], ticket], [good[1], versions], [good[2], [1, -1]])
    with pytest.raises(Refused, match=reason):
        lg.results(actor, tickets, seats, returns, latest_version=12)
    assert lg.games == 0 and lg.payoffs.games == {} and lg.refused_results == 1
    assert set(lg.tickets[0]) == {1, 2}  # both still to come
    with pytest.raises(Refused, match="once per message"):
        lg.results(0, *outcome([2, 2], [[12, 10]] * 2, [[1, -1]] * 2), latest_version=12)


def test_an_outcome_counted_before_or_of_an_evicted_snapshot_is_dropped() -> None:
    lg = league()
    lg.pinned(10)
    lg.pinned(20)
    tickets, versions = lg.matches(0, 20)
    k = int(np.flatnonzero((versions == 10).any(axis=1))[0])
    claimed = np.where(versions[k] == LATEST, 12, versions[k])
    sent = outcome([tickets[k]], [claimed], [[0, 0]])
    lg.results(0, *sent, latest_version=12)
    lg.results(0, *sent, latest_version=12)  # sent again (a lost reply): counted once
    assert lg.games == 1 and lg.stale_results == 1
    lg.evicted(10)
    assert "main@10" not in lg.ratings and lg.payoffs.games == {} and lg.pool == [20]
    k = int(np.flatnonzero((versions == 10).any(axis=1))[1])
    claimed = np.where(versions[k] == LATEST, 12, versions[k])
    lg.results(0, *outcome([tickets[k]], [claimed], [[0, 0]]), latest_version=12)
    assert lg.games == 1 and lg.stale_results == 2


def test_a_snapshot_by_win_rate_first_at_the_start_then_when_the_latest_beats_the_pool() -> None:
    lg = league(snapshot_every_versions=0, snapshot_win_rate=0.75, win_rate_games=4)
    assert lg.wants_snapshot()  # no pool: the first version becomes one
    lg.pinned(0)
    assert not lg.wants_snapshot()
    for score in (1.0, 1.0, 0.5, 0.5):  # 0.75 over the last 4 games
        lg.recent.append(score)
    assert lg.wants_snapshot()
    lg.pinned(30)
    assert not lg.wants_snapshot() and len(lg.recent) == 0
    assert lg.ratings["main@30"] == lg.ratings["main"]


def test_the_state_goes_to_disk_and_back_and_what_is_not_a_leagues_is_refused(
    tmp_path: Path,
) -> None:
    lg = league()
    lg.pinned(10)
    tickets, versions = lg.matches(0, 1)
    lg.results(0, *outcome(tickets, [[10, 7]], [[-1, 1]]), latest_version=7)
    back = league()
    back.load(lg.to_dict())
    numbered_on = {**lg.to_dict(), "next_ticket": 2 + TICKETS_SKIPPED_ON_RESTORE}
    assert back.to_dict() == numbered_on  # past any match given after the last save
    for broken in (
        {**lg.to_dict(), "main": "other"},
        {**lg.to_dict(), "ratings": {"main": 1000.0}},
        {**lg.to_dict(), "payoffs": {"main|nobody": [1, 0, 0], "nobody|main": [0, 0, 1]}},
        {**lg.to_dict(), "games": -1},
    ):
        with pytest.raises(ValueError):
            league().load(broken)
    frames = tuple(bytes(f) for f in _params_frames(5))
    storage.write_snapshot(tmp_path, "main", 5, frames)
    assert storage.read_snapshot(tmp_path, "main", 5, None) == frames
    assert storage.read_snapshot(tmp_path, "main", 6, None) is None  # missing
    storage.snapshot_path(tmp_path, "main", 6).write_bytes(
        storage.snapshot_path(tmp_path, "main", 5).read_bytes()
    )
    assert storage.read_snapshot(tmp_path, "main", 6, None) is None  # version 5's weights
    storage.snapshot_path(tmp_path, "main", 7).write_bytes(b"\x01" + bytes(30))
    assert storage.read_snapshot(tmp_path, "main", 7, None) is None


def _params_frames(version: int) -> list:
    from apexrl.transport.codec import encode

    return encode(Params(version, {"w": np.full(3, version, np.float32)}))


def test_a_server_without_matchmaking_or_for_an_unknown_actor_refuses_match_requests() -> None:
    store = ParamStore(policy="main", snapshots=SnapshotPool(2, 2), league=league())
    stores = ParamStores({"main": store}, num_actors=2)
    reply = stores.handle(MatchRequest(0, 3))
    assert isinstance(reply, Matches) and len(reply.tickets) == 3
    assert isinstance(stores.handle(MatchRequest(2, 3)), Error)
    plain = ParamStores({"main": ParamStore(policy="main")}, num_actors=2)
    assert plain.handle(MatchRequest(0, 3)) == Error(
        "this run's league makes no matches (league.matchmaking)"
    )


def weights(version: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(version)
    return {"w": rng.normal(size=(4, 3)).astype(np.float32)}


def test_a_real_server_plays_matches_and_started_again_has_its_pool_payoffs_and_ratings(
    procs: Processes, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    overrides = (
        "league.snapshot_every_versions=2",
        "league.pool_size=2",
        "league.matchmaking=pfsp",
        "league.main=walkers",
        "actor.num_actors=2",
    )
    addr = free_addr()
    args = ["params", "--config", str(CONFIG), "--run-dir", str(run_dir), "--bind", addr]
    server = procs.start("params", *args, *set_args(overrides))
    wait_for_server(server, addr, timeout_s=60)
    published = _publish_come_and_go(addr, range(6))  # 2 and 4 pinned
    matches = request(addr, MatchRequest(1, 24))
    assert isinstance(matches, Matches), server.tail()
    played = np.where(matches.versions == LATEST, 5, matches.versions)
    returns = np.where(matches.versions == LATEST, 1.0, -1.0)  # the latest wins each game
    # Actor 0 claims a match of actor 1's; actor 1 claims a snapshot seat for the latest
    forged = request(addr, MatchRequest(0, 0, matches.tickets[16:17], played[16:17], returns[:1]))
    assert isinstance(forged, Error) and "was given to actor 1, not 0" in forged.reason
    latest_everywhere = np.full_like(played[16:17], 5)
    forged = request(
        addr, MatchRequest(1, 0, matches.tickets[16:17], latest_everywhere, returns[:1])
    )
    assert isinstance(forged, Error) and "snapshot walkers@" in forged.reason
    reply = request(addr, MatchRequest(1, 0, matches.tickets[:16], played[:16], returns[:16]))
    assert isinstance(reply, Matches) and len(reply.tickets) == 0
    before = server_stats(addr)
    assert before["league/games"] == 16 and before["league/pool_size"] == 2
    assert before["league/refused_results"] == 2
    assert before["league/elo/latest"] > 1000 > before["league/elo/v2"]
    code, _ = server.stop(10.0)
    assert code == 0, server.tail()

    # Started again as the launcher restarts a server that died (no --resume): it reads them back
    again = procs.start("params", *args, *set_args(overrides))
    wait_for_server(again, addr, timeout_s=60)
    after = server_stats(addr)
    counters = ("league/refused_results", "league/stale_results")  # this process's
    league_keys = [key for key in before if key.startswith("league/") and key not in counters]
    assert {key: after[key] for key in league_keys} == {key: before[key] for key in league_keys}
    reply = request(addr, ParamsRequest(-1, "", "walkers", snapshot=4))
    assert isinstance(reply, Params) and reply.version == 4, again.tail()
    for name, array in reply.arrays.items():
        assert array.tobytes() == published[4][name].tobytes(), name
    code, _ = again.stop(10.0)
    assert code == 0, again.tail()


def _publish_come_and_go(addr: str, versions) -> dict[int, dict[str, np.ndarray]]:
    """Publish ``versions`` of policy walkers (networks of different seeds); their arrays."""
    import torch

    from apexrl.algos import load_algorithm
    from apexrl.config import load_config
    from apexrl.envs.spaces import network_spaces
    from apexrl.models import params_to_arrays
    from apexrl.multiagent.policies import policy_configs

    walkers_cfg = policy_configs(load_config(CONFIG))["walkers"]
    spaces = network_spaces(walkers_cfg)
    published = {}
    for version in versions:
        torch.manual_seed(version)
        net = load_algorithm(walkers_cfg.algorithm).make_network(*spaces, walkers_cfg)
        published[version] = params_to_arrays(net)
        reply = request(addr, PublishParams(version, version, published[version], policy="walkers"))
        assert reply == PublishAck(version, "walkers")
    return published


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"want": -1}, "want must be in [0, 1024]"),
        ({"tickets": np.zeros(2, np.int64)}, "versions must be [2, seats]"),
        (
            {
                "tickets": np.zeros(1, np.int64),
                "versions": np.zeros((1, 2), np.int64),
                "returns": np.zeros((1, 3)),
            },
            "one value per match and seat",
        ),
        (
            {"tickets": np.zeros(1, np.int64), "versions": -np.ones((1, 2), np.int64),
             "returns": np.zeros((1, 2))},
            "a seat's version is a published version",
        ),
        (
            {"tickets": np.zeros(1, np.int64), "versions": np.zeros((1, 2), np.int64),
             "returns": np.full((1, 2), np.nan)},
            "returns must be finite",
        ),
        (
            {"tickets": np.zeros(1025, np.int64), "versions": np.zeros((1025, 2), np.int64),
             "returns": np.zeros((1025, 2))},
            "1025 matches in one message, over 1024",
        ),
    ],
)  # fmt: skip
def test_the_wire_checks_a_match_requests_shapes_and_values(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        MatchRequest(**{"actor_id": 0, "want": 1, **fields})
    with pytest.raises(ValueError, match="a seat's version is -1"):
        Matches(np.zeros(1, np.int64), np.full((1, 2), -2, np.int64))


def test_a_store_pins_main_when_the_league_asks_first_then_when_the_latest_beats_its_pool() -> None:
    lg = league(snapshot_every_versions=0, snapshot_win_rate=0.75, win_rate_games=4)
    store = ParamStore(policy="main", snapshots=SnapshotPool(8, every=0), league=lg)
    store.handle(PublishParams(0, 0, weights(0), policy="main"))
    assert store.snapshots.versions == [0] and lg.pool == [0]  # the first: a pool to beat
    store.handle(PublishParams(1, 0, weights(1), policy="main"))
    assert store.snapshots.versions == [0]  # no games yet
    tickets, versions = lg.matches(0, 4)
    played = np.where(versions == LATEST, 1, versions)
    lg.results(0, tickets, played, np.where(versions == LATEST, 1.0, -1.0), latest_version=1)
    assert lg.win_rate_vs_pool() == 1.0
    store.handle(PublishParams(2, 0, weights(2), policy="main"))
    assert store.snapshots.versions == [0, 2] and lg.pool == [0, 2]
    assert lg.ratings["main@2"] == lg.ratings["main"] > lg.ratings["main@0"]


def test_the_state_on_disk_holds_the_pools_of_the_trained_policies_alone(tmp_path: Path) -> None:
    main = ParamStore(
        policy="main", snapshots=SnapshotPool(2, 1), league=league(), league_dir=tmp_path
    )
    frozen = ParamStore(policy="frozen", league_dir=tmp_path)  # a network policy not trained
    stores = ParamStores({"main": main, "frozen": frozen}, num_actors=1)
    main.handle(PublishParams(1, 0, weights(1), policy="main"))
    stores.save_league()
    state = storage.read_state(tmp_path)
    assert state["pools"] == {"main": [1]} and state["leagues"]["main"]["pool"] == [1]
    assert storage.read_snapshot(tmp_path, "main", 1, None) is not None

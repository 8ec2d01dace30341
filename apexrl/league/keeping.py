"""A parameter server's league kept: made from the config, its snapshots and state written to disk
as they change (``storage``), and read back when a run resumes. The functions take the server's
stores (``param_server.ParamStore``: ``policy``, ``snapshots``, ``league``, ``league_dir``,
``layout``, ``limits``) without importing the server.
"""

from __future__ import annotations

import logging

import numpy as np

from apexrl.config import Config
from apexrl.league import storage
from apexrl.league.config import main_policy
from apexrl.league.league import League

log = logging.getLogger(__name__)


def make_league(cfg: Config, policy: str) -> League | None:
    """The league of the run's main policy (``league.config.main_policy``) on its store."""
    if not cfg.league.enabled or main_policy(cfg.league, cfg.multiagent.trained) != policy:
        return None
    return League(cfg.league, policy, np.random.default_rng())


def keep_snapshot(store, pinned: int, evicted: int | None) -> None:
    """A store's pinned version's frames written, the evicted one's removed (``league.storage``);
    a failed write is logged and the run goes on without it."""
    try:
        storage.write_snapshot(store.league_dir, store.policy, pinned, store.snapshots.get(pinned))
        if evicted is not None:
            storage.remove_snapshot(store.league_dir, store.policy, evicted)
    except OSError as exc:
        log.warning("snapshot %s version %d is not kept on disk: %s", store.policy, pinned, exc)


def restore_snapshots(store, versions: list[int]) -> list[int]:
    """Pin again the versions kept on disk (oldest first) that read back whole; returns
    those that did not."""
    lost = []
    for version in versions:
        frames = storage.read_snapshot(
            store.league_dir, store.policy, version, store.layout, store.limits
        )
        if frames is None:
            lost.append(version)
        else:
            store.snapshots.pin(version, list(frames))
    return lost


def save_leagues(stores) -> None:
    """The leagues' state on disk (``storage``), where the stores keep one."""
    stores = [s for s in stores if s.league_dir is not None and s.snapshots is not None]
    if not stores:
        return
    state = {
        "pools": {store.policy: store.snapshots.versions for store in stores},
        "leagues": {store.policy: store.league.to_dict() for store in stores if store.league},
    }
    try:
        storage.write_state(stores[0].league_dir, state)
    except OSError as exc:
        log.warning("the league's state is not written: %s", exc)


def restore_leagues(stores) -> None:
    """The pools, payoffs and ratings a stopped server of this run left on disk
    (``league.storage``), read back by a restarted or resumed one; a snapshot that does not read
    back whole is forgotten. A new run has none: its league starts afresh."""
    stores = list(stores)
    league_dir = next(s.league_dir for s in stores if s.league_dir)
    try:
        state = storage.read_state(league_dir)
    except ValueError as exc:
        log.warning("the league starts afresh: %s", exc)
        return
    if state is None:
        log.info("no league state in %s: the league starts afresh", league_dir)
        return
    leagues = state.get("leagues")
    leagues = leagues if isinstance(leagues, dict) else {}
    for store in stores:
        policy = store.policy
        versions = state["pools"].get(policy, [])
        if store.snapshots is None or not isinstance(versions, list):
            continue
        lost = restore_snapshots(store, [v for v in versions if isinstance(v, int)])
        league_state = leagues.get(policy)
        if store.league is not None and league_state is not None:
            try:
                store.league.load(league_state)
            except ValueError as exc:
                log.warning("the league of %s starts afresh: %s", policy, exc)
        if store.league is not None:  # the league plays what is pinned, and only that
            for version in list(store.league.pool):
                if store.snapshots.get(version) is None:
                    store.league.evicted(version)
            for version in store.snapshots.versions:
                if version not in store.league.pool:
                    store.league.pinned(version)
        log.info(
            "league of %s restored: snapshots %s%s",
            policy,
            store.snapshots.versions,
            f" ({len(lost)} lost)" if lost else "",
        )

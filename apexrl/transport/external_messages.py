"""The wire schema of external environments: what a ``PolicyClient`` and a policy server
(``apexrl external``) say to each other, one frozen dataclass per kind, registered in
``messages.MESSAGE_TYPES`` with the others.

A client names its episodes by ``episode_id`` (1 to ``MAX_EPISODE_ID_CHARS`` printable
characters). Every call gets one reply, in order: ``ActionReply`` to ``GetAction``,
``ExternalSetup`` to ``ExternalHello``, ``EpisodeAck`` to the others, or ``Error`` (nothing
changed). What depends on the run (the observation's shape and dtype, the extras an actor core
stores, which episodes are open) is the server's to check.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MAX_EPISODE_ID_CHARS = 128
MAX_CONFIG_CHARS = 60_000  # ExternalSetup's config: a run's config.yaml, well under a header


def check_episode_id(episode_id: str) -> None:
    if not 0 < len(episode_id) <= MAX_EPISODE_ID_CHARS or not episode_id.isprintable():
        raise ValueError(
            f"episode_id must be 1 to {MAX_EPISODE_ID_CHARS} printable characters, "
            f"got {episode_id[:40]!r}"
        )


def _check_numeric(name: str, array: np.ndarray) -> None:
    if array.dtype.kind not in "biuf" or array.ndim > 4:
        raise ValueError(f"{name} must be a numeric array of at most 4 dimensions")


@dataclass(frozen=True)
class ExternalHello:
    """Client -> policy server: what a client with local inference needs to act itself."""


@dataclass(frozen=True)
class ExternalSetup:
    """Policy server -> client: the run's config (YAML text) and the actor id whose
    exploration the client's actions follow."""

    config_yaml: str
    actor_id: int

    def __post_init__(self) -> None:
        if len(self.config_yaml) > MAX_CONFIG_CHARS:
            raise ValueError(f"config_yaml is over {MAX_CONFIG_CHARS} characters")


@dataclass(frozen=True)
class StartEpisode:
    """Client -> server: a new episode; with ``training`` false its steps are acted on but
    neither stored nor counted."""

    episode_id: str
    training: bool = True

    def __post_init__(self) -> None:
        check_episode_id(self.episode_id)


@dataclass(frozen=True)
class GetAction:
    """Client -> server: the episode's observation; answered by the action to take."""

    episode_id: str
    obs: np.ndarray

    def __post_init__(self) -> None:
        check_episode_id(self.episode_id)
        _check_numeric("obs", self.obs)


@dataclass(frozen=True)
class ActionReply:
    """Server -> client: the action for ``GetAction`` and the weights version that chose it."""

    episode_id: str
    action: np.ndarray
    weights_version: int


@dataclass(frozen=True)
class LogAction:
    """Client -> server: an action taken on ``obs`` that the server did not choose. With
    ``local`` false the client chose it its own way, in the env's units (off-policy families
    only); with ``local`` true it is a client's local inference: the network's own action,
    with the run's actor core's ``extras`` and the ``weights_version`` that chose it."""

    episode_id: str
    obs: np.ndarray
    action: np.ndarray
    weights_version: int = -1
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    local: bool = False

    def __post_init__(self) -> None:
        check_episode_id(self.episode_id)
        _check_numeric("obs", self.obs)
        _check_numeric("action", self.action)
        if self.weights_version < -1:
            raise ValueError(f"weights_version must be >= -1, got {self.weights_version}")
        if self.extras and not self.local:
            raise ValueError("extras come with a local inference's action only (local true)")
        if len(self.extras) > 16:
            raise ValueError(f"{len(self.extras)} extras, over 16")
        for name, value in self.extras.items():
            _check_numeric(f"extras[{name!r}]", value)


@dataclass(frozen=True)
class LogReturns:
    """Client -> server: reward since the last action (it adds up until the next one)."""

    episode_id: str
    reward: float

    def __post_init__(self) -> None:
        check_episode_id(self.episode_id)
        if not np.isfinite(self.reward):
            raise ValueError("reward must be finite")


@dataclass(frozen=True)
class EndEpisode:
    """Client -> server: the episode ended on ``obs``: terminated, or cut off (``truncated``,
    which still bootstraps)."""

    episode_id: str
    obs: np.ndarray
    truncated: bool = False

    def __post_init__(self) -> None:
        check_episode_id(self.episode_id)
        _check_numeric("obs", self.obs)


@dataclass(frozen=True)
class EpisodeAck:
    """Server -> client: the call on ``episode_id`` was taken."""

    episode_id: str


EXTERNAL_MESSAGE_TYPES: tuple[type, ...] = (
    ExternalHello,
    ExternalSetup,
    StartEpisode,
    GetAction,
    ActionReply,
    LogAction,
    LogReturns,
    EndEpisode,
    EpisodeAck,
)
# What a client may send to a policy server (``auth.PERMISSIONS`` of the actor role).
CLIENT_CALLS: tuple[type, ...] = (
    ExternalHello,
    StartEpisode,
    GetAction,
    LogAction,
    LogReturns,
    EndEpisode,
)

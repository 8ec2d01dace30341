"""The wire schema: one frozen dataclass per message kind.

Every message that crosses a process boundary is one of the types in ``MESSAGE_TYPES``. Field types
are restricted to what the codec (``codec.py``) can carry without pickle:

- ``int``, ``float``, ``bool``, ``str`` scalars,
- ``np.ndarray`` (numeric dtypes only, see ``codec.ALLOWED_DTYPES``),
- ``dict[str, np.ndarray]`` (named arrays, e.g. the fields of a trajectory chunk),
- ``dict[str, float]`` (named scalars, e.g. statistics).

``__post_init__`` checks the invariants that hold between fields (matching lengths, dtypes), so a
message that decodes is a message that handlers can trust. A violation raises ``ValueError``, which
the codec turns into ``DecodeError``. What depends on the run's config (an item's layout, the
range of actor ids and learner ranks, the largest chunk or batch) is for the receiving server to
check: the replay server's ``ReplayService`` refuses what no peer of its config would send.

Replay items are rows: a ``TrajectoryChunk`` carries ``N`` items, and every array in ``fields`` has
leading dimension ``N``. What an item is depends on the algorithm, not on the wire:

- Ape-X DQN: an n-step transition (``obs [N, *obs]``, ``action [N]``, ``reward [N]``,
  ``num_steps [N]``, ``terminated [N]``, ``truncated [N]``, ``next_obs [N, *obs]``).
- R2D2: a sequence (``obs [N, T + 1, *obs]``, ..., ``recurrent_state [N, 2, H]``).
- IMPALA / PPO: an unroll (``obs [N, T + 1, *obs]``, ..., ``behaviour_logp [N, T]``), served FIFO.

Stacked Atari frames travel once (``transport/frames.py``): a chunk's or a batch's ``frames``
``[F, H, W]`` uint8 holds each distinct frame, and its frame fields (``obs``, ``next_obs``) hold
int32 references ``[N, ..., k]`` into them instead of ``[N, ..., k, H, W]`` stacks. Without
stacked frames ``frames`` is empty.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

import numpy as np

from apexrl.transport.external_messages import EXTERNAL_MESSAGE_TYPES

# 11: MatchRequest and Matches (a league's matches and their outcomes);
# 10: ParamsRequest.snapshot (a league's pinned versions);
# 9: multi-agent runs (a chunk's agent steps, reports' returns per group, weights per policy);
# 8: external environments (external_messages); 7: env tasks with the weights; 6: chunk
# sequence numbers, published versions; 5: frames sent once; 4: ActorReport.custom_metrics;
# 3: weights in shm
SCHEMA_VERSION = 11

MAX_CUSTOM_METRICS = 64  # custom metrics in one ActorReport
MAX_ENV_TASK_CHARS = 4096  # an env task, as JSON text (Trainer.set_env_task)
MAX_METRIC_NAME_CHARS = 64
MAX_RETURN_GROUPS = 64  # return groups in one ActorReport (multi-agent: team, policies, agents)
MAX_POLICY_NAME_CHARS = 64
MAX_MATCHES = 1024  # matches asked for, or outcomes sent, in one message
MAX_SEATS = 16  # seats of a league's game
# A custom metric's name: what a TensorBoard tag and a JSON key hold without escaping.
METRIC_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-/]*")


def _check_1d(name: str, array: np.ndarray, length: int | None = None) -> None:
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    if length is not None and array.shape[0] != length:
        raise ValueError(f"{name} has length {array.shape[0]}, expected {length}")


def _check_rows(fields: dict[str, np.ndarray], num_rows: int) -> None:
    for name, array in fields.items():
        if array.ndim == 0 or array.shape[0] != num_rows:
            raise ValueError(
                f"field {name!r} has shape {array.shape}, expected leading dimension {num_rows}"
            )


def _no_frames() -> np.ndarray:
    return np.zeros((0, 0, 0), dtype=np.uint8)


def _check_frames(frames: np.ndarray) -> None:
    if frames.dtype != np.uint8 or frames.ndim != 3:
        raise ValueError(f"frames must be uint8 [F, H, W], got {frames.dtype} {frames.shape}")


def _check_kind(name: str, array: np.ndarray, kinds: str) -> None:
    if array.dtype.kind not in kinds:
        raise ValueError(f"{name} has dtype {array.dtype}, expected kind in {kinds!r}")


def check_metric_name(name: str) -> None:
    """A custom metric's name: 1 to ``MAX_METRIC_NAME_CHARS`` of letters, digits and ``_.-/``,
    not starting with one of ``.-/``."""
    if not isinstance(name, str) or len(name) > MAX_METRIC_NAME_CHARS:
        raise ValueError(
            f"a metric name must be a str of at most {MAX_METRIC_NAME_CHARS} characters"
        )
    if not METRIC_NAME.fullmatch(name):
        raise ValueError(f"metric name {name[:80]!r} may hold only letters, digits and _.-/")


def check_policy_name(name: str) -> None:
    """A policy's name on the wire: empty (a single-agent run's) or an identifier of at most
    ``MAX_POLICY_NAME_CHARS`` characters."""
    if name and (len(name) > MAX_POLICY_NAME_CHARS or not name.isidentifier()):
        raise ValueError(f"policy name {name[:80]!r} is not an identifier of at most 64 characters")


def check_custom_metrics(values: dict[str, float]) -> None:
    """At most ``MAX_CUSTOM_METRICS`` metrics of valid names (``check_metric_name``) and finite
    values."""
    if len(values) > MAX_CUSTOM_METRICS:
        raise ValueError(f"{len(values)} custom metrics, over the limit of {MAX_CUSTOM_METRICS}")
    for name, value in values.items():
        check_metric_name(name)
        if not math.isfinite(value):
            raise ValueError(f"custom metric {name!r} is not finite")


@dataclass(frozen=True)
class TrajectoryChunk:
    """Actor -> replay: ``N`` replay items with their initial priorities.

    ``priorities`` is float64 ``[N]`` (ignored by FIFO tables); every array in ``fields`` has
    leading dimension ``N``. ``incarnation`` changes each time an actor process starts, so the
    server can tell a restarted actor from a duplicate. ``sequence`` numbers an incarnation's
    chunks ``0, 1, 2, ...``; a chunk sent again keeps its number, so replay stores each chunk
    once and acknowledges a copy of one it stored without storing it again. ``env_steps`` is the
    number of env steps the actor took since its previous chunk: replay counts the run's env
    steps from inserted chunks, so the count and the replay's size describe the same data.
    ``frames``: the distinct frames its frame fields reference (stacked Atari frames, see above),
    else empty.

    In a multi-agent run ``table`` is the policy whose agents' steps the items hold,
    ``agent_steps`` the agent steps they account for (what replay holds the chunk's claim to),
    and ``env_steps`` the actor's env steps since its previous chunk of any policy; a
    single-agent chunk's ``agent_steps`` is -1 (its env steps are its agent's).
    """

    table: str
    actor_id: int
    incarnation: int
    sequence: int
    weights_version: int
    env_steps: int
    priorities: np.ndarray
    fields: dict[str, np.ndarray] = field(default_factory=dict)
    frames: np.ndarray = field(default_factory=_no_frames)
    agent_steps: int = -1

    @property
    def claimed_steps(self) -> int:
        """The steps the chunk's items account for, by its own claim."""
        return self.env_steps if self.agent_steps < 0 else self.agent_steps

    def __post_init__(self) -> None:
        _check_frames(self.frames)
        if not 0 <= self.sequence < 2**62:
            raise ValueError(f"sequence must be in [0, 2**62), got {self.sequence}")
        if self.env_steps < 0:
            raise ValueError(f"env_steps must be non-negative, got {self.env_steps}")
        if self.agent_steps < -1:
            raise ValueError(f"agent_steps must be >= 0 (-1: single agent), got {self.agent_steps}")
        _check_1d("priorities", self.priorities)
        _check_kind("priorities", self.priorities, "f")
        if not np.all(np.isfinite(self.priorities)) or np.any(self.priorities < 0):
            raise ValueError("priorities must be finite and non-negative")
        if not self.fields:
            raise ValueError("a chunk needs at least one field")
        _check_rows(self.fields, self.priorities.shape[0])


@dataclass(frozen=True)
class InsertAck:
    """Replay -> actor: the chunk ``sequence`` is stored (-1: an ack that names no chunk). Sent
    late when the rate limiter holds inserts back, which is how a fast actor is slowed down
    instead of dropped. ``num_inserted`` is 0 for a copy of a chunk stored before (a duplicate),
    which is acknowledged again but not stored twice."""

    table: str
    num_inserted: int
    table_size: int
    sequence: int = -1


@dataclass(frozen=True)
class SampleRequest:
    """Learner -> replay: ask for ``batch_size`` items; answered by ``SampleBatch`` when the rate
    limiter allows it (a request may wait)."""

    table: str
    batch_size: int

    def __post_init__(self) -> None:
        if self.batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {self.batch_size}")


@dataclass(frozen=True)
class SampleBatch:
    """Replay -> learner: ``N`` items with their keys and sampling probabilities.

    ``keys`` int64 ``[N]``; ``probabilities`` float64 ``[N]`` (P(i) of prioritized sampling, 1 for
    FIFO); ``table_size`` is the number of items the probabilities were computed over;
    ``frames``: the distinct frames its frame fields reference, else empty.
    """

    table: str
    table_size: int
    keys: np.ndarray
    probabilities: np.ndarray
    fields: dict[str, np.ndarray] = field(default_factory=dict)
    frames: np.ndarray = field(default_factory=_no_frames)

    def __post_init__(self) -> None:
        _check_frames(self.frames)
        _check_1d("keys", self.keys)
        _check_kind("keys", self.keys, "i")
        _check_1d("probabilities", self.probabilities, self.keys.shape[0])
        _check_kind("probabilities", self.probabilities, "f")
        _check_rows(self.fields, self.keys.shape[0])


@dataclass(frozen=True)
class PriorityUpdate:
    """Learner -> replay: new priorities for sampled keys. Keys of evicted items are ignored.
    ``learner_rank`` says which of several learners sent it (0 for a single learner)."""

    table: str
    learner_rank: int
    keys: np.ndarray
    priorities: np.ndarray

    def __post_init__(self) -> None:
        _check_1d("keys", self.keys)
        _check_kind("keys", self.keys, "i")
        _check_1d("priorities", self.priorities, self.keys.shape[0])
        _check_kind("priorities", self.priorities, "f")
        if not np.all(np.isfinite(self.priorities)) or np.any(self.priorities < 0):
            raise ValueError("priorities must be finite and non-negative")


@dataclass(frozen=True)
class ActorReport:
    """Actor -> replay (no reply): env steps and finished episodes since the last report.

    The replay server is the one place every actor talks to, so it aggregates these for the learner
    (recent training and evaluation returns, evaluation env steps; the run's training env steps
    come from the chunks). ``episode_returns`` float64 ``[E]``, ``episode_lengths`` int64 ``[E]``.
    ``custom_metrics``: the mean of each metric that the run's callbacks returned at the end of
    the interval's episodes (``apexrl.callbacks``; ``check_custom_metrics``).

    A multi-agent actor's ``episode_returns`` are the returns the run is judged by
    (``multiagent.judge``: the team's by default); ``group_returns`` holds, per group
    (``team``, ``policy/<name>``, ``agent/<name>``, ``policy/<name>/<agent>``), the returns of the
    interval's episodes the group played, float64 ``[E_g]``; ``agent_steps`` counts every agent's
    decisions (fixed policies' too).
    """

    actor_id: int
    incarnation: int
    is_eval: bool
    env_steps: int
    weights_version: int
    episode_returns: np.ndarray
    episode_lengths: np.ndarray
    custom_metrics: dict[str, float] = field(default_factory=dict)
    group_returns: dict[str, np.ndarray] = field(default_factory=dict)
    agent_steps: int = 0

    def __post_init__(self) -> None:
        if self.env_steps < 0:
            raise ValueError(f"env_steps must be non-negative, got {self.env_steps}")
        if self.agent_steps < 0:
            raise ValueError(f"agent_steps must be non-negative, got {self.agent_steps}")
        if len(self.group_returns) > MAX_RETURN_GROUPS:
            raise ValueError(
                f"{len(self.group_returns)} return groups, over the limit of {MAX_RETURN_GROUPS}"
            )
        for name, returns in self.group_returns.items():
            check_metric_name(name)
            _check_1d(f"group_returns[{name!r}]", returns)
            _check_kind(f"group_returns[{name!r}]", returns, "f")
        _check_1d("episode_returns", self.episode_returns)
        _check_kind("episode_returns", self.episode_returns, "f")
        _check_1d("episode_lengths", self.episode_lengths, self.episode_returns.shape[0])
        _check_kind("episode_lengths", self.episode_lengths, "i")
        check_custom_metrics(self.custom_metrics)


@dataclass(frozen=True)
class RestoreCounters:
    """Learner -> replay, when a run resumes from a checkpoint: the run had made ``env_steps``
    training env steps before. Replay's count becomes at least that (a replay server that kept
    running already counts them). Answered by ``Stats``."""

    env_steps: int

    def __post_init__(self) -> None:
        if not 0 <= self.env_steps < 2**53:
            raise ValueError(f"env_steps must be in [0, 2**53), got {self.env_steps}")


@dataclass(frozen=True)
class PublishedVersion:
    """Learner -> replay (no reply), just before it publishes ``version`` to the parameter server
    (and again after replay came back): the newest weights version an actor may hold. Replay
    holds a chunk or report that names a newer one until it hears of it, so an actor key cannot
    claim versions no learner published. ``policy``: the policy of a multi-agent run whose
    version it is ("": the run's single policy)."""

    version: int
    policy: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.version < 2**53:
            raise ValueError(f"version must be in [0, 2**53), got {self.version}")
        check_policy_name(self.policy)


@dataclass(frozen=True)
class StatsRequest:
    """Any peer -> a server: ask for its ``Stats``."""


@dataclass(frozen=True)
class Stats:
    """A server's counters and gauges by stable metric name (``replay/size``, ...)."""

    role: str
    values: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ParamsRequest:
    """Actor -> param server: "I hold ``have_version``" (-1: none). Answered by ``Params`` when a
    newer version exists, else by ``ParamsNotModified``.

    ``shm_host`` is set by an actor that can read the weights from shared memory: the identity of
    its host and shared-memory directory (``shm.host_identity``); empty asks for them over the
    socket. The server only compares it with its own identity and never opens anything it names.

    ``snapshot`` >= 0 asks for that pinned version of ``policy`` (a league's snapshot,
    ``apexrl.league``) instead of the latest, over the socket; -1: the latest.
    """

    have_version: int
    shm_host: str = ""
    policy: str = ""  # the policy whose weights are asked for (multi-agent runs); "": the run's
    snapshot: int = -1

    def __post_init__(self) -> None:
        if len(self.shm_host) > 512:
            raise ValueError(f"shm_host is {len(self.shm_host)} characters, over 512")
        check_policy_name(self.policy)
        if self.snapshot < -1:
            raise ValueError(
                f"snapshot must be a version >= 0 or -1 (the latest), got {self.snapshot}"
            )
        if self.snapshot >= 0 and (self.shm_host or not self.policy):
            raise ValueError("a snapshot is asked for over the socket, of a named policy")


def check_env_task(text: str) -> None:
    """An env task on the wire: empty, or JSON text of at most ``MAX_ENV_TASK_CHARS``."""
    if not text:
        return
    if len(text) > MAX_ENV_TASK_CHARS:
        raise ValueError(f"env_task is {len(text)} characters, over {MAX_ENV_TASK_CHARS}")
    try:
        json.loads(text)
    except ValueError as exc:
        raise ValueError(f"env_task is not JSON: {exc}") from exc


@dataclass(frozen=True)
class Params:
    """Param server -> actor: the latest weights, by parameter name, in ``arrays``; or, for an
    actor that sent the server's own ``shm_host``, in the shared-memory file ``shm_file`` (a bare
    file name, ``arrays`` empty) of ``shm_nbytes`` bytes whose header holds ``shm_token`` (32 hex
    digits, random per write) and ``version`` (``apexrl.transport.shm``)."""

    version: int
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    shm_file: str = ""
    shm_nbytes: int = 0
    shm_token: str = ""
    env_task: str = ""  # the env task in force with these weights, JSON text; "": none

    def __post_init__(self) -> None:
        check_env_task(self.env_task)
        if not self.shm_file:
            if self.shm_nbytes or self.shm_token:
                raise ValueError("shm_nbytes and shm_token need a shm_file")
            return
        if self.arrays:
            raise ValueError("weights come in arrays or in a shm_file, not both")
        name = self.shm_file
        if len(name) > 255 or "/" in name or "\0" in name or name in (".", ".."):
            raise ValueError(f"shm_file must be a bare file name, got {name[:80]!r}")
        if self.shm_nbytes <= 0:
            raise ValueError(f"shm_nbytes must be positive, got {self.shm_nbytes}")
        if len(self.shm_token) != 32 or not set(self.shm_token) <= set("0123456789abcdef"):
            raise ValueError("shm_token must be 32 lowercase hex digits")


def _no_tickets() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


def _no_seats(dtype: type) -> np.ndarray:
    return np.zeros((0, 2), dtype=dtype)


def _check_matches(tickets: np.ndarray, per_seat: dict[str, np.ndarray]) -> None:
    """``tickets`` int64 ``[M]`` (at most ``MAX_MATCHES``), each of ``per_seat`` ``[M, S]`` with
    one row per ticket and 1 to ``MAX_SEATS`` seats."""
    _check_1d("tickets", tickets)
    _check_kind("tickets", tickets, "i")
    if len(tickets) > MAX_MATCHES:
        raise ValueError(f"{len(tickets)} matches in one message, over {MAX_MATCHES}")
    for name, array in per_seat.items():
        if array.ndim != 2 or array.shape[0] != len(tickets):
            raise ValueError(f"{name} must be [{len(tickets)}, seats], got shape {array.shape}")
        if not 1 <= array.shape[1] <= MAX_SEATS:
            raise ValueError(f"{name} has {array.shape[1]} seats, expected 1 to {MAX_SEATS}")


@dataclass(frozen=True)
class MatchRequest:
    """Actor -> param server: the outcomes of the league matches the actor finished and how many
    new ones it wants (``apexrl.league``). A finished match is its ``tickets`` int64 ``[G]`` (as
    ``Matches`` gave it), the weights version that played each seat (``versions`` int64
    ``[G, S]``) and each seat's episode return (``returns`` float64 ``[G, S]``). Answered by
    ``Matches``; refused whole, with ``Error``, when any outcome claims what its match was not
    (another actor's, other players)."""

    actor_id: int
    want: int
    tickets: np.ndarray = field(default_factory=_no_tickets)
    versions: np.ndarray = field(default_factory=lambda: _no_seats(np.int64))
    returns: np.ndarray = field(default_factory=lambda: _no_seats(np.float64))

    def __post_init__(self) -> None:
        if not 0 <= self.want <= MAX_MATCHES:
            raise ValueError(f"want must be in [0, {MAX_MATCHES}], got {self.want}")
        _check_matches(self.tickets, {"versions": self.versions, "returns": self.returns})
        _check_kind("versions", self.versions, "i")
        _check_kind("returns", self.returns, "f")
        if self.versions.shape != self.returns.shape:
            raise ValueError("versions and returns must have one value per match and seat")
        if (self.versions < 0).any():
            raise ValueError("a seat's version is a published version, >= 0")
        if not np.isfinite(self.returns).all():
            raise ValueError("returns must be finite")


@dataclass(frozen=True)
class Matches:
    """Param server -> actor: new matches of the league's main policy, one per episode: each
    ``tickets`` int64 ``[M]`` with the version that plays each seat (``versions`` int64
    ``[M, S]``, seats in the env's agent order): -1 the latest (the actor's newest weights),
    else a pinned snapshot (``ParamsRequest.snapshot``)."""

    tickets: np.ndarray = field(default_factory=_no_tickets)
    versions: np.ndarray = field(default_factory=lambda: _no_seats(np.int64))

    def __post_init__(self) -> None:
        _check_matches(self.tickets, {"versions": self.versions})
        _check_kind("versions", self.versions, "i")
        if (self.versions < -1).any():
            raise ValueError("a seat's version is -1 (the latest) or a pinned version")


@dataclass(frozen=True)
class ParamsNotModified:
    """Param server -> actor: no version newer than the one the actor holds (``version`` is the
    server's current version, -1 before the first publish)."""

    version: int


@dataclass(frozen=True)
class PublishParams:
    """Learner -> param server: new weights. Answered by ``PublishAck``. ``env_steps`` is the
    run's training env steps as the learner last heard them (the x-axis of the server's
    metrics)."""

    version: int
    env_steps: int
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    env_task: str = ""  # the env task actors set on their envs with these weights (JSON text)
    policy: str = ""  # the policy these weights are (multi-agent runs); "": the run's

    def __post_init__(self) -> None:
        check_env_task(self.env_task)
        check_policy_name(self.policy)
        if self.version < 0:
            raise ValueError(f"version must be non-negative, got {self.version}")
        if self.env_steps < 0:
            raise ValueError(f"env_steps must be non-negative, got {self.env_steps}")
        if not self.arrays:
            raise ValueError("a publish needs at least one array")


@dataclass(frozen=True)
class PublishAck:
    """Param server -> learner: ``version`` (of ``policy``) is now being served."""

    version: int
    policy: str = ""


@dataclass(frozen=True)
class Shutdown:
    """Ask a server to stop; a stopping server also answers requests with it, so peers stop too."""

    reason: str


@dataclass(frozen=True)
class Error:
    """Server -> peer: the request was rejected (malformed, wrong table, ...); nothing changed."""

    reason: str


Message = (
    TrajectoryChunk
    | InsertAck
    | SampleRequest
    | SampleBatch
    | PriorityUpdate
    | ActorReport
    | RestoreCounters
    | PublishedVersion
    | StatsRequest
    | Stats
    | ParamsRequest
    | Params
    | ParamsNotModified
    | MatchRequest
    | Matches
    | PublishParams
    | PublishAck
    | Shutdown
    | Error
)

MESSAGE_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        TrajectoryChunk,
        InsertAck,
        SampleRequest,
        SampleBatch,
        PriorityUpdate,
        ActorReport,
        RestoreCounters,
        PublishedVersion,
        StatsRequest,
        Stats,
        ParamsRequest,
        Params,
        ParamsNotModified,
        MatchRequest,
        Matches,
        PublishParams,
        PublishAck,
        Shutdown,
        Error,
        *EXTERNAL_MESSAGE_TYPES,
    )
}

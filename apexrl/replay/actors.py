"""What replay knows of each actor, for the ``actor/<name>/...`` entries that the replay server
adds to ``Stats`` (``apexrl status`` shows them): its env steps (a training actor's as its chunks
carried them, an evaluation actor's as it reported them), its env steps per second over the last
``ACTOR_RATE_MARKS`` of those chunks or reports, the weights version it acts with and how long
ago it was heard from. These entries are neither snapshotted nor written to TensorBoard: they
describe who reports now.

``ActorRoster`` keeps them, with when each actor (training or evaluation) was last heard from, for
``replay/active_actors``, and holds what a training actor claims to what it sent
(``StepBalance``): the env steps a chunk claims must be those its items account for, give or take
the steps an actor has taken and not cut into items yet (``algo.carried_steps``), summed over the
actor's life, so an actor key can neither inflate the run's env steps with few items nor slip
items in under few steps; and a report's env steps must be ones its chunks carried since its last
report, give or take the steps not sent yet (``report_slack``), except the first report of each
actor this server process hears, which may cover chunks an earlier server process took (it is
held to the ``MAX_*`` bounds of ``replay/admission.py`` only).
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

from apexrl.transport.messages import ActorReport, TrajectoryChunk

ACTOR_RATE_MARKS = 8  # an actor's env steps/s: over its last 8 chunks (evaluation: reports)
ACTIVE_S = 30.0  # seconds: an actor heard from this recently counts in replay/active_actors


@dataclass
class StepBalance:
    """One training actor's env steps in its current incarnation, as this server saw them."""

    incarnation: int
    claimed: int = 0  # env steps its chunks claimed
    accounted: int = 0  # env steps their items account for
    unreported: int = 0  # claimed by chunks and not yet by a report


def check_steps_claimed(
    balance: StepBalance | None,
    incarnation: int,
    claimed: int,
    accounted: int,
    carried: int,
    env_steps: int | None = None,
) -> StepBalance:
    """The balance after a chunk that claims ``claimed`` env steps for items that account for
    ``accounted``; raises ``ValueError`` when the actor's claims and items part by more than the
    ``carried`` steps an actor may hold uncut (either way: items may also hold steps that an
    earlier server process counted). A new incarnation starts a new balance. ``env_steps``: the
    run's env steps the chunk brings, when they are not its claimed steps (a multi-agent chunk
    claims its agents' steps), which its actor's next report must account for."""
    if balance is None or balance.incarnation != incarnation:
        balance = StepBalance(incarnation)
    total_claimed, total_accounted = balance.claimed + claimed, balance.accounted + accounted
    if abs(total_claimed - total_accounted) > carried:
        raise ValueError(
            f"a chunk of items that account for {accounted} env steps claims {claimed}: with "
            f"the actor's earlier chunks, {total_claimed} claimed for {total_accounted}, more "
            f"than the {carried} steps an actor holds uncut apart"
        )
    brought = claimed if env_steps is None else env_steps
    return StepBalance(incarnation, total_claimed, total_accounted, balance.unreported + brought)


@dataclass
class ActorProgress:
    """What one actor sent, for its entries in ``Stats``."""

    env_steps: int = 0  # since this server started: a training actor's chunks', else reported
    weights_version: int = -1  # its latest chunk's or report's
    last_heard: float = 0.0  # time.monotonic() of its latest chunk or report
    # (time.monotonic(), env_steps) at each of its last chunks (evaluation actors: reports)
    marks: collections.deque[tuple[float, int]] = field(
        default_factory=lambda: collections.deque(maxlen=ACTOR_RATE_MARKS)
    )


def actor_name(is_eval: bool, actor_id: int) -> str:
    """An actor's name in ``Stats`` keys: ``actor/3/...`` for training actor 3, ``actor/eval_0/...``
    for evaluation actor 0."""
    return f"eval_{actor_id}" if is_eval else str(actor_id)


def env_steps_per_s(marks: collections.deque[tuple[float, int]]) -> float:
    """Env steps per second between the first and the last of ``marks`` (time, env steps so far);
    nan with fewer than two."""
    if len(marks) < 2 or marks[-1][0] <= marks[0][0]:
        return float("nan")
    (t0, steps0), (t1, steps1) = marks[0], marks[-1]
    return (steps1 - steps0) / (t1 - t0)


def actor_stats(name: str, progress: ActorProgress, now: float) -> dict[str, float]:
    """One actor's four ``Stats`` entries (``apexrl status`` shows them)."""
    return {
        f"actor/{name}/env_steps": float(progress.env_steps),
        f"actor/{name}/env_steps_per_s": env_steps_per_s(progress.marks),
        f"actor/{name}/weights_version": float(progress.weights_version),
        f"actor/{name}/last_heard_s": now - progress.last_heard,
    }


class ActorRoster:
    """When each actor, ``(is_eval, actor id)``, was last heard from (a chunk or a report), what
    it sent, and each training actor's ``StepBalance``. ``carried``: the env steps an actor may
    hold uncut (``algo.carried_steps``); ``report_slack``: the env steps a report may count that
    no chunk carried yet."""

    def __init__(self, carried: int = 0, report_slack: int = 0) -> None:
        self.carried, self.report_slack = carried, report_slack
        self.last_seen: dict[tuple[bool, int], float] = {}  # time.monotonic()
        self.progress: dict[tuple[bool, int], ActorProgress] = {}
        self.balances: dict[int, StepBalance] = {}  # training actors, by id
        self.reported: set[int] = set()  # training actors whose reports this server heard

    def check_chunk(self, chunk: TrajectoryChunk, accounted: int) -> StepBalance:
        """The actor's balance with ``chunk`` (whose items account for ``accounted`` env steps);
        raises ``ValueError`` when its claim does not fit its items (``check_steps_claimed``)."""
        balance = self.balances.get(chunk.actor_id)
        return check_steps_claimed(
            balance,
            chunk.incarnation,
            chunk.claimed_steps,
            accounted,
            self.carried,
            chunk.env_steps,
        )

    def add_chunk(self, chunk: TrajectoryChunk, balance: StepBalance) -> None:
        """Count a chunk that ``check_chunk`` passed (with the balance it gave)."""
        self.balances[chunk.actor_id] = balance
        self.last_seen[(False, chunk.actor_id)] = time.monotonic()
        progress = self.progress.setdefault((False, chunk.actor_id), ActorProgress())
        progress.env_steps += chunk.env_steps
        progress.weights_version = chunk.weights_version
        progress.last_heard = time.monotonic()
        progress.marks.append((progress.last_heard, progress.env_steps))

    def check_report(self, report: ActorReport) -> None:
        """Raise ``ValueError`` unless a training actor's report counts env steps its chunks
        carried since its previous report (give or take ``report_slack``); its first report to
        this server is not held to it."""
        if report.is_eval or report.actor_id not in self.reported:
            return
        balance = self.balances.get(report.actor_id)
        unreported = 0
        if balance is not None and balance.incarnation == report.incarnation:
            unreported = balance.unreported
        if report.env_steps > unreported + self.report_slack:
            raise ValueError(
                f"actor {report.actor_id} reports {report.env_steps} env steps, but its chunks "
                f"carried {unreported} since its last report (and at most {self.report_slack} "
                "can be on their way)"
            )

    def add_report(self, report: ActorReport) -> None:
        now = time.monotonic()
        key = (report.is_eval, report.actor_id)
        self.last_seen[key] = now
        progress = self.progress.setdefault(key, ActorProgress())
        if report.is_eval:  # a training actor's env steps are its chunks' (``add_chunk``)
            progress.env_steps += report.env_steps
            progress.marks.append((now, progress.env_steps))
        else:
            self.reported.add(report.actor_id)
            balance = self.balances.get(report.actor_id)
            if balance is not None:
                balance.unreported = max(0, balance.unreported - report.env_steps)
        progress.weights_version = report.weights_version
        progress.last_heard = now

    def num_active(self, now: float) -> int:
        """Actors heard from in the last ``ACTIVE_S`` seconds."""
        return sum(1 for seen in self.last_seen.values() if now - seen < ACTIVE_S)

    def stats(self) -> dict[str, float]:
        """Each actor's entries (``actor/<name>/...``)."""
        now = time.monotonic()
        values: dict[str, float] = {}
        for (is_eval, actor_id), progress in self.progress.items():
            values.update(actor_stats(actor_name(is_eval, actor_id), progress, now))
        return values

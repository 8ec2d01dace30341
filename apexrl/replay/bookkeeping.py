"""The run's bookkeeping, kept by the replay server, where actors' reports meet.

The run's total of training env steps (counted from inserted chunks, so it describes the data in
the table; a resumed run's ``RestoreCounters`` is its floor), its episodes, the recent training
and evaluation returns with the weights version of each evaluation episode, the evaluation
rounds, and the custom metrics of the run's callbacks (``apexrl.callbacks``) that training actors
report. The replay server serves them in ``Stats`` to the learner, which decides when the run is
done, and to every role, which writes its TensorBoard scalars at this count of env steps: one
x-axis for the whole run.

Custom metrics are served as ``custom/<name>``: the mean of the last ``CUSTOM_METRIC_WINDOW``
interval means reported under that name. Each training actor may bring at most
``MAX_CUSTOM_METRICS`` names of its own (names another actor brought first are shared); a report
that would take it over is refused, so one actor cannot crowd out the others' metrics.

``published_version`` is the newest weights version a learner said it publishes
(``PublishedVersion``; ``replay/versions.py``), kept in snapshots with the counters.

``export`` and ``restore`` are this part of a replay snapshot (``replay/snapshot_state.py``).
"""

from __future__ import annotations

import collections
import logging

import numpy as np

from apexrl.callbacks import CUSTOM_METRIC_WINDOW, CUSTOM_PREFIX
from apexrl.replay.admission import MAX_ABS_RETURN, MAX_RUN_ENV_STEPS
from apexrl.replay.snapshot import SnapshotError
from apexrl.transport.messages import MAX_CUSTOM_METRICS, ActorReport

log = logging.getLogger(__name__)

TRAIN_RETURN_WINDOW = 100  # training episodes in replay/train_return_mean
MAX_RETURN_GROUP_NAMES = 256  # multi-agent return groups (team, policies, agents) a run keeps
COUNTERS = ("env_steps", "eval_env_steps", "train_episodes", "eval_episodes")  # snapshotted


class RunBookkeeping:
    """The run's counts, return windows and custom metrics; ``eval_window`` is
    ``run.stop_eval_episodes``, the evaluation episodes the stop condition judges."""

    def __init__(self, eval_window: int) -> None:
        self.env_steps = 0  # the run's training env steps (resumed runs: from the checkpoint on)
        self.eval_env_steps = 0
        self.train_episodes = 0
        self.eval_episodes = 0
        self.train_returns: collections.deque[float] = collections.deque(maxlen=TRAIN_RETURN_WINDOW)
        self.eval_returns: collections.deque[float] = collections.deque(maxlen=eval_window)
        # The weights version each of those episodes was played with (-1: unknown, restored).
        self.eval_versions: collections.deque[int] = collections.deque(maxlen=eval_window)
        self.eval_rounds = 0  # evaluation reports with episodes in them
        # Training actors' custom metrics: name -> the last interval means reported
        self.custom_metrics: dict[str, collections.deque[float]] = {}
        self.custom_names_by_actor: dict[int, set[str]] = {}  # the names each actor brought
        self.published_version = 0  # the newest a learner announced (0: its initial weights)
        # Multi-agent runs: every agent's decisions, and the recent returns of each group (team,
        # policy/<name>, agent/<name>, ...) by (is_eval, group); not snapshotted
        self.agent_steps = 0
        self.eval_window = eval_window
        self.group_returns: dict[tuple[bool, str], collections.deque[float]] = {}

    def note_published(self, version: int) -> None:
        """A learner publishes ``version`` (a restarted learner may go back to an older one:
        the newest stays)."""
        self.published_version = max(self.published_version, version)

    def check_custom_names(self, report: ActorReport) -> None:
        """Raise ``ValueError`` when ``report`` would take its actor over ``MAX_CUSTOM_METRICS``
        names of its own."""
        new = [name for name in report.custom_metrics if name not in self.custom_metrics]
        if not new:
            return
        brought = self.custom_names_by_actor.get(report.actor_id, set())
        if len(brought) + len(new) > MAX_CUSTOM_METRICS:
            raise ValueError(
                f"actor {report.actor_id} would bring {len(brought) + len(new)} custom metric "
                f"names, over the {MAX_CUSTOM_METRICS} one actor may ({new[0]!r}, ...)"
            )

    def resume_at(self, env_steps: int) -> None:
        """A resumed run's env steps (``RestoreCounters``) become the floor of the count."""
        if env_steps > self.env_steps:
            log.info("the run resumes at %d env steps", env_steps)
        self.env_steps = max(self.env_steps, env_steps)

    def check_groups(self, report: ActorReport) -> None:
        """Raise ``ValueError`` when ``report`` would take the run over
        ``MAX_RETURN_GROUP_NAMES`` return groups."""
        new = {(report.is_eval, name) for name in report.group_returns} - set(self.group_returns)
        if len(self.group_returns) + len(new) > MAX_RETURN_GROUP_NAMES:
            raise ValueError(
                f"the report would take the run over {MAX_RETURN_GROUP_NAMES} return groups"
            )

    def add_report(self, report: ActorReport) -> None:
        """Count an actor's episodes (and evaluation env steps) and keep its custom metrics."""
        if not report.is_eval:
            self.agent_steps += report.agent_steps
        for name, group in report.group_returns.items():
            window = self.group_returns.get((report.is_eval, name))
            if window is None:
                size = self.eval_window if report.is_eval else TRAIN_RETURN_WINDOW
                window = self.group_returns[(report.is_eval, name)] = collections.deque(maxlen=size)
            window.extend(group.tolist())
        returns = report.episode_returns.tolist()
        if report.is_eval:
            self.eval_env_steps += report.env_steps
            self.eval_episodes += len(returns)
            self.eval_returns.extend(returns)
            self.eval_versions.extend([report.weights_version] * len(returns))
            self.eval_rounds += bool(returns)
        else:
            self.train_episodes += len(returns)
            self.train_returns.extend(returns)
            self._add_custom_metrics(report.actor_id, report.custom_metrics)

    def _add_custom_metrics(self, actor_id: int, values: dict[str, float]) -> None:
        """Keep the values of a report that ``check_custom_names`` passed."""
        for name, value in values.items():
            window = self.custom_metrics.get(name)
            if window is None:
                self.custom_names_by_actor.setdefault(actor_id, set()).add(name)
                window = self.custom_metrics[name] = collections.deque(maxlen=CUSTOM_METRIC_WINDOW)
            window.append(value)

    def forget_eval_returns(self) -> None:
        """A resumed run's stop condition judges this session's evaluation episodes only."""
        self.eval_returns.clear()
        self.eval_versions.clear()

    def train_stats(self) -> dict[str, float]:
        """The ``replay/...`` entries of the run's training side."""
        return {
            "replay/env_steps": float(self.env_steps),
            "replay/train_episodes": float(self.train_episodes),
            "replay/train_return_mean": _mean(self.train_returns),
        }

    def eval_stats(self) -> dict[str, float]:
        """The ``eval/...`` entries."""
        return {
            "eval/episodes": float(self.eval_episodes),
            "eval/env_steps": float(self.eval_env_steps),
            "eval/return_mean": _mean(self.eval_returns),
            "eval/episodes_in_window": float(len(self.eval_returns)),
            "eval/version": float(_single_version(self.eval_versions)),
            "eval/rounds": float(self.eval_rounds),
        }

    def group_stats(self) -> dict[str, float]:
        """A multi-agent run's ``replay/agent_steps`` and the mean return of each group,
        ``replay/return_mean/<group>`` (training) and ``eval/return_mean/<group>``; nothing for a
        single-agent run."""
        if not self.group_returns and not self.agent_steps:
            return {}
        values = {"replay/agent_steps": float(self.agent_steps)}
        for (is_eval, name), window in sorted(self.group_returns.items()):
            values[f"{'eval' if is_eval else 'replay'}/return_mean/{name}"] = _mean(window)
        return values

    def custom_stats(self) -> dict[str, float]:
        """The ``custom/<name>`` entries."""
        return {CUSTOM_PREFIX + name: _mean(window) for name, window in self.custom_metrics.items()}

    def export(self) -> tuple[dict[str, int], dict[str, list]]:
        """This part of a snapshot: its counters and its return windows (JSON values)."""
        counters = {name: getattr(self, name) for name in COUNTERS}
        counters["eval_rounds"] = self.eval_rounds
        counters["published_version"] = self.published_version
        windows = {
            "train_returns": list(self.train_returns),
            "eval_returns": list(self.eval_returns),
            "eval_versions": list(self.eval_versions),
        }
        return counters, windows

    def restore(self, counters: dict, windows: dict) -> None:
        """Go on from what ``export`` gave (``windows``: the snapshot's meta, where they are
        kept). Raises ``SnapshotError`` (or the ``KeyError``, ``TypeError`` or ``ValueError`` of
        a malformed value), changing nothing, unless every value is one a server could have
        counted."""
        for name in COUNTERS:
            value = counters[name]
            if isinstance(value, bool) or not isinstance(value, int):
                raise SnapshotError(f"counter {name} is {value!r}, not an int")
            if not 0 <= value <= MAX_RUN_ENV_STEPS:
                raise SnapshotError(f"counter {name} {value} is outside 0..{MAX_RUN_ENV_STEPS}")
        returns = {}
        for name in ("train_returns", "eval_returns"):
            values = np.asarray(windows[name], dtype=np.float64)
            if values.ndim != 1 or not np.all(np.abs(values) <= MAX_ABS_RETURN):
                raise SnapshotError(f"{name} must be a list of returns within +-{MAX_ABS_RETURN:g}")
            returns[name] = values.tolist()
        # The weights version of each evaluation return (snapshots before they were kept: -1).
        eval_versions = windows.get("eval_versions", [-1] * len(returns["eval_returns"]))
        versions = np.asarray(eval_versions, dtype=np.int64)
        if versions.shape != (len(returns["eval_returns"]),) or versions.min(initial=0) < -1:
            raise SnapshotError("eval_versions must be one version >= -1 per evaluation return")
        eval_rounds = counters.get("eval_rounds", 0)
        if isinstance(eval_rounds, bool) or not isinstance(eval_rounds, int) or eval_rounds < 0:
            raise SnapshotError(f"counter eval_rounds is {eval_rounds!r}, not an int >= 0")
        published = counters.get("published_version", -1)
        if isinstance(published, bool) or not isinstance(published, int):
            raise SnapshotError(f"counter published_version is {published!r}, not an int")
        if not -1 <= published <= MAX_RUN_ENV_STEPS:
            raise SnapshotError(f"counter published_version {published} is outside -1..2**50")
        for name in COUNTERS:
            setattr(self, name, counters[name])
        self.published_version = published
        for window, values in (
            (self.train_returns, returns["train_returns"]),
            (self.eval_returns, returns["eval_returns"]),
            (self.eval_versions, versions.tolist()),
        ):
            window.clear()
            window.extend(values)
        self.eval_rounds = eval_rounds


def _mean(values: collections.deque[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def _single_version(versions: collections.deque[int]) -> int:
    """The weights version every episode of the window was played with; -1 when they differ,
    are unknown or there are none."""
    if not versions or versions[0] < 0 or versions.count(versions[0]) != len(versions):
        return -1
    return versions[0]

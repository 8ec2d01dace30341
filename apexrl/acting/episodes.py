"""A training actor's episodes: the returns and lengths of those that ended, the custom metrics of
the run's callbacks, and the env steps, counted per interval of ``actor.report_interval_s``.

Each interval ends with an ``ActorReport`` to replay (``EpisodeMetrics.report_if_due``); its
TensorBoard scalars (``actor/episode_return``, ``actor/env_steps_per_s``, ``actor/custom/<name>``,
...) are written at the run's env steps that replay answers with (``write_pending``), the x-axis
every role shares. The evaluation actor reports whole rounds instead (``apexrl.evaluation``).
"""

from __future__ import annotations

import time

import numpy as np

from apexrl.callbacks import EpisodeCallbacks
from apexrl.clients.params import ParamsClient
from apexrl.clients.replay import ReplayClient
from apexrl.envs import VectorStep
from apexrl.runtime.metrics import MetricsWriter, RateMeter, early_interval
from apexrl.transport.messages import ActorReport


class EpisodeMetrics:
    """Finished episodes and throughput since the last report: sent to replay as an
    ``ActorReport`` and written to TensorBoard at the run's env steps that replay answers with."""

    def __init__(
        self,
        writer: MetricsWriter,
        num_envs: int,
        actor_id: int,
        incarnation: int,
        evaluate: bool,
        report_interval_s: float,
        callbacks: EpisodeCallbacks | None = None,
    ) -> None:
        self.writer, self.prefix = writer, "eval" if evaluate else "actor"
        self.callbacks = callbacks
        self.actor_id, self.incarnation, self.evaluate = actor_id, incarnation, evaluate
        self.report_interval_s = report_interval_s
        self.started = self.last_report = time.monotonic()
        self.wait_at_report = 0.0  # the replay client's wait_s at the last report
        self.episode_return = np.zeros(num_envs)
        self.episode_length = np.zeros(num_envs, dtype=np.int64)
        self.finished_returns: list[float] = []
        self.finished_lengths: list[int] = []
        self.env_steps = 0  # this actor's own, in this process
        self.steps_since_report = 0
        self.steps_meter = RateMeter()
        self.pending: dict[str, float] = {}  # scalars waiting for the run's env steps
        self.last_run_env_steps = 0

    def add_step(
        self, reward: np.ndarray, ended: np.ndarray, action: np.ndarray, step: VectorStep
    ) -> None:
        num_envs = len(reward)
        self.episode_return += reward
        self.episode_length += 1
        if self.callbacks is not None:
            self.callbacks.step(action, step, ended, self.episode_return, self.episode_length)
        if ended.any():
            self.finished_returns += self.episode_return[ended].tolist()
            self.finished_lengths += self.episode_length[ended].tolist()
            self.episode_return[ended], self.episode_length[ended] = 0.0, 0
        self.env_steps += num_envs
        self.steps_since_report += num_envs
        self.steps_meter.add(num_envs)

    def count_steps(self, num_steps: int) -> None:
        """Env steps stepped elsewhere (a policy server's external episodes)."""
        self.env_steps += num_steps
        self.steps_since_report += num_steps
        self.steps_meter.add(num_steps)

    def add_episode(self, episode_return: float, length: int) -> None:
        """An episode that ended elsewhere (a policy server's external episodes)."""
        self.finished_returns.append(float(episode_return))
        self.finished_lengths.append(int(length))

    def report_if_due(self, replay: ReplayClient, params: ParamsClient) -> None:
        """Every ``report_interval_s`` (more often in the actor's first minute:
        ``metrics.early_interval``): send the interval's report; its scalars are written once
        replay says at which run env steps (``write_pending``), or at the next report if it does
        not answer."""
        now = time.monotonic()
        interval = now - self.last_report
        if interval < early_interval(self.report_interval_s, now - self.started):
            return
        self.write_pending(self.last_run_env_steps)
        custom = {}
        if self.callbacks is not None:
            custom = self.callbacks.metrics.means()
            self.callbacks.metrics.clear()
        replay.report(
            ActorReport(
                self.actor_id,
                self.incarnation,
                self.evaluate,
                self.steps_since_report,
                params.version,
                np.asarray(self.finished_returns, dtype=np.float64),
                np.asarray(self.finished_lengths, dtype=np.int64),
                custom,
            )
        )
        p = self.prefix
        extra = {
            f"{p}/weights_version_lag": params.version_lag,
            f"{p}/weights_version": params.version,
            f"{p}/rejected_weights": params.num_rejected,
            f"{p}/insert_wait_fraction": (replay.wait_s - self.wait_at_report) / interval,
            f"{p}/replay_silent_s": replay.link.peer.silent_s(),
        }
        self.last_report, self.wait_at_report = now, replay.wait_s
        if self.finished_returns:  # the mean over the interval: one write, not one per episode
            self.pending[f"{p}/episode_return"] = float(np.mean(self.finished_returns))
            self.pending[f"{p}/episode_length"] = float(np.mean(self.finished_lengths))
        self.pending[f"{p}/env_steps_per_s"] = self.steps_meter.rate()
        self.pending[f"{p}/env_steps"] = float(self.env_steps)
        self.pending.update(extra)
        self.pending.update({f"{p}/custom/{name}": value for name, value in custom.items()})
        self.finished_returns.clear()
        self.finished_lengths.clear()
        self.steps_since_report = 0

    def write_pending(self, run_env_steps: int | None) -> None:
        if self.pending and run_env_steps is not None:
            self.writer.scalars(self.pending, run_env_steps)
            self.pending = {}
            self.last_run_env_steps = run_env_steps

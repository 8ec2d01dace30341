"""The learner's reports: TensorBoard scalars, ``result.json`` lines and the console progress line,
written every ``learner.report_interval_s`` from replay's ``Stats`` and the learner's own counters,
and the stop decision (``run.stop_*``) they carry. A new evaluation round is judged at once
(``Reporter.judge``) and reported at once only when it ends the run.

Every scalar is written at the run's env steps (``replay/env_steps``), the x-axis every role
shares. Rank 0 writes ``result.json`` and the console line; other ranks write their scalars.

Replay's item accounting (``replay/items_*``, ``apexrl/replay/accounting.py``) goes into each
record as ``replay_items`` (``{"received": ..., "stored": ..., "lost": ...}``), with the items the
learner dropped as stale next to it (``stale_dropped``, PPO's ``stale_items_dropped``: part of
replay's ``consumed``).

A multi-agent run's records also hold its agent steps and the mean return of each group (team,
policy, agent: ``apexrl.multiagent.returns``), in training and in evaluation (``group_record``).

Custom metrics (``apexrl.callbacks``): each record's ``custom_metrics`` object holds replay's
``custom/<name>`` entries (the actors' callbacks), then what the run's ``on_train_result`` returns
for the record; each one is also a TensorBoard scalar ``custom/<name>``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from apexrl.callbacks import CUSTOM_PREFIX, TrainResultCallback, custom_stats
from apexrl.config import Config, RunConfig
from apexrl.envs.atari import frames_per_step
from apexrl.runtime import rundir
from apexrl.runtime.metrics import MetricsWriter, RateMeter, append_result, early_interval
from apexrl.tracking import TrackerFeed

log = logging.getLogger("apexrl.learner")  # the learner's log lines, whichever part writes them

# Learner metrics that also go to result.json when the algorithm reports them: how old the data
# trained on was (IMPALA, PPO), PPO's dropped stale unrolls and rollouts cut short by a timeout;
# the learner's batches and gradient steps skipped for NaN or infinite values.
ITEMS_PREFIX = "replay/items_"  # replay's item accounting in its Stats
ALGORITHM_RESULT_METRICS = (
    "policy_lag",
    "stale_items_dropped",
    "incomplete_rollouts",
    "skipped_batches",
    "skipped_updates",
)


def stop_reason(
    run: RunConfig,
    env_steps: int,
    elapsed_s: float,
    eval_return_mean: float,
    eval_episodes_in_window: int,
    eval_version: int = -1,
    agent_steps: int = 0,
) -> str | None:
    """Why the run should stop now, or None. The evaluation condition needs a full window played
    by one weights version (``eval_version`` >= 0); ``agent_steps``: a multi-agent run's."""
    threshold = run.stop_eval_return
    full = eval_episodes_in_window >= run.stop_eval_episodes and eval_version >= 0
    if threshold is not None and full and eval_return_mean >= threshold:
        return (
            f"mean evaluation return {eval_return_mean:.1f} of weights version {eval_version} "
            f"over {eval_episodes_in_window} episodes >= {threshold:g}"
        )
    if run.stop_env_steps > 0 and env_steps >= run.stop_env_steps:
        return f"{env_steps} env steps >= {run.stop_env_steps}"
    if run.stop_agent_steps > 0 and agent_steps >= run.stop_agent_steps:
        return f"{agent_steps} agent steps >= {run.stop_agent_steps}"
    if run.stop_wall_s > 0 and elapsed_s >= run.stop_wall_s:
        return f"{elapsed_s:.0f} s >= {run.stop_wall_s:g} s"
    return None


def eval_window(stats: dict[str, float]) -> tuple[float, int, int]:
    """Replay's evaluation window in its ``stats``: mean return, episodes, weights version (-1
    while the window mixes versions)."""
    return (
        stats.get("eval/return_mean", math.nan),
        int(stats.get("eval/episodes_in_window", 0)),
        int(stats.get("eval/version", -1)),
    )


def eval_condition_version(run: RunConfig, stats: dict[str, float]) -> int | None:
    """The weights version whose evaluation round meets ``run.stop_eval_return`` in replay's
    ``stats``; None when none does."""
    reason = stop_reason(run, 0, 0.0, *eval_window(stats))
    return int(stats.get("eval/version", -1)) if reason is not None else None


class Reporter:
    """Turns replay's ``Stats`` and the learner's counters into TensorBoard scalars, a
    ``result.json`` line and a console line; decides whether the run is over. Scalars are written
    at the run's env steps, the x-axis every role shares."""

    def __init__(
        self,
        cfg: Config,
        writer: MetricsWriter,
        elapsed_s: float,
        env_steps: int,
        on_train_result: TrainResultCallback | None = None,
    ) -> None:
        self.cfg, self.writer = cfg, writer
        self.on_train_result = on_train_result
        self.started = time.monotonic() - elapsed_s  # learner time counts across sessions
        self.last_report = time.monotonic()
        self.last_console = -math.inf  # when the last console line was written
        self.updates = RateMeter()
        self.samples = RateMeter()  # items this rank trained on
        self.total_samples = RateMeter()  # items all ranks trained on (equal to samples alone)
        self.wait_s = self.wait_at_report = 0.0
        self.prev_env_steps = env_steps  # at the previous report (first: at this session's start)
        self.metrics: dict[str, float] = {}  # the latest update's loss, q_mean, ...
        self.frames_per_step = frames_per_step(cfg.env)
        self.env_task: Callable[[], object] = lambda: None  # the env task in force; None: none
        self.tracking: TrackerFeed | None = None  # the run's trackers besides TensorBoard

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def due(self) -> bool:
        """Whether a report is due: every ``learner.report_interval_s``, more often in a run's
        first minute (``metrics.early_interval``), so that a run solved in seconds leaves a
        curve in result.json, its plots and its trackers."""
        interval = early_interval(self.cfg.learner.report_interval_s, self.elapsed_s)
        return time.monotonic() - self.last_report >= interval

    def judge(self, stats: dict[str, float]) -> str | None:
        """The stop reason replay's ``stats`` give now, or None; writes nothing."""
        env_steps = int(stats.get("replay/env_steps", 0))
        agent_steps = int(stats.get("replay/agent_steps", 0))
        return stop_reason(
            self.cfg.run, env_steps, self.elapsed_s, *eval_window(stats), agent_steps=agent_steps
        )

    def report_rank(self, num_updates: int, env_steps: int) -> None:
        """TensorBoard scalars of a rank other than 0 (which alone writes result.json)."""
        now = time.monotonic()
        interval, self.last_report = now - self.last_report, now
        self.writer.scalars(self._scalars(interval, num_updates), step=env_steps)

    def _scalars(self, interval: float, num_updates: int) -> dict[str, float]:
        values = {
            "learner/updates": float(num_updates),
            "learner/updates_per_s": self.updates.rate(),
            "learner/samples_per_s": self.samples.rate(),
            "learner/total_samples_per_s": self.total_samples.rate(),
            "learner/data_wait_fraction": (self.wait_s - self.wait_at_report) / interval,
            **self.metrics,
        }
        self.wait_at_report = self.wait_s
        return values

    def report(self, stats: dict[str, float], num_updates: int, num_samples: int) -> str | None:
        """Write one report; returns the stop reason when the run is over."""
        now = time.monotonic()
        interval, self.last_report = now - self.last_report, now
        env_steps = int(stats.get("replay/env_steps", 0))
        env_rate = (env_steps - self.prev_env_steps) / max(interval, 1e-9)
        self.prev_env_steps = env_steps
        eval_mean, eval_episodes, eval_version = eval_window(stats)
        reason = self.judge(stats)
        values = self._scalars(interval, num_updates)
        self.writer.scalars(values, step=env_steps)
        record = {
            "time_s": round(self.elapsed_s, 2),
            "env_steps": env_steps,
            "frames": env_steps * self.frames_per_step,  # emulator frames (Atari: frame skip)
            "learner_updates": num_updates,
            "learner_samples": num_samples,
            "episode_return_mean": _finite(stats.get("replay/train_return_mean")),
            "eval_return_mean": _finite(eval_mean),
            "eval_episodes_in_window": eval_episodes,
            "eval_weights_version": eval_version,
            "env_steps_per_s": round(env_rate, 1),
            "updates_per_s": round(values["learner/updates_per_s"], 2),
            "samples_per_s": round(values["learner/total_samples_per_s"], 1),
            "data_wait_fraction": round(values["learner/data_wait_fraction"], 3),
            "replay_size": int(stats.get("replay/size", 0)),
            "done": reason is not None,
            "env_task": self.env_task(),  # the task the actors were sent (Trainer.set_env_task)
        }
        for name in ALGORITHM_RESULT_METRICS:  # what an algorithm reports, where it does
            if f"learner/{name}" in values:
                record[name] = round(values[f"learner/{name}"], 2)
        record["replay_items"] = replay_items(stats, values)
        record.update(group_record(stats))
        record.update(league_record(stats))
        custom = {
            name: value for name, value in custom_stats(stats).items() if math.isfinite(value)
        }
        record["custom_metrics"] = custom
        if self.on_train_result is not None:
            custom.update(self.on_train_result(record))
        if custom:
            self.writer.scalars({CUSTOM_PREFIX + k: v for k, v in custom.items()}, step=env_steps)
        append_result(rundir.result_path(self.cfg.run_dir), record)
        if self.tracking is not None:
            self.tracking.record(record)
        if now - self.last_console < self.cfg.learner.report_interval_s and reason is None:
            return reason  # the console line keeps its interval; early records are denser
        self.last_console = now
        log.info(
            "%6.0fs | env steps %9d (%6.0f/s) | updates %7d (%5.1f/s) | replay %8d items | "
            "return %6.1f | eval %6.1f (%d ep)",
            self.elapsed_s,
            env_steps,
            env_rate,
            num_updates,
            values["learner/updates_per_s"],
            record["replay_size"],
            stats.get("replay/train_return_mean", math.nan),
            eval_mean,
            eval_episodes,
        )
        return reason


def league_record(stats: dict[str, float]) -> dict[str, object]:
    """A league's part of a record (the parameter server's ``league/*`` stats): its games, pool,
    the latest's win rate against the pool, every player's Elo rating (``latest``,
    ``v<version>``) and each snapshot's payoff against the latest (wins, draws, losses of the
    latest); nothing without a league."""
    if "league/games" not in stats:
        return {}
    league: dict[str, object] = {
        name: int(stats[f"league/{name}"])
        for name in ("games", "self_play_games", "pool_size", "refused_results")
    }
    if "league/win_rate_vs_pool" in stats:
        league["win_rate_vs_pool"] = round(stats["league/win_rate_vs_pool"], 3)
    league["elo"] = {
        name[len("league/elo/") :]: round(value, 1)
        for name, value in stats.items()
        if name.startswith("league/elo/")
    }
    payoffs: dict[str, list[int]] = {}
    for name, value in stats.items():
        if name.startswith("league/payoff/"):
            player, _, outcome = name[len("league/payoff/") :].partition("/")
            counts = payoffs.setdefault(player, [0, 0, 0])
            counts[("wins", "draws", "losses").index(outcome)] = int(value)
    league["payoffs"] = payoffs
    return {"league": league}


def group_record(stats: dict[str, float]) -> dict[str, object]:
    """A multi-agent run's part of a record: its agent steps and each return group's mean,
    training (``returns``) and evaluation (``eval_returns``): ``{"team": ..., "policy/<name>":
    ..., "agent/<name>": ...}``; nothing for a single-agent run."""
    if "replay/agent_steps" not in stats:
        return {}
    record: dict[str, object] = {"agent_steps": int(stats["replay/agent_steps"])}
    for key, prefix in (("returns", "replay/return_mean/"), ("eval_returns", "eval/return_mean/")):
        record[key] = {
            name[len(prefix) :]: round(value, 3)
            for name, value in stats.items()
            if name.startswith(prefix) and math.isfinite(value)
        }
    return record


def replay_items(stats: dict[str, float], learner_values: dict[str, float]) -> dict[str, int]:
    """Replay's item counts (``replay/items_<name>`` -> ``<name>``) and the items the learner
    dropped as stale (``stale_dropped``; 0 for an algorithm that drops none)."""
    items = {
        name[len(ITEMS_PREFIX) :]: int(value)
        for name, value in stats.items()
        if name.startswith(ITEMS_PREFIX) and math.isfinite(value)
    }
    items["stale_dropped"] = int(learner_values.get("learner/stale_items_dropped", 0))
    return items


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 2)

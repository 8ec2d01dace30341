"""The watch over a sweep's trials: start them as slots free up, read their records, stop each at
its condition or when the pruner says so, and show the live table (``Sweep``).

``apexrl.sweep.runner.run_sweep`` makes a ``Sweep`` and calls ``step`` until it returns False;
``close`` stops whatever still runs and writes the sweep's end (final table, ``trials.json``,
``curves.png``).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, TextIO

from apexrl.launch.run_state import log_tail
from apexrl.sweep import report
from apexrl.sweep.space import config_overrides, draw_values, trial_points
from apexrl.sweep.spec import STOP_CONFIG_KEYS, SweepSpec
from apexrl.sweep.trials import (
    ERROR,
    PENDING,
    PRUNED,
    RUNNING,
    SELF_STOP_GRACE_S,
    STOPPED,
    TERMINATED,
    Trial,
    finite,
    met_conditions,
    read_new,
    reap,
    request_stop,
    start,
    stop_all,
    trial_command,
)
from apexrl.tools.status import fmt_age

log = logging.getLogger(__name__)

EVENTS_SHOWN = 6  # the latest events under the live table


class Sweep:
    """A sweep's trials, its slots, its Optuna study and what it has shown."""

    def __init__(
        self,
        spec: SweepSpec,
        sweep_dir: Path,
        overrides: list[str],
        slots: Any,
        study: Any,
        out: TextIO,
    ) -> None:
        self.spec, self.sweep_dir, self.overrides = spec, sweep_dir, overrides
        self.slots, self.study, self.out = slots, study, out
        self.keys = [k for k, p in spec.params.items() if p.kind != "value"]
        points = trial_points(spec.params, spec.num_samples)
        self.trials = [
            Trial(i, point, sweep_dir / f"trial_{i:03d}", sweep_dir / "logs" / f"trial_{i:03d}.log")
            for i, point in enumerate(points)
        ]
        self.events: list[str] = []
        self.started = time.monotonic()
        self.shown_at: float | None = None
        self.reported: dict[int, int] = {}  # trial index -> last env steps told to the pruner
        self.met_at: dict[int, float] = {}  # trial index -> when a stop condition showed
        self.redraw = out.isatty()

    # -- one look at the trials -------------------------------------------------------------------

    def step(self) -> bool:
        """Look at every trial once; whether any is still pending or running."""
        now = time.monotonic()
        for trial in self.trials:
            if trial.state == RUNNING and trial.process is not None:
                self.watch(trial, now)
            if trial.process is not None and trial.ended is None and reap(trial):
                self.finish(trial)
        self.start_pending()
        if self.shown_at is None or now - self.shown_at >= self.spec.report_interval_s:
            self.show(now)
        return any(t.state == PENDING or t.ended is None and t.process for t in self.trials)

    def start_pending(self) -> None:
        for trial in self.trials:
            if trial.state != PENDING:
                continue
            slot = self.slots.take(trial)
            if slot is None:
                return
            trial.optuna_trial = self.study.ask()
            draw_values(trial.optuna_trial, self.spec.params, trial.values)
            command = trial_command(
                self.spec.config,
                [*self.overrides, *config_overrides(trial.values)],
                trial.run_dir,
                self.spec.actors,
                self.spec.learners,
                self.spec.evaluation,
            )
            gpus = self.slots.gpus[slot] if self.slots.gpus else ()
            start(trial, command, self.slots.cpus[slot], gpus)
            cpus = ",".join(map(str, self.slots.cpus[slot]))
            self.event(f"{trial.name} started on CPUs {cpus}: {self.describe(trial)}")

    def watch(self, trial: Trial, now: float) -> None:
        """Read the trial's new records; stop it when a condition is met or it is pruned."""
        for record in read_new(trial):
            met = met_conditions(record, self.spec.stop)
            if not met:  # a trial at its stop condition is complete, whatever the pruner says
                self.prune(trial, record)
            if met and trial.index not in self.met_at and trial.state == RUNNING:
                self.met_at[trial.index] = now
                trial.reason = ", ".join(
                    f"{k} {finite(record[k]):g} >= {self.spec.stop[k]:g}" for k in met
                )
                if not all(k in STOP_CONFIG_KEYS for k in met):  # one the learner does not judge
                    request_stop(trial, TERMINATED, trial.reason)
        met_at = self.met_at.get(trial.index)
        if trial.state == RUNNING and met_at is not None and now - met_at > SELF_STOP_GRACE_S:
            request_stop(trial, TERMINATED, trial.reason)  # the learner did not stop by itself
        timeout = self.spec.trial_timeout_s
        if trial.state == RUNNING and timeout and (trial.elapsed_s(now) or 0.0) > timeout:
            request_stop(trial, TERMINATED, f"trial_timeout_s {timeout:g} s")

    def prune(self, trial: Trial, record: dict[str, Any]) -> None:
        """Report the record's metric at its env steps; stop the trial if the pruner says so."""
        if self.spec.scheduler.kind == "none" or trial.state != RUNNING:
            return
        value, steps = finite(record.get(self.spec.metric)), finite(record.get("env_steps"))
        if value is None or steps is None or int(steps) <= self.reported.get(trial.index, -1):
            return
        self.reported[trial.index] = int(steps)
        trial.optuna_trial.report(value, int(steps))
        if trial.optuna_trial.should_prune():
            reason = f"pruned at {int(steps):,} env steps ({self.spec.metric} {value:.4g})"
            request_stop(trial, PRUNED, reason)

    def finish(self, trial: Trial) -> None:
        """A trial's process has ended: its final state, its slot back, the study told."""
        read_new(trial)  # what the learner wrote as it stopped
        if trial.state == RUNNING:
            if trial.exit_code == 0:
                trial.state = TERMINATED
                done = trial.last.get("done") is True
                trial.reason = trial.reason or ("its run met its stop condition" if done else "")
            else:
                trial.state = ERROR
                trial.reason = f"its launcher exited with {trial.exit_code}; see {trial.log_path}"
        self.slots.release(trial)
        tell(self.study, trial, self.spec.metric)
        value = trial.metric(self.spec.metric)
        shown = f"; {self.spec.metric} {value:.4g}" if value is not None else ""
        self.event(
            f"{trial.name} {trial.state}{': ' + trial.reason if trial.reason else ''}{shown}"
        )

    # -- what it shows ----------------------------------------------------------------------------

    def describe(self, trial: Trial) -> str:
        return ", ".join(f"{k}={report.fmt_value(v)}" for k, v in trial.values.items()) or "-"

    def event(self, text: str) -> None:
        self.events.append(f"{time.strftime('%H:%M:%S')} {text}")
        log.debug("%s", text)

    def title(self, now: float, finished: bool = False) -> list[str]:
        spec = self.spec
        cpus = len(self.slots.cpus[0]) if self.slots.cpus else 0
        stops = ", ".join(f"{k} >= {v:g}" for k, v in spec.stop.items()) or "the config's own"
        head = "Sweep finished" if finished else "Sweep"
        return [
            f"== {head} · {self.sweep_dir} · {time.strftime('%H:%M:%S')} ==",
            f"{len(self.trials)} trials: {report.state_counts(self.trials)}"
            f" · {fmt_age(now - self.started)} elapsed"
            f" · {len(self.slots.holders)} at a time, {cpus} CPU(s) each"
            f" · stop: {stops} · metric {spec.metric} ({spec.mode})",
        ]

    def show(self, now: float) -> None:
        """The live table, and ``trials.json`` as it stands."""
        self.shown_at = now
        path, spec = self.sweep_dir / report.TRIALS_FILE, self.spec
        report.write_trials(path, self.trials, spec.metric, spec.mode)
        text = report.render(self.trials, self.keys, spec.metric, now, self.title(now))
        events = self.events[-EVENTS_SHOWN:]
        prefix = "\x1b[H\x1b[2J" if self.redraw else "\n"
        self.out.write(prefix + text + "\n" + "".join(f"  {e}\n" for e in events))
        self.out.flush()

    # -- the end ----------------------------------------------------------------------------------

    def close(self, reason: str) -> None:
        """Stop every trial that still runs (as ``STOPPED`` with ``reason`` unless it was already
        being stopped), tell the study, then write and print the sweep's end."""
        for trial in self.trials:
            if trial.state in (RUNNING, PENDING):
                trial.state, trial.reason = STOPPED, reason
        stop_all(self.trials)
        for trial in self.trials:
            if trial.process is not None:
                read_new(trial)
            tell(self.study, trial, self.spec.metric)
        self.write_end()

    def write_end(self) -> None:
        spec, now = self.spec, time.monotonic()
        report.write_trials(
            self.sweep_dir / report.TRIALS_FILE, self.trials, spec.metric, spec.mode
        )
        ranked = report.sort_trials(self.trials, spec.metric, spec.mode)
        lines = [*self.title(now, finished=True)]
        text = report.render(ranked, self.keys, spec.metric, now, lines)
        end = [report.best_line(ranked, self.keys, spec.metric, spec.mode)]
        try:
            curves = report.write_curves(
                self.sweep_dir / report.CURVES_PLOT,
                ranked,
                self.keys,
                spec.metric,
                self.sweep_dir.name,
            )
            end.append(f"curves: {curves} · trials: {self.sweep_dir / report.TRIALS_FILE}")
        except Exception as exc:  # a plot must never change how a sweep ends
            end.append(f"no plot of the curves: {exc}")
        for trial in ranked:
            if trial.state == ERROR:
                end.append(f"{trial.name}: {trial.reason}; its last lines:")
                unread = "    (its log cannot be read: {exc})"
                end.append(log_tail(trial.log_path, 8, unread, error_lines=12))
        prefix = "\x1b[H\x1b[2J" if self.redraw else "\n"
        self.out.write(prefix + text + "\n" + "\n".join(end) + "\n")
        self.out.flush()


def tell(study: Any, trial: Trial, metric: str) -> None:
    """Tell the study how a trial ended (once): its metric, pruned, or failed."""
    from optuna.trial import TrialState

    if trial.optuna_trial is None:
        return
    value = trial.metric(metric)
    if trial.state == PRUNED:
        study.tell(trial.optuna_trial, state=TrialState.PRUNED)
    elif trial.state == TERMINATED and value is not None:
        study.tell(trial.optuna_trial, value)
    else:
        study.tell(trial.optuna_trial, state=TrialState.FAIL)
    trial.optuna_trial = None

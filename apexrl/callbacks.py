"""User callbacks and custom metrics (RLlib's callbacks).

A run names a class in its config, ``callbacks: mypkg.cb:MyCallbacks`` (empty: none). Each
training actor and the learner (rank 0) make one instance with no arguments at start; the class
defines any of these methods, and only the ones it defines are called:

On every training actor (``apexrl.actor``), for env ``env_index`` of its vector env:

- ``on_episode_start(env_index, obs)``: an episode begins with observation ``obs`` (at the first
  reset and after each episode end, with the reset observation);
- ``on_episode_step(env_index, obs, action, reward, terminated, truncated)``: one env step, with
  the observation it led to (the final one at an episode end). Called once per env per step,
  a Python call each: for a cheap per-step hook define instead
- ``on_step(obs, actions, rewards, terminated, truncated)``: one vector step, with arrays over
  the envs (``obs`` ``[B, *obs]`` as above, ``rewards`` float32 ``[B]``, ...);
- ``on_episode_end(env_index, episode_return, episode_length) -> dict[str, float] | None``: an
  episode ended; the metrics it returns are averaged over the actor's report interval
  (``actor.report_interval_s``) and sent to replay, which keeps the last
  ``CUSTOM_METRIC_WINDOW`` interval means of every actor per name and serves their mean in its
  ``Stats`` as ``custom/<name>``.

The evaluation actor calls none of them: its rounds of greedy episodes judge the run
(``eval/*``), and custom metrics describe the training episodes.

On the learner (rank 0, which writes ``result.json``):

- ``on_train_result(result) -> dict[str, float] | None``: called with every ``result.json``
  record (a copy) before it is written; the metrics it returns are merged into the record's
  ``custom_metrics`` (over an actor metric of the same name) and written to TensorBoard.

Every record of ``result.json`` carries ``"custom_metrics": {name: value}`` (replay's
``custom/<name>`` entries, then ``on_train_result``'s), and the learner writes each one to
TensorBoard as ``custom/<name>`` (replay's TensorBoard has the actors' ones too, actors write
their own interval means as ``actor/custom/<name>``).

A metric's name is 1 to 64 of letters, digits and ``_.-/``; its value is a finite number within
``MAX_ABS_METRIC``; at most ``MAX_CUSTOM_METRICS`` names per actor (the first ones returned) and
per replay server. A metric that breaks these rules is dropped with one warning per name.

A class that cannot be imported, is not a class or raises in ``__init__`` stops the launch with
one line (exit 2) before any role starts (``check_callbacks``). An exception raised in a callback
during the run does not stop the role: the first one of each method is logged with its
traceback, later ones are counted and logged in one line at most every ``ERROR_LOG_INTERVAL_S``,
and the call counts as having returned nothing.
"""

from __future__ import annotations

import importlib
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from apexrl.runtime import lifecycle
from apexrl.transport.messages import MAX_CUSTOM_METRICS, check_metric_name

if TYPE_CHECKING:
    from apexrl.envs import VectorStep

log = logging.getLogger(__name__)

CUSTOM_PREFIX = "custom/"  # replay's Stats and the learner's TensorBoard
CUSTOM_METRIC_WINDOW = 100  # interval means per name that replay averages
MAX_ABS_METRIC = 1e12  # |value| of a custom metric
ERROR_LOG_INTERVAL_S = 60.0
ACTOR_METHODS = ("on_episode_start", "on_episode_step", "on_step", "on_episode_end")
LEARNER_METHODS = ("on_train_result",)
NUMBER_TYPES = (int, float, np.integer, np.floating)


class CallbacksError(lifecycle.StartupError):
    """The configured callbacks cannot be made; the message is one line for the user (a role
    that meets it exits with status 2, as for any ``StartupError``)."""


def load_callbacks_class(spec: str) -> type:
    """The class that ``spec`` (``module:Class``) names; ``CallbacksError`` when it cannot be
    imported or is not a class."""
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise CallbacksError(f"callbacks {spec!r} must be module:Class")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a user module may raise anything while it is imported
        raise CallbacksError(
            f"callbacks {spec!r}: cannot import {module_name!r} ({type(exc).__name__}: {exc})"
        ) from exc
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise CallbacksError(f"callbacks {spec!r}: {module_name!r} has no {attr!r}")
        target = getattr(target, part)
    if not isinstance(target, type):
        raise CallbacksError(f"callbacks {spec!r} is a {type(target).__name__}, not a class")
    return target


def make_callbacks(spec: str) -> object | None:
    """An instance of the class ``spec`` names (None for ``""``); ``CallbacksError`` when it
    cannot be made."""
    if not spec:
        return None
    cls = load_callbacks_class(spec)
    try:
        return cls()
    except Exception as exc:
        raise CallbacksError(
            f"callbacks {spec!r}: {cls.__name__}() raised {type(exc).__name__}: {exc}"
        ) from exc


def check_callbacks(spec: str) -> None:
    """Make the callbacks once, as every role will (the launcher's preflight)."""
    make_callbacks(spec)


class Guarded:
    """A user's method that never raises: an exception is logged (the first with its traceback,
    then a count at most every ``ERROR_LOG_INTERVAL_S``) and the call returns None."""

    def __init__(self, method: Callable[..., Any], name: str) -> None:
        self.method, self.name = method, name
        self.num_errors = 0
        self.last_log = 0.0

    def __call__(self, *args: Any) -> Any:
        try:
            return self.method(*args)
        except Exception as exc:
            self.failed(exc)
            return None

    def failed(self, exc: Exception) -> None:
        """Count and log an exception of the method (a caller that calls ``method`` itself)."""
        self.num_errors += 1
        now = time.monotonic()
        if self.num_errors == 1:
            log.error("callback %s raised; the role goes on", self.name, exc_info=exc)
            self.last_log = now
        elif now - self.last_log >= ERROR_LOG_INTERVAL_S:
            self.last_log = now
            log.error(
                "callback %s has raised %d times (last: %s: %s)",
                self.name,
                self.num_errors,
                type(exc).__name__,
                exc,
            )


def guarded_methods(user: object | None, names: tuple[str, ...]) -> dict[str, Guarded]:
    """The methods of ``names`` that ``user`` defines, guarded."""
    if user is None:
        return {}
    found = {}
    for name in names:
        method = getattr(user, name, None)
        if callable(method):
            found[name] = Guarded(method, f"{type(user).__name__}.{name}")
    return found


class MetricCleaner:
    """Checks what a callback returned: a mapping of valid names to finite numbers within
    ``MAX_ABS_METRIC``; anything else is dropped with one warning per name (or per kind)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.warned: set[str] = set()

    def _warn(self, key: str, message: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            log.warning("%s: %s; dropped", self.source, message)

    def __call__(self, returned: Any) -> dict[str, float]:
        if returned is None:
            return {}
        if not isinstance(returned, dict):
            self._warn("", f"returned a {type(returned).__name__}, not a dict of metrics")
            return {}
        clean = {}
        for name, value in returned.items():
            try:
                check_metric_name(name)
            except ValueError as exc:
                self._warn(repr(name)[:80], str(exc))
                continue
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, NUMBER_TYPES):
                self._warn(name, f"metric {name!r} is a {type(value).__name__}, not a number")
                continue
            value = float(value)
            if not math.isfinite(value) or abs(value) > MAX_ABS_METRIC:
                self._warn(
                    name, f"metric {name!r} = {value} is not finite or over {MAX_ABS_METRIC:g}"
                )
                continue
            clean[name] = value
        return clean


class MeanMetrics:
    """Sums and counts of custom metrics over an interval, for at most ``max_names`` names (the
    first ones seen; later names are dropped with one warning each)."""

    def __init__(self, max_names: int = MAX_CUSTOM_METRICS) -> None:
        self.max_names = max_names
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.known: set[str] = set()  # every name taken so far, interval after interval
        self.refused: set[str] = set()

    def add(self, values: dict[str, float]) -> None:
        for name, value in values.items():
            if name not in self.known:
                if len(self.known) >= self.max_names:
                    if name not in self.refused:
                        self.refused.add(name)
                        log.warning("custom metric %r dropped: over %d names", name, self.max_names)
                    continue
                self.known.add(name)
            self.sums[name] = self.sums.get(name, 0.0) + value
            self.counts[name] = self.counts.get(name, 0) + 1

    def means(self) -> dict[str, float]:
        return {name: total / self.counts[name] for name, total in self.sums.items()}

    def clear(self) -> None:
        self.sums.clear()
        self.counts.clear()


class EpisodeCallbacks:
    """An actor's callbacks around its vector env: ``reset`` after ``envs.reset``, ``step`` after
    every vector step; the custom metrics of ended episodes collect in ``metrics``."""

    def __init__(self, user: object) -> None:
        methods = guarded_methods(user, ACTOR_METHODS)
        self.on_episode_start = methods.get("on_episode_start")
        self.on_episode_step = methods.get("on_episode_step")
        self.on_step = methods.get("on_step")
        self.on_episode_end = methods.get("on_episode_end")
        self.clean = MetricCleaner(f"{type(user).__name__}.on_episode_end")
        self.metrics = MeanMetrics()

    @property
    def defines_any(self) -> bool:
        methods = (self.on_episode_start, self.on_episode_step, self.on_step, self.on_episode_end)
        return any(method is not None for method in methods)

    def reset(self, obs: np.ndarray) -> None:
        if self.on_episode_start is not None:
            for i in range(len(obs)):
                self.on_episode_start(i, obs[i])

    def step(
        self,
        actions: np.ndarray,
        step: VectorStep,
        ended: np.ndarray,
        episode_returns: np.ndarray,
        episode_lengths: np.ndarray,
    ) -> None:
        """One vector step; ``episode_returns`` and ``episode_lengths`` are the envs' totals with
        this step, before the ended ones restart."""
        if self.on_step is not None:
            self.on_step(step.next_obs, actions, step.reward, step.terminated, step.truncated)
        if self.on_episode_step is not None:
            self._episode_steps(actions, step)
        if not ended.any():
            return
        for i in np.flatnonzero(ended).tolist():
            if self.on_episode_end is not None:
                returned = self.on_episode_end(
                    i, float(episode_returns[i]), int(episode_lengths[i])
                )
                self.metrics.add(self.clean(returned))
            if self.on_episode_start is not None:
                self.on_episode_start(i, step.obs[i])

    def _episode_steps(self, actions: np.ndarray, step: VectorStep) -> None:
        """``on_episode_step`` for each env: the user's method itself in the loop (one Python
        call per env step), its exceptions counted by its guard."""
        guard = self.on_episode_step
        method = guard.method
        per_env = zip(
            step.next_obs, actions, step.reward.tolist(), step.terminated.tolist(),
            step.truncated.tolist(), strict=True,
        )  # fmt: skip
        for i, (obs, action, reward, terminated, truncated) in enumerate(per_env):
            try:
                method(i, obs, action, reward, terminated, truncated)
            except Exception as exc:
                guard.failed(exc)


def make_episode_callbacks(spec: str) -> EpisodeCallbacks | None:
    """An actor's callbacks; None when the run has none or its class defines no actor method."""
    user = make_callbacks(spec)
    if user is None:
        return None
    callbacks = EpisodeCallbacks(user)
    return callbacks if callbacks.defines_any else None


class TrainResultCallback:
    """The learner's ``on_train_result``, guarded, with its metrics checked."""

    def __init__(self, user: object) -> None:
        self.method = guarded_methods(user, LEARNER_METHODS).get("on_train_result")
        self.clean = MetricCleaner(f"{type(user).__name__}.on_train_result")

    def __call__(self, record: dict[str, Any]) -> dict[str, float]:
        if self.method is None:
            return {}
        copy = {**record, "custom_metrics": dict(record.get("custom_metrics", {}))}
        return self.clean(self.method(copy))


def make_train_result_callback(spec: str) -> TrainResultCallback | None:
    """The learner's callback; None when the run has none or its class does not define it."""
    user = make_callbacks(spec)
    if user is None:
        return None
    callback = TrainResultCallback(user)
    return callback if callback.method is not None else None


def custom_stats(stats: dict[str, float]) -> dict[str, float]:
    """The custom metrics among replay's ``Stats``, by name (``custom/<name>`` -> ``<name>``)."""
    n = len(CUSTOM_PREFIX)
    return {key[n:]: value for key, value in stats.items() if key.startswith(CUSTOM_PREFIX)}

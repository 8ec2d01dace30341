"""Requests of the user's Python (``apexrl.api.Trainer``) to a running learner, through the run
directory: take these weights as a new weights version (``Trainer.set_weights``), write a
checkpoint now (``Trainer.save``), and set this env task on every training env
(``Trainer.set_env_task``).

The learner owns the weights versions (it announces each one to replay with ``PublishedVersion``
before it publishes it), so user weights go through it rather than to the parameter server: the
chief learner loads them into its network, counts one more version and publishes it to every
actor like any other.

Files, in ``<run dir>/requests/`` (``rundir.requests_dir``), each written whole (under a name
that starts with ``.``, then renamed):

- ``<n>.weights.npz``: numpy arrays by parameter name (``models.params_to_arrays``'s names), read
  with ``allow_pickle=False``; the reply is ``{"version": v}``;
- ``<n>.checkpoint`` (empty): the reply is ``{"checkpoint": "checkpoints/checkpoint-<v>.pt",
  "version": v}``, a checkpoint of the learner's state now (``rundir.saved_checkpoint_path``);
- ``<n>.env_task.json``: the task as JSON (at most ``messages.MAX_ENV_TASK_CHARS``); the learner
  keeps it in ``<run dir>/env_task.json`` (``rundir.env_task_path``: a restarted learner goes on
  with it), sends it with every weights version from the next on (``PublishParams.env_task``:
  each actor calls ``set_task(task)`` on its envs, ``apexrl.acting.env_tasks``) and writes it in
  every ``result.json`` record (``env_task``); the reply is ``{"env_task": task}``;
- the learner's reply to request ``n``: ``<n>.reply.json``, ``{"error": "..."}`` when it refused.

The chief serves them in the order of ``n``, between two turns of its loop, every
``POLL_INTERVAL_S`` at most, and only when its algorithm has no work in hand
(``LearnerCore.has_work``: PPO's epochs over a rollout are never cut by new weights, and a
checkpoint holds the version the actors play). Weights that do not fit the network or are not
finite are refused with the reason; a learner group refuses weights (its ranks must hold the
same ones).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

from apexrl.algos import LearnerCore
from apexrl.learning.checkpoint import save_checkpoint
from apexrl.learning.publisher import Publisher
from apexrl.models import arrays_to_params
from apexrl.runtime import lifecycle, rundir
from apexrl.transport.messages import MAX_ENV_TASK_CHARS, check_env_task
from apexrl.transport.weights import non_finite_arrays

log = logging.getLogger("apexrl.learner")  # the learner's log lines, whichever part writes them

POLL_INTERVAL_S = 0.2  # the longest a request waits for the learner to look
WEIGHTS = "weights.npz"
CHECKPOINT = "checkpoint"
ENV_TASK = "env_task.json"
REPLY = "reply.json"
REQUEST_NAME = re.compile(r"^(\d{1,18})\.(weights\.npz|checkpoint|env_task\.json)$")


class Request(NamedTuple):
    number: int
    kind: str  # WEIGHTS, CHECKPOINT or ENV_TASK
    path: Path


def pending_requests(directory: Path) -> list[Request]:
    """The requests waiting in ``directory``, in order; none when it does not exist."""
    try:
        names = [entry.name for entry in os.scandir(directory)]
    except OSError:
        return []
    found = []
    for name in names:
        match = REQUEST_NAME.match(name)
        if match is not None:
            found.append(Request(int(match.group(1)), match.group(2), directory / name))
    return sorted(found)


def read_weights(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a ``.npz`` file, never unpickled; ``ValueError`` when it cannot be read."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError, EOFError) as exc:
        raise ValueError(f"cannot read {path.name} as numpy arrays: {exc}") from exc


def take_weights(algo: LearnerCore, arrays: dict[str, np.ndarray]) -> int:
    """Load ``arrays`` into the network actors play (all or nothing) as the next weights
    version; returns that version. ``ValueError`` names what does not fit."""
    bad = non_finite_arrays(arrays)
    if bad:
        raise ValueError(f"array {bad[0]!r} holds NaN or infinite values")
    arrays_to_params(algo.network, arrays)
    algo.num_updates += 1
    return algo.num_updates


def read_env_task(path: Path) -> str:
    """An env task file's JSON, as compact text; ``ValueError`` when it is not JSON or too
    long for the wire (``messages.check_env_task``)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {path.name}: {exc}") from exc
    if len(raw) > MAX_ENV_TASK_CHARS + 1:
        raise ValueError(f"{path.name} holds {len(raw)} bytes, over {MAX_ENV_TASK_CHARS}")
    try:
        text = json.dumps(json.loads(raw), separators=(",", ":"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path.name} is not JSON: {exc}") from exc
    check_env_task(text)
    return text


def write_reply(directory: Path, number: int, reply: dict) -> None:
    lifecycle.write_atomic(directory / f"{number}.{REPLY}", json.dumps(reply) + "\n")


class UserRequests:
    """The chief learner's side of the requests: looks for them now and then and serves them."""

    def __init__(
        self,
        run_dir: Path,
        algo: LearnerCore,
        publisher: Publisher,
        in_group: bool,
        checkpointed: object | None = None,
    ) -> None:
        self.run_dir, self.algo, self.publisher = run_dir, algo, publisher
        # What a checkpoint holds: ``algo``, or every policy of a multi-agent run
        self.checkpointed = algo if checkpointed is None else checkpointed
        self.in_group = in_group
        self.directory = rundir.requests_dir(run_dir)
        self.last_look = time.monotonic()
        with contextlib.suppress(ValueError):  # none set yet, or not one we wrote
            publisher.env_task = read_env_task(rundir.env_task_path(run_dir))

    def serve(self, counters: dict[str, int]) -> bool:
        """Serve what is waiting (at most every ``POLL_INTERVAL_S``, never while the algorithm
        has work in hand); ``counters`` are the checkpoint's, brought up to now. True when new
        weights were published (the learner need not publish this version again)."""
        if self.algo.has_work or time.monotonic() - self.last_look < POLL_INTERVAL_S:
            return False
        self.last_look = time.monotonic()
        published = False
        for request in pending_requests(self.directory):
            try:
                if request.kind == WEIGHTS:
                    reply = self._weights(request.path, counters)
                    published = True
                elif request.kind == ENV_TASK:
                    reply = self._env_task(request.path)
                else:
                    reply = self._checkpoint(counters)
            except ValueError as exc:
                log.error("refused the request %s: %s", request.path.name, exc)
                reply = {"error": str(exc)}
            request.path.unlink(missing_ok=True)
            write_reply(self.directory, request.number, reply)
        return published

    def _weights(self, path: Path, counters: dict[str, int]) -> dict:
        if self.in_group:
            raise ValueError("a learner group cannot take weights (learner.world_size > 1)")
        if self.checkpointed is not self.algo:
            raise ValueError("a multi-agent run takes no weights from the user yet")
        version = take_weights(self.algo, read_weights(path))
        self.publisher.publish(counters["env_steps"])
        log.info("took the user's weights as version %d and published them", version)
        return {"version": version}

    def _env_task(self, path: Path) -> dict:
        text = read_env_task(path)
        lifecycle.write_atomic(rundir.env_task_path(self.run_dir), text + "\n")
        self.publisher.env_task = text
        log.info("env task %s: sent with the weights from the next version on", text[:200])
        return {"env_task": json.loads(text)}

    def _checkpoint(self, counters: dict[str, int]) -> dict:
        version = self.algo.num_updates
        path = rundir.saved_checkpoint_path(self.run_dir, version)
        path.parent.mkdir(parents=True, exist_ok=True)
        counters = {**counters, "weights_version": version}
        if not save_checkpoint(path, self.checkpointed, counters, keep_previous=False):
            raise ValueError("the weights hold NaN or infinite values; no checkpoint written")
        log.info("wrote %s on request", path.relative_to(self.run_dir))
        return {"checkpoint": str(path.relative_to(self.run_dir)), "version": version}

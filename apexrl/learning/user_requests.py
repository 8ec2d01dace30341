"""Requests of the user's Python (``apexrl.api.Trainer``) to a running learner, through the run
directory: take these weights as a new weights version (``Trainer.set_weights``), and write a
checkpoint now (``Trainer.save``).

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
- the learner's reply to request ``n``: ``<n>.reply.json``, ``{"error": "..."}`` when it refused.

The chief serves them in the order of ``n``, between two turns of its loop, every
``POLL_INTERVAL_S`` at most, and only when its algorithm has no work in hand
(``LearnerCore.has_work``: PPO's epochs over a rollout are never cut by new weights, and a
checkpoint holds the version the actors play). Weights that do not fit the network or are not
finite are refused with the reason; a learner group refuses weights (its ranks must hold the
same ones).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

from apexrl import lifecycle, rundir
from apexrl.algos import LearnerCore
from apexrl.learning.checkpoint import save_checkpoint
from apexrl.learning.publisher import Publisher
from apexrl.models import arrays_to_params
from apexrl.weights import non_finite_arrays

log = logging.getLogger("apexrl.learner")  # the learner's log lines, whichever part writes them

POLL_INTERVAL_S = 0.2  # the longest a request waits for the learner to look
WEIGHTS = "weights.npz"
CHECKPOINT = "checkpoint"
REPLY = "reply.json"
REQUEST_NAME = re.compile(r"^(\d{1,18})\.(weights\.npz|checkpoint)$")


class Request(NamedTuple):
    number: int
    kind: str  # WEIGHTS or CHECKPOINT
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


def write_reply(directory: Path, number: int, reply: dict) -> None:
    lifecycle.write_atomic(directory / f"{number}.{REPLY}", json.dumps(reply) + "\n")


class UserRequests:
    """The chief learner's side of the requests: looks for them now and then and serves them."""

    def __init__(
        self, run_dir: Path, algo: LearnerCore, publisher: Publisher, in_group: bool
    ) -> None:
        self.run_dir, self.algo, self.publisher = run_dir, algo, publisher
        self.in_group = in_group
        self.directory = rundir.requests_dir(run_dir)
        self.last_look = time.monotonic()

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
        version = take_weights(self.algo, read_weights(path))
        self.publisher.publish(counters["env_steps"])
        log.info("took the user's weights as version %d and published them", version)
        return {"version": version}

    def _checkpoint(self, counters: dict[str, int]) -> dict:
        version = self.algo.num_updates
        path = rundir.saved_checkpoint_path(self.run_dir, version)
        path.parent.mkdir(parents=True, exist_ok=True)
        counters = {**counters, "weights_version": version}
        if not save_checkpoint(path, self.algo, counters, keep_previous=False):
            raise ValueError("the weights hold NaN or infinite values; no checkpoint written")
        log.info("wrote %s on request", path.relative_to(self.run_dir))
        return {"checkpoint": str(path.relative_to(self.run_dir)), "version": version}

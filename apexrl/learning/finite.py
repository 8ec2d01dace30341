"""Nothing non-finite is trained on or kept: the learner's checks for NaN and infinite values.

A batch with a NaN or an infinity in a float field (``non_finite_fields``) is skipped
(``replay_link.BatchStream``, ``learner/skipped_batches``) and gets no priority update; a gradient
whose loss (``finite_loss``) or norm is not finite is dropped (``update.UpdateStep``,
``learner/skipped_updates``); weights that are not finite (``non_finite_tensors``) are never
written to a checkpoint (``checkpoint``). What is skipped is logged at once, then at most once per
``SKIP_LOG_INTERVAL_S`` (``RateLimitedLog``).
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import torch

from apexrl.algos import UpdateResult
from apexrl.transport.messages import SampleBatch

log = logging.getLogger("apexrl.learner")  # the learner's log lines, whichever part writes them

SKIP_LOG_INTERVAL_S = 10.0  # seconds between log lines about skipped batches or updates


class RateLimitedLog:
    """Warnings about a repeating event: the first at once, then at most one per interval."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.last: float | None = None

    def warning(self, fmt: str, *args: object) -> None:
        now = time.monotonic()
        if self.last is None or now - self.last >= self.interval_s:
            self.last = now
            log.warning(fmt, *args)


def non_finite_fields(batch: SampleBatch) -> list[str]:
    """The float fields of ``batch`` (and its probabilities) holding a NaN or an infinity."""
    arrays = {**batch.fields, "probabilities": batch.probabilities}
    return [
        name
        for name, array in arrays.items()
        if array.dtype.kind == "f" and not np.isfinite(array).all()
    ]


def non_finite_tensors(state: object, prefix: str = "") -> list[str]:
    """The names of the float tensors in a (nested) state dict that hold a NaN or an infinity."""
    if isinstance(state, torch.Tensor):
        finite = not state.is_floating_point() or bool(torch.isfinite(state).all())
        return [] if finite else [prefix]
    if isinstance(state, dict):
        items = state.items()
    elif isinstance(state, (list, tuple)):
        items = enumerate(state)
    else:
        return []
    return [
        name
        for key, value in items
        for name in non_finite_tensors(value, f"{prefix}.{key}" if prefix else str(key))
    ]


def finite_loss(result: UpdateResult) -> bool:
    """Whether the core's ``learner/loss`` metric (when it reports one) is finite."""
    return math.isfinite(result.metrics.get("learner/loss", 0.0))

"""The learner's update step and what it needs: the algorithm's learner core (fresh, or resumed
from the run's checkpoint) and, with ``learner.world_size`` > 1, the learner group it trains in.

``UpdateStep.run`` is one update: a single learner's own gradient step, or a group's averaged one
(``group``), with the group's stop vote. A gradient that is not finite is dropped (``finite``).
``join_group`` and ``share_start_state`` start a group: every rank takes rank 0's weights,
optimizer state and counters.
"""

from __future__ import annotations

import logging
import math

import torch

from apexrl.algos import LearnerCore, SampledBatch, UpdateResult, load_algorithm
from apexrl.config import Config
from apexrl.envs.spaces import network_spaces
from apexrl.learning.checkpoint import resume_checkpoint
from apexrl.learning.finite import SKIP_LOG_INTERVAL_S, RateLimitedLog, finite_loss
from apexrl.learning.group import LearnerGroup
from apexrl.models import precision
from apexrl.runtime import lifecycle

log = logging.getLogger("apexrl.learner")  # the learner's log lines, whichever part writes them


class UpdateStep:
    """One update: a single learner's own gradient step, or, in a learner group, the gradient
    averaged over the ranks that had a batch (and the group's stop vote).

    A gradient whose norm, or whose rank's loss (the core's ``learner/loss`` metric), is not
    finite is dropped before the core applies it: every ``.grad`` is cleared, so the optimizer
    changes nothing, while the core still counts the step (PPO's epochs go on). The update's
    priorities are dropped with it. In a group, a rank with a non-finite loss fills its gradient
    with NaN, so that the averaged gradient, the same on every rank, makes every rank drop it.
    """

    def __init__(self, algo: LearnerCore, group: LearnerGroup | None) -> None:
        self.algo, self.group = algo, group
        self.params = list(algo.network.parameters())  # walking the modules costs per update
        self.num_skipped = 0  # gradient steps dropped for a non-finite loss or gradient
        self.skip_log = RateLimitedLog(SKIP_LOG_INTERVAL_S)
        self.first_logged = False

    def run(
        self, batch: SampledBatch | None, wants_stop: bool
    ) -> tuple[UpdateResult | None, int, bool]:
        """Returns this rank's result (None: no gradient from this rank this time), how many
        gradients the update averaged (0: no update happened) and whether the learners stop
        now. The core is asked even without a batch: PPO's epochs need no new data."""
        if self.group is None:
            self.algo.agree(lambda values: values)
            result = self.algo.compute_gradients(batch)
            if result is None:
                return None, 0, wants_stop
            result, grad_norm = self._apply(result)
            result.metrics["learner/grad_norm"] = grad_norm
            self._log_first()
            return result, 1, wants_stop
        self.algo.agree(self.group.sum)
        result = self.algo.compute_gradients(batch)
        if result is not None and not finite_loss(result):
            for p in self.params:
                if p.grad is not None:
                    p.grad.fill_(math.nan)
        num_batches, stop_now = self.group.average_gradients(
            self.params, result is not None, wants_stop
        )
        if num_batches > 0:
            result, grad_norm = self._apply(result)
            if result is not None:
                result.metrics["learner/grad_norm"] = grad_norm
            self._log_first()
        return result, num_batches, stop_now

    def _log_first(self) -> None:
        """Log the first update (the start-up figures of benchmarks/learner_throughput.py)."""
        if not self.first_logged:
            self.first_logged = True
            log.info("first update done")

    def _apply(self, result: UpdateResult | None) -> tuple[UpdateResult | None, float]:
        """Apply the gradient in ``.grad``, or drop it when it or the loss is not finite."""
        grads = [p.grad for p in self.params if p.grad is not None]
        grad_norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
        if math.isfinite(grad_norm) and (result is None or finite_loss(result)):
            return result, self.algo.apply_gradients()
        self.num_skipped += 1
        loss = result.metrics.get("learner/loss") if result is not None else None
        self.skip_log.warning(
            "dropped a gradient step: loss %s, gradient norm %s (%d steps dropped)",
            loss,
            grad_norm,
            self.num_skipped,
        )
        for p in self.params:
            p.grad = None
        self.algo.apply_gradients()  # no gradient: the core counts its step, nothing changes
        if result is not None:
            result = result._replace(priorities=None)
        return result, grad_norm


def build_algo(
    cfg: Config, device: torch.device, resume: bool
) -> tuple[LearnerCore, dict[str, int]]:
    """The algorithm's learner core with fresh weights, or restored from the run's checkpoint."""
    spaces = network_spaces(cfg)
    algo = load_algorithm(cfg.algorithm).learner_core(*spaces, cfg, device)
    networks = precision.networks_of(algo)
    precision.choose_and_apply(
        cfg.learner.precision, device, networks, spaces[0], probe_rows(cfg), True, "learner"
    )
    # Every counter of the run that is not the algorithm's own (its updates): a resumed run
    # continues all of them.
    counters = {"num_samples": 0, "elapsed_ms": 0, "env_steps": 0}
    if resume:
        counters.update(resume_checkpoint(cfg.run_dir, algo, device))
        log.info(
            "resumed from %s at update %d, %d env steps, %.0f s of learner time",
            cfg.run_dir,
            algo.num_updates,
            counters["env_steps"],
            counters["elapsed_ms"] / 1000,
        )
    return algo, counters


def probe_rows(cfg: Config) -> int:
    """Observations in the precision probe's batch: about what one update reads (items times
    their steps), within 32..640."""
    steps = getattr(cfg.algo, "unroll_length", getattr(cfg.algo, "sequence_length", 1))
    return int(min(max(cfg.learner.batch_size * steps, 32), 640))


def join_group(cfg: Config, rank: int, device: torch.device) -> LearnerGroup | None:
    if cfg.learner.world_size == 1:
        if rank != 0:
            raise lifecycle.StartupError(f"rank {rank} given but learner.world_size is 1")
        return None
    return LearnerGroup(
        rank,
        cfg.learner.world_size,
        cfg.learner.rendezvous,
        cfg.learner.join_timeout_s,
        cfg.learner.collective_timeout_s,
        device,
    )


def share_start_state(
    group: LearnerGroup | None, algo: LearnerCore, counters: dict[str, int]
) -> dict[str, int]:
    """In a group, load rank 0's core state and return its counters on every rank (fresh or
    resumed); alone, the counters as they are. Raises ``GroupError`` when a rank is lost."""
    if group is None:
        return counters
    state = group.broadcast_state({"algo": algo.state_dict(), "counters": counters})
    algo.load_state_dict(state["algo"])
    return {k: int(v) for k, v in state["counters"].items()}

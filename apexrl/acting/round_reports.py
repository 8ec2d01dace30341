"""What an evaluation actor says of its rounds, besides its report to replay: a log line now and
then (``RoundLines``) and TensorBoard scalars written at the run's env steps (``RoundScalars``,
``round_scalars``); and how it starts (``start_evaluation``: its stop handlers, niceness, threads,
device, incarnation, round quotas and seed). The single-agent
evaluation actor (``apexrl.evaluation``) and the multi-agent one (``apexrl.multiagent.evaluation``)
both use them.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from typing import NamedTuple

import numpy as np
import torch

from apexrl.acting.rounds import Round, round_quotas
from apexrl.clients.replay import ReplayClient
from apexrl.config import Config
from apexrl.runtime import lifecycle
from apexrl.runtime.cores import lower_priority
from apexrl.runtime.metrics import MetricsWriter

log = logging.getLogger("apexrl.actor")


class RoundLines:
    """The rounds' lines in the log: at most one every ``interval_s`` (a fast env plays several
    rounds a second; TensorBoard has every round), each saying how many rounds it stands for."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.last_line = -math.inf  # time.monotonic() of the last line
        self.rounds = 0  # rounds since the last line, this one included

    def add(self, version: int, result: Round) -> None:
        self.rounds += 1
        now = time.monotonic()
        if now - self.last_line < self.interval_s:
            return
        log.info(
            "eval: weights version %d: mean return %.1f (min %.1f, max %.1f) over %d "
            "episodes, %d env steps in %.2f s%s",
            version,
            float(result.returns.mean()),
            result.returns.min(),
            result.returns.max(),
            len(result.returns),
            result.env_steps,
            result.seconds,
            f" ({self.rounds} rounds since the last line)" if self.rounds > 1 else "",
        )
        self.last_line, self.rounds = now, 0


def round_scalars(result: Round, version: int, total_steps: int) -> dict[str, float]:
    """A round's TensorBoard scalars; ``total_steps``: the env steps of every round so far."""
    return {
        "eval/episode_return": float(result.returns.mean()),
        "eval/episode_return_std": float(result.returns.std()),
        "eval/episode_length": float(result.lengths.mean()),
        "eval/weights_version": float(version),
        "eval/round_s": result.seconds,
        "eval/env_steps_per_s": result.env_steps / max(result.seconds, 1e-9),
        "eval/env_steps": float(total_steps),
    }


class RoundScalars:
    """The last round's scalars, held until replay says at which run env steps to write them."""

    def __init__(self, writer: MetricsWriter, replay: ReplayClient) -> None:
        self.writer, self.replay = writer, replay
        self.pending: dict[str, float] = {}

    def write_pending(self) -> None:
        if self.pending and self.replay.run_env_steps is not None:
            self.writer.scalars(self.pending, self.replay.run_env_steps)
            self.pending.clear()

    def add(self, scalars: dict[str, float]) -> None:
        self.write_pending()  # an earlier round's, if replay never answered
        self.pending.update(scalars)


def lower_priority_to(niceness: int) -> None:
    """Run at ``niceness`` at least: a launcher may have started the process there already."""
    lower_priority(niceness - os.getpriority(os.PRIO_PROCESS, 0))


class EvaluationStart(NamedTuple):
    stop: threading.Event
    device: str
    incarnation: int
    quotas: np.ndarray  # each env's episodes in a round
    seed: int  # the first round's; round k plays seed + k


def start_evaluation(cfg: Config) -> EvaluationStart:
    """An evaluation actor's start: stop handlers, ``Config.eval_niceness``, its torch threads,
    its device, a new incarnation, the quotas of a round of ``run.stop_eval_episodes`` episodes
    on ``actor.eval_num_envs`` envs, and its seed."""
    stop = lifecycle.install_stop_handlers()
    lower_priority_to(cfg.eval_niceness)
    torch.set_num_threads(cfg.actor.torch_threads)
    device = lifecycle.resolve_device(cfg.actor.device)
    num_episodes = cfg.run.stop_eval_episodes
    quotas = round_quotas(num_episodes, min(cfg.actor.eval_num_envs, num_episodes))
    return EvaluationStart(stop, device, lifecycle.new_incarnation(), quotas, cfg.env.seed + 5_000)

"""Videos of the evaluation actor (``actor.eval_video_interval_s`` > 0): after a round, once
that many seconds have passed since the last video, one more greedy game of the round's weights
is played in an env of its own that renders, and written to
``<run dir>/videos/eval-v<version>-episode-0.mp4`` (``apexrl.envs.video``). The game is not
counted in any round."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from apexrl.acting.rounds import play_round
from apexrl.config import Config
from apexrl.envs.video import check_video_packages, recorded_vector_env
from apexrl.runtime import rundir

log = logging.getLogger("apexrl.actor")

VIDEO_SEED_OFFSET = 9_000  # the recorded games' seeds: apart from the rounds'


class EvalVideos:
    """When a video is due and what it plays; ``VideoError`` at start where videos cannot be
    written (a package missing)."""

    def __init__(self, cfg: Config, algorithm, network, device: str) -> None:
        self.cfg, self.algorithm, self.network, self.device = cfg, algorithm, network, device
        self.interval_s = cfg.actor.eval_video_interval_s
        self.video_dir = rundir.videos_dir(cfg.run_dir)
        self.rng = np.random.default_rng(cfg.env.seed + VIDEO_SEED_OFFSET)
        self.next_at = time.monotonic()  # the first round's weights get one
        self.recorded = 0
        if self.interval_s > 0:
            check_video_packages()

    def after_round(self, version: int, keep_going: Callable[[], bool]) -> bool:
        """Record a game of weights ``version`` if one is due; False when ``keep_going`` said
        stop during it (the partial video is not written)."""
        if self.interval_s <= 0 or time.monotonic() < self.next_at:
            return True
        envs = recorded_vector_env(self.cfg, [1], self.video_dir, f"eval-v{version}")
        try:
            core = self.algorithm.actor_core(self.network, self.cfg, 0, True, self.device, self.rng)
            seed = self.cfg.env.seed + VIDEO_SEED_OFFSET + self.recorded
            result = play_round(envs, core, np.ones(1, dtype=np.int64), seed, keep_going)
        finally:  # a game stopped half way is not written
            envs.close()
        if result is None:
            return False
        self.recorded += 1
        self.next_at = time.monotonic() + self.interval_s
        log.info(
            "eval: recorded a game of weights version %d (return %.1f, %d steps) to %s",
            version,
            result.returns[0],
            result.lengths[0],
            self.video_dir / f"eval-v{version}-episode-0.mp4",
        )
        return True

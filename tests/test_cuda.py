"""CUDA: every family's learner and actor inference on the GPU when the config asks for it
(``learner.device: cuda``, ``actor.device: cuda``), on Atari frames that reach the device as uint8.
Skipped, with the reason, where no CUDA device exists."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_algos import as_batch, collect
from test_pixels import PIXEL_CASES, REPO

from apexrl.config import load_config

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device on this machine"
)


@pytest.mark.parametrize("config, env_id, torso, more", PIXEL_CASES)
def test_every_family_trains_and_acts_on_cuda(config, env_id, torso, more) -> None:
    overrides = [f"env.id={env_id}", "env.num_envs=4", "actor.num_actors=1", *more]
    overrides += ["actor.device=cuda", "learner.device=cuda"]
    if config.startswith("ppo"):
        overrides += ["algo.epochs=1", "algo.num_minibatches=1"]
    if config.startswith("r2d2"):
        overrides += ["algo.sequence_length=8", "algo.sequence_overlap=4", "algo.burn_in=2"]
    cfg = load_config(REPO / "configs" / config, overrides)
    algorithm, spaces, chunks = collect(cfg, num_blocks=1, version=0, device="cuda")
    learner = algorithm.learner_core(*spaces, cfg, torch.device("cuda"))
    assert next(learner.network.parameters()).is_cuda
    batch = as_batch(chunks, device=torch.device("cuda"))
    assert batch.fields["obs"].dtype == torch.uint8 and batch.fields["obs"].is_cuda
    for turn in range(3):
        learner.agree(lambda values: values)
        result = learner.compute_gradients(batch if turn == 0 else None)
        if result is not None:
            assert all(np.isfinite(v) for v in result.metrics.values())
            learner.apply_gradients()
            break
    assert learner.num_updates == 1

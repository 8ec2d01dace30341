"""gymnasium's MuJoCo v5 envs on the MuJoCo that install.sh installs (3.x: gymnasium's v5 envs were
made on it, and 4.0 split its Python package): made, reset and stepped the way apexrl's actors
make them (a vector env that takes the policy's [-1, 1] actions), the same episode for the same
seed, and SAC's network built for each."""

from __future__ import annotations

from pathlib import Path

import mujoco
import numpy as np
import pytest

from apexrl.algos import load_algorithm
from apexrl.config import load_config
from apexrl.envs import make_vector_env, step_vector

REPO = Path(__file__).resolve().parents[1]


def test_mujoco_is_a_3x_release() -> None:
    major = int(mujoco.__version__.split(".")[0])
    assert major == 3, f"gymnasium's v5 envs need MuJoCo 3.x, found {mujoco.__version__}"


@pytest.mark.parametrize(
    "env_id, obs_dim, action_dim",
    [("HalfCheetah-v5", 17, 6), ("Hopper-v5", 11, 3), ("Walker2d-v5", 17, 6)],
)
def test_v5_envs_make_reset_and_step_with_unit_actions(
    env_id: str, obs_dim: int, action_dim: int
) -> None:
    cfg = load_config(REPO / "configs" / "sac_halfcheetah.yaml", [f"env.id={env_id}"])
    runs = []
    for _ in range(2):
        envs = make_vector_env(cfg.env, 2, cfg.unit_actions)
        try:
            space = envs.single_action_space
            assert space.shape == (action_dim,)
            np.testing.assert_array_equal(space.low, -1.0)
            np.testing.assert_array_equal(space.high, 1.0)
            obs, _ = envs.reset(seed=3)
            assert obs.shape == (2, obs_dim) and np.all(np.isfinite(obs))
            rng = np.random.default_rng(0)
            seen = [obs]
            for _ in range(50):
                action = rng.uniform(-1, 1, (2, action_dim)).astype(np.float32)
                step = step_vector(envs, action)
                assert np.all(np.isfinite(step.reward)) and np.all(np.isfinite(step.obs))
                seen.append(step.obs)
            runs.append(np.stack(seen))
        finally:
            envs.close()
    np.testing.assert_array_equal(runs[0], runs[1])  # the same seed, the same episode
    net = load_algorithm("sac").make_network(
        envs.single_observation_space, envs.single_action_space, cfg
    )
    assert net.obs_dim == obs_dim and net.action_dim == action_dim

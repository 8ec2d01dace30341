"""Ape-X's actor core: its Q-values are exactly the network's, follow weights loaded later, and its
actions are ``targets.epsilon_greedy`` of them; the step block's checks on per-step extras."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from apexrl.acting.step_block import StepBlock
from apexrl.algos.apex_dqn import ApexActorCore, MLPQValues, TracedQValues, actor_q_values
from apexrl.config import load_config
from apexrl.envs import VectorStep
from apexrl.math import targets
from apexrl.models import arrays_to_params, build_q_network, params_to_arrays

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "apex_dqn_cartpole.yaml"


def network_q(net: torch.nn.Module, obs: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return net(torch.from_numpy(obs)).q.numpy()


@pytest.mark.parametrize("dueling", [True, False])
@pytest.mark.parametrize("hidden_sizes", [(128, 128), (7,), ()])
def test_mlp_q_values_are_the_networks_bit_for_bit(dueling: bool, hidden_sizes: tuple) -> None:
    torch.manual_seed(0)
    net = build_q_network((4,), 3, hidden_sizes, dueling)
    q_values = actor_q_values(net, "cpu")
    assert isinstance(q_values, MLPQValues)
    rng = np.random.default_rng(0)
    for batch_size in (1, 16, 80, 16):  # a batch size seen before reuses its buffers
        obs = rng.normal(size=(batch_size, 4)).astype(np.float32)
        np.testing.assert_array_equal(q_values(obs), network_q(net, obs))


def test_mlp_q_values_use_weights_loaded_later() -> None:
    torch.manual_seed(0)
    net, other = (build_q_network((4,), 2, (16, 16), True) for _ in range(2))
    q_values = actor_q_values(net, "cpu")
    obs = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    before = q_values(obs).copy()
    arrays_to_params(net, params_to_arrays(other))  # as the actor loads weights: in place
    np.testing.assert_array_equal(q_values(obs), network_q(other, obs))
    assert not np.array_equal(before, q_values(obs))
    for param in net.parameters():  # a copy straight into the tensors' memory (shared memory)
        np.copyto(param.detach().numpy(), 0.5)
    np.testing.assert_array_equal(q_values(obs), network_q(net, obs))


def test_other_networks_are_traced() -> None:
    torch.manual_seed(0)
    net = build_q_network((4, 84, 84), 3, (), True)  # Nature CNN
    q_values = actor_q_values(net, "cpu")
    assert isinstance(q_values, TracedQValues)
    obs = np.random.default_rng(2).integers(0, 255, size=(2, 4, 84, 84)).astype(np.uint8)
    np.testing.assert_allclose(q_values(obs), network_q(net, obs), rtol=1e-6, atol=1e-6)


def test_actions_are_epsilon_greedy_on_the_networks_q_and_q_taken_is_their_q() -> None:
    cfg = load_config(CONFIG)
    torch.manual_seed(0)
    net = build_q_network((4,), 2, cfg.algo.hidden_sizes, cfg.algo.dueling)
    core = ApexActorCore(net, cfg, 0.3, "cpu", np.random.default_rng(7))
    rng, obs_rng = np.random.default_rng(7), np.random.default_rng(8)
    for batch_size in (16, 16, 3):
        obs = obs_rng.normal(size=(batch_size, 4)).astype(np.float32)
        action, extras = core.act(obs)
        q = network_q(net, obs)
        np.testing.assert_array_equal(action, targets.epsilon_greedy(q, 0.3, rng))
        np.testing.assert_array_equal(extras["q_taken"], q[np.arange(batch_size), action])


def one_step(num_envs: int) -> tuple[np.ndarray, np.ndarray, VectorStep]:
    obs = np.zeros((num_envs, 4), np.float32)
    step = VectorStep(obs, obs, np.ones(num_envs, np.float32), *np.zeros((2, num_envs), bool))
    return obs, np.zeros(num_envs, np.int64), step


def test_a_step_block_refuses_extras_other_than_its_first_steps() -> None:
    block = StepBlock(num_steps=4, overlap=1)
    obs, action, step = one_step(2)
    block.add(obs, action, step, {"q_taken": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match="extras"):
        block.add(obs, action, step, {"q": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match="extras"):
        block.add(obs, action, step, {})
    assert block.size == 1


def test_a_step_block_refuses_extras_named_like_a_step_field() -> None:
    obs, action, step = one_step(2)
    with pytest.raises(ValueError, match="reward"):
        StepBlock(num_steps=4, overlap=1).add(obs, action, step, {"reward": np.zeros(2)})

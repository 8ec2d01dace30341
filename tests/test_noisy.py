"""Noisy nets (``apexrl.models.noisy``, factorised Gaussian, Fortunato et al. 2018): the layer's
initialization and its noisy weights against the formula worked with the same draws, the noise
off giving the means, and Ape-X's actors: a training actor's Q-values move with fresh noise at
each step, the evaluation actor's (and ``Policy``'s greedy ones) do not."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from apexrl.models.noisy import NoisyLinear, scaled_noise, set_noise


def test_the_noise_scaling_worked_by_hand() -> None:
    assert scaled_noise(torch.tensor([4.0, -0.25, 0.0])).tolist() == [2.0, -0.5, 0.0]


def test_initialization_follows_the_factorised_recipe() -> None:
    layer = NoisyLinear(16, 3)
    assert torch.all(layer.weight_sigma == 0.5 / 4) and torch.all(layer.bias_sigma == 0.5 / 4)
    assert layer.weight_mu.abs().max() <= 1 / 4 and layer.bias_mu.abs().max() <= 1 / 4
    names = sorted(name for name, _ in layer.named_parameters())
    assert names == ["bias_mu", "bias_sigma", "weight_mu", "weight_sigma"]


def test_a_noisy_forward_is_mu_plus_sigma_times_the_outer_product_of_the_draws() -> None:
    layer = NoisyLinear(5, 3)
    x = torch.randn(2, 5)
    torch.manual_seed(7)
    out = layer(x)
    torch.manual_seed(7)
    eps_in, eps_out = torch.randn(5), torch.randn(3)
    f_in, f_out = eps_in.sign() * eps_in.abs().sqrt(), eps_out.sign() * eps_out.abs().sqrt()
    weight = layer.weight_mu + layer.weight_sigma * f_out[:, None] * f_in[None, :]
    bias = layer.bias_mu + layer.bias_sigma * f_out
    assert torch.allclose(out, x @ weight.T + bias, atol=1e-6)
    assert not torch.allclose(layer(x), out)  # fresh noise at each pass
    set_noise(layer, False)
    assert torch.allclose(layer(x), F.linear(x, layer.weight_mu, layer.bias_mu))
    assert torch.allclose(layer(x), layer(x))


def test_training_actors_explore_by_noise_and_greedy_evaluation_does_not() -> None:
    from apexrl.algos.apex_dqn import ALGORITHM
    from apexrl.config import load_config
    from apexrl.policy import Policy, env_spaces

    cfg = load_config("configs/apex_dqn_cartpole.yaml", ["algo.noisy=true", "actor.epsilon=0"])
    obs_space, action_space = env_spaces(cfg)
    net = ALGORITHM.make_network(obs_space, action_space, cfg)
    assert isinstance(net.advantage_head, NoisyLinear)
    rng = np.random.default_rng(0)
    training = ALGORITHM.actor_core(net, cfg, 0, False, "cpu", rng)
    evaluation = ALGORITHM.actor_core(net, cfg, 0, True, "cpu", rng)
    obs = np.random.default_rng(1).normal(size=(64, 4)).astype(np.float32)
    q_train = [training.act(obs)[1]["q_taken"].copy() for _ in range(3)]
    q_eval = [evaluation.act(obs)[1]["q_taken"].copy() for _ in range(3)]
    assert not np.allclose(q_train[0], q_train[1])
    assert np.array_equal(q_eval[0], q_eval[1]) and np.array_equal(q_eval[0], q_eval[2])
    # one network, two cores: each sets its own noise before it acts
    assert not np.allclose(training.act(obs)[1]["q_taken"], q_train[0])
    policy = Policy(cfg, {k: v.detach().numpy() for k, v in net.state_dict().items()})
    greedy = [policy.compute_actions(obs)[0] for _ in range(3)]
    assert all(np.array_equal(greedy[0], g) for g in greedy[1:])

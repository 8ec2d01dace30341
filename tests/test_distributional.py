"""C51's math (``apexrl.math.distributional``) against numbers worked by hand on the support
-2, -1, 0, 1, 2 (``dz`` = 1): mass split between neighbouring atoms, a terminal window's whole
mass at its clipped reward, a truncated window discounted as any other, atoms clipped at the
support's ends, the cross-entropy, the KL divergence and the means."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from apexrl.math.distributional import (
    categorical_projection,
    cross_entropy,
    kl_divergence,
    mean_values,
    n_step_discount,
    support,
)

ATOMS = support(5, -2.0, 2.0)


def test_the_support_is_evenly_spaced() -> None:
    assert ATOMS.tolist() == [-2.0, -1.0, 0.0, 1.0, 2.0]
    assert support(51, -10, 10)[25].item() == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="num_atoms must be at least 2"):
        support(1, -1, 1)
    with pytest.raises(ValueError, match="v_min must be below v_max"):
        support(5, 1, 1)


def project(probs: list[float], reward: float, discount: float) -> list[float]:
    m = categorical_projection(
        torch.tensor([probs]), torch.tensor([reward]), torch.tensor([discount]), ATOMS
    )
    return m[0].tolist()


def test_mass_between_two_atoms_is_split_by_nearness() -> None:
    # all mass at z = 0, shifted to 0.5 + 0.5 * 0 = 0.5: halfway between atoms 0 and 1
    assert project([0, 0, 1, 0, 0], 0.5, 0.5) == pytest.approx([0, 0, 0.5, 0.5, 0])


def test_a_spread_distribution_worked_by_hand() -> None:
    # Tz = 0.3 + 0.9 z: -1.5, -0.6, 0.3, 1.2, 2.1 (clipped to 2.0); b = 0.5, 1.4, 2.3, 3.2, 4.0
    # atom 0: 0.1 -> 0.05 / 0.05 to atoms 0, 1; atom 1: 0.2 -> 0.12 / 0.08 to atoms 1, 2;
    # atom 2: 0.3 -> 0.21 / 0.09 to 2, 3; atom 3: 0.2 -> 0.16 / 0.04 to 3, 4; atom 4: 0.2 to 4
    m = project([0.1, 0.2, 0.3, 0.2, 0.2], 0.3, 0.9)
    assert m == pytest.approx([0.05, 0.17, 0.29, 0.25, 0.24])
    assert sum(m) == pytest.approx(1.0)


def test_a_terminal_window_puts_all_its_mass_at_its_clipped_reward() -> None:
    spread = [0.1, 0.2, 0.3, 0.2, 0.2]
    assert project(spread, 1.0, 0.0) == pytest.approx([0, 0, 0, 1, 0])  # on an atom: l == u
    assert project(spread, 1.25, 0.0) == pytest.approx([0, 0, 0, 0.75, 0.25])
    assert project(spread, -7.0, 0.0) == pytest.approx([1, 0, 0, 0, 0])  # below v_min
    assert project(spread, 9.0, 0.0) == pytest.approx([0, 0, 0, 0, 1])  # above v_max


def test_atoms_past_the_ends_are_clipped_onto_them() -> None:
    # Tz = 1.5 + z: -0.5, 0.5, 1.5, 2.5 -> 2, 3.5 -> 2; b = 1.5, 2.5, 3.5, 4, 4
    m = project([0.2, 0.2, 0.2, 0.2, 0.2], 1.5, 1.0)
    assert m == pytest.approx([0, 0.1, 0.2, 0.2, 0.5])


def test_truncated_windows_keep_their_discount_and_terminal_ones_lose_it() -> None:
    discount = n_step_discount(
        torch.tensor([2, 2, 3]), torch.tensor([False, True, False]), gamma=0.9
    )
    assert discount.tolist() == pytest.approx([0.81, 0.0, 0.729])
    with pytest.raises(ValueError, match="num_steps must be an integer"):
        n_step_discount(torch.tensor([2.0]), torch.tensor([False]), 0.9)


def test_a_batch_is_projected_row_by_row() -> None:
    probs = torch.tensor([[0, 0, 1, 0, 0], [0.1, 0.2, 0.3, 0.2, 0.2]], dtype=torch.float32)
    m = categorical_projection(probs, torch.tensor([0.5, 0.3]), torch.tensor([0.5, 0.9]), ATOMS)
    assert m[0].tolist() == pytest.approx([0, 0, 0.5, 0.5, 0])
    assert m[1].tolist() == pytest.approx([0.05, 0.17, 0.29, 0.25, 0.24])
    with pytest.raises(ValueError, match=r"next_probs must be \[B, 5\]"):
        categorical_projection(probs[:, :4], torch.zeros(2), torch.zeros(2), ATOMS)


def test_cross_entropy_and_means_worked_by_hand() -> None:
    uniform = torch.zeros(1, 5)
    assert cross_entropy(torch.tensor([[0, 0, 0.5, 0.5, 0]]), uniform).item() == pytest.approx(
        math.log(5)
    )
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.2, 0.2]]))
    target = torch.tensor([[0.5, 0, 0.5, 0, 0]])
    expected = -(0.5 * math.log(0.1) + 0.5 * math.log(0.3))  # 1.753279
    assert cross_entropy(target, logits).item() == pytest.approx(expected)
    # the mean of 0.1, 0.2, 0.3, 0.2, 0.2 on -2..2: -0.2 - 0.2 + 0 + 0.2 + 0.4 = 0.2
    assert mean_values(logits, ATOMS).item() == pytest.approx(0.2)
    assert mean_values(torch.zeros(3, 4, 5), ATOMS).shape == (3, 4)


def test_the_kl_divergence_is_the_cross_entropy_less_the_targets_entropy() -> None:
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.2, 0.2]]))
    target = torch.tensor([[0.5, 0, 0.5, 0, 0]])
    # 0.5 ln(0.5 / 0.1) + 0.5 ln(0.5 / 0.3) = 1.753279 - ln 2 = 1.060132; the zero atoms add 0
    assert kl_divergence(target, logits).item() == pytest.approx(1.060132, abs=1e-6)
    matched = torch.log(torch.tensor([[0.5, 1e-12, 0.5, 1e-12, 1e-12]]))
    assert kl_divergence(target, matched).item() == pytest.approx(0.0, abs=1e-6)
    assert cross_entropy(target, matched).item() == pytest.approx(math.log(2), abs=1e-6)
    one_hot = torch.tensor([[0.0, 0, 1, 0, 0]])  # no entropy: the two measures are one
    assert kl_divergence(one_hot, logits).item() == pytest.approx(-math.log(0.3), rel=1e-6)
    # the same gradient in the logits: the target's entropy is a constant
    grads = []
    for measure in (cross_entropy, kl_divergence):
        leaf = logits.clone().requires_grad_()
        measure(target, leaf).sum().backward()
        grads.append(leaf.grad)
    assert torch.allclose(grads[0], grads[1])


# --- the distributional head and loss of Ape-X DQN ----------------------------------------------


def distributional_cfg(**overrides: object) -> object:
    from apexrl.config import load_config

    sets = [f"algo.{k}={v}" for k, v in {"num_atoms": 5, "v_min": -2, "v_max": 2}.items()]
    sets += [f"algo.{k}={v}" for k, v in overrides.items()]
    return load_config("configs/apex_dqn_cartpole.yaml", sets)


def test_a_distributional_head_gives_logits_per_atom_and_q_as_their_mean() -> None:
    from apexrl.algos.apex_dqn import ALGORITHM, MLPQValues, actor_q_values
    from apexrl.policy import env_spaces

    cfg = distributional_cfg()
    obs_space, action_space = env_spaces(cfg)
    net = ALGORITHM.make_network(obs_space, action_space, cfg)
    out = net(torch.randn(3, 4))
    assert out.logits.shape == (3, 2, 5) and out.q.shape == (3, 2)
    assert torch.allclose(out.q, mean_values(out.logits, ATOMS))
    # dueling over logits: logits = V + A - mean_a A, atom by atom
    features = net.torso(torch.zeros(1, 4))
    advantage = net.advantage_head(features).view(1, 2, 5)
    expected = net.value_head(features).view(1, 1, 5) + advantage - advantage.mean(1, keepdim=True)
    assert torch.allclose(net(torch.zeros(1, 4)).logits, expected)
    assert "atoms" not in net.state_dict()  # rebuilt from the config, never published
    assert not MLPQValues.supports(net)  # the actors' fused scalar path does not apply
    q = actor_q_values(net, "cpu")(np.zeros((3, 4), dtype=np.float32))
    assert q.shape == (3, 2)


def test_the_distributional_loss_is_the_cross_entropy_of_the_projected_target() -> None:
    from apexrl.algos.apex_dqn import ALGORITHM, distributional_loss
    from apexrl.policy import env_spaces

    cfg = distributional_cfg()
    obs_space, action_space = env_spaces(cfg)
    online, target = (ALGORITHM.make_network(obs_space, action_space, cfg) for _ in range(2))
    torch.manual_seed(0)
    batch = {
        "obs": torch.randn(4, 4),
        "action": torch.tensor([0, 1, 1, 0]),
        "reward": torch.tensor([1.0, 0.0, -1.0, 0.5]),
        "num_steps": torch.tensor([3, 3, 1, 2]),
        "terminated": torch.tensor([False, True, False, False]),
        "next_obs": torch.randn(4, 4),
    }
    weights = torch.tensor([1.0, 0.5, 1.0, 2.0])
    out = distributional_loss(online, target, batch, weights, cfg.algo)
    # worked here step by step with the same functions the loss is made of
    with torch.no_grad():
        next_online, next_target = online(batch["next_obs"]), target(batch["next_obs"])
        a_star = next_online.q.argmax(-1)
        probs = torch.softmax(next_target.logits[torch.arange(4), a_star], -1)
        discount = torch.tensor([0.99**3, 0.0, 0.99, 0.99**2])
        m = categorical_projection(probs, batch["reward"], discount, ATOMS)
        logits_sa = online(batch["obs"]).logits[torch.arange(4), batch["action"]]
        ce = -(m * torch.log_softmax(logits_sa, -1)).sum(-1)
    assert out.loss.item() == pytest.approx((weights * ce).mean().item(), rel=1e-5)
    assert out.priorities.numpy() == pytest.approx(ce.double().numpy() + 1e-6, rel=1e-5)
    # Rainbow's priorities: the same loss, the KL divergence (the loss less m's entropy) as p
    by_kl = distributional_loss(
        online, target, batch, weights, distributional_cfg(distributional_priority="kl").algo
    )
    kl = ce + (m * torch.log(m.clamp_min(1e-30))).sum(-1)
    assert by_kl.loss.item() == pytest.approx(out.loss.item(), rel=1e-6)
    assert by_kl.priorities.numpy() == pytest.approx(kl.double().numpy() + 1e-6, rel=1e-4)
    assert (by_kl.priorities < out.priorities).any()
    # the terminal item's target is its reward alone: 0 on the atom 0
    assert m[1].tolist() == pytest.approx([0, 0, 1, 0, 0])
    out.loss.backward()
    assert online.advantage_head.weight.grad.abs().sum() > 0
    assert target.advantage_head.weight.grad is None


def test_a_distributional_actor_sends_cross_entropy_or_kl_priorities() -> None:
    from apexrl.algos.apex_dqn import ALGORITHM

    cfg = distributional_cfg(n_step=2)
    from apexrl.acting.step_block import StepBlock
    from apexrl.envs import make_vector_env, step_vector
    from apexrl.policy import env_spaces

    obs_space, action_space = env_spaces(cfg)
    net = ALGORITHM.make_network(obs_space, action_space, cfg)
    core = ALGORITHM.actor_core(net, cfg, 0, False, "cpu", np.random.default_rng(0))
    envs = make_vector_env(cfg.env, 4)
    obs, _ = envs.reset(seed=0)
    block = StepBlock(core.block_steps, overlap=core.block_overlap)
    while not block.full:
        action, extras = core.act(obs)
        step = step_vector(envs, action)
        block.add(obs, action, step, extras)
        obs = step.obs
    same_block = copy.deepcopy(block)
    fields, priorities = core.items(block)
    envs.close()
    assert priorities.shape == fields["reward"].shape and priorities.dtype == np.float64
    assert (priorities > 0).all() and np.isfinite(priorities).all()
    # algo.distributional_priority kl: the same items, each priority the CE less m's entropy
    kl_cfg = distributional_cfg(n_step=2, distributional_priority="kl")
    kl_core = ALGORITHM.actor_core(net, kl_cfg, 0, False, "cpu", np.random.default_rng(0))
    kl_fields, kl_priorities = kl_core.items(same_block)
    assert kl_fields["reward"].tolist() == fields["reward"].tolist()
    assert (kl_priorities > 0).all() and (kl_priorities <= priorities + 1e-6).all()
    assert (kl_priorities < priorities - 0.05).any()


def test_r2d2_refuses_a_distributional_head_and_says_why() -> None:
    from apexrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="R2D2 has no distributional head"):
        load_config("configs/r2d2_cartpole.yaml", ["algo.num_atoms=51"])
    with pytest.raises(ConfigError, match="needs algo.v_min below algo.v_max"):
        load_config("configs/apex_dqn_cartpole.yaml", ["algo.num_atoms=51", "algo.v_min=20"])
    with pytest.raises(ConfigError, match="distributional_priority must be one of"):
        load_config("configs/apex_dqn_cartpole.yaml", ["algo.distributional_priority=mse"])

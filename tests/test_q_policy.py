"""DDPG, TD3 and SAC: their math against numbers worked by hand, the learner core's update (which
parameters each loss moves, TD3's delay, the temperature's direction, Polyak targets), the actor
core (random until the learner's first update, greedy evaluation, per-actor noise, priorities),
and the config rules of the family."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import run_launcher

from apexrl import Policy
from apexrl.acting.step_block import StepBlock
from apexrl.algos import SampledBatch, load_algorithm
from apexrl.algos.q_policy import QPolicyActorCore, next_action_and_bootstrap
from apexrl.config import ConfigError, load_config
from apexrl.envs import make_vector_env, step_vector
from apexrl.math import continuous_targets as ct
from apexrl.math import targets
from apexrl.models import params_to_arrays
from apexrl.replay import admission

REPO = Path(__file__).resolve().parents[1]
T = torch.tensor


def config(name: str, *overrides: str):
    return load_config(REPO / "configs" / f"{name}_pendulum.yaml", list(overrides))


# --- the math, by hand --------------------------------------------------------------------------


def test_min_q_is_the_elementwise_minimum_and_one_critic_is_itself() -> None:
    assert torch.equal(ct.min_q([T([1.0, 5.0]), T([3.0, 2.0])]), T([1.0, 2.0]))
    assert torch.equal(ct.min_q([T([4.0, -1.0])]), T([4.0, -1.0]))
    with pytest.raises(ValueError, match="same shape"):
        ct.min_q([T([1.0]), T([1.0, 2.0])])


def test_soft_bootstrap_subtracts_alpha_times_the_log_probability() -> None:
    # 2 - 0.5 * (-1) = 2.5; 0 - 0.5 * 3 = -1.5
    assert torch.allclose(ct.soft_bootstrap(T([2.0, 0.0]), T([-1.0, 3.0]), 0.5), T([2.5, -1.5]))


def test_sac_n_step_target_by_hand_only_termination_stops_the_bootstrap() -> None:
    # reward 1 over m = 2 steps, gamma 0.9, soft bootstrap 2.5: 1 + 0.81 * 2.5 = 3.025
    bootstrap = ct.soft_bootstrap(T([2.0, 2.0, 2.0]), T([-1.0, -1.0, -1.0]), 0.5)
    y = targets.n_step_target(
        T([1.0, 1.0, 1.0]),
        T([2, 2, 2]),
        T([False, True, False]),  # the third window was truncated: it still bootstraps
        bootstrap,
        0.9,
    )
    assert torch.allclose(y, T([3.025, 1.0, 3.025]))


def test_smoothed_target_action_clips_the_noise_then_the_action() -> None:
    # 0.9 + 0.3 = 1.2 -> 1; -0.2 + clip(-0.7, -0.5, 0.5) = -0.7; 0 + 0.1 = 0.1
    out = ct.smoothed_target_action(T([[0.9, -0.2, 0.0]]), T([[0.3, -0.7, 0.1]]), 0.5)
    assert torch.allclose(out, T([[1.0, -0.7, 0.1]]))


def test_critic_loss_by_hand() -> None:
    # critic 1: errors 0, -1 -> 0.5 * mean(1 * 0, 0.5 * 1) = 0.125
    # critic 2: errors -1, 1 -> 0.5 * mean(1 * 1, 0.5 * 1) = 0.375
    loss = ct.critic_loss([T([1.0, 2.0]), T([0.0, 4.0])], T([1.0, 3.0]), T([1.0, 0.5]))
    assert math.isclose(float(loss), 0.5, rel_tol=1e-6)
    td = ct.td_errors_mean_abs([T([1.0, 2.0]), T([0.0, 4.0])], T([1.0, 3.0]))
    assert torch.allclose(td, T([0.5, 1.0]))


def test_policy_losses_by_hand() -> None:
    # mean(0.5 * -1 - 3, 0.5 * -2 - 1) = mean(-3.5, -2) = -2.75
    assert math.isclose(float(ct.sac_policy_loss(T([-1.0, -2.0]), T([3.0, 1.0]), 0.5)), -2.75)
    assert math.isclose(float(ct.deterministic_policy_loss(T([3.0, 1.0]))), -2.0)


def test_temperature_falls_when_the_entropy_is_above_its_target_and_rises_below() -> None:
    # log pi = -1, -2 (entropy about 1.5) against a target of -1: loss = -log_alpha * mean(-2, -3)
    # = 2.5 * log_alpha, gradient +2.5: a descent step lowers alpha.
    log_alpha = torch.zeros(1, requires_grad=True)
    ct.temperature_loss(log_alpha, T([-1.0, -2.0]), -1.0).backward()
    assert torch.allclose(log_alpha.grad, T([2.5]))
    log_alpha.grad = None
    # log pi = 3 (entropy -3, below the target -1): gradient -(3 - 1) = -2, alpha rises.
    ct.temperature_loss(log_alpha, T([3.0]), -1.0).backward()
    assert torch.allclose(log_alpha.grad, T([-2.0]))


def test_polyak_average_by_hand() -> None:
    assert torch.allclose(ct.polyak_average(T([0.0, 10.0]), T([10.0, 0.0]), 0.1), T([1.0, 9.0]))
    with pytest.raises(ValueError, match="tau"):
        ct.polyak_average(T([0.0]), T([1.0]), 1.5)


def test_exploration_noise_is_log_spread_over_the_actors() -> None:
    np.testing.assert_allclose(ct.exploration_noise_scales(3, 0.1, 4.0), [0.025, 0.1, 0.4])
    np.testing.assert_allclose(ct.exploration_noise_scales(1, 0.1, 4.0), [0.1])
    np.testing.assert_allclose(ct.exploration_noise_scales(4, 0.2, 1.0), [0.2] * 4)
    with pytest.raises(ValueError, match="spread"):
        ct.exploration_noise_scales(2, 0.1, 0.5)


# --- the learner core ---------------------------------------------------------------------------


def pendulum_batch(cfg, size: int = 32, seed: int = 0) -> SampledBatch:
    """Random n-step transitions in Pendulum's spaces (actions in [-1, 1])."""
    rng = np.random.default_rng(seed)
    fields = {
        "obs": rng.normal(size=(size, 3)).astype(np.float32),
        "action": rng.uniform(-1, 1, size=(size, 1)).astype(np.float32),
        "reward": rng.normal(size=size).astype(np.float32),
        "num_steps": np.ones(size, dtype=np.int64),
        "terminated": rng.random(size) < 0.2,
        "truncated": np.zeros(size, dtype=bool),
        "next_obs": rng.normal(size=(size, 3)).astype(np.float32),
    }
    tensors = {k: torch.from_numpy(v) for k, v in fields.items()}
    return SampledBatch(np.arange(size), tensors, np.full(size, 1.0 / size), size)


def learner(cfg):
    envs = make_vector_env(cfg.env, 1, cfg.unit_actions)
    spaces = envs.single_observation_space, envs.single_action_space
    envs.close()
    core = load_algorithm(cfg.algorithm).learner_core(*spaces, cfg, torch.device("cpu"))
    return core, spaces


def grads(module: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    return {n: (None if p.grad is None else p.grad.clone()) for n, p in module.named_parameters()}


@pytest.mark.parametrize("name", ["sac", "td3", "ddpg"])
def test_the_critics_gradient_is_the_critic_loss_alone(name: str) -> None:
    """The policy's loss flows through the critics' input, never into their parameters: the
    critics' gradients are those of the hand-written critic loss."""
    torch.manual_seed(0)
    cfg = config(name, "algo.hidden_sizes=[8]")
    core, _ = learner(cfg)
    batch = pendulum_batch(cfg)
    result = core.compute_gradients(batch)
    got = grads(core.network.critics)
    assert all(g is not None for g in got.values())
    assert any(
        p.grad is not None and p.grad.abs().sum() > 0 for p in core.network.policy.parameters()
    )
    # The same critic loss, by hand, from the same weights and a generator in the same state.
    fresh, _ = learner(cfg)
    fresh.network.load_state_dict(core.network.state_dict())
    fresh.target.load_state_dict(core.target.state_dict())
    fields = batch.fields
    boot = next_action_and_bootstrap(
        fresh.network, fresh.target, fields["next_obs"], cfg.algo, fresh.generator
    )
    y = targets.n_step_target(
        fields["reward"], fields["num_steps"], fields["terminated"], boot, cfg.algo.gamma
    )
    q = fresh.network.q_values(fields["obs"], fields["action"])
    loss = ct.critic_loss(q, y, torch.ones(len(y)))
    loss.backward()
    want = grads(fresh.network.critics)
    for key in want:
        torch.testing.assert_close(got[key], want[key])
    assert math.isclose(result.metrics["learner/loss"], float(loss.detach()), rel_tol=1e-5)
    assert result.priorities.shape == (len(y),) and np.all(result.priorities > 0)


def test_td3_steps_the_policy_and_the_targets_every_second_update() -> None:
    torch.manual_seed(0)
    cfg = config("td3", "algo.hidden_sizes=[8]")
    core, _ = learner(cfg)
    changed = []
    for i in range(4):
        policy_before = params_to_arrays(core.network.policy)
        target_before = params_to_arrays(core.target)
        critics_before = params_to_arrays(core.network.critics)
        core.update(pendulum_batch(cfg, seed=i))
        policy_after = params_to_arrays(core.network.policy)
        moved = any(not np.array_equal(policy_before[k], policy_after[k]) for k in policy_after)
        target_after = params_to_arrays(core.target)
        target_moved = any(
            not np.array_equal(target_before[k], target_after[k]) for k in target_after
        )
        critics_after = params_to_arrays(core.network.critics)
        assert any(not np.array_equal(critics_before[k], critics_after[k]) for k in critics_after)
        assert moved == target_moved
        changed.append(moved)
    assert changed == [True, False, True, False]
    assert int(core.network.learner_updates) == 4


def test_polyak_targets_move_by_tau() -> None:
    torch.manual_seed(0)
    cfg = config("ddpg", "algo.hidden_sizes=[8]", "algo.tau=0.25")
    core, _ = learner(cfg)
    target_before = {k: v.clone() for k, v in core.target.state_dict().items()}
    core.update(pendulum_batch(cfg))
    online = core.network.state_dict()
    for key, value in core.target.named_parameters():
        want = ct.polyak_average(target_before[key], online[key], 0.25)
        torch.testing.assert_close(value.detach(), want)


def test_sac_temperature_is_learned_toward_the_target_entropy() -> None:
    """A fresh policy on Pendulum (log-std about 0 before tanh) has entropy above -1, so the
    temperature falls from 1; with learn_alpha false it stays."""
    torch.manual_seed(0)
    cfg = config("sac", "algo.hidden_sizes=[8]")
    core, _ = learner(cfg)
    for i in range(20):
        result = core.update(pendulum_batch(cfg, seed=i))
    assert result.metrics["learner/alpha"] < 1.0
    assert core.target_entropy == -1.0
    fixed, _ = learner(config("sac", "algo.hidden_sizes=[8]", "algo.learn_alpha=false"))
    for i in range(3):
        result = fixed.update(pendulum_batch(cfg, seed=i))
    assert result.metrics["learner/alpha"] == 1.0


@pytest.mark.parametrize("name", ["sac", "td3"])
def test_learner_state_round_trips(name: str) -> None:
    torch.manual_seed(0)
    cfg = config(name, "algo.hidden_sizes=[8]")
    core, _ = learner(cfg)
    for i in range(3):
        core.update(pendulum_batch(cfg, seed=i))
    fresh, _ = learner(cfg)
    fresh.load_state_dict(core.state_dict())
    assert fresh.num_updates == 3
    a, b = params_to_arrays(core.network), params_to_arrays(fresh.network)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    # The next update from either is the same.
    core.generator.manual_seed(5)
    fresh.generator.manual_seed(5)
    core.update(pendulum_batch(cfg, seed=9))
    fresh.update(pendulum_batch(cfg, seed=9))
    a, b = params_to_arrays(core.network), params_to_arrays(fresh.network)
    assert all(np.allclose(a[k], b[k]) for k in a)


def test_observation_statistics_are_the_batches_and_reach_the_targets() -> None:
    """``algo.normalize_obs``: the moments of each batch are merged on the next turn (summed over
    the ranks by ``agree``'s total), into the online and the target network alike."""
    torch.manual_seed(0)
    cfg = config("sac", "algo.hidden_sizes=[8]", "algo.normalize_obs=true")
    core, _ = learner(cfg)
    batches = [pendulum_batch(cfg, size=16, seed=i) for i in range(3)]
    for batch in batches:
        core.agree(lambda values: values)
        core.update(batch)
    core.agree(lambda values: values)
    seen = torch.cat([b.fields["obs"] for b in batches]).double()
    norm = core.network.normalizer
    torch.testing.assert_close(norm.mean.double(), seen.mean(0), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norm.var.double(), seen.var(0, unbiased=False), rtol=1e-4, atol=1e-6)
    assert float(norm.count) == 48
    for key, value in core.target.normalizer.state_dict().items():
        torch.testing.assert_close(value, norm.state_dict()[key])
    obs = torch.ones(2, 3)
    want = ((obs - norm.mean) / torch.sqrt(norm.var + norm.eps)).clamp(-10, 10)
    torch.testing.assert_close(core.network.normalized(obs), want)


# --- the actor core -----------------------------------------------------------------------------


def actor(cfg, actor_id: int = 0, evaluate: bool = False):
    envs = make_vector_env(cfg.env, 4, cfg.unit_actions)
    algorithm = load_algorithm(cfg.algorithm)
    net = algorithm.make_network(envs.single_observation_space, envs.single_action_space, cfg)
    core = algorithm.actor_core(net, cfg, actor_id, evaluate, "cpu", np.random.default_rng(0))
    return envs, net, core


@pytest.mark.parametrize("name", ["sac", "td3", "ddpg"])
def test_actions_are_random_until_the_learners_first_update_then_the_policys(name: str) -> None:
    torch.manual_seed(0)
    cfg = config(name, "algo.hidden_sizes=[8]")
    envs, net, core = actor(cfg)
    obs = np.zeros((4, 3), dtype=np.float32)
    first, _ = core.act(obs)
    second, _ = core.act(obs)
    assert first.shape == (4, 1) and first.dtype == np.float32
    assert np.all(np.abs(first) <= 1) and not np.array_equal(first, second)
    assert np.std(np.concatenate([core.act(obs)[0] for _ in range(50)])) > 0.45  # uniform: 0.58
    net.learner_updates.fill_(1)  # weights of a learner that has trained
    acted = np.concatenate([core.act(obs)[0] for _ in range(50)])
    assert np.all(np.abs(acted) <= 1)
    with torch.no_grad():
        policy = net.policy(torch.from_numpy(obs))
        mean = torch.tanh(policy.mean) if name == "sac" else policy
    spread = np.std(acted - mean.numpy()[0])
    assert 0.02 < spread < (1.0 if name == "sac" else 0.2)  # TD3, DDPG: noise 0.1
    _, _, greedy = actor(cfg, evaluate=True)
    greedy.network.load_state_dict(net.state_dict())
    greedy.network.learner_updates.fill_(0)  # an evaluation actor never acts at random
    a, _ = greedy.act(obs)
    np.testing.assert_allclose(a, mean.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(a, greedy.act(obs)[0])
    envs.close()


def test_each_actor_explores_with_its_own_noise() -> None:
    cfg = config("td3", "actor.num_actors=3", "algo.noise_spread=4.0", "algo.exploration_noise=0.1")
    noises = []
    for i in range(3):
        envs, _, core = actor(cfg, actor_id=i)
        envs.close()
        noises.append(core.noise)
    np.testing.assert_allclose(noises, [0.025, 0.1, 0.4])


def test_actor_priorities_are_the_td_errors_of_its_own_networks() -> None:
    """With a prioritized table an actor's initial priority is |y - Q(s, a)|; uniform: ones."""
    torch.manual_seed(0)
    for exponent, prioritized in ((0.6, True), (0.0, False)):
        cfg = config("ddpg", "algo.hidden_sizes=[8]", f"replay.priority_exponent={exponent}")
        envs, net, core = actor(cfg)
        net.learner_updates.fill_(1)
        block = StepBlock(core.block_steps, core.block_overlap)
        obs, _ = envs.reset(seed=0)
        while not block.full:
            action, extras = core.act(obs)
            assert ("q_taken" in extras) == prioritized
            step = step_vector(envs, action)
            block.add(obs, action, step, {**extras, "weights_version": np.zeros(4, np.int64)})
            obs = step.obs
        fields, priorities = core.items(block)
        envs.close()
        if not prioritized:
            np.testing.assert_array_equal(priorities, np.ones(len(fields["reward"])))
            continue
        with torch.no_grad():
            f = {k: torch.from_numpy(v) for k, v in fields.items()}
            q_next = net.critics[0](f["next_obs"], net.policy(f["next_obs"]))
            y = targets.n_step_target(f["reward"], f["num_steps"], f["terminated"], q_next, 0.98)
            q = net.critics[0](f["obs"], f["action"])
        np.testing.assert_allclose(priorities, (y - q).abs().numpy() + 1e-6, rtol=1e-5, atol=1e-6)


def test_an_evaluation_actor_of_a_stochastic_policy_plays_its_mean() -> None:
    cfg = config("sac", "algo.hidden_sizes=[8]")
    _, net, core = actor(cfg, evaluate=True)
    assert isinstance(core, QPolicyActorCore) and core.greedy and not core.random_start


# --- config and admission rules -----------------------------------------------------------------


def test_the_family_acts_in_unit_actions_and_refuses_bf16() -> None:
    for name in ("sac", "td3", "ddpg"):
        assert config(name).unit_actions
        with pytest.raises(ConfigError, match="fp32"):
            config(name, "learner.precision=bf16")
    assert not load_config(REPO / "configs" / "ppo_pendulum.yaml").unit_actions


def test_replay_refuses_actions_outside_the_policys_range() -> None:
    cfg = config("sac")
    spec = cfg.algo.item_spec(*admission.env_spaces(cfg))
    checks = admission.item_value_checks(spec, cfg.algo.item_int_ranges(), ("action",), None, True)
    fields = {
        "obs": np.zeros((2, 3), np.float32),
        "action": np.array([[0.5], [1.5]], np.float32),
        "reward": np.zeros(2, np.float32),
        "num_steps": np.ones(2, np.int64),
        "terminated": np.zeros(2, bool),
        "truncated": np.zeros(2, bool),
        "next_obs": np.zeros((2, 3), np.float32),
    }
    with pytest.raises(ValueError, match=r"outside the policy's \[-1, 1\]"):
        admission.check_item_values(checks, fields)
    fields["action"][1] = -1.0
    admission.check_item_values(checks, fields)


def test_discrete_actions_and_images_are_refused_with_a_clear_error() -> None:
    cfg, sac = config("sac"), load_algorithm("sac")
    flat = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    with pytest.raises(ValueError, match="Box action space"):
        sac.make_network(flat, gym.spaces.Discrete(3), cfg)
    image = gym.spaces.Box(0, 255, (4, 42, 42), np.uint8)
    with pytest.raises(ValueError, match="flat observations"):
        sac.make_network(image, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), cfg)


# --- a launched run -----------------------------------------------------------------------------


def test_a_launched_sac_run_trains_evaluates_and_its_checkpoint_plays(tmp_path: Path) -> None:
    """SAC on Pendulum for 20 s with the launcher a user runs (2 actors, replay, parameter
    server, learner, evaluation actor): it updates, evaluates, checkpoints, stops every role; its
    checkpoint gives ``Policy.compute_actions`` actions inside the env's torque bounds and
    ``apexrl evaluate`` plays it."""
    code, output = run_launcher(
        [
            "--actors",
            "2",
            "--learners",
            "1",
            "--config",
            str(REPO / "configs" / "sac_pendulum.yaml"),
            "--logdir",
            str(tmp_path),
            "--set",
            "run.stop_wall_s=20",
            "--set",
            "run.stop_eval_return=null",
        ],
        300,
    )
    assert code == 0, output[-3000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    last = json.loads((run_dir / "result.json").read_text().splitlines()[-1])
    print(
        f"\nSAC Pendulum 20 s: {last['env_steps']} env steps, {last['learner_updates']} updates, "
        f"eval {last['eval_return_mean']}"
    )
    assert last["done"] is True and last["learner_updates"] > 100
    assert last["env_steps"] > 1000  # past the random start
    assert last["eval_return_mean"] is not None and math.isfinite(last["eval_return_mean"])
    policy = Policy.from_checkpoint(run_dir)
    actions, state = policy.compute_actions(np.zeros((5, 3), np.float32))
    assert state is None and actions.shape == (5, 1)
    assert np.all(np.abs(actions) <= 2.0)  # Pendulum's torque bounds
    explored, _ = policy.compute_actions(np.zeros((5, 3), np.float32), explore=True)
    assert not np.array_equal(explored, actions) and np.all(np.abs(explored) <= 2.0)
    played = subprocess.run(
        [sys.executable, "-m", "apexrl", "evaluate", str(run_dir), "--episodes", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert played.returncode == 0, played.stderr[-2000:]
    assert "return" in played.stdout

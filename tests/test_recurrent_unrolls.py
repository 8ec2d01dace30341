"""Recurrent IMPALA and PPO (``algo.lstm_size`` > 0): the previous inputs by hand, the actor's
state carried across steps and chunks and reset at episode ends, the learner's unroll from a
stored state reproducing the actor's own log-probabilities and values bit for bit (or nearly),
the item schema through a replay server. Learning CartPole without velocities with the launcher:
tests/test_learning.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from apexrl import Policy
from apexrl.acting.step_block import StepBlock
from apexrl.algos import load_algorithm
from apexrl.algos.actor_critic import log_prob_and_entropy, time_major
from apexrl.algos.recurrent_unrolls import (
    RecurrentPolicyActorCore,
    outputs_and_next_values,
    previous_inputs,
    recurrent_outputs,
)
from apexrl.config import ConfigError, load_config
from apexrl.envs import VectorStep, make_vector_env, step_vector
from apexrl.models import LSTMState, RecurrentActorCritic

REPO = Path(__file__).resolve().parents[1]
T = torch.tensor


def test_previous_inputs_by_hand_zero_after_an_episode_end() -> None:
    action = T([[1, 2], [0, 1], [1, 1]])
    reward = T([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    ended = T([[False, True], [False, False], [True, False]])
    prev_action, prev_reward, reset = previous_inputs(
        action, reward, ended, T([2, 0]), T([0.5, 0.0])
    )
    assert prev_action.tolist() == [[2, 0], [1, 0], [0, 1]]
    assert prev_reward.tolist() == [[0.5, 0.0], [1.0, 0.0], [3.0, 4.0]]
    assert reset.tolist() == [[False, False], [False, True], [False, False]]


def test_previous_inputs_of_vector_actions_keep_their_shape() -> None:
    action = T([[[0.5, -0.5]], [[1.0, 1.0]]])  # [T=2, N=1, D=2]
    prev_action, _, reset = previous_inputs(
        action, T([[1.0], [1.0]]), T([[True], [False]]), T([[0.25, 0.25]]), T([2.0])
    )
    assert prev_action.tolist() == [[[0.25, 0.25]], [[0.0, 0.0]]]
    assert reset.tolist() == [[False], [True]]


def test_the_lstm_reads_product_actions_one_hot_per_part_and_box_values_as_they_are() -> None:
    """MultiDiscrete([2, 3]) and Tuple(Discrete(2), Discrete(3), Box(1)) previous actions, by
    hand: a one-hot per Discrete part, then the Box values, then the reward."""
    multi = RecurrentActorCritic((2,), nvec=(2, 3), lstm_size=4, prev_action_reward=True)
    got = multi._previous_inputs(T([[[1, 2], [0, 0]]]), T([[0.5, -1.0]]))  # [T=1, B=2, K=2]
    assert got.tolist() == [[[0, 1, 0, 0, 1, 0.5], [1, 0, 1, 0, 0, -1.0]]]
    hybrid = RecurrentActorCritic(
        (2,), nvec=(2, 3), action_dim=1, lstm_size=4, prev_action_reward=True
    )
    got = hybrid._previous_inputs(T([[[1.0, 2.0, 0.25]]]), T([[3.0]]))  # [T=1, B=1, K+D=3]
    assert got.tolist() == [[[0, 1, 0, 0, 1, 0.25, 3.0]]]
    assert multi.zero_actions(2).dtype == np.int64 and multi.zero_actions(2).shape == (2, 2)
    assert hybrid.zero_actions(2).dtype == np.float32 and hybrid.zero_actions(2).shape == (2, 3)


def test_product_action_heads_mask_each_part_past_its_size() -> None:
    torch.manual_seed(0)
    net = RecurrentActorCritic((2,), nvec=(2, 3), action_dim=1, lstm_size=4)
    out = net(torch.zeros(3, 2, 2), T([[0] * 2] * 3), torch.zeros(3, 2), torch.zeros(3, 2).bool(),
              net.initial_state(2))  # fmt: skip
    logits = out.out.logits
    assert logits.shape == (3, 2, 2, 3) and out.out.mean.shape == (3, 2, 1)
    assert torch.isinf(logits[..., 0, 2]).all() and torch.isfinite(logits[..., 1, :]).all()


def config(name: str, *overrides: str):
    return load_config(REPO / "configs" / name, list(overrides))


def test_the_configs_build_a_recurrent_network_and_its_item_spec() -> None:
    for name in ("ppo_cartpole_masked.yaml", "impala_cartpole_masked.yaml"):
        cfg = config(name)
        envs = make_vector_env(cfg.env, 1)
        spaces = envs.single_observation_space, envs.single_action_space
        envs.close()
        algorithm = load_algorithm(cfg.algorithm)
        net = algorithm.make_network(*spaces, cfg)
        assert isinstance(net, RecurrentActorCritic) and net.lstm_size == 64
        spec = cfg.algo.item_spec(*spaces)
        assert spec["recurrent_state"] == (np.dtype(np.float32), (2, 128))  # policy, critic
        shared = config(name, "algo.shared_lstm=true")
        assert shared.algo.item_spec(*spaces)["recurrent_state"][1] == (2, 64)
        assert algorithm.make_network(*spaces, shared).state_size == 64
        assert spec["prev_action"] == (np.dtype(np.int64), ())
        assert spec["prev_reward"] == (np.dtype(np.float32), ())
        assert cfg.algo.ACTION_FIELDS == ("action", "prev_action")
        flat = config(name, "algo.lstm_size=0", "algo.prev_action_reward=false")
        assert "recurrent_state" not in flat.algo.item_spec(*spaces)
        assert not isinstance(algorithm.make_network(*spaces, flat), RecurrentActorCritic)


@pytest.mark.parametrize(
    "overrides, words",
    [
        (("algo.lstm_size=-1",), "lstm_size must be >= 0"),
        (("algo.lstm_size=0",), "prev_action_reward needs an LSTM"),
        (("algo.normalize_obs=true",), "normalize_obs is not supported"),
    ],
)
def test_memory_settings_that_cannot_work_are_refused(overrides, words) -> None:
    with pytest.raises(ConfigError, match=words):
        config("ppo_cartpole_masked.yaml", *overrides)


def make_core(name: str, num_envs: int = 4, seed: int = 0, *overrides: str):
    cfg = config(name, *overrides)
    envs = make_vector_env(cfg.env, num_envs)
    algorithm = load_algorithm(cfg.algorithm)
    torch.manual_seed(seed)
    net = algorithm.make_network(envs.single_observation_space, envs.single_action_space, cfg)
    core = algorithm.actor_core(net, cfg, 0, False, "cpu", np.random.default_rng(seed))
    return cfg, envs, net, core


def collect_unrolls(core, envs, num_blocks: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Step the envs with the core as an actor does, one unroll per env per block."""
    block = StepBlock(core.block_steps, core.block_overlap)
    obs, _ = envs.reset(seed=seed)
    chunks = []
    while len(chunks) < num_blocks:
        action, extras = core.act(obs)
        step = step_vector(envs, action)
        core.observe(action, step)
        block.add(obs, action, step, {**extras, "weights_version": np.zeros(len(obs), np.int64)})
        if block.full:
            fields, _ = core.items(block)
            block.keep_overlap()
            chunks.append(fields)
        obs = step.obs
    return chunks


LSTM = ("algo.lstm_size=16", "algo.prev_action_reward=true")


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("ppo_cartpole_masked.yaml", ()),
        ("impala_cartpole_masked.yaml", ()),
        ("ppo_remember_cue.yaml", ()),  # a Dict observation
        ("ppo_image_and_vector.yaml", LSTM),  # a Dict observation, a MultiDiscrete action
        ("ppo_hybrid_target.yaml", LSTM),  # a Tuple(Discrete, Box) action
    ],
    ids=["ppo", "impala", "dict-obs", "multidiscrete", "tuple-action"],
)
def test_the_learners_unroll_reproduces_what_the_actor_computed(name: str, overrides) -> None:
    """Unrolled from each unroll's stored state, with the previous inputs the unroll implies,
    the network gives the behaviour log-probabilities and values the actor stored, across
    episode ends inside unrolls and across chunks (the state carried); and the next values
    match a step-by-step replay of the actor."""
    cfg, envs, net, core = make_core(name, 4, 0, *overrides)
    assert isinstance(core, RecurrentPolicyActorCore)
    chunks = collect_unrolls(core, envs, 6)
    envs.close()
    fields = {k: torch.as_tensor(np.concatenate([c[k] for c in chunks])) for k in chunks[0]}
    ended = fields["terminated"] | fields["truncated"]
    assert ended[:, :-1].any(), "no episode ended inside an unroll"
    f = time_major(fields)
    with torch.no_grad():
        out, v_next = outputs_and_next_values(net, f)
        logp, _ = log_prob_and_entropy(out, f["action"])
    np.testing.assert_allclose(logp.numpy(), f["behaviour_logp"].numpy(), atol=1e-5)
    np.testing.assert_allclose(out.value.numpy(), f["value"].numpy(), atol=1e-5)
    # The next values: where the episode goes on, the next step's value; elsewhere V of the
    # final observation from the state after the step. Check both kinds against the actor's.
    goes_on = ~ended[:, :-1].T
    np.testing.assert_allclose(
        v_next[:-1].numpy()[goes_on.numpy()], f["value"][1:].numpy()[goes_on.numpy()], atol=1e-5
    )
    # An unroll that goes on from the previous chunk's: its stored state is what the network
    # reaches from the previous one's (6 chunks of 4 envs: chunk k's env i follows chunk k-1's).
    first, second = chunks[0], chunks[1]
    with torch.no_grad():
        unrolled = recurrent_outputs(
            net, time_major({k: torch.as_tensor(v) for k, v in first.items()})
        )
    reached = torch.stack([unrolled.states.h[-1], unrolled.states.c[-1]], 1).numpy()
    env_ended = first["terminated"][:, -1] | first["truncated"][:, -1]
    for i in range(len(env_ended)):
        if env_ended[i]:
            assert np.abs(second["recurrent_state"][i]).sum() == 0
            assert np.all(second["prev_action"][i] == 0) and second["prev_reward"][i] == 0
        else:
            np.testing.assert_allclose(second["recurrent_state"][i], reached[i], atol=1e-6)
            np.testing.assert_array_equal(second["prev_action"][i], first["action"][i, -1])
            assert second["prev_reward"][i] == first["reward"][i, -1]


def test_the_critics_lstm_is_its_own_and_the_policy_does_not_depend_on_it() -> None:
    """With a critic LSTM (the default), the state is ``[policy H | critic H]``: changing the
    critic's half moves the value only, the policy's half moves the policy; with a shared LSTM
    one state feeds both."""
    torch.manual_seed(0)
    net = RecurrentActorCritic((2,), num_actions=2, lstm_size=4, prev_action_reward=True)
    obs, prev_action, prev_reward = torch.randn(3, 1, 2), T([[1], [0], [1]]), torch.ones(3, 1)
    reset = torch.zeros(3, 1, dtype=torch.bool)
    state = net.initial_state(1)
    assert state.h.shape == (1, 8)
    base = net(obs, prev_action, prev_reward, reset, state)
    critic_half = LSTMState(state.h.clone(), state.c.clone())
    critic_half.h[:, 4:] = 0.5
    moved = net(obs, prev_action, prev_reward, reset, critic_half)
    assert torch.equal(moved.out.logits, base.out.logits)
    assert not torch.allclose(moved.out.value, base.out.value)
    policy_half = LSTMState(state.h.clone(), state.c.clone())
    policy_half.h[:, :4] = 0.5
    moved = net(obs, prev_action, prev_reward, reset, policy_half)
    assert torch.equal(moved.out.value, base.out.value)
    assert not torch.allclose(moved.out.logits, base.out.logits)
    shared = RecurrentActorCritic((2,), num_actions=2, lstm_size=4, shared_lstm=True)
    assert shared.initial_state(1).h.shape == (1, 4) and not hasattr(shared, "value_lstm")


def test_the_actor_resets_each_envs_state_where_its_episode_ended() -> None:
    _, envs, _, core = make_core("impala_cartpole_masked.yaml", num_envs=2)
    envs.close()
    obs = np.array([[0.1, 0.02], [-0.1, 0.03]], dtype=np.float32)
    for _ in range(3):
        action, _ = core.act(obs)
        core.observe(action, VectorStep(obs, obs, np.ones(2, np.float32), *np.zeros((2, 2), bool)))
    assert core.state.h.abs().sum(1).min() > 0 and core.prev_reward.tolist() == [1.0, 1.0]
    h_before = core.state.h[1].clone()
    action, _ = core.act(obs)
    ended = VectorStep(obs, obs, np.ones(2, np.float32), np.array([True, False]), np.zeros(2, bool))
    core.observe(action, ended)
    assert core.state.h[0].abs().sum() == 0 and core.state.c[0].abs().sum() == 0
    assert core.prev_action[0] == 0 and core.prev_reward[0] == 0.0
    assert not torch.equal(core.state.h[1], h_before)
    _, extras = core.act(obs)
    assert np.abs(extras["recurrent_state"][0]).sum() == 0


def test_a_recurrent_ppo_learner_trains_on_whole_unrolls() -> None:
    """A rollout of 8 unrolls in 4 minibatches: each gradient step sees 2 whole unrolls
    ``[T, 2]``, and the loss falls over the epochs on a fixed rollout."""
    cfg, envs, net, core = make_core("ppo_cartpole_masked.yaml", num_envs=8)
    (fields,) = collect_unrolls(core, envs, 1)
    envs.close()
    algorithm = load_algorithm("ppo")
    spaces = envs.single_observation_space, envs.single_action_space
    learner = algorithm.learner_core(*spaces, cfg, torch.device("cpu"))
    learner.network.load_state_dict(net.state_dict())
    learner.rollout_items = 8
    from apexrl.algos import SampledBatch

    batch = {k: torch.as_tensor(v) for k, v in fields.items()}
    learner.compute_gradients(SampledBatch(np.arange(8), batch, np.full(8, 1 / 8), 8))
    learner.agree(lambda values: values)
    assert learner.steps_left == cfg.algo.epochs * cfg.algo.num_minibatches
    assert learner.rollout["obs"].shape[:2] == (cfg.algo.unroll_length, 8)
    assert [len(i) for i in learner.minibatches[:4]] == [2, 2, 2, 2]
    losses = []
    while learner.steps_left:
        result = learner.compute_gradients(None)
        losses.append(result.metrics["learner/pg_loss"])
        learner.apply_gradients()
    assert learner.num_updates == 1
    assert np.mean(losses[-4:]) < np.mean(losses[:4])


def test_policy_compute_actions_carries_the_state_of_a_recurrent_ppo(tmp_path: Path) -> None:
    cfg, envs, net, _ = make_core("ppo_cartpole_masked.yaml", num_envs=1)
    envs.close()
    from apexrl.models import params_to_arrays

    policy = Policy(cfg, params_to_arrays(net))
    assert policy.recurrent
    obs = np.array([[0.0, 0.01], [0.02, -0.01]], np.float32)
    actions, state = policy.compute_actions(obs)
    assert actions.shape == (2,) and state.h.shape == (2, 128) and state.prev_action.shape == (2,)
    again, later = policy.compute_actions(obs, state, prev_reward=np.ones(2, np.float32))
    assert not np.array_equal(later.h, state.h)
    _, fresh = policy.compute_actions(obs, later, episode_start=np.array([True, True]))
    np.testing.assert_allclose(fresh.h, state.h, atol=1e-6)  # zeroed: as from the start

"""Dict and Tuple observations, MultiDiscrete and Tuple actions (apexrl.envs.packing, envs.nested,
models.packed): the packed layout, the wire and replay round trip, the product distributions
against numbers worked by hand, hostile nested chunks refused, Policy.compute_actions."""

from __future__ import annotations

import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from test_hostile_replay import ACTOR, actor_chunks

from apexrl.algos import load_algorithm
from apexrl.algos.actor_critic import log_prob_and_entropy
from apexrl.config import load_config
from apexrl.envs import EnvError, check_env, make_vector_env
from apexrl.envs.nested import HybridActions, PackedBox, ProductDiscrete
from apexrl.envs.packing import ActionLayout, PackedLayout
from apexrl.math.distributions import (
    hybrid_log_prob_and_entropy,
    product_categorical_entropy,
    product_categorical_log_prob,
)
from apexrl.models import RecurrentActorCritic
from apexrl.models.packed import (
    HybridOutput,
    PackedTorso,
    ProductActorCritic,
    mask_past_parts,
    parts_mask,
)
from apexrl.policy import Policy
from apexrl.replay.service import ReplayService
from apexrl.transport.messages import InsertAck, SampleBatch, SampleRequest

REPO = Path(__file__).resolve().parents[1]
DICT_SPACE = gym.spaces.Dict(
    {
        "image": gym.spaces.Box(0, 255, (2, 3, 3), np.uint8),
        "joints": gym.spaces.Box(-1.0, 1.0, (3,), np.float64),
        "flag": gym.spaces.Box(0, 1, (1,), np.int8),
    }
)


def config(name: str, *overrides: str):
    return load_config(REPO / "configs" / name, list(overrides))


# --- the layout ----------------------------------------------------------------------------------


def test_a_dict_observation_packs_into_aligned_byte_rows_and_back_exactly() -> None:
    layout = PackedLayout.from_space(DICT_SPACE)
    parts = {p.key: p for p in layout.parts}
    # widest first: joints (3 float32 = 12 bytes) at 0, then the one-byte parts in the space's
    # order (gymnasium sorts a Dict's keys): flag (1 byte) at 12, image (18 bytes) at 13
    assert list(DICT_SPACE.spaces) == ["flag", "image", "joints"]
    assert (parts["joints"].offset, parts["flag"].offset, parts["image"].offset) == (0, 12, 13)
    assert parts["joints"].dtype == np.float32  # float64 parts are stored as float32
    assert layout.nbytes == 32  # 31 bytes padded to a multiple of 8
    rng = np.random.default_rng(0)
    obs = {
        "image": rng.integers(0, 256, (4, 2, 3, 3)).astype(np.uint8),
        "joints": rng.uniform(-1, 1, (4, 3)).astype(np.float32),
        "flag": rng.integers(0, 2, (4, 1)).astype(np.int8),
    }
    rows = layout.pack(obs)
    assert rows.dtype == np.uint8 and rows.shape == (4, 32)
    np.testing.assert_array_equal(rows[:, 13:31], obs["image"].reshape(4, -1))  # pixels stay bytes
    back = layout.unpack(rows)
    for key, value in obs.items():
        np.testing.assert_array_equal(back[key], value)
    one = layout.pack({k: v[0] for k, v in obs.items()})
    np.testing.assert_array_equal(one, rows[0])


def test_a_tuple_observation_and_bad_ones() -> None:
    space = gym.spaces.Tuple((gym.spaces.Box(0, 1, (2,)), gym.spaces.Box(0, 255, (4, 4), np.uint8)))
    layout = PackedLayout.from_space(space)
    obs = (np.array([0.25, 0.5], np.float32), np.arange(16, dtype=np.uint8).reshape(4, 4))
    parts = layout.nested(layout.pack(obs))
    assert isinstance(parts, tuple)
    np.testing.assert_array_equal(parts[1], obs[1])
    with pytest.raises(ValueError, match="given 1 parts"):
        layout.pack(obs[:1])
    with pytest.raises(ValueError, match="has shape"):
        layout.pack((obs[0][:1], obs[1]))
    with pytest.raises(ValueError, match="Box parts only"):
        PackedLayout.from_space(gym.spaces.Dict({"a": gym.spaces.Discrete(3)}))
    with pytest.raises(ValueError, match="differ from"):
        PackedLayout.from_space(DICT_SPACE).pack({"image": np.zeros((2, 3, 3), np.uint8)})


def test_a_hybrid_action_row_maps_onto_the_env_action() -> None:
    space = gym.spaces.Dict(
        {
            "move": gym.spaces.Discrete(4),
            "force": gym.spaces.Box(-2.0, 2.0, (2,), np.float32),
            "fire": gym.spaces.Discrete(2),
        }
    )
    layout = ActionLayout.from_space(space)
    # the space's order (gymnasium sorts a Dict's keys): fire, force, move; indices first
    assert layout.discrete_keys == ("fire", "move") and layout.nvec == (2, 4)
    assert layout.box_dim == 2 and layout.width == 4
    action = layout.nested(np.array([1.0, 3.0, 0.5, -7.0], np.float32))
    assert list(action) == ["fire", "force", "move"]
    assert action["move"] == 3 and action["fire"] == 1
    np.testing.assert_allclose(action["force"], [0.5, -2.0])  # clipped to the bounds
    unit = layout.nested(np.array([0.0, 0.0, 1.0, 0.0], np.float32), unit=True)
    np.testing.assert_allclose(unit["force"], [2.0, 0.0])  # [-1, 1] onto [-2, 2]
    with pytest.raises(ValueError, match="mixes Discrete and Box"):
        ActionLayout.from_space(gym.spaces.Tuple((gym.spaces.Discrete(2),)))


def test_a_small_multidiscrete_is_the_product_discrete_for_q_learners() -> None:
    cfg = config("apex_dqn_image_and_vector.yaml")
    envs = make_vector_env(cfg.env, 2, cfg.unit_actions, cfg.product_discrete)
    assert envs.single_action_space == gym.spaces.Discrete(9)
    assert isinstance(envs.single_observation_space, PackedBox)
    envs.close()
    env = ProductDiscrete(gym.make("apexrl/ImageAndVector-v0"))
    np.testing.assert_array_equal(env.action(7), [2, 1])  # 7 = 2 * 3 + 1
    big = gym.make("apexrl/ImageAndVector-v0")
    big.action_space = gym.spaces.MultiDiscrete([32, 32])
    with pytest.raises(ValueError, match="1024 joint actions"):
        ProductDiscrete(big)


def test_algorithms_refuse_what_they_cannot_act_in_at_start() -> None:
    with pytest.raises(EnvError, match="needs a Discrete action space"):
        check_env(config("apex_dqn_cartpole.yaml", "env.id=apexrl/HybridTarget-v0"))
    with pytest.raises(EnvError, match="needs a Box action space"):
        check_env(config("sac_pendulum.yaml", "env.id=apexrl/HybridTarget-v0"))
    r2d2 = config("r2d2_cartpole.yaml", "env.id=apexrl/ImageAndVector-v0")
    envs = make_vector_env(r2d2.env, 1, r2d2.unit_actions, r2d2.product_discrete)
    with pytest.raises(ValueError, match="R2D2 does not take Dict"):
        load_algorithm("r2d2").make_network(
            envs.single_observation_space, envs.single_action_space, r2d2
        )
    envs.close()
    recurrent = config("ppo_image_and_vector.yaml", "algo.lstm_size=8")
    envs = make_vector_env(recurrent.env, 1)
    with pytest.raises(ValueError, match="an actor-critic cannot act in"):
        load_algorithm("ppo").make_network(
            envs.single_observation_space, gym.spaces.Box(-1, 1, (2, 2), np.float32), recurrent
        )
    envs.close()


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("ppo_remember_cue.yaml", []),
        ("impala_cartpole_masked.yaml", ["env.id=apexrl/RememberCue-v0"]),
    ],
    ids=["ppo", "impala"],
)
def test_a_dict_observation_gets_an_lstm_over_a_torso_per_part(name: str, overrides) -> None:
    """``algo.lstm_size`` with a Dict observation and a Discrete action: the policy's and the
    value's torsos each read the packed rows part by part (a CNN for the image, an MLP for the
    vector), and the unroll's outputs depend on an earlier step's image through the LSTM."""
    cfg = config(name, *overrides)
    envs = make_vector_env(cfg.env, 2)
    obs_space = envs.single_observation_space
    assert isinstance(obs_space, PackedBox)
    torch.manual_seed(0)
    net = load_algorithm(cfg.algorithm).make_network(obs_space, envs.single_action_space, cfg)
    assert isinstance(net, RecurrentActorCritic) and net.packed
    for torso in (net.torso, net.value_torso):
        assert isinstance(torso, PackedTorso) and len(torso.image_torsos) == 1
        assert torso.mlp is not None
    rows, _ = envs.reset(seed=0)
    envs.close()
    steps = torch.as_tensor(np.stack([rows, rows, rows]))  # [T=3, B=2, nbytes] uint8
    assert steps.dtype == torch.uint8
    zeros = torch.zeros(3, 2)
    args = (zeros.long(), zeros, zeros.bool(), net.initial_state(2))
    out = net(steps, *args)
    assert out.out.logits.shape == (3, 2, 3) and out.out.value.shape == (3, 2)
    other = steps.clone()
    other[0] = torch.as_tensor(obs_space.layout.pack(
        {"image": np.zeros((2, 1, 8, 8), np.uint8), "vector": np.zeros((2, 2), np.float32)}
    ))  # fmt: skip
    changed = net(other, *args)
    # Step 0's image reaches the later steps through the LSTM's state.
    assert not torch.allclose(changed.out.logits[2], out.out.logits[2])


# --- the product distributions, by hand -------------------------------------------------------


def test_product_categorical_log_prob_and_entropy_by_hand() -> None:
    # part 0: 3 actions, logits log(1), log(2), log(1) -> p = 1/4, 1/2, 1/4
    # part 1: 2 actions (the third padded with -inf), equal logits -> p = 1/2, 1/2
    logits = torch.tensor([[[0.0, math.log(2.0), 0.0], [5.0, 5.0, float("-inf")]]])
    action = torch.tensor([[1, 0]])
    logp = product_categorical_log_prob(logits, action)
    torch.testing.assert_close(logp, torch.tensor([math.log(0.5) + math.log(0.5)]))
    entropy = product_categorical_entropy(logits)
    h0 = -(2 * 0.25 * math.log(0.25) + 0.5 * math.log(0.5))  # 1.0397
    h1 = math.log(2.0)
    torch.testing.assert_close(entropy, torch.tensor([h0 + h1]))


def test_hybrid_log_prob_and_entropy_by_hand() -> None:
    logits = torch.tensor([[[0.0, 0.0]]])  # one Discrete part of 2: p = 1/2
    mean, log_std = torch.tensor([[1.0]]), torch.tensor([[0.0]])
    action = torch.tensor([[1.0, 2.0]])  # index 1, value 2: z = 1
    logp, entropy = hybrid_log_prob_and_entropy(logits, mean, log_std, action)
    expected = math.log(0.5) + (-0.5 - 0.5 * math.log(2 * math.pi))
    torch.testing.assert_close(logp, torch.tensor([expected]))
    torch.testing.assert_close(
        entropy, torch.tensor([math.log(2.0) + 0.5 + 0.5 * math.log(2 * math.pi)])
    )
    out = HybridOutput(logits, mean, log_std, torch.zeros(1))
    torch.testing.assert_close(log_prob_and_entropy(out, action)[0], logp)


def test_the_product_network_masks_padded_logits_and_keeps_leading_dims() -> None:
    torso = torch.nn.Sequential(torch.nn.Linear(4, 8))
    torso.out_features = 8
    net = ProductActorCritic((4,), torso, nvec=(2, 3))
    out = net(torch.zeros(5, 7, 4))
    assert out.logits.shape == (5, 7, 2, 3) and out.value.shape == (5, 7)
    assert torch.isinf(out.logits[..., 0, 2]).all() and torch.isfinite(out.logits[..., 1, :]).all()
    logp, entropy = log_prob_and_entropy(out, torch.zeros(5, 7, 2, dtype=torch.long))
    assert logp.shape == entropy.shape == (5, 7)
    torch.testing.assert_close(
        entropy, torch.full((5, 7), math.log(2) + math.log(3)), atol=0.01, rtol=0
    )


# --- actor -> wire -> replay -> batch -----------------------------------------------------------

NESTED_CORES = {
    "ppo-dict-multidiscrete": ("ppo_image_and_vector.yaml", ["algo.unroll_length=5"]),
    "impala-dict-multidiscrete": ("impala_image_and_vector.yaml", ["algo.unroll_length=5"]),
    "ppo-tuple-action": ("ppo_hybrid_target.yaml", ["algo.unroll_length=5"]),
    "apex-dict-product": ("apex_dqn_image_and_vector.yaml", ["actor.chunk_steps=8"]),
}


def _service(name: str):
    config_file, overrides = NESTED_CORES[name]
    cfg = config(
        config_file,
        *overrides,
        "env.num_envs=3",
        "actor.num_actors=1",
        "replay.capacity=2000",
        "replay.samples_per_insert=0",
        "replay.min_size_to_sample=1",
        "replay.kind=fifo" if "apex" not in name else "replay.kind=prioritized",
    )
    return cfg, ReplayService(cfg)


@pytest.mark.parametrize("name", list(NESTED_CORES))
def test_nested_chunks_go_through_the_wire_and_replay_exactly(name: str) -> None:
    cfg, service = _service(name)
    chunks = actor_chunks(cfg, num_vector_steps=20)
    assert chunks
    sent = {}
    for chunk in chunks:
        layout = {key: (value.dtype, value.shape[1:]) for key, value in chunk.fields.items()}
        assert layout == service.item_spec
        replies = service.handle(ACTOR, chunk) + service.drain()
        assert isinstance(replies[0].message, InsertAck), replies
        for i, key in enumerate(range(len(sent), len(sent) + len(chunk.priorities))):
            sent[key] = {f: v[i] for f, v in chunk.fields.items()}
    assert service.rejected_messages == 0
    replies = service.handle(b"learner", SampleRequest(cfg.replay.table, 4)) + service.drain()
    batch = replies[0].message
    assert isinstance(batch, SampleBatch)
    for row, key in enumerate(batch.keys):
        for field, value in sent[int(key)].items():
            np.testing.assert_array_equal(batch.fields[field][row], value, err_msg=field)
    obs_space = make_vector_env(cfg.env, 1, cfg.unit_actions, cfg.product_discrete)
    space = obs_space.single_observation_space
    obs_space.close()
    if isinstance(space, PackedBox):  # the learner's view of the image part: the actor's pixels
        parts = space.layout.unpack(batch.fields["obs"])
        assert parts["image"].dtype == np.uint8 and parts["image"].shape[-3:] == (1, 8, 8)
        assert set(np.unique(parts["image"])) - set(range(60)) == {255}


def _refused(service: ReplayService, chunk) -> bool:
    before = service.rejected_messages
    service.handle(ACTOR, chunk)
    service.drain()
    return service.rejected_messages == before + 1


def test_hostile_nested_chunks_are_refused_and_change_nothing() -> None:
    cfg, service = _service("ppo-dict-multidiscrete")
    (chunk, *_rest) = actor_chunks(cfg, num_vector_steps=10)
    space = PackedBox(gym.make("apexrl/ImageAndVector-v0").unwrapped.observation_space)
    vector = next(p for p in space.layout.parts if p.key == "vector")

    def with_field(name: str, array: np.ndarray):
        return type(chunk)(**{**vars(chunk), "fields": {**chunk.fields, name: array}})

    nan_obs = chunk.fields["obs"].copy()
    nan_obs[0, 0, vector.offset : vector.offset + 4] = np.frombuffer(
        np.float32("nan").tobytes(), np.uint8
    )
    wrong_action = chunk.fields["action"].copy()
    wrong_action[0, 0, 1] = 3  # part 1 has 3 actions: 0..2
    negative = chunk.fields["action"].copy()
    negative[1, 2, 0] = -1
    for hostile in (
        with_field("obs", nan_obs),
        with_field("next_obs", nan_obs),
        with_field("action", wrong_action),
        with_field("action", negative),
    ):
        assert _refused(service, hostile)
    assert service.table.size == 0
    assert isinstance((service.handle(ACTOR, chunk) + service.drain())[0].message, InsertAck)

    cfg, service = _service("ppo-tuple-action")
    (chunk, *_rest) = actor_chunks(cfg, num_vector_steps=10)
    half = chunk.fields["action"].copy()
    half[0, 0, 0] = 0.5  # a Discrete index that is not a whole number
    beyond = chunk.fields["action"].copy()
    beyond[0, 0, 0] = 3.0
    for action in (half, beyond):
        assert _refused(service, with_field("action", action))
    assert service.table.size == 0


def test_policy_compute_actions_takes_dict_observations_and_gives_nested_actions() -> None:
    policy = Policy(config("ppo_image_and_vector.yaml"))
    env = gym.make("apexrl/ImageAndVector-v0")
    obs, _ = env.reset(seed=0)
    batch = {key: np.stack([value, value]) for key, value in obs.items()}
    actions, state = policy.compute_actions(batch)
    assert state is None and actions.shape == (2, 2) and actions.dtype == np.int64
    env.step(actions[0])
    with pytest.raises(ValueError, match="differ from"):
        policy.compute_actions({"image": batch["image"]})

    hybrid = Policy(config("ppo_hybrid_target.yaml"))
    assert isinstance(hybrid.action_space, HybridActions)
    env = gym.make("apexrl/HybridTarget-v0")
    obs, _ = env.reset(seed=0)
    actions, _ = hybrid.compute_actions(obs[None], explore=True)
    (action,) = actions
    assert isinstance(action, tuple) and env.action_space.contains(
        (action[0], action[1].astype(np.float32))
    )
    env.step(action)

    apex = Policy(config("apex_dqn_image_and_vector.yaml"))
    actions, _ = apex.compute_actions(batch)
    assert actions.shape == (2, 2) and ((0 <= actions) & (actions < 3)).all()

    multi = Policy(config("ppo_image_and_vector.yaml", "algo.lstm_size=8"))
    actions, state = multi.compute_actions(batch)
    assert actions.shape == (2, 2) and actions.dtype == np.int64
    assert state.prev_action.shape == (2, 2) and state.prev_action.dtype == np.int64
    _, later = multi.compute_actions(batch, state, prev_reward=np.ones(2, np.float32))
    assert not np.array_equal(later.h, state.h)

    recurrent = Policy(config("ppo_remember_cue.yaml"))
    env = gym.make("apexrl/RememberCue-v0")
    obs, _ = env.reset(seed=0)
    batch = {key: np.stack([value, value]) for key, value in obs.items()}
    actions, state = recurrent.compute_actions(batch)
    assert actions.shape == (2,) and state is not None and state.h.shape[0] == 2
    obs, reward, *_ = env.step(actions[0])
    batch = {key: np.stack([value, value]) for key, value in obs.items()}
    _, later = recurrent.compute_actions(batch, state, prev_reward=np.full(2, reward, np.float32))
    assert not np.array_equal(later.h, state.h)


@pytest.mark.parametrize(
    "name", ["ppo_image_and_vector.yaml", "ppo_hybrid_target.yaml", "ppo_remember_cue.yaml"]
)
def test_policy_evaluate_plays_whole_episodes_of_nested_envs(name: str) -> None:
    result = Policy(config(name)).evaluate(episodes=4, num_envs=2, seed=0)
    assert len(result["returns"]) == 4 and all(0.0 <= r <= 10.0 for r in result["returns"])
    assert result["length"]["mean"] == 10


def test_each_discrete_part_is_masked_past_its_size() -> None:
    mask = parts_mask((3, 1, 2))
    assert mask.tolist() == [[True, True, True], [True, False, False], [True, True, False]]
    logits = torch.arange(9.0).view(3, 3)
    masked = mask_past_parts(logits, mask)
    inf = float("-inf")
    assert masked.tolist() == [[0.0, 1.0, 2.0], [3.0, inf, inf], [6.0, 7.0, inf]]
    assert torch.softmax(masked, -1)[1].tolist() == [1.0, 0.0, 0.0]


def test_image_and_vector_grows_harder_with_more_rows_and_pixels() -> None:
    env = gym.make("apexrl/ImageAndVector-v0", rows=8, side=16).unwrapped
    obs, _ = env.reset(seed=3)
    assert obs["image"].shape == (1, 16, 16) and obs["vector"].shape == (8,)
    assert list(env.action_space.nvec) == [8, 8]
    row, item = env.answer
    bright = (obs["image"][0] == 255).all(axis=1)  # the bright band: 16 // 8 = 2 pixel rows
    assert bright.nonzero()[0].tolist() == [2 * row, 2 * row + 1]
    assert int(np.argmax(obs["vector"])) == item
    _, reward, *_ = env.step(np.array([row, item]))
    assert reward == 1.0
    _, reward, *_ = env.step(np.array([(env.answer[0] + 1) % 8, env.answer[1]]))
    assert reward == 0.5
    with pytest.raises(ValueError, match="rows must be within 2..side"):
        gym.make("apexrl/ImageAndVector-v0", rows=9, side=8)

"""Legal-action masks (``algo.action_mask``; turn-based games such as PettingZoo's tic-tac-toe)
in every family with a Discrete action: Ape-X DQN, R2D2, IMPALA and PPO.

- the masked categorical (``distributions.mask_logits``) against a softmax over the legal
  actions worked by hand;
- each family's actor core, given random masks, never chooses an illegal action, training or
  evaluating;
- a ``StepBlock`` holding the multi-agent actor's ``action_mask`` / ``next_action_mask`` extras
  is cut into items whose layout is exactly ``cfg.algo.item_spec`` and whose masks are those of
  the right observations;
- the learner takes one update on those items with a finite loss, and its targets, ratios
  and entropies use the masks (Ape-X's and R2D2's priorities, PPO's KL of the acting weights
  against themselves, IMPALA's entropy).

The hand-worked masked double-Q bootstrap and epsilon-greedy are in ``tests/test_targets.py``.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from apexrl.acting.step_block import StepBlock
from apexrl.algos import SampledBatch, load_algorithm
from apexrl.algos.actor_critic import masked_policy
from apexrl.algos.apex_dqn import loss as apex_loss
from apexrl.algos.r2d2 import sequence_loss as r2d2_loss
from apexrl.config import Config, load_config
from apexrl.envs import VectorStep
from apexrl.math import targets
from apexrl.math.distributions import (
    categorical_entropy,
    categorical_log_prob,
    categorical_sample,
    mask_logits,
)
from apexrl.models import CategoricalOutput

REPO = Path(__file__).resolve().parents[1]
OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACTION_SPACE = gym.spaces.Discrete(5)
NUM_ENVS = 3

# family (and variant) -> (config file, overrides that keep it small)
CASES = {
    "apex_dqn": ("apex_dqn_cartpole.yaml", ["algo.n_step=3", "actor.chunk_steps=4"]),
    "r2d2": (
        "r2d2_cartpole.yaml",
        [
            "algo.lstm_size=8",
            "algo.sequence_length=4",
            "algo.sequence_overlap=1",
            "algo.burn_in=1",
            "algo.n_step=2",
            "actor.chunk_steps=3",
        ],
    ),
    "impala": ("impala_cartpole.yaml", ["algo.unroll_length=5"]),
    "impala-lstm": ("impala_cartpole.yaml", ["algo.unroll_length=5", "algo.lstm_size=8"]),
    "ppo": (
        "ppo_cartpole.yaml",
        ["algo.unroll_length=5", "algo.epochs=1", "algo.num_minibatches=2"],
    ),
    "ppo-lstm": (
        "ppo_cartpole.yaml",
        ["algo.unroll_length=5", "algo.epochs=1", "algo.num_minibatches=1", "algo.lstm_size=8"],
    ),
}


def masked_config(case: str) -> Config:
    config_file, overrides = CASES[case]
    return load_config(
        REPO / "configs" / config_file,
        [
            *overrides,
            "algo.action_mask=true",
            "algo.hidden_sizes=[16]",
            f"env.num_envs={NUM_ENVS}",
            "actor.num_actors=1",
        ],
    )


def random_masks(rng: np.random.Generator, num_rows: int) -> np.ndarray:
    """bool ``[num_rows, A]``: each action legal with probability 1/2, one at least."""
    legal = rng.random((num_rows, ACTION_SPACE.n)) < 0.5
    legal[np.arange(num_rows), rng.integers(0, ACTION_SPACE.n, num_rows)] = True
    return legal


def random_obs(rng: np.random.Generator, num_rows: int) -> np.ndarray:
    return rng.uniform(-1, 1, (num_rows, *OBS_SPACE.shape)).astype(np.float32)


def make_core(cfg: Config, evaluate: bool = False, seed: int = 0):
    algorithm = load_algorithm(cfg.algorithm)
    torch.manual_seed(seed)
    net = algorithm.make_network(OBS_SPACE, ACTION_SPACE, cfg)
    core = algorithm.actor_core(net, cfg, 0, evaluate, "cpu", np.random.default_rng(seed))
    return algorithm, net, core


# --- the masked categorical -----------------------------------------------------------------------


def test_masked_log_prob_and_entropy_are_the_softmax_over_the_legal_actions() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.5], [0.0, 4.0, 0.0, 0.0]])
    legal = torch.tensor([[True, False, True, False], [False, True, False, False]])
    masked = mask_logits(logits, legal)
    # Row 0: p = (e^1, e^3) / (e^1 + e^3) on actions 0 and 2, 0 elsewhere.
    z = math.exp(1) + math.exp(3)
    p0, p2 = math.exp(1) / z, math.exp(3) / z
    logp = categorical_log_prob(masked, torch.tensor([2, 1]))
    torch.testing.assert_close(logp, torch.tensor([3 - math.log(z), 0.0]))
    entropy = categorical_entropy(masked)
    # Row 1 has one legal action: certain, entropy 0.
    expected = torch.tensor([-(p0 * math.log(p0) + p2 * math.log(p2)), 0.0])
    torch.testing.assert_close(entropy, expected)
    probs = torch.softmax(masked, dim=-1)
    assert probs[~legal].tolist() == [0.0] * int((~legal).sum())  # exactly 0, not tiny
    assert torch.isfinite(torch.log_softmax(masked, dim=-1)).all()
    assert masked.dtype == logits.dtype and torch.equal(masked[legal], logits[legal])


def test_masked_logits_keep_gradients_finite_and_off_the_illegal_actions() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.5, 0.5]], requires_grad=True)
    legal = torch.tensor([[True, True, False], [False, False, False]])  # row 1: padding
    masked = mask_logits(logits, legal)
    value = categorical_log_prob(masked, torch.tensor([0, 1])) + categorical_entropy(masked)
    assert torch.isfinite(value).all()
    value.sum().backward()
    assert torch.isfinite(logits.grad).all()
    assert logits.grad[0, 2] == 0.0 and logits.grad[1].abs().sum() == 0.0


def test_masked_sampling_never_draws_an_illegal_action() -> None:
    generator = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    legal = torch.from_numpy(random_masks(rng, 4000))
    logits = torch.randn(legal.shape, generator=generator) * 5
    actions = categorical_sample(mask_logits(logits, legal), generator)
    assert legal[torch.arange(len(actions)), actions].all()


def test_mask_logits_and_masked_policy_refuse_what_they_cannot_mask() -> None:
    logits = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="bool"):
        mask_logits(logits, torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(2, 4\)"):
        mask_logits(logits, torch.ones(2, 4, dtype=torch.bool))
    multi = CategoricalOutput(torch.zeros(2, 2, 3), torch.zeros(2))  # a MultiDiscrete's
    with pytest.raises(ValueError, match="one Discrete action"):
        masked_policy(multi, torch.ones(2, 2, 3, dtype=torch.bool))


def test_item_spec_refuses_a_mask_for_a_box_action() -> None:
    cfg = masked_config("ppo")
    with pytest.raises(ValueError, match="algo.action_mask needs a Discrete action space"):
        cfg.algo.item_spec(OBS_SPACE, gym.spaces.Box(-1.0, 1.0, (2,), np.float32))


def test_cores_of_box_actions_refuse_a_mask() -> None:
    cfg = load_config(REPO / "configs" / "sac_pendulum.yaml", ["algo.hidden_sizes=[16]"])
    box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    algorithm = load_algorithm(cfg.algorithm)
    net = algorithm.make_network(OBS_SPACE, box, cfg)
    core = algorithm.actor_core(net, cfg, 0, False, "cpu", np.random.default_rng(0))
    obs = random_obs(np.random.default_rng(0), 2)
    assert core.act(obs)[0].shape == (2, 2)
    with pytest.raises(ValueError, match="action mask"):
        core.act(obs, np.ones((2, 2), dtype=bool))


# --- acting -----------------------------------------------------------------------------------


@pytest.mark.parametrize("evaluate", [False, True], ids=["train", "evaluate"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_actor_core_never_chooses_an_illegal_action(case: str, evaluate: bool) -> None:
    cfg = masked_config(case)
    _, _, core = make_core(cfg, evaluate)
    rng = np.random.default_rng(1)
    chosen = np.zeros(ACTION_SPACE.n, dtype=np.int64)
    for _ in range(200):
        obs, mask = random_obs(rng, NUM_ENVS), random_masks(rng, NUM_ENVS)
        action, _ = core.act(obs, mask)
        assert action.shape == (NUM_ENVS,)
        assert mask[np.arange(NUM_ENVS), action].all(), (action, mask)
        chosen += np.bincount(action, minlength=ACTION_SPACE.n)
    if not evaluate:  # exploring or sampling: every action, where legal, is chosen at times
        assert (chosen > 0).all()


@pytest.mark.parametrize("case", ["apex_dqn", "impala"])
def test_a_mask_that_allows_nothing_is_refused(case: str) -> None:
    _, _, core = make_core(masked_config(case))
    mask = np.ones((NUM_ENVS, ACTION_SPACE.n), dtype=bool)
    mask[1] = False
    with pytest.raises(ValueError, match=r"no action in rows \[1\]"):
        core.act(random_obs(np.random.default_rng(0), NUM_ENVS), mask)


# --- items and one update -------------------------------------------------------------------------


def collect(core, num_vector_steps: int, seed: int = 2):
    """Act on random observations with random masks as the multi-agent actor does, adding both
    masks to each step's extras; the chunks cut and a map obs bytes -> that obs's mask."""
    rng = np.random.default_rng(seed)
    block = StepBlock(core.block_steps, core.block_overlap)
    mask_of: dict[bytes, np.ndarray] = {}
    chunks = []
    obs, mask = random_obs(rng, NUM_ENVS), random_masks(rng, NUM_ENVS)
    for _ in range(num_vector_steps):
        action, extras = core.act(obs, mask)
        next_obs, next_mask = random_obs(rng, NUM_ENVS), random_masks(rng, NUM_ENVS)
        terminated = rng.random(NUM_ENVS) < 0.1
        truncated = ~terminated & (rng.random(NUM_ENVS) < 0.05)
        reward = rng.normal(size=NUM_ENVS).astype(np.float32)
        step = VectorStep(next_obs, next_obs, reward, terminated, truncated)
        core.observe(action, step)
        for o, m in zip([*obs, *next_obs], [*mask, *next_mask], strict=True):
            mask_of[o.tobytes()] = m
        extras = {
            **extras,
            "weights_version": np.zeros(NUM_ENVS, np.int64),
            "action_mask": mask,
            "next_action_mask": next_mask,
        }
        block.add(obs, action, step, extras)
        if block.full:
            fields, priorities = core.items(block)
            block.keep_overlap()
            if fields:
                chunks.append((fields, priorities))
        obs, mask = next_obs, next_mask
    return chunks, mask_of


def check_masks(cfg: Config, fields: dict[str, np.ndarray], mask_of: dict) -> None:
    """Each item's masks are those of the observations they sit beside."""
    if cfg.algorithm == "apex_dqn":
        for next_obs, next_mask in zip(fields["next_obs"], fields["next_action_mask"], strict=True):
            assert np.array_equal(next_mask, mask_of[next_obs.tobytes()])
    elif cfg.algorithm == "r2d2":  # k real steps, then at k the mask of the obs they led to
        for obs, mask, real in zip(
            fields["obs"], fields["action_mask"], fields["mask"], strict=True
        ):
            k = int(real.sum())
            for j in range(k + 1):
                assert np.array_equal(mask[j], mask_of[obs[j].tobytes()])
            assert not mask[k + 1 :].any()  # padding: no legal action
    else:
        obs, mask = fields["obs"], fields["action_mask"]
        for o, m in zip(
            obs.reshape(-1, *OBS_SPACE.shape), mask.reshape(-1, mask.shape[-1]), strict=True
        ):
            assert np.array_equal(m, mask_of[o.tobytes()])


def as_batch(chunks) -> SampledBatch:
    fields = {k: np.concatenate([c[0][k] for c in chunks]) for k in chunks[0][0]}
    n = len(fields["action"])
    tensors = {k: torch.from_numpy(v) for k, v in fields.items()}
    return SampledBatch(np.arange(n), tensors, np.full(n, 1.0 / n), n)


@pytest.mark.parametrize("case", list(CASES))
def test_items_hold_the_masks_of_the_item_spec_and_the_learner_trains_on_them(case: str) -> None:
    cfg = masked_config(case)
    algorithm, net, core = make_core(cfg)
    chunks, mask_of = collect(core, num_vector_steps=30)
    assert chunks
    spec = cfg.algo.item_spec(OBS_SPACE, ACTION_SPACE)
    mask_fields = {name for name in spec if name.endswith("action_mask")}
    assert mask_fields == {"next_action_mask" if cfg.algorithm == "apex_dqn" else "action_mask"}
    for fields, priorities in chunks:
        layout = {name: (value.dtype, value.shape[1:]) for name, value in fields.items()}
        assert layout == spec
        assert priorities is None or np.isfinite(priorities).all()
        check_masks(cfg, fields, mask_of)

    learner = algorithm.learner_core(OBS_SPACE, ACTION_SPACE, cfg, torch.device("cpu"))
    learner.network.load_state_dict(net.state_dict())  # the weights that acted
    batch, turns, losses = as_batch(chunks), 0, []
    while learner.num_updates == 0:  # one step, or PPO's epochs x minibatches
        turns += 1
        learner.agree(lambda values: values)
        result = learner.compute_gradients(batch if turns == 1 else None)
        if result is None:  # PPO collects the rollout on this turn and trains from the next
            assert cfg.algorithm == "ppo" and turns == 1
            continue
        assert all(np.isfinite(v) for v in result.metrics.values()), result.metrics
        if cfg.algorithm == "ppo" and turns == 2:  # pi = mu: the same weights, the same masks
            assert abs(result.metrics["learner/approx_kl"]) < 1e-5
            assert result.metrics["learner/clip_fraction"] == 0.0
        losses.append(result.metrics["learner/loss"])
        grad_norm = learner.apply_gradients()
        assert math.isfinite(grad_norm)
    assert losses and all(math.isfinite(x) for x in losses)


def test_apex_priorities_and_loss_bootstrap_from_the_best_legal_next_action() -> None:
    """Online = target: the double-Q bootstrap is the max of Q over the legal next actions, so
    actor and learner priorities are |r + gamma^m (1 - terminated) max_legal Q(s') - Q(s, a)|."""
    cfg = masked_config("apex_dqn")
    _, net, core = make_core(cfg)
    chunks, _ = collect(core, num_vector_steps=12)
    fields, priorities = chunks[0]
    f = {name: torch.from_numpy(value) for name, value in fields.items()}
    with torch.no_grad():
        q_next = net(f["next_obs"]).q.masked_fill(~f["next_action_mask"], float("-inf"))
        best_legal = q_next.max(dim=1).values
        q_sa = net(f["obs"]).q.gather(1, f["action"].unsqueeze(1)).squeeze(1)
    discount = torch.where(f["terminated"], 0.0, cfg.algo.gamma ** f["num_steps"].float())
    expected = (f["reward"] + discount * best_legal - q_sa).abs().double()
    np.testing.assert_allclose(priorities, expected.numpy() + 1e-6, rtol=1e-5, atol=1e-5)
    out = apex_loss(net, net, f, torch.ones(len(q_sa)), cfg.algo)
    eps = cfg.algo.priority_eps
    np.testing.assert_allclose(out.priorities.numpy(), expected.numpy() + eps, rtol=1e-5, atol=1e-5)
    # Without the mask the bootstrap would be the plain max, larger where it is illegal.
    q_all = net(f["next_obs"]).q.max(dim=1).values.detach()
    assert (q_all > best_legal).any()


def test_r2d2_bootstrap_of_a_padded_position_is_zero_and_its_loss_finite() -> None:
    """Padding after an episode end has no legal action: the masked bootstrap there is 0
    (``targets.double_q_bootstrap``), so targets and priorities stay finite."""
    q = torch.randn(5, 2, ACTION_SPACE.n)
    legal = torch.zeros(5, 2, ACTION_SPACE.n, dtype=torch.bool)
    legal[:2, :, 1] = True
    bootstrap = targets.double_q_bootstrap(q, q, legal)
    torch.testing.assert_close(bootstrap[:2], q[:2, :, 1])
    assert bootstrap[2:].abs().sum() == 0


def test_r2d2_loss_keeps_to_the_masks_and_an_all_legal_mask_is_no_mask() -> None:
    cfg = masked_config("r2d2")
    _, net, core = make_core(cfg)
    chunks, _ = collect(core, num_vector_steps=30)
    f = as_batch(chunks).fields
    weights = torch.ones(len(f["action"]))
    all_legal = {**f, "action_mask": torch.ones_like(f["action_mask"])}
    unmasked_cfg = dataclasses.replace(cfg.algo, action_mask=False)
    with torch.no_grad():
        masked = r2d2_loss(net, net, f, weights, cfg.algo)
        legal = r2d2_loss(net, net, all_legal, weights, cfg.algo)
        plain = r2d2_loss(net, net, f, weights, unmasked_cfg)
    torch.testing.assert_close(legal.priorities, plain.priorities)
    assert not torch.allclose(masked.priorities, plain.priorities)
    # The actor's initial priorities are the masked loss's (online = target = its network).
    np.testing.assert_allclose(
        np.concatenate([p for _, p in chunks]), masked.priorities.numpy(), rtol=1e-5
    )


def test_impala_entropy_covers_the_legal_actions_only() -> None:
    cfg = masked_config("impala")
    algorithm, net, core = make_core(cfg)
    chunks, _ = collect(core, num_vector_steps=cfg.algo.unroll_length)
    batch = as_batch(chunks)
    learner = algorithm.learner_core(OBS_SPACE, ACTION_SPACE, cfg, torch.device("cpu"))
    learner.network.load_state_dict(net.state_dict())
    result = learner.compute_gradients(batch)
    with torch.no_grad():
        logits = net(batch.fields["obs"]).logits
        expected = categorical_entropy(mask_logits(logits, batch.fields["action_mask"]))
        unmasked = categorical_entropy(logits)
    assert result.metrics["learner/entropy"] == pytest.approx(float(expected.mean()), rel=1e-5)
    assert float(expected.mean()) < float(unmasked.mean())

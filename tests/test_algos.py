"""Every algorithm behind the seam, driven as the generic actor and learner drive it, without
sockets: a real vector env -> ``core.act`` -> ``StepBlock`` -> ``core.items`` -> a sampled batch
-> the learner core's update. Checks the items' layout, the episode seam inside an unroll, that an
update changes the published weights, and that every shipped config loads."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from apexrl.acting.step_block import StepBlock
from apexrl.algos import ALGORITHMS, SampledBatch, load_algorithm
from apexrl.config import ConfigError, load_config
from apexrl.config.algos import ALGORITHM_CONFIGS
from apexrl.envs import make_vector_env, step_vector
from apexrl.models import params_to_arrays

REPO = Path(__file__).resolve().parents[1]
NUM_ENVS = 4


def collect(cfg, num_blocks: int, seed: int = 0, version: int = 3, device: str = "cpu"):
    """The actor's loop for ``num_blocks`` blocks, acting on ``device``; returns the algorithm,
    the spaces and the items."""
    torch.manual_seed(seed)
    envs = make_vector_env(cfg.env, NUM_ENVS, cfg.unit_actions)
    algorithm = load_algorithm(cfg.algorithm)
    net = algorithm.make_network(envs.single_observation_space, envs.single_action_space, cfg)
    core = algorithm.actor_core(net.to(device), cfg, 0, False, device, np.random.default_rng(seed))
    block = StepBlock(core.block_steps, core.block_overlap)
    obs, _ = envs.reset(seed=seed)
    chunks = []
    while len(chunks) < num_blocks:
        action, extras = core.act(obs)
        step = step_vector(envs, action)
        block.add(obs, action, step, {**extras, "weights_version": np.full(NUM_ENVS, version)})
        if block.full:
            chunks.append(core.items(block))
            block.keep_overlap()
        obs = step.obs
    spaces = envs.single_observation_space, envs.single_action_space
    envs.close()
    return algorithm, spaces, chunks


def as_batch(chunks, device: torch.device | None = None) -> SampledBatch:
    fields = {k: np.concatenate([c[0][k] for c in chunks]) for k in chunks[0][0]}
    n = len(next(iter(fields.values())))
    tensors = {k: torch.from_numpy(v).to(device) for k, v in fields.items()}
    return SampledBatch(np.arange(n), tensors, np.full(n, 1.0 / n), n)


@pytest.mark.parametrize(
    "config, env_id",
    [
        ("apex_dqn_cartpole.yaml", "CartPole-v1"),
        ("impala_cartpole.yaml", "CartPole-v1"),
        ("impala_cartpole.yaml", "Pendulum-v1"),
        ("ppo_cartpole.yaml", "CartPole-v1"),
        ("ppo_cartpole.yaml", "Pendulum-v1"),
        ("ppo_cartpole.yaml+algo.normalize_obs=true", "Pendulum-v1"),
        ("impala_cartpole.yaml+algo.squash_actions=true", "Pendulum-v1"),
        ("sac_pendulum.yaml", "Pendulum-v1"),
        ("sac_pendulum.yaml+replay.priority_exponent=0.6", "Pendulum-v1"),
        ("td3_pendulum.yaml+replay.priority_exponent=0.6", "Pendulum-v1"),
        ("ddpg_pendulum.yaml+algo.n_step=3", "Pendulum-v1"),
    ],
)
def test_an_update_through_the_seam_changes_the_published_weights(config: str, env_id: str) -> None:
    # Two actors of NUM_ENVS envs: PPO's rollout is the two blocks collected here.
    config, *more = config.split("+")
    overrides = [f"env.id={env_id}", "algo.hidden_sizes=[16]", f"env.num_envs={NUM_ENVS}", *more]
    cfg = load_config(REPO / "configs" / config, [*overrides, "actor.num_actors=2"])
    algorithm, spaces, chunks = collect(cfg, num_blocks=2, version=0)
    fields, priorities = chunks[0]
    num_items = len(fields["obs"])
    assert num_items == cfg.algo.items_per_chunk(cfg.actor.chunk_steps, NUM_ENVS)
    assert priorities is None or priorities.shape == (num_items,)
    learner = algorithm.learner_core(*spaces, cfg, torch.device("cpu"))
    before = params_to_arrays(learner.network)
    batch, steps, turns = as_batch(chunks), 0, 0
    while learner.num_updates == 0:  # one version: one step, or PPO's epochs x minibatches
        turns += 1
        learner.agree(lambda values: values)  # a single learner: the sums are its own
        result = learner.compute_gradients(batch if turns == 1 else None)
        if result is None:  # PPO collects the rollout on this turn and trains from the next
            assert cfg.algorithm == "ppo" and turns == 1
            continue
        assert all(np.isfinite(v) for v in result.metrics.values()), result.metrics
        assert result.priorities is None or result.priorities.shape == (2 * num_items,)
        learner.apply_gradients()
        steps += 1
    expected = cfg.algo.epochs * cfg.algo.num_minibatches if cfg.algorithm == "ppo" else 1
    assert steps == expected
    learner.agree(lambda values: values)
    assert learner.compute_gradients(None) is None  # nothing more without new data
    after = params_to_arrays(learner.network)
    assert any(not np.array_equal(before[k], after[k]) for k in before)
    fresh = algorithm.learner_core(*spaces, cfg, torch.device("cpu"))
    fresh.load_state_dict(learner.state_dict())
    assert fresh.num_updates == 1
    if cfg.unit_actions:  # actions in [-1, 1], mapped onto the Box
        assert np.all(np.abs(fields["action"]) <= 1.0)
    if "algo.normalize_obs=true" in more:  # the statistics took in the rollout after training
        stats = after["normalizer.count"], after["normalizer.mean"]
        assert stats[0] == 2 * num_items * cfg.algo.unroll_length and np.any(stats[1] != 0)


def ppo_learner(num_actors: int = 2, timeout_s: float = 30.0):
    overrides = [
        "algo.hidden_sizes=[16]",
        f"env.num_envs={NUM_ENVS}",
        f"actor.num_actors={num_actors}",
        f"algo.rollout_timeout_s={timeout_s}",
        "algo.epochs=1",
        "algo.num_minibatches=2",
    ]
    cfg = load_config(REPO / "configs" / "ppo_cartpole.yaml", overrides)
    algorithm, spaces, fresh = collect(cfg, num_blocks=1, version=0)
    _, _, stale = collect(cfg, num_blocks=1, version=7, seed=1)
    return algorithm.learner_core(*spaces, cfg, torch.device("cpu")), fresh, stale


def turn(learner, batch):
    """One turn of the learner loop for a single learner: agree, then compute."""
    learner.agree(lambda values: values)
    return learner.compute_gradients(batch)


def test_ppo_never_trains_on_data_of_another_version() -> None:
    learner, fresh, stale = ppo_learner(num_actors=1)
    assert turn(learner, as_batch(stale)) is None  # version 7 while the learner is at 0
    assert learner.stale_items_dropped == NUM_ENVS and learner.num_pending == 0
    assert turn(learner, as_batch(fresh)) is None  # the whole rollout of version 0 arrives
    result = turn(learner, None)  # ... and is trained on from the next turn
    assert result is not None and result.metrics["learner/stale_items_dropped"] == NUM_ENVS
    learner.apply_gradients()
    assert turn(learner, None) is not None  # 1 epoch x 2 minibatches
    learner.apply_gradients()
    assert learner.num_updates == 1
    # Version 0's data is stale now: it is dropped, not trained on again.
    assert turn(learner, as_batch(fresh)) is None and turn(learner, None) is None
    assert learner.stale_items_dropped == 2 * NUM_ENVS


def test_ppo_trains_on_what_arrived_when_an_actor_is_late() -> None:
    learner, fresh, _ = ppo_learner(num_actors=2, timeout_s=0.2)
    assert turn(learner, as_batch(fresh)) is None  # half of the rollout
    assert turn(learner, None) is None  # still waiting for the other actor
    time.sleep(0.3)
    result = turn(learner, None)
    assert result is not None and result.metrics["learner/incomplete_rollouts"] == 1


def test_ppo_anneals_learning_rate_and_clip_over_the_runs_env_steps() -> None:
    # 1 actor x 4 envs x 32 steps a rollout; a run of 512 env steps is 4 rollouts.
    overrides = [
        "algo.hidden_sizes=[16]",
        f"env.num_envs={NUM_ENVS}",
        "actor.num_actors=1",
        "algo.epochs=1",
        "algo.num_minibatches=1",
        "algo.anneal_lr=true",
        "algo.anneal_clip=true",
        f"algo.anneal_env_steps={4 * NUM_ENVS * 32}",
        f"run.stop_env_steps={3 * NUM_ENVS * 32}",  # a run may stop before the annealing ends
    ]
    cfg = load_config(REPO / "configs" / "ppo_cartpole.yaml", overrides)
    assert cfg.algo.unroll_length == 32 and cfg.algo.lr == 0.001 and cfg.algo.clip == 0.2
    algorithm, spaces, _ = collect(cfg, num_blocks=1)
    learner = algorithm.learner_core(*spaces, cfg, torch.device("cpu"))
    seen = []
    for version in range(3):
        _, _, rollout = collect(cfg, num_blocks=1, version=version, seed=version)
        assert turn(learner, as_batch(rollout)) is None
        result = turn(learner, None)
        seen.append((result.metrics["learner/lr"], result.metrics["learner/clip_range"]))
        learner.apply_gradients()
    assert seen == [
        pytest.approx((0.001, 0.2)),
        pytest.approx((0.00075, 0.15)),
        pytest.approx((0.0005, 0.1)),
    ]
    # Not annealed: the config's values throughout.
    plain = load_config(REPO / "configs" / "ppo_cartpole.yaml", overrides[:4])
    learner = algorithm.learner_core(*spaces, plain, torch.device("cpu"))
    _, _, rollout = collect(plain, num_blocks=1, version=0)
    turn(learner, as_batch(rollout))
    result = turn(learner, None)
    assert (result.metrics["learner/lr"], result.metrics["learner/clip_range"]) == (0.001, 0.2)


def test_annealing_needs_the_runs_env_steps() -> None:
    with pytest.raises(ConfigError, match="algo.anneal_lr anneals towards 0 over algo.anneal_env"):
        load_config(REPO / "configs" / "ppo_cartpole.yaml", ["algo.anneal_lr=true"])
    # Trained on past the annealing's end, a run would learn at a rate of 0: refused.
    with pytest.raises(ConfigError, match="a run must stop by then"):
        load_config(
            REPO / "configs" / "ppo_cartpole.yaml",
            ["algo.anneal_lr=true", "algo.anneal_env_steps=100", "run.stop_env_steps=200"],
        )
    with pytest.raises(ConfigError, match="algo.anneal_env_steps must be positive"):
        load_config(
            REPO / "configs" / "ppo_cartpole.yaml",
            ["algo.anneal_clip=true", "algo.anneal_env_steps=-1", "run.stop_env_steps=10"],
        )
    with pytest.raises(ConfigError, match="algo.anneal_lr anneals over a single-agent run"):
        load_config(
            REPO / "configs" / "ppo_simple_spread.yaml",
            ["algo.anneal_lr=true", "run.stop_env_steps=1000"],
        )


def test_impala_unrolls_keep_the_episode_seam() -> None:
    cfg = load_config(REPO / "configs" / "impala_cartpole.yaml", ["algo.unroll_length=40"])
    _, _, chunks = collect(cfg, num_blocks=3)
    for fields, priorities in chunks:
        assert priorities is None
        assert fields["obs"].shape == (NUM_ENVS, 40, 4)
        assert fields["behaviour_logp"].shape == (NUM_ENVS, 40)
        assert np.all(fields["behaviour_logp"] <= 0)  # log-probabilities of a categorical
        assert np.all(fields["weights_version"] == 3)
        ended = fields["terminated"] | fields["truncated"]
        following = fields["obs"][:, 1:]
        # Inside an episode the next step starts where this one ended; across an end it starts
        # from a reset state, while next_obs keeps the episode's own final observation.
        same = np.all(fields["next_obs"][:, :-1] == following, axis=-1)
        assert np.all(same[~ended[:, :-1]])
        assert ended.any(), "a 40-step unroll of a random CartPole policy holds an episode end"
        assert not np.any(same[ended[:, :-1]])


def test_every_algorithm_has_hyperparameters_and_a_config_of_its_first_env() -> None:
    """CartPole for the families of discrete actions, Pendulum for those of Box actions only."""
    assert set(ALGORITHMS) == set(ALGORITHM_CONFIGS)
    for name in ALGORITHMS:
        discrete = "Discrete" in ALGORITHM_CONFIGS[name].ACTION_SPACES
        cfg = load_config(
            REPO / "configs" / f"{name}_{'cartpole' if discrete else 'pendulum'}.yaml"
        )
        assert cfg.algorithm == name and isinstance(cfg.algo, ALGORITHM_CONFIGS[name])

"""Pixels: Atari through ale-py and MinAtar, and every family's network on images.

- ale-py's vector env (what actors step) equals gymnasium's reference wrapper stack step for step
  on the same seeds, episode seams included, with the random starts, sticky actions and fire reset
  off; sticky actions and no-op starts are the config's;
- MinAtar's observations are channel-first uint8;
- training sees clipped rewards where the config says so, returns stay raw;
- with ``terminal_on_life_loss`` a lost life ends training's episode and the game goes on;
- every family's network is built on Atari and MinAtar spaces, acts on uint8 frames, keeps them
  uint8 in its replay items and on the wire, and trains on them;
- every family trains through the launcher's real processes on 42x42 Pong frames stored once,
  with the small CNN.
"""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml
from conftest import run_launcher
from test_algos import as_batch, collect

from apexrl.algos import load_algorithm
from apexrl.config import load_config
from apexrl.envs import VectorStep, make_env, make_vector_env, step_vector
from apexrl.envs.atari import frames_per_step, lives_lost, rom_name
from apexrl.envs.training import TrainingSignal, training_step
from apexrl.models import params_to_arrays
from apexrl.models.torsos import ImpalaResNet, MinAtarCNN, NatureCNN, SmallCNN
from apexrl.transport.codec import decode, encode
from apexrl.transport.messages import TrajectoryChunk

REPO = Path(__file__).resolve().parents[1]
DETERMINISTIC = [
    "env.atari.noop_max=0",
    "env.atari.sticky_actions=0.0",
    "env.atari.fire_reset=false",
]


def env_config(env_id: str, *overrides: str, config: str = "ppo_cartpole.yaml"):
    return load_config(REPO / "configs" / config, [f"env.id={env_id}", *overrides])


def play(envs, actions: np.ndarray, seed: int) -> list[VectorStep]:
    envs.reset(seed=seed)
    return [step_vector(envs, a) for a in actions]


def reference_vector_env(cfg, num_envs: int) -> gym.vector.VectorEnv:
    return gym.vector.SyncVectorEnv(
        [lambda: make_env(cfg.env)] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )


@pytest.mark.parametrize("game", ["Breakout", "Pong"])
def test_ale_vector_env_equals_the_reference_wrapper_stack_step_for_step(game: str) -> None:
    # Games cut at 400 frames (100 env steps) so that 300 steps cross several episode seams.
    cfg = env_config(f"ALE/{game}-v5", *DETERMINISTIC, "env.atari.max_episode_frames=400")
    fast, reference = make_vector_env(cfg.env, 2), reference_vector_env(cfg, 2)
    assert type(fast).__name__ == "AtariVectorEnv"
    assert fast.single_observation_space == reference.single_observation_space
    assert fast.single_observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    actions = np.random.default_rng(0).integers(0, fast.single_action_space.n, (300, 2))
    first_fast, _ = fast.reset(seed=3)
    first_reference, _ = reference.reset(seed=3)
    np.testing.assert_array_equal(first_fast, first_reference)
    ends = 0
    for t, (a, b) in enumerate(
        zip(play(fast, actions, 3), play(reference, actions, 3), strict=True)
    ):
        for name, x, y in zip(VectorStep._fields, a, b, strict=True):
            np.testing.assert_array_equal(x, y, err_msg=f"{name} differs at step {t}")
        ends += int((a.terminated | a.truncated).sum())
        # At a seam the transition ends on the game's last frame, the next one starts afresh.
        for i in np.flatnonzero(a.truncated):
            assert not np.array_equal(a.next_obs[i], a.obs[i])
    assert ends >= 4
    fast.close()
    reference.close()


def test_sticky_actions_and_noop_starts_are_the_configs() -> None:
    actions = np.random.default_rng(1).integers(0, 6, (200, 2))

    def trajectory(seed: int, *overrides: str) -> np.ndarray:
        envs = make_vector_env(env_config("ALE/Pong-v5", *overrides).env, 2)
        obs = np.stack([step.obs for step in play(envs, actions, seed)])
        envs.close()
        return obs

    # Without sticky actions and no-op starts the seed changes nothing ...
    np.testing.assert_array_equal(trajectory(1, *DETERMINISTIC), trajectory(2, *DETERMINISTIC))
    # ... with them (the defaults) it does, and one seed plays one game again exactly.
    assert not np.array_equal(trajectory(1), trajectory(2))
    np.testing.assert_array_equal(trajectory(1), trajectory(1))
    single = make_env(env_config("ALE/Pong-v5").env)
    assert single.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)
    assert single.unwrapped.ale.getInt("max_num_frames_per_episode") == 108_000
    single.close()


def test_rom_names_and_frames_per_step() -> None:
    assert rom_name("ALE/Pong-v5") == "pong"
    assert rom_name("ALE/MsPacman-v5") == "ms_pacman"
    assert rom_name("ALE/SpaceInvaders-v5") == "space_invaders"
    assert frames_per_step(env_config("ALE/Pong-v5").env) == 4
    assert frames_per_step(env_config("ALE/Pong-v5", "env.atari.frame_skip=3").env) == 3
    assert frames_per_step(env_config("MinAtar/Breakout-v1").env) == 1
    assert frames_per_step(env_config("CartPole-v1").env) == 1


@pytest.mark.parametrize(
    "game, channels, num_actions",
    [("Breakout", 4, 3), ("SpaceInvaders", 6, 4), ("Asterix", 4, 5), ("Freeway", 7, 3)],
)
def test_minatar_observations_are_channel_first_uint8(
    game: str, channels: int, num_actions: int
) -> None:
    cfg = env_config(f"MinAtar/{game}-v1")
    env = make_env(cfg.env)
    assert env.observation_space == gym.spaces.Box(0, 1, (channels, 10, 10), np.uint8)
    assert env.action_space == gym.spaces.Discrete(num_actions)  # the minimal action set
    obs, _ = env.reset(seed=0)
    raw = env.unwrapped.game.state()  # bool (10, 10, C)
    np.testing.assert_array_equal(obs, np.moveaxis(raw, -1, 0).astype(np.uint8))
    assert obs.dtype == np.uint8 and obs.flags.c_contiguous
    env.close()


def test_training_sees_clipped_rewards_and_returns_stay_raw() -> None:
    step = VectorStep(
        obs=np.zeros((3, 1)),
        next_obs=np.zeros((3, 1)),
        reward=np.array([-7.0, 0.0, 4.0], np.float32),
        terminated=np.zeros(3, bool),
        truncated=np.zeros(3, bool),
    )
    np.testing.assert_array_equal(training_step(step, True).reward, [-1.0, 0.0, 1.0])
    assert training_step(step, False) is step
    np.testing.assert_array_equal(step.reward, [-7.0, 0.0, 4.0])  # the raw step is unchanged


def test_a_life_is_lost_where_lives_drop_within_a_game() -> None:
    previous = np.array([5, 3, 1, 5, 2])
    lives = np.array([4, 3, 5, 5, 0])
    ended = np.array([False, False, True, False, True])  # env 2: game over, reset to 5 lives
    np.testing.assert_array_equal(lives_lost(previous, lives, ended), [1, 0, 0, 0, 0])


def _vector_envs(kind: str, cfg):
    if kind == "ale_vector":
        return make_vector_env(cfg.env, 2)
    return gym.vector.SyncVectorEnv(  # the reference wrapper stack
        [lambda: make_env(cfg.env)] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )


@pytest.mark.parametrize("kind", ["ale_vector", "reference"])
@pytest.mark.parametrize("life_loss_terminal", [True, False])
def test_a_lost_life_ends_training_episodes_only_where_the_config_says(
    kind: str, life_loss_terminal: bool
) -> None:
    """Breakout (5 lives) played at random until each env has finished a game: with
    ``terminal_on_life_loss`` training sees 4 more episode ends per game (lives 5 -> 1; the
    fifth loss ends the game; the env resets only then); without it training sees exactly the
    game's ends."""
    cfg = env_config(
        "ALE/Breakout-v5",
        *DETERMINISTIC,
        f"env.atari.terminal_on_life_loss={str(life_loss_terminal).lower()}",
    )
    envs = _vector_envs(kind, cfg)
    signal = TrainingSignal(cfg.env)
    rng = np.random.default_rng(0)
    envs.reset(seed=0)
    games = np.zeros(2, int)
    trained_ends = np.zeros(2, int)
    while games.min() < 1:
        step = step_vector(envs, rng.integers(0, 4, 2))
        trained = signal(step)
        game_over = step.terminated | step.truncated
        trained_ends += (trained.terminated | trained.truncated) & (games < 1)
        games += game_over
    envs.close()
    np.testing.assert_array_equal(trained_ends, [5, 5] if life_loss_terminal else [1, 1])


def test_lives_are_ignored_off_atari_and_where_the_config_leaves_them() -> None:
    step = VectorStep(
        obs=np.zeros((2, 1)),
        next_obs=np.zeros((2, 1)),
        reward=np.zeros(2, np.float32),
        terminated=np.zeros(2, bool),
        truncated=np.zeros(2, bool),
        lives=np.array([3, 3]),
    )
    cfg = env_config("ALE/Breakout-v5", "env.atari.terminal_on_life_loss=false")
    signal = TrainingSignal(cfg.env)
    signal(step)
    assert signal(step._replace(lives=np.array([2, 3]))).terminated.tolist() == [False, False]
    on = TrainingSignal(
        env_config("CartPole-v1", "env.atari.terminal_on_life_loss=true").env
    )  # not an Atari id: no lives to lose
    on(step)
    assert on(step._replace(lives=np.array([2, 3]))).terminated.tolist() == [False, False]


PIXEL_CASES = [
    ("apex_dqn_cartpole.yaml", "MinAtar/Breakout-v1", MinAtarCNN, []),
    ("apex_dqn_cartpole.yaml", "ALE/Pong-v5", NatureCNN, []),
    ("r2d2_cartpole.yaml", "MinAtar/Breakout-v1", MinAtarCNN, []),
    ("r2d2_cartpole.yaml", "ALE/Pong-v5", NatureCNN, []),
    ("impala_cartpole.yaml", "MinAtar/SpaceInvaders-v1", MinAtarCNN, []),
    ("impala_cartpole.yaml", "ALE/Pong-v5", ImpalaResNet, ["algo.torso=impala_resnet"]),
    ("ppo_cartpole.yaml", "MinAtar/Breakout-v1", ImpalaResNet, ["algo.torso=impala_resnet"]),
    ("ppo_cartpole.yaml", "ALE/Pong-v5", NatureCNN, []),
    ("ppo_cartpole.yaml", "ALE/Pong-v5", SmallCNN, ["env.atari.screen_size=42"]),  # auto's pick
]


@pytest.mark.parametrize("config, env_id, torso, more", PIXEL_CASES)
def test_every_family_trains_on_uint8_frames(config, env_id, torso, more) -> None:
    overrides = [f"env.id={env_id}", "env.num_envs=4", "actor.num_actors=1", "algo.lr=0.01", *more]
    if config.startswith("ppo"):
        overrides += ["algo.normalize_obs=false", "algo.epochs=1", "algo.num_minibatches=1"]
    if config.startswith("r2d2"):
        overrides += [
            "algo.lstm_size=16",
            "algo.sequence_length=8",
            "algo.sequence_overlap=4",
            "algo.burn_in=2",
        ]
    cfg = load_config(REPO / "configs" / config, overrides)
    algorithm, spaces, chunks = collect(cfg, num_blocks=1, version=0)
    obs_space = spaces[0]
    assert obs_space.dtype == np.uint8 and len(obs_space.shape) == 3
    fields, priorities = chunks[0]
    # Replay items keep the env's uint8 frames, and so does the wire.
    assert fields["obs"].dtype == np.uint8
    message = TrajectoryChunk(
        table=cfg.replay.table,
        actor_id=0,
        incarnation=1,
        sequence=0,
        weights_version=0,
        env_steps=1,
        priorities=np.ones(len(fields["obs"])) if priorities is None else priorities,
        fields=fields,
    )
    decoded = decode(encode(message))
    assert decoded.fields["obs"].dtype == np.uint8
    np.testing.assert_array_equal(decoded.fields["obs"], fields["obs"])
    learner = algorithm.learner_core(*spaces, cfg, torch.device("cpu"))
    assert isinstance(learner.network.torso, torso) or any(
        isinstance(m, torso) for m in learner.network.modules()
    )
    before = params_to_arrays(learner.network)
    batch = as_batch(chunks)
    for turn in range(3):
        learner.agree(lambda values: values)
        result = learner.compute_gradients(batch if turn == 0 else None)
        if result is not None:
            assert all(np.isfinite(v) for v in result.metrics.values()), result.metrics
            learner.apply_gradients()
            break
    assert learner.num_updates == 1
    after = params_to_arrays(learner.network)
    assert any(not np.array_equal(before[k], after[k]) for k in before)


def test_an_image_network_is_the_same_on_actors_and_learners() -> None:
    cfg = env_config("MinAtar/Breakout-v1", config="apex_dqn_cartpole.yaml")
    envs = make_vector_env(cfg.env, 2)
    algorithm = load_algorithm(cfg.algorithm)
    spaces = envs.single_observation_space, envs.single_action_space
    actor_net = algorithm.make_network(*spaces, cfg)
    learner = algorithm.learner_core(*spaces, cfg, torch.device("cpu"))
    actor_shapes = {k: v.shape for k, v in params_to_arrays(actor_net).items()}
    learner_shapes = {k: v.shape for k, v in params_to_arrays(learner.network).items()}
    assert actor_shapes == learner_shapes
    envs.close()


SMALL_FRAMES = {  # family -> its overrides for a run of a few updates in 600 env steps
    "apex_dqn": ["replay.min_size_to_sample=64", "learner.batch_size=32"],
    "r2d2": [
        "replay.min_size_to_sample=4",
        "learner.batch_size=4",
        "algo.sequence_length=16",
        "algo.sequence_overlap=8",
        "algo.burn_in=4",
        "algo.lstm_size=64",
    ],
    "impala": ["replay.min_size_to_sample=4", "learner.batch_size=4"],
    "ppo": ["learner.batch_size=4", "algo.unroll_length=32"],  # a rollout: 4 x 32 env steps
}


@pytest.mark.parametrize("family", list(SMALL_FRAMES))
def test_every_family_trains_on_42x42_frames_stored_once(tmp_path: Path, family: str) -> None:
    """The family's Pong config at ``screen_size`` 42 with ``small_cnn``: actors pack the 42x42
    frames once, replay stores and serves them (it refuses whole stacks), the learner rebuilds
    the stacks and trains the small CNN, whose last layer spans the 11x11 map."""
    overrides = [
        "env.num_envs=4",
        "env.atari.screen_size=42",
        "algo.torso=small_cnn",
        "replay.store_frames_once=true",
        "run.stop_env_steps=600",
        "run.stop_wall_s=120",
        "learner.report_interval_s=1.0",
        *SMALL_FRAMES[family],
    ]
    config = REPO / "configs" / f"{family}_pong.yaml"
    args = ["--actors", "1", "--learners", "1", "--config", str(config), "--logdir", str(tmp_path)]
    code, output = run_launcher([*args, *(a for o in overrides for a in ("--set", o))], 240)
    assert code == 0, output[-3000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["env"]["atari"]["screen_size"] == 42
    assert resolved["replay"]["store_frames_once"] is True
    last = json.loads((run_dir / "result.json").read_text().splitlines()[-1])
    assert last["done"] is True and last["env_steps"] >= 600, last
    assert last["learner_updates"] >= 2, output[-3000:]
    assert last["replay_items"]["stored"] > 0 and last["replay_items"]["refused"] == 0, last
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)["algo"]
    assert (256, 32, 11, 11) in set(tensor_shapes(state))


def tensor_shapes(state: object):
    """The shapes of every tensor in a nested state dict."""
    if isinstance(state, torch.Tensor):
        yield tuple(state.shape)
    elif isinstance(state, dict):
        for value in state.values():
            yield from tensor_shapes(value)

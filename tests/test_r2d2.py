"""R2D2: the rescaling and priority math by hand, the sequence builder across episode ends and
truncations, the actor's recurrent state, burn-in without gradient, the stored state through a
real replay server to the learner, and short runs of the roles with the launcher."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import builders
import gymnasium as gym
import numpy as np
import pytest
import torch
import zmq
from conftest import REPO, Processes, free_addr, set_args, wait_for_server
from test_launch_local import Launch, launch  # noqa: F401 - the launcher fixture
from test_learner_group import launched_digests

from apexrl.acting.step_block import StepBlock
from apexrl.algos import SampledBatch, load_algorithm
from apexrl.algos.r2d2 import R2D2ActorCore, sequence_loss, stored_state, unroll_inputs
from apexrl.algos.sequences import SequenceBuilder
from apexrl.config import ConfigError, load_config
from apexrl.envs import CARTPOLE_NO_VELOCITY_ID, VectorStep, make_vector_env, step_vector
from apexrl.learning.replay_link import BatchStream
from apexrl.math import targets
from apexrl.models import LSTMState
from apexrl.transport import sockets
from apexrl.transport.messages import InsertAck

CONFIG = REPO / "configs" / "r2d2_cartpole_masked.yaml"
# A network and sequences small enough for quick unit tests and two-core role runs.
TINY = (
    "algo.hidden_sizes=[16]",
    "algo.lstm_size=8",
    "algo.sequence_length=8",
    "algo.sequence_overlap=4",
    "algo.burn_in=2",
    "algo.n_step=3",
)


def tiny_config(*overrides: str):
    return builders.config(*TINY, *overrides, path=CONFIG)


# --- the math, by hand ---------------------------------------------------------------------------


def test_value_rescaling_by_hand_and_its_inverse_is_exact_over_a_wide_range() -> None:
    x = torch.tensor([3.0, -8.0, 0.0], dtype=torch.float64)
    # h(3) = (sqrt(4) - 1) + 0.003; h(-8) = -(sqrt(9) - 1) - 0.008
    assert torch.allclose(targets.value_rescale(x), torch.tensor([1.003, -2.008, 0.0]).double())
    magnitudes = torch.logspace(-6, 8, 300, dtype=torch.float64)
    wide = torch.cat([-magnitudes.flip(0), torch.zeros(1, dtype=torch.float64), magnitudes])
    back = targets.value_rescale_inverse(targets.value_rescale(wide))
    assert torch.all((back - wide).abs() <= 1e-9 * (wide.abs() + 1)), (back - wide).abs().max()
    wide32 = wide.float()
    back32 = targets.value_rescale_inverse(targets.value_rescale(wide32))
    assert torch.all((back32 - wide32).abs() <= 1e-5 * (wide32.abs() + 1))
    h = targets.value_rescale(wide)
    assert torch.all(h[1:] > h[:-1])  # strictly increasing: the inverse exists


def test_sequence_priorities_by_hand() -> None:
    td = torch.tensor([[1.0, -5.0], [-2.0, 1.0], [3.0, 1.0], [9.0, 1.0]])  # [T=4, B=3 -> 2]
    mask = torch.tensor([[True, False], [True, False], [True, False], [False, False]])
    p = targets.sequence_priorities(td, mask, eta=0.9, eps=0.0)
    # sequence 0: max |td| over its 3 real steps 3, mean 2 -> 0.9 * 3 + 0.1 * 2; the 9 is padding
    assert p[0].item() == pytest.approx(2.9)
    assert p[1].item() == 0.0  # nothing trained: eps only
    assert p.dtype == torch.float64


def test_n_step_targets_over_a_sequence_with_a_termination_and_a_truncation_inside() -> None:
    r = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unsqueeze(1)  # [T=6, B=1]
    terminated = torch.tensor([False, True, False, False, False, False]).unsqueeze(1)
    truncated = torch.tensor([False, False, False, True, False, False]).unsqueeze(1)
    values = torch.tensor([10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0]).unsqueeze(1)  # [T+1, 1]
    y = targets.rescaled_n_step_targets(
        r, terminated, truncated, targets.value_rescale(values), gamma=0.5, n=3
    )
    expected = [
        1 + 0.5 * 2,  # stops at the termination: no bootstrap
        2,  # the terminal step itself
        3 + 0.5 * 4 + 0.25 * 50,  # stops at the truncation, bootstraps from position 4
        4 + 0.5 * 50,  # the truncated step bootstraps from the final observation
        5 + 0.5 * 6 + 0.25 * 70,  # stops at the sequence's end, bootstraps from position T
        6 + 0.5 * 70,
    ]
    got = targets.value_rescale_inverse(y.double()).squeeze(1)
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-5)


# --- the sequence builder ------------------------------------------------------------------------


def feed(builder: SequenceBuilder, t: int, ended: list[bool], truncated: list[bool]) -> list:
    """One step of 2 envs whose obs is 100 * env + t, and a 'state' that names its step."""
    obs = np.array([[t], [100 + t]], dtype=np.float32)
    fields = {
        "obs": obs,
        "action": np.array([t % 2, (t + 1) % 2]),
        "terminated": np.array(ended) & ~np.array(truncated),
        "truncated": np.array(truncated),
        "state": np.array([[t, t], [100 + t, 100 + t]], dtype=np.float32),
    }
    return builder.add(fields, obs + 0.5, np.array(ended))


def test_sequence_builder_stores_the_state_overlaps_and_pads_across_episode_ends() -> None:
    builder = SequenceBuilder(num_envs=2, length=4, overlap=2, start_fields=("state",))
    out = []
    # env 0: an episode of 6 steps that terminates at t = 5; env 1: truncated at t = 2
    for t in range(8):
        ended = [t == 5, t == 2]
        truncated = [False, t == 2]
        out += [(t, s) for s in feed(builder, t, ended, truncated)]
    env0 = [(t, s) for t, s in out if s["obs"][0, 0] < 100]
    env1 = [(t, s) for t, s in out if s["obs"][0, 0] >= 100]

    # env 0: steps 0-3 (full, starts the episode), then 2-5 (overlap 2, ends at the termination)
    (t0, a), (t1, b) = env0[:2]
    assert (t0, t1) == (3, 5)
    assert a["obs"][:, 0].tolist() == [0, 1, 2, 3, 3.5]  # position k: the obs step 3 led to
    assert a["mask"].all() and a["starts_episode"]
    assert a["state"].tolist() == [0, 0]  # the state stored at the sequence's first step
    assert b["obs"][:, 0].tolist() == [2, 3, 4, 5, 5.5]
    assert not b["starts_episode"] and b["state"].tolist() == [2, 2]
    assert b["terminated"].tolist() == [False, False, False, True]
    # after the end the next sequence starts empty at the new episode: nothing more by t = 7
    assert len(env0) == 2

    # env 1: steps 0-2 padded (truncated at 2), then a new episode 3-6, then 5-...
    (t0, c), (t1, d) = env1[:2]
    assert (t0, t1) == (2, 6)
    assert c["mask"].tolist() == [True, True, True, False]
    assert c["obs"][:, 0].tolist() == [100, 101, 102, 102.5, 0]  # final obs, then zeros
    assert c["truncated"].tolist() == [False, False, True, False]
    assert c["action"][3] == 0 and c["starts_episode"]
    assert d["obs"][:, 0].tolist() == [103, 104, 105, 106, 106.5]
    assert d["starts_episode"] and d["state"].tolist() == [103, 103]


# --- the actor core ------------------------------------------------------------------------------


def make_actor(cfg, num_envs: int = 2, seed: int = 0):
    envs = make_vector_env(cfg.env, num_envs)
    algorithm = load_algorithm("r2d2")
    torch.manual_seed(seed)
    net = algorithm.make_network(envs.single_observation_space, envs.single_action_space, cfg)
    core = algorithm.actor_core(net, cfg, 0, False, "cpu", np.random.default_rng(seed))
    return envs, net, core


def collect(core: R2D2ActorCore, envs, num_steps: int, seed: int = 0) -> list[dict]:
    """Step the envs with the core as the actor does; the chunks' fields and priorities."""
    block = StepBlock(core.block_steps, core.block_overlap)
    obs, _ = envs.reset(seed=seed)
    chunks = []
    for _ in range(num_steps):
        action, extras = core.act(obs)
        step = step_vector(envs, action)
        core.observe(action, step)
        block.add(obs, action, step, {**extras, "weights_version": np.zeros(len(obs), np.int64)})
        if block.full:
            fields, priorities = core.items(block)
            block.keep_overlap()
            if fields:
                chunks.append({"fields": fields, "priorities": priorities})
        obs = step.obs
    return chunks


def test_the_masked_cartpole_shows_position_and_angle_only() -> None:
    masked, full = gym.make(CARTPOLE_NO_VELOCITY_ID), gym.make("CartPole-v1")
    obs_masked, _ = masked.reset(seed=3)
    obs_full, _ = full.reset(seed=3)
    assert masked.observation_space.shape == (2,)
    assert obs_masked.tolist() == obs_full[[0, 2]].tolist()
    assert masked.spec.max_episode_steps == 500


def test_the_actor_resets_the_recurrent_state_where_an_episode_ended() -> None:
    cfg = tiny_config()
    _, _, core = make_actor(cfg)
    obs = np.array([[0.1, 0.02], [-0.1, 0.03]], dtype=np.float32)
    for _ in range(3):
        action, extras = core.act(obs)
        core.observe(action, VectorStep(obs, obs, np.ones(2, np.float32), *np.zeros((2, 2), bool)))
    assert core.state.h.abs().sum(1).min() > 0 and core.prev_reward.tolist() == [1.0, 1.0]
    h_before = core.state.h[1].clone()
    action, extras = core.act(obs)
    ended = VectorStep(obs, obs, np.ones(2, np.float32), np.array([True, False]), np.zeros(2, bool))
    core.observe(action, ended)
    assert core.state.h[0].abs().sum() == 0 and core.state.c[0].abs().sum() == 0
    assert core.prev_action[0] == 0 and core.prev_reward[0] == 0.0
    assert not torch.equal(core.state.h[1], h_before)  # env 1 went on
    _, extras = core.act(obs)
    assert np.abs(extras["recurrent_state"][0]).sum() == 0  # what a new sequence would store


def test_the_learners_unroll_from_a_stored_state_reproduces_the_actors_next_stored_state() -> None:
    """The learner feeds the network the same observations, previous actions and rewards as the
    actor did: unrolled from one sequence's stored state over its first L - overlap steps, it
    reaches exactly the state that the next sequence of the same episode stored."""
    cfg = tiny_config()
    envs, net, core = make_actor(cfg)
    chunks = collect(core, envs, 300)
    sequences = [
        {k: v[i] for k, v in c["fields"].items()}
        for c in chunks
        for i in range(len(c["priorities"]))
    ]
    length, overlap = cfg.algo.sequence_length, cfg.algo.sequence_overlap
    stride = length - overlap
    checked = 0
    for first in sequences:
        if not first["mask"].all():
            continue
        for second in sequences:
            if second["starts_episode"] or not np.array_equal(
                second["obs"][:overlap], first["obs"][stride:length]
            ):
                continue
            fields = {k: torch.as_tensor(v).unsqueeze(0) for k, v in first.items()}
            obs, prev_action, prev_reward = unroll_inputs(fields)
            with torch.no_grad():
                out = net(obs[:stride], prev_action[:stride], prev_reward[:stride],
                          stored_state(fields))  # fmt: skip
            reached = torch.stack([out.state.h[0], out.state.c[0]]).numpy()
            assert np.allclose(reached, second["recurrent_state"], atol=1e-6)
            assert second["prev_action"] == first["action"][stride - 1]
            assert second["prev_reward"] == first["reward"][stride - 1]
            checked += 1
    assert checked >= 5, f"only {checked} consecutive sequence pairs found"
    envs.close()


# --- the learner ---------------------------------------------------------------------------------


def sequences_batch(cfg, num_steps: int = 200) -> dict[str, torch.Tensor]:
    envs, _, core = make_actor(cfg)
    chunks = collect(core, envs, num_steps)
    envs.close()
    return {
        name: torch.as_tensor(np.concatenate([c["fields"][name] for c in chunks]))
        for name in chunks[0]["fields"]
    }


def learner_for(cfg):
    envs = make_vector_env(cfg.env, 1)
    spaces = envs.single_observation_space, envs.single_action_space
    envs.close()
    torch.manual_seed(0)
    return load_algorithm("r2d2").learner_core(*spaces, cfg, torch.device("cpu"))


def grads(net: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in net.parameters()]


def test_burn_in_takes_no_gradient() -> None:
    """The parameters' gradient of sequences that start mid-episode equals the gradient of the
    same sequences cut after their burn-in, started from the (constant) state the burn-in
    reached: nothing flows back through the burn-in steps."""
    cfg = tiny_config()
    burn_in = cfg.algo.burn_in
    batch = sequences_batch(cfg)
    mid = ~batch["starts_episode"]
    assert mid.sum() >= 4
    fields = {k: v[mid] for k, v in batch.items()}
    learner = learner_for(cfg)
    online, target = learner.online, learner.target  # equal weights: a fresh learner
    weights = torch.ones(len(fields["mask"]))

    online.zero_grad()
    out = sequence_loss(online, target, fields, weights, cfg.algo)
    out.loss.backward()
    with_burn_in = grads(online)

    obs, prev_action, prev_reward = unroll_inputs(fields)
    with torch.no_grad():
        warmed = online(obs[:burn_in], prev_action[:burn_in], prev_reward[:burn_in],
                        stored_state(fields)).state  # fmt: skip
    cut = {
        "obs": fields["obs"][:, burn_in:],
        "action": fields["action"][:, burn_in:],
        "reward": fields["reward"][:, burn_in:],
        "terminated": fields["terminated"][:, burn_in:],
        "truncated": fields["truncated"][:, burn_in:],
        "mask": fields["mask"][:, burn_in:],
        "starts_episode": fields["starts_episode"],
        "recurrent_state": torch.stack([warmed.h, warmed.c], 1),
        "prev_action": fields["action"][:, burn_in - 1],
        "prev_reward": fields["reward"][:, burn_in - 1],
    }
    online.zero_grad()
    cut_out = sequence_loss(online, target, cut, weights, dataclasses.replace(cfg.algo, burn_in=0))
    cut_out.loss.backward()
    assert torch.allclose(out.loss, cut_out.loss, atol=1e-6)
    assert torch.allclose(out.priorities, cut_out.priorities, atol=1e-6)
    for g, g_cut in zip(with_burn_in, grads(online), strict=True):
        assert torch.allclose(g, g_cut, atol=1e-6)

    # Through the observations: zero gradient on every burn-in step of a mid-episode sequence,
    # and a gradient on the first steps of a sequence that starts its episode (no burn-in).
    obs_grad = batch["obs"].clone().requires_grad_(True)
    online.zero_grad()
    loss = sequence_loss(online, target, {**batch, "obs": obs_grad}, torch.ones(len(mid)), cfg.algo)
    loss.loss.backward()
    assert obs_grad.grad[mid, :burn_in].abs().sum() == 0
    assert obs_grad.grad[mid, burn_in].abs().sum() > 0
    assert obs_grad.grad[~mid, 0].abs().sum() > 0


def test_the_learner_fits_a_fixed_batch_and_returns_sequence_priorities() -> None:
    cfg = tiny_config("algo.lr=0.003")
    fields = sequences_batch(cfg)
    n = len(fields["mask"])
    learner = learner_for(cfg)
    batch = SampledBatch(np.arange(n), fields, np.full(n, 1.0 / n), n)
    first = learner.compute_gradients(batch)
    learner.apply_gradients()
    for _ in range(60):
        last = learner.compute_gradients(batch)
        learner.apply_gradients()
    assert first.priorities.shape == (n,) and np.all(first.priorities > 0)
    assert last.metrics["learner/loss"] < 0.5 * first.metrics["learner/loss"]
    assert learner.num_updates == 61


def test_r2d2_config_errors_name_the_key() -> None:
    for bad, key in [
        ("algo.sequence_overlap=8", "algo.sequence_overlap"),
        ("algo.burn_in=9", "algo.burn_in"),
        ("algo.priority_eta=1.5", "algo.priority_eta"),
        ("algo.rescale_eps=0", "algo.rescale_eps"),
    ]:
        with pytest.raises(ConfigError, match=key):
            tiny_config(bad)


# --- over the wire -------------------------------------------------------------------------------


def test_the_stored_state_reaches_the_learner_unchanged_through_a_replay_server(
    procs: Processes, tmp_path: Path
) -> None:
    """Actor-made sequences go through a real replay server process and come back to the
    learner's batch stream with every stored state bit for bit."""
    cfg = tiny_config()
    envs, _, core = make_actor(cfg)
    chunks = collect(core, envs, 200)
    envs.close()
    sent = {
        name: np.concatenate([c["fields"][name] for c in chunks]) for name in chunks[0]["fields"]
    }
    num_items = len(sent["mask"])
    addr = free_addr()
    overrides = [
        *TINY,
        f"replay.min_size_to_sample={num_items}",
        "replay.samples_per_insert=0",
        f"learner.batch_size={num_items}",
    ]
    args = ["--config", str(CONFIG), "--run-dir", str(tmp_path / "run"), "--bind", addr]
    replay = procs.start("replay", "replay", *args, *set_args(overrides))
    wait_for_server(replay, addr)
    ctx = sockets.make_context()
    with sockets.closing(ctx):
        actor_sock = sockets.connect(ctx, zmq.DEALER, addr)
        for i, c in enumerate(chunks):
            chunk = builders.chunk(cfg, c["priorities"], **c["fields"])
            sockets.send(actor_sock, chunk)
            assert isinstance(sockets.recv(actor_sock, timeout_ms=5000), InsertAck), i
        learner_cfg = load_config(CONFIG, overrides)
        stream = BatchStream(
            sockets.connect(ctx, zmq.DEALER, addr), learner_cfg, torch.device("cpu")
        )
        stream.depth = 1
        batch = None
        for _ in range(100):
            batch = stream.next(timeout_ms=100)
            if batch is not None:
                break
        assert batch is not None, replay.tail()
    keys = batch.keys  # replay keys are insertion order: key i is the i-th sent sequence
    assert batch.fields["recurrent_state"].dtype == torch.float32
    for name in ("recurrent_state", "obs", "prev_action", "prev_reward", "mask"):
        got = batch.fields[name].numpy()
        assert np.array_equal(got, sent[name][keys]), name
    assert len(np.unique(keys)) > 1 and np.abs(sent["recurrent_state"][keys]).sum() > 0


# --- the roles, with the launcher ---------------------------------------------------------------

R2D2_SMALL = (
    *TINY,
    "env.num_envs=2",
    "actor.chunk_steps=8",
    "replay.capacity=2000",
    "replay.min_size_to_sample=16",
    "replay.samples_per_insert=2",
    "learner.batch_size=8",
    "learner.publish_period=5",
)


def test_r2d2_short_run_of_the_roles_ends_by_itself(
    launch: Callable[..., Launch],  # noqa: F811
) -> None:
    launched = launch(
        "--actors", "2", "--learners", "1", "--config", str(CONFIG),
        # An evaluation round of 4 games, not the config's 100: the training actors reach 4,000
        # steps in seconds, and the last record must already hold an evaluation return.
        overrides=(
            *R2D2_SMALL, "run.stop_env_steps=4000",
            "run.stop_eval_episodes=4", "actor.eval_num_envs=4",
        ),
    )  # fmt: skip
    code = launched.wait(150.0)
    assert code == 0, f"launcher exit code {code}\n{launched.tails()}"
    last = launched.results()[-1]
    assert last["done"] is True and last["env_steps"] >= 4000, last
    assert last["learner_updates"] > 0 and last["replay_size"] > 0, last
    assert last["eval_return_mean"] is not None and math.isfinite(last["eval_return_mean"]), last
    assert last["eval_episodes_in_window"] >= 4, last
    assert launched.run_dir().name.startswith("r2d2-apexrl-CartPoleNoVelocity-v1-")


def test_r2d2_with_two_learners_keeps_identical_weights(
    launch: Callable[..., Launch],  # noqa: F811
) -> None:
    launched = launch(
        "--actors", "2", "--learners", "2", "--no-eval", "--config", str(CONFIG),
        overrides=(*R2D2_SMALL, "run.stop_env_steps=4000"),
    )  # fmt: skip
    code = launched.wait(180.0)
    assert code == 0, f"launcher exit code {code}\n{launched.tails()}"
    digests = launched_digests(launched.run_dir() / "logs", 2)
    assert int(digests[0][0]) > 0
    assert digests[0] == digests[1], digests


def test_lstm_state_is_a_pair_of_batch_major_tensors() -> None:
    net = load_algorithm("r2d2").make_network(
        gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2), tiny_config()
    )
    state = net.initial_state(5)
    assert isinstance(state, LSTMState) and state.h.shape == (5, 8) == state.c.shape
    out = net(torch.zeros(4, 5, 3), torch.zeros(4, 5, dtype=torch.long), torch.zeros(4, 5), state)
    assert out.q.shape == (4, 5, 2) and out.state.h.shape == (5, 8)

"""Actors that step half of their envs while the network infers for the other half
(``actor.overlap``, ``apexrl.acting.stepping``), on real ale-py vector envs:

- the overlapped stepper gives every env, step for step, the trajectory the plain stepper gives it
  with the same seeds and actions: observations, actions, rewards, ``terminated`` and
  ``truncated``, final observations at episode ends, lives and what training sees of a lost life;
  only the weights version lags by one call (the next step's actions are chosen ahead);
- the actor overlaps only where it can (an asynchronous vector env, two envs or more, an
  asynchronous core) and each half has its own core (a recurrent core's state is per env);
- an actor process with overlap on streams chunks to a real replay server.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import Processes, free_addr, server_stats, set_args, wait_for_server, wait_until

from apexrl.acting.stepping import (
    ActedStep,
    OverlapStepper,
    PlainStepper,
    can_overlap,
    make_stepper,
)
from apexrl.algos import load_algorithm
from apexrl.config import load_config
from apexrl.envs import make_vector_env
from apexrl.envs.training import TrainingSignal

REPO = Path(__file__).resolve().parents[1]
BREAKOUT = REPO / "configs" / "apex_dqn_breakout.yaml"
PONG = REPO / "configs" / "apex_dqn_pong.yaml"


class ScriptedCore:
    """An actor core that plays ``actions[k, first_env + j]`` as env ``first_env + j``'s ``k``-th
    action, whatever it sees, and stores ``k`` as an extra."""

    synchronous = False

    def __init__(self, actions: np.ndarray, first_env: int, num_envs: int) -> None:
        self.envs = slice(first_env, first_env + num_envs)
        self.actions, self.num_envs, self.num_steps = actions, num_envs, 0

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        assert len(obs) == self.num_envs
        index = np.full(self.num_envs, self.num_steps, dtype=np.int64)
        return self.actions[self.num_steps, self.envs].copy(), {"step_index": index}

    def observe(self, action: np.ndarray, step) -> None:
        self.num_steps += 1


def play(stepper, seed: int, num_steps: int) -> tuple[np.ndarray, list[ActedStep]]:
    """Reset, then ``num_steps`` steps with weights version ``call // 7`` at each call."""
    obs = stepper.reset(seed)
    try:
        return obs, [stepper.step(t // 7) for t in range(num_steps)]
    finally:
        stepper.close()


def stacked(acted: list[ActedStep], field: str) -> np.ndarray:
    """``[T, B, ...]`` of one field of the steps (``step.<name>``, ``trained.<name>``,
    ``extras.<name>`` or an ActedStep field)."""
    part, _, name = field.partition(".")
    if not name:
        return np.stack([getattr(a, part) for a in acted])
    if part == "extras":
        return np.stack([a.extras[name] for a in acted])
    return np.stack([getattr(getattr(a, part), name) for a in acted])


def test_overlapped_halves_step_every_env_as_the_plain_stepper_does() -> None:
    """Breakout, 5 envs (halves of 3 and 2), sticky actions and no-op starts on, games cut at
    600 frames (150 steps), a lost life terminal for training: 400 steps cross game overs,
    truncations and lost lives in both halves."""
    cfg = load_config(
        BREAKOUT,
        [
            "env.num_envs=5",
            "env.atari.max_episode_frames=600",
            "env.atari.terminal_on_life_loss=true",
            "actor.overlap=true",
        ],
    )
    num_envs, num_steps, seed = 5, 400, 123
    actions = np.random.default_rng(0).integers(0, 4, (num_steps + 1, num_envs))

    plain = PlainStepper(
        make_vector_env(cfg.env, num_envs),
        ScriptedCore(actions, 0, num_envs),
        TrainingSignal(cfg.env),
    )
    plain_obs, plain_steps = play(plain, seed, num_steps)
    overlap = make_stepper(
        cfg,
        make_vector_env(cfg.env, num_envs),
        ScriptedCore(actions, 0, 3),
        lambda rng: ScriptedCore(actions, 3, 2),
        seed,
    )
    assert isinstance(overlap, OverlapStepper)
    assert (overlap.first.num_envs, overlap.second.num_envs) == (3, 2)
    overlap_obs, overlap_steps = play(overlap, seed, num_steps)

    np.testing.assert_array_equal(overlap_obs, plain_obs)
    fields = [
        "obs",
        "action",
        "extras.step_index",
        *(f"step.{name}" for name in ("obs", "next_obs", "reward", "terminated", "truncated")),
        "step.lives",
        *(f"trained.{name}" for name in ("obs", "next_obs", "reward", "terminated", "truncated")),
    ]
    for field in fields:
        np.testing.assert_array_equal(
            stacked(overlap_steps, field), stacked(plain_steps, field), err_msg=field
        )
    # The seams were crossed in both halves: game overs, truncations and lost lives.
    terminated, truncated = (
        stacked(plain_steps, "step.terminated"),
        stacked(plain_steps, "step.truncated"),
    )
    life_lost = stacked(plain_steps, "trained.terminated") & ~terminated
    for envs in (slice(0, 3), slice(3, 5)):
        assert terminated[:, envs].any() and truncated[:, envs].any() and life_lost[:, envs].any()
    # Where an episode ended, next_obs is the final observation, not the reset one in obs.
    ended = terminated | truncated
    final, reset = stacked(plain_steps, "step.next_obs"), stacked(plain_steps, "step.obs")
    assert all((final[t, i] != reset[t, i]).any() for t, i in np.argwhere(ended))
    # Each step's action was chosen on the observation before it.
    obs = stacked(overlap_steps, "obs")
    np.testing.assert_array_equal(obs[1:], reset[:-1])

    # The weights version: the plain stepper's is the call's; the overlapped stepper chooses the
    # actions of step t + 1 during call t, so they carry its version (one call early).
    calls = np.arange(num_steps) // 7
    np.testing.assert_array_equal(
        stacked(plain_steps, "extras.weights_version"), np.repeat(calls[:, None], 5, 1)
    )
    early = np.concatenate([calls[:1], calls[:-1]])
    np.testing.assert_array_equal(
        stacked(overlap_steps, "extras.weights_version"), np.repeat(early[:, None], 5, 1)
    )


def test_the_actor_overlaps_only_where_it_can() -> None:
    pong = ["env.num_envs=2", "actor.overlap=true"]
    cases = {
        "actor.overlap is off": (PONG, [*pong, "actor.overlap=false"]),
        "one env cannot be split": (PONG, [*pong, "env.num_envs=1"]),
        "asynchronous vector env": (
            REPO / "configs" / "apex_dqn_cartpole.yaml",
            ["env.num_envs=4", "actor.overlap=true"],
        ),
        "one weights version per chunk": (REPO / "configs" / "ppo_pong.yaml", pong),
        "": (PONG, pong),
    }
    for reason, (path, overrides) in cases.items():
        cfg = load_config(path, overrides)
        envs = make_vector_env(cfg.env, cfg.env.num_envs)
        try:
            algorithm = load_algorithm(cfg.algorithm)
            net = algorithm.make_network(
                envs.single_observation_space, envs.single_action_space, cfg
            )
            core = algorithm.actor_core(net, cfg, 0, False, "cpu", np.random.default_rng(0))
            why_not = can_overlap(cfg, envs, core)
        finally:
            envs.close()
        assert (reason in why_not) if reason else why_not == "", (path.name, why_not)


def test_a_recurrent_core_keeps_one_state_per_half() -> None:
    """R2D2 on Pong with 4 envs: two cores, each acting for its 2 envs with its own LSTM state;
    the steps put together carry the state of all 4 envs."""
    cfg = load_config(REPO / "configs" / "r2d2_pong.yaml", ["env.num_envs=4", "actor.overlap=true"])
    envs = make_vector_env(cfg.env, 4)
    algorithm = load_algorithm(cfg.algorithm)
    net = algorithm.make_network(envs.single_observation_space, envs.single_action_space, cfg)

    def new_core(rng: np.random.Generator):
        return algorithm.actor_core(net, cfg, 0, False, "cpu", rng)

    core = new_core(np.random.default_rng(0))
    stepper = make_stepper(cfg, envs, core, new_core, 0)
    assert isinstance(stepper, OverlapStepper)
    assert stepper.first.core is core and stepper.second.core is not core
    _, acted = play(stepper, 0, 3)
    for half in (stepper.first, stepper.second):
        assert half.core.state.h.shape[0] == 2  # [envs of the half, H]
    state = stacked(acted, "extras.recurrent_state")
    assert state.shape[:3] == (3, 4, 2)  # [T, B, (h, c), H]
    assert not state[0].any() and state[1].any()  # zero at the start, the LSTM's after a step


def test_an_actor_with_overlap_streams_chunks_to_replay(procs: Processes, tmp_path: Path) -> None:
    """A real replay server, parameter server and actor process: Ape-X on Pong, 4 envs in two
    halves, the actor's own initial network (no learner)."""
    replay_addr, params_addr = free_addr(), free_addr()
    run_dir = tmp_path / "run"
    overrides = set_args(
        [
            "env.num_envs=4",
            "actor.overlap=true",
            "actor.chunk_steps=4",
            "actor.report_interval_s=0.5",
            "replay.capacity=2000",
            "replay.min_size_to_sample=1000",
            "replay.samples_per_insert=0",
            "replay.report_interval_s=0.5",
            "run.stop_wall_s=0",
        ]
    )
    common = ["--config", str(PONG), "--run-dir", str(run_dir)]
    replay = procs.start("replay", "replay", *common, "--bind", replay_addr, *overrides)
    params = procs.start("params", "params", *common, "--bind", params_addr, *overrides)
    wait_for_server(replay, replay_addr)
    wait_for_server(params, params_addr)
    links = ["--replay", replay_addr, "--params", params_addr]
    actor = procs.start(
        "actor_0", "actor", *common, *links, "--id", "0", "--num-actors", "1", *overrides
    )

    def inserted() -> float:
        return (server_stats(replay_addr) or {}).get("replay/size", 0)

    assert wait_until(lambda: inserted() >= 200, 90), f"no chunks reached replay\n{procs.tails()}"
    stats = server_stats(replay_addr)
    assert stats["replay/rejected_messages"] == 0, stats
    assert stats["replay/env_steps"] >= 200, stats
    code, _ = actor.stop(timeout_s=15)
    assert code == 0, f"actor exit code {code}\n{actor.tail()}"
    assert "each half while inferring for the other" in actor.log(), actor.tail()


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """As actors infer (``actor.torch_threads``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

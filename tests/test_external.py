"""External environments: a policy server (``apexrl external``) turns the calls of
``PolicyClient``s into an actor's steps and replay items; refused calls change nothing; and a
CartPole stepped by a process outside apexrl trains a PPO run to its 475 evaluation, with remote
and with local inference, through the launcher a user runs (``--actors 0 --external 1``)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import zmq
from conftest import REPO

from apexrl import PolicyClient
from apexrl.config import load_config
from apexrl.external.client import ExternalError, policy_server_address
from apexrl.external.server import PolicyServer
from apexrl.runtime.metrics import MetricsWriter
from apexrl.transport import sockets
from apexrl.transport.external_messages import (
    ActionReply,
    EndEpisode,
    EpisodeAck,
    GetAction,
    LogAction,
    LogReturns,
    StartEpisode,
)
from apexrl.transport.messages import Error

CLIENT = b"client"


def make_server(tmp_path: Path, config: str, *overrides: str) -> PolicyServer:
    settings = ["actor.num_actors=1", "external.num_servers=1", *overrides]
    cfg = load_config(REPO / "configs" / config, settings)
    return PolicyServer(cfg, 0, "cpu", MetricsWriter(tmp_path / "tb"))


def call(server: PolicyServer, message: object, version: int = 0) -> object:
    """One call as the server's loop takes it: handled, acted on, answered."""
    server.handle(CLIENT, message)
    server.act(version)
    replies = [reply for _, reply in server.replies]
    server.replies.clear()
    return replies[-1] if replies else None


def obs(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_an_external_episode_is_cut_into_the_unrolls_an_actor_would_send(tmp_path) -> None:
    """IMPALA, unrolls of 4 steps: an episode of 3 steps (its rewards the sums of its
    log_returns, truncated at the end) and the first step of the next one, in the same lane, are
    one unroll whose fields are what the client said, step for step."""
    server = make_server(tmp_path, "impala_cartpole.yaml", "algo.unroll_length=4")
    observations = [obs(i, 0.1 * i, -i, 0.5) for i in range(6)]
    assert call(server, StartEpisode("a")) == EpisodeAck("a")
    actions = []
    for t, rewards in enumerate([(1.0, 0.5), (2.0,), (0.25, 0.25)]):
        reply = call(server, GetAction("a", observations[t]))
        assert isinstance(reply, ActionReply) and reply.weights_version == 0
        actions.append(int(reply.action))
        for reward in rewards:
            assert call(server, LogReturns("a", reward)) == EpisodeAck("a")
    assert call(server, EndEpisode("a", observations[3], truncated=True)) == EpisodeAck("a")
    assert server.metrics.finished_returns == [4.0] and server.metrics.finished_lengths == [3]
    assert not server.chunks and server.metrics.env_steps == 0  # 3 steps of 4: none claimed
    call(server, StartEpisode("b"))
    actions.append(int(call(server, GetAction("b", observations[4])).action))
    call(server, EndEpisode("b", observations[5]))  # terminated
    (chunk,) = server.chunks
    fields = chunk.fields
    assert chunk.actor_id == 0 and chunk.env_steps == 4 and len(chunk.priorities) == 1
    assert server.metrics.env_steps == 4  # reports count what the chunks claim
    np.testing.assert_array_equal(fields["obs"][0], np.stack(observations[:3] + [observations[4]]))
    np.testing.assert_array_equal(fields["action"][0], actions)
    np.testing.assert_array_equal(fields["reward"][0], [1.5, 2.0, 0.5, 0.0])
    np.testing.assert_array_equal(fields["terminated"][0], [False, False, False, True])
    np.testing.assert_array_equal(fields["truncated"][0], [False, False, True, False])
    expected_next = observations[1:4] + [observations[5]]
    np.testing.assert_array_equal(fields["next_obs"][0], np.stack(expected_next))
    np.testing.assert_array_equal(fields["weights_version"][0], [0, 0, 0, 0])
    assert np.all(fields["behaviour_logp"][0] < 0)


def test_refused_calls_get_the_reason_and_change_nothing(tmp_path) -> None:
    server = make_server(tmp_path, "ppo_cartpole.yaml", "external.max_episodes=2")
    call(server, StartEpisode("a"))
    call(server, GetAction("a", obs(0, 0, 0, 0)))
    before = (dict(server.lanes.episodes), server.lanes.stored_steps, len(server.chunks))
    refused = {
        "is not open": GetAction("nobody", obs(0, 0, 0, 0)),
        "already open": StartEpisode("a"),
        "has shape \\(3,\\)": GetAction("a", obs(0, 0, 0)),
        "NaN": EndEpisode("a", obs(0, np.nan, 0, 0)),
        "on-policy family": LogAction("a", obs(0, 0, 0, 0), np.array(1)),
        "not the core's": LogAction(
            "a", obs(0, 0, 0, 0), np.array(1), 0, {"q_taken": np.array(1.0, np.float32)}, True
        ),
    }
    for reason, message in refused.items():
        reply = call(server, message)
        assert isinstance(reply, Error), (reason, reply)
        assert re.search(reason, reply.reason), (reason, reply.reason)
        assert (dict(server.lanes.episodes), server.lanes.stored_steps) == before[:2]
        assert len(server.chunks) == before[2]
    call(server, StartEpisode("b"))
    reply = call(server, StartEpisode("c"))
    assert isinstance(reply, Error) and "external.max_episodes" in reply.reason
    assert sorted(server.lanes.episodes) == ["a", "b"]
    # A second request for the same episode while the first waits for its action.
    server.handle(CLIENT, GetAction("b", obs(0, 0, 0, 0)))
    server.handle(CLIENT, GetAction("b", obs(1, 1, 1, 1)))
    assert isinstance(server.replies[-1][1], Error) and len(server.waiting) == 1


def test_ppo_holds_the_actions_once_its_share_of_a_version_is_cut(tmp_path) -> None:
    """PPO, 2 unrolls of 2 steps per version: after they are cut the server answers no action
    until the next version, and a lane with steps of the old version starts its unroll again."""
    server = make_server(tmp_path, "ppo_cartpole.yaml", "algo.unroll_length=2", "env.num_envs=2")
    call(server, StartEpisode("a"))
    call(server, StartEpisode("b"))
    assert isinstance(call(server, GetAction("b", obs(9, 9, 9, 9))), ActionReply)  # 1 step of b
    for t in range(4):
        assert isinstance(call(server, GetAction("a", obs(t, 0, 0, 0))), ActionReply)
    assert call(server, GetAction("a", obs(4, 0, 0, 0))) is None  # held: version 0's share is cut
    assert len(server.chunks) == 2 and server.holding(0)
    assert server.lanes.cut_per_version[0] == 2
    reply = call(server, GetAction("b", obs(8, 8, 8, 8)), version=1)  # "b"'s step of version 0
    assert isinstance(reply, ActionReply) and reply.weights_version == 1
    assert server.lanes.dropped_steps == 1  # b's step of version 0 came after the share was cut
    assert not server.waiting  # a's held request was answered too
    assert server.lanes.episodes["a"].pending.version == 1


def test_off_policy_families_take_logged_actions_with_their_priorities(tmp_path) -> None:
    server = make_server(tmp_path, "apex_dqn_cartpole.yaml")
    call(server, StartEpisode("a"))
    assert call(server, LogAction("a", obs(0, 0, 0, 0), np.array(1))) == EpisodeAck("a")
    step = server.lanes.episodes["a"].pending
    q = server.core.q_values(obs(0, 0, 0, 0)[None])[0]
    assert int(step.action) == 1 and step.extras["q_taken"] == pytest.approx(q[1])
    reply = call(server, LogAction("a", obs(0, 0, 0, 0), np.array(2)))
    assert isinstance(reply, Error) and "outside 0..1" in reply.reason


def test_each_chunk_claims_the_env_steps_its_items_account_for(tmp_path) -> None:
    """Ape-X, 3-step transitions, chunks of 16: a lane's block is 18 steps, of which the last 2
    wait for the next block's windows; each chunk claims 16 env steps, so that replay's check
    of claimed against stored steps holds however many lanes hold steps uncut."""
    server = make_server(tmp_path, "apex_dqn_cartpole.yaml")
    for lane in ("a", "b", "c"):
        call(server, StartEpisode(lane))
    for t in range(35):
        for lane in ("a", "b", "c"):
            call(server, LogAction(lane, obs(t, 0, 0, 0), np.array(t % 2)))
    assert [chunk.env_steps for chunk in server.chunks] == [16] * 6
    assert all(len(chunk.priorities) == 16 for chunk in server.chunks)


# --- a launched run and a client outside it ------------------------------------------------------


def play(client: PolicyClient, env: gym.Env, seed: int) -> float:
    episode = client.start_episode()
    observation, _ = env.reset(seed=seed)
    total = 0.0
    while True:
        action = client.get_action(episode, observation)
        observation, reward, terminated, truncated, _ = env.step(int(action))
        client.log_returns(episode, reward)
        total += reward
        if terminated or truncated:
            client.end_episode(episode, observation, truncated=truncated)
            return total


def check_hostile_calls(address: str, keys: Path) -> None:
    """Over the run's CURVE link: unknown episodes and wrong shapes are refused with the reason;
    a client without the run's keys gets no answer at all."""
    with PolicyClient(address, keys_dir=str(keys), timeout_s=10) as client:
        with pytest.raises(ExternalError, match="is not open"):
            client.get_action("nobody", np.zeros(4, np.float32))
        episode = client.start_episode()
        with pytest.raises(ExternalError, match="has shape"):
            client.get_action(episode, np.zeros(5, np.float32))
        client.end_episode(episode, np.zeros(4, np.float32))
    with PolicyClient(address, timeout_s=2) as stranger:
        with pytest.raises(ExternalError, match="no answer"):
            stranger.start_episode()


# The fast suite drives a launched run through examples/external_env_client.py (test_examples).
@pytest.mark.slow
@pytest.mark.parametrize("inference", ["remote", "local"])
def test_a_cartpole_outside_apexrl_trains_ppo_to_its_evaluation(tmp_path, inference) -> None:
    run_dir = tmp_path / "run"
    args = ["--config", str(REPO / "configs" / "ppo_cartpole.yaml"), "--actors", "0"]
    args += ["--external", "1", "--run-dir", str(run_dir), "--set", "run.stop_wall_s=300"]
    launcher = subprocess.Popen(
        ["bash", str(REPO / "scripts" / "launch_local.sh"), *args],
        stdout=open(tmp_path / "launcher.log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    started = time.monotonic()
    try:
        address = policy_server_address(run_dir, timeout_s=120)
        if inference == "remote":
            check_hostile_calls(address, run_dir / "keys")
        env = gym.make("CartPole-v1")
        episodes = 0
        with PolicyClient(address, inference, str(run_dir / "keys"), timeout_s=10) as client:
            try:
                while launcher.poll() is None and time.monotonic() - started < 330:
                    play(client, env, seed=episodes)
                    episodes += 1
            except ExternalError:
                pass  # the run ended: its policy server stopped answering
        assert launcher.wait(timeout=60) == 0, (tmp_path / "launcher.log").read_text()[-3000:]
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGTERM)
            launcher.wait(timeout=30)
    last = json.loads((run_dir / "result.json").read_text().splitlines()[-1])
    print(
        f"\nPPO CartPole through PolicyClient({inference!r}): eval {last['eval_return_mean']} "
        f"after {last['time_s']:.0f} s of learner time, {last['env_steps']} env steps, "
        f"{episodes} client episodes"
    )
    assert last["eval_return_mean"] >= 475 and last["time_s"] <= 300


def test_q_values_serve_acting_and_priorities_at_the_same_batch_size(tmp_path) -> None:
    """A lane's priorities (inside inference mode) and an action for as many episodes (outside
    it) share the Q-network's buffers of that batch size."""
    server = make_server(tmp_path, "apex_dqn_cartpole.yaml")
    batch = np.zeros((18, 4), np.float32)
    with torch.inference_mode():
        inside = server.core.q_values(batch).copy()
    action, extras = server.core.act(batch)
    np.testing.assert_array_equal(extras["q_taken"], inside[np.arange(18), action])


def test_a_local_inference_action_is_stored_as_chosen_and_a_logged_one_in_the_envs_units(
    tmp_path,
) -> None:
    """SAC on Pendulum (torque in [-2, 2], the network's actions in [-1, 1], no extras on a
    uniform table): a client's local action 0.5 is stored as 0.5; a logged torque of 1.0 is
    the network's 0.5; a logged torque outside the bounds is refused."""
    server = make_server(tmp_path, "sac_pendulum.yaml")
    call(server, StartEpisode("a"))
    state = np.zeros(3, np.float32)
    local = LogAction("a", state, np.array([0.5], np.float32), 3, {}, True)
    assert call(server, local) == EpisodeAck("a")
    assert server.lanes.episodes["a"].pending.action.tolist() == [0.5]
    assert server.lanes.episodes["a"].pending.version == 3
    assert call(server, LogAction("a", state, np.array([1.0], np.float32))) == EpisodeAck("a")
    assert server.lanes.episodes["a"].pending.action.tolist() == [0.5]
    reply = call(server, LogAction("a", state, np.array([2.5], np.float32)))
    assert isinstance(reply, Error) and "bounds" in reply.reason


def test_a_late_answer_is_not_taken_for_the_next_call() -> None:
    """A call that got no answer in time leaves the client on a fresh socket: the server's late
    answer to it goes nowhere, and the next call gets its own."""
    ctx = zmq.Context()
    router = sockets.bind(ctx, zmq.ROUTER, "tcp://127.0.0.1:0")
    address = sockets.bound_address(router)

    def serve() -> None:
        first = router.recv_multipart()
        second = router.recv_multipart()
        sockets.send_to(router, first[0], EpisodeAck("a"))  # late, to the first socket
        sockets.send_to(router, second[0], EpisodeAck("b"))

    server = threading.Thread(target=serve)
    server.start()
    client = PolicyClient(address, timeout_s=0.5)
    try:
        with pytest.raises(ExternalError, match="no answer"):
            client.start_episode("a")
        assert client.start_episode("b") == "b"
    finally:
        server.join(timeout=10)
        client.close()
        router.close(linger=0)
        ctx.term()

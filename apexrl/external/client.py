"""``PolicyClient``: an environment apexrl does not step, driven from its own process.

    from apexrl import PolicyClient

    with PolicyClient("tcp://127.0.0.1:6100", inference="remote", keys_dir="run/keys") as client:
        episode = client.start_episode()
        obs, _ = env.reset()
        while True:
            action = client.get_action(episode, obs)
            obs, reward, terminated, truncated, _ = env.step(action)
            client.log_returns(episode, reward)
            if terminated or truncated:
                client.end_episode(episode, obs, truncated=truncated)
                break

``inference="remote"``: every call is one request to the policy server (``apexrl external``),
which batches the ``get_action`` of all its clients' episodes into one forward pass and answers
each call in turn; a refused call raises ``ExternalError`` with the server's reason.

``inference="local"``: the client asks the server for the run's config once, builds the run's
network and actor core itself, keeps the parameter server's newest weights in it (the same
``ParamsClient`` an actor has) and acts without a round trip; each step goes to the policy
server as a ``LogAction`` with the core's extras, without waiting for the answer. Answers are
read on later calls: a refused one raises ``ExternalError`` there, and ``close`` waits for the
last. The env must be makeable here (the run's ``env.id``), and the parameter server reachable
(``params_addr``, the config's by default).

``keys_dir``: the run's CURVE keys (the actors' bundle, or a whole ``apexrl keys`` directory);
"" when the run has none.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import yaml
import zmq

from apexrl.transport import auth, sockets
from apexrl.transport.codec import DecodeError
from apexrl.transport.external_messages import (
    ActionReply,
    EndEpisode,
    EpisodeAck,
    ExternalHello,
    ExternalSetup,
    GetAction,
    LogAction,
    LogReturns,
    StartEpisode,
)
from apexrl.transport.messages import Error

INFERENCE = ("remote", "local")
CLOSE_WAIT_S = 5.0  # local inference: how long close() waits for the answers still due
MAX_UNANSWERED = 512  # local inference: calls sent and not yet answered before the client waits


class ExternalError(RuntimeError):
    """The policy server refused a call, or did not answer."""


def policy_server_address(run_dir: str | Path, index: int = 0, timeout_s: float = 60.0) -> str:
    """The address of policy server ``external_<index>`` of a run the local launcher started:
    its ``addr`` in ``<run dir>/roles.json`` once it is running (``ExternalError`` when it is
    not within ``timeout_s``)."""
    path = Path(run_dir) / "roles.json"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            for role in json.loads(path.read_text())["roles"]:
                if role["name"] == f"external_{index}" and role["state"] == "running":
                    return role["addr"]
        except (OSError, ValueError, KeyError, TypeError):
            pass  # not written yet, or being replaced
        if time.monotonic() > deadline:
            raise ExternalError(f"no running policy server external_{index} in {path}")
        time.sleep(0.2)


class PolicyClient:
    """One connection to a policy server; use it from one thread."""

    def __init__(
        self,
        address: str,
        inference: str = "remote",
        keys_dir: str = "",
        timeout_s: float = 60.0,
        params_addr: str | None = None,
    ) -> None:
        if inference not in INFERENCE:
            raise ValueError(f"inference must be one of {', '.join(INFERENCE)}, got {inference!r}")
        self.address, self.inference, self.timeout_s = address, inference, timeout_s
        self.ctx = zmq.Context()
        self.curve = auth.external_client_keys(keys_dir)
        self.sock = sockets.connect(self.ctx, zmq.DEALER, address, curve=self.curve)
        self.unanswered = 0  # local inference: calls sent whose answer was not read yet
        self.local: LocalInference | None = None
        try:
            if inference == "local":
                setup = self._call(ExternalHello())
                self.local = LocalInference(setup, keys_dir, params_addr, self.ctx, timeout_s)
        except BaseException:
            self.close()
            raise

    # --- the calls ---------------------------------------------------------------------------

    def start_episode(self, episode_id: str | None = None, training_enabled: bool = True) -> str:
        """Open an episode (a new id when none is given); returns its id."""
        episode_id = uuid.uuid4().hex if episode_id is None else episode_id
        self._send(StartEpisode(episode_id, training_enabled))
        return episode_id

    def get_action(self, episode_id: str, obs: Any) -> np.ndarray:
        """The action to take on ``obs``, in the env's own units."""
        if self.local is None:
            reply = self._call(GetAction(episode_id, np.asarray(obs)))
            return reply.action
        self._read_answers()
        step = self.local.act(np.asarray(obs))
        self._send(LogAction(episode_id, step.obs, step.action, step.version, step.extras, True))
        return step.env_action

    def log_action(self, episode_id: str, obs: Any, action: Any) -> None:
        """An action taken on ``obs`` that the policy did not choose (off-policy families)."""
        self._send(LogAction(episode_id, np.asarray(obs), np.asarray(action)))

    def log_returns(self, episode_id: str, reward: float) -> None:
        """Reward since the last action (several calls add up)."""
        self._send(LogReturns(episode_id, float(reward)))

    def end_episode(self, episode_id: str, obs: Any, truncated: bool = False) -> None:
        """The episode ended on ``obs``: terminated, or cut off (``truncated``)."""
        self._send(EndEpisode(episode_id, np.asarray(obs), bool(truncated)))

    def close(self) -> None:
        """Read the answers still due (local inference; a refusal among them raises), waiting
        at most ``CLOSE_WAIT_S`` for a server that may have gone with its run, then close."""
        try:
            deadline = time.monotonic() + min(self.timeout_s, CLOSE_WAIT_S)
            while self.unanswered and self.sock.poll(
                max(int((deadline - time.monotonic()) * 1000), 0), zmq.POLLIN
            ):
                self.unanswered -= 1
                self._answer(0)
        finally:
            if self.local is not None:
                self.local.close()
            self.sock.close(linger=0)
            self.ctx.term()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the wire ------------------------------------------------------------------------------

    def _send(self, call: object) -> None:
        if self.local is None:
            self._call(call)
            return
        sockets.send(self.sock, call)
        self.unanswered += 1
        self._read_answers(wait_for_all=self.unanswered > MAX_UNANSWERED)

    def _call(self, call: object) -> Any:
        """Send one call and wait for its answer; ``ExternalError`` when it was refused."""
        sockets.send(self.sock, call)
        reply = self._answer(int(self.timeout_s * 1000))
        if not isinstance(reply, (EpisodeAck, ActionReply, ExternalSetup)):
            raise ExternalError(f"policy server at {self.address} answered {type(reply).__name__}")
        if getattr(reply, "episode_id", None) != getattr(call, "episode_id", None):
            raise ExternalError(f"policy server at {self.address} answered another episode")
        return reply

    def _answer(self, timeout_ms: int) -> object:
        try:
            reply = sockets.recv(self.sock, timeout_ms)
        except DecodeError as exc:
            raise ExternalError(f"policy server at {self.address} sent no message: {exc}") from exc
        if reply is None:
            # A fresh socket: an answer that comes late is not taken for the next call's.
            self.sock.close(linger=0)
            self.sock = sockets.connect(self.ctx, zmq.DEALER, self.address, curve=self.curve)
            self.unanswered = 0
            raise ExternalError(
                f"no answer from the policy server at {self.address} for {self.timeout_s:.0f} s"
            )
        if isinstance(reply, Error):
            raise ExternalError(f"policy server at {self.address}: {reply.reason}")
        return reply

    def _read_answers(self, wait_for_all: bool = False) -> None:
        """Local inference: read the answers that are there (all that are due with
        ``wait_for_all``); the first refusal raises."""
        while self.unanswered:
            if not wait_for_all and not self.sock.poll(0, zmq.POLLIN):
                return
            self.unanswered -= 1
            self._answer(int(self.timeout_s * 1000))


@dataclasses.dataclass
class LocalStep:
    obs: np.ndarray
    action: np.ndarray  # as the network chose it
    env_action: np.ndarray  # as the env takes it
    extras: dict[str, np.ndarray]
    version: int


class LocalInference:
    """The run's network and actor core in the client, with the parameter server's weights."""

    def __init__(
        self,
        setup: ExternalSetup,
        keys_dir: str,
        params_addr: str | None,
        ctx: zmq.Context,
        timeout_s: float,
    ) -> None:
        # torch and the algorithms are imported only by clients that infer themselves
        from apexrl.acting.startup import make_envs_and_network
        from apexrl.clients.params import ParamsClient, params_link, wait_for_weights
        from apexrl.config import config_from_dict
        from apexrl.external.spaces import ExternalSpaces, unsupported

        cfg = config_from_dict(yaml.safe_load(setup.config_yaml))
        net_cfg = dataclasses.replace(
            cfg.net, keys_dir=keys_dir, params_addr=params_addr or cfg.net.params_addr
        )
        problem = unsupported(cfg)
        if problem:
            raise ExternalError(problem)
        self.spaces = ExternalSpaces(cfg)
        envs, algorithm, net = make_envs_and_network(cfg, 1, "cpu", "fp32")
        envs.close()
        rng = np.random.default_rng(cfg.env.seed + 10_000 * setup.actor_id + 1)
        self.core = algorithm.actor_core(net, cfg, setup.actor_id, False, "cpu", rng)
        self.params = ParamsClient(params_link(ctx, net_cfg, "actor"), net, timeout_s)
        self.poll_steps, self.steps = cfg.actor.params_poll_steps, 0
        never = threading.Event()
        wait_for_weights(self.params, never, self.core.synchronous, timeout_s)

    def act(self, obs: np.ndarray) -> LocalStep:
        from apexrl.clients.peers import PeerShutdown

        params = self.params
        try:
            params.poll()
            self.steps += 1
            if self.core.synchronous or self.steps >= self.poll_steps:
                self.steps = 0
                params.request()  # one in flight: a synchronous core gets each version soon
        except PeerShutdown as exc:
            raise ExternalError(f"the run is over: {exc}") from exc
        obs = self.spaces.obs_in(obs)
        actions, extras = self.core.act(obs[None])
        action = np.asarray(actions[0])
        one = {name: np.asarray(value[0]) for name, value in extras.items()}
        return LocalStep(obs, action, self.spaces.action_out(action), one, params.version)

    def close(self) -> None:
        self.params.link.close()

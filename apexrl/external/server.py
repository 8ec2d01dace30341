"""Policy server (``apexrl external``): an actor whose envs are stepped elsewhere.

Binds:     ROUTER cfg.external.addr    in: ExternalHello, StartEpisode, GetAction, LogAction,
                                           LogReturns, EndEpisode
                                       out: ExternalSetup, ActionReply, EpisodeAck, Error
Connects:  as an actor (``apexrl.actor``): DEALER net.params_addr and net.replay_addr

External processes reach it through ``apexrl.PolicyClient``. Each turn of the loop reads the
calls that arrived (``external.max_calls_per_turn`` at most), answers them, acts for every
episode that asked for an action with one batched forward pass of the run's actor core, sends
the replay items its lanes cut (``apexrl.external.lanes``) and reads its servers' replies, as an
actor does at a block's end. Server ``i`` is actor id ``actor.num_actors - external.num_servers +
i``: replay, the learner's rollout (PPO counts ``env.num_envs`` unrolls per actor id) and the
exploration schedules count it as one more actor.

A client with local inference (``PolicyClient(inference="local")``) asks for the run's config
(``ExternalHello``), acts with the parameter server's weights itself and sends each step with
its extras (``LogAction``); the server checks them against what its own core stores.

A call that cannot be taken (unknown or duplicate episode, an observation or action the env
does not have, extras of another core, more open episodes than ``external.max_episodes``) is
answered with an ``Error`` that says why, and changes nothing.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch
import zmq

from apexrl.acting.chunks import ChunkNumbers, make_chunk
from apexrl.acting.episodes import EpisodeMetrics
from apexrl.acting.startup import make_envs_and_network
from apexrl.actor import connect
from apexrl.clients.params import ParamsClient
from apexrl.clients.peers import PeerShutdown
from apexrl.clients.replay import ReplayClient
from apexrl.config import Config, dump_config
from apexrl.external.lanes import CutItems, Episode, Lanes, PendingStep
from apexrl.external.spaces import ExternalSpaces, SpaceError, unsupported
from apexrl.runtime import lifecycle, rundir
from apexrl.runtime.metrics import MetricsWriter
from apexrl.transport import auth, gate, sockets
from apexrl.transport.external_messages import (
    CLIENT_CALLS,
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
from apexrl.transport.messages import Error, TrajectoryChunk

log = logging.getLogger(__name__)

MAX_QUEUED_CHUNKS = 8  # chunks cut and not yet sent before the server waits for replay


class CallError(ValueError):
    """A client call that is refused: its text is the ``Error`` the client gets."""


@dataclass
class ActionWait:
    identity: bytes
    episode_id: str
    obs: np.ndarray


def actor_id_of(cfg: Config, index: int) -> int:
    servers = cfg.external.num_servers
    if not 0 <= index < servers:
        raise lifecycle.StartupError(
            f"policy server {index} is outside 0..{servers - 1} (external.num_servers {servers})"
        )
    return cfg.actor.num_actors - servers + index


class PolicyServer:
    """The calls of external episodes turned into an actor's steps, items and chunks."""

    def __init__(self, cfg: Config, index: int, device: str, writer: MetricsWriter) -> None:
        problem = unsupported(cfg)
        if problem:
            raise lifecycle.StartupError(problem)
        try:
            self.spaces = ExternalSpaces(cfg)
        except SpaceError as exc:
            raise lifecycle.StartupError(str(exc)) from exc
        self.cfg, self.actor_id = cfg, actor_id_of(cfg, index)
        envs, algorithm, self.net = make_envs_and_network(cfg, 1, device, "fp32")
        envs.close()
        rng = np.random.default_rng(cfg.env.seed + 10_000 * self.actor_id)
        self.core = algorithm.actor_core(self.net, cfg, self.actor_id, False, device, rng)
        self.lanes = Lanes(self.core, share=cfg.env.num_envs)
        self.probe_action, self.probe_extras = self._probe()
        self.incarnation, self.numbers = lifecycle.new_incarnation(), ChunkNumbers()
        report_s = cfg.actor.report_interval_s
        self.metrics = EpisodeMetrics(writer, 1, self.actor_id, self.incarnation, False, report_s)
        self.steps_since_poll = 0
        self.waiting: list[ActionWait] = []
        self.chunks: deque[TrajectoryChunk] = deque()
        self.replies: list[tuple[bytes, object]] = []

    def _probe(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """One action of the core on a zero observation: the dtypes and shapes it stores."""
        space = self.spaces.obs_space
        action, extras = self.core.act(np.zeros((1, *space.shape), space.dtype))
        return action[0], {name: value[0] for name, value in extras.items()}

    # --- the calls ---------------------------------------------------------------------------

    def handle(self, identity: bytes, call: object) -> None:
        """Answer one call (or queue it for the batched action); a refused call gets an
        ``Error`` and changes nothing."""
        try:
            reply = self._take(identity, call)
        except (CallError, SpaceError) as exc:
            reply = Error(str(exc))
        if reply is not None:
            self.replies.append((identity, reply))

    def _take(self, identity: bytes, call: object) -> object | None:
        if isinstance(call, ExternalHello):
            return ExternalSetup(dump_config(self.cfg), self.actor_id)
        if isinstance(call, StartEpisode):
            self._start(call)
        elif isinstance(call, GetAction):
            episode = self._open(call.episode_id)
            obs = self.spaces.obs_in(call.obs)
            self._follow(episode, obs, False, False)
            self.waiting.append(ActionWait(identity, call.episode_id, obs))
            return None
        elif isinstance(call, LogAction):
            self._log_action(call)
        elif isinstance(call, LogReturns):
            episode = self._open(call.episode_id)
            if episode.pending is not None:
                episode.pending.reward += call.reward
            else:
                episode.episode_return += call.reward
        elif isinstance(call, EndEpisode):
            self._end(call)
        else:
            raise CallError(f"a policy server does not take {type(call).__name__}")
        return EpisodeAck(call.episode_id)

    def _start(self, call: StartEpisode) -> None:
        if call.episode_id in self.lanes.episodes:
            raise CallError(f"episode {call.episode_id!r} is already open")
        limit = self.cfg.external.max_episodes
        if len(self.lanes.episodes) >= limit:
            raise CallError(
                f"{limit} episodes are open (external.max_episodes): end one before starting "
                f"{call.episode_id!r}"
            )
        self.lanes.start(call.episode_id, call.training)

    def _open(self, episode_id: str) -> Episode:
        episode = self.lanes.episodes.get(episode_id)
        if episode is None:
            raise CallError(f"episode {episode_id!r} is not open (start_episode first)")
        if any(wait.episode_id == episode_id for wait in self.waiting):
            raise CallError(f"episode {episode_id!r} is still waiting for its action")
        return episode

    def _log_action(self, call: LogAction) -> None:
        episode = self._open(call.episode_id)
        obs = self.spaces.obs_in(call.obs)
        if call.local:  # a client's local inference: the network's own action
            action = self._checked_action(call.action)
            extras = self._checked_extras(call.extras)
        elif hasattr(self.core, "logged_extras"):
            action = self.spaces.action_in(call.action).astype(self.probe_action.dtype)
            one = self.core.logged_extras(obs[None], action[None])
            extras = {name: value[0] for name, value in one.items()}
        else:
            raise CallError(
                f"log_action needs the extras of {self.cfg.algorithm}'s actor core: an "
                "on-policy family learns from its own actions only (use get_action)"
            )
        self._follow(episode, obs, False, False)
        episode.pending = PendingStep(obs, action, extras, call.weights_version)

    def _checked_action(self, action: np.ndarray) -> np.ndarray:
        """An action as the network chose it: the core's shape and dtype, in range."""
        want = self.probe_action
        if action.shape != want.shape or not np.can_cast(action.dtype, want.dtype, "same_kind"):
            raise CallError(
                f"action is {action.dtype} {action.shape}, the network's {want.dtype} {want.shape}"
            )
        action = action.astype(want.dtype)
        if self.spaces.discrete:
            self.spaces.action_in(action)  # the range check
        elif not np.isfinite(action).all():
            raise CallError("action holds a NaN or an infinity")
        return action

    def _checked_extras(self, extras: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        expected = self.probe_extras
        if extras.keys() != expected.keys():
            raise CallError(f"extras {sorted(extras)} are not the core's {sorted(expected)}")
        checked = {}
        for name, value in extras.items():
            want = expected[name]
            if value.shape != want.shape or not np.can_cast(value.dtype, want.dtype, "same_kind"):
                raise CallError(
                    f"extras[{name!r}] is {value.dtype} {value.shape}, the core's "
                    f"{want.dtype} {want.shape}"
                )
            checked[name] = value.astype(want.dtype)
            if checked[name].dtype.kind == "f" and not np.isfinite(checked[name]).all():
                raise CallError(f"extras[{name!r}] holds a NaN or an infinity")
        return checked

    def _end(self, call: EndEpisode) -> None:
        episode = self._open(call.episode_id)
        obs = self.spaces.obs_in(call.obs)
        self._follow(episode, obs, not call.truncated, call.truncated)
        self.lanes.end(call.episode_id)
        if episode.lane is not None and episode.length > 0:
            self.metrics.add_episode(episode.episode_return, episode.length)

    def _follow(self, episode: Episode, obs: np.ndarray, terminated: bool, truncated: bool) -> None:
        cut = self.lanes.follow(episode, obs, terminated, truncated)
        if cut is not None:
            self._queue(cut)

    def _queue(self, cut: CutItems) -> None:
        chunk = make_chunk(
            self.cfg,
            self.actor_id,
            self.incarnation,
            self.numbers.take(),
            cut.weights_version,
            cut.env_steps,
            cut.fields,
            cut.priorities,
        )
        if chunk is not None:
            self.chunks.append(chunk)
            # The env steps reported are those the chunks claim: replay holds each report to
            # its actor's chunks, and a lane's uncut (or, for PPO, dropped) steps claim none.
            self.metrics.count_steps(chunk.env_steps)
            self.steps_since_poll += chunk.env_steps

    # --- acting --------------------------------------------------------------------------------

    def holding(self, version: int) -> bool:
        """A synchronous core waits for the learner's weights, and for a newer version once this
        server has cut its share of the current one."""
        return self.core.synchronous and (version < 0 or self.lanes.share_full(version))

    def act(self, version: int) -> None:
        """One forward pass for every episode waiting for an action, and their replies."""
        if not self.waiting or self.holding(version):
            return
        waits, self.waiting = self.waiting, []
        actions, extras = self.core.act(np.stack([wait.obs for wait in waits]))
        for i, wait in enumerate(waits):
            episode = self.lanes.episodes[wait.episode_id]
            step_extras = {name: value[i] for name, value in extras.items()}
            episode.pending = PendingStep(wait.obs, actions[i], step_extras, version)
            reply = ActionReply(wait.episode_id, self.spaces.action_out(actions[i]), version)
            self.replies.append((wait.identity, reply))

    def send_replies(self, sock: zmq.Socket) -> None:
        for identity, reply in self.replies:
            sockets.send_to(sock, identity, reply)
        self.replies.clear()

    def send_chunks(self, replay: ReplayClient) -> None:
        """Send the next chunk when replay acknowledged the last; past ``MAX_QUEUED_CHUNKS``
        wait for replay (its rate limiter then holds the external episodes back)."""
        replay.poll()
        while self.chunks and (not replay.awaiting_ack or len(self.chunks) > MAX_QUEUED_CHUNKS):
            replay.send_chunk(self.chunks.popleft())


def client_gate(server: PolicyServer) -> gate.RoleGate:
    """What a client may send: the calls, each at most a few observations' bytes."""
    obs_bytes = int(np.prod(server.spaces.obs_space.shape)) * 8
    return gate.role_gate("actor", CLIENT_CALLS, gate.SMALL_MESSAGE_BYTES + 4 * obs_bytes)


def bind(ctx: zmq.Context, cfg: Config, actor_id: int) -> zmq.Socket:
    curve = auth.external_server_keys(cfg.net, cfg.external.addr, actor_id)
    try:
        return sockets.bind(ctx, zmq.ROUTER, cfg.external.addr, curve=curve)
    except zmq.ZMQError as exc:
        raise lifecycle.StartupError(f"cannot bind {cfg.external.addr}: {exc}") from exc


def read_calls(
    sock: zmq.Socket, server: PolicyServer, client: gate.RoleGate, timeout_ms: int
) -> None:
    """Take the calls that arrived within ``timeout_ms``, at most ``max_calls_per_turn``."""
    gates = {"actor": client} if server.cfg.net.keys_dir else None
    for n in range(server.cfg.external.max_calls_per_turn):
        wait_ms = timeout_ms if n == 0 else 0
        received = sockets.recv_from(sock, wait_ms, limits=client.limits, gates=gates)
        if received is None:
            return
        if received.error is not None:
            server.replies.append((received.identity, Error(str(received.error))))
        else:
            server.handle(received.identity, received.message)


def exchange(server: PolicyServer, replay: ReplayClient, params: ParamsClient) -> None:
    """Read the servers' replies, ask for weights, report."""
    metrics = server.metrics
    metrics.write_pending(replay.run_env_steps)
    if server.holding(params.version):
        params.request()  # held by the parameter server until the next publish
    elif server.steps_since_poll >= server.cfg.actor.params_poll_steps:
        server.steps_since_poll = 0
        params.request()
    params.poll()
    metrics.pending["external/open_episodes"] = float(len(server.lanes.episodes))
    metrics.pending["external/dropped_steps"] = float(server.lanes.dropped_steps)
    metrics.report_if_due(replay, params)


def main(cfg: Config, index: int = 0) -> int:
    """Run policy server ``index`` until SIGINT/SIGTERM or a server's ``Shutdown``."""
    stop = lifecycle.install_stop_handlers()
    torch.set_num_threads(cfg.actor.torch_threads)
    device = lifecycle.resolve_device(cfg.actor.device)
    role = f"external_{index}"
    writer = MetricsWriter(rundir.tensorboard_dir(cfg.run_dir, role))
    server = PolicyServer(cfg, index, device, writer)
    ctx = sockets.make_context()
    sock = bind(ctx, cfg, server.actor_id)
    params, replay = connect(ctx, cfg, server.net, stop, server.actor_id)
    client = client_gate(server)
    log.info(
        "%s: policy server for %s (%s, actor id %d) at %s",
        role,
        cfg.env.id,
        cfg.algorithm,
        server.actor_id,
        sockets.bound_address(sock),
    )
    try:
        while not stop.is_set():
            read_calls(sock, server, client, timeout_ms=0 if server.replies else 20)
            server.act(params.version)
            server.send_replies(sock)
            server.send_chunks(replay)
            exchange(server, replay, params)
    except PeerShutdown as exc:
        log.info("%s: stopping, the servers are shutting down (%s)", role, exc)
    finally:
        writer.close()
        sock.close(linger=0)
        params.link.close()
        replay.link.close()
        ctx.term()
    log.info("%s stopped after %d env steps", role, server.metrics.env_steps)
    return 0

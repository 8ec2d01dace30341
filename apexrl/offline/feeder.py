"""Dataset feeder (``apexrl dataset``): the actor of an offline run, whose steps come from a Minari
dataset (``run.input_dataset``) instead of envs.

Connects:  DEALER net.replay_addr   out: TrajectoryChunk   in: InsertAck, Error, Shutdown
           DEALER net.params_addr   out: ParamsRequest     in: Params (the network priorities use)

It reads every episode of the dataset once, cuts each into the replay items of the run's
algorithm with the algorithm's own actor core (``episode_items``: BC's and Ape-X's one-step or
n-step transitions, with Ape-X's priorities from the network it holds), sends them to replay as
an actor sends its chunks (``env_steps``: the dataset's steps), and then waits until the run
ends: the learner trains on what replay holds, replay's table being at least as large as the
dataset. The dataset's observations and actions are the env's own (what ``apexrl evaluate
--dataset`` writes); they are checked against the run env's spaces as a policy server checks an
external env's (``apexrl.external.spaces``): a Box observation, a Discrete or Box action.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from apexrl.acting.chunks import ChunkNumbers, make_chunk
from apexrl.acting.startup import make_envs_and_network
from apexrl.acting.step_block import StepBlock
from apexrl.actor import connect
from apexrl.clients.params import wait_for_weights
from apexrl.clients.peers import PeerShutdown
from apexrl.config import Config
from apexrl.external.spaces import ExternalSpaces, SpaceError
from apexrl.runtime import lifecycle
from apexrl.transport import sockets

log = logging.getLogger(__name__)


def episode_steps(spaces: ExternalSpaces, episode) -> dict[str, np.ndarray]:
    """A Minari episode's ``T`` steps in the network's spaces: ``obs``, ``action``, ``reward``,
    ``terminated``, ``truncated``, ``next_obs`` (an episode that ends with neither flag is taken as
    truncated: it was cut, not finished)."""
    observations = [spaces.obs_in(o) for o in np.asarray(episode.observations)]
    actions = [spaces.action_in(a) for a in np.asarray(episode.actions)]
    num_steps = len(actions)
    if len(observations) != num_steps + 1:
        raise SpaceError(f"episode has {len(observations)} observations for {num_steps} actions")
    terminated = np.asarray(episode.terminations, dtype=bool).copy()
    truncated = np.asarray(episode.truncations, dtype=bool).copy()
    if not (terminated[-1] or truncated[-1]):
        truncated[-1] = True
    return {
        "obs": np.stack(observations[:-1]),
        "action": np.stack(actions),
        "reward": np.asarray(episode.rewards, dtype=np.float32),
        "terminated": terminated,
        "truncated": truncated,
        "next_obs": np.stack(observations[1:]),
    }


def episode_items(core, steps: dict[str, np.ndarray], n_step: int):
    """The replay items of one whole episode and their priorities, cut by the actor core from a
    block of its ``T`` steps and ``n - 1`` padding steps after its end (which start no item: the
    episode's last step ends every window)."""
    num_steps, pad = len(steps["action"]), n_step - 1
    rows = {name: np.concatenate([v, np.repeat(v[-1:], pad, axis=0)]) for name, v in steps.items()}
    rows["obs"][num_steps:] = steps["next_obs"][-1]
    rows["reward"][num_steps:] = 0.0
    extras = core.logged_extras(rows["obs"], rows["action"])
    block = StepBlock(num_steps + pad, pad)
    for t in range(num_steps + pad):
        block.add_one(
            rows["obs"][t],
            rows["action"][t],
            rows["reward"][t],
            rows["terminated"][t],
            rows["truncated"][t],
            rows["next_obs"][t],
            {name: value[t] for name, value in extras.items()},
        )
    return core.items(block)


def main(cfg: Config, index: int = 0) -> int:
    """Feed the dataset to replay once, then wait until SIGINT/SIGTERM or replay's Shutdown."""
    import minari

    stop = lifecycle.install_stop_handlers()
    if not cfg.run.input_dataset:
        raise lifecycle.StartupError("apexrl dataset needs run.input_dataset, a Minari dataset id")
    torch.set_num_threads(cfg.actor.torch_threads)
    try:
        dataset = minari.load_dataset(cfg.run.input_dataset)
    except Exception as exc:  # Minari raises its own errors for unknown ids and bad files
        raise lifecycle.StartupError(
            f"run.input_dataset {cfg.run.input_dataset!r} cannot be loaded: {exc}"
        ) from exc
    try:
        spaces = ExternalSpaces(cfg)
    except SpaceError as exc:
        raise lifecycle.StartupError(f"run.input_dataset: {exc}") from exc
    envs, algorithm, net = make_envs_and_network(cfg, 1, "cpu", "fp32")
    envs.close()
    actor_id = cfg.dataset_actor_id
    core = algorithm.actor_core(net, cfg, actor_id, False, "cpu", np.random.default_rng(0))
    ctx = sockets.make_context()
    params, replay = connect(ctx, cfg, net, stop, actor_id)
    incarnation, numbers = lifecycle.new_incarnation(), ChunkNumbers()
    started, fed_steps, fed_episodes = time.monotonic(), 0, 0
    try:
        wait_for_weights(params, stop, cfg.run.resume, cfg.actor.peer_timeout_s)
        for episode in dataset.iterate_episodes():
            if stop.is_set():
                break
            steps = episode_steps(spaces, episode)
            fields, priorities = episode_items(core, steps, cfg.algo.n_step)
            for chunk in split_chunks(cfg, actor_id, incarnation, numbers, fields, priorities):
                replay.send_chunk(chunk)
            fed_steps += len(steps["action"])
            fed_episodes += 1
        log.info(
            "dataset %s: %d episodes, %d steps sent to replay in %.1f s",
            cfg.run.input_dataset,
            fed_episodes,
            fed_steps,
            time.monotonic() - started,
        )
        while not stop.is_set():
            replay.poll(timeout_ms=500)
    except PeerShutdown as exc:
        log.info("dataset feeder: stopping, the servers are shutting down (%s)", exc)
    except SpaceError as exc:
        raise lifecycle.StartupError(f"run.input_dataset {cfg.run.input_dataset!r}: {exc}") from exc
    finally:
        params.link.close()
        replay.link.close()
        ctx.term()
    return 0


def split_chunks(
    cfg: Config,
    actor_id: int,
    incarnation: int,
    numbers: ChunkNumbers,
    fields: dict[str, np.ndarray],
    priorities: np.ndarray,
):
    """The items as chunks of at most ``cfg.chunk_items`` each, each claiming its items' steps."""
    size = cfg.chunk_items
    for start in range(0, len(priorities), size):
        part = {name: value[start : start + size] for name, value in fields.items()}
        weights = priorities[start : start + size]
        chunk = make_chunk(
            cfg, actor_id, incarnation, numbers.take(), -1, len(weights), part, weights
        )
        if chunk is not None:
            yield chunk

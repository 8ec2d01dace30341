"""Actors that overlap env stepping and inference (``actor.overlap``) against the serial bound,
all measured in one run on this machine's CPU with one torch thread (as actors infer):

- ``env alone``: ale-py's vector env of ``--envs`` Pong games (what actors step) with random
  actions, no inference;
- ``inference alone``: the actor core's ``act`` (Ape-X on ``configs/apex_dqn_pong.yaml``: the
  Nature CNN with its dueling head, traced, epsilon-greedy) on real frames, at the full batch and
  at half of it (what each half of an overlapping actor infers);
- ``serial bound``: ``1 / (1 / env + 1 / inference)`` at the full batch, the most an actor that
  steps and then infers can reach;
- ``plain loop``: the actor's loop as ``apexrl.actor`` runs it, with ``PlainStepper`` (act,
  step, observe) and the step block; ``+ chunks`` also cuts each full block into the Ape-X
  n-step transitions with their priorities (one more forward pass over the chunk's
  observations), everything the actor does but the sockets;
- ``overlapped loop``: the same with ``OverlapStepper`` (``apexrl.acting.stepping``).

Each rate is env steps/s, the best 1-s window of ``--seconds`` (on a shared machine the best
window is the least disturbed one); plain and overlapped loops take turns ``--repeats`` times.
``cores`` is this process's CPU seconds (the env's C++ threads included) per second of wall
time over the whole measurement. The load average before and after is printed with the table.

    python benchmarks/actor_overlap.py [--envs 16] [--seconds 6] [--repeats 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from apexrl.acting.chunks import ChunkNumbers, cut_chunk  # noqa: E402
from apexrl.acting.startup import make_envs_and_network  # noqa: E402
from apexrl.acting.step_block import StepBlock  # noqa: E402
from apexrl.acting.stepping import OverlapStepper, PlainStepper, make_stepper  # noqa: E402
from apexrl.config import Config, load_config  # noqa: E402
from apexrl.envs import make_vector_env, step_vector  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "apex_dqn_pong.yaml"


@dataclasses.dataclass
class Rate:
    steps_per_s: float  # env steps/s, best window
    cores: float  # CPU seconds of this process per wall second, whole measurement


def measure(step: Callable[[], int], seconds: float, window_s: float = 1.0) -> Rate:
    """Call ``step`` (it returns the env steps it made) for ``seconds``: the best window's rate
    and the cores used."""
    best, end = 0.0, time.monotonic() + seconds
    wall, cpu = time.monotonic(), time.process_time()
    while time.monotonic() < end:
        start, steps = time.monotonic(), 0
        while time.monotonic() - start < window_s:
            steps += step()
        best = max(best, steps / (time.monotonic() - start))
    return Rate(best, (time.process_time() - cpu) / (time.monotonic() - wall))


def env_alone(cfg: Config, num_envs: int, seconds: float) -> Rate:
    envs = make_vector_env(cfg.env, num_envs)
    envs.reset(seed=0)
    actions = np.random.default_rng(0).integers(0, envs.single_action_space.n, (64, num_envs))
    count = [0]

    def step() -> int:
        step_vector(envs, actions[count[0] % 64])
        count[0] += 1
        return num_envs

    try:
        return measure(step, seconds)
    finally:
        envs.close()


def inference_alone(cfg: Config, num_envs: int, seconds: float) -> Rate:
    """The actor core's ``act`` on ``num_envs`` real frames."""
    envs, algorithm, net = make_envs_and_network(cfg, num_envs, "cpu")
    obs, _ = envs.reset(seed=0)
    envs.close()
    core = algorithm.actor_core(net, cfg, 0, False, "cpu", np.random.default_rng(0))

    def act() -> int:
        core.act(obs)
        return num_envs

    return measure(act, seconds)


def actor_loop(cfg: Config, overlap: bool, cut_chunks: bool, seconds: float) -> Rate:
    """The actor's loop without its sockets: the stepper, the step block, and the chunks."""
    cfg = dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, overlap=overlap))
    envs, algorithm, net = make_envs_and_network(cfg, cfg.env.num_envs, "cpu")
    new_core = partial(algorithm.actor_core, net, cfg, 0, False, "cpu")
    core = new_core(np.random.default_rng(0))
    stepper = make_stepper(cfg, envs, core, new_core, 0)
    assert isinstance(stepper, OverlapStepper if overlap else PlainStepper)
    block = StepBlock(core.block_steps, core.block_overlap)
    stepper.reset(0)
    numbers = ChunkNumbers()

    def step() -> int:
        acted = stepper.step(0)
        block.add(acted.obs, acted.action, acted.trained, acted.extras)
        if block.full:
            if cut_chunks:
                cut_chunk(cfg, core, block, 0, 0, numbers, 0, 0)
            else:
                block.keep_overlap()
        return len(acted.action)

    try:
        return measure(step, seconds)
    finally:
        stepper.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(CONFIG, [f"env.num_envs={args.envs}"])
    num_envs, half = args.envs, args.envs - args.envs // 2
    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    env = env_alone(cfg, num_envs, args.seconds)
    inference = inference_alone(cfg, num_envs, args.seconds)
    inference_half = inference_alone(cfg, half, args.seconds)
    loops: dict[tuple[bool, bool], Rate] = {}
    for _ in range(args.repeats):
        for cut_chunks in (False, True):
            for overlap in (False, True):
                rate = actor_loop(cfg, overlap, cut_chunks, args.seconds)
                best = loops.get((overlap, cut_chunks))
                if best is None or rate.steps_per_s > best.steps_per_s:
                    loops[overlap, cut_chunks] = rate
    load_after = os.getloadavg()
    bound = 1.0 / (1.0 / env.steps_per_s + 1.0 / inference.steps_per_s)

    print(
        f"Pong, {num_envs} envs, CPU, 1 torch thread, {os.cpu_count()} cores; best 1-s window "
        f"of {args.seconds:.0f} s; started {started}"
    )
    print(f"load average (1, 5, 15 min) before {load_before}, after {load_after}")
    print(f"{'':44} {'env steps/s':>11} {'cores':>6}")
    rows = [
        (f"env alone ({num_envs} envs, random actions)", env),
        (f"inference alone, batch {num_envs} (core.act)", inference),
        (f"inference alone, batch {half} (core.act)", inference_half),
        (f"serial bound 1/(1/env + 1/inference@{num_envs})", Rate(bound, float("nan"))),
        ("plain loop (step, infer)", loops[False, False]),
        ("overlapped loop (halves in turn)", loops[True, False]),
        ("plain loop + chunks", loops[False, True]),
        ("overlapped loop + chunks", loops[True, True]),
    ]
    for name, rate in rows:
        cores = "" if np.isnan(rate.cores) else f"{rate.cores:6.2f}"
        print(f"{name:44} {rate.steps_per_s:11.0f} {cores:>6}")
    overlapped, plain = loops[True, False].steps_per_s, loops[False, False].steps_per_s
    print(f"overlapped / serial bound: {overlapped / bound:.2f}")
    print(f"overlapped / plain loop: {overlapped / plain:.2f}")
    chunked = loops[True, True].steps_per_s / loops[False, True].steps_per_s
    print(f"with chunks, overlapped / plain: {chunked:.2f}")


if __name__ == "__main__":
    main()

"""What a GPU gives apexrl, in one table: each family's learner update on the GPU in fp32 (TF32
matrix multiplies and convolutions) and bf16 beside the same update on this machine's CPU, and
the actors' batched inference on the GPU with many actor processes at once beside one on the
CPU. ``benchmarks/gpu_check.sh`` runs it after the CUDA tests and before a short Pong run.

- **Learner**: the family's learner core (``algorithm.learner_core``) of its Pong config (SAC
  and TD3: HalfCheetah's), with the config's batch size, on a batch of synthetic items of
  the shapes its replay table holds (``algo.item_spec``: Atari's uint8 [4, 84, 84] frames, 6
  actions; HalfCheetah's 17 floats and 6 actions), already on the device; one figure is items a
  second and env steps a second (items times their steps: an unroll's or a sequence's length)
  that the learner's own update turns (``learning.update.UpdateStep``: PPO's epochs and
  minibatches over each rollout included) take in over ``--seconds``, after three untimed turns.
  The precision is set as ``learner.precision`` sets it (``apexrl.models.precision``).
- **Actors' inference**: ``--actors`` processes, each the Ape-X Pong actor network on the device
  acting for ``--envs`` envs at a time (a forward pass on a uint8 batch and the greedy action back
  on the CPU), started together; the figure is observations a second summed over them, beside one
  such process on the CPU.

Where no CUDA device exists the GPU columns say so and the CPU figures are still measured (with
fewer seconds, and by default only Ape-X's and SAC's updates: one pixel family, one MLP family),
so that the script runs anywhere.

    python benchmarks/gpu_check.py [--seconds 3] [--families apex_dqn r2d2 impala ppo sac td3]
        [--actors 32] [--envs 8] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from apexrl.algos import SampledBatch, load_algorithm  # noqa: E402
from apexrl.config import load_config  # noqa: E402
from apexrl.learning.update import UpdateStep, probe_rows  # noqa: E402
from apexrl.models import precision  # noqa: E402

ATARI = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6)
CHEETAH = (
    gym.spaces.Box(-np.inf, np.inf, (17,), np.float32),
    gym.spaces.Box(-1.0, 1.0, (6,), np.float32),
)
CONFIGS = {  # family -> (config, spaces)
    "apex_dqn": ("apex_dqn_pong.yaml", ATARI),
    "r2d2": ("r2d2_pong.yaml", ATARI),
    "impala": ("impala_pong.yaml", ATARI),
    "ppo": ("ppo_pong.yaml", ATARI),
    "sac": ("sac_halfcheetah.yaml", CHEETAH),
    "td3": ("td3_halfcheetah.yaml", CHEETAH),
}
PRECISIONS = ("fp32", "bf16")


def synthetic_batch(cfg, spaces, device: torch.device, rng: np.random.Generator) -> SampledBatch:
    """``learner.batch_size`` items of the family's item spec: frames and floats drawn at random,
    integer fields (actions, step counts, versions) and flags zero, on ``device``."""
    n = cfg.learner.batch_size
    fields = {}
    for name, (dtype, shape) in cfg.algo.item_spec(*spaces).items():
        dtype = np.dtype(dtype)
        if dtype == np.uint8:
            array = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
        elif dtype.kind == "f":
            array = rng.standard_normal((n, *shape)).astype(dtype).clip(-1, 1)
        else:
            array = np.zeros((n, *shape), dtype)
        fields[name] = torch.from_numpy(array).to(device)
    return SampledBatch(np.arange(n), fields, np.full(n, 1.0 / n), n)


def steps_per_item(cfg) -> int:
    return int(getattr(cfg.algo, "unroll_length", getattr(cfg.algo, "sequence_length", 1)))


def learner_rate(family: str, device: str, mode: str, seconds: float) -> dict:
    """Items and env steps a second of one family's update on ``device`` in ``mode``."""
    config, spaces = CONFIGS[family]
    cfg = load_config(REPO / "configs" / config, [f"learner.device={device}"])
    torch.manual_seed(0)
    where = torch.device(device)
    algorithm = load_algorithm(cfg.algorithm)
    core = algorithm.learner_core(*spaces, cfg, where)
    chosen = precision.choose_and_apply(
        mode, where, precision.networks_of(core), spaces[0], probe_rows(cfg), True, family
    )
    batch = synthetic_batch(cfg, spaces, where, np.random.default_rng(0))
    step = UpdateStep(core, None)  # the learner's own turn: PPO's epochs run without new data
    for _ in range(3):
        feed(step, batch)
    sync(where)
    start, items = time.perf_counter(), 0
    while items < 2 * batch.table_size or time.perf_counter() - start < seconds:
        items += feed(step, batch)
    sync(where)
    elapsed = time.perf_counter() - start
    items = items / elapsed
    return {
        "items_per_s": round(items, 1),
        "steps_per_s": round(items * steps_per_item(cfg), 1),
        "precision": chosen.name,
    }


def feed(step: UpdateStep, batch: SampledBatch) -> int:
    """One learner turn, with ``batch`` where the core wants one (stamped with the core's
    weights version, which the synchronous PPO keeps alone); the items it was given."""
    core = step.algo
    wants = getattr(core, "wants_batch", True)
    if wants and "weights_version" in batch.fields:
        batch.fields["weights_version"].fill_(int(getattr(core, "num_updates", 0)))
    step.run(batch if wants else None, False)
    return batch.table_size if wants else 0


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def inference_worker(device: str, envs: int, seconds: float, start, out) -> None:
    """One actor's forward passes: the Ape-X Pong network, ``envs`` observations at a time."""
    torch.set_num_threads(1)
    cfg = load_config(REPO / "configs" / CONFIGS["apex_dqn"][0])
    net = load_algorithm(cfg.algorithm).make_network(*ATARI, cfg).to(device).eval()
    obs = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (envs, 4, 84, 84), np.uint8))
    with torch.inference_mode():
        net(obs.to(device))  # warm-up (and CUDA context) before the common start
        start.wait()
        begin, passes = time.perf_counter(), 0
        while time.perf_counter() - begin < seconds:
            out_q = net(obs.to(device)).q
            out_q.argmax(dim=1).cpu()
            passes += 1
    out.put(passes * envs / (time.perf_counter() - begin))


def inference_rate(device: str, actors: int, envs: int, seconds: float) -> float:
    """Observations a second summed over ``actors`` processes acting together on ``device``."""
    context = mp.get_context("spawn")
    start, out = context.Barrier(actors + 1), context.Queue()
    procs = [
        context.Process(target=inference_worker, args=(device, envs, seconds, start, out))
        for _ in range(actors)
    ]
    for proc in procs:
        proc.start()
    try:
        start.wait(timeout=300)
        rates = [out.get(timeout=seconds + 300) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return round(sum(rates), 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=None, help="per figure (3; CPU only: 2)")
    parser.add_argument("--families", nargs="+", choices=list(CONFIGS), default=None)
    parser.add_argument("--actors", type=int, default=32)
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    seconds = args.seconds or (3.0 if cuda else 2.0)
    families = args.families or (list(CONFIGS) if cuda else ["apex_dqn", "sac"])
    name = torch.cuda.get_device_name(0) if cuda else "no CUDA device"
    print(f"torch {torch.__version__}, {name}, {torch.get_num_threads()} CPU threads", flush=True)
    rows = []
    for family in families:
        row = {"family": family}
        for device in ("cpu", "cuda"):
            for mode in PRECISIONS:
                if device == "cuda" and not cuda:
                    row[f"{device} {mode}"] = None
                    continue
                row[f"{device} {mode}"] = learner_rate(family, device, mode, seconds)
        rows.append(row)
        print(json.dumps(row), flush=True)
    inference = {"cpu, 1 actor": inference_rate("cpu", 1, args.envs, seconds)}
    label = f"cuda, {args.actors} actors"
    inference[label] = inference_rate("cuda", args.actors, args.envs, seconds) if cuda else None
    print(table(rows, inference, args.envs))
    if args.json:
        args.json.write_text(json.dumps({"device": name, "learner": rows, "inference": inference}))
    return 0


def table(rows: list[dict], inference: dict, envs: int) -> str:
    columns = [f"{d} {m}" for d in ("cpu", "cuda") for m in PRECISIONS]
    lines = [
        "learner env steps/s (items/s) | " + " | ".join(columns),
        "---|" + "|".join("---" for _ in columns),
    ]
    for row in rows:
        cells = []
        for column in columns:
            figure = row[column]
            cells.append(
                "no GPU"
                if figure is None
                else f"{figure['steps_per_s']:,.0f} ({figure['items_per_s']:,.0f})"
            )
        lines.append(f"{row['family']} | " + " | ".join(cells))
    lines.append("")
    lines.append(f"actor inference, observations/s ({envs} envs a forward pass, Ape-X Pong net)")
    for label, figure in inference.items():
        lines.append(f"{label}: " + ("no GPU" if figure is None else f"{figure:,.0f}"))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

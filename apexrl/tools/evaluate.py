"""``apexrl evaluate RUN_DIR|CHECKPOINT --episodes N``: play a trained checkpoint's greedy policy.

Works for every algorithm through the algorithm seam: the learner core is built as the learner
builds it and loads the checkpoint (``torch.load(weights_only=True)``: a tampered file cannot run
code); its published weights go into a fresh actor network, exactly as they reach an evaluation
actor; and the episodes are played by the evaluation actor's own ``play_round`` (each env plays
its share of the N episodes from a fresh reset, so short episodes are not over-represented).

Prints the mean, std, min and max of the returns and lengths, writes every episode's return and
length as JSON (``<checkpoint's dir>/evaluate-<time>.json`` or ``--out FILE``), and with
``--record DIR`` writes one mp4 per counted episode (``apexrl.envs.video``: imageio and
imageio-ffmpeg, which ``scripts/install.sh`` installs), and with ``--dataset ID`` writes the
counted episodes as a Minari dataset (``apexrl.offline.minari_datasets``).
Every error (missing run or checkpoint, unreadable checkpoint, a config that does not match the
weights, a missing optional package) is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from apexrl.config import Config, ConfigError, add_overrides_argument, load_config
from apexrl.runtime import rundir

SEED_OFFSET = 10_000  # episodes differ from the evaluation actor's (env.seed + 5000 + round)
PROG = "apexrl evaluate"


class EvaluateError(Exception):
    """A problem with the user's arguments or files: printed as one line, exit status 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``evaluate`` subcommand's arguments (``apexrl.cli`` builds the parser)."""
    parser.add_argument("target", metavar="RUN_DIR|CHECKPOINT", help="a run directory or a .pt")
    parser.add_argument(
        "--episodes", type=_positive, default=10, help="episodes to play (default 10)"
    )
    parser.add_argument(
        "--envs", type=_positive, default=1, help="envs playing at once (default 1)"
    )
    parser.add_argument(
        "--best", action="store_true", help=f"a run directory's {rundir.BEST_CHECKPOINT}"
    )
    parser.add_argument(
        "--config", help=f"config file (default: the {rundir.CONFIG} next to the checkpoint)"
    )
    add_overrides_argument(parser, "env.max_episode_steps=200")
    parser.add_argument("--seed", type=int, help=f"reset seed (default env.seed + {SEED_OFFSET})")
    parser.add_argument("--out", help="JSON file for the episodes (default: evaluate-<time>.json)")
    parser.add_argument("--record", metavar="DIR", help="write an mp4 of every episode to DIR")
    parser.add_argument(
        "--opponent",
        metavar="PLAYER",
        help="a two-player game's multi-agent run: its policy against this fixed player (random, "
        "a scripted module:Class, or checkpoint:PATH[#POLICY], another run's policy) in both "
        "seats, the seats swapped every other episode",
    )
    parser.add_argument(
        "--policy", help="the network policy that --opponent plays (default: the first trained)"
    )
    parser.add_argument(
        "--dataset",
        metavar="ID",
        help="write the episodes as the Minari dataset ID (under MINARI_DATASETS_PATH)",
    )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def find_sources(target: Path, best: bool, config: str | None) -> rundir.CheckpointSources:
    """The checkpoint to play and the config to read, or ``EvaluateError``."""
    try:
        return rundir.checkpoint_sources(target, best, config)
    except ValueError as exc:
        raise EvaluateError(str(exc)) from exc


def load_policy_network(cfg: Config, checkpoint: Path, envs, device: str):
    """An actor network holding the checkpoint's published weights, and the checkpoint's
    weights version (-1 when it does not say)."""
    import torch

    from apexrl.algos import load_algorithm
    from apexrl.learning.checkpoint import load_checkpoint
    from apexrl.models import arrays_to_params, params_to_arrays

    algorithm = load_algorithm(cfg.algorithm)
    spaces = envs.single_observation_space, envs.single_action_space
    learner_core = algorithm.learner_core(*spaces, cfg, torch.device("cpu"))
    try:
        with warnings.catch_warnings():  # torch's warnings about a foreign file: the error says it
            warnings.simplefilter("ignore")
            counters = load_checkpoint(checkpoint, learner_core, torch.device("cpu"))
    except Exception as exc:  # torch.load and load_state_dict raise many types; all mean unusable
        raise EvaluateError(
            f"cannot load {checkpoint} as a {cfg.algorithm} checkpoint for {cfg.env.id}: "
            f"{load_failure(exc)}"
        ) from exc
    net = algorithm.make_network(*spaces, cfg)
    arrays_to_params(net, params_to_arrays(learner_core.network))
    net.to(device).eval()
    return net, int(counters.get("weights_version", -1))


def load_failure(exc: Exception) -> str:
    """Why a checkpoint could not be loaded, in one bounded line."""
    if isinstance(exc, pickle.UnpicklingError):  # what weights_only=True refuses
        return "it holds objects other than tensors and plain containers (not unpickled)"
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    text = text.split(". ")[0]  # torch's first sentence; the rest is advice on torch.load
    return (text[:300] + "...") if len(text) > 300 else text or type(exc).__name__


def check_recording(cfg: Config) -> None:
    """Refuse ``--record`` before playing when a package it needs is missing."""
    from apexrl.envs.video import VideoError, check_video_packages

    try:
        check_video_packages()
    except VideoError as exc:
        raise EvaluateError(f"--record: {exc}") from exc
    # Frames are drawn off screen: pygame-rendered envs need no display nor sound device.
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    import gymnasium as gym

    from apexrl.envs import EnvError, make_env

    try:
        env = make_env(cfg.env, render_mode="rgb_array")
    except EnvError as exc:
        raise EvaluateError(f"cannot record {cfg.env.id!r}: {exc}") from exc
    try:
        env.reset(seed=0)
        env.render()
    except (gym.error.Error, ImportError) as exc:
        raise EvaluateError(f"cannot render {cfg.env.id!r} for --record: {exc}") from exc
    finally:
        env.close()


def summary(values: np.ndarray) -> dict[str, float]:
    """Mean, std (population), min and max."""
    return {
        "mean": float(values.mean()),
        "std": float(values.std()),
        "min": float(values.min()),
        "max": float(values.max()),
    }


def format_stats(name: str, stats: dict[str, float], whole: bool = False) -> str:
    """``return  mean 500.00  std 0.00  min 500.00  max 500.00``; with ``whole``, min and max
    as integers (lengths)."""
    return f"{name:<7} " + "  ".join(
        f"{k} {v:.0f}" if whole and k in ("min", "max") else f"{k} {v:.2f}"
        for k, v in stats.items()
    )


def default_out(checkpoint: Path) -> Path:
    return checkpoint.parent / f"evaluate-{time.strftime('%Y%m%d-%H%M%S')}.json"


def load_run_config(sources: rundir.CheckpointSources, args: argparse.Namespace) -> Config:
    """The run's config with the user's overrides (and, with ``--record``, able to record)."""
    try:
        cfg = load_config(sources.config, list(args.overrides))
    except ConfigError as exc:
        raise EvaluateError(f"config error: {exc}") from exc
    if args.record:
        check_recording(cfg)
    if args.dataset:
        from apexrl.offline.minari_datasets import DatasetError, check_dataset_id

        try:
            check_dataset_id(args.dataset)
        except DatasetError as exc:
            raise EvaluateError(f"--dataset: {exc}") from exc
    return cfg


def make_envs(cfg: Config, quotas: list[int], record: str | None, episodes: list | None):
    """One env per quota (recording videos into ``record``, and each counted episode's steps
    into ``episodes`` where it is a list), checked against the algorithm."""
    from apexrl.envs import EnvError, check_action_space, make_vector_env
    from apexrl.envs.video import RecordEpisodes, wrapped_vector_env

    wrappers = []
    if record:
        if any(Path(record).glob("env*-episode-*.mp4")):
            print(f"{PROG}: videos in {record} are overwritten", file=sys.stderr)
        wrappers.append(
            lambda env, i, quota: RecordEpisodes(env, Path(record), lambda k: k < quota, f"env{i}")
        )
    if episodes is not None:
        from apexrl.offline.minari_datasets import RecordEpisodeSteps

        wrappers.append(lambda env, i, quota: RecordEpisodeSteps(env, quota, episodes))
    try:
        if wrappers:
            render_mode = "rgb_array" if record else None
            envs = wrapped_vector_env(cfg, quotas, wrappers, render_mode)
        else:
            envs = make_vector_env(cfg.env, len(quotas), cfg.unit_actions, cfg.product_discrete)
        check_action_space(cfg, envs.single_action_space)
    except EnvError as exc:
        raise EvaluateError(str(exc)) from exc
    return envs


def write_record(record: dict, out: Path) -> None:
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record) + "\n")
    except OSError as exc:
        raise EvaluateError(f"cannot write {out}: {exc}") from exc


def evaluate(args: argparse.Namespace) -> int:
    import torch

    from apexrl.acting.rounds import play_round, round_quotas
    from apexrl.algos import load_algorithm
    from apexrl.runtime import lifecycle

    sources = find_sources(Path(args.target), args.best, args.config)
    cfg = load_run_config(sources, args)
    if args.opponent and not cfg.multiagent.enabled:
        raise EvaluateError("--opponent plays a multi-agent run's policy against a fixed player")
    if cfg.multiagent.enabled:  # every policy of the run, from one checkpoint
        record = evaluate_multiagent(args, sources.checkpoint, cfg)
        out = Path(args.out) if args.out else default_out(sources.checkpoint)
        write_record(record, out)
        print(f"{record['episodes']} episodes in {record['seconds']:.1f} s written to {out}")
        return 0
    torch.set_num_threads(cfg.actor.torch_threads)
    try:
        device = lifecycle.resolve_device(cfg.actor.device)
    except lifecycle.StartupError as exc:
        raise EvaluateError(str(exc)) from exc
    quotas = round_quotas(args.episodes, min(args.envs, args.episodes))
    seed = cfg.env.seed + SEED_OFFSET if args.seed is None else args.seed
    episodes: list | None = [] if args.dataset else None  # the dataset's, as they end
    envs = make_envs(cfg, quotas, args.record, episodes)
    try:
        net, version = load_policy_network(cfg, sources.checkpoint, envs, device)
        rng = np.random.default_rng(seed)
        core = load_algorithm(cfg.algorithm).actor_core(net, cfg, 0, True, device, rng)
        print(
            f"{PROG}: {cfg.algorithm} on {cfg.env.id}, {sources.checkpoint} "
            f"(weights version {version}), {args.episodes} episodes on {len(quotas)} envs",
            flush=True,
        )
        with torch.inference_mode():
            result = play_round(envs, core, quotas, seed)
    finally:
        envs.close()
    returns, lengths = summary(result.returns), summary(result.lengths.astype(np.float64))
    record = {
        "checkpoint": str(sources.checkpoint),
        "config": str(sources.config),
        "algorithm": cfg.algorithm,
        "env": cfg.env.id,
        "weights_version": version,
        "episodes": int(len(result.returns)),
        "envs": len(quotas),
        "seed": seed,
        "returns": result.returns.tolist(),
        "lengths": result.lengths.tolist(),
        "return": returns,
        "length": lengths,
        "env_steps": result.env_steps,
        "seconds": round(result.seconds, 3),
    }
    out = Path(args.out) if args.out else default_out(sources.checkpoint)
    write_record(record, out)
    print(format_stats("return", returns))
    print(format_stats("length", lengths, whole=True))
    print(f"{len(result.returns)} episodes in {result.seconds:.1f} s written to {out}")
    if args.record:
        videos = sorted(Path(args.record).glob("*.mp4"))
        print(f"{len(videos)} videos in {args.record}")
    if args.dataset:
        write_episodes(cfg, args.dataset, episodes)
    return 0


def evaluate_multiagent(args: argparse.Namespace, checkpoint: Path, cfg: Config) -> dict:
    """Play a multi-agent run's checkpoint (``apexrl.multiagent.evaluate``): prints the judged
    return (``multiagent.judge``) and every return group's (team, policies, agents, a policy in
    each seat: ``multiagent.returns``) with wins, draws and losses where the returns are +1, 0
    and -1, and the actions taken outside the agents' legal-action masks; the JSON record."""
    from apexrl.multiagent.evaluate import outcome_shares, play_checkpoint

    if args.record or args.dataset:
        raise EvaluateError("--record and --dataset take single-agent runs")
    if args.opponent:
        from apexrl.league.opponents import opponent_config

        try:
            cfg = opponent_config(cfg, args.policy, args.opponent)
        except ConfigError as exc:
            raise EvaluateError(str(exc)) from exc
        print(f"{PROG}: {cfg.multiagent.trained[0]} against {args.opponent}, in both seats")
    elif args.policy:
        raise EvaluateError("--policy names the policy that --opponent plays")
    seed = cfg.env.seed + SEED_OFFSET if args.seed is None else args.seed
    print(
        f"{PROG}: {cfg.algorithm} on {cfg.env.id}, {checkpoint}, {args.episodes} episodes on "
        f"{min(args.envs, args.episodes)} envs",
        flush=True,
    )
    try:
        result, versions = play_checkpoint(cfg, checkpoint, args.episodes, args.envs, seed)
    except ValueError as exc:
        raise EvaluateError(str(exc)) from exc
    print("policy versions: " + ", ".join(f"{n} {v}" for n, v in versions.items()))
    groups = {}
    if len(result.returns):
        print(format_stats("return", summary(result.returns)) + f"  ({cfg.multiagent.judge})")
    for name, returns in sorted(result.groups.items()):
        groups[name] = {"episodes": int(len(returns)), **summary(returns)}
        line = f"  {name:<28} {len(returns):5d} ep  mean {groups[name]['mean']:8.3f}"
        shares = outcome_shares(returns)
        if shares is not None and name != "team":
            groups[name].update(shares)
            line += "  " + "  ".join(f"{k} {v:.3f}" for k, v in shares.items())
        print(line)
    print(f"illegal actions: {result.illegal_actions} of {result.agent_steps} agent steps")
    return {
        "checkpoint": str(checkpoint),
        "algorithm": cfg.algorithm,
        "env": cfg.env.id,
        "policy_versions": versions,
        "opponent": args.opponent or "",
        "episodes": int(len(result.returns)),
        "envs": min(args.envs, args.episodes),
        "seed": seed,
        "judge": cfg.multiagent.judge,
        "returns": result.returns.tolist(),
        "lengths": result.lengths.tolist(),
        "return": summary(result.returns) if len(result.returns) else {},
        "groups": groups,
        "illegal_actions": result.illegal_actions,
        "agent_steps": result.agent_steps,
        "env_steps": result.env_steps,
        "seconds": round(result.seconds, 3),
    }


def write_episodes(cfg: Config, dataset_id: str, episodes: list[dict]) -> None:
    """The counted episodes as the Minari dataset ``dataset_id``, in the env's own spaces."""
    from apexrl.envs import make_env
    from apexrl.offline.minari_datasets import DatasetError, write_dataset

    env = make_env(cfg.env)
    try:
        spaces = env.observation_space, env.action_space
    finally:
        env.close()
    try:
        dataset = write_dataset(
            dataset_id, episodes, cfg.env.id, *spaces, f"apexrl {cfg.algorithm}"
        )
    except DatasetError as exc:
        raise EvaluateError(str(exc)) from exc
    steps = sum(len(e["actions"]) for e in episodes)
    where = dataset.storage.data_path
    print(f"dataset {dataset_id}: {len(episodes)} episodes, {steps} steps in {where}")


def main(args: argparse.Namespace) -> int:
    """``apexrl evaluate``: 0, or 2 with one line on stderr."""
    try:
        return evaluate(args)
    except EvaluateError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2

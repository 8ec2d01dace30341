"""MPE's simple_spread with one policy shared by its three agents: apexrl PPO and IMPALA against
stable-baselines3 PPO with SuperSuit's parameter sharing, for the same wall time, in one run.

The env is ``mpe2.simple_spread_v3.parallel_env(N=3, max_cycles=25, continuous_actions=False)``.
An env step is one step of the parallel env, in which all 3 agents act (3 agent steps). The score
is the greedy team return: the sum of every agent's rewards over an episode, mean over
``--episodes`` (100) whole episodes; the per-agent return is that divided by 3. For scale (this
machine, 100 episodes): uniformly random actions -82.2, a scripted landmark-assignment policy
-23.7.

Each system trains from a clean start for ``--wall-s`` (900) seconds, one after the other, nothing
else running:

- ``sb3``: the parallel env through SuperSuit's ``pettingzoo_env_to_vec_env_v1`` (each agent a
  row of a vector env) and ``concat_vec_envs_v1`` (8 envs, so 24 rows, stepped in one process),
  stable-baselines3 PPO's ``MlpPolicy`` (its default: separate 64-64 tanh networks for the policy
  and the value) with the settings in ``SB3_PPO``, in its own process (``--sb3-python``;
  ``pip install -e ".[bench]"`` installs stable-baselines3 and SuperSuit), with one torch
  thread (``SB3_TORCH_THREADS``), as each apexrl role has (``actor.torch_threads``,
  ``learner.torch_threads``): the other ``*_vs_sb3.py`` leave torch's default, but here, with
  the envs stepped in the same process, torch's default of 2 threads on 2 cores ran several times
  slower than 1 when the other core was busy. It trains in ``model.learn`` calls of
  ``SB3_CHUNK_ROLLOUTS`` rollouts each until their summed time, the only time counted, reaches the
  wall time; then the greedy policy (``deterministic=True``) plays the episodes on the raw
  parallel env, every agent's observation through the one policy. SB3 counts a row's step (an
  agent step) as a timestep; the table shows env steps (SB3's timesteps / 3). SuperSuit folds
  the 25th step's truncation into ``done`` without ``TimeLimit.truncated``, so SB3 does not
  bootstrap there: the episode's end is its terminal state, as in MAPPO's MPE runs.
- ``apexrl_ppo``, ``apexrl_impala``: ``scripts/launch_local.sh --actors 2 --learners 1 --config
  configs/{ppo,impala}_simple_spread.yaml`` (``--ppo-config``, ``--impala-config``) with
  ``run.stop_wall_s`` and ``env.seed`` set, ending by itself; its wall time is the learner's
  clock (``result.json``'s ``time_s``), start-up not counted. The run's last ``checkpoint.pt``
  then plays the episodes greedily with ``apexrl evaluate`` (``play_checkpoint``: every policy
  of the run, as the evaluation actor plays a round). The last greedy round of the run's own
  evaluation actor (``result.json``'s ``eval_return_mean``, ``run.stop_eval_episodes`` episodes
  of an earlier weights version) is shown beside it.

Each system's row goes to ``<workdir>/<system>.json`` when it is done, so systems can run in
separate calls on one ``--workdir``; ``--report`` prints what a workdir holds.

    python benchmarks/multiagent_vs_sb3.py [--wall-s 900] [--seed 0]
        [--which sb3,apexrl_ppo,apexrl_impala] [--workdir DIR] [--report]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SYSTEMS = ("sb3", "apexrl_ppo", "apexrl_impala")
NAMES = {
    "sb3": "stable-baselines3 PPO + SuperSuit",
    "apexrl_ppo": "apexrl PPO",
    "apexrl_impala": "apexrl IMPALA",
}
NUM_AGENTS = 3
ENV_KWARGS = {"N": NUM_AGENTS, "max_cycles": 25, "continuous_actions": False}
ANCHORS = {"random actions": -82.2, "scripted landmark assignment": -23.7}  # 100 episodes each
EVAL_SEED_OFFSET = 10_000  # evaluation episodes' seeds: seed + offset + episode
EVAL_NUM_ENVS = 20  # apexrl's greedy episodes are played on this many envs at once

SB3_NUM_ENVS = 8  # parallel envs, concatenated: 8 x 3 agents = 24 rows of SB3's vector env
# There is no MPE entry in rl-baselines3-zoo. These follow MAPPO's simple_spread settings (Yu et
# al. 2022, "The Surprising Effectiveness of PPO in Cooperative Multi-Agent Games", MPE table:
# lr 7e-4, 10 epochs, clip 0.2, entropy 0.01, gamma 0.99, GAE 0.95, 64-unit layers), with
# rollouts sized for 24 rows: 128 steps a row = 3,072 agent steps = 1,024 env steps, in 3
# minibatches of 1,024; the rest are SB3's defaults (vf_coef 0.5, max_grad_norm 0.5).
SB3_PPO = {
    "n_steps": 128,
    "batch_size": 1024,
    "n_epochs": 10,
    "learning_rate": 7e-4,
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "clip_range": 0.2,
    "ent_coef": 0.01,
}
SB3_CHUNK_ROLLOUTS = 4  # rollouts per model.learn call: the wall time overshoots by at most that
SB3_TORCH_THREADS = 1


def sb3_train_and_play(wall_s: float, seed: int, episodes: int) -> dict:
    """stable-baselines3 PPO with parameter sharing for ``wall_s`` seconds of ``model.learn``;
    its row (module docstring)."""
    import supersuit as ss
    import torch
    from mpe2 import simple_spread_v3
    from stable_baselines3 import PPO
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.utils import set_random_seed

    env = ss.pettingzoo_env_to_vec_env_v1(simple_spread_v3.parallel_env(**ENV_KWARGS))
    env = ss.concat_vec_envs_v1(env, SB3_NUM_ENVS, num_cpus=1, base_class="stable_baselines3")
    # PPO(seed=...) calls env.seed, which SuperSuit 3.11's ConcatVecEnv lacks: seed the rest as
    # PPO would, and reset env i with seed + i once; SB3's later resets go on from there.
    set_random_seed(seed)
    env.venv.reset(seed=seed)
    torch.set_num_threads(SB3_TORCH_THREADS)
    model = PPO("MlpPolicy", env, **SB3_PPO)
    # A logger that writes nowhere: SB3's default makes a /tmp/SB3-<time> folder per learn().
    model.set_logger(Logger(folder=None, output_formats=[]))
    chunk = SB3_CHUNK_ROLLOUTS * SB3_PPO["n_steps"] * env.num_envs  # agent steps
    trained_s = 0.0
    while trained_s < wall_s:
        started = time.monotonic()
        model.learn(total_timesteps=chunk, reset_num_timesteps=False)
        trained_s += time.monotonic() - started
    env.close()

    def act(obs: np.ndarray) -> np.ndarray:
        return model.predict(obs, deterministic=True)[0]

    returns = play_parallel_env(act, seed + EVAL_SEED_OFFSET, episodes)
    return {
        "wall_s": trained_s,
        "env_steps": model.num_timesteps // NUM_AGENTS,
        "team_returns": returns.tolist(),
        "torch_threads": torch.get_num_threads(),
        "settings": {**SB3_PPO, "num_envs": SB3_NUM_ENVS, "rows": env.num_envs},
    }


def play_parallel_env(act, seed: int, episodes: int) -> np.ndarray:
    """Team returns of ``episodes`` whole episodes of the raw parallel env, every agent's action
    from ``act(obs [agents, obs]) -> [agents]``; episode i resets with ``seed + i``."""
    from mpe2 import simple_spread_v3

    env = simple_spread_v3.parallel_env(**ENV_KWARGS)
    returns = np.zeros(episodes)
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        while env.agents:
            agents = list(env.agents)
            actions = act(np.stack([obs[a] for a in agents]))
            obs, rewards, _, _, _ = env.step(dict(zip(agents, actions.tolist(), strict=True)))
            returns[i] += sum(rewards.values())
    env.close()
    return returns


def run_sb3(python: str, wall_s: float, seed: int, episodes: int, workdir: Path) -> dict:
    """``sb3_train_and_play`` in its own process (this file with ``--sb3-child``)."""
    args = ["--sb3-child", "--wall-s", str(wall_s), "--seed", str(seed)]
    args += ["--episodes", str(episodes)]
    with open(workdir / "sb3.log", "w") as log:
        out = subprocess.run(
            [python, __file__, *args],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            timeout=wall_s + 600,
            check=False,
        )
    if out.returncode != 0:
        raise RuntimeError(f"stable-baselines3 failed (exit {out.returncode}): see {log.name}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_apexrl(config: Path, wall_s: float, seed: int, episodes: int, workdir: Path) -> dict:
    """The launcher with ``config`` for ``wall_s`` seconds, then its last checkpoint played."""
    import pong_runs

    name = config.stem
    # pong_runs.launch takes configs/<name>.yaml; an absolute path joined there stays itself.
    code, run_dir, launcher_s = pong_runs.launch(
        str(config.resolve().with_suffix("")),
        2,
        wall_s,
        workdir,
        (f"env.seed={seed}",),
        name=name,
    )
    if code != 0 or not all((run_dir / f).exists() for f in ("checkpoint.pt", "result.json")):
        raise RuntimeError(f"the launcher failed (exit {code}): see {workdir / f'{name}.log'}")
    last = json.loads((run_dir / "result.json").read_text().splitlines()[-1])
    returns, env_steps = play_checkpoint(run_dir, seed + EVAL_SEED_OFFSET, episodes)
    return {
        "wall_s": last["time_s"],
        "launcher_s": launcher_s,
        "env_steps": env_steps,
        "team_returns": returns.tolist(),
        "run_eval_return": last["eval_return_mean"],
        "run_eval_episodes": last["eval_episodes_in_window"],
        "run_eval_weights_version": last["eval_weights_version"],
        "config": str(config),
        "run_dir": str(run_dir),
    }


def play_checkpoint(run_dir: Path, seed: int, episodes: int) -> tuple[np.ndarray, int]:
    """The team returns of ``episodes`` greedy episodes of the run's last checkpoint, played by
    ``apexrl evaluate`` on ``EVAL_NUM_ENVS`` envs (the configs judge the team return); and the
    env steps the checkpoint had trained on (its last record's)."""
    out = run_dir / "benchmark-evaluate.json"
    command = [sys.executable, "-m", "apexrl", "evaluate", str(run_dir), "--episodes"]
    command += [str(episodes), "--envs", str(EVAL_NUM_ENVS), "--seed", str(seed), "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"apexrl evaluate failed: {done.stderr.strip()[-500:]}")
    record = json.loads(out.read_text())
    last = json.loads((run_dir / "result.json").read_text().splitlines()[-1])
    return np.asarray(record["returns"], dtype=np.float64), int(last["env_steps"])


def report(rows: dict[str, dict]) -> None:
    """The table of ``rows`` (system -> its row) with the anchors, and how each was run."""
    print(
        f"\n{'system':<36} {'wall s':>7} {'env steps':>10} {'team return, mean ± std':>24} "
        f"{'per agent':>9} {'run eval':>9}"
    )
    for system, row in rows.items():
        r = np.asarray(row["team_returns"])
        own = row.get("run_eval_return")
        own_text = "" if own is None else f" {own:9.1f}"
        print(
            f"{NAMES[system]:<36} {row['wall_s']:7.0f} {row['env_steps']:10d} "
            f"{r.mean():15.1f} ± {r.std():6.1f} {r.mean() / NUM_AGENTS:9.1f}{own_text}"
        )
    for name, team in ANCHORS.items():
        print(f"{name:<36} {'':>7} {'':>10} {team:15.1f} {'':>8} {team / NUM_AGENTS:9.1f}")
    print(
        "team return: every agent's rewards of an episode summed, mean ± std over the greedy "
        "episodes; per agent = team / 3; env step = one step of the parallel env (3 agent steps)"
    )
    for system, row in rows.items():
        if system == "sb3":
            print(
                f"{NAMES[system]}: {row['settings']}, torch threads {row['torch_threads']}, "
                f"{row['env_steps'] * NUM_AGENTS} agent steps"
            )
        else:
            own = (
                f"run eval = its evaluation actor's last round ({row['run_eval_episodes']} "
                f"episodes, weights version {row['run_eval_weights_version']})"
                if row["run_eval_return"] is not None
                else "its evaluation actor finished no round"
            )
            print(
                f"{NAMES[system]}: {row['config']}, {own}; launcher {row['launcher_s']:.0f} s "
                f"with start-up; run in {row['run_dir']}"
            )


def load_rows(workdir: Path) -> dict[str, dict]:
    return {
        s: json.loads((workdir / f"{s}.json").read_text())
        for s in SYSTEMS
        if (workdir / f"{s}.json").exists()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wall-s", type=float, default=900.0, help="training seconds a system")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--which", default=",".join(SYSTEMS), help=f"systems to run, of {','.join(SYSTEMS)}"
    )
    parser.add_argument("--episodes", type=int, default=100, help="greedy episodes to score")
    parser.add_argument("--ppo-config", type=Path, default=REPO / "configs/ppo_simple_spread.yaml")
    parser.add_argument(
        "--impala-config", type=Path, default=REPO / "configs/impala_simple_spread.yaml"
    )
    parser.add_argument(
        "--sb3-python", default=sys.executable, help="a Python with stable-baselines3, SuperSuit"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="kept (default: a temp dir)")
    parser.add_argument("--report", action="store_true", help="only print what --workdir holds")
    parser.add_argument("--sb3-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sb3_child:
        print(json.dumps(sb3_train_and_play(args.wall_s, args.seed, args.episodes)))
        return 0
    which = [s for s in args.which.split(",") if s]
    unknown = sorted(set(which) - set(SYSTEMS))
    if unknown:
        parser.error(f"--which: unknown {', '.join(unknown)} (known: {', '.join(SYSTEMS)})")
    configs = {"apexrl_ppo": args.ppo_config, "apexrl_impala": args.impala_config}
    missing = [str(configs[s]) for s in which if s in configs and not configs[s].is_file()]
    if missing and not args.report:
        parser.error(f"no config file {', '.join(missing)}")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="multiagent_vs_sb3_"))
    workdir.mkdir(parents=True, exist_ok=True)
    if not args.report:
        for system in which:
            print(
                f"{time.strftime('%H:%M:%S')} {system}: {args.wall_s:g} s of simple_spread in "
                f"{workdir}, load average {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            if system == "sb3":
                row = run_sb3(args.sb3_python, args.wall_s, args.seed, args.episodes, workdir)
            else:
                row = run_apexrl(configs[system], args.wall_s, args.seed, args.episodes, workdir)
            (workdir / f"{system}.json").write_text(json.dumps(row))
        print(f"{time.strftime('%H:%M:%S')} done, load average {os.getloadavg()[0]:.1f}")
    report(load_rows(workdir))
    return 0


if __name__ == "__main__":
    sys.exit(main())

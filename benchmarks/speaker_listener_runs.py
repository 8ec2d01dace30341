"""Is communication learned? MPE's simple_speaker_listener with two policies of different spaces
(the speaker: the goal's colour, 3 words; the listener: its velocity, the landmarks and the word,
5 moves), trained from a clean start with the launcher, against the same run with the speaker a
random player.

Each run: ``scripts/launch_local.sh --actors 2 --learners 1 --config
configs/ppo_simple_speaker_listener.yaml --set run.stop_wall_s=<wall>`` (the random speaker:
``--set 'multiagent.policies=[{name: speaker, fixed: random}, {name: listener, critic:
team}]'``), then
``apexrl evaluate`` of its last checkpoint, greedy, for ``--episodes`` episodes. The team return
(both agents' rewards: twice the listener's distance cost) is printed as mean, median and
quartiles: a greedy listener now and then flies off and scores hundreds below the rest, so the
median says more than the mean of what a typical episode gets. A listener that hears its goal
gets past what the best listener without it can do (stop between the landmarks).

The ablation ``own critics`` trains the same pair with each value reading its own agent's
observation alone (``--runs 'trained speaker,random speaker,own critics'``).

    python benchmarks/speaker_listener_runs.py [--wall-s 600] [--episodes 500] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "ppo_simple_speaker_listener.yaml"
RANDOM_SPEAKER = (
    "multiagent.policies=[{name: speaker, fixed: random}, {name: listener, critic: team}]"
)
OWN_CRITICS = "multiagent.policies=[{name: speaker}, {name: listener}]"
RUNS = {
    "trained speaker": [],
    "random speaker": ["--set", RANDOM_SPEAKER],
    "own critics": ["--set", OWN_CRITICS],  # the ablation: each value reads its agent alone
}


def train_and_evaluate(
    name: str, extra: list[str], wall_s: float, episodes: int, workdir: Path
) -> dict:
    run_dir = workdir / name.replace(" ", "_")
    started = time.monotonic()
    with open(workdir / f"{run_dir.name}.log", "w") as log:
        code = subprocess.call(
            ["bash", str(REPO / "scripts" / "launch_local.sh"), "--actors", "2", "--learners", "1",
             "--config", str(CONFIG), "--run-dir", str(run_dir), "--set",
             f"run.stop_wall_s={wall_s}", *extra],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
        )  # fmt: skip
    if code != 0:
        raise RuntimeError(f"{name}: the launcher exited {code}; see {log.name}")
    out = run_dir / "benchmark-evaluate.json"
    subprocess.run(
        [sys.executable, "-m", "apexrl", "evaluate", str(run_dir), "--episodes", str(episodes),
         "--envs", "50", "--out", str(out)],
        check=True, capture_output=True, cwd=REPO,
    )  # fmt: skip
    returns = np.asarray(json.loads(out.read_text())["returns"])
    last = json.loads((run_dir / "result.json").read_text().splitlines()[-1])
    return {
        "wall_s": round(time.monotonic() - started),
        "env_steps": last["env_steps"],
        "mean": float(returns.mean()),
        "se": float(returns.std() / np.sqrt(len(returns))),
        "quartiles": np.percentile(returns, [25, 50, 75]).tolist(),
        "run_eval": last["eval_return_mean"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wall-s", type=float, default=600.0, help="learner seconds per run")
    parser.add_argument("--episodes", type=int, default=500, help="greedy episodes per run")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--runs",
        default="trained speaker,random speaker",
        help=f"comma-separated, of: {', '.join(RUNS)}",
    )
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="apexrl-bench-sl-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows = {}
    for name in args.runs.split(","):
        extra = RUNS[name]
        print(f"{time.strftime('%H:%M:%S')} {name}: {args.wall_s:.0f} s in {workdir}", flush=True)
        rows[name] = train_and_evaluate(name, extra, args.wall_s, args.episodes, workdir)
    print(
        f"\n{'run':<17} {'env steps':>10} {'mean ± se':>15} {'p25':>7} {'median':>7} {'p75':>7} "
        f"{'run eval':>9}   (greedy team return, {args.episodes} episodes)"
    )
    for name, row in rows.items():
        p25, median, p75 = row["quartiles"]
        mean = f"{row['mean']:.1f} ± {row['se']:.1f}"
        print(
            f"{name:<17} {row['env_steps']:>10} {mean:>15} {p25:>7.1f} {median:>7.1f} "
            f"{p75:>7.1f} {row['run_eval']:>9.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

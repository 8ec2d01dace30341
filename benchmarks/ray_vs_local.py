"""A run under ``apexrl ray`` against the same run under ``apexrl local``, one after the other on
this machine: what Ray's placement costs in throughput and start-up.

Both runs are the same config with the same actors and one learner, stopped by ``run.stop_wall_s``
= ``--seconds`` (no return threshold): first ``scripts/launch_local.sh``, then ``apexrl ray
--address <a one-node Ray cluster started here>`` (``ray.cluster_utils.Cluster``, its head at
127.0.0.2, a loopback address Ray does not rewrite, with as many logical CPUs as the run's
bundles). From each run's ``result.json``, over its second half: env steps/s, learner updates/s and
samples/s, the learner's data wait; and the seconds from the command to the first record with
learner updates. Ratios are Ray over local.

    python benchmarks/ray_vs_local.py [--config apex_dqn_cartpole] [--actors 2] [--seconds 120]
        [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pong_runs import REPO, launch, second_half  # noqa: E402


def summary(run_dir: Path, started_wall: float) -> dict:
    records = [json.loads(line) for line in (run_dir / "result.json").read_text().splitlines()]
    half, span = second_half(run_dir)
    first, last = half[0], half[-1]
    updating = next((r for r in records if r["learner_updates"] > 0), None)
    created = (run_dir / "config.yaml").stat().st_mtime
    return {
        "env_steps_per_s": (last["env_steps"] - first["env_steps"]) / span,
        "updates_per_s": (last["learner_updates"] - first["learner_updates"]) / span,
        "samples_per_s": (last["learner_samples"] - first["learner_samples"]) / span,
        "data_wait": float(np.mean([r["data_wait_fraction"] for r in half])),
        "env_steps": last["env_steps"],
        # from the command to the learner's first update: config.yaml's writing plus the
        # learner's time to its first record with updates (learner time counts from its start)
        "to_first_update_s": (created - started_wall)
        + (updating["time_s"] if updating else float("nan")),
    }


def run_on_ray(args: argparse.Namespace, workdir: Path) -> tuple[int, Path, float]:
    """The run under ``apexrl ray`` on a one-node cluster started here: (exit code, run
    directory, wall seconds)."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": args.actors + 4,
            "node_ip_address": "127.0.0.2",
            "temp_dir": str(workdir / "ray"),
            "include_dashboard": False,
        },
    )
    run_dir = workdir / "ray_run"
    extra = [arg for o in args.overrides for arg in ("--set", o)]
    try:
        started = time.monotonic()
        with open(workdir / "ray_run.log", "wb") as log:
            proc = subprocess.Popen(
                [
                    sys.executable, "-m", "apexrl", "ray", "--address", cluster.address,
                    "--config", str(REPO / "configs" / f"{args.config}.yaml"),
                    "--actors", str(args.actors), "--run-dir", str(run_dir),
                    "--set", f"run.stop_wall_s={args.seconds}",
                    "--set", "run.stop_eval_return=null",
                    *extra,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            try:
                code = proc.wait(timeout=args.seconds + 300)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait()
        return code, run_dir, time.monotonic() - started
    finally:
        cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="apex_dqn_cartpole")
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    # SIGTERM unwinds through the finally blocks, which stop the runs and the Ray cluster.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    rows = {}
    with tempfile.TemporaryDirectory(prefix="ray_vs_local_") as tmp:
        workdir = Path(tmp)
        overrides = ("run.stop_eval_return=null", *args.overrides)
        started_wall = time.time()
        code, run_dir, wall = launch(
            args.config, args.actors, args.seconds, workdir, overrides, name="local"
        )
        assert code == 0, (workdir / "local.log").read_text()[-3000:]
        rows["local"] = {**summary(run_dir, started_wall), "wall_s": wall}
        started_wall = time.time()
        code, run_dir, wall = run_on_ray(args, workdir)
        assert code == 0, (workdir / "ray_run.log").read_text()[-3000:]
        rows["ray"] = {**summary(run_dir, started_wall), "wall_s": wall}
    print(
        f"\n{args.config}, {args.actors} actors, 1 learner, {args.seconds:.0f} s a run "
        "(second half of each run)"
    )
    print(
        f"{'launcher':<8} {'env steps/s':>12} {'updates/s':>10} {'samples/s':>10} "
        f"{'data wait':>10} {'to 1st update':>14} {'wall s':>7}"
    )
    for name, r in rows.items():
        print(
            f"{name:<8} {r['env_steps_per_s']:>12,.0f} {r['updates_per_s']:>10,.1f} "
            f"{r['samples_per_s']:>10,.0f} {r['data_wait']:>10.2f} "
            f"{r['to_first_update_s']:>13.1f}s {r['wall_s']:>7.0f}"
        )
    local, ray = rows["local"], rows["ray"]
    print(
        f"ray / local: env steps/s {ray['env_steps_per_s'] / local['env_steps_per_s']:.2f}, "
        f"updates/s {ray['updates_per_s'] / local['updates_per_s']:.2f}"
    )


if __name__ == "__main__":
    main()

"""A tracker that does not answer against no tracker: the same PPO CartPole run, one after the
other, alternating, on this machine.

``--track mlflow`` with ``run.mlflow_tracking_uri`` at a loopback port where a socket accepts
connections and never answers (a server that hangs), against the run without a tracker and the
run with one that answers (MLflow's file store in a temporary directory,
``MLFLOW_ALLOW_FILE_STORE=true``). Printed
per run: the learner's time to the stop condition (``result.json``'s last ``time_s``), the env
steps then, the launcher's wall time (at its end the learner waits for the trackers up to
``tracking.feed.FINISH_TIMEOUT_S``, or until the launcher stops it), and what the learner's log
said about the tracker (each line once); then the medians and their ratio.

    python benchmarks/tracker_overhead.py [--runs 3] [--config ppo_cartpole] [--seconds 120]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pong_runs import launch  # noqa: E402

TRACKER_LINES = ("could not start", "calls failed", "did not finish", "behind by", "said once")


class HangingServer:
    """A loopback TCP port that accepts every connection and never sends a byte."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def one_run(args: argparse.Namespace, workdir: Path, name: str, tracked: str) -> dict:
    overrides = [f"run.stop_wall_s={args.seconds}"]
    flags: tuple[str, ...] = ()
    if tracked:
        overrides.append(f"run.mlflow_tracking_uri={tracked}")
        flags = ("--track", "mlflow")
    code, run_dir, wall_s = launch(
        args.config, args.actors, args.seconds, workdir, tuple(overrides), name, flags
    )
    records = [json.loads(line) for line in (run_dir / "result.json").read_text().splitlines()]
    log = (run_dir / "logs" / "learner.log").read_text()
    said = [line.split("WARNING", 1)[-1].strip() for line in log.splitlines()
            if any(key in line for key in TRACKER_LINES)]  # fmt: skip
    return {
        "code": code,
        "solved": bool(records[-1]["done"]),
        "time_s": records[-1]["time_s"],
        "env_steps": records[-1]["env_steps"],
        "wall_s": wall_s,
        "said": said,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--config", default="ppo_cartpole")
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=120.0)
    args = parser.parse_args()
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # the answering tracker's file store
    hanging = HangingServer()
    rows: dict[str, list[dict]] = {"no tracker": [], "answering tracker": [], "hanging tracker": []}
    try:
        with tempfile.TemporaryDirectory(prefix="tracker_overhead_") as tmp:
            for i in range(args.runs):
                for label, uri in (
                    ("no tracker", ""),
                    ("answering tracker", f"file://{Path(tmp) / 'mlruns'}"),
                    ("hanging tracker", f"http://127.0.0.1:{hanging.port}"),
                ):
                    name = f"{label.replace(' ', '_')}_{i}"
                    row = one_run(args, Path(tmp), name, uri)
                    rows[label].append(row)
                    print(
                        f"{label:16s} run {i}: exit {row['code']}, solved {row['solved']}, "
                        f"{row['time_s']:.1f} s learner time, {row['env_steps']} env steps, "
                        f"{row['wall_s']:.1f} s wall; said: {row['said'] or 'nothing'}",
                        flush=True,
                    )
    finally:
        hanging.close()
    medians = {
        label: (
            statistics.median(r["time_s"] for r in runs),
            statistics.median(r["wall_s"] for r in runs),
        )
        for label, runs in rows.items()
    }
    print("\n| runs | learner time to solve (median) | launcher wall time (median) |")
    print("|---|---|---|")
    for label, (time_s, wall_s) in medians.items():
        print(f"| {label} | {time_s:.1f} s | {wall_s:.1f} s |")
    for label in ("answering tracker", "hanging tracker"):
        ratio = medians[label][0] / medians["no tracker"][0]
        print(f"learner time to solve, {label} / none: {ratio:.2f}")
    return 0 if all(r["code"] == 0 and r["solved"] for runs in rows.values() for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())

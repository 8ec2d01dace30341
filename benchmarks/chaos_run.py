"""Chaos run: a launched run whose roles are SIGKILLed at random, then left to reach its target.

``scripts/launch_local.sh --actors N --learners 1 --config CONFIG`` (with its evaluation actor and
CURVE keys, as a user starts it) runs in a temporary run directory (or ``--run-dir``). Once the
learner updates, for ``--chaos-minutes`` (10) a random role is SIGKILLed every 20-40 s (seeded
``--seed``): the replay server, the parameter server, the learner, one of the training actors or
the evaluation actor, each of the five kinds as likely; the launcher's supervisor restarts it.
For each kill the script measures, polling the servers' ``Stats`` every 0.25 s:

- ``back``: seconds until the role served again: a server answers ``Stats``; the learner publishes
  weights (a version other than the one at the kill); an actor's report reaches replay;
- ``advance``: seconds until learner updates advanced again: the parameter server holds a version
  newer than both the one at the kill and the one when the role was back (for a learner, which
  resumes from its last checkpoint, that is the updates lost since it caught up again);
- ``rollback``: for a replay kill, the items stored of the new server (``replay/items_stored``,
  or ``replay/num_inserted`` where replay has no item accounting) against the last count read
  from the killed server (a negative number is acknowledged items the restart did not bring
  back; at least: what was stored between that reading and the kill is not in it).

**What "reached its target" means here.** The config's stop condition is held back for the whole
run (``run.stop_eval_return=null``): with it, CartPole would stop itself within the chaos window
and the kills would stop with it. After the chaos window nothing is killed and the script judges
the evaluation actor's rounds the way the learner does (``apexrl.learning`` ``stop_reason``): a
round of ``run.stop_eval_episodes`` greedy episodes of one weights version with a mean of at least
the config's ``run.stop_eval_return``, and, so that the result speaks of the run after the chaos,
of a version the learner published after the chaos window ended. It waits for that round and for
every killed role to be back with updates advanced past its kill, at most ``--after-minutes``
(10) after the chaos. Then it stops the run as a user does (``apexrl stop``: the launcher must
exit 0) and checks that no process of the run is left (every PID whose command line names the run
directory). The first round at the target during the chaos, if any, is printed too.

The table: each kill (time from the chaos start, role, PID, back, advance, rollback), totals per
role, the judged evaluation round and when it came, the launcher's restart counts, the replay
accounting (every ``replay/items_*`` counter of replay's last ``Stats`` and of ``result.json``'s
last line, with ``replay/num_inserted``, ``replay/size`` and ``replay/env_steps``; acknowledged =
stored + duplicates; whether the identities of ``apexrl.replay.accounting`` hold) and the
processes left. Exit status 1 when the target was not reached, items were lost (a rollback or
``replay/items_lost`` above 0), the launcher did not exit 0 or a process was left.

    python benchmarks/chaos_run.py [--chaos-minutes 10] [--after-minutes 10] [--actors 2]
                                   [--config configs/apex_dqn_cartpole.yaml] [--seed 0]
    python benchmarks/chaos_run.py --chaos-minutes 1 --kill-every 8 12   # a short smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from apexrl.config import Config, load_config  # noqa: E402
from apexrl.tools.server_stats import server_stats  # noqa: E402
from apexrl.transport import auth, sockets  # noqa: E402

LAUNCHER = REPO / "scripts" / "launch_local.sh"
DEFAULT_CONFIG = "configs/apex_dqn_cartpole.yaml"
KINDS = ("replay", "params", "learner", "actor", "eval")  # what a kill picks from, equally
POLL_S = 0.25
STATS_TIMEOUT_MS = 300
START_LIMIT_S = 120.0  # the run must be training by then
STOP_LIMIT_S = 60.0  # the launcher's exit after `apexrl stop` (its own bound: 10 s a stage)


# -- the run's processes ---------------------------------------------------------------------------


def run_processes(marker: str) -> dict[int, list[str]]:
    """Live processes (not zombies) whose command line mentions ``marker``: pid -> argv."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):  # it exited while we looked
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        if state != "Z" and any(marker in a for a in args):
            found[int(entry.name)] = args
    return found


def role_of(argv: list[str]) -> str:
    """``replay``, ``params``, ``learner``, ``actor_<i>``, ``eval``, ``local`` (the launcher),
    ``forkserver``, or ``other``."""
    if any(a.endswith("apexrl.launch.forkserver") for a in argv):
        return "forkserver"
    if "apexrl" not in argv:
        return "other"
    role = argv[argv.index("apexrl") + 1] if argv.index("apexrl") + 1 < len(argv) else "other"
    if role != "actor":
        return role
    if "--eval" in argv:
        return "eval"
    return f"actor_{argv[argv.index('--id') + 1]}" if "--id" in argv else "actor"


def pids_by_role(marker: str) -> dict[str, int]:
    """role -> pid of the run's processes (the last one seen when two share a role)."""
    return {role_of(argv): pid for pid, argv in run_processes(marker).items()}


def kill_left(marker: str, wait_s: float = 5.0) -> list[str]:
    """The run's processes still there after ``wait_s`` (``role pid``), SIGKILLed."""
    deadline = time.monotonic() + wait_s
    while run_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = run_processes(marker)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return [f"{role_of(argv)} {pid}" for pid, argv in left.items()]


# -- a launched run --------------------------------------------------------------------------------


@dataclass
class LaunchedRun:
    """``scripts/launch_local.sh`` started by a benchmark, in its own session."""

    popen: subprocess.Popen
    run_dir: Path
    log_path: Path

    @property
    def marker(self) -> str:
        return str(self.run_dir)

    def config(self, deadline: float) -> Config:
        """The run's resolved config, once the launcher has written it."""
        path = self.run_dir / "config.yaml"
        while True:
            try:
                return load_config(path)
            except Exception:  # not there yet, or half written
                if time.monotonic() > deadline or self.popen.poll() is not None:
                    raise RuntimeError(f"no run config at {path}\n{self.log_tail()}") from None
                time.sleep(0.1)

    def log_tail(self, num_lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])
        except OSError:
            return ""

    def stop(self, limit_s: float = STOP_LIMIT_S) -> int | None:
        """``apexrl stop`` with the run's config (what a user types); the launcher's exit status,
        or None when it had to be SIGTERMed (and SIGKILLed) as a group."""
        if self.popen.poll() is None:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "apexrl",
                    "stop",
                    "--config",
                    str(self.run_dir / "config.yaml"),
                ],
                cwd=REPO,
                capture_output=True,
                timeout=limit_s,
                check=False,
            )
        try:
            return self.popen.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            self.terminate()
            return None

    def terminate(self) -> None:
        """SIGTERM the launcher (it stops its children), SIGKILL its group after its bound."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=30.0)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.popen.wait()


def launch(args: list[str], run_dir: Path, log_path: Path) -> LaunchedRun:
    """``scripts/launch_local.sh ARGS --run-dir RUN_DIR`` with its output in ``log_path``."""
    with log_path.open("wb") as log_file:
        popen = subprocess.Popen(
            ["bash", str(LAUNCHER), *args, "--run-dir", str(run_dir)],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,  # a terminal's Ctrl-C reaches this script alone
        )
    return LaunchedRun(popen, run_dir, log_path)


class StatsReader:
    """Both servers' ``Stats``, asked as the evaluation actor (the least privileged key)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.ctx = sockets.make_context()
        self.keys = {s: auth.client_keys(cfg.net, "eval", s) for s in ("replay", "params")}

    def read(self, server: str, timeout_ms: int = STATS_TIMEOUT_MS) -> dict[str, float] | None:
        addr = self.cfg.net.replay_addr if server == "replay" else self.cfg.net.params_addr
        return server_stats(self.ctx, addr, timeout_ms, curve=self.keys[server])

    def close(self) -> None:
        self.ctx.term()


def last_result(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "result.json").read_text().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return {}


def wait_until_training(run: LaunchedRun, reader: StatsReader, roles: set[str]) -> None:
    """Until every role runs, both servers answer and the parameter server holds a version."""
    deadline = time.monotonic() + START_LIMIT_S
    while True:
        if run.popen.poll() is not None:
            raise RuntimeError(f"the launcher exited with {run.popen.returncode}\n{run.log_tail()}")
        params = reader.read("params")
        if roles <= set(pids_by_role(run.marker)) and params and params["params/version"] > 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the run was not training after {START_LIMIT_S:g} s")
        time.sleep(0.5)


# -- kills and their recovery ----------------------------------------------------------------------


@dataclass
class Kill:
    at_s: float  # seconds from the chaos start
    role: str
    pid: int
    killed_at: float  # time.monotonic()
    version: float  # the parameter server's version at the kill
    inserted: float | None  # items stored, last read before the kill (replay kills)
    back_s: float | None = None
    version_back: float | None = None
    advance_s: float | None = None
    rollback: float | None = None  # the new server's items stored minus the killed one's


@dataclass
class Poll:
    """One look at the run."""

    now: float
    replay: dict[str, float] | None
    params: dict[str, float] | None


def stored_count(replay: dict[str, float]) -> float:
    """Items replay has stored: its item accounting's count, or its inserts without one."""
    return replay.get("replay/items_stored", replay.get("replay/num_inserted", 0.0))


def actor_key(role: str) -> str:
    return "eval_0" if role == "eval" else role.removeprefix("actor_")


def is_back(kill: Kill, poll: Poll) -> bool:
    """Whether the killed role served again by this poll (see the module doc)."""
    if kill.role in ("replay", "params"):
        return getattr(poll, kill.role) is not None
    if kill.role == "learner":
        return poll.params is not None and poll.params["params/version"] not in (-1, kill.version)
    heard = (poll.replay or {}).get(f"actor/{actor_key(kill.role)}/last_heard_s")
    return heard is not None and heard < poll.now - kill.killed_at


def follow(kill: Kill, poll: Poll) -> None:
    """Fill in what this poll shows of a kill's recovery."""
    version = (poll.params or {}).get("params/version")
    if kill.back_s is None and is_back(kill, poll):
        kill.back_s = poll.now - kill.killed_at
        kill.version_back = version if version is not None else kill.version
        if kill.role == "replay" and kill.inserted is not None:
            kill.rollback = stored_count(poll.replay) - kill.inserted
    if kill.back_s is not None and kill.advance_s is None and version is not None:
        if version > max(kill.version, kill.version_back):
            kill.advance_s = poll.now - kill.killed_at


def pick_victim(
    rng: random.Random, pids: dict[str, int], kinds: tuple[str, ...] = KINDS
) -> tuple[str, int] | None:
    """A random running role of a random kind (of ``kinds``) and its pid."""
    kinds = [k for k in kinds if any(r == k or r.startswith(f"{k}_") for r in pids)]
    if not kinds:
        return None
    kind = rng.choice(kinds)
    role = kind if kind in pids else rng.choice(sorted(r for r in pids if r.startswith(kind)))
    return role, pids[role]


# -- the run ---------------------------------------------------------------------------------------


@dataclass
class Judged:
    """An evaluation round: its mean, weights version and when it came (chaos-start seconds)."""

    mean: float
    version: int
    at_s: float


@dataclass
class Outcome:
    kills: list[Kill] = field(default_factory=list)
    first_at_target: Judged | None = None  # during the chaos
    judged: Judged | None = None  # after the chaos, of a version published after it
    best_after: Judged | None = None  # the best full round after the chaos
    chaos_end_version: float = -1.0
    chaos_s: float = 0.0
    after_s: float = 0.0
    replay_end: dict[str, float] | None = None
    pids_seen: set[int] = field(default_factory=set)


def full_round(replay: dict[str, float] | None, episodes: int) -> tuple[float, int] | None:
    """(mean, version) of replay's last evaluation round when it is full and of one version."""
    if not replay or replay.get("eval/episodes_in_window", 0) < episodes:
        return None
    version, mean = int(replay.get("eval/version", -1)), replay.get("eval/return_mean")
    return None if version < 0 or mean is None or mean != mean else (mean, version)


def watch(
    run: LaunchedRun,
    reader: StatsReader,
    out: Outcome,
    rng: random.Random,
    args: argparse.Namespace,
    target: float,
    episodes: int,
) -> None:
    """The chaos window, then the wait for the target; fills ``out``."""
    started = time.monotonic()
    chaos_end = started + args.chaos_minutes * 60
    give_up = chaos_end + args.after_minutes * 60
    next_kill = started + rng.uniform(*args.kill_every)
    last_inserted: float | None = None
    version = -1.0
    while True:
        if run.popen.poll() is not None:
            print(f"the launcher exited with {run.popen.returncode} during the run", flush=True)
            break
        pids = pids_by_role(run.marker)
        out.pids_seen.update(pids.values())
        poll = Poll(time.monotonic(), reader.read("replay"), reader.read("params"))
        if poll.replay is not None:
            last_inserted = stored_count(poll.replay)
        if poll.params is not None and poll.params["params/version"] >= 0:
            version = poll.params["params/version"]
        for kill in out.kills:
            follow(kill, poll)
        at_s = poll.now - started
        judged = full_round(poll.replay, episodes)
        if poll.now < chaos_end:
            if judged and judged[0] >= target and out.first_at_target is None:
                out.first_at_target = Judged(judged[0], judged[1], at_s)
            if poll.now >= next_kill:
                victim = pick_victim(rng, pids, tuple(args.kinds))
                if victim is not None:
                    role, pid = victim
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        continue
                    inserted = last_inserted if role == "replay" else None
                    out.kills.append(Kill(at_s, role, pid, time.monotonic(), version, inserted))
                    print(f"{at_s:7.1f} s  SIGKILL {role} (pid {pid})", flush=True)
                next_kill = poll.now + rng.uniform(*args.kill_every)
        else:
            if not out.chaos_s:
                out.chaos_s, out.chaos_end_version = at_s, version
                print(f"{at_s:7.1f} s  chaos over at weights version {version:.0f}", flush=True)
            if judged and judged[1] > out.chaos_end_version:
                mean, judged_version = judged
                if out.best_after is None or mean > out.best_after.mean:
                    out.best_after = Judged(mean, judged_version, at_s)
                if mean >= target and out.judged is None:
                    out.judged = Judged(mean, judged_version, at_s)
                    print(f"{at_s:7.1f} s  target reached: {mean:.1f} (v{judged_version})")
            recovered = all(k.advance_s is not None for k in out.kills)
            if (out.judged and recovered) or poll.now >= give_up:
                break
        time.sleep(max(POLL_S - (time.monotonic() - poll.now), 0.0))
    out.after_s = time.monotonic() - started - out.chaos_s
    out.replay_end = reader.read("replay", timeout_ms=2000)


# -- the report ------------------------------------------------------------------------------------


def fmt_s(value: float | None) -> str:
    return "not seen" if value is None else f"{value:.1f}"


def items_counters(replay: dict[str, float] | None, result: dict) -> dict[str, float]:
    """Replay's item accounting: ``replay/items_*`` of its ``Stats`` and of ``result.json``, with
    its insert, size and env-step counters."""
    counters = {}
    for key, value in (replay or {}).items():
        if key.startswith("replay/items_") or key in (
            "replay/num_inserted",
            "replay/size",
            "replay/env_steps",
            "replay/evicted_for_frames",
            "replay/snapshot_items",
        ):
            counters[key] = value
    for key, value in result.items():
        if "items" not in key:
            continue
        if isinstance(value, dict):  # result.json's replay_items: {name: count}
            for name, count in value.items():
                if isinstance(count, int | float):
                    counters[f"result.json {key}.{name}"] = count
        elif isinstance(value, int | float):
            counters[f"result.json {key}"] = value
    return counters


def rolled_back(out: Outcome) -> float:
    """Stored items the restarted replay servers did not have, by our own readings."""
    return sum(-k.rollback for k in out.kills if k.rollback is not None and k.rollback < 0)


def lost_items(out: Outcome, counters: dict[str, float]) -> float:
    """Acknowledged items lost: the more of replay's own count and our readings (both may see
    the same loss)."""
    return max(rolled_back(out), counters.get("replay/items_lost", 0.0))


def accounting_lines(counters: dict[str, float]) -> list[str]:
    """Acknowledged, stored and lost items, and whether replay's two identities hold
    (``apexrl.replay.accounting``), when its last ``Stats`` had the counters."""
    c = {k.removeprefix("replay/items_"): v for k, v in counters.items() if "/items_" in k}
    needed = ("received", "stored", "duplicates", "refused", "held", "size", "lost")
    if not all(name in c for name in needed):
        return ["  (replay's Stats had no item accounting: replay/items_* missing)"]
    removed = sum(c.get(n, 0.0) for n in ("evicted_capacity", "evicted_for_frames", "consumed"))
    received_ok = c["received"] == c["stored"] + c["duplicates"] + c["refused"] + c["held"]
    stored_ok = c["stored"] == c["size"] + removed
    return [
        f"  acknowledged (stored + duplicates)       {c['stored'] + c['duplicates']:>14,.0f}",
        f"  stored                                   {c['stored']:>14,.0f}",
        f"  lost (replay/items_lost)                 {c['lost']:>14,.0f}",
        f"  received = stored + duplicates + refused + held: {'holds' if received_ok else 'NO'}",
        f"  stored = size + evicted + consumed: {'holds' if stored_ok else 'NO'}",
    ]


def report(
    out: Outcome, target: float, episodes: int, launcher_log: str, counters: dict[str, float]
) -> None:
    print(f"\nKills ({len(out.kills)} in {out.chaos_s:.0f} s of chaos); seconds from the kill")
    print(f"{'at s':>7} {'role':<9} {'pid':>7} {'back s':>8} {'advance s':>10} {'rollback':>9}")
    for k in out.kills:
        rollback = "-" if k.rollback is None else f"{k.rollback:+.0f}"
        print(
            f"{k.at_s:>7.1f} {k.role:<9} {k.pid:>7} {fmt_s(k.back_s):>8} "
            f"{fmt_s(k.advance_s):>10} {rollback:>9}"
        )
    print("\nPer role")
    print(f"{'role':<9} {'kills':>5} {'back mean s':>11} {'back max s':>10} {'advance max s':>13}")
    for kind in KINDS:
        mine = [k for k in out.kills if k.role == kind or k.role.startswith(f"{kind}_")]
        backs = [k.back_s for k in mine if k.back_s is not None]
        advances = [k.advance_s for k in mine if k.advance_s is not None]
        mean = sum(backs) / len(backs) if backs else None
        missing = len(mine) - len(backs)
        print(
            f"{kind:<9} {len(mine):>5} {fmt_s(mean):>11} {fmt_s(max(backs, default=None)):>10} "
            f"{fmt_s(max(advances, default=None)):>13}"
            + (f"  ({missing} not back)" if missing else "")
        )
    marker = "restarts in this session: "
    restarts = [line.split(marker)[-1] for line in launcher_log.splitlines() if marker in line]
    print(f"\nrestarts the launcher counted: {restarts[-1] if restarts else '-'}")
    print(f"\nEvaluation (target {target:g}: a round of {episodes} episodes of one version)")
    if out.first_at_target:
        j = out.first_at_target
        print(
            f"  first round at the target during the chaos: {j.mean:.1f} (v{j.version}) "
            f"at {j.at_s:.0f} s"
        )
    else:
        print("  no round at the target during the chaos")
    if out.judged:
        j = out.judged
        print(
            f"  after the chaos: {j.mean:.1f} (v{j.version}, published after the chaos's "
            f"v{out.chaos_end_version:.0f}) at {j.at_s:.0f} s, "
            f"{j.at_s - out.chaos_s:.0f} s after it"
        )
    else:
        best = (
            "none"
            if out.best_after is None
            else f"{out.best_after.mean:.1f} (v{out.best_after.version})"
        )
        print(f"  not reached in {out.after_s:.0f} s after the chaos; best round then: {best}")
    print("\nReplay accounting (its last Stats, result.json's last line)")
    for key, value in counters.items():
        print(f"  {key:<40} {value:>14,.0f}")
    for line in accounting_lines(counters):
        print(line)
    print(f"  {'rolled back at replay restarts':<40} {rolled_back(out):>14,.0f}")
    print(f"  {'lost (the more of the two)':<40} {lost_items(out, counters):>14,.0f}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chaos-minutes", type=float, default=10.0)
    parser.add_argument(
        "--after-minutes", type=float, default=10.0, help="time limit for the target after chaos"
    )
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--kill-every", type=float, nargs=2, default=(20.0, 40.0), metavar=("MIN_S", "MAX_S")
    )
    parser.add_argument(
        "--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="what may be killed"
    )
    parser.add_argument("--target", type=float, help="evaluation target (default: the config's)")
    parser.add_argument("--run-dir", type=Path, help="default: a new temporary directory")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="launcher --set k=v"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the ``finally`` below stops the run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    base = Path(tempfile.mkdtemp(prefix="apexrl-chaos-"))
    run_dir = args.run_dir or base / "run"
    config = load_config(REPO / args.config if not Path(args.config).is_absolute() else args.config)
    target = config.run.stop_eval_return if args.target is None else args.target
    episodes = config.run.stop_eval_episodes
    if target is None:
        print("the config has no run.stop_eval_return: give --target", file=sys.stderr)
        return 2
    launcher_args = ["--actors", str(args.actors), "--learners", "1", "--config", args.config]
    # The stop condition is held back (the module doc says why); the script stops the run.
    for override in ("run.stop_eval_return=null", "run.stop_wall_s=0", *args.overrides):
        launcher_args += ["--set", override]
    print(f"chaos run: {' '.join(launcher_args)}; run dir {run_dir}", flush=True)
    load_before = os.getloadavg()
    run = launch(launcher_args, run_dir, base / "launcher.log")
    out, code, reader, left = Outcome(), None, None, []
    try:
        reader = StatsReader(run.config(time.monotonic() + START_LIMIT_S))
        roles = {"replay", "params", "learner", "eval", *(f"actor_{i}" for i in range(args.actors))}
        wait_until_training(run, reader, roles)
        print(f"training; chaos for {args.chaos_minutes:g} min (seed {args.seed})", flush=True)
        watch(run, reader, out, random.Random(args.seed), args, target, episodes)
    finally:
        if reader is not None:
            reader.close()
        code = run.stop()
        left = kill_left(run.marker)
    counters = items_counters(out.replay_end, last_result(run_dir))
    report(out, target, episodes, run.log_path.read_text(errors="replace"), counters)
    lost = lost_items(out, counters)
    print(f"\nlauncher exit status after `apexrl stop`: {code}")
    print(
        f"processes of the run: {len(out.pids_seen)} seen, left after the stop: "
        f"{', '.join(left) if left else 'none'}"
    )
    load_after = os.getloadavg()
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    print(f"(logs in {run_dir / 'logs'}, launcher log {run.log_path})")
    problems = []
    if out.judged is None:
        problems.append("target not reached after the chaos")
    if lost:
        problems.append(f"{lost:.0f} items lost")
    return verdict(problems, code, left)


def verdict(problems: list[str], launcher_code: int | None, left: list[str]) -> int:
    """Print the run's last line, ``RESULT: ok`` or what failed (``problems``, a launcher that
    did not exit 0 after the stop, processes of the run left); the exit status."""
    if launcher_code != 0:
        problems = [*problems, f"launcher exit status {launcher_code}"]
    if left:
        problems = [*problems, "processes left"]
    print("RESULT: " + ("ok" if not problems else "FAILED: " + "; ".join(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

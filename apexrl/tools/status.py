"""``apexrl status``: a table of a live run's roles, read from its servers and its run directory.

Asks:  DEALER cfg.net.replay_addr, DEALER cfg.net.params_addr (as the ``eval`` role with CURVE keys)
       out: StatsRequest     in: Stats
Reads: <run dir>/result.json (the learner's last line), <run dir>/roles.json (the launcher's roles:
       PIDs, cores, restarts, states), both through ``apexrl.launch.run_state``; where the
       launcher runs on this host, each running role's CPU affinity and niceness from the kernel

A serial run's servers are in-process (``inproc://``): status asks the Stats relay whose loopback
addresses the serial runner records in ``roles.json`` (``apexrl.launch.stats_relay``) instead.

One row per role: replay, params, the learner(s), every actor and the evaluation actor, with their
throughput, weights version and lag behind the parameter server, time since last heard,
restarts and where it runs (its cores and niceness: the launcher's ``--placement``). Actors are
known from the replay server's ``actor/<id>/...`` entries (what their reports said). A server
that does not answer within ``--timeout`` shows as ``no answer``: the command never hangs on a
dead run. ``build_rows`` is pure (readings in, rows out); ``render`` draws them; ``watch`` is the
loop.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from apexrl.config import NetConfig
from apexrl.launch.placement import describe_cores
from apexrl.launch.run_state import last_result, read_roles
from apexrl.runtime import rundir
from apexrl.tools.server_stats import server_stats

if TYPE_CHECKING:
    import zmq

    from apexrl.transport.auth import ClientKeys

NO_ANSWER = "no answer"
SILENT_S = 30.0  # an actor not heard from for longer shows as "silent" (replay/active_actors too)
ONCE_GAP_S = 1.0  # --once reads twice, this far apart, to show the servers' rates
COLUMNS = (
    "role",
    "state",
    "pid",
    "cores",
    "restarts",
    "throughput",
    "version",
    "lag",
    "heard",
    "details",
)
EXIT_OK = 0
EXIT_NO_ANSWER = 1  # the table was printed, but a server did not answer (--once)
EXIT_USAGE = 2


@dataclass(frozen=True)
class Reading:
    """What one look at a run found. ``None`` stats: the server did not answer in time."""

    time: float  # time.monotonic() when it was taken
    replay: dict[str, float] | None
    params: dict[str, float] | None
    learner: dict | None = None  # the last result.json line
    learner_age_s: float | None = None  # seconds since result.json was written
    roles: list[dict] = field(default_factory=list)  # roles.json's roles; empty: none
    launcher_alive: bool | None = None  # None: no roles.json, or it was written on another host


@dataclass(frozen=True)
class Row:
    role: str
    state: str
    pid: str = "-"
    cores: str = "-"  # where it runs: its CPU affinity and niceness
    restarts: str = "-"
    throughput: str = "-"
    version: str = "-"
    lag: str = "-"
    heard: str = "-"
    details: str = ""

    def cells(self) -> tuple[str, ...]:
        return tuple(getattr(self, name) for name in COLUMNS)


# -- formatting ------------------------------------------------------------------------------------


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def fmt_rate(value: float | None, unit: str = "/s") -> str:
    """``1,234/s``, ``12.5/s``; ``-`` when unknown."""
    if not _finite(value):
        return "-"
    return f"{value:,.0f}{unit}" if abs(value) >= 100 else f"{value:.1f}{unit}"


def fmt_age(seconds: float | None) -> str:
    """``0.4s``, ``12s``, ``3m05s``, ``2h10m``; ``-`` when unknown."""
    if not _finite(seconds):
        return "-"
    seconds = max(seconds, 0.0)
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def fmt_int(value: float | None) -> str:
    return f"{int(value):,}" if _finite(value) else "-"


def fmt_return(value: float | None) -> str:
    return f"{value:.1f}" if _finite(value) else "-"


def _rate(now: Reading, before: Reading | None, server: str, key: str) -> float | None:
    """Per second growth of a server's counter ``key`` between two readings."""
    if before is None or now.time <= before.time:
        return None
    new, old = getattr(now, server), getattr(before, server)
    if new is None or old is None or key not in new or key not in old:
        return None
    return (new[key] - old[key]) / (now.time - before.time)


# -- rows ------------------------------------------------------------------------------------------


def actor_entries(replay: dict[str, float] | None) -> dict[str, dict[str, float]]:
    """The replay server's per-actor entries by role name (``actor_3``, ``eval``, ``eval_2``):
    ``actor/3/env_steps_per_s`` -> ``{"actor_3": {"env_steps_per_s": ...}}``."""
    actors: dict[str, dict[str, float]] = {}
    for key, value in (replay or {}).items():
        parts = key.split("/")
        if len(parts) != 3 or parts[0] != "actor":
            continue
        name = parts[1]
        if name == "eval_0":
            role = "eval"
        elif name.startswith("eval_"):
            role = name
        else:
            role = f"actor_{name}"
        actors.setdefault(role, {})[parts[2]] = value
    return actors


def _role_order(name: str) -> tuple[int, int, str]:
    """replay, params, learners, actors by id, evaluation actors."""
    head, _, tail = name.partition("_")
    rank = {"replay": 0, "params": 1, "learner": 2, "actor": 3, "eval": 4}.get(head, 5)
    return (rank, int(tail) if tail.isdigit() else -1, name)


def _launcher_state(role: dict | None, alive: bool | None) -> str | None:
    """What the launcher says of a role, when that is not simply "running"."""
    if role is None:
        return None
    state = role.get("state", "")
    if state == "exited":
        return f"exited {role.get('exit_code')}"
    if alive is False:  # what it said last no longer holds
        return "launcher gone"
    return None if state == "running" else state


def _cores(role: dict | None, launcher_alive: bool | None) -> str:
    """Where a role runs: read from the live process where the launcher runs on this host
    (``0-1 nice 10``), else the cores the launcher gave it in ``roles.json``."""
    if not role or role.get("pid") is None:
        return "-"
    if launcher_alive and role.get("state") == "running":
        try:
            cores = describe_cores(os.sched_getaffinity(role["pid"]))
            nice = os.getpriority(os.PRIO_PROCESS, role["pid"])
            return cores if nice == 0 else f"{cores} nice {nice}"
        except (OSError, AttributeError, TypeError):  # gone, or not Linux
            pass
    given = role.get("cores")
    return describe_cores(given) if isinstance(given, list) and given else "all"


def build_rows(now: Reading, before: Reading | None = None) -> list[Row]:
    """The table's rows from a reading (and the one before it, for the servers' rates)."""
    roles = {r["name"]: r for r in now.roles if isinstance(r, dict) and "name" in r}
    params_version = (now.params or {}).get("params/version")
    actors = actor_entries(now.replay)
    names = set(roles) | set(actors) | {"replay", "params"}
    if now.learner is not None and not any(n.startswith("learner") for n in names):
        names.add("learner")
    first_learner = min((n for n in names if n.startswith("learner")), key=_role_order, default="")
    rows = []
    for name in sorted(names, key=_role_order):
        role = roles.get(name)
        launcher = _launcher_state(role, now.launcher_alive)
        common = {
            "role": name,
            "pid": str(role["pid"]) if role and role.get("pid") is not None else "-",
            "cores": _cores(role, now.launcher_alive),
            "restarts": str(role.get("restarts", 0)) if role else "-",
        }
        if name == "replay":
            rows.append(_replay_row(now, before, launcher, common))
        elif name == "params":
            rows.append(_params_row(now, before, launcher, common))
        elif name.startswith("learner"):
            learner = now.learner if name == first_learner else None
            rows.append(_learner_row(learner, now, params_version, launcher, common))
        else:
            rows.append(_actor_row(name, actors.get(name), params_version, launcher, common))
    return rows


def _replay_row(now: Reading, before: Reading | None, launcher: str | None, common: dict) -> Row:
    stats = now.replay
    if stats is None:
        return Row(state=launcher or NO_ANSWER, **common)
    inserts = _rate(now, before, "replay", "replay/num_inserted")
    samples = _rate(now, before, "replay", "replay/num_sampled")
    details = (
        f"size {fmt_int(stats.get('replay/size'))}"
        f" · env steps {fmt_int(stats.get('replay/env_steps'))}"
        f" · actors {fmt_int(stats.get('replay/active_actors'))}"
        f" · pending {fmt_int(stats.get('replay/pending_inserts'))}"
        f" · rejected {fmt_int(stats.get('replay/rejected_messages'))}"
    )
    tables = per_policy(stats, "replay", "size")
    if tables:  # a multi-agent run: a table per trained policy
        details += " · tables " + ", ".join(f"{name} {fmt_int(v)}" for name, v in tables.items())
    return Row(
        state=launcher or "ok",
        throughput=f"in {fmt_rate(inserts)} out {fmt_rate(samples)}",
        heard="now",
        details=details,
        **common,
    )


def _params_row(now: Reading, before: Reading | None, launcher: str | None, common: dict) -> Row:
    stats = now.params
    if stats is None:
        return Row(state=launcher or NO_ANSWER, **common)
    served = _rate(now, before, "params", "params/num_served")
    details = (
        f"served {fmt_int(stats.get('params/num_served'))}"
        f" ({fmt_int(stats.get('params/num_served_shm'))} by shm)"
        f" · rejected {fmt_int(stats.get('params/rejected_messages'))}"
    )
    versions = per_policy(stats, "params", "version")
    if versions:  # a multi-agent run: each network policy's weights
        details += " · " + ", ".join(f"{name} v{fmt_int(v)}" for name, v in versions.items())
    return Row(
        state=launcher or "ok",
        throughput=f"served {fmt_rate(served)}",
        version=fmt_int(stats.get("params/version")),
        heard="now",
        details=details,
        **common,
    )


def _learner_row(
    learner: dict | None,
    now: Reading,
    params_version: float | None,
    launcher: str | None,
    common: dict,
) -> Row:
    if learner is None:  # a rank > 0, or no result.json line yet
        return Row(state=launcher or ("running" if common["pid"] != "-" else "-"), **common)
    wait = learner.get("data_wait_fraction")
    details = (
        f"updates {fmt_int(learner.get('learner_updates'))}"
        f" · data wait {f'{wait:.0%}' if _finite(wait) else '-'}"
        f" · env steps {fmt_int(learner.get('env_steps'))}"
        f" · return {fmt_return(learner.get('episode_return_mean'))}"
    )
    state = "done" if learner.get("done") is True else "ok"
    return Row(
        state=launcher or state,
        throughput=(
            f"{fmt_rate(learner.get('updates_per_s'))} upd "
            f"{fmt_rate(learner.get('samples_per_s'))} smp"
        ),
        version=fmt_int(params_version),  # the weights it published last
        heard=fmt_age(now.learner_age_s),
        details=details,
        **common,
    )


def _actor_row(
    name: str,
    entry: dict[str, float] | None,
    params_version: float | None,
    launcher: str | None,
    common: dict,
) -> Row:
    if entry is None:  # known to the launcher, not yet to the replay server
        return Row(state=launcher or "starting", **common)
    version = entry.get("weights_version")
    lag = (
        params_version - version
        if _finite(params_version) and _finite(version) and version >= 0
        else None
    )
    heard = entry.get("last_heard_s")
    state = launcher or ("silent" if _finite(heard) and heard > SILENT_S else "ok")
    return Row(
        state=state,
        throughput=fmt_rate(entry.get("env_steps_per_s"), " steps/s"),
        version=fmt_int(version),
        lag=fmt_int(lag),
        heard=fmt_age(heard),
        details=f"env steps {fmt_int(entry.get('env_steps'))}",
        **common,
    )


def per_policy(stats: dict[str, float], server: str, key: str) -> dict[str, float]:
    """A multi-agent run's ``<server>/<policy>/<key>`` entries by policy; empty for one agent."""
    found = {}
    for name, value in stats.items():
        parts = name.split("/")
        if len(parts) == 3 and parts[0] == server and parts[2] == key:
            found[parts[1]] = value
    return found


def summary(now: Reading) -> str:
    """One line over the table: the run's env steps, learner updates, weights, evaluation."""
    replay, learner = now.replay or {}, now.learner or {}
    rates = [
        v["env_steps_per_s"]
        for name, v in actor_entries(now.replay).items()
        if name.startswith("actor_") and _finite(v.get("env_steps_per_s"))
    ]
    env_rate = sum(rates) if rates else None
    parts = [
        f"env steps {fmt_int(replay.get('replay/env_steps'))} ({fmt_rate(env_rate)})",
        *(
            [f"agent steps {fmt_int(replay['replay/agent_steps'])}"]
            if "replay/agent_steps" in replay
            else []
        ),
        f"updates {fmt_int(learner.get('learner_updates'))}"
        f" ({fmt_rate(learner.get('updates_per_s'))})",
        f"weights v{fmt_int((now.params or {}).get('params/version'))}",
        f"eval return {fmt_return(replay.get('eval/return_mean'))}"
        f" (v{fmt_int(replay.get('eval/version'))},"
        f" {fmt_int(replay.get('eval/episodes_in_window'))} episodes)",
    ]
    return " · ".join(parts)


def league_lines(params: dict[str, float]) -> list[str]:
    """A league's line (the parameter server's ``league/*`` stats): games, pool, the latest's
    win rate against it and every player's Elo rating with the latest's record against it;
    none without a league."""
    if "league/games" not in params:
        return []
    rate = params.get("league/win_rate_vs_pool")
    line = (
        f"league: {fmt_int(params['league/games'])} games"
        f" ({fmt_int(params.get('league/self_play_games'))} self-play)"
        f" · pool {fmt_int(params.get('league/pool_size'))}"
        f" · win rate vs pool {'-' if rate is None else f'{rate:.2f}'}"
        f" · Elo latest {params.get('league/elo/latest', 0.0):.0f}"
    )
    snapshots = sorted(
        (int(name[len("league/elo/v") :]), value)
        for name, value in params.items()
        if name.startswith("league/elo/v")
    )
    if not snapshots:
        return [line]
    cells = []
    for version, elo in snapshots:
        record = [
            fmt_int(params.get(f"league/payoff/v{version}/{k}"))
            for k in ("wins", "draws", "losses")
        ]
        cells.append(f"v{version} {elo:.0f} ({'-'.join(record)})")
    return [line, "snapshots (Elo, latest's wins-draws-losses): " + ", ".join(cells)]


# -- rendering -------------------------------------------------------------------------------------


def render(rows: list[Row], title: str = "", lines: tuple[str, ...] = ()) -> str:
    """The table as text, like Ray Tune's status table (psql style)."""
    table = [COLUMNS, *(row.cells() for row in rows)]
    widths = [max(len(cells[i]) for cells in table) for i in range(len(COLUMNS))]
    right = {"pid", "restarts", "version", "lag", "heard"}

    def line(cells: tuple[str, ...]) -> str:
        padded = [
            c.rjust(w) if name in right else c.ljust(w)
            for c, w, name in zip(cells, widths, COLUMNS, strict=True)
        ]
        return "| " + " | ".join(padded) + " |"

    rule = "+-" + "-+-".join("-" * w for w in widths) + "-+"
    out = [f"== Status{' · ' + title if title else ''} =="] if title or lines else []
    out += list(lines)
    out += [rule, line(COLUMNS), "|-" + "-+-".join("-" * w for w in widths) + "-|"]
    out += [line(row.cells()) for row in rows]
    out.append(rule)
    return "\n".join(out)


# -- reading a run ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where to look: the servers' addresses, their CURVE client keys, the run directory."""

    replay_addr: str
    params_addr: str
    replay_keys: ClientKeys | None = None
    params_keys: ClientKeys | None = None
    run_dir: Path | None = None


def target_from_net(net: NetConfig, run_dir: Path | None) -> Target:
    """The run's addresses and the keys to ask its servers for ``Stats`` with (``stats_keys``).
    A run's relative ``net.keys_dir`` is also looked for in ``<run dir>/keys``."""
    if net.keys_dir and not Path(net.keys_dir).is_dir() and run_dir is not None:
        if rundir.keys_dir(run_dir).is_dir():
            net = dataclasses.replace(net, keys_dir=str(rundir.keys_dir(run_dir)))
    return Target(
        net.replay_addr,
        net.params_addr,
        stats_keys(net, "replay"),
        stats_keys(net, "params"),
        run_dir,
    )


def stats_keys(net: NetConfig, server: str) -> ClientKeys | None:
    """The keys of the first client role whose secret ``net.keys_dir`` holds (the evaluation
    actor's, the learner's, an actor's: each may ask for ``Stats``), so status works with a whole
    run's keys or any one host's bundle (a learner's ``config.yaml`` names the learner's)."""
    from apexrl.runtime.lifecycle import StartupError
    from apexrl.transport import auth

    for role in ("eval", "learner"):
        try:
            return auth.client_keys(net, role, server)
        except StartupError:
            pass
    return auth.client_keys(net, "actor", server)  # or the error that names the bundle to use


def relayed(net: NetConfig, run_dir: Path) -> NetConfig:
    """``net`` with each in-process (``inproc://``) server address, which no other process can
    reach, replaced by the address of the serial run's Stats relay that ``roles.json`` records."""
    relay = read_roles(run_dir).stats
    addresses = {"replay_addr": relay.get("replay"), "params_addr": relay.get("params")}
    replace = {
        name: address
        for name, address in addresses.items()
        if address and getattr(net, name).startswith("inproc://")
    }
    return dataclasses.replace(net, **replace) if replace else net


def take_reading(ctx: zmq.Context, target: Target, timeout_s: float) -> Reading:
    """Ask both servers (each within ``timeout_s``) and read the run directory."""
    timeout_ms = int(timeout_s * 1000)
    replay = server_stats(ctx, target.replay_addr, timeout_ms, curve=target.replay_keys)
    params = server_stats(ctx, target.params_addr, timeout_ms, curve=target.params_keys)
    learner, age, roles, alive = None, None, [], None
    if target.run_dir is not None:
        learner, age = last_result(target.run_dir)
        record = read_roles(target.run_dir)
        roles, alive = record.roles, record.launcher_alive
    return Reading(time.monotonic(), replay, params, learner, age, roles, alive)


def show(target: Target, now: Reading, before: Reading | None) -> str:
    title = str(target.run_dir) if target.run_dir is not None else ""
    lines = (
        f"replay {target.replay_addr} · params {target.params_addr} · {time.strftime('%H:%M:%S')}",
        summary(now),
        *league_lines(now.params or {}),
    )
    return render(build_rows(now, before), title or "apexrl", lines)


def watch(
    target: Target,
    interval_s: float = 2.0,
    once: bool = False,
    timeout_s: float = 1.0,
    out: TextIO = sys.stdout,
) -> int:
    """Print the table every ``interval_s`` until Ctrl-C (redrawn in place on a terminal); with
    ``once``, one table (from two readings ``ONCE_GAP_S`` apart) and exit: 0 when both servers
    answered, 1 when one did not."""
    from apexrl.transport import sockets

    ctx = sockets.make_context()
    redraw = out.isatty() and not once
    try:
        before = None
        now = take_reading(ctx, target, timeout_s)
        if once:
            if now.replay is not None or now.params is not None:
                time.sleep(ONCE_GAP_S)
                before, now = now, take_reading(ctx, target, timeout_s)
            out.write(show(target, now, before) + "\n")
            out.flush()
            return EXIT_OK if now.replay is not None and now.params is not None else EXIT_NO_ANSWER
        while True:
            out.write(("\x1b[H\x1b[2J" if redraw else "\n") + show(target, now, before) + "\n")
            out.flush()
            time.sleep(max(interval_s - (time.monotonic() - now.time), 0.0))
            before, now = now, take_reading(ctx, target, timeout_s)
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        ctx.term()


# -- command line ----------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "A table of a live run's roles (throughput, weights version and lag, replay size and "
        "rates, time since last heard, restarts), redrawn every --interval seconds until Ctrl-C. "
        "Exit status: 0; with --once, 1 when a server did not answer; 2 for a usage error."
    )
    parser.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="the run's directory")
    parser.add_argument("--replay", help="replay server address (default: the run's config)")
    parser.add_argument("--params", help="parameter server address (default: the run's config)")
    parser.add_argument("--keys", metavar="DIR", help="the run's CURVE keys (net.keys_dir)")
    parser.add_argument(
        "--interval", type=float, default=2.0, help="seconds between tables (default 2)"
    )
    parser.add_argument("--once", action="store_true", help="print one table and exit")
    parser.add_argument(
        "--timeout",
        type=float,
        default=1.0,
        help="seconds a server may take to answer before it shows as 'no answer' (default 1)",
    )


def main(args: argparse.Namespace) -> int:
    """``apexrl status RUN_DIR`` or ``apexrl status --replay ADDR --params ADDR [--keys DIR]``."""
    from apexrl.config import ConfigError, load_config
    from apexrl.runtime.lifecycle import StartupError

    if args.interval <= 0 or args.timeout <= 0:
        print("apexrl status: error: --interval and --timeout must be positive", file=sys.stderr)
        return EXIT_USAGE
    overrides = [f"net.replay_addr={args.replay}"] if args.replay else []
    overrides += [f"net.params_addr={args.params}"] if args.params else []
    overrides += [f"net.keys_dir={args.keys}"] if args.keys else []
    run_dir = Path(args.run_dir) if args.run_dir else None
    try:
        if run_dir is not None:
            config_path = rundir.config_path(run_dir)
            if not config_path.is_file():
                raise ConfigError(f"{run_dir} holds no {rundir.CONFIG}: is it a run directory?")
            cfg = load_config(config_path, overrides)
            target = target_from_net(relayed(cfg.net, run_dir), run_dir)
        elif args.replay and args.params:
            net = NetConfig(args.replay, args.params, keys_dir=args.keys or "")
            target = target_from_net(net, None)
        else:
            raise ConfigError("give a RUN_DIR, or both --replay and --params")
    except (ConfigError, StartupError, OSError, ValueError) as exc:
        print(f"apexrl status: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return watch(target, args.interval, args.once, args.timeout)

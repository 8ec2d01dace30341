"""``apexrl ray``'s driver: connects to the cluster, places the run's groups, starts each role in
its runner and supervises them until the run ends, as the local launcher does on one machine.

Order: the placement groups (all of them placed, or a one-line error naming what the cluster
lacks); every role's runner (a named Ray actor in its bundle: ``<run>/<role>`` in Ray's dashboard
and state API); the servers' addresses: the head node's address and a port free there, for the
replay and parameter servers (and the learners' rendezvous on the first learner's node), written
with the rest of the run's values to ``<run dir>/config.yaml``, which every role reads, and which
``apexrl status`` and ``apexrl stop`` read from anywhere; then the roles, servers and learners
first, the actors once both servers answer (``local.start_children``); then the local launcher's
supervisor (``supervise``): restarts with back-off, counted in ``roles.json`` (a learner with
``--resume`` from its checkpoint, a replay server from its chunk log), a configuration error
(exit 2) never restarted, a role that keeps dying (an actor past ``--max-actor-restarts``) ends
the run with status 1 naming it, the learner's stop condition ends it with 0.

A role whose runner is lost with its node is started again in a new runner in the same bundle,
which Ray places on a node that has room. The servers bind the head node's address: a head node
that is lost takes the cluster's control store with it, and the run ends.

The end, also on Ctrl-C or ``ray job stop`` (SIGTERM to the driver): SIGTERM to each role's process
group (the learner writes its checkpoint), SIGKILL to what is left after
``processes.STOP_TIMEOUT_S``, then the runners and the placement groups are removed. Should the
driver itself be killed first, Ray ends its runners, and the kernel sends each role SIGTERM as
its runner dies.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from typing import Any

from apexrl.config import Config, ConfigError
from apexrl.launch.local import (
    end_run,
    make_run_keys,
    start_children,
    write_run_config,
)
from apexrl.launch.placed_runs import source_root
from apexrl.launch.preflight import LaunchError, check_before_placing
from apexrl.launch.ray_cluster.children import RayChild, Runners
from apexrl.launch.ray_cluster.plan import (
    HEAD,
    STRATEGIES,
    RayPlan,
    RayPlanError,
    RoleSpec,
    make_plan,
    render,
    total,
)
from apexrl.launch.run_state import result_size
from apexrl.launch.supervisor import supervise
from apexrl.runtime import lifecycle, rundir
from apexrl.transport import auth, sockets

log = logging.getLogger("apexrl.launch.ray")

NAMESPACE = "apexrl"  # the Ray namespace of every run's runners and placement groups
PLACE_TIMEOUT_S = 120.0  # for the cluster to place every group
NODE_ID_LABEL = "ray.io/node-id"  # the label Ray gives each node: its id


class RayRunError(Exception):
    """The cluster cannot hold the run as planned; the one line the user sees (exit 2)."""


class RayRun:
    """A run on the cluster: its placement groups, runners and children."""

    def __init__(self, plan: RayPlan) -> None:
        import ray

        self.ray, self.plan = ray, plan
        self.groups: dict[str, Any] = {}
        self.runners = Runners()
        self.made: dict[str, int] = {}  # runners made per role (a lost one is made again)
        self.prefix = plan.cfg.run_dir.name
        from apexrl.launch.ray_cluster.runner import RoleRunner

        self.runner_class = ray.remote(RoleRunner)

    def place(self) -> None:
        """Every placement group placed, or ``RayRunError`` naming what the cluster lacks."""
        from ray.util.placement_group import placement_group

        for group in self.plan.groups:
            bundles = self.plan.bundles(group)
            selector = [{NODE_ID_LABEL: head_node_id(self.ray)}] * len(bundles)
            self.groups[group] = placement_group(
                bundles,
                strategy=STRATEGIES[group],
                name=f"{self.prefix}/{group}",
                bundle_label_selector=selector if group == HEAD else None,
            )
        for group, pg in self.groups.items():
            if not pg.wait(PLACE_TIMEOUT_S):
                raise RayRunError(
                    f"the cluster did not place the {group} group ({STRATEGIES[group]}, "
                    f"{total(self.plan.bundles(group))}) within {PLACE_TIMEOUT_S:.0f} s; it has "
                    f"{describe_resources(self.ray.cluster_resources())} in all, "
                    f"{describe_resources(self.ray.available_resources())} free"
                )

    def make_runner(self, spec: RoleSpec) -> Any:
        """A new runner for ``spec`` in its bundle (named ``<run>/<role>``, then ``#2`` ...)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.made[spec.name] = self.made.get(spec.name, 0) + 1
        count = self.made[spec.name]
        name = f"{self.prefix}/{spec.name}" + (f"#{count}" if count > 1 else "")
        strategy = PlacementGroupSchedulingStrategy(
            self.groups[spec.group], placement_group_bundle_index=spec.bundle
        )
        return self.runner_class.options(
            name=name,
            num_cpus=spec.resources.get("CPU", 0.0),
            num_gpus=spec.resources.get("GPU", 0.0),
            max_restarts=0,
            scheduling_strategy=strategy,
        ).remote(spec.name)

    def bind_addresses(self) -> Config:
        """The run's config with the servers' addresses (and the learners' rendezvous): each
        node's address and a port free there, asked of the runners that will bind them."""
        ray, cfg = self.ray, self.plan.cfg

        def address(name: str) -> str:
            runner = self.runners.handles[name]
            ip = ray.get(runner.where.remote(), timeout=PLACE_TIMEOUT_S)["ip"]
            port = ray.get(runner.free_port.remote(ip), timeout=PLACE_TIMEOUT_S)
            return f"tcp://{ip}:{port}"

        net = dataclasses.replace(
            cfg.net, replay_addr=address("replay"), params_addr=address("params")
        )
        learner = cfg.learner
        if learner.world_size > 1:
            first = next(s.name for s in self.plan.roles if s.name.startswith("learner"))
            learner = dataclasses.replace(learner, rendezvous=address(first))
        return dataclasses.replace(cfg, net=net, learner=learner)

    def build_children(self, cfg: Config) -> list[RayChild]:
        pythonpath = source_root()
        children = []
        for spec in self.plan.roles:
            children.append(
                RayChild(
                    spec.name,
                    list(spec.args),
                    rundir.log_path(cfg.run_dir, spec.name),
                    restartable=spec.restartable,
                    max_restarts=self.plan.max_actor_restarts if spec.restartable else None,
                    runners=self.runners,
                    make_runner=lambda spec=spec: self.make_runner(spec),
                    pythonpath=pythonpath,
                )
            )
        return children

    def release(self) -> None:
        """The runners (each role's process is gone by now; should one not be, the kernel sends
        it SIGTERM as its runner dies) and the placement groups, removed."""
        from ray.util.placement_group import remove_placement_group

        for handle in self.runners.handles.values():
            try:
                self.ray.kill(handle, no_restart=True)
            except Exception as exc:  # noqa: BLE001 - already gone with its node
                log.debug("runner already gone: %s", exc)
        for pg in self.groups.values():
            try:
                remove_placement_group(pg)
            except Exception as exc:  # noqa: BLE001 - the cluster is going away
                log.debug("placement group already gone: %s", exc)


def head_node_id(ray: Any) -> str:
    """Ray's id of the cluster's head node."""
    for node in ray.nodes():
        if node.get("Alive") and "node:__internal_head__" in node.get("Resources", {}):
            return node["NodeID"]
    raise RayRunError("the cluster has no live head node")


def describe_resources(resources: dict[str, float]) -> str:
    shown = {k: v for k, v in sorted(resources.items()) if k in ("CPU", "GPU")}
    return ", ".join(f"{v:g} {k}" for k, v in shown.items()) or "no CPU"


def connect(address: str) -> Any:
    """``ray`` connected to the cluster at ``address``; ``RayRunError`` when it is not there."""
    try:
        import ray
    except ImportError as exc:
        raise RayRunError(
            "Ray is not installed here: pip install 'apexrl[ray]' (on every node of the cluster)"
        ) from exc
    try:
        ray.init(
            address=address,
            namespace=NAMESPACE,
            log_to_driver=True,
            logging_level=logging.WARNING,
            configure_logging=False,
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RayRunError(f"no Ray cluster at {address}: {exc}") from exc
    return ray


def run(plan: RayPlan) -> int:
    """Place, start and supervise the run on the connected cluster; the exit status."""
    cfg = plan.cfg
    ray_run = RayRun(plan)
    stop = lifecycle.install_stop_handlers()
    ctx = sockets.make_context()
    children: list[RayChild] = []
    try:
        ray_run.place()
        for spec in plan.roles:  # made together: Ray starts their processes side by side
            try:
                ray_run.runners.handles[spec.name] = ray_run.make_runner(spec)
            except ValueError as exc:  # a live actor of the namespace has the name
                raise RayRunError(
                    f"cannot name the runner of {spec.name}: {exc} (another run with the run "
                    f"directory name {cfg.run_dir.name!r} is on this cluster)"
                ) from exc
        cfg = ray_run.bind_addresses()
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        make_run_keys(cfg)
        write_run_config(cfg)
        children = ray_run.build_children(cfg)
        log.info(
            "%s run directory %s: replay %s, params %s, %d actors on a Ray cluster of %s",
            "resuming the" if cfg.run.resume else "new",
            cfg.run_dir,
            cfg.net.replay_addr,
            cfg.net.params_addr,
            plan.num_actors,
            describe_resources(ray_run.ray.cluster_resources()),
        )
        offset = result_size(cfg.run_dir)
        code = start_children(children, cfg, stop, ctx, None)
        if code is None:
            hosts = {c.name: c.host for c in children}
            log.info("roles by node: %s", ", ".join(f"{n} {h}" for n, h in hosts.items()))
            code = supervise(children, cfg, stop, ctx, None, offset, "apexrl ray --resume")
        return code
    except RayRunError as exc:
        print(f"apexrl ray: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if children:
            end_run(children, cfg, None, ctx)
        else:
            ctx.term()
        ray_run.release()


def check_keys_given(plan: RayPlan, keys_given: bool) -> None:
    if keys_given and not auth.has_bundles(plan.keys_dir):
        raise RayPlanError(
            f"--keys {plan.keys_dir} does not hold a run's CURVE keys (make them with "
            f"`apexrl keys {plan.keys_dir}`)"
        )


def main(args: argparse.Namespace) -> int:
    """``apexrl ray``: 0 when the run met its stop condition, 2 with one line on stderr for a
    problem found before any role started, 1 when a role kept dying, 130 on a stop signal."""
    try:
        plan = make_plan(args)
        check_before_placing(plan.cfg)
        check_keys_given(plan, bool(args.keys))
    except ConfigError as exc:
        print(f"apexrl ray: config error: {exc}", file=sys.stderr)
        return 2
    except (RayPlanError, LaunchError, OSError) as exc:
        print(f"apexrl ray: error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        sys.stdout.write(render(plan))
        return 0
    try:
        ray = connect(plan.address)
    except RayRunError as exc:
        print(f"apexrl ray: error: {exc}", file=sys.stderr)
        return 2
    try:
        return run(plan)
    finally:
        ray.shutdown()

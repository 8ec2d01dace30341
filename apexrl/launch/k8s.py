"""``apexrl k8s``: Kubernetes manifests of a whole run, rendered from its config (applies nothing).

Writes one YAML stream for ``kubectl apply -f FILE``. For a run named NAME in namespace NS:

- Service ``NAME``: headless (``clusterIP: None``), selecting the replay server, the parameter
  server and the learners, so that each has a stable DNS name ``<hostname>.NAME.NS.svc.<domain>``:
  ``replay`` (port 6000), ``params`` (6001) and ``learner-<rank>`` (with several learners rank 0
  hosts the group's rendezvous on 6002). It publishes a pod's name before the pod is ready: roles
  that start first find the others as soon as they have an address;
- Pods ``NAME-replay`` and ``NAME-params``: the servers, binding ``tcp://0.0.0.0:PORT`` (the
  run's CURVE keys admit only its roles, so they may face the pod network);
- Pods ``NAME-learner-<rank>``: the learners, connecting to the servers by name (``--rank``,
  ``--world-size``, ``--rendezvous`` with several), each with ``--gpus-per-learner`` GPUs;
- Jobs ``NAME-actor-<id>``: one per actor (``--id <id>``), each mounting only its own key; with
  ``--keys DIR`` made without ``--actors`` (one key shared by the actors) one indexed Job
  ``NAME-actors`` of N completions that all run at once instead, a pod's completion index (its
  ``batch.kubernetes.io/job-completion-index`` annotation) its actor id;
- Pod ``NAME-eval``: the evaluation actor (``apexrl actor --eval``; none with ``--no-eval``);
- ConfigMap ``NAME-config``: the resolved ``config.yaml`` with the in-cluster values (run and
  keys directories, the servers' DNS addresses, ``actor.num_actors``, ``learner.world_size``),
  which every role reads; the command lines still name the addresses, as on several machines;
- Secrets ``NAME-keys-servers``, ``-learner``, ``-actor-<id>`` (or the shared ``-actors``),
  ``-eval``: the run's CURVE keys (fresh ones, each actor its own, unless ``--keys DIR``), one
  bundle of ``apexrl keys`` each. Each pod mounts only its own bundle (the servers' secret keys
  and the allow-list, or a client's own pair and the servers' public keys), read-only, mode
  0400: a pod taken over holds no other role's secret, and an actor's speaks as that actor only.

Every pod restarts only on failure, so the pods of a finished run end ``Completed``. The run
directory ``/apexrl/runs/NAME`` is an emptyDir per pod (gone with the pod) unless ``--pvc``
names a claim that every pod mounts.

Where things live: this module is the command (its flags, their checks, ``build_plan``, which
reads the config and the keys); ``apexrl.launch.k8s_manifests`` makes the objects, purely (a
``Plan`` in, the objects as plain dicts out, ``render`` for the YAML stream).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import tempfile
from decimal import Decimal
from pathlib import Path

from apexrl import tracking
from apexrl.config import ConfigError, add_overrides_argument, dump_config, load_config
from apexrl.launch.k8s_manifests import (
    BUNDLE_FILES,
    GPU_RESOURCE,
    KEY_BUNDLE,
    MAX_NAME,
    OWN_ACTOR_BUNDLE,
    Plan,
    Resources,
    bundle_files,
    cluster_overrides,
    dns_name,
    render,
)

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # RFC 1123 label
_SERVICE_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # RFC 1035 label (a Service's name)
# A Kubernetes quantity (k8s.io/apimachinery resource.Quantity) without a sign.
_QUANTITY = re.compile(r"^(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE]|[eE][-+]?\d+)?$")
EXIT_USAGE = 2


class K8sError(ValueError):
    """A flag that cannot make valid manifests."""


# -- from the command line -------------------------------------------------------------------------


def _dns_subdomain(text: str) -> bool:
    return len(text) <= 253 and all(_DNS_LABEL.match(part) for part in text.split("."))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def check_quantity(flag: str, text: str) -> str:
    """``text`` if it is a positive Kubernetes quantity (``500m``, ``2``, ``4Gi``, ``1e3``)."""
    match = _QUANTITY.match(text)
    if not match or Decimal(match.group(1)) == 0:
        raise K8sError(
            f"{flag} {text!r} is not a positive Kubernetes quantity (e.g. 500m, 2, 512Mi, 4Gi)"
        )
    return text


def read_keys(keys_dir: Path, actors: int) -> dict[str, dict[str, bytes]]:
    """The bundles of ``apexrl keys DIR`` a run of ``actors`` actors mounts, each file's
    contents: each actor's own where DIR has one for every actor (``--actors N``), else the
    actors' shared one; ``K8sError`` when one is missing."""
    own = [OWN_ACTOR_BUNDLE.format(i) for i in range(actors)]
    have_own = [b for b in own if (keys_dir / b).is_dir()]
    if have_own and len(have_own) < actors:
        raise K8sError(
            f"--keys {keys_dir} holds own keys of {len(have_own)} actors, not of all {actors}: "
            f"add them with `apexrl keys {keys_dir} --add-actors K`"
        )
    shared = KEY_BUNDLE["actor"]
    wanted = [b for b in BUNDLE_FILES if b != shared] + (own if have_own else [shared])
    paths = [keys_dir / b / f for b in wanted for f in bundle_files(b)]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise K8sError(
            f"--keys {keys_dir} holds no {missing[0].relative_to(keys_dir)}: make a run's keys "
            "with `apexrl keys DIR` and pass the whole DIR"
        )
    return {b: {f: (keys_dir / b / f).read_bytes() for f in bundle_files(b)} for b in wanted}


def fresh_keys(actors: int) -> dict[str, dict[str, bytes]]:
    """A run's new keys (every bundle, each actor its own), made in a temporary directory
    (deleted)."""
    from apexrl.transport import auth

    with tempfile.TemporaryDirectory(prefix="apexrl-k8s-") as tmp:
        keys_dir = Path(tmp) / "keys"
        auth.make_keys(keys_dir, actors=actors)
        return read_keys(keys_dir, actors)


def check_flags(args: argparse.Namespace) -> None:
    """``K8sError`` for a count, name, image, claim or domain that cannot make valid
    manifests."""
    if args.actors < 1 or args.learners < 1:
        raise K8sError(f"--actors and --learners must be >= 1, got {args.actors}, {args.learners}")
    if args.gpus_per_learner < 0:
        raise K8sError(f"--gpus-per-learner must be >= 0, got {args.gpus_per_learner}")
    if not _DNS_LABEL.match(args.namespace) or len(args.namespace) > 63:
        raise K8sError(f"--namespace {args.namespace!r} is not a DNS label (a-z, 0-9, -)")
    if args.name is not None and not (
        _SERVICE_NAME.match(args.name) and len(args.name) <= MAX_NAME
    ):
        raise K8sError(
            f"--name {args.name!r} must be lower case letters, digits and '-', start with a "
            f"letter, end with a letter or digit, at most {MAX_NAME} characters"
        )
    if not args.image.strip() or any(c.isspace() for c in args.image):
        raise K8sError(f"--image {args.image!r} is not an image reference")
    if args.pvc and not _dns_subdomain(args.pvc):
        raise K8sError(f"--pvc {args.pvc!r} is not the name of a PersistentVolumeClaim")
    if not _dns_subdomain(args.cluster_domain):
        raise K8sError(f"--cluster-domain {args.cluster_domain!r} is not a DNS name")


def pod_resources(args: argparse.Namespace) -> tuple[Resources, Resources, Resources]:
    """The servers', a learner's and an actor's resources (quantities checked)."""
    server = Resources(
        check_quantity("--server-cpu", args.server_cpu),
        check_quantity("--server-memory", args.server_memory),
    )
    learner = Resources(
        check_quantity("--learner-cpu", args.learner_cpu),
        check_quantity("--learner-memory", args.learner_memory),
        args.gpus_per_learner,
    )
    actor = Resources(
        check_quantity("--actor-cpu", args.actor_cpu),
        check_quantity("--actor-memory", args.actor_memory),
    )
    return server, learner, actor


def build_plan(args: argparse.Namespace) -> Plan:
    """Check the flags, load the config with the in-cluster values, read or make the keys."""
    check_flags(args)
    server, learner, actor = pod_resources(args)

    def overrides(name: str) -> list[str]:
        return list(args.overrides) + cluster_overrides(
            name, args.namespace, args.actors, args.learners, args.cluster_domain
        )

    # The run's name does not change the config's own name (algorithm and env id): load once to
    # learn that, then again with the name in the addresses.
    name = args.name or dns_name(load_config(args.config, overrides("apexrl")).run_name)
    cfg = tracking.with_trackers(load_config(args.config, overrides(name)), args.track)
    if args.gpus_per_learner and cfg.learner.device == "cpu":  # the GPUs asked for are used
        cfg = dataclasses.replace(cfg, learner=dataclasses.replace(cfg.learner, device="cuda"))
    if args.keys:
        keys = read_keys(Path(args.keys), args.actors)
    else:
        keys = fresh_keys(args.actors)
    return Plan(
        name=name,
        namespace=args.namespace,
        image=args.image,
        actors=args.actors,
        learners=args.learners,
        config_yaml=dump_config(cfg),
        keys=keys,
        server=server,
        learner=learner,
        actor=actor,
        evaluate=not args.no_eval,
        pvc=args.pvc or "",
        cluster_domain=args.cluster_domain,
        pull_policy=args.pull_policy or "",
    )


def write_output(text: str, output: str | None) -> None:
    """To stdout, or to ``output`` made readable by its owner only: it holds secret keys."""
    if output in (None, "-"):
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``k8s`` subcommand's arguments (``apexrl.cli`` builds the parser)."""
    parser.description = (
        "Kubernetes manifests of a whole run (applies nothing): a headless Service that names the "
        "servers and learners, their Pods, a Job per actor, the evaluation actor, the config as "
        "a ConfigMap and the run's CURVE keys as Secrets, each actor its own. Apply them with "
        "`kubectl apply -f FILE`. Exit status: 0, or 2 with one line for a usage error."
    )
    add_run_flags(parser)
    add_resource_flags(parser)
    add_storage_flags(parser)


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """The config, the number of pods, the image, the namespace and the run's name."""
    parser.add_argument("--config", required=True, metavar="FILE", help="YAML config file")
    add_overrides_argument(parser)
    parser.add_argument(
        "--actors", type=int, default=4, metavar="N", help="N, actor pods (default 4)"
    )
    parser.add_argument(
        "--learners", type=int, default=1, metavar="L", help="L, learner pods (default 1)"
    )
    parser.add_argument(
        "--image",
        default="apexrl:latest",
        metavar="IMAGE",
        help="container image with apexrl installed (default apexrl:latest)",
    )
    parser.add_argument(
        "--pull-policy",
        choices=("Always", "IfNotPresent", "Never"),
        help="the containers' imagePullPolicy (default: Kubernetes' own)",
    )
    parser.add_argument(
        "--namespace", default="default", metavar="NS", help="namespace (default 'default')"
    )
    tracking.add_track_flag(parser)  # the image needs its extra, the learner pod its credentials
    parser.add_argument(
        "--name",
        metavar="NAME",
        help=f"the run's name: the Service's and every object's prefix (default "
        f"<algorithm>-<env id>, made a DNS label of at most {MAX_NAME} characters)",
    )


def add_resource_flags(parser: argparse.ArgumentParser) -> None:
    """The GPUs of a learner pod and the CPU and memory of every kind of pod."""
    parser.add_argument(
        "--gpus-per-learner",
        type=int,
        default=0,
        metavar="G",
        help=f"{GPU_RESOURCE} limit of each learner pod (default 0); a learner.device of cpu "
        "becomes cuda",
    )
    for role, cpu, memory in (
        ("actor", "1", "1Gi"),
        ("learner", "2", "4Gi"),
        ("server", "1", "2Gi"),
    ):
        what = {"actor": "each actor pod", "learner": "each learner pod"}.get(
            role, "the replay and parameter server pods"
        )
        parser.add_argument(
            f"--{role}-cpu", default=cpu, metavar="Q", help=f"CPU request of {what} (default {cpu})"
        )
        parser.add_argument(
            f"--{role}-memory",
            default=memory,
            metavar="Q",
            help=f"memory request and limit of {what} (default {memory})",
        )


def add_storage_flags(parser: argparse.ArgumentParser) -> None:
    """The keys, the run directory's claim, the evaluation pod, the DNS domain, the output."""
    parser.add_argument(
        "--keys",
        metavar="DIR",
        help="put the keys of `apexrl keys DIR` in the Secret (default: fresh keys for this run)",
    )
    parser.add_argument(
        "--pvc",
        metavar="CLAIM",
        help="PersistentVolumeClaim every pod mounts for the run directory (ReadWriteMany when "
        "pods share it across nodes); default an emptyDir per pod: results then live only as "
        "long as the pod",
    )
    parser.add_argument("--no-eval", action="store_true", help="no evaluation actor pod")
    parser.add_argument(
        "--cluster-domain",
        default="cluster.local",
        metavar="DOMAIN",
        help="the cluster's DNS domain (default cluster.local)",
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write the manifests to FILE, mode 0600 (default: stdout)",
    )


def main(args: argparse.Namespace) -> int:
    """``apexrl k8s``: 0, or 2 with one line on stderr."""
    try:
        plan = build_plan(args)
        write_output(render(plan), args.output)
    except (K8sError, ConfigError, OSError) as exc:
        print(f"apexrl k8s: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    if args.output not in (None, "-"):
        print(f"{args.output}: the run {plan.name}; apply with kubectl apply -f {args.output}")
    return 0

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
- Job ``NAME-actors``: an indexed Job of N completions that all run at once; a pod's completion
  index (its ``batch.kubernetes.io/job-completion-index`` annotation) is its actor id;
- Pod ``NAME-eval``: the evaluation actor (``apexrl actor --eval``; none with ``--no-eval``);
- ConfigMap ``NAME-config``: the resolved ``config.yaml`` with the in-cluster values (run and
  keys directories, the servers' DNS addresses, ``actor.num_actors``, ``learner.world_size``),
  which every role reads; the command lines still name the addresses, as on several machines;
- Secret ``NAME-keys``: the run's CURVE keys (fresh ones unless ``--keys DIR``). Each pod mounts
  only the files its role reads (``auth.server_keys``: its own pair and the allow-list;
  ``auth.client_keys``: its own pair and the servers' public keys), read-only, mode 0400.

Every pod restarts only on failure, so the pods of a finished run end ``Completed``. The run
directory ``/apexrl/runs/NAME`` is an emptyDir per pod (gone with the pod) unless ``--pvc``
names a claim that every pod mounts. ``build_plan`` reads the config and the keys; ``manifests``
is pure (a ``Plan`` in, the objects as plain dicts out); ``render`` writes the YAML stream.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from apexrl.config import ConfigError, add_overrides_argument, dump_config, load_config

REPLAY_PORT = 6000
PARAMS_PORT = 6001
RENDEZVOUS_PORT = 6002
CONFIG_DIR = "/apexrl/config"  # the ConfigMap: config.yaml
CONFIG_FILE = f"{CONFIG_DIR}/config.yaml"
KEYS_DIR = "/apexrl/keys"  # the Secret: the role's key files
RUNS_DIR = "/apexrl/runs"  # the emptyDir or the claim; the run directory is RUNS_DIR/NAME
KEYS_MODE = 0o400  # of the mounted key files (secret volumes: defaultMode)
ACTOR_ID_ENV = "ACTOR_ID"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
ACTOR_RETRIES = 6  # failures per actor (on average) before the Job gives up on all of them
MAX_NAME = 40  # leaves room for "-actors-<index>" and "-learner-<rank>" in a 63-character label
GPU_RESOURCE = "nvidia.com/gpu"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_ROLE = "apexrl/role"
LABEL_SERVICE = "apexrl/service"  # on the pods behind the headless Service: the Service's name
EXIT_USAGE = 2

# The files of ``apexrl keys DIR`` (``apexrl.transport.auth``, imported only when keys are read:
# building the CLI's parser imports this module): a pair per role and the allow-list.
SERVER_ROLES = ("replay", "params")  # auth.SERVER_ROLES
CLIENT_ROLES = ("learner", "actor", "eval")  # auth.CLIENT_ROLES
ALLOW_LIST = "allow_list.json"  # auth.ALLOW_LIST
KEY_FILES = (
    *(f"{role}.{ext}" for role in SERVER_ROLES + CLIENT_ROLES for ext in ("key", "key_secret")),
    ALLOW_LIST,
)

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # RFC 1123 label
_SERVICE_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # RFC 1035 label (a Service's name)
# A Kubernetes quantity (k8s.io/apimachinery resource.Quantity) without a sign.
_QUANTITY = re.compile(r"^(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE]|[eE][-+]?\d+)?$")


class K8sError(ValueError):
    """A flag that cannot make valid manifests."""


@dataclass(frozen=True)
class Resources:
    """A container's requests (the memory also its limit) as Kubernetes quantities."""

    cpu: str
    memory: str
    gpus: int = 0  # nvidia.com/gpu in the limits


@dataclass(frozen=True)
class Plan:
    """Everything the manifests are made of; ``manifests`` reads nothing else."""

    name: str  # the run's name: the Service's, and the prefix of every other object's
    namespace: str
    image: str  # has apexrl installed: the containers run `apexrl <role> ...`
    actors: int
    learners: int
    config_yaml: str  # the resolved config with the in-cluster values (cluster_overrides)
    keys: dict[str, bytes]  # key file name -> its contents (KEY_FILES)
    server: Resources
    learner: Resources
    actor: Resources  # the evaluation actor's too
    evaluate: bool = True
    pvc: str = ""  # claim of the run directory; "": an emptyDir per pod
    cluster_domain: str = "cluster.local"
    pull_policy: str = ""  # "": Kubernetes' default
    labels: dict[str, str] = field(default_factory=dict)  # extra labels (none by default)


# -- names and addresses ---------------------------------------------------------------------------


def dns_name(text: str) -> str:
    """``apex_dqn-CartPole-v1`` -> ``apex-dqn-cartpole-v1``: an RFC 1035 label of at most
    ``MAX_NAME`` characters (lower case, digits and ``-``, starting with a letter)."""
    name = re.sub(r"[^a-z0-9]+", "-", text.lower())
    name = re.sub(r"^[^a-z]+", "", name)[:MAX_NAME].strip("-")
    return name or "apexrl"


def host(name: str, namespace: str, hostname: str, domain: str = "cluster.local") -> str:
    """The DNS name of the pod with ``hostname`` behind the headless Service ``name``."""
    return f"{hostname}.{name}.{namespace}.svc.{domain}"


def learner_hostname(rank: int) -> str:
    return f"learner-{rank}"


def cluster_overrides(
    name: str, namespace: str, actors: int, learners: int, domain: str = "cluster.local"
) -> list[str]:
    """The config values every pod of the run reads (after the user's ``--set``)."""
    overrides = [
        f"actor.num_actors={actors}",
        f"learner.world_size={learners}",
        f"run.dir={RUNS_DIR}/{name}",
        f"net.keys_dir={KEYS_DIR}",
        f"net.replay_addr=tcp://{host(name, namespace, 'replay', domain)}:{REPLAY_PORT}",
        f"net.params_addr=tcp://{host(name, namespace, 'params', domain)}:{PARAMS_PORT}",
        "net.insecure=false",
    ]
    if learners > 1:
        rendezvous = host(name, namespace, learner_hostname(0), domain)
        overrides.append(f"learner.rendezvous=tcp://{rendezvous}:{RENDEZVOUS_PORT}")
    return overrides


def role_key_files(role: str) -> list[str]:
    """The key files the ``role`` reads (``auth.server_keys`` for a server, ``auth.client_keys``
    for a client of both servers): its own pair, and the allow-list or the servers' public keys."""
    own = [f"{role}.key", f"{role}.key_secret"]
    if role in SERVER_ROLES:
        return [*own, ALLOW_LIST]
    if role in CLIENT_ROLES:
        return [*own, *(f"{server}.key" for server in SERVER_ROLES)]
    raise ValueError(f"unknown role {role!r}")


def check_quantity(flag: str, text: str) -> str:
    """``text`` if it is a positive Kubernetes quantity (``500m``, ``2``, ``4Gi``, ``1e3``)."""
    match = _QUANTITY.match(text)
    if not match or Decimal(match.group(1)) == 0:
        raise K8sError(
            f"{flag} {text!r} is not a positive Kubernetes quantity (e.g. 500m, 2, 512Mi, 4Gi)"
        )
    return text


# -- the objects -----------------------------------------------------------------------------------


def labels(plan: Plan, role: str) -> dict[str, str]:
    return {LABEL_NAME: "apexrl", LABEL_INSTANCE: plan.name, LABEL_ROLE: role, **plan.labels}


def metadata(plan: Plan, name: str, role: str, **extra: str) -> dict[str, Any]:
    return {"name": name, "namespace": plan.namespace, "labels": {**labels(plan, role), **extra}}


def service_selector(plan: Plan) -> dict[str, str]:
    return {LABEL_NAME: "apexrl", LABEL_INSTANCE: plan.name, LABEL_SERVICE: plan.name}


def service_ports(plan: Plan) -> list[tuple[str, int]]:
    ports = [("replay", REPLAY_PORT), ("params", PARAMS_PORT)]
    return ports + ([("rendezvous", RENDEZVOUS_PORT)] if plan.learners > 1 else [])


def _address(plan: Plan, hostname: str, port: int) -> str:
    return f"tcp://{host(plan.name, plan.namespace, hostname, plan.cluster_domain)}:{port}"


def _volumes(plan: Plan, key_role: str) -> list[dict[str, Any]]:
    runs: dict[str, Any] = (
        {"persistentVolumeClaim": {"claimName": plan.pvc}} if plan.pvc else {"emptyDir": {}}
    )
    return [
        {"name": "config", "configMap": {"name": f"{plan.name}-config"}},
        {
            "name": "keys",
            "secret": {
                "secretName": f"{plan.name}-keys",
                "defaultMode": KEYS_MODE,
                "items": [{"key": f, "path": f} for f in role_key_files(key_role)],
            },
        },
        {"name": "runs", **runs},
    ]


def _container(
    plan: Plan,
    name: str,
    args: list[str],
    resources: Resources,
    ports: list[tuple[str, int]] | None = None,
    env: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    limits = {"memory": resources.memory}
    if resources.gpus:
        limits[GPU_RESOURCE] = str(resources.gpus)
    container: dict[str, Any] = {"name": name, "image": plan.image}
    if plan.pull_policy:
        container["imagePullPolicy"] = plan.pull_policy
    container["command"] = ["apexrl"]
    container["args"] = [
        *args,
        *("--config", CONFIG_FILE, "--run-dir", f"{RUNS_DIR}/{plan.name}", "--keys", KEYS_DIR),
    ]
    container["env"] = [{"name": "PYTHONUNBUFFERED", "value": "1"}, *(env or [])]
    if ports:
        container["ports"] = [
            {"name": port_name, "containerPort": port, "protocol": "TCP"}
            for port_name, port in ports
        ]
    container["resources"] = {
        "requests": {"cpu": resources.cpu, "memory": resources.memory},
        "limits": limits,
    }
    container["volumeMounts"] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "keys", "mountPath": KEYS_DIR, "readOnly": True},
        {"name": "runs", "mountPath": RUNS_DIR},
    ]
    return container


def _pod_spec(
    plan: Plan, key_role: str, container: dict[str, Any], hostname: str = ""
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if hostname:  # a DNS name <hostname>.<subdomain>.NS.svc.<domain> behind the Service
        spec["hostname"] = hostname
        spec["subdomain"] = plan.name
    spec["restartPolicy"] = "OnFailure"
    spec["containers"] = [container]
    spec["volumes"] = _volumes(plan, key_role)
    return spec


def _pod(plan: Plan, name: str, role: str, spec: dict[str, Any], **extra: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata(plan, name, role, **extra),
        "spec": spec,
    }


def manifests(plan: Plan) -> list[dict[str, Any]]:
    """The run's objects: Service, ConfigMap, Secret, the servers', learners' and evaluation
    actor's Pods and the actors' Job, as plain dicts in the order they are applied."""
    name = plan.name
    replay_addr = _address(plan, "replay", REPLAY_PORT)
    params_addr = _address(plan, "params", PARAMS_PORT)
    behind_service = {LABEL_SERVICE: name}
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata(plan, name, "service"),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": service_selector(plan),
                "ports": [
                    {"name": port_name, "port": port, "targetPort": port, "protocol": "TCP"}
                    for port_name, port in service_ports(plan)
                ],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata(plan, f"{name}-config", "config"),
            "data": {"config.yaml": plan.config_yaml},
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata(plan, f"{name}-keys", "keys"),
            "type": "Opaque",
            "data": {f: base64.b64encode(plan.keys[f]).decode() for f in KEY_FILES},
        },
    ]
    for role, port in (("replay", REPLAY_PORT), ("params", PARAMS_PORT)):
        container = _container(
            plan, role, [role, "--bind", f"tcp://0.0.0.0:{port}"], plan.server, [(role, port)]
        )
        spec = _pod_spec(plan, role, container, hostname=role)
        objects.append(_pod(plan, f"{name}-{role}", role, spec, **behind_service))
    for rank in range(plan.learners):
        args = ["learner", "--replay", replay_addr, "--params", params_addr]
        ports: list[tuple[str, int]] = []
        if plan.learners > 1:
            rendezvous = _address(plan, learner_hostname(0), RENDEZVOUS_PORT)
            args += ["--rank", str(rank), "--world-size", str(plan.learners)]
            args += ["--rendezvous", rendezvous]
            ports = [("rendezvous", RENDEZVOUS_PORT)] if rank == 0 else []
        container = _container(plan, "learner", args, plan.learner, ports)
        spec = _pod_spec(plan, "learner", container, hostname=learner_hostname(rank))
        extra = {**behind_service, "apexrl/rank": str(rank)}
        objects.append(_pod(plan, f"{name}-learner-{rank}", "learner", spec, **extra))
    client = ["--replay", replay_addr, "--params", params_addr]
    actor = _container(
        plan,
        "actor",
        ["actor", *client, "--id", f"$({ACTOR_ID_ENV})", "--num-actors", str(plan.actors)],
        plan.actor,
        env=[{"name": ACTOR_ID_ENV, "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}}],
    )
    objects.append(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": metadata(plan, f"{name}-actors", "actor"),
            "spec": {
                "completionMode": "Indexed",
                "completions": plan.actors,
                "parallelism": plan.actors,
                "backoffLimit": ACTOR_RETRIES * plan.actors,
                "template": {
                    "metadata": {"labels": labels(plan, "actor")},
                    "spec": _pod_spec(plan, "actor", actor),
                },
            },
        }
    )
    if plan.evaluate:
        container = _container(plan, "eval", ["actor", *client, "--eval"], plan.actor)
        objects.append(_pod(plan, f"{name}-eval", "eval", _pod_spec(plan, "eval", container)))
    return objects


# -- the YAML stream -------------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    """Block literals for multi-line strings (the config), no anchors for repeated values."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _represent_str)


def header(plan: Plan) -> str:
    """What the stream makes and how to use it, as YAML comments."""
    ns, name = plan.namespace, plan.name
    learners = f"{name}-learner-0" + (f" .. {plan.learners - 1}" if plan.learners > 1 else "")
    pods = [f"{name}-replay", f"{name}-params", learners] + ([f"{name}-eval"] * plan.evaluate)
    run_dir = f"the claim {plan.pvc}" if plan.pvc else "each pod's own emptyDir (gone with the pod)"
    lines = [
        f"apexrl run {name}: {plan.actors} actor(s), {plan.learners} learner(s), image "
        f"{plan.image}, namespace {ns}",
        "Apply:  kubectl apply -f FILE   (the namespace must exist)",
        "Makes:",
        f"  Service {name}: headless, the DNS names of replay, params and learner-<rank>",
        f"  Pods {', '.join(pods)}",
        f"  Job {name}-actors: indexed, {plan.actors} completion(s), the index is the actor id",
        f"  ConfigMap {name}-config: config.yaml, read by every role",
        f"  Secret {name}-keys: the run's CURVE keys (keep this file private)",
        f"Run directory: {RUNS_DIR}/{name} on {run_dir}",
        f"Watch:  kubectl -n {ns} get pods -l {LABEL_INSTANCE}={name}",
        f"        kubectl -n {ns} logs -f {name}-learner-0",
    ]
    if plan.evaluate:
        lines += [
            f"        kubectl -n {ns} exec {name}-eval -- \\",
            f"          apexrl status --once --keys {KEYS_DIR} \\",
            f"          --replay {_address(plan, 'replay', REPLAY_PORT)} \\",
            f"          --params {_address(plan, 'params', PARAMS_PORT)}",
        ]
    lines += [
        f"Stop:   kubectl -n {ns} exec {name}-learner-0 -- apexrl stop --config {CONFIG_FILE}",
        "Remove: kubectl delete -f FILE",
    ]
    return "".join(f"# {line}\n" for line in lines)


def render(plan: Plan) -> str:
    """The comment header and every object, one YAML document each."""
    body = yaml.dump_all(
        manifests(plan), Dumper=_Dumper, sort_keys=False, explicit_start=True, width=100
    )
    return header(plan) + body


# -- from the command line -------------------------------------------------------------------------


def _dns_subdomain(text: str) -> bool:
    return len(text) <= 253 and all(_DNS_LABEL.match(part) for part in text.split("."))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def read_keys(keys_dir: Path) -> dict[str, bytes]:
    """The key files of ``apexrl keys DIR``; ``K8sError`` when one is missing."""
    missing = [f for f in KEY_FILES if not (keys_dir / f).is_file()]
    if missing:
        raise K8sError(
            f"--keys {keys_dir} holds no {missing[0]}: make a run's keys with `apexrl keys DIR`"
        )
    return {f: (keys_dir / f).read_bytes() for f in KEY_FILES}


def fresh_keys() -> dict[str, bytes]:
    """A new key pair per role and the allow-list, made in a temporary directory (deleted)."""
    from apexrl.transport import auth

    with tempfile.TemporaryDirectory(prefix="apexrl-k8s-") as tmp:
        keys_dir = Path(tmp) / "keys"
        auth.make_keys(keys_dir)
        return read_keys(keys_dir)


def build_plan(args: argparse.Namespace) -> Plan:
    """Check the flags, load the config with the in-cluster values, read or make the keys."""
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

    def overrides(name: str) -> list[str]:
        return list(args.overrides) + cluster_overrides(
            name, args.namespace, args.actors, args.learners, args.cluster_domain
        )

    # The run's name does not change the config's own name (algorithm and env id): load once to
    # learn that, then again with the name in the addresses.
    name = args.name or dns_name(load_config(args.config, overrides("apexrl")).run_name)
    cfg = load_config(args.config, overrides(name))
    if args.gpus_per_learner and cfg.learner.device == "cpu":  # the GPUs asked for are used
        cfg = dataclasses.replace(cfg, learner=dataclasses.replace(cfg.learner, device="cuda"))
    if args.keys:
        keys = read_keys(Path(args.keys))
    else:
        keys = fresh_keys()
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
        "servers and learners, their Pods, the actors as an indexed Job, the evaluation actor, "
        "the config as a ConfigMap and the run's CURVE keys as a Secret. Apply them with "
        "`kubectl apply -f FILE`. Exit status: 0, or 2 with one line for a usage error."
    )
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
    parser.add_argument(
        "--name",
        metavar="NAME",
        help=f"the run's name: the Service's and every object's prefix (default "
        f"<algorithm>-<env id>, made a DNS label of at most {MAX_NAME} characters)",
    )
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
